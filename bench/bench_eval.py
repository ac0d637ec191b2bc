"""How fast the book evaluates a merged model, against what this CPU can compute.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_eval.py            # everything, 1 thread
    PYTHONPATH=$PWD .venv/bin/python bench/bench_eval.py --parts lite0 minilm gemm
    PYTHONPATH=$PWD .venv/bin/python bench/bench_eval.py --parts options --no-compile

Parts (one run writes one ``run`` id on every record, so ratios come from one run):

- ``lite0``: examples/s of :func:`pactlib.eval.evaluate` (Lite0 backbone θ0 + frozen heads,
  resolution 32, batch 256) on the validation images of ``--lite0-suite`` (``--per-task`` each),
  and FLOPs per example (``torch.utils.flop_counter.FlopCounterMode``).
- ``minilm``: examples/s of the MiniLM testbed's ``evaluate`` path (``build_encoder`` +
  ``encode``, max_tokens 32, batch 128) on real validation texts of ``--minilm-suite``, and FLOPs
  per example (attention included; the length of each batch is the longest text in it).
- ``gemm``: single-thread ``torch.mm`` FLOP/s at square and model-shaped sizes; the best of them is
  the rate each evaluation's efficiency (achieved FLOP/s / GEMM FLOP/s) is taken against.
- ``options``: exact rewrites of the Lite0 evaluation, side by side with the baseline in the same
  run: channels_last off, conv+BN folding (``torch.nn.utils.fusion.fuse_conv_bn_eval``), folding
  without channels_last, ``torch.jit`` trace + ``freeze`` + ``optimize_for_inference``, and
  ``torch.compile`` (skipped with ``--no-compile``). Each reports examples/s, its one-off set-up
  seconds (paid again for every α, since each α loads new weights), max |Δ features| and
  max |Δ logits| against the baseline, and whether every argmax is equal. One batch of all
  examples and bfloat16 autocast (not exact: issue 27 allows it only with a shown agreement)
  are listed for comparison.

Records go to ``book/data/eval_speed.jsonl`` (appended; each carries machine, torch, threads and
the 1-minute load average). Each timing is the best of ``--repeats`` passes after a warm-up, in wall
seconds and in CPU seconds of the timing thread; rates per CPU second (``*_per_cpu_s``) are the
ones to use on a loaded machine, where ``cpu_over_wall`` < 1 says the process waited for a core.

Data are read from ``$PACT_CACHE`` (the prepared task files, the zoo's heads) and never written.
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import platform
import time
from pathlib import Path

import torch

from pactlib.book import records

PARTS = ("lite0", "gemm", "minilm", "options")
OUT = "book/data/eval_speed.jsonl"


def _common(args) -> dict:
    return dict(run=args.run, threads=torch.get_num_threads(), torch=torch.__version__.split("+")[0],
                machine=platform.machine(), cpu=platform.processor() or _cpu_name(), cpus=os.cpu_count(),
                load_avg=round(os.getloadavg()[0], 2))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _time(fn, repeats: int) -> tuple[float, float, float]:
    """(best wall seconds, best CPU seconds of this thread, CPU/wall of the best wall pass) of ``fn()``
    over ``repeats`` passes after one warm-up. On a loaded machine the CPU seconds are the better
    measure of the work (the wall clock also counts the time spent waiting for a core)."""
    fn()
    best, cpu, ratio = float("inf"), float("inf"), 1.0
    for _ in range(repeats):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        cpu = min(cpu, dc)
        if dt < best:
            best, ratio = dt, dc / dt
    return best, cpu, ratio


def _flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def _throughput(args, testbed: str, params: dict, n: int, timing: tuple[float, float, float], flops: int,
                **extra) -> dict:
    """The ``eval_throughput`` record of ``n`` examples evaluated in ``timing`` (:func:`_time`) at
    ``flops`` in all; ``extra`` metrics go after the example rates."""
    dt, cpu, ratio = timing
    return records.make_record("eval_throughput", params=dict(testbed=testbed, **params), seed=None, part=testbed,
                               metrics=dict(examples=n, seconds=dt, cpu_seconds=cpu, examples_per_s=n / dt,
                                            examples_per_cpu_s=n / cpu, **extra, flops_per_example=flops / n,
                                            flops_per_s=flops / dt, flops_per_cpu_s=flops / cpu,
                                            cpu_over_wall=ratio), **_common(args))


# ------------------------------------------------------------------------------------ Lite0
def _lite0_setup(args):
    from pactlib.data.store import load_task
    from pactlib.data.suites import SUITES
    from pactlib.models.efficientnet import backbone_state_dict
    from pactlib.paths import cache_dir
    from pactlib.testbeds.lite0.heads import load_head

    tasks = SUITES[args.lite0_suite]
    datas = {t: load_task(t, "val", limit=args.per_task) for t in tasks}
    heads = {t: load_head(cache_dir() / "zoo" / "heads" / f"{t}.safetensors") for t in tasks}
    return backbone_state_dict(), heads, datas


def part_lite0(args, ctx) -> list[dict]:
    from pactlib import eval as ev

    sd, heads, datas = ctx["lite0"]
    n = sum(len(d.labels) for d in datas.values())
    fn = lambda: ev.evaluate(sd, heads, datas, resolution=32, batch_size=256)  # noqa: E731
    dt, cpu, ratio = _time(fn, args.repeats)
    flops = _flops(fn)
    ctx["lite0_flops"] = flops / n
    print(f"lite0 evaluate: {n} examples in {dt:.2f}s = {n / dt:.0f} ex/s, {flops / n / 1e6:.1f} MFLOP/ex, "
          f"{flops / dt / 1e9:.2f} GFLOP/s (cpu/wall {ratio:.2f})")
    return [_throughput(args, "lite0", dict(resolution=32, batch=256, suite=args.lite0_suite, per_task=args.per_task),
                        n, (dt, cpu, ratio), flops)]


# ------------------------------------------------------------------------------------ MiniLM
def part_minilm(args, ctx) -> list[dict]:
    from pactlib.data.text import TEXT_SUITES, load_text_task
    from pactlib.testbeds.minilm.model import build_encoder, encode, load_pretrained, load_tokenizer, tokenize

    sd, cfg = load_pretrained()
    model = build_encoder(cfg, sd)
    tok = load_tokenizer()
    texts = [t for name in TEXT_SUITES[args.minilm_suite]
             for t in load_text_task(name, "val", limit=args.per_task).texts]
    x = tokenize(tok, texts, 32)
    n = x.shape[0]
    mean_tokens = float(x[:, 1].sum(1).float().mean())

    def fn():  # MiniLMTestbed.evaluate: a fresh encoder from the state dict, then encode
        with torch.no_grad():
            encode(build_encoder(cfg, sd), x, 128)

    dt, cpu, ratio = _time(fn, args.repeats)
    with torch.no_grad():
        flops = _flops(lambda: encode(model, x, 128))
    print(f"minilm evaluate: {n} texts (mean {mean_tokens:.1f} tokens) in {dt:.2f}s = {n / dt:.0f} ex/s, "
          f"{flops / n / 1e6:.1f} MFLOP/ex, {flops / dt / 1e9:.2f} GFLOP/s (cpu/wall {ratio:.2f})")
    return [_throughput(args, "minilm", dict(max_tokens=32, batch=128, suite=args.minilm_suite, per_task=args.per_task),
                        n, (dt, cpu, ratio), flops, mean_tokens=mean_tokens)]


# ------------------------------------------------------------------------------------ GEMM
#: (m, k, n): square sizes, then Lite0-shaped (256 images, late 2x2 maps: 1024 rows; head 1x1 conv)
#: and MiniLM-shaped (128 texts x 19 tokens = 2432 rows; attention projections, feed-forward).
GEMM_SIZES = ((512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
              (1024, 320, 1280), (2432, 384, 384), (2432, 384, 1536), (2432, 1536, 384))


def part_gemm(args, ctx) -> list[dict]:
    out = []
    for m, k, n in GEMM_SIZES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        reps = max(1, int(2e9 // (2 * m * k * n)))
        dt, cpu, ratio = _time(lambda: [torch.mm(a, b) for _ in range(reps)], args.repeats)
        rate, rate_cpu = 2 * m * k * n * reps / dt, 2 * m * k * n * reps / cpu
        print(f"gemm {m}x{k}x{n}: {rate / 1e9:.1f} GFLOP/s, {rate_cpu / 1e9:.1f} per CPU second (cpu/wall {ratio:.2f})")
        out.append(records.make_record("gemm", params=dict(m=m, k=k, n=n), seed=None, part="gemm",
                                       metrics=dict(flops_per_s=rate, flops_per_cpu_s=rate_cpu, cpu_over_wall=ratio),
                                       **_common(args)))
    return out


# ------------------------------------------------------------------------------------ options
def part_options(args, ctx) -> list[dict]:
    from pactlib import eval as ev
    from pactlib.models.efficientnet import backbone_for

    sd, heads, datas = ctx["lite0"]
    x = torch.cat([ev._inputs(d, 32, None)[0] for d in datas.values()])
    n = x.shape[0]
    xcl = x.contiguous(memory_format=torch.channels_last)

    def run(model, inp, bs=256):
        with torch.no_grad():
            return torch.cat([model(inp[i:i + bs]) for i in range(0, n, bs)])

    def build(channels_last=True, fold=False):
        m = backbone_for(32)
        m.load_state_dict(sd, strict=True)
        m = copy.deepcopy(m)
        if fold:
            m = ev.fold_batchnorm(m)
        return m.to(memory_format=torch.channels_last) if channels_last else m.to(memory_format=torch.contiguous_format)

    def jit(channels_last=True):
        m = build(channels_last)
        with torch.no_grad():
            t = torch.jit.trace(m, (xcl if channels_last else x)[:256])
            return torch.jit.optimize_for_inference(torch.jit.freeze(t.eval()))

    class BF16(torch.nn.Module):  # not exact: allowed by issue 27 only where the book shows agreement
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, inp):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.m(inp).float()

    def compiled():
        m = build(True)
        c = torch.compile(m, dynamic=False)
        run(c, xcl)  # compiles (every batch size once)
        return c

    options = [("baseline: unfolded, channels_last (eval.py before folding)", lambda: build(True), xcl, 256),
               ("contiguous (channels_last off)", lambda: build(False), x, 256),
               ("fold conv+BN, channels_last", lambda: build(True, True), xcl, 256),
               ("fold conv+BN, contiguous", lambda: build(False, True), x, 256),
               ("baseline, one batch of all", lambda: build(True), xcl, n),
               ("jit freeze + optimize_for_inference, channels_last", lambda: jit(True), xcl, 256),
               ("jit freeze + optimize_for_inference, contiguous", lambda: jit(False), x, 256),
               ("bfloat16 autocast, channels_last (not exact)", lambda: BF16(build(True)), xcl, 256)]
    if not args.no_compile:
        options.append(("torch.compile (inductor), channels_last", compiled, xcl, 256))
    if args.options:  # the baseline always runs first: every ratio is against it, in this run
        options = options[:1] + [o for o in options[1:] if any(k in o[0] for k in args.options)]
    ref = None
    out = []
    for name, make, inp, bs in options:
        try:
            t0 = time.perf_counter()
            model = make()
            setup = time.perf_counter() - t0
            feats = run(model, inp, bs)
            dt, cpu, ratio = _time(lambda: run(model, inp, bs), args.repeats)
        except Exception as err:  # an option that does not work here is reported, not fatal
            print(f"{name}: failed ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
            out.append(records.make_record("eval_option", params=dict(option=name, batch=bs), seed=None,
                                           part="options", metrics={}, error=f"{type(err).__name__}: {err}"[:500],
                                           **_common(args)))
            continue
        if ref is None:
            ref, base_dt, base_cpu = feats, dt, cpu
        d_feat = float((feats - ref).abs().max())
        d_logit, same = 0.0, True
        start = 0
        for t, d in datas.items():
            k = len(d.labels)
            la, lb = heads[t].logits(ref[start:start + k]), heads[t].logits(feats[start:start + k])
            d_logit = max(d_logit, float((la - lb).abs().max()))
            same = same and bool((la.argmax(1) == lb.argmax(1)).all())
            start += k
        print(f"{name}: {n / dt:.0f} ex/s (x{base_dt / dt:.2f}; per CPU second x{base_cpu / cpu:.2f}), set-up {setup:.2f}s, max|Δfeat| {d_feat:.2e}, "
              f"max|Δlogit| {d_logit:.2e}, argmax equal {same} (cpu/wall {ratio:.2f})")
        out.append(records.make_record("eval_option", params=dict(option=name, batch=bs), seed=None, part="options",
                                       metrics=dict(examples=n, seconds=dt, cpu_seconds=cpu, examples_per_s=n / dt,
                                                    examples_per_cpu_s=n / cpu, speedup=base_dt / dt,
                                                    speedup_cpu=base_cpu / cpu, setup_seconds=setup,
                                                    max_abs_dfeature=d_feat, max_abs_dlogit=d_logit,
                                                    argmax_equal=int(same), cpu_over_wall=ratio),
                                       **_common(args)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-task", type=int, default=100, help="validation examples per task (the book's val_limit)")
    p.add_argument("--lite0-suite", default="8")
    p.add_argument("--minilm-suite", default="8")
    p.add_argument("--no-compile", action="store_true", help="options: skip torch.compile")
    p.add_argument("--options", nargs="+", default=None,
                   help="options: only those whose name contains one of these words (and the baseline)")
    p.add_argument("--out", default=OUT)
    p.add_argument("--dry", action="store_true", help="print, write nothing")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.run = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ctx: dict = {}
    if {"lite0", "options"} & set(args.parts):
        ctx["lite0"] = _lite0_setup(args)
    recs = []
    for part in PARTS:
        if part in args.parts:
            recs += globals()[f"part_{part}"](args, ctx)
    gemm = [r["metrics"]["flops_per_cpu_s"] for r in recs if r["method"] == "gemm"]
    if gemm:
        for r in recs:
            if r["method"] == "eval_throughput":
                r["metrics"]["efficiency"] = r["metrics"]["flops_per_cpu_s"] / max(gemm)
                print(f"{r['params']['testbed']}: efficiency {r['metrics']['efficiency']:.1%} of the best GEMM "
                      f"({max(gemm) / 1e9:.1f} GFLOP per CPU second)")
    if not args.dry:
        records.write_records(args.out, recs)
        print(f"wrote {len(recs)} records to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
