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
# # The method
#
# PACT changes one step of model merging. Before the task vectors are merged, each one loses
# the part of it that would write into directions *other* tasks rely on. This chapter states the
# method in equations, names the `pactlib` function behind each one, and then runs the
# functions on a layer small enough to draw.
#
# ## Task vectors and the matrix view
#
# A checkpoint is a state dict. With θ0 the pre-trained weights and θt the weights fine-tuned
# on task t, the task vector is Δt = θt − θ0, computed key by key in float32
# (`pactlib.TaskVector.from_checkpoints`). A merge returns one update D and the merged model
#
# $$\theta = \theta_0 + \alpha D ,$$
#
# with α chosen on validation data.
#
# PACT and the SVD-based merges act on linear maps. A key is a *matrix layer* when it stores a
# map $W:\mathbb R^n\to\mathbb R^m$ as an (m, n) array: a linear weight, or a 1×1 convolution
# (m, n, 1, 1) seen as (m, n). open_clip's `visual.proj` is stored the other way round, so its
# view is the transpose. Biases, norms, embedding tables and convolutions with larger kernels
# are not matrix layers; integer buffers are copied from θ0. `pactlib.matrix.MatrixRule` holds
# this rule (`kind`, `view`, `unview`). The right singular vectors of a view live in the **input**
# space $\mathbb R^n$, and so does every subspace below: an orthonormal basis $V$ of shape (n, r).
#
# ## Three subspaces of a layer
#
# For one matrix layer with pre-trained weight $W_0$ and task update $\Delta_t$:
#
# $$V_{0,K} = \text{top-}K \text{ right singular vectors of } W_0 \tag{P1}$$
#
# $$V_{t,k} = \text{top-}k \text{ right singular vectors of } \Delta_t \tag{P2}$$
#
# $$A_t = (I - V_{t,k}V_{t,k}^\top)\,V_{0,K} = Q\,\Sigma\,R^\top, \qquad
#   V_{t,\mathrm{LBW}} = \{\, q_i : \sigma_i \ge \tau \,\} \tag{P3}$$
#
# $V_{0,K}$ is the *pre-trained core*: the input directions $W_0$ uses most. $V_{t,k}$ is the
# task's *active* subspace: where its update acts. The *load-bearing-wall* (LBW) subspace of
# task t is what is left of the core once the active directions are taken out. Each σ_i lies
# in [0, 1] and says how much of a core direction survives; directions with σ_i < τ are
# dropped rather than rescaled into noise. K and k are fractions of the layer rank
# min(m, n) (`core_frac`, `active_frac`) or energy fractions; τ is `lbw_tol`.
# Code: `pactlib.subspaces.pretrained_core` (P1), `pactlib.subspaces.active_subspace` (P2),
# `pactlib.subspaces.lbw_subspace` (P3, with the rank-revealing `pactlib.linalg.orth`),
# `pactlib.subspaces.choose_rank`, and `pactlib.pact.layer_subspaces` for all three at once.
#
# ## Shield and filter
#
# Task t must not overwrite what the other tasks rely on. Its shield is an orthonormal basis of
# the union of their LBW subspaces, and the filter removes the shield component of its update:
#
# $$M_t = \big[\,V_{j,\mathrm{LBW}}\,\big]_{j \ne t}, \qquad S_t = \operatorname{orth}(M_t)
#   \text{ with at most } \lfloor \gamma\, n \rfloor \text{ columns} \tag{P4}$$
#
# $$\tilde\Delta_t = \Delta_t - (\Delta_t S_t)\,S_t^\top \tag{P5}$$
#
# Here orth(·) is rank-revealing again and γ is `max_shield_frac`. The cap keeps the shield
# from covering the whole input space (which would delete the update); the leading
# directions, shared by several tasks, are kept. The filtered updates are then merged by any
# base method. Two variants:
#
# $$S_t = V_{0,K} \ \text{ for every } t \qquad \text{(S-PACT, static)} \tag{P6}$$
#
# and every "top-r singular vectors" above may come from a randomized SVD (RSVD) with
# oversampling p and q power iterations instead of the exact one (P7; Halko, Martinsson & Tropp
# 2011).
# Code: `pactlib.shield.build_shield` (P4), `pactlib.shield.filter_update` (P5, never forming
# the n×n projector), `pactlib.pact.pact_filter(..., mode="pact" | "s-pact")` (P4–P6 over a
# whole checkpoint, with `pactlib.PactOptions`), `pactlib.linalg.top_singular(method="rsvd")`
# (P7, through `torch.svd_lowrank`, or the same iteration through the Gram matrix when that is
# cheaper).
#
# ## The merges PACT wraps
#
# **Task Arithmetic (TA, M1**; Ilharco et al., ICLR 2023) adds the task vectors:
#
# $$D = \textstyle\sum_t \Delta_t \tag{M1}$$
#
# **TIES (M2**; TIES-Merging, *trim, elect sign and merge*; Yadav et al., NeurIPS 2023) keeps
# each task's top ρ % entries by magnitude (the trim percentage ρ), elects a sign per entry from
# the sum, and averages the entries that agree with it. **TSV-M (M3**; Task Singular Vectors:
# Merge; Gargiulo et al., CVPR 2025) keeps each task's top ⌊min(m, n)/T⌋ singular triplets,
# stacks them, replaces the stacked U and V by their nearest orthonormal (polar) factors and
# keeps the original singular values. **Iso-C (M4**; isotropic merging in the common subspace;
# Marczak et al., ICML 2025, "No task left behind: isotropic model merging with common and
# task-specific subspaces") takes the SVD of the sum and sets every singular value to their
# mean:
#
# $$\textstyle\sum_t \Delta_t = U\Sigma V^\top, \qquad D = \bar\sigma\, U V^\top \tag{M4}$$
#
# **Iso-CTS (M5**; isotropic merging in the common and task-specific subspaces, from the same
# paper) keeps common directions of the sum, adds task-specific ones from each update with the
# common subspace projected out, and flattens the spectrum the same way.
# Non-matrix keys are summed (M1, M2 on all entries) or averaged (M3–M5).
# Code: `pactlib.merges.get(name)` over the registry — `task_arithmetic` (M1), `ties` (M2),
# `tsv_m` (M3), `iso_c` (M4), `iso_cts` (M5); the one entry point is `pactlib.merge` /
# `pactlib.merged_update(method, θ0, task_vectors, pact="pact")`.

