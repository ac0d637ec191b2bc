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
# # The scalar-weight perspective (C1–C3)
#
# Before it argues with subspaces, the paper looks at single weights. Fine-tuning barely moves
# most entries of θ0. Are those barely-moved entries unimportant, or do some of them carry the
# task — "load-bearing walls" that the fine-tuning left in place, and that a merge then knocks
# down? Three claims are at stake:
#
# - **C1** (scalar LBW exists): sensitive entries are over-represented among barely-updated ones,
#   for every task;
# - **C2** (causal): perturbing those entries of θt by a typical update size hurts task t far
#   more than perturbing as many random entries;
# - **C3** (overwrite and restore): a merge moves those entries, and writing θt's values back
#   into the merged model recovers a measurable part of task t's loss.
#
# Code: `pactlib.fisher` (S1, S2), `pactlib.causal` (`perturb`, `random_masks_like`, `restore`),
# glued together in `pactlib.book.experiments.scalar`.

# %% tags=["parameters"]
testbed = "lite0-8"   # a testbed (pactlib.testbeds): Lite0 on its 8-task suite; every claim here is per task, eight are plenty
seeds = [0, 1, 2]               # three fine-tuning seeds: claims rest on means over >= 3 (book/method.md, protocol)
fisher_samples = 32             # N validation examples per Fisher (S1); ~0.15 s per example on CPU
empirical_fisher = False        # sample y ~ p(y|x; θt): the true Fisher (book/method.md, S1)
fisher_chunk = 64               # examples per per-sample-gradient call: memory only (~64 float32 model copies)
quantile = 0.1                  # U_t, H_t = lowest / top 10 % (book/method.md, scalar view)
touched_only = True             # draw U_t, H_t among entries with Δt ≠ 0 (see "A tie at zero" below)
perturb_scales = [1.0, 30.0]    # C2 sizes in units of the median |Δt|: the claim's size, then 30x
draws = 1                       # sign / entry draws per condition in C2 and C3 (CPU time)
alpha_points = 6                # α grid points for Task Arithmetic in C3 (0.05 … 1.0, widened at an edge)
val_limit = 64                  # validation examples per task: the Fisher examples and the α search
test_limit = 128                # test examples per task for every accuracy and loss below (CPU time)

# %%
from pactlib import testbeds
from pactlib.book import chapters, plotting, records
from pactlib.book.experiments import scalar

P = chapters.ScalarPerspective.check(globals())
suite = testbeds.suite_of(testbed)  # the records' label of the task list ("8" for lite0-8)
path = records.records_path("03_scalar_perspective")  # the compute cell writes here; the other cells read it
# How the captions name the weight tensors of Figure 3.2, per testbed family: the matrix layers, the other
# weight tensors with 2+ dimensions (scalar.layer_kind: "pointwise" and "conv").
TENSOR_WORDS = {
    "lite0": ("pointwise convolutions", "other convolutions (the stem and the depthwise ones)"),
    "minilm": ("linear maps", "embedding tables"),
}.get(testbeds.check_name(testbed), ("matrix layers", "other weight tensors"))

# %% [markdown]
# ## Sensitivity and enrichment (S1, S2)
#
# For each fine-tuned model θt we estimate the diagonal Fisher on N examples of task t (S1):
#
# $$F_t = \mathbb{E}_x\,\mathbb{E}_{y\sim p(y\mid x;\theta_t)}\big[(\partial_\theta \log p(y\mid x;\theta_t))^2\big].$$
#
# The labels y are sampled from the model, so this is the true Fisher, not the empirical one.
# The examples are the first `fisher_samples` examples of the validation split (images on
# Lite0, texts on MiniLM). The entries are every trainable parameter of the backbone. On Lite0
# these are the convolution weights and the BatchNorm scales and shifts; its frozen running
# statistics are not part of θ. On MiniLM they are the embedding tables, the weights and biases
# of the linear maps, and the LayerNorm scales and shifts. The task heads are not part of θ.
#
# Then two sets of entries: U_t, the q-fraction with the smallest |Δt|, and H_t, the q-fraction
# with the largest F_t, with q = `quantile` taken over all entries at once. The enrichment (S2)
# compares their overlap with what chance would give:
#
# $$E_t = \frac{|U_t\cap H_t|}{|U_t|\,|H_t|/N_{\text{params}}}.$$
#
# E_t = 1 is chance; E_t > 1 means sensitive entries hide among the barely-updated ones. The
# scalar LBW entries of task t are U_t ∩ H_t.
#
# **A tie at zero.** In the book's two zoos a large share of the entries has Δt = 0 *exactly*
# (Table 3.1). These entries get no gradient during fine-tuning, and AdamW without weight decay
# leaves them untouched. On Lite0 they are channels that carry no gradient at this input size
# (ReLU6 units that stay off). On MiniLM they are mostly the rows of the token-embedding table
# for tokens that task t's training texts never contain. If that share exceeds q, "the lowest
# q-quantile of |Δt|" is a tie, and S2 as written picks U_t among untouched entries by their
# position in memory. Those entries have zero gradient, hence zero Fisher, so E_t collapses to about 0 for a
# reason that has nothing to do with the claim. We therefore compute E_t twice: as written, and
# over the entries the fine-tuning moved at all (Δt ≠ 0, our default `touched_only = True`). The
# LBW entries used in C2 and C3 come from the second.

