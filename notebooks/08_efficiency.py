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
# # Efficiency: randomized SVD (C10)
#
# Every step of PACT needs top singular vectors: the pre-trained core (P1), each task's active
# subspace (P2), and, through them, the LBW subspaces and shields (P3–P4). With T tasks that is
# T + 1 truncated SVDs per matrix layer. The paper computes them with a randomized SVD (P7) and
# claims:
#
# - **C10**: the RSVD variant matches the exact-SVD accuracy (within the seed spread) at a
#   fraction of the time.
#
# We check the three things the claim rests on, on the testbed's backbone: the time of the
# filter, how far the randomized subspaces are from the exact ones, and the accuracy of the
# merge. Then we read the engine's benchmark on layers shaped like the paper's ViT-B/32.
#
# Code: `pactlib.linalg.top_singular` (exact and randomized, P7), `pactlib.pact_filter`,
# `pactlib.linalg.projector_distance`, glued together in `pactlib.book.experiments.efficiency`;
# benchmark: `bench/bench_filter.py`.

# %% tags=["parameters"]
testbed = "lite0-8"   # a testbed (pactlib.testbeds): Lite0 on its 8-task suite
seeds = [0, 1, 2]                        # fine-tuning seeds: the claims rest on >= 3
method = "iso_c"                         # base merge: Iso-C, PACT's headline pairing
n_iters = [2, 8, 12]                     # power iterations q of the core's RSVD (P1), timed and compared (PactOptions' default: 8)
accuracy_n_iter = 12                     # q of the core's RSVD in the merge whose accuracy is measured
oversample = 40                          # oversampling p of the core's RSVD (PactOptions' default: 60); task updates keep p = 40, q = 1
timing_repeats = 3                       # fastest of three runs per variant: a shared machine only slows runs down
min_speedup = 2.0                        # "a fraction of the time": RSVD takes at most half the exact time
alpha_points = 5                         # geometric α values over Iso-C's grid 0.1 … 3.0 (book/method.md, protocol)
val_limit = 100                          # validation images per task for the α search
test_limit = 300                         # test images per task
bench_json = "book/data/bench_filter.json"  # the synthetic ViT-B/32-shaped benchmark (`make bench` refreshes it)
floor_json = "book/data/pact_floor.json"  # least PACT-Iso-C / Iso-C time (bench/bench_pact_floor.py)
floor_wall_json = "book/data/pact_floor_2threads.json"  # the same on both cores, wall time (--threads 2)
scale_jsonl = "book/data/merge_scale.jsonl"  # streamed `pact merge` times and memory (bench/bench_merge_scale.py)

# %%
from pactlib import testbeds
from pactlib.book import chapters, records
from pactlib.book.experiments import efficiency

P = chapters.Efficiency.check(globals())
suite = testbeds.suite_of(testbed)  # the records' label of the task list ("8" for lite0-8)

# %% [markdown]
# ## Exact and randomized top-r subspaces (P7)
#
# The exact route takes the full thin SVD of the (m, n) matrix and keeps r triplets. The
# randomized range finder (Halko, Martinsson and Tropp 2011, Alg. 4.4; `torch.svd_lowrank`)
# multiplies W by a random Gaussian (n, r + p) matrix, sharpens the result with q power
# iterations, orthonormalises it to a basis Q of W's approximate range, and takes the SVD of the
# small matrix QᵀW:
#
# $$Y = (W W^\top)^q\, W\,\Omega,\quad Q = \mathrm{orth}(Y),\quad Q^\top W = \hat U \Sigma V^\top,\quad U \approx Q\hat U.$$
#
# Its cost grows like m·n·(r + p)·(2q + 1), against about m·n·min(m, n) for the exact SVD, so it
# pays when r + p is much smaller than min(m, n). When r + p ≥ min(m, n) the engine falls back
# to the exact SVD. With many power iterations the engine takes a cheaper route to the same
# subspace: it forms the Gram matrix of W's smaller side once (m·n·min(m, n)) and iterates with
# it, one product of min(m, n)²·(r + p) per iteration instead of two through W
# (`linalg.gram_is_cheaper` decides by counting flops).
#
# Which p and q: on the testbed, the RSVD of the pre-trained core (P1) uses p = `oversample` and
# each q of `n_iters`, while the task updates' active subspaces (P2) keep `PactOptions`' own
# setting (`active_oversample`, `active_n_iter`); the seed is `PactOptions`' (0). The tables
# below state the values. The benchmark at the end of the chapter uses `PactOptions`' defaults
# for both. We time the whole PACT filter (P1–P5 over every matrix layer of the testbed, the
# book's default options) once with exact SVDs and once per q of `n_iters`, with the kernel's
# torch thread count (the book runner's `threads`: one per kernel on the two-core build machine;
# the filter spreads its layers over them, each layer's kernels on one thread, so the filtered
# task vectors are the same for any count, the times are not).

# %% tags=["compute"]
import torch
from tqdm.auto import tqdm

from pactlib.book.experiments import depth
from pactlib.pact import PactOptions

