"""TSV-M (M3): Task Singular Vectors merge.

Gargiulo et al., "Task Singular Vectors: Reducing Task Interference in Model Merging", CVPR 2025.
"""
from __future__ import annotations

from torch import Tensor

from ..linalg import Triplets, svd
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import NullSpace, check_null_space, combine_blocks, in_range, rank_tol
from .driver import map_layers, mean_of
from .registry import alpha_grid, register


def tsv_m_kernel(deltas: Tensor, null_space: NullSpace = "drop", rank_rtol: float | None = None) -> Tensor:
    """(T, m, n) -> (m, n): each task keeps its top r = max(1, ⌊min(m, n)/T⌋) singular triplets;
    stack; polar-orthogonalise U and V; D = U⊥ diag(S) V⊥ᵀ with the original values (M3).

    With ``null_space="drop"`` a triplet whose value is at most ``rank_rtol`` × the layer's scale
    (the largest singular value of any task) is dropped before stacking, and the polar factors
    are taken on their numerical range (:mod:`pactlib.merges.blocks`): a task whose update has
    rank < r (PACT-filtered, LoRA) adds no arbitrary directions. ``"literal"`` stacks all r.
    """
    T, m, n = deltas.shape
    r = max(1, min(m, n) // T)
    blocks = []
    for d in deltas:
        U, S, Vh = svd(d)  # never fails to converge (float64 / eigh fallback)
        blocks.append(Triplets(U[:, :r], S[:r], Vh[:r].mT))
    if null_space == "drop":
        scale = max(float(b.S[0]) if b.S.numel() else 0.0 for b in blocks)
        tol = rank_tol((m, n), deltas.dtype, scale, rank_rtol)
        blocks = [in_range(b, tol) for b in blocks]
    return combine_blocks(blocks, literal=null_space == "literal")


@register("tsv_m", pretty="TSV-M", reference="Gargiulo et al., CVPR 2025", alphas=alpha_grid(0.1, 3.0, 0.1))
def tsv_m(task_vectors: list[TaskVector], *, rule: MatrixRule, null_space: NullSpace = "drop",
          rank_rtol: float | None = None) -> TaskVector:
    """TSV-M (M3) on matrix layers; mean of Δt on every other key.

    Args:
        null_space: ``"drop"`` (default) or ``"literal"``: how rank-deficient updates are treated
            (:mod:`pactlib.merges.blocks`; book chapter 5 compares them).
        rank_rtol: relative tolerance of the numerical range; None = max(m, n)·eps.

    Raises:
        ValueError: unknown ``null_space`` or ``rank_rtol`` outside [0, 1).
    """
    check_null_space(null_space, rank_rtol)
    return map_layers(task_vectors, rule, lambda x: tsv_m_kernel(x, null_space, rank_rtol), mean_of)
