"""The scalar-weight view of load-bearing walls (book chapter 3: S1, S2; claims C1–C3).

Glue between a testbed and the kernels of :mod:`pactlib.fisher` and :mod:`pactlib.causal`. A
testbed is a :class:`pactlib.testbeds.Testbed`: its ``loss_model(state, task)`` (a
differentiable model + frozen head whose parameter names are the state-dict keys) and
``inputs(task, split, limit)`` (model-ready inputs (N, ...) and labels (N,)).

- :func:`task_fisher`: diagonal Fisher F_t of θt on N task examples (S1), keyed like Δt;
- :func:`scores`, :func:`state_scores`: accuracy and mean cross-entropy of a state on a task's examples;
- :func:`typical_update`: the median |Δt| over the entries, the unit of the C2 perturbation;
- :func:`global_masks`, :func:`random_subset`: global quantile masks and the "sensitive but
  updated" control H_t \\ U_t of C2/C3;
- :func:`enrichment_records` (C1), :func:`perturbation_records` (C2), :func:`displacement` and
  :func:`restore_records` (C3): result records for :mod:`pactlib.book.records`;
- :func:`c1_verdict`, :func:`c2_verdict`, :func:`c3_verdict`: statuses computed from records;
- :func:`task_records`: one (seed, task)'s whole pipeline (C1–C3), so that a loop over tasks holds
  one task's masks at a time.

Every function returns new tensors / records; the caller's state dicts are never modified.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib import causal, fisher
from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.book import intervals
from pactlib.book.records import make_record
from pactlib.book.verdicts import condition, graded, not_tested
from pactlib.book.intervals import NO_OUTCOMES
from pactlib.book.experiments.paired import MissingOutcomes, finetuned_record, stacked
from pactlib.outcomes import pack

__all__ = ["task_fisher", "state_scores", "scores", "typical_update", "population", "lbw_sets", "global_masks",
           "random_subset", "control_masks", "layer_kind",
           "enrichment_records", "perturbation_records", "displacement", "restore_records",
           "enrichment_table", "displacement_table", "task_means", "plot_task_enrichment", "plot_layer_enrichment", "plot_dose", "plot_conditions",
           "c1_verdict", "c2_verdict", "c3_verdict", "c2_intervals", "drop_intervals", "perturbation_table",
           "task_records"]



def task_fisher(tb, task: str, state: Mapping[str, Tensor], *, n_samples: int, empirical: bool = False,
                seed: int = 0, split: str = "val", chunk: int = 64) -> dict[str, Tensor]:
    """Diagonal Fisher of ``state`` (θt) for ``task`` on its first ``n_samples`` examples (S1).

    Args:
        tb: a testbed (see the module docstring).
        task: the task whose head and examples are used.
        state: backbone state dict (not modified).
        n_samples: N examples of ``split`` (the estimate is their mean).
        empirical: use the true labels instead of y ~ p(y|x; θt) (book/method.md, S1: a switch, off by default).
        seed: seed of the label sampling.
        split: ``"val"`` or ``"test"``.
        chunk: examples per vectorised per-sample-gradient call: memory (one float32 gradient per
            example, ≈ 14 MB for Lite0's 3.4 M trained parameters) against speed (each call has a
            large fixed cost on CPU, so fewer calls are faster).

    Returns:
        {key: F (same shape as ``state[key]``)} for every trainable parameter, in network order,
        keyed like the state dict.

    Raises:
        ValueError: the split holds fewer than ``n_samples`` examples (names task and split).
    """
    x, y = tb.inputs(task, split, n_samples)
    if len(y) < n_samples:
        raise ValueError(f"task_fisher: task {task!r} has only {len(y)} {split} examples, fewer than "
                         f"n_samples={n_samples}; lower fisher_samples or raise val_limit")
    model = tb.loss_model(dict(state), task)  # a fresh module: switching gradients on is local
    model.requires_grad_(True)
    Fd = fisher.diagonal_fisher(model, [(x, y)], n_samples=n_samples, empirical=empirical, seed=seed, chunk=chunk)
    return Fd


@torch.no_grad()
def state_scores(model: torch.nn.Module, state: Mapping[str, Tensor], xy: tuple[Tensor, Tensor], *,
                 batch_size: int = 256, outcomes: bool = False) -> dict[str, Any]:
    """Accuracy in [0, 1] and mean cross-entropy (nats) of ``model`` run with the backbone weights
    ``state`` (``torch.func.functional_call``: the module is reused, nothing is loaded); with
    ``outcomes``, also ``"correct"``: the (N,) bool tensor (CPU) of the examples classified right.

    Devices: ``state`` and ``xy`` may be anywhere; they are moved to the model's device (that of
    its first parameter or buffer: a copy of the state there when it is elsewhere, e.g. CPU
    weights for a clip testbed's CUDA model).

    Args:
        model: a classifier from ``tb.loss_model(..., task)`` (parameter names = state-dict keys).
        state: backbone state dict; xy: model-ready inputs (N, ...) and labels (N,).

    Raises:
        ValueError: no examples.
    """
    from torch.func import functional_call

    x, y = xy
    if len(y) == 0:
        raise ValueError("scores: no examples to score")
    model.eval()
    device = _device_of(model)
    state = {k: v.to(device) for k, v in state.items()}
    x, y = x.to(device), y.to(device)
    logits = torch.cat([functional_call(model, state, (x[i:i + batch_size],))
                        for i in range(0, len(x), batch_size)])  # (N, C)
    right = logits.argmax(1) == y
    out = {"acc": float(right.float().mean()), "loss": float(F.cross_entropy(logits, y))}
    if outcomes:
        out["correct"] = right.cpu()
    return out


def _outcomes(task: str, s: Mapping[str, Any]) -> dict:
    """The ``outcomes`` field of a record of one task scored by :func:`state_scores` (outcomes=True)."""
    return {"outcomes": {"test": {task: pack(s["correct"])}}}


def _device_of(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (the CPU when it has neither)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def scores(tb, state: Mapping[str, Tensor], task: str, xy: tuple[Tensor, Tensor]) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``state`` + ``task``'s head on ``xy`` (one module built;
    to score many states of one task, build ``tb.loss_model`` once and call :func:`state_scores`).

    Args:
        xy: model-ready inputs (N, ...) and labels (N,), e.g. ``tb.inputs(task, "test", limit)``.

    Raises:
        ValueError: no examples.
    """
    return state_scores(tb.loss_model(dict(state), task), state, xy)


