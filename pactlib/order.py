"""One canonical order of a set of task vectors, so that a merge is a function of the set.

TSV-M, Iso-C, Iso-CTS, TIES' election and PACT combine the tasks in their order (sums, stacked
factors, randomized SVDs drawn task by task), and floating-point arithmetic is not associative:
another order of the same tasks gives other low bits. Every entry point therefore merges the tasks
in one order that depends on their content alone, the **content order**, and reports per-task
results back in the caller's order (:func:`reorder_report`):

- a task's content is the byte string of its task vector Δt (float32, or float64 when θ0 has
  float64 entries: the compute dtype), key by key in sorted key order, each key's entries in
  C order, little-endian (the bytes of the contiguous tensor);
- the tasks are sorted by that byte string (lexicographic order), equal strings keeping the
  caller's order: their task vectors are the same bits, so their places cannot change a result.

The strings are compared :data:`CHUNK` entries at a time, a chunk of a task read only while
some other task agrees with it on everything before it (:func:`content_order`): two fine-tunes
are told apart by their first chunk, so the order costs a chunk of every task, not a pass over
the files; only tasks that agree on long prefixes (identical task vectors: a full pass) are read
further. The torch paths and the torch-free fast path (:mod:`pactlib.fastpath`) form the same Δt
bits (θt − θ0 in IEEE float32 arithmetic), so they find the same order.

This module imports neither torch nor numpy; :func:`tensor_chunks` imports torch when called.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

__all__ = ["CHUNK", "segments", "content_order", "tensor_chunks", "canonical_order", "merge_order", "mark_places",
           "reorder_report", "in_user_order", "pairs_in_user_order"]

#: entries of one key compared at a time (a chunk is at most this many entries of one key)
CHUNK = 1 << 14


def segments(shapes: Mapping[str, Sequence[int]]) -> list[tuple[str, int, int]]:
    """The chunks of a task vector with these ``{key: shape}``: ``(key, start, stop)`` entry ranges
    (C order) of at most :data:`CHUNK` entries, keys in sorted order, each key's ranges in order;
    a key with no entries has none."""
    out = []
    for key in sorted(shapes):
        n = math.prod(int(d) for d in shapes[key])
        out += [(key, a, min(a + CHUNK, n)) for a in range(0, n, CHUNK)]
    return out


def content_order(T: int, nchunks: int, chunk: Callable[[int, int], bytes]) -> list[int]:
    """The content order of T tasks whose contents are ``nchunks`` chunks each: ``chunk(t, c)``
    gives the bytes of task t's chunk c (all tasks' chunk c of one length). ``perm[c]`` is the
    caller's index of the task merged c-th. A chunk is asked for only while its task agrees with
    another on every chunk before it, each at most once.

    Raises:
        whatever ``chunk`` raises.
    """
    # groups of tasks that agree on the chunks read so far, in content order; refined chunk by chunk
    groups: list[list[int]] = [list(range(T))]
    for c in range(nchunks):
        if all(len(g) == 1 for g in groups):
            break
        refined: list[list[int]] = []
        for g in groups:
            if len(g) == 1:
                refined.append(g)
                continue
            by: dict[bytes, list[int]] = {}
            for t in g:  # in the caller's order within the group: equal chunks keep it
                by.setdefault(bytes(chunk(t, c)), []).append(t)
            refined += [by[b] for b in sorted(by)]
        groups = refined
    return [t for g in groups for t in g]


def tensor_chunks(vectors: Sequence[Mapping]) -> tuple[int, Callable[[int, int], bytes]] | None:
    """``(nchunks, chunk)`` of :func:`content_order` for in-memory task vectors (mappings key ->
    tensor, on any device; a chunk is copied to the CPU when read); None when they do not all have
    the same keys, shapes and dtypes (the merge then raises its own error)."""
    import torch

    from .safetensors_io import tensor_bytes_view

    if not vectors:
        return None
    first = vectors[0]
    layout = {k: (tuple(v.shape), v.dtype) for k, v in first.items()}
    for tv in vectors[1:]:
        if tv.keys() != first.keys() or any(not isinstance(tv[k], torch.Tensor) or (tuple(tv[k].shape), tv[k].dtype)
                                            != layout[k] for k in layout):
            return None
    if any(not isinstance(v, torch.Tensor) for v in first.values()):
        return None
    segs = segments({k: s for k, (s, _) in layout.items()})
    last: dict[int, tuple] = {}  # per task, the key read last (task vectors may read a key on access)

    def chunk(t: int, c: int) -> bytes:
        key, a, b = segs[c]
        if last.get(t, (None,))[0] != key:
            last[t] = (key, vectors[t][key].detach().reshape(-1))
        x = last[t][1][a:b].cpu().contiguous()
        return bytes(tensor_bytes_view(x))

    return len(segs), chunk


def canonical_order(task_vectors: Sequence[Mapping]) -> list[int]:
    """The content order (module docstring) of in-memory task vectors: ``perm[c]`` is the
    caller's index of the task merged c-th; the caller's order when they do not share keys,
    shapes and dtypes (the merge then names the mismatch)."""
    found = tensor_chunks(task_vectors)
    if found is None:
        return list(range(len(task_vectors)))
    return content_order(len(task_vectors), *found)


def mark_places(vectors: Sequence, perm: Sequence[int]) -> None:
    """Mark ``vectors`` (task vectors in the caller's order, e.g. the PACT-filtered ones of
    :func:`pactlib.pact.pact_filter`) with their places in the content order ``perm`` of the task
    vectors they were made from: :func:`merge_order` then merges them in that order, so that
    filtering first and merging the filtered vectors gives the bytes of one merge with PACT."""
    token = object()
    for c, u in enumerate(perm):
        vectors[u]._place = (token, c)


def merge_order(vectors: Sequence) -> list[int]:
    """The order a merge takes ``vectors`` in: the places :func:`mark_places` gave them, when they
    all come from one marking and are all of it; else their content order
    (:func:`canonical_order`). ``perm[c]``: the caller's index of the task merged c-th."""
    places = [getattr(v, "_place", None) for v in vectors]
    if places and None not in places and len({p[0] for p in places}) == 1 \
            and sorted(p[1] for p in places) == list(range(len(places))):
        return sorted(range(len(places)), key=lambda i: places[i][1])
    return canonical_order(vectors)


