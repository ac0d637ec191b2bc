"""Tables, gain plots and claim verdicts computed from result records (book chapters 5–11).

Every function reads records (or a frame of them) and returns a pandas table or a verdict dict
``{"status": one of verdicts.STATUSES, "evidence": str}`` (:mod:`pactlib.book.verdicts`); no number
is typed by hand.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from pactlib import merges
from pactlib.book.plotting import legend_outside
from pactlib.book.site import and_join
from pactlib.book.verdicts import (CONTRADICTED, FAILS, HOLDS, INCONCLUSIVE, PARTLY, REPRODUCED, grade, ladder,
                                   not_tested, verdict)

PRETTY_EXTRA = {"zero-shot": "Zero-shot (θ0)", "fine-tuned": "Individual fine-tuned"}


def pretty(method: str) -> str:
    """``pact-iso_c`` -> ``PACT-Iso-C``; ``s-pact-ties`` -> ``S-PACT-TIES``; ``pact-rsvd-iso_c`` ->
    ``PACT-RSVD-Iso-C`` (the filter with randomized SVDs)."""
    if method in PRETTY_EXTRA:
        return PRETTY_EXTRA[method]
    for prefix, label in (("s-pact-", "S-PACT-"), ("pact-rsvd-", "PACT-RSVD-"), ("pact-", "PACT-")):
        if method.startswith(prefix):
            return label + pretty(method[len(prefix):])
    try:
        return merges.get(method).pretty
    except KeyError:
        return method


def _frame(records) -> pd.DataFrame:
    from pactlib.book.records import records_frame

    return records if isinstance(records, pd.DataFrame) else records_frame(list(records))


def _cell(row, metric: str = "acc") -> str:
    m, s = 100 * row[f"{metric}_mean"], 100 * row[f"{metric}_std"]
    return f"{m:.1f} ± {s:.1f}" if row["n_seeds"] > 1 else f"{m:.1f}"


def main_table(summary: pd.DataFrame, *, suites: Sequence[str]) -> pd.DataFrame:
    """Rows: methods (paper order, PACT variant under its base; only those in ``summary``); columns:
    one per suite holding ``abs ± std (normalized)`` in percent, plus the seed count per suite."""
    present = set(summary["method"])
    order = [m for m in ("zero-shot", "fine-tuned") if m in present]
    for b in [m for m in merges.names() if m in present]:
        order += [x for x in (b, f"s-pact-{b}", f"pact-{b}") if x in present]
    rows = []
    for m in order:
        row = {"method": pretty(m)}
        for s in suites:
            sel = summary[(summary["method"] == m) & (summary["suite"] == s)]
            if len(sel):
                r = sel.iloc[0]
                row[f"{s} tasks"] = f"{_cell(r)} ({100 * r['norm_acc_mean']:.1f})"
                row[f"seeds ({s})"] = int(r["n_seeds"])
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def gains(frame, *, base_methods: Sequence[str], suites: Sequence[str], prefix: str = "pact-",
          metric: str = "norm_acc") -> pd.DataFrame:
    """One row per (base method, suite, seed): test ``metric`` of ``prefix+base`` minus base, in points."""
    f = _frame(frame)
    col = f"metrics.{metric}"
    rows = []
    for b in base_methods:
        for s in suites:
            a = f[(f["method"] == b) & (f["suite"] == s)].set_index("seed")[col]
            t = f[(f["method"] == prefix + b) & (f["suite"] == s)].set_index("seed")[col]
            for seed in a.index.intersection(t.index):
                rows.append(dict(base=b, suite=s, seed=seed, gain=100 * (t[seed] - a[seed])))
    return pd.DataFrame(rows, columns=["base", "suite", "seed", "gain"])


def plot_gains(frame, methods: Sequence[str], suites: Sequence[str], *, ax, prefix: str = "pact-",
               metric: str = "norm_acc") -> pd.DataFrame:
    """Grouped bars of the mean gain per (method, suite) with their 95 % intervals as error bars
    (when the records have per-example outcomes) and one dot per seed; returns the gains."""
    g = gains(frame, base_methods=methods, suites=suites, prefix=prefix, metric=metric)
    f = _frame(frame)
    with_iv = has_outcomes(f)
    width = 0.8 / max(1, len(suites))
    for j, s in enumerate(suites):
        xs = np.arange(len(methods)) + (j - (len(suites) - 1) / 2) * width
        means = [g[(g.base == m) & (g.suite == s)]["gain"].mean() for m in methods]
        yerr = None
        if with_iv:  # the 95 % interval of each gain (pactlib.book.intervals)
            ivs = [gain_interval(f, prefix + m, m, suite=s, metric=metric) if _rows(f, prefix + m, s) else None
                   for m in methods]
            yerr = np.array([[iv.estimate - iv.lo if iv else 0.0 for iv in ivs],
                             [iv.hi - iv.estimate if iv else 0.0 for iv in ivs]])
        ax.bar(xs, means, width=width * 0.95, label=f"{s} tasks", yerr=yerr, capsize=3 if yerr is not None else 0,
               error_kw={"elinewidth": 1})
        for x, m in zip(xs, methods):
            pts = g[(g.base == m) & (g.suite == s)]["gain"]
            ax.scatter([x] * len(pts), pts, color="black", s=8, zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(methods)), [pretty(m) for m in methods])
    ax.set_ylabel(f"gain in mean {'normalized ' if metric == 'norm_acc' else ''}accuracy (points)")
    legend_outside(ax, "right", title="suite")  # beside the bars: it hides none of them
    return g


def per_task_table(frame, *, suite: str, methods: Sequence[str]) -> pd.DataFrame:
    """Rows: methods (plain and PACT); columns: the suite's tasks (those with a ``metrics.acc:<task>``
    value in its records); test accuracy in percent, mean over seeds."""
    f = _frame(frame)
    f = f[f["suite"] == suite].dropna(axis=1, how="all")  # other suites' tasks are columns of the frame too
    task_cols = [c for c in f.columns if c.startswith("metrics.acc:")]
    rows = {}
    for m in [x for b in methods for x in (b, f"pact-{b}")]:
        sel = f[f["method"] == m]
        if len(sel):
            rows[pretty(m)] = {c.split(":", 1)[1]: 100 * sel[c].mean() for c in task_cols}
    return pd.DataFrame(rows).T.round(1)


def seed_counts(frame, *, suites: Sequence[str]) -> dict[str, int]:
    """Per suite, the number of fine-tuning seeds of its merge records (zero-shot and fine-tuned
    reference records left out)."""
    f = _frame(frame)
    f = f[~f["method"].isin(list(PRETTY_EXTRA))]
    return {s: int(f[f["suite"] == s]["seed"].nunique()) for s in suites}


def seeds_text(counts: dict[str, int]) -> str:
    """What the rows of each suite rest on: ``{"8": 3, "14": 1, "20": 1}`` -> "mean over 3 seeds at
    T=8; one seed at T=14 and T=20"; one count for all: "mean over 3 seeds" / "one seed"."""
    def what(n: int) -> str:
        return "one seed" if n == 1 else f"mean over {n} seeds"

    groups: dict[int, list[str]] = {}
    for s, n in counts.items():
        groups.setdefault(n, []).append(s)
    if len(groups) == 1:
        return what(next(iter(groups)))
    return "; ".join(f"{what(n)} at " + and_join([f"T={s}" for s in ss]) for n, ss in sorted(groups.items(), reverse=True))


