"""pactlib.book.verdicts: the one verdict ladder, and the claims' statuses through it."""
import itertools
import re
from pathlib import Path

import pytest

from pactlib.book import plotting, report, verdicts
from pactlib.book.experiments import depth, efficiency, theory
from pactlib.book.records import make_record, records_frame


def _rule(n_ok, n):
    """The ladder written out: all -> reproduced; at least half -> partly; fewer -> not."""
    return "reproduced" if n and n_ok == n else ("partly reproduced" if n_ok and 2 * n_ok >= n else "not reproduced")


def test_statuses_and_the_plotting_alias():
    assert verdicts.STATUSES == ("reproduced", "partly reproduced", "not reproduced", "not yet tested")
    assert plotting.VERDICTS == verdicts.STATUSES


@pytest.mark.parametrize("n_ok, n, status", [
    (0, 0, "not reproduced"), (0, 1, "not reproduced"), (1, 1, "reproduced"), (0, 2, "not reproduced"),
    (1, 2, "partly reproduced"), (2, 2, "reproduced"), (5, 9, "partly reproduced"), (24, 24, "reproduced"),
    (4, 9, "not reproduced"), (4, 24, "not reproduced"), (12, 24, "partly reproduced"), (1, 3, "not reproduced"),
])
def test_ladder_table(n_ok, n, status):
    assert verdicts.ladder(n_ok, n) == status


def test_ladder_keeps_its_rule_under_every_option():
    for n in range(5):
        for n_ok in range(n + 1):
            assert verdicts.ladder(n_ok, n) == _rule(n_ok, n)
            if n == 2:  # depth (C9) and efficiency (C10) wrote "n_ok == 2"
                assert verdicts.ladder(n_ok, n) == ("reproduced" if n_ok == 2 else
                                                    ("partly reproduced" if n_ok else "not reproduced"))
    for bound_ok, parts in itertools.product((True, False), range(4)):  # theory (C12)
        old = ("reproduced" if bound_ok and parts == 3 else
               ("partly reproduced" if bound_ok and parts >= 2 else "not reproduced"))
        assert verdicts.ladder(parts, 3, required=bound_ok) == old
    for n, moved in itertools.product(range(4), (True, False)):  # scalar (C3): full only when moved
        for n_ok in range(n + 1):
            old = _rule(n_ok, n)
            if old == "reproduced" and not moved:
                old = "partly reproduced"
            assert verdicts.ladder(n_ok, n, full=moved) == old


@pytest.mark.parametrize("full, partial, status", [
    (True, True, "reproduced"), (True, False, "reproduced"), (False, True, "partly reproduced"),
    (False, False, "not reproduced"),
])
def test_grade(full, partial, status):
    assert verdicts.grade(full, partial) == status


def test_verdict_dict_checks_the_status():
    assert verdicts.verdict("partly reproduced", "2/3") == {"status": "partly reproduced", "evidence": "2/3"}
    assert verdicts.not_tested("one suite") == {"status": "not yet tested", "evidence": "one suite"}
    with pytest.raises(ValueError, match="'partly'"):
        verdicts.verdict("partly", "x")


def test_no_verdict_code_writes_the_ladder_itself():
    root = Path(verdicts.__file__).parent
    for path in [root / "report.py", *sorted((root / "experiments").glob("*.py"))]:
        text = path.read_text()
        assert '"partly reproduced"' not in text and '"not yet tested"' not in text, path
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


def _first_order(rows):
    return records_frame([make_record("first-order", params={}, seed=0, task=t,
                                      metrics=dict(predicted=p, bound=b, measured=m, acc_change=a, loss=1.0,
                                                   removed_energy=0.1, acc_ft=0.9, acc_filtered=0.9 + a))
                          for t, p, b, m, a in rows])


@pytest.mark.parametrize("rows, status", [
    ([("a", 0.01, 0.05, 0.012, 0.0), ("b", 0.02, 0.03, 0.018, -0.005)], "reproduced"),
    ([("a", 0.01, 0.05, -0.03, 0.0), ("b", 0.02, 0.03, 0.05, -0.005)], "not reproduced"),  # small only: 1/3
    ([("a", 0.01, 0.05, -0.03, 0.0), ("b", 0.02, 0.03, 0.02, -0.005)], "partly reproduced"),  # within + small
    ([("a", 0.01, 0.05, 0.012, -0.2), ("b", 0.02, 0.03, 0.018, -0.1)], "partly reproduced"),
    ([("a", 0.1, 0.05, 0.1, 0.0), ("b", 0.02, 0.03, 0.018, 0.0)], "not reproduced"),
    ([("a", 0.01, 0.05, -0.03, -0.2), ("b", 0.02, 0.03, 0.05, -0.1)], "not reproduced"),
])
def test_c12_statuses(rows, status):
    assert theory.c12_verdict(_first_order(rows))["status"] == status


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
