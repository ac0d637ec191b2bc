"""PEFT LoRA adapters read as task vectors, without PEFT or the model class.

An adapter folder holds ``adapter_model.safetensors`` (or ``.bin``) and ``adapter_config.json``.
For every adapted module ``<m>`` the update is (book/method.md, C11)

    Δ = scale · B A,   A = ``<m>.lora_A.weight`` (r, in),  B = ``<m>.lora_B.weight`` (out, r),
    scale = lora_alpha / r   (``use_rslora``: lora_alpha / √r),

with r and lora_alpha taken per module from ``rank_pattern`` / ``alpha_pattern`` as PEFT matches
them (:func:`pattern_key`). :func:`read_adapter` returns Δ as a
:class:`~pactlib.taskvector.TaskVector` in float32, keyed by the base checkpoint's names, the
scale applied once; ``lora_B.bias`` (``lora_bias``) gives Δbias = scale · b; Embedding and
Conv factors are read too. Whether a Linear weight is stored (in, out) (GPT-2's ``Conv1D``) goes
by θ0's shape, or the matrix rule for a square one. DoRA, other PEFT types and whole-weight
entries (``modules_to_save``, trained biases) are refused by name unless ``extra`` says to skip
them or take value − θ0. tests/test_peft.py checks all of this against adapters PEFT itself
saves and against its ``merge_and_unload``.

What PEFT does not give: reading an adapter without building the model it was trained on,
:class:`AdapterSource` for the streamed merge (each Δ formed when its key is merged), and key
maps onto another naming (:data:`KEY_MAPS`; :func:`hf_clip_to_open_clip` places Hugging Face
CLIP's ``q_proj``/``k_proj``/``v_proj`` in open_clip's fused ``in_proj_weight``).

Book: chapter "LoRA task vectors" (C11).
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import torch
from torch import Tensor

from .checks import CheckpointError
from .taskvector import TaskVector

__all__ = ["AdapterError", "AdapterConfig", "AdapterLayer", "Adapter", "Target", "KEY_MAPS", "WEIGHT_FILES",
           "CONFIG_FILE", "read_config", "read_adapter", "load_adapter", "adapter_files", "hf_clip_to_open_clip",
           "resolve_key_map", "pattern_key"]

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
CONFIG_FILE = "adapter_config.json"
PREFIX = "base_model.model."
_FACTORS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


class AdapterError(CheckpointError):
    """A PEFT adapter that cannot be read as a LoRA task vector; the message names the file, the
    key and the config field involved."""


# ------------------------------------------------------------------------------------ config

def pattern_key(patterns: Iterable[str], module: str) -> str:
    """The key of ``patterns`` PEFT uses for ``module`` (``get_pattern_key``): the first pattern
    ``p`` (in order) with ``re.match(rf"(.*\\.)?({p})$", module)``, else ``module`` itself."""
    for p in patterns:
        if re.match(rf"(.*\.)?({p})$", module):
            return p
    return module


@dataclass(frozen=True)
class AdapterConfig:
    """The fields of ``adapter_config.json`` that decide Δ (the rest is kept in ``raw``)."""

    path: str
    r: int
    lora_alpha: float
    use_rslora: bool = False
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)
    target_modules: object = None  # list of names, a regex str, or None
    fan_in_fan_out: bool = False
    modules_to_save: tuple = ()
    raw: dict = field(default_factory=dict, repr=False)

    def rank_alpha(self, module: str) -> tuple[int, float]:
        """(r, lora_alpha) of ``module`` (its name in the base model), patterns applied as PEFT does."""
        r = self.rank_pattern.get(pattern_key(self.rank_pattern, module), self.r)
        a = self.alpha_pattern.get(pattern_key(self.alpha_pattern, module), self.lora_alpha)
        return r, a

    def scale(self, module: str) -> float:
        """lora_alpha / r of ``module`` (``use_rslora``: lora_alpha / sqrt(r))."""
        r, a = self.rank_alpha(module)
        return a / math.sqrt(r) if self.use_rslora else a / r

    def targets(self, module: str) -> bool:
        """Whether ``target_modules`` names ``module`` (None or ``"all-linear"``: anything)."""
        tm = self.target_modules
        if tm is None or tm == "all-linear":
            return True
        if isinstance(tm, str):
            return re.fullmatch(tm, module) is not None
        return module in tm or any(module.endswith(f".{t}") for t in tm)


def _number(cfg: Mapping, name: str, path, *, integer: bool, where: str = "") -> float:
    v = cfg[name] if not where else cfg
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and int(v) != v) or not math.isfinite(v) \
            or (integer and v < 1):
        what = "an integer >= 1" if integer else "a finite number"
        raise AdapterError(f"{path}: {where or name} must be {what}, got {v!r}")
    return int(v) if integer else float(v)


def read_config(path: str | os.PathLike) -> AdapterConfig:
    """Read and check ``adapter_config.json`` (``path``: the file or its folder).

    Raises:
        FileNotFoundError: no config. AdapterError: not JSON, ``peft_type`` not LoRA, DoRA
            (``use_dora``), or a field with a bad value (named).
    """
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILE
    if not p.is_file():
        raise FileNotFoundError(f"PEFT adapter config not found: {p}")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterError(f"{p}: cannot read the adapter config ({type(e).__name__}: {e})") from e
    if not isinstance(cfg, dict):
        raise AdapterError(f"{p}: the adapter config is not a JSON object")
    peft_type = cfg.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise AdapterError(f"{p}: peft_type is {peft_type!r}; only LoRA adapters (peft_type 'LORA') are task vectors "
                           "of the form scale·B·A")
    if cfg.get("use_dora"):
        raise AdapterError(f"{p}: use_dora is true: a DoRA adapter rescales the weight's columns, its update is "
                           "not scale·B·A; not supported")
    for name in ("r", "lora_alpha"):
        if name not in cfg:
            raise AdapterError(f"{p}: the adapter config has no {name!r}")
    r = _number(cfg, "r", p, integer=True)
    alpha = _number(cfg, "lora_alpha", p, integer=False)
    pats = {}
    for name, integer in (("rank_pattern", True), ("alpha_pattern", False)):
        pat = cfg.get(name) or {}
        if not isinstance(pat, dict):
            raise AdapterError(f"{p}: {name} must be an object {{pattern: value}}, got {type(pat).__name__}")
        for k, v in pat.items():
            try:
                re.compile(k)
            except re.error as e:
                raise AdapterError(f"{p}: {name} key {k!r} is not a regular expression ({e})") from None
            _number(v, "", p, integer=integer, where=f"{name}[{k!r}]")
        pats[name] = {k: (int(v) if integer else float(v)) for k, v in pat.items()}
    tm = cfg.get("target_modules")
    if tm is not None and not isinstance(tm, str):
        if not isinstance(tm, list) or not all(isinstance(t, str) for t in tm):
            raise AdapterError(f"{p}: target_modules must be a list of names or a regular expression, got {tm!r}")
        tm = list(tm)
    for name in ("use_rslora", "fan_in_fan_out"):
        if not isinstance(cfg.get(name, False), bool):
            raise AdapterError(f"{p}: {name} must be true or false, got {cfg[name]!r}")
    mts = cfg.get("modules_to_save") or ()
    return AdapterConfig(path=str(p), r=r, lora_alpha=alpha, use_rslora=cfg.get("use_rslora", False),
                         rank_pattern=pats["rank_pattern"], alpha_pattern=pats["alpha_pattern"], target_modules=tm,
                         fan_in_fan_out=cfg.get("fan_in_fan_out", False), modules_to_save=tuple(mts), raw=cfg)


# ---------------------------------------------------------------------------------- key maps

@dataclass(frozen=True)
class Target:
    """Where a Δ lands in the base checkpoint.

    Args:
        key: the base checkpoint's key.
        part: ``(j, n)``: Δ (m, …) is the j-th of n row blocks of ``key`` (rows j·m … (j+1)·m), as
            Hugging Face's ``q_proj``/``k_proj``/``v_proj`` are in open_clip's fused
            ``in_proj_weight`` (j = 0, 1, 2; n = 3). None: the whole key.
        transpose: the base stores this weight (in, out): Δ is transposed first.
    """

    key: str
    part: tuple[int, int] | None = None
    transpose: bool = False


KeyMap = Union[Callable[[str], "str | Target | None"], Mapping[str, "str | Target"], str, None]

def hf_clip_to_open_clip(key: str, prefix: str = "") -> Target | None:
    """The open_clip key of a Hugging Face CLIP key (``prefix`` put before it, e.g. ``"model."``
    for the task-vectors ``ImageEncoder`` files), or None for a key with no counterpart.

    ``…self_attn.{q,k,v}_proj.{weight,bias}`` -> ``…attn.in_proj_{weight,bias}``, part (0|1|2, 3);
    ``visual_projection.weight`` -> ``visual.proj`` transposed; the rest renamed one to one, by
    the tables of :mod:`pactlib.clip_keys` (shared with :func:`pactlib.models.clip.hf_to_open_clip`).
    """
    from .clip_keys import HF_BLOCK, HF_TOP, HF_TOWERS, HF_TRANSPOSED

    if key in HF_TOP:
        return Target(prefix + HF_TOP[key])
    if key in HF_TRANSPOSED:
        return Target(prefix + HF_TRANSPOSED[key], transpose=True)
    tower = next((t for t in HF_TOWERS if key.startswith(t)), None)
    m = re.match(r"(\d+)\.(.+)$", key[len(tower):]) if tower else None
    if m is None:
        return None
    layer, rest = m.groups()
    base = f"{prefix}{HF_TOWERS[tower]}{layer}."
    q = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
    if q:
        return Target(f"{base}attn.in_proj_{q.group(2)}", part=("qkv".index(q.group(1)), 3))
    return Target(base + HF_BLOCK[rest]) if rest in HF_BLOCK else None


#: Named key maps (``pact merge --lora-key-map NAME``): PEFT key -> base checkpoint key.
KEY_MAPS: dict[str, Callable[[str], "str | Target | None"]] = {
    "identity": lambda k: k,
    "hf_clip_to_open_clip": hf_clip_to_open_clip,
    "hf_clip_to_image_encoder": lambda k: hf_clip_to_open_clip(k, prefix="model."),
}


def resolve_key_map(key_map: KeyMap) -> Callable[[str], Target | None]:
    """``key_map`` (None, a name of :data:`KEY_MAPS`, a mapping or a callable) as a function
    PEFT key -> :class:`Target` (None: no base key).

    Raises:
        KeyError: an unknown name (the known ones listed). TypeError: another type.
    """
    if key_map is None:
        fn = KEY_MAPS["identity"]
    elif isinstance(key_map, str):
        if key_map not in KEY_MAPS:
            raise KeyError(f"unknown LoRA key map {key_map!r}; known: {', '.join(KEY_MAPS)}")
        fn = KEY_MAPS[key_map]
    elif isinstance(key_map, Mapping):
        table = dict(key_map)

        def fn(k):
            return table.get(k, k)
    elif callable(key_map):
        fn = key_map
    else:
        raise TypeError(f"key_map must be None, a name, a mapping or a callable, got {type(key_map).__name__}")

    def target(k: str) -> Target | None:
        t = fn(k)
        if t is None or isinstance(t, Target):
            return t
        if isinstance(t, str):
            return Target(t)
        raise TypeError(f"key_map({k!r}) returned a {type(t).__name__}; expected a key (str), a Target or None")

    return target


# ------------------------------------------------------------------------------ the adapter

@dataclass
class AdapterLayer:
    """One adapted module: its factors and the Δ they give (float32, in the module's own naming)."""

    module: str  #: the module's name in the base model (``vision_model.encoder.layers.0.self_attn.q_proj``)
    kind: str  #: ``"linear"``, ``"conv"`` or ``"embedding"``
    A: Tensor
    B: Tensor
    r: int
    alpha: float
    scale: float
    bias: Tensor | None = None  #: ``lora_B.bias`` (``lora_bias``)
    fan_in_fan_out: bool = False
    keys: tuple[str, str] = ("", "")  #: the file's keys of A and B (for messages)

    def delta_shape(self, transpose: bool | None = None) -> tuple[int, ...]:
        """The shape :meth:`delta` returns, without computing it."""
        if self.kind == "embedding":
            return (self.A.shape[1], self.B.shape[0])
        if self.kind == "conv":
            return (self.B.shape[0], *self.A.shape[1:])
        t = self.fan_in_fan_out if transpose is None else transpose
        return (self.A.shape[1], self.B.shape[0]) if t else (self.B.shape[0], self.A.shape[1])

    def delta(self, transpose: bool | None = None) -> Tensor:
        """scale · B A in the module's weight layout (float32)."""
        A, B = self.A.float(), self.B.float()
        if self.kind == "embedding":
            return (B @ A).T * self.scale  # (num, dim)
        if self.kind == "conv":
            return (B.flatten(1) @ A.flatten(1)).reshape(B.shape[0], *A.shape[1:]) * self.scale
        d = (B @ A) * self.scale  # (out, in)
        return d.T if (self.fan_in_fan_out if transpose is None else transpose) else d


@dataclass
class Adapter:
    """A parsed adapter folder: config, layers and the file's other entries."""

    path: Path
    file: Path
    config: AdapterConfig
    layers: dict[str, AdapterLayer]  #: by module name
    extra: dict[str, Tensor]  #: whole-weight entries (modules_to_save, trained biases, ...), keys without prefix
    adapter_name: str | None = None

    @property
    def name(self) -> str:
        return str(self.path)


def adapter_files(path: str | os.PathLike) -> tuple[Path, Path]:
    """(weights file, config file) of an adapter folder (or of its weights file).

    Raises:
        FileNotFoundError: neither weights file, or no config (both named).
    """
    p = Path(path)
    if p.is_file():
        folder, weights = p.parent, p
    else:
        folder = p
        weights = next((p / f for f in WEIGHT_FILES if (p / f).is_file()), None)
        if weights is None:
            if not p.exists():
                raise FileNotFoundError(f"PEFT adapter not found: {p}")
            raise FileNotFoundError(f"{p}: no {' or '.join(WEIGHT_FILES)} in the adapter folder")
    config = folder / CONFIG_FILE
    if not config.is_file():
        raise FileNotFoundError(f"{folder}: no {CONFIG_FILE} next to {weights.name}")
    return weights, config


def _read_tensors(file: Path) -> dict[str, Tensor]:
    from .io import load_state_dict

    return load_state_dict(file)


_KEY = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
                  r"(?:\.(?P<rest>.+))?$")


