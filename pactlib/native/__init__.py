"""Fused CPU passes of the streamed global TIES (book/method.md, M2) and of Task Arithmetic
(M1), and task vectors of raw checkpoint bytes, in C.

The streamed TIES (:mod:`pactlib.streaming`) makes three passes over every task vector: two
radix-histogram passes find each task's trim threshold, the third trims, elects and averages.
In torch each pass is a dozen full-size temporaries per chunk; here each is one loop over the
chunk (``ties.c``), with the same integers and the same float32 bits as the torch expressions
(:class:`pactlib.merges.ties.GlobalThreshold`, :func:`pactlib.merges.ties.ties_kernel`;
tests/test_native.py compares them bit for bit).

``task_arithmetic.c`` merges Task Arithmetic over raw checkpoint bytes (float32, bfloat16,
float16) with the torch path's float32 operations in its order: :mod:`pactlib.fastpath` runs
``pact merge`` with it and without torch.

The C files are compiled on first use with the system C compiler (``$CC``, else ``cc``) for this
CPU (``-march=native``; no ``-ffast-math``, no contraction into fused multiply-adds) into the
cache (:func:`pactlib.paths.cache_dir` ``/native``, keyed by the hash of the source, the
compiler and the CPU; written atomically, its SHA-256 recorded) and loaded with :mod:`ctypes`,
which releases the GIL during each call. Every load checks the library's bytes against the
SHA-256 recorded at its build; a broken or replaced library is rebuilt with a warning, and a
cache folder that others may write to is refused with a warning (:mod:`pactlib.native.cache`).
Without a compiler, when the compilation fails, with a refused cache folder, or with
``PACT_NATIVE=0``, :func:`library` returns None and the callers keep the torch path (the same
results, slower). A library that passed the probe is marked so in the cache (the mark holds its
SHA-256); :func:`compiled` loads a marked library without torch (and without the probe), else
returns None.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    from torch import Tensor

from ..paths import cache_dir
from . import cache

__all__ = ["ENV", "BLOCK", "CODES", "SOURCES", "FLAGS", "compiler", "build", "load", "declare", "compiled", "library", "digit_hist", "ties_merge", "merge_workspace",
           "workspace_size", "task_arithmetic", "apply", "digit_hist_delta", "select_digit"]

ENV = "PACT_NATIVE"
SOURCES = (Path(__file__).with_name("ties.c"), Path(__file__).with_name("task_arithmetic.c"))
#: the dtype codes of task_arithmetic.c, by safetensors name
CODES = {"F32": 0, "BF16": 1, "F16": 2}
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99")
BLOCK = 512  # positions per block of the merge pass (ties.c)

_lock = threading.RLock()
_lib: list = []  # [] not tried yet; [None] unavailable; [CDLL] loaded
_plain: list = []  # the same for compiled(): the marked library, loaded without the probe
_said: set[str] = set()  # the warnings load() gave


def compiler() -> str | None:
    """The path of the C compiler (``$CC``, else ``cc``), or None when there is none."""
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


def _key(cc: str, sources: tuple[Path, ...]) -> str:
    """The cache key of these sources, this compiler, these flags and this CPU (16 hex digits)."""
    src = b"".join(f.read_bytes() for f in sources)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    return hashlib.sha256(src + version.encode() + " ".join(FLAGS).encode() + _cpu().encode()).hexdigest()[:16]


def _compile(cc: str, sources: tuple[Path, ...]):
    def run(out: str) -> None:
        subprocess.run([cc, *FLAGS, *map(str, sources), "-o", out], capture_output=True, text=True, check=True)
    return run


def load(cc: str, sources: tuple[Path, ...] = SOURCES, stem: str = "ties", *, marked_only: bool = False
         ) -> tuple[ctypes.CDLL, Path, str] | None:
    """The library of ``sources`` compiled by ``cc`` with :data:`FLAGS` for this CPU, loaded from
    the cache once its SHA-256 is checked (built first when missing; rebuilt, with a warning, when
    broken or replaced: :func:`pactlib.native.cache.load`), with its path and SHA-256; None with a
    warning when the cache folder is refused (writable by others, :class:`cache.UnsafeFolder`),
    the compile fails, or the library cannot be loaded; with ``marked_only``, None also for a
    library not yet probed (:func:`library` marks it)."""
    try:
        return cache.load(stem, _key(cc, sources), _compile(cc, sources), marked_only=marked_only)
    except cache.UnsafeFolder as e:
        why = str(e)
    except subprocess.CalledProcessError as e:
        last = (e.stderr or "").strip().splitlines()[-1:] or [f"exit status {e.returncode}"]
        why = f"native code not used: compiling {', '.join(f.name for f in sources)} failed: {last[0]}"
    except OSError as e:
        why = f"native code not used: the cache {cache_dir('native')}: {e}"
    if why not in _said:  # once per process: compiled() and library() both ask
        _said.add(why)
        warnings.warn(why, stacklevel=2)
    return None


def build(cc: str, sources: tuple[Path, ...] = SOURCES, stem: str = "ties") -> Path:
    """Compile ``sources`` with ``cc`` and :data:`FLAGS` into the cache unless a build whose bytes
    are the recorded ones is there (once per source, compiler and CPU; written atomically, its
    SHA-256 recorded: :mod:`pactlib.native.cache`) and return the library:
    ``<stem>-<key>-<sha>.so``.

    Raises:
        OSError: the cache cannot be written; subprocess.CalledProcessError: compiling failed;
        :class:`cache.UnsafeFolder`: the cache folder may be written by others.
    """
    key = _key(cc, sources)
    path, fd = cache.open_folder()
    try:
        cache.remove_dead_temps(path, fd)
        found = cache._open_verified(path, fd, stem, key)
        if isinstance(found, tuple):
            os.close(found[0])
            return path / found[1]
        if found is not None:
            warnings.warn(f"rebuilding the native library {found}", stacklevel=2)
        return cache.build(path, fd, stem, key, _compile(cc, sources))[0]
    finally:
        os.close(fd)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of the functions of :data:`SOURCES` in ``lib``; returns ``lib``."""
    i64, i32, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.pact_digit_hist_f32.argtypes = [p, i64, i64, i32, p]
    lib.pact_digit_hist_f32.restype = None
    lib.pact_ties_merge_f32.argtypes = [p, i64, i64, i64, p, p, p, p]
    lib.pact_ties_merge_f32.restype = ctypes.c_int
    lib.pact_task_arithmetic.argtypes = [p, i32, p, p, i64, i64, ctypes.c_float, p, p, p, i32]
    lib.pact_task_arithmetic.restype = i64
    lib.pact_deltas.argtypes = [p, i32, p, p, i64, i64, p, p, p, i32]
    lib.pact_deltas.restype = None
    lib.pact_apply.argtypes = [p, p, i32, i64, ctypes.c_float, p]
    lib.pact_apply.restype = i64
    lib.pact_digit_hist_delta.argtypes = [p, i32, p, i32, i64, i64, i32, p]
    lib.pact_digit_hist_delta.restype = i32
    lib.pact_select_digit.argtypes = [p, i64, p]
    lib.pact_select_digit.restype = i32
    return lib


