"""Task vectors read on demand, and PACT-filtered task vectors cached on disk, for testbeds whose
checkpoints are files (those with ``merge_sources``, :func:`pactlib.testbeds.base.merge_sources`:
the ``clip`` family).

The book's chapters hold task vectors: ``tb.task_vectors()`` and
:func:`pactlib.testbeds.filtered` return T of them. In memory that is T × the model in float32
(1.22 GB per task for a ViT-L/14 vision tower). Here they are :class:`LazyTaskVector` objects:
read-only :class:`pactlib.taskvector.TaskVector` whose entries are computed when asked for,
``Δt[key] = θt[key] − θ0[key]`` in float32 from the memory-mapped fine-tuned file (or a LoRA
adapter's ``delta(key)``), and nothing is held between accesses. Code that works key by key over
T task vectors (the merges' ``map_layers``, :func:`pactlib.book.experiments.subspace.subspaces_by_layer`,
a loop over keys) then holds one layer × T, whatever T; arithmetic (``+``, ``*``, ``map``,
``to_dict``) still works and returns ordinary, in-memory task vectors.

:func:`filtered_task_vectors` is PACT / S-PACT over those task vectors, layer by layer
(:func:`pactlib.pact.filter_layer`, as :func:`pactlib.pact.pact_filter` calls it), with every
filtered layer's (T, …) stack written once to a safetensors file in ``<tb.cache_dir>/filtered``
(atomically, :class:`pactlib.lazy.CheckpointWriter`) and the report beside it; the task vectors
returned read task t's row of a filtered layer from that file, and every other key through to
Δt. The file is keyed by the inputs' content (the converted checkpoint files' names, sizes and
times, which carry the checkpoints' sha256), the mode, the options, the matrix rule, the device
kind and the engine's code fingerprint, so a later process (another chapter) reads it instead of
filtering again. The values equal ``pact_filter(tb.pretrained, in-memory task vectors, ...)`` bit
for bit (the same kernels on the same values).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..checks import CheckpointError, check_compatible, check_finite
from ..pact import PactOptions, PactReport
from ..taskvector import TaskVector

__all__ = ["LazyTaskVector", "lazy_task_vectors", "filtered_task_vectors", "overlay", "is_lazy", "cache_key",
           "FILTER_CACHE_VERSION"]

#: Bump when the filtered-layer cache's layout or meaning changes.
FILTER_CACHE_VERSION = "v1"


def _meta(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta") for k, v in sd.items()}


class _Deltas(Mapping):
    """``{key: Δt[key]}`` over θ0's floating keys, each computed when asked for (a fresh tensor)."""

    def __init__(self, pretrained: Mapping[str, Tensor], source, keys: Sequence[str], name: str,
                 dtype: torch.dtype = torch.float32):
        self._pre, self._src, self._keys, self._name, self.dtype = pretrained, source, list(keys), name, dtype
        self._set = frozenset(self._keys)
        self._is_delta = callable(getattr(source, "check", None)) and callable(getattr(source, "delta", None))

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._set:
            raise KeyError(key)
        p = self._pre[key]
        if self._is_delta:  # a LoRA adapter: Δt itself (None: no update on this key)
            d = self._src.delta(key)
            return torch.zeros(p.shape, dtype=self.dtype) if d is None else d.detach().to(self.dtype, copy=True)
        x = self._src.read(key)
        check_finite({key: x}, name=self._name)
        return x.to(self.dtype) - p.to(self.dtype)  # as TaskVector.from_checkpoints computes it

    def __contains__(self, key) -> bool:
        return key in self._set

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class _Filtered(Mapping):
    """Task t's filtered task vector: the filtered layers read from the cache file, the rest Δt."""

    def __init__(self, raw: "LazyTaskVector", layers, t: int):
        self._raw, self._layers, self._t, self.dtype = raw, layers, t, raw.dtype

    def __getitem__(self, key: str) -> Tensor:
        if key in self._layers:
            return self._layers.read(key, (self._t, self._t + 1))[0].clone()
        return self._raw[key]

    def __contains__(self, key) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


