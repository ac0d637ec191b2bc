"""The testbed seam (pactlib.testbeds) on the synthetic testbed: protocol, registry, loss model,
determinism, LoRA task vectors, run / reference rows / memoisation, code fingerprints, frozen heads."""
from __future__ import annotations

import importlib
import sys

import pytest
import torch
from torch import nn

from pactlib import testbeds
from pactlib.book.study import depth_groups
from pactlib.taskvector import TaskVector
from pactlib.testbeds import base
from pactlib.testbeds import synthetic as syn

MAPS = ["fc1.weight", "fc2.weight", "fc3.weight", "fc4.weight"]


@pytest.fixture(scope="module")
def tb():
    return testbeds.load("synthetic-4", seed=0, kind="full")


@pytest.fixture(scope="module")
def tb_lora():
    return testbeds.load("synthetic-4", seed=0, kind="lora")


def _mean(d):
    return sum(d.values()) / len(d)


# ------------------------------------------------------------------------------ the protocol

def test_protocol_conformance(tb, tb_lora):
    for t, kind in ((tb, "full"), (tb_lora, "lora")):
        assert isinstance(t, testbeds.Testbed)
        assert (t.name, t.family, t.seed, t.kind) == ("synthetic-4", "synthetic", 0, kind)
        assert t.tasks == ["task01", "task02", "task03", "task04"]
        assert t.rule.matrix_keys(t.pretrained) == MAPS
        keys = set(t.pretrained)
        assert {"fc1.bias", "norm.weight", "norm.bias"} <= keys  # non-matrix keys are exercised
        assert set(t.finetuned) == set(t.tasks) and all(set(ft) == keys for ft in t.finetuned.values())
        for d in (t.ft_val, t.ft_test, t.zs_test):
            assert set(d) == set(t.tasks) and all(0.0 <= v <= 1.0 for v in d.values())
        tvs = t.task_vectors()
        assert [v.name for v in tvs] == t.tasks and all(isinstance(v, TaskVector) and set(v) == keys for v in tvs)
    groups = depth_groups(tb.rule.matrix_keys(tb.pretrained))
    assert all(len(groups[p]) >= 1 for p in ("early", "middle", "late"))


def test_inputs_shapes_caps_and_bad_arguments(tb):
    x, y = tb.inputs("task02", "test")
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (len(y), 32) and len(y) == 512
    assert tb.inputs("task02", "val", 17)[0].shape == (17, 32)
    xv, _ = tb.inputs("task02", "val")
    assert not any(bool((xv == row).all(1).any()) for row in x[:20])  # val and test are different examples
    capped = testbeds.load("synthetic-4", seed=0, val_limit=40, test_limit=60)
    assert len(capped.inputs("task01", "val")[1]) == 40 and len(capped.inputs("task01", "test")[1]) == 60
    assert torch.equal(capped.inputs("task01", "test")[0], tb.inputs("task01", "test")[0][:60])
    ft = tb.finetuned["task01"]
    xt, yt = tb.inputs("task01", "test", 60)
    acc60 = float((tb.loss_model(ft, "task01")(xt).argmax(1) == yt).double().mean())
    assert capped.evaluate(ft, "test", ["task01"])["task01"] == pytest.approx(acc60, abs=1e-12)
    with pytest.raises(ValueError, match="'train'"):
        tb.evaluate(tb.pretrained, "train")
    with pytest.raises(ValueError, match="'dev'"):
        tb.inputs("task01", "dev")
    with pytest.raises(KeyError, match="task99"):
        tb.evaluate(tb.pretrained, "test", ["task99"])
    with pytest.raises(RuntimeError, match="norm.bias"):
        tb.evaluate({k: v for k, v in tb.pretrained.items() if k != "norm.bias"})


