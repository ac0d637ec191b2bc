"""PEFT LoRA adapters read as task vectors (pactlib.peft): Δ = scale·B·A with the scale applied
once, rank/alpha patterns as PEFT matches them, key naming, key maps, errors, ``pact merge
--lora-adapters``; and against PEFT itself (a test requirement): adapters its save_pretrained writes,
its merge_and_unload and its merge_utils.ties."""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from torch import nn

import pactlib
from pactlib.cli import main
from pactlib.io import load_state_dict, save_state_dict
from pactlib.peft import (AdapterError, AdapterSource, Target, hf_clip_to_open_clip, pattern_key, read_adapter,
                          read_config)

G = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=G)


def base_sd():
    return {"lin.weight": rand(6, 4), "lin.bias": rand(6), "blk.0.q_proj.weight": rand(5, 5),
            "blk.1.q_proj.weight": rand(5, 5), "emb.weight": rand(10, 5), "conv.weight": rand(6, 3, 3, 3),
            "pw.weight": rand(6, 3, 1, 1), "c1d.weight": rand(6, 4), "norm.weight": torch.ones(5),
            "bn.num_batches_tracked": torch.tensor(3)}


def write_adapter(folder, tensors, **config):
    folder.mkdir(parents=True, exist_ok=True)
    save_state_dict(tensors, folder / "adapter_model.safetensors")
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 8, "target_modules": None, **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def factors(prefix="base_model.model.", adapter=""):
    """A, B of every layer kind, keyed as PEFT saves them."""
    a = f".{adapter}" if adapter else ""
    t = {}
    for m, (out, inn), r in (("lin", (6, 4), 2), ("blk.0.q_proj", (5, 5), 4), ("blk.1.q_proj", (5, 5), 2),
                             ("c1d", (4, 6), 2)):
        t[f"{prefix}{m}.lora_A{a}.weight"], t[f"{prefix}{m}.lora_B{a}.weight"] = rand(r, inn), rand(out, r)
    t[f"{prefix}conv.lora_A{a}.weight"], t[f"{prefix}conv.lora_B{a}.weight"] = rand(2, 3, 3, 3), rand(6, 2, 1, 1)
    t[f"{prefix}pw.lora_A{a}.weight"], t[f"{prefix}pw.lora_B{a}.weight"] = rand(2, 3, 1, 1), rand(6, 2, 1, 1)
    t[f"{prefix}emb.lora_embedding_A{a}"], t[f"{prefix}emb.lora_embedding_B{a}"] = rand(2, 10), rand(5, 2)
    return t


CONFIG = dict(rank_pattern={r"blk\.0\.q_proj": 4}, alpha_pattern={"lin": 3.0, "q_proj": 6},
              target_modules=["lin", "q_proj", "conv", "pw", "emb", "c1d"])


def expected(t, base, *, rslora=False, prefix="base_model.model.", a=""):
    """θ0 + Δ by hand: scale = alpha / r (rslora: / sqrt r); (B @ A) * scale as PEFT computes it."""
    def s(alpha, r):
        return alpha / math.sqrt(r) if rslora else alpha / r

    def f(m, part):
        suffix = f".{a}" if a else ""
        return t[f"{prefix}{m}.{part}{suffix}" + ("" if "embedding" in part else ".weight")]

    out = {k: v.clone() for k, v in base.items()}
    out["lin.weight"] = base["lin.weight"] + (f("lin", "lora_B") @ f("lin", "lora_A")) * s(3.0, 2)
    out["blk.0.q_proj.weight"] = base["blk.0.q_proj.weight"] + (f("blk.0.q_proj", "lora_B") @ f("blk.0.q_proj", "lora_A")) * s(6, 4)
    out["blk.1.q_proj.weight"] = base["blk.1.q_proj.weight"] + (f("blk.1.q_proj", "lora_B") @ f("blk.1.q_proj", "lora_A")) * s(6, 2)
    # Conv1D stored (in, out) = (6, 4): the factors are A (r, in=6), B (out=4, r), Δ transposed
    out["c1d.weight"] = base["c1d.weight"] + (f("c1d", "lora_B") @ f("c1d", "lora_A")).T * s(8, 2)
    A, B = f("conv", "lora_A"), f("conv", "lora_B")
    out["conv.weight"] = base["conv.weight"] + torch.einsum("or,rikl->oikl", B[:, :, 0, 0], A) * s(8, 2)
    A, B = f("pw", "lora_A"), f("pw", "lora_B")
    out["pw.weight"] = base["pw.weight"] + (B[:, :, 0, 0] @ A[:, :, 0, 0])[:, :, None, None] * s(8, 2)
    out["emb.weight"] = base["emb.weight"] + (f("emb", "lora_embedding_B") @ f("emb", "lora_embedding_A")).T * s(8, 2)
    return out


