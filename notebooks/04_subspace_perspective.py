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
# # The subspace perspective (C4)
#
# Chapter 3 looked for load-bearing walls among single weights. PACT itself works with
# subspaces: for each matrix layer $W:\mathbb{R}^n \to \mathbb{R}^m$ it asks which input
# directions the pre-trained model relies on and the fine-tuning of task t left alone. This
# chapter measures those subspaces on the testbed's backbone and tests whether they matter:
#
# - **C4** (causal, subspace): removing $V_{t,\mathrm{LBW}}$ from the layers of θt
#   (W → W − W V Vᵀ) hurts task t far more than removing a random subspace of the same
#   dimension, drawn in $\mathbb{R}^n$ or in the orthogonal complement of $V_{t,k}$.
#
# Code: `pactlib.pact.layer_subspaces` (P1–P3), `pactlib.causal.ablate_subspaces` and
# `random_basis`, glued together in `pactlib.book.experiments.subspace`.

# %% tags=["parameters"]
testbed = "lite0-8"   # a testbed (pactlib.testbeds): Lite0 on its 8-task suite; the eight tasks of the first suite
seeds = [0, 1, 2]        # three fine-tuning seeds: claims rest on >= 3
draws = 2                # random subspaces per control and task: enough to see the controls' spread
strengths = [0.25, 1.0]  # γ of W − γ W V Vᵀ: 1 = removal (the claim); 0.25 = a smaller dose
margin = 0.02            # "far more": the LBW drop must beat every random draw by 2 accuracy points
val_limit = 16           # validation examples per task: loaded with the testbed, not used here
test_limit = 200         # test examples per task behind every accuracy here (one example = 100 / test_limit points)

# %%
from pactlib import testbeds
from pactlib.book import chapters, plotting, records
from pactlib.book.experiments import subspace

P = chapters.SubspacePerspective.check(globals())
suite = testbeds.suite_of(testbed)  # the records' label of the task list ("8" for lite0-8)
path = records.records_path("04_subspace_perspective")  # the compute cells write here; the other cells read it

# %% [markdown]
# ## Three subspaces per layer (P1–P3)
#
# Every subspace lives in the layer's input space $\mathbb{R}^n$ and is given by an orthonormal
# basis.
#
# - The **pre-trained core** $V_{0,K}$: the top-K right singular vectors of W0 (P1), the input
#   directions the pre-trained layer amplifies most.
# - The **active subspace** $V_{t,k}$: the top-k right singular vectors of the update Δt (P2),
#   the directions task t's fine-tuning used.
# - The **load-bearing-wall subspace** $V_{t,\mathrm{LBW}}$ (P3): what is left of the core once
#   the active directions are projected out,
#
# $$A = (I - V_{t,k}V_{t,k}^\top)\,V_{0,K} = Q\,\Sigma\,R^\top,\qquad V_{t,\mathrm{LBW}} = \{\,Q_{:,i} : \sigma_i \ge \tau\,\}.$$
#
# The survival value σi ∈ [0, 1] says how much of a core direction lies outside $V_{t,k}$: 1 if
# the fine-tuning never used it, 0 if it lies inside $V_{t,k}$. Directions with σi < τ are
# dropped rather than renormalised. K, k and τ are PACT's defaults (`PactOptions()`, set by a first round of chapter 11's sweep):

# %%
from pactlib.pact import PactOptions

opts = PactOptions()
print(f"K = {opts.core_frac:g} × the layer's rank (core_frac), k = {opts.active_frac:g} × the rank (active_frac), "
      f"τ = {opts.lbw_tol:g} (lbw_tol); SVDs: {opts.svd}.")

# %% [markdown]
# We compute the three subspaces for every matrix layer of the testbed's backbone (on Lite0
# its pointwise convolutions, on MiniLM the linear maps of its attention and MLP blocks), every
# task and every seed. Figure 4.1 gives their number.

# %% tags=["compute"]
from tqdm.auto import tqdm

beds, subs, recs = {}, {}, []
for seed in tqdm(seeds, desc="seeds"):
    beds[seed] = tb = testbeds.load(testbed, seed, val_limit=val_limit,
                                           test_limit=test_limit)
    subs[seed] = subspace.subspaces_by_layer(tb.pretrained, tb.task_vectors(), options=opts, rule=tb.rule)
    recs += subspace.dimension_records(tb.pretrained, subs[seed], tb.tasks, tol=opts.lbw_tol, params=P, seed=seed,
                                       rule=tb.rule, suite=suite)
records.write_records(path, recs, replace=True);

