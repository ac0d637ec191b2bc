"""Small glue between a chapter's records and :mod:`pactlib.book.intervals`: picking rows, checking
that they carry per-example test outcomes, and cutting a record down to some of its tasks.

    rows = graded.rows(frame, suite="8", group="early")     # records (rows of the frame) to contrast
    graded.has_outcomes(rows)                              # False on records from before outcomes
    graded.restrict(row, ["mnist"], testbed="mnist")       # the same record on one task
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

__all__ = ["NO_OUTCOMES", "rows", "has_outcomes", "restrict", "weights", "seeds_and_examples"]

#: The note of a verdict that cannot be graded because its records predate per-example outcomes.
NO_OUTCOMES = "records without per-example outcomes: recompute"


def _value(rec, name: str, default=None):
    if isinstance(rec, Mapping):
        return rec.get(name, default)
    try:
        v = rec[name]
    except (KeyError, IndexError):
        return default
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def rows(frame, **where) -> list:
    """The rows of a records frame whose columns equal ``where`` (``suite="8", group="early"``), as a
    list of row Series (what :func:`pactlib.book.intervals.contrast` takes); [] when a column is
    missing."""
    sel = frame
    for col, value in where.items():
        if col not in sel:
            return []
        sel = sel[sel[col] == value]
    return [r for _, r in sel.iterrows()]


def _packed(rec) -> Mapping | None:
    p = _value(rec, "outcomes.test")
    if p is None:
        p = (_value(rec, "outcomes") or {}).get("test") if isinstance(_value(rec, "outcomes"), Mapping) else None
    return p if isinstance(p, Mapping) and p else None


def has_outcomes(recs: Sequence) -> bool:
    """Whether there are records and every one carries per-example test outcomes."""
    return bool(recs) and all(_packed(r) is not None for r in recs)


def restrict(rec, tasks: Sequence[str], *, testbed: str | None = None) -> dict:
    """A plain record with only ``tasks``' outcomes and ``acc:<t>`` / ``norm_acc:<t>`` metrics (the
    normalizers of a ``norm_acc`` contrast), its ``method`` and ``seed``; ``testbed`` relabels it
    (records of different suites on the same tasks' test examples then pair up).

    Raises:
        KeyError: a task without outcomes in the record (named).
    """
    packed = _packed(rec) or {}
    missing = [t for t in tasks if t not in packed]
    if missing:
        raise KeyError(f"record of {_value(rec, 'method')!r} (seed {_value(rec, 'seed')}) has no outcomes for {missing}")
    metrics = {}
    for t in tasks:
        for m in (f"acc:{t}", f"norm_acc:{t}"):
            v = _value(rec, f"metrics.{m}")
            if v is None:
                v = (_value(rec, "metrics") or {}).get(m) if isinstance(_value(rec, "metrics"), Mapping) else None
            if v is not None:
                metrics[m] = float(v)
    return {"method": _value(rec, "method"), "seed": _value(rec, "seed"),
            "testbed": testbed if testbed is not None else _value(rec, "testbed"),
            "metrics": metrics, "outcomes": {"test": {t: packed[t] for t in tasks}}}


def weights(p: float, max_denominator: int = 100) -> tuple[int, int]:
    """``(a, b)`` with a / b == p, so that a side of a contrast holding a copies of one record and
    b − a of another is their mixture p : (1 − p) (a contrast averages the records of a side).

    Raises:
        ValueError: p outside [0, 1] or not a fraction with denominator ≤ ``max_denominator``.
    """
    f = Fraction(p).limit_denominator(max_denominator)
    if not 0 <= p <= 1 or abs(float(f) - p) > 1e-9:
        raise ValueError(f"{p!r} is not a fraction in [0, 1] with a denominator of at most {max_denominator}")
    return f.numerator, f.denominator


def seeds_and_examples(ivs: Mapping[str, Any]) -> str:
    """``"T=8: 3 seeds, 150 test examples per task; T=20: 1 seed, …"`` from {label: Interval}."""
    def one(label, iv):
        return (f"{label}: {iv.n_seeds} seed{'s' if iv.n_seeds != 1 else ''}, "
                f"{iv.n_examples:,} test examples per task")
    return "; ".join(one(k, iv) for k, iv in ivs.items())
