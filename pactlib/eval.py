"""Evaluation of backbones with frozen task heads, and the α selection protocol (book/method.md, protocol).

- :func:`accuracy` -- one backbone state dict, one head, one task split -> accuracy in [0, 1].
- :func:`evaluate` -- one backbone, many tasks (the merged model is shared by every task).
- :func:`normalized` -- acc(t) / acc_ft(t), the paper's normalized accuracy.
- :func:`select_alpha` -- evaluate θ0 + α·D over an α grid on validation, pick the α with the
  best mean normalized accuracy, report test at that α, as one JSON-serialisable record. The
  evaluation is pluggable (``evaluate_fn``), so the CLIP path shares it.
- :func:`clip_evaluate` / :func:`clip_accuracy` / :func:`clip_evaluator` -- the same for CLIP
  vision towers (paper scale): one merged tower, one zero-shot head per task.

Speed: the backbone module is built once per resolution and reused (weights are loaded into it
with ``load_state_dict``), every BatchNorm is folded into its convolution before the forward
passes (:func:`fold_batchnorm`), and preprocessed images are cached per task split (keyed by the
identity of the ``TaskData.images`` tensor, so a reloaded split is preprocessed again).

Book: chapter "Evaluation protocol"; every results chapter calls :func:`select_alpha`.
"""
from __future__ import annotations

import math
from functools import lru_cache
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from pactlib.testbeds.lite0.heads import Head
from pactlib.models.efficientnet import backbone_for, preprocess
from pactlib.outcomes import Scores, packed, scores

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
    model = _load(backbone_state_dict, resolution, fold=False)
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, x.shape[0], batch_size)])


#: (convolution, BatchNorm) attribute pairs of the Lite0 backbone (efficientnet_lite_pytorch): the
#: stem and the head on the model, up to three per MBConv block. Every BatchNorm follows its
#: convolution directly, so each pair folds into one convolution with a bias.
_TOP_PAIRS = (("_conv_stem", "_bn0"), ("_conv_head", "_bn1"))
_BLOCK_PAIRS = (("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"), ("_project_conv", "_bn2"))


def fold_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of an eval-mode Lite0 backbone with every BatchNorm folded into the convolution
    before it (``torch.nn.utils.fusion.fuse_conv_bn_eval``; the BatchNorm becomes ``Identity``).

    The copy computes the same function in exact arithmetic (eval-mode BatchNorm is affine); in
    float32 its features differ from the model's by rounding only. ``model`` is not changed.

    Raises:
        ValueError: ``model`` is in training mode, or a convolution has no BatchNorm to fold.
    """
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    if model.training:
        raise ValueError("fold_batchnorm: the model must be in eval mode (BatchNorm uses running statistics)")
    model = copy.deepcopy(model)
    owners = [(model, _TOP_PAIRS)] + [(block, _BLOCK_PAIRS) for block in model._blocks]
    for owner, pairs in owners:
        for conv, bn in pairs:
            if hasattr(owner, conv):
                setattr(owner, conv, fuse_conv_bn_eval(getattr(owner, conv), getattr(owner, bn)))
                setattr(owner, bn, torch.nn.Identity())
    left = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if left:
        raise ValueError(f"fold_batchnorm: BatchNorm layers without a convolution to fold into: {left}")
    return model


def _pairs(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, str]]:
    """(owner, convolution attribute, BatchNorm attribute) of every conv+BN pair of a Lite0 backbone."""
    owners = [(model, _TOP_PAIRS)] + [(block, _BLOCK_PAIRS) for block in model._blocks]
    return [(owner, c, b) for owner, pairs in owners for c, b in pairs if hasattr(owner, c)]


def pad_in_convolution(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every symmetric "same" padding of its ``Conv2dStaticSamePadding`` layers done
    by the convolution itself (``padding=(p, p)``) instead of a ``ZeroPad2d`` copy of the input
    before it; asymmetric ones (stride 2 on an even side) stay. The same zeros enter the same
    sums: the same function, up to the rounding of whichever convolution algorithm torch picks
    (tests/test_eval.py). Changes ``model`` in place and returns it."""
    for mod in model.modules():
        pad = getattr(mod, "static_padding", None)
        if isinstance(pad, torch.nn.ZeroPad2d) and isinstance(mod, torch.nn.Conv2d):
            left, right, top, bottom = pad.padding
            if left == right and top == bottom and mod.padding == (0, 0):
                mod.padding = (top, left)
                mod.static_padding = torch.nn.Identity()
    return model