# %%
frame = records.records_frame(path)
dims = frame[frame["method"] == "dimensions"]
with plotting.figure("lbw-dimensions", chapter=4, number=1, size="wide", ncols=2,
                     caption=f"Subspaces of the backbone's {dims[dims['seed'] == seeds[0]]['key'].nunique()} matrix layers, input to output. Left: input "
                             "dimension n, core rank K, active rank k and LBW rank (mean over tasks and "
                             "seeds; band: smallest to largest task); lines that coincide are drawn on top of "
                             "each other (K = k when both are the same fraction of the rank). Right: mean "
                             "survival value σ of the "
                             "core directions, the share of the core kept in the LBW (σ ≥ τ), and the share "
                             "of W0's energy that the core holds.") as (fig, axes):
    subspace.plot_dimensions(frame, axes=axes)

# %%
keep = dims["metrics.lbw_rank"] / dims["metrics.K"]
print(f"LBW rank / K: mean {keep.mean():.2f}, min {keep.min():.2f} over {len(dims)} (layer, task) pairs; "
      f"the core holds {100 * dims.groupby('depth')['metrics.core_energy'].first().mean():.0f} % of W0's energy "
      f"on average per layer")

# %% [markdown]
# The ratio r_LBW / K says how much of the core survives in the LBW. Where the active subspace
# of a task overlaps the core, survival values fall below τ and the LBW shrinks; a ratio of 1
# everywhere means that the few directions each fine-tuning used (k is 5 % of the rank, K is
# 10 %) lie almost orthogonal to the core. The LBW is then the whole pre-trained core, and C4 becomes a
# test of the core itself, for every task alike.
#
# ## Removing the LBW subspace from θt (C4)
#
# For task t we remove a subspace V from the input side of **every** matrix layer of its own
# fine-tuned model, W → W − W V Vᵀ, and measure task t's test accuracy. Three conditions have,
# layer by layer, the dimension r of that task's LBW:
#
# 1. V = $V_{t,\mathrm{LBW}}$;
# 2. a random r-dimensional subspace of $\mathbb{R}^n$ (the claim's first control);
# 3. a random r-dimensional subspace of the orthogonal complement of $V_{t,k}$ (the second
#    control: like the LBW, it avoids the directions the task used).
#
# A fourth control is ours. The LBW is built from the core, the directions in which W0 is
# largest, so removing it takes away far more of the weights' energy ‖W V‖²/‖W‖² than r random
# directions do, and a large drop could just say "removing large weights hurts". So we also
# remove, in every layer, a random subspace matched in *energy* instead of dimension:
#
# 4. if the LBW holds the share e of the layer's energy, a random subspace of $\mathbb{R}^n$ of
#    dimension round(e·n), which removes e of the energy in expectation, spread over random
#    directions.
#
# If the LBW hurts more than that, its directions matter beyond their energy. Each random
# condition gets `draws` draws; the overlap column below (mean squared cosine between the
# removed subspace and the LBW) shows how far each control is from the LBW.
#
# **Strength.** A network whose weights lose a whole subspace in every layer at once may simply
# collapse, whatever the subspace; every condition would then sit at chance, and the comparison
# would have no resolution. On Lite0 nothing corrects for the change: its BatchNorm layers keep
# the running statistics of θt. MiniLM's LayerNorms at least renormalise each token. So besides
# the full removal of the claim (γ = 1) we also shrink the component, W → W − γ W V Vᵀ with
# γ = 0.25, a smaller dose. Which dose separates the conditions depends on the network: Tables 4.2 and 4.3
# and the lines under them show where the drops land on this testbed. Removing a fraction γ of the
# component takes away the share 1 − (1 − γ)² of its energy (0.44 for γ = 0.25).

# %% tags=["compute"]
recs = []
for seed, tb in tqdm(beds.items(), desc="seeds"):
    for t in tqdm(tb.tasks, desc=f"ablations, seed {seed}", leave=False):
        recs += subspace.ablation_records(tb, t, subs[seed], draws=draws, seed=seed, strengths=strengths, params=P,
                                          rule=tb.rule, suite=suite)
records.write_records(path, recs);

# %% [markdown]
# Every ablated model is scored on the same test examples as θt and keeps which of them it got
# right, so each drop, and each difference between two conditions' drops, is a paired
# comparison with a 95 % interval: a paired bootstrap over the test examples plus, with three
# seeds or more, the spread over seeds ({ref}`book/method.md <method-intervals>`).

# %%
from pactlib.book.intervals import NO_OUTCOMES
from pactlib.book.experiments.paired import MissingOutcomes

frame = records.records_frame(path)
try:
    per_task = subspace.contrasts(frame, by_task=True)
except MissingOutcomes:
    per_task = None
    print(f"No intervals: {NO_OUTCOMES}.")