def load_adapter(path: str | os.PathLike, *, adapter_name: str | None = None) -> Adapter:
    """Read an adapter folder (or its weights file) into its layers, checked.

    Raises:
        FileNotFoundError: missing files. AdapterError: a bad config (:func:`read_config`), a
            DoRA key, factors without their pair, shapes that do not fit (key, shapes and the
            config's ``r`` / ``rank_pattern`` named), several adapter names without
            ``adapter_name``, NaN / Inf in a factor, a grouped convolution.
    """
    weights, cfg_file = adapter_files(path)
    cfg = read_config(cfg_file)
    tensors = _read_tensors(weights)
    factors: dict[str, dict[str, tuple[str, Tensor]]] = {}
    extra: dict[str, Tensor] = {}
    names: set[str] = set()
    for key, t in tensors.items():
        k = key[len(PREFIX):] if key.startswith(PREFIX) else key
        m = _KEY.match(k)
        if m is None:  # a whole weight: modules_to_save copy, trained bias, saved embedding layer
            k = re.sub(r"\.modules_to_save(\.[^.]+)?\.", ".", k) if ".modules_to_save." in k else k
            extra[k.replace(".base_layer.", ".")] = t
            continue
        module, part, rest = m.group("module"), m.group("part"), m.group("rest")
        if part == "lora_magnitude_vector":
            raise AdapterError(f"{weights}: key {key!r} is a DoRA magnitude vector: a DoRA adapter's update is not "
                               "scale·B·A; not supported (config field use_dora)")
        toks = rest.split(".") if rest else []
        if part.startswith("lora_embedding"):
            param, adapter = "weight", (toks[0] if len(toks) == 1 else None)
            ok = len(toks) <= 1
        else:
            ok = 1 <= len(toks) <= 2 and toks[-1] in ("weight", "bias")
            param, adapter = (toks[-1] if toks else None), (toks[0] if len(toks) == 2 else None)
        if not ok:
            raise AdapterError(f"{weights}: cannot read key {key!r} (expected <module>.{part}[.<adapter>]"
                               f"{'' if part.startswith('lora_embedding') else '.weight'})")
        if adapter is not None:
            names.add(adapter)
        slot = part if param == "weight" else f"{part}.bias"
        factors.setdefault(module, {}).setdefault(adapter or "", {})
        factors[module][adapter or ""][slot] = (key, t)
    if adapter_name is not None and names and adapter_name not in names:
        raise AdapterError(f"{weights}: no adapter named {adapter_name!r}; the file holds {sorted(names)}")
    if adapter_name is None and len(names) > 1:
        raise AdapterError(f"{weights}: the file holds adapters {sorted(names)}; choose one (adapter_name=...)")
    chosen = adapter_name if adapter_name in names else (next(iter(names)) if names else "")
    layers: dict[str, AdapterLayer] = {}
    for module, by_name in factors.items():
        slots = by_name.get(chosen) or by_name.get("")
        if slots is not None:  # else: the module belongs to another adapter of the file
            layers[module] = _layer(module, slots, cfg, weights)
    if not layers:
        raise AdapterError(f"{weights}: no LoRA factors (keys <module>.lora_A.weight / .lora_B.weight) in the file; "
                           f"first keys: {list(tensors)[:5]}")
    for module in layers:
        if not cfg.targets(module):
            warnings.warn(f"{weights}: module {module!r} has LoRA factors but target_modules "
                          f"({cfg.target_modules!r}) does not name it", stacklevel=2)
    return Adapter(Path(path), weights, cfg, layers, extra, chosen or None)


