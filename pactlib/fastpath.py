"""``pact merge`` of Task Arithmetic without torch: read every input once, add in C, write once.

Importing torch takes longer than reading a few gigabytes from the page cache, so a merge whose
arithmetic is one compiled loop pays mostly for the import. For the merges this module takes,
:func:`try_merge` runs the whole merge with the standard library and the compiled loop of
:func:`pactlib.native.task_arithmetic`: each key's entries are read in blocks with ``pread``
from θ0 and every θt, merged (θ = θ0 + α·Σt (θt − θ0), book/method.md, M1) and written by the
same :class:`pactlib.lazy.CheckpointWriter` as the torch path. The output is the torch path's,
byte for byte (tests/test_fastpath.py), with the same warnings and the same JSON line.

It takes a merge when all of these hold; otherwise :func:`try_merge` returns None before
anything is written and ``pact merge`` runs the torch path, which also gives every error:

- ``--method task_arithmetic``, or ``ties`` with ``--set`` of ``k`` and ``scope=global`` only and
  at most 255 tasks; no ``--pact``, ``--config`` or ``--lora-adapters``,
  ``--device`` unset or ``cpu``, ``--out`` a ``.safetensors`` file or index (not a folder or a
  ``.pt``);
- θ0 and every θt one safetensors file each (a file, or a folder holding one), whose headers
  describe them exactly (:func:`pactlib.safetensors_io.read_entries`), with the same keys,
  shapes and dtypes; floating keys in float32, bfloat16 or float16, and at least one;
- the compiled library (:func:`pactlib.native.compiled`; the first run after an install or an
  edit of the C files builds it and probes it against torch, :func:`pactlib.native.library`,
  so that one imports torch).

When a merged value is not finite (NaN / Inf in an input, or an overflow of θ0's dtype), the
output is discarded and the torch path runs, raising the error that names the file and key.
"""
from __future__ import annotations

import bisect
import ctypes
import itertools
import json
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import native
from .checks import check_alpha, task_set_warnings
from .lazy import (CheckpointWriter, check_out_suffix, check_out_target, checkpoint_files, finish_output,
                   is_folder_output, output_lock, parse_size)
from .matrix import detect_preset, split_attention_note
from .safetensors_io import FLOATS, ITEMSIZE, read_entries

__all__ = ["BUDGET_BYTES", "next_digit", "plan", "trim_count", "try_merge"]

#: bytes of all the block buffers together (θ0's, T θt's and two outputs'), whatever T
BUDGET_BYTES = 12 << 20


class _Plan:
    """What :func:`plan` found: the files, θ0's entries (in the order of its data: key -> (shape,
    dtype name, offset)), each file's offsets, the method's parameters and the library."""

    def __init__(self, args, files: list[Path], heads: list[dict], params: dict, lib):
        self.args, self.pre, self.fts, self.lib = args, files[0], files[1:], lib
        self.entries = heads[0]
        self.offsets = [{k: v[2] for k, v in h.items()} for h in heads]
        self.params = params  # as given (--set), for the JSON line
        self.floats = [k for k, (_, dt, _) in self.entries.items() if dt in FLOATS]


def _one_file(path: str) -> Path | None:
    files = checkpoint_files(path)
    return files[0] if len(files) == 1 and files[0].suffix == ".safetensors" else None


def _ties_params(params: dict) -> float | None:
    """TIES' trim percentage k from ``--set``, when the merge is global TIES the fast path takes."""
    if not set(params) <= {"k", "scope"} or params.get("scope", "global") != "global":
        return None
    k = params.get("k", 20.0)
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k <= 100:
        return None
    return float(k)


