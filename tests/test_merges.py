"""M1–M5 invariants, every registered method with and without PACT, and a golden case."""
import json
from pathlib import Path

import pytest
import torch

import pactlib
from pactlib import TaskVector, merges, task_vectors_from
from pactlib.matrix import MatrixRule
from pactlib.merges.iso import iso_c_kernel, iso_cts_kernel, iso_cts_split
from pactlib.merges.ties import agree_count, count_dtype, trim_mask, ties_kernel
from pactlib.merges.tsv_m import tsv_m_kernel
from pactlib.linalg import polar, projector_distance, top_singular

GOLDEN = Path(__file__).parent / "fixtures" / "golden_merge.json"
#: the same cases with null_space="literal" (the reference code's convention): the values pinned
#: before the numerical-range convention became the default, unchanged
GOLDEN_LITERAL = Path(__file__).parent / "fixtures" / "golden_merge_literal.json"
RULE = MatrixRule()


def test_registry_names_and_unknown_method():
    assert merges.names() == ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"]
    with pytest.raises(merges.UnknownMethodError) as e:
        merges.get("tie")
    for name in ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"):
        assert name in str(e.value)
    assert merges.get("ties").params == {"k": 20.0, "scope": "global"}
    assert merges.get("task_arithmetic").alphas[0] == 0.05 and merges.get("iso_c").alphas[-1] == 3.0


def test_task_arithmetic_of_one_task_is_alpha_delta(ckpts):
    pre, fts = ckpts
    out = pactlib.merge("task_arithmetic", pre, fts[:1], alpha=0.3)
    for k, v in pre.items():
        if v.is_floating_point():
            torch.testing.assert_close(out[k], v + 0.3 * (fts[0][k] - v))
        else:
            assert torch.equal(out[k], v)


def test_iso_c_spectrum_flat_and_shares_singular_vectors(gen):
    deltas = torch.randn(3, 10, 7, generator=gen, dtype=torch.float64)
    D = iso_c_kernel(deltas)
    total = deltas.sum(0)
    S = torch.linalg.svdvals(D)
    torch.testing.assert_close(S, torch.full_like(S, float(torch.linalg.svdvals(total).mean())))
    U, _, Vh = torch.linalg.svd(total, full_matrices=False)
    assert projector_distance(U, torch.linalg.svd(D, full_matrices=False)[0]) < 1e-6
    torch.testing.assert_close(D, S[0] * U @ Vh)