@pytest.mark.parametrize("rslora", [False, True])
def test_hand_computed_delta_every_layer_kind(tmp_path, rslora):
    base, t = base_sd(), factors()
    write_adapter(tmp_path / "a", t, use_rslora=rslora, **CONFIG)
    tv = read_adapter(tmp_path / "a", base_keys=base)  # c1d: (in, out) by its shape, whatever fan_in_fan_out says
    assert set(tv) == {k for k, v in base.items() if v.is_floating_point()}
    assert torch.equal(tv["lin.bias"], torch.zeros(6)) and torch.equal(tv["norm.weight"], torch.zeros(5))
    got, want = tv.apply_to(base, 1.0), expected(t, base, rslora=rslora)
    for k in base:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6, msg=k)
    assert torch.equal(got["lin.weight"], want["lin.weight"])  # the same float operations: bit for bit


def test_scale_applied_once_and_read_back_by_the_config(tmp_path):
    cfg = read_config(write_adapter(tmp_path / "a", factors(), **CONFIG))
    assert cfg.rank_alpha("lin") == (2, 3.0) and cfg.scale("lin") == 1.5
    assert cfg.rank_alpha("blk.0.q_proj") == (4, 6.0) and cfg.rank_alpha("blk.1.q_proj") == (2, 6.0)
    assert cfg.scale("conv") == 4.0
    rs = read_config(write_adapter(tmp_path / "b", factors(), use_rslora=True, **CONFIG))
    assert rs.scale("blk.0.q_proj") == 6 / 2 and rs.scale("conv") == 8 / math.sqrt(2)
    # the only-adapted-keys form: Δ itself, no zeros
    tv = read_adapter(tmp_path / "a")
    assert "lin.bias" not in tv and "lin.weight" in tv and "emb.weight" in tv


def test_pattern_matching_is_peft_s():
    """get_pattern_key: re.match(rf"(.*\\.)?({p})$", module), first pattern in order, else the module."""
    assert pattern_key(["q_proj"], "model.layers.0.q_proj") == "q_proj"
    assert pattern_key(["q_proj"], "q_proj") == "q_proj"
    assert pattern_key(["q_proj"], "model.xq_proj") == "model.xq_proj"  # a suffix after a dot only
    assert pattern_key(["proj"], "model.q_proj") == "model.q_proj"
    assert pattern_key([r"layers\.0\.q_proj", "q_proj"], "m.layers.0.q_proj") == r"layers\.0\.q_proj"
    assert pattern_key(["q_proj", r"layers\.0\.q_proj"], "m.layers.0.q_proj") == "q_proj"  # first wins
    assert pattern_key([r"^model\.decoder\.layers\.0\.k_proj"], "model.decoder.layers.0.k_proj") != \
        "model.decoder.layers.0.k_proj"
    assert pattern_key([r".*\.[0-3]\.q_proj"], "enc.2.q_proj") == r".*\.[0-3]\.q_proj"


