import math

import pytest
import torch

from pactlib import PactOptions
from pactlib.linalg import (default_rtol, exact_svdvals, gram_is_cheaper, numerical_rank, orth, polar, project_out,
                            projector_distance, resolution_floor, resolved_rank, top_singular)
from conftest import planted


def _proj(V):
    return V @ V.T


def test_exact_top_singular_is_orthonormal_and_ordered(gen):
    W = torch.randn(30, 20, generator=gen, dtype=torch.float64)
    U, S, V = top_singular(W, 5)
    assert U.shape == (30, 5) and V.shape == (20, 5)
    torch.testing.assert_close(V.T @ V, torch.eye(5, dtype=torch.float64))
    torch.testing.assert_close(U.T @ U, torch.eye(5, dtype=torch.float64))
    assert torch.all(S[:-1] >= S[1:])
    torch.testing.assert_close(S, torch.linalg.svdvals(W)[:5])


@pytest.mark.parametrize("shape", [(200, 120), (120, 200)])
def test_rsvd_matches_exact_on_planted_rank(gen, shape):
    W = planted(*shape, 8, gen=gen, decay=0.8, noise=1e-3)
    Ve = top_singular(W, 8).V
    Vr = top_singular(W, 8, method="rsvd", oversample=10, n_iter=2, seed=3).V
    # planted rank 8 with a 1e-3 noise floor: the subspaces agree to ~1e-3 (stated tolerance 1e-2)
    assert projector_distance(Ve, Vr) < 1e-2
    torch.testing.assert_close(_proj(Vr).T, _proj(Vr))