with plotting.figure("ablation-drops", chapter=4, number=2, size=(9.0, 2.9 * len(strengths)), nrows=len(strengths),
                     squeeze=False, paper="Fig. 5",
                     caption="Drop in task t's test accuracy (points) when a subspace is ablated from every matrix "
                             "layer of θt (W → W − γ W V Vᵀ): the LBW subspace, two random controls of the same "
                             "dimension and a random control removing as much energy. Bars: means; dots: single "
                             "draws and seeds; black lines: 95 % intervals of the paired drop from θt.") as (fig, axes):
    for ax, gamma in zip(axes[:, 0], strengths):
        subspace.plot_drops(frame, ax=ax, strength=gamma, errors=per_task)

# %%
# the conditions as plain text: the tables are not typeset as mathematics
plain = {subspace.LABELS[c]: text for c, text in subspace.PLAIN.items()}
plotting.table(subspace.drop_table(frame).rename(columns=plain), chapter=4, number=1, floatfmt="{:.1f}",
               caption="Accuracy drop (points) per ablation strength γ, task and condition; means over draws and "
                       "seeds.")

# %%
if per_task is not None:
    plotting.table(subspace.contrast_table(frame), chapter=4, number=2,
                   caption="Per strength γ and condition, means over tasks: the drop in test accuracy from θt and "
                           "the LBW's drop minus the condition's, in points with 95 % intervals (paired over the "
                           "same test examples, draws averaged per seed), and the seeds and test examples per "
                           "task behind them.")

# %%
summary = subspace.condition_summary(frame)
plotting.table(summary.rename(index=plain), chapter=4, number=3, floatfmt="{:.1f}",
               caption="Per strength γ and condition, means over tasks, draws and seeds: accuracy drop (points), "
                       "share of the weight energy inside the ablated subspace and share removed (%, pooled over "
                       "the layers), mean per-layer share (%), overlap of the ablated subspace with the LBW (mean "
                       "squared cosine of the principal angles, %) and removed dimensions summed over the layers.")
left = 100 * frame[frame["condition"].notna()].groupby(["strength", "condition"])["metrics.acc"].mean()
for gamma, rows in summary["drop (points)"].groupby(level="γ", sort=False):
    drops = rows.droplevel("γ")
    lbw = next(c for c in drops.index if "LBW" in c)
    acc = left.xs(float(gamma), level="strength")
    print(f"γ = {gamma}: drop {drops[lbw]:.1f} points with the LBW removed, {drops.drop(lbw).min():.1f} to "
          f"{drops.drop(lbw).max():.1f} with the random controls; mean accuracy left {acc['lbw']:.1f} % and "
          f"{acc.drop('lbw').min():.1f} to {acc.drop('lbw').max():.1f} %")

# %%
with plotting.figure("ablation-energy", chapter=4, number=3,
                     size="wide", caption="Accuracy drop against the share of weight energy each ablation "
                     "removes, one point per task, condition, draw and strength (circles γ = 0.25, squares "
                     "γ = 1 with the default strengths).") as (fig, ax):
    subspace.plot_energy(frame, ax=ax)

# %% [markdown]
# Figure 4.3 separates the two explanations. If the drop were a matter of energy alone, all
# points would lie on one rising curve whatever their colour. LBW points above the
# energy-matched points (same energy on the x axis) would mean that the LBW directions matter
# beyond their energy.
#
# ## Verdict
#
# **How C4 is graded**, at the claim's operation (γ = 1, the subspace removed; the smaller dose
# is shown above, not graded), on the mean over tasks: for each control of the same dimension,
# drop(V_LBW) − drop(control) must exceed `margin` ("far more"), a paired contrast on the same
# test examples, graded by the {ref}`verdict rule <method-verdict-rule>`.

# %%
v = subspace.c4_verdict(frame, margin=margin)
plotting.verdict("C4", v)

# %%
from IPython.display import Markdown, display

from pactlib.book import report
from pactlib.book.verdicts import CONTRADICTED, INCONCLUSIVE, PARTLY, REPRODUCED

display(Markdown(report.c4_closeness(frame, margin=margin)["text"]))
MEANING = {
    REPRODUCED: "Removing the LBW subspace costs task t far more accuracy than removing random subspaces of the same "
                "dimension, beyond the sampling error: the subspace walls matter causally on this testbed. Whether "
                "that is more than their share of the weights' energy is what the energy-matched control above says.",
    PARTLY: "Against one control of the same dimension the LBW's removal hurts far more beyond the error; against "
            "the other the test sets cannot yet decide.",
    CONTRADICTED: "Against at least one control of the same dimension, removing the LBW subspace does not hurt far "
                  "more, beyond the sampling error: the subspace walls are not singled out by their removal here.",
    INCONCLUSIVE: "Neither comparison can be told apart from the margin with these test sets and seeds.",
}
display(Markdown(MEANING.get(v["status"], f"C4 could not be graded: {v['evidence']}")))