class LazyTaskVector(TaskVector):
    """A read-only :class:`~pactlib.taskvector.TaskVector` whose entries are computed on access.

    ``tv[key]`` is a fresh float32 tensor of the key's stored shape (the caller may modify it;
    the task vector is not changed); nothing is cached between accesses, so reading a key twice
    reads the file twice. Iteration, ``len`` and ``in`` need no data. Arithmetic, ``map``,
    ``to_dict`` and ``norm`` read every key and return / compute in-memory results, as for any
    task vector. Build them with :func:`lazy_task_vectors` or :func:`filtered_task_vectors`.

    Raises (on access):
        KeyError: a key that is not one of θ0's floating keys.
        CheckpointError: NaN / Inf in the fine-tuned entry (file and key named), an unreadable file.
    """

    __slots__ = ()

    def __init__(self, entries: Mapping[str, Tensor], *, name: str | None = None):
        self._d = entries
        self.name = name

    @property
    def dtype(self) -> torch.dtype:
        return getattr(self._d, "dtype", torch.float32)

    def __repr__(self) -> str:
        return f"LazyTaskVector(name={self.name!r}, keys={len(self)}, read on access)"

    def materialize(self) -> TaskVector:
        """An in-memory :class:`~pactlib.taskvector.TaskVector` with the same entries (every key read)."""
        return TaskVector._wrap({k: self._d[k] for k in self._d}, self.name)


class _Overlay(Mapping):
    """``top[key]`` for the keys of ``over``, ``base[key]`` for the others (both read on access)."""

    def __init__(self, base: Mapping[str, Tensor], top: Mapping[str, Tensor], over: Sequence[str]):
        self._base, self._top, self._over = base, top, frozenset(over)
        self.dtype = getattr(base, "dtype", torch.float32)

    def __getitem__(self, key: str) -> Tensor:
        return (self._top if key in self._over else self._base)[key]

    def __contains__(self, key) -> bool:
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)


def overlay(raw: Sequence[TaskVector], filtered: Sequence[TaskVector], keys: Sequence[str]) -> list[LazyTaskVector]:
    """Per task a :class:`LazyTaskVector` reading ``filtered[t][key]`` for ``keys`` and
    ``raw[t][key]`` for every other key (nothing copied or held).

    Raises:
        ValueError: different task counts. KeyError: a key of ``keys`` missing from a task vector.
    """
    if len(raw) != len(filtered):
        raise ValueError(f"overlay: {len(raw)} raw vs {len(filtered)} filtered task vectors")
    out = []
    for r, f in zip(raw, filtered):
        missing = [k for k in keys if k not in r or k not in f]
        if missing:
            raise KeyError(f"overlay: key(s) {missing[:3]} missing from task vector {r.name!r}")
        out.append(LazyTaskVector(_Overlay(r, f, keys), name=r.name))
    return out


def is_lazy(task_vectors: Sequence[TaskVector]) -> bool:
    """Whether any of ``task_vectors`` is a :class:`LazyTaskVector`."""
    return any(isinstance(tv, LazyTaskVector) for tv in task_vectors)


def lazy_task_vectors(pretrained: Mapping[str, Tensor], sources: Sequence, names: Sequence[str]
                      ) -> list[LazyTaskVector]:
    """Δt = θt − θ0 per task as :class:`LazyTaskVector` (float32), over ``pretrained``'s floating
    keys in its order: the values ``TaskVector.from_checkpoints(pretrained, θt)`` holds, bit for bit.

    Args:
        pretrained: θ0, ``{key: Tensor}`` (in memory; its values are subtracted).
        sources: per task a :class:`pactlib.lazy.LazyCheckpoint` of θt (θ0's keys and shapes) or a
            task-vector source with ``check(meta)`` and ``delta(key)`` (e.g.
            :class:`pactlib.peft.AdapterSource`): what ``tb.merge_sources()[1]`` gives.
        names: task names (messages, ``tv.name``).

    Raises:
        ValueError: ``sources`` and ``names`` differ in length.
        CheckpointError: a θt's keys or shapes differ from θ0's, a source refuses θ0, NaN / Inf in
            θ0 (checked here; θt's entries are checked as they are read).
    """
    if len(sources) != len(names):
        raise ValueError(f"lazy_task_vectors: {len(sources)} sources for {len(names)} names")
    meta = _meta(pretrained)
    for src, nm in zip(sources, names):
        if callable(getattr(src, "check", None)) and callable(getattr(src, "delta", None)):
            src.check(meta)
        else:
            check_compatible(meta, src.meta(), name=str(nm))
    check_finite(pretrained, name="pre-trained")
    keys = [k for k, v in pretrained.items() if torch.is_floating_point(v)]
    return [LazyTaskVector(_Deltas(pretrained, src, keys, name=getattr(src, "name", str(nm))), name=nm)
            for src, nm in zip(sources, names)]