n_threads = torch.get_num_threads()  # the kernel's: the runner's `threads` (--threads, the set, else cores / jobs)
exact = PactOptions()
recs = []
for seed in tqdm(seeds, desc="seeds"):
    tb = testbeds.load(testbed, seed, val_limit=val_limit, test_limit=test_limit)
    keys = (tb.network_order() if hasattr(tb, "network_order")  # the testbed's maps, input to output
            else depth.network_order(tb.rule.matrix_keys(tb.pretrained)))
    tvs = tb.task_vectors()
    t_exact, f_exact, r_exact = efficiency.time_filter(tb.pretrained, tvs, exact, repeats=timing_repeats, rule=tb.rule, tb=tb)
    recs.append(records.make_record("filter-time", params=P, seed=seed, svd="exact", n_iter=None, threads=n_threads,
                                    metrics={"seconds": t_exact, "rsvd_share": 0.0}))
    recs += efficiency.gap_records(tb.pretrained, exact.replace(oversample=oversample), keys=keys, params=P, seed=seed,
                                   rule=tb.rule)
    variants = {method: None, f"pact-{method}": f_exact}
    for q in tqdm(n_iters, desc=f"RSVD, seed {seed}", leave=False):
        rsvd = exact.replace(svd="rsvd", n_iter=q, oversample=oversample)
        t_q, f_q, r_q = efficiency.time_filter(tb.pretrained, tvs, rsvd, repeats=timing_repeats, rule=tb.rule, tb=tb)
        recs.append(records.make_record("filter-time", params=P, seed=seed, svd="rsvd", n_iter=q, threads=n_threads, metrics={
            "seconds": t_q, "speedup": t_exact / t_q,
            "rsvd_share": efficiency.randomized_share(tb.pretrained, tvs, rsvd, rule=tb.rule)}))
        recs += efficiency.basis_records(r_exact, r_q, params=P, seed=seed, keys=keys, tasks=tb.tasks, n_iter=q)
        recs += efficiency.change_records(f_exact, f_q, keys=keys, params=P, seed=seed, n_iter=q)
        variants.update({f"pact-rsvd-{method}": f_q} if q == accuracy_n_iter else {})
    recs += efficiency.accuracy_records(tb, method, variants, alphas=testbeds.alpha_grid(method, alpha_points), suite=suite)
records.write_records(records.records_path("08_efficiency"), recs, replace=True)

# %% [markdown]
# ## Time and subspace error
#
# The subspace error compares the LBW bases, the subspaces PACT actually protects, through the
# distance of their orthogonal projectors, ‖P_exact − P_rsvd‖_F / √r: 0 for the same subspace,
# √2 for orthogonal ones; it does not depend on the signs or rotation of the basis vectors. When
# a survival value σ sits near τ, the two routes can keep a different number of directions; the
# distance then counts the extra direction fully. The filtered task vectors themselves are
# compared by ‖Δ̃exact − Δ̃rsvd‖_F / ‖Δ̃exact‖_F over the matrix layers.

# %%
from pactlib import PactOptions
from pactlib.book import plotting, report

frame = records.records_frame(records.records_path("08_efficiency"))
timed_threads = ", ".join(str(int(t)) for t in sorted(frame.loc[frame["method"] == "filter-time", "threads"].unique()))
n_layers = frame.loc[frame["method"] == "core-gap", "key"].nunique()  # one core-gap record per matrix layer and seed
defaults = PactOptions()
updates_pq = f"p = {defaults.active_oversample}, q = {defaults.active_n_iter}"  # what the compute cell leaves as it is
plotting.table(efficiency.summary_table(frame), chapter=8, number=1, floatfmt="{:.3g}",
               caption=f"PACT filter on the backbone ({suite} tasks, {n_layers} matrix layers): time (s, fastest of "
                       f"the repeats, mean over seeds; {timed_threads} torch thread(s)), "
                       "speed-up over the exact filter, share of the top-r SVDs that really run randomized, "
                       "distance of the LBW bases from the exact ones and relative change of the filtered task "
                       f"vectors (mean and largest over layers and tasks). RSVD rows: the core with p = {oversample} "
                       f"and the row's q, the task updates with {updates_pq} (`PactOptions`' defaults). "
                       "–: the exact filter is the reference, so it has no speed-up or distance of its own.")

# %%
with plotting.figure("rsvd-time-error", chapter=8, number=1, size="wide", ncols=2, paper="Tab. 5",
                     caption=f"Left: time of the PACT filter over the backbone's {n_layers} matrix layers, exact SVD "
                             f"and RSVD with q power iterations for the core (p = {oversample}; task updates: "
                             f"{updates_pq}; dots: seeds). Right: distance of the randomized LBW bases "
                             "from the exact ones per layer, input to output (line: mean over tasks; band: "
                             "smallest to largest).") as (fig, axes):
    efficiency.plot_times(frame, ax=axes[0])
    efficiency.plot_distances(frame, ax=axes[1])

# %%
rho = efficiency.gap_correlation(frame, accuracy_n_iter)
gaps = frame[frame["method"] == "core-gap"].groupby("depth")["metrics.gap"].mean()
cores = frame.loc[frame["method"] == "core-gap", "metrics.K"].astype(int)
print(f"core size K of W0: {cores.min()}" + (f" … {cores.max()}" if cores.max() > cores.min() else "")
      + f" directions over the {n_layers} matrix layers")
print(f"core gap σ_(K+p+1)/σ_K of W0: {gaps.min():.2f} … {gaps.max():.2f} over the layers; rank correlation between "
      f"gap^(2q+1) and the LBW distance at q = {accuracy_n_iter}: {rho:.2f}")

# %% [markdown]
# The testbed's matrix layers are small next to the paper's (the first line above gives the size
# K of their cores): an exact SVD is already fast on them, and the table shows what the
# randomized route saves. How close it gets depends on the spectrum: the range finder separates the top K directions from the
# rest only as well as (σ_{K+p+1}/σ_K)^{2q+1} allows, and a pre-trained layer whose singular
# values decay slowly past K (a gap near 1) leaves it with a subspace that is only partly right.
# The printed correlation says how much of the layer-to-layer error that explains. The LBW
# bases inherit the error of the core (P3 builds them from it), and the shields and filtered
# task vectors inherit theirs. Whether that matters is a question for the accuracy, below.
#
# The speed-up is bounded: the shields (P4) and the filter itself (P5) cost the same with both
# routes, so only the SVD share of the time shrinks. Timings on a shared two-core machine vary
# from run to run by tens of percent; we report the fastest of `timing_repeats` runs. The
# benchmark at the end of the chapter shows the same filter on layers of the paper's size.
#
# ## Accuracy of the merge
#
# Plain Iso-C, PACT-Iso-C with exact SVDs and PACT-Iso-C with the RSVD, each with α chosen on
# validation ({ref}`the protocol <method-protocol>`). The RSVD of this comparison is the one of
# the timings above at q = `accuracy_n_iter`: the core with p = `oversample`, the task updates
# with `PactOptions`' setting (the caption gives the values).