def test_key_forms_prefix_and_adapter_names(tmp_path):
    ref = read_adapter(write_adapter(tmp_path / "plain", factors(), **CONFIG), base_keys=base_sd())
    for i, (prefix, name) in enumerate((("", ""), ("base_model.model.", "default"), ("", "mine"))):
        G.manual_seed(0)
        base = base_sd()
        t = factors(prefix, name)
        tv = read_adapter(write_adapter(tmp_path / f"f{i}", t, **CONFIG), base_keys=base)
        want = expected(t, base, prefix=prefix, a=name)
        got = tv.apply_to(base)
        assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in base), (prefix, name)
    assert ref.keys() == tv.keys()
    two = {**factors("", "x"), **factors("", "y")}
    d = write_adapter(tmp_path / "two", two, **CONFIG)
    with pytest.raises(AdapterError, match=r"adapters \['x', 'y'\]; choose one"):
        read_adapter(d)
    assert set(read_adapter(d, adapter_name="y")) == set(read_adapter(d, adapter_name="x"))
    with pytest.raises(AdapterError, match="no adapter named 'z'"):
        read_adapter(d, adapter_name="z")


def test_lora_bias_and_whole_weight_entries(tmp_path):
    base = base_sd()
    t = {"base_model.model.lin.lora_A.weight": rand(2, 4), "base_model.model.lin.lora_B.weight": rand(6, 2),
         "base_model.model.lin.lora_B.bias": rand(6)}
    tv = read_adapter(write_adapter(tmp_path / "b", t, lora_bias=True), base_keys=base)
    assert torch.equal(tv["lin.bias"], t["base_model.model.lin.lora_B.bias"] * 4.0)
    t2 = dict(t, **{"base_model.model.norm.weight": torch.full((5,), 2.0)})
    d = write_adapter(tmp_path / "m", t2, modules_to_save=["norm"])
    with pytest.raises(AdapterError, match=r"whole weights.*norm\.weight.*modules_to_save"):
        read_adapter(d, base_keys=base)
    with pytest.warns(UserWarning, match="left out 1 whole-weight entry"):
        assert torch.equal(read_adapter(d, base_keys=base, extra="skip")["norm.weight"], torch.zeros(5))
    assert torch.equal(read_adapter(d, base_keys=base, extra="delta")["norm.weight"], torch.ones(5))


def test_errors_name_file_key_and_field(tmp_path):
    base = base_sd()
    with pytest.raises(FileNotFoundError, match="adapter_model"):
        read_adapter(tmp_path)
    t = factors()
    d = write_adapter(tmp_path / "r", t, r=3)  # lin's A has rank 2
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors: module '[a-z.0-9_]+': '[a-z.0-9_A]+' has rank "
                                           r"\d but the config's r is 3 \(.*adapter_config\.json\)"):
        read_adapter(d)
    d = write_adapter(tmp_path / "rp", t, rank_pattern={"q_proj": 2})  # blk.0 has rank 4
    with pytest.raises(AdapterError, match=r"'blk\.0\.q_proj'.*rank_pattern\['q_proj'\] is 2"):
        read_adapter(d)
    for bad, match in (({"r": 0}, "r must be an integer >= 1"), ({"lora_alpha": "x"}, "lora_alpha must be"),
                       ({"use_dora": True}, "use_dora"), ({"peft_type": "IA3"}, "peft_type is 'IA3'"),
                       ({"rank_pattern": {"(": 2}}, "rank_pattern key '\\('"),
                       ({"alpha_pattern": {"lin": None}}, r"alpha_pattern\['lin'\]")):
        d = write_adapter(tmp_path / f"c{len(match)}", t, **{**CONFIG, **bad})
        with pytest.raises(AdapterError, match=match):
            read_adapter(d)
    d = write_adapter(tmp_path / "dora", {**t, "base_model.model.lin.lora_magnitude_vector": rand(6)}, **CONFIG)
    with pytest.raises(AdapterError, match="lora_magnitude_vector.*DoRA"):
        read_adapter(d)
    d = write_adapter(tmp_path / "half", {"base_model.model.lin.lora_A.weight": rand(2, 4)})
    with pytest.raises(AdapterError, match="'base_model.model.lin.lora_A.weight' has no lora_B partner"):
        read_adapter(d)
    d = write_adapter(tmp_path / "nan", {"lin.lora_A.weight": torch.full((2, 4), float("nan")),
                                         "lin.lora_B.weight": rand(6, 2)})
    with pytest.raises(AdapterError, match="'lin.lora_A.weight' holds NaN"):
        read_adapter(d)
    d = write_adapter(tmp_path / "shape", {"lin.lora_A.weight": rand(2, 5), "lin.lora_B.weight": rand(6, 2)})
    with pytest.raises(AdapterError, match=r"'lin.lora_A.weight': Δ has shape \(6, 5\) but the base's 'lin.weight' is \(6, 4\)"):
        read_adapter(d, base_keys=base)
    d = write_adapter(tmp_path / "miss", {"enc.lin.lora_A.weight": rand(2, 4), "enc.lin.lora_B.weight": rand(6, 2)})
    with pytest.raises(AdapterError, match="adapts 'enc.lin.weight', which is not in the base checkpoint.*key_map"):
        read_adapter(d, base_keys=base)
    tv = read_adapter(d, base_keys=base, key_map={"enc.lin.weight": "lin.weight"})
    assert tv["lin.weight"].abs().sum() > 0
    d = write_adapter(tmp_path / "grp", {"conv.lora_A.weight": rand(4, 3, 3, 3), "conv.lora_B.weight": rand(6, 2, 1, 1)},
                      r=4)
    with pytest.raises(AdapterError, match="module 'conv': grouped convolution"):
        read_adapter(d)
    with pytest.raises(KeyError, match="unknown LoRA key map 'nope'"):
        read_adapter(tmp_path / "miss", key_map="nope")
    with pytest.warns(UserWarning, match="target_modules"):
        read_adapter(write_adapter(tmp_path / "tm", factors(), **{**CONFIG, "target_modules": ["lin"]}))