# ------------------------------------------------------------------------------ filtered, on disk

def _source_identity(src) -> list:
    files = getattr(src, "files", None)
    paths = list(files) if files is not None else [getattr(src, "path", None)]
    out = []
    for p in paths:
        if p is None:
            out.append(repr(src))
            continue
        p = Path(p)
        try:
            st = p.stat()
            out.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
        except OSError:
            out.append(str(p))
        if p.is_dir():  # an adapter folder: its files
            out += [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.rglob("*")) if f.is_file()]
    return out


def cache_key(tb, mode: str, options: PactOptions, sources) -> str:
    """The filtered-layer cache's key of ``tb``'s task vectors under ``mode`` and ``options``: sha256
    (40 hex digits) of the inputs' identities (file path, size and mtime of θ0's and every θt's
    converted file or adapter), the task names, the kind, the matrix rule, the mode, the options,
    the device kind, :data:`FILTER_CACHE_VERSION` and the engine's code fingerprint."""
    from .base import ENGINE_MODULES, code_fingerprint, engine_device

    pre, fts = sources
    dev = engine_device(tb)
    payload = dict(version=FILTER_CACHE_VERSION, pre=_source_identity(pre), fts=[_source_identity(s) for s in fts],
                   tasks=list(tb.tasks), kind=getattr(tb, "kind", None), rule=repr(tb.rule), mode=mode,
                   options=vars(options), device=dev.type if dev is not None else "cpu",
                   code=code_fingerprint(ENGINE_MODULES))
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:40]


def _cache_folder(tb) -> Path:
    root = getattr(tb, "cache_dir", None)
    if root is not None:
        return Path(root) / "filtered"
    c = tb.__dict__.setdefault("_seam_cache", {})
    if "filtered_tmp" not in c:  # no cache folder: a temporary one, removed with the testbed object
        folder = Path(tempfile.mkdtemp(prefix="pact-filtered-"))
        weakref.finalize(tb, shutil.rmtree, str(folder), True)
        c["filtered_tmp"] = folder
    return c["filtered_tmp"]


def _report_to_cpu(report: PactReport) -> PactReport:
    def cpu(x):
        if isinstance(x, Tensor):
            return x.cpu()
        if isinstance(x, list):
            return [cpu(v) for v in x]
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple (LBW)
            return type(x)(*[cpu(v) for v in x])
        if hasattr(x, "__dataclass_fields__"):
            for f in x.__dataclass_fields__:
                setattr(x, f, cpu(getattr(x, f)))
        return x

    for k in list(report.shields):
        report.shields[k] = cpu(report.shields[k])
    for k in list(report.subspaces):
        report.subspaces[k] = cpu(report.subspaces[k])
    return report