# %% tags=["parameters"]
seed = 0                      # seeds the toy layer's output rotation, update directions and noise
task_angles = [0.0, 40.0]     # in-plane angles (degrees) of the two tasks' update directions
tilt_deg = 20.0               # lean of each update out of the core plane: sin(20°) < tau keeps one LBW direction per task
noise = 0.05                  # Gaussian part of each toy update, small beside its unit rank-1 part
spectra_dim = 24              # side of the square layer on which the five merges are compared
spectra_tasks = 4             # tasks merged on that layer
rsvd_shape = [512, 256]       # planted-rank matrix of the P7 check: large enough for RSVD to pay off, instant on CPU

# %%
from pactlib import merges
from pactlib.book import chapters, plotting, records, report
from pactlib.book.experiments import geometry

P = chapters.Method.check(globals())
path = records.records_path("01_method")  # the compute cells write here; the other cells read it

# %% [markdown]
# ## The method in $\mathbb R^3$
#
# A toy layer $W_0:\mathbb R^3\to\mathbb R^3$ with singular values 3, 2 and 0.3. We write every
# input vector in the basis of $W_0$'s right singular vectors, so the core ($K = 2$) is the
# plane of $e_1, e_2$ and $e_3$ is the direction $W_0$ hardly uses. Each task's update is a
# rank-one map along a unit input direction $v_t$ plus a little noise; $v_t$ leans `tilt_deg`
# out of the core plane, at its own angle inside it. With $k = 1$ the active subspace is
# (close to) $v_t$. In $\mathbb R^3$ the rank fractions are coarse, so the toy sets them
# explicitly: $K = 2$, $k = 1$, τ = 0.5 and a shield cap of two directions
# (`geometry.TOY_OPTIONS`).
#
# Why one LBW direction per task: removing $v_t$ from the core plane leaves the in-plane
# direction perpendicular to $v_t$ whole (σ₁ = 1), and of the other core direction only the
# sine of the tilt (σ₂ ≈ sin 20° ≈ 0.34 < τ). A tilt above 30° would keep both.

