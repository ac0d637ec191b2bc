"""CLIP at paper scale: checkpoint readers, vision-tower state dicts, zero-shot heads.

The paper merges CLIP ViT image encoders (B/32, B/16, L/14) fine-tuned on 8, 14 or 20 tasks.
Those weights are in no package registry, so this module never downloads: every checkpoint is
a file the user supplies, and asking for a hub tag (``pretrained="openai"``, ``"hf-hub:…"``)
raises :class:`DownloadRefused`. Three public formats are read:

- ``"open_clip"``: an open_clip state dict (``.pt`` / ``.bin`` / ``.safetensors``, or an
  OpenAI TorchScript archive) with keys ``visual.conv1.weight``, ``visual.proj`` (stored
  (in, out)), ``visual.transformer.resblocks.N.attn.in_proj_weight`` (3d, d), … and the text
  tower ``transformer.*``, ``token_embedding.weight``, ``ln_final.*``, ``text_projection``,
  ``logit_scale``; optionally inside a ``{"state_dict": …}`` wrapper and/or behind a
  ``module.`` / ``model.`` prefix.
- ``"image_encoder"``: the task_vectors / TSV / iso-merging checkpoints, a whole pickled
  ``ImageEncoder`` module (``torch.save(module)``) whose state dict has keys
  ``model.visual.*`` (and the text tower deleted), or the plain state dict of one. Unpickling
  a module runs code from the file: it needs ``trust_pickle=True``, otherwise
  :class:`PickleRefused` is raised. Classes the pickle names but this environment lacks (their
  ``src.modeling.ImageEncoder``) are replaced by empty ``nn.Module`` stand-ins, enough to
  recover the tensors.
- ``"hf"``: Hugging Face ``CLIPModel`` / ``CLIPVisionModel(WithProjection)`` weights, keys
  ``vision_model.encoder.layers.N.self_attn.{q,k,v,out}_proj.weight``, ``mlp.fc1/fc2``,
  ``vision_model.embeddings.*``, ``visual_projection.weight`` stored (out, in).

:func:`vision_state_dict` returns the image tower only, in one naming per family: ``visual.*``
for open_clip and image-encoder checkpoints (the same network), ``vision_model.*`` +
``visual_projection.weight`` for Hugging Face ones (``naming="open_clip"`` converts them, q/k/v
fused into ``in_proj_weight``). With the default :class:`pactlib.matrix.MatrixRule` the matrix
layers are then exactly the attention and MLP weights and the output projection
(``visual.proj`` viewed transposed); the patch convolution, class / positional embeddings,
norms and biases are "other" (tests/test_clip.py checks this per format).

:class:`ClipClassifier` is image encoder + zero-shot head: logits = s · f̂ Hᵀ with f̂ the
unit image feature, H the (C, d) unit class embeddings of :func:`zeroshot_head` and
s = exp(logit_scale). Its ``state_dict()`` holds only the ``visual.*`` keys, so merged vision
state dicts load into it directly.

Caution: OpenAI's CLIP weights (those of the paper's checkpoints) were trained with QuickGELU;
build them with ``quick_gelu=True`` (or the ``ViT-B-32-quickgelu`` config), otherwise the
network runs with exact GELU and its accuracy drops.

Book: chapter "Paper scale" (how to run the book on the real checkpoints).
"""
from __future__ import annotations

import logging
import pickle
import re
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pactlib.checks import CheckpointError
from pactlib.clip_keys import HF_BLOCK as _HF_BLOCK
from pactlib.clip_keys import HF_TOP as _HF_TOP
from pactlib.clip_keys import HF_TOWERS as _HF_TOWERS
from pactlib.clip_keys import HF_TRANSPOSED as _HF_TRANSPOSED

log = logging.getLogger(__name__)

Format = Literal["open_clip", "image_encoder", "hf"]
FORMATS: tuple[str, ...] = ("open_clip", "image_encoder", "hf")
PathLike = Union[str, Path]
Source = Union[PathLike, Mapping[str, Tensor], nn.Module]

