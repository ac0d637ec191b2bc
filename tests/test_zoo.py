"""The model zoo: backbone, LoRA, fine-tuning, resumable builds (tiny synthetic tasks, few steps)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace

import pytest
import torch

from pactlib import lora as L
from pactlib.testbeds import zoo_trainer
from pactlib.testbeds.lite0 import zoo as Z
from pactlib.testbeds.lite0.heads import Head, file_sha256
from pactlib.matrix import MatrixRule
from pactlib.models.efficientnet import backbone_state_dict, load_backbone, preprocess

TASKS = ("stripes", "squares")


@dataclass(frozen=True)
class FakeData:
    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple
    task: str
    split: str


def fake_loader(task, split, *, seed=0, limit=None, cache_dir=None):
    """Two tiny 3-class image tasks (oriented stripes / square position), deterministic."""
    if task not in TASKS:
        raise KeyError(f"unknown task {task!r}")
    n = {"train": 24, "val": 12, "test": 12}[split]
    g = torch.Generator().manual_seed(1000 * seed + TASKS.index(task) * 10 + ("train", "val", "test").index(split))
    y = torch.arange(n) % 3
    img = (torch.rand(n, 1, 32, 32, generator=g) * 60).repeat(1, 3, 1, 1)
    for i, c in enumerate(y.tolist()):
        if task == "stripes":
            if c == 0:
                img[i, :, ::4, :] += 150
            elif c == 1:
                img[i, :, :, ::4] += 150
            else:
                img[i, 0] += 150
        else:
            s = slice(8 * c, 8 * c + 16)
            img[i, :, s, s] += 150
    n = n if limit is None else min(limit, n)
    return FakeData(img.clamp(0, 255).to(torch.uint8)[:n], y[:n], ("a", "b", "c"), task, split)


RECIPE = Z.Recipe(steps=2, batch_size=8, warmup=1, lr=1e-4, lora_lr=1e-3, lora_rank=2, lora_alpha=4.0,
                  head_max_iter=50)


class Counter:
    """Wraps zoo.train_loop to count calls (and optionally fail at call number ``fail_at``)."""

    def __init__(self, fail_at=None):
        self.calls, self.fail_at, self.real = 0, fail_at, zoo_trainer.train_loop

    def __call__(self, *a, **kw):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise KeyboardInterrupt("simulated kill")
        return self.real(*a, **kw)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    zoo_dir = tmp_path_factory.mktemp("zoo")
    recs = Z.build_zoo(TASKS, [0], zoo_dir=zoo_dir, recipe=RECIPE, loader=fake_loader, progress=False)
    return zoo_dir, recs


# ----------------------------------------------------------------------------- backbone
def test_backbone_keys_matrix_layers_and_features():
    sd = backbone_state_dict()
    assert len(sd) == 294 and not any(k.startswith("_fc") for k in sd)
    rule = MatrixRule()
    mats = rule.matrix_keys(sd)
    assert len(mats) == 32
    assert all(k.endswith(("_expand_conv.weight", "_project_conv.weight")) or k == "_conv_head.weight" for k in mats)
    assert rule.kind("_blocks.3._depthwise_conv.weight", sd["_blocks.3._depthwise_conv.weight"]) == "other"
    assert rule.kind("_bn0.num_batches_tracked", sd["_bn0.num_batches_tracked"]) == "buffer"
    model = load_backbone(32)
    x = preprocess(fake_loader("stripes", "val").images[:4], 32)
    with torch.no_grad():
        f1, f2 = model(x), model(x[:2])
    assert f1.shape == (4, 1280)
    torch.testing.assert_close(f1[:2], f2, rtol=1e-5, atol=1e-5)  # eval-mode BN: batch-independent


def test_preprocess_range_resize_and_errors():
    imgs = torch.tensor([0, 255], dtype=torch.uint8).repeat_interleave(3 * 32 * 32 // 2).reshape(1, 3, 32, 32)
    x = preprocess(imgs, 32)
    assert x.dtype == torch.float32 and x.min() == -1.0 and x.max() == 1.0
    assert preprocess(imgs, 48).shape == (1, 3, 48, 48)
    with pytest.raises(ValueError, match="uint8"):
        preprocess(imgs.float(), 32)


# ----------------------------------------------------------------------------- LoRA
def test_lora_task_vector_is_scale_BA_in_stored_shape():
    sd = backbone_state_dict()
    g = torch.Generator().manual_seed(0)
    ad = L.init_adapters(sd, 4, generator=g)
    ad = {k: (A, torch.randn(B.shape, generator=g)) for k, (A, B) in ad.items()}  # non-zero B
    tv = L.lora_task_vector(sd, ad, 0.5)
    assert set(tv) == {k for k, v in sd.items() if v.is_floating_point()}
    key = "_blocks.5._expand_conv.weight"
    A, B = ad[key]
    assert A.shape == (4, 40) and B.shape == (240, 4)
    assert tv[key].shape == sd[key].shape == (240, 40, 1, 1)
    torch.testing.assert_close(tv[key][:, :, 0, 0], 0.5 * B @ A)
    assert torch.linalg.matrix_rank(tv[key][:, :, 0, 0]) == 4
    others = [k for k in tv if k not in ad]
    assert others and all(not tv[k].any() for k in others)
    merged = L.merge_adapters(sd, ad, 0.5)
    torch.testing.assert_close(merged[key] - sd[key], tv[key])
    with pytest.raises(ValueError, match="_blocks.5._expand_conv.weight"):
        L.lora_task_vector(sd, {key: (A[:, :10], B)}, 0.5)


def test_lora_attached_forward_equals_merged_weights_and_detach_restores():
    sd = backbone_state_dict()
    g = torch.Generator().manual_seed(1)
    ad = {k: (A, 0.05 * torch.randn(B.shape, generator=g))
          for k, (A, B) in L.init_adapters(sd, 2, generator=g).items()}
    x = preprocess(fake_loader("squares", "val").images[:3], 32)
    model = load_backbone(32)
    L.attach(model, ad, 2.0)
    got = L.read_adapters(model)
    assert set(got) == set(ad) and all(torch.equal(got[k][1], ad[k][1]) for k in ad)
    ref = load_backbone(32, L.merge_adapters(sd, ad, 2.0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
        L.detach(model)
        torch.testing.assert_close(model(x), load_backbone(32)(x))
    assert model.state_dict().keys() == sd.keys()


def test_lora_adapter_file_roundtrip_and_errors():
    ad = {"a.weight": (torch.ones(2, 3), torch.zeros(4, 2))}
    t = L.adapters_to_tensors(ad)
    assert set(t) == {"a.weight.lora_A", "a.weight.lora_B"}
    back = L.adapters_from_tensors(t)
    assert torch.equal(back["a.weight"][0], ad["a.weight"][0])
    with pytest.raises(ValueError, match="has A but no B"):
        L.adapters_from_tensors({"a.weight.lora_A": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="rank"):
        L.lora_scale(0, 1.0)


# ----------------------------------------------------------------------------- fine-tuning
def test_finetuning_keeps_head_and_bn_statistics_frozen():
    pre = backbone_state_dict()
    d = fake_loader("stripes", "train")
    head = Head(torch.randn(3, 1280) * 0.01, torch.zeros(3), ("a", "b", "c"))
    w0, b0 = head.weight.clone(), head.bias.clone()
    x = preprocess(d.images, 32)
    recipe = replace(RECIPE, steps=2)
    theta, losses = Z.finetune_full(pre, head, x, d.labels, recipe=recipe, generator=torch.Generator().manual_seed(0))
    assert len(losses) == 2
    assert torch.equal(head.weight, w0) and torch.equal(head.bias, b0)
    stats = [k for k in pre if "running_" in k or "num_batches" in k]
    assert len(stats) == 49 * 3 and all(torch.equal(theta[k], pre[k]) for k in stats)
    assert not torch.equal(theta["_conv_head.weight"], pre["_conv_head.weight"])
    assert not torch.equal(theta["_bn1.weight"], pre["_bn1.weight"])  # BN affine trains
    ad, scale, _ = Z.finetune_lora(pre, head, x, d.labels, recipe=recipe, generator=torch.Generator().manual_seed(0))
    assert torch.equal(head.weight, w0)
    assert scale == RECIPE.lora_alpha / RECIPE.lora_rank and len(ad) == 32
    assert any(B.abs().sum() > 0 for _, B in ad.values())  # B left zero init


def test_loss_model_head_matches_a_cosine_head():
    from pactlib.testbeds import with_frozen_head
    from pactlib.testbeds.lite0.heads import fit_prototype_head

    pre = backbone_state_dict()
    d = fake_loader("squares", "train")
    x = preprocess(d.images, 32)
    model = load_backbone(32, dict(pre))
    with torch.no_grad():
        f = model(x)
    head = fit_prototype_head(f, d.labels, d.classes, max_iter=20)
    with torch.no_grad():
        names = [n for n, _ in model.named_parameters()]
        cos = with_frozen_head(load_backbone(32, dict(pre)), head.weight, head.bias, normalize=True)
        assert [n for n, _ in cos.named_parameters()] == names  # the state-dict keys, no prefix
        assert torch.allclose(cos(x), head.logits(f), atol=1e-5)
        plain = with_frozen_head(load_backbone(32, dict(pre)), head.weight, head.bias, normalize=False)
        assert not torch.allclose(plain(x), head.logits(f), atol=1e-3)


def test_finetuning_is_seeded():
    pre = backbone_state_dict()
    d = fake_loader("squares", "train")
    head = Head(torch.randn(3, 1280) * 0.01, torch.zeros(3), ("a", "b", "c"))
    x = preprocess(d.images, 32)
    r = replace(RECIPE, steps=2)
    run = lambda s: Z.finetune_full(pre, head, x, d.labels, recipe=r, generator=torch.Generator().manual_seed(s))[0]
    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a["_conv_head.weight"], b["_conv_head.weight"])
    assert not torch.equal(a["_conv_head.weight"], c["_conv_head.weight"])


# ----------------------------------------------------------------------------- zoo build / resume
def test_build_writes_checkpoints_records_and_manifest(built):
    zoo_dir, recs = built
    assert [(r["task"], r["kind"]) for r in recs] == [(t, k) for t in TASKS for k in Z.KINDS]
    for r in recs:
        path = zoo_dir / r["file"]
        assert path == Z.run_path(zoo_dir, r["kind"], r["task"], 0)
        assert file_sha256(path) == r["sha256"]
        assert json.loads(path.with_suffix(".json").read_text()) == r
        assert r["recipe"] == RECIPE.relevant(r["kind"])
        for split in ("val", "test"):
            assert 0.0 <= r["zero_shot"][split] <= 1.0 and 0.0 <= r["finetuned"][split] <= 1.0
        assert r["seconds"] > 0 and r["n_train"] == 24
    assert recs[1]["lora_scale"] == 2.0 and "lora_scale" not in recs[0]
    man = json.loads((zoo_dir / "manifest.json").read_text())
    assert set(man["entries"]) == {f"{k}/{t}/seed0" for t in TASKS for k in Z.KINDS} | {f"heads/{t}" for t in TASKS}
    assert man["pretrained"]["sha256"] == file_sha256(zoo_dir / "pretrained.safetensors")
    assert not list(zoo_dir.rglob("*.tmp"))


def test_a_rebuild_with_other_threads_writes_the_same_bytes(built, tmp_path):
    zoo_dir, recs = built
    n = torch.get_num_threads()
    torch.set_num_threads(2 if n == 1 else 1)  # the caller's count: the build trains on one thread anyway
    try:
        again = Z.build_zoo(TASKS, [0], zoo_dir=tmp_path, recipe=RECIPE, loader=fake_loader, progress=False)
    finally:
        torch.set_num_threads(n)
    assert torch.get_num_threads() == n  # restored
    assert [(r["file"], r["sha256"], r["head_sha256"]) for r in again] == \
        [(r["file"], r["sha256"], r["head_sha256"]) for r in recs]


def test_load_zoo_full_and_lora(built):
    zoo_dir, recs = built
    full = Z.load_zoo(TASKS, kind="full", zoo_dir=zoo_dir)
    assert full.tasks == list(TASKS) and set(full.heads) == set(TASKS)
    assert full.pretrained.keys() == full.finetuned["stripes"].keys()
    tv = full.task_vectors()["stripes"]
    assert "_bn0.num_batches_tracked" not in tv and not tv["_bn0.running_mean"].any()
    lo = Z.load_zoo(TASKS, kind="lora", zoo_dir=zoo_dir)
    ltv = lo.task_vectors()["squares"]
    key = "_conv_head.weight"
    A, B = lo.adapters["squares"][key]
    torch.testing.assert_close(ltv[key][:, :, 0, 0], lo.records["squares"]["lora_scale"] * B @ A)
    assert not ltv["_bn1.weight"].any()
    assert lo.accuracies("test") == {r["task"]: r["finetuned"]["test"] for r in recs if r["kind"] == "lora"}
    with pytest.raises(FileNotFoundError, match="pact zoo build"):
        Z.load_zoo(TASKS, seed=7, zoo_dir=zoo_dir)


def test_resume_skips_finished_runs(built, monkeypatch):
    zoo_dir, recs = built
    counter = Counter()
    monkeypatch.setattr(zoo_trainer, "train_loop", counter)
    again = Z.build_zoo(TASKS, [0], zoo_dir=zoo_dir, recipe=RECIPE, loader=fake_loader, progress=False)
    assert counter.calls == 0 and again == recs


def test_interrupted_build_resumes_and_corrupt_file_is_rebuilt(tmp_path, monkeypatch):
    r = replace(RECIPE, steps=1)
    kill = Counter(fail_at=2)  # killed during the second run, after the first checkpoint
    monkeypatch.setattr(zoo_trainer, "train_loop", kill)
    with pytest.raises(KeyboardInterrupt):
        Z.build_zoo(TASKS, [0], kind=("full",), zoo_dir=tmp_path, recipe=r, loader=fake_loader, progress=False)
    first = Z.run_path(tmp_path, "full", "stripes", 0)
    assert first.is_file() and not Z.run_path(tmp_path, "full", "squares", 0).exists()
    sha_first = file_sha256(first)

    resume = Counter()
    monkeypatch.setattr(zoo_trainer, "train_loop", resume)
    recs = Z.build_zoo(TASKS, [0], kind=("full",), zoo_dir=tmp_path, recipe=r, loader=fake_loader, progress=False)
    assert resume.calls == 1 and file_sha256(first) == sha_first  # only the missing run trained
    assert [x["task"] for x in recs] == list(TASKS)

    # truncate a checkpoint: detected by sha256, never loaded, rebuilt by the next build
    first.write_bytes(first.read_bytes()[:1000])
    with pytest.raises(FileNotFoundError, match="stripes"):
        Z.load_zoo(TASKS, kind="full", zoo_dir=tmp_path)
    rebuild = Counter()
    monkeypatch.setattr(zoo_trainer, "train_loop", rebuild)
    recs2 = Z.build_zoo(TASKS, [0], kind=("full",), zoo_dir=tmp_path, recipe=r, loader=fake_loader, progress=False)
    # rebuilt once, and the new file is the one its record vouches for (byte-identity with the
    # first build is not asserted: CPU kernels may reduce in another order under load)
    assert rebuild.calls == 1 and file_sha256(first) == recs2[0]["sha256"]
    assert Z.load_zoo(TASKS, kind="full", zoo_dir=tmp_path).tasks == list(TASKS)

    # a recipe change of one kind's fields rebuilds that kind only; heads survive
    head_sha = file_sha256(Z.head_path(tmp_path, "stripes"))
    changed = Counter()
    monkeypatch.setattr(zoo_trainer, "train_loop", changed)
    Z.build_zoo(TASKS[:1], [0], kind=("full",), zoo_dir=tmp_path, recipe=replace(r, lr=2e-4),
                loader=fake_loader, progress=False)
    assert changed.calls == 1 and file_sha256(Z.head_path(tmp_path, "stripes")) == head_sha

    # a head fit again (here: its file replaced by another valid head) makes the runs through it stale
    other = Z.head_path(tmp_path, "squares")
    Z.head_path(tmp_path, "stripes").write_bytes(other.read_bytes())
    rec = json.loads(Z.head_path(tmp_path, "stripes").with_suffix(".json").read_text())
    rec["sha256"] = file_sha256(other)
    Z.head_path(tmp_path, "stripes").with_suffix(".json").write_text(json.dumps(rec))
    refit = Counter()
    monkeypatch.setattr(zoo_trainer, "train_loop", refit)
    recs3 = Z.build_zoo(TASKS[:1], [0], kind=("full",), zoo_dir=tmp_path, recipe=replace(r, lr=2e-4),
                        loader=fake_loader, progress=False)  # the recipe of the last build: only the head differs
    assert refit.calls == 1 and recs3[0]["head_sha256"] == file_sha256(other) != head_sha


def test_cli_parses_recipe_overrides():
    p = argparse.ArgumentParser()
    Z.add_cli(p.add_subparsers(dest="command"))
    a = p.parse_args(["zoo", "build", "--suite", "8", "--seeds", "0", "1", "2", "--steps", "5", "--lr", "0.01",
                      "--kind", "lora"])
    assert (a.suite, a.seeds, a.steps, a.lr, a.kind, a.batch_size) == ("8", [0, 1, 2], 5, 0.01, ["lora"], None)
    assert a.func is Z._cmd_build
    with pytest.raises(ValueError, match="optimizer"):
        Z.Recipe(optimizer="lion")
    with pytest.raises(ValueError, match="Recipe.head must be"):
        Z.Recipe(head="mlp")
    with pytest.raises(ValueError, match="unknown zoo kind"):
        Z.build_zoo(TASKS, [0], kind=("partial",), loader=fake_loader)


# ----------------------------------------------------------------------------- run memo
def test_testbed_run_is_memoised_on_disk_and_keyed_by_its_inputs(built, monkeypatch):
    from pactlib import eval as E
    from pactlib.testbeds import run
    from pactlib.testbeds.lite0.testbed import Lite0Testbed

    zoo_dir, _ = built
    zoo = Z.load_zoo(TASKS, seed=0, kind="full", zoo_dir=zoo_dir)
    val = {t: fake_loader(t, "val") for t in TASKS}
    test = {t: fake_loader(t, "test") for t in TASKS}
    ones = {t: 1.0 for t in TASKS}
    tb = Lite0Testbed("lite0-toy", "toy", 0, "full", list(TASKS), zoo.pretrained, zoo.finetuned, zoo.heads, val,
                      test, ones, ones, ones, 32, None, None, zoo, zoo_dir)
    calls = []
    real = E.select_alpha
    monkeypatch.setattr(E, "select_alpha", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = run(tb, "task_arithmetic", alphas=(0.1, 0.5), widen=0)
    again = run(tb, "task_arithmetic", alphas=(0.1, 0.5), widen=0)
    assert len(calls) == 1 and again["metrics"] == first["metrics"] and again["alpha"] == first["alpha"]
    assert len(list((zoo_dir / "run_memo").glob("*.json"))) == 1
    run(tb, "task_arithmetic", alphas=(0.1, 0.3), widen=0)  # another grid: computed
    run(tb, "task_arithmetic", alphas=(0.1, 0.5), widen=0, memo=False)  # opted out: computed
    run(tb, "task_arithmetic", alphas=(0.1, 0.5), widen=0, task_vectors=[tv * 0.5 for tv in tb.task_vectors()])
    assert len(calls) == 4 and len(list((zoo_dir / "run_memo").glob("*.json"))) == 2
    # a memo file cut short is ignored (recomputed and rewritten)
    path = next((zoo_dir / "run_memo").glob("*.json"))
    path.write_text(path.read_text()[:20])
    run(tb, "task_arithmetic", alphas=(0.1, 0.5), widen=0)
    run(tb, "task_arithmetic", alphas=(0.1, 0.3), widen=0)
    assert len(calls) == 5


def test_reference_records_are_the_zero_shot_and_fine_tuned_rows():
    from pactlib.testbeds import reference_records
    from pactlib.testbeds.lite0.testbed import Lite0Testbed

    zs, ft = {"stripes": 0.4, "squares": 0.6}, {"stripes": 0.8, "squares": 1.0}
    tb = Lite0Testbed("lite0-toy", "toy", 3, "full", list(TASKS), {}, {}, {}, {}, {}, ft, ft, zs, 32)
    zero, tuned = reference_records(tb, pact=None)
    assert (zero["method"], zero["base"], zero["seed"], zero["suite"], zero["pact"]) == ("zero-shot", "zero-shot", 3, "toy", None)
    assert zero["metrics"] == pytest.approx({"acc": 0.5, "norm_acc": (0.5 + 0.6) / 2}) and zero["params"] == {}
    assert tuned["method"] == "fine-tuned" and tuned["metrics"] == pytest.approx({"acc": 0.9, "norm_acc": 1.0})
    assert zero["testbed"] == "lite0-toy"
    zero, tuned = reference_records(tb, params={"head": "x"}, per_task=True, suite="other")
    assert zero["metrics"]["norm_acc:stripes"] == pytest.approx(0.5) and tuned["metrics"]["norm_acc:squares"] == 1.0
    assert zero["suite"] == "other" and zero["params"] == {"head": "x"}


def test_recipe_optional_fields_appear_only_when_set_so_older_records_stay_valid(tmp_path):
    base = Z.Recipe()
    assert "head_shots" not in base.relevant("head") and "head_shots" not in base.relevant("full")
    few = replace(base, head_shots=2)
    assert few.relevant("head")["head_shots"] == 2 and few.relevant("lora")["head_shots"] == 2
    ckpt = tmp_path / "x.safetensors"
    ckpt.write_bytes(b"abc")
    rec = {"recipe": base.relevant("full"), "sha256": file_sha256(ckpt)}
    assert Z._valid(rec, ckpt, base.relevant("full")) is None  # a record written before head_shots existed
    assert Z._valid(rec, ckpt, few.relevant("full")) == "recipe changed"
    with pytest.raises(ValueError, match="prototype head only"):
        Z.Recipe(head="probe", head_shots=2)
    with pytest.raises(ValueError, match="head_shots must be >= 1"):
        Z.Recipe(head_shots=0)


#: The recipe the book's zoo was built with (its run and head records' ``recipe`` fields). The
#: ``default`` profile is ``Recipe()``'s defaults; changing one of them re-keys every zoo record
#: and rebuilds the book's zoo, so it must be deliberate: change this table with it.
BOOK_RECIPE = {
    "head": {"resolution": 32, "head": "prototype", "head_l2": 0.01, "head_max_iter": 300, "data_seed": 0,
             "train_limit": None, "eval_limit": None},
    "run": {"steps": 80, "batch_size": 64, "optimizer": "adamw", "weight_decay": 0.0, "warmup": 8, "augment": "none"},
    "full": {"lr": 3e-05},
    "lora": {"lora_lr": 0.001, "lora_rank": 8, "lora_alpha": 16.0},
}


def test_default_profile_is_the_recipe_defaults_and_the_book_zoo_recipe(monkeypatch, tmp_path):
    from pactlib.testbeds.lite0 import testbed as study

    monkeypatch.setenv("PACT_CACHE", str(tmp_path))
    zoo_dir, recipe = study.zoo_profile("default")
    assert recipe == Z.Recipe() and zoo_dir == tmp_path / "zoo"
    assert study.PROFILES["default"]["recipe"] == {}  # the recipe is written once, in Recipe
    want = {"head": BOOK_RECIPE["head"]}
    for kind in ("full", "lora"):
        want[kind] = {**BOOK_RECIPE["head"], **BOOK_RECIPE["run"], **BOOK_RECIPE[kind]}
    for kind, fields_ in want.items():
        got = recipe.relevant(kind)
        assert list(got.items()) == list(fields_.items())  # same values, same order: the records' keys
        assert json.dumps(got, sort_keys=True) == json.dumps(fields_, sort_keys=True)
        assert all(type(got[k]) is type(v) for k, v in fields_.items())  # 16.0 stays a float, 8 an int
    smoke = study.zoo_profile("smoke")[1]  # the smoke profile changes the defaults in a few fields
    assert smoke == replace(Z.Recipe(), steps=3, warmup=1, train_limit=96, eval_limit=48, head_max_iter=15)


def test_recipe_variant_changes_fields_in_a_zoo_of_its_own(monkeypatch, tmp_path):
    from pactlib.testbeds.lite0 import testbed as study

    monkeypatch.setenv("PACT_CACHE", str(tmp_path))
    base_dir, base = study.zoo_profile("default")
    assert study.recipe_variant("default", []) == (base_dir, base)
    zoo_dir, recipe = study.recipe_variant("default", ["lr=3e-5", "steps=160", "head_shots=2"])
    assert recipe == replace(base, lr=3e-5, steps=160, head_shots=2)  # "3e-5" read as a float, not YAML's string
    assert isinstance(recipe.steps, int) and zoo_dir == tmp_path / "zoo-lr3e-05-steps160-head_shots2"
    with pytest.raises(ValueError, match="'lrate=1'.*FIELD one of"):
        study.recipe_variant("default", ["lrate=1"])
    with pytest.raises(ValueError, match="'steps=many'.*not of type int"):
        study.recipe_variant("default", ["steps=many"])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        study.recipe_variant("default", ["lr"])
    with pytest.raises(ValueError, match="head_shots"):  # Recipe checks the combination: shots need the prototype head
        study.recipe_variant("default", ["head=probe", "head_shots=2"])
    with pytest.raises(KeyError, match="unknown zoo profile"):
        study.recipe_variant("nope", ["lr=1"])