def test_loss_model_names_and_logits_match_evaluate(tb):
    state = TaskVector.sum(tb.task_vectors()).apply_to(tb.pretrained, 0.5)  # a merged state, not a checkpoint
    acc = tb.evaluate(state, "test")
    for t in tb.tasks:
        model = tb.loss_model(state, t)
        names = [n for n, _ in model.named_parameters()]
        assert set(names) == set(state) and not model.training
        assert "head_weight" in dict(model.named_buffers())
        x, y = tb.inputs(t, "test")
        logits = model(x)
        assert logits.shape == (len(y), tb.heads[t].shape[0])
        assert float((logits.argmax(1) == y).double().mean()) == acc[t]
    model = tb.loss_model(tb.finetuned["task03"], "task03")
    x, y = tb.inputs("task03", "val", 64)
    nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())


def test_accuracies_zero_shot_below_fine_tuned_and_merging_loses(tb, tb_lora):
    for t in (tb, tb_lora):
        chance = _mean({k: 1 / tb.heads[k].shape[0] for k in tb.tasks})
        assert _mean(t.zs_test) > chance + 0.1
        assert _mean(t.ft_test) > _mean(t.zs_test) + 0.1
        assert t.evaluate(t.finetuned["task02"], "test", ["task02"])["task02"] == t.ft_test["task02"]
    ta = tb.evaluate(TaskVector.sum(tb.task_vectors()).apply_to(tb.pretrained, 1.0))
    assert _mean(ta) < _mean(tb.ft_test) - 0.1  # the tasks interfere


def test_determinism_and_seeds(tb):
    r = syn.RECIPE
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    fresh0 = syn._pretrained.__wrapped__(r)  # rebuilt from scratch, bypassing the in-process memo
    fresh = syn._finetune.__wrapped__(r, 1, 0, "full")[0]
    tb.evaluate(tb.pretrained)
    tb.loss_model(tb.pretrained, "task01")
    assert torch.equal(torch.rand(4), expected)  # building and evaluating leave the global random stream alone
    assert all(torch.equal(fresh0[k], tb.pretrained[k]) for k in tb.pretrained)
    assert all(torch.equal(fresh[k], tb.finetuned["task02"][k]) for k in fresh)
    other = testbeds.load("synthetic-2", seed=1)
    assert other.tasks == tb.tasks[:2]  # suites nest
    assert all(torch.equal(other.pretrained[k], tb.pretrained[k]) for k in tb.pretrained)  # θ0 is shared
    assert not torch.equal(other.finetuned["task02"]["fc2.weight"], tb.finetuned["task02"]["fc2.weight"])
    again = testbeds.load("synthetic-4", seed=0)  # memo: equal values, but copies
    assert torch.equal(again.finetuned["task04"]["fc4.weight"], tb.finetuned["task04"]["fc4.weight"])
    again.pretrained["fc1.weight"].add_(1.0)
    assert not torch.equal(again.pretrained["fc1.weight"], testbeds.load("synthetic-4").pretrained["fc1.weight"])


def test_lora_task_vectors_are_low_rank(tb_lora):
    r, scale = syn.RECIPE.lora_rank, tb_lora.lora_scale
    for tv in tb_lora.task_vectors():
        ad = tb_lora.adapters[tv.name]
        assert sorted(ad) == sorted(MAPS)
        for k, d in tv.items():
            if k in MAPS:
                A, B = ad[k]
                assert torch.equal(d, scale * (B @ A)) and int(torch.linalg.matrix_rank(d)) <= r
                assert float(d.abs().max()) > 0
            else:
                assert not bool(d.any())
        dev = max(float((tb_lora.finetuned[tv.name][k] - tb_lora.pretrained[k] - tv[k]).abs().max()) for k in tv)
        assert dev < 1e-5


# ------------------------------------------------------------------------------- registry