#: Image normalisation of OpenAI CLIP (per RGB channel, on [0, 1] pixels).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: Leading key prefixes added by wrappers (DDP, the ImageEncoder's ``self.model``, torch.compile).
_WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")
#: Entries of TorchScript archives and HF checkpoints that are not weights (metadata, the
#: causal text mask, position indices).
_NOT_WEIGHTS = re.compile(r"(^|\.)(input_resolution|context_length|vocab_size|position_ids|attn_mask)$")
#: open_clip text-tower keys (top level of a CLIP state dict).
_TEXT_PREFIXES = ("transformer.", "token_embedding.", "ln_final.")
_TEXT_TOP = ("positional_embedding", "text_projection", "logit_scale")


class PickleRefused(CheckpointError):
    """A checkpoint holds pickled Python objects and ``trust_pickle`` was not given."""


class DownloadRefused(ValueError):
    """A hub tag or URL was asked for: this project loads local files only."""


# --------------------------------------------------------------------------- reading files


class _StandIn(nn.Module):
    """Empty module put in place of a class the pickle names but this environment lacks."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) protocol
            state = state[0] or {}
        if isinstance(state, dict):
            nn.Module.__setstate__(self, state)


def _lenient_pickle_module(substituted: list[str]) -> types.ModuleType:
    """A ``pickle``-like module whose Unpickler replaces missing classes by stand-ins."""

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                substituted.append(f"{module}.{name}")
                return type(name, (_StandIn,), {"__module__": module, "__qualname__": name})

    mod = types.ModuleType("pactlib_lenient_pickle")
    mod.Unpickler = Unpickler
    mod.load = lambda f, **kw: Unpickler(f, **kw).load()
    mod.Pickler, mod.dump, mod.dumps = pickle.Pickler, pickle.dump, pickle.dumps
    return mod


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any(n.endswith("constants.pkl") for n in zf.namelist())


def _unwrap(obj, path: Path) -> dict[str, Tensor]:
    """Module -> its state dict; {"state_dict": sd} / {"model": sd} -> sd; check tensors."""
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    for _ in range(3):  # e.g. {"state_dict": {"model": ...}}; open_clip: {"epoch", "state_dict", …}
        if isinstance(obj, Mapping) and not all(isinstance(v, Tensor) for v in obj.values()):
            inner = next((obj[k] for k in ("state_dict", "model", "module") if k in obj), None)
            if inner is None:
                break
            obj = inner.state_dict() if isinstance(inner, nn.Module) else inner
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: expected a state dict or a module, found {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(
            f"{path}: entries that are not tensors: {bad[:5]} (a wrapper other than 'state_dict'/"
            "'model'? pass the inner mapping)")
    if not obj:
        raise CheckpointError(f"{path}: the checkpoint holds no tensors")
    return dict(obj)


def _checkpoint_files(folder: Path) -> list[Path]:
    """The weight file(s) of a Hugging Face / open_clip model folder (shards via the index), in
    the order :func:`pactlib.lazy.folder_checkpoint` takes them.

    Raises:
        CheckpointError: a malformed index (see :func:`pactlib.lazy.index_shards`).
        FileNotFoundError: no weight file or index in ``folder``.
    """
    from ..lazy import INDEX_SUFFIX, folder_checkpoint, index_shards

    f = folder_checkpoint(folder)
    return index_shards(f) if f.name.endswith(INDEX_SUFFIX) else [f]


def load_clip_checkpoint(path: PathLike, *, trust_pickle: bool = False) -> dict[str, Tensor]:
    """Read one checkpoint into a flat state dict {key: Tensor} on the CPU, keys unchanged.

    ``path`` is a file, or a model folder as ``save_pretrained`` writes it (``model.safetensors``,
    ``pytorch_model.bin``, or shards listed in ``*.index.json``, merged).

    ``.safetensors`` files are read with safetensors; TorchScript archives (OpenAI's original
    ``ViT-B-32.pt``) with ``torch.jit.load`` (TorchScript, not pickle); everything else with
    ``torch.load(weights_only=True)``. A file that needs full unpickling (a whole module saved
    with ``torch.save(module)``) is read only with ``trust_pickle=True``; its
    ``state_dict()`` is returned. Wrappers ``{"state_dict": …}`` / ``{"model": …}`` are removed.

    Raises:
        FileNotFoundError: ``path`` does not exist, or a folder holds no checkpoint (named).
        PickleRefused: the file holds pickled objects and ``trust_pickle`` is False.
        CheckpointError: an unreadable / corrupt file (also with ``trust_pickle``), one holding
            something other than tensors, or a malformed ``*.index.json`` (all naming the file).
    """
    path = Path(path)
    if path.is_dir():
        merged: dict[str, Tensor] = {}
        for f in _checkpoint_files(path):
            part = load_clip_checkpoint(f, trust_pickle=trust_pickle)
            dup = merged.keys() & part.keys()
            if dup:
                raise CheckpointError(f"{f}: keys also in another shard: {sorted(dup)[:4]}")
            merged.update(part)
        return merged
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        return _unwrap(_read_file(path, trust_pickle), path)
    except CheckpointError:
        raise
    except Exception as err:  # corrupt / truncated / garbage (unpickling can raise anything)
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(err).__name__}: {str(err)[:200]})") from err


def _read_file(path: Path, trust_pickle: bool):
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    if _is_torchscript(path):
        return torch.jit.load(str(path), map_location="cpu").state_dict()
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not trust_pickle:
            raise PickleRefused(
                f"{path} holds pickled Python objects (e.g. a whole ImageEncoder module saved with "
                "torch.save(module)); unpickling it runs code from the file. If you trust the "
                "file, pass trust_pickle=True") from err
    substituted: list[str] = []
    obj = torch.load(path, map_location="cpu", weights_only=False,
                     pickle_module=_lenient_pickle_module(substituted))
    if substituted:
        log.info("%s: %d class(es) not importable here replaced by stand-ins: %s",
                 path, len(set(substituted)), ", ".join(sorted(set(substituted))[:5]))
    return obj


# --------------------------------------------------------------------------- formats


def _strip_wrappers(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Remove leading prefixes shared by every key (``module.``, ``model.``, ``_orig_mod.``)."""
    sd = dict(sd)
    changed = True
    while changed and sd:
        changed = False
        for p in _WRAPPER_PREFIXES:
            if all(k.startswith(p) for k in sd):
                sd = {k[len(p):]: v for k, v in sd.items()}
                changed = True
    return sd


