"""Low-rank adapters (LoRA) on the matrix layers, and their task vectors (claim C11).

A LoRA fine-tune of a matrix layer W (m, n) -- here a pointwise convolution stored
(m, n, 1, 1) -- trains two factors while W stays at θ0:

    W_eff = W0 + scale · B A,   A (r, n), B (m, r),   scale = alpha / r,

with B = 0 at the start (so W_eff = W0) and A drawn uniformly in ±1/sqrt(n) (the usual
Kaiming-uniform start) from an explicit ``torch.Generator``. Only the adapters train: BatchNorm
affine parameters, depthwise and stem convolutions stay at θ0, so the LoRA task vector is
exactly zero outside the matrix layers and exactly rank <= r inside them:

    Δt[key] = scale · B A reshaped to the stored shape (m, n, 1, 1)   (book/method.md, C11).

Adapters are plain dicts ``{key: (A, B)}`` keyed by the checkpoint key of the adapted weight;
on disk they are ``{key + ".lora_A": A, key + ".lora_B": B}`` (see :func:`adapters_to_tensors`).

Book: chapter "LoRA task vectors" (C11).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Integral

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from pactlib.matrix import DEFAULT_RULE, MatrixRule

Adapters = dict[str, tuple[Tensor, Tensor]]


def check_rank(rank) -> int:
    """Return a LoRA rank r, checked.

    Raises:
        TypeError: ``rank`` is not an integer (a bool is not one).
        ValueError: ``rank`` < 1.
    """
    if isinstance(rank, bool) or not isinstance(rank, Integral):
        raise TypeError(f"LoRA rank must be an integer >= 1, got {type(rank).__name__} {rank!r}")
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    return int(rank)


def lora_scale(rank: int, alpha: float) -> float:
    """scale = alpha / rank (book/method.md, C11).

    Raises:
        TypeError, ValueError: as :func:`check_rank`.
    """
    return float(alpha) / check_rank(rank)


def init_adapters(
    state_dict: Mapping[str, Tensor],
    rank: int,
    *,
    generator: torch.Generator,
    keys: Iterable[str] | None = None,
    rule: MatrixRule = DEFAULT_RULE,
) -> Adapters:
    """Fresh adapters (A random, B = 0) for the matrix layers of ``state_dict``.

    Args:
        state_dict: the pre-trained checkpoint (only shapes are read).
        rank: r, clamped per layer to min(m, n).
        generator: source of A's random numbers (the caller's global RNG is not touched).
        keys: which keys to adapt; default every matrix layer under ``rule``.

    Returns:
        ``{key: (A (r, n), B (m, r))}`` in float32.

    Raises:
        KeyError: a requested key is missing. ValueError: it is not a matrix layer.
        TypeError, ValueError: ``rank`` not an integer >= 1 (:func:`check_rank`).
    """
    rank = check_rank(rank)
    keys = list(keys) if keys is not None else rule.matrix_keys(state_dict)
    out: Adapters = {}
    for key in keys:
        if key not in state_dict:
            raise KeyError(f"cannot adapt {key!r}: not in the state dict")
        m, n = rule.view(key, state_dict[key]).shape  # (out, in)
        r = min(rank, m, n)
        bound = 1.0 / math.sqrt(n)
        A = (torch.rand(r, n, generator=generator, dtype=torch.float32) * 2 - 1) * bound  # (r, n)
        B = torch.zeros(m, r, dtype=torch.float32)  # (m, r)
        out[key] = (A, B)
    return out


def adapter_delta(key: str, A: Tensor, B: Tensor, scale: float, shape, rule: MatrixRule = DEFAULT_RULE) -> Tensor:
    """scale · B A (m, n) returned in the stored ``shape`` of ``key`` (e.g. (m, n, 1, 1)).

    Raises:
        ValueError: factors not shaped A (r, n), B (m, r) with r >= 1 (key and shapes named).
    """
    if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
        raise ValueError(f"{key}: LoRA factors must be A (r, n), B (m, r); got {tuple(A.shape)}, {tuple(B.shape)}")
    if A.shape[0] < 1:
        raise ValueError(f"{key}: LoRA rank must be >= 1, the factors have rank 0: A {tuple(A.shape)}, B {tuple(B.shape)}")
    return rule.unview(key, scale * (B @ A), shape)  # (m, n) -> stored shape


def lora_task_vector(
    pretrained: Mapping[str, Tensor],
    adapters: Mapping[str, tuple[Tensor, Tensor]],
    scale: float,
    *,
    rule: MatrixRule = DEFAULT_RULE,
) -> dict[str, Tensor]:
    """The LoRA task vector Δt for every floating backbone key (C11).

    Args:
        pretrained: θ0 (gives keys, stored shapes).
        adapters: ``{key: (A (r, n), B (m, r))}``.
        scale: alpha / r.

    Returns:
        ``{key: float32 tensor of the stored shape}`` for every floating key of ``pretrained``:
        scale · B A reshaped on adapted keys, zeros elsewhere. Non-floating buffers
        (``num_batches_tracked``) are left out, as they have no task vector (book/method.md, matrix-view).

    Raises:
        KeyError: an adapter names a key absent from ``pretrained``.
        ValueError: factor shapes do not match the layer, or rank 0 factors (names key and shapes).
    """
    extra = set(adapters) - set(pretrained)
    if extra:
        raise KeyError(f"adapters for keys not in the pre-trained state dict: {sorted(extra)[:5]}")
    out: dict[str, Tensor] = {}
    for key, w in pretrained.items():
        if not torch.is_floating_point(w):
            continue
        if key in adapters:
            A, B = adapters[key]
            m, n = rule.view(key, w).shape
            if B.shape[0] != m or A.shape[1] != n:
                raise ValueError(
                    f"{key}: layer is ({m}, {n}) but LoRA factors are A {tuple(A.shape)}, "
                    f"B {tuple(B.shape)}"
                )
            out[key] = adapter_delta(key, A.float(), B.float(), scale, w.shape, rule)
        else:
            out[key] = torch.zeros(w.shape, dtype=torch.float32)
    return out


def merge_adapters(pretrained: Mapping[str, Tensor], adapters: Mapping[str, tuple[Tensor, Tensor]],
                   scale: float, *, rule: MatrixRule = DEFAULT_RULE) -> dict[str, Tensor]:
    """θ0 + Δt as a full state dict (new tensors; ``pretrained`` is not modified)."""
    delta = lora_task_vector(pretrained, adapters, scale, rule=rule)
    return {k: (v + delta[k].to(v.dtype)) if k in delta else v.clone() for k, v in pretrained.items()}


class _LoraWeight(nn.Module):
    """Parametrisation W -> W + scale · (B A) viewed in W's stored shape."""

    def __init__(self, key: str, A: Tensor, B: Tensor, scale: float, rule: MatrixRule):
        super().__init__()
        self.key, self.scale, self.rule = key, scale, rule
        self.A = nn.Parameter(A.clone())  # (r, n)
        self.B = nn.Parameter(B.clone())  # (m, r)

    def forward(self, W: Tensor) -> Tensor:
        return W + self.rule.unview(self.key, self.scale * (self.B @ self.A), W.shape)


