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

- ``--method task_arithmetic``, no ``--pact``, ``--set``, ``--config`` or ``--lora-adapters``,
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

import ctypes
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

__all__ = ["BUDGET_BYTES", "plan", "try_merge"]

#: bytes of all the block buffers together (θ0's, T θt's and two outputs'), whatever T
BUDGET_BYTES = 12 << 20


class _Plan:
    """What :func:`plan` found: the files, θ0's entries and the merge's settings."""

    def __init__(self, args, pre: Path, fts: list[Path], entries: dict, lib):
        self.args, self.pre, self.fts, self.entries, self.lib = args, pre, fts, entries, lib
        self.offsets: list[dict[str, int]] = []


def _one_file(path: str) -> Path | None:
    files = checkpoint_files(path)
    return files[0] if len(files) == 1 and files[0].suffix == ".safetensors" else None


def plan(args) -> _Plan | None:
    """The fast merge of the parsed ``pact merge`` arguments ``args``, or None when it does not
    take them (module docstring). Reads the headers only; raises nothing (a refusal is None)."""
    try:
        if (args.config is not None or args.lora_adapters or args.pact is not None or args.set
                or args.method != "task_arithmetic" or args.alpha is None or not args.pretrained
                or not args.finetuned or args.device not in (None, "cpu") or is_folder_output(args.out)
                or check_out_suffix(args.out, args.max_shard_size) == "torch"):
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
        heads = [read_entries(f) for f in files]
        entries = heads[0][0]
        layout = {k: v[:2] for k, v in entries.items()}
        if not any(dt in FLOATS for _, dt in layout.values()) or any(
                dt in FLOATS and dt not in native.CODES for _, dt in layout.values()):
            return None
        if any({k: v[:2] for k, v in h.items()} != layout for h, _ in heads[1:]):
            return None
        p = _Plan(args, files[0], files[1:], entries, lib)
        p.offsets = [{k: v[2] for k, v in h.items()} for h, _ in heads]
        return p
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


def _merge(p: _Plan, writer: CheckpointWriter) -> tuple[list[bool], set[tuple[int, int]]] | None:
    """Merge every key into ``writer``; (nonzero per task, identical pairs), or None when a
    merged value is not finite (nothing more is written). Blocks of every key are read and
    merged here while a second thread writes the previous block (two output buffers)."""
    T = len(p.fts)
    fds = [os.open(f, os.O_RDONLY) for f in (p.pre, *p.fts)]
    try:
        itemsize = max(ITEMSIZE[dt] for _, dt, _ in p.entries.values())
        step = max(256, BUDGET_BYTES // ((T + 3) * itemsize))  # entries per block, whatever T
        bufs = [bytearray(step * itemsize) for _ in range(T + 3)]  # θ0, the θt, two outputs
        views = [memoryview(b) for b in bufs]
        addr = [ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) for b in bufs]
        fts = (ctypes.c_void_p * T)(*addr[1:T + 1])
        nonzero, same = (ctypes.c_uint8 * T)(), (ctypes.c_uint8 * (T * T))()
        for i in range(T):
            for j in range(i + 1, T):
                same[i * T + j] = 1
        alpha = float(p.args.alpha)
        with ThreadPoolExecutor(max_workers=1) as pool:  # one writer: the blocks go out in order
            pending: list = [None, None]
            k = 0
            for key, (shape, dt, _) in p.entries.items():
                n, size = math.prod(shape), ITEMSIZE[dt]
                for a in range(0, n, step):
                    m = min(step, n - a)
                    nbytes = m * size
                    if pending[k] is not None:
                        pending[k].result()  # output buffer k is written: it may be filled again
                    out = T + 1 + k
                    if dt not in FLOATS:  # a buffer: θ0's bytes
                        _read(fds[0], views[out][:nbytes], p.offsets[0][key] + a * size, p.pre)
                    else:
                        _read(fds[0], views[0][:nbytes], p.offsets[0][key] + a * size, p.pre)
                        for t in range(T):
                            _read(fds[t + 1], views[t + 1][:nbytes], p.offsets[t + 1][key] + a * size, p.fts[t])
                        code = native.CODES[dt]
                        check = any(same[i * T + j] for i in range(T) for j in range(i + 1, T))
                        if native.task_arithmetic(p.lib, addr[0], code, fts, (ctypes.c_int32 * T)(*([code] * T)), m,
                                                  alpha, addr[out], nonzero, same, check):
                            return None
                    pending[k] = pool.submit(writer.write_bytes, key, views[out][:nbytes])
                    k ^= 1
            for f in pending:
                if f is not None:
                    f.result()
        pairs = {(i, j) for i in range(T) for j in range(i + 1, T) if same[i * T + j]}
        return [bool(v) for v in nonzero], pairs
    finally:
        for fd in fds:
            os.close(fd)


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
    note = split_attention_note(p.entries, where="task_arithmetic: ")
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    names = [os.path.abspath(f) for f in a.finetuned]  # as the torch path names them (pact merge's recipe)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with output_lock(a.out):
        entries = [(k, shape, dt) for k, (shape, dt, _) in p.entries.items()]
        with CheckpointWriter(a.out, entries, max_shard_size=a.max_shard_size) as writer:
            found = _merge(p, writer)
            if found is None:
                return None  # the writer removes its temporary files; the torch path names the cause
            for message in task_set_warnings(names, *found):
                warnings.warn(message, stacklevel=2)
            files = writer.commit()
        finish_output(a.out, files)
    rule = a.rule or "auto"
    print(json.dumps({"out": str(writer.path), "method": "task_arithmetic", "pact": None, "alpha": a.alpha,
                      "tasks": len(names), "rule": detect_preset(p.entries) if rule == "auto" else rule,
                      "params": {}, "files": [str(f) for f in files]}))
    return 0
