"""pactlib.book.verdicts: the one verdict ladder, and the claims' statuses through it."""
import itertools
import re
from pathlib import Path

import pytest

from pactlib.book import plotting, report, verdicts
from pactlib.book.experiments import depth, efficiency, theory
from pactlib.book.records import make_record, records_frame


from pactlib.book.intervals import Interval, point
import outcome_records as oc


def _c(lo, hi, threshold=0.0, side=">"):
    est = (lo + hi) / 2
    return verdicts.condition("x", Interval(est, lo, hi, (hi - lo) / 3.92, se_examples=(hi - lo) / 3.92,
                                            n_examples=300), threshold=threshold, side=side)


def test_statuses_and_the_plotting_alias():
    assert verdicts.STATUSES == ("reproduced", "partly reproduced", "inconclusive", "contradicted", "not reproduced",
                                 "not yet tested")
    assert plotting.VERDICTS == verdicts.STATUSES


@pytest.mark.parametrize("lo, hi, threshold, side, grade", [
    (0.1, 2.0, 0.0, ">", "holds"), (-2.0, -0.1, 0.0, ">", "fails"), (-0.5, 1.5, 0.0, ">", "inconclusive"),
    (-1.0, 0.0, 0.0, ">", "fails"), (0.0, 1.0, 0.0, ">", "inconclusive"),  # touching the threshold: not above it
    (0.5, 0.9, 1.0, "<", "holds"), (1.0, 1.2, 1.0, "<", "fails"), (0.9, 1.1, 1.0, "<", "inconclusive"),
    (3.0, 3.0, 2.0, ">", "holds"), (2.0, 2.0, 2.0, ">", "fails"),  # a point (no sampling error)
])
def test_a_condition_is_graded_by_where_its_interval_lies(lo, hi, threshold, side, grade):
    assert verdicts.judge(lo, hi, threshold, side) == grade
    assert _c(lo, hi, threshold, side)["grade"] == grade


def test_judge_refuses_bad_sides_and_intervals():
    with pytest.raises(ValueError, match="side must be"):
        verdicts.judge(0, 1, 0, ">=")
    with pytest.raises(ValueError, match="lo > hi"):
        verdicts.judge(1, 0)


@pytest.mark.parametrize("grades, status", [
    (["holds", "holds"], "reproduced"), (["holds", "inconclusive"], "partly reproduced"),
    (["inconclusive", "inconclusive"], "inconclusive"), (["holds", "fails"], "contradicted"),
    (["inconclusive", "fails"], "contradicted"), (["fails"], "contradicted"), ([], "not yet tested"),
    (["holds"], "reproduced"), (["inconclusive"], "inconclusive"),
])
def test_the_claim_rule(grades, status):
    assert verdicts.claim_status([{"grade": g} for g in grades]) == status


def test_every_combination_of_grades_follows_the_rule_as_stated():
    for n in range(1, 4):
        for grades in itertools.product(verdicts.GRADES, repeat=n):
            status = verdicts.claim_status([{"grade": g} for g in grades])
            if "fails" in grades:
                assert status == "contradicted"
            elif set(grades) == {"holds"}:
                assert status == "reproduced"
            elif "holds" in grades:
                assert status == "partly reproduced"
            else:
                assert status == "inconclusive"
    with pytest.raises(ValueError, match="grades"):
        verdicts.claim_status([{"grade": "maybe"}])


def test_an_inconclusive_condition_says_how_much_data_would_decide_it():
    c = _c(-0.5, 1.5)  # estimate 0.5, se = 2/3.92: k = (1.96 se / 0.5)^2 = 4
    assert c["needs_factor"] == pytest.approx(4.0, rel=1e-3)
    assert "1,200 test examples per task" in c["needs"]
    assert _c(0.1, 2.0)["needs"] is None and _c(-2.0, -0.1)["needs"] is None
    assert "no amount of data" in _c(-1.0, 1.0)["needs"]


def test_graded_verdict_lists_its_conditions():
    v = verdicts.graded([_c(0.1, 2.0), _c(-0.5, 1.5)], "PACT gain")
    assert v["status"] == "partly reproduced" and len(v["conditions"]) == 2
    assert v["evidence"].startswith("PACT gain (1 holds, 1 inconclusive): x: +1.05 [+0.10, +2.00] points > 0: holds; ")
    assert verdicts.graded([verdicts.condition("E", point(1.3), threshold=1.0, unit="")], "E")["status"] == "reproduced"


def test_verdict_dict_checks_the_status():
    assert verdicts.verdict("partly reproduced", "2/3") == {"status": "partly reproduced", "evidence": "2/3"}
    assert verdicts.not_tested("one suite") == {"status": "not yet tested", "evidence": "one suite"}
    with pytest.raises(ValueError, match="'partly'"):
        verdicts.verdict("partly", "x")
    with pytest.raises(ValueError, match="'failed'"):
        verdicts.verdict("failed", "x")


@pytest.mark.parametrize("n_ok, n, status", [(0, 0, "not reproduced"), (1, 2, "partly reproduced"), (2, 2, "reproduced"),
                                             (1, 3, "not reproduced")])
def test_the_sign_ladder_of_records_without_outcomes(n_ok, n, status):
    assert verdicts.ladder(n_ok, n) == status


