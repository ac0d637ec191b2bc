"""bench/bench_test_size.py: its whole-split records, cut to chapter 5's test_limit, are chapter 5's.

The bench rebuilds chapter 5's merges of the 8-task Lite0 suite (seeds 0-2, every base method,
plain and PACT) at the α the chapter chose and keeps each test example's outcome on the whole
split (``book/data/test_size.jsonl``). Its curve rests on one step: the first n outcomes per task
are what the testbed gives at ``test_limit = n``. At n = chapter 5's test_limit that is checked
here against the chapter's committed records, outcome for outcome, and the interval of the curve
at that n against the chapter's own (Table 5.2). When chapter 5 is recomputed with other merges,
this test says that the bench's records must be made again.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pactlib.book import intervals, records, report

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "book" / "data" / "test_size.jsonl"
CHAPTER = ROOT / "book" / "records" / "default" / "main" / "05_main_results" / "05_main_results.jsonl"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_test_size", ROOT / "bench" / "bench_test_size.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prefix_at_test_limit_is_chapter_5():
    bench = _bench()
    recs = [r for r in records.read_records(DATA) if r.get("testbed") == "lite0-8"]
    ft = {r["seed"]: r for r in recs if r.get("part") == "reference" and r["method"] == "fine-tuned"}
    merges = [r for r in recs if r.get("part") == "merge"]
    chapter = {(r["method"], r["seed"]): r for r in records.read_records(CHAPTER) if r.get("suite") == "8"}
    assert len(merges) == 30 and sorted(ft) == [0, 1, 2]
    limit = merges[0]["chapter_test_limit"]
    assert limit == 300
    for r in merges:
        c = chapter[(r["method"], r["seed"])]
        assert r["alpha"] == c["alpha"]
        full = r["outcomes"]["test"]
        assert sum(int(v.split(":")[0]) for v in full.values()) == 7 * 1000 + 359  # the whole split
        cut = bench.prefix(r, limit, ft[r["seed"]])
        assert cut["outcomes"]["test"] == c["outcomes"]["test"]  # every one of the 2,400 outcomes
        for t in full:
            assert cut["metrics"][f"norm_acc:{t}"] == pytest.approx(c["metrics"][f"norm_acc:{t}"], rel=1e-12)
        assert r["chapter_agreement"]["examples_differ"] == 0
    # the curve's point at n = test_limit is chapter 5's interval of PACT-TA − TA
    plus = [bench.prefix(r, limit, ft[r["seed"]]) for r in merges if r["method"] == "pact-task_arithmetic"]
    minus = [bench.prefix(r, limit, ft[r["seed"]]) for r in merges if r["method"] == "task_arithmetic"]
    mine = intervals.contrast(plus, minus, metric="norm_acc")
    theirs = report.gain_interval(records.records_frame(CHAPTER), "pact-task_arithmetic", "task_arithmetic", suite="8")
    for name in ("estimate", "lo", "hi", "se_examples", "se_seeds"):
        assert getattr(mine, name) == pytest.approx(getattr(theirs, name), rel=1e-9, abs=1e-12)
    stored = [r for r in recs if r.get("part") == "half_width" and r["params"] == dict(
        testbed="lite0-8", base="task_arithmetic", metric="norm_acc", n=limit)]
    assert len(stored) == 1 and stored[0]["metrics"]["half_width"] == pytest.approx(theirs.half_width, rel=1e-9)
