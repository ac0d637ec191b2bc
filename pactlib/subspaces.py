"""Subspaces of one matrix layer (book/method.md, subspaces): pre-trained core (P1), active update subspace
(P2) and the load-bearing-wall (LBW) subspace (P3).

Every subspace is a subspace of the layer's **input** space R^n, given as an orthonormal basis
V (n, r). Ranks are chosen as a fraction of the layer rank min(m, n) or as the smallest rank
holding a fraction of the squared Frobenius energy. Book: chapters 1, 4 and 11.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .linalg import orth, top_singular


def choose_rank(W: Tensor, *, frac: float | None = None, energy: float | None = None,
                nonzero: bool | None = None) -> int:
    """Rank for a matrix W (m, n): ``max(1, round(frac·min(m, n)))`` or the smallest r whose top-r
    singular values hold ``energy`` of ‖W‖²_F. Exactly one of ``frac`` / ``energy`` is given.

    Returns 0 for an all-zero W (nothing to keep). ``nonzero``: whether W has a non-zero entry, when
    the caller already knows (else checked here: a pass over W).

    Raises:
        ValueError: both or neither given, or a value outside (0, 1].
    """
    if (frac is None) == (energy is None):
        raise ValueError("give exactly one of frac= or energy= to choose a rank")
    value, label = (frac, "frac") if frac is not None else (energy, "energy")
    if not (0 < value <= 1):
        raise ValueError(f"{label} must be in (0, 1], got {value}")
    d = min(W.shape)
    if not (bool(W.any()) if nonzero is None else nonzero):
        return 0
    if frac is not None:
        return max(1, min(d, round(frac * d)))
    s2 = torch.linalg.svdvals(W.float() if W.dtype not in (torch.float32, torch.float64) else W) ** 2
    cum = torch.cumsum(s2, 0) / s2.sum()
    return int(min(d, int(torch.searchsorted(cum, torch.tensor(energy, dtype=cum.dtype, device=cum.device) - 1e-12)) + 1))


def pretrained_core(W0: Tensor, K: int, **svd) -> Tensor:
    """V0,K (n, K): top-K right singular vectors of the pre-trained matrix W0 (m, n) (P1).

    ``svd`` is passed to :func:`pactlib.linalg.top_singular` (``method``, ``oversample``,
    ``n_iter``, ``seed``)."""
    return top_singular(W0, K, **svd).V


def active_subspace(delta: Tensor, k: int, *, nonzero: bool | None = None, **svd) -> Tensor:
    """Vt,k (n, k): top-k right singular vectors of the task update Δt (m, n) (P2).

    An all-zero Δt has no active subspace: returns (n, 0). ``nonzero``: whether Δt has a non-zero
    entry, when the caller already knows (else checked here)."""
    if not (bool(delta.any()) if nonzero is None else nonzero):
        return delta.new_zeros(delta.shape[1], 0, dtype=torch.promote_types(delta.dtype, torch.float32))
    return top_singular(delta, k, **svd).V


class LBW(NamedTuple):
    """An LBW subspace: basis (n, r) and the survival values σ (K,) in [0, 1] of the core."""

    basis: Tensor
    sigma: Tensor


def lbw_subspace(core: Tensor, active: Tensor, *, tol: float = 0.5) -> LBW:
    """Vt,LBW = orth((I − Vt,k Vt,kᵀ) V0,K) with rank-revealing tolerance τ = ``tol`` (P3).

    A = V0,K − Vt,k (Vt,kᵀ V0,K) (n, K); thin SVD A = Q Σ Rᵀ; keep Q's columns with σ ≥ τ.
    σ_i ∈ [0, 1] is how much of a core direction survives outside the task's active subspace.

    Args:
        core: V0,K (n, K), orthonormal columns.
        active: Vt,k (n, k), orthonormal columns (k may be 0).
        tol: τ in [0, 1] (``lbw_tol``, default 0.5).

    Raises:
        ValueError: bases in different spaces, or ``tol`` outside [0, 1].
    """
    if core.shape[0] != active.shape[0]:
        raise ValueError(f"core {tuple(core.shape)} and active {tuple(active.shape)} live in different spaces")
    if not (0 <= tol <= 1):
        raise ValueError(f"lbw_tol must be in [0, 1], got {tol}")
    A = core - active @ (active.mT @ core) if active.shape[1] else core  # (n, K)
    Q, sigma = orth(A, tol=tol)
    return LBW(Q, sigma)


def intrusion_energy(others: list[Tensor], basis: Tensor) -> float:
    """Σ_j ‖Δj V‖²_F / Σ_j ‖Δj‖²_F: the share of the other tasks' update energy that lands in the
    subspace V (n, r) (book/method.md, C9). NaN when the others are all zero."""
    num = sum(float(((d @ basis) ** 2).sum()) for d in others) if basis.shape[1] else 0.0
    den = sum(float((d ** 2).sum()) for d in others)
    return num / den if den > 0 else math.nan