# %%
plotting.table(efficiency.accuracy_table(frame).rename(index=report.pretty), chapter=8, number=2, floatfmt="{:.2f}",
               caption="Mean test accuracy and normalized accuracy (%, ± std over seeds), seed count, mean chosen "
                       "α and merge time (s, the filter excluded) per method. The RSVD: the core with "
                       f"p = {oversample}, q = {accuracy_n_iter}; the task updates with {updates_pq}.")

# %%
check = efficiency.accuracy_check(frame, exact=f"pact-{method}", other=f"pact-rsvd-{method}")
print(f"RSVD − exact: {100 * check['diff']:+.2f} points; tolerance {100 * check['tol']:.2f} points = max(seed spread "
      f"{100 * check['spread']:.2f}, sampling error {100 * check['se']:.2f}) over {check['n_seeds']} seed(s)")
acc_ivs = efficiency.accuracy_contrasts(frame, method)
if acc_ivs:
    plotting.table(report.contrast_table(acc_ivs), chapter=8, number=3,
                   caption="Differences in mean test accuracy (points) between the merges, with their 95 % "
                           "intervals (paired on the same test examples, with the spread over seeds where there "
                           "are three or more), the seeds and the test examples per task behind them.")
else:
    print("The records carry no per-example test outcomes: recompute this chapter for the intervals.")

# %% [markdown]
# "Within the seed spread" needs a spread: with several seeds it is the standard deviation of the
# exact-SVD accuracy over seeds. With one seed we use instead the sampling error of a mean
# accuracy over the test images, √(p(1 − p)/N), whichever is larger. That is the margin of the
# verdict: RSVD matches exact SVDs when the 95 % interval of their paired difference (Table 8.3)
# lies wholly inside ± the margin, an equivalence test; both merges are scored on the same
# images, so the interval is much narrower than either merge's own sampling error.
#
# ## The paper-sized benchmark
#
# `bench/bench_filter.py` runs the same filter on synthetic checkpoints shaped like ViT-B/32's
# twelve blocks (four matrix layers each: 768 × 768, 2304 × 768, 3072 × 768, 768 × 3072), eight
# tasks, with trained-like spectra, on one CPU thread. It takes several minutes (the time of the
# last run is printed below), so the book reads its result file, `book/data/bench_filter.json`,
# rather than running it; `make bench` (or `.venv/bin/python bench/bench_filter.py`) writes it
# again.
#
# Its pre-trained spectra decay slowly past the core (a power law σ_i ∝ i^-½ over a quarter of
# the rank, on top of a noise bulk). That is the hard case for the range finder described
# above: the gap σ_(K+p+1)/σ_K is close to 1, so a few power iterations with a small
# oversampling do not separate the top K directions from the next ones, and the LBW bases
# inherit the error of the core. The benchmark first sweeps the oversampling p and the power
# iterations q on one block (the second table: time of the top-r SVDs and the distance of the
# subspaces from the exact ones), then runs the whole filter with `PactOptions`' p and q, and
# with the p = 10, q = 2 of {ref}`P7 <eq-P7>` for comparison.

# %% tags=["bench-data"]
import pandas as pd

from pactlib.book import plotting
from pactlib.book.experiments import efficiency

bench = efficiency.read_bench(bench_json)
if bench:
    # the benchmark's p and q are the core's; its record has the task updates' too, shown right after them
    bench_frame = efficiency.bench_table(bench).rename(index={"oversampling p": "core V0,K: oversampling p",
                                                              "power iterations q": "core V0,K: power iterations q"})
    bench_frame = bench_frame.rename(index=lambda q: q.replace("previous RSVD (p = 10, q = 2)", "RSVD with P7's p = 10, "
                                                               "q = 2 for both").replace("previous RSVD", "the same"))
    if bench.get("active_oversample") is not None and bench.get("active_n_iter") is not None:
        at = bench_frame.index.get_indexer(["core V0,K: power iterations q"])[0] + 1 or len(bench_frame)
        updates = pd.DataFrame({"value": [str(bench["active_oversample"]), str(bench["active_n_iter"])]},
                               index=pd.Index(["task updates Vt,k: oversampling p",
                                               "task updates Vt,k: power iterations q"], name=bench_frame.index.name))
        bench_frame = pd.concat([bench_frame.iloc[:at], updates, bench_frame.iloc[at:]])
    plotting.table(bench_frame, chapter=8, number=4, floatfmt="{}",
                   caption=f"The PACT filter on ViT-B/32-shaped synthetic layers (`{bench_json}`), exact SVD vs RSVD "
                           "with `PactOptions`' settings for the core and for the task updates.")
    if bench.get("sweep"):
        plotting.table(efficiency.bench_sweep_table(bench), chapter=8, number=5, floatfmt="{:.3g}",
                       caption=f"Randomized variants on the first {bench.get('sweep_blocks', 1)} block(s) of the "
                               "benchmark: (p, q, route) for the pre-trained core and for the task updates, the time "
                               "of the top-r SVDs (fastest of the repeats) and their speed-up over the exact SVDs, and "
                               "the distance of the LBW bases, cores and active subspaces from the exact ones.")
    print(f"benchmark: {bench.get('threads')} thread(s), {bench.get('bench_seconds', float('nan')) / 60:.0f} min, "
          f"measured {bench.get('measured')}")
    print(f"RSVD with p = {bench.get('oversample')}, q = {bench.get('n_iter')} for the cores and "
          f"p = {bench.get('active_oversample')}, q = {bench.get('active_n_iter')} for the task updates: "
          f"filter {bench['speedup_rsvd']:.1f}× faster than "
          f"with exact SVDs; its SVDs alone {bench.get('speedup_svd', float('nan')):.1f}× faster. The rest of the filter "
          f"(LBW bases, shields, projections) is {100 * bench.get('rest_share_exact', float('nan')):.0f} % of the exact "
          f"filter's time, so even free SVDs would make it only {bench.get('speedup_bound', float('nan')):.1f}× faster.")
    prev = bench.get("previous") or {}
    if prev:
        print(f"LBW bases: projector distance / √r {bench['lbw_projector_distance_mean']:.2g} (mean), "
              f"{bench['lbw_projector_distance_max']:.2g} (max), spectral {bench.get('lbw_spectral_distance_max', float('nan')):.2g} "
              f"(max); with p = {prev['oversample']}, q = {prev['n_iter']} for the cores and p = "
              f"{prev.get('active_oversample', '?')}, q = {prev.get('active_n_iter', '?')} for the task updates: "
              f"{prev['lbw_projector_distance_mean']:.2g}, "
              f"{prev['lbw_projector_distance_max']:.2g} and {prev['lbw_spectral_distance_max']:.2g}, "
              f"at {prev['speedup']:.1f}× speed-up")
    own = [v for v in bench.get("sweep") or [] if (v.get("core_oversample"), v.get("core_n_iter"), v["oversample"],
           v["n_iter"]) == (bench.get("oversample"), bench.get("n_iter"), bench.get("active_oversample"),
                            bench.get("active_n_iter"))]
    if own:  # PactOptions' setting among the sweep's rows
        print(f"sweep row of this setting: LBW bases at projector distance / √r {own[0]['lbw_fro_mean']:.3f} (mean), "
              f"{own[0]['lbw_fro_max']:.3f} (max), spectral {own[0]['lbw_spectral_mean']:.3f} (mean), "
              f"{own[0]['lbw_spectral_max']:.3f} (max); cores of all layers, spectral "
              f"{own[0].get('core_spectral_max_all', float('nan')):.3f} (max); SVDs {own[0]['speedup_svd']:.1f}× faster")
