"""pactlib.book.report: gains, the main table and the verdicts of C5–C8 on records with known values."""
import pandas as pd
import pytest

from pactlib.book import records, report
import outcome_records as oc


def _rec(method, suite, seed, acc, norm):
    return records.make_record(method, params={}, seed=seed, suite=suite, alpha=0.3,
                               metrics={"acc": acc, "norm_acc": norm})


def _main_records(pact_gain_by_suite):
    """TA / TSV-M / Iso-C on suites 8 and 14, seeds 0 and 1; PACT adds ``gain`` (fraction) to both
    metrics, except TSV-M, which it lowers by 0.01 everywhere."""
    out = []
    for suite, gain in pact_gain_by_suite.items():
        for seed in (0, 1):
            out += [_rec("zero-shot", suite, seed, 0.5, 0.6), _rec("fine-tuned", suite, seed, 0.9, 1.0)]
            for m, base in (("task_arithmetic", 0.70), ("tsv_m", 0.78), ("iso_c", 0.80)):
                g = -0.01 if m == "tsv_m" else gain + 0.002 * seed
                out += [_rec(m, suite, seed, base, base + 0.1), _rec(f"pact-{m}", suite, seed, base + g, base + 0.1 + g)]
    return out


def test_gains_are_per_seed_differences_in_points():
    g = report.gains(_main_records({"8": 0.02}), base_methods=["iso_c"], suites=["8"])
    assert list(g["seed"]) == [0, 1] and list(g["gain"]) == pytest.approx([2.0, 2.2])
    assert report.gains(_main_records({"8": 0.02}), base_methods=["ties"], suites=["8"]).empty


def test_main_verdicts_count_cases_and_read_the_trend_over_T():
    v = report.main_verdicts(_main_records({"8": 0.01, "14": 0.03}), suites=["8", "14"])
    # TA and Iso-C gain in both suites, TSV-M loses: 4 of 6 cases
    assert v["C5"]["status"] == "partly reproduced" and "4/6 cases" in v["C5"]["evidence"]
    assert "TSV-M T=8: -1.00 abs / -1.00 norm" in v["C5"]["evidence"]
    # best absolute accuracy: PACT-Iso-C (0.81 / 0.83) in both suites
    assert v["C6"]["status"] == "reproduced" and "T=14: best PACT-Iso-C (83.1)" in v["C6"]["evidence"]
    # mean gain over the three bases: (1.1 + 1.1 - 1) / 3 = 0.4 at T = 8, (3.1 + 3.1 - 1) / 3 = 1.73 at T = 14
    assert v["C7"]["status"] == "reproduced" and "T=8: +0.40, T=14: +1.73" in v["C7"]["evidence"]
    assert all("(points; mean over 2 seeds; records without per-example outcomes: graded by sign)" in v[c]["evidence"]
               for c in ("C5", "C7"))
    assert report.seeds_text({"8": 3, "14": 1, "20": 1}) == "mean over 3 seeds at T=8; one seed at T=14 and T=20"
    shrinking = report.main_verdicts(_main_records({"8": 0.03, "14": 0.01}), suites=["8", "14"])
    assert shrinking["C7"]["status"] == "not reproduced"
    one = report.main_verdicts(_main_records({"8": 0.03}), suites=["8"])
    assert one["C7"]["status"] == "not yet tested" and one["C5"]["status"] == "partly reproduced"


def test_static_vs_dynamic_verdict_compares_mean_gains():
    recs = _main_records({"8": 0.02})
    for r in [r for r in recs if r["method"].startswith("pact-")]:
        s = dict(r, method="s-" + r["method"], metrics={k: v - 0.005 for k, v in r["metrics"].items()})
        recs.append(s)
    v = report.static_vs_dynamic_verdict(recs, methods=["task_arithmetic", "iso_c"], suite="8")
    assert v["status"] == "reproduced" and "Iso-C: S-PACT +1.60 vs PACT +2.10" in v["evidence"]
    assert "mean over 2 seed(s)" in v["evidence"]