def _flat(values: Mapping[str, Tensor], keys: Sequence[str]) -> Tensor:
    return torch.cat([values[k].reshape(-1).float() for k in keys])


def _split(flat: Tensor, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out, off = {}, 0
    for k, v in like.items():
        out[k] = flat[off:off + v.numel()].reshape(v.shape)
        off += v.numel()
    return out


def typical_update(delta: Mapping[str, Tensor], keys: Sequence[str], *, touched_only: bool = False) -> float:
    """The median |Δt| over every entry of ``keys`` (the "size of a typical update" of C2); with
    ``touched_only``, over the entries the fine-tuning moved at all (Δt ≠ 0).

    Raises:
        KeyError: a key missing from ``delta``; ValueError: no entry in the population.
    """
    missing = [k for k in keys if k not in delta]
    if missing:
        raise KeyError(f"typical_update: key(s) {missing[:3]} not in the task vector")
    d = _flat(delta, keys).abs()
    if touched_only:
        d = d[d > 0]
    if not len(d):
        raise ValueError("typical_update: no entry with a non-zero update")
    return float(d.median())


def population(delta: Mapping[str, Tensor], keys: Sequence[str], *, touched_only: bool) -> dict[str, Tensor]:
    """The entries U_t and H_t are drawn from, as a boolean mask per key: every entry, or with
    ``touched_only`` the entries with Δt ≠ 0.

    Why: when more than a q-fraction of the entries have Δt = 0 exactly (units that never get a
    gradient), "the lowest q-quantile of |Δt|" is a tie, and S2 would pick U_t among those
    untouched entries by position. Restricting both sets to touched entries removes the tie.
    """
    return {k: (delta[k] != 0) if touched_only else torch.ones_like(delta[k], dtype=torch.bool) for k in keys}


def _select(values: Mapping[str, Tensor], pop: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: values[k][pop[k]] for k in pop}  # 1-d: the population's entries of each key


def _scatter(masks: Mapping[str, Tensor], pop: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for k, m in masks.items():
        full = torch.zeros(pop[k].shape, dtype=torch.bool, device=pop[k].device)
        full[pop[k]] = m
        out[k] = full
    return out


def lbw_sets(delta: Mapping[str, Tensor], fisher_t: Mapping[str, Tensor], *, q: float,
             touched_only: bool) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(scalar LBW entries U_t ∩ H_t, sensitive entries H_t), global quantiles over the
    :func:`population`, as full-shape boolean masks per key of ``fisher_t`` (S2; the same sets as
    :func:`pactlib.fisher.scalar_lbw_masks` computes over all entries)."""
    pop = population(delta, list(fisher_t), touched_only=touched_only)
    d, f = _select(delta, pop), _select(fisher_t, pop)
    U = fisher.lowest_mask(_flat(d, list(d)).abs(), q)
    H = fisher.highest_mask(_flat(f, list(f)), q)
    return _scatter(_split(U & H, f), pop), _scatter(_split(H, f), pop)


def global_masks(values: Mapping[str, Tensor], q: float, *, largest: bool) -> dict[str, Tensor]:
    """Exactly ⌊q·N⌋ entries of smallest (``largest=False``) or largest value over all keys
    together (global quantile, S2), as one boolean mask per key.

    Raises:
        ValueError: q outside (0, 1).
    """
    flat = _flat(values, list(values))
    mask = fisher.highest_mask(flat, q) if largest else fisher.lowest_mask(flat, q)
    return _split(mask, values)


def random_subset(pool: Mapping[str, Tensor], count: int, *, seed: int) -> dict[str, Tensor]:
    """``count`` entries drawn uniformly (private generator) among the True entries of ``pool``.

    Raises:
        ValueError: the pool holds fewer than ``count`` entries, or ``count`` < 0.
    """
    flat = _flat(pool, list(pool)).bool()
    idx = flat.nonzero().squeeze(1)
    if count < 0 or count > len(idx):
        raise ValueError(f"random_subset: asked for {count} entries from a pool of {len(idx)}")
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros_like(flat)
    out[idx[torch.randperm(len(idx), generator=gen)[:count].to(idx.device)]] = True  # drawn on the CPU
    return _split(out, pool)


def control_masks(lbw: Mapping[str, Tensor], sensitive: Mapping[str, Tensor], *, draws: int, seed: int,
                  pool: Mapping[str, Tensor] | None = None) -> dict[str, list[dict[str, Tensor]]]:
    """The two control groups of C2/C3, ``draws`` masks each, every mask as large as ``lbw``:

    - ``"random"``: entries drawn uniformly over all entries of the same keys
      (:func:`pactlib.causal.random_masks_like`, the paper's control), or over ``pool`` when given
      (the :func:`population` U_t and H_t were drawn from);
    - ``"sensitive"``: entries drawn among H_t \\ U_t, high-Fisher entries that the fine-tuning
      *did* move (a sharper control: as sensitive, but not barely updated).

    Args:
        lbw: U_t ∩ H_t per key; sensitive: H_t per key (same keys and shapes).

    Raises:
        KeyError: the masks have different keys; ValueError: a pool smaller than U_t ∩ H_t.
    """
    if list(lbw) != list(sensitive) or (pool is not None and list(pool) != list(lbw)):
        raise KeyError("control_masks: the LBW, sensitive (and pool) masks must have the same keys")
    n = _count(lbw)
    updated = {k: sensitive[k] & ~lbw[k] for k in lbw}
    rand = [causal.random_masks_like(lbw, seed=seed * 1000 + d) if pool is None
            else random_subset(pool, n, seed=seed * 1000 + d) for d in range(draws)]
    return {"random": rand, "sensitive": [random_subset(updated, n, seed=seed * 1000 + d) for d in range(draws)]}


def layer_kind(key: str, tensor: Tensor, rule: MatrixRule = DEFAULT_RULE) -> str:
    """``"pointwise"`` (a matrix layer under ``rule``, book/method.md, matrix-view), ``"conv"`` (k×k / depthwise,
    or any other tensor of 2+ dimensions) or ``"norm"``."""
    if rule.kind(key, tensor) == "matrix":
        return "pointwise"
    return "conv" if tensor.ndim >= 2 else "norm"


def _count(masks: Mapping[str, Tensor]) -> int:
    return int(_flat(masks, list(masks)).sum())


def enrichment_records(delta: Mapping[str, Tensor], fisher_t: Mapping[str, Tensor], *, q: float, seed: int,
                       task: str, params: Mapping[str, Any], touched_only: bool = False, per_key: bool = True,
                       rule: MatrixRule = DEFAULT_RULE, **extra) -> list[dict]:
    """Enrichment E_t (S2) of task t over a :func:`population`, global and (``per_key``) per key. C1.

    Returns:
        One ``scope="global"`` record (metrics ``E``, ``n_params`` = population size, ``n_small``,
        ``n_sensitive``, ``n_both``, ``zero_update`` / ``zero_fisher`` = share of all entries with
        Δt = 0 / F_t = 0) and, with ``per_key``, one ``scope="layer"`` record per key with at least
        1/q population entries (``key``, ``layer`` = position in network order, ``kind`` from
        :func:`layer_kind` under ``rule``, the testbed's matrix rule; metrics ``E``, ``numel``).
        Every record has ``population`` = ``"touched"`` or ``"all"``.
    """
    keys = list(fisher_t)
    pop = population(delta, keys, touched_only=touched_only)
    sd, sf = _select(delta, pop), _select(fisher_t, pop)
    if per_key:
        e = fisher.enrichment(sd, sf, q=q)
        glob = dict(E=e.score, n_params=e.n_params, n_small=e.n_small, n_sensitive=e.n_sensitive, n_both=e.n_both)
    else:
        U, H = fisher.lowest_mask(_flat(sd, keys).abs(), q), fisher.highest_mask(_flat(sf, keys), q)
        glob = dict(E=fisher.enrichment_score(U, H), n_params=U.numel(), n_small=int(U.sum()),
                    n_sensitive=int(H.sum()), n_both=int((U & H).sum()))
    d, f = _flat(delta, keys), _flat(fisher_t, keys)
    label = "touched" if touched_only else "all"
    recs = [make_record("enrichment", params=params, seed=seed, task=task, scope="global", population=label,
                        metrics=dict(**glob, zero_update=float((d == 0).float().mean()),
                                     zero_fisher=float((f == 0).float().mean())), **extra)]
    order = {k: i for i, k in enumerate(keys)}
    for k, sc in (e.per_key.items() if per_key else ()):
        recs.append(make_record("enrichment", params=params, seed=seed, task=task, scope="layer", key=k,
                                population=label, layer=order[k], kind=layer_kind(k, fisher_t[k], rule),
                                metrics=dict(E=sc, numel=int(pop[k].sum())), **extra))
    return recs


def perturbation_records(tb, task: str, state: Mapping[str, Tensor], masks: Mapping[str, Tensor], *,
                         unit: float, scales: Sequence[float], draws: int, seed: int, xy: tuple[Tensor, Tensor],
                         controls: Mapping[str, Sequence[Mapping[str, Tensor]]], params: Mapping[str, Any],
                         base: Mapping[str, float] | None = None, **extra) -> list[dict]:
    """C2: add ±s (random signs) to the LBW entries of θt, and to each control set, and score task t.

    Args:
        tb, task, xy: testbed, task, and the evaluation examples (see :func:`scores`).
        state: θt (not modified); masks: scalar LBW entries U_t ∩ H_t per key.
        unit: the perturbation unit (weight units), e.g. :func:`typical_update`; s = scale × unit.
        scales: the multiples of ``unit`` to try.
        draws: sign draws of the LBW perturbation (the controls give one record per mask given).
        controls: {name: [mask, ...]} the control groups, each mask with as many entries as ``masks``.
        base: θt's own ``{"acc", "loss"}`` on ``xy`` when the caller has them (:func:`state_scores`);
            scored here otherwise.

    Returns:
        One record per (scale, condition, draw), method ``"perturb"``, fields ``scale``, ``condition``
        (``"lbw"`` and the control names), ``draw``, ``outcomes`` (``{"test": {task: packed}}``: the
        perturbed model's per-example outcomes on ``xy``); metrics ``acc``, ``loss``, ``drop`` =
        acc(θt) − acc, ``dloss`` = loss − loss(θt), ``n_entries``, ``size`` = s.

    Raises:
        ValueError: a control mask holds another number of entries than ``masks``.
    """
    model = tb.loss_model(dict(state), task)
    base = dict(base) if base is not None else state_scores(model, state, xy)
    n = _count(masks)
    groups = [("lbw", d, masks) for d in range(draws)]
    for name, ms in controls.items():
        for d, m in enumerate(ms):
            if _count(m) != n:
                raise ValueError(f"perturbation_records: control {name!r} draw {d} has {_count(m)} entries, LBW has {n}")
            groups.append((name, d, m))
    recs = []
    for scale in scales:
        size = scale * unit
        for cond, d, m in groups:
            s = state_scores(model, causal.perturb(state, m, size=size, seed=seed * 1000 + d), xy, outcomes=True)
            recs.append(make_record("perturb", params=params, seed=seed, task=task, scale=scale, condition=cond,
                                    draw=d, metrics=dict(acc=s["acc"], loss=s["loss"], drop=base["acc"] - s["acc"],
                                                         dloss=s["loss"] - base["loss"], n_entries=n, size=size),
                                    **_outcomes(task, s), **extra))
    return recs


def displacement(theta_t: Mapping[str, Tensor], merged: Mapping[str, Tensor], delta: Mapping[str, Tensor],
                 masks: Mapping[str, Tensor]) -> dict[str, float]:
    """How far a merge moved the masked entries of θt, against every other entry of the same keys (C3).

    Returns:
        ``moved_lbw`` / ``moved_other``: mean |θ_merged − θt| over masked / unmasked entries;
        ``moved_ratio`` = moved_lbw / moved_other; ``rel_moved_lbw`` / ``rel_moved_other``: the same
        mean displacement divided by the mean |Δt| of the group (how many "own updates" the merge
        moved an entry); NaN where a group is empty.
    """
    keys = list(masks)
    m = _flat(masks, keys).bool()
    moved = (_flat(merged, keys) - _flat(theta_t, keys)).abs()
    upd = _flat(delta, keys).abs()

    def mean(v, sel):
        return float(v[sel].mean()) if bool(sel.any()) else math.nan

    out = dict(moved_lbw=mean(moved, m), moved_other=mean(moved, ~m))
    out["moved_ratio"] = out["moved_lbw"] / out["moved_other"] if out["moved_other"] else math.nan
    out["rel_moved_lbw"] = out["moved_lbw"] / mean(upd, m) if mean(upd, m) else math.nan
    out["rel_moved_other"] = out["moved_other"] / mean(upd, ~m) if mean(upd, ~m) else math.nan
    return out


def _recovered(value: float, merged: float, finetuned: float) -> float:
    """(value − merged) / (finetuned − merged): the share of the gap a restore closed (NaN if no gap)."""
    gap = finetuned - merged
    return (value - merged) / gap if abs(gap) > 1e-12 else math.nan


def restore_records(tb, task: str, merged: Mapping[str, Tensor], theta_t: Mapping[str, Tensor],
                    masks: Mapping[str, Tensor], *, xy: tuple[Tensor, Tensor],
                    controls: Mapping[str, Sequence[Mapping[str, Tensor]]], seed: int,
                    params: Mapping[str, Any], finetuned: Mapping[str, float] | None = None,
                    moved: Mapping[str, float] | None = None, **extra) -> list[dict]:
    """C3: write θt's values back into the merged model at the LBW entries (and at each control
    set) and score task t.

    Returns:
        Records, method ``"restore"``, ``condition`` in ``"merged"`` (nothing restored), ``"lbw"``
        and the control names (one per control mask, ``draw``). Metrics ``acc``, ``loss``,
        ``n_entries``, ``gain_acc`` = acc − acc(merge), and ``recovered_acc`` / ``recovered_loss``: the share of the gap between
        the merge and θt that the restore closed (1 = back to θt). ``moved`` (from
        :func:`displacement`) is added to the ``"merged"`` record's metrics. Every record keeps
        the evaluated model's per-example ``outcomes`` on ``xy``.
    """
    model = tb.loss_model(dict(theta_t), task)
    ft = dict(finetuned) if finetuned is not None else state_scores(model, theta_t, xy)
    mg = state_scores(model, merged, xy, outcomes=True)
    recs = [make_record("restore", params=params, seed=seed, task=task, condition="merged", draw=0,
                        metrics=dict(acc=mg["acc"], loss=mg["loss"], n_entries=0, gain_acc=0.0, recovered_acc=0.0,
                                     recovered_loss=0.0, acc_ft=ft["acc"], loss_ft=ft["loss"], **(moved or {})),
                        **_outcomes(task, mg), **extra)]
    groups = [("lbw", 0, masks)] + [(name, d, m) for name, ms in controls.items() for d, m in enumerate(ms)]
    for cond, d, m in groups:
        s = state_scores(model, causal.restore(merged, theta_t, m), xy, outcomes=True)
        recs.append(make_record("restore", params=params, seed=seed, task=task, condition=cond, draw=d,
                                metrics=dict(acc=s["acc"], loss=s["loss"], n_entries=_count(m),
                                             gain_acc=s["acc"] - mg["acc"], recovered_acc=_recovered(s["acc"], mg["acc"], ft["acc"]),
                                             recovered_loss=_recovered(-s["loss"], -mg["loss"], -ft["loss"])),
                                **_outcomes(task, s), **extra))
    return recs


# --- one task's whole pipeline (memory bounded in T) ----------------------------------------


def task_records(tb, task: str, delta: Mapping[str, Tensor], *, fisher_samples: int, quantile: float, seed: int,
                 scales: Sequence[float], draws: int, test_limit: int | None, params: Mapping[str, Any],
                 empirical: bool = False, touched_only: bool = True, merged: Mapping[str, Tensor] | None = None,
                 merge_fields: Mapping[str, Any] | None = None, fisher_chunk: int = 64, **extra) -> list[dict]:
    """Chapter 3's measurements of one (seed, task), start to end: Fisher F_t (S1), enrichment
    (C1), the LBW and control masks, perturbations (C2) and, given ``merged``, displacement and
    restores (C3). Every mask is built, used and dropped inside the call, so a loop over tasks
    holds one task's masks at a time (full-size boolean tensors: U_t ∩ H_t, H_t, the population,
    2 × ``draws`` control masks), whatever the number of tasks; a lazy ``delta`` is read once into
    memory (one float32 copy of the model) and dropped at return.

    The records are those of the book's former three passes (:func:`enrichment_records` over all
    entries then over the chapter's population, :func:`perturbation_records`, :func:`displacement`
    + :func:`restore_records`), value for value: the same calls on the same inputs with the same
    seeds (Fisher labels ``seed``, control draws ``seed·1000 + d``, signs ``seed·1000 + d``).

    Args:
        tb: a testbed (module docstring; its ``rule``, default :data:`DEFAULT_RULE`, gives the layer
            kinds); ``task``: one of its tasks; ``delta``: Δt (any mapping,
            e.g. a :class:`pactlib.testbeds.lazy_vectors.LazyTaskVector`), keys ⊇ the Fisher's.
        fisher_samples: N validation examples of the Fisher; ``empirical``: true labels instead of
            sampled ones; ``fisher_chunk``: examples per per-sample-gradient call, a memory knob
            only (about ``fisher_chunk`` float32 copies of the model: 64 × 0.35 GB for a ViT-B/32
            tower) (:func:`task_fisher`).
        quantile: q of U_t and H_t, in (0, 1); ``touched_only``: the population of the LBW sets
            (per-key enrichment records are written for that population only).
        seed: the records' seed, the Fisher's label seed and the draws' base seed.
        scales: C2's perturbation sizes in units of :func:`typical_update` (weight units);
            ``draws``: sign / entry draws per condition (≥ 1).
        test_limit: test examples scored by C2 and C3 (``tb.inputs(task, "test", test_limit)``).
        params: the records' parameters; ``**extra``: fields of every record (e.g. ``suite``).
        merged: the merged state (θ0's keys) for C3, or None to skip C3;
            ``merge_fields``: fields of the restore records only (e.g. ``alpha``, ``on_edge``).

    Returns:
        Records in this order: 2 ``"enrichment"`` globals (population ``"all"`` then
        ``"touched"``, with the per-key ones of ``touched_only``'s population after its global),
        one ``"finetuned"`` record (θt's accuracy, loss and per-example outcomes on the test
        examples, :func:`pactlib.book.experiments.paired.finetuned_record`), ``"perturb"`` records (scale × condition × draw), then with ``merged`` the ``"restore"``
        records (``"merged"`` first, carrying the displacement metrics).

    Raises:
        ValueError: too few validation examples for the Fisher, an empty test split, an empty
            population; KeyError: a Fisher key missing from ``delta``.
    """
    F_t = task_fisher(tb, task, tb.finetuned[task], n_samples=fisher_samples, empirical=empirical, seed=seed,
                      chunk=fisher_chunk)
    keys = list(F_t)
    missing = [k for k in keys if k not in delta]
    if missing:
        raise KeyError(f"task_records: key(s) {missing[:3]} of the Fisher not in task {task!r}'s task vector")
    d = {k: delta[k] for k in delta}  # a lazy Δt read once (fresh tensors), an in-memory one shared
    recs = []
    for only in (False, True):
        recs += enrichment_records(d, F_t, q=quantile, seed=seed, task=task, params=params, touched_only=only,
                                   per_key=only == touched_only, rule=getattr(tb, "rule", DEFAULT_RULE), **extra)
    lbw, sens = lbw_sets(d, F_t, q=quantile, touched_only=touched_only)
    pool = population(d, keys, touched_only=touched_only)
    del F_t
    ctl = control_masks(lbw, sens, draws=draws, seed=seed, pool=pool)
    del sens, pool
    xy = tb.inputs(task, "test", test_limit)
    theta_t = tb.finetuned[task]
    unit = typical_update(d, list(lbw), touched_only=touched_only)
    ft = state_scores(tb.loss_model(dict(theta_t), task), theta_t, xy, outcomes=True)  # once: C2's base, C3's target
    recs.append(finetuned_record(task, ft["correct"], seed=seed, params=params, loss=ft["loss"], **extra))
    recs += perturbation_records(tb, task, theta_t, lbw, unit=unit, scales=scales, draws=draws, seed=seed, xy=xy,
                                 controls=ctl, params=params, base=ft, **extra)
    if merged is not None:
        moved = displacement(theta_t, merged, d, lbw)
        recs += restore_records(tb, task, merged, theta_t, lbw, xy=xy, controls=ctl, seed=seed, params=params,
                                finetuned=ft, moved=moved, **extra, **dict(merge_fields or {}))
    return recs


# --- figures --------------------------------------------------------------------------------

CONDITION_LABELS = {"lbw": "scalar LBW (U∩H)", "random": "random entries", "sensitive": "high-Fisher, updated (H∖U)",
                    "merged": "merge, nothing restored"}


POPULATION_LABELS = {"all": "all entries (S2 as written)", "touched": "touched entries (Δt ≠ 0)"}


def _enr(frame, scope: str, population: str | None = None):
    f = frame[(frame["method"] == "enrichment") & (frame["scope"] == scope)]
    if population is not None and "population" in f:
        f = f[f["population"] == population]
    return f


def plot_task_enrichment(frame, *, ax) -> None:
    """Global E_t per task and population: bars at the mean over seeds, one black dot per seed,
    a dashed line at E = 1 (chance)."""
    import numpy as np

    g = _enr(frame, "global")
    pops = list(dict.fromkeys(g["population"])) if "population" in g else [None]
    tasks = list(dict.fromkeys(g["task"]))
    width = 0.8 / len(pops)
    for j, p in enumerate(pops):
        gp = g if p is None else g[g["population"] == p]
        xs = np.arange(len(tasks)) + (j - (len(pops) - 1) / 2) * width
        vals = [gp[gp["task"] == t]["metrics.E"] for t in tasks]
        ax.bar(xs, [v.mean() for v in vals], width=0.95 * width, color=f"C{j}",
               label=POPULATION_LABELS.get(p, p) if p is not None else None)
        for x, v in zip(xs, vals):
            ax.scatter([x] * len(v), v, color="black", s=8, zorder=3)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks(np.arange(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_ylabel(r"enrichment $E_t$")
    if pops != [None]:
        ax.legend(loc="upper right")


def plot_layer_enrichment(frame, *, ax, population: str | None = "touched", kinds: Sequence[str] = ("conv", "pointwise")):
    """Per-layer log2 E (mean over seeds) of one population as a task × layer heatmap, layers in
    network order; only weight tensors of ``kinds``. Returns the image (for a colour bar)."""
    import numpy as np

    f = _enr(frame, "layer", population)
    f = f[f["kind"].isin(list(kinds))]
    tab = f.pivot_table(index="task", columns="layer", values="metrics.E", aggfunc="mean", sort=False)
    tab = tab[sorted(tab.columns)]
    val = np.log2(tab.to_numpy(dtype=float).clip(min=2 ** -4))
    lim = max(1.0, float(np.nanmax(np.abs(val))) if val.size else 1.0)
    im = ax.imshow(val, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    ax.set_yticks(np.arange(len(tab.index)), list(tab.index))
    kind_of = f.drop_duplicates("layer").set_index("layer")["kind"]
    ticks = [i for i, c in enumerate(tab.columns) if kind_of[c] == "pointwise"]
    ax.set_xticks(ticks, [""] * len(ticks))
    ax.set_xlabel("weight tensors in network order (ticks: pointwise / matrix layers)")
    return im


def plot_dose(frame, *, ax, conditions: Sequence[str] = ("lbw", "random", "sensitive")) -> None:
    """Loss increase against perturbation scale (log x), one line per condition (mean over tasks,
    seeds and draws), one faint dot per task."""
    f = frame[frame["method"] == "perturb"]
    for j, c in enumerate(conditions):
        g = f[f["condition"] == c]
        if not len(g):
            continue
        per_task = g.groupby(["scale", "task"], sort=True)["metrics.dloss"].mean().reset_index()
        mean = per_task.groupby("scale")["metrics.dloss"].mean()
        ax.plot(mean.index, mean.to_numpy(), marker="o", color=f"C{j}", label=CONDITION_LABELS.get(c, c))
        ax.scatter(per_task["scale"], per_task["metrics.dloss"], color=f"C{j}", s=6, alpha=0.5)
    ax.set_xscale("log")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="perturbation size (× median |Δt|)", ylabel="loss increase (nats)")
    ax.legend(loc="upper left")


def plot_conditions(frame, method: str, metric: str, *, ax, conditions: Sequence[str], scale: float = 100.0,
                    errors=None) -> None:
    """Grouped bars per task and condition of ``metrics.<metric>`` × ``scale`` (mean over seeds and
    draws), with one dot per (seed, draw).

    Args:
        errors: rows ``task``, ``condition``, ``lo``, ``hi`` (e.g. :func:`drop_intervals` at one
            scale, in the bars' unit): a black 95 % error bar on each bar that has one.
    """
    import numpy as np

    f = frame[(frame["method"] == method) & frame["condition"].isin(list(conditions))]
    tasks = list(dict.fromkeys(f["task"]))
    width = 0.8 / len(conditions)
    for j, c in enumerate(conditions):
        xs = np.arange(len(tasks)) + (j - (len(conditions) - 1) / 2) * width
        sel = [f[(f["task"] == t) & (f["condition"] == c)][f"metrics.{metric}"] * scale for t in tasks]
        ax.bar(xs, [v.mean() for v in sel], width=0.95 * width, label=CONDITION_LABELS.get(c, c), color=f"C{j}")
        for x, v in zip(xs, sel):
            ax.scatter([x] * len(v), v, color="black", s=5, zorder=3)
        if errors is not None and len(errors):
            e = errors[errors["condition"] == c].set_index("task")
            pts = [(x, v.mean(), e.loc[t]) for x, v, t in zip(xs, sel, tasks) if t in e.index]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                            yerr=[[max(0.0, p[1] - p[2]["lo"]) for p in pts], [max(0.0, p[2]["hi"] - p[1]) for p in pts]],
                            fmt="none", ecolor="black", elinewidth=1, capsize=2, zorder=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(tasks)), tasks, rotation=30, ha="right")
    ax.legend(loc="upper right")


# --- tables ---------------------------------------------------------------------------------


def enrichment_table(frame):
    """Per task (mean over seeds): E_t per population, the shares of entries with Δt = 0 and with
    F_t = 0, and |U_t ∩ H_t| of the touched population when it was measured."""
    g = _enr(frame, "global")
    by = g.groupby("task", sort=False)
    tab = g.pivot_table(index="task", columns="population", values="metrics.E", sort=False).add_prefix("E_t, ")
    tab["Δt = 0 (share)"] = by["metrics.zero_update"].mean()
    tab["F_t = 0 (share)"] = by["metrics.zero_fisher"].mean()
    touched = g[g["population"] == "touched"]
    if len(touched):
        tab["|U∩H|, touched"] = touched.groupby("task", sort=False)["metrics.n_both"].mean()
    return tab


DISPLACEMENT = ("moved_lbw", "moved_other", "moved_ratio", "rel_moved_lbw", "rel_moved_other")


def displacement_table(frame):
    """Per task (mean over seeds): the :func:`displacement` metrics of the ``"merged"`` restore
    records and the α of the merge."""
    f = frame[(frame["method"] == "restore") & (frame["condition"] == "merged")]
    tab = f.groupby("task", sort=False)[[f"metrics.{m}" for m in DISPLACEMENT] + ["alpha"]].mean()
    return tab.rename(columns=lambda c: c.removeprefix("metrics."))


# --- verdicts -------------------------------------------------------------------------------


def task_means(frame, method: str, metric: str, *, condition: str | None = None, scope: str | None = None):
    """Mean of ``metrics.<metric>`` per task (over seeds and draws), in first-appearance order."""
    f = frame[frame["method"] == method]
    if condition is not None:
        f = f[f["condition"] == condition]
    if scope is not None:
        f = f[f["scope"] == scope]
    return f.groupby("task", sort=False)[f"metrics.{metric}"].mean()


def _seed_means(f, metric: str) -> list[float]:
    """Per seed, the mean over tasks (and draws) of ``metrics.<metric>``, NaN ignored."""
    return [float(v) for v in f.groupby("seed", sort=True)[f"metrics.{metric}"].mean().dropna()]


def c1_verdict(frame, *, population: str = "touched") -> dict:
    """C1: E_t > 1 for every task, on the global enrichment records of ``population``.

    One condition per task: E_t > 1, E_t being a statistic of the checkpoints (no test examples
    behind it): with ≥ 3 seeds its interval is the t interval over seeds
    (:func:`pactlib.book.intervals.over_seeds`), with fewer a point. The claim's status follows the
    verdict rule (:func:`pactlib.book.verdicts.graded`). The note gives the population's size, the
    share of (layer, task, seed) cases with a per-layer E > 1 and the other population's mean E_t.
    """
    g = _enr(frame, "global", population)
    if not len(g):
        return not_tested(f"no global enrichment records over {POPULATION_LABELS.get(population, population)}")
    conds = [condition(f"E_t, {t}", intervals.over_seeds(gt["metrics.E"].astype(float)), threshold=1.0, side=">",
                       unit="")
             for t, gt in g.groupby("task", sort=False)]
    n_seeds = int(g["seed"].nunique())
    lay = _enr(frame, "layer", population)["metrics.E"].dropna()
    size = (f"Population: {POPULATION_LABELS.get(population, population)}, {int(g['metrics.n_params'].mean()):,} "
            f"entries on average, |U_t ∩ H_t| = {int(g['metrics.n_both'].mean()):,}") if "metrics.n_both" in g else ""
    notes = [size] if size else []
    if len(lay):
        notes.append(f"per layer, E > 1 in {100 * float((lay > 1).mean()):.0f} % of {len(lay)} (layer, task, seed) cases")
    if "population" in frame:
        rest = frame[(frame["method"] == "enrichment") & (frame["scope"] == "global") & (frame["population"] != population)]
        for p, gp in rest.groupby("population", sort=False):
            other = f"over {POPULATION_LABELS.get(p, p)}: mean E_t {gp['metrics.E'].mean():.3f}"
            if "metrics.zero_update" in gp:
                other += f", with {100 * gp['metrics.zero_update'].mean():.0f} % of entries at Δt = 0 exactly"
            notes.append(other)
    spread = ("the 95 % t interval over seeds" if n_seeds >= intervals.MIN_SEEDS
              else f"a point (fewer than {intervals.MIN_SEEDS} seeds: no spread to count)")
    return graded(conds, f"E_t > 1 for each of {len(conds)} tasks, each over {n_seeds} fine-tuning seed(s); E_t is a "
                         f"statistic of the checkpoints, its interval {spread}", note="; ".join(notes))


def _stack(frame, method: str, condition: str | None = None, *, scale: float | None = None, tasks=None):
    f = frame[frame["method"] == method]
    if condition is not None:
        f = f[f["condition"] == condition]
    if scale is not None:
        f = f[f["scale"] == scale]
    by = ["draw"] if "draw" in f and f["draw"].notna().any() else []
    return stacked(f, by, tasks=tasks)


def _tasks(frame) -> list[str]:
    """The tasks of θt's ``"finetuned"`` records (records made before outcomes were kept have none).

    Raises:
        MissingOutcomes: no such record.
    """
    tasks = list(dict.fromkeys(frame[frame["method"] == "finetuned"]["task"])) if "method" in frame else []
    if not tasks:
        raise MissingOutcomes(NO_OUTCOMES)
    return tasks


def _drop_minus(plus, ft, lbw, factor: float):
    """contrast(plus, minus) × factor = drop(lbw) − factor × drop(plus), both drops from θt: the
    minus side weighs θt by (factor − 1) and the LBW records by 1 (records are averaged per seed)."""
    k = int(round(factor))
    if k < 1 or abs(k - factor) > 1e-9:
        raise ValueError(f"c2: factor must be a whole number >= 1, got {factor!r}")
    per_seed = max(1, len(lbw) // max(1, len(ft)))
    return intervals.contrast(plus, ft * ((k - 1) * per_seed) + lbw, scale=100.0 * k)


def c2_intervals(frame, *, factor: float = 2.0, control: str = "random", scale: float | None = None) -> dict:
    """The paired contrasts C2 is graded on, at perturbation ``scale`` (default: the smallest run).

    Returns:
        ``{"scale", "drop"``: the LBW perturbation's accuracy drop from θt (points, mean over tasks),
        ``"excess"``: drop(LBW) − ``factor`` × drop(``control``) (points), ``"versus"``: drop(LBW) −
        drop(``control``), ``"n_tasks"}``; each an :class:`~pactlib.book.intervals.Interval`
        (paired over the same test examples, per-example outcomes of each perturbed model).

    Raises:
        MissingOutcomes: records without per-example outcomes.
    """
    f = frame[frame["method"] == "perturb"]
    scale = float(f["scale"].min()) if scale is None else scale
    tasks = _tasks(frame)
    ft = _stack(frame, "finetuned", tasks=tasks)
    lbw = _stack(frame, "perturb", "lbw", scale=scale, tasks=tasks)
    ctl = _stack(frame, "perturb", control, scale=scale, tasks=tasks)
    return {"scale": scale, "n_tasks": len(tasks), "drop": intervals.contrast(ft, lbw),
            "excess": _drop_minus(ctl, ft, lbw, factor), "versus": intervals.contrast(ctl, lbw)}


def drop_intervals(frame, method: str = "perturb") -> "pd.DataFrame":
    """Accuracy drop from θt (points) with its 95 % interval per (scale, task, condition) of
    ``method``'s records (``"perturb"``; ``"restore"`` gives the change from θt of the restored
    models), and over all tasks (task ``"mean"``). Columns ``drop``, ``lo``, ``hi``, ``seeds``,
    ``examples`` (per task).

    Raises:
        MissingOutcomes: records without per-example outcomes.
    """
    import pandas as pd

    f = frame[frame["method"] == method]
    if "scale" not in f:
        f = f.assign(scale=float("nan"))
    tasks = _tasks(frame)
    rows = []
    for sc, g in f.groupby("scale", sort=True, dropna=False):
        for c in dict.fromkeys(g["condition"]):
            for t in [*tasks, "mean"]:
                sub = tasks if t == "mean" else [t]
                fin = frame[(frame["method"] == "finetuned") & frame["task"].isin(sub)]
                side = g[(g["condition"] == c) & g["task"].isin(sub)]
                iv = intervals.contrast(stacked(fin, tasks=sub),
                                        stacked(side, ["draw"] if "draw" in side else [], tasks=sub))
                rows.append(dict(scale=sc, task=t, condition=c, drop=iv.estimate, lo=iv.lo, hi=iv.hi,
                                 seeds=iv.n_seeds, examples=iv.n_examples))
    return pd.DataFrame(rows)


def perturbation_table(frame):
    """Per perturbation scale and condition, over all tasks: the accuracy drop from θt (points,
    95 % interval) and the mean loss increase (nats)."""
    iv = drop_intervals(frame, "perturb")
    iv = iv[iv["task"] == "mean"]
    f = frame[frame["method"] == "perturb"]
    dloss = f.groupby(["scale", "condition"])["metrics.dloss"].mean()
    out = iv.assign(**{"accuracy drop (points)": [intervals.Interval(r.drop, r.lo, r.hi, 0.0).text()
                                                  for r in iv.itertuples()],
                       "loss increase (nats)": [float(dloss.get((r.scale, r.condition), float("nan")))
                                                for r in iv.itertuples()]})
    out["condition"] = out["condition"].map(lambda c: CONDITION_LABELS.get(c, c))
    out = out.set_index(["scale", "condition"])[["accuracy drop (points)", "loss increase (nats)", "seeds", "examples"]]
    return out.rename_axis(["scale (× median |Δt|)", "condition"]).rename(columns={"examples": "examples per task"})


def c2_verdict(frame, *, factor: float = 2.0, min_drop: float = 0.005, control: str = "random") -> dict:
    """C2: nudging the LBW entries by a typical update size (the smallest scale run) costs task t
    much more accuracy than nudging as many ``control`` entries.

    Two conditions on paired contrasts over the same test examples (mean over tasks, points):
    the LBW drop from θt exceeds ``min_drop`` (accuracy; 0.005 = half a point), and drop(LBW) −
    ``factor`` × drop(``control``) > 0 ("much more": ``factor`` times the control's). Records
    without per-example outcomes give a verdict of status NOT_TESTED saying so.
    """
    f = frame[frame["method"] == "perturb"]
    if not len(f):
        return not_tested("no perturbation records")
    try:
        c = c2_intervals(frame, factor=factor, control=control)
    except MissingOutcomes:
        return not_tested(f"C2 compares perturbed models on the same test examples: {NO_OUTCOMES}")
    sc, lab = c["scale"], CONDITION_LABELS.get(control, control)
    conds = [condition(f"accuracy drop of the LBW perturbation at {sc:g}×", c["drop"], threshold=100 * min_drop),
             condition(f"drop(LBW) − {factor:g} × drop({lab}) at {sc:g}×", c["excess"], threshold=0.0)]
    d = c["drop"]
    other = ", ".join(f"{s:g}×: {m:.1e} per entry" for s, m in f.groupby("scale")["metrics.size"].mean().items())
    return graded(conds, f"paired over the same test examples ({d.n_examples} per task, {c['n_tasks']} tasks, "
                         f"{d.n_seeds} seed(s)), mean over tasks, {int(f['metrics.n_entries'].mean()):,} entries per "
                         f"set on average",
                  note=f"Perturbation sizes: {other}; drop(LBW) − drop({lab}) at {sc:g}×: {c['versus'].text()} points")


def c3_verdict(frame, *, min_recovered: float = 0.05, control: str = "random") -> dict:
    """C3: the merge moves the LBW entries, and restoring θt's values there wins back a measurable
    part of task t's loss.

    Four conditions (means over tasks):

    1. the merge moved the LBW entries by more than their own update (``rel_moved_lbw`` > 1): a
       statistic of the weights, interval over seeds (:func:`~pactlib.book.intervals.over_seeds`);
    2. the LBW restore closes at least ``min_recovered`` of the loss gap between the merge and θt
       (%, over seeds: the records keep per-example outcomes, not per-example losses, so the
       test examples' part of this error is not counted);
    3. it closes more of the loss gap than restoring as many ``control`` entries (over seeds);
    4. it wins back test accuracy: acc(LBW restore) − acc(merge) > 0 points, paired over the same
       test examples.

    Records without per-example outcomes give a verdict of status NOT_TESTED saying so.
    """
    r = frame[frame["method"] == "restore"]
    if not len(r):
        return not_tested("no restore records")
    lab = CONDITION_LABELS.get(control, control)
    merged, lbw, ctl = (r[r["condition"] == c] for c in ("merged", "lbw", control))
    try:
        tasks = _tasks(frame)
        won = intervals.contrast(_stack(frame, "restore", "lbw", tasks=tasks),
                                 _stack(frame, "restore", "merged", tasks=tasks))
        versus = intervals.contrast(_stack(frame, "restore", "lbw", tasks=tasks),
                                    _stack(frame, "restore", control, tasks=tasks))
    except MissingOutcomes:
        return not_tested(f"C3 compares restored models on the same test examples: {NO_OUTCOMES}")
    rec_l = [100 * v for v in _seed_means(lbw, "recovered_loss")]
    diff = (100 * (lbw.groupby(["seed", "task"])["metrics.recovered_loss"].mean()
                   - ctl.groupby(["seed", "task"])["metrics.recovered_loss"].mean())).groupby(level="seed").mean().dropna()
    conds = [condition("LBW entries moved ÷ their own update", intervals.over_seeds(_seed_means(merged, "rel_moved_lbw")),
                       threshold=1.0, unit="×"),
             condition("loss gap closed by the LBW restore", intervals.over_seeds(rec_l), threshold=100 * min_recovered,
                       unit="%"),
             condition(f"loss gap closed, LBW − {lab} restore", intervals.over_seeds(list(diff)), threshold=0.0,
                       unit="points of %"),
             condition("accuracy won back by the LBW restore", won, threshold=0.0)]
    alpha = ""
    if "alpha" in merged and merged["alpha"].notna().any():
        edge = " (an edge of the grid)" if "on_edge" in merged and bool(merged["on_edge"].fillna(False).any()) else ""
        alpha = f"Task Arithmetic at α = {merged['alpha'].mean():.3g}{edge}; "
    return graded(conds, f"{alpha}means over {len(tasks)} tasks and {won.n_seeds} seed(s); accuracy paired over the "
                         f"same test examples ({won.n_examples} per task), the weights and loss shares over seeds",
                  note=f"The merge moved LBW entries {merged['metrics.moved_ratio'].mean():.2f}× as far as the other "
                       f"entries; accuracy, LBW − {lab} restore: {versus.text()} points")
