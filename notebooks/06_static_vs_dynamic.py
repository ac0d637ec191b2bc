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
# # Static vs dynamic protection: S-PACT vs PACT (C8)
#
# PACT shields each task from the *other* tasks' LBW subspaces: the shield of task t is the union
# of $V_{j,\mathrm{LBW}}$, $j \ne t$ (P4), so it changes with the set of tasks merged ("dynamic,
# mutual protection"). The static baseline S-PACT (P6) uses one shield for every task, the
# pre-trained core $V_{0,K}$ itself:
#
# $$\tilde\Delta_t^{\text{S-PACT}} = \Delta_t - \Delta_t V_{0,K} V_{0,K}^\top .$$
#
# **C8**: S-PACT gains less than PACT. Both use the same K, k and shield cap (`PactOptions()`),
# and the same α search, so the only difference is which directions are protected.
#
# Code: `pactlib.pact_filter(mode="s-pact")`, `pactlib.testbeds.run(tb, method, pact="s-pact")`.

# %% tags=["parameters"]
testbed = "lite0-8"   # a testbed (pactlib.testbeds): Lite0 on its 8-task suite
seeds = [0, 1, 2]              # claims rest on >= 3 seeds
methods = ["task_arithmetic", "tsv_m", "iso_c"]  # the three methods of C5
alpha_points = 5               # α grid points per method (book/method.md, protocol)
val_limit = 100                # validation images per task for the α search (CPU time)
test_limit = 300               # test images per task (one image = 0.33 points)

# %%
from pactlib import testbeds
from pactlib.book import chapters, plotting, records, report, study

P = chapters.StaticVsDynamic.check(globals())
suite = testbeds.suite_of(testbed)  # the records' label of the task list ("8" for lite0-8)

# %% tags=["compute"]
from tqdm.auto import tqdm

recs = []
for seed in tqdm(seeds, desc="seeds"):
    tb = testbeds.load(testbed, seed, val_limit=val_limit, test_limit=test_limit)
    for method in tqdm(methods, desc=f"seed {seed}", leave=False):
        for mode in (None, "s-pact", "pact"):
            recs.append(testbeds.run(tb, method, pact=mode, alphas=testbeds.alpha_grid(method, alpha_points)))
records.write_records(records.records_path("06_static_vs_dynamic"), recs, replace=True)

# %%
frame = records.records_frame(records.records_path("06_static_vs_dynamic"))
plotting.table(report.main_table(study.summarize(frame, by=("method", "suite")), suites=[suite]),
               chapter=6, number=1, paper="Tab. 4",
               caption="Absolute (normalized) mean test accuracy, %, plain vs S-PACT vs PACT.")

# %%
with plotting.figure("spact-vs-pact", chapter=6, number=1, size="wide", paper="Tab. 4",
                     caption="Gain in mean normalized test accuracy over the plain method (points): "
                             "static shield (S-PACT) vs dynamic shields (PACT). Bars: mean over seeds; "
                             "dots: one seed each.") as (fig, ax):
    report.plot_mode_gains(frame, methods, suite=suite, modes=("s-pact", "pact"), ax=ax)

# %% [markdown]
# How much each filter removes tells part of the story. S-PACT deletes every task's component
# along the core $V_{0,K}$, a tenth of each layer's input directions. PACT's shield for task t is
# the union of the *other* tasks' LBW subspaces. Each of them is almost the whole core, turned
# away from its own task's active directions (chapter 4), so together they can span more
# directions than the core (the cap is half the input space). The filter's records say how much
# of each task vector's energy (matrix layers) each mode removes, and which α the search then
# picks:

# %%
filt = frame[frame["pact"].notna()]
for mode, g in filt.groupby("pact"):
    print(f"{mode.upper()}: removes {100 * g['removed_energy'].mean():.0f} % of the "
          f"task vectors' energy (mean over layers, tasks, methods and seeds); cap binding in "
          f"{100 * g['cap_binding_rate'].mean():.0f} % of the shields; mean α "
          + ", ".join(f"{report.pretty(b)} {a:.2f}" for b, a in g.groupby("base")["alpha"].mean().items()))
plain = frame[frame["pact"].isna() & frame["method"].isin(methods)].groupby("method")["alpha"].mean()
print("plain methods, mean α: " + ", ".join(f"{report.pretty(m)} {a:.2f}" for m, a in plain.items()))

# %% [markdown]
# A filter that removes more of each task vector leaves the α search less to scale, and the
# search can answer with a larger α. Removing more is not in itself a loss: what decides C8 is
# whether what PACT keeps is worth more to the merge than what S-PACT keeps, which the verdict
# below grades on the test examples.

# %% [markdown]
# ## Verdict
#
# C8 has one condition per method: gain(PACT) − gain(S-PACT) > 0, which is PACT-M − S-PACT-M, a
# paired contrast of the two filtered merges on the same test examples and seeds, graded by
# {ref}`the verdict rule <method-verdict-rule>`.

# %%
v = report.static_vs_dynamic_verdict(frame, methods=methods, suite=suite)
plotting.verdict("C8", v)

# %%
from IPython.display import Markdown, display

display(Markdown(f"**What this means.** {report.reading(v)}"))
