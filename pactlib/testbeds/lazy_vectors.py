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

The report is JSON (``<key>.report.json``, or ``<key>.keep.json`` with the subspaces and shields
of ``keep=True`` in ``<key>.keep.safetensors``): read without unpickling anything
(:func:`save_report`, :func:`load_report`); a corrupted or foreign file is a
:class:`FilterCacheError` naming it.

**Disk bound.** ``<cache_dir>/filtered`` holds one entry per (inputs, mode, options): a sweep of
options (chapter 11) adds several GB per setting at ViT-B/32, T = 20. After each new entry is
written, the least recently used entries are deleted until the folder's entries total at most
``$PACT_FILTERED_CACHE_GB`` gigabytes (default :data:`DEFAULT_CACHE_GB`; ``0`` keeps only the entries
in use; ``inf`` never deletes), or the ``max_bytes`` given to :func:`filtered_task_vectors` /
:func:`prune_cache`. An entry in use — its filtered task vectors alive in this or another process
on the machine (a shared ``flock`` on ``<key>.lock`` held while they live) — and the entry just
written are never deleted, so the bound can be exceeded by the entries in use. A deleted entry is
computed again when next asked for.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

try:  # the in-use locks of the cache's entries (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows: entries in use are protected in this process only
    fcntl = None

import torch
from torch import Tensor

from ..checks import check_compatible, check_finite
from ..pact import PactOptions, PactReport, filter_stack
from ..taskvector import TaskVector

__all__ = ["LazyTaskVector", "lazy_task_vectors", "filtered_task_vectors", "overlay", "is_lazy", "cache_key",
           "FILTER_CACHE_VERSION", "FilterCacheError", "save_report", "load_report", "prune_cache", "cache_limit",
           "CACHE_ENV", "DEFAULT_CACHE_GB"]

#: Bump when the filtered-layer cache's layout or meaning changes.
FILTER_CACHE_VERSION = "v1"

#: Environment variable bounding ``<cache_dir>/filtered`` (gigabytes, 10⁹ bytes; ``inf``: no bound).
CACHE_ENV = "PACT_FILTERED_CACHE_GB"
#: Its default: about two ViT-B/32 entries at T = 20 (6.8 GB each).
DEFAULT_CACHE_GB = 20.0

_REPORT_FORMAT = "pactlib.filtered-report"
_REPORT_VERSION = 1


class FilterCacheError(ValueError):
    """A file of the filtered-layer cache that cannot be read as one this module wrote (corrupted,
    truncated, foreign, or inconsistent with its key); the message names the file. Deleting it makes
    the next call filter again."""


