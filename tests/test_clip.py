"""The paper-scale CLIP path on tiny files written here: checkpoint formats, the matrix rule per
format, zero-shot heads, the classifier, the refusal to download, and the dataset adapters."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

open_clip = pytest.importorskip("open_clip")

import pactlib  # noqa: E402
from pactlib.checks import CheckpointError  # noqa: E402
from pactlib.data import paper  # noqa: E402
from pactlib.matrix import MatrixRule  # noqa: E402
from pactlib.models import clip  # noqa: E402

#: A tiny ViT CLIP: width 32, 2 layers, patch 8, 32 px images (16 patches + class token).
TINY = dict(
    embed_dim=16,
    vision_cfg=dict(image_size=32, layers=2, width=32, patch_size=8, head_width=16),
    text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2),
)
WIDTH, EMBED, LAYERS = 32, 16, 2


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): a seeded random tiny CLIP with a non-default logit scale."""
    torch.manual_seed(0)
    model, tok = clip.build_clip(TINY)
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
    return model, tok


@pytest.fixture(scope="module")
def full_sd(tiny):
    return {k: v.clone() for k, v in tiny[0].state_dict().items()}


def _visual(sd):
    return {k: v for k, v in sd.items() if k.startswith("visual.")}


def _assert_same(a, b):
    assert list(a) == list(b) or set(a) == set(b), (sorted(set(a) ^ set(b)))[:5]
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


# ----------------------------------------------------------------------------- fake src.modeling


@pytest.fixture
def fake_repo_module(monkeypatch):
    """Install a module ``src.modeling`` with task_vectors-like classes, as their pickles name."""
    src = types.ModuleType("src")
    modeling = types.ModuleType("src.modeling")

    class ImageEncoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            delattr(self.model, "transformer")  # as they do: keep_lang=False drops the text transformer

        def forward(self, images):
            return self.model.encode_image(images)

    class ClassificationHead(nn.Linear):
        def __init__(self, normalize, weights):
            out, inp = weights.shape
            super().__init__(inp, out)
            self.normalize = normalize
            self.weight = nn.Parameter(weights.clone())
            self.bias = nn.Parameter(torch.zeros(out))

    for cls in (ImageEncoder, ClassificationHead):
        cls.__module__, cls.__qualname__ = "src.modeling", cls.__name__
        setattr(modeling, cls.__name__, cls)
    src.modeling = modeling
    monkeypatch.setitem(sys.modules, "src", src)
    monkeypatch.setitem(sys.modules, "src.modeling", modeling)
    return modeling


def _forget_fake_repo(monkeypatch):
    monkeypatch.delitem(sys.modules, "src.modeling")
    monkeypatch.delitem(sys.modules, "src")


# ----------------------------------------------------------------------------- formats


def test_open_clip_files_round_trip(tmp_path, full_sd):
    from safetensors.torch import save_file

    plain = tmp_path / "plain.pt"
    torch.save(full_sd, plain)
    st = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in full_sd.items()}, str(st))
    wrapped = tmp_path / "wrapped.bin"  # open_clip training checkpoint: wrapper + DDP prefix
    torch.save({"epoch": 3, "name": "x", "state_dict": {f"module.{k}": v for k, v in full_sd.items()}}, wrapped)
    for path in (plain, st, wrapped):
        raw = clip.load_clip_checkpoint(path)
        assert len(raw) == len(full_sd) == 62
        assert clip.detect_format(path) == "open_clip"
        vis = clip.vision_state_dict(path)
        assert len(vis) == 1 + 1 + 1 + 1 + 2 + 12 * LAYERS + 2  # class, pos, proj, conv1, ln_pre, blocks, ln_post
        _assert_same(vis, _visual(full_sd))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated, OpenAI's files still use it
def test_torchscript_archive(tmp_path, tiny, full_sd):
    """OpenAI's original checkpoints are TorchScript archives: read with torch.jit, no pickle."""
    path = tmp_path / "ViT-tiny.pt"
    torch.jit.script(tiny[0]).save(str(path))
    assert clip.detect_format(path) == "open_clip"
    _assert_same(clip.vision_state_dict(path), _visual(full_sd))
    torch.manual_seed(3)
    rebuilt, _ = clip.build_clip(TINY, weights=path)
    _assert_same(rebuilt.state_dict(), full_sd)


def test_image_encoder_pickle_needs_opt_in(tmp_path, monkeypatch, fake_repo_module, full_sd):
    torch.manual_seed(0)
    model, _ = clip.build_clip(TINY, weights=full_sd)
    enc = fake_repo_module.ImageEncoder(model)
    path = tmp_path / "finetuned.pt"
    torch.save(enc, path)  # a whole pickled module, as task_vectors / TSV / iso-merging save
    plain = tmp_path / "finetuned_sd.pt"
    torch.save(enc.state_dict(), plain)  # their plain state-dict variant
    _forget_fake_repo(monkeypatch)  # as for a user without their src/ package

    with pytest.raises(clip.PickleRefused, match="trust_pickle=True"):
        clip.load_clip_checkpoint(path)
    with pytest.raises(clip.PickleRefused):
        clip.vision_state_dict(path)
    raw = clip.load_clip_checkpoint(path, trust_pickle=True)
    assert all(k.startswith("model.") for k in raw) and "model.visual.proj" in raw
    assert not any(k.startswith("model.transformer.") for k in raw)
    for p in (path, plain):
        assert clip.detect_format(p, trust_pickle=True) == "image_encoder"
        _assert_same(clip.vision_state_dict(p, trust_pickle=True), _visual(full_sd))
    # vision-only file into a full model: visual loaded, text tower untouched
    torch.manual_seed(1)
    other, _ = clip.build_clip(TINY)
    text_before = other.token_embedding.weight.clone()
    rep = clip.load_clip_weights(other, path, trust_pickle=True)
    assert rep == clip.LoadReport(format="image_encoder", text=False)
    _assert_same(_visual(other.state_dict()), _visual(full_sd))
    assert torch.equal(other.token_embedding.weight, text_before)