def _tiny_open_clip(d=8, layers=2, e=6):
    sd = {"visual.conv1.weight": rand(d, 3, 4, 4), "visual.class_embedding": rand(d),
          "visual.positional_embedding": rand(5, d), "visual.ln_pre.weight": torch.ones(d),
          "visual.ln_pre.bias": torch.zeros(d), "visual.ln_post.weight": torch.ones(d),
          "visual.ln_post.bias": torch.zeros(d), "visual.proj": rand(d, e)}
    for i in range(layers):
        p = f"visual.transformer.resblocks.{i}."
        sd.update({p + "attn.in_proj_weight": rand(3 * d, d), p + "attn.in_proj_bias": rand(3 * d),
                   p + "attn.out_proj.weight": rand(d, d), p + "attn.out_proj.bias": rand(d),
                   p + "ln_1.weight": torch.ones(d), p + "ln_1.bias": torch.zeros(d),
                   p + "ln_2.weight": torch.ones(d), p + "ln_2.bias": torch.zeros(d),
                   p + "mlp.c_fc.weight": rand(4 * d, d), p + "mlp.c_fc.bias": rand(4 * d),
                   p + "mlp.c_proj.weight": rand(d, 4 * d), p + "mlp.c_proj.bias": rand(d)})
    return sd


