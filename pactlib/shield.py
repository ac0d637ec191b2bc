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

    The projection is applied twice (Δ̃ = P(P(Δ)), P(X) = X − (X S) Sᵀ): the same Δ̃ in exact
    arithmetic, but in float the first pass leaves a shield component at the rounding level of
    Δ, which the second reduces to the rounding level of Δ̃ itself. The shield's directions are
    then as exactly null in Δ̃ as its stored values allow, whatever share of Δ the filter removed,
    so the merges that decompose Δ̃ tell them from its real directions
    (:func:`pactlib.linalg.resolved_rank`).

    Returns a new tensor; Δ is not modified. The n x n projector is never formed.
    """
    if delta.shape[-1] != shield.shape[0]:
        raise ValueError(f"filter: update {tuple(delta.shape)} and shield {tuple(shield.shape)} do not match in n")
    S = shield.to(device=delta.device, dtype=delta.dtype)
    out = project_out(delta, S)
    if S.shape[1]:
        out.addmm_((S.mT @ out.mT).mT, S.mT, alpha=-1)  # the second pass, in place (as project_out)
    return out


def iter_shields(bases: Sequence[Tensor], n: int, *, max_frac: float = 0.5, tol: float = 1e-4,
                 dtype: torch.dtype | None = None) -> Iterator[Shield]:
    """Every task's shield: S_t = ``build_shield``([bases j ≠ t]) for t = 1..T (P4), one at a time.

    The same subspaces as T calls of :func:`build_shield` (equal up to rounding, with the same
    ranks, cap and order), for a fraction of the cost. With V = [V_1 … V_T] (n, c), c = Σ r_j, and
    task t's union M_t = [V_j]_{j≠t}: the singular values and left singular vectors of M_t are the
    eigenpairs of M_t M_tᵀ = V Vᵀ − V_t V_tᵀ. One eigendecomposition per layer gives an
    orthonormal basis B (n, R) of the union of all T bases in which V Vᵀ is diagonal,
    Bᵀ V Vᵀ B = Λ = diag(λ) (from the Gram matrix VᵀV (c, c) when c < n, else from V Vᵀ (n, n)),
    and the coordinates C = Bᵀ V (R, c); task t's matrix is then G_t = Λ − C_t C_tᵀ (R, R).
    Directions of the union with singular value below 1e-2·``tol`` (or 1e-7·σ_max) are left out of
    B: that moves each task's singular values by less than this, so only a value that close to
    ``tol`` could be kept or dropped otherwise.

    Each task's shield is then found in one of two ways:

    - **Complement (no eigendecomposition per task).** G_t = Λ^½ (I − F_t F_tᵀ) Λ^½ with
      F_t = Λ^-½ C_t (R, r_t), whose singular values φ_i are at most 1. By Ostrowski's theorem the
      j-th smallest eigenvalue of G_t is θ_j·h_j with θ_j in [λ_min, λ_max], h_j the j-th smallest
      of {1 − φ_i²} ∪ {1, …}. So the number d of directions of G_t below the tolerance is known
      exactly from the small SVD of F_t when the counts of h_j < thr²/λ_max and h_j < thr²/λ_min
      agree; those d directions (the ones task t alone brings) span Λ^-½ P_d (P_d: F_t's
      leading left singular vectors), exactly when their eigenvalues are 0, else up to an angle
      bounded by λ_max·h_d / (λ_min·h_(d+1) − λ_max·h_d), required below 1e-8. The shield is
      B times an orthonormal basis of their complement (the same subspace as the leading
      singular vectors of M_t; another orthonormal basis of it). Used when the count is certain,
      the bound holds and the cap does not bind (R − d ≤ cap).
    - **Eigendecomposition** of G_t (float64) otherwise: when the cap binds (its leading
      directions are needed), or the count or the angle is not certain. With c ≥ n (in R^n,
      without B) also for the first task and for every task whose shield is surely capped by
      the union ranks found so far, so that B is only made when some shield may be uncapped.

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
    full = sum(sizes) >= n
    # (n, c); in float64 when the per-task eigendecompositions work in R^n itself (VV (n, n)), else
    # in the bases' dtype: _union_coordinates reads it a block of rows at a time in float64
    V = torch.cat([b.double() if full else b for b in bases], dim=1)
    VV = V @ V.mT if full else None
    ends = torch.tensor(sizes).cumsum(0).tolist()
    coords = None  # (λ, C, B): made when first needed (with c ≥ n only if a shield may be uncapped)
    # With c ≥ n, the largest exact union rank found so far bounds the others': task t's is at least
    # that minus r_t (removing r_t columns removes at most r_t singular values above a threshold;
    # one threshold for all while 1e-7·σ_max < tol, σ_max ≤ √c), so task t's shield is surely
    # capped when known − r_t > cap; then, and for the first task, its eigendecomposition is taken
    # directly, and when every shield is capped the union's coordinates are never made.
    use_bound = full and 1e-7 * V.shape[1] ** 0.5 < tol
    known = -1
    for t in range(len(bases)):
        if sum(sizes) == sizes[t]:
            yield empty  # no other basis
            continue
        cols = slice(ends[t] - sizes[t], ends[t])
        direct = use_bound and (known < 0 or known - sizes[t] > cap)
        sh = None
        if not direct:
            if coords is None:
                coords = _union_coordinates(V, VV, tol, dtype)
                if not full:  # every later step works in B's coordinates: V (n, c) float64 can go
                    V = None
            lam, C, B = coords
            sh = _shield_by_complement(lam, C[:, cols], B, cap, tol)
        if sh is None:
            if full:  # M_t M_tᵀ in R^n
                Vt = V[:, cols]
                mu, W = torch.linalg.eigh(VV - Vt @ Vt.mT)
            else:  # in B's coordinates
                lam, C, B = coords
                Ct = C[:, cols]
                mu, W = torch.linalg.eigh(torch.diag(lam) - Ct @ Ct.mT)
            mu, W = mu.flip(0).clamp(min=0), W.flip(1)
            s = mu.sqrt()
            keep = s >= max(tol, 1e-7 * float(s[0]))
            union = int(keep.sum())
            capped = union > cap
            known = max(known, union)
            W = (W[:, keep][:, :cap] if capped else W[:, keep]).to(dtype)
            sh = Shield(W if full else B @ W, union, capped)
        yield sh