def test_main_table_rows_in_paper_order_with_seed_counts():
    from pactlib.book import study

    frame = records.records_frame(_main_records({"8": 0.02}))
    tab = report.main_table(study.summarize(frame, by=("method", "suite")), suites=["8"])
    assert list(tab.index)[:4] == ["Zero-shot (θ0)", "Individual fine-tuned", "Task Arithmetic", "PACT-Task Arithmetic"]
    assert tab.loc["PACT-Iso-C", "8 tasks"] == "82.1 ± 0.1 (92.1)" and tab.loc["Iso-C", "seeds (8)"] == 2
    merges_only = frame[~frame["method"].isin(["zero-shot", "fine-tuned"])]
    tab = report.main_table(study.summarize(merges_only, by=("method", "suite")), suites=["8"])
    assert list(tab.index)[:2] == ["Task Arithmetic", "PACT-Task Arithmetic"] and tab["seeds (8)"].dtype.kind == "i"


def test_per_task_table_keeps_the_suites_own_tasks():
    recs = []
    for suite, tasks in (("2", ["a", "b"]), ("3", ["a", "b", "c"])):
        for seed, acc in ((0, 0.5), (1, 0.7)):
            recs.append(records.make_record("iso_c", params={}, seed=seed, suite=suite, alpha=1.0,
                                            metrics={"acc": acc, **{f"acc:{t}": acc for t in tasks}}))
    tab = report.per_task_table(records.records_frame(recs), suite="2", methods=["iso_c"])
    assert list(tab.columns) == ["a", "b"] and list(tab.index) == ["Iso-C"]
    assert tab.loc["Iso-C", "a"] == pytest.approx(60.0)


def _ns(conv, method, seed, val, test, kind="full"):
    return records.make_record(method, params={}, seed=seed, suite="8", kind=kind, convention=conv,
                               metrics={"val_norm_acc": val, "norm_acc": test})


def test_null_space_table_and_choice_on_known_values():
    recs = []
    for seed in (0, 1):
        recs += [_ns("drop", "pact-iso_c", seed, 0.90, 0.88), _ns("literal", "pact-iso_c", seed, 0.85, 0.86)]
        recs += [_ns("drop", "pact-tsv_m", seed, 0.80, 0.80), _ns("literal", "pact-tsv_m", seed, 0.81, 0.79)]
    recs += [_ns("literal-reversed", "pact-iso_c", 0, 0.0, 0.83)]
    t = report.null_space_table(recs)
    row = t.loc[("full", "8", "pact-iso_c")]
    assert row["seeds"] == 2
    assert row["Δ val"] == pytest.approx(5.0) and row["Δ test"] == pytest.approx(2.0)
    assert row["order effect"] == pytest.approx(3.0)  # |83 - 86| on seed 0 only
    assert t.loc[("full", "8", "pact-tsv_m")]["Δ val"] == pytest.approx(-1.0)
    c = report.null_space_choice(recs)
    assert c == {"merges": 4, "drop_better": 2, "literal_better": 2, "equal": 0,
                 "mean_delta_val": pytest.approx(2.0), "mean_delta_test": pytest.approx(1.5), "choice": "drop"}
    with pytest.raises(ValueError, match="both conventions"):
        report.null_space_table([r for r in recs if r["convention"] == "drop"])