def has_outcomes(frame) -> bool:
    """Whether the merge records of ``frame`` (zero-shot and fine-tuned references left out) carry
    per-example test outcomes (:func:`pactlib.book.intervals.has_outcomes`; records made before
    they were kept do not: their verdicts are graded by the sign of the mean, and say so)."""
    from pactlib.book import intervals

    f = _frame(frame)
    return intervals.has_outcomes(f[~f["method"].isin(list(PRETTY_EXTRA))])


def _rows(f: pd.DataFrame, methods, suite: str) -> list:
    methods = [methods] if isinstance(methods, str) else list(methods)
    sel = f[f["method"].isin(methods) & (f["suite"] == suite)]
    return [row for _, row in sel.iterrows()]


def gain_interval(frame, plus, minus, *, suite: str, metric: str = "norm_acc") -> "intervals.Interval":
    """The 95 % interval (points) of mean test ``metric`` of the ``plus`` method(s) minus the
    ``minus`` method(s) on ``suite``, over the seeds both have (:func:`pactlib.book.intervals.contrast`)."""
    from pactlib.book import intervals

    f = _frame(frame)
    return intervals.contrast(_rows(f, plus, suite), _rows(f, minus, suite), metric=metric)


def gain_table(frame, methods: Sequence[str], suites: Sequence[str], *, prefix: str = "pact-",
               metric: str = "norm_acc") -> pd.DataFrame:
    """Rows: base methods; columns: suites; cells: the gain of ``prefix+method`` over the method
    with its 95 % interval, ``'+0.54 [−0.71, +1.79]'`` (points), and the seeds it rests on; records
    without per-example outcomes give the mean gain over seeds, ``'+0.54 (no interval)'``."""
    from pactlib.book.intervals import fmt

    f = _frame(frame)
    with_iv = has_outcomes(f)
    rows = {}
    for m in methods:
        row = {}
        for s in suites:
            if not (_rows(f, prefix + m, s) and _rows(f, m, s)):
                continue
            if with_iv:
                iv = gain_interval(f, prefix + m, m, suite=s, metric=metric)
                row[f"T = {s}"] = iv.text() + (f" ({iv.n_seeds} seeds)" if iv.n_seeds > 1 else " (1 seed)")
            else:
                g = gains(f, base_methods=[m], suites=[s], prefix=prefix, metric=metric)["gain"]
                row[f"T = {s}"] = f"{fmt(g.mean())} (no interval)"
        rows[pretty(m)] = row
    return pd.DataFrame(rows).T


