"""Where do the null directions of PACT-filtered and LoRA updates sit, and where the real ones?

    .venv/bin/python bench/bench_null_space_rank.py                  # a couple of minutes on one CPU
    .venv/bin/python bench/bench_null_space_rank.py --sizes 64x48 768x768

The rank decision of ``null_space="drop"`` (:func:`pactlib.linalg.resolved_rank`, book chapter 5,
"Rank-deficient layers") must cut the directions that algebra makes null (a projection, a rank-r
product, sums of them) and keep every real one, however small. This measures both, on the float32
values the merges see, with their singular values computed in float64:

- synthetic matrices of several shapes: LoRA products B·A (one task, and sums of T), S-PACT
  filtered full-rank updates (shields of 10 % and 50 % of n; Gaussian and log-spaced spectra),
  updates from which the filter removes most of the norm (one projection and the filter's two),
  and full-rank layers whose spectrum runs log-spaced down to 1e-6 and 2e-5 (all directions real);
- the synthetic testbed (4 tasks, seed 0, full and LoRA fine-tunes) with PACT / S-PACT / none:
  each matrix layer's sum, first task, and Iso-CTS residuals (the common block taken as Iso-CTS
  takes it, from the float64 SVD of the sum).

Each record (``method`` = the case) has the exact rank when algebra gives it (``alg_rank``), the
rank found (``resolved``) and with the old relative tolerance max(m, n)·eps (``old_rtol``), and
the largest null and smallest real singular value relative to σ_max and in units of
eps·‖X‖_F·(1/√m + 1/√n) (``*_units``; the decision's floor is :data:`pactlib.linalg.RESOLUTION`
units). Records go to ``book/data/rank_decision.jsonl`` (replaced).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from pactlib import linalg
from pactlib.book import records
from pactlib.linalg import default_rtol, exact_svdvals, resolved_rank
from pactlib.merges.driver import task_sum
from pactlib.pact import pact_filter
from pactlib.shield import filter_update

EPS = torch.finfo(torch.float32).eps


def unit(X: torch.Tensor, norm: float | None = None) -> float:
    """eps·‖X‖_F·(1/√m + 1/√n): the typical spectral norm of a rounding of every entry of X."""
    m, n = X.shape
    nu = float(torch.linalg.vector_norm(X, dtype=torch.float64)) if norm is None else norm
    return EPS * nu * (m ** -0.5 + n ** -0.5)


def record(case: str, X: torch.Tensor, alg: int | None, params: dict, *, norm: float | None = None,
           seed: int = 0) -> dict:
    """One record: X's float64 spectrum around its exact rank ``alg`` (None: take the decision's)."""
    s = exact_svdvals(X)
    m, n = X.shape
    found = resolved_rank(X, norm=norm)
    r = found if alg is None else alg
    u = unit(X, norm)
    top = float(s[0]) if s.numel() and float(s[0]) > 0 else 1.0
    null = float(s[r]) if r < len(s) else 0.0
    real = float(s[r - 1]) if r > 0 else None
    old = int((torch.linalg.svdvals(X) > default_rtol((m, n), X.dtype) * float(torch.linalg.svdvals(X)[0])).sum())
    return records.make_record(case, params={**params, "m": m, "n": n, "resolution": linalg.RESOLUTION},
                               seed=seed, metrics={
                                   "alg_rank": alg, "resolved": found, "old_rtol": old, "min_side": min(m, n),
                                   "null_rel": null / top, "real_rel": None if real is None else real / top,
                                   "null_units": null / u if u else None,
                                   "real_units": None if real is None or not u else real / u})


def log_spectrum(m: int, n: int, lo: float, g: torch.Generator) -> torch.Tensor:
    d = min(m, n)
    U = torch.linalg.qr(torch.randn(m, d, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, d, generator=g, dtype=torch.float64)).Q
    return ((U * torch.logspace(0, math.log10(lo), d, dtype=torch.float64)) @ V.T).float()


def synthetic(sizes: list[tuple[int, int]], seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for m, n in sizes:
        for r, T in ((4, 2), (16, 8)):
            tasks = [(0.01 * torch.randn(m, r, generator=g)) @ torch.randn(r, n, generator=g) for _ in range(T)]
            out.append(record("lora_sum", task_sum(torch.stack(tasks)), min(T * r, m, n), {"r": r, "T": T}))
            out.append(record("lora_task", tasks[0], min(r, m, n), {"r": r}))
        for frac in (0.1, 0.5):
            s = int(frac * n)
            S = torch.linalg.qr(torch.randn(n, s, generator=g, dtype=torch.float64)).Q.float()
            for spec in ("gauss", "log1e-5"):
                tasks = [0.01 * torch.randn(m, n, generator=g) if spec == "gauss" else log_spectrum(m, n, 1e-5, g)
                         for _ in range(4)]
                filt = [filter_update(d, S) for d in tasks]
                p = {"shield_frac": frac, "spectrum": spec, "T": 4}
                out.append(record("s_pact_sum", task_sum(torch.stack(filt)), min(m, n - s), p))
                out.append(record("s_pact_task", filt[0], min(m, n - s), p))
        s = max(1, n // 2)
        S64 = torch.linalg.qr(torch.randn(n, s, generator=g, dtype=torch.float64)).Q
        for kept in (0.5, 0.01, 0.001):  # the filter removes all but `kept` of the norm
            inside = torch.randn(m, s, generator=g, dtype=torch.float64) @ S64.T
            outside = torch.randn(m, n, generator=g, dtype=torch.float64)
            outside -= (outside @ S64) @ S64.T
            delta = (inside + kept * float(inside.norm() / outside.norm()) * outside).float()
            S = S64.float()
            p = {"shield_frac": 0.5, "kept": kept}
            out.append(record("filter_one_pass", linalg.project_out(delta, S), min(m, n - s), p))
            out.append(record("filter_two_passes", filter_update(delta, S), min(m, n - s), p))
        for lo in (1e-6, 2e-5):
            out.append(record("full_rank_log", log_spectrum(m, n, lo, g), min(m, n), {"lowest": lo}))
    return out


def testbed(seed: int) -> list[dict]:
    from pactlib import testbeds

    out = []
    for kind in ("full", "lora"):
        tb = testbeds.load("synthetic-4", seed=seed, kind=kind)
        pre, tvs, rule = tb.pretrained, tb.task_vectors(), tb.rule
        for pact in (None, "pact", "s-pact"):
            f = pact_filter(pre, tvs, mode=pact, rule=rule)[0] if pact else tvs
            for key in pre:
                if rule.kind(key, pre[key]) != "matrix":
                    continue
                st = rule.view(key, torch.stack([tv[key] for tv in f]), stacked=True)  # (T, m, n)
                p = {"testbed": "synthetic-4", "kind": kind, "pact": pact, "key": key}
                total = task_sum(st)
                out.append(record("testbed_sum", total, None, p, seed=seed))
                out.append(record("testbed_task", st[0], None, p, seed=seed))
                U, S, _ = torch.linalg.svd(total.double(), full_matrices=False)
                k = min(int(0.8 * min(total.shape)), resolved_rank(total))
                Uc = U[:, :k]
                for t in range(st.shape[0]):
                    d64 = st[t].double()
                    resid = (d64 - Uc @ (Uc.mT @ d64)).float()
                    out.append(record("testbed_iso_cts_residual", resid, None, {**p, "task": t, "k": k},
                                      norm=float(d64.norm()), seed=seed))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["64x48", "256x384", "768x768", "1024x1024", "3072x768"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-testbed", action="store_true")
    p.add_argument("--out", default="book/data/rank_decision.jsonl")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes]
    recs = synthetic(sizes, args.seed) + ([] if args.no_testbed else testbed(args.seed))
    out = records.write_records(Path(args.out), recs, replace=True)
    for case in dict.fromkeys(r["method"] for r in recs):
        rs = [r["metrics"] for r in recs if r["method"] == case]
        nulls = [x["null_units"] for x in rs if x["null_units"] is not None and x["null_rel"] > 0]
        reals = [x["real_units"] for x in rs if x["real_units"] is not None]
        known = [x for x in rs if x["alg_rank"] is not None]
        agree = sum(x["alg_rank"] == x["resolved"] for x in known)
        print(f"{case:26s} {len(rs):3d} cases: rank found = exact rank in {agree} of {len(known)} known; null ≤ "
              f"{max(nulls, default=0):8.2f} units; smallest real ≥ {min(reals, default=float('nan')):10.3g} units")
    print(f"wrote {len(recs)} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