@lru_cache(maxsize=4)
def _folded_module(resolution: int) -> torch.nn.Module:
    """One evaluation copy of the backbone per resolution: BatchNorm folded (:func:`fold_batchnorm`),
    symmetric padding in the convolutions (:func:`pad_in_convolution`), channels_last; :func:`_load`
    overwrites its weights (every parameter is a folded convolution's weight or bias)."""
    with torch.inference_mode(False):
        return pad_in_convolution(fold_batchnorm(backbone_for(resolution))).to(memory_format=torch.channels_last)


def _load(backbone_state_dict: Mapping[str, Tensor], resolution: int, *, fold: bool = True):
    # The weights go into the shared module (strict: keys and shapes are checked there). With
    # ``fold``, every BatchNorm is then folded into its convolution (fold_batchnorm's values,
    # written into a folded module kept per resolution, so nothing is copied but the weights):
    # the same function up to float32 rounding, fewer passes over the activations; and the
    # symmetric paddings are the convolutions' own (pad_in_convolution: no padded copies).
    # channels_last: the depthwise/pointwise convolutions of Lite0 run faster on CPU in this
    # layout. Both were chosen by timing side by side (bench/bench_eval.py, records in
    # book/data/eval_speed.jsonl). :func:`features` (head fitting in the zoo) keeps the unfolded
    # forward, so the zoo's heads depend on the training code only, not on how evaluation is sped up.
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    model = backbone_for(resolution)
    model.load_state_dict(dict(backbone_state_dict), strict=True)
    if not fold:
        return model.to(memory_format=torch.channels_last)
    folded = _folded_module(resolution)
    with torch.no_grad():
        for (owner, c, b), (fowner, fc, _) in zip(_pairs(model), _pairs(folded)):
            conv, bn, target = getattr(owner, c), getattr(owner, b), getattr(fowner, fc)
            w, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                           bn.weight, bn.bias)
            target.weight.copy_(w)
            target.bias.copy_(bias)
    return folded


def accuracy(backbone_state_dict: Mapping[str, Tensor], head: Head, data, *, resolution: int = 32,
             batch_size: int = 256, limit: int | None = None) -> float:
    """Top-1 accuracy of backbone + frozen head on one task split.

    Args:
        backbone_state_dict: backbone weights (θ0, θt or a merge).
        head: the task's frozen :class:`~pactlib.testbeds.lite0.heads.Head`.
        data: a ``TaskData`` (uint8 images (N, 3, 32, 32), int64 labels (N,), classes).
        resolution: network input side in pixels.
        limit: evaluate only the first ``limit`` examples (deterministic subset).

    Returns:
        accuracy in [0, 1].

    Raises:
        ValueError: empty split, or the head's class count differs from the task's.
        RuntimeError: incompatible state dict.
    """
    task = getattr(data, "task", "?")
    return evaluate(backbone_state_dict, {task: head}, {task: data}, resolution=resolution,
                    batch_size=batch_size, limit=limit)[task]


