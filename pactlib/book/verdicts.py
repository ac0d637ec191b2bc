"""The verdict rule: conditions graded on their 95 % intervals, claims graded on their conditions.

A claim is tested through *conditions*: "this gain is > 0", "this ratio is < 1". Each condition
has an estimate with a 95 % interval (:mod:`pactlib.book.intervals`) and is graded by where the
interval lies (book/method.md, "The verdict rule"):

- **holds**: the whole interval lies on the claimed side of the threshold;
- **fails**: the whole interval lies on the other side (or on the threshold);
- **inconclusive**: the interval spans the threshold.

A claim is then

- **reproduced** when every condition holds;
- **contradicted** when any condition fails;
- **partly reproduced** when some hold and the rest are inconclusive;
- **inconclusive** when none holds and none fails.

An inconclusive condition carries a power estimate (:func:`pactlib.book.intervals.needed`): how
much more test data or how many more seeds would decide it at the effect observed.

    c = condition("PACT-TA − TA, T = 8", contrast(pact, plain), threshold=0.0, side=">")
    c["grade"]                      # "holds" | "fails" | "inconclusive"
    graded([c, ...], "PACT gain in normalized accuracy")["status"]
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pactlib.book.intervals import Interval, needed

__all__ = ["REPRODUCED", "PARTLY", "INCONCLUSIVE", "CONTRADICTED", "NOT_REPRODUCED", "NOT_TESTED", "ladder",
           "grade", "STATUSES", "HOLDS", "FAILS",
           "GRADES", "judge", "condition", "claim_status", "graded", "verdict", "not_tested", "condition_text"]

REPRODUCED = "reproduced"
PARTLY = "partly reproduced"
INCONCLUSIVE = "inconclusive"
CONTRADICTED = "contradicted"
NOT_TESTED = "not yet tested"
#: The status of a claim graded by the sign count of :func:`ladder`: records made before the
#: per-example outcomes were kept, or a chapter not yet graded on intervals. It says nothing
#: about the noise, and its evidence says so.
NOT_REPRODUCED = "not reproduced"
#: The statuses a claim's verdict may have, best first.
STATUSES = (REPRODUCED, PARTLY, INCONCLUSIVE, CONTRADICTED, NOT_REPRODUCED, NOT_TESTED)

HOLDS = "holds"
FAILS = "fails"
#: The grades of one condition.
GRADES = (HOLDS, INCONCLUSIVE, FAILS)


def judge(lo: float, hi: float, threshold: float = 0.0, side: str = ">") -> str:
    """The grade of a condition "value ``side`` ``threshold``" whose 95 % interval is [lo, hi].

    Raises:
        ValueError: ``side`` is not ``">"`` or ``"<"``, or lo > hi.
    """
    if side not in (">", "<"):
        raise ValueError(f"judge: side must be '>' or '<', got {side!r}")
    if lo > hi:
        raise ValueError(f"judge: interval [{lo}, {hi}] has lo > hi")
    if side == ">":
        return HOLDS if lo > threshold else FAILS if hi <= threshold else INCONCLUSIVE
    return HOLDS if hi < threshold else FAILS if lo >= threshold else INCONCLUSIVE


def condition(name: str, iv: Interval, *, threshold: float = 0.0, side: str = ">", unit: str = "points",
              digits: int = 2) -> dict[str, Any]:
    """One graded condition: ``{"name", "estimate", "lo", "hi", "threshold", "side", "unit",
    "grade", "n_examples", "n_seeds", "needs"}`` (``needs``: the power estimate's text when
    inconclusive, else None)."""
    grade_ = judge(iv.lo, iv.hi, threshold, side)
    need = needed(iv, threshold) if grade_ == INCONCLUSIVE else None
    return {"name": name, "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "se": iv.se, "threshold": threshold,
            "side": side, "unit": unit, "digits": digits, "grade": grade_, "n_examples": iv.n_examples,
            "n_seeds": iv.n_seeds, "needs": need["text"] if need else None,
            "needs_factor": need["factor"] if need else None}


def claim_status(conditions: Sequence[dict]) -> str:
    """The claim's status from its conditions' grades (module docstring); no condition: not tested.

    Raises:
        ValueError: a grade that is not one of :data:`GRADES`.
    """
    grades = [c["grade"] for c in conditions]
    bad = [g for g in grades if g not in GRADES]
    if bad:
        raise ValueError(f"condition grades {bad} are not among {list(GRADES)}")
    if not grades:
        return NOT_TESTED
    if FAILS in grades:
        return CONTRADICTED
    if all(g == HOLDS for g in grades):
        return REPRODUCED
    return PARTLY if HOLDS in grades else INCONCLUSIVE


def condition_text(c: dict) -> str:
    """``'PACT-TA − TA, T = 8: +0.54 [−0.71, +1.79] points > 0: inconclusive (needs …)'``."""
    from pactlib.book.intervals import fmt

    d = c.get("digits", 2)
    unit = f" {c['unit']}" if c.get("unit") else ""
    thr = f"{c['threshold']:g}"
    text = (f"{c['name']}: {fmt(c['estimate'], d)} [{fmt(c['lo'], d)}, {fmt(c['hi'], d)}]{unit} "
            f"{c['side']} {thr}: {c['grade']}")
    return text + (f" ({c['needs']})" if c.get("needs") else "")


def graded(conditions: Sequence[dict], summary: str = "", *, note: str = "") -> dict:
    """The verdict of a claim tested by ``conditions``: its status from :func:`claim_status`, the
    conditions themselves, and an evidence line: ``summary``, the count of each grade, each
    condition's text, then ``note``."""
    status = claim_status(conditions)
    counts = ", ".join(f"{sum(c['grade'] == g for c in conditions)} {g}" for g in GRADES
                       if any(c["grade"] == g for c in conditions))
    head = f"{summary} ({counts})" if summary else counts
    body = "; ".join(condition_text(c) for c in conditions)
    evidence = f"{head}: {body}" if body else head
    return verdict(status, evidence + (f". {note}" if note else ""), conditions=list(conditions))