else:
    print(f"{bench_json} not found: run `make bench` (or `.venv/bin/python bench/bench_filter.py --out {bench_json}`) "
          "and rebuild this chapter to show the paper-sized numbers.")

# %% [markdown]
# The sweep shows where the error comes from. Its last rows give the pre-trained core its own
# setting and the task updates a cheap one: in this benchmark the LBW bases then move much less
# than the updates' active subspaces, which are far off near their own cut (P3 builds the LBW
# bases from the core; the updates' stray directions overlap little with it). The error of the
# LBW bases follows the core's, and the core's shrinks with both p and q (the convergence factor
# σ_(K+p+1)/σ_K raised to the power 2q + 1). With many iterations the Gram route is the cheaper
# one, and its one-off product dominates the cost, so more iterations cost little.
# `PactOptions`' p and q (their sweep row is the last line printed above) are among the
# cheapest settings of the sweep that keep the LBW bases on average within 0.05 of the exact
# ones in both distances, and every layer's core too (last column: the spectral distance hinges
# on the closest pair of singular values at the cut, which varies from layer to layer). The
# core and the task updates have settings of their own (`oversample`, `n_iter` and
# `active_oversample`, `active_n_iter`): the LBW bases come from the core, which needs the
# accuracy, while one power iteration is enough for the updates' active subspaces.
# The whole filter gains less than its SVDs: the shields (P4) and the projections (P5) cost the
# same with either SVD, and the printed bound says how much of the exact filter's time they take.
# Both are kept small. The shields take one eigendecomposition of the union of the LBW bases per
# layer; then, for each task whose shield is not capped, only the SVD of a small R × r_t matrix
# (R the rank of the union), which says exactly which directions task t alone brings
# (`pactlib.shield.iter_shields` explains why the count is exact; a capped shield, which needs
# its leading directions, still takes an eigendecomposition of its own). The projection
# $\Delta_t - (\Delta_t S_t) S_t^\top$ is two matrix products per task, 2·m·n·s multiply-adds for a shield of s
# columns, and in this benchmark it is the largest part of the rest.

# %% [markdown]
# ## PACT-Iso-C against Iso-C
#
# How much slower is a PACT merge than the plain one? The goal: PACT-Iso-C with the RSVD at most
# 2× the time of Iso-C. `bench/bench_merge_scale.py` times the whole streamed `pact merge`
# on ViT-B/32-shaped checkpoints, and `bench/bench_pact_floor.py` times the least it could take.
#
# Two parts of the filter cannot be skipped. Each task needs its active subspace (P2: a top-k
# RSVD of Δt), and each task's update must be projected (P5: two products of m·n·s_t
# multiply-adds). The shield of task t spans the other tasks' LBW subspaces, and each of those
# lies in the span of the core and of that task's active subspace. So a shield has
# K + (T − 1)·k columns until it reaches its cap. The projections grow like T², the active SVDs
# like T. Iso-C stays at one SVD per layer. The table counts only those two parts (the cores, LBW
# bases and shields as free) and sets the result beside what the whole merge measured.

# %% tags=["bench-data"]
import json
from pathlib import Path

floor = efficiency.read_bench(floor_json)
scale = ([json.loads(line) for line in Path(scale_jsonl).read_text().splitlines() if line.strip()]
         if Path(scale_jsonl).is_file() else [])
if floor:
    floor_wall = efficiency.read_bench(floor_wall_json) if floor_wall_json else None
    ft = efficiency.floor_table(floor, scale, floor_wall)
    plotting.table(ft, chapter=8, number=6, floatfmt="{:.2f}",
                   caption=f"PACT-RSVD-Iso-C's time over Iso-C's against the number of tasks: the least possible "
                           f"(only the T active-subspace RSVDs and the T projections; `{floor_json}`, one thread, "
                           f"CPU time, ViT-B/32 layer shapes), each part alone, the least possible on all cores "
                           f"(wall time, `{floor_wall_json}`, where present) and the whole streamed `pact merge` "
                           f"measured (CPU time, `{scale_jsonl}`; a column per model shape; –: not measured).")
    with plotting.figure("pact-iso-c-time", chapter=8, number=2,
                         caption="The same ratios against T (log scale): the least possible, dashed (black: one "
                                 "thread; coloured: all cores), and the measured `pact merge`, solid; grey: the "
                                 "2× goal.") as (fig, ax):
        efficiency.plot_floor(ft, ax=ax)
    for T, row in ft.iterrows():
        if row["least possible"] > 2:
            print(f"from T = {T}, PACT-Iso-C cannot stay within 2× of Iso-C on this CPU: even with free shields it "
                  f"takes {row['least possible']:.1f}×, and the active SVDs alone {row['active SVDs alone']:.1f}×")
            break
    print(f"floor measured {floor.get('measured')}, {floor.get('threads')} thread(s)")
    if floor_wall:
        print(f"all-cores floor measured {floor_wall.get('measured')}, {floor_wall.get('threads')} threads, wall time")
