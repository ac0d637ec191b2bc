"""Matrix-rule presets on the real key names and shapes of each model family (Hugging Face /
open_clip state dicts, one block each): which keys are maps, and which are stored (in, out)."""
import pytest
import torch

from pactlib.matrix import PRESETS, MatrixRule, detect_preset

D, V = 8, 50  # width, vocabulary (small stand-ins; the key names are the families' own)

GPT2 = {  # transformers GPT2LMHeadModel
    "transformer.wte.weight": (V, D), "transformer.wpe.weight": (16, D),
    "transformer.h.0.ln_1.weight": (D,), "transformer.h.0.ln_1.bias": (D,),
    "transformer.h.0.attn.bias": (1, 1, 16, 16), "transformer.h.0.attn.masked_bias": (),
    "transformer.h.0.attn.c_attn.weight": (D, 3 * D), "transformer.h.0.attn.c_attn.bias": (3 * D,),
    "transformer.h.0.attn.c_proj.weight": (D, D), "transformer.h.0.attn.c_proj.bias": (D,),
    "transformer.h.0.ln_2.weight": (D,), "transformer.h.0.mlp.c_fc.weight": (D, 4 * D),
    "transformer.h.0.mlp.c_fc.bias": (4 * D,), "transformer.h.0.mlp.c_proj.weight": (4 * D, D),
    "transformer.h.0.mlp.c_proj.bias": (D,), "transformer.ln_f.weight": (D,), "lm_head.weight": (V, D),
}
LLAMA = {  # transformers LlamaForCausalLM (Mistral / Qwen2 share the names)
    "model.embed_tokens.weight": (V, D), "model.layers.0.self_attn.q_proj.weight": (D, D),
    "model.layers.0.self_attn.k_proj.weight": (D // 2, D), "model.layers.0.self_attn.v_proj.weight": (D // 2, D),
    "model.layers.0.self_attn.o_proj.weight": (D, D), "model.layers.0.mlp.gate_proj.weight": (3 * D, D),
    "model.layers.0.mlp.up_proj.weight": (3 * D, D), "model.layers.0.mlp.down_proj.weight": (D, 3 * D),
    "model.layers.0.input_layernorm.weight": (D,), "model.layers.0.post_attention_layernorm.weight": (D,),
    "model.norm.weight": (D,), "lm_head.weight": (V, D),
}
BERT = {  # transformers BertModel, as in sentence-transformers' all-MiniLM-L6-v2 (no "bert." prefix)
    "embeddings.word_embeddings.weight": (V, D), "embeddings.position_embeddings.weight": (16, D),
    "embeddings.token_type_embeddings.weight": (2, D), "embeddings.LayerNorm.weight": (D,),
    "encoder.layer.0.attention.self.query.weight": (D, D), "encoder.layer.0.attention.self.query.bias": (D,),
    "encoder.layer.0.attention.self.key.weight": (D, D), "encoder.layer.0.attention.self.value.weight": (D, D),
    "encoder.layer.0.attention.output.dense.weight": (D, D), "encoder.layer.0.attention.output.LayerNorm.weight": (D,),
    "encoder.layer.0.intermediate.dense.weight": (4 * D, D), "encoder.layer.0.output.dense.weight": (D, 4 * D),
    "encoder.layer.0.output.LayerNorm.bias": (D,), "pooler.dense.weight": (D, D),
}
VIT = {  # transformers ViTModel
    "vit.embeddings.cls_token": (1, 1, D), "vit.embeddings.position_embeddings": (1, 5, D),
    "vit.embeddings.patch_embeddings.projection.weight": (D, 3, 4, 4),
    "vit.encoder.layer.0.attention.attention.query.weight": (D, D),
    "vit.encoder.layer.0.attention.attention.key.weight": (D, D),
    "vit.encoder.layer.0.attention.attention.value.weight": (D, D),
    "vit.encoder.layer.0.attention.output.dense.weight": (D, D),
    "vit.encoder.layer.0.intermediate.dense.weight": (4 * D, D), "vit.encoder.layer.0.output.dense.weight": (D, 4 * D),
    "vit.encoder.layer.0.layernorm_before.weight": (D,), "vit.layernorm.weight": (D,), "classifier.weight": (3, D),
}


def _sd(spec):
    return {k: torch.zeros(s) for k, s in spec.items()}


def _views(rule, sd):
    """{key: (m, n) of its matrix view} for the matrix layers; (m, n) = (out, in)."""
    return {k: tuple(rule.view(k, v).shape) for k, v in sd.items() if rule.kind(k, v) == "matrix"}


def test_gpt2_conv1d_layers_are_transposed_maps_and_tables_are_not():
    sd = _sd(GPT2)
    assert detect_preset(sd) == "gpt2"
    assert _views(PRESETS["gpt2"], sd) == {
        "transformer.h.0.attn.c_attn.weight": (3 * D, D), "transformer.h.0.attn.c_proj.weight": (D, D),
        "transformer.h.0.mlp.c_fc.weight": (4 * D, D), "transformer.h.0.mlp.c_proj.weight": (D, 4 * D)}
    # Conv1D computes x @ W + b: the view is the map applied to a column vector
    W = torch.randn(D, 3 * D)
    x = torch.randn(D)
    torch.testing.assert_close(PRESETS["gpt2"].view("transformer.h.0.attn.c_attn.weight", W) @ x, x @ W)
    # the default (CLIP) rule takes every "transformer." key as open_clip's text tower: no maps
    assert _views(PRESETS["default"], sd) == {}


def test_decoder_lm_embedding_and_lm_head_are_not_maps():
    sd = _sd(LLAMA)
    assert detect_preset(sd) == "decoder_lm"
    got = _views(PRESETS["decoder_lm"], sd)
    assert set(got) == {k for k in LLAMA if "proj" in k}
    assert got["model.layers.0.mlp.down_proj.weight"] == (D, 3 * D)


def test_hf_encoder_rule_on_bert_and_vit():
    for spec, prefix in ((BERT, ""), (VIT, "vit.")):
        sd = _sd(spec)
        assert detect_preset(sd) == "hf_encoder"
        got = _views(PRESETS["hf_encoder"], sd)
        tables = [k for k in spec if "embeddings" in k or "cls_token" in k]
        assert tables and not set(tables) & set(got)
        assert f"{prefix}encoder.layer.0.intermediate.dense.weight" in got
        assert got[f"{prefix}encoder.layer.0.output.dense.weight"] == (D, 4 * D)
        assert all(len(spec[k]) == 2 for k in got)  # norms, biases, patch conv: not maps


def test_default_rule_on_other_families_and_reference_rule():
    # embed_tokens / lm_head tables are never maps, whatever the preset (except the reference rule)
    assert PRESETS["default"].kind("model.embed_tokens.weight", torch.zeros(V, D)) == "other"
    assert PRESETS["default"].kind("lm_head.weight", torch.zeros(V, D)) == "other"
    assert PRESETS["reference_2d"].kind("model.embed_tokens.weight", torch.zeros(V, D)) == "matrix"
    assert detect_preset({"net.blocks.0.conv_pw.weight": torch.zeros(4, 2, 1, 1)}) == "default"
    assert PRESETS["open_clip"] is PRESETS["default"]
    with pytest.raises(KeyError, match="gpt2"):
        MatrixRule.preset("gpt3")
