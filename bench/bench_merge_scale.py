r"""Benchmark: peak memory and time of ``pact merge`` (streamed, layer by layer) against the number
of tasks T, for every method with and without PACT, and against the old in-memory path.

Synthetic checkpoints shaped like open_clip's ViT-B/32 visual tower (12 blocks, width 768, MLP
3072, fused in_proj 2304x768, patch conv1 768x3x32x32, positional 50x768, proj 768x512, norms
and biases; 87.8 M parameters, 351 MB in float32), or with ``--model vit_l14`` like ViT-L/14's
(24 blocks, width 1024, MLP 4096, conv1 1024x3x14x14, positional 257x1024, proj 1024x768; 303 M
parameters, 1.2 GB): a random θ0 and, per task, a random low-rank (rank 16) plus noise update of
every matrix and small noise on every other entry (seeded by ``--seed``), written as safetensors
into a temporary folder one task at a time. ``--blocks`` keeps only the first residual blocks:
every block holds all four matrix shapes and the streamed merge holds one key at a time, so the
peak memory does not depend on the number of blocks, while the time grows with it.

Each merge runs as its own ``pact merge`` process (``OMP_NUM_THREADS=1``, ``--workers 1``): a child
that imports ``pactlib.cli`` and calls its ``main`` with the ``merge`` arguments, as the ``pact``
command does, and reports the merge's own wall and CPU time (``merge_s``, ``merge_cpu_s``: imports
excluded; on a shared machine the CPU time is the steadier one). Its peak RSS is the child's
``ru_maxrss`` (``os.wait4``); ``wall_s`` is the whole process's wall time. This script itself
never imports torch (the checkpoints are written by a child process): Linux carries a parent's
resident set over into a child's ``ru_maxrss`` through fork and exec, so a large parent would
set a floor under every measurement. The old path (every checkpoint loaded, ``pactlib.merge``,
``save_state_dict``: what ``pact merge`` did before it streamed) runs the same way for comparison.

    .venv/bin/python bench/bench_merge_scale.py                 # default grid (below)
    .venv/bin/python bench/bench_merge_scale.py --full --blocks 1 --old-path-max-tasks 0   # every method x mode x T
    .venv/bin/python bench/bench_merge_scale.py --append --model vit_l14 --blocks 1 --tasks 2 20 \
        --methods task_arithmetic iso_c --modes none pact-rsvd --old-path-max-tasks 0

The default grid: every method plain at T = 2; PACT-RSVD with TIES (its spill file) and Iso-C,
and exact-SVD PACT with Iso-C, at T = 2; Task Arithmetic, TIES and Iso-C plain at T = 8; Task
Arithmetic and Iso-C at T = 20; PACT-RSVD-Iso-C at T = 8; the old path (Iso-C, Task Arithmetic) at
T = 2 and 8. ``--full`` runs every method x mode (plain, PACT with the exact SVD, PACT with RSVD)
x T; with all 12 blocks that takes hours on a 2-core machine (TSV-M and Iso-CTS do one SVD per
task and layer, exact PACT one per task and layer too), with ``--blocks 1`` about an hour.
Records: ``book/data/merge_scale.jsonl``: one ``run`` line per merge (with the model, blocks and
seed), a ``startup`` line (a process that only imports the CLI), then ``summary`` lines per method
and mode, peak(T_max) / peak(T_min) (goal <= 1.5), and ``time_ratio`` lines per method, PACT mode
and T: that mode's merge time over the plain merge's, both measured in the same run (wall and
CPU; goal for PACT-Iso-C with RSVD <= 2). ``--append`` adds to the file instead of replacing it.
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
#: open_clip visual towers: width, MLP width, residual blocks, tokens, embedding, patch size
MODELS = {"vit_b32": dict(width=768, mlp=3072, blocks=12, tokens=50, embed=512, patch=32),
          "vit_l14": dict(width=1024, mlp=4096, blocks=24, tokens=257, embed=768, patch=14)}
METHODS = ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")
MODES = ("none", "pact", "pact-rsvd")


def vit_shapes(model: str = "vit_b32", blocks: int | None = None) -> dict[str, tuple[int, ...]]:
    """open_clip ViT visual tower (``MODELS``), its first ``blocks`` residual blocks (default all):
    key -> shape, in the model's order."""
    c = MODELS[model]
    WIDTH, MLP, TOKENS, EMBED, PATCH = c["width"], c["mlp"], c["tokens"], c["embed"], c["patch"]
    s = {"visual.class_embedding": (WIDTH,), "visual.positional_embedding": (TOKENS, WIDTH),
         "visual.proj": (WIDTH, EMBED), "visual.conv1.weight": (WIDTH, 3, PATCH, PATCH),
         "visual.ln_pre.weight": (WIDTH,), "visual.ln_pre.bias": (WIDTH,)}
    for b in range(c["blocks"] if blocks is None else blocks):
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


