"""Reading and writing state dicts (``.safetensors``, ``.pt``/``.pth``/``.bin``), atomically.

Reading ``.pt`` uses ``torch.load(weights_only=True)``: no pickled code runs. A checkpoint that
is a whole pickled module (as some task-vector repositories save) needs a trusted reader
(:func:`pactlib.lazy.trusted_reader`; pactlib's is :func:`pactlib.models.clip.load_clip_checkpoint`)
with an explicit opt-in.

``.safetensors`` files are written by :func:`write_safetensors`, byte for byte what
``safetensors.torch.save_file`` writes (tensors sorted by dtype, then name), but without numpy,
which ``safetensors.torch``'s writer imports: the engine needs torch and safetensors only.
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import pickletools
import struct
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .checks import CheckpointError

SAFETENSORS = (".safetensors",)
TORCH = (".pt", ".pth", ".bin", ".ckpt")


def check_suffix(path: str | os.PathLike) -> str:
    """The checkpoint extension of ``path`` (lower case).

    Raises:
        CheckpointError: an extension that is neither safetensors nor torch (the supported ones listed).
    """
    s = Path(path).suffix.lower()
    if s not in SAFETENSORS + TORCH:
        raise CheckpointError(f"{path}: unknown checkpoint extension {s or '(none)'!r}; "
                              f"use one of {', '.join(SAFETENSORS + TORCH)}")
    return s


def load_state_dict(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Tensor]:
    """Load a state dict from ``path``.

    Accepts a plain ``{name: tensor}`` dict, or one wrapped under ``"state_dict"``/``"model"``.
    With ``mmap`` a torch file's tensors are memory-mapped (``torch.load(mmap=True)``; a file in
    the legacy, non-zip format is read whole); safetensors files are read whole either way.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: unknown extension, unreadable file, or content that is not a mapping of
            tensors (naming the file and the offending key). A torch file that is corrupt or not a
            torch file at all says it is "not a readable torch checkpoint"; one that is well formed
            but holds pickled Python objects the weights-only loader refuses gets "cannot read
            checkpoint" with the ``pickle.UnpicklingError`` as its ``__cause__``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
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
        if not isinstance(v, Tensor):
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
    if mmap:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
    return torch.load(path, map_location="cpu", weights_only=True)


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


def atomic_write(path: str | os.PathLike, write_fn) -> Path:
    """Call ``write_fn(tmp_path)`` then atomically rename the temporary file to ``path``.

    The temporary file lives in the destination directory, so ``os.replace`` is atomic; on any
    error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, new_file_mode())  # as open() would make it, not mkstemp's 0o600
    os.close(fd)
    try:
        write_fn(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_state_dict(sd: Mapping[str, Tensor], path: str | os.PathLike, *, metadata: dict[str, str] | None = None) -> Path:
    """Save ``sd`` atomically as safetensors or torch format, chosen by the extension.

    Tensors are made contiguous copies for safetensors (shared storage is not allowed there).

    Raises:
        CheckpointError: unknown extension (the supported ones listed) or a non-tensor value,
            before anything is written.
    """
    path = Path(path)
    suffix = check_suffix(path)
    for k, v in sd.items():
        if not isinstance(v, Tensor):
            raise CheckpointError(f"cannot save key {k!r}: a {type(v).__name__}, not a tensor")
    if suffix in SAFETENSORS:
        return atomic_write(path, lambda p: write_safetensors(sd, p, metadata=metadata))
    return atomic_write(path, lambda p: torch.save(dict(sd), p))


#: safetensors' dtype names, in the order its writer lays tensors out (largest dtype first, then by
#: name): the order of the Rust ``Dtype`` enum, descending.
_ST_ORDER: tuple[tuple[torch.dtype, str], ...] = (
    (torch.uint64, "U64"), (torch.int64, "I64"), (torch.float64, "F64"), (torch.complex64, "C64"),
    (torch.float32, "F32"), (torch.uint32, "U32"), (torch.int32, "I32"), (torch.bfloat16, "BF16"),
    (torch.float16, "F16"), (torch.uint16, "U16"), (torch.int16, "I16"), (torch.float8_e4m3fn, "F8_E4M3"),
    (torch.float8_e5m2, "F8_E5M2"), (torch.int8, "I8"), (torch.uint8, "U8"), (torch.bool, "BOOL"))
_ST_RANK = {d: i for i, (d, _) in enumerate(_ST_ORDER)}
_ST_NAME = dict(_ST_ORDER)


def tensor_bytes_view(t: Tensor) -> memoryview:
    """The bytes of the contiguous CPU tensor ``t``, in place (no copy, no numpy); valid while
    ``t`` lives."""
    n = t.numel() * t.element_size()
    if not n:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr()))


def write_safetensors(sd: Mapping[str, Tensor], path: str | os.PathLike, *,
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``sd`` to ``path`` in the safetensors format (not atomic: see :func:`save_state_dict`),
    one tensor at a time (each made a contiguous CPU tensor), the same bytes as
    ``safetensors.torch.save_file`` (whose ``__metadata__`` keys come in hash order when there are
    several; here they are sorted).

    Raises:
        CheckpointError: a dtype safetensors cannot store, or metadata that is not str -> str.
    """
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointError(f"{path}: safetensors metadata must map str to str, got {dict(metadata)!r:.200}")
    bad = sorted({str(v.dtype) for v in sd.values() if v.dtype not in _ST_RANK})
    if bad:
        raise CheckpointError(f"{path}: safetensors cannot store dtype(s) {', '.join(bad)}")
    keys = sorted(sd, key=lambda k: (_ST_RANK[sd[k].dtype], k))
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(sorted(metadata.items()))
    off = 0
    for k in keys:
        v = sd[k]
        n = v.numel() * v.element_size()
        header[k] = {"dtype": _ST_NAME[v.dtype], "shape": list(v.shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for k in keys:
            t = sd[k].detach().cpu().contiguous()
            f.write(tensor_bytes_view(t))
            del t