def test_registry_names_and_options():
    assert testbeds.load("synthetic", seed=0).name == "synthetic-4"
    assert "synthetic" in testbeds.families()
    assert testbeds.check_name("synthetic-20") == "synthetic" == testbeds.check_name("synthetic")
    with pytest.raises(KeyError, match="synthetic-30"):
        testbeds.check_name("synthetic-30")
    with pytest.raises(KeyError, match="nosuch"):
        testbeds.load("nosuch-4")
    for bad in ("synthetic-1", "synthetic-21", "synthetic-x", "synthetic-4:2"):
        with pytest.raises(KeyError, match=bad):
            testbeds.load(bad)
    with pytest.raises(ValueError, match="half"):
        testbeds.load("synthetic-4", kind="half")
    with pytest.raises(ValueError, match="half"):
        syn.load("synthetic-4", kind="half")
    with pytest.raises(TypeError, match="profile"):
        testbeds.load("synthetic-4", profile="smoke")
    with pytest.raises(ValueError, match="val_limit"):
        testbeds.load("synthetic-4", val_limit=0)


# ------------------------------------------------------------------- run, reference rows, memo

def test_run_task_arithmetic_record(tb):
    rec = testbeds.run(tb, "task_arithmetic", alphas=(0.3, 1.0), memo=False)
    m = rec["metrics"]
    assert 0.0 <= m["acc"] <= 1.5 and 0.0 <= m["norm_acc"] <= 1.5
    assert rec["alpha"] in rec["alphas"] and {0.3, 1.0} <= set(rec["alphas"])
    assert (rec["testbed"], rec["suite"], rec["kind"], rec["base"], rec["seed"]) == ("synthetic-4", "4", "full",
                                                                                   "task_arithmetic", 0)
    ta = tb.evaluate(TaskVector.sum(tb.task_vectors()).apply_to(tb.pretrained, rec["alpha"]))
    assert m["acc"] == pytest.approx(_mean(ta), abs=1e-9)
    fixed = testbeds.run(tb, "task_arithmetic", alphas=(0.3, 1.0), widen=0, memo=False)
    assert fixed["alpha"] in (0.3, 1.0) and fixed["alphas"] == [0.3, 1.0]


def test_run_pact(tb_lora):
    rec = testbeds.run(tb_lora, "iso_c", pact="pact", alphas=(0.5, 1.5), memo=False)
    assert rec["pact"] == "pact" and rec["method"] == "pact-iso_c" and rec["kind"] == "lora"
    assert 0.0 <= rec["metrics"]["norm_acc"] <= 1.5 and rec["removed_energy"] > 0
    assert 0.0 <= rec["cap_binding_rate"] <= 1.0


def test_reference_records(tb):
    zs, ft = testbeds.reference_records(tb, per_task=True)
    assert (zs["method"], ft["method"]) == ("zero-shot", "fine-tuned")
    assert ft["metrics"]["norm_acc"] == 1.0 and ft["metrics"]["acc"] == pytest.approx(_mean(tb.ft_test))
    assert zs["metrics"]["acc"] == pytest.approx(_mean(tb.zs_test)) and zs["metrics"]["norm_acc"] < 1.0
    assert zs["testbed"] == "synthetic-4" and zs["suite"] == "4"


def test_run_memo(tmp_path, monkeypatch):
    tb = testbeds.load("synthetic-2", seed=0, cache_dir=tmp_path)
    assert tb.cache_dir == tmp_path and tb.fingerprint()["code"] == testbeds.code_fingerprint(
        ["pactlib.testbeds.synthetic"])
    first = testbeds.run(tb, "task_arithmetic", alphas=(0.3, 1.0))
    assert len(list((tmp_path / "run_memo").glob("*.json"))) == 1

    def boom(*a, **k):
        raise AssertionError("merged_update called: the memo missed")

    monkeypatch.setattr(base, "merged_update", boom)
    hit = testbeds.run(testbeds.load("synthetic-2", seed=0, cache_dir=tmp_path), "task_arithmetic", alphas=(0.3, 1.0))
    assert hit["metrics"] == pytest.approx(first["metrics"]) and hit["alpha"] == first["alpha"]
    assert hit["memo_hit"] is True and "memo_hit" not in first and hit["seconds"] == first["seconds"]
    with pytest.raises(AssertionError, match="memo missed"):  # another α grid
        testbeds.run(tb, "task_arithmetic", alphas=(0.3, 0.9))
    with pytest.raises(AssertionError, match="memo missed"):  # another cap: another fingerprint
        testbeds.run(testbeds.load("synthetic-2", seed=0, cache_dir=tmp_path, test_limit=100), "task_arithmetic",
                     alphas=(0.3, 1.0))
    with pytest.raises(AssertionError, match="memo missed"):  # no cache_dir: no memo
        testbeds.run(testbeds.load("synthetic-2", seed=0), "task_arithmetic", alphas=(0.3, 1.0))


