"""The safetensors format in one place: the dtype table, the header, a file's layout read through
safetensors' own ``safe_open``, and the one writer, which streams tensor by tensor.

A file is an 8-byte little-endian header length, a JSON header ``{key: {"dtype", "shape",
"data_offsets"}}`` (with an optional ``"__metadata__"`` of str -> str) padded with spaces to a
multiple of 8, then the tensors' bytes. The writer needs torch only (``safetensors.torch``'s own
writer imports numpy) and, given the same order, writes what ``safetensors.torch.save_file``
writes, byte for byte (:func:`write_safetensors`).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from .checks import CheckpointError
from .io import close_quietly, new_temp, output_error

#: safetensors' dtype names, in the order its writer lays tensors out (largest dtype first, then
#: by name): the order of the Rust ``Dtype`` enum, descending.
ORDER: tuple[tuple[torch.dtype, str], ...] = (
    (torch.uint64, "U64"), (torch.int64, "I64"), (torch.float64, "F64"), (torch.complex64, "C64"),
    (torch.float32, "F32"), (torch.uint32, "U32"), (torch.int32, "I32"), (torch.bfloat16, "BF16"),
    (torch.float16, "F16"), (torch.uint16, "U16"), (torch.int16, "I16"), (torch.float8_e4m3fn, "F8_E4M3"),
    (torch.float8_e5m2, "F8_E5M2"), (torch.int8, "I8"), (torch.uint8, "U8"), (torch.bool, "BOOL"))
#: name -> torch dtype, and back
DTYPES: dict[str, torch.dtype] = {name: d for d, name in ORDER}
DTYPE_NAMES: dict[torch.dtype, str] = dict(ORDER)
_RANK = {d: i for i, (d, _) in enumerate(ORDER)}

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype``."""
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def tensor_bytes_view(t: Tensor) -> memoryview:
    """The bytes of the contiguous CPU tensor ``t``, in place (no copy, no numpy); valid while
    ``t`` lives."""
    n = t.numel() * t.element_size()
    if not n:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr()))


def header_bytes(entries: Sequence[tuple[str, Sequence[int], torch.dtype]],
                 metadata: Mapping[str, str] | None) -> bytes:
    """The length prefix and header of a file holding ``entries`` (key, shape, dtype) in that order.

    Raises:
        CheckpointError: a dtype safetensors cannot store, or metadata that is not str -> str.
    """
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointError(f"safetensors metadata must map str to str, got {dict(metadata)!r:.200}")
    bad = sorted({str(d) for _, _, d in entries if d not in DTYPE_NAMES})
    if bad:
        raise CheckpointError(f"safetensors cannot store dtype(s) {', '.join(bad)}")
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(sorted(metadata.items()))
    off = 0
    for key, shape, dtype in entries:
        n = tensor_bytes(shape, dtype)
        header[key] = {"dtype": DTYPE_NAMES[dtype], "shape": [int(s) for s in shape], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def read_layout(path: str | os.PathLike) -> tuple[Layout, dict[str, str]]:
    """({key: (shape, dtype)} in the order of the data, metadata) of a safetensors file, from its
    header (``safe_open``, which checks the header against the file).

    Raises:
        CheckpointError: not a readable safetensors file, or a dtype torch has no name for here
            (naming the file and the key).
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            layout: Layout = {}
            for key in f.offset_keys():
                sl = f.get_slice(key)
                dtype = DTYPES.get(sl.get_dtype())
                if dtype is None:
                    raise ValueError(f"key {key!r}: unsupported dtype {sl.get_dtype()!r}")
                layout[key] = (tuple(int(s) for s in sl.get_shape()), dtype)
    except Exception as e:  # corrupt / truncated / not safetensors
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {str(e)[:200]})") from e
    return layout, dict(meta)


def read_offsets(path: str | os.PathLike) -> dict[str, int]:
    """{key: the absolute byte offset of its data in the file} of a safetensors file, from its
    header (8-byte length, JSON, then the data). Call it after :func:`read_layout`, which checks
    the header against the file.

    Raises:
        CheckpointError: the header cannot be read (naming the file).
    """
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"{path}: cannot read checkpoint header ({type(e).__name__}: {str(e)[:200]})") from e
    return {k: 8 + n + int(v["data_offsets"][0]) for k, v in header.items() if k != "__metadata__"}


class StreamedFile:
    """One safetensors file written tensor by tensor, in the declared order, into a temporary
    file beside ``path`` (:func:`pactlib.io.new_temp`: locked while open, so no clean-up takes it
    for stale). It stays open until :meth:`publish` (renamed to ``path``) or :meth:`discard`.

    Raises (any method):
        OutputError: a write or the flush failed (a full disk), naming ``path``.
    """

    def __init__(self, path: Path, entries: list[tuple[str, tuple[int, ...], torch.dtype]],
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
        if self._f is None:
            self.open()
        flat = data.detach().cpu().contiguous().reshape(-1)
        if flat.numel():
            self._put(tensor_bytes_view(flat))  # in place, no numpy

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
    bad = sorted({str(v.dtype) for v in sd.values() if v.dtype not in _RANK})
    if bad:
        raise CheckpointError(f"{path}: safetensors cannot store dtype(s) {', '.join(bad)}")
    keys = sorted(sd, key=lambda k: (_RANK[sd[k].dtype], k))
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
