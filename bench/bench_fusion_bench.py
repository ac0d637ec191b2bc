r"""Benchmark: pactlib's in-memory merges beside fusion_bench's implementations, on the same inputs.

fusion_bench is never a dependency of pactlib: install it into a virtual environment of its own,
outside this repository, and name that environment's python (``--python``, or
``$FUSION_BENCH_PYTHON``):

    python3 -m venv ~/fb-venv
    ~/fb-venv/bin/pip install fusion-bench==0.2.33 torch==<the version in .venv>
    FUSION_BENCH_PYTHON=~/fb-venv/bin/python PYTHONPATH=. .venv/bin/python bench/bench_fusion_bench.py

Without it the script says so and writes nothing. fusion_bench runs in a child process of that
python, which never shares an import with this one: the inputs reach it as safetensors files in a
temporary folder, it loads them once, and then runs one merge per request of this process, so that
the two tools alternate (pactlib first on even repeats, fusion_bench first on odd ones) with their
state dicts already in memory. Only the merge is measured (wall clock and process CPU time, best
of ``--repeat``; the fewest minor page faults of a run), never process start or file I/O. Both
processes run torch with ``--threads`` threads (default 1). The inputs
(``bench_inmemory.state_dicts``, seed ``--seed``): θ0 of float32 matrices and T = ``--tasks``
fine-tunes θ0 + 0.01·noise; ``--matrices`` × ``--shape`` (Llama MLP-shaped) for Task Arithmetic and
TIES, ``--svd-matrices`` × ``--svd-shape`` for the SVD methods.

Each side runs the merge from θ0 and the fine-tuned state dicts to the merged state dict:

- pactlib: ``pactlib.merge(method, θ0, fine-tuned, alpha=α, **params)`` (checks included); TIES with
  ``k`` and ``scope="global"``; TSV-M, Iso-C and Iso-CTS with ``null_space="literal"`` (the
  reference code's convention; on full-rank layers ``"drop"`` gives the same D), Iso-CTS with
  ``common_frac`` = ``--common-frac``.
- fusion_bench: the calls its algorithm's ``run`` makes once the model pool has given the state
  dicts: Task Arithmetic ``state_dict_sub`` / ``state_dict_add`` / ``state_dict_mul``
  (``TaskArithmeticAlgorithm``); TIES ``state_dict_to_vector``, ``ties_merging(…, reset_thresh=k/100,
  merge_func="mean")``, ``vector_to_state_dict`` (``TiesMergingAlgorithm``); TSV-M
  ``compute_and_sum_svd_mem_reduction`` (``TaskSingularVectorMerging`` with a float α); Iso-C and
  Iso-CTS ``iso_c`` / ``iso_cts(…, common_space_fraction)`` (``ISO_C_Merge``, ``ISO_CTS_Merge``);
  θ0 + α·D with ``state_dict_add`` and ``state_dict_mul``; all on the CPU.

Per method: the best seconds of each side (``runs``: every repeat's), the ratio pactlib /
fusion_bench, and from the last repeat's outputs max |pactlib − fusion_bench| over all entries,
how many entries differ, whether the two are bit-identical, and max |θ_pactlib − θ0| for scale;
``note`` says where the two definitions differ. The load average is recorded at the start and the
end of the run and around each method (the ratio within one run is what counts on a busy machine).

    PYTHONPATH=. .venv/bin/python bench/bench_fusion_bench.py --python ~/fb-venv/bin/python
        [--tasks 8] [--matrices 12] [--shape 1024 2816] [--svd-matrices 4] [--svd-shape 512 1408]
        [--methods task_arithmetic ties tsv_m iso_c iso_cts] [--repeat 3] [--threads 1]
        [--out book/data/fusion_bench_side_by_side.jsonl] [--append]

Records (``--out``; ``--append`` adds to it): one ``setup`` line (machine, versions of both sides,
pactlib's commit, load average), one ``compare`` line per method, one ``end`` line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from sink import Sink  # noqa: E402  (the JSON-lines records, as every bench script writes them)

METHODS = ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")
SVD_METHODS = ("tsv_m", "iso_c", "iso_cts")

#: The fusion_bench side: a child that loads state dicts and merges on request (one JSON line each).
CHILD = r"""
import json, os, resource, sys, time
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # fusion_bench prints its progress: keep stdout for the replies
a = json.loads(sys.argv[1])
import torch
torch.set_num_threads(a["threads"])
from safetensors.torch import load_file, save_file
from fusion_bench.utils.state_dict_arithmetic import state_dict_add, state_dict_mul, state_dict_sub
from fusion_bench.method.ties_merging.ties_merging_utils import (state_dict_to_vector, ties_merging,
                                                                 topk_values_mask, vector_to_state_dict)
