"""Bad input: a clear error naming the problem, and nothing lost (inputs never modified)."""
import warnings

import pytest
import torch

import pactlib
from pactlib import CheckpointError, TaskVector, task_vectors_from
from pactlib.matrix import MatrixRule


def test_missing_and_extra_keys_name_task_and_keys(ckpts):
    pre, fts = ckpts
    bad = dict(fts[1])
    del bad["lin.bias"]
    bad["extra.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError) as e:
        pactlib.merge("task_arithmetic", pre, [fts[0], bad], alpha=1.0, names=["mnist", "svhn"])
    msg = str(e.value)
    assert "svhn" in msg and "'lin.bias'" in msg and "'extra.weight'" in msg


def test_shape_mismatch_names_key_and_both_shapes(ckpts):
    pre, fts = ckpts
    bad = dict(fts[0])
    bad["head.weight"] = torch.zeros(5, 9)
    with pytest.raises(CheckpointError, match=r"head\.weight.*\(4, 9\).*\(5, 9\)"):
        pactlib.merge("iso_c", pre, [bad], alpha=1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computed_in_float32_returned_as_given(dtype):
    from conftest import make_checkpoints
    pre32, fts32 = make_checkpoints(T=2)
    pre, fts = make_checkpoints(T=2, dtype=dtype)
    out = pactlib.merge("iso_c", pre, fts, alpha=1.0, pact="pact")
    assert all(out[k].dtype == pre[k].dtype for k in pre)
    # the same merge from the float32 upcast of the half inputs agrees to half precision
    up = lambda sd: {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}
    ref = pactlib.merge("iso_c", up(pre), [up(f) for f in fts], alpha=1.0, pact="pact")
    torch.testing.assert_close(out["lin.weight"].float(), ref["lin.weight"].to(dtype).float())
    tv = TaskVector.from_checkpoints(pre, fts[0])
    assert tv.dtype == torch.float32


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
def test_nan_inf_named_before_any_svd(ckpts, bad_value, monkeypatch):
    pre, fts = ckpts
    bad = {k: v.clone() for k, v in fts[2].items()}
    bad["pw.weight"][0, 0, 0, 0] = bad_value

    def no_svd(*a, **k):
        raise AssertionError("an SVD ran before the NaN/Inf check")

    monkeypatch.setattr(torch.linalg, "svd", no_svd)
    with pytest.raises(CheckpointError, match=r"task 2: key 'pw\.weight' holds"):
        pactlib.merge("tsv_m", pre, [fts[0], fts[1], bad], alpha=1.0, pact="pact")
    bad_pre = {k: v.clone() for k, v in pre.items()}
    bad_pre["lin.bias"][3] = bad_value
    with pytest.raises(CheckpointError, match=r"pre-trained: key 'lin\.bias'"):
        pactlib.merge("iso_c", bad_pre, fts, alpha=1.0)


def test_low_dim_and_kxk_tensors_never_reach_an_svd():
    rule = MatrixRule()
    assert rule.kind("logit_scale", torch.tensor(1.0)) == "other"
    assert rule.kind("x.bias", torch.zeros(3)) == "other"
    assert rule.kind("dw.weight", torch.zeros(4, 1, 3, 3)) == "other"
    assert rule.kind("conv.weight", torch.zeros(4, 2, 3, 3)) == "other"
    assert rule.kind("block.weight", torch.zeros(2, 3, 4)) == "other"
    assert MatrixRule(kxk_conv=True).kind("conv.weight", torch.zeros(4, 2, 3, 3)) == "matrix"
    assert MatrixRule(kxk_conv=True).view("conv.weight", torch.zeros(4, 2, 3, 3)).shape == (4, 18)
    with pytest.raises(ValueError, match="not a matrix layer"):
        rule.view("x.bias", torch.zeros(3))


def test_one_task_only(ckpts):
    pre, fts = ckpts
    # one task: PACT has no other task to protect, so the filter is the identity, and says so
    for method in pactlib.merges.names():
        with pytest.warns(UserWarning, match="changed no task vector: every shield is empty"):
            out = pactlib.merge(method, pre, fts[:1], alpha=1.0, pact="pact")
        assert torch.isfinite(out["lin.weight"]).all()
    with pytest.warns(UserWarning, match="changed no task vector"):
        a = pactlib.merge("task_arithmetic", pre, fts[:1], alpha=1.0, pact="pact")
    b = pactlib.merge("task_arithmetic", pre, fts[:1], alpha=1.0)
    torch.testing.assert_close(a["lin.weight"], b["lin.weight"])


def test_all_zero_task_vector_warns_and_merges(ckpts):
    pre, fts = ckpts
    same = {k: v.clone() for k, v in pre.items()}
    with pytest.warns(UserWarning, match="all zero"):
        out = pactlib.merge("iso_c", pre, [fts[0], same], alpha=1.0, pact="pact")
    assert torch.isfinite(out["lin.weight"]).all()


def test_identical_task_vectors_warn(ckpts):
    pre, fts = ckpts
    with pytest.warns(UserWarning, match="identical"):
        pactlib.merge("task_arithmetic", pre, [fts[0], fts[0]], alpha=1.0)


def test_rank_deficient_layers():
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(10, 1, generator=g), torch.randn(1, 8, generator=g)
    pre = {"w": u @ v}  # rank 1 pre-trained layer
    fts = [{"w": pre["w"] + 0.1 * torch.randn(10, 1, generator=g) @ torch.randn(1, 8, generator=g)} for _ in range(3)]
    for method in pactlib.merges.names():
        for pact in (None, "pact", "s-pact"):
            out = pactlib.merge(method, pre, fts, alpha=1.0, pact=pact, **({"core_frac": 0.5} if pact else {}))
            assert torch.isfinite(out["w"]).all()


def test_unknown_method_lists_known(ckpts):
    pre, fts = ckpts
    with pytest.raises(KeyError, match="known: task_arithmetic, ties, tsv_m, iso_c, iso_cts"):
        pactlib.merge("dare", pre, fts, alpha=1.0)


def test_unknown_parameter_and_pact_option_without_pact(ckpts):
    pre, fts = ckpts
    with pytest.raises(TypeError, match="unknown parameter 'kk'.*valid:.*k"):
        pactlib.merge("ties", pre, fts, alpha=1.0, kk=3)
    with pytest.raises(TypeError, match="pact=None"):
        pactlib.merge("ties", pre, fts, alpha=1.0, core_frac=0.2)


def test_shield_covering_whole_space_is_capped_not_deleting(ckpts):
    pre, fts = ckpts
    # core = everything, tolerance 0: every other task's LBW spans (almost) all of R^n
    out = pactlib.merge("task_arithmetic", pre, fts, alpha=1.0, pact="pact", core_frac=1.0, active_frac=0.01,
                        lbw_tol=0.0, max_shield_frac=1.0)
    assert not torch.equal(out["lin.weight"], pre["lin.weight"])


def test_not_a_sequence_or_empty(ckpts):
    pre, fts = ckpts
    with pytest.raises(CheckpointError, match="sequence"):
        pactlib.merge("task_arithmetic", pre, fts[0], alpha=1.0)
    with pytest.raises(CheckpointError, match="at least one"):
        pactlib.merge("task_arithmetic", pre, [], alpha=1.0)


def test_taskvector_arithmetic_and_strictness(ckpts):
    pre, fts = ckpts
    a = TaskVector.from_checkpoints(pre, fts[0], name="a")
    b = TaskVector.from_checkpoints(pre, fts[1], name="b")
    assert "bn.num_batches_tracked" not in a
    s = sum([a, b])
    torch.testing.assert_close(s["lin.weight"], a["lin.weight"] + b["lin.weight"])
    torch.testing.assert_close((a - b)["lin.weight"], a["lin.weight"] - b["lin.weight"])
    torch.testing.assert_close((2 * a)["pw.weight"], a["pw.weight"] * 2)
    torch.testing.assert_close((-a)["pw.weight"], -a["pw.weight"])
    theta = a.apply_to(pre, 1.0)
    torch.testing.assert_close(theta["lin.weight"], fts[0]["lin.weight"])
    assert torch.equal(theta["bn.num_batches_tracked"], pre["bn.num_batches_tracked"])
    c = TaskVector({k: v[..., :1] if k == "lin.weight" else v for k, v in a.items()}, name="c")
    with pytest.raises(CheckpointError, match=r"lin\.weight.*\(12, 10\).*\(12, 1\)"):
        a + c
    with pytest.raises(TypeError):
        a * "2"
    with pytest.raises(CheckpointError, match="not a floating"):
        TaskVector({"n": torch.tensor(3)})
