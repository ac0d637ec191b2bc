"""How should α be searched? A full grid vs a coarse grid refined around its best point.

    .venv/bin/python bench/bench_alpha_search.py                 # suite 8 (all methods) + 20 (TA, Iso-C)
    .venv/bin/python bench/bench_alpha_search.py --suites 8 --methods iso_c
    .venv/bin/python bench/bench_alpha_search.py --searches geo5   # add one search to the records
    .venv/bin/python bench/bench_alpha_search.py --set lr=1e-4 --out /tmp/alpha_lr1e-4.jsonl   # another recipe

book/method.md (protocol) gives each method an α range (TA/TIES 0.05…1.0, TSV-M/Iso-C/Iso-CTS 0.1…3.0). The
paper steps through it at 0.05 / 0.1: 20–30 evaluations of the validation split per merge, the
bulk of a merge's cost on CPU. This compares, for every (suite, method, plain / PACT) merge of
one seed, three searches (all widened at an edge, ``widen=3``):

- ``full``: the method's whole grid (``pactlib.merges.get(method).alphas``);
- ``grid5``: 5 evenly spaced points, no refinement;
- ``geo5``: 5 geometrically spaced points (constant ratio), no refinement;
- ``grid4+refine2``: 4 evenly spaced points, then 2 rounds of geometric midpoints around the
  best α (``select_alpha(refine=2)``).

Each record (``method`` = the merge, ``search`` = the search) carries the α chosen, the number of
validation evaluations, and validation / test mean normalized accuracy. The main-results chapter
reads ``book/data/alpha_search.jsonl``; :data:`pactlib.testbeds.REFINE` and
:data:`pactlib.testbeds.GRID_SPACING` are set from it.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from pactlib import merges
from pactlib.book import records
from pactlib.testbeds import alpha_grid, load, run
from pactlib.testbeds.lite0 import testbed as lite0

#: name -> (points (None: the full grid), spacing, refinement rounds)
SEARCHES = {"full": (None, "linear", 0), "grid5": (5, "linear", 0), "geo5": (5, "geometric", 0),
            "grid4+refine2": (4, "linear", 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["8", "20"])
    p.add_argument("--methods", nargs="+", default=["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"])
    p.add_argument("--large-methods", nargs="+", default=["task_arithmetic", "iso_c"],
                   help="methods run on suites other than the first (CPU time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-limit", type=int, default=100)
    p.add_argument("--test-limit", type=int, default=300)
    p.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES),
                   help="searches to run; records of other searches already in --out are kept")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="recipe fields to change (pactlib.testbeds.lite0.testbed.recipe_variant: the runs go to a zoo of their own)")
    p.add_argument("--out", default="book/data/alpha_search.jsonl")
    args = p.parse_args(argv)
    try:
        lite0.recipe_variant("default", args.set)  # a bad setting is a usage error, before any work
    except ValueError as e:
        p.error(str(e))

    recs = []
    for i, suite in enumerate(args.suites):
        tb = load(f"lite0-{suite}", args.seed, val_limit=args.val_limit, test_limit=args.test_limit,
                  settings=args.set, progress=bool(args.set))
        for method in args.methods if i == 0 else args.large_methods:
            for pact in (None, "pact"):
                for search in args.searches:
                    points, spacing, refine = SEARCHES[search]
                    alphas = merges.get(method).alphas if points is None else alpha_grid(method, points, spacing=spacing)
                    t0 = time.perf_counter()
                    r = run(tb, method, pact=pact, alphas=alphas, refine=refine)
                    r = {**r, "search": search, "n_evals": len(r["alphas"]), "search_seconds": time.perf_counter() - t0}
                    recs.append(r)
                    print(f"suite {suite:>2s} {r['method']:22s} {search:14s} α={r['alpha']:<8g} evals {r['n_evals']:2d} "
                          f"val {r['metrics']['val_norm_acc']:.3f} test {r['metrics']['norm_acc']:.3f}", flush=True)
    out = Path(args.out)
    if out.is_file():  # keep the other searches' records
        recs = [r for r in records.read_records(out) if r.get("search") not in args.searches] + recs
    out = records.write_records(out, recs, replace=True)
    print(f"wrote {len(recs)} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