def test_hf_clip_adapter_on_an_open_clip_checkpoint(tmp_path):
    """An HF-CLIP LoRA (q, v, out_proj, fc1, visual_projection) read onto open_clip keys equals the
    HF-named task vector converted by models.clip.hf_to_open_clip (q/k/v stacked, proj transposed)."""
    from pactlib.models.clip import hf_to_open_clip, open_clip_to_hf

    oc = _tiny_open_clip()
    hf = open_clip_to_hf(oc)
    d, t = 8, {}
    for i in range(2):
        for m, (o, n) in (("self_attn.q_proj", (d, d)), ("self_attn.v_proj", (d, d)),
                          ("self_attn.out_proj", (d, d)), ("mlp.fc1", (4 * d, d))):
            k = f"base_model.model.vision_model.encoder.layers.{i}.{m}"
            t[k + ".lora_A.weight"], t[k + ".lora_B.weight"] = rand(2, n), rand(o, 2)
    t["base_model.model.visual_projection.lora_A.weight"] = rand(2, d)
    t["base_model.model.visual_projection.lora_B.weight"] = rand(6, 2)
    a = write_adapter(tmp_path / "hf", t, target_modules=["q_proj", "v_proj", "out_proj", "fc1", "visual_projection"])
    tv_hf = read_adapter(a, base_keys=hf)
    want = hf_to_open_clip(tv_hf.to_dict())
    tv_oc = read_adapter(a, base_keys=oc, key_map="hf_clip_to_open_clip")
    assert tv_oc.keys() == want.keys()
    for k in want:
        assert torch.equal(tv_oc[k], want[k]), k
    k = "visual.transformer.resblocks.1.attn.in_proj_weight"
    assert tv_oc[k][d:2 * d].abs().sum() == 0 and tv_oc[k][:d].abs().sum() > 0  # k_proj not adapted
    pre = {"model." + k: v for k, v in oc.items()}
    tv_ie = read_adapter(a, base_keys=pre, key_map="hf_clip_to_image_encoder")
    assert all(torch.equal(tv_ie["model." + k], v) for k, v in tv_oc.items())
    assert hf_clip_to_open_clip("vision_model.encoder.layers.0.self_attn.v_proj.bias") == \
        Target("visual.transformer.resblocks.0.attn.in_proj_bias", part=(2, 3))
    assert hf_clip_to_open_clip("vision_model.encoder.layers.0.unknown.weight") is None


def test_pact_merge_lora_adapters(tmp_path, monkeypatch):
    """pact merge --lora-adapters: TA α=1 on one adapter is θ0 + scale·B·A exactly; several
    adapters with PACT + Iso-C give pactlib's in-memory merge of the same task vectors."""
    monkeypatch.setenv("PACT_CONVERT_CACHE", str(tmp_path / "cache"))
    base = {k: v for k, v in base_sd().items()}
    save_state_dict(base, tmp_path / "pre.safetensors")
    dirs = []
    for i in range(3):
        dirs.append(str(write_adapter(tmp_path / f"ad{i}", factors(), **CONFIG)))
    out = tmp_path / "ta.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained",
                     str(tmp_path / "pre.safetensors"), "--lora-adapters", dirs[0], "--out", str(out)]) == 0
        got = load_state_dict(out)
        want = read_adapter(dirs[0], base_keys=base).apply_to(base, 1.0)
        assert all(torch.equal(got[k], want[k]) for k in base)
        out2 = tmp_path / "iso.safetensors"
        assert main(["merge", "--method", "iso_c", "--pact", "pact", "--alpha", "0.7", "--pretrained",
                     str(tmp_path / "pre.safetensors"), "--lora-adapters", *dirs, "--out", str(out2),
                     "--set", "svd=exact", "--threads", "1"]) == 0
        tvs = [read_adapter(d, base_keys=base, name=d) for d in dirs]
        D, _ = pactlib.merged_update("iso_c", base, tvs, pact="pact", options=pactlib.PactOptions(svd="exact"))
        want = D.apply_to(base, 0.7)
        got = load_state_dict(out2)
        assert all(torch.equal(got[k], want[k]) for k in base)
        out3 = tmp_path / "ties.safetensors"  # TIES' global threshold: several passes over the sources
        assert main(["merge", "--method", "ties", "--alpha", "0.5", "--pretrained", str(tmp_path / "pre.safetensors"),
                     "--lora-adapters", *dirs, "--out", str(out3)]) == 0
        D, _ = pactlib.merged_update("ties", base, tvs)
        want, got = D.apply_to(base, 0.5), load_state_dict(out3)
        assert all(torch.equal(got[k], want[k]) for k in base)


def test_bin_adapter_reads_like_safetensors(tmp_path):
    """adapter_model.bin (torch.save of the factors) is read with weights_only: no pickled code runs."""
    base, t = base_sd(), factors()
    a = write_adapter(tmp_path / "st", t, **CONFIG)
    b = tmp_path / "bin"
    b.mkdir()
    torch.save(t, b / "adapter_model.bin")
    (b / "adapter_config.json").write_text((a / "adapter_config.json").read_text())
    x, y = read_adapter(a, base_keys=base), read_adapter(b, base_keys=base)
    assert all(torch.equal(x[k], y[k]) for k in x)
    assert set(read_adapter(b / "adapter_model.bin")) == set(read_adapter(a))


