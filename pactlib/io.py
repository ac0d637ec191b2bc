"""Reading and writing state dicts (``.safetensors``, ``.pt``/``.pth``/``.bin``), atomically.

Reading ``.pt`` uses ``torch.load(weights_only=True)``: no pickled code runs. A checkpoint that
is a whole pickled module (as some task-vector repositories save) needs a trusted reader
(:func:`pactlib.lazy.trusted_reader`; pactlib's is :func:`pactlib.models.clip.load_clip_checkpoint`)
with an explicit opt-in.

``.safetensors`` files are written by :func:`write_safetensors` (streamed: :class:`StreamedFile`), byte for
byte what ``safetensors.torch.save_file`` writes, without numpy; the format itself (dtypes, the
header) is :mod:`pactlib.safetensors_io`'s. Model folders and sharded checkpoints are read through
:func:`folder_checkpoint` and :func:`read_sharded`.

Every output goes through :func:`new_temp` (a locked temporary file beside it) and is renamed into
place when complete (:func:`atomic_output`, :func:`atomic_write`); a failed write (a full disk)
raises :class:`OutputError`, which names the output, and leaves nothing behind. An output of
several files (shards and their index, a model folder) is published inside :func:`signals_held`,
so that a Ctrl-C or SIGTERM cannot stop it half published.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pickle
import pickletools
import signal
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    from torch import Tensor


from .checks import CheckpointError
from .safetensors_io import header_bytes, tensor_bytes_view, torch_tables

SAFETENSORS = (".safetensors",)
TORCH = (".pt", ".pth", ".bin", ".ckpt")
#: What a model folder's checkpoint is read from, first found first: Hugging Face's order
#: (transformers reads ``model.safetensors`` before its index, and both before ``pytorch_model.bin``),
#: open_clip's names after Hugging Face's of the same format
FOLDER_ORDER = ("model.safetensors", "model.safetensors.index.json", "open_clip_model.safetensors",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "open_clip_pytorch_model.bin")


def check_suffix(path: str | os.PathLike) -> str:
    """The checkpoint extension of ``path`` (lower case).

    Raises:
        CheckpointError: an extension that is neither safetensors nor torch (the supported ones listed).
    """
    s = Path(path).suffix.lower()
    if s not in SAFETENSORS + TORCH:
        raise CheckpointError(f"{path}: {no_extension(path, s)}; use one of {', '.join(SAFETENSORS + TORCH)}")
    return s


def is_folder_output(out: str | os.PathLike) -> bool:
    """Whether ``--out`` names a model folder: a trailing ``/`` or an existing folder."""
    return str(out).endswith(("/", os.sep)) or Path(out).is_dir()


def no_extension(path: str | os.PathLike, suffix: str) -> str:
    """What a message says of a checkpoint name with the wrong extension ``suffix``: a folder
    (or a name meant as one, ``Llama-3.2-1B/``) or a name without an extension is told to name
    a file."""
    if is_folder_output(path):
        what = "a folder"
    elif suffix:
        return f"unknown checkpoint extension {suffix!r}"
    else:
        what = "a name without an extension"
    return f"{what}, not a checkpoint file (name the file, e.g. model.safetensors)"


def load_state_dict(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Tensor]:
    """Load a state dict from ``path``: a checkpoint file, a sharded checkpoint's
    ``*.index.json`` (every shard it names), or a model folder (its checkpoint, as ``pact merge``
    reads it: :func:`folder_checkpoint`).

    Accepts a plain ``{name: tensor}`` dict, or one wrapped under ``"state_dict"``/``"model"``.
    With ``mmap`` a torch file's tensors are memory-mapped (``torch.load(mmap=True)``; a file in
    the legacy, non-zip format is read whole); safetensors files are read whole either way.

    Raises:
        FileNotFoundError: ``path`` does not exist, or is a folder without a checkpoint.
        CheckpointError: as ``pact merge``'s reader (:func:`read_sharded`): a
            malformed index, a key in two shards, a key of the index in no shard; unknown
            extension, unreadable file, or content that is not a mapping of
            tensors (naming the file and the offending key). A torch file that is corrupt or not a
            torch file at all says it is "not a readable torch checkpoint"; one that is well formed
            but holds pickled Python objects the weights-only loader refuses gets "cannot read
            checkpoint" with the ``pickle.UnpicklingError`` as its ``__cause__``.
    """
    import torch
    path = Path(path)
    if path.is_dir():
        return load_state_dict(folder_checkpoint(path), mmap=mmap)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.name.endswith(".index.json"):
        def shard(f: Path) -> dict[str, Tensor]:
            check_suffix(f)  # a shard is a checkpoint file, never another index
            return load_state_dict(f, mmap=mmap)

        return read_sharded(path, shard)
    suffix = check_suffix(path)
    try:
        if suffix in SAFETENSORS:
            from safetensors.torch import load_file
            sd = load_file(str(path))
        else:
            sd = _torch_load(path, mmap)
    except CheckpointError:
        raise
    except Exception as e:  # corrupt safetensors / a pickled module (weights_only refuses it)
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {str(e)[:200]})") from e
    if isinstance(sd, Mapping):
        for wrapper in ("state_dict", "model"):
            if wrapper in sd and isinstance(sd[wrapper], Mapping) and len(sd) <= 4:
                sd = sd[wrapper]
                break
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path}: expected a state dict, found {type(sd).__name__}")
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{path}: key {k!r} holds a {type(v).__name__}, not a tensor")
    return dict(sd)


def _torch_load(path: Path, mmap: bool):
    """``torch.load(weights_only=True)`` of ``path``.

    Raises:
        pickle.UnpicklingError: a well-formed torch file that the weights-only loader refuses (it
            holds pickled Python objects, e.g. a whole module; reading it needs trust).
        CheckpointError: anything else that fails (naming the file): not a torch file (neither a
            zip archive nor a pickle), or one that does not parse as one (corrupt, truncated).
    """
    try:
        return _torch_load_weights(path, mmap)
    except Exception as e:
        problem = _torch_format_problem(path)
        if problem is None and isinstance(e, pickle.UnpicklingError):
            raise
        why = problem or e
        # not chained to the UnpicklingError: the CLI takes that cause for "pickled objects, needs trust"
        raise CheckpointError(f"{path}: not a readable torch checkpoint, corrupt or of another format "
                              f"({type(why).__name__}: {str(why)[:200]})") from why


def _torch_format_problem(path: Path) -> Exception | None:
    """Why ``path`` is not a well-formed ``torch.save`` file, or None if it is one: a zip archive
    (``PK\\x03\\x04``) holding a ``data.pkl`` that parses as a whole pickle, or the legacy format,
    pickles (first byte 0x80, the PROTO opcode) of which the first holds torch's magic number.
    Only parses the pickles (:func:`pickletools.genops`); nothing in them runs."""
    import torch
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head == b"PK\x03\x04":
                with zipfile.ZipFile(f) as z:
                    pkl = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                    if not pkl:
                        raise ValueError("a zip archive without a data.pkl")
                    with z.open(pkl[0]) as p:
                        list(pickletools.genops(p))
            elif head[:1] == b"\x80":
                f.seek(0)
                capped = _Capped(f, path.stat().st_size)
                if torch.serialization.MAGIC_NUMBER not in [arg for _, arg, _ in pickletools.genops(capped)]:
                    raise ValueError("a pickle without torch's magic number")
                for _ in range(3):  # protocol version, system info, the object
                    list(pickletools.genops(capped))
            else:
                raise ValueError(f"neither a zip archive nor a pickle (starts with {head!r})" if head
                                 else "the file is empty")
    except Exception as e:  # zipfile.BadZipFile, ValueError (pickletools), OSError
        return e
    return None


class _Capped:
    """A binary file whose ``read(n)`` asks for no more than what is left: pickletools reads
    lengths from the data, and a buffered ``read(n)`` allocates n bytes first."""

    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n if n < 0 else min(n, self.size - self.f.tell()))

    def readline(self) -> bytes:
        return self.f.readline()

    def tell(self) -> int:
        return self.f.tell()


def _torch_load_weights(path: Path, mmap: bool):
    import torch
    if mmap:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
    return torch.load(path, map_location="cpu", weights_only=True)


def folder_checkpoint(folder: str | os.PathLike) -> Path:
    """The file (or ``*.index.json``) a model folder's checkpoint is read from: the first of
    :data:`FOLDER_ORDER` present.

    Raises:
        FileNotFoundError: none is (the names are listed).
    """
    folder = Path(folder)
    for f in FOLDER_ORDER:
        if (folder / f).is_file():
            return folder / f
    hint = ""
    if (folder / "adapter_config.json").is_file():
        hint = (" (it holds a PEFT adapter: give it to pact merge --lora-adapters, or read its task vector with "
                "pactlib.peft.read_adapter)")
    raise FileNotFoundError(f"no checkpoint in folder {folder}: expected one of {FOLDER_ORDER}{hint}")


def _read_index(index: Path) -> dict[str, Path]:
    """{key: shard path} of a Hugging Face ``*.index.json``.

    Raises:
        CheckpointError: invalid JSON, no non-empty ``weight_map``, a value that is not a file
            name in the index's folder (an absolute path, ``..``), or a shard missing from the
            folder (all naming the index).
    """
    try:
        data = json.loads(index.read_text())
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{index}: not a readable JSON index ({type(e).__name__}: {e})") from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no 'weight_map' (a non-empty mapping of key -> shard file)")
    bad = sorted({repr(f) for f in weight_map.values()
                  if not isinstance(f, str) or not f or Path(f).is_absolute() or ".." in Path(f).parts})
    if bad:
        raise CheckpointError(f"{index}: weight_map values must be the names of shard files in the index's folder, "
                              f"got {', '.join(bad[:3])}")
    out = {k: index.parent / f for k, f in weight_map.items()}
    missing = sorted({p.name for p in out.values() if not p.is_file()})
    if missing:
        raise CheckpointError(f"{index}: weight_map names shard(s) missing from {index.parent}: {missing[:5]}")
    return out


def read_sharded(index: str | os.PathLike, read: Callable[[Path], dict]) -> dict:
    """The union of ``read(shard)`` (a ``{key: …}`` dict) over the shards a sharded checkpoint's
    ``*.index.json`` names, in name order (the order ``load_clip_checkpoint(folder)`` gives).

    Raises:
        CheckpointError: as :func:`_read_index`; a key in two shards; a key of the weight_map in
            no shard (all named).
    """
    index = Path(index)
    weight_map = _read_index(index)
    out: dict = {}
    for shard in sorted(set(weight_map.values())):
        part = read(shard)
        dup = out.keys() & part.keys()
        if dup:
            raise CheckpointError(f"{shard}: keys also in another shard: {sorted(dup)[:4]}")
        out.update(part)
    lost = sorted(k for k in weight_map if k not in out)
    if lost:
        raise CheckpointError(f"{index}: {len(lost)} key(s) of the weight_map are in no shard: {lost[:5]}")
    return out


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 without the process's umask (``mkstemp``, which
    the atomic writers use, makes 0o600 files). Read from /proc where it is (Linux), so the
    umask is never changed, not even for a moment; else by setting it and back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


class OutputError(OSError):
    """Writing an output failed (a full disk, a file size limit, a lost mount, ...). The message
    names the output; nothing was published and the temporary files are gone."""

    def __str__(self) -> str:
        return str(self.strerror)


def output_error(path: str | os.PathLike, e: BaseException) -> OutputError:
    """The :class:`OutputError` of a failed write of ``path``: the errno and reason of the first
    ``OSError`` in ``e``'s chain (``torch.save`` turns the file's ``OSError`` into a
    ``RuntimeError`` with it as the context), else ``e``'s own text."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, OutputError):
        return cause
    why = (cause.strerror or str(cause)) if cause is not None else f"{type(e).__name__}: {str(e)[:200]}"
    code = cause.errno if cause is not None and cause.errno else errno.EIO
    return OutputError(code, f"cannot write the output {path} ({why}); nothing was published")


