"""The fast path's own C loops for TIES (``kernels.c``), loaded without torch.

``kernels.c`` calls three functions of :mod:`pactlib.native` (``pact_deltas``,
``pact_ties_merge_f32``, ``pact_apply``), so it is compiled together with native's sources by
:func:`pactlib.native.load` (native's compiler, flags and cache; named by the hash of all the
sources, the compiler and the CPU; its bytes checked against the SHA-256 recorded at its build
before every load). Before use, each process
checks the loops against the native library they stand for (itself checked against torch by
:func:`pactlib.native.library`) on a small probe with ties, in float32, bfloat16 and float16:

- ``pact_ties_merge_raw``: TIES's merge pass over raw inputs, ``pact_deltas``,
  ``pact_ties_merge_f32`` and ``pact_apply`` one block of 512 positions at a time (the task
  vectors of a block stay in the cache);
- ``pact_count_ties``: how many entries of θt − θ0 lie at a threshold;
- ``pact_hist_low_f32``: the second radix pass (``pact_digit_hist_delta`` at shift 0) on
  float32, which tests 64 entries at a time in one vector loop and counts only groups that hold
  an entry of the threshold's high digit.

:func:`library` returns None without a compiler, with ``PACT_NATIVE=0``, or when the build or the
check fails; :mod:`pactlib.fastpath` then leaves TIES to the torch path.
"""
from __future__ import annotations

import ctypes
import os
import random
import struct
import threading
from pathlib import Path

from .. import native

__all__ = ["SOURCE", "library", "workspace_size"]

SOURCE = Path(__file__).with_name("kernels.c")

_lock = threading.Lock()
_lib: list = []  # [] not tried yet; [None] unavailable; [CDLL] loaded and checked


def workspace_size(tasks: int) -> int:
    """Floats of scratch ``pact_ties_merge_raw`` needs for ``tasks`` tasks: (T + 1)·BLOCK rows and
    :func:`pactlib.native.workspace_size`."""
    return (tasks + 1) * native.BLOCK + native.workspace_size(tasks)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, i32, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.pact_ties_merge_raw.argtypes = [p, i32, p, p, i64, i64, p, p, ctypes.c_float, p, p, p, p]
    lib.pact_ties_merge_raw.restype = i64
    lib.pact_count_ties.argtypes = [p, i32, p, i32, i64, i64]
    lib.pact_count_ties.restype = i64
    lib.pact_hist_low_f32.argtypes = [p, p, i64, i64, p]
    lib.pact_hist_low_f32.restype = i32
    return native.declare(lib)


def library(base: ctypes.CDLL | None) -> ctypes.CDLL | None:
    """The checked library (once per process), or None (module docstring). ``base``: the native
    library the loops are checked against (:func:`pactlib.native.compiled`)."""
    if base is None or os.environ.get(native.ENV, "1") == "0":
        return None
    with _lock:
        if not _lib:
            lib = None
            cc = native.compiler()
            found = native.load(cc, (*native.SOURCES, SOURCE), "fastpath") if cc is not None else None
            if found is not None:
                lib = _declare(found[0])
                lib = lib if _agrees(lib, base) else None
            _lib.append(lib)
        return _lib[0]


def _raw(values: list[float], code: str) -> ctypes.Array:
    """``values`` as raw entries of dtype ``code`` (F32, BF16 truncated, F16 rounded)."""
    if code == "F32":
        return (ctypes.c_float * len(values))(*values)
    if code == "BF16":
        return (ctypes.c_uint16 * len(values))(*(struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in values))
    return (ctypes.c_uint16 * len(values))(*struct.unpack(f"<{len(values)}H", struct.pack(f"<{len(values)}e", *values)))


def _agrees(lib: ctypes.CDLL, base: ctypes.CDLL) -> bool:
    """Whether the loops give ``base``'s integers and bits on a probe: 5 tasks, 1,500 entries of
    few distinct magnitudes (ties at every threshold), three dtypes."""
    rng = random.Random(0)
    T, n = 5, 1500
    pre = [rng.gauss(0, 1) for _ in range(n)]
    fts = [[p + rng.randint(-3, 3) * 0.125 for p in pre] for _ in range(T)]
    i64 = ctypes.c_int64
    for code in ("F32", "BF16", "F16"):
        c = native.CODES[code]
        p, xs = _raw(pre, code), [_raw(f, code) for f in fts]
        addrs = (ctypes.c_void_p * T)(*(ctypes.addressof(x) for x in xs))
        codes = (ctypes.c_int32 * T)(*([c] * T))
        stack = (ctypes.c_float * (T * n))()
        seen = (ctypes.c_uint8 * T)()
        base.pact_deltas(p, c, addrs, codes, T, n, stack, seen, None, 0)
        bits = [struct.unpack("<I", struct.pack("<f", stack[t * n + 7 * t]))[0] & 0x7fffffff for t in range(T)]
        v = (i64 * T)(*bits)  # a threshold per task that ties
        hist = (i64 * (1 << 16))()
        for t in range(T):
            ctypes.memset(hist, 0, ctypes.sizeof(hist))
            base.pact_digit_hist_delta(p, c, addrs[t], c, n, bits[t] >> 16, 0, hist)
            if lib.pact_count_ties(p, c, addrs[t], c, n, bits[t]) != hist[bits[t] & 0xffff]:
                return False
            if code == "F32":
                low = (i64 * (1 << 16))()
                if lib.pact_hist_low_f32(p, addrs[t], n, bits[t] >> 16, low) != 1 or bytes(low) != bytes(hist):
                    return False
        left_a, left_b = (i64 * T)(*range(1, T + 1)), (i64 * T)(*range(1, T + 1))
        entry = ctypes.c_float if code == "F32" else ctypes.c_uint16
        want, got = (entry * n)(), (entry * n)()
        D = (ctypes.c_float * n)()
        work = (ctypes.c_float * workspace_size(T))()
        base.pact_ties_merge_f32(stack, T, n, n, v, left_a, D, work)
        bad = base.pact_apply(D, p, c, n, 0.3, want)
        if (lib.pact_ties_merge_raw(p, c, addrs, codes, T, n, v, left_b, 0.3, got, (ctypes.c_void_p * T)(), work, seen)
                != bad or bytes(want) != bytes(got) or list(left_a) != list(left_b)):
            return False
    return True