def test_moved_knobs_text_gives_gains_and_says_when_the_default_was_not_swept():
    import pandas as pd

    from pactlib.book.report import moved_knobs_text

    sens = pd.DataFrame([
        {"knob": "core_frac", "default": 0.1, "best on validation": 0.2, "val (default)": 80.0, "val (best)": 83.33,
         "test (default)": 79.0, "test (best)": 81.59},
        {"knob": "active_frac", "default": 0.05, "best on validation": 0.1, "val (default)": None, "val (best)": 82.0,
         "test (default)": None, "test (best)": 81.0},
        {"knob": "lbw_tol", "default": 0.5, "best on validation": 0.5, "val (default)": 80.0, "val (best)": 80.0,
         "test (default)": 79.0, "test (best)": 79.0}]).set_index("knob")
    assert moved_knobs_text(sens) == (
        "knobs whose best value on validation is not the default: core_frac = 0.2: validation +3.33, test +2.59 "
        "points; active_frac = 0.1: validation n/a (the default was not swept), test n/a (the default was not "
        "swept) points")
    assert moved_knobs_text(sens.loc[["lbw_tol"]]).endswith(": none")


def test_sensitivity_table_breaks_ties_toward_the_default():
    import pandas as pd

    from pactlib.pact import PactOptions

    def row(value, val, test):
        return {"method": "pact", "base": "iso", "knob": "lbw_tol", "value": value, "seed": 0,
                "metrics.val_norm_acc": val, "metrics.norm_acc": test, "cap_binding_rate": 0.5}

    base = {"method": "iso", "knob": None, "value": None, "seed": 0, "metrics.val_norm_acc": 0.8,
            "metrics.norm_acc": 0.8, "cap_binding_rate": None}
    tie = pd.DataFrame([base, row(0.2, 0.85, 0.86), row(0.5, 0.85, 0.86), row(0.8, 0.84, 0.85)])
    sens = report.sensitivity_table(tie, ["lbw_tol"], defaults=PactOptions())
    assert sens.loc["lbw_tol", "best on validation"] == 0.5  # a tie keeps the default
    better = pd.DataFrame([base, row(0.2, 0.851, 0.84), row(0.5, 0.85, 0.86), row(0.8, 0.84, 0.85)])
    sens = report.sensitivity_table(better, ["lbw_tol"], defaults=PactOptions())
    assert sens.loc["lbw_tol", "best on validation"] == 0.2  # strictly better replaces it
    assert sens.loc["lbw_tol", "val (best)"] == pytest.approx(85.1)


def _knob_rec(method, won, *, val, **extra):
    """A sweep record on tasks a and b: θt's outcomes (``oc``) with ``won`` more examples right per task."""
    right = oc.correct(won=won)
    acc = float(right.float().mean())
    metrics = {"acc": acc, "norm_acc": acc / 0.9, "val_norm_acc": val, "acc:a": acc, "acc:b": acc,
               "norm_acc:a": acc / 0.9, "norm_acc:b": acc / 0.9}
    return records.make_record(method, params={}, seed=0, suite="8", metrics=metrics, base="iso_c",
                               outcomes={"test": {"a": oc.outcomes("a", won=won)["test"]["a"],
                                                  "b": oc.outcomes("b", won=won)["test"]["b"]}}, **extra)


def test_sensitivity_gains_carry_intervals_when_the_records_have_outcomes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from pactlib.pact import PactOptions

    recs = [_knob_rec("iso_c", 0, val=0.7), _knob_rec("pact-iso_c", 30, val=0.80, knob="lbw_tol", value=0.2),
            _knob_rec("pact-iso_c", 10, val=0.78, knob="lbw_tol", value=0.5),
            _knob_rec("pact-iso_c", 10, val=0.77, knob="lbw_tol", value=0.8)]
    iv = report.sweep_interval(recs, "lbw_tol", 0.2)  # against plain Iso-C: 30 of 400 per task, normalized by 0.9
    assert iv.estimate == pytest.approx(7.5 / 0.9) and iv.lo > 0
    assert report.sweep_interval(recs, "lbw_tol", 0.2, against=0.5).estimate == pytest.approx(5.0 / 0.9)
    with pytest.raises(ValueError, match="no records of knob 'core_frac'"):
        report.sweep_interval(recs, "core_frac", 0.1)
    sens = report.sensitivity_table(recs, ["lbw_tol"], defaults=PactOptions())
    text = report.sweep_interval(recs, "lbw_tol", 0.2, against=0.5).text()
    assert sens.loc["lbw_tol", "best on validation"] == 0.2 and sens.loc["lbw_tol", report.SENS_GAIN] == text
    assert report.moved_knobs_text(sens).endswith(f"lbw_tol = 0.2: validation +2.00, test {text} points")
    fig = plt.figure()
    report.plot_sensitivity(recs, ["lbw_tol"], defaults=PactOptions(), fig=fig, ax=fig.add_subplot())
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1 and len(bars[0].lines[2][0].get_segments()) == 3  # one per swept value
    plt.close(fig)


