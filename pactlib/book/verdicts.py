"""The verdict ladder: the statuses a claim may get and the one rule that turns checks into one.

Every claim's verdict function (:mod:`pactlib.book.report`, :mod:`pactlib.book.experiments`)
counts the conditions that hold and calls :func:`ladder` (or :func:`grade` where the claim has a
"full" and a "partial" form that are not counts), then :func:`verdict` for the dict it returns.

    ladder(3, 3)                 # "reproduced": every condition holds
    ladder(2, 4)                 # "partly reproduced": at least half do
    ladder(1, 3)                 # "not reproduced": fewer than half do (also for n = 0: nothing to judge)
    ladder(2, 3, required=False) # "not reproduced": a condition the claim cannot do without failed
    ladder(3, 3, full=False)     # "partly reproduced": a condition for "reproduced" alone failed
"""
from __future__ import annotations

__all__ = ["REPRODUCED", "PARTLY", "NOT_REPRODUCED", "NOT_TESTED", "STATUSES", "grade", "ladder", "verdict",
           "not_tested"]

REPRODUCED = "reproduced"
PARTLY = "partly reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_TESTED = "not yet tested"
#: The statuses a claim's verdict may have, best first.
STATUSES = (REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_TESTED)


def grade(full: bool, partial: bool = False) -> str:
    """:data:`REPRODUCED` when ``full`` holds, else :data:`PARTLY` when ``partial`` does, else
    :data:`NOT_REPRODUCED`."""
    if full:
        return REPRODUCED
    return PARTLY if partial else NOT_REPRODUCED


def ladder(n_ok: int, n: int, *, required: bool = True, full: bool = True) -> str:
    """The status of a claim judged on ``n`` conditions of which ``n_ok`` hold.

    Args:
        n_ok, n: conditions that hold, conditions checked. Every one (and ``n`` > 0):
            :data:`REPRODUCED`; at least half (2·n_ok ≥ n > 0): :data:`PARTLY`; fewer than half:
            :data:`NOT_REPRODUCED`. A claim that holds in a minority of its tasks, seeds or
            settings is not reproduced here, and its evidence gives the count.
        required: a precondition the claim cannot do without (e.g. an inequality that must hold);
            when False the status is :data:`NOT_REPRODUCED` whatever the count.
        full: a further condition for :data:`REPRODUCED` only; when False a full count gives
            :data:`PARTLY`.
    """
    if not required:
        return NOT_REPRODUCED
    return grade(bool(n) and n_ok == n and full, bool(n_ok) and 2 * n_ok >= n)


def verdict(status: str, evidence: str) -> dict:
    """A verdict dict ``{"status": status, "evidence": evidence}``.

    Raises:
        ValueError: ``status`` is not one of :data:`STATUSES`.
    """
    if status not in STATUSES:
        raise ValueError(f"verdict status {status!r} is not one of {list(STATUSES)}")
    return dict(status=status, evidence=evidence)


def not_tested(evidence: str) -> dict:
    """The verdict of a claim the run could not judge (e.g. it needs two suites and had one)."""
    return verdict(NOT_TESTED, evidence)
