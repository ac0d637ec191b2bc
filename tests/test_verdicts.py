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

TASKS = ("a", "b")


def _flipped(up, down, n=400, base=200):
    """n outcomes, the first ``base`` correct, then ``up`` more made correct and the first ``down`` made
    wrong: two such vectors differ on |up − up'| + |down − down'| examples, all the same way."""
    import torch

    c = torch.zeros(n, dtype=torch.bool)
    c[: base + up] = True
    c[:down] = False
    return c


def _scored(method, seed, flips, **fields):
    """A record with per-example outcomes on TASKS (``flips`` = (up, down) of :func:`_flipped`) and the
    per-task metrics a normalized contrast reads (fine-tuned accuracy 0.9)."""
    from pactlib.outcomes import pack

    c = _flipped(*flips)
    acc = float(c.float().mean())
    return make_record(method, params={}, seed=seed, testbed=f"t-{fields.get('suite', '')}",
                       metrics={"acc": acc, "norm_acc": acc / 0.9, **{f"acc:{t}": acc for t in TASKS},
                                **{f"norm_acc:{t}": acc / 0.9 for t in TASKS}},
                       outcomes={"test": {t: pack(c) for t in TASKS}}, **fields)


def _groups(flips_by_suite, seeds=(0, 1, 2)):
    """Chapter 7's group records: {suite: {group: (up, down)}} (none = (0, 0) unless given)."""
    recs = []
    for suite, flips in flips_by_suite.items():
        for seed in (seeds if suite == next(iter(flips_by_suite)) else seeds[:1]):
            for g, f in {"none": (0, 0), **flips}.items():
                recs.append(_scored("m", seed, f, suite=suite, group=g))
    return records_frame(recs)


_FEW = dict(early=(50, 0), middle=(10, 0), late=(5, 0), all=(60, 0))      # early well above half of all: holds
_MANY = dict(early=(20, 0), middle=(30, 0), late=(10, 0), all=(80, 0))    # all beats every group; early < half


@pytest.mark.parametrize("flips, early, whole", [
    ({"8": _FEW, "20": _MANY}, "reproduced", "reproduced"),
    # early − late (T=8) and all − late (T=20) across 0 (a few examples each way): inconclusive
    ({"8": {**_FEW, "late": (55, 6)}, "20": {**_MANY, "late": (82, 3)}}, "partly reproduced", "partly reproduced"),
    # early hurts at T=8 (every early condition fails); at T=20 early keeps most of the gain (fails)
    ({"8": {**_FEW, "early": (0, 40)}, "20": {**_MANY, "early": (70, 0)}}, "contradicted", "contradicted"),
    # no condition decided: every difference is a few examples each way
    ({"8": dict(early=(3, 2), middle=(2, 2), late=(2, 2), all=(4, 3))}, "inconclusive", "not yet tested"),
])
def test_c9_statuses(flips, early, whole):
    v = depth.c9_verdicts(_groups(flips), suites=list(flips))
    assert (v["early"]["status"], v["whole"]["status"]) == (early, whole)
    c = v["early"]["conditions"]
    assert [x["name"] for x in c] == ["T=8: all layers − no filter",
                                      "T=8: early only − 0.5 × all layers − 0.5 × no filter",
                                      "T=8: early only − middle only", "T=8: early only − late only"]
    assert c[0]["n_seeds"] == 3 and c[0]["n_examples"] == 400
    f = flips["8"]
    # the estimate is the points of normalized accuracy the flips give: (up − down) / 400 / 0.9
    gain = lambda g: 100 * (f[g][0] - f[g][1]) / 400 / 0.9  # noqa: E731
    assert c[0]["estimate"] == pytest.approx(gain("all"))
    assert c[1]["estimate"] == pytest.approx(gain("early") - 0.5 * gain("all"))
    assert "3 seeds, 400 test examples per task" in v["early"]["evidence"]
    if whole != "not yet tested":
        w = v["whole"]["conditions"]
        assert w[-1]["side"] == "<" and w[0]["n_seeds"] == 1


def test_c9_without_outcomes_is_not_yet_tested():
    recs = [make_record("m", params={}, seed=0, suite="8", group=g, metrics={"norm_acc": 0.8}) for g in depth.GROUPS]
    v = depth.c9_verdicts(records_frame(recs), suites=["8"])
    assert v["early"] == {"status": "not yet tested",
                          "evidence": "T=8: records without per-example outcomes: recompute"}
    gone = records_frame([r for r in recs if r["group"] != "late"])
    assert depth.c9_verdicts(gone, suites=["8"])["early"]["evidence"] == "T=8 has no merge for the condition(s) ['late']"
    with pytest.raises(ValueError, match="0.3333 is not a fraction"):
        depth.c9_verdicts(_groups({"8": _FEW}), suites=["8"], most=0.3333)


def _rsvd(up_down, seeds=(0,)):
    """Chapter 8's accuracy records: PACT-Iso-C at 200 of 400 per task, PACT-RSVD-Iso-C ``up_down`` from it."""
    recs = []
    for seed in seeds:
        recs += [{**_scored("pact-iso_c", seed, (0, 0)), "n_test": 800},
                 {**_scored("pact-rsvd-iso_c", seed, up_down), "n_test": 800}]
    return records_frame(recs)


@pytest.mark.parametrize("up_down, speedups, status, grades", [
    ((0, 0), [3.0], "reproduced", ["holds", "holds", "holds"]),  # same predictions: the interval is [0, 0]
    ((7, 0), [3.0], "partly reproduced", ["holds", "inconclusive", "holds"]),  # +1.75 [+0.8, +2.7] vs ± 1.77
    ((50, 0), [3.0], "contradicted", ["holds", "fails", "holds"]),  # +12.5 points: outside the margin
    ((0, 0), [1.1], "contradicted", ["holds", "holds", "fails"]),  # no faster than half the exact time
    ((0, 0), [2.5, 3.0, 3.5], "partly reproduced", ["holds", "holds", "inconclusive"]),  # t interval spans 2
])
def test_c10_statuses(up_down, speedups, status, grades):
    v = efficiency.c10_verdict(_rsvd(up_down), exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=speedups,
                               bench=None)
    assert v["status"] == status and [c["grade"] for c in v["conditions"]] == grades
    lo, hi, t = v["conditions"]
    margin = round(100 * (0.25 / 800) ** 0.5, 2)  # one seed: the binomial standard error of the mean accuracy
    assert (lo["threshold"], lo["side"], hi["threshold"], hi["side"]) == (pytest.approx(-margin), ">",
                                                                          pytest.approx(margin), "<")
    assert lo["estimate"] == pytest.approx(100 * (up_down[0] - up_down[1]) / 400)
    assert (t["threshold"], t["unit"], t["estimate"]) == (2.0, "×", pytest.approx(sum(speedups) / len(speedups)))
    assert f"Margin ± {margin:.2f} points" in v["evidence"]


def test_c10_without_outcomes_is_not_yet_tested():
    recs = [make_record(m, params={}, seed=0, n_test=800, metrics={"acc": 0.8}) for m in ("pact-iso_c", "pact-rsvd-iso_c")]
    v = efficiency.c10_verdict(records_frame(recs), exact="pact-iso_c", other="pact-rsvd-iso_c", speedups=[3.0],
                               bench=None)
    assert v["status"] == "not yet tested" and "conditions" not in v
    assert v["evidence"].startswith("PACT-RSVD-Iso-C vs PACT-Iso-C: records without per-example outcomes: recompute. "
                                    "Margin ± ")


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
