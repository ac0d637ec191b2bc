"""Exact vs randomized SVD inside PACT (book chapter 8: P7; claim C10).

- :func:`time_filter`: wall time of ``pact_filter``, fastest of a few runs (subspaces and shields kept);
- :func:`randomized_share`: on how many (layer, task) SVDs the randomized method actually runs
  (it falls back to the exact SVD when r + oversample ≥ min(m, n));
- :func:`gap_records`, :func:`gap_correlation`: how separated each layer's core is, and how
  that predicts the randomized subspaces' error;
- :func:`subspace_distances`, :func:`basis_records`: projector distance between the exact and randomized LBW bases, per
  (layer, task);
- :func:`change_records`: relative change of the filtered task vectors, per task;
- :func:`accuracy_records`: merged test accuracy of the plain method and of PACT with each SVD;
- :func:`summary_table`, :func:`accuracy_table`, :func:`plot_times`: what the chapter shows;
- :func:`read_bench`, :func:`bench_table`, :func:`bench_sweep_table`: the synthetic
  ViT-B/32-shaped benchmark's JSON (``bench/bench_filter.py``);
- :func:`floor_table`, :func:`plot_floor`, :func:`memory_table`: PACT-Iso-C's time against its
  least possible (``bench/bench_pact_floor.py``) and the streamed merge's memory
  (``bench/bench_merge_scale.py``);
- :func:`plot_distances`, :func:`accuracy_contrasts`, :func:`c10_verdict` (graded on 95 % intervals).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.pact import PactOptions, PactReport, pact_filter
from pactlib.book.records import make_record, read_json_object
from pactlib.subspaces import choose_rank
from pactlib.taskvector import TaskVector
from pactlib.testbeds import run

__all__ = ["time_filter", "randomized_share", "subspace_distances", "gap_records", "gap_correlation",
           "basis_records", "change_records", "accuracy_records", "summary_table", "accuracy_table", "plot_times", "read_bench", "bench_table", "bench_sweep_table", "plot_floor", "plot_distances",
           "accuracy_check", "accuracy_contrasts", "c10_verdict"]


def time_filter(pretrained: Mapping[str, Tensor], task_vectors: Sequence[TaskVector], options: PactOptions, *,
                repeats: int = 1, rule: MatrixRule = DEFAULT_RULE, tb=None) -> tuple[float, list[TaskVector], PactReport]:
    """Run the PACT filter ``repeats`` times; return (fastest seconds, filtered task vectors, report).

    The fastest run is reported: other processes and first-call set-up can only slow a run down.
    The filter keeps its subspaces and shields (``keep=True``) so that they can be compared;
    keeping them costs memory, not time.

    With ``tb``, a testbed whose task vectors are read from files (``merge_sources``, e.g.
    ``clip``; ``task_vectors`` are then its own), the filter runs layer by layer with the filtered
    layers written to a fresh folder under ``tb.cache_dir`` each time
    (:func:`pactlib.testbeds.lazy_vectors.filtered_task_vectors`, the same values as
    ``pact_filter``; the time includes writing them) and lazy task vectors are returned: memory
    does not grow with T. Other testbeds (and ``tb=None``) time ``pact_filter`` in memory.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"time_filter: repeats must be >= 1, got {repeats}")
    from pactlib.testbeds.base import merge_sources

    sources = merge_sources(tb) if tb is not None else None
    if sources is not None:
        import shutil
        import tempfile
        import weakref
        from pathlib import Path

        from pactlib.testbeds.lazy_vectors import _cache_folder, filtered_task_vectors

        root = _cache_folder(tb)
        root.mkdir(parents=True, exist_ok=True)
        times, out, folder = [], None, None
        for _ in range(repeats):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            folder = Path(tempfile.mkdtemp(prefix=".timed-", dir=root))
            t0 = time.perf_counter()
            out = filtered_task_vectors(tb, "pact", options, keep=True, raw=list(task_vectors), sources=sources,
                                        folder=folder)
            times.append(time.perf_counter() - t0)
        weakref.finalize(tb, shutil.rmtree, str(folder), True)
        return min(times), out[0], out[1]
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = pact_filter(pretrained, task_vectors, options=options, rule=rule, keep=True)
        times.append(time.perf_counter() - t0)
    return min(times), out[0], out[1]