def filtered_task_vectors(tb, mode: str, options: PactOptions | None = None, *, keep: bool = False,
                          raw: Sequence[LazyTaskVector] | None = None, sources=None, folder: Path | None = None
                          ) -> tuple[list[LazyTaskVector], PactReport]:
    """PACT / S-PACT-filtered task vectors of ``tb`` as :class:`LazyTaskVector`, the filtered layers
    computed once and kept on disk (module docstring), and the :class:`~pactlib.pact.PactReport`.

    Equal, bit for bit, to ``pact_filter(tb.pretrained, [in-memory Δt], mode=mode, options=options,
    rule=tb.rule, keep=keep)`` (the same per-layer kernel :func:`pactlib.pact.filter_layer` on the
    same values, layers on torch's thread count with single-threaded kernels), computed on the
    testbed's ``device`` (:func:`pactlib.testbeds.base.engine_device`). Peak memory: one layer's
    (T, m, n) stack and its filtered copy per thread (plus, with ``keep``, every layer's subspaces
    and shields in the report, as ``pact_filter(keep=True)`` keeps them). Disk: T × the filtered
    layers in float32 under ``<tb.cache_dir>/filtered`` (a temporary folder when ``cache_dir`` is
    None), plus the report (a torch pickle written by this function).

    Args:
        tb: a testbed with ``merge_sources`` (:func:`pactlib.testbeds.base.merge_sources`).
        mode: ``"pact"`` or ``"s-pact"``; options: :class:`PactOptions` (default ``PactOptions()``).
        keep: the report also holds every filtered layer's subspaces and shields.
        raw: the lazy task vectors to filter (default ``lazy_task_vectors`` of the sources).
        sources: ``tb.merge_sources()`` when the caller has it.
        folder: where the filtered layers are kept instead of ``<tb.cache_dir>/filtered`` (e.g. an
            empty folder, to time the filter itself: :func:`pactlib.book.experiments.efficiency.time_filter`).

    Raises:
        ValueError: an unknown mode; the testbed has no ``merge_sources``.
        CheckpointError: as :func:`lazy_task_vectors`; a selected layer of another shape in θ0.

    Warns:
        UserWarning: as :func:`pactlib.pact.pact_filter` (patterns that match no layer, a filter
        that changed nothing).
    """
    from ..io import atomic_write
    from ..lazy import CheckpointWriter, open_checkpoint
    from ..pact import MODES, filter_layer, select_layers, warn_if_unchanged
    from ..streaming import consume_in_order
    from .base import engine_device, merge_sources

    if mode not in MODES:
        raise ValueError(f"unknown PACT mode {mode!r}; use one of {MODES}")
    options = options or PactOptions()
    sources = merge_sources(tb) if sources is None else sources
    if sources is None:
        raise ValueError(f"testbed {tb.name!r} has no merge_sources: its task vectors are in memory "
                         "(use pactlib.pact.pact_filter)")
    pre_sd = tb.pretrained
    raw = list(raw) if raw is not None else lazy_task_vectors(pre_sd, sources[1], list(tb.tasks))
    T = len(raw)
    keys = list(raw[0])
    refs = {k: torch.empty(tuple(pre_sd[k].shape), dtype=raw[0].dtype, device="meta") for k in keys}
    matrix_keys, selected = select_layers(refs, mode=mode, options=options, rule=tb.rule, stacklevel=3)
    folder = Path(folder) if folder is not None else _cache_folder(tb)
    name = cache_key(tb, mode, options, sources)
    layers_path = folder / f"{name}.safetensors"
    report_path = folder / f"{name}.{'keep' if keep else 'report'}.pt"
    report = None
    if layers_path.is_file() and report_path.is_file():
        try:
            report = torch.load(report_path, map_location="cpu", weights_only=False)  # our own file
            layers = open_checkpoint(layers_path, name=f"{mode}-filtered task vectors")
            if not isinstance(report, PactReport) or set(layers) != set(selected):
                report = None
        except (OSError, RuntimeError, ValueError, EOFError, CheckpointError, AttributeError):
            report = None
    if report is None:
        dev = engine_device(tb)
        report = PactReport(mode, options)
        entries = [(k, (T, *pre_sd[k].shape), raw[0].dtype) for k in selected]
        folder.mkdir(parents=True, exist_ok=True)

        def job(key: str):
            p = pre_sd[key]
            deltas = [tv[key] for tv in raw]
            if dev is not None:
                p, deltas = p.to(dev), [d.to(dev) for d in deltas]
            res = filter_layer(key, p, deltas, mode=mode, options=options, rule=tb.rule, keep=keep)
            stack = torch.stack(deltas if res is None else res[1]).cpu()
            return stack, res

        def consume(key: str, result) -> None:
            stack, res = result
            writer.write(key, stack)
            if res is not None:
                lr, _, shields, subs = res
                report.layers.append(lr)
                if keep:
                    report.shields[key] = shields
                    report.subspaces[key] = subs

        for key in selected:
            if tuple(pre_sd[key].shape) != tuple(refs[key].shape):
                raise CheckpointError(f"pact_filter: key {key!r} missing from θ0 or of another shape")
        with CheckpointWriter(layers_path, entries, metadata={"mode": mode}) as writer:
            consume_in_order(job, selected, max(1, torch.get_num_threads()), consume)
            writer.commit()
        _report_to_cpu(report)
        atomic_write(report_path, lambda tmp: torch.save(report, tmp))
        layers = open_checkpoint(layers_path, name=f"{mode}-filtered task vectors")
    warn_if_unchanged(report, matrix_keys, selected, stacklevel=3)
    return [LazyTaskVector(_Filtered(tv, layers, t), name=tv.name) for t, tv in enumerate(raw)], report
