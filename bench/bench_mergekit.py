r"""Benchmark: ``pact merge`` beside mergekit's ``mergekit-yaml`` on the same files (issue 29).

mergekit is never a dependency of pactlib: install it into a virtual environment of its own,
outside this repository, and name its ``mergekit-yaml`` (``--mergekit``, or ``$MERGEKIT``):

    python3 -m venv ~/mergekit-venv
    ~/mergekit-venv/bin/pip install mergekit          # add torch==<the version in .venv> to share its wheel
    MERGEKIT=~/mergekit-venv/bin/mergekit-yaml .venv/bin/python bench/bench_mergekit.py
    make bench MERGEKIT=~/mergekit-venv/bin/mergekit-yaml

Without it the script says so and writes nothing. The inputs: a Llama-shaped float32 model
(``bench_io_floor.WRITER``: token embedding, per layer q/k/v/o, gate/up/down and two norms, a final
norm and an LM head; default 4 layers, hidden 1024, MLP 2816, vocab 8000; ``--layers 8`` is the
issue's 0.48 GB shape), θ0 and T fine-tunes (θ0 plus small noise; seeded), each a model folder
(``config.json`` of a ``LlamaForCausalLM`` and ``model.safetensors``) as both tools expect.

For each T (default 2 and 8) and method, both tools run the same merge as whole processes, on the
CPU, the way their users run them, ``--repeat`` times (default 3) with the order alternating
(pact first on even repeats, mergekit first on odd ones), the page cache warmed first:

- **Task Arithmetic**, θ0 + α·Σt (θt − θ0): ``pact merge --method task_arithmetic --alpha α``;
  mergekit ``merge_method: task_arithmetic`` with ``weight: α`` per model and ``normalize: false``.
- **TIES**, θ0 + α·(disjoint mean of the elected, trimmed updates), each tensor trimmed to its
  top k % by |θt − θ0|: ``pact merge --method ties --alpha α --set k=K scope=per_key``; mergekit
  ``merge_method: ties`` with ``density: K/100``, ``weight: 1``, ``normalize: true`` and
  ``lambda: α`` (mergekit trims each tensor: pact's ``per_key`` scope is the same definition).

pact writes a model folder (``--out DIR/``: weights, θ0's config, a model card with each input's
sha256 and the recipe; ``--pact-out file`` writes only ``merged.safetensors``); mergekit writes its
folder (``mergekit-yaml CONFIG OUT --lazy-unpickle``, its README's loading option, and
``--copy-tokenizer`` as by default). Both get the same environment, with ``OMP_NUM_THREADS`` =
``--threads`` (default 1: the machine this was written on has 2 cores shared with other jobs).

Per run: wall time, user and system CPU seconds, peak RSS and minor page faults of the child
(``os.wait4``: the rusage of that child alone), and the 1-minute load average before and after.
A ``startup`` line per tool measures a process that only imports it (``python -c "import
pactlib.cli"``; ``mergekit-yaml --help``). Per method and T: the medians of both tools and their
ratios (pact / mergekit; ``ratio_merge_cpu`` with each tool's import CPU time taken off), and,
from the last repeat's outputs, key by key in a child process: max |pact − mergekit|, how many
entries differ, and each tool's max |output − float64 reference| (the same merge computed in
float64 from the same files; TIES keeps ⌈k %·n⌉ entries of largest |Δ| per tensor, ties at the
threshold all kept). A ``setup`` line records the machine (CPU, cores, memory), the load
averages at the start, both tools' versions (Python, torch, safetensors, mergekit; pactlib's
commit) and the shape.

    .venv/bin/python bench/bench_mergekit.py --mergekit PATH                 # 4 layers, T = 2 and 8
    .venv/bin/python bench/bench_mergekit.py --mergekit PATH --layers 8 --append

Records: ``book/data/mergekit_side_by_side.jsonl`` (``--out``; ``--append`` adds to it): one
``setup`` line, a ``startup`` line per tool, one ``run`` line per tool, method, T and repeat, one
``compare`` line per method and T. Chapter 8 shows the ``compare`` lines (``pactlib.book.speed.side_by_side_table``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_io_floor import WRITER, add_shape_args, run_child  # noqa: E402  (the same checkpoints, the same child rusage)
from sink import Sink  # noqa: E402  (the JSON-lines records, as every bench script writes them)

METHODS = ("task_arithmetic", "ties")

#: The float64 reference and the differences, in a child (this process never imports torch).
CHECK = r"""
import sys, json, math, torch
from pathlib import Path
from safetensors import safe_open
a = json.loads(sys.argv[1])
alpha, k, method = a["alpha"], a["k"], a["method"]