def _agrees(lib: ctypes.CDLL) -> bool:
    """Whether the kernels give the torch path's bits on a probe (20 tasks, 3001 entries, ties and
    signed zeros), checked once per process: a compiler that breaks IEEE arithmetic is not used."""
    import torch
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
    return (torch.equal(want.view(torch.int32), got.view(torch.int32)) and _task_arithmetic_agrees(lib, st)
            and _radix_agrees(lib, st))


def _radix_agrees(lib: ctypes.CDLL, st: Tensor) -> bool:
    """Whether ``pact_digit_hist_delta`` and ``pact_select_digit`` find GlobalThreshold's
    thresholds (counts and digits) on the task vectors st[t] − st[0], float32 and bfloat16."""
    import torch

    from ..merges.ties import GlobalThreshold

    for dtype, code in ((torch.float32, "F32"), (torch.bfloat16, "BF16")):
        x = st.to(dtype)
        pre = x[0].contiguous()
        for t in range(1, x.shape[0]):
            ft = x[t].contiguous()
            d = ft.float() - pre.float()
            g = GlobalThreshold(1, 97 * t, torch.float32)
            hist = torch.zeros(1 << 16, dtype=torch.int64)
            prefix, rank, shift = 0, 97 * t, 16
            while not g.done:
                g.observe(0, d)
                hist.zero_()
                lib.pact_digit_hist_delta(pre.data_ptr(), CODES[code], ft.data_ptr(), CODES[code], d.numel(), prefix,
                                          shift, hist.data_ptr())
                if not torch.equal(hist, g.hist[0]):
                    return False
                higher = ctypes.c_int64()
                j = lib.pact_select_digit(hist.data_ptr(), rank, ctypes.byref(higher))
                g.end_pass()
                rank -= higher.value
                prefix, shift = (prefix << 16) | j, shift - 16
                if prefix != g.prefix[0] or rank != g.rank[0]:
                    return False
    return True


