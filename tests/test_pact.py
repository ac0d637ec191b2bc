"""P1–P6 on synthetic matrices: LBW subspaces, shields, the filter, PACT vs S-PACT."""
import pytest
import torch

from pactlib import PactOptions, TaskVector, pact_filter, task_vectors_from
from pactlib.linalg import projector_distance
from pactlib.matrix import MatrixRule
from pactlib.pact import layer_subspaces
from pactlib.shield import build_shield, filter_update, iter_shields, shield_cap
from pactlib.subspaces import active_subspace, choose_rank, intrusion_energy, lbw_subspace, pretrained_core


def _basis(n, r, gen):
    Q, _ = torch.linalg.qr(torch.randn(n, r, generator=gen, dtype=torch.float64))
    return Q


def test_lbw_of_core_orthogonal_to_active_is_the_core(gen):
    I = torch.eye(8, dtype=torch.float64)
    core, active = I[:, :3], I[:, 5:7]
    lbw = lbw_subspace(core, active, tol=0.5)
    assert projector_distance(lbw.basis, core) < 1e-6
    torch.testing.assert_close(lbw.sigma, torch.ones(3, dtype=torch.float64))


def test_lbw_drops_core_directions_inside_the_active_subspace():
    I = torch.eye(8, dtype=torch.float64)
    core = I[:, :3]
    active = I[:, 1:2]  # swallows the second core direction
    lbw = lbw_subspace(core, active, tol=0.5)
    assert lbw.basis.shape == (8, 2)
    assert projector_distance(lbw.basis, I[:, [0, 2]]) < 1e-6
    # partial overlap: a core direction at 60° from the active one survives with σ = sin 60°
    a = (0.5 * I[:, 0] + (3 ** 0.5 / 2) * I[:, 4]).unsqueeze(1)
    lbw = lbw_subspace(I[:, :1], a, tol=0.5)
    assert float(lbw.sigma[0]) == pytest.approx(3 ** 0.5 / 2)
    assert lbw_subspace(I[:, :1], a, tol=0.9).basis.shape == (8, 0)


def test_lbw_basis_is_orthonormal_and_orthogonal_to_active(gen):
    core, active = _basis(30, 6, gen), _basis(30, 4, gen)
    lbw = lbw_subspace(core, active, tol=0.3)
    B = lbw.basis
    torch.testing.assert_close(B.T @ B, torch.eye(B.shape[1], dtype=torch.float64))
    assert float((active.T @ B).abs().max()) < 1e-10
    assert torch.all((lbw.sigma >= 0) & (lbw.sigma <= 1 + 1e-12))


def test_choose_rank_frac_and_energy(gen):
    W = torch.diag(torch.tensor([3.0, 2.0, 1.0, 0.0]))
    assert choose_rank(W, frac=0.5) == 2
    assert choose_rank(W, frac=0.01) == 1
    assert choose_rank(W, energy=9 / 14) == 1
    assert choose_rank(W, energy=13 / 14) == 2
    assert choose_rank(W, energy=1.0) == 3
    assert choose_rank(torch.zeros(4, 4), frac=0.5) == 0
    with pytest.raises(ValueError, match="exactly one"):
        choose_rank(W, frac=0.1, energy=0.9)


def test_shield_is_union_and_cap_binds(gen):
    I = torch.eye(10, dtype=torch.float64)
    sh = build_shield([I[:, :2], I[:, 1:4]], 10, max_frac=0.5)
    assert sh.union_rank == 4 and not sh.capped
    assert projector_distance(sh.basis, I[:, :4]) < 1e-6
    sh = build_shield([I[:, :4], I[:, 4:8]], 10, max_frac=0.5)
    assert sh.union_rank == 8 and sh.capped and sh.basis.shape == (10, 5)


def test_shared_directions_come_first_when_capped():
    I = torch.eye(6, dtype=torch.float64)
    # direction e0 is in all three bases; the cap keeps it
    sh = build_shield([I[:, [0, 1]], I[:, [0, 2]], I[:, [0, 3]]], 6, max_frac=1 / 6)
    assert sh.basis.shape == (6, 1)
    assert projector_distance(sh.basis, I[:, :1]) < 1e-6


