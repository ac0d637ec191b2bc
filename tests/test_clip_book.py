"""The book's chapters executed by the runner (scripts/run_notebooks.py) on a tiny clip testbed.

A parameter set modelled on params/paper-vitb32-*.yaml, with smoke-sized values: its
``testbeds:`` section defines one clip testbed over the random-init open_clip files of
tests/test_clip_testbed.py (``files``), with PEFT LoRA adapters written here (option ``lora``),
so chapter 9 runs on the same definition with kind="lora" (what the paper sets tell users with
adapters to do). The runner executes the chapters as `make book` does (``--jobs 2``, chapter 6
after 5), in process with its output folder moved to a temporary one (as tests/test_book.py
drives it). The records each chapter wrote are read back and checked, and recomputed with the
library called directly on the same files, through a second definition with a cache of its
own (nothing the kernels cached is reused).

Chapters: 4, 5, 6 and 9: two rounds of two kernels, about a minute on two shared cores. Each
chapter costs 20-40 s even this small (kernel start, importing torch and open_clip, figures),
so the paper sets' other clip chapters, 7, 8, 10 and 11, would double that: set
PACT_CLIP_BOOK_ALL=1 to run them too (about 2 minutes; their records are checked generically). Their clip code paths are tested in process in
tests/test_clip_lazy.py (7, 8, 11) and tests/test_clip_device.py (10).
"""
from __future__ import annotations

import itertools
import json
import math
import os

import pytest
import torch
import yaml

open_clip = pytest.importorskip("open_clip")

from pactlib import testbeds  # noqa: E402
from pactlib.book import records  # noqa: E402
from pactlib.book.verdicts import STATUSES  # noqa: E402

from test_clip_testbed import TASKS, TINY, files, write_adapters  # noqa: E402,F401  (files: the module fixture)

NAME = "clip-booktiny"
DIRECT = "clip-booktiny-direct"
FAST = ["04_subspace_perspective", "05_main_results", "06_static_vs_dynamic", "09_lora"]
MORE = ["07_layer_depth", "08_efficiency", "10_theory", "11_sensitivity"]
CHAPTERS = sorted(FAST + (MORE if os.environ.get("PACT_CLIP_BOOK_ALL") else []))
LIMITS = dict(val_limit=8, test_limit=8)
STRENGTHS = [0.25, 1.0]
CLAIMS = {"04_subspace_perspective": {"C4"}, "05_main_results": {"C5", "C6", "C7"},
          "06_static_vs_dynamic": {"C8"}, "09_lora": {"C11"}}


def _adapters(files):
    """The adapters of test_clip_testbed's LoRA test (seed 5) for every task; the ``lora`` option's pattern."""
    write_adapters(files, seed=5)
    return "{task}/adapter"


def _definition(files, cache):
    return dict(family="clip", arch=TINY, checkpoint_dir=str(files["ckpt"]), pretrained_file="zeroshot.pt",
                finetuned_pattern="{task}/finetuned.pt", heads=str(files["heads"]), data_root=str(files["data"]),
                tasks=TASKS, lora=_adapters(files), device="cpu", batch_size=16, cache_dir=str(cache))


def _parameter_set(files, cache):
    """paper-vitb32-8.yaml's chapters and testbed names, smoke.yaml's sizes."""
    small = dict(seeds=[0], **LIMITS)
    return {
        "testbeds": {NAME: _definition(files, cache)},
        "common": {"seeds": [0]},
        "04_subspace_perspective": dict(testbed=NAME, draws=1, strengths=STRENGTHS, **small),
        "05_main_results": dict(testbeds=[NAME], seeds_large=[0], methods=["task_arithmetic", "iso_c"],
                                alpha_points=2, **small),
        "06_static_vs_dynamic": dict(testbed=NAME, methods=["iso_c"], alpha_points=2, **small),
        "07_layer_depth": dict(testbeds=[NAME], alpha_points=2, **small),
        "08_efficiency": dict(testbed=NAME, n_iters=[12], timing_repeats=1, alpha_points=2, **small),
        "09_lora": dict(testbed=NAME, methods=["iso_c"], alpha_points=2, **small),
        "10_theory": dict(testbed=NAME, loss_examples=4, fracs=[0.5, 1.0], **small),
        "11_sensitivity": dict(testbed=NAME, core_fracs=[0.1, 0.2], active_fracs=[0.05, 0.1], lbw_tols=[0.5],
                               max_shield_fracs=[0.5], shield_tols=[0.0001], alpha_points=2, **LIMITS),
    }


