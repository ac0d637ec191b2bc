"""A merge is a function of the *set* of task vectors (issue: merges well defined on the updates
PACT creates): invariant under any task order, to float noise, and bit-identical for any thread
count — with and without PACT / S-PACT, for full and LoRA (rank <= r) task vectors, i.e. also on
exactly rank-deficient layers. The literal convention of the reference code is shown to fail the
order test there, so these tests can fail."""
import itertools
import math

import pytest
import torch

import pactlib
from pactlib import TaskVector, merges
from pactlib.matrix import MatrixRule
from pactlib.merges.driver import task_sum
from pactlib.merges.iso import iso_c_kernel, iso_cts_kernel
from pactlib.merges.tsv_m import tsv_m_kernel
from pactlib.linalg import default_rtol, polar, resolved_rank, svd
from pactlib.pact import pact_filter

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


def _raw_update(method, pre, tvs, pact, **params):
    """The method on the task vectors in the order given: merged_update's canonical order
    (pactlib.order) bypassed, to show what the order does to the kernels themselves."""
    if pact is not None:
        tvs, _ = pact_filter(dict(pre), list(tvs), mode=pact, rule=RULE)
    return merges.get(method)(list(tvs), rule=RULE, **params)


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
    a = _raw_update(method, pre, tvs, pact, null_space="literal")
    b = _raw_update(method, pre, tvs[::-1], pact, null_space="literal")
    assert _rel(a, b) > 0.1
    a = _raw_update(method, pre, tvs, pact)
    b = _raw_update(method, pre, tvs[::-1], pact)
    assert _rel(a, b) < 2e-5
    # merged_update merges the set in one canonical order: the same bytes, either convention
    for params in ({"null_space": "literal"}, {}):
        a, b = _update(method, pre, tvs, pact, **params), _update(method, pre, tvs[::-1], pact, **params)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_conventions_agree_on_full_rank_layers(gen):
    deltas = torch.randn(4, 20, 12, generator=gen, dtype=torch.float64)
    for kernel in (iso_c_kernel, tsv_m_kernel):
        torch.testing.assert_close(kernel(deltas, "drop"), kernel(deltas, "literal"))
    torch.testing.assert_close(iso_cts_kernel(deltas, 0.8, "drop"), iso_cts_kernel(deltas, 0.8, "literal"))


KERNELS = {"iso_c": iso_c_kernel, "tsv_m": tsv_m_kernel,
           "iso_cts": lambda deltas, null_space="drop", rank_rtol=None: iso_cts_kernel(deltas, 0.8, null_space, rank_rtol)}


def log_spectrum(m: int, n: int, lo: float, gen: torch.Generator) -> torch.Tensor:
    """A float32 (m, n) matrix of full rank: random orthonormal U, V, singular values log-spaced
    from 1 down to ``lo``."""
    d = min(m, n)
    U = torch.linalg.qr(torch.randn(m, d, generator=gen, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, d, generator=gen, dtype=torch.float64)).Q
    return ((U * torch.logspace(0, math.log10(lo), d, dtype=torch.float64)) @ V.T).float()


@pytest.mark.parametrize("shape", [(64, 64), (96, 48), (40, 120)])
@pytest.mark.parametrize("method", SVD_METHODS)
def test_conventions_agree_on_a_full_rank_layer_whose_spectrum_spans_1e6(method, shape, gen):
    """One float32 task whose spectrum runs from 1 to 1e-6: Iso-C's sum, TSV-M's task and
    Iso-CTS's residual all reach 1e-6·σ_max, below max(m, n)·eps·σ_max. Every direction is real
    (float32 resolves it), so the default convention is the reference one here."""
    layer = log_spectrum(*shape, 1e-6, gen)
    assert int(torch.linalg.matrix_rank(layer.double())) == min(shape)
    deltas, kernel = layer[None], KERNELS[method]  # (1, m, n)
    drop, literal = kernel(deltas), kernel(deltas, "literal")
    assert drop.dtype == torch.float32
    tol = 1e-7 * float(literal.abs().max())  # float32 rounding (the two share one SVD)
    torch.testing.assert_close(drop, literal, rtol=0, atol=tol)
    # a relative tolerance of max(m, n)·eps (torch.linalg.matrix_rank's) cuts real directions here:
    # Iso-C and Iso-CTS then flatten a different spectrum, TSV-M loses the smallest triplets
    cut = kernel(deltas, "drop", default_rtol(shape, torch.float32))
    assert float((cut - literal).abs().max()) > 10 * tol


@pytest.mark.parametrize("method", ["iso_c", "tsv_m"])
def test_conventions_agree_when_two_tasks_sum_to_such_a_layer(method, gen):
    """T = 2, both full rank: ΣΔt's spectrum runs from 1 to 1e-6 (Iso-C), and each task's from 1
    to 1e-6 over its first half (TSV-M's r = d/2 triplets). (Iso-CTS on two tasks that cancel to
    such a sum stacks two nearly opposite residuals: their polar factor is ill-posed in float32
    under either convention, so it is left out here.)"""
    layer = log_spectrum(64, 64, 1e-6, gen)
    other = 0.1 * torch.randn(64, 64, generator=gen)
    if method == "tsv_m":
        deltas = torch.stack([log_spectrum(64, 64, 1e-12, gen), log_spectrum(64, 64, 1e-12, gen)])
    else:
        deltas = torch.stack([layer - other, other])
    drop, literal = KERNELS[method](deltas), KERNELS[method](deltas, "literal")
    torch.testing.assert_close(drop, literal, rtol=0, atol=1e-7 * float(literal.abs().max()))


def _shared_dim(shields: list[torch.Tensor]) -> int:
    """dim of the subspace every shield (n, s_t) contains: the eigenvalue T of Σt St Stᵀ."""
    M = sum(S.double() @ S.double().T for S in shields)
    return int((torch.linalg.eigvalsh(M) > len(shields) - 1e-6).sum())


@pytest.mark.parametrize("kind", ["full", "lora"])
@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
def test_rank_found_on_pact_filtered_and_lora_updates_is_the_algebraic_rank(kind, pact):
    """The rank decision of null_space="drop" (:func:`pactlib.linalg.resolved_rank`) on the float32
    updates that PACT / S-PACT and LoRA make, and on their sums, is their rank in exact
    arithmetic: task t's filtered update min(rank Δt, n − s_t) (s_t its shield's size; LoRA
    rank Δt = r = 2), the sum min(m, Σ rank Δt, n − s∩) with s∩ the dimension the T shields
    share (S-PACT: its one shield; none without PACT)."""
    pre, tvs = _setting(kind)
    filtered, report = pact_filter(pre, tvs, mode=pact, rule=RULE, keep=True) if pact else (tvs, None)
    found = []
    for key in ("a.weight", "b.weight", "pw.weight"):
        mats = [RULE.view(key, tv[key]) for tv in filtered]  # (m, n) float32
        m, n = mats[0].shape
        shields = report.shields[key] if pact else [torch.zeros(n, 0)] * len(tvs)
        own = 2 if kind == "lora" else min(m, n)
        for t, x in enumerate(mats):
            assert resolved_rank(x) == min(own, n - shields[t].shape[1]), (key, t)
        shared = _shared_dim(shields) if pact else 0
        rank = min(m, own * len(tvs), n - shared)
        assert resolved_rank(task_sum(torch.stack(mats))) == rank, key
        found.append(rank < min(m, n))
    assert any(found) if (pact or kind == "lora") else not any(found)


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
