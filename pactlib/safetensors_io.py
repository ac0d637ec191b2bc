"""The safetensors format in one place: the dtype table, the header, the one header reader of both
merge paths (:func:`read_header_checked`, which refuses what safetensors' own reader refuses, with
a message naming the file and the problem), the check that an input did not change while it was
read (:func:`check_unchanged`), the one writer's header (:func:`header_bytes`; the writer, :class:`pactlib.io.StreamedFile`,
streams tensor by tensor).

A file is an 8-byte little-endian header length, a JSON header ``{key: {"dtype", "shape",
"data_offsets"}}`` (with an optional ``"__metadata__"`` of str -> str) padded with spaces to a
multiple of 8, then the tensors' bytes. The writer needs torch only (``safetensors.torch``'s own
writer imports numpy) and, given the same order, writes what ``safetensors.torch.save_file``
writes, byte for byte (:func:`write_safetensors`).
"""
from __future__ import annotations

import collections
import ctypes
import functools
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

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


#: safetensors' limit on the header's length in bytes (the crate's ``MAX_HEADER_SIZE``)
MAX_HEADER_BYTES = 100_000_000
#: the deepest nesting of arrays and objects serde_json reads (its recursion limit, 128, less one)
MAX_DEPTH = 127
_U64 = (1 << 64) - 1


