"""Enough test data to decide? The 95 % interval of chapter 5's PACT gains against test examples per task.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_test_size.py                 # Lite0, 8 tasks, seeds 0-2
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_test_size.py --testbed minilm-8
    PYTHONPATH=$PWD .venv/bin/python bench/bench_test_size.py --analyze-only        # the curve from the stored outcomes
    PYTHONPATH=$PWD .venv/bin/python bench/bench_test_size.py --book-records /other/book/records/default --analyze-only

Chapter 5 scores every merge on the first ``test_limit`` test examples of each task (Lite0: 300,
MiniLM: 150; its provenance says which), and the 95 % interval of a PACT gain
(:func:`pactlib.book.intervals.contrast`: a paired bootstrap over the test examples plus the
spread over seeds) is as wide as those examples allow. How wide would it be with more?

"The whole split" is the test split the data layer prepares (``pactlib.data``: at most
``DEFAULT_MAX_TEST`` = 1,000 images per Lite0 task, optdigits 359; 500 texts per MiniLM task);
some raw sources hold more (the official MNIST and Fashion-MNIST test sets), but a larger split
means rebuilding the data files, which reorders the split (its first n would in general not be
chapter 5's).

For each seed of ``--seeds`` this loads ``--testbed`` with no test cap (``--cap N``: at most N
per task) and, for every merge chapter 5 recorded on that suite and seed (the five base methods,
plain and PACT), rebuilds it at the α chapter 5 chose (read from its records, with its PACT
options) through chapter 5's own function, :func:`pactlib.testbeds.run`, with that one α (no
widening, no memo), so the merge, the PACT filter and the evaluation are the chapter's code. The
records keep each test example's outcome (``outcomes``, packed as the chapters pack them) on
the whole split, beside the fine-tuned and zero-shot references
(:func:`pactlib.testbeds.reference_records`). Each merge record says how its first
``test_limit`` outcomes agree with chapter 5's (``chapter_agreement``: examples that differ
when the chapter kept outcomes, largest |Δ acc:<task>|, the validation score's difference).

Then, for n in ``--sizes`` (default: a grid from test_limit / 3 to the full split), every record
is cut to its first n examples per task (what ``test_limit = n`` evaluates: the stored order
interleaves classes, and a task with fewer examples keeps them all) and the fine-tuned
accuracy on the same n examples is the normalizer; ``contrast`` gives the interval of PACT-M − M
per base method M, and of the mean over the base methods (C7's quantity), in normalized and
absolute accuracy. The seed part of the interval does not shrink with n, so each record also
gives the half-width from the test examples alone (1.96 · SE_examples).

The cost: the wall seconds and the CPU seconds of this thread per evaluated test example (one
torch thread), and, for each n of the curve, the test examples the whole book would evaluate if
every chapter's ``test_limit`` were raised to n: counted from the records of each chapter of
``--book-records`` (the outcomes each record keeps, else its per-task test accuracies; records
read back from the run memo left out), each capped task raised to min(n, its split).

Records go to ``--out`` (``book/data/test_size.jsonl``): the records of the testbed run replace
that testbed's earlier ones, the others are kept. ``bench`` = ``test_size`` on every record;
``part``: ``merge`` / ``reference`` (outcomes), ``timing``, ``half_width``, ``book_cost``.
Data are read from ``$PACT_CACHE``; the zoo is never built (the testbed's eval memo gains the
references' full-split accuracies).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import NormalDist

import torch

from pactlib.book import intervals, records
from pactlib.outcomes import outcomes_of, pack

OUT = "book/data/test_size.jsonl"
CHAPTER = "05_main_results"
#: the record-store run (params/default.yaml variants) that holds chapter 5 of each testbed family
RUNS = {"lite0": "main", "minilm": "minilm"}
#: the half-width the issue asks about (points)
TARGET = 0.5
#: the normal 97.5 % quantile: the half-width of the test examples' part alone is Z95 · SE_examples
Z95 = NormalDist().inv_cdf(0.975)


def _common(args) -> dict:
    return dict(bench="test_size", run=args.run, threads=torch.get_num_threads(), torch=torch.__version__.split("+")[0],
                machine=platform.machine(), cpus=os.cpu_count(), load_avg=round(os.getloadavg()[0], 2))


def chapter_records(path: Path, suite: str, seeds: Sequence[int]) -> list[dict]:
    """Chapter 5's records of ``suite`` on ``seeds``."""
    return [r for r in records.read_records(path) if r.get("suite") == suite and r["seed"] in seeds]


