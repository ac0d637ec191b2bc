"""Hugging Face CLIP key names and their open_clip counterparts: the one table behind
:func:`pactlib.models.clip.hf_to_open_clip` (whole checkpoints) and
:func:`pactlib.peft.hf_clip_to_open_clip` (the key map of LoRA adapters). Plain data, so the
engine can use it without open_clip."""

#: Hugging Face encoder-layer suffix -> open_clip resblock suffix (q/k/v aside: fused into in_proj)
HF_BLOCK = {
    "self_attn.out_proj.weight": "attn.out_proj.weight",
    "self_attn.out_proj.bias": "attn.out_proj.bias",
    "layer_norm1.weight": "ln_1.weight", "layer_norm1.bias": "ln_1.bias",
    "layer_norm2.weight": "ln_2.weight", "layer_norm2.bias": "ln_2.bias",
    "mlp.fc1.weight": "mlp.c_fc.weight", "mlp.fc1.bias": "mlp.c_fc.bias",
    "mlp.fc2.weight": "mlp.c_proj.weight", "mlp.fc2.bias": "mlp.c_proj.bias",
}
#: whole-key renames (tensors unchanged)
HF_TOP = {
    "vision_model.embeddings.class_embedding": "visual.class_embedding",
    "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
    "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
    "vision_model.pre_layrnorm.weight": "visual.ln_pre.weight",
    "vision_model.pre_layrnorm.bias": "visual.ln_pre.bias",
    "vision_model.post_layernorm.weight": "visual.ln_post.weight",
    "vision_model.post_layernorm.bias": "visual.ln_post.bias",
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
    "logit_scale": "logit_scale",
}
#: (out, in) in Hugging Face, stored (in, out) in open_clip
HF_TRANSPOSED = {"visual_projection.weight": "visual.proj", "text_projection.weight": "text_projection"}
#: layer prefixes of the two towers
HF_TOWERS = {"vision_model.encoder.layers.": "visual.transformer.resblocks.",
             "text_model.encoder.layers.": "transformer.resblocks."}
