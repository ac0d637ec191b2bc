"""The engine's merge speed from the committed benchmark records (book chapter 8, issue 29).

Reads, never measures: ``book/data/io_floor.jsonl`` (``bench/bench_io_floor.py``: the streamed
``pact merge`` against the I/O floor of the same files), ``book/data/inmemory_speed.jsonl``
(``bench/bench_inmemory.py``: ``pactlib.merge`` against plain torch) and any side-by-side records
with mergekit (``book/data/mergekit*.jsonl``). Every function returns a pandas table, draws on
given axes, or returns sentences whose numbers come from the records; the goals below are the
issue's, not measurements.

The I/O floor of T tasks is the wall time of reading every input once from a warm page cache
plus writing one output-sized file, measured in the same run as the merges. Ratios:
``wall_ratio`` (the whole ``pact merge`` process's wall time over the floor, its imports included:
the goal's measure, as a user runs the command), ``merge_wall_ratio`` (the merge phase
alone, after the import, in the same process), ``cpu_ratio`` (the process's user + system CPU
time over the floor: steadier on a loaded machine) and ``merge_cpu_ratio`` (the merge phase's);
``kernel_share`` is system / (user + system) CPU time. Reading from the page cache is itself
kernel time, so the records also give the floor's own system time (a reader that reads every
input once with ``pread`` and writes the output once) as a share of each method's CPU time,
``floor_kernel_share``: the kernel share the method would have if its only kernel work were the
floor's.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from pactlib.book.paths import book_path
from pactlib.book.records import read_json_lines
from pactlib.book.site import and_join, signed

__all__ = ["IO_FLOOR", "INMEMORY", "FUSION_BENCH", "fusion_bench_table", "fusion_bench_findings", "MERGEKIT", "FLOOR_GOALS", "KERNEL_GOAL", "MEMORY_GOAL", "INMEMORY_GOAL",
           "METHODS", "FLOOR_FIELDS", "read_data", "floor_frame", "startup", "memory_frame", "floor_table",
           "plot_floor", "floor_findings", "kernel_floor_findings", "inmemory_table", "inmemory_findings",
           "side_by_side", "side_by_side_table", "side_by_side_findings"]

#: The benchmark records, relative to the book folder (``$PACT_BOOK_DIR``, else ``./book``).
IO_FLOOR = "data/io_floor.jsonl"
INMEMORY = "data/inmemory_speed.jsonl"
FUSION_BENCH = "data/fusion_bench_side_by_side.jsonl"
#: Side-by-side records with mergekit: every ``book/data/`` file matching this pattern.
MERGEKIT = "mergekit*.jsonl"
#: Issue 29's goals: wall time over the I/O floor per streamed method (TIES: both scopes).
FLOOR_GOALS = {"task_arithmetic": 2.0, "ties_global": 4.0, "ties_per_key": 4.0}
#: Kernel (system) time at most this share of the CPU time, for every method.
KERNEL_GOAL = 0.15
#: Peak memory at the largest T at most this multiple of the peak at the smallest.
MEMORY_GOAL = 1.3
#: The in-memory API within this multiple of the plain-torch expression of the same merge.
INMEMORY_GOAL = 2.0
#: The benchmark's method names, as the book writes them (in this order).
METHODS = {"task_arithmetic": "Task Arithmetic", "ties_global": "TIES (global)", "ties_per_key": "TIES (per key)",
           "ties": "TIES", "tsv_m": "TSV-M", "iso_c": "Iso-C", "iso_cts": "Iso-CTS"}


def read_data(relative: str) -> list[dict[str, Any]]:
    """The JSON lines of the book's file ``relative`` (e.g. :data:`IO_FLOOR`); ``[]`` when the
    file does not exist.

    Raises:
        ValueError: a line is not a JSON object (the message names the file and the line).
    """
    path = book_path(relative, must_exist=False)
    return read_json_lines(path.read_text(encoding="utf-8"), path) if path.is_file() else []


def _order(method: str) -> int:
    return list(METHODS).index(method) if method in METHODS else len(METHODS)


#: Fields of the merge records that the benchmark writes since it measures the merge phase in the
#: merge's own process and the floor's CPU time (:func:`floor_frame` gives NaN for older records).
FLOOR_FIELDS = ("merge_wall_ratio", "merge_kernel_share", "floor_sys_s", "floor_kernel_share",
                "merge_floor_kernel_share", "kernel_excess_s")


def startup(rows: Iterable[Mapping[str, Any]], label: str) -> dict[str, Any]:
    """The ``startup`` record of ``label`` (a process that only imports the CLI: its commit, CPU
    and memory), ``{}`` when there is none."""
    found = [dict(r) for r in rows if r.get("kind") == "startup" and r.get("label") == label]
    return found[-1] if found else {}


def floor_frame(rows: Iterable[Mapping[str, Any]], labels: Sequence[str]) -> pd.DataFrame:
    """One row per (method, T): the last ``merge`` record among ``labels`` (file order), with its
    label, the commit it measured (from the label's ``startup`` record) and the goal of
    :data:`FLOOR_GOALS` (NaN where the method has none); rows in :data:`METHODS` order, then T.

    Columns: method, T, label, commit, floor_s, wall_s, cpu_s, wall_ratio, cpu_ratio,
    merge_cpu_ratio, kernel_share, minor_faults, peak_rss_mb, then (None in records written
    before the benchmark measured them) merge_wall_ratio, merge_kernel_share, floor_sys_s,
    floor_kernel_share, merge_floor_kernel_share, kernel_excess_s; then load1, goal.
    """
    rows = list(rows)
    commits = {lab: startup(rows, lab).get("commit") for lab in labels}
    last: dict[tuple[str, int], dict] = {}
    for r in rows:
        if r.get("kind") == "merge" and r.get("label") in labels:
            last[(r["method"], int(r["T"]))] = r
    cols = ["method", "T", "label", "commit", "floor_s", "wall_s", "cpu_s", "wall_ratio", "cpu_ratio",
            "merge_cpu_ratio", "kernel_share", "minor_faults", "peak_rss_mb", *FLOOR_FIELDS, "load1", "goal"]
    out = [{"method": m, "T": T, "label": r["label"], "commit": commits.get(r["label"]),
            **{c: r.get(c) for c in cols[4:-2]}, "load1": r.get("load1_before"),
            "goal": FLOOR_GOALS.get(m, float("nan"))}
           for (m, T), r in sorted(last.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1]))]
    return pd.DataFrame(out, columns=cols).astype({c: float for c in FLOOR_FIELDS})


def memory_frame(rows: Iterable[Mapping[str, Any]], labels: Sequence[str]) -> pd.DataFrame:
    """One row per method: the last ``memory`` record among ``labels`` (peak memory of the whole
    process at ``T_max`` over ``T_min``). Columns: method, T_min, T_max, peak_ratio, label."""
    last = {r["method"]: r for r in rows if r.get("kind") == "memory" and r.get("label") in labels}
    out = [{"method": m, "T_min": r.get("T_min"), "T_max": r.get("T_max"), "peak_ratio": r.get("peak_ratio"),
            "label": r.get("label")} for m, r in sorted(last.items(), key=lambda kv: _order(kv[0]))]
    return pd.DataFrame(out, columns=["method", "T_min", "T_max", "peak_ratio", "label"])


def _fmt(value: Any, fmt: str) -> str:
    return "–" if value is None or value != value else fmt.format(value)


def _before(now: pd.DataFrame, before: pd.DataFrame | None) -> pd.DataFrame | None:
    """``before``'s rows less those of a method and T whose row in ``now`` has the same label (a
    label in both sets, e.g. a per-key run that is the code before for some methods and the code
    kept for others: where it is the latest, it is not "before")."""
    if before is None:
        return None
    same = {(r.method, r.T) for r in now.itertuples() for b in before.itertuples()
            if (b.method, b.T, b.label) == (r.method, r.T, r.label)}
    return before[[(m, T) not in same for m, T in zip(before["method"], before["T"])]]


def floor_table(now: pd.DataFrame, before: pd.DataFrame | None = None) -> pd.DataFrame:
    """The table of :func:`floor_frame` rows for a reader, as text (``–`` where there is no
    value): per method and T the floor (s); the whole process's wall time over the floor (the
    goal's measure) and the merge phase's; the process's CPU time and the merge phase's over the
    floor; the goal; the kernel share of the process's CPU time (%), the floor's system time as a
    share of the same CPU time (%), and the kernel share before (from ``before``'s rows of the
    same method and T, unless it is the same run); minor page faults (millions) and peak memory
    (MB)."""
    before = _before(now, before)
    prev = {} if before is None else {(r.method, r.T): r for r in before.itertuples()}
    rows = []
    for r in now.itertuples():
        b = prev.get((r.method, r.T))
        rows.append({"method": METHODS.get(r.method, r.method), "T": int(r.T), "floor s": _fmt(r.floor_s, "{:.2f}"),
                     "wall / floor": _fmt(r.wall_ratio, "{:.1f}"),
                     "merge wall / floor": _fmt(r.merge_wall_ratio, "{:.1f}"),
                     "CPU / floor": _fmt(r.cpu_ratio, "{:.1f}"),
                     "merge CPU / floor": _fmt(r.merge_cpu_ratio, "{:.1f}"),
                     "goal": f"≤ {r.goal:g}" if r.goal == r.goal else "–",
                     "kernel %": _fmt(100 * r.kernel_share, "{:.0f}"),
                     "floor's kernel %": _fmt(100 * r.floor_kernel_share, "{:.0f}"),
                     "kernel % before": _fmt(100 * b.kernel_share if b is not None else None, "{:.0f}"),
                     "faults M": _fmt(r.minor_faults / 1e6, "{:.2f}"), "peak MB": _fmt(r.peak_rss_mb, "{:.0f}")})
    return pd.DataFrame(rows).set_index(["method", "T"])


def plot_floor(now: pd.DataFrame, before: pd.DataFrame | None, *, axes) -> None:
    """Two panels on ``axes``: left, the time of each method with a floor goal over the I/O floor
    against T (log scale; solid: wall time, the goal's measure; dotted: CPU time), each goal a
    dashed line of its method's colour; right, the kernel share of the CPU time of every method
    against T (solid: ``now``; dashed: ``before``, less the runs that are in ``now``; dotted,
    squares: the floor's own system time as a share of the same CPU time, where recorded), the
    :data:`KERNEL_GOAL` line in black."""
    import os

    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator

    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    left, right = axes
    goals: dict[float, list[str]] = {}
    for m, g in now.groupby("method", sort=False):
        if m not in FLOOR_GOALS:
            continue
        c = colors.get(m)
        left.plot(g["T"], g["wall_ratio"], "o-", color=c, label=METHODS.get(m, m))
        left.plot(g["T"], g["cpu_ratio"], "o:", color=c, mfc="white")
        goals.setdefault(FLOOR_GOALS[m], []).append(m)
    for goal, ms in goals.items():
        c = colors.get(ms[0]) if len(ms) == 1 else "black"
        name = METHODS.get(ms[0], ms[0]) if len(ms) == 1 else os.path.commonprefix([METHODS.get(m, m) for m in ms])
        left.axhline(goal, color=c, ls="--", lw=1)
        left.annotate(f"{name.strip(' (')} goal ≤ {goal:g}×", (0.98, goal), xycoords=("axes fraction", "data"),
                      ha="right", va="top", fontsize=7, color=c)
    left.set_yscale("log")
    top = max([*now.loc[now["method"].isin(list(FLOOR_GOALS)), ["wall_ratio", "cpu_ratio"]].to_numpy().ravel(), *goals])
    left.set_ylim(min(1.0, min(goals, default=1.0) / 2), 8 * top)
    left.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.set_xlabel("tasks T")
    left.set_ylabel("time over the I/O floor")
    handles, labels = left.get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", ls="-", marker="o"), Line2D([], [], color="grey", ls=":", marker="o",
                                                                           mfc="white")]
    left.legend(handles, labels + ["wall time", "CPU time"], fontsize=7, ncol=2, loc="upper right")
    for m, g in now.groupby("method", sort=False):
        right.plot(g["T"], 100 * g["kernel_share"], "o-", color=colors.get(m), label=METHODS.get(m, m))
        if g["floor_kernel_share"].notna().any():
            right.plot(g["T"], 100 * g["floor_kernel_share"], "s:", color=colors.get(m), mfc="white", lw=1)
    before = _before(now, before)
    if before is not None:
        for m, g in before.groupby("method", sort=False):
            right.plot(g["T"], 100 * g["kernel_share"], "x--", color=colors.get(m), lw=1)
    right.axhline(100 * KERNEL_GOAL, color="black", ls="--", lw=1)
    right.annotate(f"goal ≤ {100 * KERNEL_GOAL:.0f} %", (0.5, 100 * KERNEL_GOAL), xycoords=("axes fraction", "data"),
                   ha="center", va="bottom", fontsize=7, color="black")
    right.set_ylim(0, 100)
    right.set_xlabel("tasks T")
    right.set_ylabel("kernel time, % of CPU time")
    handles, labels = right.get_legend_handles_labels()
    if now["floor_kernel_share"].notna().any():
        handles.append(Line2D([], [], color="grey", ls=":", marker="s", mfc="white", lw=1))
        labels.append("the floor's kernel time")
    if before is not None and len(before):
        handles.append(Line2D([], [], color="grey", ls="--", marker="x", lw=1))
        labels.append("before")
    right.legend(handles, labels, fontsize=7, ncol=2, loc="upper right")
    for ax in axes:
        ax.set_xticks(sorted(set(now["T"])))


def _range(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """"lo–hi" in ``fmt`` (one value when they print the same); a range that holds a negative
    value reads "−0.42 to +0.05" (typographic minus), so the dash is not taken for a sign."""
    lo, hi = min(values), max(values)
    if fmt.format(lo) == fmt.format(hi):
        return signed(lo, fmt)
    if lo < 0:
        plus = fmt.replace("{:", "{:+", 1)
        return f"{signed(lo, plus)} to {signed(hi, plus)}"
    return f"{fmt.format(lo)}–{fmt.format(hi)}"


def _ts(ts: Sequence[int]) -> str:
    return ", ".join(str(int(t)) for t in ts)


def _against(frame: pd.DataFrame, col: str, goal: float) -> str:
    """``"met"``, ``"not met"`` or ``"met at T = 2, not at T = 8, 20"`` for ``frame[col] <= goal``."""
    ok = frame[col] <= goal
    if ok.all():
        return "met"
    if not ok.any():
        return "not met"
    return f"met at T = {_ts(frame.loc[ok, 'T'])}, not at T = {_ts(frame.loc[~ok, 'T'])}"


def floor_findings(now: pd.DataFrame, memory: pd.DataFrame | None = None,
                   start: Mapping[str, Any] | None = None) -> list[str]:
    """Sentences (Markdown) saying, from the records, which of issue 29's goals the streamed
    merges meet: the floor goal per method (by wall time, the goal's measure, then by CPU time and
    by the merge's own CPU time), the kernel share, the memory at the largest T (``memory``:
    :func:`memory_frame`) and what importing the CLI costs (``start``: :func:`startup`)."""
    out = []
    if now["method"].isin(list(FLOOR_GOALS)).any():
        out.append("The goal's measure is the whole `pact merge` process's wall time over the floor, as a user "
                   "runs the command: it includes Python's start and the imports (torch, for a merge that runs "
                   "the torch path). The merge phase alone (the same process after importing the CLI) is given "
                   "beside it.")
    for m, g in now.groupby("method", sort=False):
        if m not in FLOOR_GOALS:
            continue
        goal = FLOOR_GOALS[m]
        phase = g.dropna(subset=["merge_wall_ratio"])
        out.append(f"**{METHODS.get(m, m)}** (goal ≤ {goal:g}× the floor) takes {_range(g['wall_ratio'])}× "
                   "the floor "
                   f"in wall time at T = {_ts(g['T'])}: {_against(g, 'wall_ratio', goal)}"
                   + (f"; its merge phase alone {_range(phase['merge_wall_ratio'])}× at T = {_ts(phase['T'])} "
                      f"({_against(phase, 'merge_wall_ratio', goal)})" if len(phase) else "")
                   + f". In CPU time the process is {_range(g['cpu_ratio'])}× ({_against(g, 'cpu_ratio', goal)}), "
                   f"and the merge phase {_range(g['merge_cpu_ratio'])}× ({_against(g, 'merge_cpu_ratio', goal)}).")
    ok = now[now["kernel_share"] <= KERNEL_GOAL]
    bad = now[now["kernel_share"] > KERNEL_GOAL]

    def share(frame: pd.DataFrame) -> str:
        return "; ".join(f"{METHODS.get(m, m)} {_range(100 * g['kernel_share'], '{:.0f}')} % (T = {_ts(g['T'])})"
                         for m, g in frame.groupby("method", sort=False))

    if bad.empty:
        out.append(f"**Kernel time** is at most {100 * KERNEL_GOAL:.0f} % of the CPU time for every method and T: "
                   f"{share(ok)}.")
    else:
        out.append(f"**Kernel time ≤ {100 * KERNEL_GOAL:.0f} % of the CPU time**: "
                   + (f"met by {share(ok)}; " if len(ok) else "")
                   + f"not met by {share(bad)}.")
    out += kernel_floor_findings(now)
    if memory is not None and len(memory):
        parts = [f"{METHODS.get(r.method, r.method)} {r.peak_ratio:.2f} (T = {r.T_max} over {r.T_min})"
                 for r in memory.itertuples()]
        met = "met" if (memory["peak_ratio"] <= MEMORY_GOAL).all() else "not met"
        out.append(f"**Memory** (goal ≤ {MEMORY_GOAL:g}× from the smallest to the largest T): peak of the whole "
                   f"process {'; '.join(parts)}: {met}.")
    if start and isinstance(start.get("user_s"), (int, float)) and len(now):
        cpu = start["user_s"] + start.get("sys_s", 0.0)
        floor = now.loc[now["T"] == now["T"].min(), "floor_s"].min()
        out.append(f"Importing the CLI takes {cpu:.1f} CPU-s and {start.get('peak_rss_mb', 0):.0f} MB, "
                   f"{cpu / floor:.1f}× the floor at T = {int(now['T'].min())}, in every `pact merge` process"
                   + (" (it imports torch)." if start.get("torch", True) else
                      "; a merge that runs the torch path imports torch on top of that."))
    if len(now) and now["load1"].notna().any():
        out.append(f"The shared machine's load average was {_range(now['load1'])} during these runs: a merge "
                   "waiting for a core adds to its wall time, not to its CPU time.")
    return out


def kernel_floor_findings(now: pd.DataFrame) -> list[str]:
    """A sentence (Markdown; none when no row of :func:`floor_frame` has the floor's CPU time)
    setting each method's kernel share beside the floor's own: the system time of reading every
    input once with ``pread`` and writing the output once, as a share of the method's CPU time
    (whole process), the same for the merge phase, and the merge phase's system time beyond the
    floor's (s)."""
    have = now.dropna(subset=["floor_kernel_share"])
    if have.empty:
        return []
    parts = []
    for m, g in have.groupby("method", sort=False):
        parts.append(f"{METHODS.get(m, m)} {_range(100 * g['kernel_share'], '{:.0f}')} % against "
                     f"{_range(100 * g['floor_kernel_share'], '{:.0f}')} % (merge phase "
                     f"{_range(100 * g['merge_kernel_share'], '{:.0f}')} % against "
                     f"{_range(100 * g['merge_floor_kernel_share'], '{:.0f}')} %; "
                     f"{_range(g['kernel_excess_s'], '{:.2f}')} s beyond the floor's; T = {_ts(g['T'])})")
    floor = _range(have["floor_sys_s"], "{:.2f}")
    return [f"**The floor's own kernel time.** Reading from the page cache is a copy done by the kernel: the "
            f"floor's reader (every input once with `pread`, then the output written once) spends {floor} s in "
            "the kernel. Kernel share of each method's CPU time against the share that the floor's system time "
            f"alone makes of the same CPU time: {'; '.join(parts)}."]


def inmemory_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per method and T (the last record of each): the inputs, the best seconds of
    ``pactlib.merge`` / ``merged_update`` and of the plain-torch expressions, their ratios and
    whether the results are bit-identical."""
    last = {(r["method"], r.get("tasks")): r for r in rows if r.get("bench") == "inmemory"}
    out = []
    for (m, T), r in sorted(last.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1] or 0)):
        s = r.get("seconds") or {}
        out.append({"method": METHODS.get(m, m), "T": T,
                    "matrices": f"{r.get('matrices')} × {' × '.join(str(x) for x in r.get('shape', []))}",
                    "merge s": s.get("merge"), "plain s": s.get("plain_merge"), "merge / plain": r.get("ratio_merge"),
                    "merged_update s": s.get("merged_update"), "plain update s": s.get("plain_update"),
                    "update / plain": r.get("ratio_merged_update"),
                    "identical": "yes" if r.get("identical_merge") and r.get("identical_update") else "no"})
    return pd.DataFrame(out).set_index(["method", "T"]) if out else pd.DataFrame()


def inmemory_findings(table: pd.DataFrame) -> list[str]:
    """Sentences: each method's ratios to plain torch against :data:`INMEMORY_GOAL` and whether
    the results are bit-identical, from :func:`inmemory_table`."""
    out = []
    for (m, T), r in table.iterrows():
        worst = max(r["merge / plain"], r["update / plain"])
        out.append(f"**{m}** (T = {T}): `pactlib.merge` takes {r['merge / plain']:.2f}× the plain-torch time and "
                   f"`merged_update` {r['update / plain']:.2f}× (goal ≤ {INMEMORY_GOAL:g}×: "
                   f"{'met' if worst <= INMEMORY_GOAL else 'not met'}); the results are "
                   f"{'bit-identical' if r['identical'] == 'yes' else 'not identical'}.")
    return out


def fusion_bench_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per method (the last ``compare`` record of each, :data:`FUSION_BENCH`): the inputs, the
    best seconds of pactlib and of fusion_bench, their ratio, whether the results are
    bit-identical and the largest difference relative to the largest update (the records' notes
    on how the definitions differ: :func:`fusion_bench_findings`)."""
    last = {r["method"]: r for r in rows if r.get("kind") == "compare"}
    out = []
    for m, r in sorted(last.items(), key=lambda kv: _order(kv[0])):
        s = r.get("seconds") or {}
        out.append({"method": METHODS.get(m, m), "T": r.get("tasks"),
                    "matrices": f"{r.get('matrices')} × {' × '.join(str(x) for x in r.get('shape', []))}",
                    "pactlib s": s.get("pactlib"), "fusion_bench s": s.get("fusion_bench"),
                    "pactlib / fusion_bench": r.get("ratio"), "identical": "yes" if r.get("identical") else "no",
                    "max |difference| / max |update|": r.get("max_diff_over_update")})
    return pd.DataFrame(out).set_index("method") if out else pd.DataFrame()


def fusion_bench_findings(table: pd.DataFrame, rows: Iterable[Mapping[str, Any]] = ()) -> list[str]:
    """Sentences: which methods meet the goal (pactlib no slower than fusion_bench, ratio ≤ 1)
    and which do not, from :func:`fusion_bench_table`; then, per method of ``rows`` (the same
    records), the record's note on how the two definitions differ."""
    if not len(table):
        return []
    ratio = table["pactlib / fusion_bench"]
    fast, slow = ratio[ratio <= 1.0], ratio[ratio > 1.0]
    out = [f"pactlib is no slower than fusion_bench for {and_join([f'{m} ({x:.2f}×)' for m, x in fast.items()])}"
           if len(fast) else "pactlib is slower than fusion_bench for every method measured"]
    if len(slow):
        out[0] += f"; it is slower for {and_join([f'{m} ({x:.2f}×)' for m, x in slow.items()])}"
    out[0] += " (goal: no slower for any method)."
    last = {r["method"]: r for r in rows if r.get("kind") == "compare" and r.get("note")}
    out += [f"**{METHODS.get(m, m)}**: {r['note']}" for m, r in sorted(last.items(), key=lambda kv: _order(kv[0]))]
    return out


def side_by_side() -> tuple[list[str], pd.DataFrame]:
    """The side-by-side records with mergekit: (their files, relative to the book folder; their
    records as one frame, a ``file`` column added); ``([], empty frame)`` when none is committed."""
    folder = book_path("data", must_exist=False)
    files = sorted(folder.glob(MERGEKIT)) if folder.is_dir() else []
    recs = [{"file": f.name, **r} for f in files for r in read_data(f"data/{f.name}")]
    return [f"data/{f.name}" for f in files], (pd.json_normalize(recs, max_level=1) if recs else pd.DataFrame())


def _known(value: Any) -> bool:
    """A number that is not NaN (a record's field that was written)."""
    return isinstance(value, (int, float)) and value == value


def side_by_side_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model shape, method and T, the last ``compare`` record of :func:`side_by_side`'s frame
    (``bench/bench_mergekit.py``) for a reader, as text (``–`` where there is no value): the
    file size (MB), each tool's median wall time (s), the ratios pact / mergekit of wall time, CPU
    time, CPU time less each tool's import (``startup``) and peak memory, each tool's peak memory
    (MB) and kernel share (%), max |pact − mergekit| and each tool's max |output − float64
    reference|, and the 1-minute load average during the runs. An empty frame when there is no
    ``compare`` record."""
    if frame.empty or "kind" not in frame:
        return pd.DataFrame()
    last: dict[tuple, Any] = {}
    for r in frame[frame["kind"] == "compare"].to_dict("records"):
        last[(int(r["layers"]), _order(r["method"]), int(r["T"]))] = r
    sizes = {int(r["layers"]): r.get("file_mb") for r in frame[frame["kind"] == "setup"].to_dict("records")}
    rows = []
    for (layers, _, T), r in sorted(last.items()):
        rows.append({"model": f"{layers} layers, {_fmt(sizes.get(layers), '{:.0f}')} MB", "method": METHODS.get(
            r["method"], r["method"]), "T": T,
            "pact wall s": _fmt(r.get("pact_wall_s"), "{:.1f}"),
            "mergekit wall s": _fmt(r.get("mergekit_wall_s"), "{:.1f}"),
            "wall ×": _fmt(r.get("ratio_wall"), "{:.2f}"), "CPU ×": _fmt(r.get("ratio_cpu"), "{:.2f}"),
            "merge CPU ×": _fmt(r.get("ratio_merge_cpu"), "{:.2f}"),
            "memory ×": _fmt(r.get("ratio_peak_rss_mb"), "{:.2f}"),
            "pact MB": _fmt(r.get("pact_peak_rss_mb"), "{:.0f}"),
            "mergekit MB": _fmt(r.get("mergekit_peak_rss_mb"), "{:.0f}"),
            "pact kernel %": _fmt(100 * r["pact_kernel_share"] if r.get("pact_kernel_share") is not None else None,
                                  "{:.0f}"),
            "mergekit kernel %": _fmt(100 * r["mergekit_kernel_share"]
                                      if r.get("mergekit_kernel_share") is not None else None, "{:.0f}"),
            "max |pact − mergekit|": _fmt(r.get("max_abs_pact_mergekit"), "{:.1e}"),
            "pact vs float64": _fmt(r.get("max_abs_pact_reference"), "{:.1e}"),
            "mergekit vs float64": _fmt(r.get("max_abs_mergekit_reference"), "{:.1e}"),
            "load": _range([r["load1_min"], r["load1_max"]]) if _known(r.get("load1_min")) else "–"})
    return pd.DataFrame(rows).set_index(["model", "method", "T"])


def side_by_side_findings(frame: pd.DataFrame) -> list[str]:
    """Sentences (Markdown), one per model shape and method, from the ``compare`` records of
    :func:`side_by_side`'s frame: the range over T of pact's wall time, CPU time and peak memory
    as a multiple of mergekit's (and the CPU time less each tool's import, where recorded), and how
    far each tool's output lies from the float64 reference."""
    if frame.empty or "kind" not in frame:
        return []
    last: dict[tuple, Any] = {}
    for r in frame[frame["kind"] == "compare"].to_dict("records"):
        last[(int(r["layers"]), _order(r["method"]), r["method"], int(r["T"]))] = r
    groups: dict[tuple, list] = {}
    for key, r in sorted(last.items()):
        groups.setdefault(key[:3], []).append(r)
    out = []
    for (layers, _, method), rs in groups.items():
        ts = [r["T"] for r in rs]

        def worst(field: str) -> str:
            vals = [r.get(field) for r in rs if r.get(field) is not None]
            return "0" if vals and max(vals) == 0 else _fmt(max(vals) if vals else None, "{:.0e}")

        out.append(f"**{METHODS.get(method, method)}** ({layers} layers, T = {_ts(ts)}): `pact merge` takes "
                   f"{_range([r['ratio_wall'] for r in rs], '{:.2f}')}× mergekit's wall time, "
                   f"{_range([r['ratio_cpu'] for r in rs], '{:.2f}')}× its CPU time"
                   + (f" ({_range([r['ratio_merge_cpu'] for r in rs], '{:.2f}')}× with each tool's import taken off)"
                      if all(_known(r.get("ratio_merge_cpu")) for r in rs) else "")
                   + f" and {_range([r['ratio_peak_rss_mb'] for r in rs], '{:.2f}')}× its peak memory (medians of "
                   f"{_fmt(rs[0].get('repeats'), '{:.0f}')} alternated runs). Largest difference from the float64 "
                   f"reference: pact {worst('max_abs_pact_reference')}, mergekit "
                   f"{worst('max_abs_mergekit_reference')}; "
                   + ("the two outputs are identical." if worst("max_abs_pact_mergekit") == "0"
                      else f"the two outputs differ by at most {worst('max_abs_pact_mergekit')}."))
    return out