def _layer(module: str, slots: dict, cfg: AdapterConfig, weights: Path) -> AdapterLayer:
    emb = "lora_embedding_A" in slots or "lora_embedding_B" in slots
    a_name, b_name = ("lora_embedding_A", "lora_embedding_B") if emb else ("lora_A", "lora_B")
    for have, need in ((a_name, b_name), (b_name, a_name)):
        if have in slots and need not in slots:
            raise AdapterError(f"{weights}: {slots[have][0]!r} has no {need} partner for module {module!r}")
    (ka, A), (kb, B) = slots[a_name], slots[b_name]
    for k, t in ((ka, A), (kb, B)):
        if not torch.is_floating_point(t):
            raise AdapterError(f"{weights}: key {k!r} is {t.dtype}, not a floating tensor")
        if not bool(torch.isfinite(t).all()):
            raise AdapterError(f"{weights}: key {k!r} holds NaN or Inf")
    r, alpha = cfg.rank_alpha(module)
    rank_field = f"rank_pattern[{pattern_key(cfg.rank_pattern, module)!r}]" \
        if pattern_key(cfg.rank_pattern, module) in cfg.rank_pattern else "r"
    shapes = f"A {tuple(A.shape)}, B {tuple(B.shape)}"
    if emb:
        kind = "embedding"
        good = A.ndim == 2 and B.ndim == 2 and B.shape[1] == A.shape[0]
    elif A.ndim == 2:
        kind = "linear"
        good = B.ndim == 2 and B.shape[1] == A.shape[0]
    elif A.ndim >= 3:
        kind = "conv"
        if B.ndim == A.ndim and B.shape[1] != A.shape[0] and B.shape[0] and A.shape[0] % max(B.shape[1], 1) == 0:
            raise AdapterError(f"{weights}: module {module!r}: grouped convolution LoRA ({shapes}; {kb!r} has "
                               f"{B.shape[1]} input channels for rank {A.shape[0]}) is not supported")
        good = B.ndim == A.ndim and B.shape[1] == A.shape[0] and all(s == 1 for s in B.shape[2:])
    else:
        raise AdapterError(f"{weights}: module {module!r}: key {ka!r} has shape {tuple(A.shape)}; LoRA factors are "
                           "matrices (Linear, Embedding) or convolution kernels")
    if not good:
        raise AdapterError(f"{weights}: module {module!r}: factors do not compose as B·A ({shapes}, keys {ka!r}, {kb!r})")
    if A.shape[0] != r:
        raise AdapterError(f"{weights}: module {module!r}: {ka!r} has rank {A.shape[0]} but the config's {rank_field} "
                           f"is {r} ({cfg.path})")
    scale = alpha / math.sqrt(r) if cfg.use_rslora else alpha / r
    bias = slots.get(f"{b_name}.bias", (None, None))[1]
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != B.shape[0]):
        raise AdapterError(f"{weights}: module {module!r}: lora_B.bias has shape {tuple(bias.shape)}, "
                           f"expected ({B.shape[0]},)")
    return AdapterLayer(module, kind, A, B, r, float(alpha), float(scale), bias, cfg.fan_in_fan_out, (ka, kb))




