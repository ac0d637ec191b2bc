import pytest
import torch

from pactlib.linalg import orth, polar, project_out, projector_distance, top_singular
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


def test_rsvd_is_seeded_and_leaves_global_rng_alone(gen):
    W = torch.randn(300, 200, generator=gen)
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    a = top_singular(W, 5, method="rsvd", seed=7).V
    assert torch.equal(before, torch.random.get_rng_state())
    b = top_singular(W, 5, method="rsvd", seed=7).V
    assert torch.equal(a, b)


def test_rsvd_clamps_to_exact_for_small_matrices(gen):
    W = torch.randn(12, 10, generator=gen, dtype=torch.float64)
    e = top_singular(W, 4)
    r = top_singular(W, 4, method="rsvd", oversample=10)  # 4 + 10 >= 10: exact fallback
    torch.testing.assert_close(e.S, r.S)
    assert top_singular(W, 50).V.shape == (10, 10)  # r clamped to min(m, n)
    assert top_singular(W, 0).V.shape == (10, 0)


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
