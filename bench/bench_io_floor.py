r"""Benchmark: ``pact merge`` against the I/O floor of the same files (issue 29).

A Llama-shaped float32 model (token embedding, per layer q/k/v/o, gate/up/down and two norms, a
final norm and an LM head; default 4 layers, hidden 1024, MLP 2816, vocab 8000: 67.8 M entries,
0.27 GB per file) is written with ``safetensors.torch.save_file`` as θ0 and T fine-tuned files
(θ0 plus small noise on every entry; seeded). Then, in the same run, with the page cache warm:

- **the floor**: every input read once (``cat`` of all of them to ``/dev/null``, timed as its own
  process) plus one output-sized file written and flushed (``fsync``, as ``pact merge`` does);
- **each merge** (``task_arithmetic``, ``ties`` with ``scope=global`` and ``scope=per_key``,
  ``tsv_m``, ``iso_c``, ``iso_cts``) as its own ``pact merge`` process (``--threads 1``,
  ``--workers 1``, the output to a fresh name): wall time, user and system CPU seconds and peak
  RSS of the child (``os.wait4``), and minor page faults.

Each record also holds the 1-minute load average before and after: the machine this was written
on is shared by other jobs on 2 cores, so wall time is noisy (a loaded run waits for a core).
``cpu_ratio`` (the merge's user + sys over the floor's wall time, which is nearly all CPU when the
page cache is warm) is then the steadier ratio; ``wall_ratio`` is the issue's definition.
``kernel_share`` = sys / (user + sys). A ``startup`` line measures a process that only imports
the CLI (torch's import: hundreds of MB resident and about a CPU-second, paid before any byte is
read); ``merge_cpu_s``, ``merge_cpu_ratio``, ``merge_kernel_share`` and ``merge_rss_mb`` are the
merge's own, that startup taken off. The script never imports torch itself (a child writes the
checkpoints), so a large parent does not set a floor under the children's ``ru_maxrss``.

    .venv/bin/python bench/bench_io_floor.py                          # T = 2 and 8, every method
    .venv/bin/python bench/bench_io_floor.py --tasks 20 --methods task_arithmetic ties_global --append
    .venv/bin/python bench/bench_io_floor.py --layers 8               # the issue's shape (0.48 GB per file)

Records: ``book/data/io_floor.jsonl`` (``--out``): one ``floor`` line per T, one ``merge`` line per
method and T, and ``memory`` lines (peak RSS at the largest T over the smallest, per method).
``--label`` tags the records (e.g. ``before`` / ``after`` a change); ``--code DIR`` runs the merges
with another checkout's pactlib (the ``startup`` line records its commit); ``--append`` adds to
the file; ``--keep DIR`` keeps the checkpoints for the next run. The recorded runs:
``--code <main> --tasks 2 8 --methods task_arithmetic ties_global --label before`` and
``--tasks 2 8 20 --methods task_arithmetic ties_global --label after`` (and the per-key methods at
T = 2 and 8, ``after-perkey``).
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


def run_child(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run ``cmd`` (in ``cwd``: ``python -m`` imports from there first); its wall time and its own
    rusage (user, sys, peak RSS, minor faults)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]}")
    return {"wall_s": round(wall, 3), "user_s": round(ru.ru_utime, 3), "sys_s": round(ru.ru_stime, 3),
            "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "minor_faults": ru.ru_minflt}


def floor(files: list[Path], out_bytes: int, folder: Path) -> dict:
    """Read every input once (``cat`` to /dev/null, its own process) and write ``out_bytes`` once
    (flushed); the best of three, with the read's CPU time."""
    best = None
    buf = b"\0" * (8 << 20)
    for _ in range(3):
        r = run_child(["cat", *map(str, files)])  # stdout is /dev/null
        t0 = time.perf_counter()
        fd = os.open(folder / "floor.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = out_bytes
        while left > 0:
            left -= os.write(fd, buf[:min(left, len(buf))])
        os.fsync(fd)
        os.close(fd)
        write_s = time.perf_counter() - t0
        os.unlink(folder / "floor.out")
        rec = {"read_s": r["wall_s"], "read_cpu_s": round(r["user_s"] + r["sys_s"], 3), "write_s": round(write_s, 3)}
        rec["floor_s"] = round(rec["read_s"] + rec["write_s"], 3)
        if best is None or rec["floor_s"] < best["floor_s"]:
            best = rec
    return best


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
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "data" / "io_floor.jsonl")
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoints here and keep them (reused)")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="the checkout whose pactlib the merges run (e.g. another branch's, for a before / after)")
    args = ap.parse_args(argv)
    py = sys.executable
    code = args.code.resolve()
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    records: list[dict] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sink = open(args.out, "a" if args.append else "w")

    def emit(rec: dict) -> None:  # each record as it comes: an interrupted run keeps what it measured
        records.append(rec)
        sink.write(json.dumps(rec) + "\n")
        sink.flush()
        print(json.dumps(rec), flush=True)
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
        rec = {"kind": "startup", "label": args.label, "code": str(args.code), "commit": commit, **start,
               "load1": round(os.getloadavg()[0], 2)}
        emit(rec)
        start_cpu = start["user_s"] + start["sys_s"]
        for T in sorted(args.tasks):
            files = [base] + [work / f"task{t:02d}.safetensors" for t in range(T)]
            size = base.stat().st_size
            subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
            load0 = os.getloadavg()[0]
            fl = floor(files, size, work)
            rec = {"kind": "floor", "label": args.label, **shape, "T": T, "file_mb": round(size / 1e6, 1),
                   "input_mb": round(size * (T + 1) / 1e6, 1), **fl, "load1": round(load0, 2)}
            emit(rec)
            for name in args.methods:
                method, sets = SETS.get(name, (name, []))
                out = work / f"merged-{name}-{T}.safetensors"
                cmd = [py, "-m", "pactlib.cli", "merge", "--method", method, "--alpha", "0.3",
                       "--pretrained", str(base), "--finetuned", *map(str, files[1:]), "--out", str(out),
                       "--threads", "1", "--workers", "1"]
                if sets:
                    cmd += ["--set", *sets]
                load0 = os.getloadavg()[0]
                r = run_child(cmd, env, code)
                out.unlink(missing_ok=True)
                cpu = r["user_s"] + r["sys_s"]
                rec = {"kind": "merge", "label": args.label, **shape, "T": T, "method": name, **r,
                       "cpu_s": round(cpu, 3), "floor_s": fl["floor_s"],
                       "wall_ratio": round(r["wall_s"] / fl["floor_s"], 2),
                       "cpu_ratio": round(cpu / fl["floor_s"], 2),
                       "kernel_share": round(r["sys_s"] / cpu, 3) if cpu else None,
                       "merge_cpu_s": round(cpu - start_cpu, 3),
                       "merge_cpu_ratio": round((cpu - start_cpu) / fl["floor_s"], 2),
                       "merge_kernel_share": round((r["sys_s"] - start["sys_s"]) / max(cpu - start_cpu, 1e-9), 3),
                       "merge_rss_mb": round(r["peak_rss_mb"] - start["peak_rss_mb"], 1),
                       "load1_before": round(load0, 2), "load1_after": round(os.getloadavg()[0], 2)}
                emit(rec)
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