def randomized_share(pretrained: Mapping[str, Tensor], task_vectors: Sequence[TaskVector], options: PactOptions, *,
                     rule: MatrixRule = DEFAULT_RULE) -> float:
    """Share of the top-r SVDs of one filter run (cores and active subspaces) where
    ``options.svd == "rsvd"`` really uses the randomized range finder, i.e. r + p < min(m, n)
    with p = ``oversample`` for the core and ``active_oversample`` for the task updates (``linalg.top_singular`` falls back to the exact SVD otherwise). 0 for ``"exact"``."""
    if options.svd != "rsvd":
        return 0.0
    used = total = 0
    for key in rule.matrix_keys(pretrained):
        if not options.selects(key):
            continue
        W0 = rule.view(key, pretrained[key])
        d = min(W0.shape)
        core = choose_rank(W0, frac=options.core_frac, energy=options.core_energy)
        active = [choose_rank(rule.view(key, tv[key]), frac=options.active_frac, energy=options.active_energy)
                  for tv in task_vectors]
        # the core's SVD uses oversample, the task updates' active_oversample (PactOptions)
        pairs = [(core, options.oversample)] + [(r, options.active_oversample) for r in active]
        used += sum(r + p < d for r, p in pairs if r > 0)
        total += sum(r > 0 for r, _ in pairs)
    return used / total if total else 0.0


def subspace_distances(V1: Tensor, V2: Tensor) -> tuple[float, float]:
    """(‖V1V1ᵀ − V2V2ᵀ‖_F, sine of the largest principal angle) for orthonormal bases V1 (n, a), V2 (n, b).

    Computed in float64 from the residuals R12 = V2 − V1(V1ᵀV2) and R21 = V1 − V2(V2ᵀV1):
    ‖P1 − P2‖²_F = ‖R12‖²_F + ‖R21‖²_F (= a + b − 2‖V1ᵀV2‖²_F) and, when a = b, sin θ_max =
    ‖R12‖_2. The textbook form a + b − 2‖V1ᵀV2‖²_F subtracts nearly equal numbers and cannot see
    distances below about √ε (3e-4 for float32 bases, as in ``linalg.projector_distance``); the
    residuals can. Distances here are meaningful down to about 1e-6. The spectral value is 1.0 when
    a ≠ b (and both are non-empty), as in ``linalg.projector_distance``.

    Raises:
        ValueError: bases of different n.
    """
    if V1.shape[0] != V2.shape[0]:
        raise ValueError(f"bases live in different spaces: {tuple(V1.shape)} vs {tuple(V2.shape)}")
    A, B = V1.double(), V2.double()
    R12, R21 = B - A @ (A.mT @ B), A - B @ (B.mT @ A)  # (n, b), (n, a)
    fro = math.sqrt(float(R12.pow(2).sum() + R21.pow(2).sum()))
    if A.shape[1] != B.shape[1]:
        return fro, 1.0 if A.shape[1] and B.shape[1] else 0.0
    return fro, float(torch.linalg.matrix_norm(R12, ord=2)) if B.shape[1] else 0.0


def gap_records(pretrained: Mapping[str, Tensor], options: PactOptions, *, keys: Sequence[str], params: Mapping,
                seed: int | None = None, rule: MatrixRule = DEFAULT_RULE, **extra) -> list[dict]:
    """Per layer: how well separated the pre-trained core is for a range finder with oversampling
    p = ``options.oversample``: ``gap`` = σ_{K+p+1} / σ_K of W0 (singular values in descending
    order, K = core rank; 0 when K + p ≥ rank). The range finder's error bound shrinks like
    gap^(2q+1) with q power iterations (Halko et al. 2011, §10): a gap near 1 means a slowly decaying spectrum where few
    power iterations cannot resolve the top-K subspace (a rough guide: the bound has further factors).
    Records ``core-gap`` with ``depth`` and ``key``."""
    out = []
    for depth, key in enumerate(keys):
        W0 = rule.view(key, pretrained[key]).float()  # (m, n)
        s = torch.linalg.svdvals(W0)  # descending
        K = choose_rank(W0, frac=options.core_frac, energy=options.core_energy)
        j = K + options.oversample  # 0-based index of σ_{K+p+1}
        gap = float(s[j] / s[K - 1]) if K and j < len(s) else 0.0
        out.append(make_record("core-gap", params=params, seed=seed, key=key, depth=depth,
                               metrics={"gap": gap, "K": K}, **extra))
    return out


