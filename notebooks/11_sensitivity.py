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
# # Sensitivity to K, k, tau and the shield cap
#
# How the results move with the core size K, the active size k, the tolerance tau and the shield
# cap; the sweep that fixes the book's defaults.
#
# *Equations and claims: P1–P4 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seed = 0                             # one seed per grid point keeps the sweep affordable
core_fracs = [0.1, 0.25, 0.5]        # K from a tenth to half of the rank
active_fracs = [0.05, 0.1, 0.2]      # k around the default
lbw_tols = [0.25, 0.5, 0.75]         # tau around method.md's 0.5
max_shield_fracs = [0.5, 0.75, 0.9]  # caps from half to most of the input space
demo_dim = 32                        # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seed=params.at_least(0),
    core_fracs=params.each(params.between(0, 1)),
    active_fracs=params.each(params.between(0, 1)),
    lbw_tols=params.each(params.between(0, 1)),
    max_shield_fracs=params.each(params.between(0, 1)),
    demo_dim=params.at_least(2),
)
P

# %% [markdown]
# The placeholder computation: the singular values of a seeded toy matrix of rank
# `demo_dim // 2` plus small noise, written as result records and plotted from them.

# %%
import torch

rank = demo_dim // 2
gen = torch.Generator().manual_seed(seed)
toy = torch.randn(demo_dim, rank, generator=gen) @ torch.randn(rank, demo_dim, generator=gen)
toy += 1e-3 * torch.randn(demo_dim, demo_dim, generator=gen)
sigma = torch.linalg.svdvals(toy)
path = records.records_path("11_sensitivity")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seed, metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=11, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("the defaults of K, k, tau and the cap", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