class ChangedInputError(CheckpointError):
    """An input file changed (size, modification or status-change time, inode or device) while a
    merge read it; nothing made from it is published. The message names the file."""

    def __init__(self, path: str | os.PathLike, detail: str | None = None):
        super().__init__(f"{path} changed while it was read" + (f" ({detail})" if detail else ""))
        self.path = Path(path)


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's contents changed, from its ``os.stat_result``: (size, mtime_ns, inode,
    device). Any write, truncation, ``touch`` or replacement by a rename changes it. The ctime is
    left out: a hard link made to the file (the engine's caches share entries so) changes it and
    not the contents."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def check_unchanged(path: str | os.PathLike, identity: tuple, fd: int | None = None) -> None:
    """Raise :class:`ChangedInputError` (naming ``path``) unless the file (``fd`` when given, else
    ``path``) still has ``identity`` (:func:`file_identity`); a file gone is changed too."""
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        raise ChangedInputError(path) from None
    if file_identity(st) != identity:
        raise ChangedInputError(path)


class Header(NamedTuple):
    """A checked safetensors header (:func:`read_header_checked`)."""

    #: the header's length in bytes (the data starts at byte 8 + n)
    n: int
    #: {key: (shape, dtype name, absolute byte offset of its data, its length in bytes)}, in the
    #: order of the data: by (begin, end, key)
    entries: dict[str, tuple[tuple[int, ...], str, int, int]]
    #: the ``__metadata__`` (str -> str; empty when absent)
    metadata: dict[str, str]
    #: the file's :func:`file_identity` when it was opened
    identity: tuple


def _uint(x) -> bool:
    """Whether ``x`` is what serde reads as a ``usize`` (a JSON integer in [0, 2**64))."""
    return type(x) is int and 0 <= x <= _U64


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class _Object(dict):
    """A JSON object, with the names it gives more than once (``dups``): serde_json refuses a
    struct's field given twice (``__metadata__``, ``dtype``, ``shape``, ``data_offsets``) and keeps
    the last of a map's (tensor names, metadata keys), as Python's ``json`` does."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.dups = {k for k, n in collections.Counter(k for k, _ in pairs).items() if n > 1} \
            if len(self) < len(pairs) else set()


def _parse_int(text: str) -> int | float:
    """A JSON integer as serde_json reads it into a ``usize``: ``-0`` is not one (-0.0 here)."""
    return -0.0 if text == "-0" else int(text)


def _depth(value) -> int:
    """How many arrays and objects nest in ``value`` at the deepest (a scalar: 0)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _problem(path, text: str) -> CheckpointError:
    return CheckpointError(f"{path}: cannot read checkpoint (not a valid safetensors file: {text})")


def _check_header(raw: bytes, n: int, size: int, path) -> tuple[dict, dict[str, str]]:
    """(entries, metadata) of the header bytes ``raw`` of a file of ``size`` bytes, checked as
    safetensors checks them (``SafeTensors::read_metadata``, ``Metadata::validate``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _problem(path, f"the header is not UTF-8 ({e.reason} at byte {8 + e.start})") from None
    try:  # what serde_json refuses and Python's json takes: NaN / Infinity, -0, lone surrogates, deep nesting
        header = json.loads(text, parse_constant=_no_constant, parse_int=_parse_int, object_pairs_hook=_Object)
        json.dumps(header, ensure_ascii=False).encode("utf-8")
        depth = _depth(header)
    except (ValueError, UnicodeEncodeError, RecursionError) as e:
        raise _problem(path, f"the header is not JSON ({str(e)[:120]})") from None
    if depth > MAX_DEPTH:
        raise _problem(path, f"the header nests {depth} levels deep, more than safetensors' {MAX_DEPTH}")
    if not isinstance(header, dict):
        raise _problem(path, f"the header is a JSON {type(header).__name__}, not an object")
    if "__metadata__" in header.dups:
        raise _problem(path, "__metadata__ is given twice")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _problem(path, f"__metadata__ must map strings to strings, got {json.dumps(meta)[:120]}")
    spans = {}
    for key, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise _problem(path, f"key {key!r}: expected an object with dtype, shape and data_offsets, "
                                 f"got {json.dumps(info)[:120]}")
        twice = sorted(info.dups & {"dtype", "shape", "data_offsets"})
        if twice:
            raise _problem(path, f"key {key!r}: {', '.join(twice)} given twice")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in ITEMSIZE:
            raise _problem(path, f"key {key!r}: unknown dtype {json.dumps(dtype)[:40]}; pactlib reads "
                                 f"{', '.join(sorted(ITEMSIZE))}")
        if not isinstance(shape, list) or not all(_uint(d) for d in shape):
            raise _problem(path, f"key {key!r}: shape must be a list of non-negative integers, "
                                 f"got {json.dumps(shape)[:120]}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_uint(o) for o in offsets):
            raise _problem(path, f"key {key!r}: data_offsets must be two non-negative integers, "
                                 f"got {json.dumps(offsets)[:120]}")
        spans[key] = (offsets[0], offsets[1], tuple(shape), dtype)
    at, entries = 0, {}
    for key in sorted(spans, key=lambda k: (spans[k][0], spans[k][1], k)):
        begin, end, shape, dtype = spans[key]
        if begin != at or end < begin:
            raise _problem(path, f"key {key!r}: data_offsets [{begin}, {end}] do not start where the entry "
                                 f"before ends (byte {at} of the data)")
        count = 1
        for d in shape:  # safetensors multiplies in order, refusing a product past 2**64 (even before a 0)
            count *= d
            if count > _U64:
                raise _problem(path, f"key {key!r}: shape {list(shape)} overflows")
        nbytes = count * ITEMSIZE[dtype]
        if nbytes > _U64:
            raise _problem(path, f"key {key!r}: shape {list(shape)} overflows")
        if end - begin != nbytes:
            raise _problem(path, f"key {key!r}: shape {list(shape)} of {dtype} is {nbytes} bytes, its "
                                 f"data_offsets [{begin}, {end}] hold {end - begin}")
        entries[key] = (shape, dtype, 8 + n + begin, nbytes)
        at = end
    if 8 + n + at != size:
        raise _problem(path, f"the entries end at byte {8 + n + at} of a file of {size} bytes")
    return entries, meta


def read_header_checked(path: str | os.PathLike) -> Header:
    """The header of the safetensors file ``path``, checked exactly as safetensors' own reader
    checks it (the same files are refused): an 8-byte little-endian length of at most
    :data:`MAX_HEADER_BYTES` within the file; UTF-8 JSON, an object; ``__metadata__`` absent,
    null or str -> str; every other entry an object with a known ``dtype``, a ``shape`` of JSON
    integers >= 0 (not floats, strings or booleans) and ``data_offsets`` of two such integers;
    the entries, by their offsets, back to back from the start of the data to the end of the file,
    each holding prod(shape) * itemsize bytes. The one reader of both merge paths.

    Raises:
        CheckpointError: the file cannot be read or its header is not such a header; the message
            names the file and the problem.
    """
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            head = f.read(8)
            if len(head) < 8:
                raise _problem(path, f"a file of {size} bytes is shorter than the header's 8-byte length")
            n = struct.unpack("<Q", head)[0]
            if n > MAX_HEADER_BYTES:
                raise _problem(path, f"a header of {n} bytes is longer than safetensors' limit of "
                                     f"{MAX_HEADER_BYTES}")
            if n > size - 8:
                raise _problem(path, f"a header of {n} bytes in a file of {size} bytes")
            raw = f.read(n)
            if len(raw) != n:
                raise ChangedInputError(path)
            entries, meta = _check_header(raw, n, size, path)
            check_unchanged(path, file_identity(st), f.fileno())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {str(e)[:200]})") from e
    return Header(n, entries, meta, file_identity(st))


def _header(path: str | os.PathLike) -> tuple[int, dict, int]:
    """(header length in bytes, the parsed JSON header, file size in bytes) of a safetensors file,
    unchecked (:func:`read_header_checked` checks it).

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
    safetensors file, from its header (:func:`read_header_checked`).

    Raises:
        CheckpointError: not a valid safetensors file (naming the file and the problem).
    """
    h = read_header_checked(path)
    dtypes = torch_tables()[1]
    return {k: (shape, dtypes[dt]) for k, (shape, dt, _, _) in h.entries.items()}, h.metadata


def read_offsets(path: str | os.PathLike) -> dict[str, int]:
    """{key: the absolute byte offset of its data in the file} of a safetensors file, from its
    header (:func:`read_header_checked`).

    Raises:
        CheckpointError: not a valid safetensors file (naming the file and the problem).
    """
    return {k: v[2] for k, v in read_header_checked(path).entries.items()}


def read_entries(path: str | os.PathLike) -> tuple[dict[str, tuple[tuple[int, ...], str, int]], dict[str, str]]:
    """({key: (shape, safetensors dtype name, absolute byte offset of its data)} in the order of
    the data, metadata) of a safetensors file, from its header alone, without torch
    (:func:`read_header_checked`).

    Raises:
        CheckpointError: not a valid safetensors file (naming the file and the problem).
    """
    h = read_header_checked(path)
    return {k: v[:3] for k, v in h.entries.items()}, h.metadata