def write_checkpoints(folder: Path, tasks: int, seed: int = 0, model: str = "vit_b32",
                      blocks: int | None = None) -> tuple[Path, list[Path]]:
    """θ0 and ``tasks`` fine-tuned safetensors files in ``folder``, one in memory at a time."""
    import torch
    from safetensors.torch import save_file

    shapes = vit_shapes(model, blocks)
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
    """Run ``cmd``; return its exit status, wall time and peak RSS (MB, from wait4), and what a
    ``--cli-child`` reported as the last line of its stdout (``merge_s``, ``merge_cpu_s``)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (not every child's maximum)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
    res = dict(rc=proc.returncode, wall_s=round(wall, 2), peak_rss_mb=round(usage.ru_maxrss / 1024, 1), stderr=tail)
    try:
        res.update({k: round(v, 2) for k, v in json.loads(lines[-1]).items()} if lines else {})
    except (ValueError, AttributeError):
        pass
    return res


def cli_child(argv: list[str]) -> int:
    """``pact <argv>`` in this process, timed after the imports; prints {merge_s, merge_cpu_s}."""
    import resource

    import pactlib.cli

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    rc = pactlib.cli.main(argv)
    print(json.dumps(dict(merge_s=time.perf_counter() - t0, merge_cpu_s=cpu() - c0)), flush=True)
    return rc


def one_run(method: str, mode: str, T: int, pre: Path, fts: list[Path], out: Path, path: str,
            pact_set: list[str] = ()) -> dict:
    pact = None if mode == "none" else "pact"
    sets = (["svd=rsvd"] if mode == "pact-rsvd" else []) + (list(pact_set) if pact else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if path == "streamed":
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cli-child", "merge", "--method", method, "--alpha", "0.5",
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
    if argv and argv[0] == "--cli-child":
        sys.exit(cli_child(argv[1:]))
    if argv and argv[0] == "--generate-child":
        write_checkpoints(Path(argv[1]), int(argv[2]), seed=int(argv[3]), model=argv[4],
                          blocks=None if argv[5] == "all" else int(argv[5]))
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
    p.add_argument("--model", default="vit_b32", choices=list(MODELS))
    p.add_argument("--blocks", type=int, default=None, help="residual blocks to keep (default: all of the model's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic checkpoints")
    p.add_argument("--workdir", default=None, help="folder for the synthetic checkpoints (default: a temporary one; "
                                                   "a given one is reused when it holds this model, blocks and seed)")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "merge_scale.jsonl"))
    p.add_argument("--append", action="store_true", help="append the records to --out instead of replacing it")
    a = p.parse_args(argv)
    blocks = MODELS[a.model]["blocks"] if a.blocks is None else a.blocks
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
        stamp = work / "checkpoints.json"  # what the files in --workdir are
        what = dict(model=a.model, blocks=blocks, seed=a.seed, tasks=max(tasks))
        have = json.loads(stamp.read_text()) if stamp.is_file() else None
        if not (have and {**have, "tasks": max(tasks)} == what and have["tasks"] >= max(tasks)
                and pre.is_file() and all(f.is_file() for f in fts)):  # --workdir keeps them between runs
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--generate-child", str(work),
                            str(max(tasks)), str(a.seed), a.model, str(blocks)], check=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
            stamp.write_text(json.dumps(what))
        startup = run_child([sys.executable, "-c", "import pactlib.cli"],
                            {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        records.append(dict(kind="startup", wall_s=startup["wall_s"], peak_rss_mb=startup["peak_rss_mb"],
                            model=a.model, blocks=blocks, cpus=os.cpu_count(),
                            measured=time.strftime("%Y-%m-%d %H:%M:%S %Z")))
        print(f"start-up (import pactlib.cli): {startup['wall_s']:.1f} s, {startup['peak_rss_mb']:.0f} MB", flush=True)
        gen_s = time.perf_counter() - t0
        size_mb = pre.stat().st_size / 1e6
        print(f"{max(tasks) + 1} checkpoints of {size_mb:.0f} MB written in {gen_s:.0f} s to {work}", flush=True)
        print(f"{len(runs)} runs", flush=True)
        for method, mode, T, path in runs:
            rec = one_run(method, mode, T, pre, fts, work / "merged.safetensors", path, a.pact_set)
            rec.update(model=a.model, blocks=blocks, seed=a.seed, checkpoint_mb=round(size_mb, 1), cpus=os.cpu_count(),
                       measured=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
            records.append(rec)
            print(f"{path:9s} {method:16s} {mode:9s} T={T:2d}: peak {rec['peak_rss_mb']:7.0f} MB  "
                  f"{rec['wall_s']:7.1f} s (merge {rec.get('merge_s', float('nan')):.1f} s, CPU "
                  f"{rec.get('merge_cpu_s', float('nan')):.1f} s)"
                  + ("" if rec["rc"] == 0 else f"  FAILED rc={rec['rc']}: {rec['stderr'][-300:]}"), flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    summary = []
    for path in ("streamed", "in-memory"):
        for method in METHODS:
            for mode in MODES:
                rs = sorted((r for r in records if r.get("path") == path and r["method"] == method and r["mode"] == mode
                             and r["rc"] == 0), key=lambda r: r["tasks"])
                if len(rs) >= 2:
                    lo, hi = rs[0], rs[-1]
                    summary.append(dict(kind="summary", path=path, method=method, mode=mode, tasks_lo=lo["tasks"],
                                        tasks_hi=hi["tasks"], peak_lo_mb=lo["peak_rss_mb"], peak_hi_mb=hi["peak_rss_mb"],
                                        ratio=round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 3),
                                        model=a.model, blocks=blocks, seed=a.seed))
    for s in summary:
        print(f"{s['path']:9s} {s['method']:16s} {s['mode']:9s} peak(T={s['tasks_hi']})/peak(T={s['tasks_lo']}) "
              f"= {s['ratio']:.2f}" + ("" if s["path"] != "streamed" else "  (goal <= 1.5)"))
    for method in METHODS:
        for T in tasks:
            ok = {r["mode"]: r for r in records if r["kind"] == "run" and r["path"] == "streamed" and r["rc"] == 0
                  and r["method"] == method and r["tasks"] == T}
            for mode in ("pact", "pact-rsvd"):
                if "none" in ok and mode in ok and "merge_s" in ok["none"] and "merge_s" in ok[mode]:
                    plain, pact = ok["none"], ok[mode]
                    rec = dict(kind="time_ratio", method=method, mode=mode, tasks=T,
                               merge_plain_s=plain["merge_s"], merge_pact_s=pact["merge_s"],
                               ratio=round(pact["merge_s"] / plain["merge_s"], 3),
                               cpu_plain_s=plain["merge_cpu_s"], cpu_pact_s=pact["merge_cpu_s"],
                               cpu_ratio=round(pact["merge_cpu_s"] / plain["merge_cpu_s"], 3),
                               model=a.model, blocks=blocks, seed=a.seed)
                    summary.append(rec)
                    print(f"time {method:16s} {mode:9s} / plain, T={T:2d}: {rec['ratio']:.2f} (CPU time "
                          f"{rec['cpu_ratio']:.2f})" + ("  (goal <= 2)" if (method, mode) == ("iso_c", "pact-rsvd") else ""))
    for rec in records:
        if rec.get("path") == "in-memory" and rec["rc"] == 0:
            mate = next((r for r in records if r.get("path") == "streamed" and r["rc"] == 0 and
                         (r["method"], r["mode"], r["tasks"]) == (rec["method"], rec["mode"], rec["tasks"])), None)
            if mate:
                print(f"old path / streamed, {rec['method']} {rec['mode']} T={rec['tasks']}: "
                      f"{rec['peak_rss_mb']:.0f} / {mate['peak_rss_mb']:.0f} MB = "
                      f"{rec['peak_rss_mb'] / mate['peak_rss_mb']:.1f}x memory, {rec['wall_s']:.0f} / {mate['wall_s']:.0f} s")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "a" if a.append else "w") as f:
        for r in [*records, *summary]:
            f.write(json.dumps({**r, "command": " ".join(["bench/bench_merge_scale.py", *argv])}) + "\n")
    return records


if __name__ == "__main__":
    main()
