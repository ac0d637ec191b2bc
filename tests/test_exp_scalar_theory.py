"""Chapter 3 (scalar LBW: C1–C3) and chapter 10 (first-order theory: C12) helpers, on a tiny
testbed built here: a two-layer network of 1×1 convolutions (matrix layers) with a bias, a frozen
linear head per task, and seeded inputs. Everything is checked against direct computation."""
from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest
import torch
from torch import nn

from pactlib import causal, fisher
from pactlib.book.experiments import scalar, theory
import outcome_records as oc
from pactlib.pact import PactOptions, pact_filter
from pactlib.book.records import records_frame
from pactlib.outcomes import outcomes_of
from pactlib.testbeds import with_frozen_head
from pactlib.taskvector import TaskVector

matplotlib.use("Agg")


class Backbone(nn.Module):
    """x (N, 8, 1, 1) -> features (N, 5): 1×1 conv, ReLU, 1×1 conv with bias."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 6, 1, bias=False)
        self.b = nn.Conv2d(6, 5, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).flatten(1)


class Head:
    def __init__(self, w, b):
        self.weight, self.bias = w, b


class TinyTestbed:
    """What the helpers need of a :class:`pactlib.testbeds.Testbed`, on the tiny network."""

    def __init__(self, T: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.tasks = [f"t{i}" for i in range(T)]
        self.pretrained = {"a.weight": torch.randn(6, 8, 1, 1, generator=g),
                           "b.weight": torch.randn(5, 6, 1, 1, generator=g) * 0.5,
                           "b.bias": torch.randn(5, generator=g) * 0.1}
        self.finetuned, self.heads, self.data = {}, {}, {}
        for t in self.tasks:
            self.finetuned[t] = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in self.pretrained.items()}
            self.heads[t] = Head(torch.randn(3, 5, generator=g), torch.zeros(3))
            self.data[t] = {s: (torch.randn(40, 8, 1, 1, generator=g), torch.randint(0, 3, (40,), generator=g))
                            for s in ("val", "test")}

    def loss_model(self, state, task):
        net = Backbone()
        net.load_state_dict(dict(state))
        net.requires_grad_(False)
        return with_frozen_head(net, self.heads[task].weight, self.heads[task].bias)

    def inputs(self, task, split="val", limit=None):
        x, y = self.data[task][split]
        n = len(y) if limit is None else min(limit, len(y))
        return x[:n], y[:n]

    def task_vectors(self):
        return [TaskVector.from_checkpoints(self.pretrained, self.finetuned[t], name=t) for t in self.tasks]


@pytest.fixture
def tb():
    return TinyTestbed()


def _snapshot(d):
    return {k: v.clone() for k, v in d.items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- chapter 3: Fisher, scores, masks ----------------------------------------------------------

def test_task_fisher_matches_per_example_gradients(tb):
    t = "t1"
    before = _snapshot(tb.finetuned[t])
    F = scalar.task_fisher(tb, t, tb.finetuned[t], n_samples=12, empirical=True, chunk=5)
    assert list(F) == ["a.weight", "b.weight", "b.bias"]  # unprefixed, network order
    model = tb.loss_model(tb.finetuned[t], t)
    model.requires_grad_(True)
    x, y = tb.inputs(t, "val", 12)
    ref = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for i in range(12):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for k, p in model.named_parameters():
            ref[k] += p.grad ** 2 / 12
    for k in F:
        torch.testing.assert_close(F[k], ref[k], rtol=1e-4, atol=1e-7)
    assert _same(tb.finetuned[t], before)


def test_task_fisher_sampled_is_seeded_and_refuses_too_few_examples(tb):
    a = scalar.task_fisher(tb, "t0", tb.finetuned["t0"], n_samples=20, seed=3)
    b = scalar.task_fisher(tb, "t0", tb.finetuned["t0"], n_samples=20, seed=3)
    assert all(torch.equal(a[k], b[k]) for k in a) and all(bool((v >= 0).all()) for v in a.values())
    with pytest.raises(ValueError, match=r"task 't0' has only 40 val examples.*n_samples=41"):
        scalar.task_fisher(tb, "t0", tb.finetuned["t0"], n_samples=41)


def test_scores_equal_direct_accuracy_and_loss(tb):
    t = "t2"
    xy = tb.inputs(t, "test")
    with torch.no_grad():
        logits = tb.loss_model(tb.finetuned[t], t)(xy[0])
    got = scalar.scores(tb, tb.finetuned[t], t, xy)
    assert got["acc"] == pytest.approx(float((logits.argmax(1) == xy[1]).float().mean()))
    assert got["loss"] == pytest.approx(float(nn.functional.cross_entropy(logits, xy[1])), rel=1e-6)
    # one module, another state: functional_call uses the given weights, not the module's own
    other = scalar.state_scores(tb.loss_model(tb.finetuned[t], t), tb.pretrained, xy, batch_size=7)
    assert other == pytest.approx(scalar.scores(tb, tb.pretrained, t, xy))
    assert other["loss"] != pytest.approx(got["loss"])
    with pytest.raises(ValueError, match="no examples"):
        scalar.scores(tb, tb.pretrained, t, (xy[0][:0], xy[1][:0]))


def test_typical_update_is_the_median_over_entries():
    d = {"a": torch.tensor([[1.0, -5.0]]), "b": torch.tensor([-2.0, 3.0, 4.0]), "c": torch.tensor([100.0])}
    assert scalar.typical_update(d, ["a", "b"]) == 3.0
    z = {"a": torch.tensor([0.0, 0.0, 0.0, 1.0, -2.0, 4.0])}
    assert scalar.typical_update(z, ["a"]) == 0.0 and scalar.typical_update(z, ["a"], touched_only=True) == 2.0
    with pytest.raises(KeyError, match="'z'"):
        scalar.typical_update(d, ["a", "z"])
    with pytest.raises(ValueError, match="non-zero"):
        scalar.typical_update({"a": torch.zeros(3)}, ["a"], touched_only=True)


def test_lbw_sets_over_touched_entries_break_the_zero_tie():
    # 6 untouched entries (Δ = 0, F = 0) come first; among the 10 touched ones, small |Δ| goes with
    # large F. S2 as written picks U among the zeros (E = 0); over touched entries U ∩ H is planted.
    d = {"w": torch.tensor([0.0] * 6 + [1e-3, 2e-3, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])}
    F = {"w": torch.tensor([0.0] * 6 + [9.0, 8.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])}
    pop = scalar.population(d, ["w"], touched_only=True)
    assert pop["w"].tolist() == [False] * 6 + [True] * 10
    assert scalar.population(d, ["w"], touched_only=False)["w"].all()
    lbw, H = scalar.lbw_sets(d, F, q=0.2, touched_only=True)
    assert lbw["w"].nonzero().squeeze(1).tolist() == [6, 7] and H["w"].nonzero().squeeze(1).tolist() == [6, 7]
    lbw_all, _ = scalar.lbw_sets(d, F, q=0.2, touched_only=False)
    assert not lbw_all["w"].any()
    touched = scalar.enrichment_records(d, F, q=0.2, seed=0, task="x", params={}, touched_only=True)[0]
    plain = scalar.enrichment_records(d, F, q=0.2, seed=0, task="x", params={})[0]
    assert touched["population"] == "touched" and touched["metrics"]["n_params"] == 10
    assert touched["metrics"]["E"] == pytest.approx(2 / (2 * 2 / 10)) and plain["metrics"]["E"] == 0.0
    assert plain["metrics"]["zero_update"] == pytest.approx(6 / 16) and plain["population"] == "all"
    fast = scalar.enrichment_records(d, F, q=0.2, seed=0, task="x", params={}, touched_only=True, per_key=False)
    assert len(fast) == 1 and fast[0]["metrics"] == touched["metrics"]


def test_lbw_sets_match_the_engine_over_all_entries():
    g = torch.Generator().manual_seed(5)
    d = {"a": torch.randn(30, 4, generator=g), "b": torch.randn(50, generator=g)}
    F = {"a": torch.rand(30, 4, generator=g), "b": torch.rand(50, generator=g)}
    lbw, H = scalar.lbw_sets(d, F, q=0.25, touched_only=False)
    ref = fisher.scalar_lbw_masks(d, F, q=0.25)
    assert all(torch.equal(lbw[k], ref[k]) for k in d)
    assert all(torch.equal(H[k], scalar.global_masks(F, 0.25, largest=True)[k]) for k in d)


def test_global_masks_take_exact_global_quantiles():
    v = {"a": torch.arange(10.0).reshape(2, 5), "b": torch.arange(10.0, 20.0)}
    hi = scalar.global_masks(v, 0.2, largest=True)
    lo = scalar.global_masks(v, 0.2, largest=False)
    assert hi["a"].shape == (2, 5) and not hi["a"].any() and hi["b"].tolist() == [False] * 6 + [True] * 4
    assert lo["a"].reshape(-1).tolist() == [True] * 4 + [False] * 6 and not lo["b"].any()
    with pytest.raises(ValueError, match="quantile"):
        scalar.global_masks(v, 1.5, largest=True)


def test_random_subset_draws_inside_the_pool():
    pool = {"a": torch.tensor([True, False, True, True]), "b": torch.tensor([[False, True], [True, False]])}
    s = scalar.random_subset(pool, 3, seed=1)
    assert sum(int(m.sum()) for m in s.values()) == 3
    assert all(bool((s[k] & ~pool[k]).sum() == 0) for k in pool)
    assert all(torch.equal(s[k], scalar.random_subset(pool, 3, seed=1)[k]) for k in pool)
    with pytest.raises(ValueError, match="asked for 6 entries from a pool of 5"):
        scalar.random_subset(pool, 6, seed=0)


def test_control_masks_sizes_and_membership():
    g = torch.Generator().manual_seed(0)
    F = {"a": torch.rand(20, 10, generator=g), "b": torch.rand(50, generator=g)}
    d = {"a": torch.randn(20, 10, generator=g), "b": torch.randn(50, generator=g)}
    lbw = fisher.scalar_lbw_masks(d, F, q=0.2)
    H = scalar.global_masks(F, 0.2, largest=True)
    n = sum(int(m.sum()) for m in lbw.values())
    assert n > 0
    c = scalar.control_masks(lbw, H, draws=3, seed=2)
    assert len(c["random"]) == len(c["sensitive"]) == 3
    for m in c["random"] + c["sensitive"]:
        assert sum(int(v.sum()) for v in m.values()) == n
    for m in c["sensitive"]:
        assert all(not bool((m[k] & ~(H[k] & ~lbw[k])).any()) for k in m)  # inside H \ U
    assert not all(torch.equal(c["random"][0][k], c["random"][1][k]) for k in lbw)
    pool = {"a": torch.zeros(20, 10, dtype=torch.bool), "b": torch.ones(50, dtype=torch.bool)}
    inside = scalar.control_masks(lbw, H, draws=1, seed=0, pool=pool)["random"][0]
    assert not inside["a"].any() and int(inside["b"].sum()) == n
    with pytest.raises(KeyError, match="same keys"):
        scalar.control_masks(lbw, {"a": H["a"]}, draws=1, seed=0)


# --- chapter 3: records -----------------------------------------------------------------------

def test_enrichment_records_global_and_per_layer(tb):
    t = "t0"
    tv = tb.task_vectors()[0]
    F = scalar.task_fisher(tb, t, tb.finetuned[t], n_samples=16, seed=0)
    recs = scalar.enrichment_records(tv, F, q=0.2, seed=5, task=t, params={"q": 0.2}, suite="8")
    e = fisher.enrichment(tv, F, q=0.2)
    glob = [r for r in recs if r["scope"] == "global"]
    assert len(glob) == 1 and glob[0]["metrics"]["E"] == pytest.approx(e.score)
    assert glob[0]["metrics"]["n_params"] == 48 + 30 + 5 and glob[0]["suite"] == "8" and glob[0]["seed"] == 5
    assert glob[0]["population"] == "all" and glob[0]["metrics"]["zero_update"] == 0.0
    layers = [r for r in recs if r["scope"] == "layer"]
    assert [(r["key"], r["layer"], r["kind"]) for r in layers] == [("a.weight", 0, "pointwise"),
                                                                    ("b.weight", 1, "pointwise"),
                                                                    ("b.bias", 2, "norm")]
    assert layers[0]["metrics"]["E"] == pytest.approx(e.per_key["a.weight"])


def test_layer_kind():
    assert scalar.layer_kind("x.weight", torch.zeros(4, 3, 1, 1)) == "pointwise"
    assert scalar.layer_kind("x.weight", torch.zeros(4, 1, 3, 3)) == "conv"
    assert scalar.layer_kind("bn.weight", torch.zeros(4)) == "norm"


def _masks(tb, t, q=0.2):
    tv = dict(tb.task_vectors()[tb.tasks.index(t)].items())
    F = scalar.task_fisher(tb, t, tb.finetuned[t], n_samples=16, seed=0)
    return tv, F, fisher.scalar_lbw_masks(tv, F, q=q), scalar.global_masks(F, q, largest=True)


def test_perturbation_records_measure_drops_against_controls(tb):
    t = "t1"
    tv, F, lbw, H = _masks(tb, t)
    ctl = scalar.control_masks(lbw, H, draws=2, seed=0)
    xy = tb.inputs(t, "test")
    before = _snapshot(tb.finetuned[t])
    base = scalar.scores(tb, tb.finetuned[t], t, xy)
    zero = scalar.perturbation_records(tb, t, tb.finetuned[t], lbw, unit=0.1, scales=[0.0], draws=2, seed=0, xy=xy,
                                       controls=ctl, params={})
    assert [(r["condition"], r["draw"]) for r in zero] == [("lbw", 0), ("lbw", 1), ("random", 0), ("random", 1),
                                                           ("sensitive", 0), ("sensitive", 1)]
    assert all(r["metrics"]["drop"] == 0 and abs(r["metrics"]["dloss"]) < 1e-6 for r in zero)
    big = scalar.perturbation_records(tb, t, tb.finetuned[t], lbw, unit=0.25, scales=[1.0, 2.0], draws=1, seed=0,
                                      xy=xy, controls={"random": ctl["random"][:1]}, params={})
    assert [(r["scale"], r["condition"]) for r in big] == [(1.0, "lbw"), (1.0, "random"), (2.0, "lbw"), (2.0, "random")]
    pert = causal.perturb(tb.finetuned[t], lbw, size=0.5, seed=0)
    direct = scalar.scores(tb, pert, t, xy)
    assert big[2]["metrics"]["size"] == 0.5 and big[2]["metrics"]["loss"] == pytest.approx(direct["loss"])
    assert big[2]["metrics"]["drop"] == pytest.approx(base["acc"] - direct["acc"])
    assert big[2]["metrics"]["dloss"] == pytest.approx(direct["loss"] - base["loss"], abs=1e-6)
    assert big[0]["metrics"]["n_entries"] == sum(int(m.sum()) for m in lbw.values())
    assert _same(tb.finetuned[t], before)
    with pytest.raises(ValueError, match="control 'bad' draw 0 has"):
        scalar.perturbation_records(tb, t, tb.finetuned[t], lbw, unit=0.1, scales=[1.0], draws=1, seed=0, xy=xy,
                                    controls={"bad": [H]}, params={})


def test_displacement_on_hand_numbers():
    theta = {"w": torch.tensor([0.0, 0.0, 0.0, 0.0])}
    merged = {"w": torch.tensor([1.0, 3.0, 0.5, 0.5])}
    delta = {"w": torch.tensor([0.5, 0.5, 1.0, 1.0])}
    masks = {"w": torch.tensor([True, True, False, False])}
    d = scalar.displacement(theta, merged, delta, masks)
    assert d == pytest.approx(dict(moved_lbw=2.0, moved_other=0.5, moved_ratio=4.0, rel_moved_lbw=4.0,
                                   rel_moved_other=0.5))
    empty = scalar.displacement(theta, merged, delta, {"w": torch.zeros(4, dtype=torch.bool)})
    assert math.isnan(empty["moved_lbw"]) and empty["moved_other"] == pytest.approx(1.25)


def test_restore_records_recover_all_with_every_entry_and_nothing_with_none(tb):
    t = "t0"
    tvs = tb.task_vectors()
    merged = TaskVector.sum(tvs).apply_to(tb.pretrained, 0.4)
    theta = tb.finetuned[t]
    xy = tb.inputs(t, "test")
    full = {k: torch.ones_like(v, dtype=torch.bool) for k, v in theta.items()}
    none = {k: torch.zeros_like(v, dtype=torch.bool) for k, v in theta.items()}
    snap = _snapshot(merged)
    recs = scalar.restore_records(tb, t, merged, theta, full, xy=xy, controls={"none": [none]}, seed=1,
                                  params={}, moved={"moved_lbw": 1.0}, alpha=0.4)
    by = {r["condition"]: r["metrics"] for r in recs}
    assert by["merged"]["moved_lbw"] == 1.0 and recs[0]["alpha"] == 0.4
    assert by["merged"]["loss"] == pytest.approx(scalar.scores(tb, merged, t, xy)["loss"])
    assert by["lbw"]["recovered_loss"] == pytest.approx(1.0) and by["lbw"]["n_entries"] == 83
    assert by["lbw"]["loss"] == pytest.approx(by["merged"]["loss_ft"])
    assert by["none"]["recovered_loss"] == pytest.approx(0.0) and by["none"]["gain_acc"] == 0
    assert _same(merged, snap)


# --- chapter 3: verdicts and figures -------------------------------------------------------------

def _frame(rows):
    return records_frame(rows)


def _enr(E_by_task):
    rows = []
    for t, Es in E_by_task.items():
        for s, E in enumerate(Es):
            for pop, e in (("touched", E), ("all", 0.01)):
                rows.append(dict(method="enrichment", params={}, seed=s, task=t, scope="global", population=pop,
                                 metrics={"E": e, "n_params": 100, "n_both": 3, "zero_update": 0.4, "zero_fisher": 0.5}))
                rows.append(dict(method="enrichment", params={}, seed=s, task=t, scope="layer", key="k", layer=0,
                                 population=pop, kind="pointwise", metrics={"E": e}))
                rows.append(dict(method="enrichment", params={}, seed=s, task=t, scope="layer", key="j", layer=1,
                                 population=pop, kind="conv", metrics={"E": 0.5}))
    return _frame(rows)


def _t_interval(values):
    from scipy import stats
    import numpy as np

    v = np.asarray(values, dtype=float)
    h = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / len(v) ** 0.5
    return v.mean() - h, v.mean() + h


def test_c1_verdict_grades_each_task_on_the_spread_over_seeds():
    v = scalar.c1_verdict(_enr({"a": [1.5, 1.6, 1.7], "b": [1.3, 1.4, 1.2]}))
    assert v["status"] == "reproduced" and [c["name"] for c in v["conditions"]] == ["E_t, a", "E_t, b"]
    a = v["conditions"][0]
    assert a["estimate"] == pytest.approx(1.6) and (a["lo"], a["hi"]) == pytest.approx(_t_interval([1.5, 1.6, 1.7]))
    assert a["grade"] == "holds" and a["threshold"] == 1.0 and a["n_seeds"] == 3
    assert "each over 3 fine-tuning seed(s)" in v["evidence"] and "the 95 % t interval over seeds" in v["evidence"]
    assert "mean E_t 0.010" in v["evidence"] and "40 % of entries at Δt = 0" in v["evidence"]
    across = scalar.c1_verdict(_enr({"a": [1.5, 1.6, 1.7], "b": [0.9, 1.1, 1.3]}))  # b: 1.1 ± 0.50
    assert across["status"] == "partly reproduced" and across["conditions"][1]["grade"] == "inconclusive"
    assert "seeds" in across["conditions"][1]["needs"]
    below = scalar.c1_verdict(_enr({"a": [1.5, 1.6, 1.7], "b": [0.5, 0.6, 0.7]}))
    assert below["status"] == "contradicted" and below["conditions"][1]["hi"] < 1
    assert scalar.c1_verdict(_enr({"a": [0.9, 1.1, 1.3], "b": [0.8, 1.0, 1.3]}))["status"] == "inconclusive"
    two = scalar.c1_verdict(_enr({"a": [1.5, 2.0], "b": [1.2, 1.1]}))  # < 3 seeds: points
    assert two["status"] == "reproduced" and two["conditions"][0]["lo"] == two["conditions"][0]["hi"] == 1.75
    assert "a point (fewer than 3 seeds" in two["evidence"]
    assert scalar.c1_verdict(_enr({"a": [1.5], "b": [2.0]}), population="all")["status"] == "contradicted"


def test_chapter3_tables():
    tab = scalar.enrichment_table(_enr({"a": [1.5, 2.0], "b": [1.2, 1.1]}))
    assert list(tab.index) == ["a", "b"] and tab.loc["a", "E_t, touched"] == pytest.approx(1.75)
    assert tab.loc["b", "E_t, all"] == pytest.approx(0.01) and tab.loc["a", "Δt = 0 (share)"] == pytest.approx(0.4)
    d = scalar.displacement_table(_rest({"a": 0.3}, {"a": 0.0}))
    assert d.loc["a", "rel_moved_lbw"] == 5.0 and d.loc["a", "moved_ratio"] == 2.0 and d.loc["a", "alpha"] == 0.3


def _pert(drops, *, seeds=(0,), lost=None):
    """Perturbation records (scales 1 and 30) and, with ``lost``, θt's "finetuned" records and
    per-example outcomes (tests/outcome_records.py): ``lost[task, condition]`` of θt's right
    examples the perturbed model gets wrong at scale 1 (× 30 at scale 30)."""
    rows = []
    for seed in seeds:
        for t in drops:
            if lost is not None:
                rows.append(dict(method="finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                 outcomes=oc.outcomes(t)))
            for scale in (1.0, 30.0):
                for c, d in drops[t].items():
                    extra = {} if lost is None else {"outcomes": oc.outcomes(t, lost=min(360, lost[t, c] * int(scale)))}
                    rows.append(dict(method="perturb", params={}, seed=seed, task=t, condition=c, draw=0, scale=scale,
                                     metrics={"drop": d * scale, "dloss": 0.1 * d * scale, "size": 1e-3 * scale,
                                              "n_entries": 10}, **extra))
    return _frame(rows)


def _drops(lost):
    return {t: {c: k / oc.N for (tt, c), k in lost.items() if tt == t} for t, _ in lost}


def _c2(lost):
    return scalar.c2_verdict(_pert(_drops(lost), seeds=(0, 1, 2), lost=lost))


def test_c2_verdict_grades_paired_drops_against_the_threshold():
    strong = _c2({("a", "lbw"): 40, ("a", "random"): 4, ("b", "lbw"): 20, ("b", "random"): 0})
    assert strong["status"] == "reproduced"
    drop, excess = strong["conditions"]
    # a: 10 points, b: 5 points -> 7.5; excess: a 10 − 2 × 1, b 5 − 0 -> 6.5
    assert drop["estimate"] == pytest.approx(7.5) and drop["threshold"] == pytest.approx(0.5)
    assert excess["estimate"] == pytest.approx(6.5) and excess["lo"] > 0 and drop["grade"] == excess["grade"] == "holds"
    assert drop["n_examples"] == oc.N and drop["n_seeds"] == 3
    assert "(400 per task, 2 tasks, 3 seed(s))" in strong["evidence"] and "at 1×" in drop["name"]
    tiny = _c2({("a", "lbw"): 0, ("a", "random"): 0, ("b", "lbw"): 0, ("b", "random"): 0})
    assert tiny["status"] == "contradicted" and (tiny["conditions"][0]["lo"], tiny["conditions"][0]["hi"]) == (0, 0)
    across = _c2({("a", "lbw"): 10, ("a", "random"): 4, ("b", "lbw"): 10, ("b", "random"): 4})
    d, x = across["conditions"]  # drop 2.5 points; excess 2.5 − 2 × 1 = 0.5, within its sampling error
    assert d["grade"] == "holds" and x["estimate"] == pytest.approx(0.5) and x["grade"] == "inconclusive"
    assert across["status"] == "partly reproduced" and "test examples per task" in x["needs"]
    worse = _c2({("a", "lbw"): 10, ("a", "random"): 40, ("b", "lbw"): 10, ("b", "random"): 40})
    assert worse["status"] == "contradicted" and worse["conditions"][1]["hi"] < 0
    bare = scalar.c2_verdict(_pert({"a": {"lbw": 0.2, "random": 0.01}}))
    assert bare["status"] == "not yet tested" and "records without per-example outcomes: recompute" in bare["evidence"]


def test_perturbation_table_and_drop_intervals():
    lost = {("a", "lbw"): 40, ("a", "random"): 4, ("b", "lbw"): 20, ("b", "random"): 0}
    f = _pert(_drops(lost), seeds=(0, 1, 2), lost=lost)
    iv = scalar.drop_intervals(f).set_index(["scale", "task", "condition"])
    assert iv.loc[(1.0, "a", "lbw"), "drop"] == pytest.approx(10.0) and iv.loc[(30.0, "b", "lbw"), "drop"] == 90.0
    assert iv.loc[(1.0, "mean", "random"), "drop"] == pytest.approx(0.5)
    assert iv.loc[(1.0, "b", "random"), ["lo", "hi"]].tolist() == [0.0, 0.0]  # nothing changed: no error
    tab = scalar.perturbation_table(f)
    assert tab.loc[(1.0, "scalar LBW (U∩H)"), "accuracy drop (points)"].startswith("+7.50 [")
    assert tab.loc[(1.0, "random entries"), "loss increase (nats)"] == pytest.approx(0.1 * 0.005)


def _rest(rec_lbw, rec_rand, rel_moved=5.0, *, seeds=(0,), won=None):
    """Restore records; with ``won``, θt's "finetuned" records and per-example outcomes: the
    merge gets 60 of θt's right examples wrong and a restore wins ``won[task, condition]`` back."""
    rows = []
    for seed in seeds:
        for t in rec_lbw:
            out = {} if won is None else {"outcomes": oc.outcomes(t, lost=60)}
            if won is not None:
                rows.append(dict(method="finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                 outcomes=oc.outcomes(t)))
            rows.append(dict(method="restore", params={}, seed=seed, task=t, condition="merged", draw=0, alpha=0.3,
                             on_edge=False, metrics={"recovered_loss": 0.0, "gain_acc": 0.0,
                                                     "rel_moved_lbw": rel_moved + seed / 10, "moved_ratio": 2.0,
                                                     "moved_lbw": 1.0, "moved_other": 0.5, "rel_moved_other": 1.0},
                             **out))
            for c, rec in (("lbw", rec_lbw[t]), ("random", rec_rand[t])):
                out = {} if won is None else {"outcomes": oc.outcomes(t, lost=60 - won[t, c])}
                rows.append(dict(method="restore", params={}, seed=seed, task=t, condition=c, draw=0,
                                 metrics={"recovered_loss": rec + seed / 100, "gain_acc": 0.01}, **out))
    return _frame(rows)


def _c3(rec_lbw, rec_rand, won, rel_moved=5.0):
    return scalar.c3_verdict(_rest(rec_lbw, rec_rand, rel_moved, seeds=(0, 1, 2), won=won))


def test_c3_verdict_grades_moves_loss_shares_and_paired_accuracy():
    won = {("a", "lbw"): 30, ("a", "random"): 2, ("b", "lbw"): 20, ("b", "random"): 0}
    v = _c3({"a": 0.3, "b": 0.2}, {"a": 0.01, "b": 0.0}, won)
    assert v["status"] == "reproduced" and len(v["conditions"]) == 4
    moved, share, versus, acc = v["conditions"]
    assert moved["estimate"] == pytest.approx(5.1) and moved["threshold"] == 1.0 and moved["n_seeds"] == 3
    assert share["estimate"] == pytest.approx(26.0) and share["threshold"] == pytest.approx(5.0)  # (30 + 20)/2 + 1
    assert versus["estimate"] == pytest.approx(24.5) and versus["lo"] == versus["hi"]  # the same every seed
    assert acc["estimate"] == pytest.approx(6.25) and acc["lo"] > 0 and acc["n_examples"] == oc.N  # (30 + 20)/2 / 4
    assert "α = 0.3;" in v["evidence"] and "LBW − random entries restore: +6.00 [" in v["evidence"]
    assert _c3({"a": 0.3, "b": 0.2}, {"a": 0.01, "b": 0.0}, won, rel_moved=0.5)["status"] == "contradicted"
    few = {("a", "lbw"): 2, ("a", "random"): 0, ("b", "lbw"): 1, ("b", "random"): 0}
    v = _c3({"a": 0.3, "b": 0.2}, {"a": 0.01, "b": 0.0}, few)
    assert v["conditions"][3]["grade"] == "inconclusive" and v["status"] == "partly reproduced"
    v = _c3({"a": -0.5, "b": -0.4}, {"a": 0.0, "b": 0.0}, won)  # restoring raises the loss
    assert v["status"] == "contradicted" and v["conditions"][1]["grade"] == "fails"
    bare = scalar.c3_verdict(_rest({"a": 0.3}, {"a": 0.0}))
    assert bare["status"] == "not yet tested" and "recompute" in bare["evidence"]


def test_chapter3_figures_draw_from_records():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    scalar.plot_task_enrichment(_enr({"a": [1.5, 2.0], "b": [1.2, 1.1]}), ax=ax)
    assert [round(p.get_height(), 3) for p in ax.patches] == [1.75, 1.15, 0.01, 0.01]
    ax.clear()
    scalar.plot_dose(_pert({"a": {"lbw": 0.2, "random": 0.01}}), ax=ax)
    assert [list(line.get_ydata()) for line in ax.lines[:2]] == [pytest.approx([0.02, 0.6]), pytest.approx([0.001, 0.03])]
    ax.clear()
    im = scalar.plot_layer_enrichment(_enr({"a": [2.0], "b": [4.0]}), ax=ax)
    assert im.get_array().shape == (2, 2) and float(im.get_array()[1, 0]) == pytest.approx(2.0)
    ax.clear()
    f = _pert({"a": {"lbw": 0.2, "random": 0.01}})
    scalar.plot_conditions(f[f["scale"] == 1.0], "perturb", "drop", ax=ax, conditions=["lbw", "random"])
    assert [round(p.get_height(), 3) for p in ax.patches] == [20.0, 1.0]
    plt.close(fig)


# --- chapter 10 ---------------------------------------------------------------------------------

OPTS = PactOptions(core_frac=0.5, active_frac=0.2, max_shield_frac=0.5)


@pytest.fixture
def filtered(tb):
    tvs = tb.task_vectors()
    out, report = pact_filter(tb.pretrained, tvs, options=OPTS, keep=True)
    assert set(report.shields) == {"a.weight", "b.weight"}
    assert any(s.shape[1] > 0 for ss in report.shields.values() for s in ss)
    return tvs, out, report


def test_task_loss_is_the_cross_entropy_and_differentiable(tb):
    t = "t1"
    xy = tb.inputs(t, "val", 20)
    L = theory.task_loss(tb, t, xy)
    with torch.no_grad():
        ref = nn.functional.cross_entropy(tb.loss_model(tb.pretrained, t)(xy[0]), xy[1])
    assert float(L(tb.pretrained)) == pytest.approx(float(ref), rel=1e-6)
    w = tb.finetuned[t]["a.weight"].clone().requires_grad_(True)
    L({**tb.finetuned[t], "a.weight": w}).backward()
    assert w.grad is not None and float(w.grad.norm()) > 0


def test_removed_parts_and_shields(filtered):
    tvs, out, report = filtered
    rem = theory.removed_parts(tvs[0], out[0], list(report.shields))
    for k, r in rem.items():
        S = report.shields[k][0]
        D = tvs[0][k].reshape(tvs[0][k].shape[0], -1)
        torch.testing.assert_close(r.reshape(D.shape), D @ S @ S.T, atol=1e-6, rtol=1e-5)  # Δt P_t
    with pytest.raises(KeyError, match="'zz'"):
        theory.removed_parts(tvs[0], out[0], ["zz"])
    assert theory.shields_of(report, 1)["a.weight"] is report.shields["a.weight"][1]
    empty = type(report)(report.mode, report.options)
    with pytest.raises(ValueError, match="keep=True"):
        theory.shields_of(empty, 0)


def test_layer_terms_sum_to_first_order_check_and_respect_the_bound(tb, filtered):
    tvs, out, report = filtered
    t = 2
    theta = tb.finetuned[tb.tasks[t]]
    L = theory.task_loss(tb, tb.tasks[t], tb.inputs(tb.tasks[t], "val", 30))
    rem = theory.removed_parts(tvs[t], out[t], list(report.shields))
    sh = theory.shields_of(report, t)
    rows = theory.layer_terms(L, theta, rem, sh, tvs[t])
    fo = causal.first_order_check(L, theta, rem, sh)
    assert sum(r["predicted"] for r in rows) == pytest.approx(fo["predicted"], rel=1e-4, abs=1e-9)
    assert sum(r["bound"] for r in rows) == pytest.approx(fo["bound"], rel=1e-4)
    for r in rows:
        assert abs(r["predicted"]) <= r["bound"] + 1e-9 and 0 <= r["grad_share"] <= 1 + 1e-9
        assert 0 <= r["removed_energy"] <= 1 + 1e-9
    path = theory.loss_path(L, theta, rem, [0.0, 1.0])
    assert path[0] == 0.0 and path[1] == pytest.approx(fo["measured"], rel=1e-5, abs=1e-8)


def test_theory_records_end_to_end(tb, filtered):
    tvs, out, report = filtered
    t = 1
    task = tb.tasks[t]
    xy_loss, xy_test = tb.inputs(task, "val", 25), tb.inputs(task, "test")
    before = _snapshot(tb.finetuned[task])
    recs = theory.theory_records(tb, t, tvs[t], out[t], report, xy_loss=xy_loss, xy_test=xy_test,
                                 fracs=[0.5, 1.0], seed=3, params={"p": 1}, suite="8")
    assert [r["method"] for r in recs] == ["first-order", "finetuned", "path", "path", "layer", "layer"]
    fo = recs[0]["metrics"]
    # the filtered model's and θt's per-example test outcomes, for the paired accuracy change
    filtered_out, ft_out = (outcomes_of(r)[task] for r in recs[:2])
    assert filtered_out.float().mean() == pytest.approx(fo["acc_filtered"]) and len(filtered_out) == len(xy_test[1])
    assert ft_out.float().mean() == pytest.approx(fo["acc_ft"]) and recs[1]["seed"] == 3 and recs[1]["suite"] == "8"
    L = theory.task_loss(tb, task, xy_loss)
    filt_state = out[t].apply_to(tb.pretrained)
    assert fo["measured"] == pytest.approx(float(L(filt_state)) - float(L(tb.finetuned[task])), rel=1e-4, abs=1e-7)
    assert abs(fo["predicted"]) <= fo["bound"] and fo["loss"] == pytest.approx(float(L(tb.finetuned[task])))
    assert fo["acc_filtered"] == pytest.approx(scalar.scores(tb, filt_state, task, xy_test)["acc"])
    assert fo["acc_change"] == pytest.approx(fo["acc_filtered"] - fo["acc_ft"])
    assert recs[3]["metrics"]["measured"] == pytest.approx(fo["measured"])
    assert recs[2]["metrics"]["predicted"] == pytest.approx(0.5 * fo["predicted"])
    assert recs[0]["seed"] == 3 and recs[0]["suite"] == "8" and recs[4]["key"] == "a.weight"
    assert _same(tb.finetuned[task], before)


def _fo(rows, seeds=(0,), outcomes=True):
    """First-order records (task, predicted, bound, measured, lost) and θt's; ``lost``: test
    examples of θt's right ones that θ0 + Δ̃t gets wrong (per-example outcomes, tests/outcome_records.py)."""
    recs = []
    for seed in seeds:
        for t, p, b, m, lost in rows:
            a = oc.acc(lost) - oc.acc()
            recs.append(dict(method="first-order", params={}, seed=seed, task=t,
                             metrics=dict(predicted=p, bound=b, measured=m * (1 + seed / 100), acc_change=a, loss=1.0,
                                          removed_energy=0.1, acc_ft=oc.acc(), acc_filtered=oc.acc(lost)),
                             **({"outcomes": oc.outcomes(t, lost)} if outcomes else {})))
            if outcomes:
                recs.append(dict(method="finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                 outcomes=oc.outcomes(t)))
    return _frame(recs)


def test_c12_verdict():
    good = theory.c12_verdict(_fo([("a", 0.01, 0.05, 0.012, 0), ("b", 0.02, 0.03, 0.018, 2)], seeds=(0, 1, 2)))
    assert good["status"] == "reproduced" and len(good["conditions"]) == 4
    within, sign, rel, acc = good["conditions"]
    assert within["estimate"] == pytest.approx(0.6 * 1.01) and within["side"] == "<" and within["n_seeds"] == 3
    assert sign["estimate"] == 0 and rel["threshold"] == 0.5
    assert acc["estimate"] == pytest.approx(-0.25) and acc["threshold"] == pytest.approx(-1.0) and acc["lo"] > -1
    assert "|predicted| ≤ bound (the precondition, Cauchy–Schwarz) in 6/6 (task, seed) cases" in good["evidence"]
    off = theory.c12_verdict(_fo([("a", 0.01, 0.05, -0.03, 0), ("b", 0.02, 0.03, 0.05, 0)]))
    assert off["status"] == "contradicted"  # outside the bound for b, a sign wrong, large relative error
    assert [c["grade"] for c in off["conditions"]] == ["fails", "fails", "fails", "holds"]
    assert off["conditions"][1]["estimate"] == 1
    broken = theory.c12_verdict(_fo([("a", 0.1, 0.05, 0.1, 0), ("b", 0.02, 0.03, 0.018, 0)]))  # |predicted| > bound
    assert broken["status"] == "contradicted" and [c["name"] for c in broken["conditions"]] == ["largest ratio of the prediction's size to the bound"]
    assert broken["conditions"][0]["estimate"] == pytest.approx(2.0) and "the arithmetic is wrong" in broken["evidence"]
    bare = theory.c12_verdict(_fo([("a", 0.01, 0.05, 0.012, 0)], outcomes=False))
    assert bare["status"] == "not yet tested" and "records without per-example outcomes: recompute" in bare["evidence"]


def test_chapter10_table_and_figures(tb, filtered):
    import matplotlib.pyplot as plt

    tvs, out, report = filtered
    recs = []
    for t in range(2):
        task = tb.tasks[t]
        recs += theory.theory_records(tb, t, tvs[t], out[t], report, xy_loss=tb.inputs(task, "val", 20),
                                      xy_test=tb.inputs(task, "test"), fracs=[0.5, 1.0], seed=0, params={})
    frame = records_frame(recs)
    tab = theory.summary_table(frame)
    assert list(tab.index) == ["t0", "t1"] and tab["seeds"].tolist() == [1, 1]
    assert tab.loc["t0", "measured"] == pytest.approx(recs[0]["metrics"]["measured"])
    fig, ax = plt.subplots()
    theory.plot_sides(frame, ax=ax)
    assert len(ax.collections) == 3
    ax.clear()
    theory.plot_path(frame, ax=ax)
    assert len(ax.lines) == 2 * 2 + 1
    ax.clear()
    theory.plot_layers(frame, ax=ax)
    assert len(ax.patches) == 2
    plt.close("all")