def test_tsv_m_factors_orthonormal_and_values_kept(gen):
    deltas = torch.randn(4, 12, 8, generator=gen, dtype=torch.float64)
    D = tsv_m_kernel(deltas)
    r = 8 // 4
    blocks = [top_singular(d, r) for d in deltas]
    U = polar(torch.cat([b.U for b in blocks], 1))
    V = polar(torch.cat([b.V for b in blocks], 1))
    torch.testing.assert_close(U.T @ U, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(V.T @ V, torch.eye(8, dtype=torch.float64))
    S = torch.cat([b.S for b in blocks])
    torch.testing.assert_close(D, (U * S) @ V.T)
    # orthonormal factors: D's singular values are exactly the stacked original values
    torch.testing.assert_close(torch.linalg.svdvals(D), S.sort(descending=True).values)


def test_tsv_m_of_orthogonal_tasks_is_their_sum():
    I = torch.eye(6, dtype=torch.float64)
    # full rank-3 blocks with mutually orthogonal left and right singular vectors across tasks
    d1 = 3 * torch.outer(I[0], I[0]) + 2 * torch.outer(I[1], I[1]) + torch.outer(I[2], I[2])
    d2 = 5 * torch.outer(I[3], I[4]) + 4 * torch.outer(I[4], I[5]) + 0.5 * torch.outer(I[5], I[3])
    torch.testing.assert_close(tsv_m_kernel(torch.stack([d1, d2])), d1 + d2)


def test_iso_cts_split_and_flat_spectrum(gen):
    # (100 - 80) / 8 = 2.5 rounds half-to-even to 2, as Python's round() in the reference code
    assert iso_cts_split(100, 8, 0.8) == (84, 2)
    assert iso_cts_split(768, 8, 0.8) == (616, 19)
    deltas = torch.randn(4, 20, 16, generator=gen, dtype=torch.float64)
    D = iso_cts_kernel(deltas, 0.8)
    S = torch.linalg.svdvals(D)
    k, per = iso_cts_split(16, 4, 0.8)
    nz = S[S > 1e-9]
    assert len(nz) == k + 4 * per
    torch.testing.assert_close(nz, torch.full_like(nz, float(nz[0])))



@pytest.mark.parametrize("c", [0.0, -0.5, 1.5, float("nan"), float("inf")])
def test_iso_cts_refuses_common_frac_outside_0_1_everywhere(c):
    """The split, the reducer and the method refuse c outside (0, 1] (NaN too) with one message."""
    msg = rf"Iso-CTS common_frac must be in \(0, 1\], got {c}"
    tvs = [TaskVector._wrap({"w": torch.ones(3, 2) * (t + 1)}, f"t{t}") for t in range(2)]
    for call in (lambda: iso_cts_split(4, 2, c), lambda: merges.get("iso_cts").reducer(2, True, common_frac=c),
                 lambda: merges.get("iso_cts")(tvs, rule=RULE, common_frac=c)):
        with pytest.raises(ValueError, match=msg):
            call()

def test_ties_exact_counts_with_tied_magnitudes():
    x = torch.ones(10)
    assert int(trim_mask(x, 20).sum()) == 2
    x = torch.tensor([0.1, -5, 3, 0.2, 0.0])
    assert trim_mask(x, 40).tolist() == [False, True, True, False, False]
    with pytest.raises(ValueError, match="trim percentage"):
        trim_mask(x, 0)


def _ties_as_written(stack):
    """M2's election and disjoint mean as the paper writes them: sign(Σt Δt); Δt agrees when
    sign(Δt) equals it and Δt ≠ 0; int64 counts; sums over tasks in task_sum's order."""
    from pactlib.merges.ties import task_sum

    elected = torch.sign(task_sum(stack))
    agree = (torch.sign(stack) == elected) & (stack != 0)
    count = agree.sum(0)
    total = task_sum(torch.where(agree, stack, torch.zeros_like(stack)))
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T", [1, 2, 7, 255, 256, 300])
def test_ties_kernel_is_m2_as_written_bit_for_bit(T, dtype):
    """The kernel's two-pass agreement (Δt · sign > 0) and byte counts give M2's values bit for
    bit, with and without a workspace: signed zeros, subnormals, an elected sign of 0, full
    agreement, and T past a byte's range (int32 counts)."""
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, 2000, generator=g, dtype=dtype)
    x[torch.rand(T, 2000, generator=g) < 0.7] = 0
    x[:, 0] = 0.0
    x[:, 1] = -0.0
    x[0, 2] = -0.0
    x[:, 3] = torch.finfo(dtype).tiny / 4  # subnormal, all agree
    x[:, 4] = torch.tensor([1.0, -1.0], dtype=dtype).repeat(T)[:T]  # sums to 0 for even T: elected 0
    x[:, 5] = 1.5  # all agree, count T
    want = _ties_as_written(x)
    work: dict = {}
    for got in (ties_kernel(x), ties_kernel(x, work=work), ties_kernel(x.reshape(T, 40, 50), work=work).reshape(-1)):
        assert got.dtype == dtype and torch.equal(got.view(torch.int8), want.view(torch.int8))
    assert float(want[5]) == 1.5 and (T % 2 or float(want[4]) == 0.0)


@pytest.mark.parametrize("T", [1, 3, 255, 256, 700])
def test_agree_count_is_exact(T):
    g = torch.Generator().manual_seed(T)
    agree = torch.rand(T, 513, generator=g) < 0.5
    agree[:, 0] = True
    got = agree_count(agree)
    assert got.dtype == count_dtype(T) == (torch.uint8 if T <= 255 else torch.int32)
    assert torch.equal(got.long(), agree.sum(0)) and int(got[0]) == T
    out = torch.full((513,), 9, dtype=count_dtype(T))
    assert agree_count(agree, out=out) is out and torch.equal(out.long(), agree.sum(0))


def test_ties_elect_and_disjoint_mean():
    stack = torch.tensor([[1.0, -2.0, 0.0, 3.0], [3.0, 1.0, 0.0, -3.0], [0.0, -1.0, 0.0, 0.0]])
    # col0: sign +, mean(1,3)=2; col1: sum -2 -> sign -, mean(-2,-1)=-1.5; col2: 0; col3: sum 0 -> 0
    torch.testing.assert_close(ties_kernel(stack), torch.tensor([2.0, -1.5, 0.0, 0.0]))


