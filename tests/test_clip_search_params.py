"""``pact search --params FILE`` on the tiny clip testbed (issue 15 review): the parameter set's
``testbeds:`` section is defined as the book runner defines it, so a clip testbed can be named
from the shell; placeholder paths and bad options exit 2 naming them; ``--help`` documents
``--params`` and ``$PACT_TESTBEDS``."""
from __future__ import annotations

import json

import pytest
import yaml

open_clip = pytest.importorskip("open_clip")

from pactlib import testbeds  # noqa: E402
from pactlib.book.records import read_records  # noqa: E402
from pactlib.cli import main  # noqa: E402
from test_clip_testbed import TASKS, TINY, files  # noqa: E402,F401  (files: a fixture)

NAME = "clip-search-params"


def _write_set(path, files, **more):  # noqa: F811
    spec = dict(family="clip", arch=TINY, checkpoint_dir=str(files["ckpt"]), data_root=str(files["data"]),
                tasks=TASKS, heads=str(files["heads"]), device="cpu", batch_size=8,
                cache_dir=str(path.parent / "cache"), **more)
    path.write_text(yaml.safe_dump({"testbeds": {NAME: spec}, "05_main_results": {"testbeds": [NAME]}}))
    return path


@pytest.fixture
def undefine():
    yield
    testbeds.undefine(NAME)


def test_search_names_a_clip_testbed_of_a_parameter_set(files, tmp_path, capsys, undefine):  # noqa: F811
    assert NAME not in testbeds.definitions()
    pset = _write_set(tmp_path / "mine.yaml", files)
    recs = tmp_path / "r.jsonl"
    assert main(["search", "--params", str(pset), "--testbed", NAME, "--method", "task_arithmetic",
                 "--alphas", "0.5", "1.0", "--widen", "0", "--out-records", str(recs)]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["testbed"] == NAME and summary["alpha"] in (0.5, 1.0)
    [rec] = read_records(recs)
    assert rec["testbed"] == NAME and rec["method"] == "task_arithmetic"
    # the definition is the file's, as the runner's define_testbeds makes it
    assert testbeds.definitions()[NAME]["checkpoint_dir"] == str(files["ckpt"])
    ref = testbeds.run(testbeds.load(NAME, 0), "task_arithmetic", alphas=(0.5, 1.0), widen=0, memo=False)
    assert ref["alpha"] == rec["alpha"] and ref["metrics"]["norm_acc"] == pytest.approx(rec["metrics"]["norm_acc"])


def test_search_params_errors_exit_2_naming_the_culprit(files, tmp_path, capsys, undefine):  # noqa: F811
    base = ["search", "--testbed", NAME, "--method", "task_arithmetic", "--alphas", "1.0"]
    placeholder = _write_set(tmp_path / "p.yaml", files)
    placeholder.write_text(placeholder.read_text().replace(str(files["data"]), "/path/to/datasets"))
    assert main([*base, "--params", str(placeholder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pact: error:") and "data_root /path/to/datasets does not exist" in err
    assert main([*base, "--params", str(_write_set(tmp_path / "b.yaml", files, colour="red"))]) == 2
    err = capsys.readouterr().err
    assert "b.yaml: testbeds" in err and "'colour'" in err
    assert main([*base, "--params", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
    assert main([*base, "--params", "no-such-set"]) == 2
    assert "no parameter set params/no-such-set.yaml under the current folder" in capsys.readouterr().err


def test_search_params_takes_a_set_name_as_the_runner_does(files, tmp_path, monkeypatch, undefine):  # noqa: F811
    from pactlib.testbeds.search import define_from_params

    (tmp_path / "params").mkdir()
    _write_set(tmp_path / "params" / "mine.yaml", files)
    monkeypatch.chdir(tmp_path)
    assert define_from_params("mine") == [NAME]
    assert testbeds.definitions()[NAME]["checkpoint_dir"] == str(files["ckpt"])


def test_search_help_documents_params_and_the_environment(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    out = capsys.readouterr().out
    assert "--params SET" in out and "$PACT_TESTBEDS" in out and "testbeds:" in out and "./params/" in out
