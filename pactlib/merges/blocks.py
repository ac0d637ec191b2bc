"""Shared step of TSV-M and Iso-CTS: per-task singular blocks -> stack -> polar-orthogonalise.

Both methods build U = [U_1 … U_T] (m, Σ r_t), S and V = [V_1 … V_T] (n, Σ r_t) from per-task
singular triplets, replace U and V by their orthogonal polar factors, and recombine
D = U⊥ diag(S) V⊥ᵀ.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..linalg import Triplets, polar


def combine_blocks(blocks: Sequence[Triplets], *, values: Tensor | None = None) -> Tensor:
    """D = polar(U) diag(S) polar(V)ᵀ from stacked blocks (U_i (m, r_i), S_i, V_i (n, r_i)).

    Args:
        blocks: the per-task (or common) singular blocks, stacked in order.
        values: replacement singular values (Σ r_i,); default the blocks' own values.

    Returns:
        D (m, n). When Σ r_i > min(m, n) the polar factors have orthonormal rows instead of
        columns (a documented degenerate case of many tasks on a small layer).
    """
    U = torch.cat([b.U for b in blocks], dim=1)  # (m, R)
    V = torch.cat([b.V for b in blocks], dim=1)  # (n, R)
    S = torch.cat([b.S for b in blocks]) if values is None else values  # (R,)
    return (polar(U) * S) @ polar(V).mT
