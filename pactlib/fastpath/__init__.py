"""``pact merge`` of Task Arithmetic and TIES without torch: ``pread``, C loops, one write.

Importing torch takes longer than reading a few gigabytes from the page cache, so a merge whose
arithmetic is a few compiled loops pays mostly for the import. For the merges this module takes,
:func:`try_merge` runs the whole merge with the standard library and the loops of
:mod:`pactlib.native`. A merge reads each block of entries of every input with ``pread`` into a
buffer of its own (:meth:`_Inputs.read_block`: resident memory stays about a block per file, and a
file cut short reads short instead of faulting), and the merged blocks are written by the same
:class:`pactlib.lazy.CheckpointWriter` as the torch path, from a second thread while the next
block is merged. TIES's radix passes read each file the same way, a span of a few MiB at a time
into two buffers per thread; no input is memory-mapped.

- Task Arithmetic (book/method.md, M1): θ = θ0 + α·Σt (θt − θ0), one pass
  (:func:`pactlib.native.task_arithmetic`).
- TIES (M2), ``scope`` global or per key: two radix passes count each task's |Δt| digits
  (:func:`pactlib.native.digit_hist_delta`, :func:`~pactlib.native.select_digit`: the
  thresholds of :class:`pactlib.merges.ties.GlobalThreshold`), each of ``--workers`` threads
  taking its own tasks through a whole pass (per key: through both passes of every key); a third
  pass makes the task vectors (``pact_deltas``), trims, elects and averages
  (``pact_ties_merge_f32``) and forms θ0 + α·D (:func:`pactlib.native.apply`), each block's
  columns split over the threads.

The output is the torch path's, byte for byte (tests/test_fastpath.py), with the same warnings
and the same JSON line. Both merge the θt in their content order (:mod:`pactlib.order`, found by
:func:`_content_order` from a chunk of each file's float32 task vector): any order of the same
``--finetuned`` files gives the same bytes; the warnings name the files as given. The headers are read by the torch path's reader
(:func:`pactlib.safetensors_io.read_header_checked`), so both refuse the same files with the same
message; an input that changes while it is read (size, times, inode: checked when it is opened,
before and after each block or span, and before publishing) is the error "FILE changed while
it was read" and nothing is published; a file cut short between two checks reads short, which is
the same error.

It takes a merge when all of these hold; otherwise :func:`try_merge` returns None before
anything is written and ``pact merge`` runs the torch path, which also gives every error:

- Task Arithmetic, or TIES with ``k`` and ``scope`` only and at most 255 tasks, from the flags
  or from a recipe (``--config``, read with :data:`METHODS` for the registry); no PACT, no LoRA
  adapters, ``--device`` unset or ``cpu``; ``--out`` a ``.safetensors`` file or index (not a
  ``.pt``), or a folder: then the model folder the torch path writes (its inputs hashed, the
  weights, θ0's folder's support files, the recipe and the card:
  :class:`pactlib.recipe.FolderFiles`);
- θ0 and every θt one safetensors file each (a file, or a folder holding one), with the same keys,
  shapes and dtypes, and no empty entry; floating keys in float32, bfloat16 or float16, and at
  least one;
- a POSIX system and the compiled library (:func:`pactlib.native.compiled`; the first run after
  an install or an edit of the C files builds it and probes it against torch,
  :func:`pactlib.native.library`, so that one imports torch); for TIES also the fast path's own
  loops (:func:`pactlib.fastpath.kernels.library`, checked against native's in each process).

When a merged value is not finite (NaN / Inf in an input, or an overflow of θ0's dtype), the
output is discarded and the torch path runs, raising the error that names the file and key.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from .. import native
from ..checks import CheckpointError, check_alpha, task_set_warnings
from ..io import signals_held
from ..lazy import (CheckpointWriter, check_out_suffix, check_out_target, checkpoint_files, finish_output,
                    is_folder_output, output_lock, parse_size)
from ..matrix import detect_preset, split_attention_note
from ..recipe import (DEFAULT_SHARD_SIZE, FolderFiles, check_folder_target, check_model_folder_out, check_sha256,
                      weights_name)
from ..safetensors_io import FLOATS, ITEMSIZE, ChangedInputError, check_unchanged, read_header_checked
from ..order import CHUNK, content_order, in_user_order, pairs_in_user_order, segments
from . import kernels

__all__ = ["BUDGET_BYTES", "METHODS", "plan", "trim_count", "try_merge"]

_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None  # pread(2): POSIX only

class Method(NamedTuple):
    """What a model card and a recipe take from the merge methods' registry."""
    params: dict
    pretty: str
    reference: str


#: the registry's entries (:func:`pactlib.merges.get`, which imports torch) of the methods this
#: module merges, for folder outputs (tests/test_fastpath.py holds them equal)
METHODS = {"task_arithmetic": Method({}, "Task Arithmetic", "Ilharco et al., ICLR 2023"),
           "ties": Method({"k": 20.0, "scope": "global"}, "TIES", "Yadav et al., NeurIPS 2023")}
