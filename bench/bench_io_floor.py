r"""Benchmark: ``pact merge`` against the I/O floor of the same files (issue 29).

A Llama-shaped float32 model (token embedding, per layer q/k/v/o, gate/up/down and two norms, a
final norm and an LM head; default 4 layers, hidden 1024, MLP 2816, vocab 8000: 67.8 M entries,
0.27 GB per file) is written with ``safetensors.torch.save_file`` as θ0 and T fine-tuned files
(θ0 plus small noise on every entry; seeded). Then, in the same run, with the page cache warm:

- **the floor**: every input read once (``cat`` of all of them to ``/dev/null``, timed as its own
  process) plus one output-sized file written and flushed (``fsync``, as ``pact merge`` does);
- **each merge** (``task_arithmetic``, ``ties`` with ``scope=global`` and ``scope=per_key``,
  ``tsv_m``, ``iso_c``, ``iso_cts``) as its own ``pact merge`` process (``--threads 1``,
  ``--workers`` as given, default 1, the output to a fresh name): wall time, user and system
  CPU seconds and peak RSS of the child (``os.wait4``), and minor page faults.

Each merge process reports its own two phases (a small runner, :data:`RUNNER`, reads
``getrusage`` and the clock after ``import pactlib.cli``, which imports torch, and after the
merge): ``import_*`` and ``merge_wall_s``, ``merge_user_s``, ``merge_sys_s``, ``merge_faults``.
The issue's goal is about the whole process, as a user runs it: ``wall_ratio`` (its wall time
over the floor) is the goal's measure; ``merge_wall_ratio`` is the same for the merge phase
alone.

**The floor's own CPU.** Reading from the page cache is itself kernel time (the kernel copies
every byte), so a merge's kernel share has a floor too. A reader process (:data:`READER`, no
torch) reads every input once with ``pread`` in blocks of ``--block`` bytes (default 4 MiB, the
engine's read size per task for Task Arithmetic: an eighth of ``CHUNK_BYTES``) into one reused
buffer, then writes an output-sized file in the same blocks and flushes it; its user and system
CPU, read and write apart, are ``floor_user_s`` / ``floor_sys_s`` (``read_sys_s``,
``write_sys_s``). Per merge, ``floor_kernel_share`` = floor system time / the process's CPU
time and ``merge_floor_kernel_share`` = floor system time / the merge phase's CPU time: the
kernel share the merge would have if its only kernel work were the floor's; ``kernel_excess_s``
= the merge phase's system time less the floor's (what the merge adds: extra passes over the
inputs, page faults of new buffers).

``--repeats N`` (default 3) measures the floor and every merge N times in turn (``floor-run`` and
``merge-run`` records) and keeps the fastest of each as the ``floor`` and ``merge`` records: on
this virtual machine the same 271 MB write takes from 0.1 s to over 1 s of kernel time, depending
on whether the pages it lands on were recently in use, and noise only ever adds time.

Each record also holds the 1-minute load average before and after: the machine this was written
on is shared by other jobs on 2 cores, so wall time is noisy (a loaded run waits for a core).
``cpu_ratio`` (the merge's user + sys over the floor's wall time, which is nearly all CPU when the
page cache is warm) is then the steadier ratio. ``kernel_share`` = sys / (user + sys). A
``startup`` line measures a process that only imports the CLI (torch's import: hundreds of MB
resident and a few CPU-seconds, paid before any byte is read). ``merge_cpu_s``,
``merge_cpu_ratio``, ``merge_kernel_share`` and ``merge_rss_mb`` are the merge phase's own, as
the runner measured them in the same process (records before the runner took the ``startup``
line's CPU and memory off the process's instead). The script never imports torch itself (a
child writes the checkpoints), so a large parent does not set a floor under the children's
``ru_maxrss``.

    .venv/bin/python bench/bench_io_floor.py                          # T = 2 and 8, every method
    .venv/bin/python bench/bench_io_floor.py --tasks 20 --methods task_arithmetic ties_global --append
    .venv/bin/python bench/bench_io_floor.py --layers 8               # the issue's shape (0.48 GB per file)

Records: ``book/data/io_floor.jsonl`` (``--out``): one ``floor`` line per T, one ``merge`` line per
method and T, and ``memory`` lines (peak RSS at the largest T over the smallest, per method).
``--label`` tags the records (e.g. ``before`` / ``after`` a change); ``--code DIR`` runs the merges
with another checkout's pactlib (the ``startup`` line records its commit); ``--append`` adds to
the file; ``--keep DIR`` keeps the checkpoints for the next run. ``--reread`` drops the inputs
from the page cache and reads them back before each T (the ``startup`` line's ``page_cache``): a
memory-mapped pass costs less kernel time over the large folios a read from disk leaves than
over an aged cache (``bench/io_floor_profile.md``). The recorded runs:
``--code <main> --tasks 2 8 --methods task_arithmetic ties_global --label before`` and
``--tasks 2 8 20 --methods task_arithmetic ties_global --label after`` (and the per-key methods at
T = 2 and 8, ``after-perkey``); ``--tasks 2 8 --methods task_arithmetic ties_global ties_per_key
--label after-perkey2`` (per-key TIES rebuilt; the first run with the merge phase timed
in-process and the floor's CPU time).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from sink import Sink  # noqa: E402  (the JSON-lines records, as every bench script writes them)

METHODS = ("task_arithmetic", "ties_global", "ties_per_key", "tsv_m", "iso_c", "iso_cts")
SETS = {"ties_global": ("ties", ["scope=global"]), "ties_per_key": ("ties", ["scope=per_key"])}

WRITER = r"""
import sys, json, torch
from safetensors.torch import save_file
layers, hidden, mlp, vocab, tasks, seed, folder = json.loads(sys.argv[1])
shapes = {"model.embed_tokens.weight": (vocab, hidden)}
for i in range(layers):
    p = f"model.layers.{i}."
    shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (hidden, hidden),
                   p + "self_attn.v_proj.weight": (hidden, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                   p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
                   p + "mlp.down_proj.weight": (hidden, mlp), p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)})
shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
g = torch.Generator().manual_seed(seed)
base = {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}
save_file(base, f"{folder}/base.safetensors")
for t in range(tasks):
    save_file({k: v + torch.randn(v.shape, generator=g) * 1e-3 for k, v in base.items()},
              f"{folder}/task{t:02d}.safetensors")
print(sum(v.numel() for v in base.values()))
"""


#: Runs ``pact merge`` (argv: JSON of the CLI's arguments, then a report file): getrusage and the clock
#: after the import of the CLI and after the merge, written to the report as JSON.
RUNNER = r"""
import json, resource, sys, time
def now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"t": time.perf_counter(), "user": r.ru_utime, "sys": r.ru_stime, "faults": r.ru_minflt,
            "rss_mb": r.ru_maxrss / 1024}
a = now()
import pactlib.cli
b = now()
rc = pactlib.cli.main(json.loads(sys.argv[1]))
c = now()
with open(sys.argv[2], "w") as f:
    json.dump({"import": [b[k] - a[k] for k in ("t", "user", "sys", "faults")], "import_rss_mb": b["rss_mb"],
               "merge": [c[k] - b[k] for k in ("t", "user", "sys", "faults")]}, f)
sys.exit(rc)
"""

#: The floor's reader (no torch): every input read once with pread in blocks into one reused buffer,
#: then an output-sized file written in the same blocks and flushed; each phase's wall, user and sys.
READER = r"""
import json, os, resource, sys, time
files, block, out, out_bytes = json.loads(sys.argv[1])
buf = bytearray(block)
view = memoryview(buf)
def now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime
a = now()
for f in files:
    fd = os.open(f, os.O_RDONLY)
    off = 0
    while True:
        n = os.preadv(fd, [view], off)
        if n <= 0:
            break
        off += n
    os.close(fd)
b = now()
fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
left = out_bytes
while left > 0:
    left -= os.write(fd, view[:min(left, block)])
