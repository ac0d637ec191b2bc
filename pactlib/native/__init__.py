"""Fused CPU passes of the streamed global TIES (book/method.md, M2), in C.

The streamed TIES (:mod:`pactlib.streaming`) makes three passes over every task vector: two
radix-histogram passes find each task's trim threshold, the third trims, elects and averages.
In torch each pass is a dozen full-size temporaries per chunk; here each is one loop over the
chunk (``ties.c``), with the same integers and the same float32 bits as the torch expressions
(:class:`pactlib.merges.ties.GlobalThreshold`, :func:`pactlib.merges.ties.ties_kernel`;
tests/test_native.py compares them bit for bit).

The C file is compiled on first use with the system C compiler (``$CC``, else ``cc``) for this
CPU (``-march=native``; no ``-ffast-math``, no contraction into fused multiply-adds) into the
cache (:func:`pactlib.paths.cache_dir` ``/native``, named by the hash of the source, the
compiler and the CPU; written atomically) and loaded with :mod:`ctypes`, which releases the GIL during each call.
Without a compiler, when the compilation fails, or with ``PACT_NATIVE=0``, :func:`library`
returns None and the callers keep the torch path (the same results, slower).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

from ..paths import cache_dir

__all__ = ["ENV", "BLOCK", "library", "digit_hist", "ties_merge", "merge_workspace", "workspace_size"]

ENV = "PACT_NATIVE"
SOURCE = Path(__file__).with_name("ties.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99")
BLOCK = 512  # positions per block of the merge pass (ties.c)

_lock = threading.RLock()
_lib: list = []  # [] not tried yet; [None] unavailable; [CDLL] loaded


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _cpu() -> str:
    """What ``-march=native`` compiles for: the CPU's model and flags (a cache shared by machines
    keeps one library per kind of CPU)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    return "\n".join(dict.fromkeys(ln for ln in info if ln.split(":")[0].strip() in ("model name", "flags")))