def test_gain_table_without_outcomes_gives_the_mean_gain_and_says_so():
    tab = report.gain_table(_main_records({"8": 0.02}), ["iso_c"], ["8"], metric="acc")
    assert tab.loc["Iso-C", "T = 8"] == "+2.10 (no interval)"  # mean of 2.0 and 2.2


def test_reading_follows_the_status_and_names_what_fails():
    from pactlib.book import intervals, verdicts

    def cond(name, lo, hi):
        return verdicts.condition(name, intervals.Interval((lo + hi) / 2, lo, hi, (hi - lo) / 4, n_examples=100))

    ok, wide, bad = cond("A − B", 1.0, 2.0), cond("A − C", -1.0, 2.0), cond("A − D", -3.0, -1.0)
    assert report.reading(verdicts.graded([ok])).startswith("Every one of the 1 comparisons")
    assert report.reading(verdicts.graded([ok, wide])).startswith("1 of the 2 comparisons hold")
    assert report.reading(verdicts.graded([wide])).startswith("No comparison is decided")
    text = report.reading(verdicts.graded([ok, wide, bad]))
    assert text.startswith("1 of the 3 comparisons lie wholly on the wrong side") and "(A − D)" in text
    assert "not graded on intervals here: one suite" in report.reading(verdicts.not_tested("one suite"))


def test_table_record_round_trips_index_columns_order_and_dtypes(tmp_path):
    import json
    import math

    import pandas as pd

    frame = pd.DataFrame({"task": ["b", "a"], "n": [3, 4], "x": [1.5, math.nan], "text": ["1,000", "2"],
                          "ok": [True, False]}).set_index("task")
    path = records.write_records(tmp_path / "r.jsonl", [
        records.make_record("other", params={}, seed=0, metrics={"acc": 0.5}),
        records.table_record(frame, table="t", params={"p": 1}, seed=0, note="x"),
        records.table_record(frame.reset_index().set_index(["task", "n"]), table="multi", params={})])
    pd.testing.assert_frame_equal(records.table_frame(path, "t"), frame)
    pd.testing.assert_frame_equal(records.table_frame(records.read_records(path), "multi"),
                                  frame.reset_index().set_index(["task", "n"]))
    square = pd.DataFrame([[1.0, 0.25], [0.25, 1.0]], index=["a", "b"], columns=["a", "b"])
    rec = json.loads(json.dumps(records.table_record(square, table="cos", params={})))
    pd.testing.assert_frame_equal(records.table_frame([rec], "cos"), square)
    with pytest.raises(KeyError, match="no table 'nope'.*'multi', 't'"):
        records.table_frame(path, "nope")
    with pytest.raises(records.RecordError, match="MultiIndex columns"):
        records.table_record(pd.DataFrame([[1]], columns=pd.MultiIndex.from_tuples([("a", "b")])), table="m",
                             params={})


def test_recipe_view_writes_no_cap_as_all():
    frame = pd.DataFrame({"full": ["None", "—", "80", None], "profile": ["None", "None", "80", "None"]},
                         index=pd.Index(["train_limit", "head_shots", "steps", "eval_limit"], name="field"))
    out = report.recipe_view(frame)
    assert out.loc["train_limit"].tolist() == ["all", "all"] and out.loc["eval_limit"].tolist() == ["all", "all"]
    assert out.loc["head_shots"].tolist() == ["—", "all"] and out.loc["steps"].tolist() == ["80", "80"]
    assert frame.loc["train_limit", "full"] == "None"