def _meta(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta") for k, v in sd.items()}


class _KeyView(Mapping):
    """A read-on-access mapping whose keys (order, ``in``, ``len``) are those of ``self._keyspace``
    (any mapping or dict of the keys); subclasses compute the values."""

    _keyspace: Mapping

    def __contains__(self, key) -> bool:
        return key in self._keyspace

    def __iter__(self) -> Iterator[str]:
        return iter(self._keyspace)

    def __len__(self) -> int:
        return len(self._keyspace)


class _Deltas(_KeyView):
    """``{key: Δt[key]}`` over θ0's floating keys, each computed when asked for (a fresh tensor)."""

    def __init__(self, pretrained: Mapping[str, Tensor], source, keys: Sequence[str], name: str,
                 dtype: torch.dtype = torch.float32):
        self._pre, self._src, self._name, self.dtype = pretrained, source, name, dtype
        self._keyspace = dict.fromkeys(keys)
        self._is_delta = callable(getattr(source, "check", None)) and callable(getattr(source, "delta", None))

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._keyspace:
            raise KeyError(key)
        p = self._pre[key]
        if self._is_delta:  # a LoRA adapter: Δt itself (None: no update on this key)
            d = self._src.delta(key)
            return torch.zeros(p.shape, dtype=self.dtype) if d is None else d.detach().to(self.dtype, copy=True)
        x = self._src.read(key)
        check_finite({key: x}, name=self._name)
        return x.to(self.dtype) - p.to(self.dtype)  # as TaskVector.from_checkpoints computes it


class _Filtered(_KeyView):
    """Task t's filtered task vector: the filtered layers read from the cache file, the rest Δt."""

    def __init__(self, raw: "LazyTaskVector", layers, t: int):
        self._raw, self._layers, self._t, self.dtype = raw, layers, t, raw.dtype
        self._keyspace = raw

    def __getitem__(self, key: str) -> Tensor:
        if key in self._layers:
            return self._layers.read(key, (self._t, self._t + 1))[0].clone()
        return self._raw[key]


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


class _Overlay(_KeyView):
    """``top[key]`` for the keys of ``over``, ``base[key]`` for the others (both read on access)."""

    def __init__(self, base: Mapping[str, Tensor], top: Mapping[str, Tensor], over: Sequence[str]):
        self._base, self._top, self._over = base, top, frozenset(over)
        self._keyspace = base
        self.dtype = getattr(base, "dtype", torch.float32)

    def __getitem__(self, key: str) -> Tensor:
        return (self._top if key in self._over else self._base)[key]


def overlay(raw: Sequence[TaskVector], filtered: Sequence[TaskVector], keys: Sequence[str]) -> list[LazyTaskVector]:
    """Per task a :class:`LazyTaskVector` reading ``filtered[t][key]`` for ``keys`` and
    ``raw[t][key]`` for every other key (nothing copied or held).

    Raises:
        ValueError: different task counts. KeyError: a key of ``keys`` missing from a task vector.
    """
    check_pairs(raw, filtered, keys, "overlay")
    return [LazyTaskVector(_Overlay(r, f, keys), name=r.name) for r, f in zip(raw, filtered)]


def check_pairs(raw: Sequence[TaskVector], filtered: Sequence[TaskVector], keys: Sequence[str], who: str) -> None:
    """Check that ``raw`` and ``filtered`` pair up task by task and that every task vector on
    both sides has every key of ``keys`` (``who`` names the caller in the errors).

    Raises:
        ValueError: different task counts. KeyError: a key of ``keys`` missing (the first three named).
    """
    if len(raw) != len(filtered):
        raise ValueError(f"{who}: {len(raw)} raw vs {len(filtered)} filtered task vectors")
    for r, f in zip(raw, filtered):
        missing = [k for k in keys if k not in r or k not in f]
        if missing:
            raise KeyError(f"{who}: key(s) {missing[:3]} missing from task vector {r.name!r}")


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
    from .engine import ENGINE_MODULES, code_fingerprint, engine_device

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


class _Release:
    """Called once: ends this process's use of a cache entry (closes its lock descriptor)."""

    def __init__(self, folder: str, name: str, fd: int):
        self._key, self._fd = (folder, name), fd

    def __call__(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        n = _HELD_HERE.get(self._key, 0) - 1
        if n > 0:
            _HELD_HERE[self._key] = n
        else:
            _HELD_HERE.pop(self._key, None)
        try:
            os.close(fd)
        except OSError:
            pass


def save_report(report: PactReport, path: str | os.PathLike) -> Path:
    """Write ``report`` as JSON at ``path`` (mode, options, every :class:`~pactlib.pact.LayerReport`),
    its subspaces and shields (``keep=True`` reports), if any, as tensors in a safetensors file
    beside it (``path`` with the suffix ``.safetensors``). Both written atomically, the tensors first.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the folder cannot be written.
    """
    from ..io import write_atomic
    from ..io import write_safetensors

    path = Path(path)
    tensors: dict[str, Tensor] = {}
    names: dict[int, str] = {}

    def put(x: Tensor) -> str:
        if id(x) in names:  # S-PACT: one shield object for every task, stored once
            return names[id(x)]
        y = x.detach().cpu()
        if not y.is_contiguous() or y.untyped_storage().nbytes() != y.numel() * y.element_size():
            y = y.contiguous().clone()  # a view into a larger tensor: safetensors stores whole tensors
        name = f"t{len(tensors)}"
        tensors[name], names[id(x)] = y, name
        return name

    shields = {k: [put(s) for s in v] for k, v in report.shields.items()}
    subspaces = {k: {"core": put(s.core), "active": [put(a) for a in s.active],
                     "lbw": [[put(b.basis), put(b.sigma)] for b in s.lbw]} for k, s in report.subspaces.items()}
    tensor_file = path.with_suffix(".safetensors") if tensors else None
    doc = {"format": _REPORT_FORMAT, "version": _REPORT_VERSION, "mode": report.mode,
           "options": {k: v for k, v in vars(report.options).items()},
           "layers": [dataclasses.asdict(lr) for lr in report.layers],
           "shields": shields, "subspaces": subspaces,
           "tensors": tensor_file.name if tensor_file is not None else None}
    text = json.dumps(doc, default=repr)
    if tensor_file is not None:
        write_safetensors(tensors, tensor_file)
    write_atomic(path, text)
    return path


def load_report(path: str | os.PathLike, *, mode: str | None = None, options: PactOptions | None = None
                ) -> PactReport:
    """Read a report written by :func:`save_report` (JSON, and its safetensors file when it has
    subspaces and shields; nothing is unpickled).

    Args:
        path: the JSON file. mode: the PACT mode it must hold (None: any).
        options: the report's :class:`PactOptions` (the cache key holds them; default: rebuilt
            from the file).

    Returns:
        The :class:`~pactlib.pact.PactReport` (tensors on the CPU, in their stored dtypes).

    Raises:
        FilterCacheError: the file (or its tensor file) is unreadable, not JSON, not a report of
            this format and version, of another mode, or inconsistent (names the file).
    """
    from ..pact import LayerReport, LayerSubspaces
    from ..subspaces import LBW

    path = Path(path)
    hint = "; delete it to filter again"
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FilterCacheError(f"{path}: not a readable filtered-layer report ({type(e).__name__}: {e}){hint}") from e
    if not isinstance(doc, dict) or doc.get("format") != _REPORT_FORMAT:
        raise FilterCacheError(f"{path}: not a pactlib filtered-layer report (no format {_REPORT_FORMAT!r}){hint}")
    if doc.get("version") != _REPORT_VERSION:
        raise FilterCacheError(f"{path}: report version {doc.get('version')!r}, this pactlib reads "
                               f"{_REPORT_VERSION}{hint}")
    if mode is not None and doc.get("mode") != mode:
        raise FilterCacheError(f"{path}: a report of mode {doc.get('mode')!r}, not {mode!r}{hint}")
    try:
        opts = options if options is not None else PactOptions(**doc["options"])
        report = PactReport(doc["mode"], opts, layers=[LayerReport(**lr) for lr in doc["layers"]])
        tensors: dict[str, Tensor] = {}
        if doc["tensors"] is not None:
            name = str(doc["tensors"])
            if Path(name).name != name:
                raise ValueError(f"tensor file {name!r} outside the report's folder")
            from safetensors.torch import load_file

            tensors = load_file(str(path.parent / name))
        report.shields = {k: [tensors[n] for n in v] for k, v in doc["shields"].items()}
        report.subspaces = {k: LayerSubspaces(core=tensors[s["core"]], active=[tensors[n] for n in s["active"]],
                                              lbw=[LBW(tensors[b], tensors[g]) for b, g in s["lbw"]])
                            for k, s in doc["subspaces"].items()}
    except FilterCacheError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed file, whatever failed: name it
        raise FilterCacheError(f"{path}: a malformed filtered-layer report ({type(e).__name__}: {e}){hint}") from e
    return report


def cache_limit(max_bytes: float | None = None) -> float:
    """The bound of ``<cache_dir>/filtered`` in bytes: ``max_bytes`` if given, else
    ``$PACT_FILTERED_CACHE_GB`` × 10⁹, else :data:`DEFAULT_CACHE_GB` × 10⁹ (``math.inf``: no bound).

    Raises:
        ValueError: a negative or NaN bound, or an environment value that is not a number (named).
    """
    if max_bytes is None:
        raw = os.environ.get(CACHE_ENV)
        try:
            gb = DEFAULT_CACHE_GB if raw in (None, "") else float(raw)
        except ValueError:
            raise ValueError(f"${CACHE_ENV}={raw!r} is not a number of gigabytes (e.g. 20, 0, inf)") from None
        max_bytes = gb * 1e9
    max_bytes = float(max_bytes)
    if math.isnan(max_bytes) or max_bytes < 0:
        raise ValueError(f"filtered cache bound must be >= 0 bytes, got {max_bytes}")
    return max_bytes


def _entries(folder: Path) -> dict[str, list[Path]]:
    """{cache key: its files} of the cache folder (dot files and folders — temporary writes, timed
    filters — are not entries)."""
    out: dict[str, list[Path]] = {}
    for f in folder.iterdir() if folder.is_dir() else ():
        if f.name.startswith(".") or not f.is_file():
            continue
        key = f.name.split(".", 1)[0]
        if len(key) == 40 and all(c in "0123456789abcdef" for c in key):
            out.setdefault(key, []).append(f)
    return out


def _hold(folder: Path, name: str):
    """An open descriptor of ``<name>.lock`` with a shared lock: the entry is in use while it is open."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


_HELD_HERE: dict[tuple[str, str], int] = {}  # entries in use in this process (no flock: Windows)


def prune_cache(folder: str | os.PathLike, max_bytes: float | None = None, *, keep: Sequence[str] = ()
                ) -> list[str]:
    """Delete the least recently used entries of a filtered-layer cache folder until its entries
    total at most ``max_bytes`` (default :func:`cache_limit`). Last use = the newest modification time
    of an entry's files (a reuse touches its layers file). Entries in ``keep`` and entries in use
    (their lock held by live filtered task vectors, in any process) are never deleted.

    Returns:
        The keys of the deleted entries, oldest first.

    Raises:
        ValueError: as :func:`cache_limit`.
    """
    limit = cache_limit(max_bytes)
    folder = Path(folder)
    entries = _entries(folder)

    def stat(files):
        size, last = 0, 0.0
        for f in files:
            if f.name.endswith(".lock"):  # holding an entry is not a use of it
                continue
            try:
                st = f.stat()
            except OSError:
                continue
            size, last = size + st.st_size, max(last, st.st_mtime)
        return size, last

    info = {k: stat(fs) for k, fs in entries.items()}
    order = sorted(info, key=lambda k: (k not in keep, -info[k][1]))  # kept first, then newest first
    total, deleted = 0, []
    for k in order:
        size = info[k][0]
        if k in keep or total + size <= limit:
            total += size
            continue
        if (str(folder), k) in _HELD_HERE:
            total += size
            continue
        fd = os.open(folder / f"{k}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # in use elsewhere
                    total += size
                    continue
            for f in entries[k]:
                if not f.name.endswith(".lock"):
                    f.unlink(missing_ok=True)
            (folder / f"{k}.lock").unlink(missing_ok=True)
            deleted.append(k)
        finally:
            os.close(fd)
    return sorted(deleted, key=lambda k: info[k][1])


def filtered_task_vectors(tb, mode: str, options: PactOptions | None = None, *, keep: bool = False,
                          raw: Sequence[LazyTaskVector] | None = None, sources=None, folder: Path | None = None,
                          max_bytes: float | None = None) -> tuple[list[LazyTaskVector], PactReport]:
    """PACT / S-PACT-filtered task vectors of ``tb`` as :class:`LazyTaskVector`, the filtered layers
    computed once and kept on disk (module docstring), and the :class:`~pactlib.pact.PactReport`.

    Equal, bit for bit, to ``pact_filter(tb.pretrained, [in-memory Δt], mode=mode, options=options,
    rule=tb.rule, keep=keep)`` (the same per-layer kernel :func:`pactlib.pact.filter_layer` on the
    same values, layers on torch's thread count with single-threaded kernels), computed on the
    testbed's ``device`` (:func:`pactlib.testbeds.base.engine_device`). Peak memory: one layer's
    (T, m, n) stack and its filtered copy per thread (plus, with ``keep``, every layer's subspaces
    and shields in the report, as ``pact_filter(keep=True)`` keeps them). Disk: T × the filtered
    layers in float32 under ``<tb.cache_dir>/filtered`` (a temporary folder when ``cache_dir`` is
    None), plus the report (JSON, with ``keep`` its tensors in safetensors: :func:`save_report`).
    After a new entry is written, the cache folder is bounded (module docstring, :func:`prune_cache`).

    Args:
        tb: a testbed with ``merge_sources`` (:func:`pactlib.testbeds.base.merge_sources`).
        mode: ``"pact"`` or ``"s-pact"``; options: :class:`PactOptions` (default ``PactOptions()``).
        keep: the report also holds every filtered layer's subspaces and shields.
        raw: the lazy task vectors to filter (default ``lazy_task_vectors`` of the sources).
        sources: ``tb.merge_sources()`` when the caller has it.
        folder: where the filtered layers are kept instead of ``<tb.cache_dir>/filtered`` (e.g. an
            empty folder, to time the filter itself: :func:`pactlib.book.experiments.efficiency.time_filter`;
            such a folder is not bounded).
        max_bytes: the bound of ``<tb.cache_dir>/filtered`` in bytes (default :func:`cache_limit`:
            ``$PACT_FILTERED_CACHE_GB``, else :data:`DEFAULT_CACHE_GB` gigabytes).

    Raises:
        ValueError: an unknown mode; the testbed has no ``merge_sources``; a bad bound (:func:`cache_limit`).
        CheckpointError: as :func:`lazy_task_vectors` (which refuses a θt of other keys or shapes).
        FilterCacheError: a cached report or layers file that cannot be read as ours (named).

    Warns:
        UserWarning: as :func:`pactlib.pact.pact_filter` (patterns that match no layer, a filter
        that changed nothing).
    """
    from ..lazy import CheckpointWriter, open_checkpoint
    from ..order import canonical_order, in_user_order, mark_places, reorder_report
    from ..pact import MODES, select_layers, warn_if_unchanged
    from ..streaming import consume_in_order
    from .engine import engine_device, merge_sources

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
    bounded = folder is None
    limit = cache_limit(max_bytes) if bounded else math.inf  # a bad bound fails before any work
    folder = Path(folder) if folder is not None else _cache_folder(tb)
    name = cache_key(tb, mode, options, sources)
    layers_path = folder / f"{name}.safetensors"
    report_path = folder / f"{name}.{'keep' if keep else 'report'}.json"
    lock = _hold(folder, name)  # in use from here on: prune_cache (any process) leaves it alone
    _HELD_HERE[str(folder), name] = _HELD_HERE.get((str(folder), name), 0) + 1
    release = _Release(str(folder), name, lock)
    report = None
    try:
        if layers_path.is_file() and report_path.is_file():
            report = load_report(report_path, mode=mode, options=options)
            os.utime(layers_path)  # last use, for the bound; before it is opened: reads check its mtime
            try:
                layers = open_checkpoint(layers_path, name=f"{mode}-filtered task vectors")
                stored = set(layers)
            except Exception as e:  # noqa: BLE001 - corrupted / foreign: name the file
                raise FilterCacheError(f"{layers_path}: not readable as filtered layers ({type(e).__name__}: {e}); "
                                       "delete it to filter again") from e
            if stored != set(selected):
                raise FilterCacheError(f"{layers_path}: holds {len(stored)} layers, not the {len(selected)} "
                                       f"selected ones of its key; delete it to filter again")
    except BaseException:
        release()
        raise
    perm = canonical_order(raw)  # filtered in the content order (pactlib.order), stored in the tasks' order
    inv = in_user_order(list(range(T)), perm)  # a task's row in the content order
    if report is None:
        dev = engine_device(tb)
        report = PactReport(mode, options)
        entries = [(k, (T, *pre_sd[k].shape), raw[0].dtype) for k in selected]
        folder.mkdir(parents=True, exist_ok=True)

        def job(key: str):
            stack, res = filter_stack(key, pre_sd[key], torch.stack([raw[t][key] for t in perm]), mode=mode,
                                      options=options, rule=tb.rule, dev=dev, keep=keep)
            return stack.cpu()[inv], res

        def consume(key: str, result) -> None:
            stack, res = result
            writer.write(key, stack)
            if res is not None:
                lr, _, shields, subs = res
                report.layers.append(lr)
                if keep:
                    report.shields[key] = shields
                    report.subspaces[key] = subs

        try:
            with CheckpointWriter(layers_path, entries, metadata={"mode": mode}) as writer:
                consume_in_order(job, selected, max(1, torch.get_num_threads()), consume)
                writer.commit()
            _report_to_cpu(report)
            reorder_report(report, perm)
            save_report(report, report_path)
            layers = open_checkpoint(layers_path, name=f"{mode}-filtered task vectors")
        except BaseException:
            release()
            raise
        if bounded:
            prune_cache(folder, limit, keep=[name])
    weakref.finalize(layers, release)  # the entry stays in use while its task vectors live
    warn_if_unchanged(report, matrix_keys, selected, stacklevel=3)
    out = [LazyTaskVector(_Filtered(tv, layers, t), name=tv.name) for t, tv in enumerate(raw)]
    mark_places(out, perm)  # merged in the order they were filtered in (pactlib.order)
    return out, report
