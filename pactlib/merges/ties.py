"""TIES-Merging (M2): trim, elect sign, disjoint mean.

Yadav et al., "TIES-Merging: Resolving Interference When Merging Models", NeurIPS 2023.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .registry import alpha_grid, register


def trim_mask(x: Tensor, k: float) -> Tensor:
    """Boolean mask (same shape as x) of exactly ceil(k% · x.numel()) entries of largest |x|
    (ties broken by position, so the count is exact even with tied magnitudes)."""
    if not (0 < k <= 100):
        raise ValueError(f"TIES trim percentage k must be in (0, 100], got {k}")
    flat = x.reshape(-1).abs()
    keep = min(flat.numel(), max(1, int(-(-k * flat.numel() // 100))))
    idx = torch.topk(flat, keep, sorted=False).indices
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=x.device)
    mask[idx] = True
    return mask.reshape(x.shape)


def ties_kernel(stack: Tensor) -> Tensor:
    """Elect + disjoint mean of already trimmed updates (T, …) -> (…).

    The elected sign is sign(Σt trimmed Δt); entries agreeing with it (and non-zero) are averaged;
    where none agree (or the elected sign is 0) the result is 0.
    """
    elected = torch.sign(stack.sum(0))
    agree = (torch.sign(stack) == elected) & (stack != 0)
    count = agree.sum(0)
    total = torch.where(agree, stack, torch.zeros_like(stack)).sum(0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


@register("ties", pretty="TIES", reference="Yadav et al., NeurIPS 2023", alphas=alpha_grid(0.05, 1.0, 0.05))
def ties(task_vectors: list[TaskVector], *, rule: MatrixRule, k: float = 20.0,
         scope: Literal["global", "per_key"] = "global") -> TaskVector:
    """TIES (M2): keep each task's top ``k``% entries by |Δt|, elect signs, disjoint mean.

    Args:
        k: trim percentage kept per task (default 20).
        scope: ``"global"`` ranks each task's entries over the whole flattened task vector, as the
            reference implementation does; ``"per_key"`` ranks within each tensor.

    Raises:
        ValueError: ``k`` outside (0, 100] or an unknown ``scope``.
    """
    if scope not in ("global", "per_key"):
        raise ValueError(f"TIES scope must be 'global' or 'per_key', got {scope!r}")
    keys = list(task_vectors[0].keys())
    trimmed = []
    for tv in task_vectors:
        if scope == "global":
            flat = torch.cat([tv[key].reshape(-1) for key in keys])
            mask = trim_mask(flat, k)
            kept, out, off = flat * mask, {}, 0
            for key in keys:
                n = tv[key].numel()
                out[key] = kept[off:off + n].reshape(tv[key].shape)
                off += n
        else:
            out = {key: tv[key] * trim_mask(tv[key], k) for key in keys}
        trimmed.append(out)
    return TaskVector._wrap({key: ties_kernel(torch.stack([t[key] for t in trimmed])) for key in keys})
