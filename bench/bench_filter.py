"""Benchmark: the PACT filter with exact vs randomized SVD (P7), and PACT-Iso-C vs Iso-C.

Synthetic checkpoints shaped like ViT-B/32's 12 blocks: per block four matrix layers
(768x768, 2304x768, 3072x768, 768x3072); pre-trained spectra decaying like trained weights
(a power-law low-rank part on top of a Marchenko–Pastur bulk); task updates low-rank plus noise.
Eight tasks, one CPU thread by default (``--threads``).

What it measures, in one run:

1. **Sweep** (first ``--sweep-blocks`` block(s)): every top-r SVD that PACT takes there (the
   pre-trained core of each layer, the active subspace of each task) with the exact SVD and with
   each randomized variant, given separately for the core (P1) and for the task updates (P2):
   oversampling p, power iterations q, route (``direct`` through W as ``torch.svd_lowrank``,
   ``gram`` through the Gram matrix, ``auto`` = the cheaper one by ``linalg.gram_is_cheaper``).
   It records the SVDs' time (fastest of ``--sweep-repeat`` per call), the distance of the cores,
   active subspaces and LBW bases from the exact ones, and the distance of every layer's core
   (all blocks), which bounds the LBW bases' error.
2. **Filter**: ``pact_filter`` over all blocks with the exact SVD, with the randomized SVD at
   ``PactOptions()``'s settings (core: ``oversample``, ``n_iter``; updates: ``active_oversample``,
   ``active_n_iter``), and at p = 10, q = 2 for both (the defaults of book/method.md, P7; ``previous``),
   interleaved layer by layer (so that a change in the machine's load hits all three alike), each
   the fastest of ``--filter-repeat`` runs per layer. It reports the total time, the part spent in
   the SVDs and the part in the projections Δt − (Δt S_t) S_tᵀ (P5; the remainder: LBW bases and
   shields), the distances of all layers' subspaces from the exact ones, and the relative change
   of the filtered task vectors.
3. Iso-C alone vs PACT-Iso-C with the randomized SVD.

Times are CPU seconds of the benchmark's process (``time.process_time``; with one thread that is
the time of its core), so that other work on a shared machine does not count; the wall time of
the whole run is recorded too (``bench_seconds``).

Distances: ``fro`` = ‖P_exact − P_rsvd‖_F / √r (0 = same subspace, √2 = orthogonal; the
chapter's measure), ``spectral`` = sine of the largest principal angle (1.0 when the ranks differ).

    .venv/bin/python bench/bench_filter.py [--blocks 12] [--tasks 8] [--threads 1] [--out book/data/bench_filter.json]

The efficiency chapter (8) shows ``book/data/bench_filter.json``, which ships with the repository;
re-running the script refreshes it (over an hour on one thread of a 2-core machine busy with other
work; the record keeps the command, how long it took and when it ran). K and k default to
``PactOptions()``'s.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import pactlib.pact
import pactlib.subspaces
from pactlib import PactOptions, TaskVector, merged_update, pact_filter
from pactlib.book.experiments.efficiency import subspace_distances
from pactlib.linalg import gram_is_cheaper, top_singular
from pactlib.subspaces import choose_rank, lbw_subspace

SHAPES = {"attn.out_proj.weight": (768, 768), "attn.in_proj_weight": (2304, 768),
          "mlp.c_fc.weight": (3072, 768), "mlp.c_proj.weight": (768, 3072)}
#: (p, q, route) for the pre-trained core (P1), each swept with the updates at ``UPDATE_REF``
SWEEP_CORE = [(40, 12, "auto"), (40, 8, "auto"), (30, 8, "auto"), (60, 8, "auto"), (40, 6, "auto"), (60, 6, "auto"),
              (80, 6, "auto"), (40, 4, "auto"), (80, 4, "auto"), (20, 2, "direct"), (40, 4, "direct")]
#: (p, q, route) for the task updates (P2), each swept with the core at ``CORE_REF``
SWEEP_UPDATES = [(40, 12, "auto"), (20, 2, "auto"), (10, 2, "auto"), (5, 2, "auto"), (40, 1, "auto"),
                 (20, 1, "auto"), (10, 1, "auto"), (20, 0, "auto"), (10, 3, "auto")]
#: the sweep's centre: PactOptions()' settings
CORE_REF = (PactOptions().oversample, PactOptions().n_iter, "auto")
UPDATE_REF = (PactOptions().active_oversample, PactOptions().active_n_iter, "auto")
#: one setting for both (the previous defaults: p = 10, q = 2 of P7 in book/method.md; then p = 40, q = 12)
SWEEP_SAME = [(10, 2, "auto"), (40, 12, "auto")]
PREVIOUS = dict(oversample=10, n_iter=2, active_oversample=10, active_n_iter=2)
#: CPU seconds of this process: on a shared machine they leave out the time other processes hold the core
clock = time.process_time


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
        t0 = clock()
        out = fn()
        times.append(clock() - t0)
    return statistics.median(times), out


def summary(values: list[float], prefix: str) -> dict:
    return {f"{prefix}_mean": statistics.mean(values), f"{prefix}_max": max(values)}


def distances(exact_subs: list, other_subs: list) -> dict[str, list[float]]:
    """Distances of the cores, active subspaces and LBW bases of ``other_subs`` from ``exact_subs``
    (lists of pact.LayerSubspaces, one per layer)."""
    out = {k: [] for k in ("core_fro", "core_spectral", "active_fro", "active_spectral", "lbw_fro", "lbw_spectral")}
    for e, o in zip(exact_subs, other_subs):
        pairs = [("core", e.core, o.core)] + [("active", a, b) for a, b in zip(e.active, o.active)] + \
                [("lbw", a.basis, b.basis) for a, b in zip(e.lbw, o.lbw)]
        for kind, a, b in pairs:
            fro, spectral = subspace_distances(a, b)
            out[f"{kind}_fro"].append(fro / math.sqrt(max(a.shape[1], 1)))
            out[f"{kind}_spectral"].append(spectral)
    return out


@contextlib.contextmanager
def clocked(module, name: str):
    """Accumulate the seconds spent in ``module.name`` inside the block (the function is wrapped)."""
    spent = [0.0]
    original = getattr(module, name)

    def wrapper(*args, **kw):
        t0 = clock()
        try:
            return original(*args, **kw)
        finally:
            spent[0] += clock() - t0

    setattr(module, name, wrapper)
    try:
        yield spent
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def svd_clock():
    """(seconds in PACT's top-r SVDs (``pactlib.subspaces.top_singular``), seconds in its projections
    (``pactlib.pact.filter_update``, P5)), accumulated inside the block."""
    with clocked(pactlib.subspaces, "top_singular") as svd, clocked(pactlib.pact, "filter_update") as projection:
        yield svd, projection


def sweep(pre: dict, tvs: list, keys: list[str], options: PactOptions, variants, repeat: int) -> tuple[float, list[dict]]:
    """SVD time and subspace distances of each randomized variant on the layers ``keys``, and the
    distance of its pre-trained cores from the exact ones on every layer of ``pre`` (the spectral
    distance is decided by the closest pair of singular values at the cut, which varies by layer)."""
    from pactlib.pact import LayerSubspaces
    mats = []  # (W0, K, [Δt], k) per layer
    for key in keys:
        W0, deltas = pre[key], [tv[key] for tv in tvs]
        mats.append((W0, choose_rank(W0, frac=options.core_frac, energy=options.core_energy), deltas,
                     choose_rank(deltas[0], frac=options.active_frac, energy=options.active_energy)))

    def run(svd: dict, svd_core: dict | None = None):
        total, total_core, subs = 0.0, 0.0, []
        for W0, K, deltas, k in mats:
            bases = []
            for i, (W, r) in enumerate([(W0, K)] + [(d, k) for d in deltas]):
                kw = svd_core if i == 0 and svd_core is not None else svd
                best = math.inf
                for _ in range(repeat):
                    t0 = clock()
                    V = top_singular(W, r, **kw).V
                    best = min(best, clock() - t0)
                total += best
                total_core += best if i == 0 else 0.0
                bases.append(V)
            core, actives = bases[0], bases[1:]
            subs.append(LayerSubspaces(core, actives, [lbw_subspace(core, a, tol=options.lbw_tol) for a in actives]))
        return total, total_core, subs

    t_exact, t_exact_core, exact = run(dict(method="exact"))
    cores = [(W0, choose_rank(W0, frac=options.core_frac, energy=options.core_energy)) for W0 in pre.values()]
    exact_cores = [top_singular(W0, K).V for W0, K in cores]
    print(f"sweep: exact SVDs {t_exact:.2f} s (cores {t_exact_core:.2f} s)", flush=True)
    rows, all_cores_of = [], {}
    for core_v, active_v in variants:
        (pc, qc, rc), (p, q, route) = core_v, active_v
        core_kw = dict(method="rsvd", oversample=pc, n_iter=qc, route=rc, seed=options.seed)
        t, t_core, subs = run(dict(method="rsvd", oversample=p, n_iter=q, route=route, seed=options.seed), core_kw)
        d = distances(exact, subs)
        if core_v not in all_cores_of:  # (fro / √K, spectral) of every layer's core
            all_cores_of[core_v] = [subspace_distances(e, top_singular(W0, K, **core_kw).V) for e, (W0, K) in
                                    zip(exact_cores, cores)]
        all_fro = [f / math.sqrt(K) for (f, _), (_, K) in zip(all_cores_of[core_v], cores)]
        all_cores = [sp for _, sp in all_cores_of[core_v]]

        def used(pp, qq, rr, mm):
            return sorted({"gram" if rr == "gram" or rr == "auto" and gram_is_cheaper(*W.shape, r + pp, qq) else "direct"
                           for W, r in mm})
        row = dict(core_oversample=pc, core_n_iter=qc, core_route=rc, oversample=p, n_iter=q, route=route,
                   routes_used="+".join(sorted(set(used(pc, qc, rc, [(m[0], m[1]) for m in mats])
                                                   + used(p, q, route, [(m[2][0], m[3]) for m in mats])))),
                   t_svd=t, speedup_svd=t_exact / t, t_svd_core=t_core, t_svd_updates=t - t_core,
                   **summary(d["lbw_fro"], "lbw_fro"), **summary(d["lbw_spectral"], "lbw_spectral"),
                   core_spectral_max=max(d["core_spectral"]), active_spectral_max=max(d["active_spectral"]),
                   core_spectral_mean_all=statistics.mean(all_cores), core_spectral_max_all=max(all_cores),
                   core_fro_mean_all=statistics.mean(all_fro), core_fro_max_all=max(all_fro),
                   **summary(d["active_fro"], "active_fro"))
        rows.append(row)
        label = f"p={p:3d} q={q:3d} {route:6s}" if core_v == active_v else f"core {pc}/{qc}/{rc}, updates {p}/{q}/{route}"
        print(f"  {label} ({row['routes_used']}) SVDs {t:6.2f} s ({row['speedup_svd']:5.1f}x) | LBW "
              f"fro/√r mean {row['lbw_fro_mean']:.3f} max {row['lbw_fro_max']:.3f}, spectral mean "
              f"{row['lbw_spectral_mean']:.3f} max {row['lbw_spectral_max']:.3f} | core {row['core_spectral_max']:.3f} "
              f"active {row['active_spectral_max']:.3f} (/√r max {row['active_fro_max']:.3f}) | cores of all layers: "
              f"/√r max {max(all_fro):.3f}, spectral max {max(all_cores):.3f}", flush=True)
    return t_exact, rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the timing of one core)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each Iso-C timing (median)")
    p.add_argument("--filter-repeat", type=int, default=2, help="runs of the filter per layer and variant (fastest)")
    p.add_argument("--sweep-blocks", type=int, default=1, help="blocks whose SVDs the sweep times (0: no sweep)")
    p.add_argument("--filter-blocks", type=int, default=None, help="blocks the filter runs on (default: all)")
    p.add_argument("--sweep-repeat", type=int, default=2, help="runs of each SVD in the sweep (fastest)")
    p.add_argument("--core-frac", type=float, default=PactOptions().core_frac)
    p.add_argument("--active-frac", type=float, default=PactOptions().active_frac)
    p.add_argument("--out", default="book/data/bench_filter.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    a.filter_blocks = a.blocks if a.filter_blocks is None else min(a.filter_blocks, a.blocks)
    started = time.perf_counter()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"threads={torch.get_num_threads()} blocks={a.blocks} tasks={a.tasks}", flush=True)
    pre, tvs = synthetic(a.blocks, a.tasks)
    exact = PactOptions(core_frac=a.core_frac, active_frac=a.active_frac, svd="exact")
    rsvd = exact.replace(svd="rsvd")  # PactOptions' p and q
    previous = exact.replace(svd="rsvd", **PREVIOUS)
    blocks = [[k for k in pre if k.startswith(f"visual.transformer.resblocks.{b}.")] for b in range(a.blocks)]

    variants = ([(v, v) for v in SWEEP_SAME] + [(c, UPDATE_REF) for c in SWEEP_CORE]
                + [(CORE_REF, u) for u in SWEEP_UPDATES if u != UPDATE_REF])
    t_sweep_exact, rows = (sweep(pre, tvs, [k for blk in blocks[:a.sweep_blocks] for k in blk], exact, variants,
                                 a.sweep_repeat) if a.sweep_blocks else (None, []))

    # the filter over every layer, the three variants interleaved layer by layer, fastest of --filter-repeat
    variants = {"exact": exact, "rsvd": rsvd, "previous": previous}
    t_all = {v: 0.0 for v in variants}
    t_svd = {v: 0.0 for v in variants}
    t_proj = {v: 0.0 for v in variants}
    dists = {v: {} for v in ("rsvd", "previous")}
    change = {v: [[0.0, 0.0] for _ in tvs] for v in ("rsvd", "previous")}  # per task: Σ‖Δ̃e − Δ̃‖², Σ‖Δ̃e‖²
    cap_flags = []
    for i, key in enumerate(k for blk in blocks[:a.filter_blocks] for k in blk):
        pre_l = {key: pre[key]}
        tvs_l = [TaskVector({key: tv[key]}, name=tv.name) for tv in tvs]
        best = {v: (math.inf, 0.0, 0.0) for v in variants}
        out = {}
        for rep in range(a.filter_repeat):
            for v in (list(variants) if (i + rep) % 2 == 0 else list(reversed(variants))):
                with svd_clock() as (svd_s, proj_s):
                    t0 = clock()
                    res = pact_filter(pre_l, tvs_l, options=variants[v], keep=True)
                    elapsed = clock() - t0
                best[v] = min(best[v], (elapsed, svd_s[0], proj_s[0]))
                out.setdefault(v, res)
        for v, (elapsed, svd_s, proj_s) in best.items():
            t_all[v] += elapsed
            t_svd[v] += svd_s
            t_proj[v] += proj_s
        f_exact, rep_exact = out["exact"]
        cap_flags += [c for lr in rep_exact.layers for c in lr.capped]
        for v in ("rsvd", "previous"):
            f, rep = out[v]
            for kind, vals in distances([rep_exact.subspaces[key]], [rep.subspaces[key]]).items():
                dists[v].setdefault(kind, []).extend(vals)
            for t, (x, y) in enumerate(zip(f_exact, f)):
                change[v][t][0] += float((x[key] - y[key]).pow(2).sum())
                change[v][t][1] += float(x[key].pow(2).sum())
        if key.endswith(list(SHAPES)[-1]):  # the last layer of a block
            print(f"{key}: " + ", ".join(f"{v} {t_all[v]:.1f} s (SVDs {t_svd[v]:.1f} s, projections {t_proj[v]:.1f} s)"
                                         for v in variants), flush=True)

    def described(v: str) -> dict:
        d = dists[v]
        rel = [math.sqrt(num / den) for num, den in change[v]]
        return dict(t_filter=t_all[v], t_svd=t_svd[v], t_rest=t_all[v] - t_svd[v], t_projection=t_proj[v],
                    speedup=t_all["exact"] / t_all[v],
                    speedup_svd=t_svd["exact"] / t_svd[v],
                    lbw_projector_distance_mean=statistics.mean(d["lbw_fro"]), lbw_projector_distance_max=max(d["lbw_fro"]),
                    **summary(d["lbw_spectral"], "lbw_spectral_distance"), **summary(d["core_fro"], "core_distance"),
                    **summary(d["core_spectral"], "core_spectral_distance"), **summary(d["active_fro"], "active_distance"),
                    **summary(d["active_spectral"], "active_spectral_distance"),
                    filtered_rel_change_mean=statistics.mean(rel), filtered_rel_change_max=max(rel))

    new, old = described("rsvd"), described("previous")
    t_iso, _ = timed(lambda: merged_update("iso_c", pre, tvs), a.repeat)
    print(f"Iso-C alone:            {t_iso:.1f} s", flush=True)
    t_pact_iso, _ = timed(lambda: merged_update("iso_c", pre, tvs, pact="pact", options=rsvd), a.repeat)
    print(f"PACT-Iso-C (RSVD):      {t_pact_iso:.1f} s", flush=True)

    res = dict(blocks=a.blocks, tasks=a.tasks, threads=torch.get_num_threads(), core_frac=a.core_frac,
               active_frac=a.active_frac, oversample=rsvd.oversample, n_iter=rsvd.n_iter,
               active_oversample=rsvd.active_oversample, active_n_iter=rsvd.active_n_iter, filter_blocks=a.filter_blocks,
               t_filter_exact=t_all["exact"], t_svd_exact=t_svd["exact"], t_rest_exact=t_all["exact"] - t_svd["exact"],
               t_projection_exact=t_proj["exact"],
               t_filter_rsvd=new["t_filter"], t_svd_rsvd=new["t_svd"], t_rest_rsvd=new["t_rest"],
               t_projection_rsvd=new["t_projection"],
               speedup_rsvd=new["speedup"], speedup_svd=new["speedup_svd"],
               rest_share_exact=(t_all["exact"] - t_svd["exact"]) / t_all["exact"],
               speedup_bound=t_all["exact"] / (t_all["exact"] - t_svd["exact"]),
               **{k: v for k, v in new.items() if k not in ("t_filter", "t_svd", "t_rest", "speedup", "speedup_svd")},
               previous=dict(PREVIOUS, **old),
               t_iso_c=t_iso, t_pact_iso_c_rsvd=t_pact_iso, pact_iso_over_iso=t_pact_iso / t_iso,
               cap_binding_rate=sum(cap_flags) / len(cap_flags) if cap_flags else 0.0,
               filter_repeat=a.filter_repeat, sweep_blocks=a.sweep_blocks, sweep_repeat=a.sweep_repeat, t_svd_exact_sweep=t_sweep_exact,
               sweep_core_ref=list(CORE_REF), sweep_update_ref=list(UPDATE_REF), sweep=rows,
               clock="process_time", cpus=os.cpu_count(), bench_seconds=time.perf_counter() - started,
               measured=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command=" ".join(["bench/bench_filter.py", *(argv or [])]))
    print(f"PACT filter: exact {res['t_filter_exact']:.1f} s (SVDs {res['t_svd_exact']:.1f} s, projections "
          f"{res['t_projection_exact']:.1f} s), RSVD core p={rsvd.oversample} q={rsvd.n_iter}, updates "
          f"p={rsvd.active_oversample} q={rsvd.active_n_iter}: {res['t_filter_rsvd']:.1f} s (SVDs {res['t_svd_rsvd']:.1f} s, "
          f"projections {res['t_projection_rsvd']:.1f} s): {res['speedup_rsvd']:.1f}x "
          f"(goal >= 5x; SVDs alone {res['speedup_svd']:.1f}x; bound with free SVDs {res['speedup_bound']:.1f}x)")
    print(f"previous RSVD p=10 q=2 (core and updates): {old['t_filter']:.1f} s, {old['speedup']:.1f}x")
    print(f"LBW bases, fro/√r: mean {res['lbw_projector_distance_mean']:.2e}, max {res['lbw_projector_distance_max']:.2e} "
          f"(goal <= 0.1; previous {old['lbw_projector_distance_mean']:.2f}); spectral: mean "
          f"{res['lbw_spectral_distance_mean']:.2e}, max {res['lbw_spectral_distance_max']:.2e}")
    print(f"relative change of filtered task vectors: mean {res['filtered_rel_change_mean']:.2e}, "
          f"max {res['filtered_rel_change_max']:.2e}")
    print(f"PACT-Iso-C (RSVD) / Iso-C time: {res['pact_iso_over_iso']:.2f}x (goal <= 2x)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