else:
    print(f"{floor_json} not found: run `.venv/bin/python bench/bench_pact_floor.py` to show it")

# %% [markdown]
# At two tasks PACT costs little on top of Iso-C. From eight tasks on, the two parts that no
# implementation can skip already take PACT-Iso-C past 2×, however cheaply the shields are
# built. The T active SVDs alone (the middle column) come close to 2× at eight tasks; they grow
# with T, while Iso-C does one SVD per layer. A fused path for the summed methods could make the projections cheaper:
# project the summed update once onto the union of all shields, then correct each task in the
# small complement of its own shield. It cannot remove those SVDs, so it would leave little room
# under 2× at eight tasks and none at twenty. Both cores do not help either (the column "least
# possible, 2 threads"): the products and the small RSVDs already run near the core's peak rate
# (the record's `projection_gflops`), and Iso-C's SVD gains about as much from the second
# thread. So we leave the goal unmet and report the gap. A GPU might shift the balance,
# because matrix products run much faster there than SVDs. `pact merge --device cuda` filters
# and merges each layer there, and `scripts/gpu_check.sh` reports the ratio; the section "On a
# GPU" below has one such run, and the GPU did not meet the goal either.

# %% [markdown]
# ## Memory against the number of tasks
#
# The streamed `pact merge` reads one layer at a time. Task Arithmetic, TSV-M and Iso-C go
# further: they take the tasks one at a time too (a running sum, or each task's top singular
# triplets), so a layer's memory does not grow with T. With PACT such a layer is filtered in two
# passes over the tasks: one for the subspaces, one to filter each update. TIES reads chunks of
# rows, and with PACT filters one task at a time too. Iso-CTS needs the tasks' sum before each
# task's own part, so it reads the tasks twice: the sum first, then each task against it. The goal: a peak at twenty tasks at most
# 1.5× the peak at two. The table is the last run of `bench/bench_merge_scale.py` for each model
# shape, method and mode (resident set size of the whole process, about 0.64 GB of it the Python
# and torch start-up).

# %% tags=["bench-data"]
mt = efficiency.memory_table(scale)
if len(mt):
    plotting.table(mt, chapter=8, number=7, floatfmt="{:.2f}",
                   caption=f"Peak memory of the streamed `pact merge` at T hi tasks over its peak at T lo, per model "
                           f"shape (blocks: residual blocks kept), method and PACT mode (`{scale_jsonl}`, the last "
                           f"run of each).")
    over = mt[mt["≤ 1.5"] == "no"]
    print("every run is within 1.5×" if over.empty else
          "over 1.5×: " + "; ".join(f"{r.method} {r.PACT} on {r.model} ({r.ratio:.2f})" for r in over.itertuples()))
else:
    print(f"{scale_jsonl} has no summary record: run `.venv/bin/python bench/bench_merge_scale.py` to show it")

# %% [markdown]
# ## Near the I/O floor?
#
# A streamed merge cannot beat reading every input once and writing its output once. How close
# does `pact merge` come to that floor? `bench/bench_io_floor.py` measures the floor in the same
# run as the merges: it reads every input from the warm page cache (`cat` to /dev/null) and
# writes and flushes one output-sized file. Then it runs each method as its own `pact merge`
# process on the same Llama-shaped float32 files, with one thread. The goals set for the engine:
# Task Arithmetic within 2× the floor, TIES (both scopes) within 4×, the kernel's (system) share
# of the CPU time at most 15 % for every method, and a peak memory at twenty tasks at most 1.3×
# the peak at two. TSV-M, Iso-C and Iso-CTS spend their time in SVDs; for them only the kernel
# share counts.
#
# The records keep the runs of several versions of the code, each with a label and its commit,
# and the figure and table show the latest run of each method and T. `before` is the reader and
# the chunk loops as they first were. `after`, `after-perkey` and `after-perkey2` replaced them:
# each file opened once and read with `pread`, chunk buffers reused instead of mapped afresh, and
# per-key TIES rebuilt the same way (`bench/io_floor_profile.md` says where the time went and
# why). `main-r3` and `after-count` are best-of-three runs of later code; in `after-count` TIES
# counts the agreeing tasks in bytes, the radix pass uses one bincount, and Task Arithmetic
# checks its running sum for NaN once per chunk instead of every task's input. In `native` both
# TIES run their passes as compiled loops (`pactlib.native`), and sums over tasks take one fixed
# order; `main-r4` is the code just before, measured in the same sitting. For per-key TIES the
# "before" column is `after-perkey`. `after-trim4` and `twopass` are variants that were tried
# and not kept (`twopass`: two reads of every input instead of three, measured beside `main-r5`;
# the profile note says why it did not pay). In `torchfree` Task Arithmetic and TIES (both
# scopes) run without torch (`pactlib.fastpath`): the inputs are memory-mapped and read in
# place, the C loops merge, a second thread writes, and TIES's passes split the tasks over two
# threads (`--workers 2`; the earlier labels ran one). `sweeps` ran on another machine (Linux
# 6.18, a faster floor) beside `main-r6`, the code just before it in the same sitting: each
# worker takes its own tasks through a whole radix pass, and the merge pass splits each block's
# columns over the workers. `kernels`, the newest, on the same machine: each merged block reads
# its inputs from map windows of its own, and TIES runs the fast path's own C loops (the merge
# pass on raw inputs, a block of 512 positions at a time; a vectorised second radix pass).
# `svd-r6` re-measured TSV-M, Iso-C and Iso-CTS (the torch path, unchanged by these runs) on
# that machine, once each at T = 2 and 8. `isocts-r7` (a third machine) measured Iso-CTS once
# it took the tasks one at a time, beside `isocts-before-r7`, the code before, in the same sitting.
# `cache-reread-idle`, the newest, measured Task Arithmetic and TIES on that machine with the
# inputs dropped from the page cache and read back first (`--reread`), as a first read from disk
# leaves them: how pages came into the cache sets what a mapped read costs in the kernel.
# `cache-aged` and `cache-reread` (not shown) are the same code over an aged cache and beside
# other jobs; the profile note compares the three.
#
# A merge that waits for a core adds to its wall time, not to its CPU time, so we give both over
# the floor; `load1` in the table is the load average when the run began (the `after-count` runs
# had the machine to themselves). The goal's measure is the wall time of the whole `pact merge`
# process, as a user runs it: Python's start, the CLI's import (with torch, up to `native`),
# the merge. Later runs also time the merge phase alone, after the import, in the same process.
#
# Reading from the page cache is itself kernel work: the kernel copies every byte. So the floor
# has a kernel share of its own. A reader reads every input once with `pread`, in the engine's
# block size, and writes the output once; its system time, set against each method's CPU time,
# is the kernel share that method would have if the floor were its only kernel work.