# %% tags=["compute"]
toy = geometry.toy_layer(angles_deg=task_angles, tilt_deg=tilt_deg, noise=noise, seed=seed)
records.write_records(path, geometry.toy_records(toy, params=P, seed=seed)
                      + geometry.toy_drawing_records(toy, params=P, seed=seed), replace=True);

# %%
frame = records.records_frame([r for r in records.read_records(path) if r["method"] == "toy-geometry"])
toy_frame = frame[frame["method"] == "toy-geometry"].set_index("task")[[
    "metrics.tilt_deg", "metrics.sigma_1", "metrics.sigma_2", "metrics.lbw_rank", "metrics.shield_rank",
    "metrics.removed_pact", "metrics.removed_spact", "metrics.intrusion_before", "metrics.intrusion_after"]]
toy_labels = {"tilt_deg": "tilt to core (°)", "sigma_1": "σ₁", "sigma_2": "σ₂", "lbw_rank": "LBW rank",
              "shield_rank": "shield rank", "removed_pact": "removed, PACT", "removed_spact": "removed, S-PACT",
              "intrusion_before": "intrusion before", "intrusion_after": "intrusion after"}
plotting.table(toy_frame.rename(columns=lambda c: toy_labels[c.removeprefix("metrics.")]), chapter=1, number=1,
               caption="The toy layer per task: angle of the active direction to the core (degrees), survival "
                       "values σ of P3, LBW and shield ranks, share of ‖Δt‖² removed by PACT and by S-PACT, and "
                       "the share of the other task's update energy inside this task's LBW subspace before and "
                       "after PACT (intrusion energy).")

# %%
with plotting.figure("toy-geometry", chapter=1, number=1, size=(9, 4.2), ncols=2,
                     caption="P1–P5 in the input space of the toy layer. Grey: the core V0,K. Solid arrows: each "
                             "task's update direction (length ‖Δt‖F); dashed lines: its LBW subspace; dotted arrows: "
                             "the dominant direction of the PACT-filtered update (length ‖Δ̃t‖F). Each filtered update "
                             "is perpendicular to the other task's LBW line.") as (fig, axes):
    geometry.draw_toy(fig, axes, [r for r in records.read_records(path) if r["method"] == "toy-drawing"])

# %% [markdown]
# Read the right panel from above. Task 1's LBW line (dashed, its colour) is the in-plane
# direction perpendicular to task 1's update: task 1 does not change it, but the pre-trained
# layer uses it a lot. Task 2's raw update has a component along that line, so merging the two
# raw updates would move a direction task 1 depends on. After the filter, task 2's update has
# lost that component (the *intrusion after* column of Table 1.1 is zero) and the same holds
# the other way round. The price is the removed share of each update's energy. S-PACT shields
# the whole core plane instead and removes more of each update.
#
# The check below holds by construction: the filtered updates have no energy in the other
# tasks' LBW subspaces, each LBW basis is orthogonal to its own task's active direction, and
# `pact_filter` run on the same layer as a one-key checkpoint gives the step-by-step result.

# %%
v = geometry.toy_verdict(frame)
plotting.verdict("the filter's geometry (P3–P5) on the toy layer", v)

# %%
from IPython.display import Markdown, display

