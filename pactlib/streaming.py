"""Streamed merges: checkpoint files in, a merged checkpoint file out, one layer at a time.

:func:`merge_files` computes what :func:`pactlib.merge` computes (the same numbers: the same
kernels on the same values), without holding θ0 and the T fine-tuned checkpoints in memory. For
every key of θ0, in order: read that key of θ0 and of every θt (:mod:`pactlib.lazy`: memory-mapped
safetensors, shards, converted pickles), stack the T deltas Δt = θt − θ0 in float32 (float64 when
θ0 has float64 entries), filter the layer with PACT / S-PACT if asked (P1–P6 are per layer:
:func:`pactlib.pact.filter_layer`, in place), merge it with the method's own code called on that
one key, write θ0 + α·D in θ0's dtype to the output, and free it. Peak memory: about one layer's
(T, m, n) stack and the kernels' work space, whatever the model's size; Task Arithmetic (an
entry-wise method, :attr:`MergeMethod.elementwise`) and TIES stream large keys in chunks of rows,
so that their peak does not grow with T either.

**Methods with a per-task reducer** (:attr:`MergeMethod.reducer`: Task Arithmetic and Iso-C, a
running sum; TSV-M, each task's top singular triplets; Iso-CTS, the sum, then each task against
it in a second pass) need no stack at all: :func:`reduced_update` reads one task's delta at a
time and hands it to the reducer, in task order (the in-memory kernels reduce in that order too,
e.g. :func:`pactlib.merges.driver.task_sum`, so the numbers stay the same). With PACT, each
selected layer is filtered by :func:`pactlib.pact.filter_tasks` in two passes over the tasks
(subspaces, then filtering; each Δt is read twice), so memory is a few copies of the layer,
whatever T; Iso-CTS with PACT keeps the T filtered deltas of a layer for its second pass.

**Per-key methods** (:meth:`MergeMethod.is_per_key`: Task Arithmetic, TSV-M, Iso-C, Iso-CTS,
TIES with ``scope="per_key"``, and any method written with ``map_layers``) are called on T
one-key task vectors whose tensors are the rows of the stack (``map_layers`` takes the stack
itself, no copy: :func:`pactlib.merges.driver.stack_rows`).

**TIES with ``scope="global"``** ranks each task's entries over its whole task vector: the trim
threshold depends on every layer. :class:`pactlib.merges.ties.GlobalThreshold` finds, for every
task, the exact k%-th largest |Δt| and how many entries tied with it are kept (the first ones by
position, as :func:`pactlib.merges.ties.trim_mask` keeps them) by radix selection over passes
through the files (two for float32, four for float64; 65,536 counters per task); a last pass
trims, elects and merges chunk by chunk. With PACT, the first pass filters every layer and
writes the filtered task vectors to a temporary file next to the output (T × the filtered
layers' size on disk, deleted at the end), which the other passes read instead of filtering again;
with one worker it filters each layer one task at a time (:func:`pactlib.pact.filter_tasks`),
counting and spilling each filtered Δ̃t as it comes, so no (T, m, n) stack is held.

Checks: every key and shape is compared from the file headers before any data is read (a
missing key or a shape mismatch names the fine-tuned file and the key); NaN / Inf are checked as
each key is read (naming the file and the key); the output is written to temporary files renamed
at the end (:class:`pactlib.lazy.CheckpointWriter`): a failed or interrupted run leaves no output.

Threads: ``workers`` layers are merged at once (default 1), each kernel on one thread
(:mod:`pactlib.threads`); global TIES, which reads the whole model chunk by chunk, runs the tasks of
each chunk on ``workers`` threads instead. The result does not depend on ``workers``; memory grows
with it.
"""
from __future__ import annotations

import logging
import contextlib
import math
import os
import shutil
import tempfile
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from . import merges, native
from .api import check_options, resolve_kwargs
from .checks import (CheckpointError, all_finite, check_alpha, check_compatible, check_device, check_finite,
                     check_state_dict, task_set_warnings)
from .io import signals_held
from .lazy import (CheckpointWriter, LazyCheckpoint, Loader, check_out_suffix, check_out_target, default_loader,
                   finish_output, is_folder_output, open_checkpoint, output_lock, spill_prefix)
from .matrix import DEFAULT_RULE, MatrixRule, no_matrix_note, split_attention_note
from .merges.driver import RunningSum, passes_of
from .merges.ties import GlobalThreshold, scratch, ties_kernel, trim_count
from .order import content_order, in_user_order, pairs_in_user_order, reorder_report, segments
from .safetensors_io import tensor_bytes_view
from .pact import PactOptions, PactReport, filter_stack, filter_tasks, select_layers, warn_if_unchanged
from .taskvector import TaskVector
from .threads import single_threaded

log = logging.getLogger(__name__)

#: Budget of one chunk's (T, rows, …) stack for the entry-wise paths (TA, TIES), in bytes.
CHUNK_BYTES = 32 << 20


@dataclass
class MergedFiles:
    """What :func:`merge_files` wrote."""

    path: Path  #: the merged checkpoint: its file, or the index of a sharded output
    files: list[Path]  #: every file written (shards, then the index)
    tasks: int
    report: PactReport | None = None  #: PACT's per-layer report (None without PACT)


class _TaskChecks:
    """The in-memory path's warnings, gathered key by key: all-zero and identical task vectors."""

    def __init__(self, names: Sequence[str], *, perm: Sequence[int] | None = None):
        self.names = list(names)
        self.perm = list(range(len(names))) if perm is None else list(perm)  # the tasks' order: names' indices
        self.nonzero = [False] * len(names)
        self.same = {(i, j) for i in range(len(names)) for j in range(i + 1, len(names))}
        self._lock = threading.Lock()

    def update(self, stack: Tensor) -> None:
        """Look at one key's (or chunk's) (T, …) stack of unfiltered deltas."""
        with self._lock:
            for t in range(len(self.names)):
                if not self.nonzero[t] and bool(stack[t].any()):
                    self.nonzero[t] = True
            self.same = {(i, j) for i, j in self.same if torch.equal(stack[i], stack[j])}

    def probe(self) -> "_KeyProbe":
        """The same look at one key (or chunk) whose deltas are read one task at a time."""
        return _KeyProbe(self)

    def warn(self) -> None:
        """The warnings, tasks named in the caller's order (``perm``: the caller's index of each task)."""
        p = self.perm
        for message in task_set_warnings(in_user_order(self.names, p), in_user_order(self.nonzero, p),
                                         pairs_in_user_order(self.same, p)):
            warnings.warn(message, stacklevel=3)