def _task_arithmetic_agrees(lib: ctypes.CDLL, st: Tensor) -> bool:
    """Whether :func:`task_arithmetic` gives the torch path's bits (RunningSum, then
    ``TaskVector.apply_to``) on the probe's values, in each dtype, overflows counted alike;
    ``pact_deltas`` the bits of θt − θ0 and ``pact_apply`` those of θ0 + α·D."""
    import torch

    for dtype, code in ((torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16")):
        x = (st / 1000).to(dtype)
        pre, fts = x[0].contiguous(), [x[t].contiguous() for t in range(1, x.shape[0])]
        d = [f.float() - pre.float() for f in fts]
        total = d[0].clone()
        for dt in d[1:]:
            total += dt
        want = 0.3 * total
        want += pre.float()
        want = want.to(dtype)
        out = torch.empty_like(pre)
        T = len(fts)
        addrs = (ctypes.c_void_p * T)(*(f.data_ptr() for f in fts))
        codes = (ctypes.c_int32 * T)(*([CODES[code]] * T))
        nonzero, same = (ctypes.c_uint8 * T)(), (ctypes.c_uint8 * (T * T))()
        bad = task_arithmetic(lib, pre.data_ptr(), CODES[code], addrs, codes, pre.numel(), 0.3, out.data_ptr(),
                              nonzero, same, False)
        stack = torch.empty(T, pre.numel())
        lib.pact_deltas(pre.data_ptr(), CODES[code], addrs, codes, T, pre.numel(), stack.data_ptr(), nonzero, same, 0)
        if not torch.equal(torch.stack(d).view(torch.int32), stack.view(torch.int32)):
            return False
        applied = torch.empty_like(pre)
        if lib.pact_apply(total.data_ptr(), pre.data_ptr(), CODES[code], pre.numel(), 0.3, applied.data_ptr()) != bad:
            return False
        if not torch.equal(applied.view(torch.int16 if code != "F32" else torch.int32),
                           want.view(torch.int16 if code != "F32" else torch.int32)):
            return False
        if bad != int((~torch.isfinite(want)).sum()) or not torch.equal(want.view(torch.int16 if code != "F32" else
                                                                                    torch.int32),
                                                                          out.view(torch.int16 if code != "F32" else
                                                                                   torch.int32)):
            return False
    return True


def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None when ``PACT_NATIVE=0``, no C compiler is
    found, compiling fails, or the kernels do not give torch's bits on a probe (another torch
    whose sums take another order): the callers then run the torch path. A library that passes
    the probe is marked in the cache (``<library>.agrees``) for :func:`compiled`. A cached library
    whose bytes are not the ones recorded at its build is rebuilt first (:func:`load`, a warning);
    a refused cache folder or a failed compile gives None with a warning."""
    if os.environ.get(ENV, "1") == "0":
        return None
    with _lock:
        if not _lib:
            cc = compiler()
            found = load(cc) if cc else None
            lib = declare(found[0]) if found else None
            if lib is not None:
                _lib.append(None)  # the probe's reference runs the torch path
                try:
                    ok = _agrees(lib)
                finally:
                    _lib.clear()
                if not ok:
                    lib = None
                else:
                    with contextlib.suppress(OSError, cache.UnsafeFolder):
                        cache.mark(found[1], found[2])
            _lib.append(lib)
        return _lib[0]


def compiled() -> ctypes.CDLL | None:
    """The compiled kernels without torch: the cached library of the current sources, compiler
    and CPU when :func:`library` has probed it in some process (its mark is in the cache); None
    when ``PACT_NATIVE=0``, there is no compiler, or no probed library (the caller runs the torch
    path, which builds and probes one). The library's bytes are checked as :func:`load` checks
    them (a broken one is rebuilt here, and then not yet probed: None)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    with _lock:
        if not _plain:
            cc = compiler()
            found = load(cc, marked_only=True) if cc else None
            _plain.append(declare(found[0]) if found else None)
        return _plain[0]


def _check(x: Tensor, name: str) -> None:
    import torch
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name}: expected a float32 CPU tensor, got {x.dtype} on {x.device}")


