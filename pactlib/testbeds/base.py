"""The testbed seam: everything a chapter needs from a model family, in one file.

A *testbed* is one model family on one task list, one fine-tuning seed and one kind of
fine-tune (full or LoRA): θ0, θt per task, the matrix rule that says which keys are maps, an
evaluator, a differentiable loss model and input batches. Every chapter takes a ``testbed``
parameter (a registry name, :func:`pactlib.testbeds.load`) and talks to it only through
:class:`Testbed` and the free functions below, which are written once for every family:

    tb = testbeds.load("lite0-8", seed=0, kind="full")
    rec = run(tb, "iso_c", pact="pact", alphas=alpha_grid("iso_c", 5))  # merge, α on val, test
    rows = reference_records(tb)                                        # zero-shot, fine-tuned

Built-in families: ``lite0-*`` (:mod:`pactlib.testbeds.lite0.testbed`) and ``synthetic-*``
(:mod:`pactlib.testbeds.synthetic`, seconds-sized, for the smoke book and the tests). How to add
one: ``book/adding-a-testbed.md``.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn

from .. import merges
from ..api import merged_update
from ..matrix import MatrixRule
from ..outcomes import packed
from ..pact import PactOptions, PactReport, pact_filter
from ..taskvector import TaskVector
from .engine import ENGINE_MODULES, _CODE, code_fingerprint, engine_device, merge_sources, source_fingerprint  # noqa: F401

__all__ = ["Testbed", "run", "filtered", "reference_records", "alpha_grid", "code_fingerprint", "REFINE",
           "GRID_SPACING", "ENGINE_MODULES", "source_fingerprint", "merge_sources", "streamed_update"]


@runtime_checkable
class Testbed(Protocol):
    """One model family on one task list, seed and kind: what every chapter needs.

    Attributes:
        name: the registry name it was loaded under (e.g. ``"lite0-8"``); ``family``: its
            family (``"lite0"``), the part before the first ``-``.
        seed: fine-tuning seed of θt; ``kind``: ``"full"`` or ``"lora"``.
        tasks: task names, in the family's order.
        rule: the :class:`~pactlib.matrix.MatrixRule` that says which keys of θ0 are maps.
        pretrained: θ0, ``{key: Tensor}`` (the weights that are merged; heads are not).
        finetuned: ``{task: θt}`` with θ0's keys (LoRA: the merged ``W0 + scale·B·A``).
        ft_val, ft_test: accuracy in [0, 1] of each task's own θt on the (capped) splits:
            the normalizers of normalized accuracy. ``zs_test``: θ0's test accuracy per task.
        val_limit, test_limit: the caps on examples per task that ``evaluate`` applies
            (None: the whole split).
        cache_dir: where memoised results live (``<cache_dir>/run_memo``); None: no memo.
    """

    name: str
    family: str
    seed: int
    kind: str
    tasks: list[str]
    rule: MatrixRule
    pretrained: dict[str, Tensor]
    finetuned: dict[str, dict[str, Tensor]]
    ft_val: dict[str, float]
    ft_test: dict[str, float]
    zs_test: dict[str, float]
    val_limit: int | None
    test_limit: int | None
    cache_dir: Path | None

    def task_vectors(self) -> list[TaskVector]:
        """Δt = θt − θ0 per task, in ``tasks`` order (LoRA: exactly scale·B·A on adapted keys)."""

    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """``{task: accuracy in [0, 1]}`` of weights ``state`` (θ0's keys) on ``split``
        (``"val"`` or ``"test"``, capped), each task with its own frozen head."""

    def loss_model(self, state: Mapping[str, Tensor], task: str) -> nn.Module:
        """A fresh differentiable model: inputs -> logits (N, C) of ``task``, weights ``state``.
        ``named_parameters()`` names are keys of ``state`` (Fisher, gradients, theory); the
        task's head is frozen (a buffer). In eval mode."""

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """A batch ``(x, y)`` for :meth:`loss_model`: model-ready inputs (N, ...) and labels (N,)."""

    def fingerprint(self) -> dict | None:
        """JSON-able identity of everything an evaluation depends on besides the merge
        (checkpoint hashes, data and caps, the evaluator's code); None: results are not memoised."""


# --------------------------------------------------------------------------------------- α grid

#: Rounds of coarse-to-fine α refinement in :func:`run` (``pactlib.eval.select_alpha``'s
#: ``refine``). 0, chosen by measurement: ``book/data/alpha_search.jsonl``
#: (``bench/bench_alpha_search.py``; chapter 5, "How α is searched").
REFINE = 0

#: Spacing of the ``points``-value α grids of :func:`alpha_grid` (the chapters' ``alpha_points``):
#: ``"geometric"``, chosen by measurement (chapter 2, ``book/data/interference*.jsonl``; chapter 5,
#: ``book/data/alpha_search.jsonl``).
GRID_SPACING = "geometric"


def alpha_grid(method: str, points: int | None = None, *, lo: float | None = None, hi: float | None = None,
               spacing: str | None = None) -> tuple[float, ...]:
    """The α grid of ``method`` (book/method.md, protocol), or ``points`` values over its range.

    The one α-grid function of the book: every chapter and benchmark takes its grid here.
    ``lo``/``hi`` replace the range ends (e.g. 0.1…3.0 for every LoRA merge, book/method.md, protocol), the
    full grid then steps by 0.1. ``spacing``: ``"linear"`` or ``"geometric"`` (a constant ratio
    between neighbours); None means :data:`GRID_SPACING`. Values are rounded to 4 decimals.

    Raises:
        ValueError: ``points`` < 1, an unknown ``spacing``. UnknownMethodError: unknown method.
    """
    import numpy as np

    spacing = GRID_SPACING if spacing is None else spacing
    if spacing not in ("linear", "geometric"):
        raise ValueError(f"grid spacing must be 'linear' or 'geometric', got {spacing!r}")
    full = merges.get(method).alphas
    if lo is not None or hi is not None:
        lo, hi = lo if lo is not None else full[0], hi if hi is not None else full[-1]
        if not 0 <= lo < hi:
            raise ValueError(f"alpha grid of {method!r}: need 0 <= lo < hi, got lo={lo}, hi={hi}")
        full = merges.alpha_grid(lo, hi, (hi - lo) / max(1, int(round((hi - lo) / 0.1))))
    if points is None or points >= len(full):
        return tuple(full)
    if points < 1:
        raise ValueError(f"alpha points must be >= 1, got {points}")
    space = np.geomspace if spacing == "geometric" and full[0] > 0 else np.linspace
    return tuple(round(float(a), 4) for a in space(full[0], full[-1], points))


# -------------------------------------------------------------------------------- memoisation

def _memo_key(tb: Testbed, payload: dict) -> str | None:
    ident = tb.fingerprint()
    if ident is None or tb.cache_dir is None:
        return None
    full = dict(payload, testbed=ident, name=tb.name, seed=tb.seed, kind=tb.kind, tasks=list(tb.tasks),
                rule=repr(tb.rule), code=code_fingerprint(ENGINE_MODULES))
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=repr).encode()).hexdigest()[:40]


