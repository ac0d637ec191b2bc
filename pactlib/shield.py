"""Shields (P4) and the PACT filter (P5) for one matrix layer.

The shield of task t is an orthonormal basis S_t (n, s) of the union of the *other* tasks' LBW
subspaces; the filter removes the shield component of Δt: Δ̃t = Δt − (Δt S_t) S_tᵀ. The shield
is capped at ``max_shield_frac · n`` columns (and always below n), so that it can never cover the
whole input space and delete the update. Book: chapters 1, 6 and 11.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

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


def iter_shields(bases: Sequence[Tensor], n: int, *, max_frac: float = 0.5, tol: float = 1e-4,
                 dtype: torch.dtype | None = None) -> Iterator[Shield]:
    """Every task's shield: S_t = ``build_shield``([bases j ≠ t]) for t = 1..T (P4), one at a time.

    The same subspaces as T calls of :func:`build_shield` (equal up to rounding, with the same
    ranks, cap and order), for a fraction of the cost. With V = [V_1 … V_T] (n, c), c = Σ r_j, and
    task t's union M_t = [V_j]_{j≠t}: the singular values and left singular vectors of M_t are the
    eigenpairs of M_t M_tᵀ = V Vᵀ − V_t V_tᵀ, computed in coordinates of a basis B of the union of
    all T bases:

    - c < n: one eigendecomposition of the Gram matrix VᵀV (c, c) gives B (n, R), R = rank ≤ c,
      and the coordinates C = Bᵀ V (R, c) with C Cᵀ = diag(λ); task t's matrix is
      diag(λ) − C_t C_tᵀ (R, R). Directions of the union with singular value below
      1e-2·``tol`` (or 1e-7·σ_max) are left out of B: that moves each task's singular values by
      less than this, so only a value that close to ``tol`` could be kept or dropped otherwise.
    - c ≥ n: B = I, task t's matrix is V Vᵀ − V_t V_tᵀ (n, n).

    Either way one eigendecomposition of size min(n, R) per task instead of the Gram of
    Σ_{j≠t} r_j columns (which grows with T). Computed in float64.

    Args:
        bases: T orthonormal bases (n, r_j) (r_j may be 0).
        dtype: of the returned shields (default: the first basis's dtype).

    Yields:
        T :class:`Shield`\\ s, in the order of ``bases``, each made when asked for (only B and the
        coordinates are kept between them).

    Raises:
        ValueError: a basis not of n rows, or an invalid ``max_frac``.
    """
    cap = shield_cap(n, max_frac)
    for b in bases:
        if b.ndim != 2 or b.shape[0] != n:
            raise ValueError(f"shield: every basis must be (n={n}, r), got {tuple(b.shape)}")
    dtype = dtype or (bases[0].dtype if bases else torch.float32)
    sizes = [b.shape[1] for b in bases]
    device = bases[0].device if bases else None
    empty = Shield(torch.zeros(n, 0, dtype=dtype, device=device), 0, False)
    if sum(sizes) == 0:
        yield from (empty for _ in bases)
        return
    V = torch.cat([b.double() for b in bases], dim=1)  # (n, c)
    if V.shape[1] >= n:  # coordinates: R^n itself
        B, C = None, V
        G = V @ V.mT  # (n, n)
    else:
        lam, R = torch.linalg.eigh(V.mT @ V)  # ascending
        lam, R = lam.flip(0).clamp(min=0), R.flip(1)
        sig = lam.sqrt()
        inside = sig > max(1e-2 * tol, 1e-7 * float(sig[0]))
        lam, sig, R = lam[inside], sig[inside], R[:, inside]
        B = ((V @ R) / sig).to(dtype)  # (n, R): orthonormal basis of the union
        C = sig[:, None] * R.mT  # (R, c) = Bᵀ V
        G = torch.diag(lam)  # C Cᵀ
    ends = torch.tensor(sizes).cumsum(0).tolist()
    for t in range(len(bases)):
        if sum(sizes) == sizes[t]:
            yield empty  # no other basis
            continue
        Ct = C[:, ends[t] - sizes[t]: ends[t]]
        mu, W = torch.linalg.eigh(G - Ct @ Ct.mT)  # M_t M_tᵀ in B's coordinates, ascending
        mu, W = mu.flip(0).clamp(min=0), W.flip(1)
        s = mu.sqrt()
        keep = s >= max(tol, 1e-7 * float(s[0]))
        union = int(keep.sum())
        capped = union > cap
        W = (W[:, keep][:, :cap] if capped else W[:, keep]).to(dtype)
        yield Shield(W if B is None else B @ W, union, capped)