def gap_correlation(frame: pd.DataFrame, n_iter: int) -> float:
    """Spearman rank correlation over layers between the core gap^(2q+1) and the mean LBW distance
    of the RSVD with ``n_iter`` = q (NaN when either kind of record is missing)."""
    if "metrics.gap" not in frame or "metrics.dist" not in frame:
        return math.nan
    gaps = frame[frame["method"] == "core-gap"].groupby("depth")["metrics.gap"].mean()
    d = frame[(frame["method"] == "lbw-distance") & (frame["n_iter"] == n_iter)].groupby("depth")["metrics.dist"].mean()
    both = pd.concat([gaps ** (2 * n_iter + 1), d], axis=1, join="inner").dropna()
    if len(both) < 3:
        return math.nan
    return float(both.rank().corr().iloc[0, 1])


def basis_records(exact: PactReport, other: PactReport, *, params: Mapping, seed: int, keys: Sequence[str],
                  tasks: Sequence[str], **extra) -> list[dict]:
    """Per (layer, task): how far the LBW basis of ``other`` (randomized) is from the exact one.

    Metrics (from :func:`subspace_distances`): ``dist`` = Frobenius projector distance divided by
    sqrt(max(r_exact, 1)) (0 = same subspace, √2 = orthogonal; comparable across layers),
    ``dist_spectral`` (sine of the largest principal angle, 1.0 when the ranks differ),
    ``rank_exact``, ``rank_other``. Both reports must come from ``pact_filter(..., keep=True)``.

    Raises:
        KeyError: a layer without kept subspaces in either report.
    """
    out = []
    for depth, key in enumerate(keys):
        if key not in exact.subspaces or key not in other.subspaces:
            raise KeyError(f"basis_records: no kept subspaces for layer {key!r} (run pact_filter with keep=True)")
        for t, task in enumerate(tasks):
            a, b = exact.subspaces[key].lbw[t].basis, other.subspaces[key].lbw[t].basis
            fro, spectral = subspace_distances(a, b)
            out.append(make_record("lbw-distance", params=params, seed=seed, key=key, depth=depth, task=task, metrics=dict(
                dist=fro / math.sqrt(max(a.shape[1], 1)), dist_spectral=spectral, rank_exact=a.shape[1],
                rank_other=b.shape[1]), **extra))
    return out


def change_records(exact: Sequence[TaskVector], other: Sequence[TaskVector], *, keys: Sequence[str], params: Mapping,
                   seed: int, **extra) -> list[dict]:
    """Per task: ‖Δ̃_exact − Δ̃_other‖_F / ‖Δ̃_exact‖_F over the layers ``keys`` (``rel_change``).

    Raises:
        ValueError: different task counts.
    """
    if len(exact) != len(other):
        raise ValueError(f"change_records: {len(exact)} vs {len(other)} task vectors")
    out = []
    for a, b in zip(exact, other):
        num = sum(float((a[k] - b[k]).pow(2).sum()) for k in keys)
        den = sum(float(a[k].pow(2).sum()) for k in keys)
        out.append(make_record("filtered-change", params=params, seed=seed, task=a.name,
                               metrics={"rel_change": math.sqrt(num / den) if den > 0 else float("nan")}, **extra))
    return out


