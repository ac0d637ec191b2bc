"""Input checks shared by the engine: keys, shapes, dtypes and finiteness of checkpoints.

Every check raises :class:`CheckpointError` (a ``ValueError``) with a message naming the task,
the key(s) and the shapes involved, before any SVD is attempted. Nothing here modifies its
inputs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint (state dict) that cannot be used as given; the message names the problem."""


def _preview(keys, n: int = 5) -> str:
    keys = sorted(keys)
    more = f" … and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(repr(k) for k in keys[:n]) + more


def check_state_dict(sd: Mapping[str, Tensor], *, name: str) -> None:
    """Check that ``sd`` is a non-empty mapping of str -> Tensor.

    Raises:
        CheckpointError: not a mapping, empty, or holding a non-tensor value (named).
    """
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{name}: expected a state dict (mapping str -> Tensor), got {type(sd).__name__}")
    if not sd:
        raise CheckpointError(f"{name}: the state dict is empty")
    for k, v in sd.items():
        if not isinstance(v, Tensor):
            raise CheckpointError(f"{name}: key {k!r} holds a {type(v).__name__}, not a tensor")


def check_compatible(reference: Mapping[str, Tensor], other: Mapping[str, Tensor], *,
                     ref_name: str = "pre-trained", name: str = "fine-tuned") -> None:
    """Check that ``other`` has exactly the keys and shapes of ``reference``.

    Raises:
        CheckpointError: keys missing from or extra in ``other`` (both listed, with the task
            name), or a shape mismatch (key and both shapes named), or a floating entry in one
            and a non-floating entry in the other.
    """
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
        raise CheckpointError(f"{name}: " + "; ".join(parts))
    for k, v in reference.items():
        w = other[k]
        if v.shape != w.shape:
            raise CheckpointError(
                f"{name}: shape mismatch at key {k!r}: {ref_name} {tuple(v.shape)} vs {name} {tuple(w.shape)}")
        if torch.is_floating_point(v) != torch.is_floating_point(w):
            raise CheckpointError(
                f"{name}: dtype kind mismatch at key {k!r}: {ref_name} {v.dtype} vs {name} {w.dtype}")


def check_finite(sd: Mapping[str, Tensor], *, name: str) -> None:
    """Raise :class:`CheckpointError` naming the first key (and counts) holding NaN or Inf."""
    for k, v in sd.items():
        if torch.is_floating_point(v) and not bool(torch.isfinite(v).all()):
            n_nan = int(torch.isnan(v).sum())
            n_inf = int(torch.isinf(v).sum())
            raise CheckpointError(f"{name}: key {k!r} holds {n_nan} NaN and {n_inf} Inf value(s)")


def check_task_set(pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]],
                   names: Sequence[str] | None = None) -> list[str]:
    """Check a pre-trained checkpoint and T fine-tuned ones together; return the task names.

    Raises:
        CheckpointError: no fine-tuned checkpoint, names of the wrong length, or any failure of
            :func:`check_compatible` / :func:`check_finite` (named by task).
    """
    if isinstance(finetuned, Mapping):
        raise CheckpointError("finetuned: expected a sequence of state dicts, got a single state dict")
    if len(finetuned) == 0:
        raise CheckpointError("finetuned: at least one fine-tuned checkpoint is needed")
    names = list(names) if names is not None else [f"task {i}" for i in range(len(finetuned))]
    if len(names) != len(finetuned):
        raise CheckpointError(f"names: {len(names)} names for {len(finetuned)} fine-tuned checkpoints")
    check_state_dict(pretrained, name="pre-trained")
    check_finite(pretrained, name="pre-trained")
    for sd, nm in zip(finetuned, names):
        check_compatible(pretrained, sd, name=nm)
        check_finite(sd, name=nm)
    return names