# -------------------------------------------------------------------- code fingerprints, heads

def test_code_fingerprint_ignores_docstrings_and_comments(tmp_path, monkeypatch):
    src = {
        "a": '"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # add one\n',
        "b": '"""Another doc."""\n# a comment\n\ndef f(x):\n    """Other doc, longer."""\n\n    return x + 1\n',
        "c": '"""Module doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 2  # add one\n',
    }
    fps = {}
    for tag, text in src.items():
        d = tmp_path / tag
        d.mkdir()
        (d / "pact_fp_probe.py").write_text(text)
        monkeypatch.setattr(sys, "path", [str(d)] + [p for p in sys.path if str(tmp_path) not in p])
        monkeypatch.setattr(testbeds.engine, "_CODE", {})
        importlib.invalidate_caches()
        fps[tag] = testbeds.code_fingerprint(["pact_fp_probe"])
    assert "pact_fp_probe" not in sys.modules
    assert fps["a"] == fps["b"] and fps["a"] != fps["c"]
    with pytest.raises(ModuleNotFoundError, match="pact_no_such_module"):
        testbeds.code_fingerprint(["pact_no_such_module"])


def test_with_frozen_head():
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4))
    before = [n for n, _ in net.named_parameters()]
    W, b = torch.randn(3, 4), torch.randn(3)
    model = testbeds.with_frozen_head(net, W, b)
    assert [n for n, _ in model.named_parameters()] == before and not model.training
    x = torch.randn(7, 5)
    feats = nn.Sequential.forward(model, x)
    assert torch.allclose(model(x), feats @ W.T + b)
    W.add_(1.0)  # the head is a copy
    assert torch.allclose(model(x), feats @ (W - 1.0).T + b)
    cos = testbeds.with_frozen_head(nn.Linear(5, 4), torch.randn(3, 4), normalize=True)
    assert torch.allclose(cos(x), nn.functional.normalize(nn.Linear.forward(cos, x), dim=1) @ cos.head_weight.T)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        testbeds.with_frozen_head(nn.Linear(5, 4), torch.randn(3))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        testbeds.with_frozen_head(nn.Linear(5, 4), torch.randn(3, 4), torch.randn(2))


def test_book_runner_key_ignores_comment_edits_but_not_code_edits(tmp_path):
    """The notebook runner keys executed chapters by pactlib's code: a comment or docstring edit
    keeps every key, a code edit changes it."""
    from pactlib.testbeds.base import source_fingerprint

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text('"""Doc."""\nX = 1  # one\n')
    (pkg / "b.py").write_text("def f():\n    return 2\n")
    files = lambda: sorted(pkg.glob("*.py"))  # noqa: E731
    before = source_fingerprint(files(), tmp_path)
    (pkg / "a.py").write_text('"""Another doc, measured 3x faster."""\n# a new comment\nX = 1  # two\n')
    assert source_fingerprint(files(), tmp_path) == before
    (pkg / "b.py").write_text("def f():\n    return 3\n")
    assert source_fingerprint(files(), tmp_path) != before
    (pkg / "b.py").write_text("def f():\n    return 2\n")
    (pkg / "b.py").rename(pkg / "c.py")  # a file's name is part of the code
    assert source_fingerprint(files(), tmp_path) != before
