"""GPU check: the paper path on ViT-B/32-shaped random weights, timed on cuda and on the CPU.

For a session that has a GPU machine (``scripts/gpu_check.sh`` runs this): nothing is
downloaded; everything is built from seeded random numbers, in a few minutes:

- θ0: open_clip ``ViT-B-32`` built with its random initialisation (:func:`pactlib.models.clip.build_clip`
  with no weights), its image tower ``visual.*`` (88 M parameters);
- T = 8 synthetic task vectors over θ0's floating keys: on every matrix layer (the default
  :class:`~pactlib.matrix.MatrixRule`) a shared low-rank part plus a task-specific low-rank part
  with power-law singular values plus a small dense part, scaled to a few percent of the layer's
  norm (as fine-tunes move CLIP's layers); small noise on the other keys;
- per task a random (C, d) zero-shot head and a few hundred random uint8 images, split into
  validation and test halves.

Stages, each timed (cuda kernels synchronised) with its peak GPU memory
(``torch.cuda.max_memory_allocated`` since the stage began), each on ``cuda`` and on ``cpu``
(the CPU runs come after all cuda runs, the costly exact filter last, and none starts once
``--budget-s`` is spent; skipped ones are listed as such):

1. ``filter``: the PACT filter (:func:`pactlib.pact_filter`, mode ``pact``) with the exact SVD
   and with the randomized SVD (``PactOptions(svd="rsvd")``);
2. ``merge``: every merge method's update D (:func:`pactlib.merged_update`) on the unfiltered
   task vectors;
3. ``eval``: evaluation throughput of θ0 (:func:`pactlib.eval.clip_evaluate`) in images per
   second, batch ``--batch``;
3b. ``svd`` (first, on the device only): the thin SVDs of the SVD-bound merges taken each way
   torch offers (:func:`svd_checks`), timed per SVD with their error;
4. ``paper path``: PACT (RSVD) + Iso-C, α chosen on validation over three values, test at the
   chosen α (:func:`pactlib.eval.select_alpha` with :func:`pactlib.eval.clip_evaluator`): the
   whole path, timed once (cuda only);
5. ``files``: the streamed ``pact merge`` (:func:`pactlib.merge_files` with ``device``) on
   θ0 and the T fine-tuned checkpoints written as safetensors files: Iso-C, PACT-RSVD-Iso-C
   and TIES with a PACT-RSVD filter. Each output is compared with the first device's (max |Δθ|
   over max |θ|), and PACT-RSVD-Iso-C's time over Iso-C's is the note of its row: the
   engine's goal is at most 2× (the CPU cannot meet it from T = 8, chapter 8);
6. ``chapter 3`` / ``chapter 10`` (cuda only): a :class:`pactlib.testbeds.clip.ClipTestbed` on
   ``device`` over these weights, heads and images (its own ``loss_model`` and ``inputs``, as a
   clip testbed with files has them), running chapter 3's per-task pipeline for task 0
   (:func:`pactlib.book.experiments.scalar.task_records`: the diagonal Fisher of 8 validation
   images, 4 per per-sample-gradient call as the paper sets' ``fisher_chunk``, the masks, the
   perturbations and restores scored on the device) and chapter 10's first-order check for task 0
   (:func:`pactlib.book.experiments.theory.theory_records` after a ``keep=True`` PACT filter):
   CPU weights, masks and labels meeting a model on the GPU.

Prints a table and writes ``gpu_check.json`` under ``--out`` (default ``$OUT`` when set, else
``results/``). Without a GPU it prints why and exits 0, doing nothing. ``--cpu-smoke`` runs the
same code on tiny shapes (a 2-layer, width-64 ViT, 3 tasks, 16 images) on the CPU in seconds:
what ``tests/test_gpu_check.py`` runs.

    bash scripts/gpu_check.sh [--tasks 8] [--images 256] [--budget-s 300] [--no-cpu] [--out DIR]
    .venv/bin/python bench/gpu_check.py --cpu-smoke --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

def _head() -> str | None:
    """git's HEAD of this checkout (short), or None where there is no git or no repository (a
    copy of the working tree on a GPU machine: give ``--commit``)."""
    import subprocess

    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


#: A tiny ViT CLIP for --cpu-smoke (width 64, 2 layers, patch 8, 32 px images).
TINY = dict(embed_dim=32, vision_cfg=dict(image_size=32, layers=2, width=64, patch_size=8, head_width=32),
            text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1))
METHODS = ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")


def synthetic_task_vectors(pre: dict, T: int, *, seed: int = 0, rank: int = 64, rel: float = 0.03,
                           device: str = "cpu"):
    """T task vectors over ``pre``'s floating keys (CPU float32), deterministic in ``seed`` (and
    the ``device`` whose random generator draws them: cuda is much faster at ViT-B/32 size).

    Matrix layers (default rule): Δt = c·(0.5·shared + task_t + 0.1·dense), shared and task_t
    rank-``rank`` products with singular values ∝ 1/i, scaled so that ‖Δt‖ = rel·‖W‖; other keys:
    rel/10 · std(W) Gaussian noise.
    """
    from pactlib import TaskVector
    from pactlib.matrix import DEFAULT_RULE

    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)
    mats = set(DEFAULT_RULE.matrix_keys(pre))
    out = [dict() for _ in range(T)]

    def lowrank(m, n, k):
        s = 1.0 / torch.arange(1, k + 1, dtype=torch.float32, device=device)
        return (randn(m, k) / math.sqrt(m) * s) @ (randn(k, n) / math.sqrt(n))

    for key, w in pre.items():
        if not w.is_floating_point():
            continue
        w = w.float()
        if key in mats:
            view = DEFAULT_RULE.view(key, w)
            m, n = view.shape
            k = min(rank, m, n)
            shared = lowrank(m, n, k)
            for t in range(T):
                d = 0.5 * shared + lowrank(m, n, k) + 0.1 * randn(m, n) / math.sqrt(m * n) * k ** 0.5
                d = d * (rel * float(view.norm()) / max(float(d.norm()), 1e-12))
                out[t][key] = DEFAULT_RULE.unview(key, d, w.shape).contiguous().cpu()
        else:
            std = float(w.std()) if w.numel() > 1 else 1.0
            for t in range(T):
                out[t][key] = (randn(*w.shape) * (rel / 10) * (std or 1.0)).cpu()
    return [TaskVector._wrap(d, f"task{t}") for t, d in enumerate(out)]


def to_device(tvs, pre, device):
    from pactlib import TaskVector

    return ([TaskVector._wrap({k: v.to(device) for k, v in tv.items()}, tv.name) for tv in tvs],
            {k: v.to(device) for k, v in pre.items()})


class Timer:
    """Stage records: seconds (cuda synchronised), peak GPU memory, errors caught and kept."""

    def __init__(self, budget_s: float):
        self.rows: list[dict] = []
        self.t0 = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def run(self, stage: str, variant: str, device: str, fn, *, budget: bool = False, **extra):
        row = dict(stage=stage, variant=variant, device=device, seconds=None, peak_gpu_bytes=None, error=None, **extra)
        if budget and self.elapsed() > self.budget_s:
            row["error"] = f"skipped: time budget of {self.budget_s:.0f} s spent"
            self.rows.append(row)
            print(f"  {stage:10s} {variant:24s} {device:5s} skipped (time budget)", flush=True)
            return None
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        result = None
        try:
            result = fn()
            if cuda:
                torch.cuda.synchronize()
            row["seconds"] = time.perf_counter() - t
        except Exception as e:  # keep going: one failing stage must not cost the whole GPU session
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        if cuda:
            row["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
            row["gpu_bytes_before"] = int(base)
        self.rows.append(row)
        s = f"{row['seconds']:.3f} s" if row["seconds"] is not None else row["error"]
        print(f"  {stage:10s} {variant:24s} {device:5s} {s}", flush=True)
        return result


def chapter_checks(pre: dict, tvs, heads: dict, val: dict, test: dict, clf, device: str, timer: "Timer", *,
                   fisher_samples: int = 8, test_limit: int = 32) -> None:
    """Stage 5 (module docstring): chapters 3 and 10 for task 0 on a clip testbed on ``device``,
    each timed by ``timer``; a note gives the record count and, for chapter 10, predicted vs
    measured loss change (nats). ``pre``, ``tvs``: CPU; ``heads``: {task: (C, d) unit rows}."""
    from pactlib import PactOptions, TaskVector, pact_filter
    from pactlib.book.experiments import scalar, theory
    from pactlib.matrix import DEFAULT_RULE
    from pactlib.testbeds.clip import ClipTestbed

    tasks = list(heads)
    clf.to(device)
    tb = ClipTestbed("gpu-check", 0, "full", tasks, heads={t: (h, 100.0) for t, h in heads.items()},
                     val=val, test=test, classifier=clf, device=device, pretrained=pre, rule=DEFAULT_RULE,
                     finetuned={t: tv.apply_to(pre, 1.0) for t, tv in zip(tasks, tvs)})
    t0 = tasks[0]

    def chapter3():
        merged = TaskVector.sum(tvs).apply_to(pre, 0.3)
        recs = scalar.task_records(tb, t0, tvs[0], fisher_samples=fisher_samples, fisher_chunk=4, quantile=0.1,
                                   seed=0, scales=[1.0], draws=1, test_limit=test_limit, params={}, merged=merged)
        return f"{len(recs)} records"

    def chapter10():
        pre_d = {k: v.to(device) for k, v in pre.items()}
        tvs_d = [tv.map(lambda k, v: v.to(device)) for tv in tvs]
        filtered, report = pact_filter(pre_d, tvs_d, mode="pact", options=PactOptions(svd="rsvd"),
                                       rule=DEFAULT_RULE, keep=True)
        filtered = [tv.map(lambda k, v: v.cpu()) for tv in filtered]  # as testbeds.filtered returns them
        del pre_d, tvs_d
        recs = theory.theory_records(tb, 0, tvs[0], filtered[0], report, xy_loss=tb.inputs(t0, "val", 16),
                                     xy_test=tb.inputs(t0, "test", test_limit), fracs=[0.5, 1.0], seed=0,
                                     params={}, rule=DEFAULT_RULE)
        fo = recs[0]["metrics"]
        return f"{len(recs)} records; predicted {fo['predicted']:.2e}, measured {fo['measured']:.2e} nats"

    for name, fn in (("chapter 3", chapter3), ("chapter 10", chapter10)):
        note = timer.run(name, "task 0 on the testbed", device, fn)
        if note is not None:
            timer.rows[-1]["note"] = note


#: (variant, method, PACT mode or None) of the ``files`` stage: the streamed merge on the device
FILE_MERGES = (("Iso-C", "iso_c", None), ("PACT-RSVD-Iso-C", "iso_c", "pact"), ("PACT-RSVD-TIES", "ties", "pact"))


def svd_checks(tvs, device: str, timer: "Timer", *, shapes: int = 2, repeats: int = 3) -> None:
    """Stage ``svd``: ways to take the thin SVDs the SVD-bound merges take, on the ``shapes``
    largest matrix-view shapes of the task vectors (each task's Δ of one layer of that shape, on
    ``device``), best of ``repeats``: the engine's :func:`pactlib.linalg.svd`, torch's default,
    cuSOLVER's other drivers (``gesvdj``, ``gesvda``; cuda only), the T tasks as one batch, and
    the eigendecomposition of the smaller Gram matrix (float32 and float64). Each row's note:
    milliseconds per SVD and the largest error of the singular values over σ1 against float64
    on the CPU."""
    from pactlib import linalg
    from pactlib.matrix import DEFAULT_RULE

    layers: dict[tuple, str] = {}
    for key in DEFAULT_RULE.matrix_keys(tvs[0]):
        layers.setdefault(tuple(DEFAULT_RULE.view(key, tvs[0][key]).shape), key)
    cuda = device.startswith("cuda")

    def gram(X, dtype):
        A = X.to(dtype)
        A = A.mT if A.shape[0] < A.shape[1] else A
        lam, Q = torch.linalg.eigh(A.mT @ A)
        S = lam.flip(0).clamp(min=0).sqrt()
        return A @ Q.flip(1) / S.clamp(min=torch.finfo(dtype).tiny), S, Q.flip(1).mT

    for shape in sorted(layers, key=lambda sh: -sh[0] * sh[1])[:shapes]:
        key = layers[shape]
        Xs = [DEFAULT_RULE.view(key, tv[key]).float().to(device) for tv in tvs]
        ref = [torch.linalg.svdvals(X.double().cpu()) for X in Xs]
        ways = {"pactlib.linalg.svd": lambda X: linalg.svd(X),
                "torch default": lambda X: torch.linalg.svd(X, full_matrices=False)}
        if cuda:
            for drv in ("gesvdj", "gesvda"):
                ways[f"driver {drv}"] = lambda X, drv=drv: torch.linalg.svd(X, full_matrices=False, driver=drv)
        ways["Gram eigh float32"] = lambda X: gram(X, torch.float32)
        ways["Gram eigh float64"] = lambda X: gram(X, torch.float64)
        name = f"{shape[0]}×{shape[1]}"
        for way, fn in [*ways.items(), ("T as one batch", None)]:
            out: list = []

            def go(fn=fn, out=out):
                out.clear()
                if fn is None:
                    S = torch.linalg.svd(torch.stack(Xs), full_matrices=False)[1]
                    out.extend(S.unbind(0))
                else:
                    out.extend(fn(X)[1] for X in Xs)
            runs = []
            for _ in range(repeats):
                timer.run("svd", f"{name} {way}", device, go)
                runs.append(timer.rows.pop())
            done = [r for r in runs if r["seconds"] is not None]
            best = min(done, key=lambda r: r["seconds"]) if done else runs[-1]
            timer.rows.append(best)
            if best["seconds"] is not None and out:
                err = max(float((S.double().cpu().sort(descending=True).values - r).abs().max() / r[0])
                          for S, r in zip(out, ref))
                best.update(ms_per_svd=1e3 * best["seconds"] / len(Xs), sigma_error=err,
                            note=f"{1e3 * best['seconds'] / len(Xs):.1f} ms per SVD, σ error {err:.1e}")


def write_checkpoints(pre: dict, tvs, folder: Path) -> tuple[str, list[str]]:
    """θ0 and θt = θ0 + Δt as safetensors files in ``folder`` (CPU tensors): the inputs of the
    ``files`` stage."""
    from pactlib.io import save_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    p0 = str(save_state_dict(pre, folder / "pre.safetensors"))
    return p0, [str(save_state_dict(tv.apply_to(pre, 1.0), folder / f"ft{t}.safetensors")) for t, tv in enumerate(tvs)]


def files_checks(p0: str, ps: list[str], device: str, timer: "Timer", folder: Path, *, budget: bool,
                 first: dict) -> None:
    """Stage 5 (module docstring) on ``device``: each of :data:`FILE_MERGES` into ``folder``; the
    first device's outputs are kept in ``first`` ({variant: path}) and later ones compared with
    them (note: max |Δθ| / max |θ|)."""
    from pactlib import merge_files
    from pactlib.lazy import open_checkpoint

    seconds = {}
    for variant, method, pact in FILE_MERGES:
        out = folder / f"{variant}-{device.replace(':', '_')}.safetensors"
        kw = dict(svd="rsvd") if pact else {}
        timer.run("files", variant, device,
                  lambda: merge_files(method, p0, ps, out, alpha=1.0, pact=pact, device=device, **kw), budget=budget)
        row = timer.rows[-1]
        seconds[variant] = row["seconds"]
        if row["seconds"] is None:
            continue
        if variant not in first:
            first[variant] = out
            continue
        a, b = open_checkpoint(first[variant]), open_checkpoint(out)
        diff = max(float((a.read(k).double() - b.read(k).double()).abs().max()) for k in a.keys())
        top = max(float(a.read(k).double().abs().max()) for k in a.keys())
        row["max_rel_diff_to_first"] = diff / max(top, 1e-30)
        row["note"] = f"max |Δθ| / max |θ| vs {Path(first[variant]).stem.split('-')[-1]}: {diff / max(top, 1e-30):.1e}"
    if seconds.get("Iso-C") and seconds.get("PACT-RSVD-Iso-C"):
        ratio = seconds["PACT-RSVD-Iso-C"] / seconds["Iso-C"]
        row = next(r for r in reversed(timer.rows) if r["variant"] == "PACT-RSVD-Iso-C" and r["device"] == device)
        row["ratio_to_iso_c"] = ratio
        row["note"] = "; ".join(x for x in (row.get("note"), f"{ratio:.2f}x Iso-C's time (goal <= 2)") if x)


def _num(x) -> str:
    return "" if x is None else f"{x:.3f}"


def table(rows: list[dict]) -> str:
    out = [f"{'stage':10s} {'variant':24s} {'cuda s':>9s} {'cpu s':>9s} {'speed-up':>8s} {'peak GPU MiB':>12s}  note"]
    keys = []
    for r in rows:
        if (r["stage"], r["variant"]) not in keys:
            keys.append((r["stage"], r["variant"]))
    for st, var in keys:
        by = {r["device"].split(":")[0]: r for r in rows if (r["stage"], r["variant"]) == (st, var)}
        g, c = by.get("cuda"), by.get("cpu")
        gs = g["seconds"] if g else None
        cs = c["seconds"] if c else None
        mem = f"{g['peak_gpu_bytes'] / 2**20:.0f}" if g and g.get("peak_gpu_bytes") is not None else ""
        note = "; ".join(x for x in [(g or {}).get("error"), (c or {}).get("error")] if x)
        extra = next((r.get("note") for r in (g, c) if r and r.get("note")), "")
        speed = f"{cs / gs:.1f}x" if gs and cs else ""
        out.append(f"{st:10s} {var:24s} {_num(gs):>9s} {_num(cs):>9s} {speed:>8s} {mem:>12s}  "
                   f"{'; '.join(x for x in (extra, note) if x)}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, in seconds (a self-test)")
    p.add_argument("--tasks", type=int, default=None, help="task vectors (default 8; smoke 3)")
    p.add_argument("--images", type=int, default=None, help="images per task, val + test (default 256; smoke 16)")
    p.add_argument("--batch", type=int, default=256, help="evaluation batch size")
    p.add_argument("--methods", nargs="+", default=list(METHODS), help="merge methods timed")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="no CPU comparison starts once the run has taken this long (default 300 s)")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU comparisons")
    p.add_argument("--out", default=None, help="folder of gpu_check.json (default $OUT, else results/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None,
                   help="the code's commit, recorded (default: git's HEAD here, when this is a checkout)")
    args = p.parse_args(argv)

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_check: no GPU here (torch.cuda.is_available() is False): nothing to check; "
              "exiting 0. (--cpu-smoke runs the same path on tiny shapes on the CPU.)")
        return 0
    warnings.filterwarnings("ignore")
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "results")
    T = args.tasks or (3 if smoke else 8)
    n_img = args.images or (16 if smoke else 256)
    device = "cpu" if smoke else "cuda"

    from pactlib import PactOptions, merged_update, pact_filter
    from pactlib.data.store import TaskData
    from pactlib.eval import clip_evaluate, clip_evaluator, select_alpha
    from pactlib.matrix import DEFAULT_RULE
    from pactlib.models.clip import ClipClassifier, build_clip

    timer = Timer(args.budget_s)
    info = dict(mode="cpu-smoke" if smoke else "gpu", torch=torch.__version__, python=platform.python_version(),
                cpu_threads=torch.get_num_threads(), tasks=T, images_per_task=n_img, batch=args.batch,
                seed=args.seed, arch="tiny ViT (TINY)" if smoke else "ViT-B-32 (random init)",
                commit=args.commit or _head(), measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not smoke:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_total_bytes"] = int(torch.cuda.get_device_properties(0).total_memory)
    print(f"gpu_check: {info['mode']}, {info['arch']}, {T} tasks, {n_img} images per task, device {device}"
          + (f" ({info['gpu']})" if not smoke else ""), flush=True)

    t_setup = time.perf_counter()
    torch.manual_seed(args.seed)
    model, _ = build_clip(TINY if smoke else "ViT-B-32")
    pre = {f"visual.{k}": v.detach().clone() for k, v in model.visual.state_dict().items()}
    d = model.visual.output_dim
    tvs = synthetic_task_vectors(pre, T, seed=args.seed, rank=8 if smoke else 64, device=device)
    g = torch.Generator().manual_seed(args.seed + 1)
    size = model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    heads, val, test = {}, {}, {}
    for t in range(T):
        C = 10
        name = f"task{t}"
        heads[name] = torch.nn.functional.normalize(torch.randn(C, d, generator=g), dim=1)
        imgs = torch.randint(0, 256, (n_img, 3, size, size), generator=g, dtype=torch.uint8)
        labels = torch.randint(0, C, (n_img,), generator=g)
        h = n_img // 2
        classes = tuple(f"c{i}" for i in range(C))
        val[name] = TaskData(imgs[:h], labels[:h], classes, name, "val")
        test[name] = TaskData(imgs[h:], labels[h:], classes, name, "test")
    clf = ClipClassifier.from_clip(model, heads["task0"])
    info["params"] = int(sum(v.numel() for v in pre.values()))
    info["matrix_layers"] = len(DEFAULT_RULE.matrix_keys(pre))
    info["setup_seconds"] = time.perf_counter() - t_setup
    print(f"  setup: {info['params'] / 1e6:.1f} M parameters, {info['matrix_layers']} matrix layers, "
          f"{info['setup_seconds']:.1f} s", flush=True)

    devices = [device] + ([] if smoke or args.no_cpu else ["cpu"])
    if not smoke:  # CUDA context, cuBLAS / cuSOLVER handles: not part of any stage's time
        x = torch.randn(256, 256, device="cuda")
        torch.linalg.svd(x @ x.T)
        torch.cuda.synchronize()

    import tempfile

    files_dir = Path(tempfile.mkdtemp(prefix="gpu_check_files_"))
    p0, ps = write_checkpoints(pre, tvs, files_dir / "in")
    first_files: dict = {}
    on = {}
    for dev in devices:
        budget = dev == "cpu" and not smoke
        print(f"-- {dev}", flush=True)
        if dev == device:  # the SVD-bound merges' own SVDs, each way (cheap: a few layers)
            svd_checks(tvs, dev, timer)
        tvs_d, pre_d = (tvs, pre) if dev == "cpu" else to_device(tvs, pre, dev)
        on[dev] = (tvs_d, pre_d)
        filters = ("rsvd", "exact") if dev == device else ("rsvd",)  # the CPU's exact filter runs last
        for svd in filters:
            timer.run("filter", f"pact ({svd})", dev,
                      lambda: pact_filter(pre_d, tvs_d, mode="pact", options=PactOptions(svd=svd), rule=DEFAULT_RULE),
                      budget=budget)
        for m in args.methods:
            timer.run("merge", m, dev, lambda: merged_update(m, pre_d, tvs_d, rule=DEFAULT_RULE), budget=budget)
        files_checks(p0, ps, dev, timer, files_dir, budget=budget, first=first_files)
        n_eval = n_img // 2 if dev == device else min(64, n_img // 2)
        sub = {k: val[k] for k in list(val)[: (T if dev == device else 1)]}
        res = timer.run("eval", f"θ0, {sum(min(n_eval, len(v)) for v in sub.values())} images", dev,
                        lambda: clip_evaluate(pre_d, heads, sub, classifier=clf, device=dev, batch_size=args.batch,
                                              limit=n_eval, progress=False), budget=budget)
        row = timer.rows[-1]
        if row["seconds"]:
            row["images_per_second"] = sum(min(n_eval, len(v)) for v in sub.values()) / row["seconds"]
            row["note"] = f"{row['images_per_second']:.0f} img/s"
        if dev == device:
            def paper_path():
                tv_f, _ = pact_filter(pre_d, tvs_d, mode="pact", options=PactOptions(svd="rsvd"), rule=DEFAULT_RULE)
                D, _ = merged_update("iso_c", pre_d, tv_f, rule=DEFAULT_RULE)
                ones = {t: 1.0 for t in heads}
                return select_alpha(lambda a: D.apply_to(pre_d, a), (0.5, 1.0, 2.0), val=val, test=test,
                                    ft_val=ones, ft_test=ones, method="pact-iso_c",
                                    evaluate_fn=clip_evaluator(heads, classifier=clf, device=dev,
                                                               batch_size=args.batch, progress=False))
            rec = timer.run("path", "PACT(rsvd)+Iso-C, 3 α", dev, paper_path)
            if rec is not None:
                timer.rows[-1]["alpha"] = rec["alpha"]
                timer.rows[-1]["note"] = f"α = {rec['alpha']}"
            chapter_checks(pre, tvs, heads, val, test, clf, dev, timer,
                           fisher_samples=4 if smoke else 8, test_limit=8 if smoke else 32)
        if dev != device:
            timer.run("filter", "pact (exact)", dev,
                      lambda: pact_filter(pre_d, tvs_d, mode="pact", options=PactOptions(svd="exact"),
                                          rule=DEFAULT_RULE), budget=budget)
        clf.to("cpu")
        if dev != "cpu":
            on.pop(dev)
            del tvs_d, pre_d
            torch.cuda.empty_cache()

    import shutil

    shutil.rmtree(files_dir, ignore_errors=True)
    info["total_seconds"] = timer.elapsed()
    report = dict(info=info, stages=timer.rows)
    print()
    print(table(timer.rows))
    print(f"total {info['total_seconds']:.1f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")
    failed = [r for r in timer.rows if r["error"] and not r["error"].startswith("skipped")]
    if failed:
        print(f"gpu_check: {len(failed)} stage(s) failed: " + "; ".join(f"{r['stage']} {r['variant']} {r['device']}: "
                                                                         f"{r['error']}" for r in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
