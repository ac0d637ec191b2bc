"""Benchmark: the least time PACT-Iso-C can take against Iso-C, whatever the shields cost.

PACT's filter (P1–P5) does, per matrix layer and per task, two things no implementation can skip:
the task's active subspace (P2: a top-k SVD of Δt; here the randomized one of ``PactOptions()``,
``active_oversample``, ``active_n_iter``) and the projection Δ̃t = Δt − (Δt S_t) S_tᵀ (P5), two
matrix products of 2·m·n·s_t flops each for a shield of s_t columns. Iso-C does one thin SVD of
the layer's summed update. So, with everything else in the filter free (the core, the LBW bases,
the shields), PACT-Iso-C takes at least

    floor(T) = 1 + T · Σ_layers (t_active + t_projection(s_T)) / Σ_layers t_Iso-C(T)

times Iso-C's time. The shield of task t spans the other T − 1 tasks' LBW subspaces; each lies in
the span of the core V0,K and that task's active subspace, so in general position
s_T = min(K + (T − 1)·k, cap) with K = ``core_frac``·r, k = ``active_frac``·r, r = min(m, n) and
cap = ``max_shield_frac``·n (what the filter's reports show on the synthetic layers of
``bench_filter.py``: 343 = 77 + 7 · 38 at T = 8). The shield grows with T, so the floor grows
faster than linearly in T until the cap.

The record also gives each part's floor alone (``projections_only``, ``actives_only``). The active
subspaces alone cost about as much as Iso-C's SVD at T = 8, which is why no reorganisation of the
projections gets PACT-Iso-C under 2× there: a fused path for the summed methods (Task Arithmetic,
Iso-C) that projects the summed update once onto the union W of all T LBW subspaces (dim
K + T·k) and corrects each task only in the complement of its shield within W (about k columns)
would make the projections cheap, but not the T top-k SVDs; and at T = 20 W fills R^n for
768-wide layers, so the complement is n/2 wide again.

The script times, on one thread and on the four ViT-B/32 matrix shapes of ``bench_filter.py``
(trained-like θ0, low-rank-plus-noise updates), each piece with the engine's own kernels
(``pactlib.merges.iso.iso_c_kernel``, ``pactlib.subspaces.active_subspace``,
``pactlib.linalg.project_out``), the fastest of ``--repeat`` runs in CPU seconds, and writes
``book/data/pact_floor.json``: per T the floor, and per layer shape the times, flops and rates.

    .venv/bin/python bench/bench_pact_floor.py [--tasks 2 8 20] [--repeat 3] [--threads 1]
        [--out book/data/pact_floor.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_filter import SHAPES, task_update, trained_like  # noqa: E402

from pactlib import PactOptions  # noqa: E402
from pactlib.linalg import project_out  # noqa: E402
from pactlib.merges.iso import iso_c_kernel  # noqa: E402
from pactlib.shield import shield_cap  # noqa: E402
from pactlib.subspaces import active_subspace, choose_rank  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def fastest(fn, repeat: int, clock=time.process_time) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, nargs="+", default=[2, 8, 20])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 1 times CPU seconds, more than 1 wall seconds (CPU time would "
                        "add the threads up)")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "pact_floor.json"))
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    torch.set_num_threads(a.threads)
    clock = time.process_time if a.threads == 1 else time.perf_counter
    opts = PactOptions(svd="rsvd")
    gen = torch.Generator().manual_seed(a.seed)
    start = time.time()
    layers = []
    for name, (m, n) in SHAPES.items():
        r = min(m, n)
        K = choose_rank(torch.ones(m, n), frac=opts.core_frac)
        k = choose_rank(torch.ones(m, n), frac=opts.active_frac)
        cap = shield_cap(n, opts.max_shield_frac)
        trained_like(m, n, gen)  # θ0 (drawn as bench_filter does, so the updates are its draws)
        deltas = torch.stack([task_update(m, n, gen) for _ in range(max(a.tasks))])
        t_active = fastest(lambda: active_subspace(deltas[0], k, **opts.active_svd_kw), a.repeat, clock)
        row = dict(layer=name, m=m, n=n, K=K, k=k, cap=cap, active_s=t_active, per_T={})
        for T in a.tasks:
            s = min(K + (T - 1) * k, cap)
            S = torch.linalg.qr(torch.randn(n, s, generator=gen)).Q  # a random orthonormal shield
            t_proj = fastest(lambda: project_out(deltas[0], S), a.repeat, clock)
            t_iso = fastest(lambda: iso_c_kernel(deltas[:T]), a.repeat, clock)
            row["per_T"][str(T)] = dict(shield=s, projection_s=t_proj, iso_c_s=t_iso,
                                        projection_gflops=4 * m * n * s / t_proj / 1e9)
            print(f"{name} ({m}x{n}) T={T}: shield {s}, projection {t_proj * 1e3:.0f} ms, "
                  f"active {t_active * 1e3:.0f} ms, Iso-C {t_iso * 1e3:.0f} ms", flush=True)
        layers.append(row)
    floors = {}
    for T in a.tasks:
        filt = sum(T * (r["active_s"] + r["per_T"][str(T)]["projection_s"]) for r in layers)
        iso = sum(r["per_T"][str(T)]["iso_c_s"] for r in layers)
        proj = sum(T * r["per_T"][str(T)]["projection_s"] for r in layers)
        floors[str(T)] = dict(floor=1 + filt / iso, projections_only=1 + proj / iso,
                              actives_only=1 + (filt - proj) / iso, iso_c_s=iso, unavoidable_filter_s=filt)
        print(f"T={T}: PACT-Iso-C / Iso-C >= {1 + filt / iso:.2f} (projections alone: {1 + proj / iso:.2f}, "
              f"active subspaces alone: {1 + (filt - proj) / iso:.2f})")
    rec = dict(kind="pact_floor", tasks=a.tasks, seed=a.seed, threads=a.threads,
               clock="CPU seconds" if a.threads == 1 else "wall seconds", repeat=a.repeat,
               options=dict(core_frac=opts.core_frac, active_frac=opts.active_frac,
                            max_shield_frac=opts.max_shield_frac, active_oversample=opts.active_oversample,
                            active_n_iter=opts.active_n_iter),
               layers=layers, floors=floors, bench_seconds=time.time() - start, cpus=os.cpu_count(),
               measured=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               command=" ".join(["bench/bench_pact_floor.py", *(argv if argv is not None else sys.argv[1:])]))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, out)
    return rec


if __name__ == "__main__":
    main()
