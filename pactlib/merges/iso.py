"""Iso-C (M4) and Iso-CTS (M5): isotropic merging in common and task-specific subspaces.

Marczak et al., "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific
Subspaces", ICML 2025.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..linalg import Triplets, leading_triplets, svd
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import NullSpace, check_null_space, combine_blocks, in_range, rank_tol
from .driver import RunningSum, map_layers, mean_of, task_sum
from .registry import alpha_grid, register


def iso_c_kernel(deltas: Tensor, null_space: NullSpace = "drop", rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): ΣΔt = U Σ Vᵀ; D = σ̄ U Vᵀ with a flat spectrum (M4):
    :func:`iso_c_of_sum` of the sum in task order (:func:`pactlib.merges.driver.task_sum`).

    ``null_space="drop"`` (default): only the numerical range of ΣΔt, the r singular values
    above ``rank_rtol``·σ_max (default max(m, n)·eps), with σ̄ their mean; D keeps the nuclear
    norm of ΣΔt on the directions the tasks span and is zero on the others. ``"literal"`` (the
    reference code): σ̄ is the mean of all min(m, n) values and every direction gets it, also the
    null directions of a rank-deficient sum, whose pairing the SVD picks arbitrarily. On a
    full-rank sum the two agree.
    """
    return iso_c_of_sum(task_sum(deltas), null_space, rank_rtol)


def iso_c_of_sum(S: Tensor, null_space: NullSpace = "drop", rank_rtol: float | None = None) -> Tensor:
    """(m, n) -> (m, n): Iso-C's D from the sum S = ΣΔt (M4; :func:`iso_c_kernel`). An all-zero S
    gives zeros without an SVD."""
    if not bool(S.any()):
        return torch.zeros_like(S)
    U, Sv, Vh = svd(S)
    if null_space == "literal":
        return Sv.mean() * (U @ Vh)
    r = int((Sv > rank_tol(S.shape, S.dtype, Sv[0] if Sv.numel() else 0.0, rank_rtol)).sum())
    if r == 0:
        return torch.zeros_like(S)
    return Sv[:r].mean() * (U[:, :r] @ Vh[:r])


def _iso_c_reducer(T: int, matrix: bool, *, null_space: NullSpace = "drop",
                   rank_rtol: float | None = None) -> RunningSum:
    """Iso-C's D of one key from the tasks' running sum (:attr:`pactlib.merges.MergeMethod.reducer`)."""
    return RunningSum((lambda S: iso_c_of_sum(S, null_space, rank_rtol)) if matrix else (lambda S: S / T))


def iso_cts_split(d: int, T: int, common_frac: float) -> tuple[int, int]:
    """(k common directions, per-task directions) for rank d and T tasks (M5):
    k = d − round((d − ⌊c·d⌋)/T)·T, per task (d − k)/T."""
    if not (0 < common_frac <= 1):
        raise ValueError(f"Iso-CTS common_frac must be in (0, 1], got {common_frac}")
    k = d - round((d - int(common_frac * d)) / T) * T
    k = min(max(k, 0), d)
    return k, (d - k) // T


def iso_cts_kernel(deltas: Tensor, common_frac: float = 0.8, null_space: NullSpace = "drop",
                   rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): Iso-CTS (M5).

    Top-k common directions of ΣΔt; each task adds (d − k)/T directions from the SVD of its update
    with the common *left* subspace projected out; stack, polar-orthogonalise U and V, and set every
    singular value to the mean of the stacked values.

    ``null_space="drop"`` (default) keeps common directions only up to the numerical rank of
    ΣΔt (values above ``rank_rtol``·σ_max(ΣΔt)), and in each task's block only directions whose
    value exceeds ``rank_rtol`` × the layer's scale (the largest singular value of ΣΔt or of any
    task's residual); σ̄ is the mean over those; ``"literal"`` keeps k and
    (d − k)/T directions whatever their values (zeros included in the mean), as the reference code.
    """
    T, m, n = deltas.shape
    d = min(m, n)
    k, per = iso_cts_split(d, T, common_frac)
    U, S, Vh = svd(deltas.sum(0))
    top = float(S[0]) if S.numel() else 0.0
    if null_space == "drop":  # the common block stops at the sum's numerical rank
        k = min(k, int((S > rank_tol((m, n), deltas.dtype, top, rank_rtol)).sum()))
    Uc = U[:, :k]  # (m, k)
    blocks = [Triplets(Uc, S[:k], Vh[:k].mT)]
    if per > 0:
        for delta in deltas:
            resid = delta - Uc @ (Uc.mT @ delta)  # task-specific part (m, n)
            blocks.append(leading_triplets(*svd(resid), per))
            del resid
    if null_space == "drop":  # task blocks: values above the tolerance of the layer's scale
        scale = max([top] + [float(b.S[0]) for b in blocks[1:] if b.S.numel()])
        tol = rank_tol((m, n), deltas.dtype, scale, rank_rtol)
        blocks = blocks[:1] + [in_range(b, tol) for b in blocks[1:]]
    values = torch.cat([b.S for b in blocks])
    if values.numel() == 0:
        return torch.zeros_like(deltas[0])
    return combine_blocks(blocks, values=torch.full_like(values, float(values.mean())),
                          literal=null_space == "literal")


@register("iso_c", pretty="Iso-C", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1),
          reducer=_iso_c_reducer)
def iso_c(task_vectors: list[TaskVector], *, rule: MatrixRule, null_space: NullSpace = "drop",
          rank_rtol: float | None = None) -> TaskVector:
    """Iso-C (M4) on matrix layers; mean of Δt on every other key.

    Args:
        null_space: ``"drop"`` (default) or ``"literal"`` (:func:`iso_c_kernel`; book chapter 5).
        rank_rtol: relative tolerance of the numerical range; None = max(m, n)·eps.

    Raises:
        ValueError: unknown ``null_space`` or ``rank_rtol`` outside [0, 1).
    """
    check_null_space(null_space, rank_rtol)
    return map_layers(task_vectors, rule, lambda x: iso_c_kernel(x, null_space, rank_rtol), mean_of)


@register("iso_cts", pretty="Iso-CTS", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1))
def iso_cts(task_vectors: list[TaskVector], *, rule: MatrixRule, common_frac: float = 0.8,
            null_space: NullSpace = "drop", rank_rtol: float | None = None) -> TaskVector:
    """Iso-CTS (M5) on matrix layers with common fraction ``common_frac`` (c, default 0.8);
    mean of Δt on every other key.

    Args:
        common_frac: c in (0, 1].
        null_space: ``"drop"`` (default) or ``"literal"`` (:func:`iso_cts_kernel`; book chapter 5).
        rank_rtol: relative tolerance of the numerical range; None = max(m, n)·eps.

    Raises:
        ValueError: ``common_frac`` outside (0, 1], unknown ``null_space`` or bad ``rank_rtol``.
    """
    check_null_space(null_space, rank_rtol)
    if not (0 < common_frac <= 1):
        raise ValueError(f"Iso-CTS common_frac must be in (0, 1], got {common_frac}")
    return map_layers(task_vectors, rule, lambda x: iso_cts_kernel(x, common_frac, null_space, rank_rtol),
                      mean_of)