#: rows of V read at a time in float64 (:func:`_union_coordinates`)
_ROWS = 512


def _union_coordinates(V: Tensor, VV: Tensor | None, tol: float, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(λ (R,) descending, C = Bᵀ V (R, c) float64, B (n, R) in ``dtype``): an orthonormal basis B of
    the union of V's columns in which V Vᵀ is diagonal, Bᵀ V Vᵀ B = diag(λ), without the directions
    of singular value below max(1e-2·tol, 1e-7·σ_max) (:func:`iter_shields`). From the
    eigendecomposition of V Vᵀ (``VV``, (n, n), with V in float64) when given, else of the Gram
    matrix VᵀV (c, c), formed in float64 from V (any float dtype) a block of rows at a time."""
    if VV is None:  # the Gram matrix VᵀV (c, c) in float64, a block of V's rows at a time
        G = torch.zeros(V.shape[1], V.shape[1], dtype=torch.float64, device=V.device)
        for i in range(0, V.shape[0], _ROWS):
            Vi = V[i:i + _ROWS].double()
            G.addmm_(Vi.mT, Vi)
    lam, E = torch.linalg.eigh(VV if VV is not None else G)
    G = None
    lam, E = lam.flip(0).clamp(min=0), E.flip(1)  # descending
    sig = lam.sqrt()
    inside = sig > max(1e-2 * tol, 1e-7 * float(sig[0]))
    lam, sig, E = lam[inside], sig[inside], E[:, inside]
    if VV is not None:
        return lam, E.mT @ V, E.to(dtype)  # B (n, R), C (R, c)
    C = sig[:, None] * E.mT  # (R, c) = Bᵀ V
    E /= sig  # in place (E is the copy made by the mask): B = V E / σ, the union's orthonormal basis
    # formed a block of rows at a time in float64, each cast as it is made: for a wide layer
    # (n = 4096, c = T·K = 2,040 at T = 20) V and the product in float64 would be 67 MB each
    B = torch.empty(V.shape[0], E.shape[1], dtype=dtype, device=V.device)
    for i in range(0, V.shape[0], _ROWS):
        B[i:i + _ROWS] = V[i:i + _ROWS].double() @ E
    return lam, C, B


def _shield_by_complement(lam: Tensor, Ct: Tensor, B: Tensor, cap: int, tol: float) -> Shield | None:
    """Task t's shield from the small SVD of F_t = Λ^-½ C_t (:func:`iter_shields`, first way), or
    None when the rank count or the null directions are not certain, or the cap binds.

    ``lam`` (R,) descending and positive, ``Ct`` (R, r_t) float64; ``B`` (n, R) in the shields' dtype.
    """
    R = lam.shape[0]
    lmax, lmin = float(lam[0]), float(lam[-1])
    root = lam.sqrt()
    P, phi, _ = torch.linalg.svd(Ct / root[:, None], full_matrices=False)  # phi descending, (min(R, r_t),)
    h = torch.cat([(1 - phi ** 2).clamp(min=0), phi.new_ones(R - phi.shape[0])])  # ascending
    # the reference keeps σ ≥ max(tol, 1e-7·σ_max(M_t)), σ_max(M_t)² in [λ_max − ‖C_t‖², λ_max]
    thr_lo = max(tol, 1e-7 * max(lmax - float((Ct ** 2).sum()), 0.0) ** 0.5)
    thr_hi = max(tol, 1e-7 * lmax ** 0.5)
    d = int((h < thr_lo ** 2 / lmax).sum())
    if d != int((h < thr_hi ** 2 / lmin).sum()):
        return None  # the count is not certain
    union = R - d
    if union > cap:
        return None  # capped: its leading directions need the eigendecomposition
    if union == 0:
        return Shield(B.new_zeros(B.shape[0], 0), 0, False)
    if d == 0:
        return Shield(B, union, False)
    if lmax * float(h[d - 1]) > 1e-8 * (lmin * float(h[d]) - lmax * float(h[d - 1])):
        return None  # the null directions' angle bound is not small enough
    # Householder QR of the null directions X (R, d): its full Q (R, R) has X's span in its first
    # d columns and the complement in the rest; B Q is applied reflector by reflector (ormqr, in
    # the shields' dtype)
    a, tau = torch.geqrf(P[:, :d] / root[:, None])
    return Shield(torch.ormqr(a.to(B.dtype), tau.to(B.dtype), B, left=False)[:, d:], union, False)
