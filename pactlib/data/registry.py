"""The task registry: what a task is (:class:`TaskSpec`) and how a registered builder is run.

A task is a :class:`TaskSpec` (plain data: classes, source, provenance, licence, whether it is
*derived*) plus a builder ``f(seed, max_trainval, max_test) -> (arrays, notes)`` that turns
the raw sources into train / val / test arrays. :func:`register` adds both; :func:`build_task`
runs a builder and checks what it returns. The tasks themselves are defined in
:mod:`~pactlib.data.tasks` (shipped datasets and their derivatives),
:mod:`~pactlib.data.glyph_tasks` and :mod:`~pactlib.data.patch_tasks`; caching lives in
:mod:`~pactlib.data.store`.

Sizes: at most ``max_trainval`` train+val images (validation = 10 % of them) and
``max_test`` test images per task; smaller sources give fewer.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .imaging import image_hashes
from .splits import SPLITS, VAL_FRACTION, balanced_order, rng_for

__all__ = ["TaskSpec", "TASKS", "register", "build_task", "ordered", "balanced", "split_counts",
           "Arrays", "DEFAULT_MAX_TRAINVAL", "DEFAULT_MAX_TEST"]

DEFAULT_MAX_TRAINVAL = 5000  # train + val images per task (CPU-sized)
DEFAULT_MAX_TEST = 1000      # test images per task

Arrays = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (uint8 (N,3,32,32), int64 (N,))


@dataclass(frozen=True)
class TaskSpec:
    """Static description of one task (no data).

    Attributes:
        name: registry key, e.g. ``"fashion_mnist"``.
        classes: class names; label ``i`` means ``classes[i]``.
        source: where the raw data comes from, as ``"<registry>:<package>"``.
        derived: ``True`` when the task is constructed here rather than shipped as a dataset.
        description: one or two sentences; for derived tasks, how it is made.
        provenance: the original dataset / images and their reference.
        license: licence of the underlying data.
        shares_images_with: names of tasks that may contain the same images (empty: disjoint).
    """
    name: str
    classes: tuple[str, ...]
    source: str
    derived: bool
    description: str
    provenance: str
    license: str
    shares_images_with: tuple[str, ...] = ()


TASKS: dict[str, TaskSpec] = {}
_BUILDERS: dict[str, Callable[[int, int, int], tuple[Arrays, dict]]] = {}


def register(**fields):
    """Register a builder ``f(seed, max_trainval, max_test) -> (arrays, notes)`` with its spec."""
    def deco(fn):
        spec = TaskSpec(**fields)
        if spec.name in TASKS:
            raise ValueError(f"task {spec.name!r} registered twice")
        TASKS[spec.name] = spec
        _BUILDERS[spec.name] = fn
        return fn
    return deco


def build_task(name: str, seed: int = 0, *, max_trainval: int = DEFAULT_MAX_TRAINVAL,
               max_test: int = DEFAULT_MAX_TEST) -> tuple[Arrays, dict]:
    """Build one task's splits from the raw sources (no caching).

    Images that appear in two splits (byte-identical after resizing) are removed from the
    later-listed of train / val in favour of test, so the splits are always disjoint.

    Returns:
        ``(arrays, notes)``: ``arrays[split] = (images uint8 (N, 3, 32, 32), labels int64
        (N,))`` for split in train / val / test, in the stored (class-interleaved) order, and a
        JSON-able dict of build details (pools, fonts or cells per split, removed duplicates).

    Raises:
        KeyError: unknown task (lists the known ones).
        ValueError: bad sizes. SourceMissingError: a raw source is not installed.
        RuntimeError: a class ended up missing from a split (a bug, never expected).
    """
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    k = len(TASKS[name].classes)
    if round(VAL_FRACTION * max_trainval) < k or max_test < k:
        raise ValueError(f"task {name!r} has {k} classes: max_trainval must be >= {10 * k} (so that "
                         f"validation holds every class) and max_test >= {k}; got max_trainval="
                         f"{max_trainval}, max_test={max_test}")
    arrays, notes = _BUILDERS[name](seed, max_trainval, max_test)
    arrays, removed = _drop_cross_split_duplicates(arrays)
    notes["cross_split_duplicates_removed"] = removed
    n_classes = len(TASKS[name].classes)
    for split, (x, y) in arrays.items():
        if x.dtype != np.uint8 or x.shape[1:] != (3, 32, 32) or len(x) != len(y):
            raise RuntimeError(f"{name}/{split}: bad arrays {x.dtype} {x.shape} / {y.shape}")
        missing = sorted(set(range(n_classes)) - set(np.unique(y).tolist()))
        if missing or y.min() < 0 or y.max() >= n_classes:
            raise RuntimeError(f"{name}/{split}: classes {missing} missing or labels out of range")
    return arrays, notes


def _drop_cross_split_duplicates(arrays: Arrays) -> tuple[Arrays, dict[str, int]]:
    seen: set[str] = set()
    out, removed = {}, {}
    for split in ("test", "val", "train"):  # test keeps everything; train yields
        x, y = arrays[split]
        h = image_hashes(x)
        keep = np.array([k not in seen for k in h], dtype=bool)
        seen.update(h)
        out[split] = (x[keep], y[keep])
        removed[split] = int((~keep).sum())
    return {s: out[s] for s in SPLITS}, removed


def ordered(arrays: Arrays, seed: int, name: str) -> Arrays:
    """Store each split class-interleaved so that any prefix is roughly balanced."""
    out = {}
    for split, (x, y) in arrays.items():
        order = balanced_order(y, rng_for(seed, name, "order", split))
        out[split] = (x[order], y[order])
    return out


def balanced(classes: Sequence, total: int) -> dict:
    """Split ``total`` over ``classes`` as evenly as possible (earlier classes get the extra)."""
    q, r = divmod(total, len(classes))
    return {c: q + (i < r) for i, c in enumerate(classes)}


def split_counts(max_trainval: int, max_test: int) -> dict[str, int]:
    """Images per split for generated tasks: val = 10 % of ``max_trainval``."""
    n_val = int(round(VAL_FRACTION * max_trainval))
    return {"train": max_trainval - n_val, "val": n_val, "test": max_test}
