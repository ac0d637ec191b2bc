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
# # LoRA merging (C11)
#
# With LoRA the pre-trained weights stay frozen during fine-tuning; each task learns rank-r
# adapters $B_t A_t$ on the matrix layers (on Lite0 its pointwise convolutions, on MiniLM the
# linear maps of its attention and MLP blocks), and its task vector is
#
# $$\Delta_t = s\,B_t A_t ,\qquad s = \alpha_{\mathrm{LoRA}}/r ,$$
#
# with the LoRA scale s ({ref}`notation <method-spec>`: $\alpha_{\mathrm{LoRA}}$ is LoRA's own
# scaling hyperparameter, not the merge's α). Δt has rank ≤ r per layer and is zero everywhere
# else. The LBW argument still applies: whatever the task relies on in θ0 outside its adapter's
# row space is exposed to the other tasks' adapters.
#
# **C11**: PACT still improves the merges of LoRA task vectors. Following {ref}`the protocol <method-protocol>`, every
# LoRA merge searches α on one grid from 0.1 to `alpha_max`, widened when the best α lies on
# its edge; a chosen α still on the edge is flagged in the α table, and the lines under it say
# which searches widened the grid. At paper scale, isotropic merges of LoRA task vectors are
# reported to need a much larger α than with full fine-tuning (chapter 12, caveats); the same
# lines give the α each merge chose here.
#
# Code: `pactlib.lora.lora_task_vector`, `pactlib.testbeds.load(testbed, seed, kind="lora")`.

# %% tags=["parameters"]
testbed = "lite0-8"   # a testbed (pactlib.testbeds): Lite0 on its 8-task suite
seeds = [0, 1, 2]              # claims rest on >= 3 seeds
methods = ["task_arithmetic", "tsv_m", "iso_c"]  # the three methods of C5
alpha_points = 5               # points on the 0.1..alpha_max grid
alpha_max = 3.0                # upper end of the LoRA α grid (book/method.md, protocol)
val_limit = 100                # validation examples per task for the α search (CPU time)
test_limit = 300               # test examples per task (at 300, one example = 0.33 points of a task's accuracy)

# %%
from pactlib import testbeds
from pactlib.book import chapters, plotting, records, report, study

P = chapters.Lora.check(globals())
suite = testbeds.suite_of(testbed)  # the records' label of the task list ("8" for lite0-8)

# %% tags=["compute"]
from tqdm.auto import tqdm

recs = []
for seed in tqdm(seeds, desc="seeds"):
    tb = testbeds.load(testbed, seed, kind="lora", val_limit=val_limit,
                              test_limit=test_limit)
    for method in tqdm(methods, desc=f"seed {seed}", leave=False):
        for mode in (None, "pact"):
            recs.append(testbeds.run(tb, method, pact=mode, alphas=testbeds.alpha_grid(method, alpha_points, lo=0.1, hi=alpha_max)))
    recs += testbeds.reference_records(tb, pact=None, kind="lora")  # zero-shot θ0 and the LoRA fine-tunes
records.write_records(records.records_path("09_lora"), recs, replace=True)

# %%
frame = records.records_frame(records.records_path("09_lora"))
plotting.table(report.main_table(study.summarize(frame, by=("method", "suite")), suites=[suite]),
               chapter=9, number=1, paper="Tab. 3",
               caption="LoRA task vectors: absolute (normalized) mean test accuracy, %, mean ± std over seeds.")

# %%
plotting.table(report.alpha_table(frame), chapter=9, number=2,
               caption="α chosen on validation per method and seed; * marks a choice on the grid's edge.")

# %%
from IPython.display import Markdown, display

display(Markdown(report.alpha_search_text(frame)))

# %%
with plotting.figure("lora-gain", chapter=9, number=1, size="wide", paper="Tab. 3",
                     caption="Gain of PACT on LoRA task vectors, mean normalized test accuracy (points). "
                             "Bars: mean over seeds; black lines: 95 % intervals (when the records keep "
                             "per-example outcomes); dots: one seed each.") as (fig, ax):
    report.plot_gains(frame, methods, [suite], ax=ax)

# %% [markdown]
# How large is a gain of a fraction of a point? Each task is scored on at most `test_limit` test
# examples, so one example more or less right moves that task's accuracy by at least
# 100/`test_limit` points. The line below sets each method's gain in mean accuracy against that
# step: a gain under one step is less than one test example per task. The error bars of
# Figure 9.1 say the same more precisely: they count how many examples the two merges disagree on.

# %%
step = 100 / test_limit  # points of one task's accuracy per test example (at least: some tasks may have fewer)
gain = report.gains(frame, base_methods=methods, suites=[suite], metric="acc").groupby("base", sort=False)["gain"].mean()
size = "; ".join(f"{report.pretty(m)} {gain[m]:+.2f} points = {gain[m] / step:+.2f} test examples per task"
                 for m in methods if m in gain.index)
print(f"One test example is {step:.2f} points of a task's accuracy. PACT's gain in mean test accuracy "
      f"(mean over tasks and seeds): {size}.")

# %% [markdown]
# ## Verdict
#
# C11 has two conditions per method, as C5 in chapter 5: the PACT gain on LoRA task vectors in
# absolute and in normalized test accuracy, each > 0, graded on its 95 % interval by
# {ref}`the verdict rule <method-verdict-rule>`.

# %%
v = report.main_verdicts(frame, suites=[suite], c5_methods=methods)["C5"]
plotting.verdict("C11", {**v, "evidence": v["evidence"].replace("PACT gain", "PACT gain on LoRA task vectors")
                         + f"; one test example is {step:.2f} points of a task's accuracy"})

# %%
display(Markdown(f"**What this means.** {report.reading(v)}"))
