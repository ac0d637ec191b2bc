"""The chapters use the testbed's matrix rule (``tb.rule``), not :data:`~pactlib.matrix.DEFAULT_RULE`.

A synthetic testbed loaded with ``rule={"not_matrix": ["^fc4\\."]}`` has a rule under which
``fc4.weight`` (a 64 x 64 map under the default rule) is not a map. Every experiment function of
chapters 3, 4, 7, 8 and 10, given ``rule=tb.rule`` as the chapters give it, must treat ``fc4`` as
not-a-map: no LBW subspace, no ablation, no filtering (PACT leaves it as it was), no layer record.
A transposing rule checks that chapter 10's first-order terms view the gradients by the rule.
A static check reads chapters 3-11 and asks every call that takes a ``rule`` to pass ``tb.rule``;
a slow test executes chapters 4, 7, 8 and 10 through the book runner on such a defined testbed.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch
import yaml

from pactlib import testbeds
from pactlib.book.experiments import depth, efficiency, scalar, subspace, theory
from pactlib.book.study import depth_groups
from pactlib.matrix import DEFAULT_NOT_MATRIX, DEFAULT_RULE, MatrixRule
from pactlib.pact import PactOptions, pact_filter
from pactlib.testbeds import synthetic as syn

ROOT = Path(__file__).resolve().parents[1]
MAPS = ["fc1.weight", "fc2.weight", "fc3.weight", "fc4.weight"]
OFF = "fc4.weight"
NO_FC4 = {"not_matrix": [r"^fc4\."]}


@pytest.fixture(scope="module")
def tb():
    return testbeds.load("synthetic-3", seed=0, rule=NO_FC4, val_limit=16, test_limit=32)


@pytest.fixture(scope="module")
def tvs(tb):
    return tb.task_vectors()


class Spy:
    """A testbed that records every state it is asked to evaluate."""

    def __init__(self, tb):
        self._tb, self.states = tb, []

    def __getattr__(self, name):
        return getattr(self._tb, name)

    def evaluate(self, state, split="test", tasks=None):
        self.states.append({k: v.clone() for k, v in state.items()})
        return self._tb.evaluate(state, split, tasks)


# ------------------------------------------------------------------- the synthetic rule option

def test_synthetic_rule_option(tb):
    assert tb.rule.matrix_keys(tb.pretrained) == MAPS[:3] and tb.matrix_keys() == MAPS[:3]
    assert tb.rule == MatrixRule(not_matrix=(r"^fc4\.",)) and tb.rule.kind(OFF, tb.pretrained[OFF]) == "other"
    plain = testbeds.load("synthetic-3", seed=0, val_limit=16, test_limit=32)
    assert plain.rule is DEFAULT_RULE and plain.rule.matrix_keys(plain.pretrained) == MAPS
    # the weights do not depend on the rule; the fingerprint does (the run memo must not mix them)
    assert all(torch.equal(plain.finetuned[t][k], tb.finetuned[t][k]) for t in tb.tasks for k in MAPS)
    assert "rule" not in plain.fingerprint() and list(tb.fingerprint()["rule"]["not_matrix"]) == [r"^fc4\."]
    # the same as wrapping the default testbed
    wrapped = dataclasses.replace(plain, rule=tb.rule)
    assert wrapped.rule.matrix_keys(wrapped.pretrained) == MAPS[:3]
    # presets and MatrixRule objects
    assert syn.matrix_rule("hf_encoder") == MatrixRule.preset("hf_encoder")
    assert syn.matrix_rule(tb.rule) is tb.rule and syn.matrix_rule(None) is DEFAULT_RULE
    assert syn.matrix_rule({"transposed": ["^fc2"]}).not_matrix == DEFAULT_NOT_MATRIX  # fields replace, others stay
    # LoRA: the adapters were trained under the default rule; a rule without fc4 still reads them
    lora = testbeds.load("synthetic-3", seed=0, kind="lora", rule=NO_FC4)
    assert all(float(v[OFF].abs().sum()) > 0 for v in lora.task_vectors())


@pytest.mark.parametrize("rule, err, fragment", [
    ({"not_matrx": ["x"]}, TypeError, "no field 'not_matrx'"),
    ({"not_matrix": "^fc4"}, TypeError, "list of regular expressions"),
    ({"not_matrix": ["(fc4"]}, ValueError, "bad regular expression '(fc4'"),
    ({"conv_1x1": "yes"}, TypeError, "must be a bool"),
    ("nosuch", KeyError, "unknown matrix-rule preset"),
    (3, TypeError, "rule must be None, a preset name"),
])
def test_synthetic_rule_option_rejects_bad_values(rule, err, fragment):
    with pytest.raises(err, match=fragment.replace("(", r"\(")):
        syn.matrix_rule(rule)
    with pytest.raises(err, match=fragment.replace("(", r"\(")):  # at definition time, named
        testbeds.define("synthetic-3-bad", family="synthetic", rule=rule)
    assert "synthetic-3-bad" not in testbeds.definitions()


def test_synthetic_definition_with_rule():
    with pytest.raises(TypeError, match="unknown option"):
        testbeds.define("synthetic-5", family="synthetic", profile="smoke")
    testbeds.define("synthetic-5", family="synthetic", rule=NO_FC4)
    try:
        got = testbeds.load("synthetic-5", seed=0, val_limit=8, test_limit=8)
        assert got.rule.matrix_keys(got.pretrained) == MAPS[:3]
    finally:
        testbeds.undefine("synthetic-5")
    assert testbeds.load("synthetic-5", seed=0, val_limit=8, test_limit=8).rule is DEFAULT_RULE


# ------------------------------------------------------------------------------------ the seam

def test_seam_filters_only_the_rules_maps(tb, tvs):
    filtered, report = testbeds.filtered(tb, "pact")
    assert [lr.key for lr in report.layers] == MAPS[:3]
    for raw, f in zip(tvs, filtered):
        assert torch.equal(raw[OFF], f[OFF])
        assert any(not torch.equal(raw[k], f[k]) for k in MAPS[:3])


# ------------------------------------------------------------------------------ the chapters

def test_chapter3_layer_kinds_follow_the_rule(tb):
    assert scalar.layer_kind(OFF, tb.pretrained[OFF], tb.rule) == "conv"  # a 2-d tensor that is not a map
    assert scalar.layer_kind(OFF, tb.pretrained[OFF]) == "pointwise"
    delta = tb.task_vectors()[0]
    fisher_t = {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(0)) for k, v in delta.items()
                if k.endswith(".weight")}
    recs = scalar.enrichment_records(delta, fisher_t, q=0.2, seed=0, task=tb.tasks[0], params={}, rule=tb.rule)
    kinds = {r["key"]: r["kind"] for r in recs if r["scope"] == "layer"}
    assert kinds[OFF] == "conv" and kinds["fc1.weight"] == "pointwise"


def test_chapter4_subspaces_and_ablations_skip_non_maps(tb, tvs):
    opts = PactOptions()
    subs = subspace.subspaces_by_layer(tb.pretrained, tvs, options=opts, rule=tb.rule)
    assert list(subs) == MAPS[:3]
    assert list(subspace.subspaces_by_layer(tb.pretrained, tvs, options=opts)) == MAPS  # the default rule differs
    recs = subspace.dimension_records(tb.pretrained, subs, tb.tasks, tol=opts.lbw_tol, params={}, seed=0, rule=tb.rule)
    assert {r["key"] for r in recs} == set(MAPS[:3]) and len(recs) == 3 * len(tb.tasks)
    spy = Spy(tb)
    task = tb.tasks[1]
    recs = subspace.ablation_records(spy, task, subs, draws=1, seed=0, params={}, rule=tb.rule)
    ablated = [r for r in recs if r["method"] == "ablate"]  # besides θt's own record when it has outcomes
    assert {r["method"] for r in recs} <= {"ablate", "finetuned"}
    assert {r["condition"] for r in ablated} == set(subspace.CONDITIONS) and len(spy.states) == len(ablated)
    theta = tb.finetuned[task]
    for state in spy.states:
        assert torch.equal(state[OFF], theta[OFF])  # fc4 is never ablated
    lbw = spy.states[0]  # the "lbw" condition comes first
    assert any(not torch.allclose(lbw[k], theta[k]) for k in MAPS[:3])


def test_chapter7_filter_intrusion_and_groups_skip_non_maps(tb, tvs):
    keys = depth.network_order(tb.rule.matrix_keys(tb.pretrained))
    assert keys == MAPS[:3]
    opts = PactOptions()
    filtered, report = pact_filter(tb.pretrained, tvs, options=opts, keep=True, rule=tb.rule)
    assert list(report.subspaces) == MAPS[:3] and list(report.shields) == MAPS[:3]
    assert all(torch.equal(r[OFF], f[OFF]) for r, f in zip(tvs, filtered))
    recs = depth.intrusion_records(tvs, report.subspaces, keys=keys, params={}, seed=0, rule=tb.rule)
    assert {r["key"] for r in recs} == set(MAPS[:3])
    with pytest.raises(KeyError, match="no subspaces for layer 'fc4.weight'"):
        depth.intrusion_records(tvs, report.subspaces, keys=MAPS, params={}, seed=0, rule=tb.rule)
    groups = depth_groups(keys)
    assert groups["late"] == ["fc3.weight"] and OFF not in groups["all"]
    rec = depth.group_record(tb, "task_arithmetic", "all", keys=groups["all"], raw=tvs, filtered=filtered,
                             options=opts, alphas=(0.3,))
    assert rec["n_layers"] == 3 and 0 <= rec["metrics"]["acc"] <= 1
    # the "all" group is the seam's own PACT merge (which uses tb.rule)
    assert rec["metrics"]["acc"] == pytest.approx(testbeds.run(tb, "task_arithmetic", pact="pact", options=opts,
                                                               alphas=(0.3,), memo=False)["metrics"]["acc"])


def test_chapter8_timing_share_and_gaps_skip_non_maps(tb, tvs):
    keys = tb.rule.matrix_keys(tb.pretrained)
    exact = PactOptions()
    _, f_exact, r_exact = efficiency.time_filter(tb.pretrained, tvs, exact, rule=tb.rule)
    assert list(r_exact.subspaces) == MAPS[:3] and all(torch.equal(r[OFF], f[OFF]) for r, f in zip(tvs, f_exact))
    rsvd = exact.replace(svd="rsvd", n_iter=2, oversample=2)
    _, f_q, r_q = efficiency.time_filter(tb.pretrained, tvs, rsvd, rule=tb.rule)
    assert list(r_q.subspaces) == MAPS[:3] and all(torch.equal(r[OFF], f[OFF]) for r, f in zip(tvs, f_q))
    without = {k: v for k, v in tb.pretrained.items() if k != OFF}  # under the default rule: the same three maps
    assert efficiency.randomized_share(tb.pretrained, tvs, rsvd, rule=tb.rule) == \
        efficiency.randomized_share(without, tvs, rsvd)
    gaps = efficiency.gap_records(tb.pretrained, exact, keys=keys, params={}, seed=0, rule=tb.rule)
    assert [r["key"] for r in gaps] == MAPS[:3]
    with pytest.raises(ValueError, match="not a matrix layer"):
        efficiency.gap_records(tb.pretrained, exact, keys=MAPS, params={}, seed=0, rule=tb.rule)
    assert {r["key"] for r in efficiency.basis_records(r_exact, r_q, params={}, seed=0, keys=keys,
                                                        tasks=tb.tasks)} == set(MAPS[:3])


def _theory(tb, rule, t=0):
    tvs = tb.task_vectors()
    filtered, report = pact_filter(tb.pretrained, tvs, keep=True, rule=rule)
    task = tb.tasks[t]
    recs = theory.theory_records(tb, t, tvs[t], filtered[t], report, xy_loss=tb.inputs(task, "val", 16),
                                 xy_test=tb.inputs(task, "test", 32), fracs=[0.5, 1.0], seed=0, params={}, rule=rule)
    return tvs, filtered, report, recs


def test_chapter10_theory_skips_non_maps(tb):
    tvs, filtered, _, recs = _theory(tb, tb.rule)
    assert torch.equal(tvs[0][OFF], filtered[0][OFF])
    layers = [r for r in recs if r["method"] == "layer"]
    assert [r["key"] for r in layers] == MAPS[:3]
    (fo,) = [r for r in recs if r["method"] == "first-order"]
    assert fo["metrics"]["bound"] == pytest.approx(sum(r["metrics"]["bound"] for r in layers), rel=1e-6)


def test_chapter10_first_order_terms_view_by_the_rule():
    """Under a rule that transposes fc2 (64 x 64, so both views are valid), the shields live in
    the transposed view's input space; the bound must be computed in that view."""
    tr = testbeds.load("synthetic-3", seed=0, rule={"transposed": [r"^fc2\.weight$"]}, val_limit=16, test_limit=32)
    tvs, filtered, report, recs = _theory(tr, tr.rule)
    task = tr.tasks[0]
    removed = theory.removed_parts(tvs[0], filtered[0], list(report.shields))
    loss_fn = theory.task_loss(tr, task, tr.inputs(task, "val", 16))
    args = (loss_fn, tr.finetuned[task], removed, theory.shields_of(report, 0), tvs[0])
    want = {r["key"]: r["bound"] for r in theory.layer_terms(*args, rule=tr.rule)}
    wrong = {r["key"]: r["bound"] for r in theory.layer_terms(*args)}
    got = {r["key"]: r["metrics"]["bound"] for r in recs if r["method"] == "layer"}
    assert got == pytest.approx(want, rel=1e-9)
    assert got["fc2.weight"] != pytest.approx(wrong["fc2.weight"], rel=1e-3)  # the view matters
    (fo,) = [r for r in recs if r["method"] == "first-order"]
    assert fo["metrics"]["bound"] == pytest.approx(sum(want.values()), rel=1e-6)