def plan(args) -> _Plan | None:
    """The fast merge of the parsed ``pact merge`` arguments ``args``, or None when it does not
    take them (module docstring). Reads the headers only; raises nothing (a refusal is None)."""
    try:
        if (args.config is not None or args.lora_adapters or args.pact is not None
                or args.method not in ("task_arithmetic", "ties") or args.alpha is None or not args.pretrained
                or not args.finetuned or args.device not in (None, "cpu") or is_folder_output(args.out)
                or check_out_suffix(args.out, args.max_shard_size) == "torch"):
            return None
        from .cli import parse_set

        params = parse_set(args.set)
        if (args.method == "task_arithmetic" and params
                or args.method == "ties" and (_ties_params(params) is None or len(args.finetuned) > 255)):
            return None
        check_alpha(args.alpha)
        if args.max_shard_size is not None:
            parse_size(args.max_shard_size)
        if args.threads is not None and not 1 <= args.threads <= 4096 or args.workers is not None and args.workers < 1:
            return None
        files = [_one_file(p) for p in (args.pretrained, *args.finetuned)]
        if None in files:
            return None
        # not probed yet (a first run, or new C sources): probe it now, with torch, once per machine
        lib = native.compiled() or native.library()
        if lib is None:
            return None
        check_out_target(args.out, [args.pretrained, *args.finetuned], name="--out")
        heads = [read_entries(f)[0] for f in files]
        layout = {k: v[:2] for k, v in heads[0].items()}
        if not any(dt in FLOATS for _, dt in layout.values()) or any(
                dt in FLOATS and dt not in native.CODES for _, dt in layout.values()):
            return None
        if any({k: v[:2] for k, v in h.items()} != layout for h in heads[1:]):
            return None
        return _Plan(args, files, heads, params, lib)
    except Exception:
        return None