# %% tags=["bench-data"]
from IPython.display import Markdown, display

from pactlib.book import plotting, speed

io_rows = speed.read_data(speed.IO_FLOOR)
# the latest run of each method and T wins
io_labels = ("after", "after-perkey", "after-perkey2", "main-r3", "after-count", "native", "torchfree", "sweeps", "svd-r6", "isocts-r7", "kernels", "cache-reread-idle")
io_before = ("before", "after-perkey")
io_now, io_old = speed.floor_frame(io_rows, io_labels), speed.floor_frame(io_rows, io_before)
if len(io_now):
    shape = next(r for r in io_rows if r.get("kind") == "floor")
    commits = "; ".join(f"`{lab}`: {speed.startup(io_rows, lab).get('commit', '?')}"
                        for lab in dict.fromkeys((*io_before, *io_labels)))
    where = (f"{shape['layers']} layers, hidden {shape['hidden']}, MLP {shape['mlp']}, vocab {shape['vocab']}: "
             f"{shape['file_mb']:.0f} MB per file")
    with plotting.figure("merge-io-floor", chapter=8, number=3, size=(9.0, 3.8), ncols=2,
                         caption=f"The streamed `pact merge` against the I/O floor ({where}; `book/{speed.IO_FLOOR}`). "
                                 "Left: time over the floor against the number of tasks for the methods with a "
                                 "floor goal (solid: wall time, the goal's measure; dotted: CPU time); dashed: "
                                 "the goals. Right: the kernel's share of the CPU time for every method (dashed, "
                                 "crosses: before the change; dotted, open squares: the share that the floor's own "
                                 "kernel time makes of the same CPU time); dashed black: the goal. "
                                 f"Commits: {commits}.") as (fig, axes):
        speed.plot_floor(io_now, io_old, axes=axes)
    plotting.table(speed.floor_table(io_now, io_old), chapter=8, number=8,
                   caption="The same runs: floor (s); over the floor, the wall time of the whole process (the "
                           "goal's measure) and of the merge phase alone, the CPU time of the process and of the merge "
                           "phase; the goal (×); the kernel's share of the process's CPU time (%), the floor's own "
                           "kernel time as a share of the same CPU time (%), and the kernel share before the change; "
                           "minor page faults (millions) and peak memory of the process (MB). – : not recorded in "
                           "that run.")
    display(Markdown("\n".join(f"- {s}" for s in speed.floor_findings(
        io_now, speed.memory_frame(io_rows, io_labels), speed.startup(io_rows, io_labels[-1])))))
else:
    print(f"book/{speed.IO_FLOOR} has no merge records: run `.venv/bin/python bench/bench_io_floor.py` to show them")