os.fsync(fd)
os.close(fd)
c = now()
os.unlink(out)
print(json.dumps({"read": [b[i] - a[i] for i in range(3)], "write": [c[i] - b[i] for i in range(3)]}))
"""


def run_child(cmd: list[str], env: dict | None = None, cwd: Path | None = None, *, capture: bool = False) -> dict:
    """Run ``cmd`` (in ``cwd``: ``python -m`` imports from there first); its wall time and its own
    rusage (user, sys, peak RSS, minor faults); with ``capture``, its standard output too
    (``stdout``)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, cwd=cwd)
    out = proc.stdout.read().decode() if capture else ""  # small: the child's report
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if capture:
        proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]}")
    rec = {"wall_s": round(wall, 3), "user_s": round(ru.ru_utime, 3), "sys_s": round(ru.ru_stime, 3),
           "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "minor_faults": ru.ru_minflt}
    return {**rec, "stdout": out} if capture else rec


def drop_cached(files: list[Path]) -> None:
    """Flush each file and drop its pages from the page cache (``posix_fadvise(DONTNEED)``), so
    that the ``cat`` after it fills the cache as a first read from disk does. How the pages came
    into the cache sets the size of its folios, and with it what a memory-mapped pass costs in
    the kernel (``bench/io_floor_profile.md``)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def floor(files: list[Path], out_bytes: int, folder: Path, block: int = 4 << 20) -> dict:
    """Read every input once (``cat`` to /dev/null, its own process), then, in a reader process
    (:data:`READER`), read them all again with ``pread`` in ``block``-byte runs and write
    ``out_bytes`` once (flushed), with that process's CPU per phase. ``floor_s`` = cat's wall time
    + the write's wall time; the best of three by ``floor_s``, and the least CPU of the three
    reader runs (each phase's user and sys from the run with the least total)."""
    best, cpu = None, None
    for _ in range(3):
        r = run_child(["cat", *map(str, files)])  # stdout is /dev/null
        rd = run_child([sys.executable, "-c", READER, json.dumps([[str(f) for f in files], block,
                                                                  str(folder / "floor.out"), out_bytes])], capture=True)
        got = json.loads(rd["stdout"])
        rec = {"read_s": r["wall_s"], "read_cpu_s": round(r["user_s"] + r["sys_s"], 3),
               "write_s": round(got["write"][0], 3)}
        rec["floor_s"] = round(rec["read_s"] + rec["write_s"], 3)
        if best is None or rec["floor_s"] < best["floor_s"]:
            best = rec
        total = sum(got["read"][1:]) + sum(got["write"][1:])
        if cpu is None or total < cpu[0]:
            cpu = (total, got)
    got = cpu[1]
    return {**best, "block_bytes": block, "pread_s": round(got["read"][0], 3),
            "read_user_s": round(got["read"][1], 3), "read_sys_s": round(got["read"][2], 3),
            "write_user_s": round(got["write"][1], 3), "write_sys_s": round(got["write"][2], 3),
            "floor_user_s": round(got["read"][1] + got["write"][1], 3),
            "floor_sys_s": round(got["read"][2] + got["write"][2], 3)}


def merge_record(r: dict, phases: dict, fl: dict) -> dict:
    """The ratios and shares of one merge process ``r`` (:func:`run_child`), its phases as
    :data:`RUNNER` reported them (``phases``) and the floor ``fl`` (:func:`floor`)."""
    cpu = r["user_s"] + r["sys_s"]
    iw, iu, isys, ifl = phases["import"]
    mw, mu, ms, mf = phases["merge"]
    mcpu = mu + ms
    fsys = fl.get("floor_sys_s")
    rec = {"cpu_s": round(cpu, 3), "floor_s": fl["floor_s"],
           "wall_ratio": round(r["wall_s"] / fl["floor_s"], 2), "cpu_ratio": round(cpu / fl["floor_s"], 2),
           "kernel_share": round(r["sys_s"] / cpu, 3) if cpu else None,
           "import_s": round(iw, 3), "import_cpu_s": round(iu + isys, 3), "import_sys_s": round(isys, 3),
           "merge_wall_s": round(mw, 3), "merge_user_s": round(mu, 3), "merge_sys_s": round(ms, 3),
           "merge_faults": mf, "merge_cpu_s": round(mcpu, 3),
           "merge_wall_ratio": round(mw / fl["floor_s"], 2), "merge_cpu_ratio": round(mcpu / fl["floor_s"], 2),
           "merge_kernel_share": round(ms / mcpu, 3) if mcpu else None,
           "merge_rss_mb": round(r["peak_rss_mb"] - phases["import_rss_mb"], 1)}
    if fsys is not None:
        rec.update({"floor_sys_s": fsys, "floor_kernel_share": round(fsys / cpu, 3) if cpu else None,
                    "merge_floor_kernel_share": round(fsys / mcpu, 3) if mcpu else None,
                    "kernel_excess_s": round(ms - fsys, 3)})
    return rec


def add_shape_args(ap: argparse.ArgumentParser, methods) -> None:
    """The Llama shape, the task counts and the methods: the options this benchmark shares with
    bench_mergekit.py."""
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--mlp", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--methods", nargs="+", default=list(methods), choices=methods)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(ap, METHODS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block", type=int, default=4 << 20, help="the floor reader's pread size (bytes)")
    ap.add_argument("--label", default="")
    ap.add_argument("--workers", type=int, default=1,
                    help="pact merge --workers (threads, each with one-thread torch kernels; the floor stays one reader)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of the floor and every merge; the records keep the fastest of each (default 3)")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "data" / "io_floor.jsonl")
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoints here and keep them (reused)")
    ap.add_argument("--reread", action="store_true",
                    help="drop the inputs from the page cache before warming it, as a first read from disk leaves it")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="the checkout whose pactlib the merges run (e.g. another branch's, for a before / after)")
    args = ap.parse_args(argv)
    py = sys.executable
    code = args.code.resolve()
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    sink = Sink(args.out, append=args.append)  # each record as it comes: an interrupted run keeps what it measured
    emit, records = sink.emit, sink.records
    shape = dict(layers=args.layers, hidden=args.hidden, mlp=args.mlp, vocab=args.vocab)
    work = args.keep or Path(tempfile.mkdtemp(prefix="io_floor-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tmax = max(args.tasks)
        stem = f"made-{args.layers}-{args.hidden}-{args.mlp}-{args.vocab}"
        stamp = work / f"{stem}-{tmax}-{args.seed}"
        made = [int(f.name.split("-")[-2]) for f in work.glob(f"{stem}-*-{args.seed}")]
        if not made or max(made) < tmax:  # the same seed writes the same first files
            subprocess.run([py, "-c", WRITER, json.dumps([args.layers, args.hidden, args.mlp, args.vocab, tmax,
                                                          args.seed, str(work)])], check=True, env=env)
            stamp.touch()
        base = work / "base.safetensors"
        start = run_child([py, "-c", "import pactlib.cli"], env, code)  # what every merge pays before it reads a byte
        commit = subprocess.run(["git", "-C", str(args.code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        torch_too = subprocess.run([py, "-c", "import sys, pactlib.cli; print('torch' in sys.modules)"], env=env,
                                   cwd=code, capture_output=True, text=True).stdout.strip() == "True"
        rec = {"kind": "startup", "label": args.label, "code": str(args.code), "commit": commit, **start,
               "torch": torch_too, "page_cache": "reread" if args.reread else "as found",
               "load1": round(os.getloadavg()[0], 2)}
        emit(rec)
        for T in sorted(args.tasks):
            files = [base] + [work / f"task{t:02d}.safetensors" for t in range(T)]
            size = base.stat().st_size
            if args.reread:
                drop_cached(files)
            subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
            floors, merges = [], {name: [] for name in args.methods}
            for rep in range(args.repeats):  # the floor and every method in turn, each round
                load0 = os.getloadavg()[0]
                fl = floor(files, size, work, args.block)
                floors.append((fl, load0))
                if args.repeats > 1:
                    emit({"kind": "floor-run", "label": args.label, **shape, "T": T, "repeat": rep, **fl,
                          "load1": round(load0, 2)})
                for name in args.methods:
                    method, sets = SETS.get(name, (name, []))
                    out = work / f"merged-{name}-{T}.safetensors"
                    argv = ["merge", "--method", method, "--alpha", "0.3", "--pretrained", str(base), "--finetuned",
                            *map(str, files[1:]), "--out", str(out), "--threads", "1", "--workers", str(args.workers)]
                    if sets:
                        argv += ["--set", *sets]
                    report = work / f"phases-{name}-{T}.json"
                    load0 = os.getloadavg()[0]
                    r = run_child([py, "-c", RUNNER, json.dumps(argv), str(report)], env, code)
                    out.unlink(missing_ok=True)
                    phases = json.loads(report.read_text())
                    report.unlink()
                    loads = {"load1_before": round(load0, 2), "load1_after": round(os.getloadavg()[0], 2)}
                    merges[name].append((r, phases, loads))
                    if args.repeats > 1:
                        emit({"kind": "merge-run", "label": args.label, **shape, "T": T, "method": name, "workers": args.workers,
                              "repeat": rep,
                              **r, **merge_record(r, phases, fl), **loads})
            # the fastest of the rounds, floor and merge alike (noise only ever adds time)
            fl, load0 = min(floors, key=lambda f: f[0]["floor_s"])
            emit({"kind": "floor", "label": args.label, **shape, "T": T, "file_mb": round(size / 1e6, 1),
                  "input_mb": round(size * (T + 1) / 1e6, 1), **fl, "load1": round(load0, 2), "repeats": args.repeats})
            for name in args.methods:
                r, phases, loads = min(merges[name], key=lambda m: m[0]["wall_s"])
                emit({"kind": "merge", "label": args.label, **shape, "T": T, "method": name, "workers": args.workers, **r,
                      **merge_record(r, phases, fl), **loads, "repeats": args.repeats})
        runs = [r for r in records if r["kind"] == "merge"]
        for name in args.methods:
            mine = sorted((r for r in runs if r["method"] == name), key=lambda r: r["T"])
            if len(mine) >= 2:
                rec = {"kind": "memory", "label": args.label, **shape, "method": name, "T_min": mine[0]["T"],
                       "T_max": mine[-1]["T"],
                       "peak_ratio": round(mine[-1]["peak_rss_mb"] / mine[0]["peak_rss_mb"], 3),
                       "merge_rss_mb": [mine[0]["merge_rss_mb"], mine[-1]["merge_rss_mb"]]}
                emit(rec)
    finally:
        sink.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