def main_verdicts(frame, *, suites: Sequence[str], c5_methods=("task_arithmetic", "tsv_m", "iso_c")) -> dict:
    """Verdicts of C5 (PACT improves TA, TSV-M, Iso-C, abs and normalized), C6 (PACT-Iso-C best in
    every suite) and C7 (mean PACT gain grows with T), graded on 95 % intervals
    (:mod:`pactlib.book.verdicts`): C5, a condition per (method, suite, metric) "PACT-M − M > 0";
    C6, per suite and every other merge X run, "PACT-Iso-C − X > 0" in absolute accuracy; C7, per
    step between consecutive suites, "mean gain at the larger T − at the smaller T > 0" (mean
    over base methods, normalized accuracy; independent test sets). Records without per-example
    outcomes get :func:`main_verdicts_by_sign`."""
    from pactlib.book import intervals
    from pactlib.book.verdicts import condition, graded

    f = _frame(frame)
    if not has_outcomes(f):
        return main_verdicts_by_sign(f, suites=suites, c5_methods=c5_methods)
    seeds = seeds_text(seed_counts(f, suites=suites))
    out = {}
    present = [m for m in c5_methods if m in set(f["method"])]
    conds = []
    for m in present:
        for s in suites:
            for metric, what in (("acc", "abs"), ("norm_acc", "norm")):
                if _rows(f, f"pact-{m}", s):
                    conds.append(condition(f"{pretty('pact-' + m)} − {pretty(m)}, T = {s}, {what}",
                                           gain_interval(f, f"pact-{m}", m, suite=s, metric=metric)))
    out["C5"] = graded(conds, f"PACT gain in test accuracy, 95 % intervals ({seeds})")
    conds = []
    for s in suites:
        sel = f[(f["suite"] == s) & ~f["method"].isin(list(PRETTY_EXTRA))]
        if "pact-iso_c" not in set(sel["method"]):
            continue
        rivals = sel[sel["method"] != "pact-iso_c"].groupby("method")["metrics.acc"].mean().sort_values(ascending=False)
        for x in rivals.index:
            conds.append(condition(f"PACT-Iso-C − {pretty(x)}, T = {s}",
                                   gain_interval(f, "pact-iso_c", x, suite=s, metric="acc")))
    out["C6"] = graded(conds, f"PACT-Iso-C against every other merge, absolute test accuracy ({seeds})") if conds \
        else not_tested("PACT-Iso-C was not run")
    bases = [m for m in merges.names() if m in set(f["method"]) and f"pact-{m}" in set(f["method"])]
    if len(suites) < 2:
        out["C7"] = not_tested(f"only one suite run ({seeds})")
    else:
        ivs = {s: gain_interval(f, [f"pact-{b}" for b in bases], bases, suite=s) for s in suites}
        conds = [condition(f"mean gain T = {b} − T = {a}", intervals.difference(ivs[b], ivs[a]))
                 for a, b in zip(suites, suites[1:])]
        txt = ", ".join(f"T = {s}: {ivs[s].text()}" for s in suites)
        out["C7"] = graded(conds, f"growth of the mean PACT gain in normalized accuracy over "
                                  f"{len(bases)} base methods ({seeds}; gains {txt})")
    return out


def main_verdicts_by_sign(frame, *, suites: Sequence[str], c5_methods=("task_arithmetic", "tsv_m", "iso_c")) -> dict:
    """The verdicts of :func:`main_verdicts` for records without per-example outcomes: counts of
    mean differences above zero (no interval), each evidence saying so."""
    f = _frame(frame)
    seeds = seeds_text(seed_counts(f, suites=suites)) + "; records without per-example outcomes: graded by sign"
    out = {}
    checks, parts = 0, []
    present = [m for m in c5_methods if m in set(f["method"])]
    for m in present:
        for s in suites:
            ga = gains(f, base_methods=[m], suites=[s], metric="acc")["gain"].mean()
            gn = gains(f, base_methods=[m], suites=[s], metric="norm_acc")["gain"].mean()
            checks += int(ga > 0 and gn > 0)
            parts.append(f"{pretty(m)} T={s}: {ga:+.2f} abs / {gn:+.2f} norm")
    n = len(present) * len(suites)
    out["C5"] = verdict(ladder(checks, n),
                        f"PACT gain > 0 in both metrics in {checks}/{n} cases (points; {seeds}): "
                        + "; ".join(parts))
    wins, parts = 0, []
    for s in suites:
        sel = f[(f["suite"] == s) & ~f["method"].isin(["zero-shot", "fine-tuned"])]
        best = sel.groupby("method")["metrics.acc"].mean().sort_values(ascending=False)
        if len(best):
            wins += int(best.index[0] == "pact-iso_c")
            parts.append(f"T={s}: best {pretty(best.index[0])} ({100 * best.iloc[0]:.1f})")
    out["C6"] = verdict(ladder(wins, len(suites)),
                        f"PACT-Iso-C best in {wins}/{len(suites)} suites ({seeds}): " + "; ".join(parts))
    bases = [m for m in merges.names() if m in set(f["method"])]
    mean_gain = [gains(f, base_methods=bases, suites=[s])["gain"].mean() for s in suites]
    txt = ", ".join(f"T={s}: {g:+.2f}" for s, g in zip(suites, mean_gain))
    if len(suites) < 2:
        out["C7"] = not_tested(f"only one suite run ({txt}; {seeds})")
    else:
        mono = all(b > a for a, b in zip(mean_gain, mean_gain[1:]))
        out["C7"] = verdict(grade(mono, mean_gain[-1] > mean_gain[0]),
                            f"mean PACT gain in normalized accuracy over all base methods (points; {seeds}): {txt}")
    return out