def accuracy_records(tb, method: str, variants: Mapping[str, Sequence[TaskVector] | None], *,
                     alphas: Sequence[float], **extra) -> list[dict]:
    """Merge, choose α on validation and test once per variant: {label: task vectors} (None = the
    testbed's raw task vectors, i.e. the plain method). Each record (from :func:`pactlib.testbeds.run`) gets
    ``n_test`` (test examples over all tasks, for :func:`accuracy_check`) and ``extra``."""
    n_test = sum(len(tb.inputs(t, "test")[1]) for t in tb.tasks)
    return [{**run(tb, method, alphas=alphas, task_vectors=tvs, label=label), "n_test": n_test, **extra}
            for label, tvs in variants.items()]


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per SVD variant (exact, RSVD q = …): filter time (s, mean over seeds), speed-up over
    the exact filter, share of SVDs that are really randomized, LBW basis distance (mean, max) and
    relative change of the filtered task vectors (mean, max)."""
    t = frame[frame["method"] == "filter-time"]
    g = t.groupby(t["n_iter"].fillna(-1).astype(int), sort=False)
    out = pd.DataFrame({"filter time (s)": g["metrics.seconds"].mean()})
    if "metrics.speedup" in t:
        out["speed-up"] = g["metrics.speedup"].mean()
    if "metrics.rsvd_share" in t:
        out["randomized SVDs (%)"] = 100 * g["metrics.rsvd_share"].mean()
    for name, metric, label in (("lbw-distance", "dist", "LBW distance"), ("filtered-change", "rel_change", "Δ̃ change")):
        f = frame[frame["method"] == name]
        if len(f):
            gf = f.groupby(f["n_iter"].astype(int))[f"metrics.{metric}"]
            out[f"{label} (mean)"], out[f"{label} (max)"] = gf.mean(), gf.max()
    out.index = ["exact SVD" if q < 0 else f"RSVD, q = {q}" for q in out.index]
    return out


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean test accuracy and normalized accuracy (%) ± std over seeds, seed count and mean chosen α per
    merged method (records with an ``n_test`` field)."""
    f = frame[frame["n_test"].notna()] if "n_test" in frame else frame.iloc[:0]
    g = f.groupby("method", sort=False)
    out = pd.DataFrame({"acc %": 100 * g["metrics.acc"].mean(), "± acc": 100 * g["metrics.acc"].std(ddof=1),
                        "norm. acc %": 100 * g["metrics.norm_acc"].mean(),
                        "± norm.": 100 * g["metrics.norm_acc"].std(ddof=1), "seeds": g["seed"].nunique(),
                        "α": g["alpha"].mean(), "merge time (s)": g["merge_seconds"].mean()})
    return out.fillna({"± acc": 0.0, "± norm.": 0.0})


def plot_times(frame: pd.DataFrame, *, ax) -> None:
    """Bars: filter time (s) per SVD variant, mean over seeds; dots: single seeds."""
    t = frame[frame["method"] == "filter-time"]
    labels, vals, pts = [], [], []
    for (svd, q), sel in t.groupby(["svd", t["n_iter"].fillna(-1)], sort=False):
        labels.append("exact" if svd == "exact" else f"RSVD q={int(q)}")
        vals.append(sel["metrics.seconds"].mean())
        pts.append(sel["metrics.seconds"].tolist())
    ax.bar(range(len(vals)), vals, color=["grey"] + [f"C{i}" for i in range(len(vals) - 1)])
    for i, p in enumerate(pts):
        ax.scatter([i] * len(p), p, color="black", s=8, zorder=3)
    ax.set_xticks(range(len(vals)), labels)
    ax.set_ylabel("PACT filter time (s)")


def read_bench(path: str | Path) -> dict | None:
    """The JSON written by ``bench/bench_filter.py``, or None when the file does not exist.

    Raises:
        ValueError: the file exists but is not a JSON object (names the file).
    """
    try:
        return read_json_object(path)
    except ValueError as exc:
        raise ValueError(f"{exc}; re-run bench/bench_filter.py") from exc