def _read(fd: int, view: memoryview, offset: int, path: Path) -> None:
    """Fill ``view`` from ``fd`` at ``offset`` (pread, short reads continued).

    Raises:
        OSError: a read failed or the file ended early (naming it)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"{path}: the file ended at byte {offset + done} while reading it")
        done += n


class _Blocks:
    """The files open once, and block buffers of raw bytes: θ0's, each θt's, two outputs' (in
    ``BUDGET_BYTES`` together, or ``floats`` more float32 entries per block of scratch ``work``)."""

    def __init__(self, p: _Plan, extra_floats: int = 0):
        self.p, self.T = p, len(p.fts)
        itemsize = max(ITEMSIZE[dt] for _, dt, _ in p.entries.values())
        self.step = max(256, BUDGET_BYTES // ((self.T + 3) * itemsize + 4 * extra_floats))  # entries per block
        self._bufs = [bytearray(self.step * itemsize) for _ in range(self.T + 3)]  # θ0, the θt, two outputs
        self.views = [memoryview(b) for b in self._bufs]
        self.addr = [ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) for b in self._bufs]
        self.fts = (ctypes.c_void_p * self.T)(*self.addr[1:self.T + 1])
        self.work = (ctypes.c_float * max(1, self.step * extra_floats))()
        self.fds: list[int] = []
        for f in (p.pre, *p.fts):
            self.fds.append(os.open(f, os.O_RDONLY))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)

    def ranges(self, key: str):
        """``(a, m)``: the blocks of ``key``, m entries from entry a."""
        n = math.prod(self.p.entries[key][0])
        return ((a, min(self.step, n - a)) for a in range(0, n, self.step))

    def read(self, key: str, a: int, m: int, buf: int, *, tasks: bool) -> None:
        """θ0's entries [a, a + m) of ``key`` into buffer ``buf``; with ``tasks`` every θt's too."""
        size = ITEMSIZE[self.p.entries[key][1]]
        _read(self.fds[0], self.views[buf][:m * size], self.p.offsets[0][key] + a * size, self.p.pre)
        if tasks:
            self.read_tasks(key, a, m, range(self.T))

    def read_tasks(self, key: str, a: int, m: int, tasks) -> None:
        """The entries [a, a + m) of ``key`` of the θt in ``tasks`` into their buffers."""
        size = ITEMSIZE[self.p.entries[key][1]]
        for t in tasks:
            _read(self.fds[t + 1], self.views[t + 1][:m * size], self.p.offsets[t + 1][key] + a * size, self.p.fts[t])

    def deltas(self, key: str, a: int, m: int, tasks: range, stack, nonzero, same=None, check: int = 0) -> None:
        """Read the θt in ``tasks`` (a range) and write their task vectors into their rows of the
        (T, m) float32 ``stack`` (``pact_deltas``; θ0's block already in buffer 0); ``same``:
        the (len(tasks))² flags of those tasks, compared when ``check`` (1 values, 2 bits)."""
        self.read_tasks(key, a, m, tasks)
        code = native.CODES[self.p.entries[key][1]]
        n = len(tasks)
        fts = (ctypes.c_void_p * n)(*self.addr[tasks.start + 1:tasks.stop + 1])
        self.p.lib.pact_deltas(self.addr[0], code, fts, (ctypes.c_int32 * n)(*([code] * n)), n, m,
                               ctypes.addressof(stack) + 4 * tasks.start * m, ctypes.addressof(nonzero) + tasks.start,
                               same if same is not None else None, check if same is not None else 0)


def _pairs(T: int):
    return [(i, j) for i in range(T) for j in range(i + 1, T)]


def _flags(T: int):
    """(nonzero, same): T uint8 flags, and T·T with every pair (i < j) set."""
    nonzero, same = (ctypes.c_uint8 * T)(), (ctypes.c_uint8 * (T * T))()
    for i, j in _pairs(T):
        same[i * T + j] = 1
    return nonzero, same


def _found(T: int, nonzero, same) -> tuple[list[bool], set[tuple[int, int]]]:
    return [bool(v) for v in nonzero], {(i, j) for i, j in _pairs(T) if same[i * T + j]}


def _written(pool: ThreadPoolExecutor, writer: CheckpointWriter, b: _Blocks):
    """``emit(key, m, out_buffer)``: hand a merged block to the writer thread, and ``out()``: the
    output buffer to fill next (after its previous block is written)."""
    pending: list = [None, None]
    state = {"k": 0}

    def out() -> int:
        k = state["k"]
        if pending[k] is not None:
            pending[k].result()  # written: the buffer may be filled again
        return b.T + 1 + k

    def emit(key: str, nbytes: int) -> None:
        k = state["k"]
        pending[k] = pool.submit(writer.write_bytes, key, b.views[b.T + 1 + k][:nbytes])
        state["k"] = k ^ 1

    def drain() -> None:
        for f in pending:
            if f is not None:
                f.result()

    return out, emit, drain


def _task_arithmetic(p: _Plan, writer: CheckpointWriter):
    """Merge every key into ``writer``: (nonzero per task, identical pairs), or None when a
    merged value is not finite (nothing more is written)."""
    b = _Blocks(p)
    T, alpha = b.T, float(p.args.alpha)
    nonzero, same = _flags(T)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # one writer: the blocks go out in order
            out, emit, drain = _written(pool, writer, b)
            for key, (_, dt, _) in p.entries.items():
                size = ITEMSIZE[dt]
                for a, m in b.ranges(key):
                    o = out()
                    if dt not in FLOATS:  # a buffer: θ0's bytes
                        b.read(key, a, m, o, tasks=False)
                    else:
                        b.read(key, a, m, 0, tasks=True)
                        code = native.CODES[dt]
                        check = any(same[i * T + j] for i, j in _pairs(T))
                        if native.task_arithmetic(p.lib, b.addr[0], code, b.fts, (ctypes.c_int32 * T)(*([code] * T)),
                                                  m, alpha, b.addr[o], nonzero, same, check):
                            return None
                    emit(key, m * size)
            drain()
        return _found(T, nonzero, same)
    finally:
        b.close()


def trim_count(numel: int, k: float) -> int:
    """:func:`pactlib.merges.ties.trim_count` (the same integer; tests/test_fastpath.py)."""
    return min(numel, max(1, int(-(-k * numel // 100))))


def next_digit(counts: list[int], rank: int) -> tuple[int, int]:
    """One digit of the radix selection, as :meth:`pactlib.merges.ties.GlobalThreshold.end_pass`:
    (the largest digit j whose entries at or above it hold ``rank``, the entries above j)."""
    at_top = list(itertools.accumulate(reversed(counts)))  # at_top[i]: entries with digit >= len - 1 - i
    i = bisect.bisect_left(at_top, rank)
    return len(counts) - 1 - i, at_top[i - 1] if i else 0


def _halves(T: int) -> list[range]:
    """The tasks split in two (one range when T = 1): each half on one core."""
    return [range(0, T)] if T == 1 else [range(0, T // 2), range(T // 2, T)]


def _ties_global(p: _Plan, writer: CheckpointWriter):
    """Global TIES into ``writer`` (module docstring): as :func:`_task_arithmetic`. The task
    vectors of a block are made and counted by two threads, each on half of the tasks (the
    first block's, while tasks may still be identical, by one: every pair is compared)."""
    T, alpha = len(p.fts), float(p.args.alpha)
    b = _Blocks(p, extra_floats=T + 1)  # the (T, m) stack of task vectors and D
    stack, D = b.work, ctypes.addressof(b.work) + 4 * T * b.step
    keep = trim_count(sum(math.prod(p.entries[k][0]) for k in p.floats), _ties_params(p.params))
    bins = 1 << 16
    hist = (ctypes.c_int64 * (T * bins))()
    prefix, rank = [0] * T, [keep] * T
    nonzero, same = _flags(T)
    halves = _halves(T)
    try:
        with ThreadPoolExecutor(max_workers=len(halves)) as cores:
            def parallel(fn) -> None:
                for _ in cores.map(fn, halves):  # the first error is raised
                    pass

            for shift in (16, 0):  # the two radix passes of float32 (GlobalThreshold.observe, end_pass)
                ctypes.memset(hist, 0, ctypes.sizeof(hist))
                for key in p.floats:
                    for a, m in b.ranges(key):
                        b.read(key, a, m, 0, tasks=False)

                        def count(tasks: range, key=key, a=a, m=m) -> None:
                            b.deltas(key, a, m, tasks, stack, nonzero)
                            for t in tasks:
                                p.lib.pact_digit_hist_f32(ctypes.addressof(stack) + 4 * t * m, m, prefix[t], shift,
                                                          ctypes.addressof(hist) + 8 * t * bins)

                        if shift and any(same[i * T + j] for i, j in _pairs(T)):  # every pair compared
                            b.deltas(key, a, m, range(T), stack, nonzero, same, 1)
                            for t in range(T):
                                p.lib.pact_digit_hist_f32(ctypes.addressof(stack) + 4 * t * m, m, prefix[t], shift,
                                                          ctypes.addressof(hist) + 8 * t * bins)
                        else:
                            parallel(count)
                counts = memoryview(hist).cast("B").cast("q").tolist()
                for t in range(T):
                    row = counts[t * bins:(t + 1) * bins]
                    if shift and sum(row[0x7f80:]):
                        return None  # NaN / Inf in a task vector: the torch path names it
                    j, higher = next_digit(row, rank[t])
                    rank[t] -= higher
                    prefix[t] = (prefix[t] << 16) | j
            thresholds, left = (ctypes.c_int64 * T)(*prefix), (ctypes.c_int64 * T)(*rank)
            space = (ctypes.c_float * native.workspace_size(T))()
            with ThreadPoolExecutor(max_workers=1) as pool:  # one writer: the blocks go out in order
                out, emit, drain = _written(pool, writer, b)
                for key, (_, dt, _) in p.entries.items():  # the merge pass: trim in position order, elect, mean
                    size = ITEMSIZE[dt]
                    for a, m in b.ranges(key):
                        o = out()
                        if dt not in FLOATS:
                            b.read(key, a, m, o, tasks=False)
                        else:
                            b.read(key, a, m, 0, tasks=False)
                            parallel(lambda tasks, key=key, a=a, m=m: b.deltas(key, a, m, tasks, stack, nonzero))
                            p.lib.pact_ties_merge_f32(stack, T, m, m, thresholds, left, D, space)
                            if native.apply(p.lib, D, b.addr[0], native.CODES[dt], m, alpha, b.addr[o]):
                                return None
                        emit(key, m * size)
                drain()
        return _found(T, nonzero, same)
    finally:
        b.close()


def try_merge(args) -> int | None:
    """Run ``pact merge`` for the parsed ``args`` without torch when :func:`plan` takes it:
    print the torch path's JSON line and return 0; None when it does not take it, or when a merged
    value is not finite (nothing is published: the caller runs the torch path).

    Raises:
        OutputError (an ``OSError``): another run writes the output, or writing failed (named,
            nothing left behind); OSError: an input could not be read.
    """
    p = plan(args)
    if p is None:
        return None
    a = p.args
    note = split_attention_note(p.entries, where=f"{a.method}: ")
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    names = [os.path.abspath(f) for f in a.finetuned]  # as the torch path names them (pact merge's recipe)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with output_lock(a.out):
        entries = [(k, shape, dt) for k, (shape, dt, _) in p.entries.items()]
        with CheckpointWriter(a.out, entries, max_shard_size=a.max_shard_size) as writer:
            found = (_task_arithmetic if a.method == "task_arithmetic" else _ties_global)(p, writer)
            if found is None:
                return None  # the writer removes its temporary files; the torch path names the cause
            for message in task_set_warnings(names, *found):
                warnings.warn(message, stacklevel=2)
            files = writer.commit()
        finish_output(a.out, files)
    rule = a.rule or "auto"
    print(json.dumps({"out": str(writer.path), "method": a.method, "pact": None, "alpha": a.alpha,
                      "tasks": len(names), "rule": detect_preset(p.entries) if rule == "auto" else rule,
                      "params": p.params, "files": [str(f) for f in files]}))
    return 0
