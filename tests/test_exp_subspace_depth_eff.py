"""Helpers of book chapters 4 (subspace ablation, C4), 7 (layer depth, C9) and 8 (RSVD, C10):
exact values on planted synthetic layers, the depth-group identity with ``PactOptions(layers=)``,
and the verdict logic on hand-made records."""
from __future__ import annotations

import json
import math
import random
import re

import matplotlib
import pandas as pd
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pactlib.book.experiments import depth, efficiency, subspace  # noqa: E402
from pactlib.linalg import projector_distance  # noqa: E402
from pactlib.pact import LayerSubspaces, PactOptions, pact_filter  # noqa: E402
from pactlib.book.records import make_record, records_frame  # noqa: E402
from pactlib.outcomes import Scores, outcomes_of, scores  # noqa: E402
import outcome_records as oc  # noqa: E402
from pactlib.subspaces import LBW  # noqa: E402
from pactlib.taskvector import TaskVector  # noqa: E402
from pactlib.testbeds import alpha_grid  # noqa: E402

from conftest import make_checkpoints  # noqa: E402


def _tvs(pre, fts):
    return [TaskVector.from_checkpoints(pre, ft, name=f"task{i}") for i, ft in enumerate(fts)]


def _e(n, *idx):
    """Orthonormal basis (n, len(idx)) of coordinate axes."""
    return torch.eye(n)[:, list(idx)]


# --- depth (chapter 7) -------------------------------------------------------------------------

LITE0_KEYS = [f"_blocks.{b}.{c}.weight" for b in range(16) for c in ("_expand_conv", "_project_conv")
              if not (b == 0 and c == "_expand_conv")] + ["_conv_head.weight"]


def test_network_order_is_natural_and_matches_lite0():
    shuffled = LITE0_KEYS[:]
    random.Random(0).shuffle(shuffled)
    assert sorted(shuffled)[:4] == ["_blocks.0._project_conv.weight", "_blocks.1._expand_conv.weight",
                                    "_blocks.1._project_conv.weight", "_blocks.10._expand_conv.weight"]
    assert depth.network_order(shuffled) == LITE0_KEYS
    # the real backbone's module order (its state dict follows module registration)
    from pactlib.models.efficientnet import backbone_state_dict
    from pactlib.matrix import DEFAULT_RULE

    real = DEFAULT_RULE.matrix_keys(backbone_state_dict())
    assert len(real) == 32 and depth.network_order(sorted(real)) == real == LITE0_KEYS


def test_network_order_with_reference_and_missing_key():
    ref = ["visual.transformer.resblocks.0.attn.in_proj_weight", "visual.transformer.resblocks.0.mlp.c_fc.weight",
           "visual.proj"]
    assert depth.network_order(list(reversed(ref)), reference=ref) == ref
    assert depth.network_order(list(reversed(ref)))[0] == "visual.proj"  # natural order is not network order here
    with pytest.raises(KeyError, match="visual.nope"):
        depth.network_order(["visual.nope"], reference=ref)


def test_alpha_grid_geometric_and_widened():
    assert alpha_grid("iso_c", 3, spacing="geometric") == pytest.approx((0.1, math.sqrt(0.3), 3.0), abs=1e-4)
    g = alpha_grid("iso_c", 6, lo=0.025, spacing="geometric")
    assert g[0] == 0.025 and g[-1] == 3.0 and len(g) == 6
    ratios = [b / a for a, b in zip(g, g[1:])]
    assert max(ratios) - min(ratios) < 1e-2
    with pytest.raises(ValueError, match="points must be >= 1"):
        alpha_grid("iso_c", 0)
    with pytest.raises(ValueError, match="need 0 <= lo < hi"):
        alpha_grid("iso_c", 4, lo=5.0)


def test_layer_regexes_match_exactly_their_keys():
    keys = ["_blocks.1._expand_conv.weight"]
    pats = depth.layer_regexes(keys)
    assert pats == (r"^_blocks\.1\._expand_conv\.weight$",)
    opts = depth.group_options(PactOptions(), keys)
    assert opts.selects("_blocks.1._expand_conv.weight")
    assert not opts.selects("_blocks.11._expand_conv.weight") and not opts.selects("x_blocks.1._expand_conv.weight")
    assert opts.core_frac == PactOptions().core_frac
    with pytest.raises(ValueError, match="empty layer group"):
        depth.group_options(PactOptions(), [])


def test_group_task_vectors_equal_pact_on_that_group_only():
    pre, fts = make_checkpoints(T=3, seed=5)
    tvs = _tvs(pre, fts)
    opts = PactOptions(core_frac=0.3, active_frac=0.2)
    full, _ = pact_filter(pre, tvs, options=opts)
    group = ["pw.weight"]
    expected, rep = pact_filter(pre, tvs, options=depth.group_options(opts, group))
    assert [lr.key for lr in rep.layers] == group
    got = depth.group_task_vectors(tvs, full, group)
    for g, e, raw in zip(got, expected, tvs):
        assert g.name == raw.name and set(g) == set(e)
        for k in e:
            torch.testing.assert_close(g[k], e[k], rtol=0, atol=1e-6)
        assert not torch.equal(g["pw.weight"], raw["pw.weight"])  # the group was filtered ...
        assert torch.equal(g["lin.weight"], raw["lin.weight"])  # ... the rest was not
    with pytest.raises(ValueError, match="3 raw vs 2 filtered"):
        depth.group_task_vectors(tvs, full[:2], group)
    with pytest.raises(KeyError, match="nope"):
        depth.group_task_vectors(tvs, full, ["nope"])