def reading(v: dict) -> str:
    """Two or three sentences on what a graded verdict's numbers mean, chosen by its status and
    built from its conditions (counts and names, no typed numbers); a verdict without conditions
    (not yet tested, or graded by sign) says it is not graded on intervals here and why."""
    conds = v.get("conditions") or []
    by = {g: [c["name"] for c in conds if c["grade"] == g] for g in (HOLDS, INCONCLUSIVE, FAILS)}
    n, status = len(conds), v["status"]
    if not conds:
        return ("This claim is not graded on intervals here: " + v["evidence"].rstrip(".") + ". Nothing in this run "
                "decides it either way; the chapter's tables show what was measured.")
    if status == REPRODUCED:
        return (f"Every one of the {n} comparisons lies clear of its threshold: each 95 % interval is wholly on the "
                "claimed side, so the test sampling error (and, where there are enough seeds, the spread over "
                "seeds) cannot explain the effect away. The claim holds on this testbed at these test sizes.")
    if status == CONTRADICTED:
        named = and_join(by[FAILS][:4]) + (" and others" if len(by[FAILS]) > 4 else "")
        rest = (f" {len(by[HOLDS])} hold and {len(by[INCONCLUSIVE])} are within the noise."
                if by[HOLDS] or by[INCONCLUSIVE] else "")
        return (f"{len(by[FAILS])} of the {n} comparisons lie wholly on the wrong side of their threshold ({named}): "
                "there the data go against the claim beyond the sampling error." + rest)
    tail = ("The column \"to decide\" says how much more test data or how many more seeds would settle each "
            "undecided comparison at the effect observed.")
    if status == PARTLY:
        return (f"{len(by[HOLDS])} of the {n} comparisons hold; the intervals of the other {len(by[INCONCLUSIVE])} "
                "span the threshold, so those effects cannot be told from sampling error at this test size and "
                "seed count, in either direction. " + tail)
    return ("No comparison is decided: every interval spans its threshold, so the effects measured here are "
            "within the sampling error and say neither that the claim holds nor that it fails. " + tail)


def plot_mode_gains(frame, methods: Sequence[str], *, suite: str, modes: Sequence[str], ax,
                    metric: str = "norm_acc") -> pd.DataFrame:
    """Bars: mean gain of each filter mode (``"s-pact"``, ``"pact"``) over the plain method, per
    method, on one suite; dots: seeds."""
    rows = []
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        g = gains(frame, base_methods=methods, suites=[suite], prefix=f"{mode}-", metric=metric)
        g["mode"] = mode
        rows.append(g)
        xs = np.arange(len(methods)) + (j - (len(modes) - 1) / 2) * width
        ax.bar(xs, [g[g.base == m]["gain"].mean() for m in methods], width=width * 0.95, label=mode.upper())
        for x, m in zip(xs, methods):
            pts = g[g.base == m]["gain"]
            ax.scatter([x] * len(pts), pts, color="black", s=8, zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(methods)), [pretty(m) for m in methods])
    ax.set_ylabel("gain over the plain method (points)")
    legend_outside(ax, "right")
    return pd.concat(rows, ignore_index=True)


def static_vs_dynamic_verdict(frame, *, methods: Sequence[str], suite: str) -> dict:
    """C8: S-PACT's gain (normalized accuracy) is below PACT's for each method: a condition per
    method, "PACT-M − S-PACT-M > 0" on its 95 % interval (records without per-example outcomes:
    by the sign of the means)."""
    from pactlib.book.verdicts import condition, graded

    f = _frame(frame)
    if has_outcomes(f):
        conds = [condition(f"{pretty('pact-' + m)} − {pretty('s-pact-' + m)}",
                           gain_interval(f, f"pact-{m}", f"s-pact-{m}", suite=suite)) for m in methods]
        return graded(conds, f"PACT's gain over S-PACT's in normalized test accuracy, T = {suite} "
                             f"({seeds_text(seed_counts(f, suites=[suite]))})")
    ok, parts = 0, []
    for m in methods:
        gs = gains(f, base_methods=[m], suites=[suite], prefix="s-pact-")["gain"].mean()
        gp = gains(f, base_methods=[m], suites=[suite], prefix="pact-")["gain"].mean()
        ok += int(gs < gp)
        parts.append(f"{pretty(m)}: S-PACT {gs:+.2f} vs PACT {gp:+.2f}")
    n_seeds = f["seed"].nunique()
    return verdict(ladder(ok, len(methods)),
                   f"S-PACT gains less than PACT for {ok}/{len(methods)} methods (points of mean "
                   f"normalized test accuracy, mean over {n_seeds} seed(s)): " + "; ".join(parts))


def alpha_table(frame) -> pd.DataFrame:
    """Chosen α per method (rows) and seed (columns); ``*`` marks a choice on the grid's edge."""
    f = _frame(frame)
    f = f[f["method"].isin([m for m in f["method"].unique() if m not in PRETTY_EXTRA])]
    out = {}
    for _, r in f.iterrows():
        out.setdefault(pretty(r["method"]), {})[f"seed {r['seed']}"] = f"{r['alpha']:.3g}" + ("*" if r.get("on_edge") else "")
    return pd.DataFrame(out).T


def alpha_search_gaps(frame, *, reference: str = "full") -> pd.DataFrame:
    """Each α search against the ``reference`` search on the same merge (suite, method), from
    ``bench/bench_alpha_search.py`` records (one per merge × ``search``).

    Returns:
        One row per record: ``search``, ``suite``, ``method``, ``n_evals``, ``alpha`` and the
        reference's ``alpha_ref`` (when the records carry ``alpha``), and the differences ``Δ val``
        and ``Δ test`` in validation / test normalized accuracy (points).

    Raises:
        ValueError: no record of the ``reference`` search, or a merge without one.
    """
    f = _frame(frame).copy()
    f["val"], f["test"] = 100 * f["metrics.val_norm_acc"], 100 * f["metrics.norm_acc"]
    ref = f[f["search"] == reference].set_index(["suite", "method"])
    if ref.empty:
        raise ValueError(f"no records of the reference search {reference!r}")
    parts = []
    for search, g in f.groupby("search", sort=False):
        g = g.set_index(["suite", "method"])
        missing = g.index.difference(ref.index)
        if len(missing):
            raise ValueError(f"search {search!r}: merges without a {reference!r} record: {list(missing)}")
        r = ref.loc[g.index]
        out = g[["search", "n_evals"] + (["alpha"] if "alpha" in g else [])].copy()
        if "alpha" in g:
            out["alpha_ref"] = r["alpha"].to_numpy()
        out["Δ val"], out["Δ test"] = (g["val"] - r["val"]).to_numpy(), (g["test"] - r["test"]).to_numpy()
        parts.append(out.reset_index())
    return pd.concat(parts, ignore_index=True)