# ------------------------------------------------------------------------------ task vector

def _shape_of(v) -> tuple[int, ...] | None:
    if isinstance(v, Tensor):
        return tuple(v.shape)
    if isinstance(v, (tuple, list, torch.Size)):
        return tuple(int(s) for s in v)
    return None


def _floating(v) -> bool:
    return torch.is_floating_point(v) if isinstance(v, Tensor) else True


@dataclass
class _Piece:
    """One Δ (or a row block of one) of a base key: how to compute it, its shape, its origin."""

    target: Target
    make: Callable[[], Tensor]  # Δ in the target's layout (transposed when the target says so)
    shape: tuple[int, ...]
    origin: str  # the file's key, for messages


def _stored_transposed(key: str, base: Mapping, layer: AdapterLayer, rule) -> bool:
    """Whether θ0 stores ``key`` (in, out), as GPT-2's ``Conv1D``: PEFT decides this by the layer's
    type (``fan_in_fan_out`` forced False on ``nn.Linear``, True on ``Conv1D``; the saved flag is
    whatever the last layer set). Here: the shape, when the layer is not square; else the matrix
    rule (``rule``, default the preset of θ0's key names, :func:`pactlib.matrix.detect_preset`)."""
    shape = _shape_of(base[key])
    out_in = (layer.B.shape[0], layer.A.shape[1])
    if shape is not None and len(shape) == 2 and shape[0] != shape[1]:
        if shape == out_in[::-1]:
            return True
        if shape == out_in:
            return False
    if rule is None:
        from .matrix import MatrixRule, detect_preset

        rule = MatrixRule.preset(detect_preset(base))
    return rule.is_transposed(key)


