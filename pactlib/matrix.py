"""The matrix view: which checkpoint entries are linear maps, and how to see them as (out, in).

PACT and the SVD-based merges act on linear maps W: R^n -> R^m stored as (m, n). This module
holds the one explicit rule (book/method.md, matrix-view) that decides, key by key, whether an entry is a

- ``"matrix"`` layer: ``nn.Linear.weight`` (m, n) -- including open_clip's fused
  ``attn.in_proj_weight`` (3d, d) and Hugging Face CLIP's separate q/k/v/out/fc1/fc2 --, a 1x1
  convolution (m, n, 1, 1) seen as (m, n), or open_clip's ``visual.proj``, stored (in, out)
  because it is used as ``x @ proj``: its view is the **transpose**;
- ``"other"`` floating entry, merged by the base method's own rule and never by an SVD:
  biases, norms, 0-d scalars (``logit_scale``), class tokens, positional / token embedding
  tables (a table is not a map), k x k convolutions with k > 1 (depthwise included), anything
  with more than two dims that is not a 1x1 conv, and the text tower of a CLIP model (its task
  vectors are zero);
- ``"buffer"``: a non-floating entry (e.g. BatchNorm's ``num_batches_tracked``), copied from
  the pre-trained checkpoint and never differenced.

The right singular vectors of a view live in the input space R^n; every subspace in pactlib is
a subspace of R^n. Book: chapter 1 ("The method").
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    import torch
    from torch import Tensor


Kind = Literal["matrix", "other", "buffer"]

#: Keys that are tables or belong to a frozen / zero-delta text tower: never matrix layers.
DEFAULT_NOT_MATRIX: tuple[str, ...] = (
    r"positional_embedding",  # open_clip (tokens, d) table
    r"class_embedding",  # open_clip class token
    r"(^|\.)embeddings?\.",  # HF CLIP embeddings.* (patch, position) and similar tables
    r"token_embedding",  # open_clip text token table
    r"(^|\.)text_model\.",  # HF CLIP text tower
    r"(^|\.)text_projection",  # open_clip / HF text projection
    r"^((model|module|_orig_mod)\.)*transformer\.",  # open_clip text tower (visual's is visual.transformer.*)
    r"^((model|module|_orig_mod)\.)*ln_final\.",  # open_clip text tower final norm
    r"logit_scale",
    r"(^|\.)embed_tokens\.",  # decoder LMs' token table
    r"(^|\.)lm_head\.",  # decoder LMs' output table (often tied to embed_tokens)
)
#: Keys stored (in, out) because the model computes ``x @ W``: their matrix view is W.T.
DEFAULT_TRANSPOSED: tuple[str, ...] = (r"(^|\.)visual\.proj$",)


@dataclass(frozen=True)
class MatrixRule:
    """The explicit rule deciding which keys are matrix layers (book/method.md, matrix-view).

    Args:
        not_matrix: regular expressions (``re.search``); a key matching any is never a matrix.
        transposed: regular expressions of 2-d keys stored (in, out); their view is the transpose.
        kxk_conv: if True, k x k convolutions (m, c, k, k) with k > 1 become (m, c*k*k)
            matrices. Default False (book/method.md, matrix-view).
        conv_1x1: if True (default), 1 x 1 convolutions (m, n, 1, 1) are (m, n) matrices; if
            False only 2-d tensors can be matrices.

    Named presets: :data:`PRESETS` / :meth:`preset` (e.g. ``MatrixRule.preset("reference_2d")``).
    """

    not_matrix: tuple[str, ...] = DEFAULT_NOT_MATRIX
    transposed: tuple[str, ...] = DEFAULT_TRANSPOSED
    kxk_conv: bool = False
    conv_1x1: bool = True

    @staticmethod
    def preset(name: str) -> "MatrixRule":
        """The rule registered as ``name`` in :data:`PRESETS`.

        Raises:
            KeyError: unknown name (the message lists the presets).
        """
        try:
            return PRESETS[name]
        except KeyError:
            raise KeyError(f"unknown matrix-rule preset {name!r}; known: {', '.join(PRESETS)}") from None

    def kind(self, key: str, tensor: Tensor) -> Kind:
        """Classify one entry. Returns ``"matrix"``, ``"other"`` or ``"buffer"``."""
        import torch
        if not torch.is_floating_point(tensor):
            return "buffer"
        if tensor.ndim < 2 or any(re.search(p, key) for p in self.not_matrix):
            return "other"
        if tensor.ndim == 2:
            return "matrix"
        if tensor.ndim == 4:
            kh, kw = tensor.shape[-2:]
            if ((kh, kw) == (1, 1) and self.conv_1x1) or self.kxk_conv:
                return "matrix"
        return "other"

    def is_transposed(self, key: str) -> bool:
        return any(re.search(p, key) for p in self.transposed)

    def view(self, key: str, tensor: Tensor, *, stacked: bool = False) -> Tensor:
        """The (m, n) = (out, in) matrix view of a matrix layer (a view, no copy, where possible).

        Args:
            key: the checkpoint key (decides transposition).
            tensor: the stored tensor, or with ``stacked=True`` a stack (T, *stored shape).

        Returns:
            (m, n), or (T, m, n) when ``stacked``.

        Raises:
            ValueError: the key is not a matrix layer under this rule.
        """
        one = tensor[0] if stacked else tensor
        if self.kind(key, one) != "matrix":
            raise ValueError(f"key {key!r} with shape {tuple(one.shape)} is not a matrix layer")
        lead = tensor.shape[:1] if stacked else ()
        # (…, m, n·k·k); a 1x1 conv -> (…, m, n). n is given, not -1: reshape cannot infer a -1
        # for a tensor with no elements (m = 0)
        mat = tensor.reshape(*lead, one.shape[0], math.prod(one.shape[1:]))
        if self.is_transposed(key):
            mat = mat.transpose(-2, -1)  # stored (in, out) -> view (out, in)
        return mat

    def unview(self, key: str, mat: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
        """Inverse of :meth:`view` for one (m, n) matrix: back to the stored ``shape``."""
        if self.is_transposed(key):
            mat = mat.transpose(-2, -1)
        return mat.reshape(shape)

    def matrix_keys(self, state_dict) -> list[str]:
        """Keys of ``state_dict`` that are matrix layers, in the dict's order."""
        return [k for k, v in state_dict.items() if self.kind(k, v) == "matrix"]


