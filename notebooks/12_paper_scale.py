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
# # At paper scale
#
# The paper's CLIP ViT setting: the published reference numbers beside (never mixed with) what
# this project measures when a user supplies checkpoints.
#
# *Equations and claims: M1–M5, P4–P7 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seed = 0               # evaluation is deterministic; the seed fixes the validation split
checkpoint_dir = None  # paper-scale checkpoints exist in no registry: None = published numbers only
demo_dim = 32          # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seed=params.at_least(0),
    checkpoint_dir=None,
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
path = records.records_path("12_paper_scale")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seed, metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=12, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("the paper-scale comparison", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