from fusion_bench.method.task_singular_vector.utils.TSVM_utils import compute_and_sum_svd_mem_reduction
from fusion_bench.method.isotropic_merging.iso_utils import check_parameterNamesMatch, iso_c, iso_cts


def task_vectors(pre, fts):
    return [state_dict_sub(ft, pre) for ft in fts]


def task_arithmetic(pre, fts, alpha):  # TaskArithmeticAlgorithm.run
    tv = None
    for ft in fts:
        d = state_dict_sub(ft, pre)
        tv = d if tv is None else state_dict_add(tv, d)
    tv = state_dict_mul(tv, alpha, keep_dtype_when_zero=True)
    return state_dict_add(pre, tv)


def ties(pre, fts, alpha, k):  # TiesMergingAlgorithm.run, merge_func="mean"
    flat_ft = torch.vstack([state_dict_to_vector(ft, []) for ft in fts])
    flat_ptm = state_dict_to_vector(pre, [])
    merged_tv = ties_merging(flat_ft - flat_ptm, reset_thresh=k / 100, merge_func="mean")
    return vector_to_state_dict(flat_ptm + alpha * merged_tv, pre, remove_keys=[])


def tsv_m(pre, fts, alpha):  # TaskSingularVectorMerging.run, a float alpha
    D = compute_and_sum_svd_mem_reduction(task_vectors(pre, fts), exclude_keys=[], accelerator="cpu")
    return state_dict_add(state_dict_mul(D, alpha), pre)


def iso_c_merge(pre, fts, alpha):  # ISO_C_Merge.run
    tvs = task_vectors(pre, fts)
    check_parameterNamesMatch(tvs)
    return state_dict_add(pre, state_dict_mul(iso_c(tvs, accelerator="cpu", exclude_keys=None), alpha))


def iso_cts_merge(pre, fts, alpha, common_frac):  # ISO_CTS_Merge.run
    tvs = task_vectors(pre, fts)
    check_parameterNamesMatch(tvs)
    D = iso_cts(tvs, common_space_fraction=common_frac, accelerator="cpu", exclude_keys=None)
    return state_dict_add(pre, state_dict_mul(D, alpha))


MERGES = {"task_arithmetic": task_arithmetic, "ties": ties, "tsv_m": tsv_m, "iso_c": iso_c_merge,
          "iso_cts": iso_cts_merge}
sets, last = {}, None
for line in sys.stdin:
    req = json.loads(line)
    op, rep = req["op"], {}
    if op == "load":
        sets[req["set"]] = (load_file(req["pre"]), [load_file(f) for f in req["finetuned"]])
    elif op == "drop":
        sets.pop(req["set"], None)
    elif op == "merge":
        pre, fts = sets[req["set"]]
        last = None
        with torch.no_grad():
            f0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
            last = MERGES[req["method"]](pre, fts, **req["params"])
            rep = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                   "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}
    elif op == "save":
        save_file({k: v.clone() for k, v in last.items()}, req["path"])  # TIES: views of one vector
        last = None
    elif op == "kept":  # TIES: entries each task keeps under fusion_bench's own trim
        pre, fts = sets[req["set"]]
        flat_ptm = state_dict_to_vector(pre, [])
        rep = {"kept": [int(topk_values_mask((state_dict_to_vector(ft, []) - flat_ptm)[None], K=req["k"] / 100,
                                             return_mask=True)[2].sum()) for ft in fts]}
    proto.write(json.dumps(rep) + "\n")
    proto.flush()