DEFAULT_RULE = MatrixRule()

#: The rule of the public reference implementations of TSV-M and Iso-C/Iso-CTS (and of the
#: task-vectors code they build on): every 2-d tensor except ``text_projection`` is merged as a
#: matrix, as stored. Unlike :data:`DEFAULT_RULE` it also SVD-merges open_clip's
#: ``positional_embedding`` (a (tokens, d) table) and takes ``visual.proj`` untransposed (stored
#: (in, out); TSV-M and Iso-C do not care, Iso-CTS and PACT do: they act on one side), and it
#: leaves 1 x 1 convolutions to the mean. Use it to reproduce the reference merges exactly
#: (book chapter 12).
REFERENCE_2D_RULE = MatrixRule(not_matrix=(r"text_projection",), transposed=(), conv_1x1=False)

#: Hugging Face encoders (BERT / MiniLM, ViT): ``nn.Linear`` q/k/v, attention output, the two MLP
#: weights, pooler and heads are maps stored (out, in); word / position / token-type embedding
#: tables, ViT's ``cls_token`` and ``position_embeddings`` and its patch convolution are not.
HF_ENCODER_RULE = MatrixRule(
    not_matrix=(r"(^|\.)embeddings?\.", r"(^|\.)(word|position|token_type)_embeddings", r"cls_token",
                r"mask_token", r"(^|\.)relative_attention_bias"),
    transposed=())

#: GPT-2 (Hugging Face): its ``Conv1D`` layers (``c_attn``, ``c_proj``, ``c_fc``, ``q_attn``) are
#: stored (in, out), so their view is the transpose; ``wte`` / ``wpe`` tables, the tied
#: ``lm_head`` (a table of token vectors) and the causal-mask buffers ``attn.bias`` /
#: ``attn.masked_bias`` are not maps.
GPT2_RULE = MatrixRule(
    not_matrix=(r"(^|\.)wte\.", r"(^|\.)wpe\.", r"(^|\.)lm_head\.", r"(^|\.)attn\.(masked_)?bias$",
                r"(^|\.)score\."),
    transposed=(r"(^|\.)(c_attn|c_proj|c_fc|q_attn)\.weight$",))

#: Decoder language models in the Llama / Mistral / Qwen layout: q/k/v/o and gate/up/down
#: projections are maps; the ``embed_tokens`` table and ``lm_head`` (vocabulary × width, often
#: tied to it) are not.
DECODER_LM_RULE = MatrixRule(
    not_matrix=(r"(^|\.)embed_tokens\.", r"(^|\.)lm_head\.", r"(^|\.)embed_positions\.",
                r"rotary_emb"),
    transposed=())