BENCH_ROWS = (("blocks", "ViT-B/32-shaped blocks (4 matrix layers each)", "{:.0f}"),
              ("tasks", "tasks", "{:.0f}"), ("threads", "CPU threads", "{:.0f}"),
              ("oversample", "oversampling p", "{:.0f}"), ("n_iter", "power iterations q", "{:.0f}"),
              ("t_filter_exact", "PACT filter, exact SVD (s)", "{:.1f}"),
              ("t_filter_rsvd", "PACT filter, RSVD (s)", "{:.1f}"),
              ("speedup_rsvd", "speed-up of RSVD", "{:.1f}×"),
              ("t_svd_exact", "of which top-r SVDs, exact (s)", "{:.1f}"),
              ("t_svd_rsvd", "of which top-r SVDs, RSVD (s)", "{:.1f}"),
              ("speedup_svd", "speed-up of the SVDs alone", "{:.1f}×"),
              ("speedup_bound", "speed-up with SVDs for free (exact time / its non-SVD part)", "{:.1f}×"),
              ("lbw_projector_distance_mean", "LBW projector distance / √r, mean", "{:.2e}"),
              ("lbw_projector_distance_max", "LBW projector distance / √r, max", "{:.2e}"),
              ("lbw_spectral_distance_mean", "LBW spectral distance (sin of largest angle), mean", "{:.2e}"),
              ("lbw_spectral_distance_max", "LBW spectral distance (sin of largest angle), max", "{:.2e}"),
              ("core_spectral_distance_max", "core V0,K spectral distance, max", "{:.2e}"),
              ("active_spectral_distance_max", "active Vt,k spectral distance, max", "{:.2e}"),
              ("filtered_rel_change_mean", "relative change of filtered Δ̃t, mean", "{:.2e}"),
              ("filtered_rel_change_max", "relative change of filtered Δ̃t, max", "{:.2e}"),
              ("previous.speedup", "previous RSVD (p = 10, q = 2): speed-up", "{:.1f}×"),
              ("previous.lbw_projector_distance_mean", "previous RSVD: LBW projector distance / √r, mean", "{:.2e}"),
              ("previous.lbw_spectral_distance_max", "previous RSVD: LBW spectral distance, max", "{:.2e}"),
              ("t_iso_c", "Iso-C alone (s)", "{:.1f}"),
              ("t_pact_iso_c_rsvd", "PACT-Iso-C with RSVD (s)", "{:.1f}"),
              ("pact_iso_over_iso", "PACT-Iso-C / Iso-C time", "{:.2f}×"))


def _bench_value(bench: Mapping, key: str):
    """``bench[key]``, where a dotted key reads a nested record (``previous.speedup``); None if absent."""
    for part in key.split("."):
        if not isinstance(bench, Mapping) or part not in bench:
            return None
        bench = bench[part]
    return bench


def bench_table(bench: Mapping) -> pd.DataFrame:
    """The benchmark's numbers as a two-column table (quantity, value as text); keys it lacks are skipped."""
    rows = [(label, fmt.format(v)) for k, label, fmt in BENCH_ROWS if (v := _bench_value(bench, k)) is not None]
    return pd.DataFrame(rows, columns=["quantity", "value"]).set_index("quantity")


def bench_sweep_table(bench: Mapping) -> pd.DataFrame:
    """The benchmark's sweep of randomized variants (``bench["sweep"]``), one row each: (p, q, route)
    for the core V0,K and for the task updates, the route(s) the variant ran, the time of the top-r
    SVDs of the swept block(s), their speed-up over the exact SVDs, and the distances of the LBW
    bases (projector distance / √r and spectral, mean and max), the cores' and the active
    subspaces' (spectral, max) from the exact ones, and of the cores of all the benchmark's layers
    (spectral, max; NaN in records without it). Empty when the benchmark has no sweep."""
    rows = []
    for v in bench.get("sweep") or []:
        core = (v.get("core_oversample", v["oversample"]), v.get("core_n_iter", v["n_iter"]), v.get("core_route", v["route"]))
        upd = (v["oversample"], v["n_iter"], v["route"])
        rows.append({"core (p, q, route)": "{}, {}, {}".format(*core), "updates (p, q, route)": "{}, {}, {}".format(*upd),
                     "ran": v.get("routes_used", ""), "SVD time (s)": v["t_svd"], "SVD speed-up": v["speedup_svd"],
                     "LBW /√r mean": v["lbw_fro_mean"], "LBW /√r max": v["lbw_fro_max"],
                     "LBW spectral mean": v["lbw_spectral_mean"], "LBW spectral max": v["lbw_spectral_max"],
                     "core spectral max": v["core_spectral_max"], "active spectral max": v["active_spectral_max"],
                     "cores, all layers: spectral max": v.get("core_spectral_max_all", math.nan)})
    return pd.DataFrame(rows)


