"""Evaluation of backbones with frozen task heads, and the α selection protocol (method.md §5).

- :func:`accuracy` -- one backbone state dict, one head, one task split -> accuracy in [0, 1].
- :func:`evaluate` -- one backbone, many tasks (the merged model is shared by every task).
- :func:`normalized` -- acc(t) / acc_ft(t), the paper's normalized accuracy.
- :func:`select_alpha` -- evaluate θ0 + α·D over an α grid on validation, pick the α with the
  best mean normalized accuracy, report test at that α, as one JSON-serialisable record.

Speed: the backbone module is built once per resolution and reused (weights are loaded into it
with ``load_state_dict``), and preprocessed images are cached per task split (keyed by the
identity of the ``TaskData.images`` tensor, so a reloaded split is preprocessed again).

Book: chapter "Evaluation protocol"; every results chapter calls :func:`select_alpha`.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from pactlib.heads import Head
from pactlib.models.efficientnet import backbone_for, preprocess

_PRE_CACHE: dict[tuple, tuple[weakref.ref, Tensor]] = {}
_PRE_CACHE_MAX = 64


def _inputs(data, resolution: int, limit: int | None) -> tuple[Tensor, Tensor]:
    """Preprocessed images (N', 3, R, R) and labels (N',) of ``data``, cached; N' = min(N, limit)."""
    images, labels = data.images, data.labels
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"task {getattr(data, 'task', '?')!r}: {images.shape[0]} images but {labels.shape[0]} labels"
        )
    n = images.shape[0] if limit is None else min(int(limit), images.shape[0])
    key = (id(images), images.data_ptr(), tuple(images.shape), resolution, n)
    hit = _PRE_CACHE.get(key)
    if hit is not None and hit[0]() is images:
        return hit[1], labels[:n]
    x = preprocess(images[:n], resolution)
    if len(_PRE_CACHE) >= _PRE_CACHE_MAX:
        _PRE_CACHE.pop(next(iter(_PRE_CACHE)))
    _PRE_CACHE[key] = (weakref.ref(images), x)
    return x, labels[:n]


def clear_cache() -> None:
    """Drop every cached preprocessed tensor."""
    _PRE_CACHE.clear()


@torch.no_grad()
def features(backbone_state_dict: Mapping[str, Tensor], x: Tensor, *, resolution: int = 32,
             batch_size: int = 256) -> Tensor:
    """Backbone features of preprocessed inputs.

    Args:
        backbone_state_dict: backbone weights (strict: exactly the Lite0 backbone keys).
        x: float (N, 3, R, R) from :func:`pactlib.models.efficientnet.preprocess`.

    Returns:
        float32 (N, 1280).

    Raises:
        RuntimeError: the state dict misses or adds keys, or a shape differs.
    """
    model = _load(backbone_state_dict, resolution)
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, x.shape[0], batch_size)])


def _load(backbone_state_dict: Mapping[str, Tensor], resolution: int):
    model = backbone_for(resolution)
    model.load_state_dict(dict(backbone_state_dict), strict=True)
    return model


@torch.no_grad()
def _acc_loaded(model, head: Head, data, *, resolution: int, batch_size: int, limit: int | None) -> float:
    x, y = _inputs(data, resolution, limit)
    if y.numel() == 0:
        raise ValueError(f"task {getattr(data, 'task', '?')!r}: no examples to evaluate")
    if len(data.classes) != head.num_classes:
        raise ValueError(
            f"task {getattr(data, 'task', '?')!r} has {len(data.classes)} classes but the head has "
            f"{head.num_classes}"
        )
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        pred = head.logits(model(x[i : i + batch_size])).argmax(1)
        correct += int((pred == y[i : i + batch_size]).sum())
    return correct / y.numel()


def accuracy(backbone_state_dict: Mapping[str, Tensor], head: Head, data, *, resolution: int = 32,
             batch_size: int = 256, limit: int | None = None) -> float:
    """Top-1 accuracy of backbone + frozen head on one task split.

    Args:
        backbone_state_dict: backbone weights (θ0, θt or a merge).
        head: the task's frozen :class:`~pactlib.heads.Head`.
        data: a ``TaskData`` (uint8 images (N, 3, 32, 32), int64 labels (N,), classes).
        resolution: network input side in pixels.
        limit: evaluate only the first ``limit`` examples (deterministic subset).

    Returns:
        accuracy in [0, 1].

    Raises:
        ValueError: empty split, or the head's class count differs from the task's.
        RuntimeError: incompatible state dict.
    """
    model = _load(backbone_state_dict, resolution)
    return _acc_loaded(model, head, data, resolution=resolution, batch_size=batch_size, limit=limit)


def evaluate(backbone_state_dict: Mapping[str, Tensor], heads: Mapping[str, Head],
             datas: Mapping[str, Any], *, resolution: int = 32, batch_size: int = 256,
             limit: int | None = None) -> dict[str, float]:
    """Accuracy of one backbone on several tasks: ``{task: acc}`` for every task of ``datas``.

    Raises:
        KeyError: a task in ``datas`` has no head.
    """
    missing = [t for t in datas if t not in heads]
    if missing:
        raise KeyError(f"no head for task(s) {missing}")
    model = _load(backbone_state_dict, resolution)
    return {t: _acc_loaded(model, heads[t], d, resolution=resolution, batch_size=batch_size, limit=limit)
            for t, d in datas.items()}