def attach(model: nn.Module, adapters: Mapping[str, tuple[Tensor, Tensor]], scale: float,
           *, rule: MatrixRule = DEFAULT_RULE) -> list[nn.Parameter]:
    """Attach trainable adapters to ``model`` in place; returns the adapter parameters [A, B, ...].

    The model's own parameters are not changed (their ``requires_grad`` is left as is). Read the
    trained factors back with :func:`read_adapters`; undo with :func:`detach`.

    Raises:
        KeyError: an adapter key names no ``<module>.weight`` of ``model``.
    """
    modules = dict(model.named_modules())
    params: list[nn.Parameter] = []
    for key, (A, B) in adapters.items():
        mod_name, _, attr = key.rpartition(".")
        if attr != "weight" or mod_name not in modules:
            raise KeyError(f"cannot attach LoRA to {key!r}: no such module weight in the model")
        p = _LoraWeight(key, A, B, scale, rule)
        parametrize.register_parametrization(modules[mod_name], "weight", p)
        params += [p.A, p.B]
    return params


def read_adapters(model: nn.Module) -> Adapters:
    """The current (A, B) of every adapter attached to ``model`` (detached float32 copies)."""
    out: Adapters = {}
    for mod in model.modules():
        if parametrize.is_parametrized(mod, "weight"):
            for p in mod.parametrizations.weight:
                if isinstance(p, _LoraWeight):
                    out[p.key] = (p.A.detach().clone(), p.B.detach().clone())
    return out


def detach(model: nn.Module) -> None:
    """Remove every adapter from ``model``, restoring its original (un-merged) weights."""
    for mod in model.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=False)


def adapters_to_tensors(adapters: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """``{key: (A, B)}`` -> ``{key + ".lora_A": A, key + ".lora_B": B}`` (for safetensors)."""
    out = {}
    for key, (A, B) in adapters.items():
        out[f"{key}.lora_A"], out[f"{key}.lora_B"] = A, B
    return out


def adapters_from_tensors(tensors: Mapping[str, Tensor]) -> Adapters:
    """Inverse of :func:`adapters_to_tensors`.

    Raises:
        ValueError: an A without its B (or the reverse), or an unexpected key (names it).
    """
    out: Adapters = {}
    for name in tensors:
        if not name.endswith((".lora_A", ".lora_B")):
            raise ValueError(f"unexpected entry {name!r} in a LoRA adapter file")
    for name in tensors:
        if name.endswith(".lora_A"):
            key = name[: -len(".lora_A")]
            if f"{key}.lora_B" not in tensors:
                raise ValueError(f"LoRA adapter for {key!r} has A but no B")
            out[key] = (tensors[name], tensors[f"{key}.lora_B"])
        elif name[: -len(".lora_B")] + ".lora_A" not in tensors:
            raise ValueError(f"LoRA adapter for {name[:-7]!r} has B but no A")
    return out
