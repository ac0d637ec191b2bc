"""Running PACT on CLIP checkpoints (book chapter 12, "At paper scale").

Helpers for the chapter's two modes. With a user's checkpoint folder: find θ0 and the θt of a
suite (:func:`find_checkpoints`), tabulate what the matrix rule makes of their keys
(:func:`key_kinds`), report what the PACT filter does to every vision layer
(:func:`layer_frame`, data-free) and check the dataset folders (:func:`data_check`). Without
one: :func:`write_tiny_example` writes a tiny open_clip CLIP, fine-tuned-looking copies of it
and tiny image folders in the same layout, so the very same steps run on files made on the fly.

The chapter's compute cells store what its tables and figures show as records
(:func:`rule_records`, :func:`data_check_records`, ``pact-layer`` records of :func:`layer_frame`'s
rows); its present cells rebuild them from the records alone (:func:`rule_table`,
:func:`data_check_table`, :func:`plot_pact_layers`).

Nothing here downloads; checkpoints are read with :mod:`pactlib.models.clip`, datasets with
:mod:`pactlib.data.paper`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pactlib.matrix import DEFAULT_RULE, MatrixRule

__all__ = ["TINY_CLIP", "TinyExample", "write_tiny_example", "find_checkpoints", "key_kinds", "tower_of",
           "layer_frame", "data_check", "classifier_accuracy", "rule_records", "rule_table", "data_check_records",
           "data_check_table", "plot_pact_layers"]

#: A tiny open_clip ViT CLIP (width 32, 2 vision layers, 8 px patches on 32 px images): the
#: same key layout as ViT-B/32, small enough to build in a second.
TINY_CLIP = dict(
    embed_dim=16,
    vision_cfg=dict(image_size=32, layers=2, width=32, patch_size=8, head_width=16),
    text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1),
)
_VISION_PREFIXES = ("visual.", "vision_model.", "visual_projection.")
#: Leading wrapper prefixes a key may carry before its tower's name: the task_vectors / TSV
#: ``ImageEncoder`` files hold ``model.visual.*`` (``self.model``), DDP adds ``module.``.
_WRAPPERS = re.compile(r"^(?:(?:module|model|_orig_mod)\.)+")


def tower_of(key: str) -> str:
    """``"vision"`` for a vision-tower key of any CLIP layout (``visual.*``, ``vision_model.*``,
    ``visual_projection.*``, also behind ``model.`` / ``module.`` wrappers, as in the TSV files),
    else ``"text / shared"``."""
    return "vision" if _WRAPPERS.sub("", key).startswith(_VISION_PREFIXES) else "text / shared"


@dataclass(frozen=True)
class TinyExample:
    """What :func:`write_tiny_example` wrote: the checkpoint folder, task names, the data
    root (one image folder per task), the open_clip config and the class names per task."""

    checkpoint_dir: Path
    tasks: tuple[str, ...]
    data_root: Path
    arch: dict
    classes: dict[str, tuple[str, ...]]


def _tiny_clip_state(seed: int) -> dict[str, Tensor]:
    import open_clip

    with torch.random.fork_rng(devices=[]):  # open_clip initialises from the global RNG
        torch.manual_seed(seed)
        model = open_clip.CLIP(**TINY_CLIP)  # weights only: no tokenizer needed here
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def write_tiny_example(folder: str | Path, *, tasks: int = 3, rank: int = 2, scale: float = 0.05,
                       classes: int = 3, per_class: int = 4, pretrained_file: str = "zeroshot.pt",
                       finetuned_pattern: str = "{task}/finetuned.pt", names: Sequence[str] | None = None,
                       seed: int = 0, rule: MatrixRule = DEFAULT_RULE) -> TinyExample:
    """Write a tiny CLIP θ0, ``tasks`` fine-tuned-looking θt and tiny image folders.

    θ0 is a seeded random :data:`TINY_CLIP` (both towers, open_clip keys), saved with
    ``torch.save`` as a plain state dict at ``folder/<pretrained_file>``. Task t's checkpoint
    adds to every vision matrix layer a seeded rank-``rank`` update of relative size
    ``scale`` (in the layer's matrix view, so ``visual.proj`` is perturbed as the map it is)
    and ``scale``/10 relative noise to the other floating vision entries; the text tower and
    ``logit_scale`` stay as in θ0, as in the paper's fine-tunes. Data: for each task,
    ``folder/data/<task>/{train,test}/<class>/*.png`` (ImageFolder layout), ``per_class`` 32 px
    images per class and split, each class a colour plus noise. Tasks are called ``names``
    (default ``task1``, ``task2``, …).

    Returns:
        :class:`TinyExample`.

    Raises:
        ValueError: ``tasks`` < 2, ``rank`` < 1, ``scale`` <= 0, a pattern without ``{task}``,
            or ``names`` not of length ``tasks``.
    """
    from PIL import Image

    if tasks < 2 or rank < 1 or scale <= 0:
        raise ValueError(f"write_tiny_example: need tasks >= 2, rank >= 1, scale > 0; got {tasks}, {rank}, {scale}")
    if "{task}" not in finetuned_pattern:
        raise ValueError(f"finetuned_pattern {finetuned_pattern!r} has no '{{task}}'")
    folder = Path(folder)
    theta0 = _tiny_clip_state(seed)
    (folder / pretrained_file).parent.mkdir(parents=True, exist_ok=True)
    torch.save(theta0, folder / pretrained_file)
    gen = torch.Generator().manual_seed(seed + 1)
    names = tuple(names) if names is not None else tuple(f"task{t + 1}" for t in range(tasks))
    if len(names) != tasks:
        raise ValueError(f"write_tiny_example: {len(names)} names for {tasks} tasks")
    for name in names:
        theta = {}
        for key, w in theta0.items():
            if not key.startswith("visual.") or not torch.is_floating_point(w):
                theta[key] = w.clone()
            elif rule.kind(key, w) == "matrix":
                W = rule.view(key, w)  # (m, n)
                m, n = W.shape
                upd = torch.randn(m, rank, generator=gen) @ torch.randn(rank, n, generator=gen)
                upd *= scale * W.norm() / upd.norm()
                theta[key] = w + rule.unview(key, upd, w.shape)
            else:
                noise = torch.randn(w.shape, generator=gen)
                theta[key] = w + (scale / 10) * (w.norm() / max(1.0, w.numel() ** 0.5)) * noise
        path = folder / finetuned_pattern.format(task=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(theta, path)
    rng = np.random.default_rng(seed)
    class_names = {}
    for name in names:
        class_names[name] = tuple(f"{name} class {c}" for c in range(classes))
        colours = rng.integers(40, 216, size=(classes, 3))
        for split in ("train", "test"):
            for c, cname in enumerate(class_names[name]):
                d = folder / "data" / name / split / cname.replace(" ", "_")
                d.mkdir(parents=True, exist_ok=True)
                for i in range(per_class):
                    img = np.clip(colours[c] + rng.normal(0, 20, size=(32, 32, 3)), 0, 255).astype(np.uint8)
                    Image.fromarray(img).save(d / f"{split}_{i}.png")
    return TinyExample(folder, names, folder / "data", dict(TINY_CLIP), class_names)


def find_checkpoints(checkpoint_dir: str | Path, tasks: Sequence[str], *, pretrained_file: str,
                     finetuned_pattern: str) -> tuple[Path, list[Path]]:
    """θ0 and one θt per task inside ``checkpoint_dir``.

    ``finetuned_pattern`` is a path relative to ``checkpoint_dir`` with ``{task}`` standing for
    the task name, e.g. ``"{task}/finetuned.pt"`` or ``"{task}Val/finetuned.pt"`` (the
    task_vectors / TSV layouts).

    Raises:
        FileNotFoundError: the folder, θ0 or any θt is missing (all missing files are named,
            with the pattern used).
        ValueError: the pattern has no ``{task}``.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {root}")
    if "{task}" not in finetuned_pattern:
        raise ValueError(f"finetuned_pattern {finetuned_pattern!r} has no '{{task}}'")
    pre = root / pretrained_file
    fts = [root / finetuned_pattern.format(task=t) for t in tasks]
    missing = [str(p) for p in [pre, *fts] if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} checkpoint(s) missing under {root} (pretrained_file="
                                f"{pretrained_file!r}, finetuned_pattern={finetuned_pattern!r}): {missing[:6]}")
    return pre, fts


def key_kinds(state_dict: Mapping[str, Tensor], *, rule: MatrixRule = DEFAULT_RULE) -> pd.DataFrame:
    """Entries and values per (tower, kind) of a CLIP state dict under ``rule``.

    ``tower`` is "vision" for ``visual.*`` / ``vision_model.*`` / ``visual_projection.*`` keys,
    behind any ``model.`` / ``module.`` wrapper (:func:`tower_of`), and "text / shared" for the rest; ``kind`` is the rule's "matrix" / "other" / "buffer", with
    "matrix (stored transposed)" for keys such as ``visual.proj`` whose view is the transpose.
    """
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for key, t in state_dict.items():
        tower = tower_of(key)
        kind = rule.kind(key, t)
        if kind == "matrix" and rule.is_transposed(key):
            kind = "matrix (stored transposed)"
        r = rows.setdefault((tower, kind), {"entries": 0, "values": 0})
        r["entries"] += 1
        r["values"] += t.numel()
    out = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    out.index = pd.MultiIndex.from_tuples(out.index, names=["tower", "kind"])
    return out


def layer_frame(report, tasks: Sequence[str]) -> pd.DataFrame:
    """One row per (matrix layer, task) of a :class:`pactlib.PactReport`, in network order.

    Columns: layer (index in network order), key, m, n, task (name), core_rank, active_rank,
    lbw_rank, shield_rank, union_rank, capped, removed_energy (share of ‖Δt‖²_F the filter removed).
    """
    rows = []
    for i, lr in enumerate(report.layers):
        for t, name in enumerate(tasks):
            rows.append({"layer": i, "key": lr.key, "m": lr.m, "n": lr.n, "task": name, "core_rank": lr.core_rank,
                         "active_rank": lr.active_rank[t], "lbw_rank": lr.lbw_rank[t],
                         "shield_rank": lr.shield_rank[t], "union_rank": lr.union_rank[t],
                         "capped": bool(lr.capped[t]), "removed_energy": lr.removed_energy[t]})
    return pd.DataFrame(rows)


def data_check(data_root: str | Path, tasks: Sequence[str]) -> pd.DataFrame:
    """Which dataset folders of ``tasks`` are under ``data_root``, and what they hold.

    Per task: the folder found (:func:`pactlib.data.paper.task_root`), the number of classes and
    of train / test images (``val`` is used as test where a dataset has no test split, as
    :func:`pactlib.data.paper.load_paper_task` does), or the error that stops it. Indexing
    lists files; no image is decoded.
    """
    from pactlib.data import paper

    rows = []
    for t in tasks:
        row = {"task": t, "folder": "", "classes": np.nan, "train": np.nan, "test": np.nan, "status": "ok"}
        try:
            root = paper.task_root(data_root, t)
            row["folder"] = root.name
            train = paper.index_split(root, "train")
            test_split = "test" if paper.has_split(root, "test") else "val"
            test = paper.index_split(root, test_split, classes=train.classes)
            row.update(classes=len(train.classes), train=len(train), test=len(test))
            if test_split != "test":
                row["status"] = "ok (val used as test)"
        except (FileNotFoundError, ValueError) as exc:
            row["status"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        rows.append(row)
    return pd.DataFrame(rows).set_index("task")


@torch.no_grad()
def classifier_accuracy(classifier: torch.nn.Module, images: Tensor, labels: Tensor, *, batch_size: int = 256) -> float:
    """Top-1 accuracy in [0, 1] of ``classifier`` (images (B, 3, H, W) -> logits (B, C)) on
    uint8 ``images`` (N, 3, H, W) with int64 ``labels`` (N,), in batches of ``batch_size``.

    Raises:
        ValueError: no images, or images and labels of different lengths.
    """
    if len(images) == 0 or len(images) != len(labels):
        raise ValueError(f"classifier_accuracy: {len(images)} images and {len(labels)} labels")
    was_training = classifier.training
    classifier.eval()
    try:
        correct = sum(int((classifier(images[i:i + batch_size]).argmax(1) == labels[i:i + batch_size]).sum())
                      for i in range(0, len(images), batch_size))
    finally:
        classifier.train(was_training)
    return correct / len(images)


def _rule_view(rule: MatrixRule, key: str, t: Tensor) -> str:
    kind = rule.kind(key, t)
    if kind != "matrix":
        return kind
    m, n = rule.view(key, t).shape
    return f"matrix {m}×{n}" + (" (transposed)" if rule.is_transposed(key) else "")


def rule_differences(state_dict: Mapping[str, Tensor], rules: Mapping[str, MatrixRule]) -> pd.DataFrame:
    """Keys on which matrix rules disagree (kind or view), one row per key pattern.

    Block indices are folded (``resblocks.3.`` -> ``resblocks.*.``) so a 12-block tower gives
    one row per kind of layer. Columns: ``pattern``, ``keys`` (how many), ``shape`` (stored) and
    one column per rule name with its view: ``"matrix m×n"`` (``" (transposed)"`` when viewed
    transposed), ``"other"`` or ``"buffer"``. Empty when the rules agree on every key.
    """
    rows: dict[tuple, dict] = {}
    for key, t in state_dict.items():
        views = {name: _rule_view(rule, key, t) for name, rule in rules.items()}
        if len(set(views.values())) == 1:
            continue
        pattern = re.sub(r"\.\d+\.", ".*.", key)
        row = rows.setdefault((pattern, tuple(t.shape), tuple(views.values())),
                              {"pattern": pattern, "keys": 0, "shape": "×".join(map(str, t.shape)), **views})
        row["keys"] += 1
    return pd.DataFrame(list(rows.values()), columns=["pattern", "keys", "shape", *rules])


def rule_records(differences: pd.DataFrame, *, params: Mapping, seed: int | None) -> list[dict]:
    """:func:`rule_differences`' rows as records (``rule-key``; :func:`rule_table` reads them back).

    Each record holds ``pattern``, ``shape``, ``views`` ({rule name: view}) and the metric
    ``keys`` (how many keys the pattern stands for).
    """
    from pactlib.book.records import make_record

    rules = [c for c in differences.columns if c not in ("pattern", "keys", "shape")]
    return [make_record("rule-key", params=params, seed=seed, pattern=r["pattern"], shape=r["shape"],
                        views={name: r[name] for name in rules}, metrics={"keys": int(r["keys"])})
            for _, r in differences.iterrows()]


def rule_table(records, rules: Sequence[str]) -> pd.DataFrame:
    """The table of :func:`rule_differences` from :func:`rule_records`' records.

    Args:
        records: records (other methods than ``rule-key`` are ignored).
        rules: the rule names, in column order (every record's ``views`` has them).

    Returns:
        Columns ``pattern``, ``keys``, ``shape`` and one per rule; empty when no record.
    """
    rows = [{"pattern": r["pattern"], "keys": int(r["metrics"]["keys"]), "shape": r["shape"],
             **{name: r["views"][name] for name in rules}} for r in records if r["method"] == "rule-key"]
    return pd.DataFrame(rows, columns=["pattern", "keys", "shape", *rules])


def data_check_records(check: pd.DataFrame, *, params: Mapping) -> list[dict]:
    """:func:`data_check`'s rows as records (``data-check``; :func:`data_check_table` reads them
    back): ``task``, ``folder``, ``status`` and the metrics ``classes``, ``train``, ``test``
    (None where the folder could not be indexed)."""
    from pactlib.book.records import make_record

    return [make_record("data-check", params=params, seed=None, task=t, folder=r["folder"], status=r["status"],
                        metrics={"classes": r["classes"], "train": r["train"], "test": r["test"]})
            for t, r in check.iterrows()]


def data_check_table(records) -> pd.DataFrame:
    """The table of :func:`data_check` from :func:`data_check_records`' records (NaN for a
    missing count); empty (same columns) when there is none."""
    rows = [{"task": r["task"], "folder": r["folder"],
             **{k: np.nan if r["metrics"][k] is None else r["metrics"][k] for k in ("classes", "train", "test")},
             "status": r["status"]} for r in records if r["method"] == "data-check"]
    return pd.DataFrame(rows, columns=["task", "folder", "classes", "train", "test", "status"]).set_index("task")


def plot_pact_layers(frame: pd.DataFrame, axes) -> pd.DataFrame:
    """Draw PACT's effect per vision layer from the ``pact-layer`` records of a records frame.

    Left axis: the share of ‖Δt‖² the filter removes (line: mean over tasks, band: min–max).
    Right axis: the shield rank as a share of the input dimension n (mean over tasks) and the
    share of tasks whose shield hit the cap.

    Args:
        frame: a records frame with ``pact-layer`` rows (``layer``, ``key``, ``metrics.removed_energy``,
            ``metrics.shield_rank``, ``metrics.n``, ``metrics.capped``).
        axes: two matplotlib axes.

    Returns:
        The per-layer summary drawn: ``layer``, ``key``, ``removed`` (mean), ``removed_min``,
        ``removed_max``, ``shield`` (mean rank), ``n``, ``capped`` (share).

    Raises:
        ValueError: the frame has no ``pact-layer`` row.
    """
    rows = frame[frame["method"] == "pact-layer"] if "method" in frame else frame.iloc[:0]
    if rows.empty:
        raise ValueError("plot_pact_layers: no 'pact-layer' record")
    per_layer = rows.groupby(["layer", "key"], sort=True).agg(
        removed=("metrics.removed_energy", "mean"), removed_min=("metrics.removed_energy", "min"),
        removed_max=("metrics.removed_energy", "max"), shield=("metrics.shield_rank", "mean"),
        n=("metrics.n", "first"), capped=("metrics.capped", "mean")).reset_index()
    left, right = axes
    left.plot(per_layer["layer"], per_layer["removed"], marker="o", ms=3)
    left.fill_between(per_layer["layer"], per_layer["removed_min"], per_layer["removed_max"], alpha=0.25)
    left.set(xlabel="vision matrix layer", ylabel="removed share of ‖Δt‖²")
    right.plot(per_layer["layer"], per_layer["shield"] / per_layer["n"], marker="o", ms=3, label="shield rank / n")
    right.plot(per_layer["layer"], per_layer["capped"], marker="x", ms=4, ls=":", label="cap bound (share of tasks)")
    right.set(xlabel="vision matrix layer", ylim=(-0.05, 1.05))
    right.legend(fontsize=7)
    return per_layer
