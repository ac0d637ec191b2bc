"""A merge is a function of the *set* of task vectors (issue: merges well defined on the updates
PACT creates): invariant under any task order, to float noise, and bit-identical for any thread
count — with and without PACT / S-PACT, for full and LoRA (rank <= r) task vectors, i.e. also on
exactly rank-deficient layers. The literal convention of the reference code is shown to fail the
order test there, so these tests can fail."""
import itertools

import pytest
import torch

import pactlib
from pactlib import TaskVector, merges
from pactlib.matrix import MatrixRule
from pactlib.merges.iso import iso_c_kernel, iso_cts_kernel
from pactlib.merges.tsv_m import tsv_m_kernel
from pactlib.linalg import polar, svd

RULE = MatrixRule()
SVD_METHODS = ("tsv_m", "iso_c", "iso_cts")
SHAPES = {"a.weight": (64, 48), "b.weight": (48, 64), "pw.weight": (40, 24, 1, 1), "a.bias": (64,)}


def _setting(kind: str, T: int = 4, seed: int = 0):
    """θ0 and T task vectors: ``full`` (dense) or ``lora`` (scale · B A, rank 2, zero off-matrix)."""
    g = torch.Generator().manual_seed(seed)
    pre = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    tvs = []
    for t in range(T):
        d = {}
        for k, s in SHAPES.items():
            if len(s) == 1:
                d[k] = 0.01 * torch.randn(s, generator=g) if kind == "full" else torch.zeros(s)
            elif kind == "full":
                d[k] = 0.05 * torch.randn(s, generator=g)
            else:
                m, n = s[0], s[1]
                d[k] = (0.5 * torch.randn(m, 2, generator=g) @ torch.randn(2, n, generator=g) / n).reshape(s)
        tvs.append(TaskVector(d, name=f"t{t}"))
    return pre, tvs


def _update(method, pre, tvs, pact, **params):
    D, _ = pactlib.merged_update(method, pre, tvs, pact=pact, rule=RULE, **params)
    return D


def _rel(D1, D2) -> float:
    num = sum(float((D1[k] - D2[k]).double().norm() ** 2) for k in D1)
    den = sum(float(D1[k].double().norm() ** 2) for k in D1)
    return (num / den) ** 0.5 if den else num ** 0.5


@pytest.mark.parametrize("kind", ["full", "lora"])
@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"])
def test_merge_is_invariant_under_task_order(method, pact, kind):
    pre, tvs = _setting(kind)
    ref = _update(method, pre, tvs, pact)
    assert sum(float(v.norm()) for v in ref.values()) > 0
    rng = torch.Generator().manual_seed(7)
    for _ in range(3):
        order = torch.randperm(len(tvs), generator=rng).tolist()
        assert _rel(ref, _update(method, pre, [tvs[i] for i in order], pact)) < 2e-5, order


@pytest.mark.parametrize("kind", ["full", "lora"])
@pytest.mark.parametrize("pact", [None, "pact"])
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"])
def test_merge_is_bit_identical_across_thread_counts(method, pact, kind):
    # layers large enough for MKL to split its SVD / eigh over threads
    g = torch.Generator().manual_seed(3)
    pre = {"big.weight": torch.randn(256, 384, generator=g), "x.weight": torch.randn(300, 200, generator=g)}
    tvs = []
    for t in range(3):
        if kind == "full":
            d = {k: 0.02 * torch.randn(v.shape, generator=g) for k, v in pre.items()}
        else:
            d = {k: torch.randn(v.shape[0], 4, generator=g) @ torch.randn(4, v.shape[1], generator=g) / 50
                 for k, v in pre.items()}
        tvs.append(TaskVector(d, name=f"t{t}"))
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(_update(method, pre, tvs, pact))
            assert torch.get_num_threads() == threads  # the caller's setting is restored
    finally:
        torch.set_num_threads(before)
    for other in outs[1:]:
        for k in outs[0]:
            assert torch.equal(outs[0][k], other[k]), k


@pytest.mark.parametrize("method, kind, pact", [("tsv_m", "full", "pact"), ("iso_c", "lora", None),
                                                ("iso_c", "full", "pact"), ("iso_cts", "lora", None)])