# %% [markdown]
# The bullets above are written from the records. Where a goal is missed, the profile note
# (`bench/io_floor_profile.md`) says where the time goes. The bullet above on the CLI's import
# sets that cost against the floor. Part of every method's system time is reading the inputs
# from the page cache, which the floor's reader pays too (a copy with `pread`; the torch-free
# merges map the pages instead, which costs less); the bullet on the floor's own kernel time
# gives, per method, the kernel seconds beyond the floor's (a negative value: less than the
# floor's own reader spent). TIES reads every input three
# times: two passes find the global threshold, one merges. Compiling each pass into one loop
# cut its user time by 2.5–3×, and left it at 7–12× the floor in the merge phase. Three reads
# already take most of what 4× the floor allows. Two passes instead of three (a sample predicts
# each task's threshold, so the first pass finds it exactly) were tried and did not pay: at
# T = 20 the merge is compute-bound, and the saved read was spent on the sample. For Task
# Arithmetic, reading task t + 1 while task t is added was tried and did not help on this
# machine.
#
# Importing torch alone took 1.5–2 s here (the `startup` records up to `native`), 2–9× the
# floor: no process that imports torch could meet the Task Arithmetic goal on these shapes. So
# `pact merge` now runs Task Arithmetic and TIES on safetensors files without torch, with the
# torch path's bytes (`torchfree`). Task Arithmetic then stays within the floor goal with about
# the floor's own kernel time. TIES reads every input three times, and its passes are
# compute-bound: it came within the goal once each worker took its own tasks through a whole
# pass, the merge pass ran on both workers (`sweeps`), and the loops of the merge pass and of the
# second radix pass were rewritten to stay in the cache and in vector registers (`kernels`):
# 2.7–3.6× the floor at T = 2 to 20, from 3.7–5.9× in `main-r6`.
#
# Memory depends on the machine. The kernel of the `sweeps` machine maps a file's pages in
# folios of up to 2 MB, so a mapped input holds up to 2 MB resident however small the block
# read from it: with every input mapped whole, memory at T = 20 was about twice that at T = 2
# (`main-r6`, `sweeps`). Since `kernels`, a merged block maps each input's share in a window of
# its own, and a fault cannot map beyond a window: memory no longer grows with T. The windows
# cost some kernel time (mapping them, then unmapping them, which stops both cores): in
# `kernels` the kernel's share was 14–22 % for TIES.
#
# That share depends as much on the page cache as on the merge. A mapped pass over a file costs
# little in the kernel when the cache holds the file in large folios (as after a read from disk)
# and about twice as much over an aged cache in small ones; a copy with `pread`, the floor
# reader's way, costs the same either way. Over the same files at the same commit, TIES (global)
# at T = 8 spent 15 % of its CPU time in the kernel after a re-read and 28 % over the aged
# cache (`cache-reread`, `cache-aged`; the profile note). With the inputs re-read
# (`cache-reread-idle`), TIES meets the 15 % goal at T = 8 and 20. At T = 2 the goal is below
# the floor: the floor reader's kernel time alone is 16 % of TIES's CPU time there, and TIES
# spends within a few hundredths of a second of it. Task Arithmetic does little besides reading,
# so its share stays near the floor reader's own, which is all kernel time: the floor's share of
# its CPU time is 51–66 %, and it spends less kernel time than the floor's reader at every T (the
# bullet on the floor's own kernel time). TSV-M, Iso-C and
# Iso-CTS spend their time in SVDs and stay at 7–15 % (`svd-r6`, `isocts-r7`). Iso-CTS held a
# layer's T task vectors at once, so its peak memory grew with T: 1.27× from T = 2 to 8 in
# `isocts-before-r7`. It only needs the sum of the task vectors for its common subspace, then each
# task against that subspace, so it now reads every task twice, one at a time: 1.005× in
# `isocts-r7`, the same output bytes, the same time to within 4 %.
#
# ### The in-memory API against plain torch
#
# `pactlib.merge` and `pactlib.merged_update` check their inputs and then merge. The goal: within
# 2× of the same merge written in plain torch, with no checks, on the same state dicts, and the
# same result bit for bit. `bench/bench_inmemory.py` times both (best of its repeats, one thread).

# %% tags=["bench-data"]
mem_table = speed.inmemory_table(speed.read_data(speed.INMEMORY))
if len(mem_table):
    plotting.table(mem_table, chapter=8, number=9, floatfmt="{:.3g}",
                   caption=f"The in-memory API against plain torch (`book/{speed.INMEMORY}`): T fine-tuned state dicts "
                           "of float32 matrices, the best seconds of `pactlib.merge` and `merged_update` and of the "
                           "plain-torch expressions, their ratios, and whether the results are bit-identical.")
    display(Markdown("\n".join(f"- {s}" for s in speed.inmemory_findings(mem_table))))
else:
    print(f"book/{speed.INMEMORY} not found: run `PYTHONPATH=. .venv/bin/python bench/bench_inmemory.py` to show it")

# %% [markdown]
# ### Beside mergekit
#
# How does `pact merge` compare with mergekit, timed side by side on the same files?
# `bench/bench_mergekit.py` writes a Llama-shaped float32 model folder and T fine-tunes, then runs
# `pact merge` and mergekit's `mergekit-yaml` as whole processes on the CPU, in alternating order,
# for Task Arithmetic and TIES with the same α and the same trim (mergekit trims each tensor, so
# pact's TIES runs with `scope=per_key`). mergekit lives in a virtual environment of its own; it
# is never a dependency of pactlib. Each row below is the median of the repeats. The ratios are
# pact over mergekit, so a value below 1 means pact is faster or smaller. Both outputs are also
# checked against the same merge computed in float64 from the same files.

# %% tags=["bench-data"]
mk_files, mk_frame = speed.side_by_side()
mk_table = speed.side_by_side_table(mk_frame)
if len(mk_table):
    plotting.table(mk_table, chapter=8, number=10,
                   caption="`pact merge` beside mergekit on the same files (" + ", ".join(f"`book/{f}`" for f in mk_files)
                           + "): medians of each tool's wall time (s); pact / mergekit of wall time, CPU time, CPU "
                           "time less each tool's import, and peak memory; each tool's peak memory (MB) and "
                           "kernel share of its CPU time (%); the largest differences between the outputs and to "
                           "the float64 reference; the 1-minute load average of the shared machine during the runs.")
    display(Markdown("\n".join(f"- {s}" for s in speed.side_by_side_findings(mk_frame))))
else:
    display(Markdown("No side-by-side record with mergekit is committed (no `book/data/mergekit*.jsonl`), so "
                     "this book cannot say how the two compare; `bench/bench_mergekit.py` writes one."))

# %% [markdown]
# ### Beside fusion_bench
#
# fusion_bench implements the same merges in Python, on state dicts in memory. The goal is that
# `pactlib.merge` is no slower than it for any method. `bench/bench_fusion_bench.py` builds the
# same inputs for both and runs fusion_bench in a process of its own, from its own virtual
# environment. It times only the merge, alternating the two tools, best of the repeats, one
# thread. Where the definitions differ, the table's note says how.

# %% tags=["bench-data"]
fb_rows = speed.read_data(speed.FUSION_BENCH)
fb_table = speed.fusion_bench_table(fb_rows)
if len(fb_table):
    plotting.table(fb_table, chapter=8, number=11, floatfmt="{:.3g}",
                   caption=f"`pactlib.merge` beside fusion_bench on the same state dicts (`book/{speed.FUSION_BENCH}`): "
                           "best seconds of each, their ratio (below 1: pactlib is faster), whether the results are "
                           "bit-identical, and the largest difference over the largest update. The notes "
                           "below say how the definitions differ.")
    display(Markdown("\n".join(f"- {s}" for s in speed.fusion_bench_findings(fb_table, fb_rows))))