def test_intrusion_energy_per_layer_and_task():
    n = 4
    # task 0's LBW = e0; task 1's LBW = {e1, e2}; Δ0 = [[1, 2, 0, 0]], Δ1 = [[3, 0, 0, 4]]
    d0, d1 = torch.tensor([[1.0, 2.0, 0.0, 0.0]]), torch.tensor([[3.0, 0.0, 0.0, 4.0]])
    tvs = [TaskVector({"w": d0}, name="a"), TaskVector({"w": d1}, name="b")]
    subs = {"w": LayerSubspaces(core=_e(n, 0, 1, 2), active=[_e(n, 1), _e(n, 0)],
                                lbw=[LBW(_e(n, 0), torch.ones(3)), LBW(_e(n, 1, 2), torch.ones(3))])}
    recs = depth.intrusion_records(tvs, subs, keys=["w"], params={}, seed=0, suite="8")
    got = {r["task"]: r["metrics"] for r in recs}
    assert got["a"]["intrusion"] == pytest.approx(9 / 25)  # ‖Δ1 e0‖² / ‖Δ1‖²
    assert got["b"]["intrusion"] == pytest.approx(4 / 5)  # ‖Δ0 [e1 e2]‖² / ‖Δ0‖²
    assert got["a"]["chance"] == 0.25 and got["b"]["chance"] == 0.5 and got["b"]["lbw_rank"] == 2
    assert recs[0]["depth"] == 0 and recs[0]["T"] == 2 and recs[0]["suite"] == "8"
    with pytest.raises(ValueError, match="at least two"):
        depth.intrusion_records(tvs[:1], subs, keys=["w"], params={}, seed=0)
    with pytest.raises(KeyError, match="'v'"):
        depth.intrusion_records(tvs, subs, keys=["v"], params={}, seed=0)


def _group_frame(gains_by_suite, base=0.80):
    recs = []
    for suite, gains in gains_by_suite.items():
        for seed in (0, 1):
            recs.append(make_record("m", params={}, seed=seed, suite=suite, group="none", metrics={"norm_acc": base}))
            for g, v in gains.items():
                recs.append(make_record("m", params={}, seed=seed, suite=suite, group=g,
                                        metrics={"norm_acc": base + v / 100}))
    return records_frame(recs)


def test_group_gains_and_c9_reproduced():
    f = _group_frame({"8": dict(early=2.0, middle=0.5, late=0.1, all=3.0),
                      "20": dict(early=1.0, middle=1.0, late=0.5, all=5.0)})
    g = depth.group_gains(f)
    assert len(g) == 16
    assert g[(g.suite == "8") & (g.group == "early")]["gain"].tolist() == pytest.approx([2.0, 2.0])
    v = depth.c9_verdicts(f, suites=["8", "20"])  # records without outcomes: nothing to grade on (test_verdicts)
    assert v["early"]["status"] == v["whole"]["status"] == "not yet tested"
    assert depth.gain_intervals(f, suites=["8", "20"]) == {} and depth.gain_table(f, suites=["8"]).empty


def test_condition_and_intrusion_tables():
    f = _group_frame({"8": dict(early=2.0, all=3.0), "20": dict(early=1.0, all=5.0)})
    f["alpha"] = 1.0
    f["metrics.acc"] = f["metrics.norm_acc"] - 0.1
    t = depth.condition_table(f)
    assert list(t.index) == ["none", "early", "all"]
    assert list(t.columns) == [(q, s) for q in ("acc %", "norm. acc %", "alpha") for s in ("8", "20")]
    assert t.loc["all", ("norm. acc %", "20")] == pytest.approx(85.0) and t.loc["none", ("acc %", "8")] == pytest.approx(70.0)
    assert t.loc["early", ("alpha", "8")] == 1.0
    f["on_edge"] = f["group"] == "none"
    t = depth.condition_table(f)
    assert t.loc["none", ("α on edge", "20")] == 1.0 and t.loc["all", ("α on edge", "8")] == 0.0
    recs = [make_record("intrusion", params={}, seed=0, suite="8", key=k, depth=i, task="a",
                        metrics={"intrusion": 0.1 * (i + 1), "chance": 0.05}) for i, k in enumerate("wxyz")]
    it = depth.intrusion_table(records_frame(recs), {"early": ["w", "x"], "late": ["y", "z"], "all": list("wxyz")})
    assert list(it.index) == ["early", "late"]
    assert it.loc["early", ("intrusion %", "8")] == pytest.approx(15.0) and it.loc["late", ("r/n %", "8")] == pytest.approx(5.0)
    assert it.loc["late", ("intrusion / (r/n)", "8")] == pytest.approx(7.0)  # (6 + 8) / 2


def test_layer_records_round_trip_the_depth_groups_through_a_records_file(tmp_path):
    from pactlib.book import study
    from pactlib.book.records import read_records, write_records

    keys = [f"_blocks.{i}._project_conv.weight" for i in (0, 2, 10, 11, 12)]  # 10 after 2: network order kept
    groups = study.depth_groups(keys)
    recs = depth.layer_records(groups, params={"x": 1}, testbed="t")
    assert [r["depth"] for r in recs] == [0, 1, 2, 3, 4] and {r["testbed"] for r in recs} == {"t"}
    assert [r["group"] for r in recs] == ["early", "early", "middle", "middle", "late"]
    path = write_records(tmp_path / "layers.jsonl", [*recs[::-1], make_record("other", params={}, seed=0, metrics={})])
    got_keys, got = depth.groups_from_records(read_records(path))  # any file order; other records ignored
    assert got_keys == keys and got == groups and list(got) == ["early", "middle", "late", "all"]
    assert depth.groups_from_records(records_frame(path)) == (keys, groups)
    with pytest.raises(ValueError, match="no 'depth-layer'"):
        depth.groups_from_records([make_record("other", params={}, seed=0, metrics={})])
    with pytest.raises(ValueError, match="in no depth group"):
        depth.layer_records({"early": keys[:1], "all": keys}, params={})
    with pytest.raises(ValueError, match="'all'"):
        depth.layer_records({"early": keys}, params={})


