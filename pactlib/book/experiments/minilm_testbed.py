"""Describing the MiniLM testbed (book chapter 2, part "MiniLM: a transformer on 14 text tasks").

The text tasks (from :data:`pactlib.data.text.TEXT_TASKS` and the text cache's manifest), a few
test texts, θ0's entries and its 36 maps, where full fine-tuning puts its change, the heads
measured before the zoo was built (``book/data/minilm_heads.jsonl``) and what things cost on the
build machine (``book/data/minilm_timing.jsonl``). Like :mod:`pactlib.book.experiments.testbed`
(whose ``run_records``, ``accuracy_table``, ``plot_accuracy``, ``recipe_table`` and
``timing_table`` serve both testbeds), nothing here trains or evaluates a model: every number
was measured when the zoo or the benchmark ran, and is read from their files.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pactlib.matrix import PRESETS, MatrixRule

__all__ = ["HEADS", "TIMING", "ROLES", "load_records", "load_pretrained", "task_table", "derived_notes",
           "sample_texts", "backbone_summary", "map_table", "trained_table", "delta_shares", "plot_delta_shares",
           "heads_frame", "head_table", "plot_heads", "wording_table", "timing_frame", "step_table", "plot_steps",
           "cost_table", "zoo_seconds", "fine_tune_gains"]

#: Records of ``bench/bench_minilm.py`` shipped with the book (paths relative to the book folder).
HEADS = "data/minilm_heads.jsonl"
TIMING = "data/minilm_timing.jsonl"

RULE: MatrixRule = PRESETS["hf_encoder"]

#: The six maps of a MiniLM layer: Hugging Face module -> (the paper's name, what it does).
ROLES = {
    "attention.self.query": ("q", "attention query"),
    "attention.self.key": ("k", "attention key"),
    "attention.self.value": ("v", "attention value"),
    "attention.output.dense": ("out", "attention output projection"),
    "intermediate.dense": ("fc1", "MLP up-projection"),
    "output.dense": ("fc2", "MLP down-projection"),
}
_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.weight$")

#: Groups of θ0's entries (:func:`entry_group`), in the order tables show them.
GROUPS = ("maps (Linear weights)", "embedding tables", "biases", "LayerNorm")


def entry_group(key: str, tensor: Tensor, rule: MatrixRule = RULE) -> str:
    """Which of :data:`GROUPS` a θ0 entry belongs to: a matrix of ``rule``, a 2-d embedding table,
    a LayerNorm scale or shift, or another bias."""
    if rule.kind(key, tensor) == "matrix":
        return GROUPS[0]
    if ".embeddings." in f".{key}" and tensor.ndim == 2:
        return GROUPS[1]
    if "LayerNorm" in key:
        return GROUPS[3]
    return GROUPS[2]


# ----------------------------------------------------------------------------- zoo files (read only)
def load_records(zoo_dir: str | Path, kind: str | None = None) -> list[dict]:
    """Every record of the MiniLM zoo's ``manifest.json`` (runs and heads), optionally of one
    ``kind`` (``"full"``, ``"lora"``, ``"head"``); ``[]`` when there is no manifest."""
    from pactlib.testbeds.zoo_files import read_json

    man = read_json(Path(zoo_dir) / "manifest.json") or {}
    return [r for r in man.get("entries", {}).values() if kind is None or r.get("kind") == kind]


def load_pretrained(zoo_dir: str | Path) -> tuple[dict[str, Tensor], dict]:
    """θ0 and its config from the zoo's ``pretrained.safetensors``, checked against the sha256
    in the manifest, keys in the model's own order; nothing is written.

    Raises:
        FileNotFoundError: no θ0 file, or its sha256 does not match (names the file).
    """
    from pactlib.testbeds.minilm.model import in_model_order
    from pactlib.testbeds.zoo_files import file_sha256, load_safetensors, read_json

    zoo_dir = Path(zoo_dir)
    path, pre = zoo_dir / "pretrained.safetensors", (read_json(zoo_dir / "manifest.json") or {}).get("pretrained", {})
    if not path.is_file() or not pre.get("config") or file_sha256(path) != pre.get("sha256"):
        raise FileNotFoundError(f"MiniLM θ0 missing or not the one in {zoo_dir / 'manifest.json'}: {path}; build the "
                                "zoo with python -m pactlib.testbeds.minilm.zoo --suite 14 --seeds 0")
    return in_model_order(pre["config"], load_safetensors(path)[0]), pre["config"]


# ----------------------------------------------------------------------------- tasks
def _smallest_suite(task: str) -> str:
    from pactlib.data.text import TEXT_SUITES

    hits = [s for s, tasks in TEXT_SUITES.items() if task in tasks]
    return min(hits, key=int) if hits else "—"


def task_table(tasks: Sequence[str], *, seed: int = 0, cache_dir=None) -> pd.DataFrame:
    """One row per text task: the smallest suite holding it, what one example is, classes,
    derived or not, source package, the texts per split of the cached split ``seed`` (NaN where
    the task is not cached; from the text cache's ``manifest.json``), licence and provenance.

    Raises:
        KeyError: an unknown task (lists the known ones).
    """
    from pactlib.data.text import TEXT_TASKS, text_cache_root

    unknown = [t for t in tasks if t not in TEXT_TASKS]
    if unknown:
        raise KeyError(f"unknown text task(s) {unknown}; known: {sorted(TEXT_TASKS)}")
    path = text_cache_root(cache_dir) / "manifest.json"
    files = json.loads(path.read_text(encoding="utf-8")).get("files", {}) if path.is_file() else {}
    rows = []
    for t in tasks:
        spec, counts = TEXT_TASKS[t], files.get(f"{t}-seed{seed}.json.gz", {}).get("counts", {})
        rows.append({"task": t, "suite": _smallest_suite(t), "unit": spec.unit, "classes": len(spec.classes),
                     "derived": "yes" if spec.derived else "no", "source": spec.source,
                     "train": counts.get("train", math.nan), "val": counts.get("val", math.nan),
                     "test": counts.get("test", math.nan), "license": spec.license, "provenance": spec.provenance})
    return pd.DataFrame(rows).set_index("task")


def derived_notes(tasks: Sequence[str]) -> dict[str, str]:
    """``{task: description}`` of the derived tasks among ``tasks`` (how their labels are made)."""
    from pactlib.data.text import TEXT_TASKS

    return {t: TEXT_TASKS[t].description for t in tasks if TEXT_TASKS[t].derived}


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def sample_texts(tasks: Sequence[str], *, seed: int = 0, classes: int = 2, width: int = 90, loader=None,
                 split: str = "test") -> pd.DataFrame:
    """The first ``split`` text of each of the first ``classes`` classes of every task, cut to
    ``width`` characters: rows (task, class), column ``text``.

    Args:
        loader: ``loader(task, split, *, seed, limit) -> TextData`` (default
            :func:`pactlib.data.text.load_text_task`, which builds a missing task from its source).
    """
    if loader is None:
        from pactlib.data.text import load_text_task as loader
    rows = []
    for t in tasks:
        d = loader(t, split, seed=seed, limit=64)  # stored class-interleaved: 64 texts hold every class's first
        labels = d.labels.tolist()
        for c in range(min(classes, len(d.classes))):
            if c in labels:
                rows.append({"task": t, "class": d.classes[c], "text": _short(d.texts[labels.index(c)], width)})
    return pd.DataFrame(rows).set_index(["task", "class"])


# ----------------------------------------------------------------------------- backbone
def backbone_summary(state_dict: Mapping[str, Tensor], *, rule: MatrixRule = RULE) -> pd.DataFrame:
    """Entries and values of θ0 by :data:`GROUPS`, with ``how merged``: maps as matrices (PACT and
    the SVD-based merges), the rest entry-wise by each base method's own rule.

    Returns:
        rows per group; ``entries`` and ``values`` as text with thousands separators (the table
        formats only floats), ``share of values`` in [0, 1].
    """
    rows: dict[str, dict[str, int]] = {}
    for key, t in state_dict.items():
        r = rows.setdefault(entry_group(key, t, rule), {"entries": 0, "values": 0})
        r["entries"] += 1
        r["values"] += t.numel()
    out = pd.DataFrame.from_dict(rows, orient="index").reindex([g for g in GROUPS if g in rows])
    out["share of values"] = out["values"] / out["values"].sum()
    out["how merged"] = ["as matrices (PACT, SVD merges)" if g == GROUPS[0] else "entry-wise (base method's rule)"
                         for g in out.index]
    out["entries"] = out["entries"].map("{:,}".format)
    out["values"] = out["values"].map("{:,}".format)
    return out


def map_table(state_dict: Mapping[str, Tensor], *, rule: MatrixRule = RULE) -> pd.DataFrame:
    """The maps of θ0 by role (:data:`ROLES`): the paper's name, what the map does, the Hugging
    Face module, its matrix view (m, n), the layers holding it and its values over all layers.

    Raises:
        ValueError: a matrix key that is not one of the six roles of an encoder layer.
    """
    rows: dict[str, dict] = {}
    for key in rule.matrix_keys(state_dict):
        m = _LAYER.match(key)
        if m is None or m.group(2) not in ROLES:
            raise ValueError(f"matrix key {key!r} is not one of a layer's maps {sorted(ROLES)}")
        module = m.group(2)
        mm, nn = rule.view(key, state_dict[key]).shape
        paper, what = ROLES[module]
        r = rows.setdefault(paper, {"map": paper, "what": what, "module": module, "m (out)": mm, "n (in)": nn,
                                    "layers": 0, "values": 0})
        r["layers"] += 1
        r["values"] += mm * nn
    out = pd.DataFrame(list(rows.values())).set_index("map")
    out["values"] = out["values"].map("{:,}".format)
    return out


def trained_table(state_dict: Mapping[str, Tensor], *, rank: int, alpha: float, targets: str = "all",
                  rule: MatrixRule = RULE) -> pd.DataFrame:
    """What each kind of fine-tune trains: rows ``full`` (every floating entry of θ0) and ``lora``
    (rank-``rank`` factors A (r, n) and B (m, r) on the maps ``targets`` selects,
    :data:`pactlib.testbeds.minilm.zoo.LORA_TARGETS`); columns: entries adapted, trained values,
    their share of θ0's values, and the scale alpha / r of the LoRA update."""
    from pactlib.testbeds.minilm.zoo import lora_keys

    floating = {k: t for k, t in state_dict.items() if torch.is_floating_point(t)}
    total = sum(t.numel() for t in floating.values())
    keys = lora_keys(state_dict, targets)
    lora_values = 0
    for k in keys:
        m, n = rule.view(k, state_dict[k]).shape
        lora_values += rank * (m + n)
    out = pd.DataFrame([
        {"kind": "full", "entries trained": len(floating), "trained values": total, "share of θ0": 1.0,
         "update": "θt − θ0, every entry"},
        {"kind": "lora", "entries trained": len(keys), "trained values": lora_values,
         "share of θ0": lora_values / total, "update": f"(α/r)·B A = {alpha / rank:g}·B A on the maps, r = {rank}"},
    ]).set_index("kind")
    out["trained values"] = out["trained values"].map("{:,}".format)
    return out


def delta_shares(zoo_dir: str | Path, tasks: Sequence[str], *, seed: int = 0, kind: str = "full",
                 pretrained: Mapping[str, Tensor] | None = None, rule: MatrixRule = RULE) -> pd.DataFrame:
    """Where a fine-tune puts its change: per task, the share of ‖Δt‖² (float64 sums) in each of
    :data:`GROUPS`, ‖Δt‖, and how many rows of the word-embedding table changed at all (rows of
    tokens the task's training texts never hold keep Δ = 0 under AdamW without weight decay).
    Reads one checkpoint at a time, each checked against the sha256 of its record.

    Raises:
        FileNotFoundError: a run of the zoo is missing or its sha256 does not match.
        ValueError: ``kind`` is not "full" (a LoRA Δ lies in the maps by construction).
    """
    from pactlib.testbeds.minilm.zoo import run_path
    from pactlib.testbeds.zoo_files import file_sha256, load_safetensors, read_json

    if kind != "full":
        raise ValueError(f"delta_shares reads full fine-tunes; a {kind!r} task vector lies in the maps by construction")
    zoo_dir = Path(zoo_dir)
    theta0 = pretrained if pretrained is not None else load_pretrained(zoo_dir)[0]
    word = next((k for k in theta0 if k.endswith("word_embeddings.weight")), None)
    rows = []
    for t in tasks:
        path = run_path(zoo_dir, kind, t, seed)
        rec = read_json(path.with_suffix(".json"))
        if rec is None or not path.is_file() or file_sha256(path) != rec.get("sha256"):
            raise FileNotFoundError(f"MiniLM {kind} run of {t!r} seed {seed} missing or invalid at {path}")
        theta = load_safetensors(path)[0]
        sq = dict.fromkeys(GROUPS, 0.0)
        for k, w0 in theta0.items():
            if torch.is_floating_point(w0):
                sq[entry_group(k, w0, rule)] += float(((theta[k].double() - w0.double()) ** 2).sum())
        total = sum(sq.values())
        row = {"task": t, **{g: v / total for g, v in sq.items()}, "‖Δ‖": math.sqrt(total)}
        if word is not None:
            changed = (theta[word] != theta0[word]).any(dim=1)
            row["embedding rows changed"] = int(changed.sum())
            row["of rows"] = int(changed.numel())
        rows.append(row)
    return pd.DataFrame(rows).set_index("task")


def plot_delta_shares(frame: pd.DataFrame, *, ax) -> None:
    """Stacked horizontal bars per task: the share (%) of ‖Δt‖² in each group of :data:`GROUPS`."""
    left = np.zeros(len(frame))
    y = np.arange(len(frame))
    for i, g in enumerate(GROUPS):
        v = 100 * frame[g].to_numpy()
        ax.barh(y, v, left=left, color=f"C{i}", label=g)
        left += v
    ax.set_yticks(y, frame.index, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="share of ‖Δt‖² (%)", xlim=(0, 100))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=len(GROUPS), fontsize=7, frameon=False)


