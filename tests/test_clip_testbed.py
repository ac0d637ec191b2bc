"""The clip testbed family end to end, on tiny random-init open_clip models and image folders
written here: named definitions, the three checkpoint formats, heads from files and zero-shot,
the Testbed protocol, `testbeds.run` with its memo, the disk caches, the device hook, and the
book runner's check of a parameter set with a `testbeds:` section."""
from __future__ import annotations

import json
import sys
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

open_clip = pytest.importorskip("open_clip")

from pactlib import testbeds  # noqa: E402
from pactlib.checks import CheckpointError  # noqa: E402
from pactlib.data import paper  # noqa: E402
from pactlib.matrix import PRESETS  # noqa: E402
from pactlib.models import clip  # noqa: E402
from pactlib.testbeds import clip as ctb  # noqa: E402

#: A tiny ViT CLIP: width 32, 2 layers, patch 8, 32 px images.
TINY = dict(
    embed_dim=16,
    vision_cfg=dict(image_size=32, layers=2, width=32, patch_size=8, head_width=16),
    text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1),
)
TASKS = ["MNIST", "EuroSAT"]  # names of the paper's suites, so their templates are the real ones
CLASSES = 3


def _images(rng, colour, n):
    return [np.clip(colour + rng.normal(0, 90, size=(32, 32, 3)), 0, 255).astype(np.uint8) for _ in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """θ0 (a full tiny CLIP, open_clip keys), two fine-tuned copies, image folders and prototype
    heads of each θt (so the fine-tuned models classify well), in the TSV layout."""
    from PIL import Image

    root = tmp_path_factory.mktemp("clipfiles")
    torch.manual_seed(0)
    model, _ = clip.build_clip(TINY)
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt = root / "ckpt"
    ckpt.mkdir()
    torch.save(theta0, ckpt / "zeroshot.pt")
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(1)
    fts = {}
    for t in TASKS:
        ft = {k: (v + 0.02 * v.std() * torch.randn(v.shape, generator=g)) if k.startswith("visual.") and v.ndim >= 1
              and v.is_floating_point() else v.clone() for k, v in theta0.items()}
        fts[t] = ft
        (ckpt / t).mkdir()
        torch.save(ft, ckpt / t / "finetuned.pt")
        colours = rng.integers(100, 156, size=(CLASSES, 3))
        # 3 classes, not MNIST's / EuroSAT's 10: the folder names its classes (else the standard list must fit)
        (root / "data" / t.lower()).mkdir(parents=True)
        (root / "data" / t.lower() / "classnames.txt").write_text("".join(f"class {c}\n" for c in range(CLASSES)))
        for split, n in (("train", 14), ("test", 4)):
            for c in range(CLASSES):
                d = root / "data" / t.lower() / split / f"class_{c}"
                d.mkdir(parents=True)
                for i, img in enumerate(_images(rng, colours[c], n)):
                    Image.fromarray(img).save(d / f"{i}.png")
    heads = root / "heads"
    heads.mkdir()
    for t in TASKS:  # prototype heads of θt on its val + test images: θt is good, θ0 worse
        data = paper.load_paper_task(t, paper.task_root(root / "data", t), image_size=32)
        m, _ = clip.build_clip(TINY, weights=fts[t])
        c = clip.ClipClassifier.from_clip(m, torch.zeros(CLASSES, 16))
        x = torch.cat([data["val"].images, data["test"].images])
        y = torch.cat([data["val"].labels, data["test"].labels])
        with torch.no_grad():
            f = c.encode(x)
        H = F.normalize(torch.stack([f[y == k].mean(0) for k in range(CLASSES)]), dim=-1)
        torch.save({"weight": 50.0 * H, "bias": torch.zeros(CLASSES)}, heads / f"head_{t}Val.pt")
    return dict(root=root, ckpt=ckpt, data=root / "data", heads=heads, theta0=theta0, fts=fts)


def _define(name, files, tmp_path_factory=None, **more):
    opts = dict(arch=TINY, checkpoint_dir=str(files["ckpt"]), data_root=str(files["data"]), tasks=TASKS,
                heads=str(files["heads"]), device="cpu", batch_size=8,
                cache_dir=str(files["root"] / "cache"))
    opts.update(more)
    testbeds.define(name, family="clip", replace=True, **opts)
    return name


def loaded(name, files, tmp_path_factory=None):
    """Define ``name`` over ``files`` (its own cache folder when ``tmp_path_factory`` is given),
    yield its seed-0 testbed, undefine it: the body of the module-scoped ``tb`` fixtures."""
    more = dict(cache_dir=str(tmp_path_factory.mktemp(name))) if tmp_path_factory is not None else {}
    _define(name, files, **more)
    yield testbeds.load(name, 0)
    testbeds.undefine(name)


@pytest.fixture(scope="module")
def tb(files):
    yield from loaded("clip-tiny", files)


# ----------------------------------------------------------------------------- definitions

def test_definitions_check_options_and_names(files, monkeypatch):
    name = _define("clip-def", files)
    try:
        assert testbeds.check_name(name) == "clip"
        assert testbeds.definitions()[name]["family"] == "clip"
        assert testbeds.missing_paths(name) == []
        with pytest.raises(KeyError, match="not defined.*testbeds:"):
            testbeds.check_name("clip-undefined")
        with pytest.raises(TypeError, match="no option 'chekpoint_dir'.*its options"):
            testbeds.define("x", family="clip", chekpoint_dir="/a", arch="ViT-B-32", data_root="/b")
        with pytest.raises(ValueError, match="option 'arch' is required"):
            testbeds.define("x", family="clip", checkpoint_dir="/a", data_root="/b")
        with pytest.raises(ValueError, match="option 'finetuned_pattern'.*task"):
            testbeds.define("x", family="clip", arch="ViT-B-32", checkpoint_dir="/a", data_root="/b",
                            finetuned_pattern="ft.pt")
        with pytest.raises(KeyError, match="unknown family 'nope'"):
            testbeds.define("x", family="nope")
        with pytest.raises(ValueError, match="already defined"):
            testbeds.define(name, family="clip", arch="ViT-B-32", checkpoint_dir="/a", data_root="/b")
        with pytest.raises(ValueError) as err:  # every problem at once, each naming testbed and key
            testbeds.define_all({"a": {"family": "clip", "arch": "ViT-B-32", "checkpoint_dir": "/a", "data_root": "/b",
                                       "tasks": 9}, "b": {"arch": "x"}, "c": {"family": "clip", "bogus": 1}},
                                where="set.yaml: testbeds")
        msg = str(err.value)
        assert "set.yaml: testbeds" in msg and "'a'" in msg and "option 'tasks'" in msg
        assert "'b': no 'family'" in msg and "'c'" in msg and "'bogus'" in msg
        # the JSON of $PACT_TESTBEDS defines the same names in another process (a kernel)
        env = json.dumps({"clip-env": {**testbeds.definitions()[name]}})
        monkeypatch.setenv(testbeds.ENV, env)
        testbeds._define_from_env()
        assert testbeds.definitions()["clip-env"] == testbeds.definitions()[name]
        monkeypatch.setenv(testbeds.ENV, "{not json")
        with pytest.raises(ValueError, match="PACT_TESTBEDS"):
            testbeds._define_from_env()
    finally:
        testbeds.undefine(name)
        testbeds.undefine("clip-env")


def test_missing_files_are_named_with_their_option(files, tmp_path):
    opts = dict(arch=TINY, checkpoint_dir=str(tmp_path / "nope"), data_root="/path/to/datasets", tasks=TASKS)
    assert ctb.missing_paths(opts) == [("checkpoint_dir", str(tmp_path / "nope")), ("data_root", "/path/to/datasets")]
    opts = dict(opts, checkpoint_dir=str(files["ckpt"]), data_root=str(files["data"]), tasks=TASKS + ["DTD"],
                heads=str(files["heads"]))
    missing = dict(ctb.missing_paths(opts))
    assert "DTD" in missing["finetuned_pattern"] and "DTD" in missing["data_root"] and "head_DTD" in missing["heads"]
    testbeds.define("clip-missing", family="clip", replace=True, **opts)
    try:
        with pytest.raises(FileNotFoundError, match="finetuned_pattern: .*DTD/finetuned.pt does not exist"):
            testbeds.load("clip-missing")
    finally:
        testbeds.undefine("clip-missing")
    _define("clip-seed", files)
    try:
        with pytest.raises(ValueError, match=r"one fine-tuning run \(seed 0\).*\{seed\}"):
            testbeds.load("clip-seed", seed=1)
    finally:
        testbeds.undefine("clip-seed")


# ----------------------------------------------------------------------------- the protocol

def test_protocol_evaluate_loss_model_and_inputs(tb, files):
    assert isinstance(tb, testbeds.Testbed) and tb.family == "clip" and tb.tasks == TASKS
    assert tb.device == "cpu" and testbeds.base.engine_device(tb) is None
    assert set(tb.pretrained) == {k for k in files["theta0"] if k.startswith("visual.")}
    assert tb.rule == PRESETS["open_clip"] and tb.format == "open_clip"
    tvs = tb.task_vectors()
    assert [tv.name for tv in tvs] == TASKS
    k = "visual.transformer.resblocks.0.attn.in_proj_weight"
    torch.testing.assert_close(tvs[1][k], files["fts"]["EuroSAT"][k] - files["theta0"][k])
    assert tb.ft_test["MNIST"] > 0.5 and tb.ft_val["EuroSAT"] > 0.5  # the prototype heads fit θt
    assert set(tb.zs_test) == set(TASKS)
    for t in TASKS:
        state = tb.finetuned[t]
        model = tb.loss_model(state, t)
        assert {n for n, _ in model.named_parameters()} == set(state)  # names = state-dict keys
        assert not any(n.startswith("head") for n, _ in model.named_parameters())  # the head is frozen
        x, y = tb.inputs(t, "test")
        assert x.dtype == torch.float32 and x.shape == (len(y), 3, 32, 32)
        with torch.no_grad():
            acc = float((model(x).argmax(1) == y).float().mean())
        assert acc == pytest.approx(tb.evaluate(state, "test", [t])[t]) == pytest.approx(tb.ft_test[t])
        loss = F.cross_entropy(model(x), y)  # differentiable in the tower's weights
        loss.backward()
        assert model.get_parameter(k).grad is not None
    json.dumps(tb.fingerprint())


def test_run_record_memo_and_cached_accuracies(tb, files, monkeypatch):
    rec = testbeds.run(tb, "iso_c", pact="pact", alphas=(0.5, 1.0))
    assert rec["testbed"] == "clip-tiny" and rec["pact"] == "pact" and rec["alpha"] in rec["alphas"]
    assert 0 <= rec["metrics"]["acc"] <= 1 and rec["metrics"]["norm_acc"] > 0
    memo = list((tb.cache_dir / "run_memo").glob("*.json"))
    assert memo

    def refuse(*a, **k):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(tb, "evaluate", refuse)
    assert testbeds.run(tb, "iso_c", pact="pact", alphas=(0.5, 1.0)) == dict(rec, memo_hit=True)  # nothing evaluated
    monkeypatch.undo()
    import pactlib.eval

    monkeypatch.setattr(pactlib.eval, "clip_evaluate", refuse)  # a second load reads every accuracy from disk
    again = testbeds.load("clip-tiny", 0)
    assert (again.ft_val, again.ft_test, again.zs_test) == (tb.ft_val, tb.ft_test, tb.zs_test)
    assert again.fingerprint() == tb.fingerprint()
    assert testbeds.run(again, "iso_c", pact="pact", alphas=(0.5, 1.0)) == dict(rec, memo_hit=True)
    rows = testbeds.reference_records(tb)
    assert [r["method"] for r in rows] == ["zero-shot", "fine-tuned"] and rows[1]["metrics"]["norm_acc"] == 1.0


def test_zeroshot_heads_from_the_text_tower_cached(files, monkeypatch, tmp_path):
    name = _define("clip-zs", files, heads="zeroshot", cache_dir=str(tmp_path / "cache"))
    try:
        tb = testbeds.load(name)
        model, tok = clip.build_clip(TINY, weights=files["theta0"])
        for t in TASKS:
            H, scale = tb.heads[t]
            want = clip.zeroshot_head(model, tok, tb.val[t].classes, paper.templates_for(t))
            torch.testing.assert_close(H, want)
            assert scale == pytest.approx(float(model.logit_scale.detach().exp()))
        assert tb.val["MNIST"].classes == ("class 0", "class 1", "class 2")
        monkeypatch.setattr(clip, "zeroshot_head", lambda *a, **k: (_ for _ in ()).throw(AssertionError("again")))
        again = testbeds.load(name)  # heads (and accuracies) from the disk cache
        torch.testing.assert_close(again.heads["EuroSAT"][0], tb.heads["EuroSAT"][0])
        assert again.fingerprint() == tb.fingerprint()
    finally:
        testbeds.undefine(name)


# ----------------------------------------------------------------------------- formats

def test_hugging_face_files_one_naming_or_native(files, tb, tmp_path):
    from safetensors.torch import save_file

    ckpt = tmp_path / "hf"
    for t, sd in [("zeroshot", files["theta0"]), *files["fts"].items()]:
        path = ckpt / ("model.safetensors" if t == "zeroshot" else f"{t}/model.safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in clip.open_clip_to_hf(sd).items()}, str(path))
    common = dict(checkpoint_dir=str(ckpt), pretrained_file="model.safetensors",
                  finetuned_pattern="{task}/model.safetensors", cache_dir=str(tmp_path / "cache"))
    _define("clip-hf", files, **common)
    try:
        hf = testbeds.load("clip-hf")  # converted to open_clip names: the same testbed as the .pt files
        assert hf.format == "hf" and hf.rule == PRESETS["open_clip"] and set(hf.pretrained) == set(tb.pretrained)
        for k in tb.pretrained:
            assert torch.equal(hf.pretrained[k], tb.pretrained[k]), k
        assert (hf.ft_test, hf.zs_test) == (tb.ft_test, tb.zs_test)
        a = testbeds.run(hf, "iso_c", alphas=(0.5, 1.0))
        b = testbeds.run(tb, "iso_c", alphas=(0.5, 1.0))
        assert a["metrics"]["acc"] == b["metrics"]["acc"] and a["alpha"] == b["alpha"]
    finally:
        testbeds.undefine("clip-hf")
    _define("clip-hf-native", files, naming="native", **common)
    try:
        with pytest.warns(UserWarning, match="naming='native'"):
            nat = testbeds.load("clip-hf-native")
        assert nat.rule == PRESETS["hf_encoder"]
        assert "vision_model.encoder.layers.0.self_attn.q_proj.weight" in nat.pretrained
        t = TASKS[0]
        model = nat.loss_model(nat.finetuned[t], t)  # Hugging Face names, run through the open_clip tower
        assert {n for n, _ in model.named_parameters()} == set(nat.pretrained)
        x, y = nat.inputs(t, "test")
        with torch.no_grad():
            acc = float((model(x).argmax(1) == y).float().mean())
        assert acc == pytest.approx(nat.ft_test[t]) == pytest.approx(tb.ft_test[t])
        with pytest.warns(UserWarning, match="three .d, d. matrices per layer"):  # merged_update says so
            testbeds.run(nat, "task_arithmetic", alphas=(0.5,), memo=False)
    finally:
        testbeds.undefine("clip-hf-native")
    # one merge of both layouts: the error says what to do
    from pactlib import task_vectors_from

    with pytest.raises(CheckpointError, match="two layouts"):
        task_vectors_from(clip.vision_state_dict(files["theta0"]),
                          [clip.open_clip_to_hf(clip.vision_state_dict(files["fts"]["MNIST"]))])


@pytest.fixture
def fake_repo_module(monkeypatch):
    """``src.modeling.ImageEncoder`` / ``ClassificationHead`` as the task_vectors pickles name them."""
    src, modeling = types.ModuleType("src"), types.ModuleType("src.modeling")

    class ImageEncoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            delattr(self.model, "transformer")  # keep_lang=False: no text transformer

    ImageEncoder.__module__, ImageEncoder.__qualname__ = "src.modeling", "ImageEncoder"
    modeling.ImageEncoder = ImageEncoder
    src.modeling = modeling
    monkeypatch.setitem(sys.modules, "src", src)
    monkeypatch.setitem(sys.modules, "src.modeling", modeling)
    return modeling


def test_task_vectors_pickles_need_trust(files, tb, tmp_path, monkeypatch, fake_repo_module):
    ckpt = tmp_path / "tv"
    for t, sd in [("zeroshot", files["theta0"]), *files["fts"].items()]:
        model, _ = clip.build_clip(TINY, weights=sd)
        path = ckpt / (f"{t}.pt" if t == "zeroshot" else f"{t}Val/nonlinear_finetuned.pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(fake_repo_module.ImageEncoder(model), path)
    monkeypatch.delitem(sys.modules, "src.modeling")  # a user without their src/ package
    monkeypatch.delitem(sys.modules, "src")
    common = dict(checkpoint_dir=str(ckpt), pretrained_file="zeroshot.pt",
                  finetuned_pattern="{task}Val/nonlinear_finetuned.pt", cache_dir=str(tmp_path / "cache"))
    _define("clip-tv", files, **common)
    try:
        with pytest.raises(clip.PickleRefused, match="trust_pickle"):
            testbeds.load("clip-tv")
    finally:
        testbeds.undefine("clip-tv")
    _define("clip-tv", files, trust_pickle=True, **common)
    try:
        tv = testbeds.load("clip-tv")
        assert tv.format == "image_encoder" and set(tv.pretrained) == set(tb.pretrained)
        assert tv.ft_test == tb.ft_test
        with pytest.raises(ValueError, match="text_file"):  # an image encoder has no text tower
            testbeds.load("clip-tv", heads="zeroshot")
    finally:
        testbeds.undefine("clip-tv")


# ----------------------------------------------------------------------------- device, LoRA

def test_device_option(files):
    assert ctb.resolve_device("cpu") == "cpu"
    assert ctb.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device cuda: torch sees no GPU"):
            ctb.resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got 'gpu'"):
        ctb.resolve_device("gpu")
    with pytest.raises(ValueError, match="option 'device'"):
        testbeds.define("x", family="clip", arch="ViT-B-32", checkpoint_dir="/a", data_root="/b", device="tpu")

    class OnDevice:
        device = "cuda:0"

    assert testbeds.base.engine_device(OnDevice()) == torch.device("cuda:0")


def write_adapters(files, seed: int) -> dict[str, dict]:
    """PEFT LoRA adapters (rank 2, lora_alpha 8, on Hugging Face CLIP module names q_proj and fc1)
    of every task under ``<checkpoint_dir>/<task>/adapter`` (the ``lora`` option's pattern
    ``"{task}/adapter"``), drawn with ``seed``; returns each task's factors."""
    from pactlib.io import save_state_dict

    g = torch.Generator().manual_seed(seed)
    mods = {"vision_model.encoder.layers.0.self_attn.q_proj": (32, 32),
            "vision_model.encoder.layers.1.mlp.fc1": (128, 32)}
    factors = {}
    for t in TASKS:
        folder = files["ckpt"] / t / "adapter"
        folder.mkdir(exist_ok=True)
        tensors = {}
        for m, (out, inn) in mods.items():
            tensors[f"base_model.model.{m}.lora_A.weight"] = 0.1 * torch.randn(2, inn, generator=g)
            tensors[f"base_model.model.{m}.lora_B.weight"] = 0.1 * torch.randn(out, 2, generator=g)
        factors[t] = tensors
        save_state_dict(tensors, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 8,
                                                                "target_modules": ["q_proj", "fc1"]}))
    return factors


def test_lora_kind_reads_peft_adapters(tb, files, tmp_path):
    """PEFT adapters on Hugging Face CLIP module names (q_proj, fc1) land on open_clip's keys: q
    as the first third of in_proj_weight, the scale lora_alpha / r applied once."""
    with pytest.raises(ValueError, match="needs the option 'lora'"):
        testbeds.load("clip-tiny", kind="lora")
    factors = write_adapters(files, seed=3)
    _define("clip-lora", files, lora="{task}/adapter", cache_dir=str(tmp_path / "cache"))
    try:
        lo = testbeds.load("clip-lora", kind="lora")
        assert lo.kind == "lora" and set(lo.ft_val) == set(TASKS)
        tv = lo.task_vectors()[0]
        f = factors[TASKS[0]]
        m = "base_model.model.vision_model.encoder.layers.0.self_attn.q_proj"
        q = 4.0 * f[f"{m}.lora_B.weight"] @ f[f"{m}.lora_A.weight"]  # scale 8 / 2
        k = "visual.transformer.resblocks.0.attn.in_proj_weight"
        torch.testing.assert_close(tv[k][:32], q)
        assert float(tv[k][32:].abs().max()) == 0.0 and float(tv["visual.conv1.weight"].abs().max()) == 0.0
        fc = "base_model.model.vision_model.encoder.layers.1.mlp.fc1"
        torch.testing.assert_close(tv["visual.transformer.resblocks.1.mlp.c_fc.weight"],
                                   4.0 * f[f"{fc}.lora_B.weight"] @ f[f"{fc}.lora_A.weight"])
        torch.testing.assert_close(lo.finetuned[TASKS[0]][k], lo.pretrained[k] + tv[k])
        rec = testbeds.run(lo, "task_arithmetic", alphas=(0.5, 1.0))
        assert rec["kind"] == "lora" and rec["metrics"]["norm_acc"] > 0
        from pactlib import merged_update

        for pact in (None, "pact"):  # run's streamed merge reads the adapters key by key: the same D
            tvs = testbeds.base.filtered(lo, pact)[0] if pact else lo.task_vectors()
            for method in ("iso_c", "ties"):  # TIES: scope="global", in passes over the keys
                D, _ = testbeds.base.streamed_update(lo, method, pact=pact)
                want, _ = merged_update(method, lo.pretrained, tvs, rule=lo.rule)
                assert set(D) == set(want) and all(torch.equal(D[k], want[k]) for k in want), method
        assert lo.fingerprint() != tb.fingerprint()
    finally:
        testbeds.undefine("clip-lora")


# ----------------------------------------------------------------------------- chapter 12, runner

def test_key_kinds_count_tsv_vision_keys_as_vision(files):
    from pactlib.book.experiments import paper_scale

    wrapped = {f"model.{k}": v for k, v in files["theta0"].items() if not k.startswith("transformer.")}
    kinds = paper_scale.key_kinds(wrapped)
    towers = set(kinds.index.get_level_values("tower"))
    vision = kinds.loc["vision"]["values"].sum()
    assert vision == sum(v.numel() for k, v in files["theta0"].items() if k.startswith("visual."))
    assert towers == {"vision", "text / shared"}


def test_runner_checks_a_parameter_set_with_testbeds(files, tmp_path, capsys):
    from conftest import ROOT, load_runner

    rn = load_runner()
    data = yaml.safe_load((ROOT / "params" / "paper-vitb32-8.yaml").read_text())
    (name, spec), = data["testbeds"].items()
    assert rn.main(["--params", str(ROOT / "params" / "paper-vitb32-8.yaml"), "--check-only"]) == 2
    err = capsys.readouterr().err
    assert f"testbeds: {name!r}" in err and "option 'checkpoint_dir': /path/to/checkpoints/ViT-B-32" in err
    assert "option 'data_root': /path/to/datasets" in err

    spec.update(arch=TINY, checkpoint_dir=str(files["ckpt"]), pretrained_file="zeroshot.pt",
                finetuned_pattern="{task}/finetuned.pt", heads=str(files["heads"]), data_root=str(files["data"]),
                tasks=TASKS)
    good = tmp_path / "mine.yaml"
    good.write_text(yaml.safe_dump(data))
    assert rn.main(["--params", str(good), "--check-only"]) == 0, capsys.readouterr().err
    jobs = rn.prepare(rn.notebook_paths(["05", "12"]), good, {})
    assert [list(j.testbeds) for j in jobs] == [[name], [name]]
    assert json.loads(json.dumps(testbeds.definitions()[name]))["family"] == "clip"

    data["testbeds"][name]["family"] = "nope"
    data["testbeds"]["other"] = {"family": "clip", "arch": "ViT-B-32", "checkpoint_dir": "/a", "data_root": "/b",
                                 "resolution": 3}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    assert rn.main(["--params", str(bad), "--check-only"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'nope'" in err and "no option 'resolution'" in err
    testbeds.undefine(name)
    testbeds.undefine("other")


def test_network_order_puts_the_projection_last(tb):
    order = tb.network_order()
    assert set(order) == set(tb.matrix_keys()) and order[-1] == "visual.proj"
    assert order[0] == "visual.transformer.resblocks.0.attn.in_proj_weight"
    assert order.index("visual.transformer.resblocks.1.attn.in_proj_weight") > order.index(
        "visual.transformer.resblocks.0.mlp.c_proj.weight")


def test_pact_merge_warns_on_hugging_face_attention_layout(files, tmp_path, capsys):
    from safetensors.torch import save_file

    from pactlib.cli import main

    paths = []
    for t, sd in [("zeroshot", files["theta0"]), *files["fts"].items()]:
        paths.append(tmp_path / f"{t}.safetensors")
        save_file({k: v.contiguous() for k, v in clip.open_clip_to_hf(clip.vision_state_dict(sd)).items()},
                  str(paths[-1]))
    out = tmp_path / "merged.safetensors"
    assert main(["merge", "--method", "iso_c", "--alpha", "1.0", "--pretrained", str(paths[0]), "--finetuned",
                 *map(str, paths[1:]), "--out", str(out)]) == 0
    err = capsys.readouterr().err  # merge_files' warning (pactlib.merge's words), said once
    assert "pact: warning: iso_c: Hugging Face CLIP keys" in err and "naming='open_clip'" in err
    assert err.count("Hugging Face CLIP keys") == 1
