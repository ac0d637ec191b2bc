"""What should TSV-M, Iso-C and Iso-CTS do on rank-deficient layers? Measured on validation.

    .venv/bin/python bench/bench_null_space.py                     # 8 tasks full + LoRA (3 seeds), 20 tasks (seed 0)
    .venv/bin/python bench/bench_null_space.py --seeds 0 --suites 8
    .venv/bin/python bench/bench_null_space.py --seeds 1 2 --suites 8 20 --large-seeds 0 --append   # in parts

The PACT filter removes directions shared by every task's shield from every task, and LoRA task
vectors have rank <= T·r, so the matrices these merges decompose are often exactly
rank-deficient. Two conventions (``null_space``, :mod:`pactlib.merges.blocks`):

- ``drop``: keep only the directions the stored values resolve (:func:`pactlib.linalg.resolved_rank`;
  ``bench/bench_null_space_rank.py`` measures the spectra behind it); a function of the set of
  task vectors;
- ``literal``: the reference code's, which flattens / stacks every singular triplet, writing
  merged weight into null directions whose pairing the SVD picks arbitrarily.

For each (suite, kind, seed, method, filter) merge the book's α search runs (5 geometric values,
widened at an edge; validation 100 images per task, test 300, as chapters 5 and 9) with each
convention, and, for ``literal``, once more with the task order reversed (``literal-reversed``):
the same set of task vectors, which ``drop`` merges to the same model to float noise. Records
(``convention`` = drop / literal / literal-reversed) go to ``book/data/null_space.jsonl``; the
default convention is the one with the higher mean validation score (chapter 5, "Rank-deficient
layers").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tqdm.auto import tqdm

from pactlib.book import records
from pactlib.testbeds import alpha_grid, filtered, load, run

METHODS = ("tsv_m", "iso_c", "iso_cts")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["8", "20"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of the first suite")
    p.add_argument("--large-seeds", nargs="+", type=int, default=[0], help="seeds of the other suites")
    p.add_argument("--kinds", nargs="+", default=["full", "lora"], help="kinds of the first suite (others: full)")
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--reversed-seeds", nargs="+", type=int, default=[0],
                   help="seeds on which the literal convention is also run with the task order reversed")
    p.add_argument("--val-limit", type=int, default=100)
    p.add_argument("--test-limit", type=int, default=300)
    p.add_argument("--alpha-points", type=int, default=5)
    p.add_argument("--out", default="book/data/null_space.jsonl")
    p.add_argument("--append", action="store_true", help="add to --out instead of replacing it (runs in parts)")
    args = p.parse_args(argv)

    plan = [(s, k, seed) for i, s in enumerate(args.suites) for k in (args.kinds if i == 0 else ["full"])
            for seed in (args.seeds if i == 0 else args.large_seeds)]
    recs = []
    for suite, kind, seed in tqdm(plan, desc="testbeds"):
        tb = load(f"lite0-{suite}", seed, kind=kind, val_limit=args.val_limit, test_limit=args.test_limit)
        # plain full fine-tunes have full-rank sums: both conventions agree there (tested), skip them
        filters = (None, "pact", "s-pact") if kind == "lora" else ("pact", "s-pact")
        for method in args.methods:
            alphas = (alpha_grid(method, args.alpha_points, lo=0.1, hi=3.0) if kind == "lora"
                      else alpha_grid(method, args.alpha_points))
            for pact in filters:
                conventions = ["drop", "literal"] + (["literal-reversed"] if seed in args.reversed_seeds else [])
                for conv in conventions:
                    kw = {} if conv == "drop" else {"null_space": "literal"}  # drop: the chapters' memo
                    tvs = None
                    if conv == "literal-reversed":
                        tvs = filtered(tb, pact)[0][::-1] if pact else tb.task_vectors()[::-1]
                    r = run(tb, method, pact=None if tvs is not None else pact, alphas=alphas, task_vectors=tvs,
                               label=f"{pact}-{method}" if pact else method, **kw)
                    r = {**r, "convention": conv, "base": method, "pact": pact, "kind": kind}
                    recs.append(r)
                    m = r["metrics"]
                    tqdm.write(f"suite {suite:>2s} {kind:4s} s{seed} {r['method']:18s} {conv:16s} α={r['alpha']:<7g} "
                               f"val {m['val_norm_acc']:.4f} test {m['norm_acc']:.4f}")
    out = records.write_records(Path(args.out), recs, replace=not args.append)
    print(f"wrote {len(recs)} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
