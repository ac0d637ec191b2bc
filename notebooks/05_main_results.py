# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Main results (C5–C7)
#
# We merge the fine-tuned models of each suite with the five base methods — Task Arithmetic
# (M1), TIES (M2), TSV-M (M3), Iso-C (M4), Iso-CTS (M5) — once on the raw task vectors and once
# after the PACT filter (P4–P5). For every merge, α is chosen on the validation split by mean
# normalized accuracy over the method's grid ({ref}`the protocol <method-protocol>`), then the test split is scored.
#
# Three claims are at stake:
#
# - **C5**: PACT improves TA, TSV-M and Iso-C, in absolute and normalized accuracy.
# - **C6**: PACT-Iso-C is the best method in every setting.
# - **C7**: the gain of PACT grows with the number of tasks T.
#
# Code: `pactlib.testbeds.run` (merge → `pactlib.eval.select_alpha`), `pactlib.merged_update`,
# `pactlib.pact_filter`.

# %% tags=["parameters"]
testbeds = ["lite0-8", "lite0-14", "lite0-20"]  # the paper's three task counts (pactlib.testbeds names)
seeds = [0, 1, 2]              # claims rest on >= 3 fine-tuning seeds on the first testbed
seeds_large = [0]              # the other testbeds' rows: one seed (CPU time)
methods = ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"]  # M1–M5
alpha_points = 5               # geometric α values over each method's grid (book/method.md, protocol)
val_limit = 100                # validation images per task for the α search (CPU time)
test_limit = 300               # test images per task (one image = 0.33 points)

# %%
from pactlib import merges
from pactlib.book import chapters, plotting, records, report, study
from pactlib.testbeds import suite_of

P = chapters.MainResults.check(globals())
suites = [suite_of(name) for name in testbeds]  # the records' labels ("8" for lite0-8)

# %% [markdown]
# ## Run every merge
#
# One testbed per (suite, seed); each method runs plain and with PACT at the default options
# (`PactOptions()`; chapter 11 says how they were set and sweeps them again). The first suite
# runs on every seed of `seeds`, the larger suites on `seeds_large` only, to save CPU time.
# Progress shows one line per merge.

# %% tags=["compute"]
from tqdm.auto import tqdm

from pactlib.testbeds import alpha_grid, load, reference_records, run

runs = [(name, seed) for i, name in enumerate(testbeds) for seed in (seeds if i == 0 else seeds_large)]
recs = []
for name, seed in tqdm(runs, desc="testbeds"):
    tb = load(name, seed, val_limit=val_limit, test_limit=test_limit)
    for method in tqdm(methods, desc=f"{name} seed {seed}", leave=False):
        for pact in (None, "pact"):
            recs.append(run(tb, method, pact=pact, alphas=alpha_grid(method, alpha_points)))
    recs += reference_records(tb, pact=None)  # zero-shot θ0 and the fine-tuned models
records.write_records(records.records_path("05_main_results"), recs, replace=True)

# %% [markdown]
# ## The table
#
# Mean test accuracy over tasks, absolute and (normalized), in percent; mean ± standard
# deviation over the fine-tuning seeds of each row (seed counts in the last columns).
#
# The protocol asks for at least 3 seeds. Only the first suite runs on all of `seeds`; the
# others run on `seeds_large`, and the line under Table 5.1 says which suites rest on one seed.
# A row with one seed is a single run: no ±, no estimate of the spread between seeds. Those rows
# enter the verdicts on C5–C7 all the same, and each verdict's evidence names the suites that
# rest on one seed.

# %%
frame = records.records_frame(records.records_path("05_main_results"))
summary = study.summarize(frame, by=("method", "suite"))
table = report.main_table(summary, suites=suites)
plotting.table(table, chapter=5, number=1, paper="Tab. 1",
               caption="Absolute (normalized) mean test accuracy, %, mean ± std over seeds.")
print("rows of Table 5.1: " + report.seeds_text(report.seed_counts(frame, suites=suites)))

# %%
with plotting.figure("pact-gain", chapter=5, number=1, size="wide", paper="Tab. 1",
                     caption="Gain of PACT in mean normalized test accuracy (points) per base method "
                             "and suite; bars: mean over seeds, dots: one seed each.") as (fig, ax):
    report.plot_gains(frame, methods, suites, ax=ax)

# %% [markdown]
# The bars are means over seeds; the error bars are 95 % intervals ({ref}`how <method-intervals>`):
# a paired bootstrap over the test images, plus the spread over seeds where there are three.
# Table 5.2 gives the same gains in numbers.

# %%
plotting.table(report.gain_table(frame, methods, suites), chapter=5, number=2,
               caption="Gain of PACT in mean normalized test accuracy (points) with its 95 % interval, per base "
                       "method and suite.")