def floor_table(floor: Mapping, scale: Sequence[Mapping] = (), wall: Mapping | None = None) -> pd.DataFrame:
    """PACT-Iso-C's time over Iso-C's per number of tasks T: the least possible (``floor``, the
    record of ``bench/bench_pact_floor.py``: with free shields, cores and LBW bases, only the T
    active-subspace RSVDs and the T projections; and each of the two alone) beside the ratio
    measured for the whole streamed ``pact merge`` (``scale``: ``kind="time_ratio"`` records of
    ``bench/bench_merge_scale.py`` for Iso-C with ``mode="pact-rsvd"``, CPU time; the last record
    per model and T; one column per model). One row per T of the floor record. ``wall``: another
    floor record, run with ``--threads N`` > 1 (wall seconds), adds the column
    "least possible, N threads" (NaN for a T it lacks).

    Raises:
        KeyError: a floor record without ``floors`` or a floor without one of its parts (not
            bench_pact_floor's, or an older one: run the script again).
    """
    measured: dict[tuple[str, int], float] = {}
    for r in scale:
        if r.get("kind") == "time_ratio" and r.get("method") == "iso_c" and r.get("mode") == "pact-rsvd":
            measured[str(r.get("model", "vit_b32")), int(r["tasks"])] = float(r.get("cpu_ratio", r["ratio"]))
    models = sorted({m for m, _ in measured})
    rows = []
    for T, f in sorted(floor["floors"].items(), key=lambda kv: int(kv[0])):
        row = {"tasks": int(T), "least possible": f["floor"], "active SVDs alone": f["actives_only"],
               "projections alone": f["projections_only"]}
        if wall is not None:
            row[f"least possible, {wall.get('threads', '?')} threads"] = (
                wall["floors"][T]["floor"] if T in wall["floors"] else math.nan)
        for m in models:
            row[f"measured, {m}"] = measured.get((m, int(T)), math.nan)
        rows.append(row)
    return pd.DataFrame(rows).set_index("tasks")


def plot_floor(table: pd.DataFrame, *, ax, goal: float = 2.0) -> None:
    """Lines: PACT-Iso-C's time over Iso-C's against the number of tasks, one per column of
    :func:`floor_table` (the least possible ones dashed, its two parts alone dotted, the
    measured ones solid; NaN cells are left out), on a log scale, and the ``goal`` as a grey
    horizontal line."""
    from matplotlib.ticker import ScalarFormatter

    for i, col in enumerate(table.columns):
        y = table[col].astype(float)
        ok = y.notna()
        if not ok.any():
            continue
        style = "--" if col.startswith("least possible") else ":" if col.endswith(" alone") else "-"
        ax.plot(table.index[ok], y[ok], marker="o", linestyle=style, linewidth=1 if style == ":" else 1.6,
                color="black" if col == "least possible" else f"C{i}", label=col)
    ax.axhline(goal, color="grey", linewidth=1)
    ax.annotate(f"goal {goal:g}×", (table.index.min(), goal), textcoords="offset points", xytext=(2, 4),
                color="grey", fontsize="small")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xticks(list(table.index))
    ax.set_xlabel("tasks T")
    ax.set_ylabel("PACT-RSVD-Iso-C time / Iso-C time")
    ax.legend(fontsize="small")