def test_ties_global_trim_keeps_k_percent_per_task(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    D = merges.get("ties")(tvs[:1], rule=RULE, k=10)
    n = sum(v.numel() for v in tvs[0].values())
    kept = sum(int((v != 0).sum()) for v in D.values())
    assert kept == -(-10 * n // 100)


@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"])
def test_every_method_with_and_without_pact(ckpts, method, pact):
    pre, fts = ckpts
    snap_pre = {k: v.clone() for k, v in pre.items()}
    snap_fts = [{k: v.clone() for k, v in f.items()} for f in fts]
    out = pactlib.merge(method, pre, fts, alpha=0.5, pact=pact)
    assert out.keys() == pre.keys()
    for k, v in pre.items():
        assert out[k].shape == v.shape and out[k].dtype == v.dtype
        assert torch.isfinite(out[k].float()).all()
    assert torch.equal(out["bn.num_batches_tracked"], pre["bn.num_batches_tracked"])
    assert not torch.equal(out["lin.weight"], pre["lin.weight"])
    # inputs never modified
    for k in pre:
        assert torch.equal(pre[k], snap_pre[k])
        for f, s in zip(fts, snap_fts):
            assert torch.equal(f[k], s[k])
    # α scales the update linearly
    out2 = pactlib.merge(method, pre, fts, alpha=1.0, pact=pact)
    torch.testing.assert_close(out2["lin.weight"] - pre["lin.weight"], 2 * (out["lin.weight"] - pre["lin.weight"]),
                               atol=1e-5, rtol=1e-4)


def _golden_case(**params):
    from conftest import make_checkpoints
    pre, fts = make_checkpoints(T=3, seed=42)
    res = {}
    for method in ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"):
        extra = params if method in ("tsv_m", "iso_c", "iso_cts") else {}
        for pact in (None, "pact", "s-pact"):
            out = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact, **extra,
                                **({"core_frac": 0.3} if pact else {}))
            res[f"{method}/{pact}"] = {k: round(float((out[k].double() - pre[k].double()).norm()), 6)
                                       for k in ("lin.weight", "pw.weight", "head.weight", "lin.bias")}
    return res


@pytest.mark.parametrize("path, params", [(GOLDEN, {}), (GOLDEN_LITERAL, {"null_space": "literal"})])
def test_golden_case(path, params):
    got = _golden_case(**params)
    if not path.exists():  # pragma: no cover - written once, then pinned in git
        path.write_text(json.dumps(got, indent=1, sort_keys=True))
        pytest.fail("golden file was missing and has been written; re-run")
    want = json.loads(path.read_text())
    assert want.keys() == got.keys()
    for case in want:
        for k in want[case]:
            assert got[case][k] == pytest.approx(want[case][k], rel=1e-4, abs=1e-6), (case, k)


def test_golden_conventions_differ_only_on_rank_deficient_pact_layers():
    """Plain merges have full-rank sums: drop == literal. PACT-filtered sums are rank-deficient."""
    drop, literal = (json.loads(p.read_text()) for p in (GOLDEN, GOLDEN_LITERAL))
    for case in drop:
        same = all(drop[case][k] == pytest.approx(literal[case][k], rel=1e-4, abs=1e-6) for k in drop[case])
        assert same == (case.split("/")[0] in ("task_arithmetic", "ties") or case.endswith("/None")), case


def test_pact_improves_nothing_when_tasks_do_not_interfere():
    """Orthogonal inputs: shields of other tasks do not touch a task's own active directions."""
    I = torch.eye(8)
    pre = {"w": torch.diag(torch.arange(8, 0, -1).float())}
    fts = [{"w": pre["w"] + 0.1 * torch.outer(I[6], I[6])}, {"w": pre["w"] + 0.1 * torch.outer(I[7], I[7])}]
    plain = pactlib.merge("task_arithmetic", pre, fts, alpha=1.0)
    shielded = pactlib.merge("task_arithmetic", pre, fts, alpha=1.0, pact="pact", core_frac=0.25, active_frac=0.125)
    torch.testing.assert_close(plain["w"], shielded["w"])


@pytest.mark.parametrize("null_space", ["drop", "literal"])
@pytest.mark.parametrize("name", [n for n in merges.names() if merges.get(n).reducer is not None])
def test_reducer_equals_the_method_bit_for_bit(name, null_space, gen):
    """A method's per-task reducer fed Δ1..ΔT one at a time gives the same D as the method on the T
    task vectors (what lets the streamed merge read one task at a time), also on a rank-deficient
    layer, a layer whose updates cancel, a task with a zero update and an all-zero layer."""
    from pactlib.merges.driver import reduce_stack

    m = merges.get(name)
    assert name in ("task_arithmetic", "tsv_m", "iso_c", "iso_cts")
    params = {} if name == "task_arithmetic" else {"null_space": null_space}
    u = torch.randn(12, 1, generator=gen)
    tvs = [TaskVector._wrap({"w": torch.randn(12, 9, generator=gen), "low": u @ torch.randn(1, 9, generator=gen) * (t + 1),
                             "gone": torch.ones(12, 9) * (1 if t == 0 else -1 if t == 1 else 0),
                             "one": torch.randn(12, 9, generator=gen) * (t != 1), "zero": torch.zeros(12, 9),
                             "b": torch.randn(9, generator=gen)}, f"t{t}") for t in range(3)]
    D = m(tvs, rule=RULE, **params)
    for key in D:
        stack = torch.stack([tv[key] for tv in tvs])
        matrix = RULE.kind(key, stack[0]) == "matrix"
        before = stack.clone()
        assert torch.equal(reduce_stack(m.reducer(3, matrix, **params), stack), D[key]), key
        assert torch.equal(stack, before)  # the stack is not modified
    assert not D["zero"].any() and (name in ("tsv_m", "iso_cts") or not D["gone"].any())
    with pytest.raises(ValueError, match="no task"):
        merges.get("iso_c").reducer(3, True).result()



@pytest.mark.parametrize("name", [n for n in merges.names() if merges.get(n).reducer is not None])
def test_reducers_that_say_they_keep_their_input_keep_it(name, gen):
    """A reducer with ``modifies_input = False`` is fed the stack's own rows by ``reduce_stack``:
    it leaves them as they were, bit for bit, and gives the D it gives fed copies (full-rank,
    rank-deficient, cancelling, zero and float64 layers; every null-space convention)."""
    from pactlib.merges.driver import modifies_input, passes_of, reduce_stack

    m = merges.get(name)
    variants = [{}] if name == "task_arithmetic" else [
        {"null_space": "drop"}, {"null_space": "literal"}, {"null_space": "drop", "rank_rtol": 1e-3}]
    u = torch.randn(3, 11, 2, generator=gen)
    layers = {"w": torch.randn(3, 11, 8, generator=gen), "wide": torch.randn(3, 5, 13, generator=gen).double(),
              "low": u @ torch.randn(3, 2, 8, generator=gen), "shared": u[:1] @ torch.randn(3, 2, 8, generator=gen),
              "cancel": torch.stack([torch.ones(6, 4), -torch.ones(6, 4), torch.zeros(6, 4)]),
              "zero": torch.zeros(3, 6, 4), "b": torch.randn(3, 8, generator=gen)}
    kept = 0
    for params in variants:
        for key, stack in layers.items():
            matrix = stack.dim() == 3
            if modifies_input(m.reducer(3, matrix, **params)):
                continue
            kept += 1
            before = stack.clone()
            D = reduce_stack(m.reducer(3, matrix, **params), stack)
            assert torch.equal(stack, before), (key, params)
            ref = m.reducer(3, matrix, **params)
            for i in range(passes_of(ref)):
                if i:
                    ref.next_pass()
                for t in range(3):
                    ref.add(before[t].clone())
            assert torch.equal(D, ref.result()), (key, params)
    assert kept > 0 or name in ("task_arithmetic", "iso_c")

def test_task_sum_adds_in_task_order(gen):
    from pactlib.merges.driver import mean_of, task_sum

    x = torch.randn(20, 50, generator=gen) * torch.logspace(-6, 6, 20).unsqueeze(1)
    seq = x[0].clone()
    for t in range(1, 20):
        seq = seq + x[t]
    assert torch.equal(task_sum(x), seq) and torch.equal(mean_of(x), seq / 20)
    assert torch.allclose(task_sum(x).double(), x.double().sum(0), rtol=1e-5, atol=1e-6 * float(x.abs().max()))


# -- in-memory Task Arithmetic from the checkpoints (no task vectors held) --------------------------

def _task_vector_path(pre, fts, alpha, rule):
    """The general path: T task vectors, the method, θ0 + α·D."""
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in pre.values()) else torch.float32
    tvs = task_vectors_from(pre, fts, dtype=dtype)
    D, _ = pactlib.merged_update("task_arithmetic", pre, tvs, rule=rule)
    return D.apply_to(pre, alpha)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("preset", ["default", "gpt2"])