def alpha_search_table(frame, *, reference: str = "full") -> pd.DataFrame:
    """Compare α searches (``bench/bench_alpha_search.py`` records, one per merge × ``search``).

    Rows: the searches. Columns: merges compared, mean validation evaluations per merge, and
    against the ``reference`` search on the same merge (suite, method; :func:`alpha_search_gaps`):
    the mean and the worst difference in validation normalized accuracy, and the mean and mean
    absolute difference in test normalized accuracy (points).

    Raises:
        ValueError: as :func:`alpha_search_gaps`.
    """
    rows = {search: {"merges": len(g), "evaluations": g["n_evals"].mean(), "Δ val (mean)": g["Δ val"].mean(),
                     "Δ val (worst)": g["Δ val"].min(), "Δ test (mean)": g["Δ test"].mean(),
                     "|Δ test| (mean)": g["Δ test"].abs().mean()}
            for search, g in alpha_search_gaps(frame, reference=reference).groupby("search", sort=False)}
    return pd.DataFrame(rows).T.rename_axis("search")


def _sweep_rows(frame, knob: str) -> pd.DataFrame:
    f = _frame(frame)
    base = f[f["method"] == f[f["knob"] == knob]["base"].iloc[0]] if "knob" in f and (f["knob"] == knob).any() else None
    sel = f[f.get("knob") == knob] if "knob" in f else f.iloc[0:0]
    rows = []
    for (value, seed), g in sel.groupby(["value", "seed"]):
        b = base[base["seed"] == seed].iloc[0] if base is not None and len(base[base["seed"] == seed]) else None
        r = g.iloc[0]
        rows.append(dict(value=value, seed=seed,
                         val=100 * (r["metrics.val_norm_acc"] - (b["metrics.val_norm_acc"] if b is not None else 0)),
                         test=100 * (r["metrics.norm_acc"] - (b["metrics.norm_acc"] if b is not None else 0)),
                         val_abs=100 * r["metrics.val_norm_acc"], test_abs=100 * r["metrics.norm_acc"],
                         cap=r.get("cap_binding_rate")))
    return pd.DataFrame(rows)


def sweep_interval(frame, knob: str, value, *, against=None, metric: str = "norm_acc") -> "intervals.Interval":
    """The 95 % interval of a sensitivity sweep's test gain (points of mean test ``metric``): the
    merges at ``knob`` = ``value`` against the plain base method's merges (``against`` None) or
    against the same sweep at ``knob`` = ``against`` (e.g. the default), same testbed and seed
    (:func:`pactlib.book.intervals.contrast`).

    Raises:
        ValueError: no records of the knob, or as ``contrast``.
    """
    from pactlib.book import intervals

    f = _frame(frame)
    sel = f[f["knob"] == knob] if "knob" in f else f.iloc[0:0]
    if sel.empty:
        raise ValueError(f"sweep_interval: no records of knob {knob!r}")
    plus = sel[sel["value"] == value]
    if against is None:
        minus = f[(f["method"] == sel["base"].iloc[0]) & f["knob"].isna()]
    else:
        minus = sel[sel["value"] == against]
    return intervals.contrast([r for _, r in plus.iterrows()], [r for _, r in minus.iterrows()], metric=metric)


def plot_sensitivity(frame, knobs: Sequence[str], *, defaults, fig, ax) -> None:
    """One panel per knob: PACT gain over the plain method on validation (solid) and test (dotted),
    the test gain with its 95 % interval as an error bar when the records hold per-example
    outcomes (:func:`sweep_interval`; validation has no interval: its outcomes are not kept)."""
    ax.remove()
    axes = fig.subplots(1, len(knobs), sharey=True)
    axes = np.atleast_1d(axes)
    with_iv = has_outcomes(frame)
    for a, knob in zip(axes, knobs):
        d = _sweep_rows(frame, knob).groupby("value")[["val", "test"]].mean().reset_index()
        a.plot(d["value"], d["val"], marker="o", label="validation")
        if with_iv and len(d):
            ivs = [sweep_interval(frame, knob, v) for v in d["value"]]
            a.errorbar(d["value"], d["test"], yerr=np.array([[iv.estimate - iv.lo for iv in ivs],
                                                              [iv.hi - iv.estimate for iv in ivs]]),
                       marker="s", ls=":", capsize=3, label="test (95 % interval)")
        else:
            a.plot(d["value"], d["test"], marker="s", ls=":", label="test")
        a.axvline(getattr(defaults, knob), color="grey", ls="--", lw=0.8)
        a.axhline(0, color="grey", lw=0.6)
        a.set_xlabel(knob)
    axes[0].set_ylabel("gain over plain (points)")
    axes[0].legend()


#: The column of :func:`sensitivity_table` with the test gain of the best value over the default.
SENS_GAIN = "test, best − default [95 %]"


