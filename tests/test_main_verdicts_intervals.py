"""Chapter 5's verdicts (C5-C7) and chapter 6's (C8) graded on 95 % intervals from per-example outcomes."""
import numpy as np
import pytest
import torch

from pactlib.book import report
from pactlib.book.records import make_record, records_frame
from pactlib.outcomes import pack

N, TASKS = 400, ("a", "b")


def _rec(method, suite, seed, p, rng):
    bits = {t: rng.random(N) < p for t in TASKS}
    acc = {t: float(b.mean()) for t, b in bits.items()}
    metrics = {"acc": float(np.mean(list(acc.values()))), "norm_acc": float(np.mean(list(acc.values()))) / 0.9,
               **{f"acc:{t}": acc[t] for t in TASKS}, **{f"norm_acc:{t}": acc[t] / 0.9 for t in TASKS}}
    return make_record(method, params={}, seed=seed, metrics=metrics, suite=suite, testbed=f"tb-{suite}",
                       outcomes={"test": {t: pack(torch.tensor(b)) for t, b in bits.items()}})


def _frame(gain_by_suite, seeds=(0, 1, 2)):
    rng = np.random.default_rng(0)
    recs = []
    for suite, gain in gain_by_suite.items():
        for seed in seeds:
            for m in ("task_arithmetic", "iso_c"):
                recs += [_rec(m, suite, seed, 0.6, rng), _rec(f"pact-{m}", suite, seed, 0.6 + gain, rng)]
    return records_frame(recs)


@pytest.mark.parametrize("gains, c5, c7", [
    ({"8": 0.15, "20": 0.35}, "reproduced", "reproduced"),       # clear gains, clear growth
    ({"8": -0.15, "20": -0.15}, "contradicted", "inconclusive"),  # clear losses, no growth
    ({"8": 0.0, "20": 0.0}, "inconclusive", "inconclusive"),      # nothing to see at this size
])
def test_main_verdicts_follow_the_intervals(gains, c5, c7):
    v = report.main_verdicts(_frame(gains), suites=list(gains), c5_methods=("task_arithmetic", "iso_c"))
    assert v["C5"]["status"] == c5 and v["C7"]["status"] == c7
    assert len(v["C5"]["conditions"]) == 2 * 2 * len(gains)  # methods x suites x (abs, norm)
    c = v["C5"]["conditions"][0]
    assert c["name"] == "PACT-Task Arithmetic − Task Arithmetic, T = 8, abs" and c["lo"] < c["estimate"] < c["hi"]
    assert c["n_seeds"] == 3 and c["n_examples"] == N
    assert "95 % intervals" in v["C5"]["evidence"]


def test_c6_needs_pact_iso_c_above_every_rival():
    v = report.main_verdicts(_frame({"8": 0.3}), suites=["8"], c5_methods=("iso_c",))
    names = sorted(c["name"] for c in v["C6"]["conditions"])
    assert names == ["PACT-Iso-C − Iso-C, T = 8", "PACT-Iso-C − PACT-Task Arithmetic, T = 8",
                     "PACT-Iso-C − Task Arithmetic, T = 8"]
    grades = {c["name"]: c["grade"] for c in v["C6"]["conditions"]}
    assert grades["PACT-Iso-C − Iso-C, T = 8"] == grades["PACT-Iso-C − Task Arithmetic, T = 8"] == "holds"
    assert grades["PACT-Iso-C − PACT-Task Arithmetic, T = 8"] == "inconclusive"  # the same accuracy by design
    assert v["C6"]["status"] == "partly reproduced"


def test_records_without_outcomes_are_graded_by_sign_and_say_so():
    recs = [make_record(m, params={}, seed=0, suite="8", metrics={"acc": a, "norm_acc": a})
            for m, a in (("task_arithmetic", 0.6), ("pact-task_arithmetic", 0.61))]
    v = report.main_verdicts(recs, suites=["8"], c5_methods=("task_arithmetic",))
    assert v["C5"]["status"] == "reproduced" and "graded by sign" in v["C5"]["evidence"]
    assert "conditions" not in v["C5"]


def test_c8_compares_pact_with_s_pact_on_the_same_examples():
    rng = np.random.default_rng(3)
    recs = []
    for seed in (0, 1, 2):
        for m in ("task_arithmetic",):
            recs += [_rec(m, "8", seed, 0.6, rng), _rec(f"s-pact-{m}", "8", seed, 0.6, rng),
                     _rec(f"pact-{m}", "8", seed, 0.8, rng)]
    v = report.static_vs_dynamic_verdict(records_frame(recs), methods=["task_arithmetic"], suite="8")
    assert v["status"] == "reproduced" and v["conditions"][0]["name"] == "PACT-Task Arithmetic − S-PACT-Task Arithmetic"
    table = report.gain_table(records_frame(recs), ["task_arithmetic"], ["8"])
    assert table.loc["Task Arithmetic", "T = 8"].endswith("(3 seeds)") and "[" in table.loc["Task Arithmetic", "T = 8"]