def test_shield_never_covers_the_whole_space(gen):
    n = 6
    assert shield_cap(n, 1.0) == n - 1
    sh = build_shield([torch.eye(n, dtype=torch.float64)], n, max_frac=1.0)
    assert sh.capped and sh.basis.shape == (n, n - 1)
    delta = torch.randn(4, n, generator=gen, dtype=torch.float64)
    assert filter_update(delta, sh.basis).norm() > 0
    with pytest.raises(ValueError, match="max_shield_frac"):
        shield_cap(n, 0.0)


@pytest.mark.parametrize("n, ranks, max_frac", [(40, [5, 7, 0, 6], 0.5), (30, [12, 10, 9, 11], 0.5),
                                                (24, [6, 6, 6], 0.25), (16, [4], 0.5), (20, [0, 0], 0.5)])
def test_iter_shields_equal_build_shield_per_task(gen, n, ranks, max_frac):
    # overlapping bases (a shared block plus private directions), of fewer and of more columns in all than n
    shared = _basis(n, 3, gen)
    bases = []
    for r in ranks:
        if r == 0:
            bases.append(torch.zeros(n, 0, dtype=torch.float64))
            continue
        M = torch.cat([shared + 0.3 * torch.randn(n, 3, generator=gen, dtype=torch.float64),
                       torch.randn(n, r - 3, generator=gen, dtype=torch.float64)], dim=1)[:, :r]
        bases.append(torch.linalg.qr(M).Q)
    got = list(iter_shields(bases, n, max_frac=max_frac, tol=1e-4))
    assert len(got) == len(bases)
    for t, sh in enumerate(got):
        want = build_shield([b for j, b in enumerate(bases) if j != t], n, max_frac=max_frac, tol=1e-4)
        assert (sh.union_rank, sh.capped, sh.basis.shape) == (want.union_rank, want.capped, want.basis.shape)
        assert sh.basis.dtype == torch.float64
        if want.basis.shape[1]:
            torch.testing.assert_close(sh.basis @ sh.basis.T, want.basis @ want.basis.T, atol=1e-10, rtol=0)
            torch.testing.assert_close(sh.basis.T @ sh.basis, torch.eye(sh.basis.shape[1], dtype=torch.float64))


@pytest.mark.parametrize("n, T, r, shared, max_frac", [(40, 4, 6, 3, 0.9), (24, 5, 5, 2, 1.0), (30, 3, 4, 0, 0.5),
                                                      (12, 5, 4, 2, 0.5)])
def test_iter_shields_complement_matches_the_eigendecomposition(monkeypatch, gen, n, T, r, shared, max_frac):
    # LBW-like bases (a block shared by all, perturbed per task, plus each task's own directions): the
    # shields found from the small SVD of F_t (no eigendecomposition per task) equal those from the
    # eigendecomposition of each task's union, and those of build_shield; more columns in all than n
    # (24 and 12) and fewer (40, 30); the last one is capped, so it takes the eigendecompositions
    import pactlib.shield as shield
    base = _basis(n, shared, gen) if shared else torch.zeros(n, 0, dtype=torch.float64)
    bases = [torch.linalg.qr(torch.cat([base + 0.1 * torch.randn(n, shared, generator=gen, dtype=torch.float64),
                                        torch.randn(n, r - shared, generator=gen, dtype=torch.float64)], 1)).Q
             for _ in range(T)]
    taken = []
    original = shield._shield_by_complement

    def spy(*a, **kw):
        out = original(*a, **kw)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(shield, "_shield_by_complement", spy)
    got = list(iter_shields(bases, n, max_frac=max_frac, tol=1e-4))
    monkeypatch.setattr(shield, "_shield_by_complement", lambda *a, **kw: None)
    eig = list(iter_shields(bases, n, max_frac=max_frac, tol=1e-4))
    # with c = T·r ≥ n the first task takes the eigendecomposition (nothing known yet), and every
    # task whose shield is then surely capped too (the last case: all of them)
    capped = max_frac == 0.5 and n == 12
    assert taken == ([] if capped else [True] * (T - (T * r >= n)))
    for t, (a, b) in enumerate(zip(got, eig)):
        want = build_shield([x for j, x in enumerate(bases) if j != t], n, max_frac=max_frac, tol=1e-4)
        for other in (b, want):
            assert (a.union_rank, a.capped, a.basis.shape) == (other.union_rank, other.capped, other.basis.shape)
            torch.testing.assert_close(a.basis @ a.basis.T, other.basis @ other.basis.T, atol=1e-10, rtol=0)
        torch.testing.assert_close(a.basis.T @ a.basis, torch.eye(a.basis.shape[1], dtype=torch.float64))
    # float32 bases: float32 shields, the same subspaces to float32 rounding
    got32 = list(iter_shields([b.float() for b in bases], n, max_frac=max_frac, tol=1e-4))
    for a, b in zip(got32, eig):
        assert a.basis.dtype == torch.float32 and a.union_rank == b.union_rank
        torch.testing.assert_close((a.basis @ a.basis.T).double(), b.basis @ b.basis.T, atol=1e-5, rtol=0)


