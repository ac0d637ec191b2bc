"""Iso-C (M4) and Iso-CTS (M5): isotropic merging in common and task-specific subspaces.

Marczak et al., "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific
Subspaces", ICML 2025.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..linalg import Triplets, as_float64, leading_triplets, svd
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import NullSpace, check_null_space, combine_blocks, in_range, kept_rank
from .driver import RunningSum, map_layers, mean_of, task_sum
from .registry import alpha_grid, register


def iso_c_kernel(deltas: Tensor, null_space: NullSpace = "drop", rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): ΣΔt = U Σ Vᵀ; D = σ̄ U Vᵀ with a flat spectrum (M4):
    :func:`iso_c_of_sum` of the sum in task order (:func:`pactlib.merges.driver.task_sum`).

    ``null_space="drop"`` (default): only the r directions of ΣΔt its values resolve
    (:func:`pactlib.merges.blocks.kept_rank`: singular values in float64 above the float32
    rounding noise of ΣΔt; with ``rank_rtol``, above ``rank_rtol``·σ_max), with σ̄ their mean; D
    keeps the nuclear norm of ΣΔt on the directions the tasks span and is zero on the others.
    ``"literal"`` (the reference code): σ̄ is the mean of all min(m, n) values and every direction
    gets it, also the null directions of a rank-deficient sum, whose pairing the SVD picks
    arbitrarily. On a full-rank sum the two give the same D, also when its smallest singular
    values are far below max(m, n)·eps·σ_max.
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
    r = kept_rank(S, Sv, rank_rtol)
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
    singular value to the mean of the stacked values. The SVD of ΣΔt and the projections are taken
    in float64 (the result in the deltas' dtype): the residual of a task whose update lies in the
    common subspace is then zero to the rounding of its values, not to the float32 SVD's accuracy.

    ``null_space="drop"`` (default) keeps common directions only up to the number of directions
    ΣΔt resolves, and in each task's block only the directions its residual resolves above the
    rounding noise of Δt, which the residual inherits (:func:`pactlib.merges.blocks.kept_rank`);
    σ̄ is the mean over those. With ``rank_rtol``: values above ``rank_rtol``·σ_max(ΣΔt) in the
    common block and above ``rank_rtol`` × the layer's scale (the largest singular value of ΣΔt or
    of any task's residual) in the task blocks. ``"literal"`` keeps k and (d − k)/T directions
    whatever their values (zeros included in the mean), as the reference code.
    """
    T, m, n = deltas.shape
    d = min(m, n)
    k, per = iso_cts_split(d, T, common_frac)
    total = deltas.sum(0)  # (m, n)
    # the common subspace from the float64 SVD of the sum, and the residuals formed in float64: in
    # float32 the SVD's error in Uc would leak a rounding-sized part of Δt into its residual, where
    # it would look like task-specific directions (LoRA: Δt lies in the sum's range, its residual is 0)
    U, S, Vh = svd(as_float64(total))
    top = float(S[0]) if S.numel() else 0.0
    drop = null_space == "drop"
    if drop:  # the common block stops at the directions the sum resolves
        k = min(k, kept_rank(total, S, rank_rtol))
    Uc = U[:, :k]  # (m, k) float64
    dt = deltas.dtype
    to = dict(device=total.device, dtype=dt)  # as_float64 computes on the CPU for MPS
    blocks = [Triplets(Uc.to(**to), S[:k].to(**to), Vh[:k].mT.to(**to))]
    if per > 0:
        for delta in deltas:
            d64 = as_float64(delta)
            resid = (d64 - Uc @ (Uc.mT @ d64)).to(**to)  # task-specific part (m, n)
            Ur, Sr, Vhr = svd(resid)
            r = per
            if drop and rank_rtol is None:  # directions above the rounding noise of Δt
                r = kept_rank(resid, Sr, None, norm=float(torch.linalg.vector_norm(d64)), limit=per)
            blocks.append(leading_triplets(Ur, Sr, Vhr, r))
            del d64, resid, Ur, Sr, Vhr
    if drop and rank_rtol is not None:  # task blocks: values above rank_rtol × the layer's scale
        scale = max([top] + [float(b.S[0]) for b in blocks[1:] if b.S.numel()])
        blocks = blocks[:1] + [in_range(b, float(rank_rtol) * scale) for b in blocks[1:]]
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
        rank_rtol: None (default): keep the directions the values resolve
            (:func:`pactlib.merges.blocks.kept_rank`); a number: a relative tolerance instead.

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
        rank_rtol: None (default): keep the directions the values resolve
            (:func:`pactlib.merges.blocks.kept_rank`); a number: a relative tolerance instead.

    Raises:
        ValueError: ``common_frac`` outside (0, 1], unknown ``null_space`` or bad ``rank_rtol``.
    """
    check_null_space(null_space, rank_rtol)
    if not (0 < common_frac <= 1):
        raise ValueError(f"Iso-CTS common_frac must be in (0, 1], got {common_frac}")
    return map_layers(task_vectors, rule, lambda x: iso_cts_kernel(x, common_frac, null_space, rank_rtol),
                      mean_of)