# %% [markdown]
# **One pass per task.** Each measurement of this chapter needs a task's boolean masks over
# every entry of the network: U_t ∩ H_t, H_t, the population they are drawn from, and the control
# sets of C2 and C3 below. Keeping them for every (seed, task) until the last section costs
# memory in proportion to the number of tasks (about 37 GB for a ViT-B/32 on 20 tasks), so
# the cell below runs each task's whole pipeline at once: Fisher, enrichment (C1),
# perturbations (C2) and restores into the Task Arithmetic merge (C3; the merge itself is
# computed first, once per seed). Then it drops that task's masks and moves on. The sections
# below explain each measurement and read its records.

# %% tags=["compute"]
from tqdm.auto import tqdm

from pactlib.taskvector import TaskVector

recs = []
for seed in tqdm(seeds, desc="seeds"):
    tb = testbeds.load(testbed, seed, val_limit=val_limit, test_limit=test_limit)
    ta = testbeds.run(tb, "task_arithmetic", alphas=testbeds.alpha_grid("task_arithmetic", alpha_points))
    recs.append(ta)
    tvs = tb.task_vectors()  # lazy on a testbed with files (clip): read one task at a time
    merged = TaskVector.sum(tvs).apply_to(tb.pretrained, ta["alpha"])
    for t, tv in tqdm(list(zip(tb.tasks, tvs)), desc=f"tasks, seed {seed}", leave=False):
        recs += scalar.task_records(tb, t, tv, fisher_samples=fisher_samples, fisher_chunk=fisher_chunk,
                                    empirical=empirical_fisher,
                                    quantile=quantile, touched_only=touched_only, seed=seed, scales=perturb_scales,
                                    draws=draws, test_limit=test_limit, params=P, suite=suite, merged=merged,
                                    merge_fields=dict(alpha=ta["alpha"], on_edge=ta["on_edge"]))
    del tb, tvs, merged
records.write_records(path, recs, replace=True);

# %%
frame = records.records_frame(path)
enrichment = scalar.enrichment_table(frame)
if "|U∩H|, touched" in enrichment:  # a count (mean over seeds): shown as a whole number
    enrichment["|U∩H|, touched"] = enrichment["|U∩H|, touched"].round().astype("Int64")
plotting.table(enrichment, chapter=3, number=1, floatfmt="{:.3g}", formats={"E_t, all": "{:.2e}"},
               caption="Per task (mean over seeds): enrichment over all entries and over touched entries, "
                       "the share of entries with Δt = 0 and with F_t = 0, and the number of scalar LBW "
                       "entries among touched entries.")

# %%
with plotting.figure("enrichment", chapter=3, number=1, paper="Fig. 2",
                     caption=f"Enrichment E_t of high-Fisher entries among the {quantile:.0%} least-updated "
                             "entries, per task, over all entries and over touched entries: bars are means "
                             "over seeds, dots single seeds, the dashed line is chance (E = 1). Bars too "
                             "close to zero to see are given in Table 3.1.") as (fig, ax):
    scalar.plot_task_enrichment(frame, ax=ax)
    plotting.legend_outside(ax, "above")

# %% [markdown]
# The same score inside each weight tensor (quantiles taken per tensor, touched entries), for
# the weight tensors with two or more dimensions, in network order: on Lite0 the convolutions,
# on MiniLM the embedding tables and the linear maps. Red cells are tensors where sensitive and
# barely-updated entries coincide more often than chance, blue cells less often.

# %%
tensors = frame[(frame["method"] == "enrichment") & (frame["scope"] == "layer")
                & (frame["population"] == "touched")].drop_duplicates("key")
n_matrix, n_other = int((tensors["kind"] == "pointwise").sum()), int((tensors["kind"] == "conv").sum())
with plotting.figure("layer-enrichment", chapter=3, number=2, size="wide",
                     caption="log2 of the per-tensor enrichment over touched entries (mean over seeds), tasks × "
                             f"the {n_matrix + n_other} weight tensors with two or more dimensions, from input to "
                             f"output: {n_matrix} {TENSOR_WORDS[0]} (ticked) and {n_other} {TENSOR_WORDS[1]}; "
                             "0 (white) is chance.") as (fig, ax):
    fig.colorbar(scalar.plot_layer_enrichment(frame, ax=ax, population="touched"), ax=ax, label=r"$\log_2 E$")

