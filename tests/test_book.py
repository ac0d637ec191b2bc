"""The book machinery: result records, the plotting helper, the runner's cache keys, and (slow)
the whole smoke book built end to end — every chapter executed with params/smoke.yaml and
rendered by jupyter-book — with its pages, figures and offline MathJax checked.
"""
from __future__ import annotations

import ast
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pactlib.book import plotting, records
from pactlib.book.records import RecordError

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    from conftest import load_runner

    return load_runner()


# --- records ---------------------------------------------------------------------------------

def _rec(method="ta", seed=0, **metrics):
    return records.make_record(method, params={"alpha": 0.3, "T": 2}, seed=seed,
                               metrics=metrics or {"acc": 0.5}, task="mnist")


def test_records_round_trip_append_and_replace(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    records.write_records(path, [_rec(acc=0.5), _rec("iso_c", 1, acc=0.75)])
    records.write_records(path, [_rec("pact_iso_c", 2, acc=0.875)])
    got = records.read_records(path)
    assert [(r["method"], r["seed"], r["metrics"]["acc"]) for r in got] == \
        [("ta", 0, 0.5), ("iso_c", 1, 0.75), ("pact_iso_c", 2, 0.875)]
    assert got[0]["params"] == {"alpha": 0.3, "T": 2} and got[0]["task"] == "mnist"
    records.write_records(path, [_rec(acc=0.25)], replace=True)
    assert [r["metrics"]["acc"] for r in records.read_records(path)] == [0.25]
    assert not list(tmp_path.glob("sub/*.tmp")) and not list(tmp_path.glob("sub/.*.tmp"))


def test_make_record_converts_array_scalars_and_non_finite():
    rec = records.make_record("x", params={"k": np.int64(3), "fr": np.float32(0.5)}, seed=np.int64(4),
                              metrics={"a": torch.tensor(0.25), "b": float("nan"),
                                       "c": np.float64(math.inf)}, layers=torch.arange(3))
    assert rec == {"method": "x", "params": {"k": 3, "fr": 0.5}, "seed": 4,
                   "metrics": {"a": 0.25, "b": None, "c": None}, "layers": [0, 1, 2]}
    assert type(rec["params"]["k"]) is int and type(rec["seed"]) is int
    json.dumps(rec, allow_nan=False)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(method="", params={}, seed=0, metrics={}), "non-empty str"),
    (dict(method="m", params=[1], seed=0, metrics={}), "'params' must be a mapping"),
    (dict(method="m", params={}, seed=1.5, metrics={}), "'seed' must be an int or None"),
    (dict(method="m", params={}, seed=True, metrics={}), "'seed' must be an int or None"),
    (dict(method="m", params={}, seed=0, metrics={"acc": "high"}), "metric 'acc' must be a number"),
    (dict(method="m", params={}, seed=0, metrics={"acc": object()}), "cannot store a object"),
])
def test_make_record_rejects_malformed(kwargs, fragment):
    method = kwargs.pop("method")
    with pytest.raises(RecordError, match=re.escape(fragment)):
        records.make_record(method, **kwargs)


def test_write_records_is_all_or_nothing(tmp_path):
    path = tmp_path / "r.jsonl"
    records.write_records(path, [_rec()])
    before = path.read_bytes()
    with pytest.raises(RecordError, match="lacks field"):
        records.write_records(path, [_rec(), {"method": "m", "params": {}, "metrics": {}}])
    assert path.read_bytes() == before


def test_read_records_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    records.write_records(path, [_rec()])
    with open(path, "a") as fh:
        fh.write('{"method": "m", "params": {}, "seed": 0, "metrics": {}}\n{oops\n')
    with pytest.raises(RecordError, match=r"r\.jsonl, line 3: not JSON"):
        records.read_records(path)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        records.read_records(tmp_path / "missing.jsonl")


def _append_many(path, worker, n):
    for i in range(n):
        records.write_records(path, [records.make_record("w", params={}, seed=worker,
                                                         metrics={"i": i})])


def test_concurrent_appends_lose_nothing(tmp_path):
    path = tmp_path / "r.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, 25)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    got = records.read_records(path)
    assert sorted((r["seed"], r["metrics"]["i"]) for r in got) == \
        [(w, i) for w in range(3) for i in range(25)]


def test_records_frame_flattens_params_and_metrics(tmp_path):
    path = records.write_records(tmp_path / "r.jsonl",
                                 [_rec(acc=0.5, norm_acc=0.625), _rec("iso_c", 1, acc=0.75)])
    frame = records.records_frame(path)
    assert {"method", "seed", "task", "params.alpha", "params.T", "metrics.acc",
            "metrics.norm_acc"} <= set(frame.columns)
    assert frame["metrics.acc"].tolist() == [0.5, 0.75]
    assert frame["metrics.norm_acc"].isna().tolist() == [False, True]
    assert records.records_frame([]).empty


def test_records_path_follows_the_runner(monkeypatch, tmp_path):
    monkeypatch.setenv("PACT_RECORDS_DIR", str(tmp_path))
    assert records.records_path("05_main") == tmp_path / "05_main.jsonl"
    monkeypatch.delenv("PACT_RECORDS_DIR")
    assert records.records_path("05_main") == Path("results/05_main.jsonl")


# --- plotting --------------------------------------------------------------------------------

def test_figure_writes_a_numbered_png_of_the_fixed_size(tmp_path):
    from PIL import Image

    with plotting.figure("alpha-sweep", chapter=5, number=2, caption="Accuracy against alpha.",
                         directory=tmp_path) as (fig, ax):
        ax.plot([0, 1], [0, 1])
    path = tmp_path / "fig05.2-alpha-sweep.png"
    with Image.open(path) as im:
        w, h = plotting.SIZES["single"]
        assert im.size == (round(w * plotting.DPI), round(h * plotting.DPI))
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("size", [*plotting.SIZES, (9.0, 4.2), (12.0, 3.0)])
def test_no_text_of_a_figure_shows_below_the_floor_in_the_books_column(tmp_path, size):
    """Tick labels, legends and a label set to fontsize=6 all show at >= MIN_TEXT_PX once the
    PNG is scaled into the article column (a 9-inch figure is shown at about half its pixels)."""
    from matplotlib.text import Text

    width = plotting.SIZES[size][0] if isinstance(size, str) else size[0]
    with plotting.figure("x", chapter=1, number=1, caption="c", size=size, directory=tmp_path) as (fig, ax):
        ax.plot([0, 1], [0, 1], label="a line")
        ax.legend(fontsize=6)
        ax.text(0.5, 0.5, "a note", fontsize=5)
        ax.set_xlabel("x")
        seen = fig
    texts = [t for t in seen.findobj(Text) if t.get_text()]
    assert len(texts) >= 6
    assert min(plotting.displayed_px(t.get_fontsize(), width) for t in texts) >= plotting.MIN_TEXT_PX - 1e-9
    assert plotting.displayed_px(10, 5.0) == pytest.approx(10 * 150 / 72 * 676 / 750)  # shown scaled to the column
    assert plotting.displayed_px(10, 4.0) == pytest.approx(10 * 150 / 72)  # narrower than the column: as drawn


def test_a_figures_alt_text_is_its_caption_in_plain_words():
    assert plotting.alt_text("**Figure 5.1** (paper: Fig. 3). Gains over [TA](x.md) at `alpha`, see {ref}`ch-5`.") \
        == "Figure 5.1 (paper: Fig. 3). Gains over TA at alpha, see ch-5."


def test_figure_leaves_the_global_style_alone(tmp_path):
    import matplotlib as mpl

    before = dict(mpl.rcParams)
    with plotting.figure("x", chapter=1, number=1, caption="c", directory=tmp_path) as (fig, ax):
        assert mpl.rcParams["axes.grid"] is True  # the book's whitegrid style applies inside
    assert dict(mpl.rcParams) == before


def test_figure_failing_block_writes_nothing(tmp_path):
    import matplotlib.pyplot as plt

    n_open = len(plt.get_fignums())
    with pytest.raises(ZeroDivisionError):
        with plotting.figure("x", chapter=1, number=1, caption="c", directory=tmp_path):
            1 / 0
    assert not list(tmp_path.iterdir()) and len(plt.get_fignums()) == n_open


@pytest.mark.parametrize("kwargs, exc, fragment", [
    (dict(name="Bad Name"), ValueError, "lower-case"),
    (dict(chapter=0), ValueError, "chapter must be a positive int"),
    (dict(number=1.5), ValueError, "number must be a positive int"),
    (dict(caption="  "), ValueError, "caption is required"),
    (dict(size="huge"), KeyError, "unknown size 'huge'"),
    (dict(size=(3, -1)), ValueError, "size must be (width, height)"),
])
def test_figure_rejects_bad_arguments(tmp_path, kwargs, exc, fragment):
    args = dict(name="ok", chapter=1, number=1, caption="c", directory=tmp_path) | kwargs
    with pytest.raises(exc, match=re.escape(fragment)):
        with plotting.figure(args.pop("name"), **args):
            pass
    assert not list(tmp_path.iterdir())


def test_table_formats_floats_not_counts():
    import pandas as pd

    frame = pd.DataFrame({"cost": [1.23456, 0.5], "seeds": [3, 12], "joins": ["14", "20"]})
    html = plotting.table_style(frame, "{:.2f}").to_html()
    assert ">1.23<" in html and ">0.50<" in html and ">3<" in html and ">12<" in html
    assert "3.00" not in html and "1.23456" not in html
    assert frame["cost"].iloc[0] == 1.23456  # the frame is not modified



def test_table_shows_missing_values_as_a_dash_and_no_row_numbers():
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({"speed-up": [2.0, np.nan], "limit": [None, 5], "route": ["exact", None]})
    html = plotting.table_style(frame, "{:.2f}").to_html()
    assert "nan" not in html.lower() and "None" not in html
    assert html.count(f">{plotting.NA_REP}<") == 3 and ">2.00<" in html
    assert "row_heading" not in html  # the RangeIndex 0..n-1 is hidden
    filtered = pd.DataFrame({"n": [1, 2, 3]})[lambda f: f["n"] > 1]  # integer row numbers 1, 2
    assert "row_heading" not in plotting.table_style(filtered).to_html()
    labelled = pd.DataFrame({"n": [1]}, index=["PACT-TA"])
    assert ">PACT-TA<" in plotting.table_style(labelled).to_html()  # labels stay