def test_literal_convention_depends_on_task_order_on_rank_deficient_layers(method, kind, pact):
    """The reference code's convention writes into arbitrary null directions: the defect the
    default convention removes (PACT-filtered sums and LoRA sums are rank-deficient). TSV-M's
    per-task null vectors depend on each task alone, so reordering exact LoRA updates does not
    move them, but the float noise of the PACT filter does."""
    pre, tvs = _setting(kind)
    a = _update(method, pre, tvs, pact, null_space="literal")
    b = _update(method, pre, tvs[::-1], pact, null_space="literal")
    assert _rel(a, b) > 0.1
    a = _update(method, pre, tvs, pact)
    b = _update(method, pre, tvs[::-1], pact)
    assert _rel(a, b) < 2e-5


def test_conventions_agree_on_full_rank_layers(gen):
    deltas = torch.randn(4, 20, 12, generator=gen, dtype=torch.float64)
    for kernel in (iso_c_kernel, tsv_m_kernel):
        torch.testing.assert_close(kernel(deltas, "drop"), kernel(deltas, "literal"))
    torch.testing.assert_close(iso_cts_kernel(deltas, 0.8, "drop"), iso_cts_kernel(deltas, 0.8, "literal"))


def test_iso_c_on_a_rank_deficient_sum_flattens_only_its_range(gen):
    """ΣΔt of rank 3 in a 10 x 8 layer: D = mean of the 3 values on the sum's range, zero elsewhere."""
    B = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    A = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    deltas = torch.stack([B @ torch.diag(torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)) @ A, B @ A])
    total = deltas.sum(0)
    U, S, Vh = torch.linalg.svd(total, full_matrices=False)
    D = iso_c_kernel(deltas)
    torch.testing.assert_close(D, S[:3].mean() * U[:, :3] @ Vh[:3])
    torch.testing.assert_close(torch.linalg.svdvals(D)[:3], S[:3].mean().expand(3))
    assert float(torch.linalg.svdvals(D)[3:].abs().max()) < 1e-10
    # nuclear norm kept, null space untouched
    torch.testing.assert_close(torch.linalg.svdvals(D).sum(), S.sum())
    null = torch.linalg.svd(total.T @ total)[0][:, 3:]  # right null space (8, 5)
    assert float((D @ null).abs().max()) < 1e-10


def test_tsv_m_drops_zero_triplets_of_low_rank_tasks(gen):
    """Two rank-1 tasks in a 6 x 6 layer (r = 3 per task): only their two real triplets count, so
    orthogonal tasks merge to their exact sum; the literal convention adds arbitrary vectors."""
    I = torch.eye(6, dtype=torch.float64)
    d1, d2 = 2 * torch.outer(I[0], I[1]), 3 * torch.outer(I[2], I[3])
    torch.testing.assert_close(tsv_m_kernel(torch.stack([d1, d2])), d1 + d2)


def test_canonical_polar_of_a_rank_deficient_stack(gen):
    X = torch.randn(9, 3, generator=gen, dtype=torch.float64)
    X = torch.cat([X, X[:, :1] + X[:, 1:2]], dim=1)  # (9, 4), rank 3
    P = polar(X)
    # a partial isometry on X's range: P Pᵀ P = P, and P maps the dependent combination to 0
    torch.testing.assert_close(P @ P.T @ P, P)
    torch.testing.assert_close(P @ torch.tensor([1.0, 1.0, 0.0, -1.0], dtype=torch.float64),
                               torch.zeros(9, dtype=torch.float64))
    # order of the columns does not matter (same factor, columns permuted)
    perm = [2, 0, 3, 1]
    torch.testing.assert_close(polar(X[:, perm]), P[:, perm])


def test_svd_falls_back_when_lapack_does_not_converge(monkeypatch, gen):
    X = torch.randn(12, 7, generator=gen)
    calls = []
    real = torch.linalg.svd

    def failing(A, *a, **kw):
        calls.append(A.dtype)
        raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", failing)
    U, S, Vh = svd(X)
    monkeypatch.setattr(torch.linalg, "svd", real)
    assert calls == [torch.float32, torch.float64]  # float32, then float64, then eigh
    assert U.dtype == X.dtype
    torch.testing.assert_close((U * S) @ Vh, X, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, torch.linalg.svdvals(X), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(U.T @ U, torch.eye(7), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", SVD_METHODS)
def test_bad_null_space_parameters_are_named(method):
    pre, tvs = _setting("full", T=2)
    with pytest.raises(ValueError, match="null_space"):
        merges.get(method)(tvs, rule=RULE, null_space="zero")
    with pytest.raises(ValueError, match="rank_rtol"):
        merges.get(method)(tvs, rule=RULE, rank_rtol=-1.0)
