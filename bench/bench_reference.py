r"""Benchmark: our merges against the public reference implementations, on the same inputs.

How the comparison works. The reference code is not part of this repository and is never copied
into it: give the path of a checkout of each reference repository and this script imports the
merge functions from there at run time (each file loaded by its path under a private module
name, so that the repositories' identically named ``src`` packages do not collide):

- Task Arithmetic: ``mlfoundations/task_vectors``, ``src/task_vectors.py``: the sum of
  ``TaskVector`` objects (``sum(task_vectors)``, as its README's merging example does).
- TIES: ``prateeky2806/ties-merging``, ``src/utils/merge_utils.py``: ``merge_methods("topk", flat,
  reset_thresh=20, resolve_method="mass", merge_func="dis-mean")`` on the task vectors flattened
  in sorted key order (``state_dict_to_vector``), as in ``src/ties_minimal.ipynb``; the result is
  unflattened with ``vector_to_state_dict``. That module imports ``transformers`` (for its T5
  loaders, not used here); when it is not installed a stand-in module is registered under that
  name while the file loads.
- TSV-M: ``AntoAndGar/task_singular_vectors``, ``src/utils/TSVM_utils.py``:
  ``compute_and_sum_svd_mem_reduction(task_vectors, config)``.
- Iso-C and Iso-CTS: ``danielm1405/iso-merging``, ``src/utils/iso.py``: ``iso_c`` and ``iso_cts``
  (common space fraction 0.8).

The inputs: synthetic checkpoints shaped like open_clip's ViT-B/32 visual tower (``--blocks``
residual blocks of the 12, plus the stem and the projection), a random θ0 and T task vectors
(low-rank plus noise on the matrices, small noise elsewhere), float32, seed ``--seed``. Both sides
get the same task vectors (ours as :class:`pactlib.TaskVector`, theirs as objects with a
``.vector`` dict). Ours run through ``pactlib.merged_update`` with the references' conventions:
the matrix rule ``reference_2d`` (every 2-d tensor but ``text_projection`` is merged as a matrix,
as stored) and, for TSV-M, Iso-C and Iso-CTS, ``null_space="literal"`` (the references keep every
singular direction; on these full-rank layers the two conventions agree); TIES with k = 20 and a
global trim, Iso-CTS with c = 0.8. Each method runs ``--repeat`` times per side, alternating,
single-threaded (``torch.set_num_threads(1)``), and the fastest run counts. Times are CPU seconds
of this process (``time.process_time``: with one thread, the work done, whatever else runs on a
shared machine); wall times are recorded too. The record gives both sides' times, their ratio,
and max |D_ours − D_ref| over all entries of the merged update D (also relative to max |D_ref|) and how many entries differ by more than 1e-6 of max |D_ref|. Known
difference: the reference TIES keeps every entry with |Δ| at least the k-th largest value, so a
tie at that value (float32 values do tie among millions of entries) keeps one entry more; ours
keeps exactly ⌈k%·N⌉ per task (book/method.md, M2). A handful of entries of the merged update then
differ by about one update entry.

    .venv/bin/python bench/bench_reference.py --task-vectors-repo PATH --ties-repo PATH \
        --tsv-repo PATH --iso-repo PATH [--blocks 1] [--tasks 8] [--repeat 2]

Get the references with ``git clone https://github.com/<owner>/<name> PATH``. A reference whose
path is not given is skipped with a message; with none given the script says so and writes
nothing. Records: ``book/data/reference_compare.jsonl`` (one line per method, with the commit of
the reference checkout when it is a git repository).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: method -> (option naming the reference checkout, repository, file inside it)
REFERENCES = {"task_arithmetic": ("task_vectors_repo", "mlfoundations/task_vectors", "src/task_vectors.py"),
              "ties": ("ties_repo", "prateeky2806/ties-merging", "src/utils/merge_utils.py"),
              "tsv_m": ("tsv_repo", "AntoAndGar/task_singular_vectors", "src/utils/TSVM_utils.py"),
              "iso_c": ("iso_repo", "danielm1405/iso-merging", "src/utils/iso.py"),
              "iso_cts": ("iso_repo", "danielm1405/iso-merging", "src/utils/iso.py")}


def shapes(blocks: int) -> dict[str, tuple[int, ...]]:
    """open_clip ViT-B/32 visual tower with ``blocks`` residual blocks: key -> shape
    (``bench_merge_scale.vit_shapes``, the same benchmark inputs)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_merge_scale import vit_shapes

    return vit_shapes("vit_b32", blocks)