def _ablate(drops, strength=1.0):
    """drops: {(task, condition): [drop per draw]} -> ablate records at one strength γ."""
    return [records.make_record("ablate", params={}, seed=0, task=t, condition=c, draw=i, strength=strength,
                                metrics={"drop": d})
            for (t, c), ds in drops.items() for i, d in enumerate(ds)]


def _ablate_outcomes(lost, strength=1.0, finetuned=True):
    """lost: {(task, condition): [θt's right test examples lost, per draw]} -> ablate records with
    per-example outcomes on 3 seeds, and θt's "finetuned" records (tests/outcome_records.py)."""
    recs = []
    for seed in (0, 1, 2):
        if finetuned:
            recs += [records.make_record("finetuned", params={}, seed=seed, task=t, metrics={"acc": oc.acc()},
                                         outcomes=oc.outcomes(t)) for t in dict.fromkeys(t for t, _ in lost)]
        recs += [records.make_record("ablate", params={}, seed=seed, task=t, condition=c, draw=i, strength=strength,
                                     metrics={"drop": k / oc.N}, outcomes=oc.outcomes(t, k))
                 for (t, c), ks in lost.items() for i, k in enumerate(ks)]
    return recs


def test_c4_closeness_grades_the_energy_control_on_its_interval():
    strong = {("a", "lbw"): [200], ("a", "random"): [4, 20], ("a", "complement"): [0, 8], ("a", "energy"): [180, 200],
              ("b", "lbw"): [120], ("b", "random"): [40, 80], ("b", "complement"): [40, 40],
              ("b", "energy"): [160, 160]}
    weak = {("a", "lbw"): [40], ("a", "random"): [0], ("a", "complement"): [8], ("a", "energy"): [0],
            ("b", "lbw"): [40], ("b", "random"): [0], ("b", "complement"): [0], ("b", "energy"): [0]}
    frame = records.records_frame(_ablate_outcomes(strong) + _ablate_outcomes(weak, 0.25, finetuned=False))
    c = report.c4_closeness(frame, margin=0.02)
    assert c["graded"] == 1.0 and sorted(c["strengths"]) == [0.25, 1.0]
    one = c["strengths"][1.0]  # LBW: (50 + 30)/2 = 40 points; energy: (47.5 + 40)/2 = 43.75
    assert one["lbw"] == pytest.approx(40.0) and one["energy"] == pytest.approx(43.75)
    assert one["excess"].estimate == pytest.approx(-3.75) and one["excess"].hi < 2
    assert c["strengths"][0.25]["excess"].estimate == pytest.approx(10.0)
    assert "at γ = 0.25, drop(V_LBW) − drop(energy-matched) is +10.0 [" in c["text"]
    assert "points, more than the margin above it" in c["text"]
    assert "at γ = 1 (graded), drop(V_LBW) − drop(energy-matched) is −3.8 [" in c["text"]
    assert c["text"].endswith("below the margin: the LBW hurts no more than removing as much energy at random.")
    no_energy = {k: v for k, v in strong.items() if k[1] != "energy"}
    c = report.c4_closeness(records.records_frame(_ablate_outcomes(no_energy)))
    assert c["strengths"][1.0]["energy"] is None and c["strengths"][1.0]["excess"] is None
    assert c["text"].startswith("**Against the energy-matched control.** Not run")
    bare = report.c4_closeness(records.records_frame(_ablate(strong)))
    assert bare["strengths"] == {} and "records without per-example outcomes: recompute" in bare["text"]