def test_iter_shields_complement_refuses_an_uncertain_count():
    # λ_min of the union ~1e-10 (a direction barely present) makes the count uncertain: None, and
    # iter_shields falls back to the eigendecomposition (test above: same shields)
    from pactlib.shield import _shield_by_complement
    lam = torch.tensor([2.0, 1.0, 1e-10], dtype=torch.float64)
    Ct = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    assert _shield_by_complement(lam, Ct, torch.eye(3, dtype=torch.float64), 2, 1e-4) is None
    # a clear case: task t alone brings the third direction
    lam = torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64)
    Ct = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.5 ** 0.5]], dtype=torch.float64)
    sh = _shield_by_complement(lam, Ct, torch.eye(3, dtype=torch.float64), 2, 1e-4)
    assert sh is not None and sh.union_rank == 2 and not sh.capped
    torch.testing.assert_close(sh.basis @ sh.basis.T, torch.diag(torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)))


def test_iter_shields_drops_directions_only_task_t_brings():
    I = torch.eye(8, dtype=torch.float64)
    bases = [I[:, [0, 1]], I[:, [0, 2]], I[:, [0, 3]] * 1.0]
    shields = list(iter_shields(bases, 8, max_frac=1.0))
    torch.testing.assert_close(shields[0].basis @ shields[0].basis.T, torch.diag(I[:, [0, 2, 3]].sum(1)))
    torch.testing.assert_close(shields[2].basis @ shields[2].basis.T, torch.diag(I[:, [0, 1, 2]].sum(1)))
    # a direction of the union barely present (σ = 1e-5 < shield_tol) is not shielded
    tiny = torch.linalg.qr(torch.stack([I[:, 4] + 1e-5 * I[:, 5], I[:, 6]], 1)).Q
    bases = [I[:, [4]], tiny]
    sh = list(iter_shields(bases, 8, max_frac=1.0, tol=1e-4))
    assert sh[1].union_rank == 1 and sh[0].union_rank == 2


def test_active_subspaces_use_their_own_rsvd_settings(monkeypatch, gen):
    import pactlib.subspaces as subspaces
    calls = []
    original = subspaces.top_singular

    def spy(W, r, **kw):
        calls.append((tuple(W.shape), kw["oversample"], kw["n_iter"]))
        return original(W, r, **kw)

    monkeypatch.setattr(subspaces, "top_singular", spy)
    W0 = torch.randn(60, 50, generator=gen)
    deltas = [torch.randn(60, 50, generator=gen) for _ in range(2)]
    opts = PactOptions(svd="rsvd", oversample=7, n_iter=5, active_oversample=3, active_n_iter=1)
    layer_subspaces(W0, deltas, opts)
    assert calls == [((60, 50), 7, 5), ((60, 50), 3, 1), ((60, 50), 3, 1)]
    assert opts.active_svd_kw == dict(method="rsvd", oversample=3, n_iter=1, seed=0)