def _plan(adapter: Adapter, base, key_map: KeyMap, extra: str, rule=None, *,
          streamed: bool = False) -> dict[str, list[_Piece]]:
    """``{base key: [pieces]}``: every check that needs no arithmetic (keys, shapes, key map),
    done before any Δ is formed. ``streamed``: for the streamed merge (:class:`AdapterSource`,
    ``pact merge --lora-adapters``), whose messages offer only what it takes (not 'delta')."""
    if extra not in ("error", "skip", "delta"):
        raise ValueError(f"extra must be 'error', 'skip' or 'delta', got {extra!r}")
    target_of = resolve_key_map(key_map)
    if base is not None and not isinstance(base, Mapping):
        base = {k: None for k in base}
    where = adapter.file
    plan: dict[str, list[_Piece]] = {}

    def target(peft_key: str, origin: str) -> Target:
        t = target_of(peft_key)
        if t is None:
            raise AdapterError(f"{where}: key {origin!r}: the key map gives no base checkpoint key for {peft_key!r}")
        if base is not None and t.key not in base:
            hint = "" if key_map is not None else \
                " (pass key_map / --lora-key-map when the base checkpoint names its keys another way)"
            raise AdapterError(f"{where}: key {origin!r} adapts {t.key!r}, which is not in the base checkpoint{hint}")
        return t

    def add(t: Target, make, shape, origin) -> None:
        if t.transpose:
            if len(shape) != 2:
                raise AdapterError(f"{where}: key {origin!r}: the key map transposes {t.key!r}, but Δ is {shape}")
            make, shape = (lambda f=make: f().T), shape[::-1]
        plan.setdefault(t.key, []).append(_Piece(t, make, tuple(shape), origin))

    for module, layer in adapter.layers.items():
        t = target(f"{module}.weight", layer.keys[0])
        flip = None
        if layer.kind == "linear" and base is not None and t.part is None and not t.transpose:
            flip = _stored_transposed(t.key, base, layer, rule)
        add(t, (lambda lay=layer, f=flip: lay.delta(f)), layer.delta_shape(flip), layer.keys[0])
        if layer.bias is not None:
            origin = layer.keys[1].rsplit(".", 1)[0] + ".bias"
            add(target(f"{module}.bias", origin), (lambda lay=layer: lay.bias.float() * lay.scale),
                tuple(layer.bias.shape), origin)
    if adapter.extra:
        names = sorted(adapter.extra)
        preview = ", ".join(names[:4]) + (" …" if len(names) > 4 else "")
        fields = "modules_to_save" if adapter.config.modules_to_save else "bias / modules_to_save"
        if extra == "error":
            fix = ("pass extra='skip' (--lora-extra skip) to leave them out" if streamed else
                   "pass extra='skip' to leave them out, or extra='delta' with θ0 to take value − θ0")
            raise AdapterError(f"{where}: {len(names)} entr{'y is' if len(names) == 1 else 'ies are'} whole weights, "
                               f"not LoRA factors ({preview}; config field {fields}); {fix}")
        if extra == "skip":
            warnings.warn(f"{where}: left out {len(names)} whole-weight entr{'y' if len(names) == 1 else 'ies'} "
                          f"({preview}; config field {fields})", stacklevel=3)
        else:
            for k in names:
                t = target(k, k)
                if not isinstance(base[t.key], Tensor):
                    raise AdapterError(f"{where}: entry {k!r} ({fields}): extra='delta' needs θ0's tensor of "
                                       f"{t.key!r} (base_keys as a state dict)")
                v = adapter.extra[k]
                add(Target(t.key, t.part, t.transpose), (lambda v=v, b=base[t.key]: v.float() - b.float()),
                    tuple(v.shape), k)
    for key, pieces in plan.items():
        _check_pieces(key, pieces, None if base is None else _shape_of(base[key]), where)
    return plan


