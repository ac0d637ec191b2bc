"""Input checks shared by the engine: keys, shapes, dtypes and finiteness of checkpoints, the
scaling coefficient α and the types of parameters.

Every checkpoint check raises :class:`CheckpointError` (a ``ValueError``) with a message naming
the task, the key(s) and the shapes involved, before any SVD is attempted. Nothing here modifies
its inputs.
"""
from __future__ import annotations

import math
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `pact merge` of Task Arithmetic runs without it
    from torch import Tensor



class CheckpointError(ValueError):
    """A checkpoint (state dict) that cannot be used as given; the message names the problem."""


class MergeOverflowError(CheckpointError, OverflowError):
    """A merged value does not fit the checkpoint's dtype (e.g. beyond fp16's ±65504): it would
    become ±inf. The message names the key, the dtype and the largest |value|."""


class PrecisionWarning(UserWarning):
    """A fine-tuned checkpoint stores floating entries in a less precise dtype than θ0 (e.g.
    float16 against float32): its task vector Δt = θt − θ0 then carries that dtype's rounding
    of the whole weight, not only the fine-tuning update."""


def check_alpha(alpha) -> float:
    """Return α as a float.

    Raises:
        TypeError: α is not a real number (or is a bool).
        ValueError: α is NaN or ±Inf.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, Real):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__} {alpha!r}")
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha}")
    return float(alpha)


def check_device(device, *, name: str = "device") -> str:
    """Where to compute: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or ``"auto"`` (``"cuda"`` when torch
    sees a GPU, else ``"cpu"``); returned as a string torch accepts. A ``torch.device`` is checked
    the same way when it is a CUDA one, refused when it is ``meta`` and taken as given otherwise
    (another backend torch knows).
    ``name`` is the parameter's name in messages (e.g. ``"--device"``).

    Raises:
        ValueError: another value, a CUDA device on a machine where torch sees none, or a
            ``cuda:N`` beyond the GPUs present (the message names ``name`` and the value).
    """
    import torch
    if isinstance(device, torch.device):
        if device.type == "meta":
            raise ValueError(f"{name} {device}: a meta device holds no values to merge")
        if device.type != "cuda":
            return str(device)
        device = str(device)
    if not isinstance(device, str):
        raise ValueError(f"{name} must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    index = device[len("cuda:"):] if device.startswith("cuda:") else None
    if device != "cuda" and not (index and index.isdigit()):
        raise ValueError(f"{name} must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name} {device}: torch sees no GPU here (torch.cuda.is_available() is False); "
                         "use 'cpu' or 'auto'")
    if index is not None and int(index) >= torch.cuda.device_count():
        raise ValueError(f"{name} {device}: torch sees {torch.cuda.device_count()} GPU(s) here (cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1})")
    return device


def _fits(value, expected) -> bool:
    """Whether ``value`` fits the annotation ``expected`` (an int fits float; a bool fits only
    bool; a Literal is checked for its type only, its values by the caller)."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is None or expected is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(type(value) is type(a) for a in args)
    if origin in (tuple, list, Sequence):
        item = args[0] if args else typing.Any
        return isinstance(value, (tuple, list)) and all(_fits(v, item) for v in value)
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, Integral) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, Real) and not isinstance(value, bool)
    return isinstance(value, expected) if isinstance(expected, type) else True


def _describe(expected) -> str:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is None or expected is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list, Sequence):
        plural = {str: "strings", int: "integers", float: "numbers"}
        return f"a list of {plural.get(args[0], 'values') if args else 'values'}"
    names = {bool: "true or false (bool)", int: "an integer (int)", float: "a number (float)", str: "a string (str)"}
    return names.get(expected, getattr(expected, "__name__", str(expected)))


def check_type(owner: str, name: str, value, expected) -> None:
    """Check that parameter ``name`` of ``owner`` fits the annotation ``expected`` (float, int,
    str, bool, None, unions, Literal, ``tuple[X, ...]``); an int is a valid float, a bool is
    not a number.

    Raises:
        TypeError: naming ``owner``, ``name``, the expected type and the value given.
    """
    if not _fits(value, expected):
        raise TypeError(f"{owner}: parameter {name!r} must be {_describe(expected)}, "
                        f"got {type(value).__name__} {value!r}")


def _preview(keys, n: int = 5) -> str:
    keys = sorted(keys)
    more = f" … and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(repr(k) for k in keys[:n]) + more


def check_state_dict(sd: Mapping[str, Tensor], *, name: str) -> None:
    """Check that ``sd`` is a non-empty mapping of str -> Tensor.

    Raises:
        CheckpointError: not a mapping, empty, or holding a non-tensor value (named).
    """
    import torch
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{name}: expected a state dict (mapping str -> Tensor), got {type(sd).__name__}")
    if not sd:
        raise CheckpointError(f"{name}: the state dict is empty")
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{name}: key {k!r} holds a {type(v).__name__}, not a tensor")