def test_hf_format_round_trip_and_equivalence(tmp_path, tiny, full_sd):
    from safetensors.torch import save_file

    model, _ = tiny
    hf = clip.open_clip_to_hf(full_sd)
    assert hf["visual_projection.weight"].shape == (EMBED, WIDTH)  # (out, in)
    assert hf["vision_model.encoder.layers.0.self_attn.q_proj.weight"].shape == (WIDTH, WIDTH)
    assert torch.equal(hf["vision_model.encoder.layers.1.self_attn.v_proj.weight"],
                       full_sd["visual.transformer.resblocks.1.attn.in_proj_weight"][2 * WIDTH:])
    _assert_same(clip.hf_to_open_clip(hf), full_sd)

    hf["vision_model.embeddings.position_ids"] = torch.arange(17)[None]  # older transformers keep it
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in hf.items()}, str(path))
    assert clip.detect_format(path) == "hf"
    native = clip.vision_state_dict(path)
    assert set(native) == {k for k in hf if k.startswith("vision_model.") and not k.endswith("position_ids")} | {
        "visual_projection.weight"}
    _assert_same(clip.vision_state_dict(path, naming="open_clip"), _visual(full_sd))

    torch.manual_seed(5)
    rebuilt, _ = clip.build_clip(TINY, weights=path)  # both towers from the HF file
    x = torch.rand(3, 3, 32, 32)
    tokens = open_clip.tokenize(["a photo of a dog."])
    with torch.no_grad():
        assert torch.equal(rebuilt.encode_image(x), model.encode_image(x))
        assert torch.equal(rebuilt.encode_text(tokens), model.encode_text(tokens))

    # a save_pretrained folder with two shards and their index
    folder = tmp_path / "hf_sharded"
    folder.mkdir()
    keys = list(hf)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, ks in shards.items():
        save_file({k: hf[k].contiguous() for k in ks}, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: name for name, ks in shards.items() for k in ks}}))
    _assert_same(clip.load_clip_checkpoint(folder), hf)
    _assert_same(clip.vision_state_dict(folder, naming="open_clip"), _visual(full_sd))

    # a CLIPVisionModel file has no projection: the model keeps its own
    vision_only = {k: v for k, v in hf.items() if k.startswith("vision_model.")}
    assert "visual_projection.weight" not in clip.vision_state_dict(vision_only)
    torch.manual_seed(6)
    other, _ = clip.build_clip(TINY)
    proj = other.visual.proj.detach().clone()
    rep = clip.load_clip_weights(other, vision_only)
    assert rep == clip.LoadReport(format="hf", text=False, kept=("visual.proj",))
    assert torch.equal(other.visual.proj, proj)
    assert torch.equal(other.visual.conv1.weight, full_sd["visual.conv1.weight"])
    del vision_only["vision_model.post_layernorm.bias"]
    with pytest.raises(CheckpointError, match="ln_post.bias"):
        clip.load_clip_weights(other, vision_only)


def _expected_matrix_keys(fmt: str, prefix: str = "") -> set[str]:
    keys = set()
    for i in range(LAYERS):
        if fmt == "hf":
            b = f"{prefix}vision_model.encoder.layers.{i}."
            keys |= {b + f"self_attn.{p}_proj.weight" for p in "qkvo" if p != "o"}
            keys |= {b + "self_attn.out_proj.weight", b + "mlp.fc1.weight", b + "mlp.fc2.weight"}
        else:
            b = f"{prefix}visual.transformer.resblocks.{i}."
            keys |= {b + s for s in ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight",
                                     "mlp.c_proj.weight")}
    keys.add(f"{prefix}visual_projection.weight" if fmt == "hf" else f"{prefix}visual.proj")
    return keys


