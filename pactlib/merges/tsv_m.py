"""TSV-M (M3): Task Singular Vectors merge.

Gargiulo et al., "Task Singular Vectors: Reducing Task Interference in Model Merging", CVPR 2025.
"""
from __future__ import annotations

from torch import Tensor

from ..linalg import top_singular
from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .blocks import combine_blocks
from .driver import map_layers, mean_of
from .registry import alpha_grid, register


def tsv_m_kernel(deltas: Tensor) -> Tensor:
    """(T, m, n) -> (m, n): each task keeps its top r = max(1, ⌊min(m, n)/T⌋) singular triplets;
    stack; polar-orthogonalise U and V; D = U⊥ diag(S) V⊥ᵀ with the original values (M3)."""
    T, m, n = deltas.shape
    r = max(1, min(m, n) // T)
    return combine_blocks([top_singular(d, r) for d in deltas])


@register("tsv_m", pretty="TSV-M", reference="Gargiulo et al., CVPR 2025", alphas=alpha_grid(0.1, 3.0, 0.1))
def tsv_m(task_vectors: list[TaskVector], *, rule: MatrixRule) -> TaskVector:
    """TSV-M (M3) on matrix layers; mean of Δt on every other key."""
    return map_layers(task_vectors, rule, tsv_m_kernel, mean_of)