def sensitivity_table(frame, knobs: Sequence[str], *, defaults) -> pd.DataFrame:
    """Per knob: default, best value on validation, and both values' validation/test scores.

    Ties go to the default: another value is "best on validation" only when its validation score
    is strictly higher than the default's (when the sweep has the default). When the records hold
    per-example test outcomes, the column :data:`SENS_GAIN` gives the best value's test gain over
    the default with its 95 % interval (points; :func:`sweep_interval`; empty where the best is
    the default or the default was not swept)."""
    with_iv = has_outcomes(frame)
    rows = []
    for knob in knobs:
        d = _sweep_rows(frame, knob).groupby("value")[["val_abs", "test_abs", "cap"]].mean()
        if not len(d):
            continue
        best = d["val_abs"].idxmax()
        dv = getattr(defaults, knob)
        if dv in d.index and d.loc[dv, "val_abs"] >= d.loc[best, "val_abs"]:
            best = dv
        row = {"knob": knob, "default": dv, "best on validation": best,
               "val (default)": round(d.loc[dv, "val_abs"], 2) if dv in d.index else None,
               "val (best)": round(d.loc[best, "val_abs"], 2),
               "test (default)": round(d.loc[dv, "test_abs"], 2) if dv in d.index else None,
               "test (best)": round(d.loc[best, "test_abs"], 2),
               "cap binds (best)": None if pd.isna(d.loc[best, "cap"]) else round(float(d.loc[best, "cap"]), 3)}
        if with_iv:
            row[SENS_GAIN] = (sweep_interval(frame, knob, best, against=dv).text()
                              if best != dv and dv in d.index else None)
        rows.append(row)
    return pd.DataFrame(rows).set_index("knob")


def moved_knobs_text(sens: pd.DataFrame) -> str:
    """One sentence from :func:`sensitivity_table`: the knobs whose best value on validation is
    not the default, each with its validation and test gain over the default (points; the test
    gain with its 95 % interval when the table has :data:`SENS_GAIN`); "n/a (the default was not
    swept)" where the sweep left the default out (its scores are missing)."""

    def gain(best, default) -> str:
        return "n/a (the default was not swept)" if pd.isna(default) else f"{best - default:+.2f}"

    def test(r) -> str:
        iv = r.get(SENS_GAIN)
        return iv if isinstance(iv, str) else gain(r["test (best)"], r["test (default)"])

    moved = sens[sens["best on validation"] != sens["default"]]
    return "knobs whose best value on validation is not the default: " + ("; ".join(
        f"{knob} = {r['best on validation']:g}: validation {gain(r['val (best)'], r['val (default)'])}, "
        f"test {test(r)} points" for knob, r in moved.iterrows()) or "none")


def earlier_round_text(sens: pd.DataFrame, earlier, *, defaults) -> str:
    """One sentence: for each knob whose best value on validation in :func:`sensitivity_table`
    ``sens`` is not the default, what the ``earlier`` sweep's records gave for that value on
    validation against that sweep's default (``defaults``, a ``PactOptions``), in points of mean
    normalized accuracy; "not swept then" where the earlier sweep left the value or the knob out."""
    parts = []
    for knob, r in sens[sens["best on validation"] != sens["default"]].iterrows():
        rows = _sweep_rows(earlier, knob)
        d = rows.groupby("value")["val_abs"].mean() if len(rows) else pd.Series(dtype=float)
        v, dv = r["best on validation"], getattr(defaults, knob)
        parts.append(f"{knob} = {v:g}: {d[v] - d[dv]:+.2f} points against {dv:g}" if v in d.index and dv in d.index
                     else f"{knob} = {v:g}: not swept then")
    return ("the values the sweep above prefers, as the first round scored them on validation: "
            + ("; ".join(parts) or "none (the sweep above prefers every default)"))


def _null_space_pairs(frame) -> pd.DataFrame:
    """One row per merge (kind, suite, method, seed) with val / test (points) per convention."""
    f = _frame(frame).copy()
    if "convention" not in f or not {"drop", "literal"} <= set(f["convention"]):
        raise ValueError("null-space records need both conventions 'drop' and 'literal' "
                         "(bench/bench_null_space.py)")
    f["kind"] = f["kind"] if "kind" in f else "full"
    f["val"], f["test"] = 100 * f["metrics.val_norm_acc"], 100 * f["metrics.norm_acc"]
    wide = f.pivot_table(index=["kind", "suite", "method", "seed"], columns="convention", values=["val", "test"],
                         aggfunc="first")
    wide.columns = [f"{metric} {conv}" for metric, conv in wide.columns]
    return wide.dropna(subset=["val drop", "val literal"]).reset_index()


def null_space_table(frame) -> pd.DataFrame:
    """The two rank-deficiency conventions of TSV-M / Iso-C / Iso-CTS (``null_space``) on the same
    merges, from ``bench/bench_null_space.py`` records (one per merge × ``convention``).

    Rows: (kind, suite, merge). Columns: seeds; mean validation and test normalized accuracy (%)
    of ``drop`` and ``literal``; their mean differences ``Δ val`` and ``Δ test`` (drop − literal,
    points); ``order effect``: the mean |test difference| between ``literal`` on the task order
    and on the reversed order (points; NaN where not run), which ``drop`` does not have.

    Raises:
        ValueError: records without both conventions.
    """
    w = _null_space_pairs(frame)
    w["Δ val"], w["Δ test"] = w["val drop"] - w["val literal"], w["test drop"] - w["test literal"]
    if "test literal-reversed" in w:
        w["order effect"] = (w["test literal-reversed"] - w["test literal"]).abs()
    else:
        w["order effect"] = np.nan
    g = w.groupby(["kind", "suite", "method"], sort=False)
    out = g[["val drop", "val literal", "Δ val", "test drop", "test literal", "Δ test", "order effect"]].mean()
    out.insert(0, "seeds", g["seed"].nunique())
    return out