@torch.no_grad()
def evaluate(backbone_state_dict: Mapping[str, Tensor], heads: Mapping[str, Head],
             datas: Mapping[str, Any], *, resolution: int = 32, batch_size: int = 256,
             limit: int | None = None) -> Scores:
    """Accuracy of one backbone on several tasks: ``{task: acc}`` for every task of ``datas``, a
    :class:`~pactlib.outcomes.Scores` whose ``outcomes`` hold each example's correctness.

    Raises:
        KeyError: a task in ``datas`` has no head.
    """
    missing = [t for t in datas if t not in heads]
    if missing:
        raise KeyError(f"no head for task(s) {missing}")
    model = _load(backbone_state_dict, resolution)
    # The backbone is shared: run every task's images through it in full batches, then apply
    # each task's head to its own slice of the features.
    xs, ys = {}, {}
    for t, d in datas.items():
        xs[t], ys[t] = _inputs(d, resolution, limit)
        if ys[t].numel() == 0:
            raise ValueError(f"task {t!r}: no examples to evaluate")
        if len(d.classes) != heads[t].num_classes:
            raise ValueError(f"task {t!r} has {len(d.classes)} classes but the head has {heads[t].num_classes}")
    x = torch.cat(list(xs.values()))
    feats = torch.cat([model(x[i : i + batch_size].contiguous(memory_format=torch.channels_last))
                       for i in range(0, x.shape[0], batch_size)])
    correct, start = {}, 0
    for t in xs:
        n = ys[t].numel()
        pred = heads[t].logits(feats[start : start + n]).argmax(1)
        correct[t] = pred == ys[t]
        start += n
    return scores(correct)