def check_compatible(reference: Mapping[str, Tensor], other: Mapping[str, Tensor], *,
                     ref_name: str = "pre-trained", name: str = "fine-tuned") -> None:
    """Check that ``other`` has exactly the keys and shapes of ``reference``.

    Raises:
        CheckpointError: keys missing from or extra in ``other`` (both listed, with the task
            name), or a shape mismatch (key and both shapes named), or a floating entry in one
            and a non-floating entry in the other.
    """
    import torch
    check_state_dict(reference, name=ref_name)
    check_state_dict(other, name=name)
    missing = reference.keys() - other.keys()
    extra = other.keys() - reference.keys()
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} key(s) missing: {_preview(missing)}")
        if extra:
            parts.append(f"{len(extra)} extra key(s) not in {ref_name}: {_preview(extra)}")
        from .matrix import attention_layout

        layouts = attention_layout(reference.keys()), attention_layout(other.keys())
        if None not in layouts and layouts[0] != layouts[1]:
            parts.append(f"{ref_name} and {name} are CLIP checkpoints in two layouts (Hugging Face: separate "
                         "q/k/v; open_clip / task_vectors: fused in_proj_weight); convert both to one naming "
                         "first, e.g. pactlib.models.clip.vision_state_dict(path, naming='open_clip')")
        raise CheckpointError(f"{name}: " + "; ".join(parts))
    for k, v in reference.items():
        w = other[k]
        if v.shape != w.shape:
            raise CheckpointError(
                f"{name}: shape mismatch at key {k!r}: {ref_name} {tuple(v.shape)} vs {name} {tuple(w.shape)}")
        if torch.is_floating_point(v) != torch.is_floating_point(w):
            raise CheckpointError(
                f"{name}: dtype kind mismatch at key {k!r}: {ref_name} {v.dtype} vs {name} {w.dtype}")
    coarser = [k for k, v in reference.items()
               if torch.is_floating_point(v) and other[k].dtype != v.dtype
               and torch.finfo(other[k].dtype).eps > torch.finfo(v.dtype).eps]
    if coarser:
        k = coarser[0]
        warnings.warn(
            f"{name}: {len(coarser)} floating key(s) stored in a less precise dtype than {ref_name} "
            f"(e.g. {k!r}: {other[k].dtype} vs {reference[k].dtype}); Δt = θt − θ0 then includes "
            f"{other[k].dtype}'s rounding of the weights, not only the fine-tuning update. Cast "
            f"{ref_name} to {other[k].dtype} first (θ0 rounded the same way cancels) or give "
            f"{reference[k].dtype} checkpoints", PrecisionWarning, stacklevel=3)


def all_finite(x: Tensor) -> bool:
    """Whether every entry of the floating tensor ``x`` is finite (no NaN, no ±Inf).

    One read pass and no tensor-sized allocation: a NaN or an Inf makes the sum of ``x``
    non-finite, so a finite sum settles it; a non-finite sum (NaN / Inf in ``x``, or finite
    values whose sum overflows) is settled entry by entry. Half-precision tensors are summed in
    float32.
    """
    import torch
    s = x.sum(dtype=torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x.sum()
    return bool(torch.isfinite(s)) or bool(torch.isfinite(x).all())


def check_finite(sd: Mapping[str, Tensor], *, name: str) -> None:
    """Raise :class:`CheckpointError` naming the first key (and counts) holding NaN or Inf."""
    import torch
    for k, v in sd.items():
        if torch.is_floating_point(v) and not all_finite(v):
            n_nan = int(torch.isnan(v).sum())
            n_inf = int(torch.isinf(v).sum())
            raise CheckpointError(f"{name}: key {k!r} holds {n_nan} NaN and {n_inf} Inf value(s)")


def task_names(finetuned: Sequence[Mapping[str, Tensor]], names: Sequence[str] | None = None) -> list[str]:
    """The T task names for messages (default ``task 0``, ``task 1``, …), after checking that
    ``finetuned`` is a non-empty sequence of state dicts and ``names`` has one name per task.

    Raises:
        CheckpointError: a single state dict, no fine-tuned checkpoint, names of the wrong length.
    """
    if isinstance(finetuned, Mapping):
        raise CheckpointError("finetuned: expected a sequence of state dicts, got a single state dict")
    if len(finetuned) == 0:
        raise CheckpointError("finetuned: at least one fine-tuned checkpoint is needed")
    names = list(names) if names is not None else [f"task {i}" for i in range(len(finetuned))]
    if len(names) != len(finetuned):
        raise CheckpointError(f"names: {len(names)} names for {len(finetuned)} fine-tuned checkpoints")
    return names


def check_task_set(pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]],
                   names: Sequence[str] | None = None) -> list[str]:
    """Check a pre-trained checkpoint and T fine-tuned ones together; return the task names.

    Raises:
        CheckpointError: no fine-tuned checkpoint, names of the wrong length, or any failure of
            :func:`check_compatible` / :func:`check_finite` (named by task).
    """
    names = task_names(finetuned, names)
    check_state_dict(pretrained, name="pre-trained")
    check_finite(pretrained, name="pre-trained")
    for sd, nm in zip(finetuned, names):
        check_compatible(pretrained, sd, name=nm)
        check_finite(sd, name=nm)
    return names


def task_set_warnings(names: Sequence[str], nonzero: Sequence[bool], same) -> list[str]:
    """What a merge warns about its task set: each task vector that is all zero (fine-tuned ==
    pre-trained), in task order, then each pair of identical ones. ``same``: the index pairs
    (i, j), i < j, found identical."""
    return ([f"task vector of {names[t]!r} is all zero (fine-tuned == pre-trained)"
             for t, nz in enumerate(nonzero) if not nz]
            + [f"task vectors of {names[i]!r} and {names[j]!r} are identical" for i, j in sorted(same)])