def test_table_has_one_header_row_for_a_named_index():
    import pandas as pd

    one = pd.DataFrame({"acc": [0.5, 0.25]}, index=pd.Index([0.1, 0.25], name="alpha"))
    html = plotting.table_style(one, "{:.2f}").to_html()
    assert html.count("<tr>") == 3 and ">alpha<" in html and ">0.1<" in html and ">0.25<" in html
    counts = pd.DataFrame({"ratio": [1.5, 2.5]}, index=pd.Index([2, 8], name="tasks"))
    html = plotting.table_style(counts, "{:.2f}").to_html()
    assert ">tasks<" in html and ">2<" in html and ">8<" in html  # a named integer index is a label
    two = pd.DataFrame({"share": [0.1, 0.2, 0.3]}, index=pd.MultiIndex.from_tuples(
        [("drift", "a"), ("drift", "b"), ("random", "a")], names=["population", "task"]))
    html = plotting.table_style(two, "{:.2f}").to_html()
    assert html.count("<tr>") == 4 and html.count("index_name") == 0
    assert ">population<" in html and ">task<" in html
    assert html.count(">drift<") == 1 and html.count(">random<") == 1  # a group label shows once
    assert two.index.names == ["population", "task"]  # the frame is not modified
    # columns of two levels: the index's name labels the header row just above the row labels
    wide = pd.DataFrame([[1.0, 2.0], [3.0, 4.0]], index=pd.Index(["none", "early"], name="group"),
                        columns=pd.MultiIndex.from_tuples([("acc %", "T = 8"), ("acc %", "T = 20")]))
    rows = plotting.table_style(wide, "{:.1f}").to_html().split("<tr>")[1:]
    assert len(rows) == 4 and ">group<" in rows[1] and ">group<" not in rows[0] and ">acc %<" in rows[0]

def test_verdict_text():
    said = "*PACT improves Task Arithmetic, TSV-M and Iso-C in absolute and normalized test accuracy.*"
    assert plotting.verdict_text("C5", "reproduced", " +2.0 pts ") == \
        f"**Verdict on {{ref}}`C5 <claim-C5>`: reproduced.** {said} +2.0 pts"
    # the evidence follows a full stop: a lowercase first letter is capitalised, symbols are left alone
    assert plotting.verdict_text("C1", "reproduced", "largest gap 1e-33").endswith(" Largest gap 1e-33")
    assert plotting.verdict_text("C4", "reproduced", "γ = 0.25").endswith(".* γ = 0.25")
    assert plotting.verdict_text("own check", "reproduced", "x") == "**Verdict on own check: reproduced.** X"
    from pactlib.book.intervals import Interval
    from pactlib.book.verdicts import condition
    c = condition("PACT-TA − TA", Interval(0.5, -0.5, 1.5, 0.51, se_examples=0.51, n_examples=300))
    text = plotting.verdict_text("C5", "inconclusive", "see the table", [c])
    assert "| PACT-TA − TA | +0.50 [−0.50, +1.50] points | > 0 | inconclusive | needs ≈ 4.0× the data" in text
    with pytest.raises(ValueError, match="not one of"):
        plotting.verdict_text("C5", "yes", "x")
    with pytest.raises(ValueError, match="evidence"):
        plotting.verdict_text("C5", "reproduced", "")


# --- chapter 8: the merge speed from the committed bench records (pactlib.book.speed) --------

def _bench_book(tmp_path, monkeypatch, **files) -> Path:
    """A book folder with ``data/<name>`` files of JSON lines, as ``$PACT_BOOK_DIR``."""
    for name, rows in files.items():
        path = tmp_path / "book" / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("PACT_BOOK_DIR", str(tmp_path / "book"))
    return tmp_path / "book"


def _merge(label, method, T, wall, cpu, kernel, merge_cpu=None, **extra):
    return {"kind": "merge", "label": label, "method": method, "T": T, "floor_s": 1.0, "wall_s": wall, "cpu_s": cpu,
            "wall_ratio": wall, "cpu_ratio": cpu, "merge_cpu_ratio": cpu / 2 if merge_cpu is None else merge_cpu,
            "kernel_share": kernel, "minor_faults": 100_000, "peak_rss_mb": 900.0, "load1_before": 4.0, **extra}


#: the fields the benchmark writes since it measures the merge phase in-process and the floor's CPU
PHASES = {"merge_wall_ratio": 2.5, "merge_kernel_share": 0.3, "floor_sys_s": 0.2, "floor_kernel_share": 0.11,
          "merge_floor_kernel_share": 0.2, "kernel_excess_s": 0.1}


IO_ROWS = [
    {"kind": "startup", "label": "old", "commit": "aaaaaaa", "user_s": 2.0, "sys_s": 0.5, "peak_rss_mb": 800.0},
    _merge("old", "task_arithmetic", 2, 9.0, 6.0, 0.40),
    {"kind": "startup", "label": "new", "commit": "bbbbbbb", "user_s": 2.5, "sys_s": 0.5, "peak_rss_mb": 830.0},
    _merge("new", "ties_global", 8, 9.0, 5.0, 0.10),
    _merge("new", "task_arithmetic", 8, 3.0, 1.9, 0.12, **PHASES),
    _merge("new", "task_arithmetic", 2, 1.5, 1.0, 0.20),
    _merge("trial", "task_arithmetic", 2, 0.5, 0.4, 0.01),  # a label not asked for: left out
    _merge("new", "iso_c", 2, 40.0, 30.0, 0.20),
    _merge("new", "task_arithmetic", 2, 1.8, 1.2, 0.14),  # a later run of the same label, method and T wins
    {"kind": "memory", "label": "new", "method": "task_arithmetic", "T_min": 2, "T_max": 8, "peak_ratio": 1.02},
    {"kind": "memory", "label": "new", "method": "ties_global", "T_min": 2, "T_max": 8, "peak_ratio": 1.4},
]


