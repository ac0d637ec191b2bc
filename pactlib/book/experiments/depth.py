"""Layer depth (book chapter 7, claim C9): where in the network PACT's filter matters.

- :func:`network_order`: matrix-layer keys from input to output (state dicts are often sorted
  by name, which puts ``_blocks.10`` before ``_blocks.2``);
- :func:`alpha_grid`: a geometric α grid over a method's range, optionally widened below it;
- :func:`layer_regexes`, :func:`group_options`: a depth group as ``PactOptions(layers=...)``;
- :func:`group_task_vectors`: the task vectors PACT gives when only a group of layers is
  filtered, assembled from one filter over every layer (the filter acts layer by layer, so this
  equals a run with :func:`group_options`; the tests check the identity);
- :func:`group_record`: one merge → α → test record for a depth group;
- :func:`intrusion_records`: C9's intrusion energy of the other tasks' updates into each task's
  LBW subspace, per layer and task;
- :func:`group_gains`, :func:`plot_group_gains`, :func:`plot_intrusion`;
- :func:`gain_intervals`, :func:`gain_table`, :func:`plot_gain_intervals`, :func:`c9_verdicts`: the gains
  with 95 % intervals (paired on the test examples) and C9 graded on them;
- :func:`layer_records`, :func:`groups_from_records`: the layers' network order and depth groups
  as records, so the chapter's tables and figures are drawn from records alone.

Every function returns new objects; task vectors and state dicts are never modified.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch

from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.pact import LayerSubspaces, PactOptions
from pactlib.book.records import make_record
from pactlib.book.verdicts import not_tested
from pactlib.subspaces import intrusion_energy
from pactlib.taskvector import TaskVector
from pactlib.testbeds import run

__all__ = ["GROUPS", "network_order", "alpha_grid", "layer_regexes", "group_options", "group_task_vectors",
           "group_record", "intrusion_records", "group_gains", "condition_table", "intrusion_table",
           "plot_group_gains", "plot_intrusion", "c9_verdicts", "gain_intervals", "gain_table",
           "plot_gain_intervals", "layer_records", "groups_from_records"]

#: The conditions of chapter 7, in plotting order: no filter, one depth group, every layer.
GROUPS = ("none", "early", "middle", "late", "all")
_NUM = re.compile(r"(\d+)")


def _natural(key: str) -> tuple:
    """``"_blocks.10._expand_conv.weight"`` -> ("_blocks.", 10, "._expand_conv.weight")."""
    return tuple(int(p) if p.isdigit() else p for p in _NUM.split(key))


def network_order(keys: Sequence[str], reference: Sequence[str] | None = None) -> list[str]:
    """``keys`` from the input to the output of the network.

    Args:
        keys: matrix-layer keys in any order.
        reference: keys in network order (e.g. ``list(model.state_dict())``, which follows module
            registration); when given, ``keys`` are sorted by their position in it.

    Without a reference, keys are sorted "naturally" (numbers compared as numbers). That is the
    network order of EfficientNet-Lite0 (``_blocks.N._expand_conv`` before ``_project_conv``,
    ``_conv_head`` last; checked against the model in the tests), not of every model.

    Raises:
        KeyError: a key missing from ``reference`` (named).
    """
    keys = list(keys)
    if reference is None:
        return sorted(keys, key=_natural)
    pos = {k: i for i, k in enumerate(reference)}
    missing = [k for k in keys if k not in pos]
    if missing:
        raise KeyError(f"network_order: key(s) {missing[:3]} not in the reference order")
    return sorted(keys, key=pos.__getitem__)


def layer_regexes(keys: Sequence[str]) -> tuple[str, ...]:
    """Regular expressions matching exactly ``keys`` (``"^" + re.escape(key) + "$"``)."""
    return tuple("^" + re.escape(k) + "$" for k in keys)


def group_options(options: PactOptions, keys: Sequence[str]) -> PactOptions:
    """``options`` restricted to the layers ``keys`` (``PactOptions.layers``).

    Raises:
        ValueError: ``keys`` is empty (an empty group would filter nothing; run the plain merge).
    """
    if not keys:
        raise ValueError("group_options: empty layer group; use the plain merge (pact=None) instead")
    return options.replace(layers=layer_regexes(keys))


def group_task_vectors(raw: Sequence[TaskVector], filtered: Sequence[TaskVector],
                       keys: Sequence[str]) -> list[TaskVector]:
    """Per task: the filtered values at ``keys``, the raw values everywhere else.

    With ``filtered`` from ``pact_filter(..., options)`` over every layer, this is what
    ``pact_filter(..., group_options(options, keys))`` returns (P4–P5 act on each layer alone).
    When either side is lazy (:class:`pactlib.testbeds.lazy_vectors.LazyTaskVector`, e.g. a clip
    testbed's), the result is lazy too (:func:`pactlib.testbeds.lazy_vectors.overlay`: nothing
    copied, each key read from its side on access); otherwise in-memory copies.

    Raises:
        ValueError: different task counts; KeyError: a key missing from a task vector.
    """
    from pactlib.testbeds.lazy_vectors import check_pairs, is_lazy, overlay

    if is_lazy(raw) or is_lazy(filtered):
        return overlay(raw, filtered, keys)
    check_pairs(raw, filtered, keys, "group_task_vectors")
    out = []
    for r, f in zip(raw, filtered):
        d = dict(r.items())
        d.update({k: f[k] for k in keys})
        out.append(TaskVector(d, name=r.name, dtype=r.dtype))
    return out


def group_record(tb, method: str, group: str, *, keys: Sequence[str], raw: Sequence[TaskVector],
                 filtered: Sequence[TaskVector], options: PactOptions, alphas: Sequence[float]) -> dict:
    """Merge with PACT on the layers ``keys`` only (``group == "none"``: the plain merge), choose
    α on validation, test: one record from :func:`pactlib.testbeds.run` with ``group``, ``pact`` and the PACT options
    (``layers`` = number of filtered layers) filled in."""
    if group == "none":
        rec = run(tb, method, alphas=alphas, task_vectors=raw, label=f"{method}[none]")
        return {**rec, "group": group, "n_layers": 0}
    tvs = group_task_vectors(raw, filtered, keys)
    rec = run(tb, method, alphas=alphas, task_vectors=tvs, label=f"pact-{method}[{group}]")
    opts = {**asdict(options), "layers": len(keys)}
    return {**rec, "group": group, "pact": "pact", "n_layers": len(keys), "params": {**rec["params"], **opts}}


def intrusion_records(task_vectors: Sequence[TaskVector], subspaces: Mapping[str, LayerSubspaces], *,
                      keys: Sequence[str], params: Mapping, seed: int, rule: MatrixRule = DEFAULT_RULE,
                      **extra) -> list[dict]:
    """C9's intrusion energy per (layer, task): Σ_{j≠t} ‖Δj Vt,LBW‖²_F / Σ_{j≠t} ‖Δj‖²_F.

    Args:
        task_vectors: Δ1..ΔT (their matrix views are used).
        subspaces: {key: LayerSubspaces} with one LBW basis per task (e.g. ``report.subspaces``
            of ``pact_filter(..., keep=True)``).
        keys: the layers, in network order (``depth`` = position in it).

    Returns:
        Records ``intrusion`` with metrics ``intrusion``, ``chance`` (r_LBW / n: the share an
        isotropic update would put into an r-dimensional subspace) and ``lbw_rank``, plus
        ``key``, ``depth``, ``task``, ``T`` and ``extra``.

    Raises:
        KeyError: a key without subspaces. ValueError: fewer than two tasks.
    """
    T = len(task_vectors)
    if T < 2:
        raise ValueError("intrusion energy needs at least two tasks")
    out = []
    for depth, key in enumerate(keys):
        if key not in subspaces:
            raise KeyError(f"intrusion_records: no subspaces for layer {key!r}")
        views = [rule.view(key, tv[key]).float() for tv in task_vectors]  # T x (m, n)
        n = views[0].shape[1]
        for t, tv in enumerate(task_vectors):
            V = subspaces[key].lbw[t].basis.float()  # (n, r)
            value = intrusion_energy([views[j] for j in range(T) if j != t], V)
            out.append(make_record("intrusion", params=params, seed=seed, key=key, depth=depth, task=tv.name, T=T,
                                   metrics={"intrusion": value, "chance": V.shape[1] / n, "lbw_rank": V.shape[1]},
                                   **extra))
    return out


def group_gains(frame: pd.DataFrame, metric: str = "norm_acc") -> pd.DataFrame:
    """Per (suite, seed, group): test ``metric`` of the group's merge minus the unfiltered merge,
    in points. Columns ``suite``, ``seed``, ``group``, ``gain``."""
    runs = frame[frame["group"].notna()] if "group" in frame else frame.iloc[:0]
    col = f"metrics.{metric}"
    rows = []
    for (suite, seed), g in runs.groupby(["suite", "seed"], sort=False):
        base = g[g["group"] == "none"][col]
        if base.empty:
            continue
        for _, r in g[g["group"] != "none"].iterrows():
            rows.append(dict(suite=suite, seed=seed, group=r["group"], gain=100 * (r[col] - base.iloc[0])))
    return pd.DataFrame(rows, columns=["suite", "seed", "group", "gain"])


def plot_group_gains(frame: pd.DataFrame, *, ax, suites: Sequence[str], metric: str = "norm_acc") -> pd.DataFrame:
    """Bars: mean gain over seeds per depth group, one colour per suite; dots: single seeds."""
    g = group_gains(frame, metric)
    groups = [x for x in GROUPS if x != "none"]
    width = 0.8 / max(1, len(suites))
    for j, s in enumerate(suites):
        xs = np.arange(len(groups)) + (j - (len(suites) - 1) / 2) * width
        sel = g[g["suite"] == s]
        ax.bar(xs, [sel[sel["group"] == x]["gain"].mean() for x in groups], width=0.95 * width, label=f"{s} tasks")
        for x, grp in zip(xs, groups):
            pts = sel[sel["group"] == grp]["gain"]
            ax.scatter([x] * len(pts), pts, color="black", s=8, zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(groups)), [f"{x} only" if x != "all" else "all layers" for x in groups])
    ax.set_ylabel(f"gain in mean {'normalized ' if metric == 'norm_acc' else ''}accuracy (points)")
    ax.legend(title="suite")
    return g


def plot_intrusion(frame: pd.DataFrame, *, ax, suites: Sequence[str], bounds: Mapping[str, int] | None = None,
                   relative: bool = False) -> None:
    """Intrusion energy against layer depth: mean over tasks and seeds per suite (line) and a band
    from the smallest to the largest task. Absolute (%, with the isotropic reference r_LBW/n
    dashed) or, with ``relative``, divided by r_LBW/n (1 = what a random update would give).
    ``bounds``: {label: depth index where a group starts}, drawn as vertical lines."""
    f = frame[frame["method"] == "intrusion"].copy()
    f["value"] = f["metrics.intrusion"] / f["metrics.chance"] if relative else 100 * f["metrics.intrusion"]
    for s in suites:
        sel = f[f["suite"] == s]
        per_task = sel.groupby(["depth", "task"])[["value", "metrics.chance"]].mean().reset_index()
        g = per_task.groupby("depth")
        x = g.size().index
        line, = ax.plot(x, g["value"].mean(), marker="o", ms=3, label=f"{s} tasks")
        ax.fill_between(x, g["value"].min(), g["value"].max(), color=line.get_color(), alpha=0.15, lw=0)
        if not relative:
            ax.plot(x, 100 * g["metrics.chance"].mean(), ls="--", lw=1, color=line.get_color())
    if relative:
        ax.axhline(1.0, color="grey", lw=1, ls="--")
    for label, x in (bounds or {}).items():
        ax.axvline(x - 0.5, color="grey", lw=0.8, ls=":")
        ax.text(x - 0.4, ax.get_ylim()[1] * 0.98, label, fontsize=7, va="top", color="grey")
    ax.set(xlabel="matrix layer (input → output)",
           ylabel="intrusion / (r/n)" if relative else "intrusion energy (%)")
    ax.legend(title="suite" if relative else "suite (dashed: r/n)", fontsize=7)


def _suite_order(t: pd.DataFrame, quantities: Sequence[str]) -> pd.DataFrame:
    """Columns (quantity, suite) in the given quantity order and numeric suite order ("8" before "20")."""
    suites = sorted(set(t.columns.get_level_values(1)), key=lambda s: (len(str(s)), str(s)))
    return t[[(q, s) for q in quantities for s in suites if (q, s) in t.columns]]


def condition_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows: conditions (``GROUPS`` order); columns: (quantity, suite) for the mean test accuracy and
    normalized accuracy (%), the chosen α and, when recorded, the share of seeds whose α lies on an
    edge of the grid (``on_edge``); means over seeds."""
    runs = frame[frame["group"].notna()].copy()
    quantities = ["metrics.acc", "metrics.norm_acc", "alpha"]
    if "on_edge" in runs:
        runs["on_edge"] = runs["on_edge"].astype(float)
        quantities.append("on_edge")
    t = runs.pivot_table(index="group", columns="suite", values=quantities,
                         aggfunc="mean").reindex([g for g in GROUPS if g in set(runs["group"])])
    for c in ("metrics.acc", "metrics.norm_acc"):
        t[c] = 100 * t[c]
    names = {"metrics.acc": "acc %", "metrics.norm_acc": "norm. acc %", "on_edge": "α on edge"}
    return _suite_order(t, quantities).rename(columns=lambda c: names.get(c, c))