def digit_hist(lib: ctypes.CDLL, values: Tensor, prefix: int, shift: int, hist: Tensor) -> None:
    """Add one chunk of one task's entries to ``hist`` (int64, 2^16 bins, contiguous): the
    counts :meth:`pactlib.merges.ties.GlobalThreshold.observe` adds for float32.

    Raises:
        ValueError: ``values`` not float32 on the CPU, or ``hist`` not 2^16 contiguous int64.
    """
    import torch
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
    import torch
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
    import torch
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


def task_arithmetic(lib: ctypes.CDLL, pre: int, pre_code: int, fts, codes, n: int, alpha: float, out: int,
                    nonzero, same, check_same: bool) -> int:
    """θ = θ0 + α·Σt (θt − θ0) on ``n`` entries of raw memory (book/method.md, M1; the torch
    path's float32 operations in its order, ``task_arithmetic.c``). ``pre``, ``out``: addresses
    of θ0's and the output's entries (dtype code ``pre_code``, :data:`CODES`); ``fts``: a ctypes
    array of T addresses of the θt entries, ``codes`` their T codes (int32); ``nonzero``: T
    uint8 flags set where some Δt != 0; ``same``: T·T uint8 flags, each set pair (i < j) cleared
    where Δi and Δj differ, when ``check_same``.

    Returns:
        The number of output entries that are not finite (a NaN / Inf input or an overflow: the
        torch path raises there and says which).
    """
    return lib.pact_task_arithmetic(pre, pre_code, fts, codes, len(codes), n, alpha, out, nonzero, same,
                                    1 if check_same else 0)


def apply(lib: ctypes.CDLL, D: int, pre: int, pre_code: int, n: int, alpha: float, out: int) -> int:
    """θ = θ0 + α·D on ``n`` entries of raw memory (book/method.md, merges;
    ``TaskVector.apply_to``'s float32 operations: α·D, then θ0 added, cast to θ0's dtype).
    ``D``: the address of n float32 entries; ``pre``, ``out``: of θ0's and the output's entries
    (dtype code ``pre_code``, :data:`CODES`).

    Returns:
        The number of output entries that are not finite (the torch path raises there).
    """
    return lib.pact_apply(D, pre, pre_code, n, alpha, out)


def digit_hist_delta(lib: ctypes.CDLL, pre: int, pre_code: int, x: int, code: int, n: int, prefix: int, shift: int,
                     hist: int) -> bool:
    """One radix pass of :class:`pactlib.merges.ties.GlobalThreshold` (its ``observe``, M2) on the
    task vector θt − θ0 of ``n`` raw entries, without writing it: ``pre``, ``x``: addresses of
    θ0's and θt's entries (dtype codes, :data:`CODES`); ``hist``: the address of 2^16 int64
    counters, added to; ``prefix``, ``shift``: the digits found so far and this pass's shift
    (16, then 0). Returns whether some Δ != 0."""
    return bool(lib.pact_digit_hist_delta(pre, pre_code, x, code, n, prefix, shift, hist))


def select_digit(lib: ctypes.CDLL, hist: int, rank: int) -> tuple[int, int]:
    """:meth:`pactlib.merges.ties.GlobalThreshold.end_pass` for one task: (the largest digit whose
    entries at or above it hold ``rank``, the entries above it), from 2^16 int64 counters at the
    address ``hist``."""
    higher = ctypes.c_int64()
    return lib.pact_select_digit(hist, rank, ctypes.byref(higher)), higher.value