def _as_state_dict(source: Source, trust_pickle: bool) -> dict[str, Tensor]:
    if isinstance(source, nn.Module):
        return dict(source.state_dict())
    if isinstance(source, Mapping):
        return _unwrap(source, Path("<state dict>"))
    return load_clip_checkpoint(source, trust_pickle=trust_pickle)


def detect_format(source: Source, *, trust_pickle: bool = False) -> Format:
    """Tell which checkpoint family ``source`` (a path, a state dict or a module) belongs to.

    Returns:
        ``"hf"`` (keys ``vision_model.*``), ``"image_encoder"`` (every key under ``model.``,
        ``model.visual.*`` present and no text transformer, as saved by the task_vectors
        family), or ``"open_clip"`` (keys ``visual.*`` after removing wrapper prefixes).

    Raises:
        CheckpointError: no CLIP vision tower recognised (the first keys are named).
        PickleRefused / FileNotFoundError: see :func:`load_clip_checkpoint`.
    """
    raw = _as_state_dict(source, trust_pickle)
    if any(re.search(r"(^|\.)vision_model\.", k) for k in raw):
        return "hf"
    if all(k.startswith("model.") for k in raw) and any(k.startswith("model.visual.") for k in raw) \
            and not any(k.startswith("model.transformer.") for k in raw):
        return "image_encoder"
    if any(k.startswith("visual.") for k in _strip_wrappers(raw)):
        return "open_clip"
    raise CheckpointError(
        f"no CLIP vision tower recognised (expected keys 'visual.*', 'model.visual.*' or "
        f"'vision_model.*'); first keys: {list(raw)[:5]}")


