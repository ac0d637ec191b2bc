"""Notebook parameters: parsing the `parameters` cell, YAML sets, validation, in-notebook checks.

Fast (no notebook is executed). The last tests hold every notebook and every parameter set of
the repository to the same rules, so a bad parameter fails here before any heavy work.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import yaml

from pactlib.book import params
from pactlib.book.params import ParameterError

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    from conftest import load_runner

    return load_runner()


CELL = '''
seeds = [0, 1, 2]        # three seeds
alpha = 0.5              # a float
steps = 10               # an int
name: str = "iso_c"      # annotated
verbose = False          # a bool
options = {"k": 1}       # a dict
ckpt = None              # optional, any type
zoo_dir = ...            # required
'''
DEFAULTS = params.parse_defaults(CELL)


# --- parse_defaults -------------------------------------------------------------------------

def test_parse_defaults_reads_literals_in_order():
    assert list(DEFAULTS) == ["seeds", "alpha", "steps", "name", "verbose", "options", "ckpt",
                              "zoo_dir"]
    assert DEFAULTS["seeds"] == [0, 1, 2] and DEFAULTS["alpha"] == 0.5
    assert DEFAULTS["options"] == {"k": 1} and DEFAULTS["ckpt"] is None
    assert DEFAULTS["zoo_dir"] is params.REQUIRED


@pytest.mark.parametrize("source, fragment", [
    ("x = f(3)", "must be a literal"),
    ("import os", "only hold `name = literal`"),
    ("x = y + 1", "must be a literal"),
    ("a.b = 1", "plain name"),
    ("x = 1\nx = 2", "assigned twice"),
    ("x = (", "cannot parse"),
])
def test_parse_defaults_rejects_non_literal_cells(source, fragment):
    with pytest.raises(ParameterError, match="nb.py") as err:
        params.parse_defaults(source, where="nb.py")
    assert fragment in str(err.value)


# --- validate --------------------------------------------------------------------------------

def test_validate_accepts_good_overrides_and_widens_int_to_float():
    out = params.validate(DEFAULTS, {"alpha": 1, "steps": 3, "seeds": [4], "zoo_dir": "z",
                                     "ckpt": 7, "verbose": True})
    assert out == {"alpha": 1.0, "steps": 3, "seeds": [4], "zoo_dir": "z", "ckpt": 7,
                   "verbose": True}
    assert isinstance(out["alpha"], float)


def test_validate_unknown_name_lists_the_known_ones():
    with pytest.raises(ParameterError) as err:
        params.validate(DEFAULTS, {"alpah": 0.3, "zoo_dir": "z"}, notebook="05_main")
    msg = str(err.value)
    assert "05_main" in msg and "unknown parameter 'alpah'" in msg
    assert "'alpha'" in msg and "'seeds'" in msg  # the known names


@pytest.mark.parametrize("name, value, expected, got", [
    ("steps", 2.5, "int", "float"),
    ("steps", True, "int", "bool"),
    ("verbose", 1, "bool", "int"),
    ("alpha", "0.5", "float", "str"),
    ("name", 3, "str", "int"),
    ("options", [1], "dict", "list"),
    ("seeds", 3, "list", "int"),
    ("seeds[1]", None, "int", "float"),  # element type: [0, 1.5]
])
def test_validate_wrong_type_names_parameter_expected_and_got(name, value, expected, got):
    key = name.split("[")[0]
    override = [0, 1.5] if name == "seeds[1]" else value
    with pytest.raises(ParameterError) as err:
        params.validate(DEFAULTS, {key: override, "zoo_dir": "z"})
    msg = str(err.value)
    assert f"parameter '{name}'" in msg and f"expected {expected}, got {got}" in msg


def test_validate_missing_required_and_reports_all_problems_together():
    with pytest.raises(ParameterError) as err:
        params.validate(DEFAULTS, {"steps": "x", "bogus": 1})
    msg = str(err.value)
    assert "missing required parameter 'zoo_dir'" in msg
    assert "unknown parameter 'bogus'" in msg and "parameter 'steps'" in msg


def test_validate_does_not_mutate_inputs():
    overrides = {"alpha": 1, "zoo_dir": "z"}
    before = dict(overrides), dict(DEFAULTS)
    params.validate(DEFAULTS, overrides)
    assert (overrides, DEFAULTS) == before


# --- load_params -----------------------------------------------------------------------------

def _yaml(tmp_path, data) -> Path:
    path = tmp_path / "set.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_load_params_merges_common_then_section(tmp_path):
    path = _yaml(tmp_path, {"common": {"seeds": [0], "alpha": 0.1, "other": 5},
                            "05_main": {"alpha": 0.9}, "06_x": None})
    assert params.load_params(path, "05_main") == {"seeds": [0], "alpha": 0.9, "other": 5}
    # common entries the notebook does not declare are skipped; its own section is kept
    assert params.load_params(path, "05_main", declared=["alpha"]) == {"alpha": 0.9}
    assert params.load_params(path, "06_x", declared=["seeds"]) == {"seeds": [0]}


def test_load_params_unknown_section_lists_sections(tmp_path):
    path = _yaml(tmp_path, {"common": {}, "05_main": {}, "06_x": {}})
    with pytest.raises(ParameterError) as err:
        params.load_params(path, "07_missing")
    assert "07_missing" in str(err.value) and "['05_main', '06_x']" in str(err.value)


def test_load_params_rejects_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        params.load_params(tmp_path / "nope.yaml", "a")
    with pytest.raises(ParameterError, match="section 'a' must be a mapping"):
        params.load_params(_yaml(tmp_path, {"a": [1, 2]}), "a")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ParameterError, match="not valid YAML"):
        params.load_params(bad, "a")


def test_testbeds_is_a_reserved_section(tmp_path):
    spec = {"clip-x": {"family": "clip", "arch": "ViT-B-32", "checkpoint_dir": "/ckpt", "data_root": "/data"}}
    path = _yaml(tmp_path, {"testbeds": spec, "common": {"seeds": [0]}, "05_main": {"testbed": "clip-x"}})
    assert params.sections(path) == ["05_main"]
    assert params.testbed_definitions(path) == spec
    assert params.load_params(path, "05_main") == {"seeds": [0], "testbed": "clip-x"}
    with pytest.raises(ParameterError, match=r"no section for notebook 'testbeds'.*\['05_main'\]"):
        params.load_params(path, "testbeds")  # never a notebook's section
    assert params.testbed_definitions(_yaml(tmp_path, {"05_main": {}})) == {}
    with pytest.raises(ParameterError, match="testbeds: 'clip-x' must be a mapping"):
        params.testbed_definitions(_yaml(tmp_path, {"testbeds": {"clip-x": "ViT-B-32"}}))
    with pytest.raises(ParameterError, match="section 'testbeds' must be a mapping"):
        params.testbed_definitions(_yaml(tmp_path, {"testbeds": ["clip-x"]}))


def test_variants_section_runs_chapters_again_with_values_on_top(tmp_path):
    path = _yaml(tmp_path, {"common": {"seeds": [0]}, "05_main": {"alpha": 0.9, "testbed": "lite0-8"}, "06_x": {},
                            "variants": {"main": {"title": "Images"},
                                         "text": {"title": "Text", "chapters": {"05_main": {"testbed": "minilm-8"}}}}})
    assert params.sections(path) == ["05_main", "06_x"]
    v = params.variant_definitions(path)
    assert list(v) == ["main", "text"] and v["main"] == {"title": "Images", "chapters": {}}
    assert v["text"]["chapters"] == {"05_main": {"testbed": "minilm-8"}}
    assert params.load_params(path, "05_main") == {"seeds": [0], "alpha": 0.9, "testbed": "lite0-8"}
    assert params.load_params(path, "05_main", variant="text") == {"seeds": [0], "alpha": 0.9, "testbed": "minilm-8"}
    with pytest.raises(ParameterError, match="'text' has no values for notebook '06_x'"):
        params.load_params(path, "06_x", variant="text")
    # no section: the main run alone, titled "main"
    assert params.variant_definitions(_yaml(tmp_path, {"05_main": {}})) == {"main": {"title": "main", "chapters": {}}}


@pytest.mark.parametrize("variants, fragment", [
    (["text"], "section .variants. must be a mapping"),
    ({"Text!": {"title": "T", "chapters": {"05_main": {}}}}, "a variant name is lower-case"),
    ({"text": "T"}, "must be a mapping with 'title' and 'chapters'"),
    ({"text": {"title": "T", "chapters": {"05_main": {}}, "seeds": [0]}}, r"unknown key\(s\) \['seeds'\]"),
    ({"text": {"chapters": {"05_main": {}}}}, "needs a non-empty string 'title'"),
    ({"text": {"title": "T"}}, "'chapters' must map notebook names"),
    ({"main": {"title": "M", "chapters": {"05_main": {}}}}, "the main run takes a title only"),
    ({"text": {"title": "T", "chapters": {"07_nope": {}}}}, r"chapter '07_nope' is not a notebook section.*\['05_main'\]"),
    ({"text": {"title": "T", "chapters": {"05_main": [1]}}}, "the values of '05_main' must be a mapping"),
])
def test_variants_section_errors_name_the_variant_and_key(tmp_path, variants, fragment):
    path = _yaml(tmp_path, {"05_main": {}, "variants": variants})
    with pytest.raises(ParameterError, match=fragment):
        params.variant_definitions(path)


def test_existing_path_and_testbed_family_rules(tmp_path):
    rule = params.existing_path()
    assert rule(None) is None and rule(str(tmp_path)) is None
    assert "nothing exists at that path" in rule("/path/to/checkpoints")
    assert params.existing_path(none_ok=False)(None) is not None
    with pytest.raises(ParameterError, match=r"parameter 'data_root' must be .*got '/path/to/datasets'"):
        params.check({"data_root": "/path/to/datasets"}, data_root=params.existing_path())
    assert params.testbed(none_ok=True)(None) is None
    assert params.testbed()(None) is not None
    assert "family 'clip'" in params.testbed(family="clip")("lite0-8")
    assert params.testbed(family="lite0")("lite0-8") is None


# --- check (inside a notebook) ---------------------------------------------------------------

def test_check_returns_values_in_order():
    ns = {"lbw_tol": 0.5, "seeds": [0, 1], "methods": ["ta"], "x": 1}
    out = params.check(ns, seeds=params.each(params.at_least(0)), lbw_tol=params.between(0, 1),
                       methods=params.each(params.one_of("ta", "iso_c")))
    assert list(out.items()) == [("seeds", [0, 1]), ("lbw_tol", 0.5), ("methods", ["ta"])]


def test_check_reports_every_broken_rule():
    ns = {"lbw_tol": 1.5, "seeds": [0, -1], "methods": ["bogus"], "zoo": ..., "flag": True}
    with pytest.raises(ParameterError) as err:
        params.check(ns, lbw_tol=params.between(0, 1), seeds=params.each(params.at_least(0)),
                     methods=params.each(params.one_of("ta")), zoo=None, missing=None,
                     flag=params.at_least(0))
    msg = str(err.value)
    assert "parameter 'lbw_tol' must be a number in [0, 1], got 1.5" in msg
    assert "element 1 = -1" in msg and "one of ['ta']" in msg
    assert "required parameter 'zoo'" in msg and "'missing' is not defined" in msg
    assert "parameter 'flag'" in msg  # a bool is not a number


def test_rules_edge_cases():
    assert params.between(0, 1)(0) is None and params.between(0, 1)(1.0) is None
    assert params.at_least(1)(float("inf")) is not None
    assert params.each(params.at_least(0))([]) == "a non-empty list"
    assert params.each(params.at_least(0), nonempty=False)([]) is None


def test_rules_fraction_unique_and_registry_choices():
    from pactlib import merges
    from pactlib.testbeds.lite0 import testbed as study
    from pactlib.data.suites import SUITES

    assert params.fraction()(1) is None and params.fraction()(0.5) is None
    assert params.fraction()(0) == "a number in (0, 1]" and params.fraction()(1.01) is not None
    assert params.fraction()(True) is not None
    assert params.each(params.at_least(0), unique=True)([0, 1]) is None
    assert "element 2 = 1 repeats" in params.each(params.at_least(0), unique=True)([0, 1, 1])
    for name in merges.names():
        assert params.merge_method()(name) is None
    assert params.merge_method()("nope") == f"one of {list(merges.names())}"
    assert params.suite()("14") is None and params.suite()(14) == f"one of {list(SUITES)}"
    assert params.zoo_profile()("smoke") is None and "default" in params.zoo_profile()("x")
    assert params.task_count("8")(0) is None and params.task_count("8")(8) is None
    assert params.task_count(["8", "20"])(9) == "an int in [0, 8] (0 = every task; suite '8' has 8 tasks)"
    assert params.task_count("8")(-1) is not None and params.task_count("8")(True) is not None
    assert params.task_count("99")(3) is None  # an unknown suite is the suite rule's problem
    assert study.PROFILES  # the profiles the rule reads
    assert params.testbed()("lite0-8") is None and params.testbed()("lite0-20:3") is None
    assert "unknown testbed 'lite0-9'" in params.testbed()("lite0-9")
    assert "no family 'gpt'" in params.testbed()("gpt-2") and "a str" in params.testbed()(8)


NB_CELLS = [
    "n = 2\nmethods = ['iso_c']\npick = 1",
    "!echo an IPython line is skipped\n%time x = 1",
    "from pactlib import params as pp\n"
    "P = pp.check(globals(), n=pp.at_least(1), methods=pp.each(pp.merge_method()),\n"
    "             pick=pp.between(0, max(1, n)))",
]


def test_check_notebook_evaluates_the_notebooks_own_rules():
    values = {"n": 2, "methods": ["iso_c"], "pick": 2}
    assert params.check_notebook(NB_CELLS, values, notebook="nb.py") == values
    with pytest.raises(ParameterError) as err:
        params.check_notebook(NB_CELLS, {"n": 0, "methods": ["x"], "pick": 3}, notebook="nb.py")
    msg = str(err.value)
    assert msg.startswith("nb.py: ")
    assert "parameter 'n' must be a finite number >= 1, got 0" in msg
    assert "parameter 'methods' must be a list whose every element is one of" in msg
    assert "parameter 'pick' must be a number in [0, 1], got 3" in msg  # max(1, n) with n = 0
    assert params.check_notebook(NB_CELLS[:2], {"n": -5}) == {}  # no check() call: no rules


def test_check_notebook_reports_rules_it_cannot_evaluate():
    cells = ["import numpy as np\nP = params.check(globals(), x=params.one_of(*np.arange(3)), y=5)"]
    with pytest.raises(ParameterError) as err:
        params.check_notebook(cells, {"x": 1, "y": 1}, notebook="nb.py")
    msg = str(err.value)
    assert "the rule of 'x' (`params.one_of(*np.arange(3))`) cannot be evaluated" in msg
    assert "NameError" in msg and "the rule of 'y' (`5`) is not a rule" in msg


# --- the repository's notebooks and parameter sets -------------------------------------------

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
PARAM_SETS = sorted((ROOT / "params").glob("*.yaml"))


def test_there_are_twelve_chapters_matching_the_toc():
    rn = _runner()
    assert [p.stem for p in NOTEBOOKS] == rn.toc_chapters()
    assert len(NOTEBOOKS) == 12


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_checks_exactly_its_parameters(path):
    """The jupytext conversion keeps the `parameters` tag, and the validation cell names every
    parameter once (so a parameter can not be added without a rule, or dropped silently)."""
    import jupytext

    rn = _runner()
    nb = jupytext.read(path)
    cell = rn.parameters_cell(nb, path.stem)
    defaults = params.parse_defaults(cell.source, where=path.name)
    checked = None
    for c in nb.cells:
        for node in ast.walk(ast.parse(c.source)) if c.cell_type == "code" else ():
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "check":
                checked = [kw.arg for kw in node.keywords]
    assert checked is not None, f"{path.name}: no params.check(globals(), ...) call"
    assert checked == list(defaults), f"{path.name}: check() names differ from the parameters cell"


@pytest.mark.parametrize("param_set", PARAM_SETS, ids=lambda p: p.stem)
def test_every_parameter_set_validates_against_every_notebook(param_set):
    """Every set checks; the paper-scale sets only once their placeholder paths are edited (they
    are refused, each path named with its option, until then)."""
    rn = _runner()
    assert set(params.sections(param_set)) == {p.stem for p in NOTEBOOKS}
    if not param_set.stem.startswith("paper-"):
        jobs = rn.prepare(NOTEBOOKS, param_set, {})
        variants = params.variant_definitions(param_set)
        assert [j.id for j in jobs] == [p.stem for p in NOTEBOOKS] + [
            f"{v}/{p.stem}" for v, spec in variants.items() for p in NOTEBOOKS if p.stem in spec["chapters"]]
        return
    with pytest.raises(ParameterError) as err:
        rn.prepare(NOTEBOOKS, param_set, {})
    (name,) = params.testbed_definitions(param_set)
    msg = str(err.value)
    assert f"testbeds: {name!r}" in msg and "option 'checkpoint_dir': /path/to/checkpoints/" in msg
    assert "option 'data_root': /path/to/datasets" in msg and "option 'heads'" in msg
    assert msg.count("bad parameters") == 1 and "unknown" not in msg  # nothing else is wrong


def test_runner_rejects_bad_parameters_before_running_anything(tmp_path, capsys):
    rn = _runner()
    bad = _yaml(tmp_path, {"common": {"sedes": [0]}, **{p.stem: {} for p in NOTEBOOKS}})
    assert rn.main(["--params", str(bad), "--check-only"]) == 2
    assert "common ['sedes'] is declared by no notebook" in capsys.readouterr().err
    assert rn.main(["--only", "05", "--check-only", "-p", "alpha_points=2.5"]) == 2
    err = capsys.readouterr().err
    assert "05_main_results" in err and "expected int, got float" in err
    assert rn.main(["--only", "05", "--check-only", "-p", "alpha_points=5",
                    "-p", "methods=[task_arithmetic, iso_c]"]) == 0


@pytest.mark.parametrize("override, fragments", [
    ("methods=[task_arithmetic, bogus]", ["parameter 'methods'", "'bogus'", "one of ['task_arithmetic'"]),
    ("testbeds=['lite0-8', 'lite0-30']", ["parameter 'testbeds'", "'lite0-30'", "lite0-8, lite0-14, lite0-20"]),
    ("testbeds=['nosuch-8']", ["parameter 'testbeds'", "'nosuch-8'", "no family 'nosuch'", "lite0-..."]),
    ("alpha_points=-1", ["parameter 'alpha_points'", "got -1", ">= 2"]),
    ("val_limit=0", ["parameter 'val_limit'", "got 0", ">= 8"]),
    ("seeds=[]", ["parameter 'seeds'", "got []", "a non-empty list"]),
    ("seeds=[0, 0]", ["parameter 'seeds'", "got [0, 0]", "without repeats"]),
])
def test_runner_rejects_bad_values_before_running_anything(override, fragments, capsys):
    """Values, not only types: the notebook's own check() rules, evaluated before any run."""
    rn = _runner()
    assert rn.main(["--only", "05", "--check-only", "-p", override]) == 2
    err = capsys.readouterr().err
    assert "notebooks/05_main_results.py" in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_runner_value_rules_use_the_registries_and_other_parameters(capsys):
    from pactlib import merges

    rn = _runner()
    assert rn.main(["--only", "07", "--check-only", "-p", "method=top_k", "-p", "most=0"]) == 2
    err = capsys.readouterr().err
    assert f"one of {list(merges.names())}, got 'top_k'" in err  # pactlib.merges.names()
    assert "parameter 'most' must be a number in (0, 1], got 0.0" in err
    # a rule may depend on another parameter's final value (08: accuracy_n_iter in n_iters)
    assert rn.main(["--only", "08", "--check-only", "-p", "accuracy_n_iter=3"]) == 2
    assert "parameter 'accuracy_n_iter' must be one of [2, 8, 12], got 3" in capsys.readouterr().err
    assert rn.main(["--only", "08", "--check-only", "-p", "accuracy_n_iter=3",
                    "-p", "n_iters=[1, 3]"]) == 0
    # 10: val_limit must cover loss_examples
    assert rn.main(["--only", "10", "--check-only", "-p", "loss_examples=100"]) == 2
    assert "parameter 'val_limit' must be a finite number >= 100, got 64" in capsys.readouterr().err
    # problems of every selected notebook are reported together
    assert rn.main(["--only", "05", "06", "--check-only", "-p", "alpha_points=0"]) == 2
    err = capsys.readouterr().err
    assert "05_main_results.py: parameter 'alpha_points'" in err
    assert "06_static_vs_dynamic.py: parameter 'alpha_points'" in err


@pytest.mark.parametrize("override, fragment", [
    ("seeds=[0,", "not valid YAML"),
    ("seeds={a: [1}", "not valid YAML"),
    ("nosuchequals", "expected name=value"),
    ("=5", "expected name=value"),
    ("two words=5", "is not a parameter name"),
])
def test_malformed_cli_value_is_one_line_and_exit_2(override, fragment, capsys):
    rn = _runner()
    assert rn.main(["--only", "05", "--check-only", "-p", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: -p ") and fragment in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_malformed_cli_value_from_the_shell():
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_notebooks.py"), "--only", "05",
                           "--check-only", "-p", "seeds=[0,"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "-p 'seeds=[0,'" in proc.stderr


def test_cli_values_are_yaml():
    rn = _runner()
    assert rn.parse_cli(["a=5", "b=[x, y]", "c=0.5", "d=none text"]) == \
        {"a": 5, "b": ["x", "y"], "c": 0.5, "d": "none text"}
    with pytest.raises(ParameterError, match="name=value"):
        rn.parse_cli(["novalue"])