def test_depth_plots_draw_every_group_and_suite():
    f = _group_frame({"8": dict(early=2.0, middle=0.5, late=0.1, all=3.0)})
    fig, ax = plt.subplots()
    g = depth.plot_group_gains(f, ax=ax, suites=["8"])
    assert len(ax.patches) == 4 and [p.get_height() for p in ax.patches] == pytest.approx([2.0, 0.5, 0.1, 3.0])
    assert len(g) == 8
    plt.close(fig)
    recs = [make_record("intrusion", params={}, seed=0, suite=s, depth=d, task=t,
                        metrics={"intrusion": 0.1 * d + (0.05 if t == "b" else 0), "chance": 0.1})
            for s in ("8", "20") for d in range(3) for t in "ab"]
    fig, ax = plt.subplots()
    depth.plot_intrusion(records_frame(recs), ax=ax, suites=["8", "20"], bounds={"middle": 1})
    assert len(ax.lines) == 2 * 2 + 1
    assert list(ax.lines[0].get_ydata()) == pytest.approx([2.5, 12.5, 22.5])
    plt.close(fig)
    fig, ax = plt.subplots()
    depth.plot_intrusion(records_frame(recs), ax=ax, suites=["8"], relative=True)
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.25, 1.25, 2.25]) and len(ax.lines) == 2
    plt.close(fig)


# --- subspace (chapter 4) ----------------------------------------------------------------------

def _planted_layer():
    """W0 (6, 8) whose top-2 input directions are e0, e1 (σ 5, 4; the rest ≤ 0.5); task 0 updates
    along e0, task 1 along e5."""
    W0 = torch.zeros(6, 8)
    W0[0, 0], W0[1, 1] = 5.0, 4.0
    for i in range(2, 6):
        W0[i, i] = 0.5 - 0.1 * (i - 2)
    d0, d1 = torch.zeros(6, 8), torch.zeros(6, 8)
    d0[0, 0], d1[2, 5] = 0.3, 0.2
    return W0, d0, d1


def test_subspaces_by_layer_planted_lbw_and_dimensions():
    W0, d0, d1 = _planted_layer()
    pre = {"b.weight": W0.reshape(6, 8, 1, 1), "a.weight": W0.clone()}
    tvs = [TaskVector({"b.weight": d0.reshape(6, 8, 1, 1), "a.weight": d0}, name="t0"),
           TaskVector({"b.weight": d1.reshape(6, 8, 1, 1), "a.weight": d1}, name="t1")]
    opts = PactOptions(core_frac=2 / 6, active_frac=1 / 6, lbw_tol=0.5)  # K = 2, k = 1
    subs = subspace.subspaces_by_layer(pre, tvs, options=opts)
    assert list(subs) == ["a.weight", "b.weight"]
    s = subs["b.weight"]
    assert s.core.shape == (8, 2) and projector_distance(s.core, _e(8, 0, 1)) < 1e-5
    assert s.lbw[0].basis.shape[1] == 1 and projector_distance(s.lbw[0].basis, _e(8, 1)) < 1e-5
    assert s.lbw[1].basis.shape[1] == 2 and projector_distance(s.lbw[1].basis, _e(8, 0, 1)) < 1e-5
    recs = subspace.dimension_records(pre, subs, ["t0", "t1"], tol=0.5, params={}, seed=3, suite="8")
    m = {(r["key"], r["task"]): r["metrics"] for r in recs}
    assert m["b.weight", "t0"] == pytest.approx(dict(m=6, n=8, K=2, k=1, lbw_rank=1, sigma_mean=0.5, sigma_min=0.0,
                                                     survive=0.5, core_energy=41 / (41 + 0.25 + 0.16 + 0.09 + 0.04)),
                                                abs=1e-5)
    assert m["b.weight", "t1"]["survive"] == 1.0 and m["b.weight", "t1"]["sigma_min"] == pytest.approx(1.0)
    assert {r["depth"] for r in recs if r["key"] == "b.weight"} == {1} and recs[0]["seed"] == 3
    with pytest.raises(KeyError, match="'c.weight'"):
        subspace.subspaces_by_layer(pre, tvs, keys=["c.weight"])
    with pytest.raises(ValueError, match="no task vectors"):
        subspace.subspaces_by_layer(pre, [])


def _subs_fixture():
    W0, d0, d1 = _planted_layer()
    pre = {"w": W0}
    tvs = [TaskVector({"w": d0}, name="t0"), TaskVector({"w": d1}, name="t1")]
    return pre, tvs, subspace.subspaces_by_layer(pre, tvs, options=PactOptions(core_frac=0.5, active_frac=1 / 6))


def test_ablation_bases_conditions():
    pre, tvs, subs = _subs_fixture()  # K = 3 (e0, e1, e2), k = 1
    s = subs["w"]
    r = s.lbw[0].basis.shape[1]
    assert r == 2
    lbw = subspace.ablation_bases(subs, 0, "lbw")["w"]
    assert lbw is s.lbw[0].basis
    theta = {"w": pre["w"] + tvs[0]["w"]}
    for cond, dim in (("random", r), ("complement", r), ("energy", 3)):
        V = subspace.ablation_bases(subs, 0, cond, seed=1, state=theta)["w"]
        assert V.shape == (8, dim)
        torch.testing.assert_close(V.T @ V, torch.eye(dim), atol=1e-5, rtol=0)
        assert torch.equal(V, subspace.ablation_bases(subs, 0, cond, seed=1, state=theta)["w"])  # reproducible
        assert not torch.allclose(V, subspace.ablation_bases(subs, 0, cond, seed=1, draw=1, state=theta)["w"])
    comp = subspace.ablation_bases(subs, 0, "complement", seed=2)["w"]
    assert float((s.active[0].T @ comp).abs().max()) < 1e-5
    # energy-matched: θt's energies on e0..e5 are 5.3², 4², 0.5², 0.4², 0.3², 0.2²; the LBW {e1, e2}
    # holds e = 16.25 / 44.63 of it, so r' = round(8 e) = 3 random directions (expected share 3/8)
    with pytest.raises(ValueError, match="needs the state dict"):
        subspace.ablation_bases(subs, 0, "energy")
    with pytest.raises(ValueError, match="unknown ablation condition 'lbw2'"):
        subspace.ablation_bases(subs, 0, "lbw2")