def test_task_arithmetic_merge_equals_the_task_vector_path_bit_for_bit(dtype, preset):
    g = torch.Generator().manual_seed(5)
    shapes = {"h.0.attn.c_attn.weight": (12, 36), "h.0.mlp.c_fc.weight": (12, 20), "conv.weight": (6, 4, 3, 3),
              "h.0.ln_1.bias": (12,), "wte.weight": (30, 12)}
    pre = {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}
    pre["bn.num_batches_tracked"] = torch.tensor(3)
    fts = [{k: (v + 0.1 * torch.randn(v.shape, generator=g).to(dtype)) if v.is_floating_point() else v.clone()
            for k, v in pre.items()} for _ in range(4)]
    before = {k: v.clone() for k, v in pre.items()}
    rule = MatrixRule.preset(preset)
    out = pactlib.merge("task_arithmetic", pre, fts, alpha=0.37, rule=rule)
    ref = _task_vector_path(pre, fts, 0.37, rule)
    assert out.keys() == ref.keys()
    for k in ref:
        assert out[k].dtype == pre[k].dtype and torch.equal(out[k], ref[k]), k
        assert out[k].data_ptr() not in {v.data_ptr() for sd in (pre, *fts) for v in sd.values()}
    assert all(torch.equal(pre[k], before[k]) for k in pre)  # inputs untouched


