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
# # Layer depth (C9)
#
# PACT filters every matrix layer by default. Is the protection needed everywhere, or does it
# matter most in some part of the network? The paper's answer has two halves:
#
# - **C9a**: filtering the early layers only gives most of the gain of filtering all of them;
# - **C9b**: with many tasks, the whole network needs filtering.
#
# We split the backbone's matrix layers by depth, apply PACT to one part only, and compare with
# no filter and with every layer filtered, on two suites of the testbed: one with few tasks and
# one with many (the two names in `testbeds`). To see *why* depth might matter we also measure,
# layer by layer, how much of the other tasks' updates lands in each task's LBW subspace: the
# intrusion energy of {ref}`C9 <claim-C9>`.
#
# Code: `pactlib.book.study.depth_groups`, `pactlib.pact.PactOptions(layers=...)`,
# `pactlib.subspaces.intrusion_energy`, glued together in `pactlib.book.experiments.depth`.

# %% tags=["parameters"]
testbeds = ["lite0-8", "lite0-20"]  # few and many tasks (pactlib.testbeds names): the two halves of C9
seeds = [0, 1, 2]        # fine-tuning seeds of the first testbed (the others use the first seed)
method = "iso_c"         # base merge: Iso-C, the merge PACT is paired with in the headline results
alpha_points = 6         # α values, geometrically spaced from alpha_min to 3.0 (the end of Iso-C's grid)
alpha_min = 0.025        # below Iso-C's 0.1, so that a merge that wants a smaller α finds it inside the grid
most = 0.5               # "most of the gain": early-only keeps at least half of the all-layer gain
val_limit = 48           # validation examples per task for the α search (10 merges x 6 α: the CPU budget)
test_limit = 150         # test examples per task

# %%
from pactlib.book import chapters, records, study
from pactlib.book.experiments import depth
from pactlib.testbeds import suite_of

P = chapters.LayerDepth.check(globals())
suites = [suite_of(name) for name in testbeds]  # the records' labels ("8" for lite0-8)

# %% [markdown]
# ## Depth groups
#
# The backbone's matrix layers, taken from input to output, are cut into three contiguous
# groups of (nearly) equal count: early, middle and late (`study.depth_groups`); the cell
# below lists them. On Lite0 the matrix layers are pointwise convolutions: early ones have few
# channels and see large feature maps, late ones have many channels and see small ones. On
# MiniLM they are the linear maps of the six transformer layers, which all have the same
# shapes, so the groups differ by depth alone.
#
# For a group G, PACT runs as usual (P4–P5, the book's default options) but only on the layers
# of G; every other layer keeps its raw Δt:
#
# $$\tilde\Delta_t^{(l)} = \begin{cases}\Delta_t^{(l)} - \Delta_t^{(l)} S_t^{(l)} S_t^{(l)\top} & l \in G\\ \Delta_t^{(l)} & l \notin G.\end{cases}$$
#
# In the engine that is `PactOptions(layers=...)` with one anchored pattern per key. The filter
# of a layer depends on that layer alone, so we filter every layer once and assemble each
# group's task vectors from the result (`depth.group_task_vectors`); a test checks that this
# equals running the filter with the group's `layers` option.
#
# The base merge is Iso-C (M4), for every condition, with α chosen on validation over the same
# grid. Iso-C flattens the spectrum of the summed update, which spreads every task's update over
# many directions: that is where interference between tasks, and so the filter, matters most.
#
# **The α grid.** Iso-C's grid in {ref}`the protocol <method-protocol>` runs from 0.1 to 3.0.
# Here it starts lower: `alpha_points` values spaced geometrically from `alpha_min` to 3.0, so
# that a merge of many tasks that wants a smaller α than 0.1 finds it inside the grid, with
# more points at small α. As the protocol asks, a best α on an edge widens the grid; the table
# below gives the chosen α and flags any choice that still falls on an edge.

# %% tags=["compute"]
from pactlib.testbeds import load

first = load(testbeds[0], seeds[0], val_limit=val_limit, test_limit=test_limit)
keys = (first.network_order() if hasattr(first, "network_order")  # the testbed's maps, input to output
        else depth.network_order(first.rule.matrix_keys(first.pretrained)))
