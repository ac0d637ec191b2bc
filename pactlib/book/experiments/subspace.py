"""The subspace view of load-bearing walls (book chapter 4: P1–P3; claim C4).

- :func:`subspaces_by_layer`: the pre-trained core V0,K (P1), every task's active subspace Vt,k
  (P2) and LBW subspace Vt,LBW (P3) for each matrix layer, in network order;
- :func:`dimension_records`: K, k, LBW rank and the survival values σ per (layer, task);
- :func:`ablation_bases`: the subspace removed from every layer of θt under one condition: the
  LBW itself, a random control of the same dimension (in R^n, or in the orthogonal complement
  of Vt,k), or a random subspace of R^n that removes as much weight energy as the LBW;
- :func:`removed_energy`: the share of the weights' energy an ablation removes, ‖W V‖²/‖W‖²;
- :func:`ablation_records`: C4's measurements for one task (accuracy drop and removed energy
  per condition, draw and ablation strength);
- :func:`plot_dimensions`, :func:`plot_drops`, :func:`plot_energy`, :func:`drop_table`,
  :func:`condition_summary`, :func:`c4_verdict`.

Ablation is W → W − W V Vᵀ on the matrix view (``causal.ablate_subspaces``). Every function
returns new objects; state dicts and task vectors are never modified.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pactlib import causal
from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.pact import LayerSubspaces, PactOptions, layer_subspaces
from pactlib.book import intervals
from pactlib.book.records import make_record
from pactlib.book.verdicts import condition, graded, not_tested
from pactlib.book.intervals import NO_OUTCOMES
from pactlib.book.experiments.paired import MissingOutcomes, finetuned_record, stacked
from pactlib.outcomes import packed
from pactlib.book.experiments.depth import network_order

__all__ = ["CONDITIONS", "LABELS", "subspaces_by_layer", "dimension_records", "ablation_bases", "removed_energy",
           "ablation_records", "plot_dimensions", "plot_drops", "plot_energy", "drop_table", "condition_summary",
           "c4_verdict", "contrasts", "contrast_table", "graded_strength", "PLAIN"]

#: Ablation conditions of C4: the LBW and its three random controls of the same dimension.
CONDITIONS = ("lbw", "random", "complement", "energy")
LABELS = {"lbw": r"$V_{t,\mathrm{LBW}}$", "random": r"random in $\mathbb{R}^n$",
          "complement": r"random $\perp V_{t,k}$", "energy": r"random in $\mathbb{R}^n$, energy-matched"}


def subspaces_by_layer(pretrained: Mapping[str, Tensor], task_vectors: Sequence[Mapping[str, Tensor]], *,
                       options: PactOptions = PactOptions(), rule: MatrixRule = DEFAULT_RULE,
                       keys: Sequence[str] | None = None) -> dict[str, LayerSubspaces]:
    """P1–P3 for every matrix layer: {key: LayerSubspaces}, keys in network order.

    Args:
        pretrained: θ0 (its matrix layers give the cores V0,K).
        task_vectors: Δ1..ΔT over θ0's floating keys.
        options: ranks, τ and SVD choice (``PactOptions``; ``layers`` is ignored).
        keys: the layers (default: every matrix layer of θ0).

    Raises:
        KeyError: a key missing from θ0 or a task vector. ValueError: no task vectors.
    """
    if not task_vectors:
        raise ValueError("subspaces_by_layer: no task vectors")
    keys = network_order(keys if keys is not None else rule.matrix_keys(pretrained))
    out = {}
    for key in keys:
        missing = [i for i, tv in enumerate(task_vectors) if key not in tv]
        if key not in pretrained or missing:
            raise KeyError(f"subspaces_by_layer: layer {key!r} missing from θ0 or task vector(s) {missing}")
        W0 = rule.view(key, pretrained[key]).float()  # (m, n)
        out[key] = layer_subspaces(W0, [rule.view(key, tv[key]).float() for tv in task_vectors], options)
    return out


def dimension_records(pretrained: Mapping[str, Tensor], subspaces: Mapping[str, LayerSubspaces], tasks: Sequence[str], *,
                      tol: float, params: Mapping, seed: int, rule: MatrixRule = DEFAULT_RULE, **extra) -> list[dict]:
    """One ``dimensions`` record per (layer, task): ``m``, ``n``, ``K``, ``k``, ``lbw_rank``, the
    survival values σ of the core outside Vt,k (``sigma_mean``, ``sigma_min``, ``survive`` = share
    of σ ≥ ``tol``) and ``core_energy`` = ‖W0 V0,K‖²/‖W0‖² (P1–P3). ``depth`` is the position of
    the layer in ``subspaces`` (network order)."""
    out = []
    for depth, (key, s) in enumerate(subspaces.items()):
        W0 = rule.view(key, pretrained[key]).float()  # (m, n)
        core_energy = float((W0 @ s.core.float()).pow(2).sum() / W0.pow(2).sum())
        for t, task in enumerate(tasks):
            sig = s.lbw[t].sigma.float()
            K = s.core.shape[1]
            out.append(make_record("dimensions", params=params, seed=seed, key=key, depth=depth, task=task, metrics=dict(
                m=W0.shape[0], n=W0.shape[1], K=K, k=s.active[t].shape[1], lbw_rank=s.lbw[t].basis.shape[1],
                sigma_mean=float(sig.mean()) if len(sig) else None, sigma_min=float(sig.min()) if len(sig) else None,
                survive=float((sig >= tol).float().mean()) if len(sig) else None, core_energy=core_energy), **extra))
    return out


def _layer_seed(seed: int, draw: int, depth: int) -> int:
    """A distinct, reproducible seed per (run seed, draw, layer)."""
    return (seed * 7919 + draw) * 1009 + depth


def ablation_bases(subspaces: Mapping[str, LayerSubspaces], t: int, condition: str, *, seed: int = 0,
                   draw: int = 0, state: Mapping[str, Tensor] | None = None,
                   rule: MatrixRule = DEFAULT_RULE) -> dict[str, Tensor]:
    """{key: V (n, r')} removed from every layer of θt under ``condition`` (C4); r = rank of Vt,LBW:

    - ``"lbw"``: Vt,LBW itself (r' = r);
    - ``"random"``: a random r-dimensional subspace of R^n;
    - ``"complement"``: a random r-dimensional subspace of the orthogonal complement of Vt,k;
    - ``"energy"``: a random subspace of R^n matched in *energy* instead of dimension: with
      e = ‖W Vt,LBW‖²_F / ‖W‖²_F the share of the layer's energy the LBW holds (W = the layer of
      ``state``, i.e. θt), r' = round(e·n), clipped to [0, n − 1]. A random r'-dimensional subspace
      removes r'/n of any W's energy in expectation, so this control removes as much energy as
      the LBW, spread over random directions. (Vt,LBW is built from the pre-trained core, the
      directions where W0 is largest, so it removes far more energy than r random directions.)

    Random bases are seeded by (``seed``, ``draw``, layer position): reproducible and different
    per layer and draw.

    Raises:
        ValueError: unknown condition (lists the known ones), or ``"energy"`` without ``state``.
    """
    if condition not in CONDITIONS:
        raise ValueError(f"unknown ablation condition {condition!r}; use one of {CONDITIONS}")
    if condition == "energy" and state is None:
        raise ValueError("ablation_bases: the 'energy' condition needs the state dict θt (state=...)")
    out = {}
    for depth, (key, s) in enumerate(subspaces.items()):
        lbw = s.lbw[t].basis
        n, r = lbw.shape
        sd = _layer_seed(seed, draw, depth)
        if condition == "lbw" or r == 0:
            out[key] = lbw
        elif condition == "random":
            out[key] = causal.random_basis(n, r, seed=sd)
        elif condition == "complement":
            out[key] = causal.random_basis(n, r, seed=sd, within=s.active[t])
        else:
            share = removed_energy({key: state[key]}, {key: lbw}, rule=rule)["pooled"]
            out[key] = causal.random_basis(n, min(n - 1, max(0, round(share * n))), seed=sd)
    return out


def removed_energy(state: Mapping[str, Tensor], bases: Mapping[str, Tensor], *,
                   rule: MatrixRule = DEFAULT_RULE) -> dict[str, float]:
    """Share of the weights' energy that removing ``bases`` takes away, ‖W V‖²_F / ‖W‖²_F:
    ``pooled`` over all the layers (dominated by the large ones) and ``layer_mean`` (the mean of
    the per-layer shares). NaN for no layers."""
    num = den = 0.0
    shares = []
    for key, V in bases.items():
        W = rule.view(key, state[key]).float()  # (m, n)
        a, b = float((W @ V.float()).pow(2).sum()), float(W.pow(2).sum())
        num, den = num + a, den + b
        shares.append(a / b if b > 0 else 0.0)
    return {"pooled": num / den if den > 0 else float("nan"),
            "layer_mean": float(np.mean(shares)) if shares else float("nan")}


def ablation_records(tb, task: str, subspaces: Mapping[str, LayerSubspaces], *, draws: int, seed: int,
                     params: Mapping, strengths: Sequence[float] = (1.0,), conditions: Sequence[str] = CONDITIONS,
                     rule: MatrixRule = DEFAULT_RULE, **extra) -> list[dict]:
    """C4 for one task: ablate each condition's subspaces from every layer of θt and measure the
    task's test accuracy.

    The ablation of strength γ is W → W − γ W V Vᵀ (γ = 1: the subspace is removed, the claim's
    operation; γ < 1: its component is shrunk by the factor 1 − γ). It is
    ``causal.ablate_subspaces`` applied to the scaled basis √γ V.

    Args:
        tb: a testbed (:class:`pactlib.testbeds.Testbed`: ``tasks``, ``finetuned``, ``ft_test`` and
            ``evaluate(state, split, tasks)``); θt is ``tb.finetuned[task]`` (not modified) and
            the baseline ``tb.ft_test[task]``, on the same test examples.
        task: the task t.
        subspaces: from :func:`subspaces_by_layer` over ``tb``'s task vectors (in ``tb.tasks`` order).
        draws: random draws per random condition (the LBW is deterministic: one).
        strengths: the γ values, each in (0, 1].

    Returns:
        ``ablate`` records, one per (condition, draw, strength): metrics ``acc``, ``drop``
        (baseline − acc), ``energy`` = Σ‖W V‖²/Σ‖W‖² over the layers (the share of the weight energy
        inside the ablated subspace), ``removed`` = (1 − (1 − γ)²)·``energy`` (the share the
        ablation takes away), ``energy_layer_mean`` (mean of the per-layer shares), ``dims``
        (ablated dimensions over all layers) and ``overlap`` = Σ_l ‖Vt,LBWᵀ V‖²_F / dims, the mean
        squared cosine of the principal angles between the ablated subspace and the LBW (1 for the
        LBW, about r/n for a random subspace); fields ``task``, ``condition``, ``draw``,
        ``strength``, ``outcomes`` (the ablated model's per-example test outcomes, when
        ``tb.evaluate`` returns :class:`~pactlib.outcomes.Scores`) and ``extra``. First, when
        ``tb.ft_test`` carries outcomes, one ``"finetuned"`` record of θt
        (:func:`pactlib.book.experiments.paired.finetuned_record`), the base of the paired drops.

    Raises:
        KeyError: ``task`` not in the testbed. ValueError: a strength outside (0, 1].
    """
    if task not in tb.tasks:
        raise KeyError(f"ablation_records: task {task!r} not in the testbed's tasks {list(tb.tasks)}")
    bad = [g for g in strengths if not 0 < g <= 1]
    if bad:
        raise ValueError(f"ablation_records: strengths must be in (0, 1], got {bad}")
    t, state, baseline = list(tb.tasks).index(task), tb.finetuned[task], tb.ft_test[task]
    out = []
    ft_out = getattr(tb.ft_test, "outcomes", {}).get(task)
    if ft_out is not None:  # θt's own outcomes: the base of the paired drops
        out.append(finetuned_record(task, ft_out, seed=seed, params=params, **extra))
    for cond in conditions:
        for draw in range(1 if cond == "lbw" else draws):
            bases = ablation_bases(subspaces, t, cond, seed=seed, draw=draw, state=state, rule=rule)
            e = removed_energy(state, bases, rule=rule)
            dims = sum(int(V.shape[1]) for V in bases.values())
            overlap = sum(float((subspaces[k].lbw[t].basis.float().mT @ V.float()).pow(2).sum())
                          for k, V in bases.items())
            for gamma in strengths:
                scaled = {k: V * gamma ** 0.5 for k, V in bases.items()}  # √γ V: W − γ W V Vᵀ
                got = tb.evaluate(causal.ablate_subspaces(state, scaled, rule=rule), "test", [task])
                acc, kept = got[task], packed(got)
                out.append(make_record("ablate", params=params, seed=seed, task=task, condition=cond, draw=draw,
                                       strength=gamma, metrics=dict(
                                           acc=acc, drop=baseline - acc, energy=e["pooled"],
                                           removed=(1 - (1 - gamma) ** 2) * e["pooled"],
                                           energy_layer_mean=e["layer_mean"], dims=dims,
                                           overlap=overlap / dims if dims else None),
                                       **({"outcomes": {"test": kept}} if kept else {}), **extra))
    return out


def plot_dimensions(frame: pd.DataFrame, *, axes) -> None:
    """Left: n, K, mean k and mean LBW rank (band: smallest to largest task) per layer, log scale.
    Right: mean survival value σ of the core directions and the share of the core kept (σ ≥ τ)."""
    f = frame[frame["method"] == "dimensions"]
    g = f.groupby("depth")
    x = g.size().index
    ax = axes[0]
    ax.plot(x, g["metrics.n"].first(), color="grey", lw=1, label="input dim n")
    ax.plot(x, g["metrics.K"].first(), marker="s", ms=6, mfc="none", lw=2.5, label="core K")
    ax.plot(x, g["metrics.k"].mean(), marker="^", ms=5, mfc="none", ls="--", label="active k (mean)")
    line, = ax.plot(x, g["metrics.lbw_rank"].mean(), marker="o", ms=2.5, lw=1, label="LBW rank (mean)")
    ax.fill_between(x, g["metrics.lbw_rank"].min(), g["metrics.lbw_rank"].max(), color=line.get_color(), alpha=0.2, lw=0)
    ax.set(yscale="log", xlabel="matrix layer (input → output)", ylabel="dimension")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(x, g["metrics.sigma_mean"].mean(), marker="o", ms=3, label=r"mean survival $\sigma$")
    ax.plot(x, g["metrics.survive"].mean(), marker="s", ms=3, label=r"share of core kept ($\sigma\geq\tau$)")
    ax.plot(x, g["metrics.core_energy"].first(), ls="--", lw=1, label=r"energy of $W_0$ in the core")
    ax.set(ylim=(0, 1.05), xlabel="matrix layer (input → output)", ylabel="fraction")
    ax.legend(fontsize=7)


def _ablations(frame: pd.DataFrame) -> pd.DataFrame:
    f = frame[frame["method"] == "ablate"].copy()
    if "strength" not in f:
        f["strength"] = 1.0
    return f


def drop_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy drop (points) per (strength γ, task) and condition, means over seeds and draws."""
    f = _ablations(frame)
    t = (100 * f.groupby(["strength", "task", "condition"], sort=False)["metrics.drop"].mean()).unstack("condition")
    t = t[[c for c in CONDITIONS if c in t.columns]].rename(columns=LABELS)
    t.index = t.index.set_levels([f"{v:g}" for v in t.index.levels[0]], level=0).set_names(["γ", "task"])
    return t


def condition_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (strength γ, condition): mean accuracy drop (points), the share of weight energy
    in the ablated subspace and the share removed (%, pooled over layers), the mean per-layer
    share (%), the overlap with the LBW (%) and the ablated dimensions; means over tasks, seeds
    and draws."""
    f = _ablations(frame)
    cols = {"metrics.drop": "drop (points)", "metrics.energy": "energy in V %", "metrics.removed": "energy removed %",
            "metrics.energy_layer_mean": "energy in V % (layer mean)", "metrics.overlap": "overlap with LBW %",
            "metrics.dims": "dimensions"}
    g = f.groupby(["strength", "condition"])[[c for c in cols if c in f]].mean()
    g[[c for c in g.columns if c != "metrics.dims"]] *= 100
    order = [(s, c) for s in sorted(set(f["strength"])) for c in CONDITIONS if (s, c) in g.index]
    g = g.reindex(order).rename(columns=cols, index=LABELS)
    g.index = g.index.set_levels([f"{v:g}" for v in g.index.levels[0]], level=0).set_names(["γ", "condition"])
    return g


def plot_drops(frame: pd.DataFrame, *, ax, strength: float = 1.0, conditions: Sequence[str] = CONDITIONS,
               errors: pd.DataFrame | None = None) -> None:
    """Grouped bars: mean accuracy drop (points) per task and condition at ablation strength
    ``strength``; dots: seeds and draws; with ``errors`` (:func:`contrasts` ``by_task=True``), a
    black 95 % error bar on each bar."""
    f = _ablations(frame)
    f = f[np.isclose(f["strength"], strength)]
    tasks = list(dict.fromkeys(f["task"]))
    width = 0.8 / len(conditions)
    for j, c in enumerate(conditions):
        xs = np.arange(len(tasks)) + (j - (len(conditions) - 1) / 2) * width
        sel = f[f["condition"] == c]
        ax.bar(xs, [100 * sel[sel["task"] == t]["metrics.drop"].mean() for t in tasks], width=0.95 * width,
               label=LABELS[c])
        for x, t in zip(xs, tasks):
            pts = 100 * sel[sel["task"] == t]["metrics.drop"]
            ax.scatter([x] * len(pts), pts, color="black", s=5, zorder=3)
        if errors is not None and len(errors):
            e = errors[(errors["condition"] == c) & np.isclose(errors["strength"], strength)].set_index("task")
            pts = [(x, 100 * sel[sel["task"] == t]["metrics.drop"].mean(), e.loc[t]) for x, t in zip(xs, tasks)
                   if t in e.index]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                            yerr=[[max(0.0, p[1] - p[2]["drop_lo"]) for p in pts],
                                  [max(0.0, p[2]["drop_hi"] - p[1]) for p in pts]],
                            fmt="none", ecolor="black", elinewidth=1, capsize=2, zorder=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(tasks)), tasks, rotation=20, ha="right")
    ax.set(ylabel="accuracy drop (points)", title=f"ablation strength γ = {strength:g}")
    ax.legend(fontsize=7, ncol=2)


def plot_energy(frame: pd.DataFrame, *, ax, conditions: Sequence[str] = CONDITIONS) -> None:
    """Accuracy drop (points) against the share of weight energy the ablation removes (%), one
    point per ablation: colour = condition, marker = strength γ."""
    f = _ablations(frame)
    markers = dict(zip(sorted(set(f["strength"])), "os^vD"))
    for j, c in enumerate(conditions):
        for gamma, m in markers.items():
            sel = f[(f["condition"] == c) & np.isclose(f["strength"], gamma)]
            ax.scatter(100 * sel["metrics.removed"], 100 * sel["metrics.drop"], s=14, marker=m, color=f"C{j}",
                       label=f"{LABELS[c]}, γ = {gamma:g}")
    ax.set(xscale="log", xlabel="weight energy removed (%, log scale)", ylabel="accuracy drop (points)")
    ax.xaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(mticker.FormatStrFormatter("%g"))
    ax.legend(fontsize=6, ncol=2)


def _side(frame: pd.DataFrame, condition: str | None, strength: float | None, tasks: Sequence[str]) -> list[dict]:
    """Stacked records (:func:`~pactlib.book.experiments.paired.stacked`) of θt (``condition``
    None) or of one ablation condition at one strength, over ``tasks``."""
    if condition is None:
        f = frame[(frame["method"] == "finetuned") & frame["task"].isin(list(tasks))]
        return stacked(f, tasks=tasks)
    f = _ablations(frame)
    f = f[(f["condition"] == condition) & np.isclose(f["strength"], strength) & f["task"].isin(list(tasks))]
    return stacked(f, ["draw"], tasks=tasks)


def graded_strength(frame: pd.DataFrame) -> float:
    """The strength C4 is graded at: γ = 1 (the claim's removal) when run, else the largest γ."""
    s = sorted(set(_ablations(frame)["strength"]))
    return 1.0 if any(np.isclose(s, 1.0)) else float(s[-1])


def contrasts(frame: pd.DataFrame, *, by_task: bool = False) -> pd.DataFrame:
    """Paired contrasts of the ablations on the same test examples, per strength γ and condition
    (and per task with ``by_task``; else the mean over tasks): ``drop`` from θt and ``excess`` =
    drop(V_LBW) − drop(condition), points, each with its 95 % interval (``*_lo``, ``*_hi``), the
    seeds and the test examples per task behind them.

    Raises:
        MissingOutcomes: records without per-example outcomes.
    """
    f = _ablations(frame)
    tasks = list(dict.fromkeys(frame[frame["method"] == "finetuned"]["task"]))
    if not tasks:
        raise MissingOutcomes(NO_OUTCOMES)
    rows = []
    for gamma in sorted(set(f["strength"])):
        for sub in ([[t] for t in tasks] if by_task else [tasks]):
            ft, lbw = _side(frame, None, gamma, sub), _side(frame, "lbw", gamma, sub)
            for c in [c for c in CONDITIONS if c in set(f["condition"])]:
                side = _side(frame, c, gamma, sub)
                d = intervals.contrast(ft, side)
                x = intervals.contrast(side, lbw)
                rows.append({"strength": float(gamma), "task": sub[0] if by_task else "mean", "condition": c,
                             "drop": d.estimate, "drop_lo": d.lo, "drop_hi": d.hi, "excess": x.estimate,
                             "excess_lo": x.lo, "excess_hi": x.hi, "excess_iv": x, "seeds": d.n_seeds,
                             "examples": d.n_examples})
    return pd.DataFrame(rows)


def contrast_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (γ, condition), means over tasks: the accuracy drop from θt and the LBW's drop
    minus the condition's, each as "estimate [95 % interval]" in points, with seeds and test
    examples per task."""
    c = contrasts(frame)
    out = pd.DataFrame({
        "γ": [f"{g:g}" for g in c["strength"]], "condition": [PLAIN[x] for x in c["condition"]],
        "drop (points)": [intervals.Interval(r.drop, r.drop_lo, r.drop_hi, 0.0).text(1) for r in c.itertuples()],
        "drop(LBW) − drop (points)": ["" if r.condition == "lbw" else r.excess_iv.text(1) for r in c.itertuples()],
        "seeds": c["seeds"], "examples per task": c["examples"]})
    return out.set_index(["γ", "condition"])


def c4_verdict(frame: pd.DataFrame, *, margin: float = 0.02, controls: Sequence[str] = ("random", "complement")) -> dict:
    """C4 from ``ablate`` records: removing V_t,LBW (γ = 1, or the largest γ run) drops task t's
    accuracy by more than removing each control in ``controls`` plus ``margin`` (accuracy; 0.02 =
    2 points, "far more").

    One condition per control: drop(V_LBW) − drop(control) > 100·``margin`` points, the paired
    contrast over the same test examples, mean over tasks, draws averaged per seed. Other strengths
    and the energy-matched control are reported in the note, not graded. Records without
    per-example outcomes give a verdict of status NOT_TESTED saying so.
    """
    f = _ablations(frame)
    if not len(f):
        return not_tested("no ablation records")
    try:
        c = contrasts(frame)
    except MissingOutcomes:
        return not_tested(f"C4 compares ablated models on the same test examples: {NO_OUTCOMES}")
    gamma = graded_strength(frame)
    at = c[np.isclose(c["strength"], gamma)].set_index("condition")
    conds = [condition(f"drop(V_LBW) − drop({PLAIN[k]}), γ = {gamma:g}", at.loc[k, "excess_iv"],
                       threshold=100 * margin, digits=1) for k in controls]
    rest = [f"γ = {r.strength:g}, {PLAIN[r.condition]}: {r.excess_iv.text(1)}" for r in c.itertuples()
            if r.condition != "lbw" and not (np.isclose(r.strength, gamma) and r.condition in controls)]
    n = at.loc["lbw"]
    return graded(conds, f"mean over {f['task'].nunique()} tasks, paired over the same test examples "
                         f"({int(n['examples'])} per task), {int(n['seeds'])} seed(s); LBW drop at γ = {gamma:g}: "
                         f"{intervals.Interval(n['drop'], n['drop_lo'], n['drop_hi'], 0.0).text(1)} points",
                  note=("Not graded, drop(V_LBW) − drop(control) in points: " + "; ".join(rest)) if rest else "")


#: The conditions in plain text (tables and verdicts are not typeset as mathematics).
PLAIN = {"lbw": "V_t,LBW", "random": "random in ℝⁿ", "complement": "random ⊥ V_t,k",
         "energy": "random in ℝⁿ, energy-matched"}