def test_floor_frame_takes_the_last_run_of_the_labels_asked_for_with_goal_and_commit(tmp_path, monkeypatch):
    from pactlib.book import speed

    _bench_book(tmp_path, monkeypatch, **{"io_floor.jsonl": IO_ROWS})
    rows = speed.read_data(speed.IO_FLOOR)
    now = speed.floor_frame(rows, ("new",))
    assert list(zip(now["method"], now["T"])) == [("task_arithmetic", 2), ("task_arithmetic", 8), ("ties_global", 8),
                                                  ("iso_c", 2)]
    assert now["wall_ratio"].tolist() == [1.8, 3.0, 9.0, 40.0] and set(now["commit"]) == {"bbbbbbb"}
    assert now["goal"].tolist()[:3] == [2.0, 2.0, 4.0] and now["goal"].isna().tolist() == [False] * 3 + [True]
    old = speed.floor_frame(rows, ("old",))
    table = speed.floor_table(now, old)
    assert table.loc[("Task Arithmetic", 2)].to_dict() == {
        "floor s": "1.00", "wall / floor": "1.8", "merge wall / floor": "–", "CPU / floor": "1.2",
        "merge CPU / floor": "0.6", "goal": "≤ 2", "kernel %": "14", "floor's kernel %": "–", "kernel % before": "40",
        "faults M": "0.10", "peak MB": "900"}
    assert table.loc[("Task Arithmetic", 8), ["merge wall / floor", "floor's kernel %"]].tolist() == ["2.5", "11"]
    assert now["floor_kernel_share"].isna().tolist() == [True, False, True, True]  # older records: NaN
    assert table.loc[("Iso-C", 2), "goal"] == "–" and table.loc[("Iso-C", 2), "kernel % before"] == "–"
    # a label among both the kept and the before labels: where its run is the latest, it is not "before"
    both = speed.floor_frame(rows, ("old", "new"))
    assert both["label"].tolist() == ["new"] * 4
    assert speed.floor_table(now, both)["kernel % before"].tolist() == ["–"] * 4
    assert speed.read_data("data/none.jsonl") == []
    (tmp_path / "book" / "data" / "bad.jsonl").write_text('{"kind": "floor"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: not a JSON object"):
        speed.read_data("data/bad.jsonl")


def test_floor_findings_say_which_goals_are_met_from_the_records(tmp_path, monkeypatch):
    from pactlib.book import speed

    now = speed.floor_frame(IO_ROWS, ("new",))
    found = speed.floor_findings(now, speed.memory_frame(IO_ROWS, ("new",)), speed.startup(IO_ROWS, "new"))
    goal, ta, ties, kernel, floor, memory, start, load = found
    assert goal.startswith("The goal's measure is the whole `pact merge` process's wall time over the floor")
    assert ta.startswith("**Task Arithmetic** (goal ≤ 2× the floor) takes 1.8–3.0× the floor in wall time at "
                         "T = 2, 8: met at T = 2, not at T = 8; its merge phase alone 2.5× at T = 8 (not met).")
    assert "In CPU time the process is 1.2–1.9× (met), and the merge phase 0.6–0.9× (met)" in ta
    assert "merge phase alone" not in ties  # no record of the merge phase
    assert floor.startswith("**The floor's own kernel time.**") and "spends 0.20 s in the kernel" in floor
    assert floor.endswith(": Task Arithmetic 12 % against 11 % (merge phase 30 % against 20 %; 0.10 s beyond the "
                          "floor's; T = 8).")
    assert speed.kernel_floor_findings(now[now["T"] == 2]) == []
    assert "**TIES (global)** (goal ≤ 4× the floor) takes 9.0× the floor" in ties and ": not met." in ties
    assert kernel == ("**Kernel time ≤ 15 % of the CPU time**: met by Task Arithmetic 12–14 % (T = 2, 8); "
                      "TIES (global) 10 % (T = 8); not met by Iso-C 20 % (T = 2).")
    assert "Task Arithmetic 1.02 (T = 8 over 2); TIES (global) 1.40 (T = 8 over 2): not met." in memory
    assert start == ("Importing the CLI takes 3.0 CPU-s and 830 MB, 3.0× the floor at T = 2, "
                     "in every `pact merge` process (it imports torch).")
    light = speed.floor_findings(now, None, {**speed.startup(IO_ROWS, "new"), "torch": False})
    assert light[-2].endswith("process; a merge that runs the torch path imports torch on top of that.")
    assert "4.0" in load
    every = speed.floor_findings(now[now["kernel_share"] <= 0.15])
    assert any(s.startswith("**Kernel time** is at most 15 % of the CPU time for every method") for s in every)


def test_plot_floor_draws_each_goal_once_and_the_kernel_goal(tmp_path):
    from pactlib.book import plotting, speed

    now, old = speed.floor_frame(IO_ROWS, ("new",)), speed.floor_frame(IO_ROWS, ("old",))
    with plotting.figure("floor", chapter=8, number=9, ncols=2, caption="c", directory=tmp_path) as (fig, axes):
        speed.plot_floor(now, old, axes=axes)
        left, right = axes
        flat = sorted({ln.get_ydata()[0] for ln in left.get_lines() if len(set(ln.get_ydata())) == 1
                       and ln.get_linestyle() == "--"})
        assert flat == [2.0, 4.0] and left.get_yscale() == "log"
        labels = [t.get_text() for t in left.texts]
        assert labels == ["Task Arithmetic goal ≤ 2×", "TIES (global) goal ≤ 4×"]
        assert [t.get_text() for t in right.texts] == ["goal ≤ 15 %"]
        assert sorted(ln.get_ydata()[0] for ln in right.get_lines() if ln.get_linestyle() == "--"
                      and len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == 0) == [15.0]
        # the methods without a floor goal are on the right only
        assert "Iso-C" not in [t.get_text() for t in left.get_legend().get_texts()]
        assert "Iso-C" in [t.get_text() for t in right.get_legend().get_texts()]
        # the floor's kernel share beside Task Arithmetic's (the only method with a record of it)
        floor = [ln for ln in right.get_lines() if ln.get_linestyle() == ":"]
        assert len(floor) == 1 and [v for v in floor[0].get_ydata() if v == v] == [11.0]
        assert "the floor's kernel time" in [t.get_text() for t in right.get_legend().get_texts()]
    assert (tmp_path / "fig08.9-floor.png").stat().st_size > 0


def test_inmemory_findings_and_the_side_by_side_with_mergekit(tmp_path, monkeypatch):
    from pactlib.book import speed

    rec = {"bench": "inmemory", "method": "task_arithmetic", "tasks": 8, "matrices": 12, "shape": [1024, 2816],
           "seconds": {"merge": 1.5, "merged_update": 0.5, "plain_merge": 1.25, "plain_update": 0.25},
           "ratio_merge": 1.2, "ratio_merged_update": 2.0, "identical_merge": True, "identical_update": True}
    slow = {**rec, "method": "ties", "ratio_merge": 2.5, "identical_update": False}
    _bench_book(tmp_path, monkeypatch, **{"inmemory_speed.jsonl": [rec, slow]})
    table = speed.inmemory_table(speed.read_data(speed.INMEMORY))
    assert table.loc[("Task Arithmetic", 8), "matrices"] == "12 × 1024 × 2816"
    assert table["identical"].tolist() == ["yes", "no"]
    assert speed.inmemory_findings(table) == [
        "**Task Arithmetic** (T = 8): `pactlib.merge` takes 1.20× the plain-torch time and `merged_update` 2.00× "
        "(goal ≤ 2×: met); the results are bit-identical.",
        "**TIES** (T = 8): `pactlib.merge` takes 2.50× the plain-torch time and `merged_update` 2.00× "
        "(goal ≤ 2×: not met); the results are not identical."]
    files, frame = speed.side_by_side()
    assert files == [] and frame.empty
    _bench_book(tmp_path, monkeypatch, **{"mergekit_side_by_side.jsonl": [{"tool": "mergekit", "wall_s": 3.0},
                                                                          {"tool": "pact", "wall_s": 2.0}]})
    files, frame = speed.side_by_side()
    assert files == ["data/mergekit_side_by_side.jsonl"] and frame["tool"].tolist() == ["mergekit", "pact"]
    assert set(frame["file"]) == {"mergekit_side_by_side.jsonl"}


def test_fusion_bench_table_and_findings(tmp_path, monkeypatch):
    """The last compare record per method, in METHODS order; the goal (no slower) per method,
    and each record's note on the definitions."""
    from pactlib.book import speed

    def rec(method, ratio, identical, note=""):
        return {"kind": "compare", "method": method, "tasks": 8, "matrices": 4, "shape": [512, 1408],
                "seconds": {"pactlib": ratio, "fusion_bench": 1.0}, "ratio": ratio, "identical": identical,
                "max_diff_over_update": 0.0 if identical else 1e-5, "note": note}

    rows = [{"kind": "setup"}, rec("iso_c", 2.0, False), rec("task_arithmetic", 0.5, True, "same definition"),
            rec("iso_c", 0.6, False, "rounding differs"), rec("ties", 1.5, False)]
    _bench_book(tmp_path, monkeypatch, **{"fusion_bench_side_by_side.jsonl": rows})
    table = speed.fusion_bench_table(speed.read_data(speed.FUSION_BENCH))
    assert table.index.tolist() == ["Task Arithmetic", "TIES", "Iso-C"]
    assert table["pactlib / fusion_bench"].tolist() == [0.5, 1.5, 0.6]
    assert table["identical"].tolist() == ["yes", "no", "no"]
    assert speed.fusion_bench_findings(table, rows) == [
        "pactlib is no slower than fusion_bench for Task Arithmetic (0.50×) and Iso-C (0.60×); it is slower for "
        "TIES (1.50×) (goal: no slower for any method).",
        "**Task Arithmetic**: same definition", "**Iso-C**: rounding differs"]
    assert speed.fusion_bench_findings(speed.fusion_bench_table([])) == []


def _compare(method, T, wall, layers=4, **extra):
    return {"kind": "compare", "layers": layers, "method": method, "T": T, "repeats": 3, "pact_wall_s": wall,
            "mergekit_wall_s": 2 * wall, "ratio_wall": 0.5, "ratio_cpu": 0.4, "ratio_peak_rss_mb": 0.25,
            "pact_peak_rss_mb": 500.0, "mergekit_peak_rss_mb": 2000.0, "pact_kernel_share": 0.2,
            "mergekit_kernel_share": 0.1, "max_abs_pact_mergekit": 0.0, "max_abs_pact_reference": 3e-9,
            "max_abs_mergekit_reference": 3e-9, "load1_min": 2.0, "load1_max": 4.5, **extra}


def test_side_by_side_table_and_findings_from_the_compare_records(tmp_path, monkeypatch):
    """The last compare record per shape, method and T, in METHODS order; ratios, memory, kernel
    shares and differences as written; the import-free CPU ratio only where every T has it."""
    import pandas as pd

    from pactlib.book import speed

    assert speed.side_by_side_table(pd.DataFrame()).empty and speed.side_by_side_findings(pd.DataFrame()) == []
    rows = [{"kind": "setup", "layers": 4, "file_mb": 271.1}, {"kind": "run", "tool": "pact", "wall_s": 1.0},
            _compare("ties", 8, 9.0, max_abs_mergekit_reference=4e-4, max_abs_pact_mergekit=4e-4),
            _compare("task_arithmetic", 2, 99.0), _compare("task_arithmetic", 2, 3.0, ratio_merge_cpu=0.3),
            _compare("task_arithmetic", 8, 6.0, ratio_wall=0.8, ratio_merge_cpu=0.2)]
    _bench_book(tmp_path, monkeypatch, **{"mergekit_side_by_side.jsonl": rows})
    _, frame = speed.side_by_side()
    table = speed.side_by_side_table(frame)
    model = "4 layers, 271 MB"
    assert table.index.tolist() == [(model, "Task Arithmetic", 2), (model, "Task Arithmetic", 8), (model, "TIES", 8)]
    first = table.iloc[0]
    assert first[["pact wall s", "mergekit wall s", "wall ×", "merge CPU ×"]].tolist() == ["3.0", "6.0", "0.50", "0.30"]
    assert first[["memory ×", "pact MB", "pact kernel %", "mergekit kernel %"]].tolist() == ["0.25", "500", "20", "10"]
    assert (first["load"], first["pact vs float64"]) == ("2.0–4.5", "3.0e-09")
    assert table.iloc[2]["merge CPU ×"] == "–" and table.iloc[2]["mergekit vs float64"] == "4.0e-04"
    assert speed.side_by_side_findings(frame) == [
        "**Task Arithmetic** (4 layers, T = 2, 8): `pact merge` takes 0.50–0.80× mergekit's wall time, 0.40× its CPU "
        "time (0.20–0.30× with each tool's import taken off) and 0.25× its peak memory (medians of 3 alternated "
        "runs). Largest difference from the float64 reference: pact 3e-09, mergekit 3e-09; the two outputs are "
        "identical.",
        "**TIES** (4 layers, T = 8): `pact merge` takes 0.50× mergekit's wall time, 0.40× its CPU time and 0.25× its "
        "peak memory (medians of 3 alternated runs). Largest difference from the float64 reference: pact 3e-09, "
        "mergekit 4e-04; the two outputs differ by at most 4e-04."]


def test_chapter_8_reads_the_committed_io_floor_records():
    """The labels chapter 8 names exist in book/data/io_floor.jsonl, with every streamed method
    of the issue and a floor in each run."""
    from pactlib.book import speed

    rows = [json.loads(line) for line in (ROOT / "book" / "data" / "io_floor.jsonl").read_text().splitlines() if line]
    source = (ROOT / "notebooks" / "08_efficiency.py").read_text()
    named = re.search(r"^io_labels = (\(.*?\))", source, re.M)
    labels = ast.literal_eval(named.group(1))
    assert set(labels) <= {r.get("label") for r in rows}  # every label the chapter names has records
    now = speed.floor_frame(rows, labels)
    assert {"task_arithmetic", "ties_global", "ties_per_key", "iso_c"} <= set(now["method"])
    assert now["floor_s"].gt(0).all() and now["commit"].notna().all()
    latest = now[now["label"] == labels[-1]]  # the newest run: every floor field, T = 2, 8, 20 per method
    assert len(latest) and latest[list(speed.FLOOR_FIELDS)].notna().all().all()
    for method in ("ties_global", "ties_per_key"):  # the newest run re-measured TIES
        assert sorted(latest.loc[latest["method"] == method, "T"]) == [2, 8, 20], method
    assert sorted(now.loc[now["method"] == "task_arithmetic", "T"]) == [2, 8, 20]
    # the synthetic, floor and memory benchmarks, the I/O floor's 3, fusion_bench, the GPU check
    assert source.count('# %% tags=["bench-data"]') == 8
    from pactlib.book import provenance

    # speed only reads and draws: editing it stales no chapter's records
    assert provenance.engine_modules(["pactlib.book.speed", "pactlib.book.site"], ROOT) == {}


# --- runner: records store, present keys ------------------------------------------------------

def test_present_key_tracks_source_params_records_and_state(tmp_path, monkeypatch):
    rn = _runner()
    monkeypatch.setattr(rn, "RECORDS", tmp_path / "records")
    job = rn.prepare([ROOT / "notebooks" / "01_method.py"], ROOT / "params" / "smoke.yaml", {})[0]
    key = rn.present_key(job, "smoke", "code-1")
    assert rn.present_key(job, "smoke", "code-1") == key  # deterministic
    assert rn.present_key(job, "smoke", "code-2") != key  # pactlib's code
    job.params = {**job.params, "spectra_dim": 9}
    assert rn.present_key(job, "smoke", "code-1") != key
    job.params = {**job.params, "spectra_dim": 8}
    assert rn.present_key(job, "smoke", "code-1") == key
    folder = rn.records_dir("smoke", job)
    assert folder == tmp_path / "records" / "smoke" / "main" / "01_method"
    records.write_records(folder / "01_method.jsonl", [_rec()])
    with_records = rn.present_key(job, "smoke", "code-1")
    assert with_records != key
    (folder / "01_method.verdicts.jsonl").write_text('{"claim": "C1", "status": "reproduced"}\n')
    assert rn.present_key(job, "smoke", "code-1") == with_records  # verdicts are present's output, not input
    job.reasons = ["engine changed: pactlib/merges/iso.py"]
    assert rn.present_key(job, "smoke", "code-1") != with_records
    # -p overrides go to a scratch store, never the set's own
    assert rn.store_name("default", {}) == "default" and rn.store_name("default", {"seeds": [0]}) == "_scratch/default"


def test_current_chapters_stored_verdicts_follow_the_present_rules(tmp_path, capsys):
    rn = _runner()
    job = rn.prepare([ROOT / "notebooks" / "01_method.py"], ROOT / "params" / "smoke.yaml", {})[0]
    stored, presented = tmp_path / "records" / "01_method.verdicts.jsonl", tmp_path / "work" / "01_method.verdicts.jsonl"
    stored.parent.mkdir()
    presented.parent.mkdir()
    old = '{"claim": "C1", "status": "partly reproduced", "evidence": "E_t > 1 in 4/24"}\n'
    new = '{"claim": "C1", "status": "not reproduced", "evidence": "E_t > 1 in 4/24"}\n'
    stored.write_text(old)
    presented.write_text(new)
    job.reasons = ["engine changed: pactlib/merges/iso.py"]  # stale: its compute run's verdicts stay
    assert not rn.refresh_verdicts(job, stored, presented) and stored.read_text() == old
    job.reasons = []
    assert rn.refresh_verdicts(job, stored, presented) and stored.read_text() == new
    assert "C1: partly reproduced -> not reproduced" in capsys.readouterr().out
    assert not rn.refresh_verdicts(job, stored, presented)  # the same again: nothing written
    presented.unlink()
    assert not rn.refresh_verdicts(job, stored, presented) and stored.read_text() == new


def test_variant_runs_get_their_own_folder_title_note_toc_sections_and_verdict_column(tmp_path, monkeypatch):
    rn = _runner()
    monkeypatch.setattr(rn, "EXECUTED", tmp_path)
    params_file = tmp_path / "demo.yaml"
    params_file.write_text(yaml.safe_dump({
        "common": {}, **{p.stem: {} for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))},
        "variants": {"main": {"title": "Images"},
                     "text": {"title": "Text", "chapters": {"06_static_vs_dynamic": {"testbed": "synthetic-4"}}}}}))
    paths = [ROOT / "notebooks" / "05_main_results.py", ROOT / "notebooks" / "06_static_vs_dynamic.py"]
    jobs = rn.prepare(paths, params_file, {})
    assert [j.id for j in jobs] == ["05_main_results", "06_static_vs_dynamic", "text/06_static_vs_dynamic"]
    main, var = jobs[1], jobs[2]
    assert var.overrides["testbed"] == "synthetic-4" and "testbed" not in main.overrides
    assert var.out_dir(tmp_path) == tmp_path / "text" and main.out_dir(tmp_path) == tmp_path
    first = lambda job: next(c.source for c in job.nb.cells if c.cell_type == "markdown")  # noqa: E731
    assert first(var) == first(main).replace("(C8)", "(C8) · Text", 1) and first(var) != first(main)
    notes = [c.source for c in var.nb.cells if "variant-note" in c.metadata.get("tags", [])]
    assert len(notes) == 1 and "**Text**" in notes[0] and "testbed='synthetic-4'" in notes[0]
    assert not any("variant-note" in c.metadata.get("tags", []) for c in main.nb.cells)
    # the table of contents: the variant's page is a section of its chapter, then the verdicts page
    toc = yaml.safe_load(rn.toc_for("demo", params_file).read_text())
    chapters = [c for part in toc["parts"] for c in part["chapters"]]
    six = next(c for c in chapters if c["file"].endswith("/06_static_vs_dynamic"))
    assert six["file"] == "book/_executed/demo/06_static_vs_dynamic"
    assert six["sections"] == [{"file": "book/_executed/demo/text/06_static_vs_dynamic"}]
    variant_sections = [s["file"] for c in chapters for s in c.get("sections", []) if "/text/" in s["file"]]
    assert variant_sections == ["book/_executed/demo/text/06_static_vs_dynamic"]  # only the variant's chapter
    one = next(c for c in chapters if c["file"].endswith("/01_method"))  # its own section stays, first
    assert one["sections"] == [{"file": "book/method"}]
    assert {"file": "book/_executed/demo/verdicts"} in chapters
    assert rn.expected_pages(params_file)[-1] == "text/06_static_vs_dynamic"
    # the verdicts page: a column per run, read from the verdicts the present runs wrote
    monkeypatch.setattr(rn, "RECORDS", tmp_path / "records")
    jobs = rn.prepare([ROOT / "notebooks" / f"{n}.py" for n in ("02_testbed", "06_static_vs_dynamic", "10_theory")],
                      params_file, {})
    rn.assess(jobs, "demo")
    for run, status in (("main", "reproduced"), ("text", "not reproduced")):
        monkeypatch.setenv("PACT_NOTEBOOK", "06_static_vs_dynamic")
        monkeypatch.setenv("PACT_RECORDS_DIR", str(tmp_path / "demo" / run))
        monkeypatch.setenv("PACT_RUN", run)
        plotting.record_verdict("C8", status, "S-PACT +0.1 vs PACT +0.5")
    (tmp_path / "demo" / "main" / "10_theory.verdicts.jsonl").write_text(
        json.dumps({"claim": "C11", "status": "partly reproduced", "evidence": "x"}) + "\n")
    # a verdict the main run gives about another run's testbed lands in that run's column
    monkeypatch.setenv("PACT_NOTEBOOK", "02_testbed")
    monkeypatch.setenv("PACT_RECORDS_DIR", str(tmp_path / "demo" / "main"))
    monkeypatch.setenv("PACT_RUN", "main")
    plotting.record_verdict("precondition", "reproduced", "14/14 tasks")
    plotting.record_verdict("precondition", "partly reproduced", "7/8 tasks", run="text")
    plotting.record_verdict("aside", "reproduced", "x", run="no-such-run")  # unknown run: the notebook's own
    page = rn.write_verdicts_page("demo", params_file, jobs).read_text()
    assert "| Claim | Chapter | Images | Text |" in page
    from pactlib.book.claims import statement
    c8 = f"| {{ref}}`C8 <claim-C8>`: {statement('C8')} | {{doc}}`6 <06_static_vs_dynamic>` |"
    assert f"{c8} reproduced (missing) | not reproduced (missing) |" in page
    c11 = f"| {{ref}}`C11 <claim-C11>`: {statement('C11')} | {{doc}}`10 <10_theory>` |"
    assert f"{c11} partly reproduced (missing) | not run |" in page
    assert page.index(c8) < page.index(c11)
    assert "| precondition | {doc}`2 <02_testbed>` | reproduced (missing) | partly reproduced |" in page
    assert "| aside | {doc}`2 <02_testbed>` | reproduced (missing) | not run |" in page
    assert "| 06_<wbr>static_<wbr>vs_<wbr>dynamic | Text | missing | – | no records yet |" in page
    # where the time goes: each chapter's wall and CPU minutes per run and its merges, from the
    # records' provenance; the zoos' training minutes from book/records/<set>/zoo.json
    assert "Where the time goes" not in page  # nothing computed yet
    from pactlib.book import provenance

    merges = {"computed": 3, "reused": 2, "merge_minutes": 1.0, "eval_minutes": 2.5}
    for job, cpu in zip(jobs, (None, 1.5, 10.0, 0.5)):
        if cpu is not None:
            provenance.write(rn.records_dir("demo", job), {"cpu_minutes": cpu, "wall_minutes": cpu * 2,
                                                           "made": "2026-12-03T10:00:00Z",
                                                           **({"merges": merges} if cpu == 10.0 else {})})
    (tmp_path / "records" / "demo" / "zoo.json").write_text(json.dumps(
        {"lite0": {"kinds": {"full": {"models": 4, "minutes": 6.0}, "lora": {"models": 2, "minutes": 1.5}}}}))
    rn.assess(jobs, "demo")
    page = rn.write_verdicts_page("demo", params_file, jobs).read_text()
    assert "| Chapter, testbed | Wall min | CPU min | Merges computed / reused |" in page
    assert "| 06_<wbr>static_<wbr>vs_<wbr>dynamic<br>*Images* | 3.0 | 1.5 | – | – | – | 3.0 |" in page
    assert "| 10_<wbr>theory<br>*Images* | 20.0 | 10.0 | 3 / 2 | 1.0 | 2.5 | 16.5 |" in page
    assert "| 06_<wbr>static_<wbr>vs_<wbr>dynamic<br>*Text* | 1.0 | 0.5 | – | – | – | 1.0 |" in page
    prof = page[page.index("Where the time goes"):]
    assert prof.index("| 10_<wbr>theory<br>*Images*") < prof.index("dynamic<br>*Text*")  # main's rows first
    assert "| **all chapters** | **24.0** | **12.0** | 3 / 2 | 1.0 | 2.5 | 20.5 |" in page
    assert "| lite0 | full | 4 | 6.0 |" in page and "| **all zoos** | | | **7.5** |" in page
    assert "02_<wbr>testbed | Images | missing" in page
    assert "| 10_<wbr>theory | Images | stale | 2026-12-03 | parameters differ" in page
    # the evaluation floor: the examples the α searches evaluated, counted from the chapter's
    # records, the split sizes from chapter 2's task table, the test cap from its parameters
    ten, two = (next(j for j in jobs if j.name == n and j.run == "main") for n in ("10_theory", "02_testbed"))
    acc = {"mnist": 0.5, "lfw_faces": 0.5}
    records.write_records(rn.records_dir("demo", ten) / "10_theory.jsonl", [records.make_record(
        "iso_c", params={}, seed=0, metrics={}, testbed="lite0-8", val_limit=100, seconds=30.0, merge_seconds=2.0,
        curve=[{"alpha": a} for a in (0.5, 1.0, 2.0)], per_task={"val": {"acc": acc}, "test": {"acc": acc}})])
    records.write_records(rn.records_dir("demo", two) / "02_testbed.jsonl", [records.make_record(
        "table", params={}, seed=None, metrics={}, table="tasks", index=["task"], columns=["val", "test"],
        rows=[["mnist", 500, 1000], ["lfw_faces", 16, 40]])])
    provenance.write(rn.records_dir("demo", ten), {"cpu_minutes": 10.0, "wall_minutes": 20.0, "merges": merges,
                                                   "made": "2026-12-03T10:00:00Z", "params": {"test_limit": 300}})
    rn.assess(jobs, "demo")
    page = rn.write_verdicts_page("demo", params_file, jobs).read_text()
    floor = page[page.index("### The evaluation floor"):]
    # 3 α × (100 + 16) validation + (300 + 40) test examples; 4 models; 2.5 min measured
    assert "| 10_<wbr>theory<br>*Images* | 4 | 688 | 2.5 |" in floor