def memory_table(scale: Sequence[Mapping], *, goal: float = 1.5) -> pd.DataFrame:
    """Peak memory of the streamed ``pact merge`` at the most tasks over its peak at the fewest,
    per model shape, method and PACT mode: the last ``kind="summary"`` record of
    ``bench/bench_merge_scale.py`` for each (model, blocks, method, mode) in ``scale`` (the file
    is appended in time order). Columns: the two T, the two peaks (MB, resident set), their ratio
    and whether it is within ``goal``, and the date of the T hi run (the engine changes: older rows
    measured older code); rows in the registry's method order, then none, pact, pact-rsvd. Empty
    (with those columns) when there is no summary record.
    """
    from ... import merges

    last: dict[tuple, Mapping] = {}
    when: dict[tuple, str] = {}  # the date of the last run per (model, blocks, method, mode, T)
    for r in scale:
        if r.get("path", "streamed") != "streamed":
            continue
        key = (str(r.get("model", "vit_b32")), r.get("blocks"), r.get("method"), r.get("mode"))
        if r.get("kind") == "run":
            when[(*key, r.get("tasks"))] = str(r.get("measured", ""))[:10]
        elif r.get("kind") == "summary":
            last[key] = {**r, "measured": when.get((*key, r["tasks_hi"]), "")}
    order = {m: i for i, m in enumerate(merges.names())}
    modes = {"none": 0, "pact": 1, "pact-rsvd": 2}
    rows = []
    for (model, blocks, method, mode), r in sorted(
            last.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1],
                                          order.get(kv[0][2], 99), modes.get(kv[0][3], 9))):
        rows.append({"model": model, "blocks": "all" if blocks is None else int(blocks),
                     "method": merges.get(method).pretty if method in order else method, "PACT": mode,
                     "T lo": int(r["tasks_lo"]), "T hi": int(r["tasks_hi"]), "peak lo (MB)": round(float(r["peak_lo_mb"])),
                     "peak hi (MB)": round(float(r["peak_hi_mb"])), "ratio": float(r["ratio"]),
                     f"≤ {goal:g}": "yes" if float(r["ratio"]) <= goal else "no", "measured": r["measured"]})
    cols = ["model", "blocks", "method", "PACT", "T lo", "T hi", "peak lo (MB)", "peak hi (MB)", "ratio", f"≤ {goal:g}",
            "measured"]
    return pd.DataFrame(rows, columns=cols)


def plot_distances(frame: pd.DataFrame, *, ax) -> None:
    """Projector distance of the randomized LBW bases from the exact ones against layer depth, one
    line per power-iteration count q (mean over tasks; band: smallest to largest task)."""
    f = frame[frame["method"] == "lbw-distance"]
    for q, sel in f.groupby("n_iter"):
        g = sel.groupby("depth")["metrics.dist"]
        line, = ax.plot(g.mean().index, g.mean(), marker="o", ms=3, label=f"q = {int(q)}")
        ax.fill_between(g.mean().index, g.min(), g.max(), color=line.get_color(), alpha=0.15, lw=0)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set(xlabel="matrix layer (input → output)", ylabel=r"$\|P_{exact} - P_{rsvd}\|_F / \sqrt{r}$")
    ax.legend(title="RSVD power iterations", fontsize=7)


def accuracy_check(frame: pd.DataFrame, *, exact: str, other: str) -> dict:
    """Mean test accuracy of two methods over seeds, their paired difference and the tolerance of
    C10: the larger of the seed spread (std over seeds of the exact run, when ≥ 2 seeds) and one
    binomial standard error of the mean test accuracy sqrt(p(1 − p)/N) with N the test examples
    behind it (``n_test`` field of the records). Accuracies in [0, 1]."""
    a = frame[frame["method"] == exact].set_index("seed")
    b = frame[frame["method"] == other].set_index("seed")
    seeds = a.index.intersection(b.index)
    if not len(seeds):
        raise ValueError(f"accuracy_check: no seed has both {exact!r} and {other!r}")
    acc_a, acc_b = a.loc[seeds, "metrics.acc"], b.loc[seeds, "metrics.acc"]
    p = float(acc_a.mean())
    n = float(a.loc[seeds, "n_test"].mean()) * len(seeds)
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    spread = float(acc_a.std(ddof=1)) if len(seeds) > 1 else 0.0
    return dict(acc_exact=p, acc_other=float(acc_b.mean()), diff=float((acc_b - acc_a).mean()),
                tol=max(spread, se), spread=spread, se=se, n_seeds=len(seeds))


def accuracy_contrasts(frame: pd.DataFrame, method: str) -> dict:
    """{label: Interval} of the chapter's accuracy gains (points, paired on the test examples):
    PACT − plain, PACT-RSVD − plain and PACT-RSVD − PACT of ``method``; {} when the records carry
    no per-example outcomes."""
    from pactlib.book.experiments.paired import rows
    from pactlib.book.intervals import contrast, has_outcomes
    from pactlib.book.report import pretty

    names = (method, f"pact-{method}", f"pact-rsvd-{method}")
    got = {m: rows(frame, method=m) for m in names}
    if not all(has_outcomes(r) for r in got.values()):
        return {}
    pairs = ((names[1], names[0]), (names[2], names[0]), (names[2], names[1]))
    return {f"{pretty(a)} − {pretty(b)}": contrast(got[a], got[b], metric="acc") for a, b in pairs}