#: Named matrix rules: ``MatrixRule.preset(name)``, ``pact merge --rule NAME``. ``default`` is
#: the rule of book/method.md, matrix-view, for CLIP (open_clip, Hugging Face, task-vectors layouts) and the
#: book's convolutional testbed (``open_clip`` is an alias of it).
PRESETS: dict[str, MatrixRule] = {"default": DEFAULT_RULE, "open_clip": DEFAULT_RULE,
                                  "hf_encoder": HF_ENCODER_RULE, "gpt2": GPT2_RULE,
                                  "decoder_lm": DECODER_LM_RULE, "reference_2d": REFERENCE_2D_RULE}


def detect_preset(state_dict) -> str:
    """The preset whose family the key names of ``state_dict`` belong to.

    GPT-2 (``.attn.c_attn.weight`` under ``h.N.``), decoder LMs (``embed_tokens``), Hugging Face
    encoders (``attention.self.query`` / ``attention.attention.query``) and otherwise
    ``"default"`` (CLIP layouts, convolutional nets). Used by ``pact merge --rule auto``.
    """
    keys = list(state_dict)
    if any(re.search(r"(^|\.)h\.\d+\.attn\.c_attn\.weight$", k) for k in keys):
        return "gpt2"
    if any(re.search(r"(^|\.)embed_tokens\.weight$", k) for k in keys):
        return "decoder_lm"
    if any(re.search(r"\.attention\.(self|attention)\.query\.weight$", k) for k in keys):
        return "hf_encoder"
    return "default"


_SPLIT_QKV = re.compile(r"(^|\.)(vision_model|text_model)\.encoder\.layers\.\d+\.self_attn\.[qkv]_proj\.weight$")
_FUSED_QKV = re.compile(r"(^|\.)(visual\.)?transformer\.resblocks\.\d+\.attn\.in_proj_weight$")


def attention_layout(keys) -> str | None:
    """How a CLIP checkpoint stores its attention input projections: ``"split"`` (Hugging Face:
    ``…self_attn.{q,k,v}_proj.weight``, three (d, d) matrices per layer), ``"fused"`` (open_clip,
    task_vectors / TSV files: one ``…attn.in_proj_weight`` (3d, d)), or None (neither)."""
    keys = list(keys)
    if any(_SPLIT_QKV.search(k) for k in keys):
        return "split"
    if any(_FUSED_QKV.search(k) for k in keys):
        return "fused"
    return None


#: What :func:`split_attention_note` says: the same weights in the two layouts merge differently.
SPLIT_ATTENTION_NOTE = (
    "{where}Hugging Face CLIP keys: q, k and v are merged as three (d, d) matrices per layer, while "
    "open_clip and task_vectors/TSV files of the same weights (and the reference TSV-M / Iso-C code) hold one "
    "fused (3d, d) in_proj_weight; SVD-based merges (TSV-M, Iso-C, Iso-CTS) and PACT act per matrix, so the two "
    "layouts give different merged updates. For the reference's view convert the checkpoints first: "
    "pactlib.models.clip.vision_state_dict(path, naming='open_clip')")


def no_matrix_note(method, rule: MatrixRule, tensors, where: str = "") -> str | None:
    """A warning's text when ``method`` (a :class:`pactlib.merges.MergeMethod`) merges matrix
    layers through their SVDs (``matrix_layers``: TSV-M, Iso-C, Iso-CTS) and no key of
    ``tensors`` (``{key: Tensor}``, ``meta`` tensors will do) is a matrix under ``rule``: the
    merge then runs entry by entry. It names the preset :func:`detect_preset` finds for the keys
    (what ``pact merge --rule auto`` uses) when that is not the default. None otherwise."""
    if not method.matrix_layers or any(rule.kind(k, v) == "matrix" for k, v in tensors.items()):
        return None
    preset = detect_preset(tensors)
    hint = (f"; these keys are {preset}'s: rule=MatrixRule.preset({preset!r}) (pact merge --rule {preset}, or auto) "
            "views their matrix layers" if preset != "default" else "")
    return f"{where}no key is a matrix layer under this rule, so {method.name} runs entry by entry{hint}"


def split_attention_note(keys, where: str = "") -> str | None:
    """:data:`SPLIT_ATTENTION_NOTE` when ``keys`` hold a Hugging Face CLIP tower's separate q/k/v
    projections (:func:`attention_layout` is ``"split"``), else None."""
    return SPLIT_ATTENTION_NOTE.format(where=where) if attention_layout(keys) == "split" else None