def test_pact_merge_lora_adapter_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PACT_CONVERT_CACHE", str(tmp_path / "cache"))
    save_state_dict(base_sd(), tmp_path / "pre.safetensors")
    d = write_adapter(tmp_path / "miss", {"enc.lin.lora_A.weight": rand(2, 4), "enc.lin.lora_B.weight": rand(6, 2)})
    argv = ["merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained", str(tmp_path / "pre.safetensors"),
            "--out", str(tmp_path / "o.safetensors"), "--lora-adapters", str(d)]
    assert main(argv) == 2
    assert "adapts 'enc.lin.weight', which is not in the base checkpoint" in capsys.readouterr().err
    assert main(argv + ["--lora-key-map", "nope"]) == 2
    assert "unknown LoRA key map 'nope'" in capsys.readouterr().err
    assert main(argv[:-2] + ["--lora-adapters", str(tmp_path / "none")]) == 2
    assert "PEFT adapter not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --finetuned and --lora-adapters are exclusive
        main(argv + ["--finetuned", str(tmp_path / "pre.safetensors")])
    assert not (tmp_path / "o.safetensors").exists()


def test_pact_merge_whole_weight_entries_are_named_with_what_the_cli_takes(tmp_path, capsys, monkeypatch):
    """An adapter with a modules_to_save weight: `pact merge --lora-adapters` names it and offers
    --lora-extra skip, the one choice it takes (not extra='delta', which needs θ0 in memory); with
    skip the merge runs and leaves that weight at θ0."""
    monkeypatch.setenv("PACT_CONVERT_CACHE", str(tmp_path / "cache"))
    base = base_sd()
    save_state_dict(base, tmp_path / "pre.safetensors")
    d = write_adapter(tmp_path / "m", {**factors(), "base_model.model.norm.weight": torch.full((5,), 2.0)},
                      **CONFIG, modules_to_save=["norm"])
    argv = ["merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained", str(tmp_path / "pre.safetensors"),
            "--out", str(tmp_path / "o.safetensors"), "--lora-adapters", str(d)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "whole weights" in err and "norm.weight" in err and "--lora-extra skip" in err
    assert "delta" not in err
    with pytest.raises(SystemExit):  # the CLI has no 'delta'
        main(argv + ["--lora-extra", "delta"])
    assert "invalid choice: 'delta'" in capsys.readouterr().err
    assert main(argv + ["--lora-extra", "skip"]) == 0
    assert "left out 1 whole-weight entry" in capsys.readouterr().err
    assert torch.equal(load_state_dict(tmp_path / "o.safetensors")["norm.weight"], base["norm.weight"])
    with pytest.raises(AdapterError, match="extra='delta' with θ0"):  # in memory, 'delta' is offered
        read_adapter(d, base_keys=base)


def test_adapter_source_streams_delta_only_on_request(tmp_path):
    base = base_sd()
    src = AdapterSource(write_adapter(tmp_path / "a", factors(), **CONFIG))
    with pytest.raises(RuntimeError):
        src.delta("lin.weight")
    src.check({k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in base.items()})
    assert src.delta("lin.bias") is None
    assert torch.equal(src.delta("lin.weight"), read_adapter(tmp_path / "a")["lin.weight"])


# ------------------------------------------------------------------------ PEFT's own merge

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.lin = nn.Linear(4, 6)
        self.blk = nn.ModuleList([nn.ModuleDict({"q_proj": nn.Linear(5, 5)}) for _ in range(2)])
        self.emb = nn.Embedding(10, 5)
        self.conv = nn.Conv2d(3, 6, 3)
        self.pw = nn.Conv2d(3, 6, 1)
        self.c1d = Conv1D(4, 6)  # weight stored (in=6, out=4)


@pytest.mark.parametrize("rslora,bias", [(False, False), (True, False), (False, True)])
def test_against_peft_merge_and_unload(tmp_path, rslora, bias):
    """Our θ0 + Δ equals PEFT's own merge_and_unload() (rsLoRA, rank/alpha patterns, lora_bias)."""
    import peft
    torch.manual_seed(0)
    net = _Net()
    base = {k: v.detach().clone() for k, v in net.state_dict().items()}
    targets = ["lin", "q_proj", "conv", "pw", "c1d"] + ([] if bias else ["emb"])  # no lora_bias on Embedding
    cfg = peft.LoraConfig(r=2, lora_alpha=8, use_rslora=rslora, lora_bias=bias, target_modules=targets,
                          rank_pattern={r"blk\.0\.q_proj": 4, "conv": 3}, alpha_pattern={"lin": 3, "q_proj": 6})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(net, cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=G))
        model.save_pretrained(tmp_path / "ad")
        merged = {k: v.detach().clone() for k, v in model.merge_and_unload().state_dict().items()}
        tv = read_adapter(tmp_path / "ad", base_keys=base)
    got = tv.apply_to(base, 1.0)
    assert got.keys() == merged.keys()
    for k in merged:
        torch.testing.assert_close(got[k], merged[k], rtol=1e-6, atol=1e-6, msg=k)


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)


