"""Benchmark: the in-memory API against the plain-torch expression of the same merge.

On the same state dicts (θ0 and T fine-tuned checkpoints of ``--matrices`` float32 matrices of
``--shape``, Llama MLP-shaped by default), it times, alternated ``--repeat`` times, wall clock:

- ``merge``: ``pactlib.merge(method, θ0, fine-tuned, alpha=α)`` (checks included);
- ``merged_update``: ``pactlib.merged_update(method, θ0, task vectors)`` on task vectors built
  before the clock starts;
- ``plain``: the same merge written in plain torch, with no checks: Task Arithmetic
  θ0 + α·Σt(θt − θ0) (the sum in task order); TIES with ``scope="global"``: each task's top k%
  |Δt| over the whole task vector (one ``topk`` of the concatenated deltas), sign election, disjoint
  mean, θ0 + α·D. For ``merged_update`` the plain reference starts from the task vectors too.

and checks that the results are equal bit for bit (the plain TIES keeps the entries tied at the
threshold by position, as pactlib does, so that the two may be compared bit for bit). Each
record (one per method and T) holds the best time of each and the ratios; they are appended to
``book/data/inmemory_speed.jsonl``.

    PYTHONPATH=. .venv/bin/python bench/bench_inmemory.py [--tasks 8] [--matrices 12]
        [--shape 1024 2816] [--repeat 3] [--threads 1] [--out book/data/inmemory_speed.jsonl]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

import pactlib
from pactlib.matrix import MatrixRule

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from sink import Sink  # noqa: E402  (the JSON-lines records, as every bench script writes them)


def state_dicts(matrices: int, shape: tuple[int, int], T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pre = {f"layers.{i}.mlp.weight": torch.randn(shape, generator=g) for i in range(matrices)}
    fts = [{k: v + 0.01 * torch.randn(shape, generator=g) for k, v in pre.items()} for _ in range(T)]
    return pre, fts


def plain_task_arithmetic(pre, fts, alpha):
    out = {}
    for k, p in pre.items():
        s = fts[0][k] - p
        for ft in fts[1:]:
            s += ft[k] - p
        out[k] = p + alpha * s
    return out


def plain_ta_update(tvs):
    out = {}
    for k in tvs[0]:
        s = tvs[0][k].clone()
        for tv in tvs[1:]:
            s += tv[k]
        out[k] = s
    return out


def plain_ties_update(tvs, k):
    keys = list(tvs[0].keys())
    trimmed = []
    for tv in tvs:
        flat = torch.cat([tv[key].reshape(-1) for key in keys])
        a = flat.abs()
        keep = max(1, int(-(-k * flat.numel() // 100)))
        v = torch.topk(a, keep, sorted=False).values.min()  # the keep-th largest |Δ|
        mask = a > v
        ties = torch.nonzero(a == v).reshape(-1)[: keep - int(mask.sum())]  # ties kept by position
        mask[ties] = True
        trimmed.append(flat * mask)
    st = torch.stack(trimmed)
    elected = torch.sign(st.sum(0))
    agree = (torch.sign(st) == elected) & (st != 0)
    count = agree.sum(0)
    total = torch.where(agree, st, torch.zeros_like(st)).sum(0)
    D = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
    out, off = {}, 0
    for key in keys:
        n = tvs[0][key].numel()
        out[key] = D[off:off + n].reshape(tvs[0][key].shape)
        off += n
    return out


def plain_ties(pre, fts, alpha, k):
    tvs = [{key: ft[key] - p for key, p in pre.items()} for ft in fts]
    D = plain_ties_update(tvs, k)
    return {key: p + alpha * D[key] for key, p in pre.items()}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[8])
    ap.add_argument("--matrices", type=int, default=12)
    ap.add_argument("--shape", type=int, nargs=2, default=[1024, 2816])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--k", type=float, default=20.0)
    ap.add_argument("--methods", nargs="+", default=["task_arithmetic", "ties"])
    ap.add_argument("--out", default=str(ROOT / "book/data/inmemory_speed.jsonl"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rule = MatrixRule()
    records = []
    for T in args.tasks:
        pre, fts = state_dicts(args.matrices, tuple(args.shape), T)
        tvs = pactlib.task_vectors_from(pre, fts)
        for method in args.methods:
            params = {"k": args.k} if method == "ties" else {}
            runs = {
                "merge": lambda: pactlib.merge(method, pre, fts, alpha=args.alpha, rule=rule, **params),
                "merged_update": lambda: pactlib.merged_update(method, pre, tvs, rule=rule, **params)[0].to_dict(),
                "plain_merge": (lambda: plain_task_arithmetic(pre, fts, args.alpha)) if method == "task_arithmetic"
                else (lambda: plain_ties(pre, fts, args.alpha, args.k)),
                "plain_update": (lambda: plain_ta_update(tvs)) if method == "task_arithmetic"
                else (lambda: plain_ties_update(tvs, args.k)),
            }
            best = {name: float("inf") for name in runs}
            outs = {}
            for _ in range(args.repeat):  # alternated, so that a busy moment hits every variant alike
                for name, fn in runs.items():
                    dt, outs[name] = timed(fn)
                    best[name] = min(best[name], dt)
            rec = {"bench": "inmemory", "method": method, "tasks": T, "matrices": args.matrices,
                   "shape": list(args.shape), "dtype": "float32", "threads": args.threads, "repeat": args.repeat,
                   "alpha": args.alpha, **({"k": args.k} if params else {}),
                   "seconds": {n: round(v, 4) for n, v in best.items()},
                   "ratio_merge": round(best["merge"] / best["plain_merge"], 3),
                   "ratio_merged_update": round(best["merged_update"] / best["plain_update"], 3),
                   "identical_merge": equal(outs["merge"], outs["plain_merge"]),
                   "identical_update": equal(outs["merged_update"], outs["plain_update"]),
                   "torch": torch.__version__, "machine": platform.machine(), "pactlib": pactlib.__version__}
            print(json.dumps(rec))
            records.append(rec)
            del outs
    with Sink(args.out, append=True, echo=False, mkdir=False) as sink:  # all at the end, each printed above
        for rec in records:
            sink.emit(rec)


if __name__ == "__main__":
    main()