"""

NOTES = {
    "task_arithmetic": ("same definition: θ0 + α·Σt (θt − θ0), the deltas summed in task order; a few passes over "
                        "memory, so a side's time follows how many fresh pages the allocator maps during its merge "
                        "(minor_faults), which depends on the process's allocation history more than on the code"),
    "ties": ("both trim globally over each task vector (fusion_bench's ties_merging flattens it in sorted "
             "key order; pactlib scope='global'); fusion_bench keeps every entry with |Δ| ≥ its "
             "(d − ⌊k%·d⌋)-th smallest |Δ| (⌊k%·d⌋ + 1 entries plus any tied at the threshold), pactlib exactly "
             "⌈k%·d⌉ (ties by position): kept_per_task gives both counts; merge_func='mean' (the disjoint mean "
             "of the paper and of pactlib; fusion_bench's config default is 'sum'); a zero elected sign gets the "
             "majority sign in fusion_bench and keeps nothing in pactlib (the same unless trimmed entries cancel "
             "exactly)"),
    "tsv_m": ("same definition: r = ⌊d/T⌋ triplets per task (fusion_bench int(d·(1/T))), stacked, both factors "
              "polar-orthogonalised, D = U⊥ diag(S) V⊥ᵀ; pactlib null_space='literal' (its default 'drop' agrees on "
              "full-rank layers); α scales D (fusion_bench's float alpha)"),
    "iso_c": ("same definition: ΣΔt = U Σ Vᵀ, D = mean(Σ)·U Vᵀ; fusion_bench forms ΣΔt as (Σt Δt)/T·T "
              "(rounding), pactlib the sum in task order; pactlib null_space='literal'"),
    "iso_cts": ("same definition (common k = d − round((d − ⌊c·d⌋)/T)·T directions of ΣΔt, (d − k)/T per task from "
                "its residual, polar factors, flat spectrum); pactlib takes the SVD of ΣΔt and the residuals "
                "Δt − Uc(UcᵀΔt) in float64, fusion_bench in float32 with the m×m projector Uc Ucᵀ; the task blocks "
                "come before the common one in fusion_bench, after it in pactlib (the same D); pactlib "
                "null_space='literal'"),
}


def machine() -> dict:
    """The CPU model, core count and memory of this machine."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = next((int(line.split()[1]) // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), None) if Path("/proc/meminfo").exists() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_mb": mem, "os": platform.platform(),
            "machine": platform.machine()}


def versions(python: str, modules: list[str], env: dict) -> dict:
    """``{module: version}`` as ``python`` sees them (``None`` where it cannot), and its Python version."""
    code = ("import json, sys, importlib.metadata as m\nout = {'python': sys.version.split()[0]}\nfor n in %r:\n"
            "    try: out[n] = m.version(n)\n    except Exception: out[n] = None\nprint(json.dumps(out))" % modules)
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def minflt() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def load1() -> float:
    return round(os.getloadavg()[0], 2)


