"""Evaluation (accuracy, normalized accuracy, α selection) and the task heads."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch

from pactlib import eval as E
from pactlib.testbeds.lite0.heads import Head, fit_head, fit_prototype_head, head_accuracy, load_head, save_head
from pactlib.models.efficientnet import backbone_state_dict, preprocess


@dataclass(frozen=True)
class FakeData:
    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple
    task: str = "fake"
    split: str = "val"


@pytest.fixture(scope="module")
def pre():
    return backbone_state_dict()


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (8, 3, 32, 32), generator=g, dtype=torch.uint8)


@pytest.fixture(scope="module")
def feats(pre, images):
    return E.features(pre, preprocess(images, 32))


def _perfect_head(feats, C=3, seed=0):
    """A random head and the labels it predicts on ``feats`` (so its accuracy there is exactly 1)."""
    g = torch.Generator().manual_seed(seed)
    head = Head(torch.randn(C, feats.shape[1], generator=g), torch.zeros(C), tuple("abc"[:C]))
    return head, head.logits(feats).argmax(1)


# ----------------------------------------------------------------------------- BatchNorm folding
def test_fold_batchnorm_is_the_same_function_and_leaves_the_model_alone(pre, images):
    from pactlib.models.efficientnet import load_backbone

    g = torch.Generator().manual_seed(1)
    sd = dict(pre)
    for k in [k for k in sd if k.endswith("running_mean") or k.endswith("running_var")]:
        # running statistics far from (0, 1), so the folded scale and shift really matter
        sd[k] = (torch.rand(sd[k].shape, generator=g) * 2 + 0.5) if k.endswith("var") else torch.randn(sd[k].shape, generator=g)
    model = load_backbone(32, sd)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = E.fold_batchnorm(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 49  # the original keeps its 49
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    x = preprocess(images, 32)
    with torch.no_grad():
        a, b = model(x), folded(x)
    assert a.shape == b.shape == (8, 1280)
    assert float((a - b).abs().max()) <= 1e-3 * float(a.abs().max())  # float32 rounding, through 17 blocks
    model.train()
    with pytest.raises(ValueError, match="eval mode"):
        E.fold_batchnorm(model)


def test_padding_in_the_convolution_changes_no_bit_and_evaluation_reuses_one_module(pre, images):
    import copy

    from pactlib.models.efficientnet import load_backbone

    model = E.fold_batchnorm(load_backbone(32, pre))
    padded = E.pad_in_convolution(copy.deepcopy(model))
    pads = [m for m in padded.modules() if isinstance(getattr(m, "static_padding", None), torch.nn.ZeroPad2d)]
    moved = [m for m in padded.modules() if isinstance(m, torch.nn.Conv2d) and m.padding != (0, 0)]
    assert len(moved) == 12 and len(pads) == 5  # 3x3/5x5 stride 1 move; stride 2 on an even side pads 0 | 1
    x = preprocess(images, 32)
    with torch.no_grad():
        a, b = model(x), padded(x)
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())  # the same zeros, maybe another algorithm
    g = torch.Generator().manual_seed(3)
    other = {k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() and "running" not in k else v
             for k, v in pre.items()}
    for sd in (pre, other, pre):  # the one evaluation module takes each state dict's folded weights, bit for bit
        ref = E.pad_in_convolution(E.fold_batchnorm(load_backbone(32, sd))).to(memory_format=torch.channels_last)
        with torch.no_grad():
            assert torch.equal(E._load(sd, 32)(x), ref(x))
    assert E._load(other, 32) is E._load(pre, 32)


def test_evaluation_folds_and_features_do_not(pre, images, feats):
    x = preprocess(images, 32)
    folded = E._load(pre, 32)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    with torch.no_grad():
        f = folded(x)
    assert float((f - feats).abs().max()) <= 1e-4 * float(feats.abs().max())
    assert torch.equal(E.features(pre, x), feats)  # head fitting: the unfolded forward, bit for bit


# ----------------------------------------------------------------------------- accuracy
def test_accuracy_of_known_tiny_cases_is_exact(pre, images, feats):
    head, pred = _perfect_head(feats)
    labels = pred.clone()
    labels[[1, 6]] = (labels[[1, 6]] + 1) % 3  # two of eight wrong
    data = FakeData(images, labels, ("a", "b", "c"))
    assert E.accuracy(pre, head, data) == 0.75
    assert E.accuracy(pre, head, data, batch_size=3) == 0.75  # batching changes nothing
    assert E.accuracy(pre, head, data, limit=4) == (labels[:4] == pred[:4]).float().mean().item()
    const = Head(torch.zeros(3, 1280), torch.tensor([0.0, 1.0, 0.0]), ("a", "b", "c"))  # always "b"
    y = torch.tensor([1, 1, 1, 0, 2, 0, 0, 2])
    assert E.accuracy(pre, const, FakeData(images, y, ("a", "b", "c"))) == 3 / 8


def test_evaluate_many_tasks_and_errors(pre, images, feats):
    head, pred = _perfect_head(feats)
    datas = {"t1": FakeData(images, pred, tuple("abc")), "t2": FakeData(images, (pred + 1) % 3, tuple("abc"))}
    assert E.evaluate(pre, {"t1": head, "t2": head}, datas) == {"t1": 1.0, "t2": 0.0}
    with pytest.raises(KeyError, match="t2"):
        E.evaluate(pre, {"t1": head}, datas)
    with pytest.raises(ValueError, match="2 classes but the head has 3"):
        E.accuracy(pre, head, FakeData(images, pred, ("a", "b")))
    bad = dict(pre)
    bad.pop("_conv_head.weight")
    with pytest.raises(RuntimeError, match="_conv_head.weight"):
        E.accuracy(bad, head, datas["t1"])


def test_state_dict_is_loaded_into_the_shared_module_not_mutated(pre, images, feats):
    head, pred = _perfect_head(feats)
    data = FakeData(images, pred, tuple("abc"))
    broken = {k: (torch.zeros_like(v) if k == "_conv_head.weight" else v) for k, v in pre.items()}
    before = broken["_conv_head.weight"].clone()
    acc_broken = E.accuracy(broken, head, data)  # constant features -> one class predicted
    assert acc_broken in {(pred == c).float().mean().item() for c in range(3)} and acc_broken < 1
    assert E.accuracy(pre, head, data) == 1.0  # the shared module really got θ0 back
    assert torch.equal(broken["_conv_head.weight"], before)


def test_normalized_and_mean():
    assert E.normalized({"a": 0.45, "b": 0.9}, {"a": 0.9, "b": 0.9}) == {"a": 0.5, "b": 1.0}
    assert E.mean({"a": 0.5, "b": 1.0}) == 0.75
    with pytest.raises(KeyError, match="'c'"):
        E.normalized({"c": 0.1}, {"a": 1.0})
    with pytest.raises(ValueError, match="fine-tuned accuracy"):
        E.normalized({"a": 0.1}, {"a": 0.0})


# ----------------------------------------------------------------------------- α selection
def test_select_alpha_picks_best_val_alpha_and_reports_test(pre, images, feats):
    head, pred = _perfect_head(feats)
    val = {"t": FakeData(images, pred, tuple("abc"))}
    test = {"t": FakeData(images.flip(0), pred.flip(0), tuple("abc"), split="test")}
    broken = {k: (torch.zeros_like(v) if k == "_conv_head.weight" else v) for k, v in pre.items()}
    asked = []

    def merged(alpha):
        asked.append(alpha)
        return pre if alpha == 0.3 else broken

    rec = E.select_alpha(merged, [0.5, 0.1, 0.3], heads={"t": head}, val=val, test=test,
                         ft_val={"t": 1.0}, ft_test={"t": 0.8}, method="ta", params={"k": 1}, seed=2,
                         suite="toy")
    assert rec["alpha"] == 0.3 and rec["params"] == {"k": 1, "alpha": 0.3} and rec["seed"] == 2
    assert rec["on_edge"] is False and rec["alphas"] == [0.1, 0.3, 0.5] and rec["suite"] == "toy"
    assert asked == [0.1, 0.3, 0.5, 0.3]  # val sweep, then test at the chosen α only
    assert [c["alpha"] for c in rec["curve"]] == [0.1, 0.3, 0.5]
    assert rec["curve"][1]["mean_normalized"] == 1.0 > rec["curve"][0]["mean_normalized"]
    assert rec["metrics"]["acc"] == 1.0 and rec["metrics"]["norm_acc"] == 1.25
    assert rec["metrics"]["acc:t"] == 1.0 and rec["per_task"]["test"]["normalized"] == {"t": 1.25}
    json.dumps(rec)  # JSON-serialisable

    tie = E.select_alpha(lambda a: pre, [0.2, 0.1], heads={"t": head}, val=val, test=test,
                         ft_val={"t": 1.0}, ft_test={"t": 1.0}, method="ta")
    assert tie["alpha"] == 0.1 and tie["on_edge"] is True  # ties -> smaller α, flagged on the edge
    with pytest.raises(ValueError, match="at least one alpha"):
        E.select_alpha(lambda a: pre, [], heads={"t": head}, val=val, test=test, ft_val={}, ft_test={}, method="x")


def test_select_alpha_widens_the_grid_at_an_edge():
    val = {"t": FakeData(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), ("a",))}
    test = {"t": FakeData(val["t"].images, val["t"].labels, ("a",), split="test")}

    def run(peak, grid, **kw):  # validation accuracy 1 - |log(α / peak)| / 10: one peak at α = peak
        fn = lambda a, datas, limit=None: {"t": 1 - abs(math.log(a / peak)) / 10}
        return E.select_alpha(lambda a: a, grid, evaluate_fn=fn, val=val, test=test, ft_val={"t": 1.0},
                              ft_test={"t": 1.0}, method="m", **kw)

    up = run(4.5, [1.0, 2.0], widen=4)  # walks up 3, 4.5, then 6.75 is worse: stops
    assert up["widened"] == [3.0, 4.5, 6.75] and up["alpha"] == 4.5 and up["on_edge"] is False
    assert up["alphas"] == [1.0, 2.0, 3.0, 4.5, 6.75] and [c["alpha"] for c in up["curve"]] == up["alphas"]
    down = run(0.01, [0.1, 0.2], widen=2, widen_factor=2.0)  # the budget ends the walk, still on the edge
    assert down["widened"] == [0.05, 0.025] and down["alpha"] == 0.025 and down["on_edge"] is True
    inner = run(2.0, [1.0, 2.0, 3.0], widen=3)
    assert inner["widened"] == [] and inner["alpha"] == 2.0
    assert run(4.5, [1.0, 2.0])["widened"] == [] and run(4.5, [1.0, 2.0])["on_edge"] is True  # widen=0: as given
    with pytest.raises(ValueError, match="widen_factor"):
        run(1.0, [1.0], widen=1, widen_factor=1.0)


def test_select_alpha_refines_around_the_best_point_by_geometric_midpoints():
    val = {"t": FakeData(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), ("a",))}
    test = {"t": FakeData(val["t"].images, val["t"].labels, ("a",), split="test")}
    asked = []

    def run(peak, grid, **kw):  # one peak at α = peak on a log scale
        def fn(a, datas, limit=None):
            asked.append(a)
            return {"t": 1 - abs(math.log(max(a, 1e-9) / peak)) / 10}
        return E.select_alpha(lambda a: a, grid, evaluate_fn=fn, val=val, test=test, ft_val={"t": 1.0},
                              ft_test={"t": 1.0}, method="m", **kw)

    # grid 0.1, 0.4, 1.6 -> best 0.4; round 1: √(0.04) = 0.2, √(0.64) = 0.8 -> best 0.2 (peak 0.25);
    # round 2 around 0.2 (neighbours 0.1, 0.4): √0.02 = 0.141421, √0.08 = 0.282843 -> best 0.282843
    rec = run(0.25, [0.1, 0.4, 1.6], refine=2)
    assert rec["refined"] == [0.2, 0.8, 0.141421, 0.282843] and rec["alpha"] == 0.282843
    assert rec["alphas"] == [0.1, 0.141421, 0.2, 0.282843, 0.4, 0.8, 1.6] and rec["on_edge"] is False
    assert asked == [0.1, 0.4, 1.6, 0.2, 0.8, 0.141421, 0.282843, 0.282843]  # 7 val, 1 test
    # closer than the coarse grid could get: |log(α/peak)| 0.123 vs 0.47 for 0.4
    assert abs(math.log(rec["alpha"] / 0.25)) < abs(math.log(0.4 / 0.25)) / 3
    # at an edge: widening first, then refinement only on the side that has a neighbour
    edge = run(10.0, [1.0, 2.0], widen=1, refine=1)
    assert edge["widened"] == [3.0] and edge["refined"] == [2.44949] and edge["alpha"] == 3.0
    # a 0 in the grid: arithmetic midpoint
    zero = run(0.01, [0.0, 1.0], refine=1)
    assert zero["refined"] == [0.5] and zero["alpha"] == 0.5
    assert run(0.25, [0.1, 0.4, 1.6])["refined"] == []  # refine=0: the grid as given
    with pytest.raises(ValueError, match="refine"):
        run(0.25, [0.1], refine=-1)



# ----------------------------------------------------------------------------- heads
def _blobs(n=60, C=3, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(C, D, generator=g) * 4
    y = torch.arange(n) % C
    return centers[y] + torch.randn(n, D, generator=g), y


def test_fit_head_separates_and_is_deterministic():
    x, y = _blobs()
    h1, h2 = fit_head(x, y, ("a", "b", "c")), fit_head(x, y, ("a", "b", "c"))
    assert h1.weight.shape == (3, 16) and h1.bias.shape == (3,)
    assert torch.equal(h1.weight, h2.weight) and torch.equal(h1.bias, h2.bias)
    assert head_accuracy(h1, x, y) == 1.0
    strong = fit_head(x, y, ("a", "b", "c"), l2=100.0)
    assert strong.weight.norm() < h1.weight.norm()  # ridge shrinks


def test_fit_head_errors():
    x, y = _blobs()
    with pytest.raises(ValueError, match="no training example for class"):
        fit_head(x, y, ("a", "b", "c", "d"))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        fit_head(x, y, ("a", "b"))
    with pytest.raises(ValueError, match="features must be"):
        fit_head(x[:, None], y, ("a", "b", "c"))


def test_prototype_head_is_scaled_unit_class_means_on_normalized_features():
    x, y = _blobs()
    x = x.abs() + 0.1  # nonnegative, like pooled ReLU6 features
    h = fit_prototype_head(x, y, ("a", "b", "c"))
    assert h.normalize and torch.equal(h.bias, torch.zeros(3))
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    means = torch.stack([xn[y == c].mean(0) for c in range(3)])
    protos = torch.nn.functional.normalize(means, dim=1)
    s = h.weight.double().norm(dim=1)
    assert torch.allclose(s, s[0].expand(3), rtol=1e-6) and s[0] > 1  # one logit scale for all classes
    assert torch.allclose(h.weight.double() / s[:, None], protos, atol=1e-6)
    # a cosine classifier: rescaling an image's features changes nothing
    assert torch.allclose(h.logits(x * 7.0), h.logits(x), atol=1e-5)
    # the fitted scale minimises the train cross-entropy (a 10 % larger or smaller one is worse)
    ce = lambda k: torch.nn.functional.cross_entropy(k * (xn @ protos.T) * s[0], y).item()
    assert ce(1.0) <= min(ce(0.9), ce(1.1)) + 1e-9
    assert head_accuracy(h, x, y) == (xn @ protos.T).argmax(1).eq(y).double().mean().item()
    with pytest.raises(ValueError, match="no training example for class"):
        fit_prototype_head(x, y, ("a", "b", "c", "d"))


def test_prototype_head_with_shots_uses_that_many_images_per_class_and_all_for_the_scale():
    x, y = _blobs()
    x = x.abs() + 0.1
    k = 2
    h = fit_prototype_head(x, y, ("a", "b", "c"), shots=k, seed=3)
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    protos = torch.nn.functional.normalize(h.weight.double(), dim=1)
    # each prototype is the normalised sum of exactly k of its class's normalised features
    g = torch.Generator().manual_seed(3)
    for c in range(3):
        idx = (y == c).nonzero().flatten()
        pick = idx[torch.randperm(idx.numel(), generator=g)[:k]]
        want = torch.nn.functional.normalize(xn[pick].sum(0), dim=0)
        assert torch.allclose(protos[c], want, atol=1e-6)
        assert not torch.allclose(protos[c], torch.nn.functional.normalize(xn[idx].sum(0), dim=0), atol=1e-3)
    # the logit scale minimises the cross-entropy over all examples, not only the k shots
    s = h.weight.double().norm(dim=1)[0]
    ce = lambda m: torch.nn.functional.cross_entropy(m * s * (xn @ protos.T), y).item()
    assert ce(1.0) <= min(ce(0.9), ce(1.1)) + 1e-9
    # deterministic in the seed, different across seeds
    assert torch.equal(fit_prototype_head(x, y, ("a", "b", "c"), shots=k, seed=3).weight, h.weight)
    assert not torch.equal(fit_prototype_head(x, y, ("a", "b", "c"), shots=k, seed=4).weight, h.weight)
    # balanced classes of 20: shots = 20 is the all-images head
    n_min = int(torch.bincount(y).min())
    assert n_min == int(torch.bincount(y).max()) == 20
    assert torch.allclose(fit_prototype_head(x, y, ("a", "b", "c"), shots=n_min).weight,
                          fit_prototype_head(x, y, ("a", "b", "c")).weight, atol=1e-5)
    with pytest.raises(ValueError, match="shots must be >= 1"):
        fit_prototype_head(x, y, ("a", "b", "c"), shots=0)
    with pytest.raises(ValueError, match="fewer train examples"):
        fit_prototype_head(x, y, ("a", "b", "c"), shots=n_min + 1)


def test_head_save_load_roundtrip_and_corruption(tmp_path):
    x, y = _blobs()
    h = fit_head(x, y, ("cat", "dog", "cow"))
    path = tmp_path / "h.safetensors"
    save_head(h, path, task="toy")
    back = load_head(path)
    assert back.classes == ("cat", "dog", "cow") and torch.equal(back.weight, h.weight)
    assert not back.normalize
    cos = fit_prototype_head(x, y, ("cat", "dog", "cow"))
    save_head(cos, tmp_path / "c.safetensors")
    back = load_head(tmp_path / "c.safetensors")
    assert back.normalize and torch.equal(back.weight, cos.weight)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_head(path)
    with pytest.raises(FileNotFoundError):
        load_head(tmp_path / "none.safetensors")


def test_alpha_search_gaps_pairs_each_record_with_the_reference_merge():
    from pactlib.book import records, report

    recs = [records.make_record(m, params={}, seed=0, suite="8", search=search, n_evals=n, alpha=a,
                                metrics={"val_norm_acc": v, "norm_acc": t})
            for m, search, n, a, v, t in (("ta", "full", 20, 0.2, 0.80, 0.78), ("ta", "geo5", 5, 0.22, 0.79, 0.80),
                                          ("iso_c", "full", 30, 2.9, 0.90, 0.88), ("iso_c", "geo5", 6, 6.75, 0.95, 0.94))]
    gaps = report.alpha_search_gaps(recs).set_index(["search", "method"])
    assert gaps.loc[("geo5", "iso_c"), "alpha_ref"] == 2.9 and gaps.loc[("geo5", "iso_c"), "alpha"] == 6.75
    assert gaps.loc[("geo5", "iso_c"), "Δ test"] == pytest.approx(6.0)
    assert gaps.loc[("geo5", "ta"), "Δ val"] == pytest.approx(-1.0) and gaps.loc[("full", "ta"), "Δ test"] == 0


def test_alpha_search_table_compares_each_search_with_the_full_grid():
    from pactlib.book import records, report

    recs = []
    for method, (full_v, full_t) in {"ta": (0.80, 0.78), "iso_c": (0.86, 0.85)}.items():
        for search, dv, dt, n in (("full", 0.0, 0.0, 20), ("grid5", -0.01, 0.004, 5), ("grid4+refine2", 0.002, -0.006, 9)):
            recs.append(records.make_record(method, params={}, seed=0, suite="8", search=search, n_evals=n,
                                            metrics={"val_norm_acc": full_v + dv, "norm_acc": full_t + dt}))
    tab = report.alpha_search_table(recs)
    assert list(tab.index) == ["full", "grid5", "grid4+refine2"]
    assert tab.loc["full", "Δ val (mean)"] == 0 and tab.loc["full", "evaluations"] == 20
    assert tab.loc["grid5", "Δ val (mean)"] == pytest.approx(-1.0) and tab.loc["grid5", "Δ val (worst)"] == pytest.approx(-1.0)
    assert tab.loc["grid4+refine2", "Δ test (mean)"] == pytest.approx(-0.6)
    assert tab.loc["grid4+refine2", "|Δ test| (mean)"] == pytest.approx(0.6) and tab.loc["grid5", "merges"] == 2
    with pytest.raises(ValueError, match="reference search 'exhaustive'"):
        report.alpha_search_table(recs, reference="exhaustive")
    with pytest.raises(ValueError, match="without a 'full' record"):
        report.alpha_search_table(recs + [records.make_record("ties", params={}, seed=0, suite="8", search="grid5",
                                                              n_evals=5, metrics={"val_norm_acc": 0.8, "norm_acc": 0.8})])
