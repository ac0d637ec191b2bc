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
# Removing a task's load-bearing-wall subspace from its own fine-tuned model against removing
# random subspaces of the same dimension (P1–P3, C4).
#
# *Equations and claims: P1–P3; C4 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seeds = [0, 1, 2]  # three seeds for a spread
core_frac = 0.25   # K as a fraction of the rank (set by chapter 11's sweep)
active_frac = 0.1  # k as a fraction of the rank
lbw_tol = 0.5      # tau of P3 (method.md default)
random_trials = 5  # five random subspaces per layer give a baseline spread
demo_dim = 32      # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seeds=params.each(params.at_least(0)),
    core_frac=params.between(0, 1),
    active_frac=params.between(0, 1),
    lbw_tol=params.between(0, 1),
    random_trials=params.at_least(1),
    demo_dim=params.at_least(2),
)
P

# %% [markdown]
# The placeholder computation: the singular values of a seeded toy matrix of rank
# `demo_dim // 2` plus small noise, written as result records and plotted from them.

# %%
import torch

rank = demo_dim // 2
gen = torch.Generator().manual_seed(seeds[0])
toy = torch.randn(demo_dim, rank, generator=gen) @ torch.randn(rank, demo_dim, generator=gen)
toy += 1e-3 * torch.randn(demo_dim, demo_dim, generator=gen)
sigma = torch.linalg.svdvals(toy)
path = records.records_path("04_subspace_perspective")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seeds[0], metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=4, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("C4", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