@pytest.fixture(scope="module")
def book(files, tmp_path_factory):
    """CHAPTERS computed by the runner; yields ``{"out": <the set's executed folder>, "store": <its
    records folder of the main run>}``."""
    from conftest import load_runner

    rn = load_runner()
    tmp = tmp_path_factory.mktemp("clipbook")
    set_file = tmp / "clip-tiny-book.yaml"
    set_file.write_text(yaml.safe_dump(_parameter_set(files, tmp / "cache")))
    mp = pytest.MonkeyPatch()
    mp.setattr(rn, "EXECUTED", tmp / "executed")
    mp.setattr(rn, "RECORDS", tmp / "records")
    mp.setenv("PACT_CACHE", str(tmp / "pact-cache"))  # nothing written to the checkout's cache
    try:
        rc = rn.main(["--mode", "compute", "--params", str(set_file), "--only", *CHAPTERS, "--jobs", "2",
                      "--no-render"])
        out = tmp / "executed" / set_file.stem
        assert rc == 0, f"runner exit {rc}; failed: {sorted(p.name for p in out.glob('*.failed.ipynb'))}"
        yield {"out": out, "store": tmp / "records" / set_file.stem / "main"}
    finally:
        mp.undo()
        testbeds.undefine(NAME)


@pytest.fixture(scope="module")
def direct(files, tmp_path_factory):
    """The same files as the book's testbed, loaded here with a cache of their own and one torch
    thread (the kernels' count with --jobs 2 on two cores): ``{"full": tb, "lora": tb}``."""
    spec = _definition(files, tmp_path_factory.mktemp("direct-cache"))
    testbeds.define(DIRECT, replace=True, **spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield {kind: testbeds.load(DIRECT, 0, kind=kind, **LIMITS) for kind in ("full", "lora")}
    finally:
        torch.set_num_threads(threads)
        testbeds.undefine(DIRECT)


def _records(book, chapter):
    return records.read_records(book["store"] / chapter / f"{chapter}.jsonl")


def _merges(recs):
    return [r for r in recs if r["method"] not in ("zero-shot", "fine-tuned")]


def _check_merge_record(rec, kind, *, filtered_here=True):
    """The fields every `testbeds.run` record of the book's testbed has, with sane values
    (``filtered_here``: a PACT row's filter ran inside `run`, not before it as in chapter 7)."""
    assert rec["testbed"] == NAME and rec["suite"] == testbeds.suite_of(NAME) and rec["kind"] == kind, rec["method"]
    m = rec["metrics"]
    for name in ("acc", "val_acc", *(f"acc:{t}" for t in TASKS)):
        assert 0.0 <= m[name] <= 1.0, (rec["method"], name, m[name])
    for name in ("norm_acc", "val_norm_acc", *(f"norm_acc:{t}" for t in TASKS)):
        assert m[name] is not None and math.isfinite(m[name]) and m[name] >= 0, (rec["method"], name, m[name])
    assert m["acc"] == pytest.approx(sum(m[f"acc:{t}"] for t in TASKS) / len(TASKS))
    assert rec["alpha"] in rec["alphas"] and rec["alpha"] in [p["alpha"] for p in rec["curve"]]
    if filtered_here and rec["pact"]:
        assert 0.0 < rec["removed_energy"] < 1.0, rec["method"]  # the filter removed something, not everything
    elif filtered_here:
        assert rec["removed_energy"] is None


def _same_merge(got, want):
    """A chapter's record and `testbeds.run` on the direct testbed: the same α search and scores."""
    assert got["alphas"] == want["alphas"] and got["alpha"] == want["alpha"], got["method"]
    assert [p["alpha"] for p in got["curve"]] == [p["alpha"] for p in want["curve"]]
    for name in ("removed_energy", "cap_binding_rate"):  # what the PACT / S-PACT filter did
        assert got[name] == (None if want[name] is None else pytest.approx(want[name], rel=1e-5)), \
            (got["method"], name)
    for name, value in want["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, abs=1e-9), (got["method"], name)
    for split, what in itertools.product(("val", "test"), ("acc", "normalized")):
        assert got["per_task"][split][what] == pytest.approx(want["per_task"][split][what], abs=1e-9), \
            (got["method"], split, what)


def _direct_run(tb, rec, **grid):
    return testbeds.run(tb, rec["base"], pact=rec["pact"], alphas=testbeds.alpha_grid(rec["base"], 2, **grid),
                        memo=False)


# ----------------------------------------------------------------------------- every chapter

def test_the_runner_executed_every_chapter_on_the_clip_testbed(book):
    out = book["out"]
    assert not list(out.glob("*.failed.ipynb"))
    for ch in CHAPTERS:
        prov = json.loads((book["store"] / ch / "provenance.json").read_text())
        named = prov["params"].get("testbed", prov["params"].get("testbeds"))
        assert named in (NAME, [NAME]), ch
        assert list((out / "figures").glob(f"fig{ch[:2]}.*.png")), f"{ch}: no figure"
        recs = _records(book, ch)
        assert recs, ch
        for r in recs:  # every accuracy any chapter recorded is one
            for name, value in r["metrics"].items():
                if name == "acc" or name.startswith(("acc:", "val_acc")):
                    assert value is not None and 0.0 <= value <= 1.0, (ch, r["method"], name, value)
        verdicts = book["store"] / ch / f"{ch}.verdicts.jsonl"  # the claim chapters end with verdicts
        lines = verdicts.read_text().splitlines() if verdicts.exists() else []
        got = {json.loads(line)["claim"]: json.loads(line)["status"] for line in lines}
        assert CLAIMS.get(ch, set()) <= set(got), (ch, got)
        assert set(got.values()) <= set(STATUSES), (ch, got)


# ----------------------------------------------------------------------------- chapter 4

def test_chapter_4_subspaces_and_ablations_of_every_task(book, direct):
    from pactlib.book.experiments import subspace
    from pactlib.pact import PactOptions

    tb = direct["full"]
    recs = _records(book, "04_subspace_perspective")
    assert {r["method"] for r in recs} == {"dimensions", "ablate"}
    assert all(r["seed"] == 0 and r["suite"] == testbeds.suite_of(NAME) for r in recs)
    # P1-P3 per (layer, task): every matrix layer of the tower, its shape, K >= LBW rank
    dims = [r for r in recs if r["method"] == "dimensions"]
    keys = tb.rule.matrix_keys(tb.pretrained)
    assert len(keys) > 1 and sorted((r["key"], r["task"]) for r in dims) == sorted(itertools.product(keys, TASKS))
    for r in dims:
        m = r["metrics"]
        assert (m["m"], m["n"]) == tuple(tb.rule.view(r["key"], tb.pretrained[r["key"]]).shape), r["key"]
        assert 1 <= m["k"] <= min(m["m"], m["n"]) and 0 <= m["lbw_rank"] <= m["K"] <= min(m["m"], m["n"]), r["key"]
        assert 0.0 < m["core_energy"] <= 1.0 + 1e-6
    # C4: one row per (task, condition, strength) with draws=1, each task's drop from its own θt
    abl = [r for r in recs if r["method"] == "ablate"]
    assert sorted((r["task"], r["condition"], r["strength"]) for r in abl) == \
        sorted(itertools.product(TASKS, subspace.CONDITIONS, STRENGTHS))
    for r in abl:
        assert r["metrics"]["drop"] == pytest.approx(tb.ft_test[r["task"]] - r["metrics"]["acc"], abs=1e-9)
        assert r["metrics"]["dims"] > 0 and 0.0 < r["metrics"]["energy"] < 1.0
    lbw = [r for r in abl if r["condition"] == "lbw"]
    assert all(r["metrics"]["overlap"] == pytest.approx(1.0, abs=1e-4) for r in lbw)
    assert all(r["metrics"]["overlap"] < 0.99 for r in abl if r["condition"] in ("random", "energy"))
    # the LBW ablations recomputed here, on the files loaded with a cache of their own
    subs = subspace.subspaces_by_layer(tb.pretrained, tb.task_vectors(), options=PactOptions(), rule=tb.rule)
    for t in TASKS:
        want = subspace.ablation_records(tb, t, subs, draws=1, seed=0, strengths=STRENGTHS, params={},
                                         conditions=("lbw",), rule=tb.rule)
        got = sorted((r for r in lbw if r["task"] == t), key=lambda r: r["strength"])
        assert [r["metrics"]["dims"] for r in got] == [w["metrics"]["dims"] for w in want]
        for g, w in zip(got, want):
            assert g["metrics"]["acc"] == pytest.approx(w["metrics"]["acc"], abs=1e-9), (t, g["strength"])
            assert g["metrics"]["energy"] == pytest.approx(w["metrics"]["energy"], rel=1e-4), (t, g["strength"])


# ----------------------------------------------------------------------------- chapters 5 and 6

def test_chapter_5_merges_and_reference_rows_equal_the_library_run(book, direct):
    tb = direct["full"]
    recs = _records(book, "05_main_results")
    assert sorted(r["method"] for r in recs) == sorted(
        ["task_arithmetic", "pact-task_arithmetic", "iso_c", "pact-iso_c", "zero-shot", "fine-tuned"])
    for rec in _merges(recs):
        _check_merge_record(rec, "full")
        _same_merge(rec, _direct_run(tb, rec))
    ref = {r["method"]: r["metrics"]["acc"] for r in recs if r["method"] in ("zero-shot", "fine-tuned")}
    assert ref["zero-shot"] == pytest.approx(sum(tb.zs_test.values()) / len(TASKS), abs=1e-9)
    assert ref["fine-tuned"] == pytest.approx(sum(tb.ft_test.values()) / len(TASKS), abs=1e-9)


def test_chapter_6_has_plain_s_pact_and_pact_rows_equal_the_library_run(book, direct):
    recs = _records(book, "06_static_vs_dynamic")
    assert sorted((r["method"], r["pact"] or "") for r in recs) == \
        [("iso_c", ""), ("pact-iso_c", "pact"), ("s-pact-iso_c", "s-pact")]
    for rec in recs:
        _check_merge_record(rec, "full")
        _same_merge(rec, _direct_run(direct["full"], rec))
    # run's memo: chapter 6 ran after chapter 5 (the runner's AFTER) and reused its merges, records
    # and all (their timings too), instead of merging again
    five = {r["method"]: r for r in _records(book, "05_main_results")}
    shared = [r for r in recs if r["method"] in five]
    assert sorted(r["method"] for r in shared) == ["iso_c", "pact-iso_c"]
    for rec in shared:
        assert rec == dict(five[rec["method"]], memo_hit=True), rec["method"]


# ----------------------------------------------------------------------------- chapter 9

def test_chapter_9_merges_the_lora_adapters(book, direct):
    lora, full = direct["lora"], direct["full"]
    recs = _records(book, "09_lora")
    assert sorted(r["method"] for r in recs) == ["fine-tuned", "iso_c", "pact-iso_c", "zero-shot"]
    assert all(r["kind"] == "lora" and r["testbed"] == NAME for r in recs)
    for rec in _merges(recs):
        _check_merge_record(rec, "lora")
        assert set(testbeds.alpha_grid("iso_c", 2, lo=0.1, hi=3.0)) <= set(rec["alphas"])  # the LoRA grid
        _same_merge(rec, _direct_run(lora, rec, lo=0.1, hi=3.0))
    ref = {r["method"]: r["metrics"] for r in recs if r["method"] in ("zero-shot", "fine-tuned")}
    # the fine-tuned row is θ0 + each task's adapter, not the full fine-tune θt (which scores otherwise)
    lora_ft = sum(lora.ft_test.values()) / len(TASKS)
    assert lora_ft != pytest.approx(sum(full.ft_test.values()) / len(TASKS))  # the check below can tell them apart
    assert ref["fine-tuned"]["acc"] == pytest.approx(lora_ft, abs=1e-9) and ref["fine-tuned"]["norm_acc"] == 1.0
    # θ0 and its heads are the same whatever the kind
    assert ref["zero-shot"]["acc"] == pytest.approx(sum(full.zs_test.values()) / len(TASKS), abs=1e-9)
    assert math.isfinite(ref["zero-shot"]["norm_acc"])


# ----------------------------------------------------------------------------- with PACT_CLIP_BOOK_ALL=1

@pytest.mark.skipif(not os.environ.get("PACT_CLIP_BOOK_ALL"), reason="set PACT_CLIP_BOOK_ALL=1 (about 2 min)")
@pytest.mark.parametrize("chapter", MORE)
def test_other_chapters_record_merges_of_the_clip_testbed(book, chapter):
    recs = _records(book, chapter)
    runs = [r for r in recs if "kind" in r and "curve" in r]
    if chapter != "10_theory":  # 10 records the loss bound of P-filters, no merge
        assert runs, chapter
    for rec in runs:
        _check_merge_record(rec, "full", filtered_here=chapter != "07_layer_depth")