def _check_pieces(key: str, pieces: list[_Piece], shape, where) -> tuple[int, ...]:
    """The shape the pieces of ``key`` make (checked against θ0's ``shape`` when known)."""
    origins = [p.origin for p in pieces]
    if any(p.target.part is None for p in pieces):
        if len(pieces) > 1:
            raise AdapterError(f"{where}: keys {origins} all adapt {key!r}")
        full = pieces[0].shape
        if shape is not None and full != tuple(shape):
            raise AdapterError(f"{where}: key {origins[0]!r}: Δ has shape {full} but the base's {key!r} is "
                               f"{tuple(shape)}")
        return full
    counts = {p.target.part[1] for p in pieces}
    shapes = {p.shape for p in pieces}
    if len(counts) != 1 or len(shapes) != 1:
        raise AdapterError(f"{where}: {key!r}: its row blocks do not fit together "
                           f"{[(p.origin, p.target.part, p.shape) for p in pieces]}")
    idx = [p.target.part[0] for p in pieces]
    n, (m, *rest) = counts.pop(), shapes.pop()
    if len(set(idx)) != len(idx) or not all(0 <= j < n for j in idx):
        raise AdapterError(f"{where}: {key!r}: row blocks {idx} of {n} ({origins})")
    full = (n * m, *rest)
    if shape is not None and tuple(shape) != full:
        raise AdapterError(f"{where}: {key!r} is {tuple(shape)} in the base but its {n} row blocks "
                           f"({origins}) make {full}")
    return full


