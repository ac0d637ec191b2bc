r"""Benchmark: peak memory and time of ``pact merge`` (streamed, layer by layer) against the number
of tasks T, and against the old in-memory path.

Synthetic checkpoints shaped like open_clip's ViT-B/32 visual tower (12 blocks, width 768, MLP
3072, fused in_proj 2304x768, patch conv1 768x3x32x32, positional 50x768, proj 768x512, norms
and biases; 87.8 M parameters, 351 MB in float32): a random θ0 and, per task, a random low-rank
(rank 16) plus noise update of every matrix and small noise on every other entry, written as
safetensors into a temporary folder one task at a time. Each merge runs as its own ``pact merge``
process (``OMP_NUM_THREADS=1``, ``--workers 1``); its peak RSS is the child's ``ru_maxrss``
(``os.wait4``), its time the wall time of the process (start-up included). This script itself
never imports torch (the checkpoints are written by a child process): Linux carries a parent's
resident set over into a child's ``ru_maxrss`` through fork and exec, so a large parent would
set a floor under every measurement. The old path (every
checkpoint loaded, ``pactlib.merge``, ``save_state_dict``: what ``pact merge`` did before it
streamed) runs the same way for comparison.

    .venv/bin/python bench/bench_merge_scale.py                 # default grid (~20-25 min, 2 cores)
    .venv/bin/python bench/bench_merge_scale.py --full          # every method x {plain, PACT, PACT-RSVD} x T
    .venv/bin/python bench/bench_merge_scale.py --tasks 2 8 --methods iso_c task_arithmetic --modes none pact-rsvd

The default grid (about 20-25 min on this project's 2-core machine with a background job on one
core): every method plain at T = 2; PACT-RSVD with TIES (its spill file) and Iso-C, and exact-SVD
PACT with Iso-C, at T = 2; Task Arithmetic, TIES and Iso-C plain at T = 8; Task Arithmetic and
Iso-C at T = 20; PACT-RSVD-Iso-C at T = 8; the old path (Iso-C, Task Arithmetic) at T = 2 and 8.
What is left out is slow, not different: TIES reads the files three times (3-8 min at T = 20
here: ``--full --tasks 2 20 --methods ties --modes none``), TSV-M and Iso-CTS do one SVD per task
and layer (~0.9 s for the 3072x768 layers here, ~15 min per merge at T = 20), and PACT builds each task's shield from the other T − 1 tasks'
LBW bases (an orthonormal basis of (T − 1)·K columns per task and layer: PACT-RSVD-Iso-C took
39 min at T = 20 here; ``--pact-set 'layers=[resblocks\.0\.]'`` filters block 0 only, whose four
layers have every shape, a quick proxy of PACT's per-layer peak). ``--full`` runs every method x
mode x T (hours). Records: ``book/data/merge_scale.jsonl`` (one line per run, then one
``summary`` line per method and mode with peak(T_max) / peak(T_min), goal <= 1.5).
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
WIDTH, MLP, BLOCKS, TOKENS, EMBED, PATCH = 768, 3072, 12, 50, 512, 32
METHODS = ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")
MODES = ("none", "pact", "pact-rsvd")


def vit_b32_shapes() -> dict[str, tuple[int, ...]]:
    """open_clip ViT-B/32 visual tower: key -> shape, in the model's order."""
    s = {"visual.class_embedding": (WIDTH,), "visual.positional_embedding": (TOKENS, WIDTH),
         "visual.proj": (WIDTH, EMBED), "visual.conv1.weight": (WIDTH, 3, PATCH, PATCH),
         "visual.ln_pre.weight": (WIDTH,), "visual.ln_pre.bias": (WIDTH,)}
    for b in range(BLOCKS):
        p = f"visual.transformer.resblocks.{b}."
        s.update({p + "ln_1.weight": (WIDTH,), p + "ln_1.bias": (WIDTH,),
                  p + "attn.in_proj_weight": (3 * WIDTH, WIDTH), p + "attn.in_proj_bias": (3 * WIDTH,),
                  p + "attn.out_proj.weight": (WIDTH, WIDTH), p + "attn.out_proj.bias": (WIDTH,),
                  p + "ln_2.weight": (WIDTH,), p + "ln_2.bias": (WIDTH,),
                  p + "mlp.c_fc.weight": (MLP, WIDTH), p + "mlp.c_fc.bias": (MLP,),
                  p + "mlp.c_proj.weight": (WIDTH, MLP), p + "mlp.c_proj.bias": (WIDTH,)})
    s.update({"visual.ln_post.weight": (WIDTH,), "visual.ln_post.bias": (WIDTH,)})
    return s


def checkpoint_paths(folder: Path, tasks: int) -> tuple[Path, list[Path]]:
    return folder / "pre.safetensors", [folder / f"ft{t:02d}.safetensors" for t in range(tasks)]