# ----------------------------------------------------------------------------- heads
def _book_frame(path, default: str, what: str) -> pd.DataFrame:
    from pactlib.book.paths import book_path
    from pactlib.book.records import records_frame

    path = Path(path) if path is not None else book_path(default, must_exist=False)
    if not path.is_file():
        raise FileNotFoundError(f"no MiniLM {what} records at {path}; run bench/bench_minilm.py to write them")
    return records_frame(path)


def heads_frame(path: str | Path | None = None) -> pd.DataFrame:
    """The records of ``bench/bench_minilm.py --parts heads prompts`` (default: the book's
    :data:`HEADS`) as a frame.

    Raises:
        FileNotFoundError: no records at ``path``.
    """
    return _book_frame(path, HEADS, "head")


_HEAD_KINDS = ("prompt", "prototype", "probe")


def head_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per task (in file order): classes, the majority class's share and each head's validation
    accuracy at θ0 (%), with ``best`` the head kind that scores highest; last row: the means over
    tasks."""
    rows = frame[frame["method"] == "head_choice"]
    out = pd.DataFrame({"classes": rows["classes"].astype(int).to_numpy(),
                        "majority": 100 * rows["metrics.majority"].to_numpy(),
                        **{h: 100 * rows[f"metrics.val_acc:{h}"].to_numpy() for h in _HEAD_KINDS}},
                       index=pd.Index(rows["task"], name="task"))
    out["best"] = out[list(_HEAD_KINDS)].idxmax(axis=1)
    mean = out[["majority", *_HEAD_KINDS]].mean()
    out.loc["mean over tasks"] = {"classes": np.nan, **mean.to_dict(), "best": mean[list(_HEAD_KINDS)].idxmax()}
    out["classes"] = out["classes"].astype("Int64")  # a count: no decimals, <NA> on the mean row
    return out


def plot_heads(table: pd.DataFrame, *, ax) -> None:
    """Validation accuracy at θ0 (%) per task and head kind (markers), the majority class as a
    grey bar, from :func:`head_table` (its mean row left out)."""
    t = table.drop(index="mean over tasks", errors="ignore")
    x = np.arange(len(t))
    ax.bar(x, t["majority"], width=0.7, color="0.85", label="majority class")
    for i, (h, marker) in enumerate(zip(_HEAD_KINDS, ("o", "s", "^"))):
        ax.plot(x, t[h], marker, ms=5, color=f"C{i}", label=f"{h} head", ls="none")
    ax.set_xticks(x, t.index, rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="validation accuracy at θ0 (%)", ylim=(0, 100))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=4, fontsize=7, frameon=False)


def wording_table(frame: pd.DataFrame, *, width: int = 60) -> pd.DataFrame:
    """The class descriptions tried per task (records ``prompt_wording``): rows (task, wording),
    the first two descriptions cut to ``width`` characters, the validation accuracy (%) of the
    prompt head at θ0 and whether the wording is the one in use."""
    rows = frame[frame["method"] == "prompt_wording"]
    out = []
    for _, r in rows.iterrows():
        prompts = list(r["params.prompts"])
        out.append({"task": r["task"], "wording": int(r["wording"]),
                    "descriptions": " | ".join(_short(p, width) for p in prompts[:2]) + (" | …" if len(prompts) > 2 else ""),
                    "val acc": 100 * r["metrics.val_acc:prompt"], "in use": "yes" if bool(r["in_use"]) else ""})
    return pd.DataFrame(out).set_index(["task", "wording"])


# ----------------------------------------------------------------------------- costs
def timing_frame(path: str | Path | None = None) -> pd.DataFrame:
    """The records of ``bench/bench_minilm.py`` timing parts (default: the book's :data:`TIMING`).

    Raises:
        FileNotFoundError: no records at ``path``.
    """
    return _book_frame(path, TIMING, "timing")


def step_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Seconds per fine-tuning step (one thread) by token budget, batch size and kind: rows
    (tokens, batch), columns ``full`` and ``lora``, plus texts per second of the full step."""
    s = frame[frame["method"] == "step_time"]
    out = s.pivot_table(index=["params.max_tokens", "params.batch_size"], columns="params.kind",
                        values="metrics.seconds_per_step")
    out.index = pd.MultiIndex.from_tuples([(int(t), int(b)) for t, b in out.index], names=["tokens", "batch"])
    out.columns.name = None
    out["full: texts/s"] = out.index.get_level_values("batch") / out["full"]
    return out


def plot_steps(table: pd.DataFrame, *, ax) -> None:
    """Grouped bars of :func:`step_table`: seconds per step of full and LoRA fine-tuning per
    (tokens, batch)."""
    x = np.arange(len(table))
    for j, (kind, label) in enumerate((("full", "full fine-tune"), ("lora", "LoRA fine-tune"))):
        ax.bar(x + (j - 0.5) * 0.38, table[kind], width=0.36, color=f"C{j + 1}", label=label)
    ax.set_xticks(x, [f"{t} tokens\nbatch {b}" for t, b in table.index], fontsize=7)
    ax.set(ylabel="seconds per step (1 thread)")
    ax.legend(fontsize=7, frameon=False)


def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """What the book's MiniLM work costs on one thread, one row per item (seconds, and the amount
    it covers): import and reading of θ0, evaluation throughput at 16 and 32 tokens, a fine-tune
    of each kind (mean over the benchmark's tasks), the first load of the merge testbed, one
    evaluation of its capped validation split, and each timed merge with its α search.

    Raises:
        ValueError: the frame lacks the ``load``, ``throughput`` or ``merge`` records.
    """
    rows = []

    def one(method: str) -> pd.DataFrame:
        sel = frame[frame["method"] == method]
        if sel.empty:
            raise ValueError(f"no {method!r} records in the MiniLM timing frame")
        return sel

    ld = one("load").iloc[-1]
    rows.append(("import transformers", ld["metrics.import_seconds"], "once per kernel"))
    rows.append(("read θ0 and the tokenizer", ld["metrics.model_seconds"] + ld["metrics.tokenizer_seconds"],
                 f"{int(ld['metrics.parameters']):,} parameters"))
    for _, r in one("throughput").sort_values("params.max_tokens").iterrows():
        rows.append((f"evaluate 1,000 texts at ≤ {int(r['params.max_tokens'])} tokens",
                     1000 / r["metrics.seq_per_s"], f"{r['metrics.seq_per_s']:.0f} texts/s"))
    ft = frame[frame["method"] == "finetune"]
    for kind, g in ft.groupby("kind", sort=True):
        rows.append((f"one {kind} fine-tune (train only)", g["metrics.train_seconds"].mean(),
                     f"mean of {len(g)} tasks, {g['metrics.train_seconds'].min():.0f}–{g['metrics.train_seconds'].max():.0f} s"))
    merges = one("merge_cost")
    m0 = merges.iloc[0]
    tb = m0.get("testbed", "the merge testbed")
    rows.append((f"first load of {tb}", m0["metrics.load_seconds"],
                 f"acc_ft and zero-shot on {int(m0['metrics.test_texts']):,} test + {int(m0['metrics.val_texts']):,} val texts"))
    rows.append((f"one validation evaluation of {tb}", m0["metrics.eval_val_seconds"],
                 f"{int(m0['metrics.val_texts']):,} texts"))
    for _, r in merges.iterrows():
        rows.append((f"{r['params.method']} with its α search", r["metrics.seconds"],
                     f"{int(r['params.alphas'])} α on val, then test; merge alone {r['metrics.merge_seconds']:.1f} s"))
    return pd.DataFrame(rows, columns=["item", "seconds", "covers"]).set_index("item")


def zoo_seconds(zoo_records: Sequence[Mapping], *, tasks: Sequence[str], seeds: Sequence[int]) -> pd.DataFrame:
    """Wall-clock seconds the zoo's runs took (fine-tune and evaluation, ``seconds`` of each run
    record) and its heads (``seconds`` of each head record), by kind, over ``tasks`` × ``seeds``;
    rows ``head``, ``full``, ``lora`` (those present) with ``runs``, ``seconds`` and ``minutes``."""
    wanted, seeds = set(tasks), {int(s) for s in seeds}
    rows: dict[str, list[float]] = {}
    for r in zoo_records:
        if r.get("task") not in wanted:
            continue
        kind = r.get("kind")
        if kind == "head" or (kind in ("full", "lora") and int(r.get("seed", -1)) in seeds):
            rows.setdefault(kind, []).append(float(r.get("seconds") or 0.0))
    order = [k for k in ("head", "full", "lora") if k in rows]
    out = pd.DataFrame({"runs": [len(rows[k]) for k in order], "seconds": [sum(rows[k]) for k in order]}, index=order)
    out["minutes"] = out["seconds"] / 60
    return out


def fine_tune_gains(runs: pd.DataFrame, kind: str = "full") -> tuple[pd.Series, pd.Series, pd.Series]:
    """From a frame of :func:`pactlib.book.experiments.testbed.run_records` records: per task the
    zero-shot test accuracy, the mean fine-tuned test accuracy of ``kind`` over seeds, and the gain
    in points (fine-tuned − zero-shot), all indexed by task in suite order.

    Raises:
        ValueError: no ``kind`` runs in the frame.
    """
    zs = runs[runs["method"] == "zero-shot"].set_index("task")["metrics.acc"]
    ft = runs[runs["method"] == kind].groupby("task", sort=False)["metrics.acc"].mean()
    if ft.empty:
        raise ValueError(f"no {kind!r} runs in the frame")
    zs = zs.reindex(ft.index)
    return zs, ft, 100 * (ft - zs)