class _KeyProbe:
    """:meth:`_TaskChecks.update` for one key whose T deltas come one at a time: ``add(t, Δt)``
    for each task, then ``commit()``. Identical tasks are compared by a hash of their bytes, taken
    only while some pair of tasks may still be identical (after the first key that tells them
    apart, never)."""

    def __init__(self, checks: _TaskChecks):
        self.checks = checks
        self.nonzero: dict[int, bool] = {}
        self.digest: dict[int, bytes] = {}

    def add(self, t: int, x: Tensor) -> None:
        import hashlib

        from .safetensors_io import tensor_bytes_view

        self.nonzero[t] = self.checks.nonzero[t] or bool(x.any())
        if any(t in pair for pair in self.checks.same):
            x = x.detach().contiguous().cpu()
            self.digest[t] = hashlib.blake2b(tensor_bytes_view(x), digest_size=32).digest()

    def commit(self) -> None:
        c = self.checks
        with c._lock:
            for t, nz in self.nonzero.items():
                c.nonzero[t] = c.nonzero[t] or nz
            c.same = {(i, j) for i, j in c.same
                      if i in self.digest and j in self.digest and self.digest[i] == self.digest[j]}


def is_delta_source(x) -> bool:
    """Whether ``x`` is a task-vector source (e.g. :class:`pactlib.peft.AdapterSource`) rather
    than a checkpoint path: it has ``check(meta)`` and ``delta(key) -> Tensor | None``."""
    return callable(getattr(x, "check", None)) and callable(getattr(x, "delta", None))