def in_user_order(items: Sequence, perm: Sequence[int]) -> list:
    """``items`` given in content order (the c-th for task ``perm[c]``) in the caller's order."""
    out = [None] * len(perm)
    for c, u in enumerate(perm):
        out[u] = items[c]
    return out


def pairs_in_user_order(pairs, perm: Sequence[int]) -> set[tuple[int, int]]:
    """Pairs ``(i, j)`` of tasks in content order as pairs of the caller's indices, smaller first."""
    return {tuple(sorted((perm[i], perm[j]))) for i, j in pairs}


def reorder_report(report, perm: Sequence[int]):
    """``report`` (a :class:`pactlib.pact.PactReport` of tasks in content order, or None) with
    every per-task list in the caller's order: task ``perm[c]``'s entry is the c-th one. The
    report is changed in place and returned."""
    if report is None or list(perm) == sorted(perm):
        return report
    for lr in report.layers:
        for f in dataclasses.fields(lr):
            value = getattr(lr, f.name)
            if isinstance(value, list) and len(value) == len(perm):
                setattr(lr, f.name, in_user_order(value, perm))
    for key, shields in report.shields.items():
        report.shields[key] = in_user_order(list(shields), perm)
    for key, subs in report.subspaces.items():
        report.subspaces[key] = dataclasses.replace(subs, active=in_user_order(list(subs.active), perm),
                                                    lbw=in_user_order(list(subs.lbw), perm))
    return report
