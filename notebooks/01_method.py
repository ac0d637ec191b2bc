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
# PACT in equations: the matrix view (method.md §0), the pre-trained core $V_{0,K}$ (P1), the
# active update subspace $V_{t,k}$ (P2), the load-bearing-wall subspace (P3), the shield (P4)
# and the filter (P5), with S-PACT (P6) and randomized SVD (P7).
#
# *Equations and claims: P1–P7 (`method.md`).* **Placeholder:** this chapter has the structure
# of the final one (parameters, validation, a figure read from result records, a verdict);
# the experiment itself is still to be written.

# %% tags=["parameters"]
seed = 0           # one seeded toy layer is enough to illustrate the equations
core_frac = 0.25   # K = a quarter of the layer's rank (method.md §1; the book's sweep sets it)
active_frac = 0.1  # k = a tenth of the rank: task updates are low-rank
lbw_tol = 0.5      # tau of P3, method.md's default
demo_dim = 32      # size of the placeholder's toy matrix: instant on CPU

# %%
from pactlib import params, plotting, records

P = params.check(
    globals(),
    seed=params.at_least(0),
    core_frac=params.between(0, 1),
    active_frac=params.between(0, 1),
    lbw_tol=params.between(0, 1),
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
path = records.records_path("01_method")
records.write_records(path, [
    records.make_record("placeholder-spectrum", params=P, seed=seed, metrics={"sigma": s}, index=i)
    for i, s in enumerate(sigma)
], replace=True)
frame = records.records_frame(path)

# %%
with plotting.figure("placeholder-spectrum", chapter=1, number=1,
                     caption="Singular values of the placeholder toy matrix, read from its records.") as (fig, ax):
    ax.semilogy(frame["index"], frame["metrics.sigma"], marker="o")
    ax.set(xlabel="index $i$", ylabel=r"$\sigma_i$")

# %%
gap = frame["metrics.sigma"].iloc[rank - 1] / frame["metrics.sigma"].iloc[rank]
plotting.verdict("the equations (P1–P7)", "not yet tested",
                 f"Placeholder only: the toy spectrum drops by a factor {gap:.0f} after index {rank - 1}.")