# ----------------------------------------------------------- the chapters pass tb.rule (static)

CHAPTERS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py") if 3 <= int(p.name[:2]) <= 11)


def _code_cells(path: Path) -> list[ast.Module]:
    import jupytext

    nb = jupytext.read(path)
    return [ast.parse(c.source) for c in nb.cells if c.cell_type == "code"
            and not any(line.lstrip().startswith(("!", "%")) for line in c.source.splitlines())]


def _resolve(node: ast.expr, ns: dict):
    if isinstance(node, ast.Name):
        return ns.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, ns)
        return getattr(base, node.attr, None) if base is not None and inspect.ismodule(base) else None
    return None


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapters_pass_the_testbeds_rule(path):
    """Every call in the chapter to a library function that takes ``rule`` passes ``rule=<testbed>.rule``."""
    cells = _code_cells(path)
    ns: dict = {}
    for tree in cells:  # the chapter's imports, to resolve the names it calls
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), ns)
    calls, missing = 0, []
    for i, tree in enumerate(cells, 1):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = _resolve(node.func, ns)
            if not callable(fn):
                continue
            try:
                takes = "rule" in inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if not takes:
                continue
            calls += 1
            rule = {kw.arg: kw.value for kw in node.keywords}.get("rule")
            if not (isinstance(rule, ast.Attribute) and rule.attr == "rule"):
                missing.append(f"code cell {i}, line {node.lineno}: {ast.unparse(node.func)}(...)")
    assert not missing, f"{path.name}: calls without rule=tb.rule: {missing}"
    # chapter 3's per-task pipeline (scalar.task_records) and chapters 7 and 10's filter
    # (testbeds.filtered) take the testbed itself and read its rule inside (tested there)
    expected = {"03": 0, "04": 3, "07": 1, "08": 4, "10": 1}.get(path.name[:2], 0)
    assert calls >= expected, f"{path.name}: found {calls} calls that take a rule, expected at least {expected}"