def vision_state_dict(source: Source, *, trust_pickle: bool = False,
                      naming: Literal["native", "open_clip"] = "native") -> dict[str, Tensor]:
    """The image tower of a CLIP checkpoint, keys normalised (tensors shared, not copied).

    Args:
        source: a checkpoint path, a state dict or a module, in any of :data:`FORMATS`.
        trust_pickle: allow unpickling a whole module (see :func:`load_clip_checkpoint`).
        naming: ``"native"``: open_clip and image-encoder checkpoints give ``visual.*`` keys,
            Hugging Face ones ``vision_model.*`` (+ ``visual_projection.weight`` when present).
            ``"open_clip"``: Hugging Face keys are converted too (:func:`hf_to_open_clip`).

    Returns:
        {key: Tensor}; non-weight entries (``position_ids``, TorchScript metadata) dropped.

    Raises:
        CheckpointError: no vision tower found; ValueError: unknown ``naming``.
    """
    if naming not in ("native", "open_clip"):
        raise ValueError(f"naming must be 'native' or 'open_clip', got {naming!r}")
    raw = _as_state_dict(source, trust_pickle)
    fmt = detect_format(raw)
    sd = {k: v for k, v in _strip_wrappers(raw).items() if not _NOT_WEIGHTS.search(k)}
    if fmt == "hf":
        sd = {k: v for k, v in sd.items()
              if k.startswith("vision_model.") or k == "visual_projection.weight"}
        if naming == "open_clip":
            sd = hf_to_open_clip(sd)
    else:
        sd = {k: v for k, v in sd.items() if k.startswith("visual.")}
    if not sd:
        raise CheckpointError(f"{fmt} checkpoint without vision-tower keys; first keys: {list(raw)[:5]}")
    return sd


# --------------------------------------------------------------------------- HF <-> open_clip