def write_checkpoints(folder: Path, tasks: int, seed: int = 0) -> tuple[Path, list[Path]]:
    """θ0 and ``tasks`` fine-tuned safetensors files in ``folder``, one in memory at a time."""
    import torch
    from safetensors.torch import save_file

    shapes = vit_b32_shapes()
    gen = torch.Generator().manual_seed(seed)
    pre = {}
    for k, shape in shapes.items():
        if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") or "ln_p" in k and k.endswith("weight"):
            pre[k] = 1 + 0.05 * torch.randn(shape, generator=gen)
        else:
            fan_in = shape[-1] if len(shape) == 2 else max(1, torch.Size(shape[1:]).numel())
            pre[k] = torch.randn(shape, generator=gen) / fan_in ** 0.5
    pre_path = folder / "pre.safetensors"
    save_file(pre, str(pre_path))
    paths = []
    for t in range(tasks):
        ft = {}
        for k, w in pre.items():
            if w.ndim == 2 and "positional" not in k:
                m, n = w.shape
                r = 16
                upd = (torch.randn(m, r, generator=gen) @ torch.randn(r, n, generator=gen)) * (1e-3 / r ** 0.5)
                upd += 1e-4 * torch.randn(m, n, generator=gen)
            else:
                upd = 1e-4 * torch.randn(w.shape, generator=gen)
            ft[k] = w + upd
        paths.append(folder / f"ft{t:02d}.safetensors")
        save_file(ft, str(paths[-1]))
        del ft
    return pre_path, paths


def old_path_child(argv: list[str]) -> int:
    """The pre-streaming ``pact merge``: load everything, merge in memory, save."""
    a = json.loads(argv[0])
    import pactlib  # noqa: E402
    from pactlib.cli import build_parser

    build_parser()  # the same modules as the CLI (its sub-command extensions)
    pre = pactlib.load_state_dict(a["pretrained"])
    fts = [pactlib.load_state_dict(p) for p in a["finetuned"]]
    from pactlib.cli import parse_set

    out = pactlib.merge(a["method"], pre, fts, alpha=a["alpha"], pact=a["pact"], **parse_set(a["set"]))
    pactlib.save_state_dict(out, a["out"])
    return 0