def null_space_choice(frame) -> dict:
    """Which convention validation prefers over every merge of the records.

    Returns:
        ``merges`` (merge × seed pairs), ``drop_better`` / ``literal_better`` / ``equal`` (counts
        on validation), ``mean_delta_val`` and ``mean_delta_test`` (drop − literal, points) and
        ``choice``: ``"drop"`` when the mean validation difference is >= 0, else ``"literal"``.
    """
    w = _null_space_pairs(frame)
    dv, dt = w["val drop"] - w["val literal"], w["test drop"] - w["test literal"]
    return {"merges": len(w), "drop_better": int((dv > 0).sum()), "literal_better": int((dv < 0).sum()),
            "equal": int((dv == 0).sum()), "mean_delta_val": float(dv.mean()), "mean_delta_test": float(dt.mean()),
            "choice": "drop" if dv.mean() >= 0 else "literal"}


#: Recipe fields where None means "no cap": every example (train_limit, eval_limit) or every
#: train image per class (head_shots) is used (the zoo's ``Recipe`` docstrings).
UNCAPPED_FIELDS = ("head_shots", "train_limit", "eval_limit")


def recipe_view(frame: pd.DataFrame, fields: Sequence[str] = UNCAPPED_FIELDS) -> pd.DataFrame:
    """A recipe table (rows: fields) to show: ``None`` in the ``fields`` rows, which means no cap,
    written "all"; the other rows as they are (their ``None`` is the table's missing value). The
    frame itself is not modified."""
    out = frame.copy()
    rows = out.index.isin(list(fields))
    def uncapped(v) -> bool:  # None, as stored (the string "None") or read back (None / NaN)
        return v == "None" if isinstance(v, str) else bool(pd.isna(v))

    out.loc[rows] = out.loc[rows].map(lambda v: "all" if uncapped(v) else v)
    return out


def c4_closeness(frame, *, margin: float = 0.02, controls: Sequence[str] = ("random", "complement")) -> dict:
    """What chapter 4's C4 verdict rests on, beyond its graded conditions
    (``experiments.subspace.c4_verdict``, same ``margin`` and ``controls``): the energy-matched
    control (``energy``), which removes as much weight energy as V_t,LBW and is not graded, as a
    paired contrast per ablation strength γ.

    Returns:
        ``strengths``: per γ a dict with ``lbw`` and ``energy`` (mean drops from θt, points;
        ``energy`` None when that control was not run) and ``excess`` (the
        :class:`~pactlib.book.intervals.Interval` of drop(V_LBW) − drop(energy-matched), None
        when not run); ``text``: one Markdown paragraph, chosen by where each interval lies
        against ``margin`` (the words hold whatever the numbers), or the note that the records
        carry no per-example outcomes; ``graded``: the γ C4 is graded at.
    """
    from pactlib.book.experiments import subspace
    from pactlib.book.intervals import NO_OUTCOMES
    from pactlib.book.experiments.paired import MissingOutcomes

    f = _frame(frame)
    try:
        c = subspace.contrasts(f)
    except MissingOutcomes:
        return {"strengths": {}, "graded": None,
                "text": f"**Against the energy-matched control.** Not compared: {NO_OUTCOMES}."}
    gamma0 = subspace.graded_strength(f)
    per, parts = {}, []
    for gamma, g in c.groupby("strength", sort=True):
        g = g.set_index("condition")
        has = "energy" in g.index
        x = g.loc["energy", "excess_iv"] if has else None
        per[float(gamma)] = {"lbw": float(g.loc["lbw", "drop"]), "energy": float(g.loc["energy", "drop"]) if has else None,
                             "excess": x}
        if x is not None:
            where = ("more than the margin above it" if x.lo > 100 * margin else
                     "below the margin: the LBW hurts no more than removing as much energy at random"
                     if x.hi <= 100 * margin else "across the margin: undecided")
            parts.append(f"at γ = {gamma:g}{' (graded)' if np.isclose(gamma, gamma0) else ''}, drop(V_LBW) − "
                         f"drop(energy-matched) is {x.text(1)} points, {where}")
    if not parts:
        text = ("**Against the energy-matched control.** Not run: the verdict compares the LBW with controls of "
                "the same dimension only.")
    else:
        text = ("**Against the energy-matched control.** It removes as much of the weights' energy as V_t,LBW and "
                f"does not count toward the status (margin {100 * margin:g} points): " + "; ".join(parts) + ".")
    return {"strengths": per, "graded": gamma0, "text": text}