#: torch's names of the float dtypes the module merges, for a recipe's ``dtype``
TORCH_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}

#: bytes a merged block holds together at most, whatever T: its buffers of the T + 1 inputs and the
#: two output buffers
BUDGET_BYTES = 24 << 20
#: bytes of one input a merged block reads at most: buffers that stay in the CPU's caches between
#: the ``pread`` that fills them and the loop that reads them
READ_BYTES = 1 << 20


class _Plan:
    """What :func:`plan` found: the merge (a :class:`pactlib.recipe.Recipe`), the files, θ0's
    entries (in the order of its data: key -> (shape, dtype name, offset)), each file's offsets,
    the method's parameters and the libraries."""

    def __init__(self, args, recipe, files: list[Path], heads: list[dict], lib, fast, folder: Path | None,
                 out: str, max_shard_size):
        self.args, self.recipe, self.pre, self.fts, self.lib, self.fast = args, recipe, files[0], files[1:], lib, fast
        # the folder of a folder output, the weights file and their shard size (as the torch path's)
        self.folder, self.out, self.max_shard_size = folder, out, max_shard_size
        self.entries = {k: v[:3] for k, v in heads[0].entries.items()}
        self.offsets = [{k: v[2] for k, v in h.entries.items()} for h in heads]
        self.identities = [h.identity for h in heads]  # each file's when its header was read
        self.params = recipe.params  # as given (--set or the recipe), for the JSON line
        self.floats = [k for k, (_, dt, _) in self.entries.items() if dt in FLOATS]
        self.dtypes = sorted({TORCH_NAMES[self.entries[k][1]] for k in self.floats})  # torch's names, as a recipe


def _one_file(path: str) -> Path | None:
    files = checkpoint_files(path)
    return files[0] if len(files) == 1 and files[0].suffix == ".safetensors" else None


def _ties_params(params: dict) -> tuple[float, str] | None:
    """TIES' (k, scope) from ``--set``, when the fast path takes them (``k`` and ``scope`` only)."""
    defaults = METHODS["ties"].params
    scope = params.get("scope", defaults["scope"])
    if not set(params) <= {"k", "scope"} or scope not in ("global", "per_key"):
        return None
    k = params.get("k", defaults["k"])
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k <= 100:
        return None
    return float(k), scope


def _takes(method: str, pact, params: dict) -> None:
    """Raise ValueError unless the fast path takes the merge (``check`` of
    :func:`pactlib.recipe.read_recipe`): the torch path then reads the recipe again and names what
    is wrong with it."""
    if (method not in METHODS or pact is not None or method == "task_arithmetic" and params
            or method == "ties" and _ties_params(params) is None):
        raise ValueError(f"{method}: not a merge of the fast path")


def plan(args) -> _Plan | None:
    """The fast merge of the parsed ``pact merge`` arguments ``args`` (flags or ``--config``), or
    None when it does not take them (module docstring). Reads the recipe and the headers only
    (:func:`pactlib.safetensors_io.read_header_checked`, the torch path's reader).

    Raises:
        CheckpointError: an input's header is not valid (the torch path's message, naming the
            file); every other refusal is None, and the torch path gives its error.
    """
    try:
        if _libc is None or args.lora_adapters or args.device not in (None, "cpu"):
            return None
        from ..command import recipe_of

        r = recipe_of(args, methods=METHODS, check=_takes)  # paths made absolute, as the torch path's
        _takes(r.merge_method, r.pact, r.params)
        if r.lora or len(r.models) > 255:
            return None
        folder = Path(args.out) if is_folder_output(args.out) else None
        shard = r.max_shard_size if folder is None or r.max_shard_size is not None else DEFAULT_SHARD_SIZE
        out = str(folder / weights_name(r.base_model)) if folder is not None else args.out
        if check_out_suffix(out, shard) == "torch":
            return None
        check_alpha(r.alpha)
        if shard is not None:
            parse_size(shard)
        if args.threads is not None and not 1 <= args.threads <= 4096 or args.workers is not None and args.workers < 1:
            return None
        inputs = [r.base_model, *r.models]
        files = [_one_file(p) for p in inputs]
        if None in files:
            return None
        # not probed yet (a first run, or new C sources): probe it now, with torch, once per machine
        lib = native.compiled() or native.library()
        if lib is None:
            return None
        if folder is not None:
            check_folder_target(folder, inputs)
        check_out_target(out, inputs, name="--out")
        check_model_folder_out(out)
        # the headers in the torch path's order: θ0's, its dtypes against the recipe's, then the θt's
        heads = [_header(files[0])]
        layout = {k: v[:2] for k, v in heads[0].entries.items()}
        if not any(dt in FLOATS for _, dt in layout.values()) or any(
                dt in FLOATS and dt not in native.CODES for _, dt in layout.values()):
            return None
        if r.dtype is not None and sorted({TORCH_NAMES[dt] for _, dt in layout.values() if dt in FLOATS}) != [r.dtype]:
            return None  # the recipe's dtype is not θ0's: the torch path says so
        if folder is not None or r.sha256:
            heads += [read_header_checked(f) for f in files[1:]]  # hashed first: the torch path's errors
        else:
            heads += [_header(f) for f in files[1:]]
        if any({k: v[:2] for k, v in h.entries.items()} != layout for h in heads[1:]):
            return None
        if any(not v[3] for h in heads for v in h.entries.values()):
            return None  # an empty entry
        fast = kernels.library(lib) if r.merge_method == "ties" else None
        if r.merge_method == "ties" and fast is None:
            return None
        p = _Plan(args, r, files, heads, lib, fast, folder, out, shard)
        if r.dtype is not None and p.dtypes != [r.dtype]:
            return None  # the recipe's dtype is not θ0's: the torch path says so
        return p
    except _Refused as e:
        raise e.error from None
    except Exception:
        return None