class Child:
    """The fusion_bench process: ``ask(op=…, …)`` sends one request and returns its reply.

    Raises:
        RuntimeError: the child exited or answered nothing (with the end of its stderr).
    """

    def __init__(self, python: str, args: dict, env: dict, log: Path):
        self.log = log
        self.err = open(log, "w")
        self.p = subprocess.Popen([python, "-c", CHILD, json.dumps(args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)

    def ask(self, **req) -> dict:
        try:
            self.p.stdin.write(json.dumps(req) + "\n")
            self.p.stdin.flush()
            line = self.p.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.err.flush()
            raise RuntimeError(f"the fusion_bench process stopped at {req['op']!r}: "
                               f"{self.log.read_text()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=60)
        self.err.close()


def compare(ours: dict, theirs: dict, pre: dict) -> dict:
    """Max |ours − theirs| over all entries, how many differ, bit-identity, max |ours − θ0|.

    Raises:
        RuntimeError: the two state dicts have different keys or shapes.
    """
    import torch

    if set(ours) != set(theirs) or any(ours[k].shape != theirs[k].shape for k in ours):
        raise RuntimeError("pactlib and fusion_bench returned different keys or shapes")
    diff = differing = update = 0.0
    for k, x in ours.items():
        d = (x.double() - theirs[k].double()).abs()
        diff = max(diff, float(d.max()))
        differing += int((d != 0).sum())
        update = max(update, float((x.double() - pre[k].double()).abs().max()))
    return {"identical": differing == 0 and all(ours[k].dtype == theirs[k].dtype for k in ours),
            "max_abs_diff": diff, "entries_differing": int(differing),
            "entries": sum(x.numel() for x in ours.values()), "max_abs_update": update,
            "max_diff_over_update": diff / update if update else None}


def positive(name: str):
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {s!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {v}")
        return v
    return conv


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=os.environ.get("FUSION_BENCH_PYTHON"),
                    help="python of fusion_bench's own virtual environment (default: $FUSION_BENCH_PYTHON)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--tasks", type=positive("--tasks"), default=8, help="T fine-tuned checkpoints")
    ap.add_argument("--matrices", type=positive("--matrices"), default=12)
    ap.add_argument("--shape", type=positive("--shape"), nargs=2, default=[1024, 2816], metavar=("M", "N"))
    ap.add_argument("--svd-matrices", type=positive("--svd-matrices"), default=4, help="matrices for the SVD methods")
    ap.add_argument("--svd-shape", type=positive("--svd-shape"), nargs=2, default=[512, 1408], metavar=("M", "N"))
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--k", type=float, default=20.0, help="TIES: percent kept per task (global trim)")
    ap.add_argument("--common-frac", type=float, default=0.8, help="Iso-CTS: common space fraction")
    ap.add_argument("--repeat", type=positive("--repeat"), default=3)
    ap.add_argument("--threads", type=positive("--threads"), default=1, help="torch threads of both sides")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "data" / "fusion_bench_side_by_side.jsonl")
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args(argv)
    if args.tasks < 2:
        ap.error(f"--tasks must be at least 2 to merge, got {args.tasks}")
    if not (0 < args.k <= 100):
        ap.error(f"--k must be in (0, 100], got {args.k}")
    if not (0 < args.common_frac <= 1):
        ap.error(f"--common-frac must be in (0, 1], got {args.common_frac}")
    if not (args.alpha == args.alpha and abs(args.alpha) != float("inf")):
        ap.error(f"--alpha must be a finite number, got {args.alpha}")
    if not args.python:
        print("fusion_bench not found: install it in its own virtual environment and give its python with "
              "--python or $FUSION_BENCH_PYTHON (see this script's docstring); nothing written", file=sys.stderr)
        return []
    if not Path(args.python).is_file():
        ap.error(f"--python {args.python}: no such file")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the child sees fusion_bench's environment only, never this repository
    theirs = versions(args.python, ["fusion-bench", "torch", "safetensors", "numpy"], env)
    if not theirs.get("fusion-bench"):
        ap.error(f"--python {args.python}: fusion-bench is not installed there")

    import torch
    from safetensors.torch import load_file, save_file

    import pactlib
    from bench_inmemory import state_dicts
    from pactlib.merges.ties import trim_count

    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "pactlib",
                                 ":!pactlib/book"], capture_output=True, text=True).stdout.strip())
    sink = Sink(args.out, append=args.append, head={"bench": "fusion_bench_side_by_side", "label": args.label},
                ensure_ascii=False)  # each record as it comes: an interrupted run keeps what it measured
    emit, records = sink.emit, sink.records

    work = Path(tempfile.mkdtemp(prefix="bench_fusion_bench-"))
    child = None
    try:
        emit({"kind": "setup", "methods": args.methods, "tasks": args.tasks, "matrices": args.matrices,
              "shape": list(args.shape), "svd_matrices": args.svd_matrices, "svd_shape": list(args.svd_shape),
              "dtype": "float32", "alpha": args.alpha, "k": args.k, "common_frac": args.common_frac,
              "repeat": args.repeat, "threads": args.threads, "seed": args.seed, "machine": machine(),
              "load_start": [round(x, 2) for x in os.getloadavg()],
              "pactlib": {"commit": commit, "pactlib_modified": dirty, "version": pactlib.__version__,
                          "python": platform.python_version(), "torch": torch.__version__},
              "fusion_bench": {"python_path": args.python, **theirs},
              "measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(["bench/bench_fusion_bench.py", *(argv if argv is not None else sys.argv[1:])])})
        child = Child(args.python, {"threads": args.threads}, env, work / "fusion_bench.log")
        groups = [("elementwise", args.matrices, tuple(args.shape),
                   [m for m in args.methods if m not in SVD_METHODS]),
                  ("svd", args.svd_matrices, tuple(args.svd_shape), [m for m in args.methods if m in SVD_METHODS])]
        for name, matrices, shape, methods in groups:
            if not methods:
                continue
            pre, fts = state_dicts(matrices, shape, args.tasks, args.seed)
            files = [work / f"{name}-{i}.safetensors" for i in range(args.tasks + 1)]
            for f, sd in zip(files, [pre] + fts):
                save_file(sd, str(f))
            child.ask(op="load", set=name, pre=str(files[0]), finetuned=[str(f) for f in files[1:]])
            for f in files:
                f.unlink()
            for method in methods:
                ours_params: dict = {"k": args.k, "scope": "global"} if method == "ties" else {}
                theirs_params: dict = {"alpha": args.alpha}
                if method == "ties":
                    theirs_params["k"] = args.k
                if method in SVD_METHODS:
                    ours_params["null_space"] = "literal"
                if method == "iso_cts":
                    ours_params["common_frac"] = args.common_frac
                    theirs_params["common_frac"] = args.common_frac
                best = {tool: [float("inf")] * 3 for tool in ("pactlib", "fusion_bench")}
                runs: dict[str, list[float]] = {"pactlib": [], "fusion_bench": []}
                load_before, ours = load1(), None
                for rep in range(args.repeat):  # alternated, so that a busy moment hits both alike
                    for tool in (("pactlib", "fusion_bench") if rep % 2 == 0 else ("fusion_bench", "pactlib")):
                        if tool == "pactlib":
                            ours = None
                            with torch.no_grad():
                                f0, c0, t0 = minflt(), time.process_time(), time.perf_counter()
                                ours = pactlib.merge(method, pre, fts, alpha=args.alpha, **ours_params)
                                wall, cpu, flt = time.perf_counter() - t0, time.process_time() - c0, minflt() - f0
                        else:
                            r = child.ask(op="merge", set=name, method=method, params=theirs_params)
                            wall, cpu, flt = r["wall_s"], r["cpu_s"], r["minflt"]
                        best[tool] = [min(best[tool][0], wall), min(best[tool][1], cpu), min(best[tool][2], flt)]
                        runs[tool].append(round(wall, 4))
                load_after = load1()
                path = work / f"fusion_bench-{method}.safetensors"
                child.ask(op="save", path=str(path))
                got = load_file(str(path))
                path.unlink()
                extra: dict = {}
                if method == "ties":
                    d = sum(v.numel() for v in pre.values())
                    extra["kept_per_task"] = {"pactlib": trim_count(d, args.k),
                                              "fusion_bench": child.ask(op="kept", set=name, k=args.k)["kept"]}
                if method == "tsv_m":
                    dmin = min(shape)
                    extra["rank_per_task"] = {"pactlib": max(1, dmin // args.tasks),
                                              "fusion_bench": int(dmin * (1 / args.tasks))}
                rec = {"kind": "compare", "method": method, "tasks": args.tasks, "matrices": matrices,
                       "shape": list(shape), "dtype": "float32", "threads": args.threads, "repeat": args.repeat,
                       "alpha": args.alpha, "pactlib_params": {k: v for k, v in ours_params.items()},
                       "fusion_bench_params": {k: v for k, v in theirs_params.items() if k != "alpha"}
                       | ({"merge_func": "mean"} if method == "ties" else {}),
                       "seconds": {t: round(b[0], 4) for t, b in best.items()},
                       "cpu_seconds": {t: round(b[1], 4) for t, b in best.items()},
                       "ratio": round(best["pactlib"][0] / best["fusion_bench"][0], 3),
                       "ratio_cpu": round(best["pactlib"][1] / best["fusion_bench"][1], 3), "runs": runs,
                       "minor_faults": {t: b[2] for t, b in best.items()},
                       **compare(ours, got, pre), **extra, "note": NOTES[method],
                       "load1_before": load_before, "load1_after": load_after,
                       "torch": torch.__version__, "machine": platform.machine(), "commit": commit}
                emit(rec)
                del ours, got
            child.ask(op="drop", set=name)
            del pre, fts
        emit({"kind": "end", "load_end": [round(x, 2) for x in os.getloadavg()]})
    finally:
        sink.close()
        if child is not None:
            child.close()
        shutil.rmtree(work, ignore_errors=True)
    return records


if __name__ == "__main__":
    main()