def c9a_closeness(v: dict) -> dict:
    """How close a graded verdict (chapter 7's C9a, from ``experiments.depth.c9_verdicts``) is to
    flipping: for each condition, how far its 95 % interval lies from the threshold.

    Returns:
        ``margins``: per condition ``{"name", "grade", "margin"}``, ``margin`` the gap in the
        condition's unit between the threshold and the interval's nearer end (positive: the
        interval clears it on the side the grade says; 0 for an inconclusive one); and ``text``,
        one Markdown sentence: the decided conditions with their gaps, the inconclusive ones with
        what would decide them. Empty text for a verdict without conditions.
    """
    from pactlib.book.intervals import fmt

    margins, parts = [], []
    for c in v.get("conditions") or []:
        thr, lo, hi = c["threshold"], c["lo"], c["hi"]
        below = (c["side"] == ">") == (c["grade"] == FAILS)  # the interval lies below the threshold
        gap = 0.0 if c["grade"] == INCONCLUSIVE else (thr - hi if below else lo - thr)
        margins.append({"name": c["name"], "grade": c["grade"], "margin": float(gap)})
        unit = f" {c['unit']}" if c.get("unit") else ""
        if c["grade"] == INCONCLUSIVE:
            parts.append(f"\"{c['name']}\" spans {c['threshold']:g} ({c.get('needs') or 'undecided'})")
        else:
            side = "below" if below else "above"
            parts.append(f"\"{c['name']}\" {c['grade']}, its interval {fmt(gap).lstrip('+')}{unit} {side} "
                         f"{c['threshold']:g}")
    text = ("**How close to flipping.** " + "; ".join(parts) + ". A gap near 0 means a little more noise, or a "
            "little more data, could change the grade.") if parts else ""
    return {"margins": margins, "text": text}


def contrast_table(pairs: dict, *, digits: int = 2) -> pd.DataFrame:
    """One row per contrast ``{label: Interval}``: the estimate with its 95 % interval (points, as
    text), the half-width, the seeds and the test examples per task behind it."""
    from pactlib.book.intervals import fmt

    rows = [{"contrast": label, "effect [95 % interval]": iv.text(digits),
             "±": fmt(iv.half_width, digits).lstrip("+"), "seeds": iv.n_seeds,
             "test examples per task": iv.n_examples} for label, iv in pairs.items()]
    return pd.DataFrame(rows, columns=["contrast", "effect [95 % interval]", "±", "seeds",
                                       "test examples per task"]).set_index("contrast")


def _seeds(seeds) -> str:
    seeds = [str(s) for s in seeds]
    return ("seed " if len(seeds) == 1 else "seeds ") + and_join(seeds)


def alpha_search_text(frame) -> str:
    """What the α searches of a chapter's merge records did, in one Markdown paragraph: the grid
    they started on (``alphas`` minus ``widened`` and ``refined``), each merge whose search
    widened it (grid's new ends, seeds, the α chosen there; a choice inside the widened grid is
    not on its edge, so :func:`alpha_table` gives it no ``*``), and the α each method chose,
    mean over seeds (plain, then with PACT when run).

    Raises:
        ValueError: no merge record with ``alphas``.
    """
    f = _frame(frame)
    f = f[~f["method"].isin(list(PRETTY_EXTRA)) & f["alpha"].notna()] if "alphas" in f else f.iloc[0:0]
    if f.empty:
        raise ValueError("alpha_search_text: no merge record with an α grid (alphas)")

    def start(r) -> tuple:
        extra = set(r.get("widened") or []) | set(r.get("refined") or [])
        return tuple(a for a in r["alphas"] if a not in extra)

    grids: dict[tuple, list[str]] = {}
    for _, r in f.iterrows():
        names = grids.setdefault(start(r), [])
        if pretty(r["method"]) not in names:
            names.append(pretty(r["method"]))
    if len(grids) == 1:
        g = next(iter(grids))
        text = f"Every search started on the same grid of {len(g)} values from {g[0]:g} to {g[-1]:g}."
    else:
        text = f"The searches started on {len(grids)} grids: " + "; ".join(
            f"{len(g)} values from {g[0]:g} to {g[-1]:g} ({and_join(names)})" for g, names in grids.items()) + "."
    wide = f[f["widened"].map(lambda w: bool(w) if isinstance(w, list) else False)] if "widened" in f else f.iloc[0:0]
    if wide.empty:
        text += " No search widened it."
    else:
        parts = []
        for m, g in wide.groupby("method", sort=False):
            added = and_join([f"{a:.3g}" for a in sorted({a for w in g["widened"] for a in w})])
            chosen = (f"{g['alpha'].iloc[0]:.3g}" + ("" if len(g) == 1 else " on both" if len(g) == 2 else " on each")
                      if g["alpha"].nunique() == 1 else and_join([f"{a:.3g}" for a in g["alpha"]]))
            parts.append(f" {pretty(m)} ({_seeds(g['seed'])}): the best α lay on the grid's edge, so the search added "
                         f"α = {added}; it then chose α = {chosen}, inside the widened grid (the α table marks no *).")
        text += "".join(parts)
    means = f.groupby("method", sort=False)["alpha"].mean()
    bases = [m for m in merges.names() if m in means.index]
    text += " Chosen α, mean over seeds: " + ", ".join(
        f"{pretty(b)} {means[b]:.2f}" + (f" (PACT {means['pact-' + b]:.2f})" if f"pact-{b}" in means.index else "")
        for b in bases) + "."
    return text


def suite_columns(frame: pd.DataFrame, level: str = "suite") -> pd.DataFrame:
    """``frame`` (not modified) with its column level ``level`` (task-suite sizes, e.g. 8 and 20)
    written as "T = 8", "T = 20" and left unnamed, so the table's header row of suites says what
    its labels are and its corner is free for the row labels' name (:func:`plotting.table_style`).
    A frame without that column level is returned as it is."""
    if level not in (frame.columns.names or []):
        return frame
    out = frame.copy()
    i = out.columns.names.index(level)
    out.columns = out.columns.set_levels([f"T = {v}" for v in out.columns.levels[i]], level=i).set_names(None, level=i)
    return out