groups = study.depth_groups(keys)
records.write_records(records.records_path("07_layer_depth_layers"),
                      depth.layer_records(groups, params=P, testbed=testbeds[0]), replace=True)

# %%
keys, groups = depth.groups_from_records(records.read_records(records.records_path("07_layer_depth_layers")))
print(f"{len(keys)} matrix layers, input to output, in three depth groups:")
for g, k in groups.items():
    if g != "all":
        print(f"  {g + ':':<8}{len(k):>3} layers, from {k[0]} to {k[-1]}")

# %% [markdown]
# ## Run every condition
#
# For each suite (the first testbed of `testbeds` with every seed of `seeds`, the second with
# the first seed only): one PACT filter over all layers with its subspaces kept, then five
# merges (no filter, early, middle, late, all), each with its α search and test.

# %% tags=["compute"]
from tqdm.auto import tqdm

from pactlib.pact import PactOptions
from pactlib.testbeds import alpha_grid
from pactlib.testbeds.base import filtered as pact_filtered

opts = PactOptions()
runs = [(name, seed) for i, name in enumerate(testbeds) for seed in (seeds if i == 0 else seeds[:1])]
recs = []
for name, seed in tqdm(runs, desc="testbeds"):
    tb = load(name, seed, val_limit=val_limit, test_limit=test_limit)
    suite = suite_of(name)
    raw = tb.task_vectors()
    # pact_filter(tb.pretrained, raw, options=opts, keep=True); a clip testbed's are lazy, read from its files
    filtered, report = pact_filtered(tb, "pact", opts, keep=True)
    recs += depth.intrusion_records(raw, report.subspaces, keys=keys, params=P, seed=seed, rule=tb.rule, suite=suite)
    for g in tqdm(depth.GROUPS, desc=f"{name} seed {seed}", leave=False):
        recs.append(depth.group_record(tb, method, g, keys=groups.get(g, []), raw=raw, filtered=filtered, options=opts,
                                       alphas=alpha_grid(method, alpha_points, lo=alpha_min, spacing="geometric")))
records.write_records(records.records_path("07_layer_depth"), recs, replace=True)

# %% [markdown]
# ## Gains by depth group

# %%
from pactlib.book import plotting, report

frame = records.records_frame(records.records_path("07_layer_depth"))
with plotting.figure("depth-gains", chapter=7, number=1, paper="Tab. 4",
                     caption="Gain in mean normalized test accuracy (points) over plain Iso-C when PACT filters "
                             "one depth group only, or every layer. Bars: mean over seeds; dots: single seeds; "
                             "black error bars: 95 % intervals (paired bootstrap over the test examples, with the "
                             "spread over seeds where there are three or more).") as (fig, ax):
    gains = depth.plot_group_gains(frame, ax=ax, suites=suites)
    depth.plot_gain_intervals(frame, ax=ax, suites=suites)

# %%
gain_ivs = depth.gain_table(frame, suites=suites)
if gain_ivs.empty:
    print("The records carry no per-example test outcomes: recompute this chapter for the gains' intervals.")
else:
    plotting.table(gain_ivs, chapter=7, number=1,
                   caption="Gain in mean normalized test accuracy (points) over plain Iso-C per condition and "
                           "suite, with its 95 % interval, and the seeds behind it (the merges are compared on "
                           "the same test examples).")

# %%
plotting.table(report.suite_columns(depth.condition_table(frame).rename(columns={"alpha": "α"}, level=0)),
               chapter=7, number=2,
               floatfmt="{:.2f}",
               caption="Mean test accuracy and normalized accuracy (%), the chosen α and the share of seeds whose "
                       "α lies on an edge of the grid, per condition and suite (means over seeds).")

