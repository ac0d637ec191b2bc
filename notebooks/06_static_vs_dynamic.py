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
# # Static versus dynamic shields (C8)
#
# S-PACT (P6), which shields every task with the pre-trained core, against PACT's mutual shields
# (P4).
#
# *Equations and claims: P4, P6; C8 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seeds = [0, 1, 2]          # three seeds for a spread
n_tasks = 4                # the largest T that runs in minutes
methods = ["ta", "iso_c"]  # one scalar and one subspace merge
demo_dim = 32              # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seeds=params.each(params.at_least(0)),
    n_tasks=params.at_least(2),
    methods=params.each(params.one_of("ta", "ties", "tsv_m", "iso_c", "iso_cts")),
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
path = records.records_path("06_static_vs_dynamic")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seeds[0], metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=6, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("C8", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