def test_c9a_closeness_says_how_far_each_interval_lies_from_its_threshold():
    from pactlib.book import verdicts
    from pactlib.book.intervals import Interval

    def cond(name, lo, hi, side=">"):
        return verdicts.condition(name, Interval((lo + hi) / 2, lo, hi, (hi - lo) / 3.92,
                                                 se_examples=(hi - lo) / 3.92, n_examples=150), side=side)

    v = verdicts.graded([cond("gain", 0.4, 2.0), cond("early − late", -0.5, 1.5), cond("share", -1.2, -0.3),
                         cond("less", -2.0, -0.25, side="<")], "x")
    c = report.c9a_closeness(v)
    assert [m["margin"] for m in c["margins"]] == pytest.approx([0.4, 0.0, 0.3, 0.25])
    assert [m["grade"] for m in c["margins"]] == ["holds", "inconclusive", "fails", "holds"]
    assert c["text"].startswith("**How close to flipping.** \"gain\" holds, its interval 0.40 points above 0; "
                                "\"early − late\" spans 0 (needs ≈ 4.0× the data")
    assert "\"share\" fails, its interval 0.30 points below 0; \"less\" holds, its interval 0.25 points below 0." \
        in c["text"]
    assert report.c9a_closeness(verdicts.not_tested("one suite")) == {"margins": [], "text": ""}


def _searched(method, seed, alpha, *, widened=(), grid=(0.1, 0.5, 3.0)):
    return records.make_record(method, params={}, seed=seed, suite="8", alpha=alpha, on_edge=False,
                               alphas=[*grid, *widened], widened=list(widened), refined=[],
                               metrics={"acc": 0.5, "norm_acc": 0.6})


def test_alpha_search_text_names_the_start_grid_the_widened_searches_and_the_mean_alpha():
    recs = [records.make_record("zero-shot", params={}, seed=0, suite="8", metrics={"acc": 0.1})]
    for seed in (0, 1, 2):
        recs += [_searched("iso_c", seed, 0.5), _searched("pact-iso_c", seed, 3.0, widened=(4.5,) if seed != 1 else ()),
                 _searched("task_arithmetic", seed, 0.1 if seed else 0.5)]
    text = report.alpha_search_text(recs)
    assert text.startswith("Every search started on the same grid of 3 values from 0.1 to 3.")
    assert ("PACT-Iso-C (seeds 0 and 2): the best α lay on the grid's edge, so the search added α = 4.5; it then "
            "chose α = 3 on both, inside the widened grid") in text
    assert text.endswith("Chosen α, mean over seeds: Task Arithmetic 0.23, Iso-C 0.50 (PACT 3.00).")
    plain = [_searched("iso_c", 0, 0.5), _searched("tsv_m", 0, 0.5, grid=(0.2, 1.0))]
    text = report.alpha_search_text(plain)
    assert "started on 2 grids: 3 values from 0.1 to 3 (Iso-C); 2 values from 0.2 to 1 (TSV-M)." in text
    assert "No search widened it." in text
    with pytest.raises(ValueError, match="no merge record"):
        report.alpha_search_text(recs[:1])


def test_suite_columns_say_t_and_free_the_corner():
    import pandas as pd

    from pactlib.book import plotting

    wide = pd.DataFrame([[1.0, 2.0]], index=pd.Index(["early"], name="group"),
                        columns=pd.MultiIndex.from_product([["acc %"], [8, 20]], names=[None, "suite"]))
    out = report.suite_columns(wide)
    assert list(out.columns) == [("acc %", "T = 8"), ("acc %", "T = 20")] and out.columns.names == [None, None]
    assert wide.columns.names == [None, "suite"]  # not modified
    rows = plotting.table_style(out, "{:.1f}").to_html().split("<tr>")[1:]
    assert ">group<" in rows[1] and ">T = 8<" in rows[1] and ">suite<" not in "".join(rows)
    plain = pd.DataFrame({"a": [1.0]})
    assert report.suite_columns(plain) is plain