def normalized(acc: Mapping[str, float], acc_ft: Mapping[str, float]) -> dict[str, float]:
    """Normalized accuracy acc(t) / acc_ft(t) per task (method.md §5).

    Raises:
        KeyError: a task of ``acc`` has no fine-tuned accuracy. ValueError: acc_ft(t) = 0.
    """
    out = {}
    for t, a in acc.items():
        if t not in acc_ft:
            raise KeyError(f"no fine-tuned accuracy for task {t!r}")
        if acc_ft[t] <= 0:
            raise ValueError(f"fine-tuned accuracy of task {t!r} is {acc_ft[t]}: cannot normalize")
        out[t] = a / acc_ft[t]
    return out


def mean(values: Mapping[str, float]) -> float:
    """Mean over tasks (NaN for no task)."""
    return sum(values.values()) / len(values) if values else math.nan


def _split_record(acc: dict[str, float], acc_ft: Mapping[str, float]) -> dict:
    norm = normalized(acc, acc_ft)
    return {"acc": acc, "normalized": norm, "mean_acc": mean(acc), "mean_normalized": mean(norm)}


def select_alpha(
    merged_state: Callable[[float], Mapping[str, Tensor]],
    alphas: Sequence[float],
    *,
    heads: Mapping[str, Head],
    val: Mapping[str, Any],
    test: Mapping[str, Any],
    ft_val: Mapping[str, float],
    ft_test: Mapping[str, float],
    method: str,
    params: Mapping[str, Any] | None = None,
    seed: int | None = None,
    resolution: int = 32,
    batch_size: int = 256,
    limit: int | None = None,
    progress: Callable | None = None,
    **extra: Any,
) -> dict:
    """Choose α on validation by mean normalized accuracy, then evaluate test at that α (§5).

    Args:
        merged_state: α -> backbone state dict (the caller's θ0 + α·D).
        alphas: the α grid (method.md §5: TA/TIES 0.05..1.0, TSV-M/Iso/LoRA 0.1..3.0).
        heads: ``{task: Head}``.
        val, test: ``{task: TaskData}`` for the validation and test splits (same tasks).
        ft_val, ft_test: fine-tuned accuracies acc_ft(t) on each split (the normalizers).
        method: what is evaluated (e.g. ``"pact_iso_c"``); ``params``: its settings (α is added).
        seed: the seed of the fine-tuned models (None for deterministic).
        limit: cap on validation examples per task (test is always evaluated in full).
        progress: optional wrapper for the α loop (e.g. ``tqdm``).
        extra: further top-level fields of the record (``suite=...``, ``kind=...``).

    Returns:
        A record in :mod:`pactlib.records` form: ``method``, ``params`` (with ``alpha``),
        ``seed``, ``metrics`` = {``acc``, ``norm_acc`` (test means at the chosen α), ``val_acc``,
        ``val_norm_acc``, and per task ``acc:<task>``, ``norm_acc:<task>`` (test)}, plus
        ``alpha``, ``alphas``, ``on_edge`` (chosen α is the first or last grid point: widen the
        grid), ``curve`` (per α: validation mean acc and mean normalized acc), ``per_task``
        (``val`` / ``test`` -> ``acc`` / ``normalized`` -> {task: value}), ``val_limit`` and
        ``extra``. Ties in validation score go to the smaller α.

    Raises:
        ValueError: empty grid, or val and test name different tasks.
    """
    from pactlib.records import make_record

    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("select_alpha needs at least one alpha")
    if set(val) != set(test):
        raise ValueError(f"val and test name different tasks: {sorted(set(val) ^ set(test))}")
    curve, best, best_rec = [], None, None
    for a in sorted(alphas) if progress is None else progress(sorted(alphas)):
        acc = evaluate(merged_state(a), heads, val, resolution=resolution, batch_size=batch_size,
                       limit=limit)
        rec = _split_record(acc, ft_val)
        curve.append({"alpha": a, "mean_acc": rec["mean_acc"], "mean_normalized": rec["mean_normalized"]})
        if best is None or rec["mean_normalized"] > best_rec["mean_normalized"]:
            best, best_rec = a, rec
    test_rec = _split_record(
        evaluate(merged_state(best), heads, test, resolution=resolution, batch_size=batch_size), ft_test)
    metrics = {"acc": test_rec["mean_acc"], "norm_acc": test_rec["mean_normalized"],
               "val_acc": best_rec["mean_acc"], "val_norm_acc": best_rec["mean_normalized"]}
    for t in test_rec["acc"]:
        metrics[f"acc:{t}"] = test_rec["acc"][t]
        metrics[f"norm_acc:{t}"] = test_rec["normalized"][t]
    per_task = {s: {"acc": r["acc"], "normalized": r["normalized"]}
                for s, r in (("val", best_rec), ("test", test_rec))}
    return make_record(
        method, params={**(params or {}), "alpha": best}, seed=seed, metrics=metrics,
        alpha=best, alphas=sorted(alphas), on_edge=len(alphas) > 1 and best in (min(alphas), max(alphas)),
        curve=curve, per_task=per_task, val_limit=limit, **extra,
    )