def verdict(status: str, evidence: str, *, conditions: Sequence[dict] | None = None) -> dict:
    """A verdict dict ``{"status", "evidence"[, "conditions"]}``.

    Raises:
        ValueError: ``status`` is not one of :data:`STATUSES`.
    """
    if status not in STATUSES:
        raise ValueError(f"verdict status {status!r} is not one of {list(STATUSES)}")
    out = dict(status=status, evidence=evidence)
    if conditions is not None:
        out["conditions"] = list(conditions)
    return out


def not_tested(evidence: str) -> dict:
    """The verdict of a claim the run could not judge (e.g. it needs two suites and had one)."""
    return verdict(NOT_TESTED, evidence)


# --- the sign-count ladder: chapters whose records have no per-example outcomes yet ---------------

def grade(full: bool, partial: bool = False) -> str:
    """:data:`REPRODUCED` when ``full`` holds, else :data:`PARTLY` when ``partial`` does, else
    :data:`NOT_REPRODUCED` (a grade by sign, without intervals)."""
    return REPRODUCED if full else PARTLY if partial else NOT_REPRODUCED


def ladder(n_ok: int, n: int, *, required: bool = True, full: bool = True) -> str:
    """The sign-count status of a claim judged on ``n`` conditions of which ``n_ok`` hold by the
    sign of their mean (no interval): all: :data:`REPRODUCED`; at least half: :data:`PARTLY`;
    fewer, or ``required`` False: :data:`NOT_REPRODUCED`; ``full`` False caps it at :data:`PARTLY`.
    Used only where a chapter's records carry no per-example outcomes (:func:`graded` is the rule)."""
    if not required:
        return NOT_REPRODUCED
    return grade(bool(n) and n_ok == n and full, bool(n_ok) and 2 * n_ok >= n)