def opener(folder):
    files = sorted(Path(folder).glob("*.safetensors"))
    handles = [safe_open(str(f), "pt") for f in files]
    where = {key: h for h in handles for key in h.keys()}
    return where

base = safe_open(a["base"], "pt")
tasks = [safe_open(f, "pt") for f in a["tasks"]]
outs = {tool: opener(d) for tool, d in a["outputs"].items()}
keys = list(base.keys())
res = {"keys": len(keys), "entries": 0, "max_abs_reference": 0.0, "max_abs": {}, "differing": {}, "missing": {}}
for tool, where in outs.items():
    res["missing"][tool] = sorted(set(keys) - set(where))[:5]

def note(name, diff):
    res["max_abs"][name] = max(res["max_abs"].get(name, 0.0), float(diff.max()))
    res["differing"][name] = res["differing"].get(name, 0) + int((diff != 0).sum())

for key in keys:
    t0 = base.get_tensor(key).double()
    d = torch.stack([t.get_tensor(key).double() - t0 for t in tasks])
    if method == "task_arithmetic":
        ref = t0 + alpha * d.sum(0)
    else:
        n = d[0].numel()
        keep = min(n, max(1, math.ceil(k * n / 100)))
        mag = d.reshape(len(tasks), -1).abs()
        thr = torch.topk(mag, keep, dim=1).values.min(dim=1).values
        trimmed = d * (mag >= thr[:, None]).reshape(d.shape)
        elected = torch.sign(trimmed.sum(0))
        agree = (torch.sign(trimmed) == elected) & (trimmed != 0)
        count = agree.sum(0)
        mean = torch.where(agree, trimmed, 0.0).sum(0) / count.clamp(min=1)
        ref = t0 + alpha * torch.where(count > 0, mean, 0.0)
    res["entries"] += ref.numel()
    res["max_abs_reference"] = max(res["max_abs_reference"], float(ref.abs().max()))
    got = {tool: where[key].get_tensor(key) for tool, where in outs.items() if key in where}
    for tool, x in got.items():
        note(tool, (x.double() - ref).abs())
    if len(got) == 2:
        x, y = got.values()
        note("between", (x.double() - y.double()).abs())
print(json.dumps(res))
"""


def config_json(layers: int, hidden: int, mlp: int, vocab: int) -> dict:
    """A ``LlamaForCausalLM`` config of the written shape (heads of 64, as many key/value heads)."""
    heads = max(1, hidden // 64)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": mlp, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "vocab_size": vocab, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
            "bos_token_id": 1, "eos_token_id": 2}


def folders(work: Path, names: list[str], config: dict) -> list[Path]:
    """One model folder per checkpoint ``work/NAME.safetensors``: ``work/NAME/`` with the config and
    ``model.safetensors`` (a hard link, else a symbolic one: the same bytes, not a copy)."""
    out = []
    for name in names:
        d = work / name
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(config, indent=2))
        link = d / "model.safetensors"
        if not link.exists():
            try:
                os.link(work / f"{name}.safetensors", link)
            except OSError:
                link.symlink_to(work / f"{name}.safetensors")
        out.append(d)
    return out


def mergekit_config(method: str, base: Path, tasks: list[Path], alpha: float, k: float) -> str:
    """mergekit's YAML for the same merge (see the module docstring)."""
    if method == "task_arithmetic":
        params, per_model = {"normalize": False}, {"weight": alpha}
    else:
        params, per_model = {"normalize": True, "lambda": alpha}, {"weight": 1.0, "density": k / 100}
    lines = ["models:"]
    for t in tasks:
        lines += [f"  - model: {t}", "    parameters:"] + [f"      {p}: {v}" for p, v in per_model.items()]
    lines += [f"merge_method: {method}", f"base_model: {base}", "parameters:"]
    lines += [f"  {p}: {str(v).lower() if isinstance(v, bool) else v}" for p, v in params.items()]
    lines += ["dtype: float32", ""]
    return "\n".join(lines)


