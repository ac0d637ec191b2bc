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
# Code: `pactlib.pact_filter(mode="s-pact")`, `pactlib.study.Testbed.run(pact="s-pact")`.

# %% tags=["parameters"]
zoo_profile = "default"        # the zoo `make zoo` builds
suite = "8"                    # the 8-task suite, where we have 3 seeds
n_tasks = 0                    # 0 = every task of the suite
seeds = [0, 1, 2]              # claims rest on >= 3 seeds
methods = ["task_arithmetic", "tsv_m", "iso_c"]  # the three methods of C5
alpha_points = 5               # α grid points per method (method.md §5 ranges)
val_limit = 100                # validation images per task for the α search (CPU time)
test_limit = 300               # test images per task (one image = 0.33 points)

# %%
from pactlib import params, plotting, records, report, study

P = params.check(
    globals(), zoo_profile=params.one_of(*study.PROFILES), suite=params.one_of("8", "14", "20"),
    n_tasks=params.at_least(0), seeds=params.each(params.at_least(0)),
    methods=params.each(params.one_of("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")),
    alpha_points=params.at_least(2), val_limit=params.at_least(8), test_limit=params.at_least(8),
)

# %%
from tqdm.auto import tqdm

recs = []
for seed in tqdm(seeds, desc="seeds"):
    tb = study.ensure_testbed(zoo_profile, suite, seed, n_tasks=n_tasks, val_limit=val_limit, test_limit=test_limit)
    for method in tqdm(methods, desc=f"seed {seed}", leave=False):
        for mode in (None, "s-pact", "pact"):
            recs.append(tb.run(method, pact=mode, alphas=study.grid(method, alpha_points)))
path = records.records_path("06_static_vs_dynamic")
records.write_records(path, recs, replace=True)
frame = records.records_frame(path)

# %%
plotting.table(report.main_table(study.summarize(frame, by=("method", "suite")), suites=[suite]),
               chapter=6, number=1, paper="Tab. 4",
               caption="Absolute (normalized) mean test accuracy, %, plain vs S-PACT vs PACT.")

# %%
with plotting.figure("spact-vs-pact", chapter=6, number=2, size="wide", paper="Tab. 4",
                     caption="Gain in mean normalized test accuracy over the plain method (points): "
                             "static shield (S-PACT) vs dynamic shields (PACT). Ticks: seeds.") as (fig, ax):
    report.plot_mode_gains(frame, methods, suite=suite, modes=("s-pact", "pact"), ax=ax)

# %% [markdown]
# How much each filter removes tells part of the story: S-PACT deletes every task's component
# along the whole core, PACT only the part of the core that *other* tasks leave untouched.

# %%
v = report.static_vs_dynamic_verdict(frame, methods=methods, suite=suite)
plotting.verdict("C8", v["status"], v["evidence"])