def _assemble(key: str, pieces: list[_Piece]) -> Tensor:
    if pieces[0].target.part is None:
        return pieces[0].make().contiguous()
    n, m = pieces[0].target.part[1], pieces[0].shape[0]
    out = torch.zeros((n * m, *pieces[0].shape[1:]), dtype=torch.float32)
    for p in pieces:
        j = p.target.part[0]
        out[j * m:(j + 1) * m] = p.make()
    return out


def adapter_deltas(adapter: Adapter, *, base_keys=None, key_map: KeyMap = None, extra: str = "error",
                   rule=None) -> dict[str, Tensor]:
    """``{base key: Δ}`` of the adapted keys only (float32): :func:`read_adapter` without the
    zeros. Arguments and errors as :func:`read_adapter`."""
    return {k: _assemble(k, pieces) for k, pieces in _plan(adapter, base_keys, key_map, extra, rule).items()}


def read_adapter(path: str | os.PathLike, *, base_keys=None, key_map: KeyMap = None, extra: str = "error",
                 adapter_name: str | None = None, name: str | None = None, rule=None) -> TaskVector:
    """The task vector of a PEFT LoRA adapter: Δ = scale·B·A per adapted weight (module docstring).

    Args:
        path: the adapter folder (``adapter_model.safetensors`` or ``.bin`` + ``adapter_config.json``)
            or its weights file.
        base_keys: the base checkpoint θ0: a state dict ``{key: Tensor}`` (or ``{key: shape}``)
            gives a task vector over **every** floating key of θ0 (zeros where nothing is
            adapted: what :func:`pactlib.merge` / :meth:`TaskVector.apply_to` need), each Δ
            checked against the key's shape; an iterable of key names only checks that each Δ
            lands on one; None: the adapted keys only.
        key_map: PEFT key (``<m>.weight``) -> base key: None (identity), a name of
            :data:`KEY_MAPS` (``"hf_clip_to_open_clip"``), a mapping (keys absent are kept), or a
            callable returning a key, a :class:`Target` or None.
        extra: entries that are whole weights, not factors: ``"error"`` (default), ``"skip"``,
            or ``"delta"`` (value − θ0; needs ``base_keys`` as a state dict).
        adapter_name: which adapter, when the file holds several names.
        name: the task vector's name (default the path).
        rule: the :class:`~pactlib.matrix.MatrixRule` whose ``transposed`` patterns say which
            square Linear weights θ0 stores (in, out) (GPT-2's ``Conv1D``); default the preset
            of θ0's key names. Non-square weights go by their shape; without ``base_keys`` the
            config's ``fan_in_fan_out`` decides.

    Raises:
        FileNotFoundError: missing files. AdapterError (a :class:`~pactlib.checks.CheckpointError`):
            every problem with the files, the config or the key map, naming the file, the key
            and the config field. KeyError: an unknown key-map name.
    """
    adapter = load_adapter(path, adapter_name=adapter_name)
    deltas = adapter_deltas(adapter, base_keys=base_keys, key_map=key_map, extra=extra, rule=rule)
    if isinstance(base_keys, Mapping):
        full = {}
        for k, v in base_keys.items():
            if not _floating(v):
                if k in deltas:
                    raise AdapterError(f"{adapter.file}: adapts {k!r}, a non-floating entry of the base checkpoint")
                continue
            if k in deltas:
                full[k] = deltas[k]
            else:
                shape = _shape_of(v)
                if shape is None:
                    raise TypeError(f"base_keys[{k!r}]: expected a tensor or a shape, got {type(v).__name__}")
                full[k] = torch.zeros(shape, dtype=torch.float32)
        deltas = full
    return TaskVector._wrap(deltas, name or str(path))