def open_output(fd: int) -> BinaryIO:
    """The binary file every output's bytes go through (a buffered file on ``fd``)."""
    return os.fdopen(fd, "wb")


def new_temp(path: str | os.PathLike) -> tuple[Path, BinaryIO]:
    """A new temporary file beside ``path`` (``.<name>.<random>.tmp``, the mode ``open()`` would
    give it), open for writing and locked (``flock``) while it is open: a clean-up of stale
    temporary files (:func:`pactlib.lazy.remove_stale_outputs`) leaves a locked one alone.

    Raises:
        OutputError: the folder cannot be made or written (naming ``path``).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise output_error(path, e) from e
    try:
        os.fchmod(fd, new_file_mode())  # as open() would make it, not mkstemp's 0o600
        fcntl.flock(fd, fcntl.LOCK_EX)
        return Path(tmp), open_output(fd)
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


#: The signals :func:`signals_held` holds back
HELD_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_hold: dict = {"depth": 0, "published": []}
_outputs: list[Path] = []  # what signals_held blocks published in this process, in order


def published_outputs() -> list[Path]:
    """The paths that :func:`signals_held` blocks of this process published, in order (a copy):
    a caller notes its length before a run and reads what the run published after, also when a
    signal stopped it."""
    return list(_outputs)


@contextlib.contextmanager
def signals_held() -> Iterator[list[Path]]:
    """Hold SIGINT, SIGTERM and SIGHUP back while the block publishes an output, so that it is
    published whole or not at all. The block appends the paths it published to the list it is
    given; when it ends normally they join :func:`published_outputs`. A signal that arrives in
    the block is delivered when the block ends, to the handler in place before it (Python's
    raises ``KeyboardInterrupt``); a signal that was ignored stays ignored.

    Nested blocks share the outermost block's hold and list. Outside the main thread (where no
    handler can be set) the block runs with the signals as they are.
    """
    if _hold["depth"]:
        _hold["depth"] += 1
        try:
            yield _hold["published"]
        finally:
            _hold["depth"] -= 1
        return
    published: list[Path] = []
    if threading.current_thread() is not threading.main_thread():
        yield published
        _outputs.extend(published)
        return
    pending: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in HELD_SIGNALS}
    previous = {sig: h for sig, h in previous.items() if h is not signal.SIG_IGN}  # ignored: left so
    for sig in previous:
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    _hold.update(depth=1, published=published)
    try:
        yield published
        _outputs.extend(published)
    finally:
        _hold.update(depth=0, published=[])
        for sig, h in previous.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(pending):  # each signal once, in the order they came
            signal.raise_signal(sig)  # its handler runs now; one that raises ends the loop


def close_quietly(f) -> None:
    """Close ``f``, ignoring a failed final flush (a full disk): for clean-up paths."""
    try:
        f.close()
    except OSError:
        pass


@contextlib.contextmanager
def _published(path: Path, sync: bool) -> Iterator[tuple[Path, BinaryIO]]:
    tmp, f = new_temp(path)
    try:
        yield tmp, f
        f.flush()
        if sync:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        close_quietly(f)
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            raise output_error(path, e) from e
        raise
    close_quietly(f)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, sync: bool = False) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` (``os.replace``, atomic) when the block ends; on any
    error the temporary file is removed and ``path`` is left as it was. ``sync``: ``fsync``
    before the rename.

    Raises:
        OutputError: a write, the flush or the rename failed (a full disk; naming ``path``).
    """
    with _published(Path(path), sync) as (_, f):
        yield f