# %% [markdown]
# ## Per task (8-task suite)

# %%
plotting.table(report.per_task_table(frame, suite=suites[0], methods=methods), chapter=5, number=3,
               floatfmt="{:.1f}", caption=f"Test accuracy per task on the {suites[0]}-task suite (%, mean over seeds).")

# %% [markdown]
# ## How α is searched
#
# Every number above depends on the α picked on validation. The paper steps through each
# method's range at 0.05 (TA, TIES) or 0.1 (TSV-M, Iso-C, Iso-CTS): 20 to 30 evaluations of the
# validation split per merge, which is most of a merge's cost on a CPU. We use 5 geometrically
# spaced points instead (a constant ratio between neighbours, so more of them at small α, where
# TA lands with many tasks), widened past an edge when the best α sits there. Is that enough?
# `bench/bench_alpha_search.py` ran 14 merges on the Lite0 testbed (8 tasks: all ten; 20 tasks:
# TA and Iso-C, plain and PACT; seed 0) with four searches: the full grid; 5 evenly spaced points; our 5 geometric
# points; and 4 evenly spaced points refined twice around the best one by geometric midpoints
# (`select_alpha(refine=2)`). The records are in `book/data/alpha_search.jsonl`.

# %% tags=["bench-data"]
from pactlib.book import plotting, records, report

alpha_search = records.records_frame(plotting.repo_path("book/data/alpha_search.jsonl"))
plotting.table(report.alpha_search_table(alpha_search), chapter=5, number=4, floatfmt="{:.2f}",
               caption="α searches against the full grid of the protocol (book/method.md) on the same merges: validation "
                       "evaluations per merge, and the difference in mean normalized accuracy (points) on "
                       "validation (the score searched) and on test.")

# %% [markdown]
# The five-point searches cost a quarter of the full grid. On average none of them loses on
# test: each lands within a point of the full grid on test in mean absolute terms, and
# slightly above it in the mean. Refinement finds the best validation scores, since its
# midpoints fall between the grid's steps, but not better test scores. The gaps are the noise
# of choosing α on a small validation split per task, and a finer search cannot remove it. The
# largest one is printed below: there the full grid's best validation α sat just inside its
# upper edge, so it was never widened, while the five-point searches widened past 3.0 and
# found a better α on validation and on test. PACT's merges often want an α above the plain
# method's range, because the filter removes part of each task vector: widening matters.
#
# Between the two five-point grids the test scores do not decide. The geometric one loses less
# validation score in the worst case, and in chapter 2 it is the one that finds Task
# Arithmetic's small α at 14 and 20 tasks. So the book uses 5 geometric points
# (`pactlib.testbeds.GRID_SPACING = "geometric"`, `REFINE = 0`).

# %% tags=["bench-data"]
gaps = report.alpha_search_gaps(alpha_search)
worst = gaps.loc[gaps["Δ test"].abs().idxmax()]
print(f"largest test gap: {worst['method']} on {worst['suite']} tasks, {worst['search']} picks α = {worst['alpha']:.3g}, "
      f"the full grid α = {worst['alpha_ref']:.3g}: {worst['Δ test']:+.1f} points on test")