PRESENT_NB = """\
# %% [markdown]
# # Tiny chapter
#
# Some prose.

# %% tags=["parameters"]
testbed = "lite0-8"   # Lite0 on its 8-task suite
seeds = [0, 1]        # two seeds
test_limit = 200      # test examples per task (at 200, one example = 0.5 points)

# %%
print(testbed)

# %% [markdown]
# ## Results
#
# Read from the run's records.

# %%
print("records")

# %% [markdown]
# Why the records say so.
#
# ## A benchmark
#
# Read from book/data.
#
# ```{note}
# ## not a heading: inside a fence
# ```

# %% tags=["bench-data"]
bench = 1

# %% [markdown]
# ### Its second table

# %% tags=["bench-data"]
print(bench)

# %% [markdown]
# ## Mixed
#
# Both kinds.

# %% tags=["bench-data"]
print("bench")

# %%
print("records")

# %% [markdown]
# ## Verdict

# %%
print(bench)
"""


def _present(variant, changed, **kw):
    import jupytext

    from pactlib.book import runplan

    nb = jupytext.reads(PRESENT_NB, fmt="py:percent")
    return nb, runplan.present_copy(nb, missing=False, changed=changed, store="s", top="", chapter="98_tiny",
                                    variant=variant, **kw)


def test_present_copy_shows_the_values_the_run_executes_with():
    from pactlib.book import runplan

    nb, main = _present("", {})
    params = lambda book: next(c for c in book.cells if "parameters" in c.metadata.get("tags", []))  # noqa: E731
    assert params(main).source == params(nb).source  # a run with the defaults: the cell as written
    assert not any("pact-parameters" in c.metadata.get("tags", []) for c in main.cells)
    _, var = _present("text", {"testbed": "minilm-8", "test_limit": 150})
    shown = params(var).source.split("\n")
    assert shown[0] == 'testbed = "minilm-8"  # this run\'s value; the notebook\'s default: "lite0-8"'
    assert shown[1] == "seeds = [0, 1]        # two seeds"  # not set by the run: as written
    assert shown[2] == "test_limit = 150      # this run's value; the notebook's default: 200"
    assert "Lite0" not in params(var).source and "0.5 points" not in params(var).source
    at = var.cells.index(params(var))
    assert var.cells[at - 1].source == "*This run (parameter set `s`) sets `testbed = 'minilm-8'`, `test_limit = 150`.*"
    assert params(nb).source.startswith('testbed = "lite0-8"')  # the notebook itself is left as it is
    # a variant's page already says its values in its note: no second sentence listing them
    import jupytext
    import nbformat

    noted = jupytext.reads(PRESENT_NB, fmt="py:percent")
    noted.cells.insert(0, nbformat.v4.new_markdown_cell("variant note", metadata={"tags": ["variant-note"]}))
    shown_v = runplan.present_copy(noted, missing=False, changed={"testbed": "minilm-8"}, store="s", top="",
                                   chapter="98_tiny", variant="text")
    assert not any("pact-parameters" in c.metadata.get("tags", []) for c in shown_v.cells)
    assert params(shown_v).source.startswith('testbed = "minilm-8"  # this run\'s value')
    # what runs is unchanged: the shown cell defines the run's values, papermill's cell sets the same
    ns = {}
    exec(params(var).source, ns)
    assert (ns["testbed"], ns["seeds"], ns["test_limit"]) == ("minilm-8", [0, 1], 150)
    # a value over several lines, a list of strings, no comment
    src = 'testbeds = ["a",\n            "b"]  # two\nk = 1'
    assert runplan.shown_parameters(src, {"testbeds": ["c"], "k": 2.5}) == \
        'testbeds = ["c"]  # this run\'s value; the notebook\'s default: ["a", "b"]\n' \
        "k = 2.5  # this run's value; the notebook's default: 1"


