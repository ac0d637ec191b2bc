"""scripts/compare_records.py: pairing records, counting numbers, timings aside, verdict changes."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_records", ROOT / "scripts" / "compare_records.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)


def _text(*records):
    return "".join(json.dumps(r) + "\n" for r in records)


def test_numbers_are_compared_leaf_by_leaf_timings_and_flags_aside():
    a = {"method": "ties", "seed": 0, "params": {"k": 0.2}, "merge_seconds": 1.0, "ok": True,
         "metrics": {"acc": 0.5, "acc:mnist": 0.25}, "curve": [{"alpha": 0.1, "mean_acc": 0.4}]}
    b = json.loads(json.dumps(a)) | {"merge_seconds": 9.0}
    b["metrics"] = {"acc": 0.5, "acc:mnist": 0.2500001}
    r = cr.compare_file(_text(a), _text(b), "x.jsonl")
    # numbers: seed, params.k, metrics.acc, metrics.acc:mnist, curve[0].alpha, curve[0].mean_acc (not the timing, not the bool)
    assert (r["records"], r["numbers"], r["identical"]) == (1, 6, 5)
    assert r["max_abs"] == pytest.approx(1e-7) and r["max_rel"] == pytest.approx(1e-7 / 0.2500001)
    assert r["verdicts"] == []


def test_verdict_changes_are_named_and_unpairable_records_raise():
    v = {"claim": "C5", "status": "reproduced", "evidence": "x"}
    r = cr.compare_file(_text(v), _text(v | {"status": "partly reproduced", "evidence": "y"}), "v.jsonl")
    assert r["verdicts"] == ["C5: reproduced -> partly reproduced"] and r["numbers"] == 0
    with pytest.raises(ValueError, match="1 records at the revision, 2 now"):
        cr.compare_file(_text(v), _text(v, v), "v.jsonl")
    chosen = cr.compare_file(_text({"method": "ta", "seed": 0, "params": {"alpha": 0.3, "k": 1}}),
                             _text({"method": "ta", "seed": 0, "params": {"alpha": 0.4, "k": 1}}), "a.jsonl")
    assert (chosen["numbers"], chosen["identical"]) == (3, 2)  # another chosen α: the same record, one number moved
    with pytest.raises(ValueError, match="record 0 is another one now"):
        cr.compare_file(_text({"method": "ties", "seed": 0}), _text({"method": "ties", "seed": 1}), "m.jsonl")


def test_chapter_folders_are_run_and_chapter_not_the_stores_log():
    base = Path("book/records/default")
    files = [base / "reproductions.jsonl", base / "main/05_main_results/05_main_results.jsonl",
             base / "main/05_main_results/05_main_results.verdicts.jsonl", base / "minilm/09_lora/09_lora.jsonl"]
    assert cr.chapter_folders([str(f) for f in files], base) == ["main/05_main_results", "minilm/09_lora"]
