"""The first-order theory of the PACT filter (book chapter 10, claim C12).

PACT removes from each task's update the part inside its shield: Δ̃t = Δt − Δt P_t with
P_t = S_t S_tᵀ (P4–P5). Seen from task t, the filter moves θt to θt − Δt P_t = θ0 + Δ̃t. To first
order the task loss changes by −⟨∇L_t(θt), Δt P_t⟩; since P_t is an orthogonal projector,
⟨G, Δ P⟩ = ⟨G P, Δ P⟩ and Cauchy–Schwarz bounds it, layer by layer, by ‖∇L_t P_t‖_F ‖Δt P_t‖_F.
:func:`pactlib.causal.first_order_check` computes the prediction, the bound and the true change;
this module supplies the task loss, the removed parts and the shields of one PACT run, breaks the
two sides down per layer, follows the loss along θt − s·Δt P_t, and turns the records into the
verdict on C12.

A testbed is a :class:`pactlib.testbeds.Testbed` (``loss_model(state, task)`` with parameter
names = state-dict keys, ``inputs(task, split, limit)``, ``tasks``, ``pretrained``,
``finetuned``). Inputs are never modified.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib import causal
from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.book import intervals
from pactlib.book.records import make_record
from pactlib.book.verdicts import condition, graded, not_tested
from pactlib.book.intervals import NO_OUTCOMES
from pactlib.book.experiments.paired import MissingOutcomes, finetuned_record, stacked
from pactlib.book.experiments.scalar import _device_of, _outcomes, state_scores

__all__ = ["task_loss", "removed_parts", "shields_of", "layer_terms", "loss_path", "theory_records",
           "summary_table", "plot_sides", "plot_path", "plot_layers", "c12_verdict"]



def task_loss(tb, task: str, xy: tuple[Tensor, Tensor]) -> Callable[[Mapping[str, Tensor]], Tensor]:
    """L_t: backbone state dict -> mean cross-entropy (nats) of backbone + task head on ``xy``.

    The returned function is differentiable in the tensors it is given (``torch.func.functional_call``
    on one classifier module built here); BatchNorm runs in eval mode, as in the zoo.

    Devices: the model is where ``tb.loss_model`` puts it (a clip testbed's ``device``); ``xy`` is
    moved there once, and each state's tensors are moved there at each call (differentiably: the
    gradient of the returned 0-d loss, which lives on the model's device, flows back to the
    tensors given, e.g. CPU weights).

    Args:
        xy: model-ready inputs (N, ...) and labels (N,), e.g. ``tb.inputs(task, "val", 256)``.
    """
    from torch.func import functional_call

    model = tb.loss_model(dict(tb.finetuned[task]), task).eval()
    device = _device_of(model)
    x, y = (v.to(device) for v in xy)

    def loss(state: Mapping[str, Tensor]) -> Tensor:
        logits = functional_call(model, {k: v.to(device) for k, v in state.items()}, (x,))  # (N, C)
        return F.cross_entropy(logits, y)

    return loss


def removed_parts(delta: Mapping[str, Tensor], filtered: Mapping[str, Tensor],
                  keys: Sequence[str]) -> dict[str, Tensor]:
    """{key: Δt − Δ̃t} (stored shape, float32) for the filtered layers ``keys`` (= Δt P_t, P5).

    Raises:
        KeyError: a key missing from ``delta`` or ``filtered``.
    """
    out = {}
    for k in keys:
        if k not in delta or k not in filtered:
            raise KeyError(f"removed_parts: layer {k!r} missing from the task vector or its filtered copy")
        out[k] = delta[k].float() - filtered[k].float()
    return out


def shields_of(report, t: int) -> dict[str, Tensor]:
    """{key: S_t (n, s)} of task index ``t`` from a ``pact_filter(..., keep=True)`` report.

    Raises:
        ValueError: the report kept no shields (run ``pact_filter`` with ``keep=True``).
    """
    if not report.shields:
        raise ValueError("shields_of: the PACT report holds no shields; call pact_filter(..., keep=True)")
    return {k: s[t] for k, s in report.shields.items()}


def layer_terms(loss_fn: Callable[[Mapping[str, Tensor]], Tensor], theta: Mapping[str, Tensor],
                removed: Mapping[str, Tensor], shields: Mapping[str, Tensor], delta: Mapping[str, Tensor], *,
                rule: MatrixRule = DEFAULT_RULE) -> list[dict[str, float]]:
    """Per filtered layer, the two sides of C12 and what they are made of.

    For each key with G = ∇L_t(θt) and R = Δt P_t in matrix view (m, n), S = S_t (n, s):
    ``predicted`` = −⟨G, R⟩, ``bound`` = ‖G S‖_F ‖R‖_F, ``grad_share`` = ‖G S‖_F / ‖G‖_F (how much of
    the gradient lies in the shield), ``removed_energy`` = ‖R‖²_F / ‖Δt‖²_F. Their sums over layers
    are :func:`pactlib.causal.first_order_check`'s ``predicted`` and ``bound``.
    """
    params = {k: v.detach().clone().requires_grad_(k in removed) for k, v in theta.items()}
    grads = torch.autograd.grad(loss_fn(params), [params[k] for k in removed])
    out = []
    for (k, r), g in zip(removed.items(), grads):
        G, R = rule.view(k, g).double(), rule.view(k, r.to(g.device)).double()  # (m, n)
        gs = float((G @ shields[k].to(G.device, G.dtype)).norm())
        dn = float(delta[k].double().norm()) ** 2
        out.append(dict(key=k, predicted=-float((G * R).sum()), bound=gs * float(R.norm()),
                        grad_share=gs / float(G.norm()) if float(G.norm()) else math.nan,
                        removed_energy=float(R.norm()) ** 2 / dn if dn else math.nan))
    return out


@torch.no_grad()
def loss_path(loss_fn: Callable[[Mapping[str, Tensor]], Tensor], theta: Mapping[str, Tensor],
              removed: Mapping[str, Tensor], fracs: Sequence[float], *, base: float | None = None) -> list[float]:
    """L_t(θt − s·Δt P_t) − L_t(θt) for each s in ``fracs`` (s = 1 is the full filter).

    Args:
        base: L_t(θt) when already known (saves one forward pass).
    """
    base = float(loss_fn(dict(theta))) if base is None else base
    out = []
    for s in fracs:
        moved = {k: (v - s * removed[k].to(v.device, v.dtype) if k in removed else v) for k, v in theta.items()}
        out.append(float(loss_fn(moved)) - base)
    return out


def theory_records(tb, t: int, delta: Mapping[str, Tensor], filtered: Mapping[str, Tensor], report, *,
                   xy_loss: tuple[Tensor, Tensor], xy_test: tuple[Tensor, Tensor], fracs: Sequence[float],
                   seed: int, params: Mapping[str, Any], rule: MatrixRule = DEFAULT_RULE, **extra) -> list[dict]:
    """C12 for task index ``t`` of one PACT run: records of the totals, the path and the layers.

    Args:
        tb: the testbed; ``tb.tasks[t]`` is the task, ``tb.finetuned[task]`` is θt.
        delta, filtered: Δt and Δ̃t (key -> tensor) of that task.
        report: the :class:`pactlib.pact.PactReport` of ``pact_filter(..., keep=True)``.
        xy_loss: the validation batch on which L_t is measured; xy_test: test examples for accuracy.
        fracs: fractions s of the removed part for the loss path.
        rule: the matrix rule of the PACT run (``tb.rule``): the gradients and removed parts
            are viewed as matrices by it, as the shields were.

    Returns:
        ``"first-order"`` (one): metrics ``predicted``, ``bound``, ``measured``, ``loss`` (L_t(θt)),
        ``removed_energy`` (‖Δt P_t‖² / ‖Δt‖² over the filtered layers), ``acc_ft``, ``acc_filtered``
        (θ0 + Δ̃t on ``xy_test``) and ``acc_change`` = acc_filtered − acc_ft, ``outcomes``: θ0 + Δ̃t's
        per-example test outcomes; ``"finetuned"`` (one): θt's test accuracy and outcomes
        (:func:`pactlib.book.experiments.paired.finetuned_record`); ``"path"`` (one per s):
        ``frac``, ``measured``, ``predicted`` (s × the first-order term); ``"layer"`` (one per
        filtered layer, ``layer`` = position): the terms of :func:`layer_terms`.
    """
    task = tb.tasks[t]
    theta = tb.finetuned[task]
    keys = list(report.shields)
    removed = removed_parts(delta, filtered, keys)
    shields = shields_of(report, t)
    loss_fn = task_loss(tb, task, xy_loss)
    fo = causal.first_order_check(loss_fn, theta, removed, shields, rule=rule)
    rem = sum(float(r.double().norm()) ** 2 for r in removed.values())
    tot = sum(float(delta[k].double().norm()) ** 2 for k in keys)
    model = tb.loss_model(dict(theta), task)
    ft = state_scores(model, theta, xy_test, outcomes=True)
    filt = state_scores(model, {k: (v - removed[k].to(v.device, v.dtype) if k in removed else v)
                                for k, v in theta.items()}, xy_test, outcomes=True)
    common = dict(params=params, seed=seed, task=task, **extra)
    recs = [make_record("first-order", metrics=dict(**fo, removed_energy=rem / tot if tot else math.nan,
                                                    acc_ft=ft["acc"], acc_filtered=filt["acc"],
                                                    acc_change=filt["acc"] - ft["acc"]),
                        **_outcomes(task, filt), **common),
            finetuned_record(task, ft["correct"], seed=seed, params=params, loss=ft["loss"], **extra)]
    inner = [s for s in fracs if s != 1.0]  # s = 1 is first_order_check's own measurement
    path = {**dict(zip(inner, loss_path(loss_fn, theta, removed, inner, base=fo["loss"]))), 1.0: fo["measured"]}
    for s in fracs:
        recs.append(make_record("path", frac=s, metrics=dict(measured=path[s], predicted=s * fo["predicted"]), **common))
    for i, row in enumerate(layer_terms(loss_fn, theta, removed, shields, delta, rule=rule)):
        key = row.pop("key")
        recs.append(make_record("layer", key=key, layer=i, metrics=row, **common))
    return recs


# --- tables and figures ---------------------------------------------------------------------

SUMMARY = {"metrics.loss": "L_t(θt)", "metrics.predicted": "predicted", "metrics.bound": "bound",
           "metrics.measured": "measured", "metrics.removed_energy": "removed share of ‖Δt‖²",
           "metrics.acc_ft": "acc θt", "metrics.acc_filtered": "acc θ0+Δ̃t"}


def summary_table(frame):
    """One row per task (means over seeds) of the ``"first-order"`` records, plus the seed count."""
    f = frame[frame["method"] == "first-order"]
    g = f.groupby("task", sort=False)
    out = g[list(SUMMARY)].mean().rename(columns=SUMMARY)
    out["seeds"] = g["seed"].nunique()
    return out


def plot_sides(frame, *, ax) -> None:
    """Per (task, seed): a grey bar from −bound to +bound, the prediction (dot) and the measured
    change (cross), on a symmetric-log y axis."""
    f = frame[frame["method"] == "first-order"].reset_index(drop=True)
    xs = np.arange(len(f))
    b = f["metrics.bound"].to_numpy()
    ax.vlines(xs, -b, b, color="lightgrey", lw=6, label="±bound")
    ax.scatter(xs, f["metrics.predicted"], color="C0", s=18, zorder=3, label="predicted (first order)")
    ax.scatter(xs, f["metrics.measured"], color="C3", marker="x", s=22, zorder=4, label="measured")
    ax.axhline(0, color="grey", lw=0.8)
    vals = np.abs(np.concatenate([b, f["metrics.predicted"].to_numpy(), f["metrics.measured"].to_numpy()]))
    vals = vals[vals > 0]
    ax.set_yscale("symlog", linthresh=float(np.quantile(vals, 0.1)) if len(vals) else 1e-6)
    ax.set_xticks(xs, [f"{t}·{s}" for t, s in zip(f["task"], f["seed"])], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel(r"$\Delta L_t$ (nats)")
    ax.legend(loc="upper right")


def plot_path(frame, *, ax) -> None:
    """Measured loss change along θt − s·Δt P_t (solid) and s × prediction (dashed), per task."""
    f = frame[frame["method"] == "path"]
    for j, (t, g) in enumerate(f.groupby("task", sort=False)):
        m = g.groupby("frac")[["metrics.measured", "metrics.predicted"]].mean()
        s = np.concatenate([[0.0], m.index.to_numpy(dtype=float)])
        ax.plot(s, np.concatenate([[0.0], m["metrics.measured"]]), color=f"C{j % 10}", marker="o", ms=3, label=t)
        ax.plot(s, np.concatenate([[0.0], m["metrics.predicted"]]), color=f"C{j % 10}", ls="--", lw=1)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="fraction s of the removed part", ylabel=r"$L_t(\theta_t - s\,\Delta_t P_t) - L_t(\theta_t)$")
    ax.legend(ncol=2, fontsize=6, loc="upper left")


def plot_layers(frame, *, ax) -> None:
    """Per filtered layer: mean bound term (bars, left axis) and mean gradient share in the
    shield (dots, right axis)."""
    f = frame[frame["method"] == "layer"]
    g = f.groupby("layer")[["metrics.bound", "metrics.grad_share"]].mean()
    ax.bar(g.index, g["metrics.bound"], color="C0")
    ax.set(xlabel="filtered layer (pointwise convolutions, input to output)",
           ylabel=r"$\|\nabla L_t P_t\|\,\|\Delta_t P_t\|$")
    ax2 = ax.twinx()
    ax2.scatter(g.index, g["metrics.grad_share"], color="C3", s=10)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel(r"$\|\nabla L_t P_t\| / \|\nabla L_t\|$", color="C3")
    ax2.grid(False)


def c12_verdict(frame, *, small_drop: float = 0.01, rel_tol: float = 0.5) -> dict:
    """C12 from the ``"first-order"`` and ``"finetuned"`` records.

    A precondition first: |predicted| ≤ bound in every (task, seed) case (Cauchy–Schwarz: it must
    hold, so it checks the arithmetic, not the claim); when it fails, it is the verdict's one
    condition (contradicted). Else four conditions grade the claim:

    1. the bound covers the truth: the worst |measured| / bound over the tasks < 1;
    2. the first-order term has the measured change's sign: the count of (task, seed) cases with
       the wrong sign < 0.5 (none);
    3. it tracks the size: the median relative error |measured − predicted| / |measured| over the
       tasks < ``rel_tol``;
    4. small self-degradation: accuracy of θ0 + Δ̃t − accuracy of θt > −100·``small_drop``
       points (mean over tasks), paired over the same test examples.

    1 and 3 are per seed and carry the interval over seeds (:func:`~pactlib.book.intervals.over_seeds`;
    a point below 3 seeds): prediction and measurement share the loss batch, so they have no test
    sampling error; 2 is a count (a point). Records without per-example outcomes give a "not yet
    tested" verdict saying so.
    """
    f = frame[frame["method"] == "first-order"]
    if not len(f):
        return not_tested("no first-order records")
    pred, bound, meas = f["metrics.predicted"], f["metrics.bound"], f["metrics.measured"]
    n = len(f)
    n_bound = int((pred.abs() <= bound * (1 + 1e-6) + 1e-12).sum())
    pre = f"|predicted| ≤ bound (the precondition, Cauchy–Schwarz) in {n_bound}/{n} (task, seed) cases"
    if n_bound < n:
        worst = float((pred.abs() / bound.where(bound > 0)).max())
        return graded([condition("largest ratio of the prediction's size to the bound", intervals.point(worst),
                                 threshold=1.0 + 1e-6, side="<", unit="")], pre + ": the arithmetic is wrong")
    try:
        tasks = list(dict.fromkeys(f["task"]))
        fin = frame[(frame["method"] == "finetuned") & frame["task"].isin(tasks)]
        change = intervals.contrast(stacked(f, tasks=tasks), stacked(fin, tasks=tasks))
    except MissingOutcomes:
        return not_tested(f"C12's accuracy change compares θ0 + Δ̃t and θt on the same test examples: {NO_OUTCOMES}. "
                          f"{pre}")
    g = f.assign(within=meas.abs() / bound.where(bound > 0),
                 rel=(meas - pred).abs() / meas.abs().where(meas.abs() > 0)).groupby("seed", sort=True)
    n_wrong = int((np.sign(pred.to_numpy()) != np.sign(meas.to_numpy())).sum())
    conds = [condition("worst ratio of the measured change's size to the bound",
                       intervals.over_seeds(list(g["within"].max().dropna())), threshold=1.0, side="<", unit=""),
             condition("(task, seed) cases where the first-order term has the wrong sign", intervals.point(n_wrong),
                       threshold=0.5, side="<", unit="cases", digits=0),
             condition("median relative error of the first-order term",
                       intervals.over_seeds(list(g["rel"].median().dropna())), threshold=rel_tol, side="<", unit=""),
             condition("accuracy change of a task under its own filter", change, threshold=-100 * small_drop)]
    return graded(conds, f"{n} (task, seed) cases over {f['seed'].nunique()} seed(s); {pre}; the loss sides share the "
                         f"loss batch (intervals over seeds), the accuracy change is paired over the same test "
                         f"examples ({change.n_examples} per task)",
                  note=f"Loss change: mean measured {meas.mean():+.4f} vs predicted {pred.mean():+.4f} nats")