def test_removed_energy_pooled_and_per_layer():
    state = {"a": torch.diag(torch.tensor([3.0, 1.0])), "b": torch.tensor([[0.0, 2.0]])}
    e = subspace.removed_energy(state, {"a": _e(2, 0), "b": _e(2, 0)})
    assert e["pooled"] == pytest.approx(9 / 14) and e["layer_mean"] == pytest.approx((0.9 + 0.0) / 2)


class FakeBed:
    """A testbed whose "accuracy" of a state is 0.9 minus the weight energy removed from layer w."""

    def __init__(self, pre, tvs):
        self.tasks = [tv.name for tv in tvs]
        self.finetuned = {tv.name: tv.apply_to(pre, 1.0) for tv in tvs}
        self.ft_test = {t: 0.9 for t in self.tasks}
        self.calls = 0

    def evaluate(self, state, split, tasks):
        assert split == "test"
        self.calls += 1
        ref = self.finetuned[tasks[0]]["w"]
        return {tasks[0]: 0.9 - float(1 - state["w"].pow(2).sum() / ref.pow(2).sum())}


class ScoredBed(FakeBed):
    """FakeBed whose evaluations are Scores: θt gets the first 8 of 10 test examples right, an
    ablated state the first round(10 × its accuracy)."""

    def __init__(self, pre, tvs):
        super().__init__(pre, tvs)
        self.ft_test = Scores({t: 0.8 for t in self.tasks}, {t: torch.arange(10) < 8 for t in self.tasks})

    def evaluate(self, state, split, tasks):
        acc = super().evaluate(state, split, tasks)[tasks[0]]
        return scores({tasks[0]: torch.arange(10) < round(10 * acc)})


def test_ablation_records_keep_the_ablated_models_outcomes():
    pre, tvs, subs = _subs_fixture()
    tb = ScoredBed(pre, tvs)
    recs = subspace.ablation_records(tb, "t0", subs, draws=1, seed=2, params={}, conditions=("lbw", "random"), suite="8")
    assert [r["method"] for r in recs] == ["finetuned", "ablate", "ablate"]
    assert outcomes_of(recs[0])["t0"].tolist() == [True] * 8 + [False] * 2 and recs[0]["seed"] == 2
    assert recs[0]["suite"] == "8"
    for r in recs[1:]:
        got = outcomes_of(r)["t0"]
        assert got.float().mean() == pytest.approx(r["metrics"]["acc"]) and len(got) == 10


def test_ablation_records_measure_drop_and_energy_without_mutating():
    pre, tvs, subs = _subs_fixture()
    tb = FakeBed(pre, tvs)
    before = tb.finetuned["t0"]["w"].clone()
    recs = subspace.ablation_records(tb, "t0", subs, draws=2, seed=0, params={"x": 1}, suite="8")
    assert tb.calls == 1 + 3 * 2 and len(recs) == 7
    assert torch.equal(tb.finetuned["t0"]["w"], before)
    for r in recs:
        assert r["metrics"]["drop"] == pytest.approx(r["metrics"]["energy"], abs=1e-5) and r["strength"] == 1.0
        assert r["metrics"]["dims"] == (3 if r["condition"] == "energy" else 2)
        assert r["task"] == "t0" and r["suite"] == "8"
    lbw = next(r for r in recs if r["condition"] == "lbw")
    # θt = W0 + Δ0 has energies 5.3², 4², 0.5², 0.4², 0.3², 0.2² on e0..e5; the LBW is {e1, e2}
    assert lbw["metrics"]["energy"] == pytest.approx(16.25 / (5.3 ** 2 + 16.25 + 0.16 + 0.09 + 0.04), abs=1e-5)
    assert [r["draw"] for r in recs if r["condition"] == "random"] == [0, 1]
    assert lbw["metrics"]["overlap"] == pytest.approx(1.0, abs=1e-5)
    assert all(0 <= r["metrics"]["overlap"] <= 1 + 1e-5 for r in recs)
    summary = subspace.condition_summary(records_frame(recs))
    assert list(summary.index) == [("1", subspace.LABELS[c]) for c in subspace.CONDITIONS]
    lb = ("1", subspace.LABELS["lbw"])
    assert summary.loc[lb, "overlap with LBW %"] == pytest.approx(100, abs=1e-3) and summary.loc[lb, "dimensions"] == 2
    assert summary.loc[("1", subspace.LABELS["random"]), "drop (points)"] == pytest.approx(
        100 * sum(r["metrics"]["drop"] for r in recs if r["condition"] == "random") / 2)
    # partial ablation W − γ W V Vᵀ removes (1 − (1 − γ)²) of the subspace's energy
    half = subspace.ablation_records(tb, "t0", subs, draws=1, seed=0, params={}, strengths=(0.5, 1.0),
                                     conditions=("lbw",))
    assert [r["strength"] for r in half] == [0.5, 1.0]
    assert half[0]["metrics"]["removed"] == pytest.approx(0.75 * half[1]["metrics"]["removed"])
    assert all(r["metrics"]["drop"] == pytest.approx(r["metrics"]["removed"], abs=1e-5) for r in half)
    with pytest.raises(ValueError, match=r"strengths must be in \(0, 1\]"):
        subspace.ablation_records(tb, "t0", subs, draws=1, seed=0, params={}, strengths=(0.0,))
    with pytest.raises(KeyError, match="'t9'"):
        subspace.ablation_records(tb, "t9", subs, draws=1, seed=0, params={})


def _ablate_frame(drops, *, strength=1.0, seeds=(0,), lost=None):
    """drops: {(task, condition): [drop per draw]} -> frame of ablate records at one strength γ;
    with ``lost`` ({(task, condition): [θt's right test examples lost, per draw]}), θt's
    "finetuned" records and per-example outcomes too (tests/outcome_records.py)."""
    return records_frame(_ablate_recs(drops, strength=strength, seeds=seeds, lost=lost))