# %% [markdown]
# **How C1 is graded.** E_t is a statistic of the checkpoints: no test examples stand behind
# it, so its uncertainty is the spread over fine-tuning seeds (a t interval over the seeds when
# there are at least three, {ref}`book/method.md <method-intervals>`). Each task is one
# condition, E_t > 1, graded by the {ref}`verdict rule <method-verdict-rule>`; the verdict box
# closes the chapter.

# %%
v1 = scalar.c1_verdict(frame, population="touched" if touched_only else "all")

# %% [markdown]
# ## Causal test: perturbing the scalar LBW entries (C2)
#
# A high Fisher says a weight matters *locally*. To see whether it matters for accuracy we add
# ±s (random signs) to the LBW entries of θt and measure task t's test accuracy and loss. The
# unit of s is the median |Δt| over the touched entries: the size of a typical fine-tuning
# update, as the claim asks. We try that size and, because a typical update turns out to be
# too small to move anything, a 30 times larger one. Two control groups get the same number of
# entries and the same ±s:
#
# - **random entries**, drawn uniformly over the same population (the paper's control);
# - **high-Fisher, updated entries**, drawn from H_t ∖ U_t. Since H_t is chosen by sensitivity,
#   the first control is easy to beat; this one asks whether being *barely updated* adds
#   anything beyond being sensitive.

# %% [markdown]
# Every perturbed model is scored on the same test examples as θt, and its record keeps which
# examples it got right. A drop, and the difference between two drops, is therefore a paired
# comparison, example by example; its 95 % interval counts the test examples (a paired
# bootstrap) and, with three seeds or more, the spread over seeds
# ({ref}`book/method.md <method-intervals>`).

# %%
from pactlib.book.intervals import NO_OUTCOMES
from pactlib.book.experiments.paired import MissingOutcomes

try:
    drops = scalar.drop_intervals(frame, "perturb")
except MissingOutcomes:
    drops = None
    print(f"No intervals: {NO_OUTCOMES}.")
small = min(perturb_scales)
with plotting.figure("perturbation", chapter=3, number=3, size="wide", paper="Fig. 3",
                     caption=f"Drop in task t's test accuracy (points) when ±{small:g}× the median "
                             "|Δt| is added to its scalar LBW entries or to as many control entries; bars: "
                             "means, dots: single seeds and draws, black lines: 95 % intervals of the "
                             "paired drop from θt.") as (fig, ax):
    scalar.plot_conditions(frame[frame["scale"] == small], "perturb", "drop", ax=ax,
                           conditions=["lbw", "random", "sensitive"],
                           errors=None if drops is None else drops[drops["scale"] == small])
    ax.set_ylabel("accuracy drop (points)")

# %%
if drops is not None:
    plotting.table(scalar.perturbation_table(frame), chapter=3, number=2, floatfmt="{:.4f}",
                   caption="Per perturbation size and condition, over all tasks: the drop in test accuracy "
                           "from θt with its 95 % interval (paired over the same test examples), the mean "
                           "increase of the test loss, and the seeds and test examples per task behind it.")

# %%
with plotting.figure("perturbation-size", chapter=3, number=4,
                     caption="Increase of task t's test loss against the perturbation size, per condition: "
                             "lines are means over tasks, dots single tasks.") as (fig, ax):
    scalar.plot_dose(frame, ax=ax)

# %% [markdown]
# **How C2 is graded**, at the claim's size (the smallest perturbation run), on the mean over
# tasks: the LBW perturbation's drop must exceed half a point, and exceed twice the drop of as
# many random entries ("much more"): drop(LBW) − 2 × drop(random) > 0, a paired contrast on the
# same test examples.

# %%
v2 = scalar.c2_verdict(frame)

# %% [markdown]
# ## Overwrite and restore (C3)
#
# We merge with Task Arithmetic (M1), θ = θ0 + α Σt Δt, with α chosen on validation by mean
# normalized accuracy ({ref}`the protocol <method-protocol>`). From task t's point of view the merge moves each entry
# by θ − θt. We compare how far it moved the LBW entries of task t with how far it moved the
# others, in absolute terms and relative to each group's own fine-tuning update |Δt|. Then we
# write θt's values back into the merged model at task t's LBW entries (`causal.restore`) and
# measure how much of the gap between the merge and θt this closes, for the loss and the
# accuracy of task t, against restoring as many control entries.

