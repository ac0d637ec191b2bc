"""Iso-C (M4) and Iso-CTS (M5): isotropic merging in common and task-specific subspaces.

Marczak et al., "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific
Subspaces", ICML 2025.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..linalg import Triplets
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import combine_blocks
from .driver import map_layers, mean_of
from .registry import alpha_grid, register


def iso_c_kernel(deltas: Tensor) -> Tensor:
    """(T, m, n) -> (m, n): ΣΔt = U Σ Vᵀ; D = σ̄ U Vᵀ with σ̄ the mean of all min(m, n)
    singular values (M4). The spectrum of D is flat and D shares singular vectors with ΣΔt."""
    U, S, Vh = torch.linalg.svd(deltas.sum(0), full_matrices=False)
    return S.mean() * (U @ Vh)


def iso_cts_split(d: int, T: int, common_frac: float) -> tuple[int, int]:
    """(k common directions, per-task directions) for rank d and T tasks (M5):
    k = d − round((d − ⌊c·d⌋)/T)·T, per task (d − k)/T."""
    if not (0 < common_frac <= 1):
        raise ValueError(f"Iso-CTS common_frac must be in (0, 1], got {common_frac}")
    k = d - round((d - int(common_frac * d)) / T) * T
    k = min(max(k, 0), d)
    return k, (d - k) // T


def iso_cts_kernel(deltas: Tensor, common_frac: float = 0.8) -> Tensor:
    """(T, m, n) -> (m, n): Iso-CTS (M5).

    Top-k common directions of ΣΔt; each task adds (d − k)/T directions from the SVD of its update
    with the common *left* subspace projected out; stack, polar-orthogonalise U and V, and set every
    singular value to the mean of the stacked values.
    """
    T, m, n = deltas.shape
    d = min(m, n)
    k, per = iso_cts_split(d, T, common_frac)
    U, S, Vh = torch.linalg.svd(deltas.sum(0), full_matrices=False)
    Uc = U[:, :k]  # (m, k)
    blocks = [Triplets(Uc, S[:k], Vh[:k].mT)]
    if per > 0:
        for delta in deltas:
            resid = delta - Uc @ (Uc.mT @ delta)  # task-specific part (m, n)
            Ut, St, Vth = torch.linalg.svd(resid, full_matrices=False)
            blocks.append(Triplets(Ut[:, :per], St[:per], Vth[:per].mT))
    values = torch.cat([b.S for b in blocks])
    return combine_blocks(blocks, values=torch.full_like(values, float(values.mean())))


@register("iso_c", pretty="Iso-C", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1))
def iso_c(task_vectors: list[TaskVector], *, rule: MatrixRule) -> TaskVector:
    """Iso-C (M4) on matrix layers; mean of Δt on every other key."""
    return map_layers(task_vectors, rule, iso_c_kernel, mean_of)


@register("iso_cts", pretty="Iso-CTS", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1))
def iso_cts(task_vectors: list[TaskVector], *, rule: MatrixRule, common_frac: float = 0.8) -> TaskVector:
    """Iso-CTS (M5) on matrix layers with common fraction ``common_frac`` (c, default 0.8);
    mean of Δt on every other key."""
    return map_layers(task_vectors, rule, lambda x: iso_cts_kernel(x, common_frac), mean_of)
