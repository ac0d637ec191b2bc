"""TSV-M (M3): Task Singular Vectors merge.

Gargiulo et al., "Task Singular Vectors: Reducing Task Interference in Model Merging", CVPR 2025.
"""
from __future__ import annotations

from torch import Tensor

from ..linalg import Triplets, leading_triplets, svd
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import NullSpace, check_null_space, combine_blocks, in_range, kept_rank
from .driver import RunningSum, map_layers, mean_of
from .registry import alpha_grid, register


def tsv_m_kernel(deltas: Tensor, null_space: NullSpace = "drop", rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): each task keeps its top r = max(1, ⌊min(m, n)/T⌋) singular triplets;
    stack; polar-orthogonalise U and V; D = U⊥ diag(S) V⊥ᵀ with the original values (M3).

    With ``null_space="drop"`` each task keeps only those of its r triplets that its update's
    values resolve (:func:`pactlib.merges.blocks.kept_rank`; with ``rank_rtol``: values above
    ``rank_rtol`` × the layer's scale, the largest singular value of any task), and the polar
    factors are taken on the directions the stacked factors resolve (:mod:`pactlib.merges.blocks`):
    a task whose update has rank < r (PACT-filtered, LoRA) adds no arbitrary directions.
    ``"literal"`` stacks all r.
    """
    blocks = TsvBlocks(deltas.shape[0], null_space, rank_rtol)
    for d in deltas:
        blocks.add(d)
    return blocks.result()


class TsvBlocks:
    """TSV-M (M3) on one matrix layer, one task at a time (a
    :class:`pactlib.merges.driver.TaskReducer`): ``add(Δt)`` (m, n) keeps that task's top
    r = max(1, ⌊min(m, n)/T⌋) singular triplets (copies: r·(m + n + 1) values per task, about
    (m + n)·min(m, n) in all, whatever T); ``result()`` is :func:`tsv_m_kernel`'s D. With
    ``null_space="drop"`` an all-zero Δt needs no SVD (its triplets would all be dropped).
    Δt is not modified.
    """

    modifies_input = False

    def __init__(self, T: int, null_space: NullSpace = "drop", rank_rtol: float | None = None):
        self.T, self.null_space, self.rank_rtol = T, null_space, rank_rtol
        self.blocks: list[Triplets] = []
        self.shape: tuple[int, int] | None = None
        self.dtype = None

    def add(self, d: Tensor) -> None:
        m, n = self.shape = tuple(d.shape)
        self.dtype = d.dtype
        r = max(1, min(m, n) // self.T)
        if self.null_space == "drop" and not bool(d.any()):
            self.blocks.append(Triplets(d.new_zeros(m, 0), d.new_zeros(0), d.new_zeros(n, 0)))
            return
        U, S, Vh = svd(d)  # never fails to converge (float64 / eigh fallback)
        if self.null_space == "drop" and self.rank_rtol is None:  # this task's resolved directions
            r = kept_rank(d, S, None, limit=r)
        self.blocks.append(leading_triplets(U, S, Vh, r))

    def result(self) -> Tensor:
        blocks = self.blocks
        if self.null_space == "drop" and self.rank_rtol is not None:  # one tolerance for the layer
            scale = max(float(b.S[0]) if b.S.numel() else 0.0 for b in blocks)
            blocks = [in_range(b, float(self.rank_rtol) * scale) for b in blocks]
        return combine_blocks(blocks, literal=self.null_space == "literal")


def _tsv_m_reducer(T: int, matrix: bool, *, null_space: NullSpace = "drop", rank_rtol: float | None = None):
    """TSV-M's reducer for one key (:attr:`pactlib.merges.MergeMethod.reducer`): the blocks of a
    matrix layer, the mean over tasks elsewhere."""
    return TsvBlocks(T, null_space, rank_rtol) if matrix else RunningSum(lambda S: S / T)


@register("tsv_m", pretty="TSV-M", reference="Gargiulo et al., CVPR 2025", alphas=alpha_grid(0.1, 3.0, 0.1),
          reducer=_tsv_m_reducer, matrix_layers=True)
def tsv_m(task_vectors: list[TaskVector], *, rule: MatrixRule, null_space: NullSpace = "drop",
          rank_rtol: float | None = None) -> TaskVector:
    """TSV-M (M3) on matrix layers; mean of Δt on every other key.

    Args:
        null_space: ``"drop"`` (default) or ``"literal"``: how rank-deficient updates are treated
            (:mod:`pactlib.merges.blocks`; book chapter 5 compares them).
        rank_rtol: None (default): keep the directions the values resolve
            (:func:`pactlib.merges.blocks.kept_rank`); a number: a relative tolerance instead.

    Raises:
        ValueError: unknown ``null_space`` or ``rank_rtol`` outside [0, 1).
    """
    check_null_space(null_space, rank_rtol)
    return map_layers(task_vectors, rule, lambda x: tsv_m_kernel(x, null_space, rank_rtol), mean_of)