geo8 = alpha_search.query("search == 'geo5' and suite == '8'").set_index("method")["alpha"]
print("α picked by the geometric grid on 8 tasks, plain → PACT: "
      + ", ".join(f"{m} {geo8[m]:.3g} → {geo8['pact-' + m]:.3g}" for m in ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")))

# %% [markdown]
# ## Rank-deficient layers
#
# TSV-M, Iso-C and Iso-CTS decompose matrices by SVD. The PACT filter removes every direction
# that lies in all the tasks' shields from every task, so the sum of the filtered task vectors is
# exactly rank-deficient (S-PACT, which uses one shield for all, even more so). LoRA task vectors
# have rank at most T·r without any filter. On such a matrix the SVD pairs the null directions
# arbitrarily: the pairing changes with the order of the tasks or with float noise. The reference
# code flattens (Iso-C) or stacks and orthogonalises (TSV-M, Iso-CTS) *every* singular triplet,
# so it writes merged weight into those arbitrary directions, and the merge then depends on the
# task order. That convention is `null_space="literal"`.
#
# `null_space="drop"` keeps only the directions the matrix's values resolve
# (`pactlib.linalg.resolved_rank`). The null directions come from algebra (a projection, a
# rank-r product), but the task vectors are stored in float32, so they are not zero: they sit at
# the rounding level of the stored values. `bench/bench_null_space_rank.py` measured them
# (records in `book/data/rank_decision.jsonl`): computed in float64, the null singular values
# of PACT-filtered, S-PACT and LoRA updates and sums lie between about 5e-9 and 2e-7 of the
# largest, never near float64's 1e-16, so float64's tolerance alone would keep them all. Measured
# in units of eps·‖X‖_F·(1/√m + 1/√n), the typical size of a rounding error in every entry, they
# stay below 2, for every shape from 64 x 48 to 3072 x 768, while the smallest real directions
# of the testbed's trained updates lie hundreds of units above (down to 3e-5 of the largest
# singular value), and a spectrum running to 1e-6 still reaches 20 units. So a singular
# value counts when it exceeds 8 of these units (and float64's own tolerance, which matters
# for float64 inputs only), computed in float64 from the stored values. Two steps keep the
# null directions at that level: the PACT filter projects twice (one pass leaves a shield
# component at the rounding level of the *unfiltered* update, thousands of units when the filter
# removes most of it), and Iso-CTS takes the sum's SVD and its residuals in float64 (a float32
# SVD's error in the common subspace would leak part of each LoRA task into its residual). A
# tolerance of max(m, n)·eps times the largest value (`torch.linalg.matrix_rank`'s) would cut real
# directions of full-rank layers: 1.2e-4 of the largest at 1024 x 1024, where trained sums reach
# 2e-5. This one keeps every direction float32 resolves, so on full-rank layers the two
# conventions give the same merge, also when the spectrum runs down to 1e-6 (tested). Iso-C
# spreads the sum's nuclear norm evenly over the directions the tasks span and leaves the rest
# at zero; TSV-M and Iso-CTS drop null triplets before stacking. The merge is then a function of
# the *set* of task vectors: the tests check it for every method, ± PACT / S-PACT, full and LoRA,
# over random task orders and thread counts, in memory and streamed.
#
# Which should be the default? `bench/bench_null_space.py` ran each rank-deficient merge of
# this chapter, of chapter 6 (S-PACT) and of chapter 9 (LoRA) both ways, with the book's α
# search, and the literal convention a second time with the task order reversed.

# %% tags=["bench-data"]
from pactlib import merges

null_space = records.records_frame(plotting.repo_path("book/data/null_space.jsonl"))
plotting.table(report.null_space_table(null_space), chapter=5, number=5, floatfmt="{:.1f}",
               caption="The two conventions for rank-deficient layers on the same merges (mean over seeds): "
                       "validation and test normalized accuracy (%), their differences (drop − literal, points), "
                       "and the literal convention's test change when only the task order is reversed (points).")
choice = report.null_space_choice(null_space)
default = merges.get("iso_c").params["null_space"]
print(f"{choice['merges']} merges: 'drop' scores higher on validation in {choice['drop_better']}, 'literal' in "
      f"{choice['literal_better']}; mean difference {choice['mean_delta_val']:+.2f} points on validation, "
      f"{choice['mean_delta_test']:+.2f} on test. Validation picks {choice['choice']!r}; pactlib's default is {default!r}.")
order = report.null_space_table(null_space)["order effect"]
print(f"literal convention, task order reversed: test accuracy moves by up to {order.max():.1f} points "
      f"({order.idxmax()[2]}, {order.idxmax()[0]} task vectors); 'drop' gives the same merge for any order.")

# %% [markdown]
# The records are one seed of the 8-task suite (full and LoRA fine-tunes), so read the rows as
# cases, not as estimates. The pattern is what matters. Dropping the null directions helps most
# where the sum is most rank-deficient: LoRA merges and Iso-C / Iso-CTS, whose literal form pours
# the mean singular value into every arbitrary direction. It changes little for TSV-M, which
# keeps each triplet's own value (a zero stays a zero and only the polar factors move). The
# literal convention also makes a merge depend on the order in which the tasks are listed, by
# up to the amount printed above. So `null_space="drop"` is the default; `null_space="literal"`
# reproduces the reference code.

# %% [markdown]
# ## Verdicts

# %%
v = report.main_verdicts(frame, suites=suites)
for claim in ("C5", "C6", "C7"):
    plotting.verdict(claim, v[claim])

# %% [markdown]
# Each verdict follows {ref}`the rule <method-verdict-rule>`: a gain counts only when its whole
# 95 % interval is above zero. An *inconclusive* row is not a loss: its interval spans zero, and
# the last column says how much more test data or how many seeds would decide it at the effect
# seen. A gain measured on one seed carries no seed spread, so its interval is narrower than the
# truth.

# %% [markdown]
# ## What these numbers mean

# %%
from IPython.display import Markdown, display

display(Markdown("\n\n".join(f"**{claim}.** {report.reading(v[claim])}" for claim in ("C5", "C6", "C7"))))
