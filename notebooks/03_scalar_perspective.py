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
# Do barely-updated entries carry task knowledge? Fisher enrichment of small updates (S1, S2),
# the causal perturbation test (C2) and overwrite-and-restore after merging (C3).
#
# *Equations and claims: S1–S2; C1–C3 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seeds = [0, 1, 2]     # claims are judged on means over three seeds
fisher_samples = 256  # 256 examples per task: a stable diagonal Fisher on CPU
quantile = 0.1        # U_t and H_t are the lowest/top 10 % (method.md §3)
demo_dim = 32         # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seeds=params.each(params.at_least(0)),
    fisher_samples=params.at_least(1),
    quantile=params.between(0, 1),
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
path = records.records_path("03_scalar_perspective")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seeds[0], metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=3, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("C1–C3", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
