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
from .driver import RunningSum, map_layers, mean_of, reduce_stack, task_sum
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


def check_common_frac(common_frac: float) -> None:
    """Refuse an Iso-CTS common fraction c outside (0, 1] (M5); NaN is outside.

    Raises:
        ValueError: ``common_frac`` outside (0, 1].
    """
    if not (0 < common_frac <= 1):
        raise ValueError(f"Iso-CTS common_frac must be in (0, 1], got {common_frac}")


def iso_cts_split(d: int, T: int, common_frac: float) -> tuple[int, int]:
    """(k common directions, per-task directions) for rank d and T tasks (M5):
    k = d − round((d − ⌊c·d⌋)/T)·T, per task (d − k)/T.

    Raises:
        ValueError: ``common_frac`` outside (0, 1] (:func:`check_common_frac`).
    """
    check_common_frac(common_frac)
    k = d - round((d - int(common_frac * d)) / T) * T
    k = min(max(k, 0), d)
    return k, (d - k) // T


def iso_cts_kernel(deltas: Tensor, common_frac: float = 0.8, null_space: NullSpace = "drop",
                   rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): Iso-CTS (M5): :class:`IsoCTS` fed the T deltas (task order, two passes).

    Top-k common directions of ΣΔt; each task adds (d − k)/T directions from the SVD of its update
    with the common *left* subspace projected out; stack, polar-orthogonalise U and V, and set every
    singular value to the mean of the stacked values. The SVD of ΣΔt and the projections are taken
    in float64 (the result in the deltas' dtype): the residual of a task whose update lies in the
    common subspace is then zero to the rounding of its values, not to the float32 SVD's accuracy.

    ``null_space="drop"`` (default) keeps common directions only up to the number of directions
    ΣΔt resolves above the rounding noise it inherits from the tasks (of norm Σt‖Δt‖_F: the sum
    of tasks that cancel is that noise, and keeps none), and in each task's block only the
    directions its residual resolves above the rounding noise of Δt, which the residual inherits
    (:func:`pactlib.merges.blocks.kept_rank`);
    σ̄ is the mean over those. With ``rank_rtol``: values above ``rank_rtol``·σ_max(ΣΔt) in the
    common block and above ``rank_rtol`` × the layer's scale (the largest singular value of ΣΔt or
    of any task's residual) in the task blocks. ``"literal"`` keeps k and (d − k)/T directions
    whatever their values (zeros included in the mean), as the reference code.
    """
    return reduce_stack(IsoCTS(deltas.shape[0], common_frac, null_space, rank_rtol), deltas)


class IsoCTS:
    """Iso-CTS's D of one matrix key (M5; :func:`iso_cts_kernel`) from the T deltas given twice,
    one at a time (a two-pass :class:`pactlib.merges.driver.TaskReducer`): the first pass adds up
    ΣΔt in task order (:func:`pactlib.merges.driver.task_sum`), ``next_pass`` takes its float64
    SVD and the common block, the second pass keeps each task's leading residual triplets. Memory:
    the sum, its SVD and one task's residual, whatever T. The deltas are not modified.

    Raises:
        ValueError: ``common_frac`` outside (0, 1]; ``add`` after the second pass's T deltas,
            ``result`` before it.
    """

    passes = 2
    modifies_input = False

    def __init__(self, T: int, common_frac: float = 0.8, null_space: NullSpace = "drop",
                 rank_rtol: float | None = None):
        self.T, self.common_frac, self.null_space, self.rank_rtol = T, common_frac, null_space, rank_rtol
        check_common_frac(common_frac)
        self.total: Tensor | None = None
        self.norm = 0.0  # Σt ‖Δt‖_F: the scale of the sum's rounding noise
        self.seen = 0
        self.Uc: Tensor | None = None
        self.blocks: list[Triplets] = []
        self.top = 0.0
        self.per = 0

    def add(self, delta: Tensor) -> None:
        if self.Uc is None:  # first pass: ΣΔt in task order
            self.norm += float(torch.linalg.vector_norm(delta, dtype=torch.float64))
            if self.total is None:
                self.total = delta.clone()
            else:
                self.total += delta
            return
        if self.seen >= self.T:
            raise ValueError(f"Iso-CTS: more than {self.T} deltas in the second pass")
        self.seen += 1
        if self.per == 0:
            return
        d64 = as_float64(delta)
        resid = (d64 - self.Uc @ (self.Uc.mT @ d64)).to(device=self.total.device, dtype=self.total.dtype)
        Ur, Sr, Vhr = svd(resid)  # the task-specific part (m, n)
        r = self.per
        if self.null_space == "drop" and self.rank_rtol is None:  # directions above the rounding noise of Δt
            r = kept_rank(resid, Sr, None, norm=float(torch.linalg.vector_norm(d64)), limit=self.per)
        self.blocks.append(leading_triplets(Ur, Sr, Vhr, r))

    def next_pass(self) -> None:
        """The common block from the float64 SVD of ΣΔt (the first pass must be complete)."""
        if self.total is None:
            raise ValueError("no task was added")
        total = self.total
        m, n = total.shape
        d = min(m, n)
        k, self.per = iso_cts_split(d, self.T, self.common_frac)
        # the common subspace from the float64 SVD of the sum, and the residuals formed in float64: in
        # float32 the SVD's error in Uc would leak a rounding-sized part of Δt into its residual, where
        # it would look like task-specific directions (LoRA: Δt lies in the sum's range, its residual is 0)
        U, S, Vh = svd(as_float64(total))
        self.top = float(S[0]) if S.numel() else 0.0
        if self.null_space == "drop":  # the common block stops at the directions the sum resolves: its
            # values carry the rounding of the tasks' (a sum of tasks that cancel is rounding noise)
            k = min(k, kept_rank(total, S, self.rank_rtol, norm=self.norm))
        self.Uc = U[:, :k]  # (m, k) float64
        to = dict(device=total.device, dtype=total.dtype)  # as_float64 computes on the CPU for MPS
        self.blocks = [Triplets(self.Uc.to(**to), S[:k].to(**to), Vh[:k].mT.to(**to))]

    def result(self) -> Tensor:
        if self.Uc is None or self.seen < self.T:
            raise ValueError(f"Iso-CTS: {self.seen} of {self.T} deltas in the second pass")
        blocks = self.blocks
        if self.null_space == "drop" and self.rank_rtol is not None:  # task blocks: values above rank_rtol × scale
            scale = max([self.top] + [float(b.S[0]) for b in blocks[1:] if b.S.numel()])
            blocks = blocks[:1] + [in_range(b, float(self.rank_rtol) * scale) for b in blocks[1:]]
        values = torch.cat([b.S for b in blocks])
        if values.numel() == 0:
            return torch.zeros_like(self.total)
        return combine_blocks(blocks, values=torch.full_like(values, float(values.mean())),
                              literal=self.null_space == "literal")


def _iso_cts_reducer(T: int, matrix: bool, *, common_frac: float = 0.8, null_space: NullSpace = "drop",
                     rank_rtol: float | None = None):
    """Iso-CTS's reducer for one key (:attr:`pactlib.merges.MergeMethod.reducer`): :class:`IsoCTS`
    on a matrix key, the mean of Δt on any other."""
    return IsoCTS(T, common_frac, null_space, rank_rtol) if matrix else RunningSum(lambda S: S / T)


@register("iso_c", pretty="Iso-C", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1),
          reducer=_iso_c_reducer, matrix_layers=True)
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


@register("iso_cts", pretty="Iso-CTS", reference="Marczak et al., ICML 2025", alphas=alpha_grid(0.1, 3.0, 0.1),
          reducer=_iso_cts_reducer, matrix_layers=True)
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
    check_common_frac(common_frac)
    return map_layers(task_vectors, rule, lambda x: iso_cts_kernel(x, common_frac, null_space, rank_rtol),
                      mean_of)