def test_task_arithmetic_merge_reports_the_first_fault_in_task_order(ckpts):
    pre, fts = ckpts
    key = next(k for k, v in pre.items() if v.is_floating_point() and v.dim() == 2)
    nan0 = [dict(f) for f in fts]
    nan0[0] = {**nan0[0], key: nan0[0][key].clone()}
    nan0[0][key][0, 0] = float("nan")
    nan0[1] = {k: v for k, v in nan0[1].items() if k != key}  # task 1: a key missing
    with pytest.raises(pactlib.CheckpointError, match=rf"task 0: key '{key}' holds 1 NaN"):
        pactlib.merge("task_arithmetic", pre, nan0, alpha=1.0)
    with pytest.raises(pactlib.CheckpointError, match="task 1: 1 key\\(s\\) missing"):
        pactlib.merge("task_arithmetic", pre, [fts[0], nan0[1]], alpha=1.0)
    inf2 = [dict(f) for f in fts]
    inf2[-1] = {**inf2[-1], key: inf2[-1][key].clone()}
    inf2[-1][key][-1, -1] = float("inf")
    with pytest.raises(pactlib.CheckpointError, match=rf"task {len(fts) - 1}: key '{key}' holds 0 NaN and 1 Inf"):
        pactlib.merge("task_arithmetic", pre, inf2, alpha=1.0)


def test_task_arithmetic_merge_warns_on_zero_and_identical_tasks(ckpts):
    pre, fts = ckpts
    with pytest.warns(UserWarning) as rec:
        pactlib.merge("task_arithmetic", pre, [pre, fts[0], fts[0]], alpha=1.0, names=["z", "a", "b"])
    msgs = [str(w.message) for w in rec]
    assert any("'z' is all zero" in m for m in msgs)
    assert any("'a' and 'b' are identical" in m for m in msgs)
    assert not any("'z' and" in m for m in msgs)


def test_iso_cts_reducer_takes_the_deltas_twice_and_keeps_them(gen):
    """Iso-CTS's reducer: the sum on the first pass, each task against it on the second; it checks
    the passes' counts and leaves the deltas as they were (a caller keeps them between passes)."""
    r = merges.get("iso_cts").reducer(2, True)
    with pytest.raises(ValueError, match="no task"):
        r.next_pass()
    d = [torch.randn(6, 5, generator=gen) for _ in range(2)]
    before = [x.clone() for x in d]
    for x in d:
        r.add(x)
    r.next_pass()
    r.add(d[0])
    with pytest.raises(ValueError, match="1 of 2"):
        r.result()
    r.add(d[1])
    with pytest.raises(ValueError, match="more than 2"):
        r.add(d[1])
    assert torch.equal(r.result(), iso_cts_kernel(torch.stack(d)))
    assert all(torch.equal(a, b) for a, b in zip(d, before))


def test_iso_cts_of_tasks_that_cancel_keeps_no_common_noise(gen):
    """Tasks that cancel (Δ0, −Δ0, Δ1, −Δ1) leave a sum of rounding noise: ``drop`` keeps none
    of its directions (their σ̄ would be the task blocks' O(1) mean), so D is the task blocks'
    alone, the same for every task order."""
    import itertools

    d0, d1 = (torch.randn(37, 53, generator=gen) for _ in range(2))
    tasks = [d0, -d0, d1, -d1]
    outs = [iso_cts_kernel(torch.stack([tasks[i] for i in order])) for order in itertools.permutations(range(4))]
    r = merges.get("iso_cts").reducer(4, True)
    for x in tasks:
        r.add(x)
    r.next_pass()
    assert r.Uc.shape[1] == 0  # no common direction
    for D in outs[1:]:
        torch.testing.assert_close(D, outs[0], rtol=0, atol=1e-5)