def test_filter_removes_exactly_the_shield_component(gen):
    S = _basis(12, 4, gen)
    delta = torch.randn(5, 12, generator=gen, dtype=torch.float64)
    out = filter_update(delta, S)
    assert float((out @ S).abs().max()) < 1e-12  # nothing left in the shield
    torch.testing.assert_close(delta - out, (delta @ S) @ S.T)  # removed part lies in the shield
    torch.testing.assert_close(filter_update(out, S), out)  # idempotent
    assert not torch.equal(out, delta) and delta.shape == out.shape


@pytest.mark.parametrize("kept", [0.5, 1e-3])
def test_filter_leaves_the_shield_null_to_the_rounding_of_its_output(gen, kept):
    """float32, Δ mostly inside a 200-column shield (the filter keeps ``kept`` of its norm): what
    is left in the shield is at the rounding level of Δ̃'s own values (a few eps·‖Δ̃‖_F), not of
    Δ's, so the merges tell the shield's directions from Δ̃'s real ones. One projection leaves
    eps·‖Δ‖_F there: 1000x more at kept = 1e-3."""
    S = torch.linalg.qr(torch.randn(400, 200, generator=gen, dtype=torch.float64)).Q
    inside = torch.randn(300, 200, generator=gen, dtype=torch.float64) @ S.T
    outside = torch.randn(300, 400, generator=gen, dtype=torch.float64)
    outside = outside - (outside @ S) @ S.T
    delta = (inside + kept * float(inside.norm() / outside.norm()) * outside).float()
    S = S.float()
    out = filter_update(delta, S)
    eps = torch.finfo(torch.float32).eps
    assert float(torch.linalg.matrix_norm((out @ S).double())) < 2 * eps * float(out.double().norm())
    torch.testing.assert_close(out.double().norm() / delta.double().norm(),
                               torch.tensor(kept / (1 + kept ** 2) ** 0.5, dtype=torch.float64),
                               rtol=1e-2, atol=0)


def test_intrusion_energy_closed_form():
    I = torch.eye(4, dtype=torch.float64)
    d1 = torch.diag(torch.tensor([3.0, 4.0, 0, 0], dtype=torch.float64))
    assert intrusion_energy([d1], I[:, :1]) == pytest.approx(9 / 25)
    assert intrusion_energy([d1, d1], I[:, 2:]) == 0.0


