r"""Benchmark: peak memory of the *clip testbed path* (what the chapters run) against the number of tasks T.

The chapters do not call ``pact merge``: they load a testbed (``testbeds.load("clip-...")``), merge
through :func:`pactlib.testbeds.run` (merge, α, validation and test evaluation),
:func:`pactlib.testbeds.reference_records` and ``tb.evaluate``. This script measures that path's
peak resident memory for T = 2 and T = 20 on the same shapes (goal: peak(T=20) <= 1.5 x peak(T=2),
issue 15 "memory bounded").

Files (written once into ``--work``, reused; seeded by ``--seed``): a random-init open_clip CLIP
with ViT-B/32's vision widths (width 768, 12 heads, MLP 3072, patch 32, 224 px images, embedding
512) but only ``--blocks`` residual blocks (default 2; every block has the same four matrix shapes,
so the per-layer peak of a streamed merge does not depend on the block count) and a 1-layer,
width-64 text tower (it is not merged); θ0 = that model's state dict, θt = θ0 + 0.02·std·N(0, 1)
noise on every floating ``visual.*`` entry, each a torch pickle ``{task}/finetuned.pt`` (the
open_clip format); one head file per task (the unit class means of θt's features on all of the task's
images, scale 100, so that θt classifies its task well: the TSV layout's ``head_{task}.pt``); one image folder per task (``--classes`` classes of random-colour 64 px PNGs,
``--train`` per class in train, ``--test`` per class in test; validation is 10 % of train).

Each measurement is a child process (``OMP_NUM_THREADS=1``) with a fresh cache folder (cold: the
first load converts, hashes and evaluates the fine-tuned and zero-shot accuracies) and then a second
child on that cache (warm: every accuracy read from the disk cache). The child reports its own
``ru_maxrss`` after each phase (peak so far: import, load, Task Arithmetic run at α = 0.3,
PACT-Iso-C run at α = 1.0 (exact SVD, default PACT options), reference records and one test
evaluation of θ0) and the records' accuracies (to compare code versions). This script itself never
imports torch: a parent's resident set is carried over into a child's ``ru_maxrss``.

    .venv/bin/python bench/bench_clip_memory.py --label before         # T = 2 and 20, append records

Records (JSON lines, appended): ``book/data/clip_testbed_memory.jsonl``: one ``run`` line per child
(label, T, cache cold/warm, shapes, seeds, peak MB per phase, seconds, accuracies) and a ``summary``
line per label and cache: peak(T_max) / peak(T_min). The accuracies are a smoke check only: on these
easy colour tasks every model, θ0 included, scores 1.0; that the merges are unchanged is tested
bit for bit in ``tests/test_clip_memory.py``. Each code version is measured from its own source
tree (``git archive <commit>`` into a folder, this script copied in, run from there), one child at
a time per version; two versions may run side by side (the machine's other load shows in the
seconds, not in the peaks).
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
OUT = ROOT / "book" / "data" / "clip_testbed_memory.jsonl"
WIDTH, MLP, PATCH, IMAGE, EMBED, HEADS = 768, 3072, 32, 224, 512, 12


def arch(blocks: int) -> dict:
    """The open_clip config: ViT-B/32 vision widths, ``blocks`` blocks, a tiny text tower."""
    return dict(embed_dim=EMBED,
                vision_cfg=dict(image_size=IMAGE, layers=blocks, width=WIDTH, patch_size=PATCH,
                                head_width=WIDTH // HEADS, mlp_ratio=MLP / WIDTH),
                text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=1, layers=1))


def task_names(n: int) -> list[str]:
    return [f"task{t:02d}" for t in range(n)]


def write_files(work: Path, tasks: int, blocks: int, seed: int, classes: int, train: int, test: int) -> None:
    """θ0, θt, heads and image folders for ``tasks`` tasks under ``work`` (skips what exists)."""
    import numpy as np
    import torch
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from pactlib.models.clip import build_clip

    ckpt, heads, data = work / "ckpt", work / "heads", work / "data"
    for d in (ckpt, heads, data):
        d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if not (ckpt / "zeroshot.pt").exists():
        model, _ = build_clip(arch(blocks))
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, ckpt / "zeroshot.pt")
        del model
    theta0 = torch.load(ckpt / "zeroshot.pt", weights_only=True)
    for i, t in enumerate(task_names(tasks)):
        f = ckpt / t / "finetuned.pt"
        if not f.exists():
            g = torch.Generator().manual_seed(seed * 1000 + i + 1)
            ft = {k: (v + 0.02 * v.std() * torch.randn(v.shape, generator=g))
                  if k.startswith("visual.") and v.is_floating_point() and v.numel() > 1 else v.clone()
                  for k, v in theta0.items()}
            f.parent.mkdir(exist_ok=True)
            torch.save(ft, f)
            del ft
        folder = data / t
        if not folder.exists():
            rng = np.random.default_rng(seed * 1000 + i)
            tmp = data / f".{t}.tmp"
            colours = rng.integers(60, 196, size=(classes, 3))
            for split, n in (("train", train), ("test", test)):
                for c in range(classes):
                    d = tmp / split / f"class_{c}"
                    d.mkdir(parents=True, exist_ok=True)
                    for j in range(n):
                        img = np.clip(colours[c] + rng.normal(0, 60, size=(64, 64, 3)), 0, 255).astype(np.uint8)
                        Image.fromarray(img).save(d / f"{j}.png")
            tmp.rename(folder)
        h = heads / f"head_{t}.pt"
        if not h.exists():  # prototype head of θt on all of the task's images: θt classifies them well
            from pactlib.data import paper
            from pactlib.models.clip import ClipClassifier

            sp = paper.load_paper_task(t, folder, image_size=IMAGE, limit={"train": None, "val": 0, "test": None})
            x = torch.cat([sp["train"].images, sp["test"].images])
            y = torch.cat([sp["train"].labels, sp["test"].labels])
            model, _ = build_clip(arch(blocks), weights=torch.load(ckpt / t / "finetuned.pt", weights_only=True))
            c = ClipClassifier.from_clip(model, torch.zeros(classes, EMBED))
            with torch.no_grad():
                f = c.encode(x)
            H = torch.nn.functional.normalize(torch.stack([f[y == k].mean(0) for k in range(classes)]), dim=-1)
            torch.save({"weight": 100.0 * H, "bias": torch.zeros(classes)}, h)
            del model, c


def child(a: dict) -> int:
    """One measurement (see the module docstring); prints one JSON line."""
    import resource

    def peak_mb() -> float:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import torch  # noqa: F401

    from pactlib import testbeds

    work = Path(a["work"])
    out: dict = {"phases": {}, "seconds": {}}
    out["phases"]["import"] = peak_mb()
    testbeds.define("clip-bench", family="clip", replace=True, arch=arch(a["blocks"]),
                    checkpoint_dir=str(work / "ckpt"), data_root=str(work / "data"), tasks=task_names(a["tasks"]),
                    heads=str(work / "heads"), device="cpu", batch_size=32, cache_dir=a["cache"])
    t = time.perf_counter()
    tb = testbeds.load("clip-bench", 0)
    out["seconds"]["load"] = round(time.perf_counter() - t, 2)
    out["phases"]["load"] = peak_mb()
    recs = {}
    for label, method, pact, alpha in (("ta", "task_arithmetic", None, 0.3), ("pact_iso_c", "iso_c", "pact", 1.0)):
        t = time.perf_counter()
        rec = testbeds.run(tb, method, pact=pact, alphas=(alpha,), widen=0, memo=False)
        out["seconds"][label] = round(time.perf_counter() - t, 2)
        out["phases"][label] = peak_mb()
        recs[label] = dict(acc=rec["metrics"]["acc"], norm_acc=rec["metrics"]["norm_acc"],
                           val_acc=rec["metrics"]["val_acc"])
    t = time.perf_counter()
    rows = testbeds.reference_records(tb)
    acc0 = tb.evaluate(tb.pretrained, "test")
    out["seconds"]["eval"] = round(time.perf_counter() - t, 2)
    out["phases"]["eval"] = peak_mb()
    recs["zero-shot"] = rows[0]["metrics"]["acc"]
    recs["fine-tuned"] = rows[1]["metrics"]["acc"]
    recs["theta0_test"] = sum(acc0.values()) / len(acc0)
    out["results"] = recs
    out["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out))
    return 0


def run_child(a: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PACT_CACHE=str(Path(a["cache"]) / "pact"),
               PACT_CONVERT_CACHE=str(Path(a["cache"]) / "converted"))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(a)], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    rec["wall_s"] = round(wall, 2)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 20])
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--train", type=int, default=10, help="train images per class (validation: 10 %% of train)")
    ap.add_argument("--test", type=int, default=4, help="test images per class")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "pact_bench_clip_memory"))
    ap.add_argument("--label", default="", help="a name for this code version in the records")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm-cache children")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--write", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(json.loads(args.child))
    if args.write is not None:
        w = json.loads(args.write)
        write_files(Path(w["work"]), w["tasks"], w["blocks"], w["seed"], w["classes"], w["train"], w["test"])
        return 0
    work = Path(args.work) / f"b{args.blocks}-s{args.seed}-c{args.classes}-{args.train}-{args.test}"
    spec = dict(work=str(work), tasks=max(args.tasks), blocks=args.blocks, seed=args.seed, classes=args.classes,
                train=args.train, test=args.test)
    subprocess.run([sys.executable, __file__, "--write", json.dumps(spec)], check=True, cwd=ROOT,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    shapes = dict(width=WIDTH, mlp=MLP, patch=PATCH, image=IMAGE, embed=EMBED, heads=HEADS, blocks=args.blocks,
                  text=dict(width=64, layers=1), classes=args.classes, train_per_class=args.train,
                  test_per_class=args.test)
    records = []
    for cache_kind in ("cold",) + (() if args.no_warm else ("warm",)):
        peaks = {}
        for T in args.tasks:
            cache = work / f"cache-{args.label or 'run'}-T{T}"
            if cache_kind == "cold" and cache.exists():
                import shutil

                shutil.rmtree(cache)
            rec = run_child(dict(work=str(work), tasks=T, blocks=args.blocks, cache=str(cache)))
            row = dict(kind="run", label=args.label, commit=commit, tasks=T, cache=cache_kind, seed=args.seed,
                       shapes=shapes, peak_mb=rec["phases"], seconds=rec["seconds"], wall_s=rec["wall_s"],
                       results=rec["results"], threads=1)
            records.append(row)
            peaks[T] = max(rec["phases"].values())
            print(json.dumps(row), flush=True)
        lo, hi = min(args.tasks), max(args.tasks)
        summ = dict(kind="summary", label=args.label, commit=commit, cache=cache_kind, blocks=args.blocks,
                    peak_mb={str(k): v for k, v in peaks.items()}, ratio=round(peaks[hi] / peaks[lo], 3),
                    goal=1.5, tasks=[lo, hi])
        records.append(summ)
        print(json.dumps(summ), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