@pytest.mark.parametrize("fmt", ["open_clip", "image_encoder", "hf"])
def test_matrix_rule_per_format(fmt, full_sd):
    rule = MatrixRule()
    if fmt == "open_clip":
        raw = dict(full_sd)
    elif fmt == "image_encoder":
        raw = {f"model.{k}": v for k, v in full_sd.items() if not k.startswith("transformer.")}
    else:
        raw = clip.open_clip_to_hf(full_sd)
        raw["vision_model.embeddings.position_ids"] = torch.arange(17)[None]
    assert clip.detect_format(raw) == fmt
    prefix = "model." if fmt == "image_encoder" else ""
    # the raw checkpoint (text tower included) and the normalised vision tower
    assert set(rule.matrix_keys(raw)) == _expected_matrix_keys(fmt, prefix)
    vis = clip.vision_state_dict(raw)
    assert set(rule.matrix_keys(vis)) == _expected_matrix_keys(fmt)
    kinds = {k: rule.kind(k, v) for k, v in raw.items()}
    if fmt == "hf":
        assert kinds["vision_model.embeddings.position_ids"] == "buffer"
        for k in ("vision_model.embeddings.patch_embedding.weight", "vision_model.embeddings.position_embedding.weight",
                  "vision_model.embeddings.class_embedding", "vision_model.pre_layrnorm.weight",
                  "vision_model.encoder.layers.0.self_attn.q_proj.bias", "text_projection.weight",
                  "text_model.encoder.layers.0.mlp.fc1.weight", "text_model.embeddings.token_embedding.weight",
                  "logit_scale"):
            assert kinds[k] == "other", k
        assert torch.equal(rule.view("visual_projection.weight", raw["visual_projection.weight"]),
                           raw["visual_projection.weight"])
    else:
        for k in ("visual.conv1.weight", "visual.positional_embedding", "visual.class_embedding",
                  "visual.ln_pre.weight", "visual.transformer.resblocks.0.attn.in_proj_bias",
                  "visual.ln_post.bias", "positional_embedding", "token_embedding.weight", "text_projection",
                  "ln_final.weight", "logit_scale"):
            assert kinds[prefix + k] == "other", k
        if fmt == "open_clip":
            assert kinds["transformer.resblocks.0.attn.in_proj_weight"] == "other"  # text tower
        in_proj = raw[prefix + "visual.transformer.resblocks.0.attn.in_proj_weight"]
        assert rule.view(prefix + "visual.transformer.resblocks.0.attn.in_proj_weight", in_proj).shape == (
            3 * WIDTH, WIDTH)
        proj = raw[prefix + "visual.proj"]  # stored (in, out) = (32, 16)
        assert proj.shape == (WIDTH, EMBED)
        view = rule.view(prefix + "visual.proj", proj)
        assert view.shape == (EMBED, WIDTH) and torch.equal(view, proj.t())  # (out, in)
        # the transposed view is the map the model applies: x @ proj == view @ x
        x = torch.randn(WIDTH)
        assert torch.allclose(x @ proj, view @ x)
        # and it equals the Hugging Face layout of the same layer
        assert torch.equal(view, clip.open_clip_to_hf(full_sd)["visual_projection.weight"])
    fused = clip.vision_state_dict(clip.open_clip_to_hf(full_sd), naming="open_clip")
    assert set(rule.matrix_keys(fused)) == _expected_matrix_keys("open_clip")


def test_reference_2d_rule_preset_on_open_clip_keys(full_sd):
    """The reference code's rule: every 2-d tensor but text_projection, as stored."""
    from pactlib.book.experiments.paper_scale import rule_differences
    from pactlib.matrix import PRESETS

    ref = MatrixRule.preset("reference_2d")
    assert ref is PRESETS["reference_2d"]
    with pytest.raises(KeyError, match="reference_2d"):
        MatrixRule.preset("nope")
    two_d = {k for k, v in full_sd.items() if v.ndim == 2 and "text_projection" not in k}
    assert set(ref.matrix_keys(full_sd)) == two_d  # text tower, positional tables, proj included
    assert torch.equal(ref.view("visual.proj", full_sd["visual.proj"]), full_sd["visual.proj"])  # as stored
    assert ref.kind("x.pw.weight", torch.zeros(8, 4, 1, 1)) == "other"  # 1x1 convs are not 2-d
    diff = rule_differences(_visual(full_sd), {"ours": MatrixRule(), "ref": ref})
    got = {r.pattern: (r.ours, r.ref, r.keys) for r in diff.itertuples()}
    assert got == {"visual.positional_embedding": ("other", f"matrix 17×{WIDTH}", 1),
                   "visual.proj": (f"matrix {EMBED}×{WIDTH} (transposed)", f"matrix {WIDTH}×{EMBED}", 1)}
    # Iso-C is transpose-equivariant: visual.proj merges the same under both rules; Iso-CTS is not
    g = torch.Generator().manual_seed(0)
    tvs = [pactlib.TaskVector({"visual.proj": torch.randn(WIDTH, EMBED, generator=g)}) for _ in range(3)]
    a = pactlib.merges.get("iso_c")(tvs, rule=MatrixRule())["visual.proj"]
    b = pactlib.merges.get("iso_c")(tvs, rule=ref)["visual.proj"]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    a = pactlib.merges.get("iso_cts")(tvs, rule=MatrixRule())["visual.proj"]
    b = pactlib.merges.get("iso_cts")(tvs, rule=ref)["visual.proj"]
    assert float((a - b).norm() / b.norm()) > 0.01


# ----------------------------------------------------------------------------- heads, classifier


def test_zeroshot_head_shape_norm_and_value(tiny):
    model, tok = tiny
    names = ["cat", "dog", "red car"]
    templates = ["a photo of a {}.", "a blurry photo of the {}.", lambda c: f"itap of a {c}."]
    head = clip.zeroshot_head(model, tok, names, templates)
    assert head.shape == (3, EMBED) and head.dtype == torch.float32
    assert torch.allclose(head.norm(dim=1), torch.ones(3), atol=1e-6)
    # one class by hand: normalise each prompt's embedding, average, renormalise
    with torch.no_grad():
        e = F.normalize(model.encode_text(tok(["a photo of a dog.", "a blurry photo of the dog.",
                                               "itap of a dog."])), dim=-1)
    assert torch.allclose(head[1], F.normalize(e.mean(0), dim=0), atol=1e-6)
    assert torch.equal(head, clip.zeroshot_head(model, tok, names, templates))  # deterministic
    assert torch.allclose(head, clip.zeroshot_head(model, tok, names, templates, batch_size=2), atol=1e-6)
    assert not torch.allclose(head[0], head[1])
    with pytest.raises(ValueError, match="no '\\{\\}'"):
        clip.zeroshot_head(model, tok, names, ["a photo"])
    with pytest.raises(ValueError, match="classnames is empty"):
        clip.zeroshot_head(model, tok, [], templates)


