"""Benchmark: the PACT filter with exact vs randomized SVD (P7), and PACT-Iso-C vs Iso-C.

Synthetic checkpoints shaped like ViT-B/32's 12 blocks: per block four matrix layers
(768x768, 2304x768, 3072x768, 768x3072); pre-trained spectra decaying like trained weights
(a power-law low-rank part on top of a Marchenko–Pastur bulk); task updates low-rank plus noise.
Eight tasks. Prints the time ratios measured in this one run, the projector distance between
the exact and randomized LBW bases, and the relative change of the filtered task vectors.

    .venv/bin/python bench/bench_filter.py [--blocks 12] [--tasks 8] [--out book/data/bench_filter.json]

The efficiency chapter (8) shows ``book/data/bench_filter.json``, which ships with the repository;
re-running the script on an idle machine refreshes it. K and k default to ``PactOptions()``'s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from pactlib import PactOptions, TaskVector, merged_update, pact_filter
from pactlib.linalg import projector_distance
from pactlib.pact import layer_subspaces

SHAPES = {"attn.out_proj.weight": (768, 768), "attn.in_proj_weight": (2304, 768),
          "mlp.c_fc.weight": (3072, 768), "mlp.c_proj.weight": (768, 3072)}


def power_law(m: int, n: int, r: int, scale: float, exponent: float, gen: torch.Generator) -> torch.Tensor:
    """Rank-r matrix with singular values scale·i^-exponent, i = 1..r, and random singular vectors."""
    U = torch.linalg.qr(torch.randn(m, r, generator=gen))[0]
    V = torch.linalg.qr(torch.randn(n, r, generator=gen))[0]
    s = scale * torch.arange(1, r + 1, dtype=torch.float32) ** -exponent
    return (U * s) @ V.T


def trained_like(m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """A heavy-tailed power-law spectrum (σ_i = 20·i^-0.5 over the top quarter of the rank) on
    top of a Marchenko–Pastur bulk with σ ≲ 0.6: the shape of trained transformer weights."""
    r = min(m, n) // 4
    return power_law(m, n, r, 20.0, 0.5, gen) + 0.3 * torch.randn(m, n, generator=gen) / max(m, n) ** 0.5


def task_update(m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """A fine-tuning update: a steep power law (σ_i = 0.5·i^-1 over half the rank: effectively
    low rank) plus a small noise floor."""
    return power_law(m, n, min(m, n) // 2, 0.5, 1.0, gen) + 1e-3 * torch.randn(m, n, generator=gen) / max(m, n) ** 0.5


def synthetic(blocks: int, tasks: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    pre, tvs = {}, [dict() for _ in range(tasks)]
    for b in range(blocks):
        for name, (m, n) in SHAPES.items():
            key = f"visual.transformer.resblocks.{b}.{name}"
            pre[key] = trained_like(m, n, gen)
            for t in range(tasks):
                tvs[t][key] = task_update(m, n, gen)
    return pre, [TaskVector(d, name=f"task{t}") for t, d in enumerate(tvs)]


def timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--core-frac", type=float, default=PactOptions().core_frac)
    p.add_argument("--active-frac", type=float, default=PactOptions().active_frac)
    p.add_argument("--n-iter", type=int, default=2, help="RSVD power iterations q")
    p.add_argument("--out", default="book/data/bench_filter.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()} blocks={a.blocks} tasks={a.tasks}", flush=True)
    pre, tvs = synthetic(a.blocks, a.tasks)
    exact = PactOptions(core_frac=a.core_frac, active_frac=a.active_frac, svd="exact")
    rsvd = exact.replace(svd="rsvd", n_iter=a.n_iter)

    t_exact, (f_exact, rep) = timed(lambda: pact_filter(pre, tvs, options=exact), a.repeat)
    print(f"PACT filter, exact SVD: {t_exact:.1f} s", flush=True)
    t_rsvd, (f_rsvd, _) = timed(lambda: pact_filter(pre, tvs, options=rsvd), a.repeat)
    print(f"PACT filter, RSVD:      {t_rsvd:.1f} s", flush=True)

    # subspace error of the LBW bases (first block, every layer and task) and filtered-vector change
    dists = []
    for name in SHAPES:
        key = f"visual.transformer.resblocks.0.{name}"
        deltas = [tv[key] for tv in tvs]
        se, sr = layer_subspaces(pre[key], deltas, exact), layer_subspaces(pre[key], deltas, rsvd)
        dists += [projector_distance(x.basis, y.basis, norm="fro") / max(1, x.basis.shape[1]) ** 0.5
                  for x, y in zip(se.lbw, sr.lbw)]
    rel = [(a_ - b_).norm() / a_.norm() for a_, b_ in zip(f_exact, f_rsvd)]

    t_iso, _ = timed(lambda: merged_update("iso_c", pre, tvs), a.repeat)
    print(f"Iso-C alone:            {t_iso:.1f} s", flush=True)
    t_pact_iso, _ = timed(lambda: merged_update("iso_c", pre, tvs, pact="pact", options=rsvd), a.repeat)
    print(f"PACT-Iso-C (RSVD):      {t_pact_iso:.1f} s", flush=True)

    res = dict(blocks=a.blocks, tasks=a.tasks, n_iter=a.n_iter, threads=torch.get_num_threads(), core_frac=a.core_frac,
               active_frac=a.active_frac, t_filter_exact=t_exact, t_filter_rsvd=t_rsvd,
               speedup_rsvd=t_exact / t_rsvd, lbw_projector_distance_mean=statistics.mean(dists),
               lbw_projector_distance_max=max(dists), filtered_rel_change_max=float(max(rel)),
               filtered_rel_change_mean=float(statistics.mean(float(r) for r in rel)),
               t_iso_c=t_iso, t_pact_iso_c_rsvd=t_pact_iso, pact_iso_over_iso=t_pact_iso / t_iso,
               cap_binding_rate=rep.cap_binding_rate(), cpus=os.cpu_count(),
               measured=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command=" ".join(["bench/bench_filter.py", *(argv or [])]))
    print(f"RSVD speed-up of the filter: {res['speedup_rsvd']:.1f}x (goal >= 5x)")
    print(f"LBW basis projector distance (Frobenius, per sqrt(dim)): mean {res['lbw_projector_distance_mean']:.2e}, "
          f"max {res['lbw_projector_distance_max']:.2e}")
    print(f"relative change of filtered task vectors: mean {res['filtered_rel_change_mean']:.2e}, "
          f"max {res['filtered_rel_change_max']:.2e}")
    print(f"PACT-Iso-C (RSVD) / Iso-C time: {res['pact_iso_over_iso']:.2f}x (goal <= 2x)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