def test_no_verdict_code_writes_the_rule_itself():
    root = Path(verdicts.__file__).parent
    for path in [root / "report.py", *sorted((root / "experiments").glob("*.py"))]:
        text = path.read_text()
        assert '"partly reproduced"' not in text and '"not yet tested"' not in text, path
        assert '"inconclusive"' not in text and '"contradicted"' not in text, path
        assert not re.search(r"\bdict\(status=", text), path


# --- claims on small frames: the statuses the code gave before the ladder moved here -------------

def _groups(gains_by_suite, base=0.80):
    recs = []
    for suite, gains in gains_by_suite.items():
        recs.append(make_record("m", params={}, seed=0, suite=suite, group="none", metrics={"norm_acc": base}))
        recs += [make_record("m", params={}, seed=0, suite=suite, group=g, metrics={"norm_acc": base + v / 100})
                 for g, v in gains.items()]
    return records_frame(recs)


@pytest.mark.parametrize("gains, early, whole", [
    ({"8": (2.0, 0.5, 0.1, 3.0), "20": (1.0, 1.0, 0.5, 5.0)}, "reproduced", "reproduced"),
    ({"8": (0.5, -0.2, 0.0, -0.1), "20": (2.0, 0.0, 0.0, 1.0)}, "partly reproduced", "not reproduced"),
    ({"8": (-0.5, -0.7, -0.2, 1.0), "20": (-0.3, -1.2, -2.1, 0.7)}, "not reproduced", "partly reproduced"),
    ({"8": (1.0, 0.0, 0.0, 3.0), "20": (2.0, 0.0, 0.0, 3.0)}, "partly reproduced", "partly reproduced"),
    ({"8": (0.1, 1.0, 0.0, 2.0)}, "not reproduced", "not yet tested"),
])
def test_c9_statuses(gains, early, whole):
    f = _groups({s: dict(zip(("early", "middle", "late", "all"), g)) for s, g in gains.items()})
    v = depth.c9_verdicts(f, suites=list(gains))
    assert (v["early"]["status"], v["whole"]["status"]) == (early, whole)


@pytest.mark.parametrize("diff, speedup, status", [
    (0.005, 3.0, "reproduced"), (0.005, 1.1, "partly reproduced"), (0.05, 3.0, "partly reproduced"),
    (0.05, 0.9, "not reproduced"),
])
def test_c10_statuses(diff, speedup, status):
    check = dict(acc_exact=0.8, acc_other=0.8 + diff, diff=diff, tol=0.0127, spread=0.0, se=0.0127, n_seeds=1)
    assert efficiency.c10_verdict(check, speedup=speedup, bench=None)["status"] == status


def _first_order(rows, lost):
    """First-order records on 3 seeds and θt's, with per-example outcomes: θ0 + Δ̃t gets ``lost``
    of θt's right test examples wrong on every task (tests/outcome_records.py)."""
    recs = []
    for seed in (0, 1, 2):
        for t, p, b, m in rows:
            recs += [make_record("first-order", params={}, seed=seed, task=t, outcomes=oc.outcomes(t, lost),
                                 metrics=dict(predicted=p, bound=b, measured=m, acc_change=oc.acc(lost) - oc.acc(),
                                              loss=1.0, removed_energy=0.1, acc_ft=oc.acc(), acc_filtered=oc.acc(lost))),
                     make_record("finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                 outcomes=oc.outcomes(t))]
    return records_frame(recs)


GOOD = [("a", 0.01, 0.05, 0.012), ("b", 0.02, 0.03, 0.018)]
WRONG_SIGN = [("a", 0.01, 0.05, -0.012), ("b", 0.02, 0.03, 0.018)]


@pytest.mark.parametrize("rows, lost, grade, status", [
    (GOOD, 0, "holds", "reproduced"),            # no accuracy change: [0, 0] above −1 point
    (GOOD, 1, "holds", "reproduced"),            # −0.25 points, the interval wholly above −1
    (GOOD, 40, "fails", "contradicted"),         # −10 points, wholly below
    (GOOD, 5, "inconclusive", "partly reproduced"),  # −1.25 points, the interval across −1
    (WRONG_SIGN, 0, "holds", "contradicted"),    # a wrong sign fails its condition whatever the accuracy
])
def test_c12_statuses(rows, lost, grade, status):
    v = theory.c12_verdict(_first_order(rows, lost))
    acc = v["conditions"][-1]
    assert acc["name"] == "accuracy change of a task under its own filter" and acc["grade"] == grade
    assert acc["estimate"] == pytest.approx(-100 * lost / oc.N) and acc["n_examples"] == oc.N
    assert v["status"] == status


def _main(gain_by_suite):
    recs = []
    for suite, gain in gain_by_suite.items():
        for m, base in (("task_arithmetic", 0.70), ("iso_c", 0.80)):
            recs += [make_record(m, params={}, seed=0, suite=suite, alpha=0.3, metrics={"acc": base, "norm_acc": base}),
                     make_record(f"pact-{m}", params={}, seed=0, suite=suite, alpha=0.3,
                                 metrics={"acc": base + gain, "norm_acc": base + gain})]
    return recs


@pytest.mark.parametrize("gains, c7", [
    ({"8": 0.01, "14": 0.02, "20": 0.03}, "reproduced"),
    ({"8": 0.01, "14": 0.04, "20": 0.03}, "partly reproduced"),
    ({"8": 0.03, "14": 0.04, "20": 0.01}, "not reproduced"),
    ({"8": 0.01}, "not yet tested"),
])
def test_c7_statuses(gains, c7):
    assert report.main_verdicts(_main(gains), suites=list(gains))["C7"]["status"] == c7