def test_classifier_logits_deterministic_and_reloadable(tmp_path, tiny, full_sd):
    model, tok = tiny
    path = tmp_path / "clip.pt"
    torch.save(full_sd, path)
    names, templates = ["cat", "dog", "car", "tree"], ["a photo of a {}."]
    c1 = clip.clip_classifier(TINY, weights=path, classnames=names, templates=templates)
    c2 = clip.clip_classifier(TINY, weights=path, classnames=names, templates=templates)
    assert set(c1.state_dict()) == set(_visual(full_sd))  # head / normalisation are not weights
    assert c1.scale == pytest.approx(torch.tensor(2.0).exp().item())
    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8, generator=g)
    with torch.no_grad():
        a, b = c1(imgs), c2(imgs)
        assert a.shape == (5, 4) and torch.equal(a, b) and torch.equal(a, c1(imgs))
        x = (imgs.float() / 255 - torch.tensor(clip.CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(
            clip.CLIP_STD).view(1, 3, 1, 1)
        manual = c1.scale * F.normalize(model.encode_image(x), dim=-1) @ c1.head.t()
        assert torch.allclose(a, manual, atol=1e-5)
        assert torch.allclose(c1(imgs.float() / 255), a, atol=1e-5)  # float [0, 1] input too
        assert c1(torch.randint(0, 256, (2, 3, 48, 40), dtype=torch.uint8)).shape == (2, 4)  # resized
    # a fine-tuned vision tower moves the logits; loading it back restores them
    tuned = {k: (v + 0.05 * torch.randn_like(v)) if k == "visual.proj" else v for k, v in _visual(full_sd).items()}
    c3 = clip.clip_classifier(TINY, weights=path, head=c1.head, vision_weights=tuned)
    with torch.no_grad():
        assert not torch.allclose(c3(imgs), a)
        c3.load_state_dict(c1.state_dict())
        assert torch.equal(c3(imgs), a)
        c3.load_vision(tuned)
        assert not torch.allclose(c3(imgs), a)
        rep = c3.load_vision(clip.open_clip_to_hf(c1.state_dict()))  # a merged tower in HF naming
        assert rep.format == "hf" and rep.kept == () and torch.equal(c3(imgs), a)
    with pytest.raises(ValueError, match="either head"):
        clip.clip_classifier(TINY, weights=path)


def test_read_head_of_pickled_classification_head(tmp_path, monkeypatch, fake_repo_module):
    unit = F.normalize(torch.randn(7, EMBED), dim=-1)
    head = fake_repo_module.ClassificationHead(True, 100.0 * unit)
    path = tmp_path / "head_MNIST.pt"
    torch.save(head, path)
    _forget_fake_repo(monkeypatch)
    with pytest.raises(clip.PickleRefused):
        clip.read_head(path)
    h, scale = clip.read_head(path, trust_pickle=True)
    assert scale == pytest.approx(100.0, rel=1e-5)
    assert torch.allclose(h, unit, atol=1e-6)


def test_never_downloads():
    with pytest.raises(clip.DownloadRefused, match="local"):
        clip.build_clip("ViT-B-32", pretrained="openai")
    with pytest.raises(clip.DownloadRefused):
        clip.build_clip("ViT-B-32", pretrained="laion2b_s34b_b79k")
    with pytest.raises(clip.DownloadRefused):
        clip.build_clip("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K")
    with pytest.raises(clip.DownloadRefused, match="weights='openai' is not a local file"):
        clip.build_clip(TINY, weights="openai")
    with pytest.raises(ValueError, match="unknown open_clip architecture"):
        clip.build_clip("ViT-Q-99")


def test_clear_errors(tmp_path, tiny, full_sd):
    model, _ = tiny
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        clip.load_clip_checkpoint(tmp_path / "nowhere.pt")
    corrupt = tmp_path / "truncated.pt"
    torch.save(full_sd, corrupt)
    corrupt.write_bytes(corrupt.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated.pt: cannot read"):
        clip.load_clip_checkpoint(corrupt)
    with pytest.raises(CheckpointError, match="no CLIP vision tower"):
        clip.detect_format({"fc.weight": torch.zeros(2, 2)})
    bad = dict(full_sd)
    bad["visual.proj"] = torch.zeros(WIDTH, EMBED + 1)
    with pytest.raises(CheckpointError, match="visual.proj"):
        clip.load_clip_weights(model, bad)
    with pytest.raises(CheckpointError, match="unknown Hugging Face CLIP key"):
        clip.hf_to_open_clip({"vision_model.encoder.layers.0.self_attn.rotary.weight": torch.zeros(1)})


# ----------------------------------------------------------------------------- dataset adapters

_CLASSES = ("dense_residential", "forest", "sea_ice")
_SPLIT_CODE = {"train": 10, "test": 200}


def _write_image(path, cls: int, i: int, split: str, *, gray=False):
    """A uniform image whose colour encodes (class, index, split): resizing keeps it exactly."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    colour = (40 * cls + 20, 7 * i, _SPLIT_CODE[split])
    img = Image.new("RGB", (40, 30) if i % 2 else (24, 36), colour)
    (img.convert("L") if gray else img).save(path)
    return colour


@pytest.fixture
def folder_dataset(tmp_path):
    """root/train/<class>/*.png (12 per class) and root/test/<class>/*.png (4 per class)."""
    root = tmp_path / "RESISC45"
    for split, n in (("train", 12), ("test", 4)):
        for c, name in enumerate(_CLASSES):
            for i in range(n):
                _write_image(root / split / name / f"{name}_{i:03d}.png", c, i, split)
    return root


def _ids(images):
    """(class code, index, split code) of every uniform image (N, 3, S, S)."""
    px = images[:, :, 0, 0].to(torch.int64)  # (N, 3)
    assert torch.equal(images, images[:, :, :1, :1].expand_as(images)), "images are not uniform"
    return [tuple(p.tolist()) for p in px]


def test_paper_task_lists():
    assert paper.paper_tasks(8) == ("SUN397", "Cars", "RESISC45", "EuroSAT", "SVHN", "GTSRB", "MNIST", "DTD")
    assert len(paper.paper_tasks(14)) == 14 and paper.paper_tasks(14)[8:] == (
        "CIFAR100", "STL10", "Flowers102", "OxfordIIITPet", "PCAM", "FER2013")
    assert len(set(paper.paper_tasks(20))) == 20 and paper.paper_tasks(20)[:14] == paper.paper_tasks(14)
    assert set(paper.paper_tasks(20)) == set(paper.prompt_tasks())  # standard prompts: tests/test_clip_prompts.py
    assert all(t.count("{}") == 1 for task in paper.paper_tasks(20) for t in paper.templates_for(task))
    with pytest.raises(ValueError, match="8, 14, 20"):
        paper.paper_tasks(10)


def test_train_val_indices_match_random_split():
    tr, va = paper.train_val_indices(36)
    ref_tr, ref_va = torch.utils.data.random_split(range(36), [33, 3], generator=torch.Generator().manual_seed(0))
    assert tr.tolist() == list(ref_tr.indices) and va.tolist() == list(ref_va.indices)
    tr, va = paper.train_val_indices(60_000)
    assert len(va) == 5000 and len(tr) == 55_000  # 10 % capped at 5,000
    assert len(set(tr.tolist()) | set(va.tolist())) == 60_000
    with pytest.raises(ValueError, match="empty"):
        paper.train_val_indices(5)


def test_folder_dataset_splits(folder_dataset):
    data = paper.load_paper_task("Scenes", folder_dataset, image_size=16)  # no standard class list: folder names
    tr, va, te = data["train"], data["val"], data["test"]
    assert (len(tr.labels), len(va.labels), len(te.labels)) == (33, 3, 12)
    assert tr.images.shape == (33, 3, 16, 16) and tr.images.dtype == torch.uint8
    assert tr.labels.dtype == torch.int64 and tr.classes == ("dense residential", "forest", "sea ice")
    assert tr.task == "Scenes" and te.split == "test" and te.classes == tr.classes
    ids = {s: _ids(d.images) for s, d in data.items()}
    # labels agree with the class encoded in every image; splits are disjoint and complete
    for d, i in zip(data.values(), ids.values()):
        assert [(c - 20) // 40 for c, _, _ in i] == d.labels.tolist()
    assert not set(ids["train"]) & set(ids["val"])
    assert len(set(ids["train"]) | set(ids["val"])) == 36 and {s for _, _, s in ids["train"] + ids["val"]} == {10}
    assert {s for _, _, s in ids["test"]} == {200} and len(set(ids["test"])) == 12
    # validation = the reference random_split of the ImageFolder order (class-major, sorted files)
    _, va_rows = paper.train_val_indices(36)
    assert [(40 * (r // 12) + 20, 7 * (r % 12), 10) for r in va_rows.tolist()] == ids["val"]
    # deterministic
    again = paper.load_paper_task("Scenes", folder_dataset, image_size=16)
    assert torch.equal(again["val"].images, va.images) and torch.equal(again["train"].labels, tr.labels)


def test_limits_classnames_and_cache(folder_dataset, tmp_path):
    (folder_dataset / "classnames.txt").write_text("dense houses\nwoodland\nsea ice\n")
    data = paper.load_paper_task("RESISC45", folder_dataset, image_size=8, limit={"train": 10, "test": 5})
    assert (len(data["train"].labels), len(data["val"].labels), len(data["test"].labels)) == (10, 3, 5)
    assert data["train"].classes == ("dense houses", "woodland", "sea ice")
    cache = tmp_path / "cache"
    first = paper.load_paper_task("RESISC45", folder_dataset, image_size=8, limit=10, cache_dir=cache)
    assert len(list(cache.glob("*.pt"))) == 3 and not list(cache.glob(".*tmp"))
    second = paper.load_paper_task("RESISC45", folder_dataset, image_size=8, limit=10, cache_dir=cache)
    assert all(torch.equal(first[s].images, second[s].images) for s in first)
    assert torch.equal(first["train"].images, data["train"].images)  # same seeded subset
    (folder_dataset / "classnames.txt").write_text("only one\n")
    with pytest.raises(ValueError, match="1 names for 3 classes"):
        paper.load_paper_task("RESISC45", folder_dataset, image_size=8)


def test_csv_list_and_npz_layouts(folder_dataset):
    import shutil

    test_dir = folder_dataset / "test"
    rows = sorted(test_dir.rglob("*.png"))
    ref = paper.load_paper_task("T", folder_dataset, image_size=8)["test"]
    ref_by_id = dict(zip(_ids(ref.images), ref.labels.tolist()))
    # CSV layouts: GTSRB-style (';', integer ClassId) and (',', class names); images under root/images
    for name, header, fmt in (("gtsrb", "Filename;Width;ClassId", "images/{rel};40;{idx}"),
                              ("named", "path,label", "images/{rel},{cls}")):
        root = folder_dataset.parent / name
        shutil.copytree(folder_dataset / "train", root / "train")
        shutil.copytree(test_dir, root / "images")
        (root / "test.csv").write_text(header + "\n" + "".join(
            fmt.format(rel=p.relative_to(test_dir), idx=_CLASSES.index(p.parent.name), cls=p.parent.name) + "\n"
            for p in rows))
        got = paper.load_paper_task("T", root, image_size=8)["test"]
        assert len(got.labels) == 12 and got.classes == ref.classes
        assert dict(zip(_ids(got.images), got.labels.tolist())) == ref_by_id
    # RESISC45-style list of bare file names, found in the class folders under root
    lst = folder_dataset.parent / "lst"
    shutil.copytree(test_dir, lst / "all")
    (lst / "test.txt").write_text("".join(f"{p.name}\n" for p in rows[::-1]))
    idx = paper.index_split(lst, "test")
    assert idx.layout == "list" and [p.name for p in idx.files] == [p.name for p in rows[::-1]]
    assert idx.classes == tuple(f"all/{c}" for c in _CLASSES)
    assert paper.prompt_names(lst, idx.classes) == ("dense residential", "forest", "sea ice")
    # an npz split of grayscale digits-like arrays
    imgs = np.stack([np.full((5, 7), 30 * i, np.uint8) for i in range(4)])  # (4, 5, 7)
    np.savez(folder_dataset / "extra.npz", images=imgs, labels=np.array([0, 1, 2, 1]))
    z = paper.index_split(folder_dataset, "extra")
    assert z.layout == "npz" and z.labels.tolist() == [0, 1, 2, 1] and z.classes == ("0", "1", "2")
    dec = paper.decode(z, np.arange(4), 6)
    assert dec.shape == (4, 3, 6, 6) and dec[:, :, 3, 3].tolist() == [[30 * i] * 3 for i in range(4)]


def test_missing_and_inconsistent_data_errors(folder_dataset, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        paper.load_paper_task("X", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="split 'train' not found"):
        paper.load_paper_task("X", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no folder for task 'DTD'"):
        paper.task_root(tmp_path, "DTD")
    assert paper.task_root(folder_dataset.parent, "RESISC45") == folder_dataset
    (folder_dataset / "EuroSAT_splits").mkdir()
    assert paper.task_root(folder_dataset, "EuroSAT").name == "EuroSAT_splits"
    _write_image(folder_dataset / "test" / "glacier" / "g.png", 0, 0, "test", gray=True)
    with pytest.raises(ValueError, match="glacier"):
        paper.load_paper_task("RESISC45", folder_dataset, image_size=8)


def test_decoding_matches_clip_eval_transform(tmp_path):
    """Decoded images equal torchvision's Resize(S, bicubic) + CenterCrop(S), CLIP's eval geometry."""
    from PIL import Image
    from torchvision import transforms as T

    rng = np.random.default_rng(0)
    ref_tf = T.Compose([T.Resize(24, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(24)])
    for i, (w, h) in enumerate([(61, 40), (33, 50), (24, 24), (17, 11)]):
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(tmp_path / f"{i}.png")
        idx = paper.SplitIndex("list", (tmp_path / f"{i}.png",), np.zeros(1, np.int64), ("x",))
        got = paper.decode(idx, np.arange(1), 24)[0].permute(1, 2, 0).numpy()
        assert np.array_equal(got, np.asarray(ref_tf(Image.fromarray(arr)))), (w, h)


# ----------------------------------------------------------------------------- evaluation loop

from pactlib import eval as E  # noqa: E402
from pactlib.data.store import TaskData  # noqa: E402


def _task(images, labels, C, name="t", split="val"):
    return TaskData(images=images, labels=labels, classes=tuple(f"c{i}" for i in range(C)), task=name, split=split)


@pytest.fixture(scope="module")
def eval_setup(tiny, full_sd):
    """A classifier on its own copy of the tiny tower, two tasks with random unit heads, and the
    predictions of θ0 (= full_sd's tower) per task computed by hand from the original model."""
    import copy

    model, _ = tiny
    g = torch.Generator().manual_seed(11)
    imgs = torch.randint(0, 256, (11, 3, 32, 32), dtype=torch.uint8, generator=g)
    x = (imgs.float() / 255 - torch.tensor(clip.CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        clip.CLIP_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        f = F.normalize(model.encode_image(x), dim=-1)  # (11, 16)
    # class embeddings = features of some of the images (so each class is predicted at least once)
    heads = {"a": f[[0, 1, 2]].clone(), "b": f[[3, 4, 5, 6, 7]].clone()}
    pred = {t: (f @ h.t()).argmax(1) for t, h in heads.items()}
    assert len(set(pred["a"].tolist())) > 1 and len(set(pred["b"].tolist())) > 1  # not a constant map
    clf = clip.ClipClassifier.from_clip(copy.deepcopy(model), heads["a"])
    return clf, imgs, heads, pred, clip.vision_state_dict(full_sd)


def _wrong(labels, rows, C):
    out = labels.clone()
    out[rows] = (out[rows] + 1) % C
    return out


def test_clip_evaluate_equals_manual_argmax_batching_and_limit(eval_setup):
    clf, imgs, heads, pred, vis = eval_setup
    ya = _wrong(pred["a"], [0, 4, 9], 3)  # 8 of 11 right
    yb = _wrong(pred["b"], [2], 5)  # 10 of 11 right
    datas = {"b": _task(imgs, yb, 5, "b"), "a": _task(imgs, ya, 3, "a")}
    hs = {"a": heads["a"], "b": (heads["b"], 50.0)}  # plain tensor (classifier's scale), (H, scale) pair
    res = E.clip_evaluate(vis, hs, datas, classifier=clf, progress=False)
    assert res == {"b": 10 / 11, "a": 8 / 11} and list(res) == ["b", "a"]
    for bs in (1, 7, 64):
        assert E.clip_evaluate(vis, hs, datas, classifier=clf, batch_size=bs, progress=False) == res
    lim = E.clip_evaluate(vis, hs, datas, classifier=clf, limit=4, progress=False)
    assert lim == {"b": 3 / 4, "a": 3 / 4}  # first 4 rows: row 2 of "b" and row 0 of "a" are wrong
    assert lim == {t: (datas[t].labels[:4] == pred[t][:4]).float().mean().item() for t in datas}
    # clip_accuracy: the classifier as it is (tower loaded above, its own head = heads["a"])
    modes = {n: m.training for n, m in clf.named_modules()}
    assert E.clip_accuracy(clf, datas["a"], batch_size=5) == 8 / 11  # with the tqdm bar
    assert E.clip_accuracy(clf, datas["a"], limit=1, progress=False) == 0.0
    assert {n: m.training for n, m in clf.named_modules()} == modes  # train/eval flags restored


def test_clip_evaluate_loads_the_tower_into_the_shared_module(eval_setup):
    clf, imgs, heads, pred, vis = eval_setup
    datas = {"a": _task(imgs, pred["a"], 3, "a"), "b": _task(imgs, pred["b"], 5, "b")}
    g = torch.Generator().manual_seed(3)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in vis.items()}
    before = {k: v.clone() for k, v in noisy.items()}
    clf_heads = {"a": heads["a"], "b": heads["b"]}
    acc_noisy = E.clip_evaluate(noisy, clf_heads, datas, classifier=clf, progress=False)
    assert min(acc_noisy.values()) < 1.0  # another tower, other predictions
    assert E.clip_evaluate(vis, clf_heads, datas, classifier=clf, progress=False) == {"a": 1.0, "b": 1.0}
    assert all(torch.equal(noisy[k], before[k]) for k in noisy)  # inputs not modified
    # None = the weights already in the classifier; other namings of the same tower
    assert E.clip_evaluate(None, clf_heads, datas, classifier=clf, progress=False) == {"a": 1.0, "b": 1.0}
    E.clip_evaluate(noisy, clf_heads, datas, classifier=clf, progress=False)
    for same in (clip.open_clip_to_hf(vis), {f"model.{k}": v for k, v in vis.items()}):
        assert E.clip_evaluate(same, clf_heads, datas, classifier=clf, progress=False) == {"a": 1.0, "b": 1.0}
    # a ClipClassifier as head: its head and scale; it is also the default classifier
    other = clip.ClipClassifier(clf.visual, heads["b"], scale=3.0, image_size=32)
    assert E.clip_evaluate(vis, {"a": clf, "b": other}, datas, progress=False) == {"a": 1.0, "b": 1.0}


class _ChannelMean(nn.Module):
    """A stand-in tower: feature = proj(mean pixel per normalised channel), (N, 3) -> (N, 3)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(3))

    def forward(self, x):
        return self.proj(x.mean(dim=(2, 3)))


def _colour_images(colours, side=8):
    """Uniform images, image i having channel colours[i] at 255 and the others at 0."""
    imgs = torch.zeros(len(colours), 3, side, side, dtype=torch.uint8)
    imgs[torch.arange(len(colours)), torch.tensor(colours)] = 255
    return imgs


def test_clip_evaluate_known_accuracy_with_one_hot_heads():
    """Channel c bright -> normalised feature largest in dimension c (CLIP mean/std < 1 and > 0),
    so a head mapping class c to the one-hot embedding e_c predicts the colour exactly."""
    colours = [0, 1, 2, 0, 1, 2, 0, 1, 2]
    imgs = _colour_images(colours)
    clf = clip.ClipClassifier(_ChannelMean(), torch.eye(3), scale=100.0, image_size=8)
    y = torch.tensor(colours)
    shifted = torch.eye(3)[[1, 2, 0]]  # class c -> e_{c+1}: predicts class (colour - 1) mod 3
    datas = {"id": _task(imgs, _wrong(y, [1, 5], 3), 3), "shift_true": _task(imgs, y, 3),
             "shift_pred": _task(imgs, (y - 1) % 3, 3)}
    hs = {"id": torch.eye(3), "shift_true": shifted, "shift_pred": shifted}
    assert E.clip_evaluate(None, hs, datas, classifier=clf, batch_size=4, progress=False) == {
        "id": 7 / 9, "shift_true": 0.0, "shift_pred": 1.0}
    # a "merged" tower whose projection permutes the channels moves the predictions with it
    perm = {"visual.proj.weight": torch.eye(3)[[1, 2, 0]]}  # feature_j = channel_{j+1}
    assert E.clip_evaluate(perm, {"t": torch.eye(3)}, {"t": _task(imgs, (y - 1) % 3, 3)}, classifier=clf,
                           progress=False) == {"t": 1.0}
    # images of another side: an error unless resize=True (uniform images stay uniform)
    big = _task(_colour_images(colours, side=16), y, 3, "big")
    with pytest.raises(ValueError, match=r"task 'big': images are 16x16 px but the classifier expects 8x8.*"
                                         r"image_size=8.*resize=True"):
        E.clip_evaluate({"visual.proj.weight": torch.eye(3)}, {"big": torch.eye(3)},
                        {"big": big}, classifier=clf, progress=False)
    assert E.clip_evaluate({"visual.proj.weight": torch.eye(3)}, {"big": torch.eye(3)}, {"big": big},
                           classifier=clf, resize=True, progress=False) == {"big": 1.0}
    assert E.clip_accuracy(clf, big, resize=True, progress=False) == 1.0


def test_clip_evaluate_errors(eval_setup):
    clf, imgs, heads, pred, vis = eval_setup
    data = {"a": _task(imgs, pred["a"], 3, "a")}
    with pytest.raises(KeyError, match=r"no head for task\(s\) \['a'\]"):
        E.clip_evaluate(vis, {"b": heads["b"]}, data, classifier=clf, progress=False)
    with pytest.raises(ValueError, match="needs classifier="):
        E.clip_evaluate(vis, {"a": heads["a"]}, data, progress=False)
    with pytest.raises(ValueError, match="task 'a' has 3 classes but its head has 5"):
        E.clip_evaluate(vis, {"a": heads["b"]}, data, classifier=clf, progress=False)
    with pytest.raises(ValueError, match="embedding dim 17 but the image features have 16"):
        E.clip_evaluate(vis, {"a": torch.randn(3, 17)}, data, classifier=clf, progress=False)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        E.clip_evaluate(vis, {"a": (heads["a"], -1.0)}, data, classifier=clf, progress=False)
    with pytest.raises(TypeError, match="got str"):
        E.clip_evaluate(vis, {"a": "head.pt"}, data, classifier=clf, progress=False)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        E.clip_evaluate(vis, {"a": heads["a"]}, {"a": _task(imgs, pred["a"] + 3, 3, "a")}, classifier=clf,
                        progress=False)
    with pytest.raises(ValueError, match="no examples"):
        E.clip_evaluate(vis, {"a": heads["a"]}, data, classifier=clf, limit=0, progress=False)
    with pytest.raises(ValueError, match="11 images but 10 labels"):
        E.clip_evaluate(vis, {"a": heads["a"]}, {"a": _task(imgs, pred["a"][:10], 3, "a")}, classifier=clf,
                        progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        E.clip_evaluate(vis, {"a": heads["a"]}, data, classifier=clf, batch_size=0, progress=False)
    bad = dict(vis)
    del bad["visual.ln_post.bias"]
    with pytest.raises(CheckpointError, match="ln_post.bias"):
        E.clip_evaluate(bad, {"a": heads["a"]}, data, classifier=clf, progress=False)


def test_select_alpha_with_clip_evaluator(eval_setup):
    clf, imgs, heads, pred, vis = eval_setup
    val = {"a": _task(imgs, pred["a"], 3, "a"), "b": _task(imgs, pred["b"], 5, "b")}
    test = {t: _task(d.images.flip(0), d.labels.flip(0), len(d.classes), t, "test") for t, d in val.items()}
    g = torch.Generator().manual_seed(4)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in vis.items()}
    assert min(E.clip_evaluate(noisy, heads, val, classifier=clf, progress=False).values()) < 1.0
    asked = []

    def merged(alpha):
        asked.append(alpha)
        return vis if alpha == 0.3 else noisy

    fn = E.clip_evaluator(heads, classifier=clf, batch_size=4, progress=False)
    rec = E.select_alpha(merged, [0.5, 0.1, 0.3], val=val, test=test, ft_val={"a": 1.0, "b": 1.0},
                         ft_test={"a": 0.8, "b": 1.0}, method="ta", evaluate_fn=fn, limit=6)
    assert rec["alpha"] == 0.3 and asked == [0.1, 0.3, 0.5, 0.3] and rec["val_limit"] == 6
    assert rec["metrics"]["acc"] == 1.0 and rec["metrics"]["norm_acc"] == pytest.approx((1 / 0.8 + 1) / 2)
    assert rec["per_task"]["test"]["normalized"] == {"a": 1 / 0.8, "b": 1.0}
    json.dumps(rec)
    with pytest.raises(ValueError, match="exactly one of heads= .* and evaluate_fn="):
        E.select_alpha(merged, [0.1], heads=heads, val=val, test=test, ft_val={}, ft_test={}, method="x",
                       evaluate_fn=fn)
    with pytest.raises(ValueError, match="exactly one of"):
        E.select_alpha(merged, [0.1], val=val, test=test, ft_val={}, ft_test={}, method="x")


# ----------------------------------------------------------------------------- pact merge --trust-pickle


def test_cli_merge_trust_pickle_reads_image_encoder_pickles(tmp_path, monkeypatch, fake_repo_module, full_sd,
                                                            capsys):
    import pactlib
    from pactlib.cli import main
    from pactlib.io import load_state_dict, save_state_dict

    g = torch.Generator().manual_seed(9)
    sds, paths = [], []
    for i in range(3):  # θ0 and two fine-tuned towers, each saved as a whole pickled ImageEncoder
        sd = dict(full_sd) if i == 0 else {
            k: (v + 0.01 * torch.randn(v.shape, generator=g)) if k.startswith("visual.") else v
            for k, v in full_sd.items()}
        model, _ = clip.build_clip(TINY, weights=sd)
        enc = fake_repo_module.ImageEncoder(model)
        sds.append({k: v.clone() for k, v in enc.state_dict().items()})
        paths.append(tmp_path / ("zeroshot.pt" if i == 0 else f"ft{i}.pt"))
        torch.save(enc, paths[-1])
    _forget_fake_repo(monkeypatch)  # a user without their src/ package
    save_state_dict(sds[0], tmp_path / "zeroshot.safetensors")
    out = tmp_path / "merged.safetensors"
    common = ["merge", "--method", "iso_c", "--pact", "pact", "--alpha", "0.8", "--out", str(out),
              "--set", "core_frac=0.2"]

    rc = main([*common, "--pretrained", str(tmp_path / "zeroshot.safetensors"), "--finetuned",
               *map(str, paths[1:])])
    err = capsys.readouterr().err
    assert rc == 2 and "ft1.pt holds pickled Python objects" in err and "--trust-pickle" in err
    assert not out.exists()

    rc = main([*common, "--pretrained", str(paths[0]), "--finetuned", *map(str, paths[1:]), "--trust-pickle"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["tasks"] == 2
    want = pactlib.merge("iso_c", sds[0], sds[1:], alpha=0.8, pact="pact", core_frac=0.2)
    got = load_state_dict(out)
    assert set(got) == set(want) and all(k.startswith("model.") for k in got)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    assert clip.detect_format(out) == "image_encoder"  # loadable by ClipClassifier.load_vision