def run_child(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; return its exit status, wall time and peak RSS (MB, from wait4)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (not every child's maximum)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
    return dict(rc=proc.returncode, wall_s=round(wall, 2), peak_rss_mb=round(usage.ru_maxrss / 1024, 1), stderr=tail)


def one_run(method: str, mode: str, T: int, pre: Path, fts: list[Path], out: Path, path: str,
            pact_set: list[str] = ()) -> dict:
    pact = None if mode == "none" else "pact"
    sets = (["svd=rsvd"] if mode == "pact-rsvd" else []) + (list(pact_set) if pact else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if path == "streamed":
        cmd = [sys.executable, "-m", "pactlib.cli", "merge", "--method", method, "--alpha", "0.5",
               "--pretrained", str(pre), "--finetuned", *map(str, fts[:T]), "--out", str(out), "--workers", "1"]
        if pact:
            cmd += ["--pact", pact]
        if sets:
            cmd += ["--set", *sets]
    else:
        spec = dict(method=method, pact=pact, alpha=0.5, pretrained=str(pre), finetuned=list(map(str, fts[:T])),
                    out=str(out), set=sets)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--old-path-child", json.dumps(spec)]
    res = run_child(cmd, env)
    out.unlink(missing_ok=True)
    rec = dict(kind="run", path=path, method=method, mode=mode, tasks=T, pact_set=list(pact_set) if pact else [],
               **res)
    if rec["rc"] == 0:
        rec.pop("stderr")
    return rec


OLD_PATH_METHODS = ("iso_c", "task_arithmetic")


def default_grid(tasks: list[int], methods: list[str], modes: list[str]) -> list[tuple[str, str, int, str]]:
    """The default runs (module docstring): every code path of the streamed merge, the ratio
    peak(T_max) / peak(T_min) of the cheap methods, and PACT's at the middle T."""
    lo, hi = min(tasks), max(tasks)
    mid = [t for t in tasks if lo < t < hi]
    want = [(m, "none", lo) for m in METHODS]
    want += [("ties", "pact-rsvd", lo), ("iso_c", "pact-rsvd", lo), ("iso_c", "pact", lo)]
    want += [(m, "none", T) for T in mid for m in ("task_arithmetic", "ties", "iso_c")]
    want += [(m, "none", hi) for m in ("task_arithmetic", "iso_c")]
    want += [("iso_c", "pact-rsvd", T) for T in mid]
    seen, runs = set(), []
    for method, mode, T in want:
        if method in methods and mode in modes and (method, mode, T) not in seen:
            seen.add((method, mode, T))
            runs.append((method, mode, T, "streamed"))
    return sorted(runs, key=lambda r: r[2])


def old_path_grid(tasks: list[int], methods: list[str], modes: list[str], max_tasks: int):
    """The old in-memory path: Iso-C and Task Arithmetic, plain, at every T <= ``max_tasks``
    (its memory grows by ~2 checkpoints per task: T = 20 would need ~15 GB)."""
    return [(m, "none", T, "in-memory") for T in tasks if T <= max_tasks for m in OLD_PATH_METHODS
            if m in methods and "none" in modes]


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--old-path-child":
        sys.exit(old_path_child(argv[1:]))
    if argv and argv[0] == "--generate-child":
        write_checkpoints(Path(argv[1]), int(argv[2]))
        sys.exit(0)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[2, 8, 20])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--full", action="store_true", help="every method x mode x T, streamed (hours)")
    p.add_argument("--old-path-max-tasks", type=int, default=8,
                   help="run the old in-memory path (Iso-C, TA) at every T up to this (0: never)")
    p.add_argument("--pact-set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="PACT options for the PACT runs, e.g. 'layers=[resblocks\\.0\\.]' (a quick proxy of PACT's "
                        "per-layer peak: block 0 holds every layer shape)")
    p.add_argument("--workdir", default=None, help="folder for the synthetic checkpoints (default: a temporary one)")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "merge_scale.jsonl"))
    a = p.parse_args(argv)
    tasks = sorted(set(a.tasks))
    if a.full:
        runs = [(m, mode, T, "streamed") for T in tasks for m in a.methods for mode in a.modes]
    else:
        runs = default_grid(tasks, a.methods, a.modes)
    runs += old_path_grid(tasks, a.methods, a.modes, a.old_path_max_tasks)
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="pact-merge-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    records = []
    try:
        t0 = time.perf_counter()
        pre, fts = checkpoint_paths(work, max(tasks))
        if not (pre.is_file() and all(f.is_file() for f in fts)):  # --workdir keeps them between runs
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--generate-child", str(work),
                            str(max(tasks))], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        gen_s = time.perf_counter() - t0
        size_mb = pre.stat().st_size / 1e6
        print(f"{max(tasks) + 1} checkpoints of {size_mb:.0f} MB written in {gen_s:.0f} s to {work}", flush=True)
        print(f"{len(runs)} runs", flush=True)
        for method, mode, T, path in runs:
            rec = one_run(method, mode, T, pre, fts, work / "merged.safetensors", path, a.pact_set)
            rec.update(checkpoint_mb=round(size_mb, 1), cpus=os.cpu_count(),
                       measured=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
            records.append(rec)
            print(f"{path:9s} {method:16s} {mode:9s} T={T:2d}: peak {rec['peak_rss_mb']:7.0f} MB  "
                  f"{rec['wall_s']:7.1f} s" + ("" if rec["rc"] == 0 else f"  FAILED rc={rec['rc']}: {rec['stderr'][-300:]}"),
                  flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    summary = []
    for path in ("streamed", "in-memory"):
        for method in METHODS:
            for mode in MODES:
                rs = sorted((r for r in records if r["path"] == path and r["method"] == method and r["mode"] == mode
                             and r["rc"] == 0), key=lambda r: r["tasks"])
                if len(rs) >= 2:
                    lo, hi = rs[0], rs[-1]
                    summary.append(dict(kind="summary", path=path, method=method, mode=mode, tasks_lo=lo["tasks"],
                                        tasks_hi=hi["tasks"], peak_lo_mb=lo["peak_rss_mb"], peak_hi_mb=hi["peak_rss_mb"],
                                        ratio=round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 3)))
    for s in summary:
        print(f"{s['path']:9s} {s['method']:16s} {s['mode']:9s} peak(T={s['tasks_hi']})/peak(T={s['tasks_lo']}) "
              f"= {s['ratio']:.2f}" + ("" if s["path"] != "streamed" else "  (goal <= 1.5)"))
    for rec in records:
        if rec["path"] == "in-memory" and rec["rc"] == 0:
            mate = next((r for r in records if r["path"] == "streamed" and r["rc"] == 0 and
                         (r["method"], r["mode"], r["tasks"]) == (rec["method"], rec["mode"], rec["tasks"])), None)
            if mate:
                print(f"old path / streamed, {rec['method']} {rec['mode']} T={rec['tasks']}: "
                      f"{rec['peak_rss_mb']:.0f} / {mate['peak_rss_mb']:.0f} MB = "
                      f"{rec['peak_rss_mb'] / mate['peak_rss_mb']:.1f}x memory, {rec['wall_s']:.0f} / {mate['wall_s']:.0f} s")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        for r in [*records, *summary]:
            f.write(json.dumps({**r, "command": " ".join(["bench/bench_merge_scale.py", *argv])}) + "\n")
    return records


if __name__ == "__main__":
    main()