# %%
plotting.table(scalar.displacement_table(frame).rename(columns={
                   "moved_lbw": "|θ − θt|, LBW", "moved_other": "|θ − θt|, others",
                   "moved_ratio": "ratio LBW / others", "rel_moved_lbw": "÷ mean |Δt|, LBW",
                   "rel_moved_other": "÷ mean |Δt|, others", "alpha": "α"}), chapter=3, number=3, floatfmt="{:.3g}",
               formats={"|θ − θt|, LBW": "{:.2e}", "|θ − θt|, others": "{:.2e}"},
               caption="How far the Task Arithmetic merge moved each task's entries (mean over seeds): mean "
                       "|θ − θt| over the LBW entries and over all others, their ratio, each divided by the "
                       "group's mean |Δt|, and the α chosen on validation.")

# %% [markdown]
# Where α lands matters for reading this table: a small α pulls the merge back towards θ0,
# so every entry of θt loses about its own update, whatever its role.

# %%
with plotting.figure("restore", chapter=3, number=5, size="wide", paper="Fig. 4",
                     caption="Share of the loss gap between the merge and θt that restoring θt's values "
                             "closes (%), per task: at the scalar LBW entries, or at as many control "
                             "entries; dots: single seeds and draws.") as (fig, ax):
    scalar.plot_conditions(frame, "restore", "recovered_loss", ax=ax, conditions=["lbw", "random", "sensitive"])
    ax.set_ylabel("loss gap closed (%)")

# %%
from pactlib.book.intervals import Interval

if drops is not None:
    gains = scalar.drop_intervals(frame, "restore")
    gains = gains[gains["task"] == "mean"].assign(
        change=lambda d: [Interval(-r.drop, -r.hi, -r.lo, 0.0).text() for r in d.itertuples()])
    gains["condition"] = gains["condition"].map(lambda c: scalar.CONDITION_LABELS.get(c, c))
    plotting.table(gains.set_index("condition")[["change", "seeds", "examples"]].rename(columns={
                       "change": "test accuracy − θt's (points) [95 % interval]", "examples": "examples per task"}),
                   chapter=3, number=4,
                   caption="Test accuracy of the merge and of the restored merges relative to θt, mean over "
                           "tasks, with 95 % intervals paired over the same test examples: the accuracy a "
                           "restore wins back is its row minus the merge's.")

# %% [markdown]
# **How C3 is graded**, on means over tasks: the merge moved the LBW entries by more than their
# own update (a statistic of the weights: interval over seeds); restoring them closes at least
# 5 % of the loss gap, and more than restoring as many random entries (intervals over seeds: the
# records keep which examples each model got right, not each example's loss, so these two count
# the seeds' spread only); and the restore wins back test accuracy, a paired contrast on the same
# test examples.

# %%
v3 = scalar.c3_verdict(frame)

# %% [markdown]
# ## Verdicts

# %%
for claim, v in (("C1", v1), ("C2", v2), ("C3", v3)):
    plotting.verdict(claim, v)

# %%
from IPython.display import Markdown, display

from pactlib.book.verdicts import CONTRADICTED, INCONCLUSIVE, PARTLY, REPRODUCED

MEANING = {
    "C1": {REPRODUCED: "Sensitive entries are over-represented among the barely-updated ones for every task, "
                       "beyond the spread over seeds: scalar load-bearing walls exist on this testbed.",
           PARTLY: "Some tasks show the over-representation clearly and the rest cannot be told from chance "
                   "with these seeds.",
           CONTRADICTED: "At least one task has fewer sensitive entries among its barely-updated ones than "
                         "chance, beyond the spread over seeds: the scalar walls are not a property of every task here.",
           INCONCLUSIVE: "No task's enrichment can be told from chance with these seeds."},
    "C2": {REPRODUCED: "Nudging the walls by a typical update costs measurably more accuracy than nudging "
                       "random entries: they matter causally, at the claim's size.",
           PARTLY: "Part of the causal test holds; the rest sits within the sampling error of these test sets.",
           CONTRADICTED: "At the claim's size the nudge does not cost what the claim says, beyond the sampling "
                         "error: on this testbed a typical update is too small to make the walls matter.",
           INCONCLUSIVE: "The test sets are too small to tell the walls' nudge from the random one."},
    "C3": {REPRODUCED: "The merge overwrites the walls, and putting them back wins back loss and accuracy "
                       "beyond the random control.",
           PARTLY: "Some parts of the overwrite-and-restore story hold; the others are within the error.",
           CONTRADICTED: "At least one part of the overwrite-and-restore story goes the other way beyond the "
                         "error, so restoring the walls is not what repairs the merge here.",
           INCONCLUSIVE: "Nothing in the overwrite-and-restore test can be told from noise at this size."},
}
display(Markdown(" ".join(MEANING[c].get(v["status"], f"{c} could not be graded: {v['evidence']}")
                          for c, v in (("C1", v1), ("C2", v2), ("C3", v3)))))