# %%
sizes = frame[frame["method"] == "intrusion"].groupby("suite")["T"].first()  # tasks per suite
accs = frame[frame["group"] == "none"].groupby("suite", sort=False)["metrics.acc"].mean()  # plain Iso-C, mean over seeds
noise = {}  # suite -> sampling error (points), also read by the verdict below
print("Sampling error of one merge's mean test accuracy (plain Iso-C):")
for suite, acc in accs.items():
    n = test_limit * int(sizes[suite])  # at most: some tasks have fewer test examples
    noise[suite] = 100 * (acc * (1 - acc) / n) ** 0.5
    print(f"  T={suite}: over ≤ {n} test examples ≈ {noise[suite]:.2f} points")
print("The gains compare merges on the same test examples, so their own noise is smaller.")

# %% [markdown]
# Gains well below that sampling error are noise. The gains themselves are paired: two merges
# scored on the same test examples differ only where their predictions differ, so their 95 %
# intervals (figure 7.1, table 7.1; {ref}`how they are computed <method-intervals>`) are narrower than the
# sampling error of either merge, and the verdicts below are graded on them.
#
# ## Intrusion energy across depth
#
# For task t and layer l, the intrusion energy is the share of the other tasks' update energy
# that falls inside task t's LBW subspace:
#
# $$I_t^{(l)} = \frac{\sum_{j\neq t}\big\|\Delta_j^{(l)} V_{t,\mathrm{LBW}}^{(l)}\big\|_F^2}{\sum_{j\neq t}\big\|\Delta_j^{(l)}\big\|_F^2}.$$
#
# It is what the merge would write into task t's load-bearing walls if nothing protected them.
# A random update would put the share r/n into an r-dimensional subspace of $\mathbb{R}^n$, and
# r/n changes from layer to layer. On Lite0 it alternates: a pointwise convolution that expands
# the channels has a small n, the one that projects them back a large n. On MiniLM the MLP's
# second map (keys `encoder.layer.*.output.dense.weight`, chapter 2's fc2) has a larger n than
# the other maps. So we also show the ratio to r/n: above 1,
# the other tasks aim their updates at task t's walls more than chance would; below 1, they
# avoid them.

# %%
bounds = {g: keys.index(groups[g][0]) for g in ("middle", "late")}
with plotting.figure("intrusion-depth", chapter=7, number=2, size=(9.0, 3.6), ncols=2,
                     caption="Intrusion energy of the other tasks' updates into each task's LBW subspace, per matrix "
                             "layer from input to output: mean over tasks (line) and smallest to largest task "
                             "(band). Left: in % of their energy, with the share r/n a random update would give "
                             "(dashed). Right: divided by r/n (1 = random). Dotted lines: group boundaries.") as (fig, axes):
    depth.plot_intrusion(frame, ax=axes[0], suites=suites, bounds=bounds)
    depth.plot_intrusion(frame, ax=axes[1], suites=suites, bounds=bounds, relative=True)

# %%
plotting.table(report.suite_columns(depth.intrusion_table(frame, groups)), chapter=7, number=3, floatfmt="{:.2f}",
               caption="Mean intrusion energy and its random reference r/n (%) and their ratio, per depth group and "
                       "suite.")

# %% [markdown]
# ## Verdicts
#
# Each half of C9 is a set of conditions on paired contrasts between the depth conditions'
# merges (early only E, middle only M, late only L, all layers A, no filter N; points of
# normalized accuracy), graded by where their 95 % intervals lie ({ref}`the verdict rule
# <method-verdict-rule>`). C9a, at the first suite: A − N > 0; E − `most`·A − (1 − `most`)·N > 0,
# i.e. the early layers keep at least `most` of the gain; E − M > 0 and E − L > 0. C9b, at the
# last suite: A − E, A − M and A − L > 0, and E − `most`·A − (1 − `most`)·N < 0.

# %%
from IPython.display import Markdown, display

v = depth.c9_verdicts(frame, suites=suites, most=most)
plotting.verdict("C9a (early layers give most of the gain)", v["early"])
display(Markdown(report.c9a_closeness(v["early"])["text"]))
plotting.verdict("C9b (many tasks need the whole network)", v["whole"])

# %%
display(Markdown("\n\n".join(f"**{name}.** {report.reading(v[half])}"
                                for half, name in (("early", "C9a"), ("whole", "C9b")))))