# ------------------------------------------------ chapters 4, 7, 8, 10 executed on such a testbed

@pytest.mark.slow
def test_chapters_run_on_a_testbed_with_another_rule(tmp_path):
    """The smoke parameters, with ``synthetic-3`` defined as the testbed whose rule leaves fc4
    out: chapters 4, 7, 8 and 10 execute (kernels get the definition through $PACT_TESTBEDS) and
    none of their per-layer records names fc4."""
    from conftest import load_runner

    rn = load_runner()
    smoke = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    smoke["testbeds"] = {"synthetic-3": {"family": "synthetic", "rule": NO_FC4}}
    set_path = tmp_path / "smoke-rule.yaml"
    set_path.write_text(yaml.safe_dump(smoke))
    names = ["04_subspace_perspective", "07_layer_depth", "08_efficiency", "10_theory"]
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(rn, "EXECUTED", tmp_path / "executed")
        mp.setattr(rn, "RECORDS", tmp_path / "records")
        for job in rn.prepare([ROOT / "notebooks" / f"{n}.py" for n in names], set_path, {}):
            rn.compute(job, "smoke-rule", "smoke-rule", progress=False)
    finally:
        mp.undo()
        testbeds.undefine("synthetic-3")
    out = tmp_path / "records" / "smoke-rule" / "main"
    per_layer = {"dimensions", "intrusion", "core-gap", "lbw-distance", "layer"}
    for n in names:
        recs = [json.loads(line) for line in (out / n / f"{n}.jsonl").read_text().splitlines()]
        keyed = [r for r in recs if r["method"] in per_layer]
        assert keyed, n
        assert {r["key"] for r in keyed} == set(MAPS[:3]), n
