"""Benchmark of the model zoo: time per fine-tuning run, accuracies, and Task Arithmetic vs T.

    .venv/bin/python bench/bench_zoo.py                       # suite 8, seed 0, full + LoRA
    .venv/bin/python bench/bench_zoo.py --suites 8 14 20 --ta # + TA merged accuracy on 8/14/20

Builds (or resumes) the zoo with the default :class:`pactlib.testbeds.lite0.zoo.Recipe` in ``--zoo-dir``
(default ``$PACT_CACHE/zoo-bench``, so a bench never rewrites the book's zoo; with ``--no-build``
it only reads an existing zoo, e.g. ``--zoo-dir .cache/zoo``), prints per-run seconds and zero-shot -> fine-tuned accuracy per task,
extrapolates the book's zoo time (3 seeds x suite 8 x full+LoRA, plus seed 0 of the 14/20
suites), and with ``--ta`` evaluates Task Arithmetic θ0 + α·Σt Δt (M1) with α chosen on
validation (:func:`pactlib.eval.select_alpha`) for each suite. Runs already in the zoo are not
retrained: their recorded seconds are reported (pass a fresh ``--zoo-dir`` to time from scratch).
Results go to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from pactlib.testbeds.lite0 import zoo as Z
from pactlib.eval import select_alpha


def _suite_tasks(suite: str) -> tuple[str, ...]:
    from pactlib.data import suite_tasks

    return tuple(suite_tasks(suite))


def ta_record(suite: str, kind: str, zoo_dir: Path, alphas, val_limit, seed: int = 0) -> dict:
    """Task Arithmetic (M1) on one suite: α on validation, test at that α."""
    from pactlib.data import load_task

    zoo = Z.load_zoo(suite, seed=seed, kind=kind, zoo_dir=zoo_dir)
    tvs = zoo.task_vectors()
    D = {k: sum(tv[k] for tv in tvs.values()) for k in next(iter(tvs.values()))}  # Σt Δt
    pre = zoo.pretrained

    def merged(alpha):
        return {k: (v + alpha * D[k]).to(v.dtype) if k in D else v for k, v in pre.items()}

    rs = zoo.records[zoo.tasks[0]]["recipe"]
    val = {t: load_task(t, "val", seed=rs["data_seed"]) for t in zoo.tasks}
    test = {t: load_task(t, "test", seed=rs["data_seed"]) for t in zoo.tasks}
    t0 = time.perf_counter()
    rec = select_alpha(merged, alphas, heads=zoo.heads, val=val, test=test, ft_val=zoo.accuracies("val"),
                       ft_test=zoo.accuracies("test"), method="task_arithmetic", seed=seed,
                       resolution=rs["resolution"], limit=val_limit, suite=suite, kind=kind)
    rec["seconds"] = time.perf_counter() - t0
    zs = zoo.accuracies("test", "zero_shot")
    rec["zero_shot_mean_acc"] = statistics.mean(zs.values())
    rec["zero_shot_mean_norm"] = statistics.mean(zs[t] / zoo.accuracies("test")[t] for t in zs)
    rec["finetuned_mean_acc"] = statistics.mean(zoo.accuracies("test").values())
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suites", nargs="+", default=["8"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--kind", nargs="+", default=list(Z.KINDS), choices=Z.KINDS)
    p.add_argument("--zoo-dir", default=None, help="default $PACT_CACHE/zoo-bench")
    p.add_argument("--no-build", action="store_true", help="only read runs already in --zoo-dir")
    p.add_argument("--ta", action="store_true", help="also evaluate Task Arithmetic per suite (seed 0)")
    p.add_argument("--val-limit", type=int, default=None, help="validation examples per task for α")
    p.add_argument("--out", default="bench_zoo.json")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    zoo_dir = Path(args.zoo_dir) if args.zoo_dir else Z.default_zoo_dir().with_name("zoo-bench")
    out = {"threads": torch.get_num_threads(), "recipe": Z.Recipe().__dict__, "suites": {}}

    for suite in args.suites:
        t0 = time.perf_counter()
        if args.no_build:
            recs = [r for s in args.seeds for k in args.kind
                    for r in Z.load_zoo(suite, seed=s, kind=k, zoo_dir=zoo_dir).records.values()]
        else:
            recs = Z.build_zoo(suite, args.seeds, kind=args.kind, zoo_dir=zoo_dir)
        wall = time.perf_counter() - t0
        print(f"\n== suite {suite}: {len(recs)} runs, wall {wall:.0f} s (includes data loading; "
              f"runs already built cost ~0 s)")
        print(f"{'kind':5s} {'task':22s} {'seed':>4s} {'sec':>6s} {'zero-shot':>9s} {'ft val':>7s} {'ft test':>7s}")
        for r in recs:
            print(f"{r['kind']:5s} {r['task']:22s} {r['seed']:4d} {r['seconds']:6.1f} "
                  f"{r['zero_shot']['test']:9.3f} {r['finetuned']['val']:7.3f} {r['finetuned']['test']:7.3f}")
        per_kind = {k: [r["seconds"] for r in recs if r["kind"] == k] for k in args.kind}
        summary = {k: {"runs": len(v), "mean_s": statistics.mean(v), "total_s": sum(v)} for k, v in per_kind.items() if v}
        for k in args.kind:
            sel = [r for r in recs if r["kind"] == k]
            if sel:
                summary[k]["zero_shot_test"] = statistics.mean(r["zero_shot"]["test"] for r in sel)
                summary[k]["finetuned_test"] = statistics.mean(r["finetuned"]["test"] for r in sel)
                summary[k]["worst_gain"] = min(r["finetuned"]["test"] - r["zero_shot"]["test"] for r in sel)
        print(json.dumps(summary, indent=1))
        out["suites"][suite] = {"wall_s": wall, "runs": recs, "summary": summary}

    # extrapolation of the book's zoo: 3 seeds x 8 tasks x (full + LoRA), plus seed 0 of tasks 9..20
    # (full only, or full + LoRA), plus the 20 heads, from the mean measured seconds per kind
    runs = [r for s in out["suites"].values() for r in s["runs"]]
    mean_s = {k: statistics.mean(r["seconds"] for r in runs if r["kind"] == k) for k in Z.KINDS
              if any(r["kind"] == k for r in runs)}
    heads = [r["seconds"] for r in Z.load_records(zoo_dir, kind="head")]
    if len(mean_s) == 2:
        head_s = statistics.mean(heads) if heads else 0.0
        suite8 = 8 * (mean_s["full"] + mean_s["lora"]) + 8 * head_s
        book_full = 3 * 8 * (mean_s["full"] + mean_s["lora"]) + 12 * mean_s["full"] + 20 * head_s
        book_both = book_full + 12 * mean_s["lora"]
        out["extrapolation"] = {"mean_run_s": mean_s, "mean_head_s": head_s, "suite8_1seed_s": suite8,
                                "book_zoo_s_extra_full_only": book_full, "book_zoo_s_extra_full_lora": book_both}
        print(f"\nmean run: full {mean_s['full']:.1f} s, LoRA {mean_s['lora']:.1f} s, head {head_s:.1f} s -> "
              f"suite 8, 1 seed, full+LoRA: {suite8 / 60:.1f} min; book zoo (3 seeds x 8 x full+LoRA + "
              f"tasks 9-20 seed 0): {book_full / 60:.1f} min (full only) / {book_both / 60:.1f} min (full+LoRA)")

    if args.ta:
        # the grids of book/method.md, protocol (TA 0.05..1, LoRA 0.1..3) plus smaller α: on this testbed the best TA α
        # sits near or below 0.05 (see the report printed below).
        grids = {"full": [0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0],
                 "lora": [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0]}
        out["ta"] = {}
        for suite in args.suites:
            for kind in args.kind:
                grid = grids[kind]
                rec = ta_record(suite, kind, zoo_dir, grid, args.val_limit)
                out["ta"][f"{suite}/{kind}"] = rec
                print(f"TA {kind:4s} T={len(rec['per_task']['test']['acc']):2d}: α={rec['alpha']:.2f}"
                      f"{' (edge)' if rec['on_edge'] else ''} test acc {rec['metrics']['acc']:.3f} "
                      f"norm {rec['metrics']['norm_acc']:.3f} | zero-shot {rec['zero_shot_mean_acc']:.3f} "
                      f"(norm {rec['zero_shot_mean_norm']:.3f}) ft {rec['finetuned_mean_acc']:.3f} "
                      f"[{rec['seconds']:.0f} s]")
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