def _build(cc: str) -> Path:
    """Compile ``ties.c`` into the cache (once per source and compiler) and return the library."""
    src = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(src + version.encode() + " ".join(FLAGS).encode() + _cpu().encode()).hexdigest()[:16]
    folder = cache_dir("native")
    lib = folder / f"ties-{key}.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ties-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, check=True)
        os.replace(tmp, lib)  # atomic: a concurrent build writes the same bytes under its own name
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _agrees(lib: ctypes.CDLL) -> bool:
    """Whether the kernels give the torch path's bits on a probe (20 tasks, 3001 entries, ties and
    signed zeros), checked once per process: a compiler that breaks IEEE arithmetic is not used."""
    from ..merges.ties import GlobalThreshold, ties_kernel, trim_count

    g = torch.Generator().manual_seed(0)
    T, n = 20, 3001
    st = torch.randn(T, n, generator=g) * torch.exp(4 * torch.randn(T, n, generator=g))
    st[:, : n // 3] = st[:, : n // 3].round()
    a, b = (GlobalThreshold(T, trim_count(n, 20.0), torch.float32) for _ in range(2))
    while not a.done:
        for t in range(T):
            a.observe(t, st[t])
            digit_hist(lib, st[t], b.prefix[t], b.shift, b.hist[t])
        if not torch.equal(a.hist, b.hist):
            return False
        a.end_pass()
        b.end_pass()
    want = ties_kernel(torch.stack([st[t] * a.mask(t, st[t]) for t in range(T)]))
    got = ties_merge(lib, st, torch.tensor(b.prefix), torch.tensor(b.rank), torch.empty(n), merge_workspace(T))
    return torch.equal(want.view(torch.int32), got.view(torch.int32))


def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None when ``PACT_NATIVE=0``, no C compiler is
    found, compiling fails, or the kernels do not give torch's bits on a probe (another torch
    whose sums take another order): the callers then run the torch path."""
    if os.environ.get(ENV, "1") == "0":
        return None
    with _lock:
        if not _lib:
            try:
                cc = _compiler()
                lib = ctypes.CDLL(str(_build(cc))) if cc else None
            except (OSError, subprocess.CalledProcessError):
                lib = None
            if lib is not None:
                i64, p = ctypes.c_int64, ctypes.c_void_p
                lib.pact_digit_hist_f32.argtypes = [p, i64, i64, ctypes.c_int32, p]
                lib.pact_digit_hist_f32.restype = None
                lib.pact_ties_merge_f32.argtypes = [p, i64, i64, i64, p, p, p, p]
                lib.pact_ties_merge_f32.restype = ctypes.c_int
                _lib.append(None)  # the probe's reference runs the torch path
                try:
                    ok = _agrees(lib)
                finally:
                    _lib.clear()
                if not ok:
                    lib = None
            _lib.append(lib)
        return _lib[0]


def _check(x: Tensor, name: str) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name}: expected a float32 CPU tensor, got {x.dtype} on {x.device}")


def digit_hist(lib: ctypes.CDLL, values: Tensor, prefix: int, shift: int, hist: Tensor) -> None:
    """Add one chunk of one task's entries to ``hist`` (int64, 2^16 bins, contiguous): the
    counts :meth:`pactlib.merges.ties.GlobalThreshold.observe` adds for float32.

    Raises:
        ValueError: ``values`` not float32 on the CPU, or ``hist`` not 2^16 contiguous int64.
    """
    _check(values, "values")
    if hist.dtype != torch.int64 or hist.numel() != 1 << 16 or not hist.is_contiguous():
        raise ValueError("hist: expected 65536 contiguous int64 counters")
    values = values.reshape(-1)
    if not values.is_contiguous():
        values = values.contiguous()
    lib.pact_digit_hist_f32(values.data_ptr(), values.numel(), prefix, shift, hist.data_ptr())


def workspace_size(tasks: int) -> int:
    """Floats of scratch :func:`ties_merge` needs for ``tasks`` rows: 2·T·BLOCK + 4·BLOCK."""
    return 2 * tasks * BLOCK + 4 * BLOCK


def merge_workspace(tasks: int) -> Tensor:
    """The scratch of :func:`ties_merge` for ``tasks`` rows (float32, :func:`workspace_size`)."""
    return torch.empty(workspace_size(tasks), dtype=torch.float32)


def ties_merge(lib: ctypes.CDLL, stack: Tensor, thresholds: Tensor, left: Tensor, out: Tensor,
               work: Tensor) -> Tensor:
    """Trim, elect and disjoint mean of one (T, …) chunk stack of float32 task vectors: what
    :func:`pactlib.streaming.trim_stack` then :func:`pactlib.merges.ties.ties_kernel` give, in
    one pass (M2). ``thresholds``: (T,) int64, each task's threshold bit pattern; ``left``: (T,)
    int64, the entries equal to it still to keep (the first by position), decremented in place;
    ``out``: a contiguous float32 tensor of ``stack.shape[1:]``; ``work``: :func:`merge_workspace`.

    Returns:
        ``out``.

    Raises:
        ValueError: dtypes, devices or shapes that do not fit, or more than 255 tasks.
    """
    _check(stack, "stack")
    _check(out, "out")
    T = stack.shape[0]
    if not 0 < T <= 255:
        raise ValueError(f"stack: 1 to 255 task rows, got {T}")
    if not stack.is_contiguous():
        stack = stack.contiguous()
    n = stack[0].numel()
    if out.numel() != n or not out.is_contiguous():
        raise ValueError(f"out: expected {n} contiguous entries, got {tuple(out.shape)}")
    for name, x in (("thresholds", thresholds), ("left", left)):
        if x.dtype != torch.int64 or x.numel() != T or not x.is_contiguous():
            raise ValueError(f"{name}: expected {T} contiguous int64 values")
    if work.numel() < workspace_size(T) or work.dtype != torch.float32:
        raise ValueError("work: too small; use merge_workspace(T)")
    lib.pact_ties_merge_f32(stack.data_ptr(), T, n, n, thresholds.data_ptr(), left.data_ptr(),
                            out.data_ptr(), work.data_ptr())
    return out
