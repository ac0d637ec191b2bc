"""The safetensors format in one place: the dtype table, the header, a file's layout read through
safetensors' own ``safe_open``; the one writer, which streams tensor by tensor, builds on it
(:class:`pactlib.io.StreamedFile`).

A file is an 8-byte little-endian header length, a JSON header ``{key: {"dtype", "shape",
"data_offsets"}}`` (with an optional ``"__metadata__"`` of str -> str) padded with spaces to a
multiple of 8, then the tensors' bytes. The writer needs torch only (``safetensors.torch``'s own
writer imports numpy) and, given the same order, writes what ``safetensors.torch.save_file``
writes, byte for byte (:func:`pactlib.io.write_safetensors`).
"""
from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    import torch
    from torch import Tensor

    Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]

from .checks import CheckpointError

#: safetensors' dtype names with their sizes in bytes, in the order its writer lays tensors out
#: (largest dtype first, then by name): the order of the Rust ``Dtype`` enum, descending.
NAMES: tuple[tuple[str, int], ...] = (
    ("U64", 8), ("I64", 8), ("F64", 8), ("C64", 8), ("F32", 4), ("U32", 4), ("I32", 4), ("BF16", 2),
    ("F16", 2), ("U16", 2), ("I16", 2), ("F8_E4M3", 1), ("F8_E5M2", 1), ("I8", 1), ("U8", 1), ("BOOL", 1))
#: safetensors name -> bytes per entry
ITEMSIZE: dict[str, int] = dict(NAMES)
#: the torch dtype of each name of :data:`NAMES`, by its attribute name in torch
_TORCH = ("uint64", "int64", "float64", "complex64", "float32", "uint32", "int32", "bfloat16", "float16", "uint16",
          "int16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "bool")
#: the names of the floating dtypes (``torch.is_floating_point``)
FLOATS = frozenset({"F64", "F32", "BF16", "F16", "F8_E4M3", "F8_E5M2"})

@functools.cache
def torch_tables() -> tuple[tuple, dict, dict, dict]:
    """``(ORDER, DTYPES, DTYPE_NAMES, RANK)``: :data:`NAMES` with torch dtypes (torch is imported
    here, on first use): ((dtype, name), ...) in the writer's order, name -> dtype, dtype -> name,
    dtype -> position."""
    import torch

    order = tuple((getattr(torch, t), n) for t, (n, _) in zip(_TORCH, NAMES))
    return order, {n: d for d, n in order}, dict(order), {d: i for i, (d, _) in enumerate(order)}


def __getattr__(name: str):
    """``ORDER``, ``DTYPES`` and ``DTYPE_NAMES`` (:func:`torch_tables`), built when first asked for."""
    tables = ("ORDER", "DTYPES", "DTYPE_NAMES")
    if name in tables:
        return torch_tables()[tables.index(name)]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype) -> str | None:
    """The safetensors name of ``dtype`` (a torch dtype, or already a name of :data:`ITEMSIZE`);
    None when safetensors has none."""
    if isinstance(dtype, str):
        return dtype if dtype in ITEMSIZE else None
    return torch_tables()[2].get(dtype)


