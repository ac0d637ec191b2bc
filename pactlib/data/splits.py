"""Deterministic, disjoint splitting of image pools.

Two levels of randomness, both explicit:

* **Pools** (seed-independent): tasks drawn from the same source get disjoint image pools,
  allocated once from a fixed permutation salted with the source's name, so that tasks built
  with *different* seeds still never share an image.
* **Splits** (seed-dependent): inside its pool a task's train / val / test split and any
  subsampling are drawn from ``rng_for(seed, task)``.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "SPLITS", "VAL_FRACTION", "rng_for", "unique_indices", "allocate_pools", "stratified_take",
    "stratified_split", "balanced_order", "partition_items",
]

SPLITS = ("train", "val", "test")
VAL_FRACTION = 0.1  # share of the train+val pool that becomes validation


def rng_for(*parts: object) -> np.random.Generator:
    """A PCG64 generator seeded from the sha256 of ``parts`` (stable across runs and machines)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def unique_indices(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Indices of the first copy of every distinct image, in increasing order.

    Images that occur with two different labels are dropped entirely (all copies).

    Args:
        images: ``(N, ...)`` array; rows compared by their bytes.
        labels: ``(N,)`` integer labels.
    """
    first: dict[bytes, int] = {}
    bad: set[bytes] = set()
    flat = np.ascontiguousarray(images).reshape(len(images), -1)
    for i, row in enumerate(flat):
        key = row.tobytes()
        j = first.setdefault(key, i)
        if j != i and labels[j] != labels[i]:
            bad.add(key)
    return np.array(sorted(i for k, i in first.items() if k not in bad), dtype=np.int64)


def allocate_pools(labels: np.ndarray, quotas: Sequence[Mapping[int, int]], salt: str,
                   candidates: np.ndarray | None = None) -> list[np.ndarray]:
    """Split one source into disjoint per-task pools, independent of any experiment seed.

    Walks a fixed permutation (``rng_for("pool", salt)``) of ``candidates`` and gives task
    ``k`` the first ``quotas[k][c]`` still-unused indices of each class ``c``.

    Args:
        labels: ``(N,)`` source labels.
        quotas: one ``{class: count}`` per task, in allocation order.
        salt: names the source (e.g. ``"fashion_mnist/train"``).
        candidates: indices allowed (default all), e.g. after :func:`unique_indices`.

    Returns:
        One sorted int64 index array per task.

    Raises:
        ValueError: a class has fewer unused images than the quotas ask for.
    """
    cand = np.arange(len(labels)) if candidates is None else np.asarray(candidates)
    order = cand[rng_for("pool", salt).permutation(len(cand))]
    cursor: dict[int, int] = {}
    by_class = {int(c): order[labels[order] == c] for c in np.unique(labels[order])}
    pools = []
    for k, quota in enumerate(quotas):
        taken = []
        for c, n in quota.items():
            avail = by_class.get(int(c), np.empty(0, np.int64))
            start = cursor.get(int(c), 0)
            if start + n > len(avail):
                raise ValueError(f"{salt}: pool {k} asks for {n} images of class {c} but only "
                                 f"{len(avail) - start} are left (of {len(avail)})")
            taken.append(avail[start:start + n])
            cursor[int(c)] = start + n
        pools.append(np.sort(np.concatenate(taken)) if taken else np.empty(0, np.int64))
    return pools


def _largest_remainder(counts: np.ndarray, total: int) -> np.ndarray:
    """Integer allocation of ``total`` proportional to ``counts`` (never above a count)."""
    total = min(int(total), int(counts.sum()))
    exact = counts * (total / max(int(counts.sum()), 1))
    out = np.minimum(np.floor(exact).astype(np.int64), counts)
    rest = total - int(out.sum())
    for i in np.argsort(-(exact - out), kind="stable"):
        if rest <= 0:
            break
        if out[i] < counts[i]:
            out[i] += 1
            rest -= 1
    return out


def stratified_take(idx: np.ndarray, labels: np.ndarray, n: int | None,
                    rng: np.random.Generator) -> np.ndarray:
    """A class-stratified random subset of ``idx`` of size ``min(n, len(idx))`` (sorted)."""
    idx = np.asarray(idx)
    if n is None or n >= len(idx):
        return np.sort(idx)
    classes, counts = np.unique(labels[idx], return_counts=True)
    take = _largest_remainder(counts, n)
    parts = [rng.choice(idx[labels[idx] == c], size=k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(parts))


def stratified_split(idx: np.ndarray, labels: np.ndarray, rng: np.random.Generator, *,
                     test_frac: float, max_trainval: int | None, max_test: int | None,
                     val_frac: float = VAL_FRACTION) -> dict[str, np.ndarray]:
    """Split one pool into train / val / test, stratified by class.

    ``test_frac`` of each class goes to test, ``val_frac`` of the rest to val; then test and
    train+val are capped at ``max_test`` / ``max_trainval`` by stratified subsampling.

    Returns:
        ``{"train", "val", "test"}`` -> disjoint sorted index arrays into ``labels``.
    """
    idx = np.asarray(idx)
    test, trainval = [], []
    for c in np.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == c])
        k = int(round(test_frac * len(members)))
        test.append(members[:k])
        trainval.append(members[k:])
    test_idx = stratified_take(np.concatenate(test), labels, max_test, rng)
    tv_idx = stratified_take(np.concatenate(trainval), labels, max_trainval, rng)
    return dict(zip(SPLITS, split_trainval(tv_idx, labels, rng, val_frac))) | {"test": test_idx}


def split_trainval(idx: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
                   val_frac: float = VAL_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Stratified ``(train, val)`` split of ``idx`` with ``round(val_frac * n)`` in val."""
    idx = np.asarray(idx)
    classes, counts = np.unique(labels[idx], return_counts=True)
    n_val = _largest_remainder(counts, int(round(val_frac * len(idx))))
    train, val = [], []
    for c, k in zip(classes, n_val):
        members = rng.permutation(idx[labels[idx] == c])
        val.append(members[:k])
        train.append(members[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def balanced_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation of ``range(len(labels))`` whose every prefix is close to class-balanced.

    Classes are shuffled internally and interleaved by relative rank, so ``limit=k`` in
    :func:`pactlib.data.load_task` yields a roughly proportional, deterministic subset.
    """
    keys = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        ranks = rng.permutation(len(members))
        keys[members] = (ranks + rng.random(len(members))) / len(members)
    return np.argsort(keys, kind="stable")


def partition_items(items: Sequence, rng: np.random.Generator, *, n_test: int,
                    n_val: int) -> dict[str, list]:
    """Shuffle ``items`` (fonts, characters, image cells) into disjoint train / val / test groups.

    Raises:
        ValueError: fewer than ``n_test + n_val + 1`` items.
    """
    if len(items) < n_test + n_val + 1:
        raise ValueError(f"need at least {n_test + n_val + 1} items to split, got {len(items)}")
    order = [items[i] for i in rng.permutation(len(items))]
    return {"test": order[:n_test], "val": order[n_test:n_test + n_val],
            "train": order[n_test + n_val:]}