def intrusion_table(frame: pd.DataFrame, groups: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    """Per depth group (rows) and suite (columns): mean intrusion energy (%), its isotropic reference
    r/n (%) and their ratio (mean over layers and tasks of intrusion / (r/n); 1 = chance).
    ``groups``: {group: keys} as from ``study.depth_groups`` (``"all"`` is skipped)."""
    f = frame[frame["method"] == "intrusion"].copy()
    where = {k: g for g, ks in groups.items() if g != "all" for k in ks}
    f["group"] = f["key"].map(where)
    f["metrics.intrusion"] *= 100
    f["metrics.chance"] *= 100
    f["ratio"] = f["metrics.intrusion"] / f["metrics.chance"]
    quantities = ["metrics.intrusion", "metrics.chance", "ratio"]
    t = f.pivot_table(index="group", columns="suite", values=quantities, aggfunc="mean")
    t = _suite_order(t.reindex([g for g in groups if g != "all" and g in set(f["group"])]), quantities)
    names = {"metrics.intrusion": "intrusion %", "metrics.chance": "r/n %", "ratio": "intrusion / (r/n)"}
    return t.rename(columns=lambda c: names.get(c, c))


def _contrast(frame: pd.DataFrame, suite: str, plus: Sequence[str], minus: Sequence[str], metric: str):
    """The 95 % interval (points) of mean(groups ``plus``) − mean(groups ``minus``) at ``suite``: a
    paired contrast on the same test examples (:func:`pactlib.book.intervals.contrast`); a group
    named twice on a side counts twice."""
    from pactlib.book.experiments.paired import rows
    from pactlib.book.intervals import contrast

    side = lambda gs: [r for g in gs for r in rows(frame, suite=suite, group=g)]  # noqa: E731
    return contrast(side(plus), side(minus), metric=metric)


def gain_intervals(frame: pd.DataFrame, *, suites: Sequence[str], metric: str = "norm_acc") -> dict:
    """{(suite, group): Interval} of each filtered group's gain over the unfiltered merge (points,
    paired on the test examples, over the suite's seeds); {} when the records carry no per-example
    outcomes."""
    from pactlib.book.intervals import has_outcomes
    from pactlib.book.experiments.paired import rows

    out = {}
    for s in suites:
        if not has_outcomes(rows(frame, suite=s, group="none")):
            return {}
        for g in GROUPS[1:]:
            if rows(frame, suite=s, group=g):
                out[(s, g)] = _contrast(frame, s, [g], ["none"], metric)
    return out


def gain_table(frame: pd.DataFrame, *, suites: Sequence[str], metric: str = "norm_acc") -> pd.DataFrame:
    """Rows: depth groups; columns: per suite the gain over the unfiltered merge with its 95 %
    interval (text, points), the seeds and the test examples per task behind it. Empty when the
    records carry no per-example outcomes."""
    ivs = gain_intervals(frame, suites=suites, metric=metric)
    rows = []
    for g in GROUPS[1:]:
        row = {"condition": f"{g} only" if g != "all" else "all layers"}
        for s in suites:
            iv = ivs.get((s, g))
            if iv is not None:
                row[f"gain [95 % interval], T={s}"] = iv.text()
                row[f"seeds, T={s}"] = iv.n_seeds
        if len(row) > 1:
            rows.append(row)
    return pd.DataFrame(rows).set_index("condition") if rows else pd.DataFrame()


def c9_verdicts(frame: pd.DataFrame, *, suites: Sequence[str], most: float = 0.5,
                metric: str = "norm_acc") -> dict[str, dict]:
    """The two halves of C9, graded on 95 % intervals of paired contrasts between the depth
    conditions' merges on the same test examples (:mod:`pactlib.book.verdicts`; points of test
    ``metric``; E, M, L, A, N: early only, middle only, late only, all layers, no filter).

    - ``"early"`` (first suite): A − N > 0 (there is a gain to share); E − most·A − (1 − most)·N > 0
      (the early layers alone keep at least ``most`` of it: E − N > most·(A − N)); E − M > 0 and
      E − L > 0 (no other single group gives more).
    - ``"whole"`` (last suite, needs two suites): A − E > 0, A − M > 0, A − L > 0 (every single
      group falls short of filtering every layer) and E − most·A − (1 − most)·N < 0 (the early
      layers alone no longer keep ``most`` of the gain).

    Returns:
        {"early": verdict, "whole": verdict} (:func:`pactlib.book.verdicts.graded`); "not yet
        tested" when the records carry no per-example outcomes, a condition's merges are missing
        or (``"whole"``) only one suite was run.

    Raises:
        ValueError: ``most`` is not a fraction with a denominator of at most 100.
    """
    from pactlib.book.intervals import NO_OUTCOMES, has_outcomes
    from pactlib.book.experiments.paired import rows, seeds_and_examples, weights
    from pactlib.book.verdicts import condition, graded

    a, b = weights(most)
    mix = ["all"] * a + ["none"] * (b - a)  # most·A + (1 − most)·N as a side of a contrast
    share = f"early only − {most:g} × all layers − {1 - most:g} × no filter"
    for s in suites:
        runs = [r for g in GROUPS for r in rows(frame, suite=s, group=g)]
        missing = [g for g in GROUPS if not rows(frame, suite=s, group=g)]
        if missing:
            why = f"T={s} has no merge for the condition(s) {missing}"
            return {"early": not_tested(why), "whole": not_tested(why)}
        if not has_outcomes(runs):
            why = f"T={s}: {NO_OUTCOMES}"
            return {"early": not_tested(why), "whole": not_tested(why)}

    s0 = suites[0]
    gain = _contrast(frame, s0, ["all"], ["none"], metric)
    early = [condition(f"T={s0}: all layers − no filter", gain),
             condition(f"T={s0}: {share}", _contrast(frame, s0, ["early"] * b, mix, metric)),
             condition(f"T={s0}: early only − middle only", _contrast(frame, s0, ["early"], ["middle"], metric)),
             condition(f"T={s0}: early only − late only", _contrast(frame, s0, ["early"], ["late"], metric))]
    unit = "normalized accuracy" if metric == "norm_acc" else "accuracy"
    out = {"early": graded(early, f"Gains in test {unit} (points), paired on the same test examples",
                           note=seeds_and_examples({f"T={s0}": gain}) + ".")}
    if len(suites) < 2:
        out["whole"] = not_tested(f"only one suite run (T={s0}); the claim compares few and many tasks")
        return out
    s1 = suites[-1]
    last = _contrast(frame, s1, ["all"], ["early"], metric)
    whole = [condition(f"T={s1}: all layers − early only", last),
             condition(f"T={s1}: all layers − middle only", _contrast(frame, s1, ["all"], ["middle"], metric)),
             condition(f"T={s1}: all layers − late only", _contrast(frame, s1, ["all"], ["late"], metric)),
             condition(f"T={s1}: {share}", _contrast(frame, s1, ["early"] * b, mix, metric), side="<")]
    out["whole"] = graded(whole, f"Gains in test {unit} (points), paired on the same test examples",
                          note=seeds_and_examples({f"T={s1}": last}) + ".")
    return out


def plot_gain_intervals(frame: pd.DataFrame, *, ax, suites: Sequence[str], metric: str = "norm_acc") -> None:
    """95 % error bars (:func:`gain_intervals`) on :func:`plot_group_gains`' bars, at the same
    places; nothing when the records carry no per-example outcomes."""
    ivs = gain_intervals(frame, suites=suites, metric=metric)
    groups = [x for x in GROUPS if x != "none"]
    width = 0.8 / max(1, len(suites))
    for j, s in enumerate(suites):
        xs = np.arange(len(groups)) + (j - (len(suites) - 1) / 2) * width
        for x, grp in zip(xs, groups):
            iv = ivs.get((s, grp))
            if iv is not None:
                ax.errorbar([x], [iv.estimate], yerr=[[iv.estimate - iv.lo], [iv.hi - iv.estimate]], fmt="none",
                            ecolor="black", elinewidth=1, capsize=3, zorder=4)


def layer_records(groups: Mapping[str, Sequence[str]], *, params: Mapping, **extra) -> list[dict]:
    """The depth groups as records: one ``depth-layer`` record per matrix layer, in network order.

    Args:
        groups: {group: keys} as from ``study.depth_groups`` (``"all"``: every key, in network
            order; the other groups partition it).
        params: the chapter's parameters (stored in each record).
        **extra: other fields of every record.

    Returns:
        Records with ``key``, ``depth`` (position in ``groups["all"]``) and ``group`` and no
        metrics; :func:`groups_from_records` reads them back.

    Raises:
        ValueError: ``groups`` lacks ``"all"``, or a key of ``"all"`` is in no other group.
    """
    if "all" not in groups:
        raise ValueError("layer_records: groups need 'all' (every key, in network order)")
    where = {k: g for g, ks in groups.items() if g != "all" for k in ks}
    missing = [k for k in groups["all"] if k not in where]
    if missing:
        raise ValueError(f"layer_records: key(s) {missing[:3]} are in no depth group")
    return [make_record("depth-layer", params=params, seed=None, key=k, depth=i, group=where[k], metrics={}, **extra)
            for i, k in enumerate(groups["all"])]


def groups_from_records(records) -> tuple[list[str], dict[str, list[str]]]:
    """The keys in network order and the depth groups, from :func:`layer_records`' records.

    Args:
        records: records or a frame (:func:`pactlib.book.records.records_frame`); rows other than
            ``depth-layer`` are ignored.

    Returns:
        ``(keys, groups)``: ``groups`` as ``study.depth_groups(keys)`` returns it (groups in the
        order of their first layer, then ``"all"``).

    Raises:
        ValueError: no ``depth-layer`` record.
    """
    f = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    f = f[f["method"] == "depth-layer"] if "method" in f else f.iloc[:0]
    if f.empty:
        raise ValueError("groups_from_records: no 'depth-layer' record")
    f = f.sort_values("depth")
    keys = [str(k) for k in f["key"]]
    groups: dict[str, list[str]] = {}
    for k, g in zip(keys, f["group"]):
        groups.setdefault(str(g), []).append(k)
    groups["all"] = keys
    return keys, groups