def _ablate_recs(drops, *, strength=1.0, seeds=(0,), lost=None, finetuned=True):
    recs = []
    for seed in seeds:
        if lost is not None and finetuned:
            recs += [make_record("finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                 outcomes=oc.outcomes(t)) for t in dict.fromkeys(t for t, _ in drops)]
        for (t, c), ds in drops.items():
            for i, d in enumerate(ds):
                extra = {} if lost is None else {"outcomes": oc.outcomes(t, lost[t, c][i])}
                recs.append(make_record("ablate", params={}, seed=seed, task=t, condition=c, draw=i, strength=strength,
                                        metrics={"drop": d, "energy": 0.5 if c in ("lbw", "energy") else 0.05,
                                                 "removed": 0.5 if c in ("lbw", "energy") else 0.05, "acc": 0.9 - d},
                                        **extra))
    return recs


def _lost(drops):
    return {k: [round(d * oc.N) for d in ds] for k, ds in drops.items()}


def _c4(drops, *, margin=0.02, weak=None):
    recs = _ablate_recs(drops, seeds=(0, 1, 2), lost=_lost(drops))
    if weak is not None:  # the smaller dose γ = 0.25, not graded
        recs += _ablate_recs(weak, strength=0.25, seeds=(0, 1, 2), lost=_lost(weak), finetuned=False)
    return subspace.c4_verdict(records_frame(recs), margin=margin)


STRONG = {("a", "lbw"): [0.5], ("a", "random"): [0.01, 0.05], ("a", "complement"): [0.0, 0.02],
          ("a", "energy"): [0.45, 0.5], ("b", "lbw"): [0.3], ("b", "random"): [0.1, 0.2],
          ("b", "complement"): [0.1, 0.1], ("b", "energy"): [0.1, 0.1]}


def test_c4_verdict_grades_paired_excess_drops_at_the_removal():
    weak = {k: [0.0] * len(v) for k, v in STRONG.items()}
    v = _c4(STRONG, weak=weak)
    assert v["status"] == "reproduced" and [c["grade"] for c in v["conditions"]] == ["holds", "holds"]
    rand, comp = v["conditions"]
    # random: a 50 − 3, b 30 − 15 -> 31; complement: a 50 − 1, b 30 − 10 -> 34.5 (points)
    assert rand["name"] == "drop(V_LBW) − drop(random in ℝⁿ), γ = 1" and rand["estimate"] == pytest.approx(31.0)
    assert comp["estimate"] == pytest.approx(34.5) and rand["threshold"] == pytest.approx(2.0)
    assert rand["n_examples"] == oc.N and rand["n_seeds"] == 3
    assert "LBW drop at γ = 1: +40.0 [" in v["evidence"] and "(400 per task), 3 seed(s)" in v["evidence"]
    assert "γ = 0.25, random in ℝⁿ: +0.0 [+0.0, +0.0]" in v["evidence"]  # reported, not graded
    assert "γ = 1, random in ℝⁿ, energy-matched: +11.2 [" in v["evidence"]  # a 50 − 47.5, b 30 − 10
    far = _c4(STRONG, margin=0.4)  # 31 and 34.5 points lie wholly below 40
    assert far["status"] == "contradicted" and all(c["grade"] == "fails" for c in far["conditions"])
    close = {("a", "lbw"): [0.05], ("a", "random"): [0.025], ("a", "complement"): [0.0],
             ("b", "lbw"): [0.05], ("b", "random"): [0.025], ("b", "complement"): [0.0]}
    v = _c4(close)  # random: 2.5 points, across the 2-point margin; complement: 5 points, above it
    assert [c["grade"] for c in v["conditions"]] == ["inconclusive", "holds"] and v["status"] == "partly reproduced"
    assert v["conditions"][0]["needs"].startswith("needs ≈ ")
    bare = subspace.c4_verdict(_ablate_frame(STRONG))
    assert bare["status"] == "not yet tested" and "records without per-example outcomes: recompute" in bare["evidence"]


def test_contrast_table_gives_drops_and_excess_with_intervals():
    t = subspace.contrast_table(_ablate_frame(STRONG, seeds=(0, 1, 2), lost=_lost(STRONG)))
    assert list(t.index) == [("1", subspace.PLAIN[c]) for c in subspace.CONDITIONS]
    assert t.loc[("1", "V_t,LBW"), "drop (points)"].startswith("+40.0 [") and t.loc[("1", "V_t,LBW"), "drop(LBW) − drop (points)"] == ""
    assert t.loc[("1", "random ⊥ V_t,k"), "drop(LBW) − drop (points)"].startswith("+34.5 [")
    assert t["seeds"].tolist() == [3] * 4 and t["examples per task"].tolist() == [oc.N] * 4


def test_subspace_plots_and_table():
    drops = {("a", c): [0.1 * (i + 1)] for i, c in enumerate(subspace.CONDITIONS)}
    f = _ablate_frame(drops)
    fig, ax = plt.subplots()
    subspace.plot_drops(f, ax=ax)
    assert [p.get_height() for p in ax.patches] == pytest.approx([10, 20, 30, 40])
    assert not ax.containers[4:]  # bars only: no error bars without intervals
    plt.close(fig)
    g = _ablate_frame(drops, seeds=(0, 1, 2), lost=_lost(drops))
    fig, ax = plt.subplots()
    subspace.plot_drops(g, ax=ax, errors=subspace.contrasts(g, by_task=True))
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 4  # one 95 % error bar per condition's bar
    seg = bars[0].lines[2][0].get_segments()[0]  # the LBW bar's: 10 points ± its paired interval
    assert seg[0][1] < 10 < seg[1][1]
    plt.close(fig)
    fig, ax = plt.subplots()
    subspace.plot_energy(f, ax=ax)
    assert len(ax.collections) == 4
    plt.close(fig)
    t = subspace.drop_table(f)
    assert list(t.columns) == [subspace.LABELS[c] for c in subspace.CONDITIONS]
    assert t.loc[("1", "a"), subspace.LABELS["energy"]] == pytest.approx(40)
    W0, d0, d1 = _planted_layer()
    pre, tvs, subs = _subs_fixture()
    dims = records_frame(subspace.dimension_records(pre, subs, ["t0", "t1"], tol=0.5, params={}, seed=0))
    fig, axes = plt.subplots(1, 2)
    subspace.plot_dimensions(dims, axes=axes)
    assert len(axes[0].lines) == 4 and len(axes[1].lines) == 3
    plt.close(fig)


# --- efficiency (chapter 8) --------------------------------------------------------------------

def test_time_filter_and_exact_rsvd_comparison():
    pre, fts = make_checkpoints(T=3, seed=2)
    tvs = _tvs(pre, fts)
    exact = PactOptions(core_frac=0.3, active_frac=0.2)
    secs, filt, rep = efficiency.time_filter(pre, tvs, exact, repeats=2)
    assert secs > 0 and rep.subspaces and set(rep.shields) == set(rep.subspaces)
    ref, _ = pact_filter(pre, tvs, options=exact)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(filt, ref) for k in a)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        efficiency.time_filter(pre, tvs, exact, repeats=0)
    keys = [lr.key for lr in rep.layers]
    same = efficiency.basis_records(rep, rep, params={}, seed=0, keys=keys, tasks=["a", "b", "c"])
    assert len(same) == 3 * len(keys)
    assert all(r["metrics"]["dist"] < 1e-6 and r["metrics"]["dist_spectral"] < 1e-6 for r in same)
    # randomized SVD without oversampling or power iterations: a worse, but valid, subspace
    _, filt2, rep2 = efficiency.time_filter(pre, tvs, exact.replace(svd="rsvd", oversample=0, n_iter=0))
    far = efficiency.basis_records(rep, rep2, params={}, seed=0, keys=keys, tasks=["a", "b", "c"], n_iter=0)
    assert all(0 <= r["metrics"]["dist"] <= math.sqrt(2) + 1e-6 for r in far) and far[0]["n_iter"] == 0
    assert max(r["metrics"]["dist"] for r in far) > 1e-3
    ch = efficiency.change_records(filt, filt2, keys=keys, params={}, seed=0)
    assert [r["task"] for r in ch] == ["task0", "task1", "task2"]
    assert all(r["metrics"]["rel_change"] > 0 for r in ch)
    assert all(r["metrics"]["rel_change"] == 0 for r in efficiency.change_records(filt, ref, keys=keys, params={}, seed=0))
    with pytest.raises(KeyError, match="keep=True"):
        efficiency.basis_records(rep, rep, params={}, seed=0, keys=["dw.weight"], tasks=["a"])


def test_subspace_distances_match_projector_distance_and_resolve_tiny_angles():
    g = torch.Generator().manual_seed(0)
    V1 = torch.linalg.qr(torch.randn(50, 4, generator=g, dtype=torch.float64))[0]
    V2 = torch.linalg.qr(torch.randn(50, 4, generator=g, dtype=torch.float64))[0]
    fro, spec = efficiency.subspace_distances(V1, V2)
    assert fro == pytest.approx(projector_distance(V1, V2, norm="fro"), rel=1e-9)
    assert spec == pytest.approx(projector_distance(V1, V2), rel=1e-9)
    # rotate one basis vector by a tiny angle: both distances must see it (the textbook form cannot in float32)
    eps = 1e-5
    W = V1.clone()
    W[:, 0] = math.cos(eps) * V1[:, 0] + math.sin(eps) * torch.linalg.qr(torch.cat([V1, V2[:, :1]], 1))[0][:, 4]
    fro, spec = efficiency.subspace_distances(V1.float(), W.float())
    assert fro == pytest.approx(math.sqrt(2) * eps, rel=0.05) and spec == pytest.approx(eps, rel=0.05)
    assert efficiency.subspace_distances(V1.float(), V1.float())[0] < 1e-6
    assert efficiency.subspace_distances(V1, V2[:, :3])[1] == 1.0
    assert efficiency.subspace_distances(V1[:, :0], V2[:, :0]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="different spaces"):
        efficiency.subspace_distances(V1, V2[:10])


def test_gap_records_and_correlation():
    # W0 = diag(10, 9, 1, 0.5, 0.25, ...) on (8, 8): K = 2 (frac 0.25), p = 1 -> gap = σ4 / σ2 = 0.5 / 9
    W0 = torch.diag(torch.tensor([10.0, 9.0, 1.0, 0.5, 0.25, 0.2, 0.1, 0.05]))
    opts = PactOptions(core_frac=0.25, active_frac=0.25, oversample=1)
    recs = efficiency.gap_records({"w": W0, "v": W0[:3, :2]}, opts, keys=["w", "v"], params={}, seed=0)
    assert recs[0]["metrics"] == pytest.approx({"gap": 0.5 / 9, "K": 2})
    assert recs[1]["metrics"]["gap"] == 0.0 and recs[1]["depth"] == 1  # K + p = 2 >= rank 2: nothing outside
    dist = [make_record("lbw-distance", params={}, seed=0, n_iter=2, depth=d, task="a", metrics={"dist": x})
            for d, x in enumerate([0.1, 0.3, 0.2, 0.4])]
    gaps = [make_record("core-gap", params={}, seed=0, depth=d, metrics={"gap": g}) for d, g in enumerate([0.2, 0.6, 0.4, 0.9])]
    assert efficiency.gap_correlation(records_frame(dist + gaps), 2) == pytest.approx(1.0)
    assert math.isnan(efficiency.gap_correlation(records_frame(dist), 2))


def test_randomized_share_counts_the_fallback():
    pre, fts = make_checkpoints(T=2)
    tvs = _tvs(pre, fts)
    opts = PactOptions(core_frac=0.1, active_frac=0.1, svd="rsvd")
    # layers: lin (12, 10), pw (9, 12), head (4, 9): rank 1 everywhere; r + p >= min(m, n): all exact
    assert efficiency.randomized_share(pre, tvs, opts) == 0.0
    assert efficiency.randomized_share(pre, tvs, opts.replace(oversample=5, active_oversample=5)) == \
        pytest.approx(6 / 9)  # lin, pw: 1+5 < 9, 10
    # the core uses oversample, the task updates active_oversample: only lin's and pw's cores
    assert efficiency.randomized_share(pre, tvs, opts.replace(oversample=5)) == pytest.approx(2 / 9)
    assert efficiency.randomized_share(pre, tvs, opts.replace(svd="exact", oversample=0)) == 0.0


def test_read_bench_and_table(tmp_path):
    assert efficiency.read_bench(tmp_path / "missing.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="bad.json"):
        efficiency.read_bench(bad)
    good = tmp_path / "b.json"
    good.write_text(json.dumps({"blocks": 12, "tasks": 8, "speedup_rsvd": 6.25, "t_filter_exact": 80.0,
                                "lbw_projector_distance_mean": 1.5e-4}))
    b = efficiency.read_bench(good)
    t = efficiency.bench_table(b)
    assert t.loc["speed-up of RSVD", "value"] == "6.2×" and t.loc["PACT filter, exact SVD (s)", "value"] == "80.0"
    assert t.loc["LBW projector distance / √r, mean", "value"] == "1.50e-04" and len(t) == 5
    assert efficiency.bench_sweep_table(b).empty
    # nested records (the previous defaults) by dotted key; the sweep as its own table
    b = {"speedup_rsvd": 2.5, "previous": {"speedup": 3.25, "lbw_projector_distance_mean": 0.42},
         "sweep": [dict(oversample=10, n_iter=2, route="direct", routes_used="direct", t_svd=1.0, speedup_svd=14.0,
                        lbw_fro_mean=0.42, lbw_fro_max=0.45, lbw_spectral_mean=0.99, lbw_spectral_max=1.0,
                        core_spectral_max=1.0, active_spectral_max=0.86),
                   dict(core_oversample=40, core_n_iter=8, core_route="auto", oversample=10, n_iter=2, route="direct",
                        routes_used="direct+gram", t_svd=1.5, speedup_svd=9.0, lbw_fro_mean=0.04, lbw_fro_max=0.07,
                        lbw_spectral_mean=0.15, lbw_spectral_max=0.31, core_spectral_max=0.05, active_spectral_max=0.86)]}
    t = efficiency.bench_table(b)
    assert t.loc["previous RSVD (p = 10, q = 2): speed-up", "value"] == "3.2×" and len(t) == 3
    sw = efficiency.bench_sweep_table(b)
    assert list(sw["core (p, q, route)"]) == ["10, 2, direct", "40, 8, auto"]
    assert list(sw["updates (p, q, route)"]) == ["10, 2, direct"] * 2 and sw["LBW /√r max"].tolist() == [0.45, 0.07]


def test_floor_table_sets_the_least_ratio_beside_the_measured_one():
    floor = {"floors": {"8": {"floor": 2.4, "projections_only": 1.7, "actives_only": 1.7},
                        "2": {"floor": 1.3, "projections_only": 1.1, "actives_only": 1.2}}}
    ratio = dict(kind="time_ratio", method="iso_c", mode="pact-rsvd", ratio=9.0)
    scale = [dict(ratio, tasks=8, cpu_ratio=3.0, model="vit_b32"), dict(ratio, tasks=8, cpu_ratio=2.9, model="vit_b32"),
             dict(ratio, tasks=2, model="vit_l14", cpu_ratio=1.4), dict(ratio, tasks=8, mode="pact", cpu_ratio=7.0),
             dict(ratio, tasks=8, method="task_arithmetic", cpu_ratio=8.0), {"kind": "run", "tasks": 8}]
    t = efficiency.floor_table(floor, scale)
    assert list(t.index) == [2, 8]  # by T, not by the file's order
    assert list(t.columns) == ["least possible", "active SVDs alone", "projections alone", "measured, vit_b32",
                               "measured, vit_l14"]
    assert t.loc[8, "measured, vit_b32"] == 2.9  # the last record per (model, T); exact PACT and TA left out
    assert t.loc[2, "measured, vit_l14"] == 1.4 and math.isnan(t.loc[8, "measured, vit_l14"])
    assert t.loc[2, "least possible"] == 1.3 and list(efficiency.floor_table(floor).columns)[-1] == "projections alone"
    wall = {"threads": 2, "floors": {"8": {"floor": 2.2}}}  # the all-cores record, wall time
    tw = efficiency.floor_table(floor, scale, wall)
    assert list(tw.columns)[3] == "least possible, 2 threads" and tw.loc[8, "least possible, 2 threads"] == 2.2
    assert math.isnan(tw.loc[2, "least possible, 2 threads"])  # a T the wall record lacks
    with pytest.raises(KeyError):
        efficiency.floor_table({"blocks": 12})
    with pytest.raises(KeyError, match="actives_only"):  # an older record: no silent NaN column
        efficiency.floor_table({"floors": {"8": {"floor": 2.4, "projections_only": 1.7}}})


def _acc_frame(exact, other, n_test=1000):
    recs = [make_record(m, params={}, seed=s, n_test=n_test, metrics={"acc": a})
            for m, accs in (("pact-iso_c", exact), ("pact-rsvd-iso_c", other)) for s, a in enumerate(accs)]
    return records_frame(recs)


def test_accuracy_check_tolerance():
    c = efficiency.accuracy_check(_acc_frame([0.8], [0.805]), exact="pact-iso_c", other="pact-rsvd-iso_c")
    assert c["n_seeds"] == 1 and c["spread"] == 0 and c["tol"] == pytest.approx(math.sqrt(0.16 / 1000))
    assert c["diff"] == pytest.approx(0.005)
    c = efficiency.accuracy_check(_acc_frame([0.7, 0.8, 0.9], [0.7, 0.8, 0.9]), exact="pact-iso_c",
                                  other="pact-rsvd-iso_c")
    assert c["tol"] == pytest.approx(0.1) and c["diff"] == pytest.approx(0) and c["n_seeds"] == 3
    with pytest.raises(ValueError, match="no seed has both"):
        efficiency.accuracy_check(_acc_frame([0.8], [0.8]), exact="pact-iso_c", other="iso_c")


def test_c10_verdict_reports_the_benchmark_beside_its_conditions():
    f = _acc_frame([0.8], [0.805])  # no per-example outcomes: not graded, the benchmark still reported
    v = efficiency.c10_verdict(f, exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=[1.1],
                               bench={"speedup_rsvd": 6.0, "blocks": 12}, rsvd_share=0.5)
    assert v["status"] == "not yet tested" and "6.0× faster" in v["evidence"] and "50 %" in v["evidence"]
    assert "RSVD 1.10× faster (goal > 2×, 1 seed(s))" in v["evidence"]
    v = efficiency.c10_verdict(f, exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=[3.0],
                               bench={"speedup_rsvd": 3.2, "blocks": 12, "lbw_projector_distance_mean": 0.424,
                                      "filtered_rel_change_mean": 0.175})
    assert "projector distance / √r 0.42" in v["evidence"] and "differ by 18 %" in v["evidence"]
    v = efficiency.c10_verdict(f, exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=[3.0],
                               bench={"speedup_rsvd": 2.7, "blocks": 12, "oversample": 40, "n_iter": 8,
                                      "lbw_projector_distance_mean": 0.011, "filtered_rel_change_mean": 0.004})
    assert "2.7× faster with p = 40, q = 8" in v["evidence"] and "√r 0.011" in v["evidence"] and "by 0.4 %" in v["evidence"]
    assert "not run" in efficiency.c10_verdict(f, exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=[3.0],
                                               bench=None)["evidence"]
    with pytest.raises(ValueError, match="no seed has both"):
        efficiency.c10_verdict(f, exact="pact-iso_c", other="iso_c", speedups=[3.0], bench=None)
    assert efficiency.accuracy_contrasts(f, "iso_c") == {}


def test_plot_floor_draws_each_column_without_its_gaps_and_the_goal():
    t = pd.DataFrame({"least possible": [1.3, 2.6, 6.1], "active SVDs alone": [1.2, 1.8, 2.9],
                      "least possible, 2 threads": [1.3, 2.4, 5.6], "measured, vit_b32": [1.6, math.nan, 7.4]},
                     index=pd.Index([2, 8, 20], name="tasks"))
    fig, ax = plt.subplots()
    efficiency.plot_floor(t, ax=ax, goal=2.0)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["measured, vit_b32"].get_xdata()) == [2, 20]  # the NaN at T = 8 left out
    assert [lines[c].get_linestyle() for c in t.columns] == ["--", ":", "--", "-"]  # floors, a part, measured
    goal = [ln for ln in ax.get_lines() if list(ln.get_ydata()) == [2.0, 2.0]]
    assert len(goal) == 1 and ax.get_yscale() == "log"
    plt.close(fig)


def test_plot_distances_one_line_per_q():
    recs = [make_record("lbw-distance", params={}, seed=0, n_iter=q, depth=d, task=t,
                        metrics={"dist": 1e-3 * q * (d + 1)}) for q in (1, 2) for d in range(3) for t in "ab"]
    fig, ax = plt.subplots()
    efficiency.plot_distances(records_frame(recs), ax=ax)
    assert len(ax.lines) == 2 and list(ax.lines[1].get_ydata()) == pytest.approx([2e-3, 4e-3, 6e-3])
    plt.close(fig)


def test_memory_table_keeps_the_last_summary_per_model_method_and_mode():
    s = dict(kind="summary", path="streamed", tasks_lo=2, tasks_hi=20, seed=0)
    scale = [dict(s, model="vit_l14", blocks=1, method="iso_c", mode="pact-rsvd", peak_lo_mb=700.0, peak_hi_mb=1200.0, ratio=1.714),
             dict(s, model="vit_l14", blocks=1, method="iso_c", mode="pact-rsvd", peak_lo_mb=716.0, peak_hi_mb=800.0, ratio=1.117),
             dict(s, model="vit_l14", blocks=1, method="task_arithmetic", mode="none", peak_lo_mb=724.0, peak_hi_mb=683.0, ratio=0.943),
             dict(s, model="vit_b32", blocks=None, method="iso_c", mode="none", peak_lo_mb=800.0, peak_hi_mb=1240.0, ratio=1.55),
             dict(s, model="vit_l14", blocks=1, method="iso_c", mode="none", path="old", peak_lo_mb=1.0, peak_hi_mb=9.0, ratio=9.0),
             {"kind": "run", "method": "iso_c", "mode": "none", "tasks": 2}]
    run = dict(kind="run", path="streamed", model="vit_l14", blocks=1, method="iso_c", mode="pact-rsvd", tasks=20)
    scale = [dict(run, measured="2026-11-30 10:00:00 UTC"), *scale[:1], dict(run, measured="2026-12-02 03:00:00 UTC"),
             dict(run, tasks=2, measured="2026-12-03 01:00:00 UTC"), *scale[1:]]
    t = efficiency.memory_table(scale)
    assert t["measured"].tolist() == ["", "", "2026-12-02"]  # the T hi run's date before the summary
    assert list(zip(t["model"], t["blocks"], t["method"], t["PACT"])) == [
        ("vit_b32", "all", "Iso-C", "none"), ("vit_l14", 1, "Task Arithmetic", "none"), ("vit_l14", 1, "Iso-C", "pact-rsvd")]
    assert t["ratio"].tolist() == [1.55, 0.943, 1.117]  # the later Iso-C record wins; the old path is left out
    assert t["≤ 1.5"].tolist() == ["no", "yes", "yes"] and t["peak hi (MB)"].iloc[2] == 800.0
    empty = efficiency.memory_table([], goal=2)
    assert empty.empty and list(empty.columns)[-2:] == ["≤ 2", "measured"]
