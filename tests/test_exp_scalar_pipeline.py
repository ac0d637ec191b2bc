"""Chapter 3 in one pass per task (issue 15): :func:`scalar.task_records` gives the records of the
book's former three passes (Fisher + enrichment for every task, then perturbations, then restores,
every task's masks held until the end) value for value, the chapter's tables and verdicts read the
same from them, and a loop over tasks holds one task's masks at a time. On the synthetic tiny
testbed of test_exp_scalar_theory (the tiny clip testbed: test_clip_scalar.py)."""
from __future__ import annotations

import gc
import weakref

import pandas as pd
import pytest
import torch

from pactlib.book.experiments import scalar
from pactlib.outcomes import unpack
from pactlib.book.records import records_frame
from pactlib.matrix import DEFAULT_RULE
from pactlib.taskvector import TaskVector
from test_exp_scalar_theory import TinyTestbed

KW = dict(fisher_samples=8, quantile=0.2, touched_only=True, scales=[1.0, 30.0], draws=2, test_limit=16)


def _three_passes(tb, seeds_tbs, merged_of, P, *, fisher_samples, quantile, touched_only, scales, draws, test_limit):
    """The former notebook cells of chapter 3 (before issue 15), verbatim but for the testbed
    loading and the merge (given): every (seed, task)'s masks live until the last pass."""
    runs, recs, lbw, sens, pool = {}, [], {}, {}, {}
    for seed, tb in seeds_tbs.items():
        tvs = dict(zip(tb.tasks, tb.task_vectors()))
        runs[seed] = (tb, tvs)
        for t in tb.tasks:
            F_t = scalar.task_fisher(tb, t, tb.finetuned[t], n_samples=fisher_samples, empirical=False, seed=seed)
            for only in (False, True):
                recs += scalar.enrichment_records(tvs[t], F_t, q=quantile, seed=seed, task=t, params=P,
                                                  touched_only=only, per_key=only == touched_only,
                                                  rule=getattr(tb, "rule", DEFAULT_RULE), suite="s")
            lbw[seed, t], sens[seed, t] = scalar.lbw_sets(tvs[t], F_t, q=quantile, touched_only=touched_only)
            pool[seed, t] = scalar.population(tvs[t], list(F_t), touched_only=touched_only)
    xy, ctl = {}, {}
    for seed, (tb, tvs) in runs.items():
        for t in tb.tasks:
            xy[seed, t] = tb.inputs(t, "test", test_limit)
            ctl[seed, t] = scalar.control_masks(lbw[seed, t], sens[seed, t], draws=draws, seed=seed, pool=pool[seed, t])
            unit = scalar.typical_update(tvs[t], list(lbw[seed, t]), touched_only=touched_only)
            recs += scalar.perturbation_records(tb, t, tb.finetuned[t], lbw[seed, t], unit=unit, scales=scales,
                                                draws=draws, seed=seed, xy=xy[seed, t], controls=ctl[seed, t],
                                                params=P, suite="s")
    for seed, (tb, tvs) in runs.items():
        merged, alpha = merged_of(tb, tvs.values())
        recs.append(dict(method="task_arithmetic", params={}, seed=seed, metrics={"acc": 0.5}))
        for t in tb.tasks:
            moved = scalar.displacement(tb.finetuned[t], merged, tvs[t], lbw[seed, t])
            recs += scalar.restore_records(tb, t, merged, tb.finetuned[t], lbw[seed, t], xy=xy[seed, t],
                                           controls=ctl[seed, t], seed=seed, params=P, moved=moved, suite="s",
                                           alpha=alpha, on_edge=False)
    return recs


def _one_pass(seeds_tbs, merged_of, P, **kw):
    """The chapter's cell now: per seed the merge first, then each task's whole pipeline."""
    recs = []
    for seed, tb in seeds_tbs.items():
        tvs = tb.task_vectors()
        merged, alpha = merged_of(tb, tvs)
        recs.append(dict(method="task_arithmetic", params={}, seed=seed, metrics={"acc": 0.5}))
        for t, tv in zip(tb.tasks, tvs):
            recs += scalar.task_records(tb, t, tv, seed=seed, params=P, suite="s", merged=merged,
                                        merge_fields=dict(alpha=alpha, on_edge=False), **kw)
    return recs


def _merged(tb, tvs, alpha=0.4):
    return TaskVector.sum(list(tvs)).apply_to(tb.pretrained, alpha), alpha


def _by_method(recs):
    out = {}
    for r in recs:
        out.setdefault(r["method"], []).append(r)
    return out


def _frame_tables(recs):
    frame = records_frame([r for r in recs if r["method"] != "task_arithmetic"])
    return (scalar.enrichment_table(frame), scalar.displacement_table(frame),
            scalar.c1_verdict(frame), scalar.c2_verdict(frame), scalar.c3_verdict(frame),
            scalar.task_means(frame, "perturb", "drop", condition="lbw"))