def atomic_write(path: str | os.PathLike, write_fn: Callable[[Path], object]) -> Path:
    """Call ``write_fn(tmp_path)``, then rename the temporary file to ``path`` atomically (as
    :func:`atomic_output`, for writers that take a path; ``write_fn`` opens it itself).

    Raises:
        OutputError: as :func:`atomic_output`.
    """
    path = Path(path)
    with _published(path, False) as (tmp, _):
        write_fn(tmp)
    return path


def write_atomic(path: str | os.PathLike, data: bytes | str, *, sync: bool = False) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically (:func:`atomic_output`).

    Raises:
        OutputError: as :func:`atomic_output`.
    """
    with atomic_output(path, sync=sync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def save_state_dict(sd: Mapping[str, Tensor], path: str | os.PathLike, *, metadata: dict[str, str] | None = None) -> Path:
    """Save ``sd`` atomically as safetensors or torch format, chosen by the extension.

    Tensors are made contiguous copies for safetensors (shared storage is not allowed there).

    Raises:
        CheckpointError: unknown extension (the supported ones listed) or a non-tensor value,
            before anything is written.
    """
    import torch
    suffix = check_suffix(path)  # as given: a trailing / says a folder was meant
    path = Path(path)
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"cannot save key {k!r}: a {type(v).__name__}, not a tensor")
    if suffix in SAFETENSORS:
        return write_safetensors(sd, path, metadata=metadata)
    with atomic_output(path) as f:  # a file object: an error names the output, the archive name is fixed
        torch.save(dict(sd), f)
    return path


class StreamedFile:
    """One safetensors file written tensor by tensor, in the declared order, into a temporary
    file beside ``path`` (:func:`pactlib.io.new_temp`: locked while open, so no clean-up takes it
    for stale). It stays open until :meth:`publish` (renamed to ``path``) or :meth:`discard`.

    Raises (any method):
        OutputError: a write or the flush failed (a full disk), naming ``path``.
    """

    def __init__(self, path: Path, entries: list[tuple[str, tuple[int, ...], torch.dtype | str]],
                 metadata: Mapping[str, str] | None):
        self.path, self.entries, self.metadata = Path(path), entries, metadata
        self.tmp: Path | None = None
        self._f = None

    def _put(self, data) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            raise output_error(self.path, e) from e

    def open(self) -> None:
        head = header_bytes(self.entries, self.metadata)
        self.tmp, self._f = new_temp(self.path)
        self._put(head)

    def write(self, data: Tensor) -> None:
        """Append ``data``'s bytes (a whole tensor, or its next rows)."""
        flat = data.detach().cpu().contiguous().reshape(-1)
        self.write_bytes(tensor_bytes_view(flat))  # in place, no numpy

    def write_bytes(self, data) -> None:
        """Append ``data`` (a bytes-like object: the next bytes of the tensors, in order)."""
        if self._f is None:
            self.open()
        if len(data):
            self._put(data)

    def close(self) -> None:
        """Flush the file to disk (it stays open, and locked, until published)."""
        if self._f is None:
            self.open()
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            raise output_error(self.path, e) from e

    def publish(self) -> None:
        os.replace(self.tmp, self.path)
        close_quietly(self._f)

    def discard(self) -> None:
        """Remove the temporary file; a failed last flush (a full disk) is ignored."""
        if self._f is not None:
            close_quietly(self._f)
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def write_safetensors(sd: Mapping[str, Tensor], path: str | os.PathLike, *,
                      metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``sd`` to ``path`` atomically, one tensor at a time (each made a contiguous CPU
    tensor), in ``safetensors.torch.save_file``'s order (dtype, then name) and so with its bytes
    (whose ``__metadata__`` keys come in hash order when there are several; here they are sorted).

    Raises:
        CheckpointError: a dtype safetensors cannot store, or metadata that is not str -> str
            (before anything is written).
        OutputError: the write failed (naming ``path``; nothing is left behind).
    """
    rank = torch_tables()[3]
    bad = sorted({str(v.dtype) for v in sd.values() if v.dtype not in rank})
    if bad:
        raise CheckpointError(f"{path}: safetensors cannot store dtype(s) {', '.join(bad)}")
    keys = sorted(sd, key=lambda k: (rank[sd[k].dtype], k))
    try:
        f = StreamedFile(Path(path), [(k, tuple(sd[k].shape), sd[k].dtype) for k in keys], metadata)
        f.open()
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    try:
        for k in keys:
            f.write(sd[k])
        f.close()
        f.publish()
    except BaseException:
        f.discard()
        raise
    return Path(path)