def normalized(acc: Mapping[str, float], acc_ft: Mapping[str, float]) -> dict[str, float]:
    """Normalized accuracy acc(t) / acc_ft(t) per task (book/method.md, protocol).

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


def _midpoint(a: float, b: float) -> float:
    """Geometric midpoint √(a·b) of two α values (arithmetic when one is <= 0), rounded to 6 places."""
    return round(math.sqrt(a * b) if a > 0 and b > 0 else (a + b) / 2, 6)


def select_alpha(
    merged_state: Callable[[float], Mapping[str, Tensor]],
    alphas: Sequence[float],
    *,
    heads: Mapping[str, Head] | None = None,
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
    evaluate_fn: Callable[..., Mapping[str, float]] | None = None,
    widen: int = 0,
    widen_factor: float = 1.5,
    refine: int = 0,
    **extra: Any,
) -> dict:
    """Choose α on validation by mean normalized accuracy, then evaluate test at that α (book/method.md, protocol).

    book/method.md, protocol: the grid is widened when the best α sits on its edge. With ``widen > 0``,
    while the best α is the largest (smallest) α evaluated, one more α = largest × ``widen_factor``
    (smallest / ``widen_factor``) is evaluated, at most ``widen`` extra points in all.

    Coarse to fine: with ``refine > 0``, after the grid (and any widening) each round evaluates
    the midpoints between the best α and its two neighbours among the α values evaluated so far —
    geometric midpoints √(a·b) (α is a scale; arithmetic when an end is 0) — at most 2 new α per
    round; each round halves, on a log scale, the bracket around the best α. Whether refining
    pays on the book's testbed is measured in chapter 5, "How α is searched"
    (``book/data/alpha_search.jsonl``, ``bench/bench_alpha_search.py``); the book does not refine.

    Args:
        merged_state: α -> backbone state dict (the caller's θ0 + α·D).
        alphas: the α grid (book/method.md, protocol: TA/TIES 0.05..1.0, TSV-M/Iso/LoRA 0.1..3.0).
        heads: ``{task: Head}`` for the Lite0 testbed (evaluated with :func:`evaluate`).
        val, test: ``{task: TaskData}`` for the validation and test splits (same tasks).
        ft_val, ft_test: fine-tuned accuracies acc_ft(t) on each split (the normalizers).
        method: what is evaluated (e.g. ``"pact_iso_c"``); ``params``: its settings (α is added).
        seed: the seed of the fine-tuned models (None for deterministic).
        limit: cap on validation examples per task (test is always evaluated in full).
        progress: optional wrapper for the α loop (e.g. ``tqdm``).
        evaluate_fn: instead of ``heads``: ``fn(state_dict, datas, *, limit) -> {task: acc}``
            (e.g. :func:`clip_evaluator` for CLIP); ``resolution`` / ``batch_size`` are then unused.
        widen: most extra α values evaluated beyond the grid's edges (0: the grid as given).
        widen_factor: geometric step (> 1) of those extra values.
        refine: rounds of coarse-to-fine refinement around the best α (0: none).
        extra: further top-level fields of the record (``suite=...``, ``kind=...``).

    Returns:
        A record in :mod:`pactlib.book.records` form: ``method``, ``params`` (with ``alpha``),
        ``seed``, ``metrics`` = {``acc``, ``norm_acc`` (test means at the chosen α), ``val_acc``,
        ``val_norm_acc``, and per task ``acc:<task>``, ``norm_acc:<task>`` (test)}, plus
        ``alpha``, ``alphas`` (every α evaluated, extra ones included), ``widened`` (the extra α
        values beyond the edges), ``refined`` (the α added by refinement), ``on_edge`` (the
        chosen α is still the first or last α evaluated), ``curve`` (per α: validation mean acc
        and mean normalized acc), ``per_task`` (``val`` / ``test`` -> ``acc`` / ``normalized`` ->
        {task: value}), ``val_limit``, ``outcomes`` (``{"test": {task: packed}}``, each test
        example's correctness at the chosen α, :func:`pactlib.outcomes.pack`; only when
        ``evaluate_fn`` returns :class:`~pactlib.outcomes.Scores`) and ``extra``. Ties in validation score go to the smaller α.

    Raises:
        ValueError: empty grid, val and test name different tasks, not exactly one of
            ``heads`` and ``evaluate_fn`` given, ``widen`` < 0, ``widen_factor`` <= 1 or
            ``refine`` < 0.
    """
    from pactlib.book.records import make_record

    if (heads is None) == (evaluate_fn is None):
        raise ValueError("select_alpha needs exactly one of heads= (Lite0 testbed) and evaluate_fn=")
    if evaluate_fn is None:
        def evaluate_fn(sd, datas, *, limit=None):
            return evaluate(sd, heads, datas, resolution=resolution, batch_size=batch_size, limit=limit)

    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("select_alpha needs at least one alpha")
    if set(val) != set(test):
        raise ValueError(f"val and test name different tasks: {sorted(set(val) ^ set(test))}")
    if widen < 0 or widen_factor <= 1:
        raise ValueError(f"select_alpha: widen must be >= 0 and widen_factor > 1, got {widen}, {widen_factor}")
    if refine < 0:
        raise ValueError(f"select_alpha: refine must be >= 0, got {refine}")
    curve, best, best_rec = [], None, None

    def score(a: float) -> None:
        nonlocal best, best_rec
        rec = _split_record(dict(evaluate_fn(merged_state(a), val, limit=limit)), ft_val)
        curve.append({"alpha": a, "mean_acc": rec["mean_acc"], "mean_normalized": rec["mean_normalized"]})
        better = best is None or rec["mean_normalized"] > best_rec["mean_normalized"] or (
            rec["mean_normalized"] == best_rec["mean_normalized"] and a < best)
        if better:
            best, best_rec = a, rec

    for a in sorted(alphas) if progress is None else progress(sorted(alphas)):
        score(a)
    widened: list[float] = []
    while len(alphas) > 1 and len(widened) < widen:
        lo, hi = min(alphas + widened), max(alphas + widened)
        if best == hi:
            a = round(hi * widen_factor, 6)
        elif best == lo and lo > 0:
            a = round(lo / widen_factor, 6)
        else:
            break
        widened.append(a)
        score(a)
    refined: list[float] = []
    for _ in range(refine):
        pts = sorted(set(alphas + widened + refined))
        i = pts.index(best)
        new = [m for m in (_midpoint(pts[i - 1], best) if i > 0 else None,
                           _midpoint(best, pts[i + 1]) if i + 1 < len(pts) else None)
               if m is not None and m not in pts]
        if not new:
            break
        for a in new:
            refined.append(a)
            score(a)
    curve.sort(key=lambda c: c["alpha"])
    grid_all = sorted(set(alphas + widened + refined))
    test_scores = evaluate_fn(merged_state(best), test, limit=None)
    test_rec = _split_record(dict(test_scores), ft_test)
    test_outcomes = packed(test_scores)
    metrics = {"acc": test_rec["mean_acc"], "norm_acc": test_rec["mean_normalized"],
               "val_acc": best_rec["mean_acc"], "val_norm_acc": best_rec["mean_normalized"]}
    for t in test_rec["acc"]:
        metrics[f"acc:{t}"] = test_rec["acc"][t]
        metrics[f"norm_acc:{t}"] = test_rec["normalized"][t]
    per_task = {s: {"acc": r["acc"], "normalized": r["normalized"]}
                for s, r in (("val", best_rec), ("test", test_rec))}
    return make_record(
        method, params={**(params or {}), "alpha": best}, seed=seed, metrics=metrics,
        alpha=best, alphas=grid_all, widened=widened, refined=refined,
        on_edge=len(grid_all) > 1 and best in (grid_all[0], grid_all[-1]), curve=curve, per_task=per_task, val_limit=limit,
        **({"outcomes": {"test": test_outcomes}} if test_outcomes else {}), **extra,
    )


# --------------------------------------------------------------------------- CLIP (paper scale)
#
# The paper's models are CLIP image encoders with one fixed zero-shot head per task: every task
# shares the (merged) vision tower, only the (C, d) class-embedding matrix changes. The functions
# below load the merged tower once into one ClipClassifier and swap heads per task.

#: What :func:`clip_evaluate` accepts as a task's head: (C, d) class embeddings (the
#: classifier's scale is used), a ``(embeddings, scale)`` pair as
#: :func:`pactlib.models.clip.read_head` returns, or a ``ClipClassifier`` (its ``head`` and
#: ``scale``; its own vision tower is not used).
ClipHead = Any


def _clip_head(task: str, head: ClipHead, default_scale: float, dim: int) -> tuple[Tensor, float]:
    """(C, d) float head and positive scale of ``task``, checked against the feature dim ``dim``."""
    from pactlib.models.clip import ClipClassifier

    if isinstance(head, ClipClassifier):
        h, scale = head.head, head.scale
    elif isinstance(head, tuple) and len(head) == 2 and isinstance(head[0], Tensor):
        h, scale = head[0], float(head[1])
    elif isinstance(head, Tensor):
        h, scale = head, default_scale
    else:
        raise TypeError(f"task {task!r}: a head must be a (C, d) tensor, a (tensor, scale) pair or a "
                        f"ClipClassifier, got {type(head).__name__}")
    if h.ndim != 2 or h.shape[0] == 0:
        raise ValueError(f"task {task!r}: head must be (C, d) with C >= 1, got shape {tuple(h.shape)}")
    if h.shape[1] != dim:
        raise ValueError(f"task {task!r}: head has embedding dim {h.shape[1]} but the image features "
                         f"have {dim} (a head of another CLIP architecture?)")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"task {task!r}: head scale must be finite and > 0, got {scale}")
    return h.detach().float(), scale


def _clip_inputs(task: str, data, num_classes: int, size: int, *, limit: int | None,
                 resize: bool) -> tuple[Tensor, Tensor]:
    """Checked (images[:n], labels[:n]) of one split; n = min(N, limit)."""
    images, labels = data.images, data.labels
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"task {task!r}: images must be (N, 3, H, W), got shape {tuple(images.shape)}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"task {task!r}: {images.shape[0]} images but {labels.shape[0]} labels")
    if limit is not None and int(limit) < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    n = images.shape[0] if limit is None else min(int(limit), images.shape[0])
    if n == 0:
        raise ValueError(f"task {task!r}: no examples to evaluate")
    if len(data.classes) != num_classes:
        raise ValueError(f"task {task!r} has {len(data.classes)} classes but its head has {num_classes}")
    y = labels[:n].long()
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ValueError(f"task {task!r}: labels must lie in [0, {num_classes}), found "
                         f"{int(y.min())}..{int(y.max())}")
    if tuple(images.shape[-2:]) != (size, size) and not resize:
        raise ValueError(
            f"task {task!r}: images are {images.shape[-2]}x{images.shape[-1]} px but the classifier "
            f"expects {size}x{size}; load the task with image_size={size} (e.g. "
            f"pactlib.data.paper.load_paper_task(..., image_size={size})) or pass resize=True")
    return images[:n], y.cpu()


@torch.no_grad()
def clip_evaluate(
    vision_state_dict,
    heads: Mapping[str, ClipHead],
    datas: Mapping[str, Any],
    *,
    classifier=None,
    batch_size: int = 256,
    limit: int | None = None,
    device: str | torch.device | None = None,
    resize: bool = False,
    progress: bool = True,
    trust_pickle: bool = False,
) -> dict[str, float]:
    """Top-1 accuracy of one CLIP vision tower (θ0, θt or a merge) on several tasks.

    The tower is loaded once into ``classifier`` (its module is reused for every task); each
    task then gets its own zero-shot head: logits = s · f̂ Hᵀ with f̂ the unit image feature
    (N, d), H the task's (C, d) class embeddings and s its scale, as in
    :class:`pactlib.models.clip.ClipClassifier`. Evaluation runs under ``torch.no_grad`` in
    eval mode (every module's train/eval flag is restored afterwards), in batches.
    Normalized accuracy (book/method.md, protocol) is acc_merged(t) / acc_finetuned(t): pass the result and
    the fine-tuned accuracies to :func:`normalized`, or use :func:`clip_evaluator` with
    :func:`select_alpha`.

    Args:
        vision_state_dict: the image tower to evaluate: keys as
            :func:`pactlib.models.clip.vision_state_dict` gives them (``visual.*``; Hugging Face
            ``vision_model.*`` naming and ``model.visual.*`` image-encoder keys are converted),
            a checkpoint path, or None to evaluate the classifier's current weights. It is loaded
            *in place* into ``classifier.visual`` (the caller's tensors are not modified).
        heads: ``{task: head}`` for every task of ``datas``; a head is a (C, d) tensor (scale =
            ``classifier.scale``), a ``(tensor, scale)`` pair (:func:`~pactlib.models.clip.read_head`)
            or a ``ClipClassifier`` (its head and scale only).
        datas: ``{task: TaskData}``: uint8 images (N, 3, S, S) in 0..255 (or float in [0, 1]),
            int64 labels (N,) in ``0..C-1``, ``classes`` of length C
            (:func:`pactlib.data.paper.load_paper_task` gives this).
        classifier: the ``ClipClassifier`` whose vision tower is used; None: the first
            ``ClipClassifier`` among ``heads``.
        batch_size: images per forward pass (results do not depend on it).
        limit: evaluate only the first ``limit`` examples of each task (deterministic subset).
        device: run there (the classifier is moved, in place); None: where the classifier is.
            Images are moved batch by batch, so the splits can stay on the CPU.
        resize: allow images whose side differs from the classifier's ``image_size`` (they are
            resized, bicubic); by default that is an error, since it usually means the data were
            decoded at the wrong size.
        progress: show a tqdm bar over all images (``False`` to disable).
        trust_pickle: allow a pickled-module checkpoint path (see
            :func:`~pactlib.models.clip.load_clip_checkpoint`).

    Returns:
        ``{task: accuracy in [0, 1]}`` in the order of ``datas`` (a :class:`~pactlib.outcomes.Scores`:
        ``outcomes`` holds each image's correctness).

    Raises:
        KeyError: a task of ``datas`` has no head.
        ValueError: no classifier; a head that is not (C, d) with the features' d, or a scale
            <= 0; a task with no examples, a class count unequal to its head's, labels out of
            range, images not (N, 3, H, W), or of another side than the classifier's
            (without ``resize``); ``batch_size`` < 1.
        TypeError: a head of another type.
        CheckpointError: the vision state dict does not fit the classifier (keys named).
    """
    from pactlib.models.clip import ClipClassifier

    missing = [t for t in datas if t not in heads]
    if missing:
        raise KeyError(f"no head for task(s) {missing}")
    if classifier is None:
        classifier = next((h for h in heads.values() if isinstance(h, ClipClassifier)), None)
        if classifier is None:
            raise ValueError("clip_evaluate needs classifier= (a ClipClassifier whose vision tower is "
                             "used) when no head is a ClipClassifier")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batch_size = int(batch_size)
    dim = classifier.head.shape[1]
    tasks = {}
    for t, d in datas.items():
        h, scale = _clip_head(t, heads[t], classifier.scale, dim)
        x, y = _clip_inputs(t, d, h.shape[0], classifier.image_size, limit=limit, resize=resize)
        tasks[t] = (h, scale, x, y)
    if device is not None:
        classifier.to(device)
    if vision_state_dict is not None:
        classifier.load_vision(vision_state_dict, trust_pickle=trust_pickle)
    param = next(classifier.visual.parameters())
    device, dtype = param.device, param.dtype

    from tqdm.auto import tqdm

    modes = [(m, m.training) for m in classifier.modules()]
    classifier.eval()
    bar = tqdm(total=sum(y.numel() for *_, y in tasks.values()), desc="clip eval", unit="img",
               leave=False, disable=not progress)
    out = {}
    try:
        for t, (h, scale, x, y) in tasks.items():
            bar.set_postfix_str(t)
            hd = h.to(device)
            correct = []
            for i in range(0, y.numel(), batch_size):
                xb = classifier.prepare(x[i:i + batch_size].to(device)).to(dtype)
                f = torch.nn.functional.normalize(classifier.visual(xb).float(), dim=-1)  # (B, d)
                pred = (scale * f @ hd.t()).argmax(1).cpu()  # (B,)
                correct.append(pred == y[i:i + batch_size])
                bar.update(pred.numel())
            out[t] = torch.cat(correct)
    finally:
        bar.close()
        for m, mode in modes:  # each module's own train/eval flag, as it was
            m.training = mode
    return scores(out)


def clip_accuracy(classifier, data, *, batch_size: int = 256, limit: int | None = None,
                  device: str | torch.device | None = None, resize: bool = False,
                  progress: bool = True) -> float:
    """Top-1 accuracy in [0, 1] of a ``ClipClassifier`` as it is (its tower and head) on one split.

    ``data``: a ``TaskData`` (uint8 images (N, 3, S, S), int64 labels (N,), C classes). Same
    arguments and errors as :func:`clip_evaluate` (which this calls with no state dict).
    """
    task = getattr(data, "task", "task")
    return clip_evaluate(None, {task: classifier}, {task: data}, classifier=classifier,
                         batch_size=batch_size, limit=limit, device=device, resize=resize,
                         progress=progress)[task]


def clip_evaluator(heads: Mapping[str, ClipHead], *, classifier=None, batch_size: int = 256,
                   device: str | torch.device | None = None, resize: bool = False,
                   progress: bool = True) -> Callable[..., dict[str, float]]:
    """An ``evaluate_fn`` for :func:`select_alpha` that evaluates CLIP vision state dicts.

    Returns ``fn(vision_state_dict, datas, *, limit=None) -> {task: acc}`` calling
    :func:`clip_evaluate` with these ``heads`` and settings (the same classifier module is
    reused across α). Example::

        rec = select_alpha(lambda a: D.apply_to(pre, a), alphas, val=val, test=test,
                           ft_val=ft_val, ft_test=ft_test, method="pact_iso_c",
                           evaluate_fn=clip_evaluator(heads, classifier=clf))
    """

    def fn(state, datas: Mapping[str, Any], *, limit: int | None = None) -> dict[str, float]:
        return clip_evaluate(state, heads, datas, classifier=classifier, batch_size=batch_size,
                             limit=limit, device=device, resize=resize, progress=progress)

    return fn
