r"""Measurement: peak RSS of chapter 7's experiment (layer depth) on a small clip testbed, T = 2 vs 8,
with the clip testbed's lazy task vectors (``tb.task_vectors()``, ``testbeds.filtered(keep=True)``)
against the same calls on in-memory task vectors (``TaskVector.from_checkpoints`` per task and
``pact_filter(keep=True)``), issue 15.

Files: those of ``bench/bench_clip_memory.py`` (its ``write_files``: a random-init open_clip CLIP
with ViT-B/32's vision widths and ``--blocks`` blocks, θt = θ0 + noise, prototype heads, colour
image folders), written once into ``--work``. Each measurement is a child process
(``OMP_NUM_THREADS=1``) on a warm cache (the first child per T converts and evaluates): it loads the
testbed, then runs chapter 7's cell for one seed: the raw and PACT-filtered task vectors (keep),
:func:`pactlib.book.experiments.depth.intrusion_records`, and
:func:`pactlib.book.experiments.depth.group_record` for the groups "none" and "early" (Iso-C, one α,
no widening). It reports ``ru_maxrss`` after loading and after the experiment (MB) and the
records' digest (the same for both modes). This parent never imports torch.

    nice -n 15 .venv/bin/python bench/measure_chapter7_memory.py             # T = 2 and 8

Output (JSON lines, appended): ``book/data/chapter7_clip_memory.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "data" / "chapter7_clip_memory.jsonl"
sys.path.insert(0, str(ROOT / "bench"))
from bench_clip_memory import arch, task_names, write_files  # noqa: E402


def child(a: dict) -> int:
    import hashlib
    import resource

    def peak_mb() -> float:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    sys.path.insert(0, str(ROOT))
    from pactlib import testbeds
    from pactlib.book.experiments import depth
    from pactlib.pact import PactOptions, pact_filter
    from pactlib.taskvector import TaskVector

    work = Path(a["work"])
    testbeds.define("clip-ch7", family="clip", replace=True, arch=arch(a["blocks"]),
                    checkpoint_dir=str(work / "ckpt"), data_root=str(work / "data"), tasks=task_names(a["tasks"]),
                    heads=str(work / "heads"), device="cpu", batch_size=32, cache_dir=a["cache"])
    out: dict = {"mode": a["mode"], "T": a["tasks"], "blocks": a["blocks"], "phases": {}}
    t0 = time.perf_counter()
    tb = testbeds.load("clip-ch7", 0)
    out["phases"]["load"] = peak_mb()
    opts = PactOptions()
    keys = tb.network_order()
    if a["mode"] == "lazy":
        raw = tb.task_vectors()
        filtered, report = testbeds.filtered(tb, "pact", opts, keep=True)
    else:
        raw = [TaskVector.from_checkpoints(tb.pretrained, dict(tb.finetuned[t]), name=t) for t in tb.tasks]
        filtered, report = pact_filter(tb.pretrained, raw, options=opts, keep=True, rule=tb.rule)
    recs = depth.intrusion_records(raw, report.subspaces, keys=keys, params={}, seed=0, rule=tb.rule)
    half = keys[: max(1, len(keys) // 3)]
    for g, ks in (("none", []), ("early", half)):
        r = depth.group_record(tb, "iso_c", g, keys=ks, raw=raw, filtered=filtered, options=opts, alphas=(1.0,))
        recs.append({k: v for k, v in r.items() if k not in ("seconds", "merge_seconds")})
    out["phases"]["chapter7"] = peak_mb()
    out["experiment_mb"] = round(out["phases"]["chapter7"] - out["phases"]["load"], 1)
    out["records_sha256"] = hashlib.sha256(json.dumps(recs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "pact_measure_ch7"))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    for T in args.tasks:
        work = Path(args.work) / f"T{T}"
        write_files(work, T, args.blocks, 0, 3, 10, 4)
        for i, mode in enumerate(("lazy", "lazy", "in-memory")):  # the first child converts and evaluates
            a = dict(work=str(work), tasks=T, blocks=args.blocks, mode=mode, cache=str(work / "cache"))
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            p = subprocess.run([sys.executable, __file__, "--child", json.dumps(a)], env=env, cwd=ROOT,
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"child failed ({p.returncode}):\n{p.stderr[-4000:]}")
            rec = json.loads(p.stdout.strip().splitlines()[-1])
            rec["cache"] = "cold" if i == 0 else "warm"
            rec["command"] = "nice -n 15 .venv/bin/python bench/measure_chapter7_memory.py " + " ".join(argv or sys.argv[1:])
            print(json.dumps(rec), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