def test_bench_sections_are_the_main_runs_and_a_variant_links_to_them():
    from pactlib.book import runplan

    nb, main = _present("", {})
    label = runplan.bench_label("98_tiny", "A benchmark")
    assert label == "pact-98-tiny-a-benchmark"
    # the main run: the same cells, the benchmark section labelled, nothing else changed
    assert len(main.cells) == len(nb.cells)
    md = [c.source for c in main.cells if c.cell_type == "markdown"]
    assert "Why the records say so.\n\n(pact-98-tiny-a-benchmark)=\n## A benchmark\n\nRead from book/data.\n\n" \
        "```{note}\n## not a heading: inside a fence\n```" in md
    assert sum("(pact-" in s for s in md) == 1  # the mixed section and the fenced line are not benchmark sections
    assert not any("remove-cell" in c.metadata.get("tags", []) for c in main.cells)
    # a variant: the heading and one line linking to the main page's section; the benchmark's code
    # still runs (the verdict uses `bench`) but is removed from the page; its prose is dropped
    _, var = _present("text", {"testbed": "minilm-8"})
    md = [c.source for c in var.cells if c.cell_type == "markdown"]
    note = next(s for s in md if s.startswith("Why the records say so."))  # the cell's part before the section
    assert note == ("Why the records say so.\n\n## A benchmark\n\nThis section shows committed benchmark data (`book/data/`), not this run's "
                    f"records, so it is the same on every run; it is in the main run's chapter: {{ref}}`{label}`.")
    assert not any("Read from book/data." in s or "Its second table" in s for s in md)
    removed = [c.source for c in var.cells if "remove-cell" in c.metadata.get("tags", [])]
    assert removed == ["bench = 1", "print(bench)"]
    kept = [c.source for c in var.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])]
    assert kept[-3:] == ['print("bench")', 'print("records")', "print(bench)"]  # mixed section, verdict
    assert "## Mixed\n\nBoth kinds." in md and "## Verdict" in md and "not a heading" not in "".join(md)
    # without records only the benchmark cells run, on a variant removed from the page all the same
    import jupytext

    missing = runplan.present_copy(jupytext.reads(PRESENT_NB, fmt="py:percent"), missing=True,
                                   changed={"testbed": "minilm-8"}, store="s", top="", chapter="98_tiny",
                                   variant="text")
    runs = [c.source for c in missing.cells if c.cell_type == "code" and "parameters" not in c.metadata["tags"]]
    assert runs == ["bench = 1", "print(bench)", 'print("bench")']
    # a heading right under a line of text: its label gets a blank line before it (a target starts a block)
    import nbformat

    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\ntext\n## Bench\nx"),
                                           nbformat.v4.new_code_cell("1", metadata={"tags": [runplan.BENCH_TAG]})])
    assert runplan.bench_sections(book, "09_x", "") == ["Bench"]
    assert book.cells[0].source == "# T\n\ntext\n\n(pact-09-x-bench)=\n## Bench\nx"


def test_chapters_benchmark_sections_link_from_every_variant_page():
    """Chapters 5 and 8: every section that shows only book/data is labelled on the main page and
    linked, not repeated, on a variant's page; the I/O floor section is one of them."""
    import jupytext

    from pactlib.book import runplan

    for stem, titles in (("05_main_results", ["How α is searched", "Rank-deficient layers"]),
                         ("08_efficiency", ["The paper-sized benchmark", "PACT-Iso-C against Iso-C",
                                            "Memory against the number of tasks", "Near the I/O floor?",
                                            "On a GPU"])):
        nb = jupytext.read(ROOT / "notebooks" / f"{stem}.py")
        main = runplan.present_copy(nb, missing=False, changed={}, store="default", top="", chapter=stem)
        var = runplan.present_copy(nb, missing=False, changed={"testbed": "minilm-8"}, store="default", top="",
                                   chapter=stem, variant="minilm")
        main_md = "\n".join(c.source for c in main.cells if c.cell_type == "markdown")
        var_md = "\n".join(c.source for c in var.cells if c.cell_type == "markdown")
        labels = [runplan.bench_label(stem, t) for t in titles]
        assert re.findall(r"^\((pact-[^)]*)\)=$", main_md, re.M) == labels
        assert re.findall(r"\{ref\}`(pact-[^`]*)`", var_md) == labels
        shown = [c for c in var.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])]
        assert not any(runplan.BENCH_TAG in c.metadata.get("tags", []) for c in shown)
        assert "## Verdict" in var_md
    assert "Issue 29" not in var_md and "mergekit" not in var_md