def _memo_path(tb: Testbed, key: str) -> Path:
    return Path(tb.cache_dir) / "run_memo" / f"{key}.json"


def _memo_read(tb: Testbed, key: str) -> dict | None:
    try:
        rec = json.loads(_memo_path(tb, key).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "metrics" in rec else None


def _memo_write(tb: Testbed, key: str, rec: dict) -> None:
    from ..io import write_atomic

    path = _memo_path(tb, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(rec, default=float)
    write_atomic(path, text)


# ------------------------------------------------------------------------- merge, α, records

def _cache(tb: Testbed) -> dict:
    return tb.__dict__.setdefault("_seam_cache", {})


def own_task_vectors(tb: Testbed) -> list[TaskVector]:
    """:meth:`Testbed.task_vectors`, computed once per testbed object."""
    c = _cache(tb)
    if "tvs" not in c:
        c["tvs"] = list(tb.task_vectors())
    return list(c["tvs"])


def _to(tvs: Sequence[TaskVector], device) -> list[TaskVector]:
    out = [tv.map(lambda k, v: v.to(device)) for tv in tvs]
    for a, b in zip(tvs, out):  # the same task vectors elsewhere: merged in the same order (pactlib.order)
        place = getattr(a, "_place", None)
        if place is not None:
            b._place = place
    return out


def _engine_pretrained(tb: Testbed) -> dict[str, Tensor]:
    """θ0 on :func:`engine_device`, moved there once."""
    dev = engine_device(tb)
    if dev is None:
        return tb.pretrained
    c = _cache(tb)
    if "pre_on_device" not in c:
        c["pre_on_device"] = {k: v.to(dev) for k, v in tb.pretrained.items()}
    return c["pre_on_device"]


def _engine_task_vectors(tb: Testbed) -> list[TaskVector]:
    """The testbed's own task vectors on :func:`engine_device`, moved there once."""
    dev = engine_device(tb)
    if dev is None:
        return own_task_vectors(tb)
    c = _cache(tb)
    if "tvs_on_device" not in c:
        c["tvs_on_device"] = _to(own_task_vectors(tb), dev)
    return list(c["tvs_on_device"])


def _filtered(tb: Testbed, mode: str, options: PactOptions | None) -> tuple[list[TaskVector], PactReport]:
    options = options or PactOptions()
    c = _cache(tb).setdefault("filtered", {})
    if (mode, options) not in c:
        if merge_sources(tb) is not None:  # filtered layers on disk, read on access; moved only for a device
            tvs, report = filtered(tb, mode, options)
            dev = engine_device(tb)
            c[mode, options] = (tvs if dev is None else _to(tvs, dev)), report
        else:
            c[mode, options] = pact_filter(_engine_pretrained(tb), _engine_task_vectors(tb), mode=mode,
                                           options=options, rule=tb.rule)
    return c[mode, options]


def filtered(tb: Testbed, mode: str, options: PactOptions | None = None, *,
             keep: bool = False) -> tuple[list[TaskVector], PactReport]:
    """(PACT/S-PACT-filtered task vectors, :class:`~pactlib.pact.PactReport`) of ``tb``'s own task
    vectors for ``mode`` (``"pact"``, ``"s-pact"``) and ``options``; computed once per testbed, on
    :func:`engine_device` (the task vectors returned are on the CPU). ``keep``: the report also
    holds every filtered layer's subspaces and shields (``pact_filter(..., keep=True)``).

    A testbed with :func:`merge_sources` (``clip``) gets read-only
    :class:`~pactlib.testbeds.lazy_vectors.LazyTaskVector` objects instead of T in-memory task
    vectors: the filtered layers are computed once, layer by layer, and kept in a file of
    ``<tb.cache_dir>/filtered`` keyed by the inputs' content, mode and options (reused by later
    calls, processes and :func:`run`'s PACT merges), each access reading one layer of one task
    (:func:`pactlib.testbeds.lazy_vectors.filtered_task_vectors`); the values are the in-memory
    ones, bit for bit.

    Raises:
        ValueError: an unknown mode. CheckpointError: mismatched or non-finite checkpoints.
    """
    sources = merge_sources(tb)
    if sources is not None:
        from .lazy_vectors import filtered_task_vectors

        options = options or PactOptions()
        c = _cache(tb).setdefault("filtered_lazy", {})
        if (mode, options, keep) not in c:
            tvs, report = filtered_task_vectors(tb, mode, options, keep=keep, sources=sources)
            c[mode, options, keep] = (tvs, report)
            if tvs and not any(v.dtype == torch.float64 for v in tb.pretrained.values()):
                # the same (T, ...) float32 stacks streamed_update spills: its PACT merges read them too
                _cache(tb).setdefault("filtered_spill", {}).setdefault((mode, options), (tvs[0]._d._layers, report))
        tvs, report = c[mode, options, keep]
        return list(tvs), report
    if keep:
        options = options or PactOptions()
        c = _cache(tb).setdefault("filtered_keep", {})
        if (mode, options) not in c:
            c[mode, options] = pact_filter(_engine_pretrained(tb), _engine_task_vectors(tb), mode=mode,
                                           options=options, rule=tb.rule, keep=True)
        tvs, report = c[mode, options]
    else:
        tvs, report = _filtered(tb, mode, options)
    return (tvs if engine_device(tb) is None else _to(tvs, "cpu")), report


def streamed_update(tb: Testbed, method: str, *, pact: str | None = None, options: PactOptions | None = None,
                    sources=None, **params: Any) -> tuple[TaskVector, PactReport | None] | None:
    """The merged update D of ``method`` over ``tb``'s own task vectors (optionally PACT/S-PACT
    filtered), computed one key at a time from :func:`merge_sources` as the streamed ``pact merge``
    computes it (:mod:`pactlib.streaming`: its reader of θ0 and θt, the per-layer filter
    :func:`pactlib.pact.filter_layer` and the method on one key; layers on torch's thread count,
    each kernel single-threaded), on :func:`engine_device`. Equal to the in-memory
    ``merged_update(method, tb.pretrained, filtered or own task vectors)``, bit for bit (the same
    kernels on the same values); peak memory about D (one tower in float32) plus one layer's
    (T, m, n) stack per thread (a few copies of one layer for Task Arithmetic, TSV-M and Iso-C,
    which read one task at a time into their reducer, :func:`pactlib.streaming.reduced_update`), instead of T task vectors (and T filtered ones). With PACT the
    filtered layers come from the filtered-layer cache of :func:`filtered` (``<tb.cache_dir>/filtered``,
    T × the filtered layers' size on disk, written once per inputs, mode and options and read by
    later calls and processes), so no base method filters again. The filter runs inside the merge
    instead, every call, when ``sources`` are not the testbed's own or the disk has less than twice
    the filtered layers' size free; θ0 with float64 entries spills its float64 filtered layers to a
    temporary file under ``tb.cache_dir`` (removed with the testbed object).

    TIES with ``scope="global"`` (M2; its trim threshold ranks each task's entries over its whole
    task vector) is streamed too: :class:`pactlib.merges.ties.GlobalThreshold` finds every task's
    exact ``k``%-th largest |Δt| and how many entries tied with it are kept by radix selection in
    two passes over the keys (four for float64; chunks of :data:`pactlib.streaming.CHUNK_BYTES`,
    65,536 counters per task; :func:`pactlib.streaming.find_thresholds`), then a last pass trims each chunk in the in-memory position order
    (θ0's keys in ``tb.pretrained``'s order, ties kept first by position, as
    :func:`pactlib.merges.ties.trim_mask` on the concatenated task vector), elects and averages.
    With PACT the filtered layers are read back from the file above (filtered again in every pass
    when the disk had no room for it).

    Returns:
        ``(D, PACT report or None)``, D over θ0's floating keys (float32, or float64 when θ0 has
        float64 entries) on :func:`engine_device`; None when ``tb`` offers no sources or the method
        has no key-by-key form (the caller merges in memory).

    Raises:
        UnknownMethodError, TypeError, ValueError: as :func:`pactlib.api.merged_update` (TIES'
            ``k`` outside (0, 100] or an unknown ``scope`` before any key is read).
        CheckpointError: a key or shape mismatch, NaN / Inf in a checkpoint (file and key named).
    """
    import warnings

    from ..matrix import split_attention_note
    from ..pact import MODES, select_layers, warn_if_unchanged
    from ..order import reorder_report
    from ..streaming import DeltaReader, check_method_values, delta_order

    m = merges.get(method)
    if pact is not None and pact not in MODES:
        raise ValueError(f"unknown pact mode {pact!r}; use None or one of {MODES}")
    per_key = m.is_per_key(params)
    if not per_key and m.name != "ties":
        return None
    own = sources is None  # tb's own files: the filtered-layer cache applies
    sources = merge_sources(tb) if own else sources
    if sources is None:
        return None
    from ..api import check_method_params

    check_method_params(method, params)
    pre, fts = sources
    inputs = DeltaReader(pre, fts, list(tb.tasks))
    perm = delta_order(inputs)  # merged in the content order (pactlib.order), as merged_update merges
    if perm != sorted(perm):
        inputs = DeltaReader(pre, [fts[t] for t in perm], [tb.tasks[t] for t in perm], user=perm)
    check_method_values(m, tb.rule, params, inputs.dtype)
    note = split_attention_note(inputs.meta.keys(), where=f"{method}: ")
    if note:
        warnings.warn(note, UserWarning, stacklevel=3)
    report, selected, matrix_keys = None, set(), []
    if pact is not None:
        options = options or PactOptions()
        report = PactReport(pact, options)
        matrix_keys, sel = select_layers({k: inputs.meta[k] for k in inputs.floats}, mode=pact, options=options,
                                         rule=tb.rule, stacklevel=3)
        selected = set(sel)
    spills = _cache(tb).setdefault("filtered_spill", {})
    spilled = spills.get((pact, options)) if pact is not None else None  # (LazyCheckpoint, report)
    writer = None
    if pact is not None and spilled is None:
        entries = [(k, (inputs.T, *inputs.pre.shape(k)), inputs.dtype) for k in inputs.floats if k in selected]
        if own and inputs.dtype == torch.float32 and _room(tb, entries):
            filtered(tb, pact, options)  # the filtered-layer cache <cache_dir>/filtered, kept across processes
            spilled = spills.get((pact, options))
        elif inputs.dtype == torch.float64:  # the cache holds float32 layers: a spill of our own
            writer = _spill_writer(tb, entries)
    args = dict(tb=tb, inputs=inputs, m=m, params=params, pact=pact, options=options, selected=selected,
                report=report, spilled=spilled, writer=writer, dev=engine_device(tb), perm=perm)
    D = _streamed_per_key(**args) if per_key else _streamed_ties_global(**args)
    if writer is not None:
        from ..lazy import open_checkpoint

        spills[pact, options] = (open_checkpoint(writer.path, name=f"{pact}-filtered task vectors"), report)
    if spilled is not None:
        return TaskVector._wrap(D), spilled[1]  # in the tasks' order already
    if report is not None:
        warn_if_unchanged(report, matrix_keys, sorted(selected), stacklevel=3)
    return TaskVector._wrap(D), reorder_report(report, perm)


def _filter_job(tb: Testbed, inputs, pact: str, options: PactOptions, dev):
    """One selected layer's PACT/S-PACT-filtered (T, m, n) stack (on ``dev``) and its layer report,
    by the filtered-layer cache's kernel (:func:`pactlib.pact.filter_stack`)."""
    from ..pact import filter_stack

    def job(key: str):
        p, stack = inputs.deltas(key)
        stack, res = filter_stack(key, p, stack, mode=pact, options=options, rule=tb.rule, dev=dev)
        return stack, (res[0] if res is not None else None)

    return job


def _streamed_per_key(*, tb, inputs, m, params, pact, options, selected, report, spilled, writer, dev,
                      perm) -> dict:
    """D of a per-key method, key by key (:func:`streamed_update`)."""
    from contextlib import nullcontext

    from ..order import in_user_order
    from ..streaming import CHUNK_BYTES, consume_in_order, reduced_update

    T, names = inputs.T, inputs.names
    inv = in_user_order(list(range(T)), perm)  # a task's row in the merge's order
    filt = _filter_job(tb, inputs, pact, options, dev) if pact is not None else None
    reduced = m.reducer is not None

    def job(key: str):
        parts, lr, keep = [], None, None
        for rows in inputs.rows(key, m.elementwise and key not in selected, CHUNK_BYTES):
            if reduced and (key not in selected or spilled is not None or writer is None):
                # tasks read one at a time into the method's reducer (from the filtered-layer cache,
                # or filtered as they come): no (T, m, n) stack
                cached = spilled is not None and key in selected
                # the spill's rows are in the tasks' order, task t of the merge is task perm[t]
                read = (lambda t, first: spilled[0].read(key, (perm[t], perm[t] + 1))[0].clone()) if cached else None
                D, lr_ = reduced_update(inputs, key, rows, None if cached else inputs.pre.read(key, rows), m=m,
                                        params=params, rule=tb.rule,
                                        pact=pact if key in selected and not cached else None,
                                        options=options, read=read, dev=dev)
                lr = lr_ if lr_ is not None else lr
                parts.append(D)
                continue
            if spilled is not None and key in selected:  # filtered by an earlier run: read it back
                stack = spilled[0].read(key)[perm]  # the spill's rows in the merge's order
                stack = stack if dev is None else stack.to(dev)
            elif key in selected:
                stack, lr = filt(key)
                keep = stack[inv] if writer is not None else None  # the spill in the tasks' order
            else:
                _, stack = inputs.deltas(key, rows)
                stack = stack if dev is None else stack.to(dev)
            views = [stack[t] for t in range(T)]  # rows of the stack: map_layers uses it without a copy
            parts.append(m([TaskVector._wrap({key: v}, nm) for v, nm in zip(views, names)], rule=tb.rule,
                           **params)[key])
            del views, stack
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), lr, keep

    D: dict[str, Tensor] = {}

    def consume(key: str, result) -> None:
        D[key], lr, keep = result
        if lr is not None:
            report.layers.append(lr)
        if keep is not None:
            writer.write(key, keep)

    with writer if writer is not None else nullcontext():  # a failed run leaves no spill file
        consume_in_order(job, inputs.floats, max(1, torch.get_num_threads()), consume)
        if writer is not None:
            writer.commit()
    return D


def _streamed_ties_global(*, tb, inputs, m, params, pact, options, selected, report, spilled, writer, dev,
                          perm) -> dict:
    """D of TIES with ``scope="global"`` (M2) in passes over the keys (:func:`streamed_update`)."""
    from contextlib import nullcontext

    from ..lazy import open_checkpoint
    from ..merges.ties import GlobalThreshold, ties_kernel, trim_count
    from ..order import in_user_order
    from ..streaming import (CHUNK_BYTES, consume_in_order, find_thresholds, native_count, observe_stack, ties_chunk,
                             trim_stack)

    T = inputs.T
    inv = in_user_order(list(range(T)), perm)  # a task's row in the merge's order
    k = float(params.get("k", m.params["k"]))
    floats = set(inputs.floats)
    order = [key for key in tb.pretrained if key in floats]  # the in-memory task vectors' key order
    if len(order) != len(floats):
        order = list(inputs.floats)
    gt = GlobalThreshold(T, trim_count(sum(inputs.pre.entry(key).numel for key in order), k), inputs.dtype,
                         count=native_count)
    spill = spilled[0] if spilled is not None else None
    counted: set[str] = set()  # filtered layers counted in the filtering pass
    if pact is not None and spilled is None and selected:
        filt = _filter_job(tb, inputs, pact, options, dev)

        def consume(key: str, result) -> None:
            stack, lr = result
            if lr is not None:
                report.layers.append(lr)
            observe_stack(gt, stack)
            counted.add(key)
            if writer is not None:
                writer.write(key, stack[inv])  # the spill in the tasks' order

        with writer if writer is not None else nullcontext():  # a failed run leaves no spill file
            consume_in_order(filt, [key for key in inputs.floats if key in selected], max(1, torch.get_num_threads()),
                             consume)
            if writer is not None:
                writer.commit()
        if writer is not None:
            spill = open_checkpoint(writer.path, name=f"{pact}-filtered task vectors")
    refilter = _filter_job(tb, inputs, pact, options, dev) if pact is not None and spill is None else None

    def chunks(key: str, first: bool):
        """The (T, rows, …) stacks of Δt (filtered when ``key`` is selected) covering ``key``, in order, on the CPU."""
        if key in selected and spill is not None:
            for rows in inputs.rows(key, True, CHUNK_BYTES):
                yield spill.read(key, rows, dim=1)[perm]  # the spill's rows in the merge's order
        elif key in selected:  # no room on disk for the filtered layers: filter again
            with torch.no_grad():
                yield refilter(key)[0].cpu()
        else:
            for rows in inputs.rows(key, True, CHUNK_BYTES):
                yield inputs.deltas(key, rows, check=first)[1]

    def passes(first: bool):
        for key in order:
            if not (first and key in counted):
                yield from chunks(key, first and key not in selected)

    find_thresholds(gt, passes)
    D: dict[str, Tensor] = {}
    for key in order:  # the merge pass: trim in position order, elect, disjoint mean
        parts = []
        for st in chunks(key, False):
            if dev is None:
                parts.append(ties_chunk(gt, st))  # = flat * mask in memory, then M2
            else:
                parts.append(ties_kernel(trim_stack(gt, st).to(dev)))
            del st
        D[key] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return D


def _spill_root(tb: Testbed) -> Path:
    """``tb.cache_dir``, else the system's temporary folder: where filtered layers are kept."""
    import tempfile

    return Path(tb.cache_dir) if getattr(tb, "cache_dir", None) is not None else Path(tempfile.gettempdir())


def _room(tb: Testbed, entries: list) -> bool:
    """Whether the disk under :func:`_spill_root` has at least twice the size of ``entries`` (key,
    shape, dtype) free: room for the filtered layers."""
    import shutil

    from ..safetensors_io import tensor_bytes

    need = sum(tensor_bytes(shape, dtype) for _, shape, dtype in entries)
    root = _spill_root(tb)
    try:
        root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(root).free >= 2 * need
    except OSError:
        return False


def _spill_writer(tb: Testbed, entries: list):
    """A :class:`pactlib.lazy.CheckpointWriter` for the PACT-filtered (T, …) float64 stacks of the
    selected layers (θ0 with float64 entries, which the float32 filtered-layer cache does not
    hold), in a temporary folder under ``tb.cache_dir`` (else the system's) removed with the testbed
    object, so that later runs with the same PACT mode and options read the filtered layers instead
    of filtering again; None when there is no layer or no :func:`_room` (each run then filters again)."""
    import shutil
    import tempfile
    import weakref

    from ..lazy import CheckpointWriter

    if not entries or not _room(tb, entries):
        return None
    try:
        folder = Path(tempfile.mkdtemp(prefix=".filtered-spill-", dir=_spill_root(tb)))
    except OSError:
        return None
    try:
        weakref.finalize(tb, shutil.rmtree, str(folder), True)
    except TypeError:  # a testbed object without weak references: no spill
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return CheckpointWriter(folder / "filtered.safetensors", entries, metadata={})


def run(tb: Testbed, method: str, *, pact: str | None = None, options: PactOptions | None = None,
        alphas: Sequence[float] | None = None, label: str | None = None,
        task_vectors: Sequence[TaskVector] | None = None, widen: int = 3, refine: int = REFINE,
        memo: bool = True, **params: Any) -> dict:
    """Merge (optionally PACT/S-PACT-filtered), choose α on validation, test: one record.

    The merge and the PACT filter run on :func:`engine_device` (the testbed's ``device``, e.g.
    CUDA), and so do the merged states handed to ``tb.evaluate``. A testbed that offers its
    checkpoint files (:func:`merge_sources`) is merged key by key (:func:`streamed_update`: the
    same D, in memory independent of the number of tasks; the PACT-filtered layers read from the
    filtered-layer cache on disk, filtered once for every base method, chapter and process; TIES
    with ``scope="global"`` in passes over the keys); others merge their task vectors in memory.

    Args:
        tb: the testbed. ``method``: a name of :func:`pactlib.merges.names`; ``params`` go to it.
        pact: None, ``"pact"`` or ``"s-pact"``; ``options``: its :class:`PactOptions`.
        alphas: the α grid (default :func:`alpha_grid` of ``method``).
        label: the record's method name (default ``"<pact>-<method>"`` or ``method``).
        task_vectors: merge these instead of the testbed's own (never memoised).
        widen: when the best α sits on an edge of the grid, up to this many more α values are
            tried beyond it (×1.5 each; book/method.md, protocol); the record lists them in ``widened``.
        refine: rounds of coarse-to-fine search around the best α (:func:`pactlib.eval.select_alpha`).
        memo: keep the record in ``<tb.cache_dir>/run_memo/<key>.json`` (written atomically) and
            reuse it when the same merge is asked again (another chapter, an interrupted run).
            The key holds every input: ``tb.fingerprint()``, the testbed's name, seed, kind,
            tasks and matrix rule, method, PACT mode and options, α grid, ``widen``, ``refine``, label, merge
            parameters and :func:`code_fingerprint` of :data:`ENGINE_MODULES`.

    Returns:
        The record of :func:`pactlib.eval.select_alpha` (test ``acc``/``norm_acc`` at the α that is
        best on validation, the curve, per-task values) with ``testbed``, ``suite`` (the part of
        the name after the family), ``kind``, ``base`` (method), ``pact``, the PACT options, the
        cap-binding rate, the mean removed energy, ``merge_seconds`` and ``seconds`` (of the run
        that computed it); a record read back from the memo also has ``memo_hit: True``.

    Raises:
        UnknownMethodError: unknown ``method``. ValueError: a bad mode or parameter.
    """
    from ..eval import select_alpha

    t0 = time.perf_counter()
    opts = (options or PactOptions()) if pact else None
    alphas = tuple(alphas or alpha_grid(method))
    own = task_vectors is None
    key = None
    if memo and own:
        key = _memo_key(tb, dict(method=method, pact=pact, options=vars(opts) if opts else None,
                                 alphas=[float(a) for a in alphas], label=label, widen=widen, refine=refine,
                                 params=params))
        hit = _memo_read(tb, key) if key else None
        if hit is not None:
            return dict(hit, memo_hit=True)
    pre = _engine_pretrained(tb)
    streamed = streamed_update(tb, method, pact=pact, options=opts, **params) if own else None
    if streamed is not None:  # key by key from the testbed's files: memory independent of T
        D, report = streamed
    elif own and pact:  # the filter does not depend on the base method: reuse it
        tvs, report = _filtered(tb, pact, opts)
        D, _ = merged_update(method, pre, tvs, rule=tb.rule, **params)
    else:
        dev = engine_device(tb)
        tvs = _engine_task_vectors(tb) if own else list(task_vectors) if dev is None else _to(task_vectors, dev)
        D, report = merged_update(method, pre, tvs, pact=pact, options=opts, rule=tb.rule, **params)
    t_merge = time.perf_counter() - t0
    name = label or (f"{pact}-{method}" if pact else method)
    splits = {"val": {t: "val" for t in tb.tasks}, "test": {t: "test" for t in tb.tasks}}

    def evaluate_fn(state, datas, *, limit=None):  # datas: {task: split name}
        return tb.evaluate(state, next(iter(datas.values())), list(datas))

    energies = [e for lr in report.layers for e in lr.removed_energy] if report and report.layers else []
    rec = select_alpha(
        lambda a: D.apply_to(pre, a), alphas, evaluate_fn=evaluate_fn, val=splits["val"],
        test=splits["test"], ft_val=tb.ft_val, ft_test=tb.ft_test, method=name, widen=widen, refine=refine,
        limit=tb.val_limit, params={**params, **(dict(vars(opts)) if opts else {})}, seed=tb.seed,
        testbed=tb.name, suite=suite_of(tb), kind=tb.kind, base=method, pact=pact,
        cap_binding_rate=report.cap_binding_rate() if report else None, merge_seconds=t_merge,
        removed_energy=float(torch.tensor(energies, dtype=torch.float64).nanmean()) if energies else None,
        seconds=None)
    rec["seconds"] = time.perf_counter() - t0
    if key is not None:
        _memo_write(tb, key, rec)
    return rec


def suite_of(tb: "Testbed | str") -> str:
    """The records' label of a testbed's task list: its name after the family (``"lite0-8"`` ->
    ``"8"``, ``"synthetic-3"`` -> ``"3"``), or the whole name when it has no ``-``."""
    name = tb if isinstance(tb, str) else tb.name
    family, sep, rest = name.partition("-")
    return rest if sep else name


def reference_records(tb: Testbed, *, params: Mapping | None = None, per_task: bool = False, **fields) -> list[dict]:
    """The two reference rows of a results table, as records on ``tb``'s test split:
    ``"zero-shot"`` (θ0 with each task's head) and ``"fine-tuned"`` (each task's own θt).

    Metrics: ``acc`` (mean test accuracy over the tasks) and ``norm_acc`` (mean of acc/acc_ft;
    1 for the fine-tuned row by definition, book/method.md, protocol); ``per_task`` adds ``norm_acc:<task>``.
    Each record has ``seed``, ``testbed``, ``suite``, ``base`` (= its method), ``outcomes``
    (``{"test": {task: packed}}``, when the testbed's ``zs_test`` / ``ft_test`` are
    :class:`~pactlib.outcomes.Scores`) and the extra ``fields``; ``params`` defaults to ``{}``.
    """
    from ..book.records import make_record

    out = []
    for name, accs in (("zero-shot", tb.zs_test), ("fine-tuned", tb.ft_test)):
        norm = {t: 1.0 if name == "fine-tuned" else accs[t] / tb.ft_test[t] for t in tb.tasks}
        metrics = {"acc": sum(accs[t] for t in tb.tasks) / len(tb.tasks), "norm_acc": sum(norm.values()) / len(tb.tasks)}
        if per_task:
            metrics.update({f"norm_acc:{t}": v for t, v in norm.items()})
        outcomes = packed({t: accs[t] for t in tb.tasks} if not hasattr(accs, "outcomes") else accs)
        out.append(make_record(name, params=dict(params or {}), seed=tb.seed, metrics=metrics,
                               **({"outcomes": {"test": outcomes}} if outcomes else {}),
                               **{"testbed": tb.name, "suite": suite_of(tb), "base": name, **fields}))
    return out


# ------------------------------------------------------------------------------- loss models

def with_frozen_head(features: nn.Module, weight: Tensor, bias: Tensor | None = None, *,
                     normalize: bool = False) -> nn.Module:
    """Turn a feature extractor ``x -> (N, d)`` into a classifier ``x -> logits (N, C)`` *in place*,
    keeping its parameter names (the state-dict keys): the head ``weight`` (C, d) and ``bias`` (C,)
    become buffers ``head_weight``/``head_bias``, so they are frozen and not parameters.
    ``normalize``: L2-normalise the features first (a cosine head). Returns ``features``, in eval mode.

    Raises:
        ValueError: ``weight`` is not 2-D or ``bias`` does not have C entries.
    """
    if weight.ndim != 2 or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"with_frozen_head: weight must be (C, d) and bias (C,), got {tuple(weight.shape)} and "
                         f"{None if bias is None else tuple(bias.shape)}")
    base = type(features)

    def forward(self, *args, **kwargs):
        f = base.forward(self, *args, **kwargs)
        if self.head_normalize:
            f = nn.functional.normalize(f, dim=1)
        return nn.functional.linear(f, self.head_weight, self.head_bias)

    features.__class__ = type(f"{base.__name__}WithHead", (base,), {"forward": forward})
    features.register_buffer("head_weight", weight.detach().clone())
    features.register_buffer("head_bias", None if bias is None else bias.detach().clone())
    features.head_normalize = bool(normalize)
    return features.eval()
