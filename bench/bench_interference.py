"""Does the testbed show the problem PACT solves? Merging loss against the number of tasks T.

    .venv/bin/python bench/bench_interference.py                   # suites 8/14/20, seeds 0 1 2
    .venv/bin/python bench/bench_interference.py --seeds 0
    .venv/bin/python bench/bench_interference.py --seeds 0 --set lr=1e-4 --out /tmp/lr1e-4.jsonl   # another recipe
    .venv/bin/python bench/bench_interference.py --draws 4 --alpha-points 0 --out book/data/interference_draws.jsonl
    .venv/bin/python bench/bench_interference.py --add-one 0.2 --out book/data/interference_add_one.jsonl
    .venv/bin/python bench/bench_interference.py --alpha-points 5 --alpha-spacing geometric   # 5 geometric α values

For each seed this builds (or reuses) the full fine-tunes of the 20-task suite with the book's
recipe (``pactlib.testbeds.lite0.testbed.PROFILES["default"]``; the book's own zoo has the 14/20-task suites on
seed 0 only, so seeds 1 and 2 add 24 runs, about 10 min on 2 cores), then merges the 8-, 14- and
20-task suites (nested: each suite starts with the smaller one's tasks) with Task Arithmetic
(M1) and Iso-C (M4), α chosen on validation with the book's search (5 geometric α values over
the range of book/method.md, protocol, widened at an edge: chapter 5's protocol). Records
(zero-shot, fine-tuned with the mean task-vector norm ``tv_norm``, TA, Iso-C per suite × seed,
per-task metrics included, so the first 8 tasks can be followed as T grows) go to ``--out``; the testbed chapter reads
``book/data/interference.jsonl``.

``--draws N`` asks a question the nested suites cannot: does the loss grow with T whichever
tasks join? The extra tasks enter the 14-task suite in one fixed order; with ``--draws`` the
script merges, for each T in ``--sizes``, N random sets of T − 8 of the 12 extra tasks (the
same sets for every seed; records carry ``draw`` and ``tasks``), besides the 8- and 20-task
suites.

``--set name=value`` changes fields of the recipe (``pactlib.testbeds.lite0.zoo.Recipe``); the runs then go to a
zoo of their own, ``$PACT_CACHE/zoo-<name><value>...``, never into the book's.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pactlib.book import records
from pactlib.testbeds import alpha_grid, reference_records, run
from pactlib.testbeds.lite0 import testbed as lite0
from pactlib.data.suites import suite_tasks
from pactlib.book.experiments.testbed import random_task_sets
from pactlib.testbeds.lite0.zoo import build_zoo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["8", "14", "20"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["task_arithmetic", "iso_c"])
    p.add_argument("--alpha-points", type=int, default=5,
                   help="α values over each method's range (book/method.md, protocol); 0: the paper's full grid")
    p.add_argument("--alpha-spacing", choices=["linear", "geometric"], default=None,
                   help="spacing of the --alpha-points grid (default: pactlib.testbeds.GRID_SPACING)")
    p.add_argument("--val-limit", type=int, default=100)
    p.add_argument("--test-limit", type=int, default=300)
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="recipe fields to change")
    p.add_argument("--draws", type=int, default=0,
                   help="random orders: for each T in --sizes, merge this many random sets of the extra tasks "
                        "(beyond the smallest suite) instead of the named suites in between")
    p.add_argument("--sizes", nargs="+", type=int, default=[11, 14, 17], help="T values of the random sets")
    p.add_argument("--add-one", type=float, default=None, metavar="ALPHA",
                   help="instead: the cost to the smallest suite's tasks of adding each extra task alone to "
                        "its Task Arithmetic merge at this α (test split)")
    p.add_argument("--out", default="book/data/interference.jsonl")
    args = p.parse_args(argv)

    try:
        zoo_dir, recipe = lite0.recipe_variant("default", args.set)
    except ValueError as e:
        p.error(str(e))
    largest = max(args.suites, key=int)
    build_zoo(largest, args.seeds, kind=["full"], zoo_dir=zoo_dir, recipe=recipe, progress=True)
    if args.add_one is not None:
        recs = add_one(args, zoo_dir, largest)
        out = records.write_records(Path(args.out), recs, replace=True)
        print(f"wrote {len(recs)} records to {out}")
        return 0
    slices = [(suite, None, None) for suite in args.suites]  # (suite label, tasks, draw)
    if args.draws:
        try:
            sets = random_task_sets(suite_tasks(min(args.suites, key=int)), suite_tasks(largest), args.sizes, args.draws)
        except ValueError as e:
            p.error(f"--sizes / --draws: {e}")
        slices = [(min(args.suites, key=int), None, None), (largest, None, None)]
        slices += [(str(T), tasks, i) for T, i, tasks in sets]
    recs = []
    for seed in args.seeds:
        for suite, tasks, draw in slices:
            tb = lite0.Lite0Testbed.from_zoo(f"lite0-{suite}", suite, seed, "full", zoo_dir=zoo_dir,
                                            val_limit=args.val_limit, test_limit=args.test_limit, tasks=tasks)
            zs_rec, ft_rec = reference_records(tb, per_task=True, kind="full", recipe=recipe.relevant("full"))
            # the size of the updates: mean Frobenius norm of Δt
            ft_rec["metrics"]["tv_norm"] = float(np.mean([tv.norm() for tv in tb.task_vectors()]))
            batch = [zs_rec, ft_rec]
            for method in args.methods:
                t0 = time.perf_counter()
                r = run(tb, method, alphas=alpha_grid(method, args.alpha_points or None, spacing=args.alpha_spacing))
                batch.append(r)
                print(f"seed {seed} suite {suite:>2s}{'' if draw is None else f' set {draw}'} {method:16s} "
                      f"α={r['alpha']:<9g} norm {r['metrics']['norm_acc']:.3f} [{time.perf_counter() - t0:.0f} s]",
                      flush=True)
            if draw is not None:
                for r in batch:
                    r.update(draw=draw, tasks=list(tb.tasks))
            recs += batch
    out = records.write_records(Path(args.out), recs, replace=True)
    print(f"wrote {len(recs)} records to {out}")
    return 0


def add_one(args, zoo_dir, largest: str) -> list[dict]:
    """Per seed: TA of the smallest suite at α = ``args.add_one`` (``added`` None), then the same
    merge plus one extra task vector (``added`` = its name); test normalized accuracy over the
    smallest suite's tasks, per task too."""
    from pactlib.taskvector import TaskVector

    first = suite_tasks(min(args.suites, key=int))
    recs = []
    for seed in args.seeds:
        tb = lite0.Lite0Testbed.from_zoo(f"lite0-{largest}", largest, seed, "full", zoo_dir=zoo_dir,
                                        val_limit=args.val_limit, test_limit=args.test_limit)
        tvs = dict(zip(tb.tasks, tb.task_vectors()))
        base = TaskVector.sum([tvs[t] for t in first])
        for added in [None] + [t for t in tb.tasks if t not in first]:
            delta = base if added is None else base + tvs[added]
            acc = tb.evaluate(delta.apply_to(tb.pretrained, args.add_one), "test", first)
            norm = {t: acc[t] / tb.ft_test[t] for t in first}
            recs.append(records.make_record(
                "task_arithmetic", params={"alpha": args.add_one}, seed=seed, suite=largest, added=added,
                alpha=args.add_one, metrics={"norm_acc": float(np.mean(list(norm.values()))),
                                             **{f"norm_acc:{t}": v for t, v in norm.items()}}))
            print(f"seed {seed} + {added or '(none)':18s} norm {recs[-1]['metrics']['norm_acc']:.4f}", flush=True)
    return recs


if __name__ == "__main__":
    raise SystemExit(main())
