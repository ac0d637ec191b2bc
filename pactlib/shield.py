"""Shields (P4) and the PACT filter (P5) for one matrix layer.

The shield of task t is an orthonormal basis S_t (n, s) of the union of the *other* tasks' LBW
subspaces; the filter removes the shield component of Δt: Δ̃t = Δt − (Δt S_t) S_tᵀ. The shield
is capped at ``max_shield_frac · n`` columns (and always below n), so that it can never cover the
whole input space and delete the update. Book: chapters 1, 6 and 11.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from .linalg import orth, project_out


class Shield(NamedTuple):
    """A shield: basis (n, s); ``union_rank`` before the cap; ``capped`` if the cap bound."""

    basis: Tensor
    union_rank: int
    capped: bool


def shield_cap(n: int, max_frac: float) -> int:
    """Largest shield size allowed in R^n: min(floor(max_frac·n), n − 1).

    Raises:
        ValueError: ``max_frac`` outside (0, 1] (``max_shield_frac``).
    """
    if not (0 < max_frac <= 1):
        raise ValueError(f"max_shield_frac must be in (0, 1], got {max_frac}")
    return max(0, min(int(max_frac * n), n - 1))


def build_shield(bases: Sequence[Tensor], n: int, *, max_frac: float = 0.5, tol: float = 1e-4) -> Shield:
    """Orthonormal basis of the union of ``bases`` (each (n, r_j)), capped (P4).

    M = [V_1 … V_J] (n, Σ r_j); thin SVD M = Q Σ Rᵀ; keep Q's columns with σ ≥ ``tol`` (the
    rank-revealing union); if more than ``shield_cap(n, max_frac)`` remain, keep the leading ones
    (directions shared by several bases have the largest σ and come first).

    Limitations: with Σ r_j close to n the union approaches R^n; the cap is what keeps the
    filtered update non-zero, and how often it binds is reported.

    Raises:
        ValueError: a basis not of n rows, or an invalid ``max_frac``.
    """
    cap = shield_cap(n, max_frac)
    bases = list(bases)
    device = bases[0].device if bases else None  # an empty shield lives where the bases do (cuda)
    bases = [b for b in bases if b.shape[1] > 0]
    for b in bases:
        if b.ndim != 2 or b.shape[0] != n:
            raise ValueError(f"shield: every basis must be (n={n}, r), got {tuple(b.shape)}")
    if not bases:
        return Shield(torch.zeros(n, 0, device=device), 0, False)
    Q, _ = orth(torch.cat(bases, dim=1), tol=tol)  # (n, union rank), leading directions first
    union = Q.shape[1]
    capped = union > cap
    return Shield(Q[:, :cap] if capped else Q, union, capped)


def filter_update(delta: Tensor, shield: Tensor) -> Tensor:
    """Δ̃ = Δ − (Δ S) Sᵀ for Δ (m, n) and a shield S (n, s) with orthonormal columns (P5).

    Returns a new tensor; Δ is not modified. The n x n projector is never formed.
    """
    if delta.shape[-1] != shield.shape[0]:
        raise ValueError(f"filter: update {tuple(delta.shape)} and shield {tuple(shield.shape)} do not match in n")
    return project_out(delta, shield.to(device=delta.device, dtype=delta.dtype))