def test_pact_filter_layer_level_matches_manual_computation(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    opts = PactOptions(core_frac=0.3, active_frac=0.2, lbw_tol=0.5)
    filtered, report = pact_filter(pre, tvs, mode="pact", options=opts)
    key = "lin.weight"
    W0 = pre[key]
    core = pretrained_core(W0, choose_rank(W0, frac=0.3))
    lbws = [lbw_subspace(core, active_subspace(tv[key], choose_rank(tv[key], frac=0.2))).basis for tv in tvs]
    for t, tv in enumerate(tvs):
        sh = build_shield([lbws[j] for j in range(len(tvs)) if j != t], W0.shape[1], max_frac=0.5)
        torch.testing.assert_close(filtered[t][key], filter_update(tv[key], sh.basis))
    # non-matrix keys pass through untouched; k x k convs are not filtered by default
    for k in ("lin.bias", "dw.weight", "bn.weight", "logit_scale"):
        for t in range(len(tvs)):
            assert torch.equal(filtered[t][k], tvs[t][k])
    keys = [lr.key for lr in report.layers]
    assert keys == ["lin.weight", "pw.weight", "head.weight"]
    assert all(0 <= e <= 1 for lr in report.layers for e in lr.removed_energy)
    assert 0 <= report.cap_binding_rate() <= 1
    assert len(report.to_records()) == 3 * len(tvs)


def test_spact_is_pact_with_the_core_as_shield(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    opts = PactOptions(core_frac=0.3, active_frac=0.2)
    filtered, report = pact_filter(pre, tvs, mode="s-pact", options=opts)
    for key in ("lin.weight", "head.weight"):
        core = pretrained_core(pre[key], choose_rank(pre[key], frac=0.3))
        for t, tv in enumerate(tvs):
            torch.testing.assert_close(filtered[t][key], filter_update(tv[key], core))
    # the 1x1 conv goes through its (m, n) view and back to (m, n, 1, 1)
    pw = MatrixRule().view("pw.weight", pre["pw.weight"])
    core = pretrained_core(pw, choose_rank(pw, frac=0.3))
    expect = filter_update(tvs[0]["pw.weight"].reshape(9, 12), core).reshape(9, 12, 1, 1)
    torch.testing.assert_close(filtered[0]["pw.weight"], expect)


def test_pact_layers_option_selects_layers(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    filtered, report = pact_filter(pre, tvs, options=PactOptions(layers=(r"^head\.",)))
    assert [lr.key for lr in report.layers] == ["head.weight"]
    assert torch.equal(filtered[0]["lin.weight"], tvs[0]["lin.weight"])
    assert not torch.equal(filtered[0]["head.weight"], tvs[0]["head.weight"])


def test_pact_with_rsvd_is_close_to_exact(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    ex, _ = pact_filter(pre, tvs, options=PactOptions(svd="exact"))
    rs, _ = pact_filter(pre, tvs, options=PactOptions(svd="rsvd", oversample=2, n_iter=4))
    for a, b in zip(ex, rs):
        rel = (a - b).norm() / a.norm()
        assert rel < 0.05


def test_pact_options_validation():
    with pytest.raises(ValueError, match="exactly one of core_frac"):
        PactOptions(core_frac=None)
    with pytest.raises(ValueError, match="lbw_tol"):
        PactOptions(lbw_tol=1.5)
    with pytest.raises(ValueError, match="svd"):
        PactOptions(svd="fast")
    with pytest.raises(TypeError, match="unknown PACT option"):
        PactOptions().replace(cor_frac=0.1)
    o = PactOptions().replace(core_energy=0.9)
    assert o.core_frac is None and o.core_energy == 0.9


@pytest.mark.parametrize("field,value,expected", [
    ("shield_tol", float("nan"), "PactOptions.shield_tol must be a finite number >= 0, got nan"),
    ("shield_tol", float("inf"), "PactOptions.shield_tol must be a finite number >= 0, got inf"),
    ("shield_tol", -1.0, "PactOptions.shield_tol must be a finite number >= 0, got -1.0"),
    ("lbw_tol", float("nan"), "PactOptions: lbw_tol must be in [0, 1], got nan"),
    ("lbw_tol", -0.1, "PactOptions: lbw_tol must be in [0, 1], got -0.1"),
    ("max_shield_frac", float("nan"), "PactOptions: max_shield_frac must be in (0, 1], got nan"),
    ("max_shield_frac", float("inf"), "PactOptions: max_shield_frac must be in (0, 1], got inf"),
    ("core_frac", float("nan"), "PactOptions: core_frac must be in (0, 1], got nan"),
    ("active_frac", float("inf"), "PactOptions: active_frac must be in (0, 1], got inf"),
    ("oversample", -1, "PactOptions.oversample must be an integer >= 0, got -1"),
    ("n_iter", -1, "PactOptions.n_iter must be an integer >= 0, got -1"),
    ("active_oversample", -3, "PactOptions.active_oversample must be an integer >= 0, got -3"),
    ("active_n_iter", -2, "PactOptions.active_n_iter must be an integer >= 0, got -2"),
])
def test_pact_options_out_of_range_named(field, value, expected):
    # checked up front (with svd="exact" too), not at the first SVD or shield
    for make in (lambda: PactOptions(**{field: value}), lambda: PactOptions().replace(**{field: value})):
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == expected


def test_pact_options_zero_tolerance_and_iterations_accepted(ckpts):
    # shield_tol = 0 keeps only the relative floor (1e-7·σ_max); p = q = 0 is a plain range finder
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    opts = PactOptions(shield_tol=0, lbw_tol=0, oversample=0, n_iter=0, active_oversample=0, active_n_iter=0)
    assert (opts.shield_tol, opts.oversample, opts.active_n_iter) == (0, 0, 0)
    for svd in ("exact", "rsvd"):
        filtered, report = pact_filter(pre, tvs, options=opts.replace(svd=svd))
        assert report.layers and all(torch.isfinite(v).all() for tv in filtered for v in tv.values())


def test_pact_filter_rejects_unknown_mode(ckpts):
    pre, fts = ckpts
    with pytest.raises(ValueError, match="unknown PACT mode"):
        pact_filter(pre, task_vectors_from(pre, fts), mode="static")


def test_pact_rsvd_defaults_keep_the_lbw_bases_of_a_trained_like_layer(gen):
    # θ0 with a slowly decaying spectrum (σ_i = i^-1/2 over a quarter of the rank + a noise bulk), the hard
    # case for a range finder; three low-rank-plus-noise task updates. float32, as checkpoints are.
    m, n = 320, 240
    r0 = min(m, n) // 4
    U, V = _basis(m, r0, gen), _basis(n, r0, gen)
    W0 = ((U * torch.arange(1, r0 + 1, dtype=torch.float64) ** -0.5) @ V.T
          + 0.02 * torch.randn(m, n, generator=gen, dtype=torch.float64) / m ** 0.5).float()
    deltas = [((_basis(m, 30, gen) * 0.5 / torch.arange(1, 31, dtype=torch.float64)) @ _basis(n, 30, gen).T
               + 1e-4 * torch.randn(m, n, generator=gen, dtype=torch.float64)).float() for _ in range(3)]
    exact = layer_subspaces(W0, deltas, PactOptions())
    rsvd = layer_subspaces(W0, deltas, PactOptions(svd="rsvd"))  # PactOptions' p and q
    assert exact.core.shape == rsvd.core.shape == (n, 24)
    # measured: core and LBW bases within ~1e-3 (sine of the largest principal angle); stated tolerance 0.05
    assert projector_distance(exact.core, rsvd.core) < 0.05
    for a, b in zip(exact.lbw, rsvd.lbw):
        assert a.basis.shape == b.basis.shape and projector_distance(a.basis, b.basis) < 0.05
    # P7's defaults (book/method.md) p = 10, q = 2 would not be close
    old = layer_subspaces(W0, deltas, PactOptions(svd="rsvd", oversample=10, n_iter=2))
    assert max(projector_distance(a.basis, b.basis) for a, b in zip(exact.lbw, old.lbw)) > 0.2


@pytest.mark.parametrize("mode", ["pact", "s-pact"])
def test_filter_tasks_reads_each_task_twice_and_equals_filter_layer(gen, mode):
    """filter_tasks (the streamed summed merges' filter) reads Δ1..ΔT for the subspaces, then again
    to filter them, one at a time, and gives filter_layer's updates and report bit for bit."""
    from pactlib.pact import filter_layer, filter_tasks

    W0 = torch.randn(40, 30, generator=gen)
    deltas = [torch.randn(40, 30, generator=gen) * 0.1 for _ in range(3)] + [torch.zeros(40, 30)]
    opts = PactOptions(core_frac=0.3)
    lr_ref, want, _, _ = filter_layer("w", W0, deltas, mode=mode, options=opts)
    reads, got = [], []
    lr, shields, subs = filter_tasks("w", W0, lambda t: reads.append(t) or deltas[t].clone(), 4,
                                     emit=lambda t, d: got.append((t, d)), mode=mode, options=opts)
    assert reads == [0, 1, 2, 3, 0, 1, 2, 3] and [t for t, _ in got] == [0, 1, 2, 3]
    for (_, d), w in zip(got, want):
        assert torch.equal(d, w)
    assert lr == lr_ref and shields == [] and subs is None
    assert sum(lr.shield_rank[:3]) > 0 and torch.equal(got[3][1], torch.zeros(40, 30))
    called = []
    assert filter_tasks("w", W0, lambda t: torch.zeros(40, 30), 2, emit=lambda t, d: called.append(t)) is None
    assert called == []  # every Δt zero: nothing to filter, nothing emitted