def versions(python: str, modules: list[str]) -> dict:
    """``{module: version}`` as ``python`` imports them (``None`` where it cannot)."""
    code = ("import json, importlib.metadata as m\nout = {}\nfor n in %r:\n    try: out[n] = m.version(n)\n"
            "    except Exception: out[n] = None\nimport sys; out['python'] = sys.version.split()[0]\n"
            "print(json.dumps(out))" % modules)
    r = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def machine() -> dict:
    """The CPU model, core count and memory of this machine."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = next((int(line.split()[1]) // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), None) if Path("/proc/meminfo").exists() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_mb": mem, "os": platform.platform()}


def median(runs: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mergekit", default=os.environ.get("MERGEKIT"),
                    help="mergekit-yaml of mergekit's own virtual environment (default: $MERGEKIT)")
    add_shape_args(ap, METHODS)
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--k", type=float, default=20.0, help="TIES: percent kept per tensor (mergekit density = k/100)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both tools")
    ap.add_argument("--pact-out", choices=("folder", "file"), default="folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "data" / "mergekit_side_by_side.jsonl")
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoints here and keep them (reused)")
    args = ap.parse_args(argv)
    if not args.mergekit or not Path(args.mergekit).is_file():
        print("mergekit not found: install it in its own virtual environment and give its mergekit-yaml with "
              "--mergekit or $MERGEKIT (see this script's docstring); nothing written", file=sys.stderr)
        return []
    mk = Path(args.mergekit)
    mk_python = str(mk.parent / "python")
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    shape = dict(layers=args.layers, hidden=args.hidden, mlp=args.mlp, vocab=args.vocab)
    # each record as it comes: an interrupted run keeps what it measured
    sink = Sink(args.out, append=args.append, head={"bench": "mergekit_side_by_side", "label": args.label})
    emit, records = sink.emit, sink.records

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_mergekit-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tmax = max(args.tasks)
        stem = f"made-{args.layers}-{args.hidden}-{args.mlp}-{args.vocab}"
        made = [int(f.name.split("-")[-2]) for f in work.glob(f"{stem}-*-{args.seed}")]
        if not made or max(made) < tmax:  # the same seed writes the same first files
            subprocess.run([py, "-c", WRITER, json.dumps([args.layers, args.hidden, args.mlp, args.vocab, tmax,
                                                          args.seed, str(work)])], check=True, env=env)
            (work / f"{stem}-{tmax}-{args.seed}").touch()
        config = config_json(**shape)
        base, *tuned = folders(work, ["base"] + [f"task{t:02d}" for t in range(tmax)], config)
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "pactlib",
                                     ":!pactlib/book"], capture_output=True, text=True).stdout.strip())
        emit({"kind": "setup", **shape, "file_mb": round((base / "model.safetensors").stat().st_size / 1e6, 1),
              "tasks": sorted(args.tasks), "methods": args.methods, "alpha": args.alpha, "k": args.k,
              "repeat": args.repeat, "threads": args.threads, "pact_out": args.pact_out, "seed": args.seed,
              "machine": machine(), "load_start": [round(x, 2) for x in os.getloadavg()],
              "pact": {"commit": commit, "pactlib_modified": dirty, **versions(py, ["torch", "safetensors"])},
              "mergekit": {"path": str(mk), **versions(mk_python, ["mergekit", "torch", "safetensors",
                                                                      "transformers"])},
              "measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(["bench/bench_mergekit.py", *(argv if argv is not None else sys.argv[1:])])})
        # what every run pays before it reads a byte: importing each tool
        start = {"pact": run_child([py, "-c", "import pactlib.cli"], env, ROOT),
                 "mergekit": run_child([str(mk), "--help"], env, ROOT)}
        for tool, r in start.items():
            emit({"kind": "startup", "tool": tool, **r, "cpu_s": round(r["user_s"] + r["sys_s"], 3)})
        for T in sorted(args.tasks):
            inputs = [base / "model.safetensors"] + [d / "model.safetensors" for d in tuned[:T]]
            subprocess.run(["cat", *map(str, inputs)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
            for method in args.methods:
                yaml = work / f"mergekit-{method}-{T}.yml"
                yaml.write_text(mergekit_config(method, base, tuned[:T], args.alpha, args.k))
                runs: dict[str, list[dict]] = {"pact": [], "mergekit": []}
                kept: dict[str, Path] = {}
                for rep in range(args.repeat):
                    order = ("pact", "mergekit") if rep % 2 == 0 else ("mergekit", "pact")
                    for pos, tool in enumerate(order):
                        out = work / f"out-{tool}-{method}-{T}-{rep}"
                        if tool == "pact":
                            target = f"{out}/" if args.pact_out == "folder" else str(out / "merged.safetensors")
                            if args.pact_out == "file":
                                out.mkdir()
                            cmd = [py, "-m", "pactlib.cli", "merge", "--method", method, "--alpha", str(args.alpha),
                                   "--pretrained", str(base), "--finetuned", *map(str, inputs[1:]), "--out", target]
                            if method == "ties":
                                cmd += ["--set", f"k={args.k:g}", "scope=per_key"]
                        else:
                            cmd = [str(mk), str(yaml), str(out), "--lazy-unpickle"]
                        load0 = os.getloadavg()[0]
                        r = run_child(cmd, env, ROOT)
                        cpu = r["user_s"] + r["sys_s"]
                        rec = {"kind": "run", **shape, "T": T, "method": method, "tool": tool, "repeat": rep,
                               "position": pos, **r, "cpu_s": round(cpu, 3),
                               "kernel_share": round(r["sys_s"] / cpu, 3) if cpu else None,
                               "load1_before": round(load0, 2), "load1_after": round(os.getloadavg()[0], 2)}
                        emit(rec)
                        runs[tool].append(rec)
                        if tool in kept:
                            shutil.rmtree(kept[tool], ignore_errors=True)
                        kept[tool] = out
                check = subprocess.run(
                    [py, "-c", CHECK, json.dumps({"method": method, "alpha": args.alpha, "k": args.k,
                                                  "base": str(inputs[0]), "tasks": [str(p) for p in inputs[1:]],
                                                  "outputs": {t: str(d) for t, d in kept.items()}})],
                    capture_output=True, text=True, env=env)
                if check.returncode != 0:
                    raise RuntimeError(f"the output check failed: {check.stderr[-2000:]}")
                diff = json.loads(check.stdout)
                for d in kept.values():
                    shutil.rmtree(d, ignore_errors=True)
                scale = diff["max_abs_reference"]
                rec = {"kind": "compare", **shape, "T": T, "method": method, "alpha": args.alpha,
                       **({"k": args.k, "scope": "per_key"} if method == "ties" else {}), "repeats": args.repeat}
                for tool, rs in runs.items():
                    for f in ("wall_s", "cpu_s", "user_s", "sys_s", "peak_rss_mb"):
                        rec[f"{tool}_{f}"] = round(median(rs, f), 3)
                    rec[f"{tool}_kernel_share"] = round(rec[f"{tool}_sys_s"] / rec[f"{tool}_cpu_s"], 3)
                    rec[f"{tool}_merge_cpu_s"] = round(rec[f"{tool}_cpu_s"] - start[tool]["user_s"]
                                                       - start[tool]["sys_s"], 3)
                for f in ("wall_s", "cpu_s", "merge_cpu_s", "peak_rss_mb"):
                    rec[f"ratio_{f.removesuffix('_s')}"] = round(rec[f"pact_{f}"] / rec[f"mergekit_{f}"], 3)
                loads = [r["load1_before"] for rs in runs.values() for r in rs]
                rec.update({"max_abs_pact_mergekit": diff["max_abs"].get("between"),
                            "max_abs_pact_reference": diff["max_abs"].get("pact"),
                            "max_abs_mergekit_reference": diff["max_abs"].get("mergekit"),
                            "entries_differing": diff["differing"].get("between"), "max_abs_reference": scale,
                            "entries": diff["entries"], "keys": diff["keys"],
                            "missing_keys": diff["missing"], "load1_min": min(loads), "load1_max": max(loads)})
                emit(rec)
    finally:
        sink.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return records


if __name__ == "__main__":
    main()