def synthetic(blocks: int, tasks: int, seed: int):
    """θ0 and ``tasks`` task vectors (dicts of float32 tensors): rank-16 plus noise updates of the
    2-d entries, small noise on the others."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    pre, tvs = {}, [{} for _ in range(tasks)]
    for k, shape in shapes(blocks).items():
        fan_in = shape[-1] if len(shape) == 2 else max(1, torch.Size(shape[1:]).numel())
        pre[k] = torch.randn(shape, generator=gen) / fan_in ** 0.5
        for tv in tvs:
            if len(shape) == 2:
                m, n = shape
                tv[k] = (torch.randn(m, 16, generator=gen) @ torch.randn(16, n, generator=gen)) * (1e-3 / 4) \
                    + 1e-4 * torch.randn(m, n, generator=gen)
            else:
                tv[k] = 1e-4 * torch.randn(shape, generator=gen)
    return pre, tvs


def load_file(repo: Path, rel: str, name: str, *, src_package: bool = False) -> types.ModuleType:
    """Import ``repo/rel`` as module ``name``. ``src_package``: the file imports the repository's own
    ``src`` package (put ``repo`` first on sys.path while it loads, and forget that package after)."""
    path = repo / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {repo} a checkout of the reference repository?")
    stub = None
    if src_package and importlib.util.find_spec("transformers") is None:
        stub = types.ModuleType("transformers")  # merge_utils imports it for its T5 loaders only
        stub.AutoModelForSeq2SeqLM = stub.AutoTokenizer = None
        sys.modules["transformers"] = stub
    saved_src = {k: v for k, v in sys.modules.items() if k == "src" or k.startswith("src.")}
    for k in saved_src:
        del sys.modules[k]
    old_path, old_cwd = list(sys.path), os.getcwd()
    try:
        if src_package:
            sys.path.insert(0, str(repo))
            os.chdir(repo)  # merge_utils puts the working directory on sys.path when it loads
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = old_path
        os.chdir(old_cwd)
        for k in [k for k in sys.modules if k == "src" or k.startswith("src.")]:
            del sys.modules[k]
        sys.modules.update(saved_src)
        if stub is not None:
            del sys.modules["transformers"]


def commit_of(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def reference_merge(method: str, module: types.ModuleType, tvs: list[dict], keys: list[str]):
    """A function running the reference ``method`` on ``tvs``; it returns {key: merged update}."""
    import torch
    T = len(tvs)
    config = types.SimpleNamespace(DATASETS=[f"task{t}" for t in range(T)], device="cpu",
                                   method=types.SimpleNamespace(common_space_fraction=0.8))
    if method == "task_arithmetic":
        def run():
            return sum(module.TaskVector(vector=dict(tv)) for tv in tvs).vector
    elif method == "ties":
        def run():
            flat = torch.vstack([module.state_dict_to_vector(tv) for tv in tvs])
            merged = module.merge_methods("topk", flat, reset_thresh=20, resolve_method="mass", merge_func="dis-mean")
            return dict(module.vector_to_state_dict(merged, {k: torch.empty_like(tvs[0][k]) for k in keys}))
    else:
        fn = {"tsv_m": "compute_and_sum_svd_mem_reduction", "iso_c": "iso_c", "iso_cts": "iso_cts"}[method]

        def run():
            return getattr(module, fn)([types.SimpleNamespace(vector=tv) for tv in tvs], config)
    return run


def ours(method: str, pre: dict, tvs: list[dict]):
    import pactlib
    from pactlib.matrix import MatrixRule
    rule = MatrixRule.preset("reference_2d")
    params = {"null_space": "literal"} if method in ("tsv_m", "iso_c", "iso_cts") else {}
    params.update({"k": 20.0, "scope": "global"} if method == "ties" else {})
    params.update({"common_frac": 0.8} if method == "iso_cts" else {})
    task_vectors = [pactlib.TaskVector(tv, name=f"task{t}") for t, tv in enumerate(tvs)]

    def run():
        return dict(pactlib.merged_update(method, pre, task_vectors, rule=rule, **params)[0].items())
    return run


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for method, (opt, repo, rel) in REFERENCES.items():
        if method != "iso_cts":
            p.add_argument("--" + opt.replace("_", "-"), type=Path, default=None,
                           help=f"checkout of github.com/{repo} (its {rel}); not given: skipped")
    p.add_argument("--methods", nargs="+", default=list(REFERENCES), choices=list(REFERENCES))
    p.add_argument("--blocks", type=int, default=1, help="ViT-B/32 residual blocks (of 12)")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=2, help="runs per method and side (fastest counts)")
    p.add_argument("--out", default=str(ROOT / "book" / "data" / "reference_compare.jsonl"))
    a = p.parse_args(argv)
    given = {m: getattr(a, REFERENCES[m][0]) for m in a.methods}
    for m, path in given.items():
        if path is None:
            print(f"{m}: skipped (no --{REFERENCES[m][0].replace('_', '-')}; the reference is "
                  f"github.com/{REFERENCES[m][1]})", flush=True)
    todo = [m for m, path in given.items() if path is not None]
    if not todo:
        print("no reference checkout given: nothing compared, nothing written", flush=True)
        return []
    import torch
    torch.set_num_threads(1)
    pre, tvs = synthetic(a.blocks, a.tasks, a.seed)
    keys = list(pre)
    records = []
    for method in todo:
        repo = Path(given[method]).resolve()
        module = load_file(repo, REFERENCES[method][2], f"_reference_{method}", src_package=method == "ties")
        runs = {"ours": ours(method, pre, tvs), "reference": reference_merge(method, module, tvs, keys)}
        best, wall, out = {}, {}, {}
        for i in range(a.repeat):
            for side in (("ours", "reference") if i % 2 == 0 else ("reference", "ours")):
                t0, c0 = time.perf_counter(), time.process_time()
                res = runs[side]()
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                best[side] = min(best.get(side, float("inf")), cpu)
                wall[side] = min(wall.get(side, float("inf")), elapsed)
                out.setdefault(side, res)
        diff = max(float((out["ours"][k].double() - out["reference"][k].double()).abs().max()) for k in keys)
        scale = max(float(out["reference"][k].double().abs().max()) for k in keys)
        worst = max(keys, key=lambda k: float((out["ours"][k].double() - out["reference"][k].double()).abs().max()))
        differing = sum(int(((out["ours"][k].double() - out["reference"][k].double()).abs() > 1e-6 * scale).sum())
                        for k in keys)
        rec = dict(kind="compare", method=method, reference=REFERENCES[method][1], reference_file=REFERENCES[method][2],
                   reference_commit=commit_of(repo), blocks=a.blocks, tasks=a.tasks, seed=a.seed, repeat=a.repeat,
                   threads=1, clock="process_time", t_ours_s=round(best["ours"], 3),
                   t_reference_s=round(best["reference"], 3), ours_over_reference=round(best["ours"] / best["reference"], 3),
                   wall_ours_s=round(wall["ours"], 3), wall_reference_s=round(wall["reference"], 3), max_abs_diff=diff,
                   max_abs_reference=scale, max_rel_diff=diff / scale if scale else float("nan"), worst_key=worst,
                   entries=sum(out["reference"][k].numel() for k in keys), entries_differing=differing,
                   cpus=os.cpu_count(), measured=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   command=" ".join(["bench/bench_reference.py", *argv]))
        records.append(rec)
        print(f"{method:16s} ours {rec['t_ours_s']:7.2f} s  reference {rec['t_reference_s']:7.2f} s (CPU)  "
              f"ratio {rec['ours_over_reference']:.2f}  max |diff| {diff:.2e} ({rec['max_rel_diff']:.1e} of max |D|, "
              f"at {worst}; {differing} entries differ by more than 1e-6 of it)", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return records


if __name__ == "__main__":
    main()
