"""Paired contrasts on the per-example outcomes of models evaluated one task at a time (chapters 3, 4, 10).

Chapters 3, 4 and 10 evaluate a model per (seed, task): θt perturbed, ablated or filtered, scored
on task t only. Each such record keeps ``outcomes: {"test": {task: packed}}``
(:mod:`pactlib.outcomes`) for its one task. :func:`pactlib.book.intervals.contrast` compares
records that cover the same tasks, so :func:`stacked` joins a seed's per-task records of one
condition into one record over every task; a contrast of two conditions is then the mean over
tasks of the paired per-example difference, with its 95 % interval.

    lbw = stacked(frame[frame["condition"] == "lbw"], by=["draw"])
    ft = stacked(frame[frame["method"] == "finetuned"])
    contrast(ft, lbw)            # accuracy drop of the LBW perturbation, points, mean over tasks

Records written before the outcomes were kept have none; :func:`has_outcomes` tells, and the
chapters' verdicts then say :data:`NO_OUTCOMES` instead of grading.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

__all__ = ["NO_OUTCOMES", "MissingOutcomes", "has_outcomes", "stacked", "finetuned_record"]

#: The note of a verdict that cannot be graded because its records carry no per-example outcomes.
NO_OUTCOMES = "records without per-example outcomes: recompute"


class MissingOutcomes(ValueError):
    """Records that a paired contrast needs carry no per-example test outcomes."""


def _packed(row) -> dict | None:
    v = row.get("outcomes.test") if hasattr(row, "get") else None
    if isinstance(v, dict) and v:
        return v
    o = row.get("outcomes") if hasattr(row, "get") else None
    if isinstance(o, dict) and isinstance(o.get("test"), dict) and o["test"]:
        return o["test"]
    return None


def has_outcomes(frame: pd.DataFrame) -> bool:
    """True when ``frame`` has rows and every row holds per-example test outcomes."""
    if not len(frame) or "outcomes.test" not in frame:
        return False
    return bool(frame["outcomes.test"].map(lambda v: isinstance(v, dict) and bool(v)).all())


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
            for t, p in _packed(row).items():
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
