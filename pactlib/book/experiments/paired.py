"""Glue between a chapter's records and :mod:`pactlib.book.intervals`: picking rows, joining the
per-task records of models evaluated one task at a time, cutting a record down to some tasks.

Chapters 3, 4 and 10 evaluate a model per (seed, task): θt perturbed, ablated or filtered, scored
on task t only. Each such record keeps ``outcomes: {"test": {task: packed}}``
(:mod:`pactlib.outcomes`) for its one task. :func:`pactlib.book.intervals.contrast` compares
records that cover the same tasks, so :func:`stacked` joins a seed's per-task records of one
condition into one record over every task; a contrast of two conditions is then the mean over
tasks of the paired per-example difference, with its 95 % interval. Chapters 2 and 7 pick merge
records by their fields (:func:`rows`) and compare them on some of their tasks (:func:`restrict`).

    lbw = stacked(frame[frame["condition"] == "lbw"], by=["draw"])
    ft = stacked(frame[frame["method"] == "finetuned"])
    contrast(ft, lbw)            # accuracy drop of the LBW perturbation, points, mean over tasks
    contrast(rows(frame, suite="8", group="early"), rows(frame, suite="8", group="none"))

Records written before the outcomes were kept have none
(:func:`pactlib.book.intervals.has_outcomes` tells); the chapters' verdicts then say
:data:`pactlib.book.intervals.NO_OUTCOMES` instead of grading.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pandas as pd

from pactlib.book.intervals import NO_OUTCOMES, field, has_outcomes, packed

__all__ = ["MissingOutcomes", "stacked", "finetuned_record", "rows", "restrict", "weights", "seeds_and_examples"]


class MissingOutcomes(ValueError):
    """Records that a paired contrast needs carry no per-example test outcomes."""


def stacked(frame: pd.DataFrame, by: Sequence[str] = (), *, tasks: Sequence[str] | None = None) -> list[dict]:
    """One record per (seed, ``by``…) joining the per-task outcomes of ``frame``'s rows.

    Args:
        frame: rows of a records frame (:func:`pactlib.book.records.records_frame`), one task each.
        by: fields besides ``seed`` that tell records of one seed apart (e.g. ``["draw"]``);
            contrast averages the records of a seed on each side.
        tasks: the task order of every stacked record (default: first appearance in ``frame``).

    Returns:
        ``[{"method", "seed", "testbed", "outcomes": {"test": {task: packed}}}]``, each over
        ``tasks`` in that order.

    Raises:
        MissingOutcomes: a row has no outcomes (its message is :data:`NO_OUTCOMES`).
        ValueError: no rows; a group holds a task twice or misses one of ``tasks``.
    """
    if not len(frame):
        raise ValueError("stacked: no records to stack")
    if not has_outcomes(frame):
        raise MissingOutcomes(NO_OUTCOMES)
    order = list(tasks) if tasks is not None else list(dict.fromkeys(frame["task"]))
    keys = ["seed", *by]
    out = []
    for key, g in frame.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        joined: dict[str, str] = {}
        for _, row in g.iterrows():
            for t, p in packed(row).items():
                if t in joined:
                    raise ValueError(f"stacked: task {t!r} appears twice in the group {dict(zip(keys, key))}")
                joined[t] = p
        missing = [t for t in order if t not in joined]
        if missing:
            raise ValueError(f"stacked: the group {dict(zip(keys, key))} has no outcomes for task(s) {missing}")
        testbed = g["testbed"].iloc[0] if "testbed" in g else None
        out.append({"method": str(g["method"].iloc[0]), "seed": key[0],
                    "testbed": None if pd.isna(testbed) else testbed,
                    "outcomes": {"test": {t: joined[t] for t in order}}})
    return out


def finetuned_record(task: str, correct, *, seed: int, params, loss: float | None = None, **extra) -> dict:
    """A ``"finetuned"`` record: θt's test accuracy on ``task`` and its per-example outcomes
    (``correct``: (N,) bool tensor), the base of the chapters' paired drops."""
    from pactlib.book.records import make_record
    from pactlib.outcomes import pack

    metrics = {"acc": float(correct.float().mean())}
    if loss is not None:
        metrics["loss"] = float(loss)
    return make_record("finetuned", params=params, seed=seed, task=task, metrics=metrics,
                       outcomes={"test": {task: pack(correct)}}, **extra)


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


def restrict(rec, tasks: Sequence[str], *, testbed: str | None = None) -> dict:
    """A plain record with only ``tasks``' outcomes and ``acc:<t>`` / ``norm_acc:<t>`` metrics (the
    normalizers of a ``norm_acc`` contrast), its ``method`` and ``seed``; ``testbed`` relabels it
    (records of different suites on the same tasks' test examples then pair up).

    Raises:
        KeyError: a task without outcomes in the record (named).
    """
    p = packed(rec) or {}
    missing = [t for t in tasks if t not in p]
    if missing:
        raise KeyError(f"record of {field(rec, 'method')!r} (seed {field(rec, 'seed')}) has no outcomes for {missing}")
    nested = field(rec, "metrics")
    metrics = {}
    for t in tasks:
        for m in (f"acc:{t}", f"norm_acc:{t}"):
            v = field(rec, f"metrics.{m}")
            if v is None and isinstance(nested, Mapping):
                v = nested.get(m)
            if v is not None:
                metrics[m] = float(v)
    return {"method": field(rec, "method"), "seed": field(rec, "seed"),
            "testbed": testbed if testbed is not None else field(rec, "testbed"),
            "metrics": metrics, "outcomes": {"test": {t: p[t] for t in tasks}}}


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