class _Refused(Exception):
    """An input :func:`plan` refuses with the torch path's own error (``error``)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _header(path: Path):
    """:func:`pactlib.safetensors_io.read_header_checked` of ``path``; its error (an invalid
    header, named as the torch path names it) ends the run."""
    try:
        return read_header_checked(path)
    except CheckpointError as e:
        raise _Refused(e) from e


def buffers(n: int, nbytes: int) -> tuple[list[bytearray], list[memoryview], list[int]]:
    """``n`` zeroed buffers of ``nbytes`` each: the buffers, a memoryview of each and the address
    of each (for the C loops)."""
    bufs = [bytearray(nbytes) for _ in range(n)]
    return bufs, [memoryview(b) for b in bufs], [ctypes.addressof((ctypes.c_char * nbytes).from_buffer(b))
                                                 for b in bufs]


class _Inputs:
    """θ0 and the θt, each opened once; every read is a ``pread`` into a buffer (:meth:`read_into`),
    so the process's resident memory stays about a block per file whatever the file sizes, and a
    file cut short reads short instead of faulting. Each file has a buffer of a block, the merged
    blocks two buffers of ``step`` entries.

    A file that changes while it is read (:func:`pactlib.safetensors_io.file_identity`, checked
    when it is opened, before and after each block or span is read and by :func:`try_merge` before
    publishing) raises :class:`~pactlib.safetensors_io.ChangedInputError`; so does a ``pread``
    past a file's new end."""

    def __init__(self, p: _Plan):
        self.p, self.T = p, len(p.fts)
        self.files = [p.pre, *p.fts]
        itemsize = max(ITEMSIZE[dt] for _, dt, _ in p.entries.values())
        # entries per block: the buffers of the T + 1 inputs and the two output buffers, together in
        # BUDGET_BYTES whatever T, each of at most READ_BYTES
        self.step = max(1024, min(BUDGET_BYTES // (self.T + 3), READ_BYTES) // itemsize)
        self.fds = []
        try:
            for f, identity in zip(self.files, p.identities):
                self.fds.append(os.open(f, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
                check_unchanged(f, identity, self.fds[-1])  # the file whose header was read
        except BaseException:
            self.close()
            raise
        self._in, self._in_views, self._in_addr = buffers(len(self.files), self.step * itemsize)
        self._out, self.out_views, self.out_addr = buffers(2, self.step * itemsize)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def check(self, i: int) -> None:
        """Raise :class:`~pactlib.safetensors_io.ChangedInputError` when file i (0: θ0, t + 1: θt)
        is no longer the file whose header was read."""
        check_unchanged(self.files[i], self.p.identities[i], self.fds[i])

    def read_into(self, i: int, key: str, a: int, m: int, view: memoryview) -> None:
        """Entries [a, a + m) of ``key`` in file i into ``view`` (``pread``, checked before and
        after: a file that changed, or ends early, raises ``ChangedInputError``)."""
        size = ITEMSIZE[self.p.entries[key][1]]
        pos, n, done = self.p.offsets[i][key] + a * size, m * size, 0
        self.check(i)
        try:
            while done < n:
                got = os.preadv(self.fds[i], [view[done:n]], pos + done)
                if got <= 0:
                    raise ChangedInputError(self.files[i])  # it ends before its header says
                done += got
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.files[i])) from e
        self.check(i)

    def read_block(self, key: str, a: int, m: int) -> list[int]:
        """The address of entry a of ``key`` in every file (0: θ0, t + 1: θt): each file's entries
        [a, a + m) read into a buffer of its own, valid until the next call."""
        for i in range(len(self.files)):
            self.read_into(i, key, a, m, self._in_views[i])
        return self._in_addr

    def ranges(self, key: str, step: int | None = None):
        """``(a, m)``: the blocks of ``key`` (of ``step`` entries, default :attr:`step`), m entries
        from entry a."""
        n, step = math.prod(self.p.entries[key][0]), step or self.step
        return ((a, min(step, n - a)) for a in range(0, n, step))


class _Flags:
    """What the C loops find about the task set: ``nonzero`` (T uint8 flags, set where some
    Δt != 0) and ``same`` (T·T, every pair i < j set until the loops see Δi and Δj differ)."""

    def __init__(self, T: int):
        self.T = T
        self.pairs = [(i, j) for i in range(T) for j in range(i + 1, T)]
        self.nonzero, self.same = (ctypes.c_uint8 * T)(), (ctypes.c_uint8 * (T * T))()
        for i, j in self.pairs:
            self.same[i * T + j] = 1
        self._open = bool(self.pairs)

    def undecided(self) -> bool:
        """Whether some pair of tasks may still be identical (once none may, never again)."""
        self._open = self._open and any(self.same[i * self.T + j] for i, j in self.pairs)
        return self._open

    def found(self) -> tuple[list[bool], set[tuple[int, int]]]:
        """(nonzero per task, identical pairs): :func:`pactlib.checks.task_set_warnings`' input."""
        return [bool(v) for v in self.nonzero], {(i, j) for i, j in self.pairs if self.same[i * self.T + j]}


class _Output:
    """The merged blocks handed to one writer thread, in order, through two buffers: ``buffer()``
    (the address of the buffer to fill next, once its last block is written), ``emit(key,
    nbytes)``, ``drain()``."""

    def __init__(self, pool: ThreadPoolExecutor, writer: CheckpointWriter, inputs: _Inputs):
        self.pool, self.writer, self.inputs = pool, writer, inputs
        self.pending: list = [None, None]
        self.k = 0

    def buffer(self) -> int:
        if self.pending[self.k] is not None:
            self.pending[self.k].result()  # written: the buffer may be filled again
        return self.inputs.out_addr[self.k]

    def emit(self, key: str, nbytes: int) -> None:
        self.pending[self.k] = self.pool.submit(self.writer.write_bytes, key, self.inputs.out_views[self.k][:nbytes])
        self.k ^= 1

    def drain(self) -> None:
        for f in self.pending:
            if f is not None:
                f.result()


def _copy_buffer_key(out: _Output, b: _Inputs, key: str) -> None:
    """A non-float key (a buffer): θ0's bytes, block by block."""
    size = ITEMSIZE[b.p.entries[key][1]]
    for a, m in b.ranges(key):
        out.buffer()
        b.read_into(0, key, a, m, b.out_views[out.k])
        out.emit(key, m * size)


def _task_arithmetic(p: _Plan, writer: CheckpointWriter):
    """Merge every key into ``writer``: (nonzero per task, identical pairs), or None when a
    merged value is not finite (nothing more is written)."""
    b = _Inputs(p)
    T, alpha = b.T, float(p.recipe.alpha)
    flags = _Flags(T)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # one writer: the blocks go out in order
            out = _Output(pool, writer, b)
            for key, (_, dt, _) in p.entries.items():
                if dt not in FLOATS:
                    _copy_buffer_key(out, b, key)
                    continue
                code = native.CODES[dt]
                codes = (ctypes.c_int32 * T)(*([code] * T))
                for a, m in b.ranges(key):
                    pre, *fts = b.read_block(key, a, m)
                    if native.task_arithmetic(p.lib, pre, code, (ctypes.c_void_p * T)(*fts), codes, m, alpha,
                                              out.buffer(), flags.nonzero, flags.same, flags.undecided()):
                        return None
                    out.emit(key, m * ITEMSIZE[dt])
            out.drain()
        return flags.found()
    finally:
        b.close()


def trim_count(numel: int, k: float) -> int:
    """:func:`pactlib.merges.ties.trim_count` (the same integer; tests/test_fastpath.py)."""
    return min(numel, max(1, int(-(-k * numel // 100))))


def _parts(T: int, workers: int) -> list[range]:
    """The tasks split into min(workers, T) contiguous ranges, one per thread."""
    n = max(1, min(workers, T))
    return [range(T * i // n, T * (i + 1) // n) for i in range(n)]


def _workers(args) -> int:
    """Threads for TIES' passes: ``--workers``, else ``--threads``, else 1 (as the torch path)."""
    return args.workers if args.workers is not None else (args.threads or 1)


#: ``pactlib.streaming.CHUNK_BYTES``: per-key TIES compares the tasks of a key that fits in a
#: quarter of it by value (``_TaskChecks.update``), of a longer key by bits (``_KeyProbe``)
TORCH_CHUNK_BYTES = 32 << 20


#: bytes of one file a radix pass reads at a time (:meth:`_Ties._spans`)
SPAN_BYTES = 1 << 20
#: bytes of the task vectors of a block whose tasks are compared pair by pair (TIES's first blocks)
CHECK_BYTES = 4 << 20


def _whole_key(shape: tuple, T: int) -> bool:
    """Whether per-key TIES' torch path reads ``key`` in one chunk (``DeltaReader.rows`` with a
    quarter of :data:`TORCH_CHUNK_BYTES`): its tasks are then compared by value, else by bits."""
    if not shape:
        return True
    per_row = max(1, math.prod(shape) // max(shape[0], 1)) * 4 * T
    return max(1, max(1, TORCH_CHUNK_BYTES // 4) // per_row) >= shape[0]


class _Left:
    """Which entries equal to its threshold each task still keeps (TIES keeps the first by
    position, :class:`pactlib.merges.ties.GlobalThreshold`): ``left[t]`` still to keep of the
    ``remaining[t]`` still to come. A task is done when it keeps none more, and keeps all when it
    keeps every one to come; only the others (pending) make a block's column parts depend on each
    other: their ties in every part but the last are counted first, and each part starts with what
    the parts before it left."""

    ALL = 1 << 62  # a part keeps every tie it meets

    def __init__(self, left: list[int], equal: list[int]):
        self.left, self.remaining = list(left), list(equal)

    def pending(self) -> list[int]:
        return [t for t, (n, r) in enumerate(zip(self.left, self.remaining)) if 0 < n < r]

    def starts(self, counts: list[list[int]]) -> list[list[int]]:
        """What each of ``len(counts) + 1`` parts starts from (``pact_ties_merge_f32``'s ``left``),
        given the ties of each pending task (:meth:`pending`'s order) in every part but the last."""
        pending, out = self.pending(), []
        for w in range(len(counts) + 1):
            row = [0 if v == 0 else self.ALL for v in self.left]
            for i, t in enumerate(pending):
                row[t] = max(0, self.left[t] - sum(c[i] for c in counts[:w]))
            out.append(row)
        return out

    def advance(self, starts: list[list[int]], ends: list) -> None:
        """The block is merged, part w from ``starts[w]`` down to ``ends[w]``: the ties of the
        pending tasks are behind. A task still left with ties to keep kept every one of the block."""
        for t in self.pending():
            kept = sum(s[t] - e[t] for s, e in zip(starts, ends))
            self.left[t], self.remaining[t] = self.left[t] - kept, self.remaining[t] - kept


class _Ties:
    """TIES (M2) over the inputs: the radix passes of :class:`pactlib.merges.ties.GlobalThreshold`
    for a set of keys, each worker thread sweeping its own tasks through every block (no thread
    waits for another until the pass ends); then the merge pass of a key, each block's columns split
    over the workers. The same bits for any number of workers."""

    ALIGN = 64  # column parts start on whole cache lines of the output

    def __init__(self, p: _Plan, b: _Inputs, cores: ThreadPoolExecutor):
        self.p, self.b, self.cores, self.T = p, b, cores, b.T
        self.workers = _workers(p.args)  # column parts of a merged block
        self.halves = _parts(self.T, self.workers)  # task ranges of a radix pass
        self.hist = (ctypes.c_int64 * (self.T << 16))()
        self.flags = _Flags(self.T)
        self.nonzero, self.same = self.flags.nonzero, self.flags.same
        # the (T, m) task vectors of a block whose tasks are compared pair by pair (pact_deltas)
        self.check_step = max(1024, CHECK_BYTES // (4 * self.T))
        itemsize = max(ITEMSIZE[dt] for _, dt, _ in p.entries.values())
        self._check_in, self._check_views, self.check_addr = buffers(self.T + 1, self.check_step * itemsize)
        # per radix-pass worker (by its first task): θ0's span and one θt's span
        self._spans_in = {r.start: buffers(2, SPAN_BYTES) for r in self.halves}
        self._stack = (ctypes.c_float * (self.T * self.check_step))()
        self.stack = ctypes.addressof(self._stack)
        self.fast = p.fast
        # per worker: pact_ties_merge_raw's rows, D and workspace; its T pointers; pact_deltas' flags
        self.space = [(ctypes.c_float * kernels.workspace_size(self.T))() for _ in range(self.workers)]
        self.ptrs = [(ctypes.c_void_p * self.T)() for _ in range(self.workers)]
        self.seen = [(ctypes.c_uint8 * self.T)() for _ in range(self.workers)]
        self.codes = (ctypes.c_int32 * self.T)()

    def _parallel(self, fn, items) -> list:
        return list(self.cores.map(fn, items))  # the first error is raised

    def _pass(self, tasks: range, spans: list, shift: int, prefix: list, rank: list, equal: list,
              zero: bool) -> bool:
        """One radix pass of ``tasks`` over ``spans`` (their counters zeroed first when ``zero``),
        then each task's digit: its ``prefix``, ``rank`` (ties still to keep) and ``equal`` (entries
        at the threshold) updated. False when a task vector holds NaN / Inf."""
        b, lib, hist = self.b, self.p.lib, ctypes.addressof(self.hist)
        _, views, (pre, x) = self._spans_in[tasks.start]
        if zero:
            ctypes.memset(hist + (tasks.start << 19), 0, len(tasks) << 19)
        for key, code, a, m in spans:
            b.read_into(0, key, a, m, views[0])  # each worker reads θ0's span once
            for t in tasks:
                b.read_into(t + 1, key, a, m, views[1])
                if (self.fast.pact_hist_low_f32(pre, x, m, prefix[t], hist + (t << 19)) if not shift and code == 0 else
                        lib.pact_digit_hist_delta(pre, code, x, code, m, prefix[t], shift, hist + (t << 19))):
                    self.nonzero[t] = 1
        for t in tasks:
            if shift and any(self.hist[(t << 16) + 0x7f80:(t + 1) << 16]):
                return False  # NaN / Inf in a task vector: the torch path names it
            j, higher = native.select_digit(lib, hist + (t << 19), rank[t])
            rank[t] -= higher
            prefix[t] = (prefix[t] << 16) | j
            equal[t] = self.hist[(t << 16) + j]
        return True

    def thresholds(self, keys: list[str], keep: int, check) -> tuple | None:
        """(thresholds, :class:`_Left`) of every task over ``keys`` (ctypes int64 array); None when
        a task vector holds NaN / Inf. ``check(key)``: how its tasks are compared while some may
        be identical (1 values, 2 bits: ``pact_deltas``)."""
        T, b, lib = self.T, self.b, self.p.lib
        prefix, rank, equal = [0] * T, [keep] * T, [0] * T
        hist = ctypes.addressof(self.hist)
        blocks = [(key, native.CODES[self.p.entries[key][1]], a, m) for key in keys
                  for a, m in b.ranges(key, self.check_step)]
        for shift in (16, 0):  # float32: two passes of 16-bit digits
            first = 0
            whole = shift and self.flags.undecided()
            if whole:  # every pair compared, block by block, until none may be identical
                ctypes.memset(self.hist, 0, ctypes.sizeof(self.hist))
            while whole and first < len(blocks) and self.flags.undecided():
                key, code, a, m = blocks[first]
                for i in range(T + 1):
                    b.read_into(i, key, a, m, self._check_views[i])
                pre, *fts = self.check_addr
                for t in range(T):
                    self.codes[t] = code
                lib.pact_deltas(pre, code, (ctypes.c_void_p * T)(*fts), self.codes, T, m, self.stack, self.nonzero,
                                self.same, check(key))
                for t in range(T):
                    lib.pact_digit_hist_f32(self.stack + 4 * t * m, m, prefix[t], shift, hist + (t << 19))
                first += 1
            spans = list(self._spans(blocks[first:]))
            if not all(self._parallel(lambda tasks: self._pass(tasks, spans, shift, prefix, rank, equal, not whole),
                                      self.halves)):
                return None
        return (ctypes.c_int64 * T)(*prefix), _Left(rank, equal)

    def per_key(self, keys: list[str], keep) -> dict | None:
        """:meth:`thresholds` of each key of ``keys`` on its own (``keep(key)`` entries), once no
        pair of tasks may be identical: each worker takes its tasks through both passes of every
        key without waiting for the others. ``{key: (thresholds, _Left)}``, or None (NaN / Inf)."""
        T = self.T
        found = {key: ([0] * T, [keep(key)] * T, [0] * T) for key in keys}

        def sweep(tasks: range) -> bool:
            for key, (prefix, rank, equal) in found.items():
                n = math.prod(self.p.entries[key][0])
                spans = list(self._spans([(key, native.CODES[self.p.entries[key][1]], 0, n)]))
                for shift in (16, 0):
                    if not self._pass(tasks, spans, shift, prefix, rank, equal, True):
                        return False
            return True

        if not all(self._parallel(sweep, self.halves)):
            return None
        return {key: ((ctypes.c_int64 * T)(*prefix), _Left(rank, equal))
                for key, (prefix, rank, equal) in found.items()}

    def _spans(self, blocks: list):
        """The ``(key, code, a, m)`` blocks (consecutive within each key) joined into spans of up to
        :data:`SPAN_BYTES` of a key: a radix pass holds two files' spans per worker, whatever T,
        and reads them in long runs."""
        runs: dict = {}
        for key, code, a, m in blocks:
            start = runs.setdefault(key, [code, a, a])
            start[2] = a + m
        for key, (code, lo, hi) in runs.items():
            span = max(1, SPAN_BYTES // ITEMSIZE[self.p.entries[key][1]])
            for c in range(lo, hi, span):
                yield key, code, c, min(span, hi - c)

    def _columns(self, m: int) -> list[tuple[int, int]]:
        """``(c, n)``: the block's m columns split in ``workers`` parts, n columns from column c."""
        k = self.workers
        cuts = [0, *(min(m, (m * i // k) // self.ALIGN * self.ALIGN) for i in range(1, k)), m]
        return [(c, e - c) for c, e in zip(cuts, cuts[1:]) if e > c]

    def merge(self, key: str, thresholds, left: _Left, out: _Output, alpha: float) -> bool:
        """The merge pass over ``key``: trim (the first tied entries by position), elect, mean,
        θ0 + α·D, to ``out``. False when a merged value is not finite."""
        T, b = self.T, self.b
        dt = self.p.entries[key][1]
        code, size = native.CODES[dt], ITEMSIZE[dt]
        for t in range(T):
            self.codes[t] = code
        for a, m in b.ranges(key):
            pre, *fts = b.read_block(key, a, m)
            dest = out.buffer()
            parts = self._columns(m)
            pending = left.pending()

            def count(w: int) -> list[int]:
                """Part w's ties of each pending task."""
                c, n = parts[w]
                return [self.fast.pact_count_ties(pre + c * size, code, fts[t] + c * size, code, n, thresholds[t])
                        for t in pending]

            def trim(w: int) -> int:
                """Part w merged into the output: the number of its entries that are not finite."""
                c, n = parts[w]
                return self.fast.pact_ties_merge_raw(pre + c * size, code,
                                                     (ctypes.c_void_p * T)(*(f + c * size for f in fts)),
                                                     self.codes, T, n, thresholds, ends[w], alpha, dest + c * size,
                                                     self.ptrs[w], self.space[w], self.seen[w])

            last = len(parts) - 1
            counts = self._parallel(count, range(last)) if pending and last else [[]] * last
            starts = left.starts(counts)  # each part starts where the one before ended
            ends = [(ctypes.c_int64 * T)(*row) for row in starts]
            bad = sum(self._parallel(trim, range(len(parts)))) if last else trim(0)
            left.advance(starts, ends)
            if bad:
                return False
            out.emit(key, m * size)
        return True


def _ties(p: _Plan, writer: CheckpointWriter):
    """TIES into ``writer`` (module docstring), global or per key: as :func:`_task_arithmetic`."""
    T, alpha = len(p.fts), float(p.recipe.alpha)
    k, scope = _ties_params(p.params)
    b = _Inputs(p)
    try:
        with ThreadPoolExecutor(max_workers=_workers(p.args)) as cores, \
                ThreadPoolExecutor(max_workers=1) as pool:  # one writer: the blocks go out in order
            ties, out = _Ties(p, b, cores), _Output(pool, writer, b)
            if scope == "global":
                found = ties.thresholds(p.floats, trim_count(sum(math.prod(p.entries[key][0]) for key in p.floats), k),
                                        lambda key: 1)
                if found is None:
                    return None
                by_key = dict.fromkeys(p.floats, found)
            else:  # key by key while some tasks may be identical, then every key's passes in one sweep
                by_key, keys = {}, list(p.floats)
                while keys and ties.flags.undecided():
                    key = keys.pop(0)
                    shape = p.entries[key][0]
                    by_key[key] = ties.thresholds([key], trim_count(math.prod(shape), k),
                                                  lambda key, shape=shape: 1 if _whole_key(shape, T) else 2)
                    if by_key[key] is None:
                        return None
                rest = ties.per_key(keys, lambda key: trim_count(math.prod(p.entries[key][0]), k))
                if rest is None:
                    return None
                by_key.update(rest)
            for key, (shape, dt, _) in p.entries.items():
                if dt not in FLOATS:
                    _copy_buffer_key(out, b, key)
                elif not ties.merge(key, *by_key[key], out, alpha):
                    return None
            out.drain()
        return ties.flags.found()
    finally:
        b.close()


def _content_order(p: _Plan) -> list[int]:
    """Put the θt of ``p`` in their content order (:mod:`pactlib.order`: the order of the bytes of
    their float32 task vectors Δt = θt − θ0, keys in sorted order, the order the torch path merges
    them in), read a chunk of one key of one task at a time (``pread``; the task vectors formed by
    :func:`pactlib.native`'s ``pact_deltas``, the torch path's float32 values); ``p``'s files,
    offsets and identities are reordered in place. ``perm[c]``: the caller's index of the c-th task.

    Raises:
        ChangedInputError: a file changed since its header was read (or ends early).
    """
    T = len(p.fts)
    segs = segments({k: p.entries[k][0] for k in p.floats})
    files, offsets, identities = [p.pre, *p.fts], p.offsets, p.identities
    buf = [bytearray(CHUNK * 4) for _ in range(2)]
    out = (ctypes.c_float * CHUNK)()
    flags, same = (ctypes.c_uint8 * 1)(), (ctypes.c_uint8 * 1)()
    fds: dict[int, int] = {}

    def read(i: int, key: str, a: int, m: int, into: bytearray) -> int:
        size = ITEMSIZE[p.entries[key][1]]
        if i not in fds:
            fds[i] = os.open(files[i], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            check_unchanged(files[i], identities[i], fds[i])
        view, pos, n, done = memoryview(into), offsets[i][key] + a * size, m * size, 0
        while done < n:
            got = os.preadv(fds[i], [view[done:n]], pos + done)
            if got <= 0:
                raise ChangedInputError(files[i])  # it ends before its header says
            done += got
        return ctypes.addressof((ctypes.c_char * len(into)).from_buffer(into))

    def chunk(t: int, c: int) -> bytes:
        key, a, b = segs[c]
        code = native.CODES[p.entries[key][1]]
        pre = read(0, key, a, b - a, buf[0])
        x = (ctypes.c_void_p * 1)(read(t + 1, key, a, b - a, buf[1]))
        p.lib.pact_deltas(pre, code, x, (ctypes.c_int32 * 1)(code), 1, b - a, out, flags, same, 0)
        return ctypes.string_at(out, 4 * (b - a))

    try:
        perm = content_order(T, len(segs), chunk)
    finally:
        for fd in fds.values():
            os.close(fd)
    if perm != list(range(T)):
        p.fts = [p.fts[t] for t in perm]
        p.offsets = [p.offsets[0], *(p.offsets[t + 1] for t in perm)]
        p.identities = [p.identities[0], *(p.identities[t + 1] for t in perm)]
    return perm


def try_merge(args) -> int | None:
    """Run ``pact merge`` for the parsed ``args`` without torch when :func:`plan` takes it:
    print the torch path's JSON line and return 0; None when it does not take it, or when a merged
    value is not finite (nothing is published: the caller runs the torch path).

    Raises:
        CheckpointError: an input's header is not valid (as the torch path says it);
            ChangedInputError: an input changed while it was read (nothing is published).
        OutputError (an ``OSError``): another run writes the output, or writing failed (named,
            nothing left behind); OSError: an input could not be read.
    """
    p = plan(args)
    if p is None:
        return None
    perm = _content_order(p)  # merged in the content order: a function of the set of tasks
    a, r = p.args, p.recipe
    note = split_attention_note(p.entries, where=f"{r.merge_method}: ")
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    if p.folder is not None or r.sha256:  # the inputs hashed (and checked against the recipe's) first
        r = replace(r, sha256=check_sha256(r, where=a.config or "recipe", workers=_workers(a)),
                    dtype=p.dtypes[0] if len(p.dtypes) == 1 else None)
    Path(p.out).parent.mkdir(parents=True, exist_ok=True)
    entries = [(k, shape, dt) for k, (shape, dt, _) in p.entries.items()]
    names = [f.path.name for f in CheckpointWriter(p.out, entries, max_shard_size=p.max_shard_size).files]
    # a folder's files are written in its staging folder and swapped in whole (FolderFiles)
    with (FolderFiles(p.folder, r, sha256=r.sha256, method=METHODS[r.merge_method], weights=names)
          if p.folder is not None else contextlib.nullcontext()) as folder_files:
        out = folder_files.staged(p.out) if folder_files is not None else p.out
        with output_lock(out), CheckpointWriter(out, entries, max_shard_size=p.max_shard_size) as writer:
            found = (_task_arithmetic if r.merge_method == "task_arithmetic" else _ties)(p, writer)
            if found is None:
                return None  # the writer removes its temporary files; the torch path names the cause
            for f, identity in zip([p.pre, *p.fts], p.identities):  # read whole from the files checked
                check_unchanged(f, identity)
            nonzero, same = found  # of the tasks in the content order: named in the caller's order
            for message in task_set_warnings(list(r.models), in_user_order(nonzero, perm),
                                             pairs_in_user_order(same, perm)):
                warnings.warn(message, stacklevel=2)
            with signals_held() as held:  # as merge_files: published whole, then a signal stops the run
                weights = writer.commit()
                held += weights
                extra = folder_files.publish() if folder_files is not None else []
                held += extra
                finish_output(out, weights)
    path = Path(writer.path)
    if p.folder is not None:  # the names in the folder, not in its staging folder
        weights, path = [p.folder / w.name for w in weights], p.folder / path.name
    from ..command import say_merged

    files = weights + extra
    say_merged({"out": str(path), "method": r.merge_method, "pact": None, "alpha": r.alpha,
                "tasks": len(r.models), "rule": detect_preset(p.entries) if r.rule == "auto" else r.rule,
                "params": r.params, **({"folder": str(p.folder)} if p.folder is not None else {}),
                "files": [str(f) for f in files]})
    return 0