def chapter_params(path: Path) -> dict:
    """The parameters chapter 5 ran with (its provenance, beside its records)."""
    prov = records.read_json_object(path.parent / "provenance.json")
    if not prov or "params" not in prov:
        raise SystemExit(f"{path.parent}: no provenance.json with params")
    return prov["params"]


# ------------------------------------------------------------------------------------ evaluate
class _Timed:
    """Wraps ``tb.evaluate`` to add up wall and thread-CPU seconds and examples per split."""

    def __init__(self, tb):
        self.inner = tb.evaluate
        self.seconds = {split: [0.0, 0.0, 0] for split in ("val", "test")}  # wall, CPU, examples

    def __call__(self, state, split="test", tasks=None):
        c0, t0 = time.thread_time(), time.perf_counter()
        s = self.inner(state, split, tasks)
        acc = self.seconds[split]
        acc[0] += time.perf_counter() - t0
        acc[1] += time.thread_time() - c0
        acc[2] += sum(o.numel() for o in s.outcomes.values())
        return s


def _pact_options(rec: Mapping):
    from dataclasses import fields

    from pactlib.pact import PactOptions

    names = {f.name for f in fields(PactOptions)}
    return PactOptions(**{k: v for k, v in rec["params"].items() if k in names})


def agreement(full: Mapping, chapter: Mapping, limit: int) -> dict:
    """How the first ``limit`` test outcomes of ``full`` (a record on the whole split) agree with
    ``chapter``'s record at ``test_limit = limit``: examples compared and differing (None without
    chapter outcomes), the largest |acc:<task> difference| and the validation score's difference."""
    mine, theirs = outcomes_of(full), outcomes_of(chapter)
    tasks = list(mine)
    acc = [abs(int(mine[t][:limit].sum()) / len(mine[t][:limit]) - chapter["metrics"][f"acc:{t}"]) for t in tasks]
    out = {"max_abs_acc_diff": max(acc), "examples_compared": None, "examples_differ": None}
    if theirs:
        out["examples_compared"] = sum(len(theirs[t]) for t in tasks)
        out["examples_differ"] = int(sum(int((mine[t][:len(theirs[t])] != theirs[t]).sum()) for t in tasks))
    val = [c["mean_normalized"] for c in chapter.get("curve") or [] if c["alpha"] == chapter["alpha"]]
    out["val_norm_acc_diff"] = (full["metrics"]["val_norm_acc"] - val[0]) if val else None
    return out