# --- slow: the smoke book, end to end --------------------------------------------------------

def _need_mathjax():
    if (ROOT / "book" / "mathjax" / "es5" / "tex-mml-chtml.js").is_file():
        return
    if not (ROOT / ".cache" / "npm" / "node_modules" / "mathjax" / "es5").is_dir():
        pytest.skip("local MathJax not installed (npm mathjax@3): run `make setup` or "
                    "scripts/setup_book_assets.sh")
    subprocess.run(["bash", str(ROOT / "scripts" / "setup_book_assets.sh")], check=True)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The runner with its records store and executed notebooks under ``tmp_path``."""
    rn = _runner()
    monkeypatch.setattr(rn, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(rn, "EXECUTED", tmp_path / "executed")
    return rn


@pytest.mark.slow
def test_failing_notebook_names_notebook_and_cell_and_keeps_the_old_records(tmp_path, store):
    rn = store
    src = tmp_path / "99_broken.py"
    src.write_text('# %% tags=["parameters"]\nsize = 3  # rows\n\n'
                   '# %%\nok = size + 1\n\n# %%\nraise ValueError(f"broken on purpose: {size}")\n')
    job = rn.prepare([src], _write_set(tmp_path, "99_broken", {"size": 4}), {})[0]
    old = rn.records_dir("t", job)
    records.write_records(old / "99_broken.jsonl", [_rec()])
    with pytest.raises(rn.RunError) as err:
        rn.compute(job, "t", "t")
    msg = str(err.value)
    assert "99_broken.py failed in the cell at line 8 (code cell [4] of the executed" in msg
    assert 'raise ValueError(f"broken on purpose: {size}")' in msg
    assert "ValueError: broken on purpose: 4" in msg
    assert (tmp_path / "executed" / "t" / "99_broken.failed.ipynb").is_file()
    assert records.read_records(old / "99_broken.jsonl") == [_rec()]  # the old records, untouched
    assert sorted(p.name for p in old.parent.iterdir()) == ["99_broken"]  # no staging folder left


TWO_PARTS = """\
# %% [markdown]
# # Tiny chapter
#
# Some prose.

# %% tags=["parameters"]
size = 3  # rows

# %%
from pydantic import Field
from pactlib.book import chapters, records, plotting
class Tiny(chapters.Chapter):
    notebook = "98_tiny"
    size: int = Field(3, ge=1)
P = Tiny.check(globals())

# %% tags=["compute"]
print("computing")
records.write_records(records.records_path("98_tiny"), [records.make_record("m", params=P, seed=None,
                                                        metrics={"acc": size / 10})], replace=True)

# %%
frame = records.records_frame(records.records_path("98_tiny"))
print("acc", frame["metrics.acc"].iloc[0])
plotting.record_verdict("C1", "reproduced", "acc")