def _trained(peft, cfg, net):
    """``net`` wrapped by PEFT with random LoRA factors and (modules_to_save) a changed head copy."""
    model = peft.get_peft_model(net, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(torch.randn(p.shape, generator=G))
    return model


def test_modules_to_save_written_by_peft_refused_skipped_or_taken_as_delta(tmp_path):
    """PEFT's save_pretrained of a LoRA with modules_to_save: the whole-weight copies are refused
    by name, left out with a warning, or taken as value − θ0, which then equals merge_and_unload."""
    import peft

    torch.manual_seed(0)
    net = _Small()
    base = {k: v.detach().clone() for k, v in net.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _trained(peft, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["lin"], modules_to_save=["head"]), net)
        model.save_pretrained(tmp_path / "ad")
        merged = {k: v.detach().clone() for k, v in model.merge_and_unload().state_dict().items()}
    with pytest.raises(AdapterError, match=r"head\.weight.*modules_to_save"):
        read_adapter(tmp_path / "ad", base_keys=base)
    with pytest.warns(UserWarning, match="left out 2 whole-weight entries"):
        skipped = read_adapter(tmp_path / "ad", base_keys=base, extra="skip")
    assert torch.equal(skipped["head.weight"], torch.zeros(3, 6)) and skipped["lin.weight"].abs().sum() > 0
    got = read_adapter(tmp_path / "ad", base_keys=base, extra="delta").apply_to(base, 1.0)
    assert got.keys() == merged.keys()
    for k in merged:
        torch.testing.assert_close(got[k], merged[k], rtol=1e-6, atol=1e-6, msg=k)


def test_dora_written_by_peft_is_refused_naming_use_dora(tmp_path):
    import peft

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trained(peft, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["lin"], use_dora=True),
                 _Small()).save_pretrained(tmp_path / "dora")
    with pytest.raises(AdapterError, match="use_dora"):
        read_adapter(tmp_path / "dora")


def test_ties_per_key_equals_peft_merge_utils_ties():
    """TIES with scope="per_key" on one key is PEFT's merge_utils.ties (density k/100, total sign,
    unit weights): 100 entries, so both keep exactly 20 per task."""
    from peft.utils.merge_utils import ties as peft_ties

    tvs = [pactlib.TaskVector._wrap({"w": torch.randn(10, 10, generator=G)}, f"t{i}") for i in range(4)]
    ours = pactlib.merges.get("ties")(tvs, rule=pactlib.MatrixRule(), k=20.0, scope="per_key")["w"]
    theirs = peft_ties([tv["w"] for tv in tvs], torch.ones(4), density=0.2)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_read_adapter_is_reachable_after_import_pactlib():
    import subprocess
    import sys

    code = "import pactlib; print(pactlib.peft.read_adapter.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "read_adapter"