class AdapterSource:
    """A PEFT adapter as one input of :func:`pactlib.streaming.merge_files` (``pact merge
    --lora-adapters``): the factors are read once (they are small); each key's Δ is formed only
    when that key is merged, so memory stays about one layer's.

    Args: as :func:`read_adapter` (``path``, ``key_map``, ``extra``, ``adapter_name``, ``rule``);
    ``name`` for messages (default the path).
    """

    def __init__(self, path: str | os.PathLike, *, key_map: KeyMap = None, extra: str = "error",
                 adapter_name: str | None = None, name: str | None = None, rule=None):
        resolve_key_map(key_map)  # an unknown name fails before the files are read
        self.adapter = load_adapter(path, adapter_name=adapter_name)
        self.path = Path(path)
        self.name = name or str(path)
        self.key_map, self.extra, self.rule = key_map, extra, rule
        self._plan: dict[str, list[_Piece]] | None = None

    def __repr__(self) -> str:
        return f"AdapterSource({self.name!r}, layers={len(self.adapter.layers)})"

    @property
    def files(self) -> tuple[Path, Path]:
        """The files it reads (:func:`adapter_files`): an output must not overwrite them
        (:func:`pactlib.lazy.check_out_target`), and caches key on them."""
        return adapter_files(self.path)

    def check(self, meta: Mapping[str, Tensor]) -> None:
        """Check every Δ against θ0's keys, shapes and dtypes (``meta``: e.g. meta-device
        tensors), before any Δ is formed.

        Raises:
            AdapterError: a key θ0 lacks, a shape mismatch, a non-floating target (named).
        """
        if self.extra == "delta":
            raise AdapterError(f"{self.adapter.file}: extra='delta' needs θ0's values; the streamed merge has only "
                               "its shapes: use 'skip', or pactlib.peft.read_adapter in memory")
        self._plan = _plan(self.adapter, meta, self.key_map, self.extra, self.rule, streamed=True)
        bad = [k for k in self._plan if not torch.is_floating_point(meta[k])]
        if bad:
            raise AdapterError(f"{self.adapter.file}: adapts non-floating entries {bad[:3]} of the base checkpoint")

    def delta(self, key: str) -> Tensor | None:
        """Δ of ``key`` (float32), or None where the adapter leaves θ0 unchanged."""
        if self._plan is None:
            raise RuntimeError("AdapterSource.check(meta) must be called first")
        pieces = self._plan.get(key)
        return None if pieces is None else _assemble(key, pieces)