def evaluate(args, chapter: list[dict], params: dict) -> list[dict]:
    """Merge records on the whole test split (``args.cap``), references and timing, per seed."""
    from pactlib import testbeds

    limit = int(params["test_limit"])
    out = []
    for seed in args.seeds:
        t_load = time.perf_counter()
        tb = testbeds.load(args.testbed, seed, build=False, val_limit=params["val_limit"], test_limit=args.cap)
        t_load = time.perf_counter() - t_load
        timed = _Timed(tb)
        tb.evaluate = timed
        sizes = {t: len(tb.test[t][1] if isinstance(tb.test[t], tuple) else tb.test[t].labels) for t in tb.tasks}
        print(f"{args.testbed} seed {seed}: loaded in {t_load:.0f} s; test examples per task {sizes}", flush=True)
        refs = testbeds.reference_records(tb, per_task=True)
        for r in refs:
            r.update(part="reference", test_limit=args.cap, chapter_test_limit=limit, **_common(args))
        out += refs
        merges = [r for r in chapter if r["seed"] == seed and r.get("base") in args.methods]
        for rec in sorted(merges, key=lambda r: (args.methods.index(r["base"]), r["pact"] is not None)):
            t0 = time.perf_counter()
            pact = rec["pact"]
            r = testbeds.run(tb, rec["base"], pact=pact, options=_pact_options(rec) if pact else None,
                             alphas=[rec["alpha"]], widen=0, memo=False)
            if r["method"] != rec["method"]:
                raise RuntimeError(f"rebuilt {r['method']!r} for chapter 5's {rec['method']!r}")
            r.update(part="merge", test_limit=args.cap, chapter_test_limit=limit,
                     chapter_agreement=agreement(r, rec, limit), **_common(args))
            out.append(r)
            a = r["chapter_agreement"]
            print(f"  {r['method']:22s} α={r['alpha']:<7g} norm {r['metrics']['norm_acc']:.4f} (full split); "
                  f"vs chapter 5 at {limit}: {a['examples_differ']} of {a['examples_compared']} outcomes differ, "
                  f"max |Δacc| {a['max_abs_acc_diff']:.4f}, Δval {a['val_norm_acc_diff']} "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
        for split, (wall, cpu, n) in timed.seconds.items():
            out.append(records.make_record(
                "eval_seconds", params=dict(testbed=args.testbed, split=split, cap=args.cap), seed=seed,
                part="timing", testbed=args.testbed,
                metrics=dict(examples=n, seconds=wall, cpu_seconds=cpu, seconds_per_example=wall / max(n, 1),
                             cpu_seconds_per_example=cpu / max(n, 1)), **_common(args)))
            print(f"  {split}: {n} examples in {wall:.1f} s wall, {cpu:.1f} s CPU = "
                  f"{1e3 * wall / max(n, 1):.3f} ms per example", flush=True)
    return out


# ------------------------------------------------------------------------------------ analyse
def prefix(rec: Mapping, n: int, finetuned: Mapping) -> dict:
    """``rec`` cut to its first ``n`` test outcomes per task, with ``acc:<t>`` and ``norm_acc:<t>``
    normalized by ``finetuned``'s accuracy on the same examples: the record ``test_limit = n`` gives."""
    mine, ft = outcomes_of(rec), outcomes_of(finetuned)
    metrics, packed = {}, {}
    for t, o in mine.items():
        o = o[:n]
        a, f = int(o.sum()) / len(o), int(ft[t][:n].sum()) / len(o)
        metrics[f"acc:{t}"], metrics[f"norm_acc:{t}"] = a, a / f
        packed[t] = pack(o)
    return {"method": rec["method"], "seed": rec["seed"], "testbed": rec["testbed"], "metrics": metrics,
            "outcomes": {"test": packed}}


def default_sizes(limit: int, largest: int) -> list[int]:
    grid = {limit // 3, limit // 2, limit, largest} | set(range(100, largest, 100))
    return sorted(n for n in grid if 0 < n <= largest)


def half_widths(args, recs: list[dict], limit: int) -> list[dict]:
    """``half_width`` records: the interval of PACT-M − M (each base method, and their mean) at
    each n of the curve, normalized and absolute accuracy."""
    merges = [r for r in recs if r.get("part") == "merge"]
    ft = {r["seed"]: r for r in recs if r.get("part") == "reference" and r["method"] == "fine-tuned"}
    largest = max(len(o) for r in merges for o in outcomes_of(r).values())
    sizes = args.sizes or default_sizes(limit, largest)
    bases = [m for m in args.methods if any(r["base"] == m for r in merges)]
    out = []
    for n in sizes:
        cut = [prefix(r, n, ft[r["seed"]]) for r in merges]
        for base in bases + ["mean"]:
            which = bases if base == "mean" else [base]
            plus = [c for c, r in zip(cut, merges) if r["base"] in which and r["pact"] == "pact"]
            minus = [c for c, r in zip(cut, merges) if r["base"] in which and r["pact"] is None]
            for metric in ("norm_acc", "acc"):
                iv = intervals.contrast(plus, minus, metric=metric)
                per_task = {t: len(o) for t, o in outcomes_of(plus[0]).items()}
                out.append(records.make_record(
                    "half_width", params=dict(testbed=args.testbed, base=base, metric=metric, n=n),
                    seed=None, part="half_width", testbed=args.testbed, base=base, n=n,
                    metrics=dict(iv.as_dict(), half_width=iv.half_width,
                                 half_width_examples=Z95 * iv.se_examples,
                                 examples=sum(per_task.values())),
                    seeds=sorted({c["seed"] for c in plus}), examples_per_task=per_task, **_common(args)))
    return out


def needed(args, curve: list[dict]) -> list[dict]:
    """``needed`` records, per base and metric: the smallest n of the curve whose half-width is at
    most :data:`TARGET` (None: none), and beyond the measured curve an extrapolation from the
    whole split: the test examples' SE shrinks as 1/√n, the seed part stays (its full-split value;
    with infinite test data the interval is q(t, S − 1 df) · SE_seeds, ``seed_floor``); the n at
    which the interval (:func:`pactlib.book.intervals._combine`) reaches the target, None when
    the seed floor is above it."""
    out = []
    for key in dict.fromkeys((r["base"], r["params"]["metric"]) for r in curve):
        rows = sorted((r for r in curve if (r["base"], r["params"]["metric"]) == key), key=lambda r: r["n"])
        first = next((r["n"] for r in rows if r["metrics"]["half_width"] <= TARGET), None)
        m, n_full = rows[-1]["metrics"], rows[-1]["n"]
        floor = intervals._combine(0.0, 0.0, m["se_seeds"], 0, m["n_seeds"]).half_width if m["se_seeds"] else 0.0
        n_ex = None
        if floor < TARGET:
            n_ex = n_full
            while n_ex < 10 ** 8:
                iv = intervals._combine(0.0, m["se_examples"] * (n_full / n_ex) ** 0.5, m["se_seeds"], n_ex, m["n_seeds"])
                if iv.half_width <= TARGET:
                    break
                n_ex = math.ceil(n_ex * 1.01)
            n_ex = int(math.ceil(n_ex / 50) * 50)  # a round number of examples per task
        out.append(records.make_record(
            "needed", params=dict(testbed=args.testbed, base=key[0], metric=key[1], target=TARGET), seed=None,
            part="needed", testbed=args.testbed, base=key[0],
            metrics=dict(n_measured=first, n_full=n_full, half_width_full=m["half_width"],
                         half_width_examples_full=m["half_width_examples"], se_examples_full=m["se_examples"],
                         se_seeds_full=m["se_seeds"], n_seeds=m["n_seeds"], seed_floor=floor,
                         n_extrapolated=first if first else n_ex), **_common(args)))
    return out


def _split_sizes(run: str, tasks) -> dict[str, int]:
    """Full test split size of each task (the prepared data files)."""
    if run == "minilm":
        from pactlib.data.text import load_text_task as load
    else:
        from pactlib.data import load_task as load
    return {t: len(load(t, "test").labels) for t in sorted(tasks)}


def _evaluated(rec: Mapping, limit: int | None, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """{task: test examples} a chapter record evaluated: its outcomes, else its per-task test accuracies."""
    p = (rec.get("outcomes") or {}).get("test") or {}
    if p:
        return {t: int(str(v).split(":")[0]) for t, v in p.items()}
    per = ((rec.get("per_task") or {}).get("test") or {}).get("acc") or {}
    return {t: min(limit, sizes[t]) if sizes else limit for t in per} if limit else {}


def _family(rec: Mapping, run: str) -> str:
    """The testbed family a chapter record was evaluated on (its ``testbed``, else its run's)."""
    tb = rec.get("testbed")
    if isinstance(tb, str) and "-" in tb:
        return tb.split("-", 1)[0]
    return next((f for f, r in RUNS.items() if r == run), run)


def book_cost(args, sizes_n: Sequence[int], seconds_per_example: float, cpu_per_example: float, *,
              larger_splits: bool = False) -> list[dict]:
    """``book_cost`` records: test examples the book's chapters evaluate on ``args.testbed``'s
    family now (n None) and at each n (every capped task raised to min(n, its split);
    ``larger_splits``: to n, as if every split held n examples, for an n beyond the prepared
    splits). Every run of ``--book-records`` counts (chapter 2 of the ``main`` run also evaluates
    MiniLM); a chapter's cap is its ``<family>_test_limit`` parameter, else its ``test_limit``."""
    family = args.testbed.split("-", 1)[0]
    chapters = []
    for folder in sorted(p for p in Path(args.book_records).glob("*/*") if p.is_dir()):
        params = (records.read_json_object(folder / "provenance.json") or {}).get("params") or {}
        limit = params.get(f"{family}_test_limit", params.get("test_limit"))
        recs = [r for f in sorted(folder.glob("*.jsonl")) if not f.name.endswith(".verdicts.jsonl")
                for r in records.read_records(f) if not r.get("memo_hit") and _family(r, folder.parent.name) == family]
        if limit and recs:
            chapters.append((f"{folder.parent.name}/{folder.name}", int(limit), recs))
    tasks = {t for _, limit, recs in chapters for r in recs for t in _evaluated(r, limit)}
    full = _split_sizes(RUNS[family], tasks)
    out = []
    for n in ([] if larger_splits else [None]) + list(sizes_n):
        total, now, per = 0, 0, {}
        for name, limit, recs in chapters:
            c_now = c_new = 0
            for r in recs:
                for t, c in _evaluated(r, limit, full).items():
                    capped = c == min(limit, full[t])
                    c_now += c
                    if capped and n is not None:
                        c_new += max(n, limit) if larger_splits else min(max(n, limit), full[t])
                    else:
                        c_new += c
            if c_now:
                per[name] = {"limit": limit, "examples_now": c_now, "examples": c_new}
            now, total = now + c_now, total + c_new
        out.append(records.make_record(
            "book_cost", params=dict(family=family, n=n, larger_splits=larger_splits), seed=None, part="book_cost",
            testbed=args.testbed, n=n,
            metrics=dict(examples_now=now, examples=total, extra_examples=total - now,
                         cpu_minutes=total * cpu_per_example / 60, extra_cpu_minutes=(total - now) * cpu_per_example / 60,
                         wall_minutes=total * seconds_per_example / 60),
            chapters=per, book_records=str(args.book_records), larger_splits=larger_splits, **_common(args)))
    return out


def report(args, recs: list[dict], limit: int) -> None:
    hw = [r for r in recs if r.get("part") == "half_width" and r["params"]["metric"] == "norm_acc"]
    need = {r["base"]: r["metrics"] for r in recs if r.get("part") == "needed" and r["params"]["metric"] == "norm_acc"}
    cost = {(r["n"], r["larger_splits"]): r["metrics"] for r in recs if r.get("part") == "book_cost"}
    sizes = sorted({r["n"] for r in hw})
    print(f"\n{args.testbed}: 95 % half-width of PACT-M − M, normalized accuracy (points), and in brackets "
          f"the test examples' part alone; n = test examples per task (chapter 5: {limit})")
    print("base".ljust(16) + "".join(f"{n:>13d}" for n in sizes))
    for base in dict.fromkeys(r["base"] for r in hw):
        row = {r["n"]: r["metrics"] for r in hw if r["base"] == base}
        print(f"{base:16s}" + "".join(f"{row[n]['half_width']:>6.2f} ({row[n]['half_width_examples']:.2f})" for n in sizes))
    print(f"\nn for a half-width ≤ {TARGET} (normalized): measured on the curve, else extrapolated from the whole split")
    for base, m in need.items():
        n = m["n_extrapolated"]
        how = (f"measured n = {m['n_measured']}" if m["n_measured"] else
               f"none measured; seed floor {m['seed_floor']:.2f} (SE_seeds {m['se_seeds_full']:.3f}, {m['n_seeds']} seeds)"
               + (f" > {TARGET}: no test size reaches it" if n is None else f"; extrapolated n ≈ {n:,}"))
        c = cost.get((n, n > m["n_full"])) if n else None
        print(f"  {base:16s} {how}" + (f"; book test evaluation {c['cpu_minutes']:.1f} CPU min "
                                         f"({c['extra_cpu_minutes']:+.1f})" if c else ""))
    now = cost.get((None, False))
    if now:
        print(f"book now: {now['examples']:,} test examples, {now['cpu_minutes']:.1f} CPU min of test evaluation")
    per_ex = now["cpu_minutes"] / now["examples"] if now and now["examples"] else 0.0
    chapters = {(r["n"], r["larger_splits"]): r["chapters"] for r in recs if r.get("part") == "book_cost"}
    for (n, larger), m in sorted(cost.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        if n is None:
            continue
        ch5 = chapters[n, larger].get(f"{args.run_name}/{CHAPTER}")
        print(f"book at test_limit ≥ {n}{' (splits of n assumed)' if larger else ''}: {m['examples']:,} test examples "
              f"({m['extra_examples']:+,}), {m['cpu_minutes']:.1f} CPU min ({m['extra_cpu_minutes']:+.1f})"
              + (f"; chapter 5: {ch5['examples']:,} ({ch5['examples_now']:,} now), {ch5['examples'] * per_ex:.1f} CPU min "
                 f"({ch5['examples_now'] * per_ex:.1f} now)" if ch5 else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--testbed", default="lite0-8", help="a chapter-5 suite: lite0-8 or minilm-8")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"])
    p.add_argument("--cap", type=int, default=None, help="test examples per task at most (default: the whole split)")
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="n of the half-width curve")
    p.add_argument("--chapter-records", default=None,
                   help=f"chapter 5's records (default book/records/default/<run>/{CHAPTER}/{CHAPTER}.jsonl)")
    p.add_argument("--book-records", default="book/records/default", help="the record store the book cost counts")
    p.add_argument("--analyze-only", action="store_true", help="the curve and cost from --out's outcomes")
    p.add_argument("--out", default=OUT)
    p.add_argument("--dry", action="store_true", help="print, write nothing")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    args.run = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    family, _, suite = args.testbed.partition("-")
    if family not in RUNS:
        p.error(f"--testbed: one of {', '.join(f + '-8' for f in RUNS)}")
    args.run_name = RUNS[family]
    path = Path(args.chapter_records or f"book/records/default/{args.run_name}/{CHAPTER}/{CHAPTER}.jsonl")
    params = chapter_params(path)
    limit = int(params["test_limit"])
    out = Path(args.out)
    if args.analyze_only:
        recs = [r for r in records.read_records(out) if r.get("testbed") == args.testbed
                and r.get("part") in ("merge", "reference", "timing")] if out.exists() else []
        if not recs:
            p.error(f"{out} has no outcome records of {args.testbed}: run without --analyze-only first")
    else:
        recs = evaluate(args, chapter_records(path, suite, args.seeds), params)
        # as write_records stores them (keys sorted): the bootstrap sees the tasks in the stored order,
        # so the curve is the same whether computed now or from the file (--analyze-only), and at
        # n = test_limit it is chapter 5's interval exactly
        recs = [json.loads(json.dumps(r, sort_keys=True)) for r in recs]
    timing = [r["metrics"] for r in recs if r.get("part") == "timing" and r["params"]["split"] == "test"]
    sec = sum(m["seconds"] for m in timing) / sum(m["examples"] for m in timing)
    cpu = sum(m["cpu_seconds"] for m in timing) / sum(m["examples"] for m in timing)
    curve = half_widths(args, recs, limit)
    need = needed(args, curve)
    recs += curve + need
    extrapolated = sorted({r["metrics"]["n_extrapolated"] for r in need} - {None})
    recs += book_cost(args, sorted({r["n"] for r in curve}), sec, cpu)
    recs += book_cost(args, extrapolated, sec, cpu, larger_splits=True)
    report(args, recs, limit)
    print(f"test evaluation: {1e3 * sec:.3f} ms wall, {1e3 * cpu:.3f} ms CPU per example (1 thread)")
    if not args.dry:
        kept = [r for r in records.read_records(out) if r.get("testbed") != args.testbed] if out.exists() else []
        records.write_records(out, kept + recs, replace=True)
        print(f"wrote {len(recs)} records of {args.testbed} to {out} ({out.stat().st_size / 1e6:.2f} MB in all)")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
