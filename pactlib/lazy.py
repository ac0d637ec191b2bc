"""Checkpoints read one key at a time, and state dicts written one key at a time: the I/O of the
streamed merge (:mod:`pactlib.streaming`).

**Reading.** :func:`open_checkpoint` returns a :class:`LazyCheckpoint`: every key's shape and
dtype from the file headers, and :meth:`LazyCheckpoint.read` for one tensor (or a range of its
rows) at a time.

- ``.safetensors``: the layout and each key's byte offset are read once from the header
  (:func:`pactlib.safetensors_io.read_header_checked`, with each file's identity then);
  each file is opened once and kept open, and a read copies one tensor (or a range of its rows,
  one contiguous run) with ``pread`` into a tensor of its own, or into a buffer the caller reuses
  (``out=``). Nothing is memory-mapped: a mapping would fault in every 4 KB page it touches on
  every pass, and keep the pages it touched in the process's resident size; the page cache's
  pages are copied instead, whatever the number of passes.
- Sharded checkpoints: a ``*.index.json`` with a Hugging Face ``weight_map`` (key -> shard file),
  or a model folder holding one (or a single ``model.safetensors`` / ``pytorch_model.bin``);
  each key is read from its shard.
- ``.pt`` / ``.pth`` / ``.bin`` / ``.ckpt`` (pickles): converted **once** to safetensors in the
  conversion cache (:func:`conversion_cache_dir`: ``$PACT_CONVERT_CACHE``, else
  :func:`pactlib.paths.cache_dir` ``/converted``), keyed by the file's resolved
  path and identity (device, inode, size, modification and change times); the file is written to a temporary name in that folder and
  renamed (atomic), and older conversions of the same source are removed. The conversion reads
  the pickle with ``torch.load(mmap=True, weights_only=True)``, so its peak is about that one
  file. ``torch.load(mmap=True)`` alone is not enough for the merge itself: the mapping of the
  whole file lives as long as any of its tensors, and the pages read stay resident (all of a
  file once all its tensors have been read), for θ0 and every θt. Pickles that hold whole modules (``trust_pickle``)
  are read by a *trusted reader* that another package contributes (:func:`trusted_reader`: the
  entry-point group ``pactlib.loaders``, or :func:`register_reader`); the engine itself only
  reads plain state dicts.

Keys come in the order the in-memory loaders give (:func:`pactlib.io.load_state_dict`: a
safetensors file's data order; shards in sorted file order), which TIES' position tie-break
depends on.

**Writing.** :class:`CheckpointWriter` writes θ0's keys in order as they are merged: a safetensors
header (every key's dtype, shape and offsets, known before any tensor) and then each tensor's bytes,
so it holds no more than the tensor being written. With ``max_shard_size`` the keys are split
over ``<stem>-00001-of-0000N.safetensors`` files and a Hugging Face ``<out>.index.json``
(``{"metadata": {"total_size"}, "weight_map"}``). Everything goes to temporary files in the
destination folder, renamed on :meth:`CheckpointWriter.commit` (shards first, the index last):
an interrupted or failed run (a full disk too) leaves no output file and no temporary file. A
writer holds a lock on each of its temporary files while it writes, and
:func:`pactlib.streaming.merge_files` holds the output's name (:func:`output_lock`), so one run at
a time writes an output and no run removes another's live files as stale. A ``.pt`` output is the exception: torch's
format needs the whole state dict, so it is collected in memory (one model) and saved atomically.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import logging
import math
import os
import re
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    import torch
    from torch import Tensor


from .checks import CheckpointError
from .io import (FOLDER_ORDER, SAFETENSORS, TORCH, StreamedFile, _read_index, folder_checkpoint,  # noqa: F401
                 is_folder_output, no_extension, read_sharded, save_state_dict, write_atomic)
from .safetensors_io import (ChangedInputError, check_unchanged, dtype_name, read_header_checked,  # noqa: F401
                             tensor_bytes, tensor_bytes_view, torch_tables)
from .paths import cache_dir as _cache_dir

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".index.json"
#: Read descriptors a :class:`LazyCheckpoint` keeps open (its most recently read files)
OPEN_FILES = 8
_CONVERSION = "v1"  # bump when the conversion changes
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(size: int | str) -> int:
    """Bytes from ``2000000``, ``"500MB"``, ``"2GB"`` (powers of 1000) or ``"1.5GiB"`` (1024).

    Raises:
        ValueError: not a positive size.
    """
    if isinstance(size, bool):
        raise ValueError(f"max shard size must be a size such as 2GB, got {size!r}")
    if isinstance(size, int):
        n = size
    else:
        m = _SIZE.match(str(size))
        if not m or (m.group(2) or "").lower() not in _UNITS:
            raise ValueError(f"max shard size must be a number of bytes or e.g. 500MB, 2GB, 1.5GiB; got {size!r}")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n < 1:
        raise ValueError(f"max shard size must be positive, got {size!r}")
    return n


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Entry:
    """Where one key lives: its safetensors file, shape and dtype."""

    file: Path
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int = -1  #: the byte offset of its data in ``file`` (-1: unknown, read through ``safe_open``)
    #: ``file``'s :func:`pactlib.safetensors_io.file_identity` when its header was read (None: unknown)
    identity: tuple | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """({key: Entry} in data order, metadata) of a safetensors file, from its header only
    (:func:`pactlib.safetensors_io.read_header_checked`), with the file's identity then.

    Raises:
        CheckpointError: not a valid safetensors file (naming it and the problem).
    """
    h = read_header_checked(path)
    dtypes = torch_tables()[1]
    return {k: Entry(Path(path), shape, dtypes[dt], offset, h.identity)
            for k, (shape, dt, offset, _) in h.entries.items()}, h.metadata


class LazyCheckpoint:
    """A checkpoint's keys, shapes and dtypes, with tensors read one at a time.

    Not a Mapping on purpose: iterating a Mapping's values would read the whole checkpoint.
    ``meta()`` gives ``meta``-device tensors (shape and dtype, no data) for the key and shape
    checks of :mod:`pactlib.checks` and for :class:`pactlib.matrix.MatrixRule`.
    """

    def __init__(self, name: str, entries: Mapping[str, Entry]):
        self.name = name
        self._entries = dict(entries)
        # each file's identity when its header was read: a file that changes since is an error
        self._identity = {e.file: e.identity for e in self._entries.values() if e.identity is not None}
        self._fds: dict[Path, int] = {}  # open descriptors, least recently used first
        self._users: dict[Path, int] = {}  # reads in progress per file
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LazyCheckpoint({self.name!r}, keys={len(self)})"

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __iter__(self):
        return iter(self._entries)

    def keys(self) -> list[str]:
        return list(self._entries)

    def entry(self, key: str) -> Entry:
        return self._entries[key]

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key].shape

    def dtype(self, key: str) -> torch.dtype:
        return self._entries[key].dtype

    @property
    def files(self) -> list[Path]:
        return sorted({e.file for e in self._entries.values()})

    def meta(self) -> dict[str, Tensor]:
        """{key: an empty ``meta`` tensor of the key's shape and dtype}, in order."""
        import torch
        return {k: torch.empty(e.shape, dtype=e.dtype, device="meta") for k, e in self._entries.items()}

    def read(self, key: str, rows: tuple[int, int] | None = None, *, dim: int = 0,
             out: Tensor | None = None) -> Tensor:
        """The tensor of ``key`` (or its index range ``rows`` = (start, stop) along ``dim``, 0 or 1),
        a CPU tensor of its own: ``out`` when given (contiguous, of the result's shape and dtype:
        a buffer reused from call to call), else a new one.

        The bytes are read with ``pread`` from a descriptor opened once per file and kept
        (:data:`OPEN_FILES` per checkpoint, until :meth:`close`): one system call per contiguous
        run (the whole tensor, a range of rows; a range along ``dim`` 1 is one run per index of
        dimension 0). Nothing is
        memory-mapped, so the page cache's pages are copied, not faulted in, and none of them
        counts in the process's resident size.

        Raises:
            KeyError: unknown key (naming the checkpoint).
            ValueError: ``out`` of the wrong shape or dtype, or not contiguous.
            ChangedInputError: the file changed since its header was read (its size, mtime,
                ctime, inode or device: checked after each read, and on a short read).
            CheckpointError: the file can no longer be read, or is shorter than its header says
                (naming it and the key).
        """
        import torch
        try:
            e = self._entries[key]
        except KeyError:
            raise KeyError(f"{self.name}: no key {key!r}") from None
        shape, runs = e.shape, None
        item = torch.empty((), dtype=e.dtype).element_size()
        if rows is None or not shape:
            runs = [(e.offset, e.numel * item)]
        else:
            if dim not in (0, 1) or len(shape) <= dim:
                raise ValueError(f"{self.name}: key {key!r} of shape {tuple(shape)} has no dimension {dim}")
            a, b, _ = slice(rows[0], rows[1]).indices(shape[dim])
            b = max(a, b)
            inner = math.prod(shape[dim + 1:]) * item  # bytes of one index along dim
            if dim == 0:
                shape = (b - a, *shape[1:])
                runs = [(e.offset + a * inner, (b - a) * inner)]
            else:
                stride = shape[1] * inner
                runs = [(e.offset + i * stride + a * inner, (b - a) * inner) for i in range(shape[0])]
                shape = (shape[0], b - a, *shape[2:])
        if out is None:
            out = torch.empty(shape, dtype=e.dtype)
        elif tuple(out.shape) != tuple(shape) or out.dtype != e.dtype or not out.is_contiguous() or out.is_cuda:
            raise ValueError(f"{self.name}: key {key!r}: out must be a contiguous CPU tensor {tuple(shape)} "
                             f"{e.dtype}, got {tuple(out.shape)} {out.dtype}")
        if e.offset < 0:  # no known offset: through safetensors
            out.copy_(self._read_safe_open(key, rows, dim))
            return out
        view = tensor_bytes_view(out)
        fd = None
        try:
            fd = self._acquire(e.file)
            pos = 0
            for off, n in runs:
                done = 0
                while done < n:
                    got = os.preadv(fd, [view[pos + done:pos + n]], off + done)
                    if got <= 0:
                        raise EOFError(f"the file ends {n - done} byte(s) early")
                    done += got
                pos += n
            self._check(e.file, fd)
        except (OSError, EOFError) as err:
            if fd is not None:
                try:
                    self._check(e.file, fd)
                except ChangedInputError:  # a file truncated since its header was read
                    raise ChangedInputError(e.file, f"cannot read key {key!r}: {err}") from err
            raise CheckpointError(f"{self.name}: cannot read key {key!r} from {e.file} "
                                  f"({type(err).__name__}: {str(err)[:200]})") from err
        finally:
            if fd is not None:
                self._release(e.file)
        return out

    def _read_safe_open(self, key: str, rows, dim: int) -> Tensor:
        from safetensors import safe_open

        e = self._entries[key]
        try:
            with safe_open(str(e.file), framework="pt") as f:
                if rows is None or not e.shape:
                    return f.get_tensor(key)
                sl = f.get_slice(key)
                return sl[rows[0]:rows[1]] if dim == 0 else sl[:, rows[0]:rows[1]]
        except Exception as err:
            raise CheckpointError(f"{self.name}: cannot read key {key!r} from {e.file} "
                                  f"({type(err).__name__}: {str(err)[:200]})") from err

    def _acquire(self, file: Path) -> int:
        """The read descriptor of ``file``, opened on first use and kept (the :data:`OPEN_FILES`
        most recently used per checkpoint: a sharded checkpoint is read shard after shard, and
        T checkpoints of many shards stay within the process's limit); released after the read."""
        with self._lock:
            fd = self._fds.pop(file, None)
            if fd is None:
                fd = os.open(file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._fds[file] = fd  # the most recently used last
            self._users[file] = self._users.get(file, 0) + 1
            for old in list(self._fds)[:max(0, len(self._fds) - OPEN_FILES)]:
                if not self._users.get(old):  # a descriptor in use by another thread stays open
                    os.close(self._fds.pop(old))
            return fd

    def _check(self, file: Path, fd: int | None = None) -> None:
        if file in self._identity:
            check_unchanged(file, self._identity[file], fd)

    def check_unchanged(self) -> None:
        """Raise :class:`~pactlib.safetensors_io.ChangedInputError` (naming the file) when a file
        of the checkpoint is no longer the one its header was read from: its size, mtime, ctime,
        inode or device differ (by its path: a file renamed over it is a change too). Called
        after the last read, before an output made from the checkpoint is published."""
        for file in self._identity:
            self._check(file)

    def _release(self, file: Path) -> None:
        with self._lock:
            self._users[file] -= 1
            if not self._users[file]:
                del self._users[file]

    def close(self) -> None:
        """Close the files' descriptors (reading again opens them again)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


Loader = Callable[[Path], Mapping[str, "Tensor"]]


def conversion_cache_dir() -> Path:
    """Where converted ``.pt`` checkpoints are kept: ``$PACT_CONVERT_CACHE``, else
    ``$PACT_CACHE/converted``, else ``$XDG_CACHE_HOME/pactlib/converted`` (``~/.cache/...``):
    :func:`pactlib.paths.cache_dir`."""
    if os.environ.get("PACT_CONVERT_CACHE"):
        return Path(os.environ["PACT_CONVERT_CACHE"])
    return _cache_dir("converted")


# ----------------------------------------------------------------------------- trusted readers
#: Entry-point group of checkpoint readers contributed by other packages. Each entry point names a
#: callable ``read(path, *, trust_pickle: bool) -> {key: Tensor}``; pactlib's own distribution
#: declares ``trusted_pickle = "pactlib.models.clip:load_clip_checkpoint"`` (whole pickled modules
#: such as the task-vectors ``ImageEncoder`` files, TorchScript archives, model folders).
LOADER_GROUP = "pactlib.loaders"
#: The reader :func:`default_loader` uses with ``trust_pickle``.
TRUSTED = "trusted_pickle"
_READERS: dict[str, Callable[..., Mapping[str, Tensor]]] = {}


def register_reader(name: str, read: Callable[..., Mapping[str, Tensor]]) -> None:
    """Register ``read(path, *, trust_pickle) -> {key: Tensor}`` as the reader ``name`` (replacing
    one of that name), e.g. ``register_reader("trusted_pickle", my_reader)``."""
    if not callable(read):
        raise TypeError(f"register_reader({name!r}, ...): expected a callable, got {type(read).__name__}")
    _READERS[name] = read


def trusted_reader(name: str = TRUSTED) -> Callable[..., Mapping[str, Tensor]]:
    """The reader registered as ``name`` (:func:`register_reader`), else the entry point ``name`` of
    the group :data:`LOADER_GROUP`, loaded on first use.

    Raises:
        CheckpointError: no such reader is registered or installed, or its module fails to import
            (the message names the group, the entry point and the error).
    """
    if name in _READERS:
        return _READERS[name]
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=LOADER_GROUP) if ep.name == name]
    if not found:
        raise CheckpointError(
            f"no checkpoint reader {name!r} is installed (entry-point group {LOADER_GROUP!r}); pactlib "
            "declares one in its pyproject.toml: install the package (pip install -e .) or call "
            "pactlib.lazy.register_reader")
    try:
        read = found[0].load()
    except Exception as e:  # an optional dependency of the reader's module is missing, ...
        raise CheckpointError(f"checkpoint reader {name!r} ({found[0].value}) cannot be loaded: "
                              f"{type(e).__name__}: {e}") from e
    register_reader(name, read)
    return read


def default_loader(trust_pickle: bool = False) -> Loader:
    """How a pickle is read for conversion: :func:`pactlib.io.load_state_dict` memory-mapped
    (``weights_only``: no pickled code runs), or with ``trust_pickle`` the reader
    :func:`trusted_reader` returns (pactlib's: :func:`pactlib.models.clip.load_clip_checkpoint`),
    which also unpickles whole modules."""
    if trust_pickle:
        def load(path: Path) -> Mapping[str, Tensor]:
            return trusted_reader()(path, trust_pickle=True)

        load.cache_tag = "trusted"
        return load
    from .io import load_state_dict

    def load(path: Path) -> Mapping[str, Tensor]:
        return load_state_dict(path, mmap=True)

    load.cache_tag = "plain"
    return load


def convert_pickle(path: str | os.PathLike, *, loader: Loader | None = None,
                   cache_dir: str | os.PathLike | None = None) -> Path:
    """The safetensors copy of the pickled checkpoint ``path`` in the conversion cache, written
    once (atomically) and reused while the file is unchanged: the same resolved path, device,
    inode, size, mtime and ctime (any write, ``touch`` or rename changes the ctime).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: as ``loader`` (default :func:`default_loader`), naming the file.
    """
    import torch
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    loader = loader or default_loader()
    tag = getattr(loader, "cache_tag", getattr(loader, "__qualname__", "loader"))
    st = path.stat()
    src = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    # the file's identity: a file rewritten in place (same size, mtime set back) has a new ctime,
    # one replaced by another (a rename) a new inode
    ident = f"{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    version = hashlib.sha256(f"{ident}|{tag}|{_CONVERSION}".encode()).hexdigest()[:12]
    cache = Path(cache_dir) if cache_dir is not None else conversion_cache_dir()
    stem = re.sub(r"[^\w.-]", "_", path.stem)[:60]
    dest = cache / f"{stem}-{src}-{version}.safetensors"
    if dest.is_file():
        return dest
    sd = loader(path)
    entries = []
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{path}: key {k!r} holds a {type(v).__name__}, not a tensor")
        if dtype_name(v.dtype) is None:
            raise CheckpointError(f"{path}: key {k!r} has dtype {v.dtype}, which safetensors cannot store")
        entries.append((k, tuple(v.shape), v.dtype))
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with CheckpointWriter(dest, entries) as w:
            for k, v in sd.items():
                w.write(k, v)
            w.commit()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write its safetensors conversion to {cache} ({e}); "
                              "set PACT_CONVERT_CACHE to a writable folder") from e
    del sd
    for old in cache.glob(f"{glob.escape(stem)}-{src}-*.safetensors"):
        if old != dest:
            old.unlink(missing_ok=True)
    return dest


def _open_file(path: Path, loader: Loader | None, cache_dir) -> dict[str, Entry]:
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS:
        return read_header(path)[0]
    if suffix in TORCH:
        return read_header(convert_pickle(path, loader=loader, cache_dir=cache_dir))[0]
    raise CheckpointError(f"{path}: unknown checkpoint extension {suffix or '(none)'!r}; "
                          f"use one of {', '.join(SAFETENSORS + TORCH)} or a *.index.json")


def checkpoint_files(path: str | os.PathLike) -> list[Path]:
    """The files :func:`open_checkpoint` reads for ``path``: the file; a sharded checkpoint's
    index and the shards its ``weight_map`` names (only the index when it cannot be read: the
    reader will say why); a folder's (:func:`folder_checkpoint`); nothing for a folder without a
    checkpoint or a missing path."""
    path = Path(path)
    if path.is_dir():
        try:
            path = folder_checkpoint(path)
        except FileNotFoundError:
            return []
    if not path.is_file():
        return []
    if path.name.endswith(INDEX_SUFFIX):
        try:
            return [path, *index_shards(path)]
        except (CheckpointError, OSError):
            return [path]
    return [path]


def index_shards(index: str | os.PathLike) -> list[Path]:
    """The shard files a sharded checkpoint's ``*.index.json`` lists in its ``weight_map``.

    Raises:
        CheckpointError: as :func:`_read_index` (naming the index file).
    """
    return sorted(set(_read_index(Path(index)).values()))


def open_checkpoint(path: str | os.PathLike, *, loader: Loader | None = None,
                    cache_dir: str | os.PathLike | None = None, name: str | None = None) -> LazyCheckpoint:
    """A :class:`LazyCheckpoint` over a ``.safetensors`` file, a pickle (``.pt``, ``.pth``,
    ``.bin``, ``.ckpt``: converted once, :func:`convert_pickle`), a sharded checkpoint's
    ``*.index.json``, or a model folder (:func:`folder_checkpoint`). Only headers are read here.

    Args:
        loader: reads a pickle for its conversion (default :func:`default_loader`).
        cache_dir: the conversion cache (default :func:`conversion_cache_dir`).
        name: what messages call the checkpoint (default the path).

    Raises:
        FileNotFoundError: no such file or folder, or a folder without a checkpoint.
        CheckpointError: an unreadable file, a malformed index, a key of the index missing from
            its shard, or a key in two shards (all naming the file).
    """
    path = Path(path)
    name = name or str(path)
    if path.is_dir():
        return open_checkpoint(folder_checkpoint(path), loader=loader, cache_dir=cache_dir, name=name)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not path.name.endswith(INDEX_SUFFIX):
        entries = _open_file(path, loader, cache_dir)
        if not entries:
            raise CheckpointError(f"{path}: the checkpoint holds no tensors")
        return LazyCheckpoint(name, entries)
    return LazyCheckpoint(name, read_sharded(path, lambda shard: _open_file(shard, loader, cache_dir)))


# --------------------------------------------------------------------------- writing


#: the streamed writer of one file (kept under its old name)
_SafetensorsFile = StreamedFile


def shard_names(out: Path, n: int) -> tuple[Path, list[Path]]:
    """(index path, shard paths) of an ``n``-shard output ``out`` (``x.safetensors`` or
    ``x.safetensors.index.json``): ``x-00001-of-0000n.safetensors`` and ``x.safetensors.index.json``."""
    name = out.name
    if name.endswith(INDEX_SUFFIX):
        index = out
        name = name[: -len(INDEX_SUFFIX)]
    else:
        index = out.with_name(name + INDEX_SUFFIX)
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    return index, [out.with_name(f"{stem}-{i:05d}-of-{n:05d}.safetensors") for i in range(1, n + 1)]


def _family_names(out: Path) -> tuple[str, str, str] | None:
    """(single file, index, shard stem) names of a safetensors output ``out`` (:func:`shard_names`:
    ``x.safetensors``, ``x.safetensors.index.json``, ``x``); None for a torch file."""
    if check_out_suffix(out) == "torch":
        return None
    index, _ = shard_names(out, 1)
    single = index.name[: -len(INDEX_SUFFIX)]
    return single, index.name, single[: -len(".safetensors")] if single.endswith(".safetensors") else single


def output_family(out: str | os.PathLike) -> Callable[[str], bool]:
    """Whether a file name in ``out``'s folder belongs to the output ``out``: a name a
    :class:`CheckpointWriter` to ``out`` may publish, with or without shards (``x.safetensors``,
    ``x.safetensors.index.json``, ``x-0000i-of-0000n.safetensors``; a torch file: its own name),
    or one of its temporary files (``.<one of those>.<random>.tmp``)."""
    out = Path(out)
    fam = _family_names(out)
    if fam is None:
        names = re.escape(out.name)
    else:
        single, index, stem = fam
        names = (f"(?:{re.escape(single)}|{re.escape(index)}|"
                 f"{re.escape(stem)}-\\d{{5}}-of-\\d{{5}}\\.safetensors)")
    pattern = re.compile(f"(?:{names}|\\.{names}\\..+\\.tmp)")
    return lambda name: pattern.fullmatch(name) is not None


def check_out_target(out: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, name: str = "out") -> None:
    """Check, before any work, that writing the output ``out`` can neither overwrite an input
    nor fail on the path: no file an input is read from (:func:`checkpoint_files`; a task-vector
    source's ``files``, e.g. a PEFT adapter's) is one ``out`` may write (:func:`output_family`: a
    single-file ``out`` may also write shards and an index), ``out`` and the names it may write
    are not folders, each temporary name fits the file system, and its folder is (or can be
    made) writable. ``name``: the parameter's name in messages (``"--out"``).

    An ``out`` in a model folder no merge wrote (it has ``config.json`` and no
    :data:`PACT_RECIPE`) is refused when the folder holds other files of its name (shards, an
    index, the single file beside an index): publishing would replace or remove that model's
    weights. (An output that a merge wrote there earlier, one file or sharded, is refused too:
    nothing tells them apart.)

    Raises:
        ValueError: ``out`` would overwrite a file of an input (both named), or remove another
            model's weights (named).
        CheckpointError: ``out`` is a folder, a part of its path is a file, or its folder is not
            writable (named).
        OutputError: a name ``out`` may write (its lock file included) is a symbolic link
            (:func:`refuse_link`, naming it).
    """
    out = Path(out)
    member = output_family(out)
    folder = out.parent.resolve()
    # the files it may write that exist now, by identity: an input file that is one of them (also
    # through a symlinked folder or under another name, a hard link) would be overwritten
    ours = {(st.st_dev, st.st_ino): f for f, st in ((f, f.stat()) for f in (folder.iterdir() if folder.is_dir() else ())
                                                     if member(f.name) and f.is_file())}
    for p in inputs:
        if getattr(p, "files", None) is not None:  # a task-vector source (a PEFT adapter) names what it reads
            files = [Path(f) for f in p.files]
        elif isinstance(p, (str, os.PathLike)):
            files = checkpoint_files(p)
        else:
            continue
        for f in files:
            if not f.exists():
                continue  # the reader names a missing file
            st = f.stat()
            hit = ours.get((st.st_dev, st.st_ino))
            if hit is None:
                continue
            if hit.name == out.name:
                same = isinstance(p, (str, os.PathLike)) and f == Path(p)
                what = f"is the input {p}" if same else f"is {f}, a file of the input {p}"
            else:
                what = f"may write {f} (with or without shards), a file of the input {p}"
            raise ValueError(f"{name} {out} {what}: writing there would overwrite it; "
                             "choose another file name or folder")
    if out.is_dir():
        raise CheckpointError(f"{name} {out} is a folder; name the output file (e.g. {out / 'model.safetensors'})")
    links = [output_lock_path(out)] + sorted(f for f in (folder.iterdir() if folder.is_dir() else ())
                                             if member(f.name) and f.is_symlink())
    for f in links:
        refuse_link(out.parent / f.name, out)
    others = sorted(f.name for f in ours.values() if f.name != out.name and not f.name.endswith(".tmp"))
    if others and (folder / "config.json").is_file() and not (folder / PACT_RECIPE).is_file():
        listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ValueError(f"{name} {out}: its folder is a model folder no merge wrote (it has config.json), and "
                         f"writing {out.name} there would replace or remove its {listed}; choose another name or "
                         "folder (pact merge --out DIR/ writes a model folder), or remove them first")
    if folder.is_dir():
        taken = sorted(f for f in folder.iterdir() if member(f.name) and f.is_dir())
        if taken:
            raise CheckpointError(f"{name} {out}: {taken[0]} is a folder with a name this output may write")
    up = out.parent
    while not up.exists():
        up = up.parent
    if not up.is_dir():
        raise CheckpointError(f"{name} {out}: {up} is a file, not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise CheckpointError(f"{name} {out}: cannot write into the folder {up} (permission denied)")
    fam = _family_names(out)  # the longest temporary names: .<name>.<8 random>.tmp (mkstemp)
    written = [out.name] if fam is None else [fam[0], fam[1], f"{fam[2]}-00001-of-99999.safetensors"]
    longest = max(len(f".{n}.") + 8 + len(".tmp") for n in written)
    try:
        limit = int(os.pathconf(up, "PC_NAME_MAX"))
    except (OSError, ValueError):
        limit = 255
    if longest > limit:
        raise CheckpointError(f"{name} {out}: the name is too long; its temporary files would need "
                              f"{longest} characters, the file system allows {limit}")


def remove_stale_outputs(out: str | os.PathLike, keep: Sequence[str | os.PathLike]) -> list[Path]:
    """Delete the files of ``out``'s folder that belong to the output ``out``
    (:func:`output_family`) other than ``keep`` (what was just published): the single file, or
    the shards and index, of an earlier output under that name (a reader that prefers the index
    would read them instead of the new file), with a warning naming them, and the temporary files
    an interrupted writer (SIGKILL) left. As Hugging Face's ``save_pretrained`` cleans its folder.
    Returns the deleted paths."""
    out = Path(out)
    if not out.parent.is_dir():  # a model folder's staging folder, swapped in (pactlib.recipe.FolderFiles)
        return []
    member = output_family(out)
    keep_names = {Path(k).name for k in keep}
    earlier, temps = [], []
    for f in sorted(out.parent.iterdir()):
        if member(f.name) and f.name not in keep_names and (f.is_file() or f.is_symlink()):
            if not f.name.endswith(".tmp"):
                earlier.append(f)
            elif not _is_live(f):  # a live one: a writer of another run has it open
                temps.append(f)
    why = "a file of an earlier output under this name; a reader of the folder may read it"
    gone = remove_published(earlier, where=out, why=why)
    warn_earlier(out, gone, stacklevel=3)
    return sorted(gone + remove_published(temps, where=out, why=why))


def warn_earlier(out: str | os.PathLike, gone: Sequence[Path], *, stacklevel: int = 2) -> None:
    """Warn that ``gone``, the files of an earlier output named as ``out``, were removed."""
    if gone:
        out = Path(out)
        gone = sorted(gone, key=lambda f: (not f.name.endswith(INDEX_SUFFIX), f.name))  # the index first
        names = ", ".join(f.name for f in gone[:4]) + (f" and {len(gone) - 4} more" if len(gone) > 4 else "")
        warnings.warn(f"{out.parent}: removed {names}: the files of an earlier output named {out.name}, which a "
                      "reader of the folder would take for this merge's", stacklevel=stacklevel)


def remove_published(paths: Sequence[Path], *, where, why: str) -> list[Path]:
    """Remove ``paths`` once an output is published: one that cannot be removed is named in a
    warning (``where``: the output; ``why``: what the file is), and the output stands. Returns
    the removed paths."""
    removed = []
    for f in paths:
        try:
            f.unlink(missing_ok=True)
        except OSError as e:
            warnings.warn(f"{where}: could not remove {f.name}, {why} ({e.strerror}); remove it by hand", stacklevel=3)
            continue
        removed.append(f)
    return removed


def spill_prefix(out: str | os.PathLike) -> str:
    """The name prefix of global TIES' spill folder next to ``out`` (removed by the next run when
    a killed one left it: :func:`finish_output`)."""
    return f".{Path(out).name}.spill-"


def finish_output(out: str | os.PathLike, files: Sequence[str | os.PathLike]) -> list[Path]:
    """After ``files`` were published as ``out``: :func:`remove_stale_outputs`, and the spill
    folders of killed global-TIES runs under that name (:func:`spill_prefix`); said in the log.
    Returns what was removed."""
    import shutil

    out = Path(out)
    stale = remove_stale_outputs(out, files)
    for d in out.parent.glob(glob.escape(spill_prefix(out)) + "*"):
        shutil.rmtree(d, ignore_errors=True)
        stale.append(d)
    if stale:
        log.info("%s: removed %d file(s) of an earlier output or an interrupted run: %s", out, len(stale),
                 ", ".join(p.name for p in stale[:5]))
    return stale


def _is_live(f: Path) -> bool:
    """Whether a writer holds the temporary file ``f`` open (its ``flock``, :func:`pactlib.io.new_temp`)."""
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def refuse_link(path: str | os.PathLike, out: str | os.PathLike) -> None:
    """Refuse a symbolic link at ``path``, a name the output ``out`` writes (a lock, a temporary
    or published file): writing there would write the file it points to, outside the output.

    Raises:
        OutputError: ``path`` is a symbolic link (``ELOOP``; naming it and its target).
    """
    from .io import OutputError

    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise OutputError(errno.ELOOP, f"cannot write the output {out}: {path} is a symbolic link (to {target}); "
                                       "pact merge never writes through a link; remove it")


#: {absolute lock path: descriptors of locks made under that name since} of the :func:`output_lock`
#: blocks open in this process: a model folder published by a swap (:class:`pactlib.recipe.FolderFiles`)
#: brings its own lock file, held from before the swap and let go with the folder's
held_locks: dict[str, list[int]] = {}

#: The lock file of a model folder output, inside it (:func:`output_lock_path`)
FOLDER_LOCK = ".pact-merge.lock"
#: the recipe a folder output holds (:data:`pactlib.recipe.RECIPE_NAME`): a folder with it is one a
#: merge wrote
PACT_RECIPE = "pact_recipe.yaml"


def output_lock_path(out: str | os.PathLike, *, folder: bool = False) -> Path:
    """The lock file of the output ``out``: ``.<name>.lock`` beside it, one for the whole family
    of names the output may write (``x.safetensors`` and ``x.safetensors.index.json`` share it);
    ``folder``: ``out`` is a model folder, held whole by :data:`FOLDER_LOCK` inside it (the
    same file however the folder's path is spelled, through links too)."""
    out = Path(out)
    if folder:
        return out / FOLDER_LOCK
    fam = _family_names(out)
    return out.with_name(f".{fam[0] if fam is not None else out.name}.lock")


@contextlib.contextmanager
def output_lock(out: str | os.PathLike, *, folder: bool = False) -> Iterator[Path]:
    """Hold the output name ``out`` for this run (an exclusive ``flock`` on
    :func:`output_lock_path`, holding the process id); the lock file is removed at the end.
    ``folder``: ``out`` is a model folder (which must exist), held whole.

    Raises:
        OutputError: another run holds it (naming the output, the lock file and its process), or
            the lock file cannot be made (naming the output, then the lock file, and why).
    """
    from .io import OutputError

    out = Path(out)
    path = output_lock_path(out, folder=folder)
    while True:
        refuse_link(path, out)
        try:  # never through a link (O_NOFOLLOW): a link made since the check fails with ELOOP
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as e:
            refuse_link(path, out)
            raise OutputError(e.errno or errno.EIO, f"cannot write the output {out} ({e.strerror}: its lock file "
                                                    f"{path.name} cannot be made there); nothing was published") from e
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a FIFO, or a hard link: its bytes are another file's too
            os.close(fd)
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
            raise OutputError(errno.EEXIST, f"cannot write the output {out}: its lock file {path} is {what}; "
                                            "pact merge writes only files it makes; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise OutputError(errno.EBUSY, f"{out}: another run is writing this output (process {holder or '?'}, "
                                           f"lock {path}); wait for it to end or choose another name") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # its holder ended and removed it between our open and our lock
            same = False
        if same:
            break
        os.close(fd)
    key = os.path.abspath(path)
    held_locks[key] = []
    try:
        ended = os.read(fd, 32).decode(errors="replace").strip()
        if ended:  # a run that ended without removing it (SIGKILL): it holds no lock, so its process is gone
            log.info("%s: took over the lock file %s that an ended run (process %s) left", out, path.name, ended)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        path.unlink(missing_ok=True)  # while still holding it: a waiting opener sees another inode and retries
        os.close(fd)
        for other in held_locks.pop(key, []):  # the lock of a folder swapped in (pactlib.recipe.FolderFiles)
            os.close(other)


def check_out_suffix(out: str | os.PathLike, max_shard_size=None) -> str:
    """The kind of output ``out`` names: ``"safetensors"``, ``"torch"`` or ``"index"``.

    Raises:
        CheckpointError: another extension, or sharding asked for a torch output.
    """
    out = Path(out)
    if out.name.endswith(INDEX_SUFFIX):
        return "index"
    s = out.suffix.lower()
    if s in SAFETENSORS:
        return "safetensors"
    if s in TORCH:
        if max_shard_size is not None:
            raise CheckpointError(f"{out}: a sharded output is written as safetensors; "
                                  f"name it *.safetensors (or *.safetensors{INDEX_SUFFIX})")
        return "torch"
    hint = "; pact merge writes a model folder with --out DIR/ (a trailing /)"
    raise CheckpointError(f"{out}: {no_extension(out, s)}; use one of {', '.join(SAFETENSORS + TORCH)} or "
                          f"*.safetensors{INDEX_SUFFIX}{hint}")


class CheckpointWriter:
    """Writes a state dict key by key, in the declared order, atomically (module docstring).

    Args:
        out: ``*.safetensors`` (one file, or shards + index when the keys exceed
            ``max_shard_size``), ``*.safetensors.index.json`` (always sharded) or a torch file
            (collected in memory, saved on commit).
        entries: (key, shape, dtype) of every key, in the order they will be written; the dtype
            a torch dtype or a safetensors name (``"F32"``; not for a torch file).
        max_shard_size: bytes (or ``"2GB"``, :func:`parse_size`) per shard; a tensor larger than
            that gets a shard of its own.
        metadata: safetensors ``__metadata__`` (default ``{"format": "pt"}``, as Hugging Face
            writes).

    ``write(key, tensor)`` takes a key whole or in consecutive chunks along its first dimension
    (``write_bytes(key, data)`` the same as bytes);
    ``commit()`` publishes the files and returns them (the index last); leaving the ``with``
    block without a commit (an error, an interrupt) removes every temporary file.
    """

    def __init__(self, out: str | os.PathLike, entries: Sequence[tuple[str, Sequence[int], torch.dtype | str]], *,
                 max_shard_size: int | str | None = None, metadata: Mapping[str, str] | None = None):
        if sys.byteorder != "little":
            raise RuntimeError("safetensors data is little-endian; this machine is not")
        self.out = Path(out)
        self.kind = check_out_suffix(self.out, max_shard_size)
        self.entries = [(k, tuple(int(s) for s in shape), dtype) for k, shape, dtype in entries]
        for k, _, dtype in self.entries:
            if dtype_name(dtype) is None:
                raise CheckpointError(f"cannot write key {k!r}: dtype {dtype} has no safetensors name")
        self.metadata = {"format": "pt"} if metadata is None else dict(metadata)
        self._sizes = {k: tensor_bytes(s, d) for k, s, d in self.entries}
        self._pos = -1  # index of the key being written
        self._done = 0  # bytes of that key written so far
        self._committed = False
        self._memory: dict[str, list[Tensor]] | None = {} if self.kind == "torch" else None
        limit = parse_size(max_shard_size) if max_shard_size is not None else None
        groups: list[list] = [[]]
        size = 0
        for e in self.entries:
            n = self._sizes[e[0]]
            if limit is not None and groups[-1] and size + n > limit:
                groups.append([])
                size = 0
            groups[-1].append(e)
            size += n
        self.sharded = self.kind == "index" or len(groups) > 1
        if self.kind == "torch":
            self.files: list[_SafetensorsFile] = []
            self.index = None
        elif self.sharded:
            self.index, paths = shard_names(self.out, len(groups))
            self.files = [_SafetensorsFile(p, g, self.metadata) for p, g in zip(paths, groups)]
        else:
            self.index = None
            self.files = [_SafetensorsFile(self.out, groups[0], self.metadata)]
        self._file_of = {e[0]: i for i, f in enumerate(self.files) for e in f.entries}
        self._current = -1

    @property
    def path(self) -> Path:
        """The output's path: the file, or the index of a sharded output."""
        return self.index if self.index is not None else self.out

    @property
    def total_size(self) -> int:
        return sum(self._sizes.values())

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, *exc) -> None:
        if not self._committed:
            self.abort()

    def write(self, key: str, tensor: Tensor) -> None:
        """Append ``tensor`` (all of ``key``, or its next rows) to the output.

        Raises:
            ValueError: a key out of order, a wrong dtype, or more bytes than the key holds.
        """
        i = self._advance(key, tensor.numel() * tensor.element_size(), tensor.dtype)
        if i is None:
            self._memory.setdefault(key, []).append(tensor.detach().clone())
        else:
            self.files[i].write(tensor)

    def write_bytes(self, key: str, data) -> None:
        """Append ``data``, a bytes-like object holding the next bytes of ``key`` (all of it, or
        its next rows, in the declared dtype, little-endian), to a safetensors output: the
        writer of callers that hold no tensors.

        Raises:
            ValueError: a torch output; a key out of order, or more bytes than the key holds.
        """
        if self._memory is not None:
            raise ValueError(f"writer: {self.out} is a torch file; write tensors to it")
        self.files[self._advance(key, len(memoryview(data).cast("B")), None)].write_bytes(data)

    def _advance(self, key: str, n: int, dtype) -> int | None:
        """Account ``n`` more bytes of ``key`` (of ``dtype``; None: unchecked); the index of the
        file they go to (its shard open, the previous closed), or None for a torch output."""
        if self._pos < 0 or key != self.entries[self._pos][0]:  # the next key (a key is written once)
            if self._pos >= 0 and self._done != self._sizes[self.entries[self._pos][0]]:
                raise ValueError(f"writer: key {self.entries[self._pos][0]!r} is incomplete")
            self._pos += 1
            self._done = 0
            if self._pos >= len(self.entries):
                raise ValueError(f"writer: key {key!r} after the last declared key")
        name, shape, declared = self.entries[self._pos]
        if key != name:
            raise ValueError(f"writer: expected key {name!r}, got {key!r}")
        if dtype is not None and dtype_name(dtype) != dtype_name(declared):
            raise ValueError(f"writer: key {key!r} declared {declared}, got {dtype}")
        if self._done + n > self._sizes[key]:
            raise ValueError(f"writer: key {key!r} gets more than its {tuple(shape)} entries")
        self._done += n
        if self._memory is not None:
            return None
        i = self._file_of[key]
        while self._current < i:  # finish the previous shard, start this one
            if self._current >= 0:
                self.files[self._current].close()
            self._current += 1
        return i

    def commit(self) -> list[Path]:
        """Check that every key was written, then publish the files (index last); return them.
        A caller that publishes an output calls it inside :func:`pactlib.io.signals_held`, so
        that a signal cannot stop it between two shards.

        Raises:
            ValueError: keys not (fully) written.
        """
        written = self._pos + 1 if self._pos >= 0 and self._done == self._sizes[self.entries[self._pos][0]] else self._pos
        if written < len(self.entries):
            missing = [e[0] for e in self.entries[max(written, 0):]]
            raise ValueError(f"writer: {len(missing)} key(s) not written, e.g. {missing[:3]}")
        if self._memory is not None:
            import torch

            sd = {}
            for k, shape, _ in self.entries:
                parts = self._memory.pop(k)
                sd[k] = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(shape)
            save_state_dict(sd, self.out)
            self._committed = True
            return [self.out]
        for f in self.files[self._current if self._current >= 0 else 0:]:
            f.close()  # the open one, and empty shards never started (no keys left)
        published: list[Path] = []
        try:
            for f in self.files:
                f.publish()
                published.append(f.path)
            if self.index is not None:
                data = {"metadata": {"total_size": self.total_size},
                        "weight_map": {k: self.files[self._file_of[k]].path.name for k, _, _ in self.entries}}
                write_atomic(self.index, json.dumps(data, indent=2) + "\n")
                published.append(self.index)
        except BaseException:
            for p in published:
                p.unlink(missing_ok=True)
            raise
        self._committed = True
        return published

    def abort(self) -> None:
        """Remove every temporary file; nothing is published."""
        for f in self.files:
            f.discard()
        self._memory = None if self._memory is None else {}