def c10_verdict(frame: pd.DataFrame, *, exact: str, other: str, speedups: Sequence[float], bench: Mapping | None,
                min_speedup: float = 2.0, rsvd_share: float | None = None) -> dict:
    """C10 graded on 95 % intervals (:mod:`pactlib.book.verdicts`), three conditions:

    - accuracy, an equivalence test: the paired contrast ``other`` − ``exact`` in test accuracy
      (points, on the same test examples and seeds; :func:`pactlib.book.intervals.contrast`) lies
      within ± the margin, both ``lo > −margin`` and ``hi < +margin``. The margin is the chapter's
      "within the seed spread": :func:`accuracy_check`'s tolerance, the larger of the standard
      deviation of the exact run's accuracy over seeds and one binomial standard error of its mean;
    - time: the exact filter's time over the RSVD filter's (``speedups``, one per seed:
      :func:`pactlib.book.intervals.over_seeds`) exceeds ``min_speedup``.

    The synthetic ViT-B/32-shaped benchmark (``bench``) is reported beside them, not graded.

    Returns:
        The verdict dict; not yet tested when the accuracy records carry no per-example outcomes.

    Raises:
        ValueError: no seed has both methods (:func:`accuracy_check`), or ``speedups`` is empty.
    """
    from pactlib.book.experiments.paired import rows
    from pactlib.book.intervals import NO_OUTCOMES, contrast, has_outcomes, over_seeds
    from pactlib.book.report import pretty
    from pactlib.book.verdicts import condition, graded, not_tested

    check = accuracy_check(frame, exact=exact, other=other)
    margin = round(100 * check["tol"], 2)  # as the evidence writes it: the threshold the reader sees
    speed = over_seeds(list(speedups))
    text = (f"Margin ± {margin:.2f} points = max(seed spread {100 * check['spread']:.2f}, sampling error "
            f"{100 * check['se']:.2f}) over {check['n_seeds']} seed(s). Filter time on the backbone: RSVD "
            f"{speed.estimate:.2f}× faster (goal > {min_speedup:g}×, {speed.n_seeds} seed(s))")
    if rsvd_share is not None:
        text += f"; the randomized range finder runs on {100 * rsvd_share:.0f} % of its SVDs"
    bench_speed = bench.get("speedup_rsvd") if bench else None
    if bench_speed is not None:
        text += (f". Synthetic ViT-B/32-shaped benchmark ({bench.get('blocks')} blocks, not graded): "
                 f"{bench_speed:.1f}× faster")
        if bench.get("oversample") is not None and bench.get("n_iter") is not None:
            text += f" with p = {bench['oversample']}, q = {bench['n_iter']}"
        if bench.get("lbw_projector_distance_mean") is not None and bench.get("filtered_rel_change_mean") is not None:
            text += (f"; its LBW bases lie at projector distance / √r {bench['lbw_projector_distance_mean']:.2g} "
                     f"from the exact ones (0 = the same subspace) and the filtered task vectors differ by "
                     f"{100 * bench['filtered_rel_change_mean']:.2g} %")
    else:
        text += ". Synthetic benchmark: not run"
    plus, minus = rows(frame, method=other), rows(frame, method=exact)
    if not (has_outcomes(plus) and has_outcomes(minus)):
        return not_tested(f"{pretty(other)} vs {pretty(exact)}: {NO_OUTCOMES}. {text}.")
    diff = contrast(plus, minus, metric="acc")
    name = f"{pretty(other)} − {pretty(exact)}, test accuracy"
    conditions = [condition(f"{name}, above −margin", diff, threshold=-margin, side=">"),
                  condition(f"{name}, below +margin", diff, threshold=margin, side="<"),
                  condition("filter time, exact / RSVD", speed, threshold=min_speedup, side=">", unit="×")]
    return graded(conditions, f"RSVD against exact SVDs ({diff.n_seeds} seed(s), {diff.n_examples:,} test examples "
                              "per task)", note=text + ".")