def hf_to_open_clip(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename a Hugging Face CLIP state dict (either tower or both) to open_clip keys.

    ``q_proj``, ``k_proj``, ``v_proj`` (d, d) are stacked into ``attn.in_proj_weight`` (3d, d)
    in the order q, k, v (biases likewise); ``visual_projection.weight`` (out, in) becomes
    ``visual.proj`` (in, out), ``text_projection.weight`` becomes ``text_projection`` (in, out).
    The input is not modified.

    Raises:
        CheckpointError: a key this mapping does not know, or a layer missing one of q/k/v.
    """
    out: dict[str, Tensor] = {}
    qkv: dict[str, dict[str, Tensor]] = {}
    for key, t in sd.items():
        if _NOT_WEIGHTS.search(key):
            continue
        if key in _HF_TOP:
            out[_HF_TOP[key]] = t
            continue
        if key in _HF_TRANSPOSED:
            out[_HF_TRANSPOSED[key]] = t.t().contiguous()  # (out, in) -> stored (in, out)
            continue
        tower = next((p for p in _HF_TOWERS if key.startswith(p)), None)
        m = re.match(r"(\d+)\.(.+)$", key[len(tower):]) if tower else None
        if m is None:
            raise CheckpointError(f"hf_to_open_clip: unknown Hugging Face CLIP key {key!r}")
        layer, rest = m.groups()
        base = f"{_HF_TOWERS[tower]}{layer}."
        qm = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)$", rest)
        if qm:
            qkv.setdefault(f"{base}attn.in_proj_{qm.group(2)}", {})[qm.group(1)] = t
        elif rest in _HF_BLOCK:
            out[base + _HF_BLOCK[rest]] = t
        else:
            raise CheckpointError(f"hf_to_open_clip: unknown Hugging Face CLIP key {key!r}")
    for key, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"hf_to_open_clip: {key} needs q, k and v projections, found {sorted(parts)}")
        out[key] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)  # (3d, d) or (3d,)
    return out


def open_clip_to_hf(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`hf_to_open_clip`: open_clip keys to Hugging Face CLIP keys.

    Raises:
        CheckpointError: a key with no Hugging Face counterpart (named).
    """
    top = {v: k for k, v in _HF_TOP.items()}
    transposed = {v: k for k, v in _HF_TRANSPOSED.items()}
    block = {v: k for k, v in _HF_BLOCK.items()}
    towers = {v: k for k, v in _HF_TOWERS.items()}
    out: dict[str, Tensor] = {}
    for key, t in sd.items():
        if key in top:
            out[top[key]] = t
            continue
        if key in transposed:
            out[transposed[key]] = t.t().contiguous()
            continue
        tower = next((p for p in towers if key.startswith(p)), None)
        m = re.match(r"(\d+)\.(.+)$", key[len(tower):]) if tower else None
        if m is None:
            raise CheckpointError(f"open_clip_to_hf: no Hugging Face name for {key!r}")
        layer, rest = m.groups()
        base = f"{towers[tower]}{layer}."
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = rest.rsplit("_", 1)[1]
            for name, part in zip("qkv", t.chunk(3, dim=0)):  # (3d, …) -> 3 × (d, …)
                out[f"{base}self_attn.{name}_proj.{kind}"] = part.contiguous()
        elif rest in block:
            out[base + block[rest]] = t
        else:
            raise CheckpointError(f"open_clip_to_hf: no Hugging Face name for {key!r}")
    return out


# --------------------------------------------------------------------------- building models


def _refuse_download(arch, **paths) -> None:
    for name, value in paths.items():
        if isinstance(value, (str, Path)) and not Path(value).exists():
            raise DownloadRefused(
                f"{name}={str(value)!r} is not a local file, and this project never downloads "
                "weights: pass the path of a local checkpoint (e.g. weights='/data/ViT-B-32.pt')")
    if isinstance(arch, str) and arch.startswith(("hf-hub:", "local-dir:", "http:", "https:")):
        raise DownloadRefused(
            f"arch={arch!r}: give an open_clip architecture name (e.g. 'ViT-B-32') or a config "
            "dict, and the weights as a local file")


def build_clip(arch: str | Mapping, *, weights: Source | None = None, pretrained: PathLike | None = None,
               quick_gelu: bool = False, trust_pickle: bool = False):
    """Build an open_clip CLIP model offline and load weights from a local file.

    Args:
        arch: an open_clip architecture name (``"ViT-B-32"``, ``"ViT-B/32"``,
            ``"ViT-L-14-quickgelu"``, …) or a config dict ``{"embed_dim", "vision_cfg",
            "text_cfg"}`` (tiny models for tests).
        weights: a checkpoint (path, state dict or module) in any of :data:`FORMATS`; None
            keeps the random initialisation. See :func:`load_clip_weights`.
        pretrained: accepted only as an alias of ``weights`` when it is an existing file.
        quick_gelu: use QuickGELU (needed for OpenAI's weights).
        trust_pickle: allow unpickling a whole saved module.

    Returns:
        (model in eval mode, tokenizer) -- the tokenizer maps a list of strings to (N, L) int64.

    Raises:
        DownloadRefused: a hub tag, URL or ``hf-hub:`` name was asked for.
        ValueError: an architecture whose tokenizer would be fetched from the Hugging Face hub.
    """
    import open_clip

    _refuse_download(arch, weights=weights, pretrained=pretrained)
    if pretrained is not None:
        if weights is not None:
            raise ValueError("give the checkpoint as weights= or pretrained=, not both")
        weights = pretrained
    if isinstance(arch, Mapping):
        cfg = dict(arch)
        quick_gelu = bool(cfg.pop("quick_gelu", False)) or quick_gelu
        model = open_clip.CLIP(**cfg, quick_gelu=quick_gelu)
        text_cfg = dict(cfg.get("text_cfg", {}))
    else:
        name = arch.replace("/", "-")
        cfg = open_clip.get_model_config(name)
        if cfg is None:
            raise ValueError(f"unknown open_clip architecture {arch!r}; known ViTs include "
                             f"{[m for m in open_clip.list_models() if m.startswith('ViT-')][:8]}")
        text_cfg = cfg.get("text_cfg", {})
        model = open_clip.create_model(name, pretrained=None, force_quick_gelu=quick_gelu,
                                       pretrained_image=False, pretrained_text=False)
    if "hf_tokenizer_name" in text_cfg:
        raise ValueError(f"{arch!r} uses a Hugging Face tokenizer ({text_cfg['hf_tokenizer_name']}), "
                         "which would be downloaded; use a CLIP architecture with the bundled BPE")
    tokenizer = open_clip.SimpleTokenizer(context_length=text_cfg.get("context_length", 77))
    if weights is not None:
        load_clip_weights(model, weights, trust_pickle=trust_pickle)
    return model.eval(), tokenizer


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_clip_weights` loaded.

    Attributes:
        format: one of :data:`FORMATS`.
        text: whether the text tower was loaded too.
        kept: vision keys the checkpoint lacks and the model kept (``("visual.proj",)`` for a
            Hugging Face ``CLIPVisionModel``, which has no projection).
    """

    format: str
    text: bool
    kept: tuple[str, ...] = ()


def _vision_to_load(visual: nn.Module, vis: Mapping[str, Tensor], fmt: str) -> tuple[dict[str, Tensor], tuple]:
    """Check ``vis`` (``visual.*`` keys) against ``visual``; returns (its state dict, kept keys)."""
    target = {f"visual.{k}": v for k, v in visual.state_dict().items()}
    vis, kept = dict(vis), ()
    if fmt == "hf" and "visual.proj" in target and "visual.proj" not in vis:
        vis["visual.proj"], kept = target["visual.proj"], ("visual.proj",)  # CLIPVisionModel: no projection
        log.info("Hugging Face vision checkpoint without visual_projection: the model's projection is kept")
    _check_keys(target, vis, "vision tower")
    return {k[len("visual."):]: v for k, v in vis.items()}, kept


def load_clip_weights(model: nn.Module, source: Source, *, trust_pickle: bool = False) -> LoadReport:
    """Load a checkpoint of any supported format into an open_clip CLIP ``model`` (in place).

    The vision tower must match exactly (every ``model.visual`` key, no extra one, same shapes),
    except that a Hugging Face ``CLIPVisionModel`` file, which has no projection, keeps the
    model's ``visual.proj``. The text tower is loaded when the checkpoint has all of it (a full
    CLIP checkpoint) and left as it is when the checkpoint has none of its transformer (an
    image-encoder-only file). Everything is checked before anything is loaded.

    Raises:
        CheckpointError: missing / unexpected / mis-shaped keys (named), or a partial text tower.
    """
    raw = _as_state_dict(source, trust_pickle)
    fmt = detect_format(raw)
    sd = {k: v for k, v in _strip_wrappers(raw).items() if not _NOT_WEIGHTS.search(k)}
    if fmt == "hf":
        sd = hf_to_open_clip({k: v for k, v in sd.items()
                              if k.startswith(("vision_model.", "text_model.")) or k in
                              ("visual_projection.weight", "text_projection.weight", "logit_scale")})
    vis, kept = _vision_to_load(model.visual, {k: v for k, v in sd.items() if k.startswith("visual.")}, fmt)
    target = model.state_dict()
    text_keys = [k for k in target if k.startswith(_TEXT_PREFIXES) or k in _TEXT_TOP]
    has_text = any(k.startswith("transformer.") for k in sd)
    text = {k: sd[k] for k in text_keys if k in sd}
    if has_text:
        _check_keys({k: target[k] for k in text_keys}, text, "text tower")
    with torch.no_grad():
        model.visual.load_state_dict(vis, strict=True)
        for k, v in (text.items() if has_text else ()):
            target[k].copy_(v)  # state_dict tensors share storage with the parameters
    return LoadReport(format=fmt, text=has_text, kept=kept)


def _check_keys(expected: Mapping[str, Tensor], got: Mapping[str, Tensor], what: str) -> None:
    missing = sorted(expected.keys() - got.keys())
    extra = sorted(got.keys() - expected.keys())
    if missing or extra:
        raise CheckpointError(f"{what}: {len(missing)} key(s) missing {missing[:4]}, "
                              f"{len(extra)} unexpected {extra[:4]} (wrong architecture?)")
    for k, v in expected.items():
        if tuple(got[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{what}: key {k!r} has shape {tuple(got[k].shape)}, the model "
                                  f"expects {tuple(v.shape)} (wrong architecture?)")


# --------------------------------------------------------------------------- zero-shot head

Template = Union[str, Callable[[str], str]]


@torch.no_grad()
def zeroshot_head(model: nn.Module, tokenizer, classnames: Sequence[str],
                  templates: Sequence[Template], *, batch_size: int = 256) -> Tensor:
    """Zero-shot classifier weights: one unit text embedding per class.

    For class c, the prompts ``template.format(c)`` (or ``template(c)``) for every template are
    encoded by ``model.encode_text``, each embedding is normalised to unit length, the T of them
    are averaged and the mean is normalised again.

    Args:
        model: an open_clip CLIP model (its text tower is used; its train/eval mode is restored).
        tokenizer: strings -> (N, L) token ids.
        classnames: C names; templates: T strings with one ``{}`` or callables.

    Returns:
        (C, d) float32, rows of unit norm (d = the model's embedding dim). Logits are
        exp(logit_scale) · f̂ @ Hᵀ (see :class:`ClipClassifier`).

    Raises:
        ValueError: no class names, no templates, or a template without ``{}``.
    """
    if not classnames:
        raise ValueError("zeroshot_head: classnames is empty")
    if not templates:
        raise ValueError("zeroshot_head: templates is empty")
    for t in templates:
        if isinstance(t, str) and "{}" not in t:
            raise ValueError(f"zeroshot_head: template {t!r} has no '{{}}' for the class name")
    prompts = [t.format(c) if isinstance(t, str) else t(c) for c in classnames for t in templates]
    was_training = model.training
    model.eval()
    try:
        chunks = [model.encode_text(tokenizer(prompts[i:i + batch_size])).float()
                  for i in range(0, len(prompts), batch_size)]
    finally:
        model.train(was_training)
    emb = F.normalize(torch.cat(chunks), dim=-1)  # (C·T, d)
    emb = emb.reshape(len(classnames), len(templates), -1).mean(dim=1)  # (C, d)
    return F.normalize(emb, dim=-1)


def read_head(path: PathLike, *, trust_pickle: bool = False) -> tuple[Tensor, float]:
    """Read a saved classification head (task_vectors' ``head_<dataset>.pt`` or a state dict).

    Those heads are linear layers with weight = exp(logit_scale) · H (C, d) and zero bias,
    applied to unit features. Returns (H with unit rows, the scale), ready for
    :class:`ClipClassifier`.

    Raises:
        CheckpointError: no ``weight`` (C, d), a non-zero bias, or rows of unequal norms.
    """
    sd = _strip_wrappers(load_clip_checkpoint(path, trust_pickle=trust_pickle))
    w = sd.get("weight")
    if w is None or w.ndim != 2:
        raise CheckpointError(f"{path}: expected a head with 'weight' (C, d), keys {list(sd)[:5]}")
    if "bias" in sd and bool(sd["bias"].abs().max() > 0):
        raise CheckpointError(f"{path}: the head has a non-zero bias, which ClipClassifier cannot apply")
    norms = w.float().norm(dim=1)  # (C,)
    if bool((norms.max() - norms.min()) > 1e-3 * norms.mean()):
        raise CheckpointError(f"{path}: head rows have unequal norms ({norms.min():.4g}..{norms.max():.4g}); "
                              "not a scaled zero-shot head")
    return w.float() / norms[:, None], float(norms.mean())


class ClipClassifier(nn.Module):
    """CLIP image encoder + fixed zero-shot head: images -> logits (N, C).

    Args:
        visual: the open_clip image tower (``model.visual``): (N, 3, S, S) -> (N, d).
        head: (C, d) class embeddings (unit rows, e.g. from :func:`zeroshot_head`); kept as a
            non-persistent buffer, so ``state_dict()`` holds only ``visual.*`` keys.
        scale: multiplies the cosine similarities; exp(logit_scale), ≈ 100 for CLIP.
        image_size: S, the encoder's input side; other sizes are resized (bicubic).
        mean, std: per-channel normalisation on [0, 1] pixels (OpenAI CLIP's by default).
    """

    def __init__(self, visual: nn.Module, head: Tensor, *, scale: float, image_size: int,
                 mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD):
        super().__init__()
        if head.ndim != 2:
            raise ValueError(f"head must be (C, d), got shape {tuple(head.shape)}")
        self.visual = visual
        self.register_buffer("head", head.detach().float().clone(), persistent=False)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.scale = float(scale)
        self.image_size = int(image_size)

    @classmethod
    def from_clip(cls, model: nn.Module, head: Tensor) -> ClipClassifier:
        """Wrap ``model.visual`` (shared, not copied) with ``head``; scale = exp(logit_scale)."""
        size = model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        return cls(model.visual, head, scale=float(model.logit_scale.detach().exp()), image_size=size)

    def load_vision(self, source: Source, *, trust_pickle: bool = False) -> LoadReport:
        """Load an image tower (fine-tuned or merged; any of :data:`FORMATS`) into the classifier.

        Raises:
            CheckpointError: the keys or shapes do not match this architecture (named).
        """
        raw = _as_state_dict(source, trust_pickle)
        fmt = detect_format(raw)
        vis, kept = _vision_to_load(self.visual, vision_state_dict(raw, naming="open_clip"), fmt)
        with torch.no_grad():
            self.visual.load_state_dict(vis, strict=True)
        return LoadReport(format=fmt, text=False, kept=kept)

    def prepare(self, images: Tensor) -> Tensor:
        """uint8 (N, 3, H, W) in 0..255 or float in [0, 1] -> normalised float (N, 3, S, S)."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (N, 3, H, W), got shape {tuple(images.shape)}")
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic",
                              align_corners=False, antialias=True).clamp_(0, 1)
        return (x - self.mean) / self.std

    def encode(self, images: Tensor) -> Tensor:
        """Unit image features (N, d)."""
        return F.normalize(self.visual(self.prepare(images)), dim=-1)

    def forward(self, images: Tensor) -> Tensor:
        """Logits (N, C) = scale · unit features @ headᵀ."""
        return self.scale * self.encode(images) @ self.head.t()


def clip_classifier(arch: str | Mapping, *, weights: Source, classnames: Sequence[str] | None = None,
                    templates: Sequence[Template] | None = None, head: Tensor | None = None,
                    vision_weights: Source | None = None, quick_gelu: bool = False,
                    trust_pickle: bool = False) -> ClipClassifier:
    """Build a :class:`ClipClassifier` from local files, in eval mode.

    Args:
        arch: see :func:`build_clip`.
        weights: the pre-trained CLIP checkpoint (both towers, when the head is computed here).
        classnames, templates: for :func:`zeroshot_head`; or give ``head`` (C, d) instead.
        vision_weights: optional image-encoder checkpoint (e.g. a fine-tuned or merged one)
            loaded over the vision tower after the head is computed.

    Raises:
        ValueError: neither ``head`` nor (classnames, templates), or both.
        DownloadRefused / CheckpointError / PickleRefused: see :func:`build_clip`.
    """
    if (head is None) == (classnames is None or templates is None):
        raise ValueError("give either head= or classnames= and templates=")
    model, tokenizer = build_clip(arch, weights=weights, quick_gelu=quick_gelu, trust_pickle=trust_pickle)
    if head is None:
        head = zeroshot_head(model, tokenizer, classnames, templates)
    classifier = ClipClassifier.from_clip(model, head)
    if vision_weights is not None:
        classifier.load_vision(vision_weights, trust_pickle=trust_pickle)
    return classifier.eval()