else:
    print(f"book/{speed.FUSION_BENCH} not found: run `bench/bench_fusion_bench.py` (it says how to install fusion_bench)")

# %% [markdown]
# ## On a GPU
#
# One session had a GPU machine for a few minutes (an H200). `scripts/gpu_check.sh` ran the paper
# path there on ViT-B/32-shaped random weights with eight task vectors, everything on cuda; its
# CPU comparisons were skipped to save the machine's time. The table shows that record. Two things
# stand out. The streamed PACT-RSVD-Iso-C stays above twice Iso-C's time on the GPU as well, so
# the GPU does not meet the goal of the section on PACT's cost either. And the merges built on
# SVDs are slow there: `torch.linalg.svd` on cuda takes tens of milliseconds per layer, where
# Task Arithmetic merges the whole model in a fraction of that. A batched SVD, or one through
# the smaller Gram matrix, is the next thing to try when a session has a GPU.

# %% tags=["bench-data"]
import json
from pathlib import Path

gpu_jsonl = "book/data/gpu_check.jsonl"  # scripts/gpu_check.sh on a GPU machine, a record per run
if Path(gpu_jsonl).is_file():
    gpu = [json.loads(line) for line in Path(gpu_jsonl).read_text().splitlines() if line.strip()][-1]
    gi = gpu["info"]
    cuda_rows = [r for r in gpu["stages"] if r["device"] == "cuda" and r.get("seconds") is not None]
    gpu_table = pd.DataFrame({"stage": [r["stage"] for r in cuda_rows], "variant": [r["variant"] for r in cuda_rows],
                              "seconds": [r["seconds"] for r in cuda_rows],
                              "peak GPU memory (GiB)": [r["peak_gpu_bytes"] / 2**30 for r in cuda_rows],
                              "note": [r.get("note") or "" for r in cuda_rows]}).set_index(["stage", "variant"])
    plotting.table(gpu_table, chapter=8, number=12, floatfmt="{:.3g}",
                   caption=f"`scripts/gpu_check.sh` on {gi['gpu']} (`{gpu_jsonl}`, label `{gpu['label']}`, code "
                           f"{gi['commit']}, torch {gi['torch']}): {gi['arch']}, {gi['params'] / 1e6:.0f} M "
                           f"parameters in {gi['matrix_layers']} matrix layers, T = {gi['tasks']} synthetic task "
                           f"vectors, {gi['images_per_task']} random images per task; seconds on cuda, one run each.")
    by = {(r["stage"], r["variant"]): r["seconds"] for r in cuda_rows}
    layers, T = gi["matrix_layers"], gi["tasks"]
    ratio = next((r["ratio_to_iso_c"] for r in cuda_rows if r.get("ratio_to_iso_c") is not None), None)
    if ratio is not None:
        print(f"streamed PACT-RSVD-Iso-C / Iso-C on the GPU: {ratio:.2f}× (goal ≤ 2×)")
    if ("merge", "tsv_m") in by and ("merge", "iso_c") in by:
        print(f"per layer SVD, at most: TSV-M {1e3 * by[('merge', 'tsv_m')] / (layers * T):.0f} ms "
              f"({layers} layers × {T} tasks), Iso-C {1e3 * by[('merge', 'iso_c')] / layers:.0f} ms ({layers} layers); "
              f"Task Arithmetic's whole merge {1e3 * by.get(('merge', 'task_arithmetic'), float('nan')):.0f} ms")
else:
    print(f"{gpu_jsonl} not found: no GPU run is recorded (`scripts/gpu_check.sh` on a machine with one)")

# %% [markdown]
# ## Verdict
#
# Three conditions ({ref}`the verdict rule <method-verdict-rule>`): the 95 % interval of
# PACT-RSVD − PACT in test accuracy lies above −margin and below +margin (the margin above), and
# the exact filter's time over the RSVD filter's, over the seeds, lies above `min_speedup`. The
# benchmark's speed-up is reported beside them.

# %%
timing = frame[(frame["method"] == "filter-time") & (frame["n_iter"] == accuracy_n_iter)]
v = efficiency.c10_verdict(frame, exact=f"pact-{method}", other=f"pact-rsvd-{method}",
                           speedups=timing["metrics.speedup"].tolist(), bench=bench, min_speedup=min_speedup,
                           rsvd_share=timing["metrics.rsvd_share"].mean())
evidence = (f"On the testbed the RSVD uses p = {oversample}, q = {accuracy_n_iter} for the cores and {updates_pq} for "
            "the task updates. " + v["evidence"])
if bench and bench.get("active_oversample") is not None:  # the benchmark's p, q in the evidence are the cores'
    core_pq = f"with p = {bench.get('oversample')}, q = {bench.get('n_iter')}"
    evidence = evidence.replace(core_pq, f"{core_pq} for the cores and p = {bench['active_oversample']}, "
                                         f"q = {bench.get('active_n_iter')} for the task updates")
plotting.verdict("C10", {**v, "evidence": evidence})

# %%
from IPython.display import Markdown, display

grades = {c["name"]: c["grade"] for c in v.get("conditions") or []}
accuracy = [g for n, g in grades.items() if "margin" in n]
time_grade = next((g for n, g in grades.items() if "filter time" in n), None)
said = {"holds": "holds", "fails": "fails", "inconclusive": "is not decided by these seeds and test examples"}
if not grades:
    text = "C10 is not graded here: the verdict box says why."
else:
    acc_text = ("the RSVD merge's accuracy lies within the margin of the exact one's" if set(accuracy) == {"holds"}
                else "the RSVD merge's accuracy lies outside the margin of the exact one's" if "fails" in accuracy
                else "the interval of the accuracy difference reaches past the margin, so equivalence is not shown")
    text = (f"On this testbed {acc_text}, and the speed-up condition {said[time_grade]}. The speed-up is bounded "
            "by the part of the filter that does not use SVDs (shields and projections); the benchmark above shows the "
            "same filter on layers of the paper's size.")
display(Markdown(text))
