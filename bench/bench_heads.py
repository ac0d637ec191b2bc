"""Which frozen head should the testbed use? Probe vs prototype, measured by Task Arithmetic.

    .venv/bin/python bench/bench_heads.py                      # suites 8 and 14, seed 0
    .venv/bin/python bench/bench_heads.py --suites 8 --heads prototype

For each head kind (``Recipe.head``: ``"probe"``, a ridge logistic regression trained on θ0's
features; ``"prototype"``, the CLIP-like cosine class-mean head) this builds (or reuses) a zoo of
full fine-tunes with otherwise the book's default recipe (``pactlib.testbeds.lite0.testbed.PROFILES["default"]``),
then measures on each suite: zero-shot and fine-tuned accuracy, Task Arithmetic (M1) and Iso-C
(M4) with α chosen on validation (book/method.md, protocol; TA's grid extended below 0.05 to see where a
probe head's best α lands). Records (one per head × suite × method, with the α curve, the seed
and the recipe) go to ``--out``; the testbed chapter reads ``book/data/head_choice.jsonl``.

Zoos: ``prototype`` uses the book's zoo (``$PACT_CACHE/zoo``, the same recipe), ``probe`` uses
``$PACT_CACHE/zoo-probe`` (built here when missing: about 4 min per 8 tasks on 2 cores).
The records in the book were made with the first default recipe (lr 1e-4, their ``recipe``
field); a run today uses the current default, and the probe zoo's runs are rebuilt to match it.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from pactlib.book import records
from pactlib.testbeds import reference_records, run
from pactlib.testbeds.lite0 import testbed as lite0
from pactlib.testbeds.lite0.zoo import Recipe, build_zoo

TA_GRID = (0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["8", "14"])
    p.add_argument("--heads", nargs="+", default=["probe", "prototype"], choices=["probe", "prototype"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-limit", type=int, default=100)
    p.add_argument("--test-limit", type=int, default=300)
    p.add_argument("--out", default="book/data/head_choice.jsonl")
    args = p.parse_args(argv)

    book_dir, book_recipe = lite0.zoo_profile("default")
    recs = []
    for head in args.heads:
        recipe = Recipe(**{**book_recipe.__dict__, "head": head})
        zoo_dir = book_dir if head == book_recipe.head else book_dir.with_name(f"zoo-{head}")
        for suite in args.suites:
            build_zoo(suite, [args.seed], kind=["full"], zoo_dir=zoo_dir, recipe=recipe, progress=True)
            tb = lite0.Lite0Testbed.from_zoo(f"lite0-{suite}", suite, args.seed, "full", zoo_dir=zoo_dir,
                                            val_limit=args.val_limit, test_limit=args.test_limit)
            extra = dict(suite=suite, kind="full", head=head, recipe=recipe.relevant("full"))
            zs_rec, ft_rec = reference_records(tb, params={"head": head}, **extra)
            recs += [zs_rec, ft_rec]
            for method, alphas in (("task_arithmetic", TA_GRID), ("iso_c", None)):
                t0 = time.perf_counter()
                r = run(tb, method, alphas=alphas)
                r.update(extra, params={**r["params"], "head": head})
                recs.append(r)
                print(f"{head:9s} suite {suite:>2s} {method:16s} α={r['alpha']:<5g} norm {r['metrics']['norm_acc']:.3f} "
                      f"(zero-shot {zs_rec['metrics']['norm_acc']:.3f}) [{time.perf_counter() - t0:.0f} s]",
                      flush=True)
    out = records.write_records(Path(args.out), recs, replace=True)
    print(f"wrote {len(recs)} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