def tensor_bytes(shape: Sequence[int], dtype) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype`` (a torch dtype or a safetensors name).

    Raises:
        KeyError: a dtype safetensors has no name for."""
    name = dtype_name(dtype)
    if name is None:
        raise KeyError(f"dtype {dtype} has no safetensors name")
    return math.prod(shape) * ITEMSIZE[name]


def tensor_bytes_view(t: Tensor) -> memoryview:
    """The bytes of the contiguous CPU tensor ``t``, in place (no copy, no numpy); valid while
    ``t`` lives."""
    n = t.numel() * t.element_size()
    if not n:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr()))


def header_bytes(entries: Sequence[tuple[str, Sequence[int], torch.dtype | str]],
                 metadata: Mapping[str, str] | None) -> bytes:
    """The length prefix and header of a file holding ``entries`` (key, shape, dtype: a torch
    dtype or a safetensors name) in that order.

    Raises:
        CheckpointError: a dtype safetensors cannot store, or metadata that is not str -> str.
    """
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointError(f"safetensors metadata must map str to str, got {dict(metadata)!r:.200}")
    bad = sorted({str(d) for _, _, d in entries if dtype_name(d) is None})
    if bad:
        raise CheckpointError(f"safetensors cannot store dtype(s) {', '.join(bad)}")
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(sorted(metadata.items()))
    off = 0
    for key, shape, dtype in entries:
        n = tensor_bytes(shape, dtype)
        header[key] = {"dtype": dtype_name(dtype), "shape": [int(s) for s in shape], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def _header(path: str | os.PathLike) -> tuple[int, dict, int]:
    """(header length in bytes, the parsed JSON header, file size in bytes) of a safetensors file.

    Raises:
        OSError, ValueError, struct.error: the file cannot be read, or its header is not JSON or
            longer than the file (the callers name the file).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8:
            raise ValueError(f"a header of {n} bytes in a file of {size}")
        return n, json.loads(f.read(n)), size


def _data_order(header: dict) -> list[str]:
    """The header's keys in the order of their data: by (begin, end, key). Empty tensors share
    an offset with their neighbour, and safetensors' own order (``offset_keys``) breaks such ties
    in a per-process hash order; the key breaks them here, the same in every run."""
    spans = {k: tuple(int(o) for o in v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}
    return sorted(spans, key=lambda k: (*spans[k], k))


def read_layout(path: str | os.PathLike) -> tuple[Layout, dict[str, str]]:
    """({key: (shape, dtype)} in the order of the data, by (begin, end, key); metadata) of a
    safetensors file, from its header (``safe_open``, which checks the header against the file).

    Raises:
        CheckpointError: not a readable safetensors file, or a dtype torch has no name for here
            (naming the file and the key).
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            layout: Layout = {}
            for key in _data_order(_header(path)[1]):
                sl = f.get_slice(key)
                dtype = torch_tables()[1].get(sl.get_dtype())
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
        n, header, _ = _header(path)
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"{path}: cannot read checkpoint header ({type(e).__name__}: {str(e)[:200]})") from e
    return {k: 8 + n + int(v["data_offsets"][0]) for k, v in header.items() if k != "__metadata__"}


def read_entries(path: str | os.PathLike) -> tuple[dict[str, tuple[tuple[int, ...], str, int]], dict[str, str]]:
    """({key: (shape, safetensors dtype name, absolute byte offset of its data)} in the order of
    the data, metadata) of a safetensors file, from its header alone, without torch: the header
    must describe the file exactly (known dtypes, each entry's size its shape's, the entries
    back to back from the start of the data to the end of the file, no empty entry).

    Raises:
        CheckpointError: the file cannot be read, or its header is not such a header (naming the
            file; :func:`read_layout` reads what this refuses, through safetensors' own reader).
    """
    try:
        n, header, size = _header(path)
        meta = header.pop("__metadata__", None) or {}
        entries = [(*(int(o) for o in header[k]["data_offsets"]), k, tuple(int(d) for d in header[k]["shape"]),
                    header[k]["dtype"]) for k in _data_order(header)]
        at = 0
        for begin, end, k, shape, dtype in entries:
            if dtype not in ITEMSIZE or begin != at or end - begin != math.prod(shape) * ITEMSIZE[dtype] or end == begin:
                raise ValueError(f"key {k!r}: {dtype} {list(shape)} at bytes [{begin}, {end}) after {at}")
            at = end
        if 8 + n + at != size or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError(f"the entries end at byte {8 + n + at} of a file of {size}")
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error) as e:
        raise CheckpointError(f"{path}: not a plain safetensors file ({type(e).__name__}: {str(e)[:200]})") from e
    return {k: (shape, dtype, 8 + n + begin) for begin, _, k, shape, dtype in entries}, dict(meta)
