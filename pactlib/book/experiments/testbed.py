"""Describing the built-in testbed (book chapter 2, "The testbed").

Tasks (from :data:`pactlib.data.TASKS` and the data cache's manifest), sample images, the
backbone's matrix layers, the zoo's recipe, and the zero-shot / fine-tuned accuracy of every
zoo run, read from the zoo's own records (:func:`pactlib.testbeds.lite0.zoo.load_records`). Nothing here
trains or evaluates a model: the numbers were measured when the zoo was built.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pactlib.matrix import DEFAULT_RULE, MatrixRule

__all__ = ["task_table", "sample_montage", "sample_records", "samples_from_records", "layer_table", "backbone_summary", "recipe_table",
           "run_records", "accuracy_table", "timing_table", "plot_accuracy", "frozen_statistics", "HEAD_CHOICE", "head_choice_frame",
           "head_choice_table", "plot_head_choice",
           "INTERFERENCE", "interference_frame", "interference_table", "interference_steps", "steps_text",
           "recipe_variants_table",
           "plot_interference", "random_task_sets", "add_one_table", "alpha_curves", "plot_alpha_curves",
           "cosine_matrix", "reference_outcomes", "precondition_verdict", "precondition_evidence", "step_contrasts",
           "problem_verdict", "testbed_meaning"]

#: Records of ``bench/bench_heads.py`` (probe vs prototype head) and ``bench/bench_interference.py``,
#: shipped with the book: paths relative to the book folder (:func:`pactlib.book.paths.book_dir`).
HEAD_CHOICE = "data/head_choice.jsonl"
INTERFERENCE = "data/interference.jsonl"

KIND_LABEL = {"zero-shot": "zero-shot (θ0 + head)", "full": "full fine-tune", "lora": "LoRA fine-tune"}


def _smallest_suite(task: str) -> str:
    from pactlib.data import SUITES

    hits = [s for s, tasks in SUITES.items() if task in tasks]
    return min(hits, key=int) if hits else "—"


def task_table(tasks: Sequence[str], *, seed: int = 0, cache_dir=None) -> pd.DataFrame:
    """One row per task: first suite, classes, source, derived flag, licence, provenance and
    the number of train / val / test images of the cached split ``seed``.

    Counts come from the data cache's ``manifest.json`` (NaN where the task is not cached).

    Raises:
        KeyError: an unknown task (lists the known ones).
    """
    from pactlib.data import TASKS, cache_root

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise KeyError(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    path = cache_root(cache_dir) / "manifest.json"
    files = json.loads(path.read_text()).get("files", {}) if path.is_file() else {}
    rows = []
    for t in tasks:
        spec, counts = TASKS[t], files.get(f"{t}-seed{seed}.pt", {}).get("counts", {})
        rows.append({"task": t, "suite": _smallest_suite(t), "classes": len(spec.classes),
                     "derived": "yes" if spec.derived else "no", "source": spec.source,
                     "train": counts.get("train", math.nan), "val": counts.get("val", math.nan),
                     "test": counts.get("test", math.nan), "license": spec.license,
                     "provenance": spec.provenance})
    return pd.DataFrame(rows).set_index("task")


def sample_montage(samples: Mapping[str, Tensor], *, per_task: int, pad: int = 2) -> tuple[np.ndarray, list[float]]:
    """One image of ``per_task`` samples per row and one row per task.

    Args:
        samples: ``{task: uint8 images (N, 3, H, W)}``, all of the same H, W; a task with fewer
            than ``per_task`` images leaves its last cells white.
        per_task: images per row. pad: white pixels between images.

    Returns:
        (uint8 (rows·(H+pad)+pad, per_task·(W+pad)+pad, 3) montage, y pixel centre of each row).

    Raises:
        ValueError: no samples, ``per_task`` < 1, or images of different sizes.
    """
    if not samples or per_task < 1:
        raise ValueError(f"sample_montage: need samples and per_task >= 1 (got {len(samples)} tasks, {per_task})")
    sizes = {tuple(x.shape[-2:]) for x in samples.values()}
    if len(sizes) != 1:
        raise ValueError(f"sample_montage: images of different sizes {sorted(sizes)}")
    h, w = sizes.pop()
    out = np.full((len(samples) * (h + pad) + pad, per_task * (w + pad) + pad, 3), 255, dtype=np.uint8)
    centres = []
    for r, x in enumerate(samples.values()):
        y0 = pad + r * (h + pad)
        centres.append(y0 + h / 2)
        for c, img in enumerate(x[:per_task]):
            x0 = pad + c * (w + pad)
            out[y0:y0 + h, x0:x0 + w] = img.permute(1, 2, 0).numpy()  # (3, H, W) -> (H, W, 3)
    return out, centres


def sample_records(samples: Mapping[str, Tensor], *, params: Mapping | None = None, seed: int | None = None
                   ) -> list[dict]:
    """Sample images as records (method ``"task-samples"``, one per task in ``samples``' order),
    so :func:`sample_montage` can be drawn from records alone (:func:`samples_from_records`).

    Each record holds ``task``, ``shape`` ``[N, 3, H, W]`` and ``png``: the N images side by side
    as one lossless PNG, base64-encoded (a few kB per 32-px image).

    Raises:
        ValueError: an entry is not a uint8 (N, 3, H, W) tensor.
    """
    import base64
    import io

    from PIL import Image

    from pactlib.book.records import make_record

    out = []
    for task, x in samples.items():
        if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"sample_records: {task!r}: need uint8 images (N, 3, H, W), got {x.dtype} {tuple(x.shape)}")
        strip = x.permute(2, 0, 3, 1).reshape(x.shape[2], -1, 3).numpy()  # (H, N*W, 3): the images side by side
        buf = io.BytesIO()
        Image.fromarray(strip).save(buf, format="PNG", optimize=True)
        out.append(make_record("task-samples", params=dict(params or {}), seed=seed, metrics={}, task=task,
                               shape=list(x.shape), png=base64.b64encode(buf.getvalue()).decode("ascii")))
    return out


def samples_from_records(recs: Iterable[Mapping]) -> dict[str, Tensor]:
    """``{task: uint8 images (N, 3, H, W)}`` back from :func:`sample_records`' records (others
    are skipped), in record order; the images are exactly the ones stored."""
    import base64
    import io

    from PIL import Image

    out = {}
    for r in recs:
        if r.get("method") != "task-samples":
            continue
        n, c, h, w = r["shape"]
        strip = np.asarray(Image.open(io.BytesIO(base64.b64decode(r["png"]))).convert("RGB"))
        out[r["task"]] = torch.from_numpy(strip.reshape(h, n, w, c).transpose(1, 3, 0, 2).copy())
    return out


def layer_table(state_dict: Mapping[str, Tensor], *, rule: MatrixRule = DEFAULT_RULE) -> pd.DataFrame:
    """The matrix layers of a state dict in the dict's order: key, block, role, (m, n), parameters.

    Pass :func:`pactlib.models.efficientnet.backbone_state_dict` for network order: a dict read
    from a ``.safetensors`` file (such as the zoo's θ0) has its keys sorted by name, which puts
    ``_blocks.10`` before ``_blocks.2``.

    ``block`` is the ``_blocks.<i>`` index (``head`` for the final 1x1 convolution), ``role``
    the layer's name inside it (``_expand_conv``, ``_project_conv``, ``_conv_head``).
    """
    rows = []
    for i, key in enumerate(rule.matrix_keys(state_dict)):
        m, n = rule.view(key, state_dict[key]).shape
        parts = key.split(".")
        block = parts[1] if parts[0] == "_blocks" else "head"
        rows.append({"layer": i, "key": key, "block": block, "role": parts[-2], "m (out)": m, "n (in)": n,
                     "params": m * n})
    return pd.DataFrame(rows).set_index("layer")


def backbone_summary(state_dict: Mapping[str, Tensor], *, rule: MatrixRule = DEFAULT_RULE) -> pd.DataFrame:
    """Entries and values of a state dict by matrix-rule kind (matrix / other / buffer), with
    the floating running statistics of BatchNorm counted apart from the other "other" entries.

    Returns:
        rows per kind; ``entries`` and ``values`` as text with thousands separators,
        ``share of values`` as a fraction in [0, 1].
    """
    rows: dict[str, dict[str, int]] = {}
    for key, t in state_dict.items():
        kind = rule.kind(key, t)
        if kind == "other" and key.endswith(("running_mean", "running_var")):
            kind = "other: BatchNorm running statistics"
        elif kind == "other":
            kind = "other: trained (biases, BN affine, k×k convs)"
        r = rows.setdefault(kind, {"entries": 0, "values": 0})
        r["entries"] += 1
        r["values"] += t.numel()
    out = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    out["share of values"] = out["values"] / out["values"].sum()
    out["entries"] = out["entries"].map("{:,}".format)  # counts as text: the table formats only the share
    out["values"] = out["values"].map("{:,}".format)
    return out


def recipe_table(records: Iterable[Mapping], *, default=None, label: str = "default") -> pd.DataFrame:
    """The recipe the runs were made with: one row per recipe field, one column per kind
    ("full", "lora") with the value used (several values joined by " / " when runs differ), and
    a column ``label`` with the values of ``default`` (a :class:`pactlib.testbeds.lite0.zoo.Recipe`, by default
    the class defaults) for comparison. Fields a run's record does not carry show "—".
    """
    from dataclasses import asdict

    from pactlib.testbeds.lite0.zoo import Recipe

    default = asdict(default if default is not None else Recipe())
    used: dict[str, dict[str, set]] = {}
    for r in records:
        if r.get("kind") not in ("full", "lora"):
            continue
        for k, v in (r.get("recipe") or {}).items():
            used.setdefault(k, {}).setdefault(r["kind"], set()).add(json.dumps(v))
    rows = []
    for k in default:
        row = {"field": k, "default": str(default[k])}
        for kind in ("full", "lora"):
            vals = sorted(used.get(k, {}).get(kind, set()))
            row[kind] = " / ".join(str(json.loads(v)) for v in vals) if vals else "—"
        rows.append(row)
    return pd.DataFrame(rows).set_index("field")[["full", "lora", "default"]].rename(columns={"default": label})


def run_records(zoo_records: Iterable[Mapping], *, tasks: Sequence[str], seeds: Sequence[int],
                params: Mapping | None = None, keep: Callable[[str, int, str], bool] | None = None) -> list[dict]:
    """Result records (:func:`pactlib.book.records.make_record`) of the zoo's runs.

    One ``"zero-shot"`` record per task (seed None: θ0 with the task's head) and one record per
    fine-tuning run (method ``"full"`` or ``"lora"``) of ``tasks`` x ``seeds``, in task order.
    Metrics: ``acc`` (test), ``acc_val``, ``train_seconds``, ``n_train``, ``final_loss``.
    Runs missing from the zoo are simply absent; ``keep(task, seed, kind)`` (e.g.
    :func:`pactlib.testbeds.lite0.testbed.in_book_zoo`) drops the runs it returns False for.
    """
    from pactlib.book.records import make_record

    params = dict(params or {})
    wanted, seeds = set(tasks), set(int(s) for s in seeds)
    runs = [r for r in zoo_records if r.get("kind") in ("full", "lora") and r.get("task") in wanted
            and int(r.get("seed", -1)) in seeds and (keep is None or keep(r["task"], int(r["seed"]), r["kind"]))]
    order = {t: i for i, t in enumerate(tasks)}
    runs.sort(key=lambda r: (order[r["task"]], r["kind"], r["seed"]))
    out, seen = [], set()
    for r in runs:
        if r["task"] not in seen:
            seen.add(r["task"])
            out.append(make_record("zero-shot", params=params, seed=None, task=r["task"], kind="zero-shot",
                                   metrics={"acc": r["zero_shot"]["test"], "acc_val": r["zero_shot"]["val"]}))
        out.append(make_record(r["kind"], params=params, seed=int(r["seed"]), task=r["task"], kind=r["kind"],
                               metrics={"acc": r["finetuned"]["test"], "acc_val": r["finetuned"]["val"],
                                        "train_seconds": r.get("train_seconds"), "n_train": r.get("n_train"),
                                        "final_loss": r.get("final_loss")}))
    return out


def _ordered(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["task"]))


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per task: zero-shot and fine-tuned (full, LoRA) test accuracy in percent, ``mean ± std
    (n)`` over seeds (``mean (1)`` for one seed, "—" when absent), from a frame of
    :func:`run_records` records; last row: the mean over tasks of each column's means."""
    tasks = _ordered(frame)
    rows, means = [], {}
    for t in tasks:
        row = {"task": t}
        for kind in ("zero-shot", "full", "lora"):
            acc = 100 * frame[(frame["task"] == t) & (frame["method"] == kind)]["metrics.acc"]
            label = KIND_LABEL[kind]
            if acc.empty:
                row[label] = "—"
                continue
            means.setdefault(label, []).append(acc.mean())
            row[label] = f"{acc.mean():.1f}" if kind == "zero-shot" else (
                f"{acc.mean():.1f} ± {acc.std(ddof=1):.1f} ({len(acc)})" if len(acc) > 1 else f"{acc.mean():.1f} (1)")
        rows.append(row)
    mean_row = {"task": "mean over tasks"}
    for label in (KIND_LABEL[k] for k in ("zero-shot", "full", "lora")):
        vals = means.get(label, [])
        mean_row[label] = f"{np.mean(vals):.1f} ({len(vals)} tasks)" if vals else "—"
    return pd.DataFrame(rows + [mean_row]).set_index("task")


def timing_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Fine-tuning seconds per run by kind (runs, mean, min, max, total), from run records."""
    f = frame[frame["method"].isin(["full", "lora"])]
    g = f.groupby("method", sort=False)["metrics.train_seconds"]
    out = pd.DataFrame({"runs": g.size(), "mean s": g.mean(), "min s": g.min(), "max s": g.max(), "total s": g.sum()})
    out.index = [KIND_LABEL[k] for k in out.index]
    return out


def plot_accuracy(frame: pd.DataFrame, *, ax) -> None:
    """Grouped bars per task: zero-shot, full and LoRA test accuracy (%), bars at the mean over
    seeds, black ticks for the single seeds."""
    tasks = _ordered(frame)
    kinds = [k for k in ("zero-shot", "full", "lora") if (frame["method"] == k).any()]
    width = 0.8 / len(kinds)
    x = np.arange(len(tasks))
    for j, kind in enumerate(kinds):
        xs = x + (j - (len(kinds) - 1) / 2) * width
        sel = frame[frame["method"] == kind]
        means = [100 * sel[sel["task"] == t]["metrics.acc"].mean() for t in tasks]
        ax.bar(xs, means, width=width * 0.95, label=KIND_LABEL[kind])
        for xi, t in zip(xs, tasks):
            pts = 100 * sel[sel["task"] == t]["metrics.acc"]
            if len(pts) > 1:
                ax.scatter([xi] * len(pts), pts, color="black", s=5, zorder=3)
    ax.set_xticks(x, tasks, rotation=60, ha="right")
    ax.set(ylabel="test accuracy (%)", ylim=(0, 100))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, ncols=len(kinds), frameon=False)


def frozen_statistics(pretrained: Mapping[str, Tensor], finetuned: Mapping[str, Mapping[str, Tensor]]) -> dict[str, float]:
    """What full fine-tuning changed, by entry type: the largest |Δ| over BatchNorm running
    statistics (zero when they stayed frozen), over BatchNorm affine parameters and over the
    matrix layers, across all given fine-tuned checkpoints ``{task: θt}``.

    Raises:
        KeyError: a fine-tuned checkpoint lacks a key of θ0 (named).
    """
    out = {"bn_running_stats": 0.0, "bn_affine": 0.0, "matrix_layers": 0.0}
    for task, sd in finetuned.items():
        for key, w0 in pretrained.items():
            if not torch.is_floating_point(w0):
                continue
            if key not in sd:
                raise KeyError(f"fine-tuned checkpoint of {task!r} lacks key {key!r}")
            d = float((sd[key].float() - w0.float()).abs().max()) if w0.numel() else 0.0
            if key.endswith(("running_mean", "running_var")):
                group = "bn_running_stats"
            elif "_bn" in key:
                group = "bn_affine"
            elif DEFAULT_RULE.kind(key, w0) == "matrix":
                group = "matrix_layers"
            else:
                continue
            out[group] = max(out[group], d)
    return out


# ----------------------------------------------------------------------------- head choice
def head_choice_frame(path: str | Path | None = None) -> pd.DataFrame:
    """The records of ``bench/bench_heads.py`` as a frame (``method``, ``head``, ``suite``,
    ``alpha``, ``curve``, ``metrics.acc``, ``metrics.norm_acc``, ...); default ``path``: the
    book's :data:`HEAD_CHOICE`.

    Raises:
        FileNotFoundError: no records at ``path`` (names the script that writes them).
    """
    return _bench_frame(path, HEAD_CHOICE, "head-choice", "bench/bench_heads.py")


def _bench_frame(path, default: str, what: str, script: str) -> pd.DataFrame:
    from pactlib.book.paths import BOOK_ENV, book_path
    from pactlib.book.records import records_frame

    where = ""
    if path is None:
        path, where = book_path(default, must_exist=False), f" (the book folder is ${BOOK_ENV}, else ./book)"
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} records at {path}{where}; run {script} to write them")
    return records_frame(path)


_HEAD_METHODS = {"zero-shot": "zero-shot", "task_arithmetic": "Task Arithmetic", "iso_c": "Iso-C"}


def head_choice_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows (head, suite); per method (zero-shot, TA, Iso-C) test accuracy and normalized accuracy
    in percent, and the α chosen on validation for TA and Iso-C."""
    rows = []
    for (head, suite), g in frame.groupby(["head", "suite"], sort=False):
        row = {"head": head, "tasks": int(suite), "fine-tuned acc": 100 * g[g["method"] == "fine-tuned"]["metrics.acc"].mean()}
        for m, label in _HEAD_METHODS.items():
            r = g[g["method"] == m]
            row[f"{label} acc"] = 100 * r["metrics.acc"].mean()
            row[f"{label} norm"] = 100 * r["metrics.norm_acc"].mean()
            if m != "zero-shot":
                row[f"{label} α"] = r["alpha"].mean()
        rows.append(row)
    return pd.DataFrame(rows).set_index(["head", "tasks"])


def plot_head_choice(frame: pd.DataFrame, *, ax) -> None:
    """Task Arithmetic's validation normalized accuracy (%) against α (log axis), one line per
    (head, suite); dashed horizontal lines at each zero-shot's test normalized accuracy."""
    ta = frame[frame["method"] == "task_arithmetic"]
    colors = {h: f"C{i}" for i, h in enumerate(dict.fromkeys(frame["head"]))}
    styles = ["-", "--", ":", "-."]
    suites = list(dict.fromkeys(frame["suite"]))
    for _, r in ta.iterrows():
        a = [c["alpha"] for c in r["curve"]]
        v = [100 * c["mean_normalized"] for c in r["curve"]]
        ax.plot(a, v, styles[suites.index(r["suite"]) % 4], marker="o", ms=3, color=colors[r["head"]],
                label=f"{r['head']} head, {r['suite']} tasks")
    for _, r in frame[frame["method"] == "zero-shot"].iterrows():
        ax.axhline(100 * r["metrics.norm_acc"], color=colors[r["head"]], lw=0.8, ls=(0, (2, 3)), alpha=0.7)
    ax.set_xscale("log")
    ax.set(xlabel="α (log scale)", ylabel="validation normalized accuracy (%)")
    ax.legend(fontsize=7, frameon=False)


# ----------------------------------------------------------------------------- interference vs T
_GROWTH_METHODS = {"zero-shot": "zero-shot", "task_arithmetic": "Task Arithmetic", "iso_c": "Iso-C"}


def interference_frame(path: str | Path | None = None) -> pd.DataFrame:
    """The records of ``bench/bench_interference.py`` (default: the book's :data:`INTERFERENCE`)
    as a frame, one row per (method, suite, seed), with two added columns: ``T`` (the suite as an
    int) and ``first_norm``, the mean normalized accuracy (fraction) over the tasks of the smallest
    suite in the file (the 8 tasks every suite shares), so a task set held fixed can be followed as
    T grows.

    Raises:
        FileNotFoundError: no records at ``path`` (names the script that writes them).
        ValueError: a record lacks the per-task ``norm_acc:<task>`` metrics of that first suite.
    """
    frame = _bench_frame(path, INTERFERENCE, "interference", "bench/bench_interference.py").copy()
    frame["T"] = frame["suite"].astype(int)
    merged = frame[frame["method"] != "fine-tuned"]  # fine-tuned: 1.0 on every task by definition
    smallest = frame["T"].min()
    base = merged[merged["T"] == smallest]
    cols = [c for c in base.columns if c.startswith("metrics.norm_acc:") and base[c].notna().all()]
    if not cols or merged[cols].isna().any(axis=None):
        raise ValueError(f"{path}: records without per-task normalized accuracy for the {smallest}-task suite's tasks")
    frame["first_norm"] = frame[cols].mean(axis=1)
    frame.loc[frame["method"] == "fine-tuned", "first_norm"] = 1.0
    return frame


def interference_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows: the number of tasks T. Per method (zero-shot, TA, Iso-C): mean normalized accuracy
    (%) over all T tasks and over the first suite's tasks, as mean ± std over seeds (and over
    the random task sets of ``--draws`` records: then a ``sets`` column counts them), the seed
    count, and the mean α chosen."""
    rows = []
    draws = "draw" in frame and frame["draw"].notna().any()
    for T, g in frame.groupby("T", sort=True):
        row = {"T": T, "seeds": g["seed"].nunique()}
        if draws:
            row["sets"] = max(1, g["draw"].nunique())
        for m, label in _GROWTH_METHODS.items():
            r = g[g["method"] == m]
            for col, name in (("metrics.norm_acc", "all"), ("first_norm", "first")):
                v = 100 * r[col]
                row[f"{label} ({name})"] = f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v.mean():.1f}"
            if m != "zero-shot":
                row[f"{label} α"] = round(float(r["alpha"].mean()), 3)
        rows.append(row)
    return pd.DataFrame(rows).set_index("T")


def _by_T(frame: pd.DataFrame, method: str, column: str) -> tuple[pd.Series, pd.Series]:
    """Mean and standard deviation over seeds (0 with one seed) of ``column`` for ``method``, in
    percent, indexed by T."""
    g = frame[frame["method"] == method].groupby("T")[column]
    return 100 * g.mean(), (100 * g.std(ddof=1)).fillna(0.0)


def interference_steps(frame: pd.DataFrame, column: str = "first_norm", T_values: Sequence[int] | None = None
                       ) -> pd.DataFrame:
    """One row per (method, consecutive pair of T values) for Task Arithmetic and Iso-C.

    Columns: ``method`` (display name), ``T_from``, ``T_to``; ``before`` and ``after``, the mean
    ``column`` (%, over seeds and task sets); ``drop`` = before − after (points); ``spread``, the
    larger standard deviation (over seeds and sets; 0 with one) of the two; ``grows`` =
    ``drop > spread``; and the paired view, since every T is measured on the same fine-tuning
    seeds: ``seeds_falling``, the number of seeds whose own drop (means over task sets) is
    positive, out of ``n_seeds`` seeds present at both T.

    Args:
        T_values: only these T (e.g. ``[8, 14, 20]``); None: every T in the frame.
    """
    rows = []
    if T_values is not None:
        frame = frame[frame["T"].isin(list(T_values))]
    for m, label in _GROWTH_METHODS.items():
        if m == "zero-shot":
            continue
        mean, std = _by_T(frame, m, column)
        per_seed = 100 * frame[frame["method"] == m].groupby(["seed", "T"])[column].mean().unstack("T")
        ts = list(mean.index)
        for a, b in zip(ts, ts[1:]):
            drop, spread = mean[a] - mean[b], max(std[a], std[b])
            d = (per_seed[a] - per_seed[b]).dropna()
            rows.append(dict(method=label, T_from=a, T_to=b, before=mean[a], after=mean[b], drop=drop, spread=spread,
                             grows=bool(drop > spread), seeds_falling=int((d > 0).sum()), n_seeds=len(d)))
    return pd.DataFrame(rows, columns=["method", "T_from", "T_to", "before", "after", "drop", "spread", "grows",
                                       "seeds_falling", "n_seeds"])


def recipe_variants_table(frames: Mapping[str, pd.DataFrame], column: str = "first_norm") -> pd.DataFrame:
    """One row per recipe: how Task Arithmetic and Iso-C fare as T grows under each.

    Args:
        frames: label -> :func:`interference_frame` of one recipe's records (all on the same T
            values, e.g. suites 8 / 14 / 20).
        column: the accuracy followed (default ``first_norm``: the first suite's tasks).

    Returns:
        Rows in the order of ``frames``; columns ``seeds``, ``zero-shot`` (at the smallest T),
        then per method ``<method> T=<T>`` for each T and ``<method> last step``, the mean at the
        second-largest T minus the mean at the largest (points: positive when the accuracy still
        falls), all in percent, means over seeds (and task sets).

    Raises:
        ValueError: ``frames`` is empty, or the frames do not share the same T values.
    """
    if not frames:
        raise ValueError("recipe_variants_table: no frames given")
    Ts = {label: tuple(sorted(f["T"].unique())) for label, f in frames.items()}
    if len(set(Ts.values())) != 1:
        raise ValueError(f"recipe_variants_table: the frames have different T values: {Ts}")
    T_values = next(iter(Ts.values()))
    rows = []
    for label, frame in frames.items():
        row = {"recipe": label, "seeds": frame["seed"].nunique(),
               "zero-shot": _by_T(frame, "zero-shot", column)[0].loc[T_values[0]]}
        for method, name in _GROWTH_METHODS.items():
            if method == "zero-shot":
                continue
            mean = _by_T(frame, method, column)[0]
            row.update({f"{name} T={T}": mean.loc[T] for T in T_values})
            if len(T_values) > 1:
                row[f"{name} last step"] = mean.loc[T_values[-2]] - mean.loc[T_values[-1]]
        rows.append(row)
    return pd.DataFrame(rows).set_index("recipe")


def steps_text(steps: pd.DataFrame, sep: str = "; ") -> str:
    """The rows of :func:`interference_steps` as text, joined by ``sep``, one per step:
    ``"Task Arithmetic 8 → 14: 81.3 → 77.0 % (drop +4.3, spread 0.9, falls on 3/3 seeds)"``."""
    return sep.join(f"{r.method} {r.T_from} → {r.T_to}: {r.before:.1f} → {r.after:.1f} % (drop {r.drop:+.1f}, "
                    f"spread {r.spread:.1f}, falls on {r.seeds_falling}/{r.n_seeds} seeds)" for r in steps.itertuples())


def plot_interference(frame: pd.DataFrame, *, axes) -> None:
    """Two panels: normalized accuracy (%) against T over all T tasks (left) and over the first
    suite's tasks (right); one line per method, mean over seeds with ±1 std error bars."""
    for ax, col, title in zip(axes, ("metrics.norm_acc", "first_norm"), ("all T tasks", "the first suite's tasks")):
        for i, (m, label) in enumerate(_GROWTH_METHODS.items()):
            mean, std = _by_T(frame, m, col)
            ax.errorbar(mean.index, mean.values, yerr=std.values, marker="o", ms=4, capsize=3, color=f"C{i}",
                        ls="--" if m == "zero-shot" else "-", label=label)
        ax.set(xlabel="number of tasks T", title=title, xticks=sorted(frame["T"].unique()))
    axes[0].set_ylabel("test normalized accuracy (%)")
    axes[0].legend(fontsize=7, frameon=False)


def random_task_sets(first: Sequence[str], last: Sequence[str], sizes: Sequence[int], draws: int
                     ) -> list[tuple[int, int, list[str]]]:
    """Random task sets between two nested suites: for each T in ``sizes`` and each draw
    i < ``draws``, the tasks of ``first`` followed by T − len(first) of ``last``'s other tasks
    (in ``last``'s order), drawn without replacement by ``numpy.random.default_rng([T, i])`` —
    the same sets on every call, so fine-tuning seeds can be paired.

    Returns:
        [(T, i, tasks)], sizes outer, draws inner.

    Raises:
        ValueError: ``first`` is not a prefix of ``last``, a size outside (len(first), len(last)),
            or ``draws`` < 1.
    """
    first, last = list(first), list(last)
    if last[:len(first)] != first:
        raise ValueError(f"the first suite {first} is not the start of the last suite {last}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    extras = last[len(first):]
    out = []
    for T in sizes:
        if not len(first) < T < len(last):
            raise ValueError(f"size {T}: must lie strictly between {len(first)} and {len(last)} tasks")
        for i in range(draws):
            pick = np.random.default_rng([T, i]).choice(len(extras), T - len(first), replace=False)
            out.append((T, i, first + [extras[j] for j in sorted(pick)]))
    return out


def add_one_table(path: str | Path, joins: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The cost of each extra task vector alone (``bench/bench_interference.py --add-one``):
    one row per added task, costliest first, with ``cost`` = normalized accuracy (points) of the
    smallest suite's tasks under its TA merge minus the same with the task added, mean and std
    over seeds; ``joins`` maps a task to the suite it enters (a column when given).

    Raises:
        FileNotFoundError: no records at ``path``; ValueError: a seed without its base merge.
    """
    frame = _bench_frame(path, "data/interference_add_one.jsonl", "add-one", "bench/bench_interference.py --add-one")
    base = frame[frame["added"].isna()].set_index("seed")["metrics.norm_acc"]
    added = frame[frame["added"].notna()]
    missing = sorted(set(added["seed"]) - set(base.index))
    if missing:
        raise ValueError(f"{path}: seeds {missing} have no base merge (added = None)")
    cost = 100 * (added["seed"].map(base) - added["metrics.norm_acc"])
    g = cost.groupby(added["added"])
    out = pd.DataFrame({"cost": g.mean(), "std": g.std(ddof=1).fillna(0.0), "seeds": g.size()})
    if joins is not None:
        out.insert(0, "joins", [joins.get(t, "") for t in out.index])
    out.index.name = "added task"
    return out.sort_values("cost", ascending=False)


def alpha_curves(frame: pd.DataFrame, method: str = "task_arithmetic") -> pd.DataFrame:
    """The validation curves the α search of ``method`` walked: one row per (T, α) with the mean
    and standard deviation (over seeds and, with ``--draws`` records, task sets) of the
    validation normalized accuracy over all T tasks, in percent, and ``n`` the curves averaged.
    Only α values every curve of that T visited are kept (a widened or refined point that some
    curves lack would mix different runs).

    Raises:
        ValueError: no ``method`` records with a ``curve``.
    """
    rows = frame[(frame["method"] == method) & frame["curve"].notna()] if "curve" in frame else frame.iloc[:0]
    if rows.empty:
        raise ValueError(f"no {method!r} records with an α curve in the frame")
    out = []
    for T, g in rows.groupby("T", sort=True):
        curves = [{round(c["alpha"], 6): 100 * c["mean_normalized"] for c in cur} for cur in g["curve"]]
        common = sorted(set.intersection(*(set(c) for c in curves)))
        for a in common:
            v = np.array([c[a] for c in curves])
            out.append(dict(T=int(T), alpha=a, mean=v.mean(), std=v.std(ddof=1) if len(v) > 1 else 0.0, n=len(v)))
    return pd.DataFrame(out, columns=["T", "alpha", "mean", "std", "n"])


def plot_alpha_curves(curves: pd.DataFrame, *, ax, zero_shot: Mapping[int, float] | None = None) -> None:
    """One line per T from :func:`alpha_curves` (validation normalized accuracy, %, against α),
    a band of ±1 std, the best α of the mean curve marked; optional dashed zero-shot levels
    ({T: %})."""
    for i, (T, g) in enumerate(curves.groupby("T", sort=True)):
        ax.plot(g["alpha"], g["mean"], marker="o", ms=3, color=f"C{i}", label=f"T = {T}")
        ax.fill_between(g["alpha"], g["mean"] - g["std"], g["mean"] + g["std"], color=f"C{i}", alpha=0.15, lw=0)
        best = g.loc[g["mean"].idxmax()]
        ax.plot(best["alpha"], best["mean"], "*", ms=11, color=f"C{i}", mec="black", mew=0.6)
        if zero_shot and T in zero_shot:
            ax.axhline(zero_shot[T], color=f"C{i}", lw=0.8, ls=(0, (2, 3)))
    ax.set(xlabel="α", ylabel="validation normalized accuracy (%)")
    ax.legend(fontsize=7, frameon=False)


def cosine_matrix(task_vectors: Sequence[Mapping[str, Tensor]], names: Sequence[str]) -> pd.DataFrame:
    """Pairwise cosine similarity ⟨Δs, Δt⟩ / (‖Δs‖ ‖Δt‖) of task vectors over all their entries
    (float64 sums), as a T × T frame indexed by ``names``; 1 on the diagonal.

    Raises:
        ValueError: ``names`` and ``task_vectors`` differ in length, the task vectors do not share
            their keys and shapes, or one of them is zero.
    """
    if len(names) != len(task_vectors):
        raise ValueError(f"{len(names)} names for {len(task_vectors)} task vectors")
    keys = list(task_vectors[0].keys())
    for name, tv in zip(names, task_vectors):
        if set(tv.keys()) != set(keys) or any(tv[k].shape != task_vectors[0][k].shape for k in keys):
            raise ValueError(f"task vector {name!r} does not have the keys and shapes of {names[0]!r}")
    T = len(task_vectors)
    gram = torch.zeros(T, T, dtype=torch.float64)
    for k in keys:
        X = torch.stack([tv[k].reshape(-1).to(torch.float64) for tv in task_vectors])
        gram += X @ X.T
    norms = gram.diagonal().sqrt()
    if bool((norms == 0).any()):
        raise ValueError(f"zero task vector(s): {[n for n, z in zip(names, (norms == 0).tolist()) if z]}")
    cos = gram / (norms[:, None] * norms[None, :])
    return pd.DataFrame(cos.numpy(), index=list(names), columns=list(names))


def reference_outcomes(from_zoo, name: str, suite: str, *, tasks: Sequence[str], seeds: Sequence[int],
                       available: Iterable[tuple[str, int]], params: Mapping | None = None, **load) -> list[dict]:
    """The zero-shot and fine-tuned records of each seed, with each test example's correctness
    (:func:`pactlib.testbeds.reference_records`, per-task metrics): for every seed, the testbed
    ``from_zoo(name, suite, seed, "full", tasks=<its tasks>, **load)`` over the tasks of ``tasks``
    that ``available`` ((task, seed) pairs: the zoo's full runs) holds on that seed. Seeds without
    any are skipped. Accuracies come from the zoo's evaluation memo when it has them.

    Returns:
        Records with ``method`` ``"zero-shot (outcomes)"`` / ``"fine-tuned (outcomes)"``, ``testbed`` =
        ``name`` and ``tasks`` (the tasks the seed covers), in seed order.
    """
    from pactlib.testbeds import reference_records

    have_all = {(str(t), int(s)) for t, s in available}
    out = []
    for seed in seeds:
        have = [t for t in tasks if (t, int(seed)) in have_all]
        if not have:
            continue
        tb = from_zoo(name, suite, int(seed), "full", tasks=have, **load)
        for r in reference_records(tb, params=params, per_task=True):
            out.append({**r, "method": f"{r['method']} (outcomes)", "testbed": name, "tasks": list(have)})
    return out


def precondition_verdict(reference: Sequence[Mapping], *, tasks: Sequence[str], tasks_word: str = "tasks",
                         note: str = "") -> dict:
    """The verdict on "fine-tuning helps every task": one condition per task, fine-tuned −
    zero-shot > 0 in test accuracy (points), a paired contrast on the task's test examples over
    the seeds that hold it (:func:`pactlib.book.intervals.contrast`; zero-shot is θ0 on every seed).

    Args:
        reference: :func:`reference_outcomes`' records of one testbed.
        tasks: the tasks, in the order of the conditions.
        note: words added after the evidence.

    Returns:
        The verdict dict; not yet tested when the records carry no per-example outcomes or a task
        has none.
    """
    from pactlib.book.experiments.paired import restrict
    from pactlib.book.intervals import NO_OUTCOMES, contrast, has_outcomes
    from pactlib.book.verdicts import condition, graded, not_tested

    ft = [r for r in reference if r.get("method") == "fine-tuned (outcomes)"]
    zs = [r for r in reference if r.get("method") == "zero-shot (outcomes)"]
    if not (has_outcomes(ft) and has_outcomes(zs)):
        return not_tested(f"zero-shot and fine-tuned test outcomes: {NO_OUTCOMES}")
    conds, seeds, examples = [], {}, set()
    for t in tasks:
        plus = [restrict(r, [t], testbed=t) for r in ft if t in (r.get("tasks") or [])]
        minus = [restrict(r, [t], testbed=t) for r in zs if t in (r.get("tasks") or [])]
        if not plus:
            return not_tested(f"no fine-tuned test outcomes for {t!r}: {NO_OUTCOMES}")
        iv = contrast(plus, minus, metric="acc")
        conds.append(condition(f"{t}: fine-tuned − zero-shot", iv, digits=1))
        seeds.setdefault(iv.n_seeds, []).append(t)
        examples.add(iv.n_examples)
    counts = "; ".join(f"{len(ts)} {tasks_word} on {n} seed{'s' if n != 1 else ''}" for n, ts in sorted(seeds.items()))
    sizes = ", ".join(f"{n:,}" for n in sorted(examples))
    text = (f"{counts}; {sizes} test examples per task; the seed spread enters where there are 3 or more seeds"
            + (f". {note}" if note else ""))
    return graded(conds, f"Test accuracy of the full fine-tune minus zero-shot, per task (points)", note=text)


def precondition_evidence(zs, ft, gain, *, tasks_word: str = "tasks") -> str:
    """The words beside chapter 2's precondition verdict: per-task zero-shot and fine-tuned test
    accuracy (fractions, the fine-tunes' mean over seeds) and their gain (points), indexed by task.
    Ends at the mean accuracies, without a full stop (callers add to it)."""
    n_pos, small = int((gain > 0).sum()), gain[gain <= 5]
    return (f"The mean full fine-tune beats zero-shot on {n_pos}/{len(gain)} {tasks_word}, by more than 5 points on "
            f"{len(gain) - len(small)}; gain (points) min {gain.min():+.1f} ({gain.idxmin()}), mean "
            f"{gain.mean():+.1f}, max {gain.max():+.1f} ({gain.idxmax()}); gains of 5 points or less: "
            + (", ".join(f"{t} {g:+.1f}" for t, g in small.items()) or "none")
            + f". Mean test accuracy: zero-shot {100 * zs.mean():.1f} %, fine-tuned {100 * ft.mean():.1f} %")


def step_contrasts(frame: pd.DataFrame, column: str = "first_norm", T_values: Sequence[int] | None = None,
                   methods: Sequence[str] = ("task_arithmetic", "iso_c")) -> pd.DataFrame:
    """The loss of each step in T with its 95 % interval: per method and consecutive pair of T
    values, the normalized accuracy of the first suite's tasks at the smaller T minus at the larger
    (points; positive: the merge loses more with more tasks). Both merges are scored on the same
    test examples of those tasks with the same fine-tunes, so this is a paired contrast
    (:func:`pactlib.book.intervals.contrast`) over the seeds; at a T with several random task sets
    (``draw``), each seed's side is the mean of its sets. Only ``column="first_norm"`` (the shared
    tasks) is paired; the all-task mean changes its tasks with T.

    Returns:
        Columns ``method`` (display name), ``T_from``, ``T_to``, ``drop``, ``lo``, ``hi`` (points),
        ``n_seeds``, ``n_examples`` and ``interval`` (the :class:`~pactlib.book.intervals.Interval`).

    Raises:
        ValueError: ``column`` is not ``first_norm``, or the records carry no per-example outcomes
            (the message ends "recompute").
    """
    from pactlib.book.experiments.paired import restrict, rows
    from pactlib.book.intervals import NO_OUTCOMES, contrast, has_outcomes

    if column != "first_norm":
        raise ValueError(f"step_contrasts: only the shared tasks ('first_norm') are paired, got {column!r}")
    if T_values is not None:
        frame = frame[frame["T"].isin(list(T_values))]
    first = _first_tasks(frame)
    out = []
    for m in methods:
        by_T = {T: rows(frame, method=m, T=T) for T in sorted(frame["T"].unique())}
        by_T = {T: r for T, r in by_T.items() if r}
        for T, r in by_T.items():
            if not has_outcomes(r):
                raise ValueError(f"step_contrasts: {_GROWTH_METHODS.get(m, m)} at T = {T}: {NO_OUTCOMES}")
        Ts = list(by_T)
        for a, b in zip(Ts, Ts[1:]):
            side = lambda T: [restrict(r, first, testbed="shared") for r in by_T[T]]  # noqa: E731
            iv = contrast(side(a), side(b), metric="norm_acc")
            out.append(dict(method=_GROWTH_METHODS.get(m, m), T_from=int(a), T_to=int(b), drop=iv.estimate, lo=iv.lo,
                            hi=iv.hi, n_seeds=iv.n_seeds, n_examples=iv.n_examples, interval=iv))
    return pd.DataFrame(out, columns=["method", "T_from", "T_to", "drop", "lo", "hi", "n_seeds", "n_examples",
                                      "interval"])


def _first_tasks(frame: pd.DataFrame) -> list[str]:
    """The smallest suite's tasks: the ``norm_acc:<task>`` columns every record of its T has."""
    smallest = frame["T"].min()
    base = frame[(frame["T"] == smallest) & (frame["method"] != "fine-tuned")]
    return [c.removeprefix("metrics.norm_acc:") for c in base.columns
            if c.startswith("metrics.norm_acc:") and base[c].notna().all()]


def problem_verdict(frame: pd.DataFrame, *, T_values: Sequence[int] | None = None, note: str = "") -> dict:
    """The verdict on "merging loses more as T grows": one condition per method and step of T, the
    step's loss on the shared tasks (:func:`step_contrasts`) > 0 points.

    Returns:
        The verdict dict; not yet tested (with the reason) when the records carry no per-example
        outcomes.
    """
    from pactlib.book.intervals import NO_OUTCOMES
    from pactlib.book.verdicts import condition, graded, not_tested

    try:
        steps = step_contrasts(frame, T_values=T_values)
    except ValueError as e:
        if NO_OUTCOMES in str(e):
            return not_tested(f"merges of the book's suites (`{INTERFERENCE}`): {NO_OUTCOMES}"
                              + (f". {note}" if note else ""))
        raise
    conds = [condition(f"{r.method}, T = {r.T_from} → {r.T_to}: loss of the shared tasks", r.interval)
             for r in steps.itertuples()]
    ns = sorted(set(steps["n_seeds"]))
    text = (f"{' / '.join(map(str, ns))} seed(s), {int(steps['n_examples'].min()):,} test examples per shared task; "
            "paired: the shared tasks' test examples and fine-tunes are the same at every T")
    return graded(conds, "Normalized accuracy of the first suite's tasks at the smaller T minus at the larger (points)",
                  note=text + (f". {note}" if note else ""))


def testbed_meaning(claim: str, status: str, where: str) -> str:
    """One sentence on what a chapter-2 verdict means, chosen by its status (no numbers): ``claim``
    is the precondition's or the problem's label, ``where`` the testbed's name in words."""
    from pactlib.book.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_TESTED, PARTLY, REPRODUCED

    pre = "precondition" in claim
    what = ("fine-tuning helps every task" if pre else "merging loses more on the shared tasks as T grows")
    return {
        REPRODUCED: f"On {where}, {what}, beyond the sampling error of its test sets and seeds.",
        PARTLY: f"On {where}, {what} where the intervals decide it, and no case is shown to go the "
                             "other way.",
        INCONCLUSIVE: f"On {where}, the data do not decide whether {what}.",
        CONTRADICTED: f"On {where}, at least one case is shown to go against \"{what}\"; the merging chapters "
                        f"should be read with it in mind.",
        NOT_TESTED: f"On {where}, whether {what} is not graded yet: the verdict says why.",
    }[status]