# %% tags=["bench-data"]
print("bench", len("book/data"))
"""


def _outputs(cell):
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.slow
def test_compute_then_present_skips_compute_cells_and_marks_stale_and_missing(tmp_path, store):
    from pactlib.book import provenance

    rn = store
    src = tmp_path / "98_tiny.py"
    src.write_text(TWO_PARTS)
    set_path = _write_set(tmp_path, "98_tiny", {"size": 4})
    job = rn.prepare([src], set_path, {})[0]
    rn.assess([job], "t")
    assert provenance.state(job.reasons) == "missing"
    # missing: the code is shown, nothing past the parameters runs but the cells that read only
    # committed bench data (tagged bench-data); a banner says so
    rn.present(job, "t", "t", "k0")
    nb = json.loads((tmp_path / "executed" / "t" / "98_tiny.ipynb").read_text())
    assert "No records yet for this chapter" in "".join(nb["cells"][0]["source"])
    assert "only the cells that read the committed benchmark data" in "".join(nb["cells"][0]["source"])
    assert "{admonition}" not in json.dumps(nb)  # no provenance without records
    ran = [c for c in nb["cells"] if c["cell_type"] == "code" and c.get("outputs")]
    assert [_outputs(c) for c in ran] == ["bench 9\n"]
    # compute: the records, the provenance (params, engine, minutes), nothing left in staging
    prov = rn.compute(job, "t", "t")
    folder = tmp_path / "records" / "t" / "main" / "98_tiny"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["98_tiny"]
    assert sorted(p.name for p in folder.iterdir()) == ["98_tiny.jsonl", "98_tiny.verdicts.jsonl", "provenance.json"]
    assert records.read_records(folder / "98_tiny.jsonl")[0]["metrics"] == {"acc": 0.4}
    assert provenance.read(folder) == json.loads(json.dumps(prov))
    assert prov["params"] == {"size": 4} and prov["chapter"] == "98_tiny" and prov["cpu_minutes"] > 0
    assert "pactlib/book/records.py" not in prov["engine"]["modules"] and "pactlib/__init__.py" in prov["engine"]["modules"]
    rn.assess([job], "t")
    assert job.reasons == []
    # present: the compute cell is shown without running (folded), the present cells read the records
    rn.present(job, "t", "t", "k1")
    nb = json.loads((tmp_path / "executed" / "t" / "98_tiny.ipynb").read_text())
    cells = {c["source"] if isinstance(c["source"], str) else "".join(c["source"]): c for c in nb["cells"]}
    compute = next(c for k, c in cells.items() if k.startswith('print("computing")'))
    assert compute["cell_type"] == "code" and compute["outputs"] == [] and "hide-input" in compute["metadata"]["tags"]
    assert "acc 0.4" in _outputs(next(c for k, c in cells.items() if k.startswith("frame =")))
    assert "computing" not in "".join(_outputs(c) for c in nb["cells"])
    title = next(k for k in cells if k.startswith("# Tiny chapter"))  # the provenance, folded, under the title
    assert ":::{admonition} Computed by `make reproduce NB=98_tiny` on " in title
    assert ":class: dropdown pact-provenance" in title and "Records: `" in title
    assert title.index(":::{admonition}") < title.index("Some prose.")
    assert "remove-input" in next(c for k, c in cells.items() if ".check(globals())" in k)["metadata"]["tags"]
    assert "*This run (parameter set `t`) sets `size = 4`.*" in cells  # papermill's own cell is removed
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert len(injected) == 1 and "remove-cell" in injected[0]["metadata"]["tags"]
    assert "No records yet" not in json.dumps(nb) and "stale" not in "".join(nb["cells"][0]["source"])
    verdicts = tmp_path / "executed" / "t" / "main" / "98_tiny.verdicts.jsonl"
    assert [json.loads(line)["claim"] for line in verdicts.read_text().splitlines()] == ["C1"]
    assert [p.name for p in folder.iterdir()] == [p.name for p in folder.iterdir()]  # present wrote nothing there
    assert (folder / "98_tiny.verdicts.jsonl").read_text().count("\n") == 1
    # other parameters: stale, with the reason at the top; the old results still render
    job = rn.prepare([src], _write_set(tmp_path, "98_tiny", {"size": 5}), {})[0]
    rn.assess([job], "t")
    assert job.reasons == ["parameters differ: size 4 -> 5"]
    rn.present(job, "t", "t", "k2")
    nb = json.loads((tmp_path / "executed" / "t" / "98_tiny.ipynb").read_text())
    top = "".join(nb["cells"][0]["source"])
    assert top.startswith("# Tiny chapter") and "**stale**" in top and "parameters differ: size 4 -> 5" in top
    assert top.index("**stale**") < top.index(":::{admonition} Computed by") < top.index("Some prose.")
    assert "acc 0.4" in "".join(_outputs(c) for c in nb["cells"])


@pytest.mark.slow
def test_parallel_execution_orders_dependents_and_reports_every_failure(tmp_path, store, monkeypatch):
    rn = store
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    body = ('# %% tags=["parameters"]\nsize = 1  # unused\n\n# %%\nimport os, time\n'
            'open(os.path.join({d!r}, "{n}.start"), "w").write(str(time.time()))\n'
            'threads = os.environ.get("OMP_NUM_THREADS")\ntime.sleep({sleep})\n{extra}'
            'open(os.path.join({d!r}, "{n}.end"), "w").write(str(time.time()) + " " + str(threads))\n')
    srcs = []
    for n, sleep, extra in (("a", 2, ""), ("b", 0, ""), ("c", 0, ""), ("d", 0, "raise ValueError('d breaks')\n")):
        src = tmp_path / f"{n}.py"
        src.write_text(body.format(d=str(stamps), n=n, sleep=sleep, extra=extra))
        srcs.append(src)
    set_path = tmp_path / "set.yaml"
    set_path.write_text(json.dumps({"common": {}, **{n: {} for n in "abcd"}}))
    jobs = rn.prepare(srcs, set_path, {})
    for job in jobs:
        job.threads = rn.resolve_threads(None, job, 2)
    monkeypatch.setattr(rn, "AFTER", {"c": ("a",)})
    rn.assess(jobs, "t")
    with pytest.raises(rn.RunError, match="d breaks") as err:
        rn.compute_all(jobs, "t", "t", 2, False)
    assert "d.py failed in the cell" in str(err.value) and "a.py" not in str(err.value)  # only d failed
    assert (tmp_path / "executed" / "t" / "d.failed.ipynb").is_file()
    assert not (tmp_path / "records" / "t" / "main" / "d").exists()
    finished = {p.stem for p in stamps.glob("*.end")}
    assert {"a", "b"} <= finished  # running jobs finish after d fails
    if "c" in finished:  # c may not start once d failed; when it did, it waited for a
        assert float((stamps / "c.start").read_text()) >= float((stamps / "a.end").read_text().split()[0])
    assert (stamps / "a.end").read_text().split()[1] == str(rn.default_threads(2))  # cores / jobs threads per kernel
    # without the failing notebook everything runs, c after a, and every chapter is current
    for f in stamps.iterdir():
        f.unlink()
    rn.assess(jobs, "t")
    rn.compute_all(jobs[:3], "t", "t", 2, True)  # resumable: a, b, c were current; --force recomputes
    assert float((stamps / "c.start").read_text()) >= float((stamps / "a.end").read_text().split()[0])
    rn.assess(jobs, "t")
    assert [j.reasons for j in jobs[:3]] == [[], [], []]


@pytest.mark.slow
def test_chapters_wait_for_the_zoo_they_read_while_the_other_family_runs(tmp_path, store, monkeypatch):
    """Compute mode builds the zoos as jobs of its pool: a Lite0 chapter starts after the Lite0 zoo
    build, a MiniLM chapter after the MiniLM one and beside the Lite0 build; a failed build stops
    its chapters and names its log."""
    from pactlib.book import runplan

    rn = store
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    body = ('# %% tags=["parameters"]\ntestbed = "{tb}"  # read by nothing\n\n# %%\nimport os, time\n'
            'open(os.path.join({d!r}, "{n}.start"), "w").write(str(time.time()))\n')
    srcs = []
    for n, tb in (("lite", "lite0-8"), ("text", "minilm-8")):
        srcs.append(tmp_path / f"{n}.py")
        srcs[-1].write_text(body.format(d=str(stamps), n=n, tb=tb))
    set_path = tmp_path / "set.yaml"
    set_path.write_text(json.dumps({"common": {}, "lite": {}, "text": {}}))

    def command(self):  # a stand-in build: Lite0's takes seconds, MiniLM's is already complete
        wait = {"lite0": 6, "minilm": 0}[self.family]
        return [sys.executable, "-c", f"import time, pathlib; print('building'); time.sleep({wait}); "
                f"pathlib.Path({str(stamps)!r}, 'zoo-{self.family}.end').write_text(str(time.time()))"]

    monkeypatch.setattr(runplan.ZooJob, "command", command)
    jobs = rn.prepare(srcs, set_path, {})
    assert [runplan.job_families(j) for j in jobs] == [{"lite0"}, {"minilm"}]
    rn.assess(jobs, "t")
    rn.compute_all(jobs, "t", "t", 2, False)
    t = {p.name: float(p.read_text()) for p in stamps.iterdir()}
    assert t["lite.start"] >= t["zoo-lite0.end"] and t["text.start"] >= t["zoo-minilm.end"]
    assert t["text.start"] < t["zoo-lite0.end"]  # beside the Lite0 build, not after it
    assert (tmp_path / "executed" / "t" / "zoo-lite0.log").read_text().strip() == "building"
    assert runplan.zoo_jobs(jobs, 1) == [runplan.ZooJob("lite0", 1), runplan.ZooJob("minilm", 1)]
    log = tmp_path / "records" / "t" / rn.REPRODUCTIONS  # the run itself, for the Verdicts page
    run = json.loads(log.read_text())
    assert run["complete"] and set(run["ran"]) == {"zoo-lite0", "zoo-minilm", "lite", "text"} and run["jobs"] == 2
    assert run["wall_minutes"] >= run["ran"]["zoo-lite0"]["wall_minutes"] >= 0.1 - 0.01  # the 6-second build
    # a failed build: its family's chapters do not start, the error names the command and the log
    monkeypatch.setattr(runplan.ZooJob, "command",
                        lambda self: [sys.executable, "-c", "import sys; print('no data'); sys.exit(3)"])
    for f in stamps.iterdir():
        f.unlink()
    with pytest.raises(rn.RunError, match=r"zoo-lite0: .* exited with 3; the end of .*zoo-lite0.log:\nno data"):
        rn.compute_all(jobs[:1], "t", "t", 2, True)
    assert not (stamps / "lite.start").exists()
    failed = json.loads(log.read_text().splitlines()[1])
    assert not failed["complete"] and failed["ran"] == {}


@pytest.mark.slow
def test_failing_shell_command_fails_the_notebook(tmp_path, store):
    """`!cmd` exiting non-zero stops the notebook (IPython alone only sets `_exit_code`)."""
    rn = store
    src = tmp_path / "97_shell.py"
    src.write_text('# %% tags=["parameters"]\nsize = 1  # unused\n\n'
                   '# %%\n!true\nprint("true ran")\n\n'
                   '# %%\n!false\nprint("after false")\n\n# %%\nprint("next cell")\n')
    job = rn.prepare([src], _write_set(tmp_path, "97_shell", {}), {})[0]
    with pytest.raises(rn.RunError) as err:
        rn.compute(job, "t", "t")
    msg = str(err.value)
    assert "97_shell.py failed in the cell at line 9" in msg and "| !false" in msg
    assert "CalledProcessError: Command 'false' returned non-zero exit status 1." in msg
    partial = json.loads((tmp_path / "executed" / "t" / "97_shell.failed.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in partial["cells"] for o in c.get("outputs", []))
    assert "true ran" in printed  # `!true` passes
    assert "after false" not in printed and "next cell" not in printed  # nothing ran after `!false`
    assert not (tmp_path / "records" / "t" / "main" / "97_shell").exists()


# --- make: parameters are checked before data or a zoo is built -----------------------------

STUB_MAKEFILE = """\
SHELL := /bin/bash
PY := {py}
STAMP :=
PARAMS ?= default
.PHONY: setup data zoo
setup: ; @echo STEP setup
data: ; @echo STEP data
zoo: ; @echo STEP zoo
include {root}/mk/book.mk
book-assets: ; @echo STEP assets
"""
# $(PY) of the stub: the real runner for the check and the --needs query (BOOK_DEPS), a log line
# instead of executing notebooks
STUB_PY = """\
#!/bin/bash
case " $* " in *" --check-only "*|*" --needs "*) exec {python} "$@";; *) echo "STEP run $*";; esac
"""


def _make(tmp_path, *args):
    """`make ARGS` with mk/book.mk under a stub Makefile whose setup/data/zoo only print."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    py = tmp_path / "py"
    py.write_text(STUB_PY.format(python=sys.executable))
    py.chmod(0o755)
    (tmp_path / "Makefile").write_text(STUB_MAKEFILE.format(py=py, root=ROOT))
    if not (tmp_path / "scripts").exists():
        (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_make_chapter_checks_parameters_before_building_anything(tmp_path):
    bad = _make(tmp_path, "-j4", "chapter", "NB=05_main_results", "ARGS=-p alpha_points=-1 --force")
    assert bad.returncode != 0
    assert ("05_main_results.py with params/default.yaml: parameter 'alpha_points' (from -p): "
            "input should be greater than or equal to 2, got -1 (int)") in bad.stderr
    assert "STEP" not in bad.stdout  # no setup, data, zoo or run
    # data (BOOK_DEPS) only where the chapter's testbeds read it: Lite0 / MiniLM in the default set,
    # the seconds-sized synthetic testbed (nothing to build) in the smoke set; the runner builds zoos
    for params, built in (("default", {"STEP setup", "STEP data"}), ("smoke", {"STEP setup"})):
        good = _make(tmp_path, "-j4", "chapter", "NB=05", f"PARAMS={params}", "ARGS=-p alpha_points=3")
        assert good.returncode == 0, good.stdout + good.stderr
        lines = good.stdout.splitlines()
        checked = next(i for i, line in enumerate(lines) if "parameters of 1 notebook(s) are valid" in line)
        steps = [line for line in lines[checked:] if line.startswith("STEP")]
        assert set(steps[:-1]) == built, params
        assert steps[-1].startswith(f"STEP run scripts/run_notebooks.py --params {params}") \
            and steps[-1].endswith("--only 05 -p alpha_points=3")
        assert not [line for line in lines[:checked] if line.startswith("STEP")]


def test_make_book_checks_every_notebook_first(tmp_path):
    bad = _make(tmp_path, "book", "PARAMS=smoke", "ARGS=-p methods=[bogus]")
    assert bad.returncode != 0 and "STEP" not in bad.stdout
    assert "parameter 'methods'" in bad.stderr and "'bogus'" in bad.stderr
    usage = _make(tmp_path, "chapter")
    assert usage.returncode != 0 and "usage: make chapter NB=" in usage.stderr and "STEP" not in usage.stdout


def test_make_book_renders_without_data_or_zoo_and_reproduce_prepares_data_when_needed(tmp_path):
    book = _make(tmp_path, "book")
    assert book.returncode == 0, book.stdout + book.stderr
    steps = [line for line in book.stdout.splitlines() if line.startswith("STEP")]
    assert steps == ["STEP assets", "STEP run scripts/run_notebooks.py --params default --jobs 2 --mode present",
                     "STEP run scripts/readme_verdicts.py"]
    smoke = _make(tmp_path, "book", "PARAMS=smoke")
    assert [line for line in smoke.stdout.splitlines() if line.startswith("STEP")][-1].endswith("--mode present")
    # the data where a chapter reads it; the zoos are the runner's jobs (test_chapters_wait_for_the_zoo...)
    for nb, built in (("05", ["STEP setup", "STEP data"]), ("01", ["STEP setup"])):
        rep = _make(tmp_path, "reproduce", f"NB={nb}")
        assert rep.returncode == 0, rep.stdout + rep.stderr
        steps = [line for line in rep.stdout.splitlines() if line.startswith("STEP")]
        assert steps == [*built, f"STEP run scripts/run_notebooks.py --params default --jobs 2 --mode compute --only {nb}"]
    everything = _make(tmp_path, "-n", "reproduce")
    assert "--mode compute" in everything.stdout and "--only" not in everything.stdout.split("--mode compute")[1]


def test_make_passes_threads_to_the_runner(tmp_path):
    """`make book/chapter THREADS=N` hands --threads N to the runner: BOOK_RUN, which runs the
    check (book-check, chapter-check: a bad value fails there, before anything is built, as the
    tests above show for ARGS; tests/test_book_threads.py for the value) and then the notebooks."""
    show = ["--eval", "show-run: ; @echo $(BOOK_RUN)", "show-run"]
    assert " --jobs 2 --threads 3" in _make(tmp_path, *show, "THREADS=3").stdout
    assert "--threads" not in _make(tmp_path, *show).stdout  # unset: the set's value, else cores / jobs


def _write_set(tmp_path, name, section):
    path = tmp_path / "set.yaml"
    path.write_text(json.dumps({"common": {}, name: section}))
    return path


@pytest.mark.slow
def test_smoke_book_computes_two_chapters_and_renders_them_all_from_records(tmp_path):
    """Compute mode on chapters 1 and 3 of the smoke set (records in book/records/smoke/, ignored
    by git), then present mode renders the whole book: those two from their records, the others
    (no records) with their banner; the Verdicts page marks them; nothing is fetched remotely."""
    _need_mathjax()
    rn = _runner()
    out = tmp_path / "book"
    run = [sys.executable, str(ROOT / "scripts" / "run_notebooks.py"), "--params", "smoke", "--jobs", "2"]
    for chapter in ("01_method", "03_scalar_perspective"):
        shutil.rmtree(ROOT / "book" / "records" / "smoke" / "main" / chapter, ignore_errors=True)
    first = subprocess.run([*run, "--mode", "compute", "--only", "01", "03", "--no-render"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count(" computing (missing: no records in book/records/smoke/main/") == 2
    store = ROOT / "book" / "records" / "smoke" / "main"
    for chapter in ("01_method", "03_scalar_perspective"):
        assert records.read_records(store / chapter / f"{chapter}.jsonl"), chapter
        prov = json.loads((store / chapter / "provenance.json").read_text())
        assert prov["set"] == "smoke" and prov["params"]["seed" if chapter == "01_method" else "seeds"] in (0, [0])
        assert prov["engine"]["modules"] and prov["wall_minutes"] > 0
    again = subprocess.run([*run, "--mode", "compute", "--only", "01", "--no-render"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "01_method                  current" in again.stdout, again.stdout
    shown = subprocess.run([*run, "--path-output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    html = out / "_build" / "html" / "book" / "_executed" / "smoke"
    chapters = rn.toc_chapters()
    assert len(chapters) == 12
    for n, stem in enumerate(chapters, 1):
        text = (html / f"{stem}.html").read_text()
        if stem in ("01_method", "03_scalar_perspective"):
            imgs = re.findall(r'<img[^>]*src="([^"]+)"', text)
            assert imgs and all((html / src).is_file() for src in imgs), stem
            alts = re.findall(r'<img[^>]*alt="([^"]*)"', text)
            assert len(alts) == len(imgs) and all(a.startswith(f"Figure {n}.") for a in alts), (stem, alts)
            assert re.search(rf"Figure {n}\.\d", text) and "No records yet" not in text, stem
            assert "Computed by" in text, stem
        else:
            assert "No records yet for this chapter" in text, stem
    assert "Verdict on" in (html / "03_scalar_perspective.html").read_text()
    for stem in ("05_main_results", "06_static_vs_dynamic"):  # the variant's pages, sections of their chapters
        assert "Synthetic, 4 tasks" in (html / "syn4" / f"{stem}.html").read_text(), stem
    verdicts = (html / "verdicts.html").read_text()
    assert "Synthetic, 3 tasks" in verdicts and "Records that are not current" in verdicts
    assert re.search(r">C1<", verdicts) and "Each task has scalar LBW entries" in verdicts and "Where the time goes" in verdicts
    for page in (out / "_build" / "html").rglob("*.html"):
        if "_static" not in page.relative_to(out / "_build" / "html").parts:
            assert not re.search(r"cdn\.jsdelivr|cdnjs|unpkg\.com|mathjax@", page.read_text()), page
    assert "Passed unknown parameter" not in shown.stderr  # papermill's noise is silenced
    banner = "every number on these pages is a smoke value (params/smoke.yaml)"
    for page in ("book/intro.html", "book/method.html", "book/_executed/smoke/05_main_results.html"):
        assert banner in (out / "_build" / "html" / page).read_text(), page  # every page, chapters or not


def test_a_set_without_records_says_to_reproduce_it_first(tmp_path, monkeypatch, capsys):
    rn = _runner()
    monkeypatch.setattr(rn, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(rn, "EXECUTED", tmp_path / "executed")
    assert rn.main(["--params", "smoke"]) == 1
    assert capsys.readouterr().err == ("error: the 'smoke' set has no records yet (only the default set's are "
                                       "committed): run `make reproduce PARAMS=smoke` first, then `make book "
                                       "PARAMS=smoke` renders them\n")
    assert not (tmp_path / "executed").exists()  # nothing presented
    assert rn.announcement("default") == "" and "not a result" in rn.announcement("smoke")
    assert "changed by -p" in rn.announcement("_scratch/default")


def test_overrides_go_to_a_scratch_store(tmp_path, monkeypatch, capsys):
    """`-p` values never touch a set's own records: the store is book/records/_scratch/<set>/."""
    rn = _runner()
    monkeypatch.setattr(rn, "RECORDS", tmp_path / "records")
    assert rn.main(["--params", "smoke", "--only", "01", "-p", "spectra_dim=9", "--status"]) == 0
    out = capsys.readouterr().out
    assert f"missing  missing: no records in {tmp_path}/records/_scratch/smoke/main/01_method" in out, out
    assert "records/smoke/" not in out


def test_pages_name_the_command_that_computes_their_records():
    """A variant's page names `NB=<variant>/<chapter>` (its chapter stem alone would compute the main
    run), and a page of the scratch store of overridden parameters names `make chapter ... -p`."""
    rn = _runner()
    main = rn.Job(name="05_main_results", source=Path("x.py"), nb=None, overrides={})
    var = rn.Job(name="05_main_results", source=Path("x.py"), nb=None, overrides={}, variant="minilm")
    assert rn._command(main, "default") == "`make reproduce NB=05_main_results`"
    assert rn._command(var, "default") == "`make reproduce NB=minilm/05_main_results`"
    assert rn._command(main, "_scratch/default") == '`make chapter NB=05_main_results ARGS="-p ..."`'
    assert "Run `make reproduce NB=minilm/05_main_results`" in rn._banner(var, "default", None)


def test_legend_outside_moves_the_legend_off_the_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.bar([0, 1], [1, 2], label="a")
    ax.bar([0, 1], [2, 1], label="b")
    ax.legend(title="suite")
    leg = plotting.legend_outside(ax, "right")
    assert ax.get_legend() is leg and leg.get_title().get_text() == "suite"
    assert [t.get_text() for t in leg.get_texts()] == ["a", "b"]
    fig.canvas.draw()
    assert leg.get_window_extent().x0 >= ax.get_window_extent().x1  # beside the axes, not over the bars
    above = plotting.legend_outside(ax, "above")
    fig.canvas.draw()
    assert above.get_window_extent().y0 >= ax.get_window_extent().y1
    with pytest.raises(ValueError, match="where must be"):
        plotting.legend_outside(ax, "inside")
    plt.close(fig)
    fig, ax = plt.subplots()
    assert plotting.legend_outside(ax) is None  # nothing labelled: no legend
    plt.close(fig)


def test_a_zoo_builds_progress_reaches_the_terminal_and_all_of_it_the_log():
    import io

    from pactlib.book import runplan

    bar = b"zoo:  10%|# | 1/10 [00:01<00:09]\rzoo:  20%|## | 2/10 [00:02<00:08]\r"
    out, log = io.StringIO(), io.BytesIO()
    runplan.relay_progress(io.BytesIO(b"loading\n" + bar + b"zoo: 100%|###| 10/10\nready: 10 runs"), log, "zoo-x",
                           every=3600, out=out)
    assert log.getvalue() == b"loading\n" + bar + b"zoo: 100%|###| 10/10\nready: 10 runs"
    assert out.getvalue() == "[zoo-x] ready: 10 runs\n"  # within `every`: only the last line
    out = io.StringIO()
    runplan.relay_progress(io.BytesIO(bar), io.BytesIO(), "zoo-x", every=0, out=out)
    assert out.getvalue() == "[zoo-x] zoo:  20%|## | 2/10 [00:02<00:08]\n"  # one read: its latest line


def test_the_zoo_plan_names_readers_models_here_and_minutes_left(store, tmp_path, monkeypatch):
    from pactlib.book import runplan

    rn = store
    (rn.RECORDS / rn.DEFAULT_SET).mkdir(parents=True, exist_ok=True)
    (rn.RECORDS / rn.DEFAULT_SET / "zoo.json").write_text(json.dumps(
        {"lite0": {"kinds": {"full": {"models": 8, "minutes": 30.0}, "head": {"models": 2, "minutes": 10.0}}}}))
    cache = tmp_path / "cache"
    monkeypatch.setenv("PACT_CACHE", str(cache))
    src = tmp_path / "lite.py"
    src.write_text('# %% tags=["parameters"]\ntestbed = "lite0-8"\n\n# %%\nx = 1\n')
    set_path = tmp_path / "set.yaml"
    set_path.write_text(json.dumps({"common": {}, "lite": {}}))
    jobs = rn.prepare([src], set_path, {})
    line = rn.zoo_plan(runplan.ZooJob("lite0", 1), jobs)
    assert line.startswith("[zoo-lite0] lite read the lite0 zoo: 0 of 10 models are in ")
    assert "~40 min (the committed build took 40 min); --run main computes only these" in line
    for i in range(5):  # half the models built here: half the minutes left
        (cache / "zoo" / "full" / f"t{i}").mkdir(parents=True)
        (cache / "zoo" / "full" / f"t{i}" / "seed0.json").write_text(json.dumps({"kind": "full", "seconds": 60}))
    assert "5 of 10 models are in" in rn.zoo_plan(runplan.ZooJob("lite0", 1), jobs)
    assert "~20 min" in rn.zoo_plan(runplan.ZooJob("lite0", 1), jobs)


def test_presented_pages_fold_the_plumbing_and_give_figures_their_alt_text():
    import nbformat

    from pactlib.book import runplan

    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("seeds = [0]", metadata={"tags": ["parameters"]}),
        v4.new_code_cell("P = chapters.X.check(globals())", metadata={"tags": ["remove-input"]}),
        v4.new_code_cell("plotting.table(frame)", outputs=[v4.new_output("display_data", {"text/html": "<table/>"})]),
        v4.new_code_cell("with plotting.figure(...): ...", outputs=[v4.new_output(
            "display_data", {"image/png": "iVBOR"}, metadata={"image/png": {"alt": "Figure 5.1. Gains."}})]),
        v4.new_code_cell("pact_filter(theta0, tvs)  # shown on purpose", metadata={"tags": [runplan.SHOW_TAG]}),
        v4.new_markdown_cell("prose")])
    runplan.restore_skipped(nb)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert tags[:5] == [["parameters"], ["remove-input"], ["hide-input"], ["hide-input"], [runplan.SHOW_TAG]]
    assert nb.cells[3].metadata["mystnb"] == {"image": {"alt": "Figure 5.1. Gains."}}
    assert "mystnb" not in nb.cells[2].metadata and tags[5] == []
