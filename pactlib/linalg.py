"""Small linear-algebra kernels: top-r singular subspaces (exact and randomized, P7),
rank-revealing orthonormal bases, polar factors and projector distances.

All functions take plain tensors and explicit scalars, compute in the input's floating dtype
(float32/float64; half precision is promoted to float32), never modify their inputs and never
form an n x n projector. Book: chapters 1 and 8.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

SvdMethod = Literal["exact", "rsvd"]
SvdRoute = Literal["auto", "direct", "gram"]


class Triplets(NamedTuple):
    """Top singular triplets of an (m, n) matrix: U (m, r), S (r,), V (n, r); W ≈ U diag(S) Vᵀ."""

    U: Tensor
    S: Tensor
    V: Tensor


def _as_compute(W: Tensor) -> Tensor:
    if W.ndim != 2:
        raise ValueError(f"expected a 2-d (m, n) matrix, got shape {tuple(W.shape)}")
    if not torch.is_floating_point(W):
        raise TypeError(f"expected a floating matrix, got dtype {W.dtype}")
    return W if W.dtype in (torch.float32, torch.float64) else W.float()


def top_singular(W: Tensor, r: int, *, method: SvdMethod = "exact", oversample: int = 10,
                 n_iter: int = 2, seed: int = 0, route: SvdRoute = "auto") -> Triplets:
    """Top-``r`` singular triplets of W (m, n), exact or randomized (P7).

    ``method="rsvd"`` is randomized subspace iteration (Halko, Martinsson & Tropp 2011, Alg. 4.4;
    ``torch.svd_lowrank``) on the tall orientation A (M, N) of W (Wᵀ when m < n): a Gaussian
    (N, r + ``oversample``) start Ω, ``n_iter`` = q power iterations with re-orthonormalisation,
    Q = orth((AAᵀ)^q A Ω), then the exact SVD of the small matrix QᵀA. Ω is drawn on the CPU
    from a generator of its own seeded by ``seed`` (the same numbers as torch's global generator
    after ``torch.manual_seed(seed)``) and moved to W's device, so the result is deterministic,
    also when layers run in parallel threads, the same start on every device, and the caller's
    random stream is not touched. When ``r + oversample >= min(m, n)`` the randomized method brings no saving and
    the exact SVD is used (clamping). ``r`` is clamped to ``min(m, n)``.

    ``route`` says how the iteration multiplies: ``"direct"`` through A and Aᵀ (2 products of
    size m·n·(r + p) per iteration: ``torch.svd_lowrank``'s algorithm, :func:`_svd_lowrank_direct`),
    ``"gram"`` through the Gram
    matrix G = AᵀA of W's smaller side, formed once (m·n·min(m, n)), after which an iteration
    costs one product of size min(m, n)²·(r + p). Both compute the same subspace from the same
    random draw (equal up to rounding); ``"auto"`` (default) takes the one with fewer flops
    (:func:`gram_is_cheaper`): the Gram pays off when q is large, as the slowly decaying spectra
    of pre-trained weights need.

    Limitations: the Gram route squares the spectrum, so in float32 its singular directions are
    accurate only for σ above about 1e-3·σ_max (the direct route and the exact SVD: about
    1e-5·σ_max); PACT's top 5–10 % directions normally sit far above that.

    Returns:
        :class:`Triplets` U (m, r'), S (r',), V (n, r') with r' = min(r, m, n), S descending.

    Raises:
        ValueError: W not 2-d, negative ``r``/``oversample``/``n_iter``, unknown ``method`` or
            ``route``.
    """
    W = _as_compute(W)
    m, n = W.shape
    if r < 0 or oversample < 0 or n_iter < 0:
        raise ValueError(f"r, oversample and n_iter must be >= 0, got {r}, {oversample}, {n_iter}")
    if method not in ("exact", "rsvd"):
        raise ValueError(f"unknown SVD method {method!r}; use 'exact' or 'rsvd'")
    if route not in ("auto", "direct", "gram"):
        raise ValueError(f"unknown RSVD route {route!r}; use 'auto', 'direct' or 'gram'")
    r = min(r, m, n)
    if r == 0:
        return Triplets(W.new_zeros(m, 0), W.new_zeros(0), W.new_zeros(n, 0))
    if method == "rsvd" and r + oversample < min(m, n):
        width = r + oversample
        gram = route == "gram" or (route == "auto" and gram_is_cheaper(m, n, width, n_iter))
        g = torch.Generator().manual_seed(seed)  # not the global one: threads share that
        U, S, V = _svd_lowrank_gram(W, width, n_iter, g) if gram else _svd_lowrank_direct(W, width, n_iter, g)
        return Triplets(U[:, :r], S[:r], V[:, :r])
    return leading_triplets(*_thin_svd(W), r)


def leading_triplets(U: Tensor, S: Tensor, Vh: Tensor, r: int) -> Triplets:
    """The leading r triplets of a thin SVD U (m, d), S (d,), Vh (d, n) as :class:`Triplets`
    U (m, r), S (r,), V (n, r). Copies when r < d: views would keep the full factors alive (a
    merge that keeps T tasks' leading triplets would hold T × (m·d + d·n) floats)."""
    if r < S.shape[0]:
        return Triplets(U[:, :r].clone(), S[:r].clone(), Vh[:r].mT.clone())
    return Triplets(U, S, Vh.mT)


def gram_is_cheaper(m: int, n: int, width: int, n_iter: int) -> bool:
    """Whether randomized subspace iteration with ``width`` = r + p columns and ``n_iter`` = q
    iterations on an (m, n) matrix is cheaper through the Gram matrix of its smaller side than
    through the matrix itself (:func:`top_singular`'s ``route="auto"``).

    A cost model in multiply-adds, with M ≥ N the sides of W and l = ``width``: a product costs
    its multiply-adds, a QR of a (k, l) matrix (with Q formed) 6·k·l² (about what it takes on one
    CPU thread: it runs far below the speed of a product). Direct: 2(q + 1)·M·N·l + 6·((q + 1)·M +
    q·N)·l². Gram: M·N² (forming G) + q·N²·l + 2·M·N·l + 6·(q·N + M)·l².
    """
    M, N, l, q = max(m, n), min(m, n), width, n_iter
    direct = 2 * (q + 1) * M * N * l + 6 * ((q + 1) * M + q * N) * l * l
    gram = M * N * N + q * N * N * l + 2 * M * N * l + 6 * (q * N + M) * l * l
    return gram < direct


def _start(A: Tensor, width: int, generator: torch.Generator | None) -> Tensor:
    """The Gaussian start Ω (N, width) of the randomized SVD of A (M, N), on A's device: drawn on
    the CPU from ``generator`` and moved there, or (None) from the global RNG of A's device."""
    if generator is None:
        return torch.randn(A.shape[1], width, dtype=A.dtype, device=A.device)
    return torch.randn(A.shape[1], width, dtype=A.dtype, generator=generator).to(A.device)


def _svd_lowrank_direct(W: Tensor, width: int, n_iter: int,
                        generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.svd_lowrank(W, q=width, niter=n_iter)``: the same algorithm on the same random draw
    (equal up to rounding), a little cheaper on one CPU thread.

    As there: on the tall orientation A (M, N), M ≥ N, Ω (N, width) drawn from ``generator``
    (a CPU one, Ω then moved to A's device; None: the global RNG on A's device, as torch draws it),
    Q = orth(A Ω), then ``n_iter`` times Q = orth(A orth(Aᵀ Q)) (Householder QR each time), and
    the SVD of the small B = QᵀA (width, N). Two differences: the products A X are formed as
    (Xᵀ Aᵀ)ᵀ (the same numbers; single-threaded MKL runs that orientation faster), and the SVD of
    B comes from the eigendecomposition of the float64 Gram matrix B Bᵀ (width, width) with
    V = Bᵀ U Σ⁻¹, accurate for every singular value above 1e-6·σ_max (the float32 SVD of B itself:
    about 1e-6 relative), a third of the cost. If B has smaller singular values, its SVD is taken.

    Returns:
        U (m, width), S (width,), V (n, width).
    """
    wide = W.shape[0] < W.shape[1]
    A = W.mT if wide else W  # (M, N), M >= N
    X = _start(A, width, generator)  # Ω (N, width)
    Q = torch.linalg.qr((X.mT @ A.mT).mT).Q  # (M, width)
    for _ in range(n_iter):
        Q = torch.linalg.qr(A.mT @ Q).Q  # (N, width)
        Q = torch.linalg.qr((Q.mT @ A.mT).mT).Q  # (M, width)
    B = Q.mT @ A  # (width, N)
    B64 = B.double()
    lam, Ub = torch.linalg.eigh(B64 @ B64.mT)  # ascending
    lam, Ub = lam.flip(0).clamp(min=0), Ub.flip(1)
    S = lam.sqrt()
    if float(S[-1]) > 1e-6 * float(S[0]):
        V, S, Ub = ((B64.mT @ Ub) / S).to(A.dtype), S.to(A.dtype), Ub.to(A.dtype)
    else:  # (nearly) rank-deficient B: the Gram cannot give those directions
        Ub, S, Vh = torch.linalg.svd(B, full_matrices=False)
        V = Vh.mT
    U = Q @ Ub  # (M, width)
    return (V, S, U) if wide else (U, S, V)


def _svd_lowrank_gram(W: Tensor, width: int, n_iter: int,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.svd_lowrank(W, q=width, niter=n_iter)`` computed through the Gram matrix.

    Like ``torch.svd_lowrank``, works on the tall orientation A (M, N), M ≥ N, and draws the same
    Gaussian start Ω (N, width) (from ``generator``, as :func:`_svd_lowrank_direct`). There Q = orth((AAᵀ)^q A Ω) is reached by 2q
    products with A and Aᵀ; here by q products with G = AᵀA (N, N): X = orth(G^q Ω) (orthonormalised
    after every product), Q = orth(A X). Then, as there, the exact SVD of QᵀA (width, N).

    Returns:
        U (m, width), S (width,), V (n, width).
    """
    wide = W.shape[0] < W.shape[1]
    A = W.mT if wide else W  # (M, N), M >= N
    G = A.mT @ A  # (N, N)
    X = _start(A, width, generator)  # Ω (N, width)
    for _ in range(n_iter):
        X = torch.linalg.qr(G @ X).Q
    Q = torch.linalg.qr(A @ X).Q  # (M, width)
    Ub, S, Vh = torch.linalg.svd(Q.mT @ A, full_matrices=False)  # (width, N) = Ub S Vh
    U, V = Q @ Ub, Vh.mT  # (M, width), (N, width)
    return (V, S, U) if wide else (U, S, V)


def top_right_singular_vectors(W: Tensor, r: int, **kw) -> Tensor:
    """Orthonormal basis (n, r') of the top-``r`` right singular subspace of W (m, n). See :func:`top_singular`."""
    return top_singular(W, r, **kw).V


def orth(A: Tensor, *, tol: float) -> tuple[Tensor, Tensor]:
    """Rank-revealing orthonormal basis of the column space of A (n, c) (P3, P4).

    Singular values and left singular vectors of A, keeping the directions whose singular value
    is >= ``tol`` (absolute). Unlike plain QR, a column that is almost zero is dropped rather than
    renormalised into noise. Computed from the float64 Gram matrix AᵀA (c, c) by ``eigh``:
    O(n c²), much cheaper than an SVD for the tall matrices used here, and exact to double
    precision for σ ≥ ~1e-7·σ_max (tolerances here are 1e-4 and above).

    Returns:
        (Q_kept (n, s) in A's dtype, sigma (min(n, c),) descending).

    Raises:
        ValueError: A not 2-d, or ``tol`` negative.
    """
    A = _as_compute(A)
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    n, c = A.shape
    if c == 0:
        return A.new_zeros(n, 0), A.new_zeros(0)
    A64 = A.double()
    lam, R = torch.linalg.eigh(A64.mT @ A64)  # ascending eigenvalues of AᵀA (c,)
    lam, R = lam.flip(0), R.flip(1)
    sigma = lam.clamp(min=0).sqrt()[: min(n, c)]
    keep = sigma >= max(tol, 1e-7 * float(sigma[0]) if len(sigma) else tol)
    Q = (A64 @ R[:, : len(sigma)][:, keep]) / sigma[keep]  # left singular vectors (n, s)
    return Q.to(A.dtype), sigma.to(A.dtype)


def default_rtol(shape: tuple[int, ...], dtype: torch.dtype) -> float:
    """The relative rank tolerance max(m, n)·eps(dtype), as ``torch.linalg.matrix_rank`` and
    NumPy use by default (half precision counts as float32, the dtype it is computed in)."""
    dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    return max(shape[-2:]) * torch.finfo(dtype).eps


def numerical_rank(S: Tensor, *, scale: float | Tensor, rtol: float) -> int:
    """Number of singular values S (descending) above ``rtol · scale``; 0 when ``scale`` is 0."""
    scale = float(scale)
    if scale <= 0 or S.numel() == 0:
        return 0
    return int((S > rtol * scale).sum())


#: How many times the typical rounding noise of a matrix's values a singular value must exceed to
#: count as a direction of the matrix (:func:`resolved_rank`). Chosen by measurement
#: (``bench/bench_null_space_rank.py``, records in ``book/data/rank_decision.jsonl``; book chapter 5,
#: "Rank-deficient layers"): the exact null directions of PACT-filtered and LoRA updates stored in
#: float32 sit below it, the smallest real directions of trained layers far above it.
RESOLUTION = 8.0


def resolution_floor(shape: tuple[int, ...], dtype: torch.dtype, norm: float) -> float:
    """The smallest singular value that the values of an (m, n) matrix in ``dtype`` resolve:
    ``RESOLUTION · eps(dtype) · norm · (1/√m + 1/√n)``, ``norm`` the Frobenius norm of the matrix
    (or of the matrix it was computed from).

    eps·‖X‖_F·(1/√m + 1/√n) is the typical spectral norm of a rounding error of relative size eps
    in every entry of X (a random (m, n) matrix of entries of root-mean-square eps·‖X‖_F/√(mn) has
    spectral norm about that): a singular value below it can be made by rounding X's values alone.
    Half precision counts as float32, the dtype it is computed in.
    """
    dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    m, n = shape[-2:]
    if m == 0 or n == 0:
        return 0.0
    return RESOLUTION * torch.finfo(dtype).eps * float(norm) * (m ** -0.5 + n ** -0.5)


def as_float64(X: Tensor) -> Tensor:
    """X in float64, on X's device (on the CPU for a device without float64: MPS)."""
    return (X.cpu() if X.device.type == "mps" else X).to(torch.float64)


def exact_svdvals(X: Tensor) -> Tensor:
    """The singular values (min(m, n),) of X's values, descending, computed in float64
    (:func:`as_float64`). Exact to float64 rounding for a float32 X. Should LAPACK not converge,
    from the float64 Gram matrix, as :func:`svd` (values below 1e-7·σ_max then come out as 0)."""
    X64 = as_float64(X.detach())
    try:
        return torch.linalg.svdvals(X64)
    except torch.linalg.LinAlgError:
        return _svd_by_eigh(X64)[1]


def resolved_rank(X: Tensor, S: Tensor | None = None, *, norm: float | None = None,
                  limit: int | None = None) -> int:
    """How many singular directions of X (m, n) its values resolve: the rank decision of
    ``null_space="drop"`` in TSV-M, Iso-C and Iso-CTS (M3–M5) and of :func:`polar`.

    Counts the singular values σ_i of X's values, computed in float64 (:func:`exact_svdvals`),
    above max(:func:`resolution_floor` of X's dtype and ``norm``, max(m, n)·eps64·σ_max). The exact
    null directions that algebra creates (a PACT projection, a LoRA product B·A of rank r, a sum of
    T such products) are not zero in stored float32 values: they sit at the rounding level of those
    values, far below the floor; a small but real direction (a full-rank layer's spectrum running
    to 1e-6·σ_max) lies above it, and is kept. The second term is float64's own tolerance: for a
    float64 X it is the larger. The decision depends on X's values only (not on how they were
    ordered or summed), so a merge built on it is a function of the set of task vectors.

    Args:
        X: the matrix (m, n), any floating dtype (half precision counts as float32).
        S: X's singular values, descending, from the SVD the caller takes anyway (in X's dtype
            or in float64), or None. When every one of the first ``limit`` values exceeds the floor
            by more than the accuracy of an SVD in S's dtype (max(m, n)·eps·σ_max) the answer is
            known without the float64 spectrum, which is then not computed; float64 values are
            that spectrum.
        norm: the Frobenius norm of the matrix whose rounding X inherits; default ‖X‖_F. A matrix
            computed from another one by a projection (Iso-CTS's task residual Δt − U Uᵀ Δt)
            carries that one's rounding noise: pass its norm.
        limit: count at most this many directions (default min(m, n)).

    Returns:
        The number r of resolved directions, 0 <= r <= min(limit, m, n); 0 for an all-zero X.

    Raises:
        ValueError / TypeError: X not a 2-d floating matrix.
    """
    X = _as_compute(X)
    m, n = X.shape
    d = min(m, n) if limit is None else max(0, min(int(limit), m, n))
    if d == 0:
        return 0
    nu = float(torch.linalg.vector_norm(X, dtype=torch.float64)) if norm is None else float(norm)
    if nu == 0.0 or not bool(X.any()):
        return 0
    floor = resolution_floor((m, n), X.dtype, nu)
    if S is not None and S.numel() >= d:
        band = default_rtol((m, n), S.dtype) * float(S[0])  # the accuracy of an SVD in S's dtype
        if float(S[d - 1]) > floor + band:
            return d
    s = S if S is not None and S.dtype == torch.float64 else exact_svdvals(X)
    tol = max(floor, max(m, n) * torch.finfo(torch.float64).eps * float(s[0]))
    return min(d, int((s > tol).sum()))


def _thin_svd(X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.linalg.svd(X, full_matrices=False)`` taken on X's tall orientation: a wide X (m < n)
    is decomposed as Xᵀ = V S Uᵀ. The same factors up to float noise and signs; on one CPU thread
    LAPACK's gesdd is faster on a tall matrix than on its wide transpose (ViT-B's MLP output layer
    under the default matrix view is wide; ``book/data/implementation_choices.jsonl``)."""
    if X.shape[-2] < X.shape[-1]:
        U, S, Vh = torch.linalg.svd(X.mT, full_matrices=False)
        return Vh.mT, S, U.mT
    return torch.linalg.svd(X, full_matrices=False)


def svd(X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD X = U diag(S) Vh that does not give up on ill-conditioned input.

    ``torch.linalg.svd`` (LAPACK gesdd on CPU) can fail to converge on matrices with many
    clustered singular values (e.g. stacks of orthonormal blocks). Then the SVD is retried in
    float64, and if that fails too it is computed from the eigendecomposition of the Gram
    matrix in float64 (always converges; exact for σ ≥ ~1e-7·σ_max, smaller values come out as
    0). The result is in X's compute dtype.

    Returns:
        U (m, d), S (d,) descending, Vh (d, n) with d = min(m, n).

    Raises:
        ValueError / TypeError: X not a 2-d floating matrix.
    """
    X = _as_compute(X)
    try:
        return _thin_svd(X)
    except torch.linalg.LinAlgError:
        pass
    X64 = X.double()
    try:
        U, S, Vh = _thin_svd(X64)
    except torch.linalg.LinAlgError:
        U, S, Vh = _svd_by_eigh(X64)
    return U.to(X.dtype), S.to(X.dtype), Vh.to(X.dtype)


def _svd_by_eigh(X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD from eigh of the smaller Gram matrix (float64 in, float64 out)."""
    m, n = X.shape
    wide = m < n
    A = X.mT if wide else X  # (p, q) with p >= q
    lam, Q = torch.linalg.eigh(A.mT @ A)  # ascending (q,)
    lam, Q = lam.flip(0).clamp(min=0), Q.flip(1)
    S = lam.sqrt()
    keep = S > 1e-7 * S[0] if S.numel() else S > 0
    P = torch.zeros(A.shape[0], len(S), dtype=A.dtype, device=A.device)
    P[:, keep] = (A @ Q[:, keep]) / S[keep]
    S = torch.where(keep, S, torch.zeros_like(S))
    if wide:  # X = Aᵀ = Q S Pᵀ
        return Q, S, P.mT
    return P, S, Q.mT


def polar(X: Tensor, *, rtol: float | None = None, literal: bool = False) -> Tensor:
    """Orthogonal polar factor of X (m, c) on its numerical range (M3, M5).

    From the thin SVD X = P Σ Qᵀ (:func:`svd`, which never fails to converge), returns
    P_r Q_rᵀ over the r directions X's values resolve (:func:`resolved_rank`), or, with ``rtol``,
    over the singular values above ``rtol · σ_max``. For X of full rank this is the usual polar
    factor, the nearest matrix with orthonormal columns (rows, if c > m) in Frobenius norm. For a
    rank-deficient X it is the canonical partial isometry: the usual factor is not unique there
    (the SVD pairs the null directions arbitrarily), this one is. ``literal=True`` keeps every
    direction, as the reference implementations do (P Qᵀ over all min(m, c) of them).
    """
    X = _as_compute(X)
    P, S, Qh = svd(X)
    if literal:
        return P @ Qh
    if rtol is None:
        r = resolved_rank(X, S)
    else:
        r = numerical_rank(S, scale=S[0] if S.numel() else 0.0, rtol=rtol)
    return P[:, :r] @ Qh[:r]


def project_out(X: Tensor, S: Tensor) -> Tensor:
    """X − (X S) Sᵀ for X (m, n) and an orthonormal basis S (n, s), without the n x n projector (P5)."""
    if S.shape[1] == 0:
        return X.clone()
    # X − (X S) Sᵀ, with X S formed as (Sᵀ Xᵀ)ᵀ: the same products, in the orientation that
    # single-threaded MKL runs faster (book/data/implementation_choices.jsonl); addmm fuses the subtraction
    return torch.addmm(X, (S.mT @ X.mT).mT, S.mT, alpha=-1)


def projector_distance(V1: Tensor, V2: Tensor, *, norm: Literal["fro", "spectral"] = "spectral") -> float:
    """‖V1 V1ᵀ − V2 V2ᵀ‖ for orthonormal bases V1 (n, a) and V2 (n, b), without forming n x n.

    Sign- and rotation-invariant: compares subspaces, not vectors. The spectral distance is the
    sine of the largest principal angle when a = b (1.0 when a != b and both are non-empty).
    The Frobenius one is sqrt(a + b − 2‖V1ᵀV2‖²_F).
    """
    if V1.shape[0] != V2.shape[0]:
        raise ValueError(f"bases live in different spaces: {tuple(V1.shape)} vs {tuple(V2.shape)}")
    C = V1.mT.double() @ V2.double()
    if norm == "fro":
        a, b = V1.shape[1], V2.shape[1]
        return float(torch.sqrt(torch.clamp(a + b - 2 * (C ** 2).sum(), min=0)))
    if norm != "spectral":
        raise ValueError(f"unknown norm {norm!r}; use 'fro' or 'spectral'")
    if V1.shape[1] == 0 and V2.shape[1] == 0:
        return 0.0
    if V1.shape[1] != V2.shape[1]:
        return 1.0
    cos = torch.linalg.svdvals(C).clamp(max=1.0)
    return float(torch.sqrt(1 - cos.min() ** 2))