class DeltaReader:
    """θ0 and the T fine-tuned checkpoints (or task-vector sources), checked from their headers;
    the deltas Δt = θt − θ0 read key by key (or rows of a key) on demand.

    Args:
        pre: θ0 as a :class:`pactlib.lazy.LazyCheckpoint`.
        fts: per task, a :class:`~pactlib.lazy.LazyCheckpoint` of θt (θ0's keys and shapes) or a
            task-vector source (:func:`is_delta_source`).
        names: task names for messages, one per entry of ``fts``.
        user: the caller's index of each entry of ``fts`` when they come in another order (the
            content order, :func:`delta_order`): of several tasks with a NaN / Inf in one key, the
            first in the caller's order is named. Default: ``fts``' own order.

    Attributes:
        meta: θ0's keys as ``meta``-device tensors (shapes, dtypes). ``floats``: θ0's floating
            keys, in θ0's order (the keys that have a task vector). ``T``: the number of tasks.
        dtype: the compute dtype, float64 when θ0 has a float64 entry, else float32.

    Raises:
        CheckpointError: θ0 is not a state dict of tensors; a θt with a key missing or extra or a
            shape mismatch (named by task and key); a source whose ``check`` refuses θ0.
    """

    def __init__(self, pre: LazyCheckpoint, fts: Sequence, names: Sequence[str], *,
                 user: Sequence[int] | None = None):
        self.pre, self.fts, self.names = pre, list(fts), list(names)
        self.user = list(range(len(self.fts))) if user is None else list(user)
        meta = pre.meta()
        check_state_dict(meta, name=f"pre-trained ({pre.name})")
        for ft, nm in zip(self.fts, self.names):
            if is_delta_source(ft):
                ft.check(meta)
            else:
                check_compatible(meta, ft.meta(), name=nm)
        self.meta = meta
        self.dtype = torch.float64 if any(v.dtype == torch.float64 for v in meta.values()) else torch.float32
        self.floats = [k for k, v in meta.items() if torch.is_floating_point(v)]
        self.T = len(self.fts)
        self._local = threading.local()  # each thread's read buffer (θt's entry before the subtraction)

    def _buffer(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """This thread's reusable read buffer as a ``shape`` tensor of ``dtype`` (grown when too
        small): θt's bytes land there and only Δt = θt − θ0 leaves it, so a pass over the files
        allocates no buffer per task."""
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < n:
            buf = self._local.buf = torch.empty(max(n, 1), dtype=torch.uint8)
        return buf[:n].view(dtype).view(tuple(shape))

    def stack_buffer(self, key: str, rows: tuple[int, int] | None, buf: Tensor | None) -> Tensor:
        """A (T, …) tensor of :attr:`dtype` for ``key`` (or its ``rows``) on the storage of
        ``buf`` (a 1-d tensor of :attr:`dtype`, reused from chunk to chunk) when it is large
        enough, else a new one: the ``out`` of :meth:`deltas` in a loop over chunks."""
        shape = self.pre.shape(key)
        if rows is not None and shape:
            shape = (rows[1] - rows[0], *shape[1:])
        n = self.T * math.prod(shape)
        if buf is None or buf.numel() < n:
            return torch.empty((self.T, *shape), dtype=self.dtype)
        return buf[:n].view(self.T, *shape)

    def rows(self, key: str, chunked: bool, chunk_bytes: int) -> list[tuple[int, int] | None]:
        """Row ranges ``(start, stop)`` along dimension 0 that cover ``key`` in order, each
        chunk's (T, rows, …) stack at most about ``chunk_bytes`` (one row at least); ``[None]``:
        the whole key at once (``chunked`` False, a 0-d key, or a key within the budget).

        Raises:
            KeyError: ``key`` is not in θ0.
        """
        shape = self.pre.shape(key)
        if not chunked or not shape:
            return [None]
        per_row = max(1, self.pre.entry(key).numel // max(shape[0], 1)) * self.dtype.itemsize * self.T
        step = max(1, chunk_bytes // per_row)
        if step >= shape[0]:
            return [None]
        return [(a, min(a + step, shape[0])) for a in range(0, shape[0], step)]

    def deltas(self, key: str, rows: tuple[int, int] | None = None, *, check: bool = True,
               out: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(p, stack)``: θ0's entry (or its ``rows``), shape (…), in θ0's dtype, and the
        (T, …) stack of Δt = θt − θ0 in :attr:`dtype` (a fresh tensor the caller may modify, or
        ``out``, a contiguous (T, …) tensor of :attr:`dtype`: :meth:`stack_buffer`), checked
        finite unless ``check`` is False (a later pass over data already checked).

        Raises:
            KeyError: ``key`` is not in θ0.
            CheckpointError: NaN / Inf in θ0 or a θt (naming the file and the key), an unreadable file.
        """
        p = self.pre.read(key, rows)
        if check:
            check_finite({key: p}, name=f"pre-trained ({self.pre.name})")
        stack = torch.empty((self.T, *p.shape), dtype=self.dtype) if out is None else out
        p_c = p.to(self.dtype)
        for t in range(self.T):
            self.delta(key, t, rows, pre=p_c, check=check, out=stack[t])
        return p, stack

    def delta(self, key: str, t: int, rows: tuple[int, int] | None = None, *, pre: Tensor | None = None,
              check: bool = True, out: Tensor | None = None) -> Tensor:
        """Task t's Δt = θt − θ0 of ``key`` (or its ``rows``) in :attr:`dtype`: ``out`` when
        given, else a fresh tensor the caller may modify; checked finite unless ``check`` is False.
        ``pre``: θ0's entry (or rows) already cast to :attr:`dtype` (else read here, unchecked).

        Raises:
            KeyError: ``key`` is not in θ0.
            CheckpointError: NaN / Inf in θt (naming the file and the key), an unreadable file.
        """
        ft, nm = self.fts[t], self.names[t]
        if pre is None:
            pre = self.pre.read(key, rows).to(self.dtype)
        if out is None:
            out = torch.empty(pre.shape, dtype=self.dtype)
        if is_delta_source(ft):  # Δt itself (None: zero); checked finite when it was read
            d = ft.delta(key)
            return out.zero_() if d is None else out.copy_(d if rows is None else d[rows[0]:rows[1]])
        x = ft.read(key, rows, out=self._buffer(pre.shape, ft.dtype(key)))
        if check:
            try:
                check_finite({key: x}, name=nm)
            except CheckpointError:
                self._first_not_finite(key, t, rows)
                raise
        return torch.sub(x.to(self.dtype), pre, out=out)

    def _first_not_finite(self, key: str, t: int, rows) -> None:
        """Raise the NaN / Inf error of ``key`` (or its rows) of the first task before task t in
        the caller's order (:attr:`user`) that has one: the error a merge in the given order
        raises first."""
        for u in sorted((u for u in range(self.T) if self.user[u] < self.user[t]), key=self.user.__getitem__):
            ft = self.fts[u]
            if not is_delta_source(ft):
                check_finite({key: ft.read(key, rows)}, name=self.names[u])


def reduced_update(inputs: DeltaReader, key: str, rows: tuple[int, int] | None, pre: Tensor | None, *,
                   m: merges.MergeMethod, params: dict, rule: MatrixRule, pact: str | None = None,
                   options: PactOptions | None = None, read: Callable[[int, bool], Tensor] | None = None,
                   checks: _TaskChecks | None = None, dev: torch.device | None = None) -> tuple[Tensor, object]:
    """``(D, layer report or None)`` of a method with a per-task reducer
    (:attr:`pactlib.merges.MergeMethod.reducer`: Task Arithmetic, TSV-M, Iso-C, Iso-CTS) on one key (or its
    ``rows``), reading one task at a time: each Δt (PACT/S-PACT-filtered when ``pact`` is given,
    :func:`pactlib.pact.filter_tasks`, which reads each Δt twice) goes to the reducer (a running
    sum; TSV-M's top triplets) instead of a (T, m, n) stack. The same values as the method on the
    stack; memory: a few copies of the key (TSV-M: and its triplets), whatever T.

    Args:
        inputs: θ0 and the θt; key, rows: what to merge (``rows``: only for an entry-wise method,
            :attr:`pactlib.merges.MergeMethod.elementwise`); pre: θ0's entry (or rows), θ0's dtype
            (None will do when ``read`` is given and ``pact`` is None).
        read: ``read(t, first)`` -> task t's Δt (a tensor the caller gives up; ``first`` the first
            time t is read), default from ``inputs`` (checked finite the first time); the streamed
            testbed merges read their filtered-layer cache through it (then ``pact`` is None).
        checks: fed the unfiltered deltas (all-zero and identical task vectors).
        dev: compute device (default: where ``read`` gives the deltas).

    Raises:
        CheckpointError: NaN / Inf in a checkpoint (file and key).
    """
    shape = tuple(inputs.meta[key].shape) if rows is None else (rows[1] - rows[0], *inputs.meta[key].shape[1:])
    matrix = rows is None and rule.kind(key, inputs.meta[key]) == "matrix"
    reducer = m.reducer(inputs.T, matrix, **params)

    def feed(d: Tensor) -> None:
        reducer.add(rule.view(key, d) if matrix else d)

    # a two-pass reducer (Iso-CTS) reads each Δt again; PACT's filtered Δ̃t are kept for the second
    # pass instead (filtering again would redo PACT's SVDs)
    twice = passes_of(reducer) == 2
    kept: list[Tensor] | None = [] if twice and pact is not None else None

    def add(t: int, d: Tensor) -> None:
        if kept is not None:
            kept.append(d)
        feed(d)
    # a running sum of unfiltered deltas is checked once: a NaN or ±Inf in any θt makes Δt and then
    # the sum non-finite (θ0 is checked finite), so a finite sum clears every θt of the key
    once = read is None and pact is None and isinstance(reducer, RunningSum)
    lr = feed_tasks(inputs, key, rows, pre, add, pact=pact, options=options, rule=rule, read=read, checks=checks,
                    dev=dev, check=not once)
    if twice:
        reducer.next_pass()
        if kept is not None:
            for d in kept:
                feed(d)
            kept.clear()
        else:  # read again: θt checked finite, checks fed, on the first pass
            feed_tasks(inputs, key, rows, pre, add, pact=None, options=options, rule=rule, read=read, dev=dev,
                       check=False)
    if once and reducer.total is not None and not all_finite(reducer.total):
        pre_c = pre.to(inputs.dtype)
        for t in range(inputs.T):  # which θt: the first by task order raises, naming its file
            inputs.delta(key, t, rows, pre=pre_c)
        # every θt finite: Δt or the sum overflowed; the update's own check says so (apply_update)
    D = reducer.result()
    return (rule.unview(key, D, shape) if matrix else D), lr


def feed_tasks(inputs: DeltaReader, key: str, rows: tuple[int, int] | None, pre: Tensor | None,
               emit: Callable[[int, Tensor], None], *, pact: str | None, options: PactOptions | None,
               rule: MatrixRule, read: Callable[[int, bool], Tensor] | None = None,
               checks: _TaskChecks | None = None, dev: torch.device | None = None, check: bool = True):
    """``emit(t, Δt)`` for t = 0..T−1 in order, each Δt read on its own (PACT/S-PACT-filtered by
    :func:`pactlib.pact.filter_tasks` when ``pact`` is given; unfiltered when every Δt of the layer
    is zero): the one-task-at-a-time feed of :func:`reduced_update` and of global TIES' first pass.
    ``pre``: θ0's entry (or rows), θ0's dtype (may be None when ``read`` is given and ``pact`` is
    None); ``read``, ``checks``, ``dev``: as :func:`reduced_update`. ``check``: the default
    ``read`` checks each θt finite the first time it is read (False: the caller checks).

    Returns:
        The layer's :class:`pactlib.pact.LayerReport`, or None (no PACT, or nothing to filter).
    """
    probe = checks.probe() if checks is not None else None
    if read is None:
        pre_c = pre.to(inputs.dtype)

        def read(t: int, first: bool) -> Tensor:
            return inputs.delta(key, t, rows, pre=pre_c, check=first and check)

    seen: set[int] = set()

    def get(t: int) -> Tensor:
        d = read(t, t not in seen)
        if t not in seen:
            seen.add(t)
            if probe is not None:
                probe.add(t, d)  # where it was read (the CPU): the hash reads its bytes
        return d if dev is None else d.to(dev)

    res = None
    if pact is not None:
        res = filter_tasks(key, pre if dev is None else pre.to(dev), get, inputs.T, emit=emit, mode=pact,
                           options=options, rule=rule)
    if res is None:  # no PACT, or every Δt is zero: nothing filtered
        for t in range(inputs.T):
            emit(t, get(t))
    if probe is not None:
        probe.commit()
    return res[0] if res is not None else None


def return_freed_memory(threshold: int = 1 << 20, trim: int | None = None) -> bool:
    """Make the C allocator give freed large buffers back to the operating system at once (glibc:
    ``mallopt(M_MMAP_THRESHOLD, threshold)``: every allocation of at least ``threshold`` bytes gets
    its own memory map, unmapped when freed; with ``trim``, ``mallopt(M_TRIM_THRESHOLD, trim)``:
    the heap keeps up to that many freed bytes at its top for the next buffers instead of giving
    them back at every free). Process-wide; ``pact merge`` calls it with :func:`allocator_settings`.

    Why: glibc raises its map threshold to the size of every large block freed (up to 32 MB), so
    later layer-sized buffers (a ViT-L/14 MLP matrix is 16 MB) come from the heap, where small
    allocations in between keep the freed ones from being returned; the resident size then grows
    with the heap's history. What it saves is recorded in ``book/data/implementation_choices.jsonl``.
    The cost is a page fault per page of each new buffer of ``threshold`` bytes or more: the chunked
    paths, whose buffers all fit in a chunk and recur chunk after chunk, take a threshold above the
    chunk and a trim threshold of a chunk (:func:`allocator_settings`), so their
    buffers come from the heap, reused without faults; the heap then holds no more than the peak
    of one chunk's work, which the process reaches anyway.

    Returns:
        True when set; False when the C library is not glibc (nothing done) or the user set
        ``MALLOC_MMAP_THRESHOLD_`` in the environment (theirs is kept).
    """
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    if trim is not None and not os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        mallopt(M_TRIM_THRESHOLD, int(trim))
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


def allocator_settings(method: str, pact: str | None, params: dict,
                       chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int | None]:
    """``(threshold, trim)`` for :func:`return_freed_memory` in a streamed merge of ``method`` with
    ``params``. When the merge's buffers recur chunk after chunk (an entry-wise method, or TIES of
    either scope, without PACT: one chunk's (T, rows, …) stack and its temporaries; TIES per key
    also keeps a few one-task buffers of the largest key, allocated once, :func:`ties_key`): a
    map threshold of twice ``chunk_bytes`` and a trim threshold of one chunk (the heap keeps that
    much freed memory for the next chunk's buffers), so they are reused from the heap. Else
    (layer-sized buffers of every size): 1 MB and glibc's own trim, each buffer its own map,
    unmapped when freed."""
    m = merges.get(method)
    chunked = m.elementwise or m.name == "ties"
    return (2 * chunk_bytes, chunk_bytes) if chunked and pact is None else (1 << 20, None)


def consume_in_order(job: Callable, items: Sequence, workers: int, consume: Callable) -> None:
    """``consume(item, job(item))`` for every item, in the order of ``items``: ``job`` runs on
    ``workers`` threads (at most ``workers`` results in flight, so memory grows with it), each
    torch kernel single-threaded (:func:`pactlib.threads.single_threaded`); ``consume`` runs on the
    calling thread. ``workers`` <= 1: one item at a time on the calling thread.

    Raises:
        whatever ``job`` or ``consume`` raises (the jobs not started yet are cancelled).
    """
    if workers <= 1:
        with single_threaded():
            for it in items:
                consume(it, job(it))
        return

    def one(it):
        torch.set_num_threads(1)
        return job(it)

    with single_threaded(), ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        try:
            for it in items:
                pending.append((it, pool.submit(one, it)))
                if len(pending) >= workers:
                    i0, f = pending.popleft()
                    consume(i0, f.result())
            while pending:
                i0, f = pending.popleft()
                consume(i0, f.result())
        except BaseException:
            for _, f in pending:
                f.cancel()
            raise


def apply_update(key: str, p: Tensor, D: Tensor, alpha: float) -> Tensor:
    """θ0 + α·D for one key (or rows of it), same shape as ``p``, in θ0's dtype:
    :meth:`TaskVector.apply_to` on that one key (book/method.md, merges; D of any of M1–M5).

    Raises:
        MergeOverflowError: a merged value overflows θ0's dtype (fp16), naming the key.
    """
    return TaskVector._wrap({key: D}).apply_to({key: p}, alpha)[key]


def check_method_values(m: merges.MergeMethod, rule: MatrixRule, params: dict, dtype: torch.dtype) -> None:
    """Check the method's parameter values (``params``, e.g. TIES' ``k`` and ``scope``) before any
    file is read, by merging a one-entry dummy task vector of ``dtype``.

    Raises:
        TypeError: an unknown parameter. ValueError: a value the method refuses (named by it).
    """
    m([TaskVector._wrap({"probe": torch.ones(1, dtype=dtype)}, "probe")], rule=rule, **params)


def native_count(values: Tensor, prefix: int, shift: int, hist: Tensor) -> bool:
    """:class:`~pactlib.merges.ties.GlobalThreshold`'s ``count``: one float32 CPU chunk of one task
    counted by the C kernels (:func:`pactlib.native.digit_hist`, the same counts) when they are
    available (True), else nothing done (False: torch counts it)."""
    lib = native.library()
    if lib is None:
        return False
    native.digit_hist(lib, values, prefix, shift, hist)
    return True


def observe_stack(gt: GlobalThreshold, stack: Tensor, *, work: dict | None = None) -> None:
    """Count one (T, …) stack of chunks (row t: a chunk of Δt, on any device) in ``gt``'s pass
    (``work``: the counting's buffers, kept by the caller: :meth:`GlobalThreshold.observe`).

    Raises:
        ValueError: the first dimension of ``stack`` is not ``gt.tasks``.
    """
    if stack.shape[0] != gt.tasks:
        raise ValueError(f"GlobalThreshold: a stack of {stack.shape[0]} rows for {gt.tasks} tasks")
    stack = stack.cpu()
    for t in range(gt.tasks):
        gt.observe(t, stack[t], work=work)


def find_thresholds(gt: GlobalThreshold, passes: Callable[[bool], Iterable[Tensor]], *,
                    work: dict | None = None) -> GlobalThreshold:
    """Finish ``gt``: every task's TIES trim threshold (M2, ``scope="global"``) and tie count.

    ``passes(first)`` yields (T, …) stacks (row t: a chunk of Δt) that together cover every entry
    of every task vector not counted yet, once, in any order; it is called once per remaining pass
    (2 for float32, 4 for float64), ``first`` True on the first call (e.g. to check the values, or
    skip layers already counted with :func:`observe_stack`, only then). Memory: one stack at a time
    (and ``work``'s buffers: :func:`observe_stack`).

    Returns:
        ``gt``, with ``gt.done``.

    Raises:
        ValueError: a stack whose first dimension is not T.
    """
    first = True
    while not gt.done:
        for stack in passes(first):
            observe_stack(gt, stack, work=work)
        gt.end_pass()
        first = False
    return gt


def trim_stack(gt: GlobalThreshold, stack: Tensor, *, out: Tensor | None = None, work: dict | None = None) -> Tensor:
    """The trimmed (T, …) stack Δt · mask_t of the next chunk of every task: chunks must come in
    the in-memory position order (keys in order, rows in order), as
    :meth:`~pactlib.merges.ties.GlobalThreshold.mask`; what the in-memory TIES computes as
    ``flat * mask`` (M2). A CPU tensor of ``stack``'s shape and dtype: ``out`` when given (which
    may be ``stack`` itself: trimmed in place), else a new one. ``work``: the masks' buffers,
    kept by the caller from chunk to chunk (:meth:`~pactlib.merges.ties.GlobalThreshold.mask`).

    Raises:
        RuntimeError: the passes are not finished. ValueError: the first dimension is not T.
    """
    if stack.shape[0] != gt.tasks:
        raise ValueError(f"GlobalThreshold: a stack of {stack.shape[0]} rows for {gt.tasks} tasks")
    out = torch.empty_like(stack) if out is None else out
    for t in range(gt.tasks):
        torch.mul(stack[t], gt.mask(t, stack[t], work=work), out=out[t])
    return out


def ties_chunk(gt: GlobalThreshold, stack: Tensor, *, work: dict | None = None) -> Tensor:
    """TIES' D (M2) on the next (T, …) chunk of every task: trimmed as :func:`trim_stack` trims it
    (chunks in position order), then elected and averaged as
    :func:`~pactlib.merges.ties.ties_kernel` does; a new tensor of ``stack.shape[1:]``. A float32
    CPU stack of at most 255 tasks takes one fused pass (:func:`pactlib.native.ties_merge`: the
    same bits), else the torch expressions, which trim ``stack`` in place when ``work`` is given
    (``work``: the buffers kept from chunk to chunk, as :func:`trim_stack` and ``ties_kernel``).

    Raises:
        RuntimeError: the passes are not finished. ValueError: the first dimension is not T.
    """
    if stack.shape[0] != gt.tasks:
        raise ValueError(f"GlobalThreshold: a stack of {stack.shape[0]} rows for {gt.tasks} tasks")
    fused = stack.dtype == torch.float32 and stack.device.type == "cpu" and gt.tasks <= 255
    lib = native.library() if fused else None
    if lib is None:
        return ties_kernel(trim_stack(gt, stack, out=stack if work is not None else None, work=work), work=work)
    space = None if work is None else work.get("native")
    if space is None or space.numel() < native.workspace_size(gt.tasks):
        space = native.merge_workspace(gt.tasks)
        if work is not None:
            work["native"] = space
    left = torch.tensor(gt.pending_ties(), dtype=torch.int64)
    out = native.ties_merge(lib, stack, torch.tensor(gt.prefix, dtype=torch.int64), left,
                            torch.empty(stack.shape[1:], dtype=stack.dtype), space)
    gt.set_pending_ties(left.tolist())
    return out


def merge_files(method: str, pretrained: str | os.PathLike, finetuned: Sequence[str | os.PathLike],
                out: str | os.PathLike, *, alpha: float, pact: str | None = None, rule: MatrixRule = DEFAULT_RULE,
                names: Sequence[str] | None = None, max_shard_size: int | str | None = None,
                trust_pickle: bool = False, loader: Loader | None = None, cache_dir: str | os.PathLike | None = None,
                workers: int = 1, chunk_bytes: int = CHUNK_BYTES, device: str | torch.device | None = None,
                on_publish: Callable[[], Sequence[Path]] | None = None, options: PactOptions | None = None,
                **kw) -> MergedFiles:
    """Merge checkpoint files layer by layer into ``out``: θ = θ0 + α·D (book/method.md, merges), D from
    ``method`` after the optional ``pact`` filter; the same result as :func:`pactlib.merge`, in
    about one layer's memory (module docstring).

    Args:
        method: a registered name (:func:`pactlib.merges.names`).
        pretrained: θ0: a ``.safetensors`` file, a pickle (``.pt``/``.pth``/``.bin``/``.ckpt``,
            converted once to safetensors, :func:`pactlib.lazy.convert_pickle`), a sharded
            checkpoint's ``*.index.json`` or a model folder.
        finetuned: the T fine-tuned checkpoints, same forms, with θ0's keys and shapes; or
            task-vector sources (:func:`is_delta_source`, e.g. PEFT LoRA adapters as
            :class:`pactlib.peft.AdapterSource`) giving Δt key by key, exactly (not θ0 + Δt − θ0).
        out: ``*.safetensors``; ``*.safetensors.index.json`` for a sharded output; or a torch
            file (``.pt``, collected in memory: one model). Once it is published, the files of
            an earlier output under that name (other shards, an index a reader would prefer) and
            temporary files of interrupted runs are removed from its folder
            (:func:`pactlib.lazy.remove_stale_outputs`).
        alpha: scaling coefficient α.
        pact: ``None``, ``"pact"`` or ``"s-pact"``.
        rule: the matrix-view rule.
        names: task names for messages (default the file paths).
        max_shard_size: split the output into shards of at most this size (bytes or ``"2GB"``),
            with a Hugging Face ``*.index.json`` (written only when more than one shard is needed,
            unless ``out`` names the index).
        trust_pickle: let the conversion of pickles unpickle whole modules (runs code from the
            files: trusted files only).
        loader: how pickles are read for their conversion (default
            :func:`pactlib.lazy.default_loader` of ``trust_pickle``).
        cache_dir: the conversion cache (default :func:`pactlib.lazy.conversion_cache_dir`).
        workers: layers merged at once (global TIES: the tasks of a chunk), each kernel
            single-threaded (same result for any value; memory grows with it).
        chunk_bytes: budget of one chunk of the entry-wise paths.
        device: where each layer is filtered and merged (:func:`pactlib.checks.check_device`:
            ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"``; None: the CPU). The files are read and
            written on the CPU; each layer's deltas go to the device as they are read, its merged
            update comes back before θ0 + α·D is formed. TIES with ``scope="global"`` filters
            (PACT) on the device and trims, elects and averages on the CPU (entry-wise passes
            over chunks).
        on_publish: called right after the weights are published, before the files of an
            earlier output are removed; it publishes files that belong with them (a model
            folder's card) and returns their paths, which join ``files``.
        options: PACT options as one :class:`PactOptions` (or by name in ``kw``; not both).
        **kw: method parameters and PACT options, routed by name (as :func:`pactlib.merge`).

    Returns:
        :class:`MergedFiles` (the output path, the files, PACT's report).

    The output is published with SIGINT, SIGTERM and SIGHUP held back
    (:func:`pactlib.io.signals_held`), ``on_publish`` and the removal of an earlier output's
    files included: a signal that arrives then is raised once all is published, and the files
    are in :func:`pactlib.io.published_outputs`.

    Raises:
        TypeError, ValueError, UnknownMethodError: as :func:`pactlib.merge`, before any file is
            read; a bad ``max_shard_size`` or ``out`` extension; ``out`` one of the inputs or a
            name it may write a file of an input, or another model's weights in a model folder
            no merge wrote (:func:`pactlib.lazy.check_out_target`); a bad ``device`` or a GPU
            torch does not see.
        FileNotFoundError: a missing input.
        CheckpointError: ``out`` names a folder (a trailing ``/`` or an existing one), not a
            file (before any work); an unreadable input, a key missing or extra, a shape
            mismatch (named by file and key, before any data is read), NaN / Inf (file and key).
        MergeOverflowError: a merged value overflows θ0's dtype.
        OutputError (an ``OSError``, :class:`pactlib.io.OutputError`): another run is writing
            ``out`` (:func:`pactlib.lazy.output_lock`), or writing failed (a full disk); named,
            with nothing left behind.

    Warns:
        UserWarning: as :func:`pactlib.merge`: θ0 has Hugging Face CLIP keys, whose separate
            q/k/v matrices merge differently from open_clip's fused ``in_proj_weight``
            (:func:`pactlib.matrix.split_attention_note`; said once θ0's header is read, before any
            merging); a method that merges matrix layers finds none under ``rule``
            (:func:`pactlib.matrix.no_matrix_note`); PACT changed nothing; a task vector is all
            zeros, or two are identical; the files of an earlier output under ``out``'s name were
            removed (:func:`pactlib.lazy.remove_stale_outputs`, naming them).
    """
    alpha = check_alpha(alpha)
    mparams, named = resolve_kwargs(method, pact, kw)
    options = check_options(options, named, pact)
    m = merges.get(method)
    if is_folder_output(out):  # named before its missing suffix is
        raise CheckpointError(f"{out} is a folder; name the output file (e.g. {Path(out) / 'model.safetensors'}): "
                              "merge_files writes one checkpoint; a model folder with config, tokenizer and card "
                              "is pact merge --out DIR/")
    out = Path(out)
    check_out_suffix(out, max_shard_size)
    if max_shard_size is not None:
        from .lazy import parse_size

        parse_size(max_shard_size)
    dev = None if device is None else torch.device(check_device(device))
    if isinstance(finetuned, (str, os.PathLike)):
        raise CheckpointError("finetuned: expected a list of checkpoint paths, got a single path")
    finetuned = list(finetuned)
    if not finetuned:
        raise CheckpointError("finetuned: at least one fine-tuned checkpoint is needed")
    check_out_target(out, [pretrained, *finetuned])  # a task-vector source names its files
    names = [getattr(p, "name", str(p)) if is_delta_source(p) else str(p) for p in finetuned] \
        if names is None else list(names)
    if len(names) != len(finetuned):
        raise CheckpointError(f"names: {len(names)} names for {len(finetuned)} fine-tuned checkpoints")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers (--workers) must be a positive integer, got {workers!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    per_key = m.is_per_key(mparams)
    if not per_key and m.name != "ties":
        raise ValueError(f"merge method {m.name!r} with {mparams} does not merge key by key and has no "
                         "streamed form; use pactlib.merge (in memory)")
    check_method_values(m, rule, mparams, torch.float32)

    with output_lock(out):  # one run at a time writes this output; the others fail naming it
        loader = loader or default_loader(trust_pickle)
        pre = open_checkpoint(pretrained, loader=loader, cache_dir=cache_dir)
        for note in (split_attention_note(pre.keys(), where=f"{method}: "),  # Hugging Face CLIP's separate q/k/v
                     no_matrix_note(m, rule, pre.meta(), where=f"{method}: ")):
            if note:
                warnings.warn(note, UserWarning, stacklevel=2)
        fts = [p if is_delta_source(p) else open_checkpoint(p, loader=loader, cache_dir=cache_dir, name=nm)
               for p, nm in zip(finetuned, names)]
        inputs = DeltaReader(pre, fts, names)
        perm = delta_order(inputs)  # merged in the content order: a function of the set of tasks
        if perm != sorted(perm):
            inputs = DeltaReader(pre, [fts[t] for t in perm], [names[t] for t in perm], user=perm)
        selected: list[str] = []
        report = None
        matrix_keys: list[str] = []
        if pact is not None:
            options = options or PactOptions()
            report = PactReport(pact, options)
            matrix_keys, selected = select_layers({k: inputs.meta[k] for k in inputs.floats}, mode=pact,
                                                  options=options, rule=rule, stacklevel=2)
        entries = [(k, v.shape, v.dtype) for k, v in inputs.meta.items()]
        checks = _TaskChecks(inputs.names, perm=perm)
        with CheckpointWriter(out, entries, max_shard_size=max_shard_size) as writer:
            args = dict(inputs=inputs, m=m, mparams=mparams, rule=rule, alpha=alpha, pact=pact, options=options,
                        selected=set(selected), report=report, checks=checks, writer=writer, workers=workers,
                        chunk_bytes=chunk_bytes, dev=dev)
            if per_key:
                _per_key(**args)
            else:
                _ties_global(**args, out=out)
            checks.warn()
            if report is not None:
                warn_if_unchanged(report, matrix_keys, selected, stacklevel=2)
                log.info("%s: cap bound on %.1f%% of (layer, task) shields", pact, 100 * report.cap_binding_rate())
            for ckpt in (pre, *fts):  # an input that changed while it was read: nothing is published
                if isinstance(ckpt, LazyCheckpoint):
                    ckpt.check_unchanged()
            with signals_held() as held:
                files = writer.commit()
                held += files
                extra = list(on_publish()) if on_publish is not None else []
                held += extra
                finish_output(out, files)  # an earlier output's files, TIES' spill folders of killed runs
        return MergedFiles(writer.path, files + extra, inputs.T, reorder_report(report, perm))


def delta_order(inputs: DeltaReader) -> list[int]:
    """The content order (:mod:`pactlib.order`) of the tasks of ``inputs``: their Δt = θt − θ0 in
    :attr:`DeltaReader.dtype`, the values :func:`pactlib.merged_update` orders the same task vectors
    by, read a chunk of one key of one task at a time (mostly the first chunk of each task).
    ``perm[c]`` is the caller's index of the c-th task."""
    segs = segments({k: tuple(inputs.meta[k].shape) for k in inputs.floats})
    cols: dict[str, int] = {}
    held: dict[str, object] = {}  # θ0's rows of the segment last read: read once for all T tasks

    def pre_rows(key: str, rows: tuple[int, int] | None) -> Tensor:
        if held.get("at") != (key, rows):
            held.update(at=(key, rows), pre=inputs.pre.read(key, rows).to(inputs.dtype))
        return held["pre"]

    def chunk(t: int, c: int) -> bytes:
        key, a, b = segs[c]
        shape = tuple(inputs.meta[key].shape)
        if not shape:
            d = inputs.delta(key, t, pre=pre_rows(key, None), check=False)
        else:
            row = cols.setdefault(key, max(1, math.prod(shape[1:])))
            r0, r1 = a // row, -(-b // row)
            d = inputs.delta(key, t, (r0, r1), pre=pre_rows(key, (r0, r1)),
                             check=False).reshape(-1)[a - r0 * row:b - r0 * row]
        return bytes(tensor_bytes_view(d.contiguous()))

    return content_order(inputs.T, len(segs), chunk)


def _per_key(*, inputs: DeltaReader, m, mparams, rule, alpha, pact, options, selected, report, checks, writer,
             workers, chunk_bytes, dev: torch.device | None) -> None:
    T = inputs.T
    reduced = m.reducer is not None
    # a reducer holds no (T, rows, …) stack but about eight one-task buffers of the rows (θ0's rows,
    # the read buffer, Δt, the running sum, the update, …): its rows take an eighth of the budget each
    budget = max(1, chunk_bytes * T // 8) if reduced else chunk_bytes
    ties = m.name == "ties"  # per key here: trimmed and elected in chunks (ties_key)
    local = threading.local()  # each worker's buffers, reused from key to key

    def job(key: str):
        if key not in inputs.floats:
            return [inputs.pre.read(key)], None
        if ties:
            work = local.__dict__.setdefault("work", {})
            k = float(mparams.get("k", m.params["k"]))
            if key not in selected:
                return ties_key(inputs, key, k=k, alpha=alpha, chunk_bytes=chunk_bytes, checks=checks, work=work), None
            p, stack = inputs.deltas(key)
            checks.update(stack)  # on the unfiltered deltas, as the in-memory path
            stack, res = filter_stack(key, p, stack if dev is None else stack.to(dev), mode=pact, options=options,
                                      rule=rule, dev=dev)
            return (ties_key(inputs, key, k=k, alpha=alpha, chunk_bytes=chunk_bytes, checks=None, work=work,
                             stack=stack.cpu(), pre=p), res[0] if res is not None else None)
        outs, lr = [], None
        for rows in inputs.rows(key, m.elementwise and key not in selected, budget):
            if reduced:  # tasks read one at a time into the method's reducer: no (T, m, n) stack
                p = inputs.pre.read(key, rows)
                check_finite({key: p}, name=f"pre-trained ({inputs.pre.name})")
                D, lr = reduced_update(inputs, key, rows, p, m=m, params=mparams, rule=rule,
                                      pact=pact if key in selected else None, options=options, checks=checks,
                                      dev=dev)
                outs.append(apply_update(key, p, D.to(p.device), alpha))
                continue
            p, stack = inputs.deltas(key, rows)
            checks.update(stack)  # on the unfiltered deltas, as the in-memory path
            if dev is not None:
                stack = stack.to(dev)
            views = [stack[t] for t in range(T)]  # rows of the stack: map_layers uses it without a copy
            if key in selected:  # filtered in place (the stack is already on dev): the views see it
                res = filter_stack(key, p, stack, mode=pact, options=options, rule=rule, dev=dev)[1]
                lr = res[0] if res is not None else None
            D = m([TaskVector._wrap({key: v}, nm) for v, nm in zip(views, inputs.names)], rule=rule, **mparams)[key]
            del views, stack
            outs.append(apply_update(key, p, D.to(p.device), alpha))
        return outs, lr

    def consume(key: str, result) -> None:
        outs, lr = result
        if lr is not None:
            report.layers.append(lr)
        for o in outs:
            writer.write(key, o)

    consume_in_order(job, inputs.pre.keys(), workers, consume)


def ties_key(inputs: DeltaReader, key: str, *, k: float, alpha: float, chunk_bytes: int, checks: _TaskChecks | None,
             work: dict, stack: Tensor | None = None, pre: Tensor | None = None) -> list[Tensor]:
    """θ0 + α·D for one key of TIES with ``scope="per_key"`` (M2), in consecutive chunks of rows
    (what :func:`pactlib.merges.ties.ties` computes on that key, bit for bit).

    Each task's trim threshold (the ``keep``-th largest |Δt| of the key, ``keep`` =
    :func:`~pactlib.merges.ties.trim_count`, and how many entries tied with it are kept, the first
    by position) is found by radix selection (:class:`~pactlib.merges.ties.GlobalThreshold`) on
    that task's Δt of the key, read whole, one task at a time; then the key is read again in
    chunks of rows whose (T, rows, …) stack is about ``chunk_bytes / 4``, each trimmed, elected
    and averaged (:func:`trim_stack`, :func:`~pactlib.merges.ties.ties_kernel`). A key whose
    whole stack fits in one chunk is read once. So every input is read at most twice, with
    ``pread`` into buffers kept in ``work`` (a dict the caller keeps from key to key), and memory
    is a few copies of the key and one chunk's stack, whatever T.

    Args:
        inputs: θ0 and the θt. key: a floating key of θ0.
        k: TIES' trim percentage. alpha: α.
        checks: fed the deltas as read (all-zero and identical task vectors); None: not fed.
        stack: the key's (T, …) stack of deltas already in memory (e.g. PACT-filtered; trimmed in
            place), with ``pre``, θ0's entry: nothing is read.

    Returns:
        θ0 + α·D of the key in θ0's dtype, as its consecutive chunks of rows.

    Raises:
        CheckpointError: NaN / Inf in a checkpoint (file and key). MergeOverflowError: as
            :func:`apply_update`.
    """
    T, shape, dtype = inputs.T, inputs.pre.shape(key), inputs.dtype
    n = math.prod(shape)
    keep = trim_count(n, k) if n else 0

    def thresholds(delta: Callable[[int], Tensor]) -> GlobalThreshold:
        parts = []
        for t in range(T):
            x = delta(t)
            g = GlobalThreshold(1, keep, dtype, count=native_count)
            while not g.done:
                g.observe(0, x, work=work)
                g.end_pass()
            parts.append(g)
        return GlobalThreshold.join(parts)

    def merged(p: Tensor, st: Tensor, gt: GlobalThreshold) -> Tensor:
        return apply_update(key, p, ties_chunk(gt, st, work=work), alpha)  # Δt * trim_mask(Δt) in memory, then M2

    def stack_buffer(rows) -> Tensor:
        out = inputs.stack_buffer(key, rows, work.get("stack"))
        if work.get("stack") is None or out.numel() > work["stack"].numel():
            work["stack"] = out.view(-1)
        return out

    if stack is not None:
        return [merged(pre, stack, thresholds(lambda t: stack[t]))]
    chunks = inputs.rows(key, True, max(1, chunk_bytes // 4))  # ties_kernel's work space: a few stacks
    if chunks == [None]:  # the whole (T, …) stack fits in a chunk: read once
        p, st = inputs.deltas(key, out=stack_buffer(None))
        if checks is not None:
            checks.update(st)
        return [merged(p, st, thresholds(lambda t: st[t]))]
    # each task's Δt of the key, whole, one at a time: its threshold
    e = inputs.pre.entry(key)
    p = inputs.pre.read(key, out=scratch(work, "pre", n, e.dtype).view(shape))
    check_finite({key: p}, name=f"pre-trained ({inputs.pre.name})")
    pre_c = p.to(dtype)
    probe = checks.probe() if checks is not None else None

    def delta(t: int) -> Tensor:
        d = inputs.delta(key, t, pre=pre_c, out=scratch(work, "delta", n, dtype).view(shape))
        if probe is not None:
            probe.add(t, d)
        return d

    gt = thresholds(delta)
    if probe is not None:
        probe.commit()
    del p, pre_c
    outs = []
    for rows in chunks:  # then the key again in chunks of rows: trim, elect, mean
        p, st = inputs.deltas(key, rows, check=False, out=stack_buffer(rows))
        outs.append(merged(p, st, gt))
    return outs


def _ties_global(*, inputs: DeltaReader, m, mparams, rule, alpha, pact, options, selected, report, checks, writer,
                 workers, chunk_bytes, dev: torch.device | None, out: Path) -> None:
    T = inputs.T
    # the election holds about four temporaries of a chunk's stack (ties_kernel's workspace): stacks
    # of a quarter of the budget keep the whole work space of a chunk within it
    chunk_bytes = max(1, chunk_bytes // 4)
    k = float(mparams.get("k", m.params["k"]))
    N = sum(inputs.pre.entry(key).numel for key in inputs.floats)
    sel = [key for key in inputs.floats if key in selected]
    gt = GlobalThreshold(T, trim_count(N, k), inputs.dtype, count=native_count)
    spill_dir = Path(tempfile.mkdtemp(prefix=spill_prefix(out), dir=out.parent)) if sel else None
    try:
        spill = None
        if sel:
            # pass 1 over the filtered layers: filter, count, and keep the result for the other passes
            spill_writer = CheckpointWriter(spill_dir / "filtered.safetensors",
                                            [(key, (T, *inputs.pre.shape(key)), inputs.dtype) for key in sel],
                                            metadata={})

            def job(key):
                p, stack = inputs.deltas(key)
                checks.update(stack)
                stack, res = filter_stack(key, p, stack, mode=pact, options=options, rule=rule, dev=dev)
                return stack.cpu(), (res[0] if res is not None else None)  # counted and spilled on the CPU

            def consume(key, result):
                stack, lr = result
                if lr is not None:
                    report.layers.append(lr)
                observe_stack(gt, stack)
                spill_writer.write(key, stack)

            def one_task_at_a_time(key, _):
                """The same pass on one layer without its (T, m, n) stack (one worker): each filtered
                Δ̃t is counted and appended to the spill as it comes (pact.filter_tasks)."""
                p = inputs.pre.read(key)
                check_finite({key: p}, name=f"pre-trained ({inputs.pre.name})")

                def emit(t: int, d: Tensor) -> None:
                    d = d.cpu()  # counted and spilled on the CPU
                    gt.observe(t, d)
                    spill_writer.write(key, d.unsqueeze(0))

                lr = feed_tasks(inputs, key, None, p, emit, pact=pact, options=options, rule=rule, checks=checks,
                                dev=dev)
                if lr is not None:
                    report.layers.append(lr)

            with spill_writer:
                if workers <= 1:
                    consume_in_order(lambda key: None, sel, 1, one_task_at_a_time)
                else:  # layers in parallel, each filtered on its stack
                    consume_in_order(job, sel, workers, consume)
                spill_writer.commit()
            spill = open_checkpoint(spill_dir / "filtered.safetensors", name="filtered task vectors")

        buf: list[Tensor | None] = [None]  # one chunk's (T, rows…) stack, reused by every chunk of every pass
        works: list[dict] = [{} for _ in range(T)]  # each task's counting and mask temporaries
        kwork: dict = {}  # ties_kernel's temporaries

        def run_tasks(pool, fn: Callable[[int], None]) -> None:
            """``fn(t)`` for every task: on ``pool``'s threads, or in task order here (no pool)."""
            if pool is None:
                for t in range(T):
                    fn(t)
            else:
                for _ in pool.map(fn, range(T)):  # the first error is raised
                    pass

        def chunk(key: str, rows, first: bool, pool,
                  each: Callable[[int, Tensor], None]) -> tuple[Tensor | None, Tensor]:
            """Fill the reused (T, rows…) stack with Δt (filtered or not) and call ``each(t, Δt)``
            for every task, the tasks on ``pool``'s threads (each task's read, subtraction and
            ``each`` on one thread): (θ0's rows, or None for a filtered layer; the stack)."""
            out = inputs.stack_buffer(key, rows, buf[0])
            if buf[0] is None or out.numel() > buf[0].numel():
                buf[0] = out.view(-1)
            if spill is not None and key in spill:
                st = spill.read(key, rows, dim=1, out=out)
                run_tasks(pool, lambda t: each(t, st[t]))
                return None, st
            p = inputs.pre.read(key, rows)
            if first:
                check_finite({key: p}, name=f"pre-trained ({inputs.pre.name})")
            p_c = p.to(inputs.dtype)

            def task(t: int) -> None:
                each(t, inputs.delta(key, t, rows, pre=p_c, check=first, out=out[t]))

            run_tasks(pool, task)
            if first:
                checks.update(out)
            return p, out

        def count(t: int, d: Tensor) -> None:
            gt.observe(t, d, work=works[t])

        # tasks on ``workers`` threads (their torch kernels single-threaded): every task's counts and
        # mask are its own, so the result does not depend on ``workers``
        with single_threaded(), (ThreadPoolExecutor(max_workers=min(workers, T), initializer=torch.set_num_threads,
                                                    initargs=(1,)) if workers > 1 and T > 1
                                 else contextlib.nullcontext()) as pool:
            first = True
            while not gt.done:  # the passes of the radix selection (find_thresholds' loop)
                for key in inputs.floats:
                    if first and key in selected:
                        continue  # counted in the filtering pass
                    for rows in inputs.rows(key, True, chunk_bytes):
                        chunk(key, rows, first, pool, count)
                gt.end_pass()
                first = False
            for key in inputs.pre.keys():  # the merge pass: trim in position order, elect, mean
                if key not in inputs.floats:
                    writer.write(key, inputs.pre.read(key))
                    continue
                for rows in inputs.rows(key, True, chunk_bytes):
                    p, st = chunk(key, rows, False, pool, lambda t, d: None)
                    if p is None:
                        p = inputs.pre.read(key, rows)
                    writer.write(key, apply_update(key, p, ties_chunk(gt, st, work=kwork), alpha))
                    del st, p
    finally:
        if spill_dir is not None:
            shutil.rmtree(spill_dir, ignore_errors=True)