def _slowly_decaying(m, n, gen):
    """A trained-weight-like spectrum: σ_i = i^-1/2 over a quarter of the rank (σ_20 / σ_30 ≈ 0.8:
    no gap at the cut) on top of a small noise bulk; float32, as PACT's layers are."""
    r = min(m, n) // 4
    U = torch.linalg.qr(torch.randn(m, r, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(n, r, generator=gen, dtype=torch.float64))[0]
    S = torch.arange(1, r + 1, dtype=torch.float64) ** -0.5
    return ((U * S) @ V.T + 0.02 * torch.randn(m, n, generator=gen, dtype=torch.float64) / max(m, n) ** 0.5).float()


@pytest.mark.parametrize("shape", [(300, 200), (200, 300)])
@pytest.mark.parametrize("route", ["direct", "gram"])
def test_rsvd_defaults_find_the_top_subspace_of_a_slowly_decaying_spectrum(gen, shape, route):
    W = _slowly_decaying(*shape, gen)
    r = 20  # 0.1 of the rank, like PACT's core
    exact = top_singular(W, r).V
    o = PactOptions()
    V = top_singular(W, r, method="rsvd", oversample=o.oversample, n_iter=o.n_iter, seed=0, route=route).V
    # PACT's defaults: sine of the largest principal angle ~2e-3 here (stated tolerance 0.02)
    assert projector_distance(exact, V) < 0.02
    # P7's defaults (book/method.md) p = 10, q = 2 cannot separate the top 20 directions from the next ones (measured ~0.4-0.5)
    assert projector_distance(exact, top_singular(W, r, method="rsvd", oversample=10, n_iter=2, seed=0).V) > 0.3


@pytest.mark.parametrize("shape", [(300, 120), (120, 300)])
@pytest.mark.parametrize("n_iter", [0, 1, 3])
def test_rsvd_routes_compute_the_same_subspace(gen, shape, n_iter):
    W = torch.randn(*shape, generator=gen, dtype=torch.float64)
    a = top_singular(W, 10, method="rsvd", oversample=5, n_iter=n_iter, seed=4, route="direct")
    b = top_singular(W, 10, method="rsvd", oversample=5, n_iter=n_iter, seed=4, route="gram")
    assert a.U.shape == b.U.shape == (shape[0], 10) and a.V.shape == b.V.shape == (shape[1], 10)
    # same random draw, same subspace iteration: equal up to rounding (the spectral distance is
    # computed from cosines, so it bottoms out near 1e-8 in float64)
    assert projector_distance(a.V, b.V) < 1e-6 and projector_distance(a.U, b.U) < 1e-6
    torch.testing.assert_close(a.S, b.S, rtol=1e-10, atol=0)
    torch.testing.assert_close(b.V.T @ b.V, torch.eye(10, dtype=torch.float64))


@pytest.mark.parametrize("route", ["direct", "gram"])
def test_rsvd_is_seeded_and_leaves_global_rng_alone(gen, route):
    W = torch.randn(300, 200, generator=gen)
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    a = top_singular(W, 5, method="rsvd", seed=7, route=route).V
    assert torch.equal(before, torch.random.get_rng_state())
    b = top_singular(W, 5, method="rsvd", seed=7, route=route).V
    assert torch.equal(a, b)
    c = top_singular(W, 5, method="rsvd", seed=8, route=route).V
    assert not torch.equal(a, c)  # the seed is used (same subspace up to the noise of the method)


@pytest.mark.parametrize("route", ["direct", "gram"])
def test_rsvd_is_the_same_while_another_thread_draws_random_numbers(gen, route):
    """The start Ω comes from a generator of its own: a thread that draws from torch's global
    generator meanwhile (as a parallel layer's RSVD did when Ω came from the seeded global one)
    cannot change it. Ω is the global generator's draw after ``manual_seed(seed)``."""
    import threading

    W = torch.randn(200, 120, generator=gen)
    torch.manual_seed(4)
    want = torch.svd_lowrank(W, q=15, niter=1)[2][:, :5] if route == "direct" else None
    ref = top_singular(W, 5, method="rsvd", oversample=10, n_iter=1, seed=4, route=route).V
    if want is not None:  # the same draw as torch's own, up to rounding and signs
        torch.testing.assert_close((ref * want).sum(0).abs(), torch.ones(5), atol=1e-4, rtol=0)
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            torch.manual_seed(1)
            torch.randn(4096)

    th = threading.Thread(target=draw)
    th.start()
    try:
        got = [top_singular(W, 5, method="rsvd", oversample=10, n_iter=1, seed=4, route=route).V for _ in range(30)]
    finally:
        stop.set()
        th.join()
    assert all(torch.equal(g, ref) for g in got)


@pytest.mark.parametrize("route", ["auto", "direct", "gram"])
def test_rsvd_clamps_to_exact_for_small_matrices(gen, route):
    W = torch.randn(12, 10, generator=gen, dtype=torch.float64)
    e = top_singular(W, 4)
    r = top_singular(W, 4, method="rsvd", oversample=6, n_iter=8, route=route)  # 4 + 6 >= 10: exact fallback
    assert torch.equal(e.S, r.S) and torch.equal(e.V, r.V) and torch.equal(e.U, r.U)
    # one below the clamp the randomized method runs: another (valid) basis of the same subspace
    q = top_singular(W, 4, method="rsvd", oversample=5, n_iter=8, route=route)
    assert not torch.equal(e.V, q.V) and projector_distance(e.V, q.V) < 1e-6
    assert top_singular(W, 50).V.shape == (10, 10)  # r clamped to min(m, n)
    assert top_singular(W, 0).V.shape == (10, 0)
    with pytest.raises(ValueError, match="route"):
        top_singular(W, 2, method="rsvd", route="krylov")


def test_gram_route_pays_off_with_many_iterations():
    # ViT-B/32's c_fc (3072, 768): PACT's core with p = 40 (l = 117)
    assert gram_is_cheaper(3072, 768, 117, 8) and gram_is_cheaper(768, 3072, 117, 8)
    assert not gram_is_cheaper(3072, 768, 48, 2)  # few iterations: the Gram costs more than it saves
    flips = [gram_is_cheaper(768, 768, 58, q) for q in range(20)]
    assert flips == sorted(flips) and flips[-1]  # once cheaper, cheaper for every larger q


def test_orth_drops_near_zero_directions(gen):
    v = torch.randn(10, 1, generator=gen, dtype=torch.float64)
    A = torch.cat([v, 2 * v, 1e-9 * torch.randn(10, 1, generator=gen, dtype=torch.float64)], 1)
    Q, S = orth(A, tol=1e-6)
    assert Q.shape == (10, 1)
    assert S.shape == (3,)
    assert projector_distance(Q, v / v.norm()) < 1e-6


def test_projector_is_idempotent_symmetric_with_01_eigenvalues(gen):
    Q, _ = orth(torch.randn(15, 4, generator=gen, dtype=torch.float64), tol=1e-8)
    P = _proj(Q)
    torch.testing.assert_close(P @ P, P)
    torch.testing.assert_close(P, P.T)
    ev = torch.linalg.eigvalsh(P)
    assert torch.all((ev.abs() < 1e-10) | ((ev - 1).abs() < 1e-10))
    assert int((ev > 0.5).sum()) == 4


def test_polar_factor_is_orthonormal_and_nearest(gen):
    X = torch.randn(20, 6, generator=gen, dtype=torch.float64)
    Q = polar(X)
    torch.testing.assert_close(Q.T @ Q, torch.eye(6, dtype=torch.float64))
    # already orthonormal input is a fixed point
    torch.testing.assert_close(polar(Q), Q)


def _log_spaced(m, n, lo, gen):
    d = min(m, n)
    U = torch.linalg.qr(torch.randn(m, d, generator=gen, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, d, generator=gen, dtype=torch.float64)).Q
    return ((U * torch.logspace(0, math.log10(lo), d, dtype=torch.float64)) @ V.T).float()


@pytest.mark.parametrize("shape", [(64, 64), (256, 128), (48, 300)])
def test_resolved_rank_keeps_every_real_direction_of_a_full_rank_float32_layer(gen, shape):
    """Singular values from 1 down to 1e-6 (float32 resolves them all): full rank, with or without
    the SVD's values given; a relative tolerance max(m, n)·eps would cut the smallest."""
    X = _log_spaced(*shape, 1e-6, gen)
    d = min(shape)
    S = torch.linalg.svdvals(X)
    assert resolved_rank(X) == resolved_rank(X, S) == d
    assert numerical_rank(S, scale=S[0], rtol=default_rtol(shape, X.dtype)) < d
    assert resolved_rank(X, limit=5) == 5 and resolved_rank(torch.zeros(*shape)) == 0


@pytest.mark.parametrize("shape, r", [((64, 48), 3), ((300, 200), 16), ((200, 300), 1)])
def test_resolved_rank_finds_the_rank_of_float32_products_and_float64_matrices(gen, shape, r):
    """B·A of rank r rounded to float32 is full rank in float64 (its null directions sit at the
    rounding level of its values): the decision finds r; and r for the float64 product."""
    m, n = shape
    B, A = torch.randn(m, r, generator=gen), torch.randn(r, n, generator=gen)
    X = B @ A
    assert int(torch.linalg.matrix_rank(X.double())) == min(m, n)  # float64's tolerance alone: all
    s = exact_svdvals(X)
    assert float(s[r]) < resolution_floor(shape, X.dtype, float(X.double().norm())) < float(s[r - 1])
    assert resolved_rank(X) == resolved_rank(X, torch.linalg.svdvals(X)) == r
    assert resolved_rank(B.double() @ A.double()) == r


def test_polar_keeps_two_directions_float32_resolves(gen):
    """Two columns 1e-5 apart: their smaller singular value (about 7e-6) is real in float32, so
    the factor has two orthonormal columns; max(m, n)·eps·σ_max (1.1e-5) would merge them."""
    u = torch.randn(64, 1, generator=gen)
    w = torch.randn(64, 1, generator=gen)
    w = w - u * (u.T @ w) / (u.T @ u)
    X = torch.cat([u / u.norm(), u / u.norm() + 1e-5 * w / w.norm()], 1)  # (64, 2) float32
    P = polar(X)
    torch.testing.assert_close(P.T @ P, torch.eye(2), atol=1e-4, rtol=0)
    assert int(torch.linalg.matrix_rank(polar(X, rtol=default_rtol(X.shape, X.dtype)))) == 1


def test_project_out_matches_explicit_projector(gen):
    X = torch.randn(7, 15, generator=gen, dtype=torch.float64)
    S, _ = orth(torch.randn(15, 3, generator=gen, dtype=torch.float64), tol=1e-8)
    torch.testing.assert_close(project_out(X, S), X @ (torch.eye(15, dtype=torch.float64) - S @ S.T))


def test_projector_distance_values(gen):
    I = torch.eye(6, dtype=torch.float64)
    assert projector_distance(I[:, :2], I[:, :2]) == 0.0
    assert projector_distance(I[:, :2], I[:, 2:4]) == pytest.approx(1.0)
    assert projector_distance(I[:, :2], I[:, 2:4], norm="fro") == pytest.approx(2.0)
    c, s = torch.cos(torch.tensor(0.3, dtype=torch.float64)), torch.sin(torch.tensor(0.3, dtype=torch.float64))
    v = (c * I[:, 0] + s * I[:, 1]).unsqueeze(1)
    assert projector_distance(I[:, :1], v) == pytest.approx(float(s))
    with pytest.raises(ValueError, match="different spaces"):
        projector_distance(I[:, :1], torch.eye(5, dtype=torch.float64)[:, :1])


@pytest.mark.parametrize("shape", [(60, 24), (24, 60)])
@pytest.mark.parametrize("n_iter", [0, 1, 3])
def test_direct_route_is_torch_svd_lowrank(gen, shape, n_iter):
    # the direct route reimplements torch.svd_lowrank (same draw, same algorithm): compare with it
    from pactlib.linalg import _svd_lowrank_direct
    m, n = shape
    U0, V0 = torch.linalg.qr(torch.randn(m, m, generator=gen))[0], torch.linalg.qr(torch.randn(n, n, generator=gen))[0]
    s = 2.0 ** -torch.arange(min(m, n), dtype=torch.float32) * 10
    W = (U0[:, :min(m, n)] * s) @ V0[:, :min(m, n)].T
    torch.manual_seed(3)
    want = torch.svd_lowrank(W, q=12, niter=n_iter)
    torch.manual_seed(3)
    got = _svd_lowrank_direct(W, 12, n_iter)
    for a, b in zip(got, want):
        assert a.shape == b.shape
    r = 8  # well above the float32 floor (σ_8 / σ_1 = 2^-7)
    torch.testing.assert_close(got[1][:r], want[1][:r], rtol=1e-5, atol=0)
    for a, b in ((got[0], want[0]), (got[2], want[2])):  # singular vectors up to sign
        torch.testing.assert_close((a[:, :r] * b[:, :r]).sum(0).abs(), torch.ones(r), atol=1e-5, rtol=0)
    # a rank-deficient W (fewer than 12 non-zero singular values) falls back to the SVD of B
    torch.manual_seed(3)
    Ud, Sd, Vd = _svd_lowrank_direct(W[:, :3] @ W[:3, :] if m == n else (U0[:, :3] * s[:3]) @ V0[:, :3].T, 12, n_iter)
    assert torch.isfinite(Ud).all() and torch.isfinite(Vd).all() and Sd.shape == (12,)