def _check_same(old, new):
    """The one pass gives the three passes' records, plus one "finetuned" record (θt's test
    outcomes, the base of the paired drops) per (seed, task), before that task's perturbations."""
    ft = [r for r in new if r["method"] == "finetuned"]
    new = [r for r in new if r["method"] != "finetuned"]
    pairs = [(r["seed"], r["task"]) for r in old if r["method"] == "enrichment" and r["scope"] == "global"
             and r["population"] == "all"]
    assert [(r["seed"], r["task"]) for r in ft] == pairs
    for r in ft:
        (task, packed), = r["outcomes"]["test"].items()
        assert task == r["task"] and unpack(packed).float().mean().item() == pytest.approx(r["metrics"]["acc"])
    assert len(old) == len(new)
    a, b = _by_method(old), _by_method(new)
    assert sorted(a) == sorted(b)  # enrichment, perturb, restore and the merge record (now first per seed)
    for m in a:  # each method's records in the same order, every field and value equal
        assert a[m] == b[m], m
    for x, y in zip(_frame_tables(old), _frame_tables(new)):  # what the chapter shows does not depend on order
        if isinstance(x, (pd.DataFrame, pd.Series)):
            pd.testing.assert_frame_equal(pd.DataFrame(x), pd.DataFrame(y), check_exact=True)
        else:
            assert x == y


def test_one_pass_equals_the_three_passes_on_the_synthetic_testbed():
    tbs = {0: TinyTestbed(T=3, seed=0), 1: TinyTestbed(T=3, seed=1)}
    P = {"q": 0.2}
    old = _three_passes(None, tbs, _merged, P, **KW)
    new = _one_pass(tbs, _merged, P, **KW)
    _check_same(old, new)
    n = _by_method(new)
    assert len(n["enrichment"]) > 2 * 6 and len(n["perturb"]) == 6 * 2 * 3 * 2 and len(n["restore"]) == 6 * 6


def test_task_records_without_a_merge_and_bad_inputs():
    tb = TinyTestbed(T=2)
    tv = tb.task_vectors()[0]
    recs = scalar.task_records(tb, "t0", tv, seed=0, params={}, **KW)
    assert {r["method"] for r in recs} == {"enrichment", "finetuned", "perturb"}
    with pytest.raises(KeyError, match="task_records: key"):
        scalar.task_records(tb, "t0", {"a.weight": tv["a.weight"]}, seed=0, params={}, **KW)
    with pytest.raises(ValueError, match="fewer than"):
        scalar.task_records(tb, "t0", tv, seed=0, params={}, **{**KW, "fisher_samples": 41})


def _track_masks(monkeypatch):
    """Weak references to every mask tensor the pipeline builds, by task."""
    alive: dict[str, list] = {}
    current = {"task": None}
    orig_fisher, orig_lbw, orig_pop, orig_ctl = scalar.task_fisher, scalar.lbw_sets, scalar.population, scalar.control_masks
    held_at_start = []

    def fisher(tb, task, *a, **k):
        gc.collect()
        held_at_start.append(sum(r() is not None for t, refs in alive.items() if t != task for r in refs))
        current["task"] = task
        return orig_fisher(tb, task, *a, **k)

    def keep(*masks):
        for m in masks:
            for v in m.values():
                alive.setdefault(current["task"], []).append(weakref.ref(v))

    def lbw(*a, **k):
        out = orig_lbw(*a, **k)
        keep(*out)
        return out

    def pop(*a, **k):
        out = orig_pop(*a, **k)
        keep(out)
        return out

    def ctl(*a, **k):
        out = orig_ctl(*a, **k)
        keep(*[m for ms in out.values() for m in ms])
        return out

    monkeypatch.setattr(scalar, "task_fisher", fisher)
    monkeypatch.setattr(scalar, "lbw_sets", lbw)
    monkeypatch.setattr(scalar, "population", pop)
    monkeypatch.setattr(scalar, "control_masks", ctl)
    return alive, held_at_start


@pytest.mark.parametrize("T", [2, 6])
def test_a_loop_over_tasks_holds_one_tasks_masks(monkeypatch, T):
    """When task k's pipeline starts, no mask of an earlier task is alive: the masks held at once
    are one task's, for T = 2 as for T = 6 (the former three passes held T tasks' masks)."""
    alive, held = _track_masks(monkeypatch)
    tbs = {0: TinyTestbed(T=T)}
    _one_pass(tbs, _merged, {}, **KW)
    gc.collect()
    assert len(held) == T and held == [0] * T
    per_task = {t: len(refs) for t, refs in alive.items()}
    assert set(per_task) == set(tbs[0].tasks) and len(set(per_task.values())) == 1  # same count per task
    assert all(r() is None for refs in alive.values() for r in refs)  # nothing left after the loop


def test_the_three_passes_held_every_tasks_masks(monkeypatch):
    """The same probe sees the former layout grow with T (so the test above can fail)."""
    alive, held = _track_masks(monkeypatch)
    tbs = {0: TinyTestbed(T=4)}
    recs = _three_passes(None, tbs, _merged, {}, **KW)
    assert recs and held == [9 * k for k in range(4)]  # U∩H, H and the population (3 keys each) per earlier task