display(Markdown({
    "reproduced": "The filter does what P3–P5 define, to rounding error: each filtered update leaves the other "
                  "task's LBW subspace untouched, each LBW basis is orthogonal to its task's active direction, and "
                  "the engine's `pact_filter` agrees with the step-by-step computation.",
    "contradicted": "At least one of these identities misses its tolerance: the filter as implemented departs from "
                    "P3–P5 on this layer, and the row that fails says where.",
}.get(v["status"], "The check did not reach a decision; the verdict box says why.")))

# %% [markdown]
# ## What the five merges do to a spectrum
#
# The base methods differ most in how they shape the singular values of the merged update.
# On one seeded layer (`spectra_dim` square, `spectra_tasks` tasks, each update of rank 3 plus
# 1 % noise) every registered method runs through the same registry call it uses on real
# checkpoints. Task Arithmetic keeps the spectrum of the sum: large values for the few
# directions the tasks use, then a cliff. TIES merges sparse, trimmed entries, which breaks the
# low rank: smaller top values and a long tail. TSV-M keeps each task's leading values and
# orthogonalises their directions. Iso-C and Iso-CTS flatten the spectrum to one value (their
# curves coincide here), the mean of the sum's singular values for Iso-C.

# %% tags=["compute"]
spectra = geometry.merge_spectra(n=spectra_dim, tasks=spectra_tasks, seed=seed)
records.write_records(path, [records.make_record(m, params=P, seed=seed, kind="merge-spectrum", index=i,
                                                 metrics={"sigma": float(s)})
                             for m, sv in spectra.items() for i, s in enumerate(sv)]);

# %%
frame = records.records_frame(path)
with plotting.figure("merge-spectra", chapter=1, number=2,
                     caption=f"Singular values of the merged update D of each base method (M1–M5) on one seeded "
                             f"{spectra_dim}×{spectra_dim} layer with {spectra_tasks} rank-3 task updates.") as (fig, ax):
    for m in merges.names():
        sel = frame[(frame["kind"] == "merge-spectrum") & (frame["method"] == m)]
        ax.plot(sel["index"], sel["metrics.sigma"], marker="o", ms=3, label=report.pretty(m))
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i(D)$", yscale="log")
    ax.legend(fontsize=7)

# %% [markdown]
# ## Randomized SVD (P7)
#
# PACT needs only the leading singular vectors of each layer, which a randomized range finder
# computes at a fraction of the cost of a full SVD. On a planted-rank matrix (rank 16 plus
# 10⁻³ noise, of shape `rsvd_shape`), the distance between the exact and the randomized top-16
# right singular subspaces is the sine of their largest principal angle
# (`pactlib.linalg.projector_distance`). The check uses the specification's p = 10 and q = 2
# ({ref}`P7 <eq-P7>`); `PactOptions` has settings of its own for the core and for the task
# updates, which chapter 8 measures, with what they mean for accuracy.

# %% tags=["compute"]
check = geometry.rsvd_check(m=rsvd_shape[0], n=rsvd_shape[1], seed=seed)
records.write_records(path, [records.make_record("rsvd-check", params=P, seed=seed, kind="rsvd", metrics=check)]);

# %%
m_, n_ = rsvd_shape
frame = records.records_frame(path)
row = frame[frame["method"] == "rsvd-check"].iloc[-1]
# a row of the mixed-type frame has dtype object, and plotting.table formats float columns only
values = row[["metrics.distance", "metrics.exact_seconds", "metrics.rsvd_seconds"]].astype(float)
rsvd_labels = {"distance": "projector distance", "exact_seconds": "exact SVD (s)",
               "rsvd_seconds": "randomized SVD (s)"}
plotting.table(values.to_frame("value").rename(index=lambda c: rsvd_labels[c.removeprefix("metrics.")]),
               chapter=1, number=2,
               floatfmt="{:.2e}",
               caption=f"Exact vs randomized top-16 right singular subspace of a {m_}×{n_} planted-rank matrix "
                       f"(oversampling 10, 2 power iterations): projector distance and seconds per call.")
