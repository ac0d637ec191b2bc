"""Causal experiments on LBW dimensions: scalar perturbation (C2), overwrite-and-restore (C3),
subspace ablation (C4) and the first-order theory of the filter (C12). Book: chapters 3, 4, 10.

All functions take state dicts / tensors and explicit scalars and return new state dicts; inputs
are never modified.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from .matrix import DEFAULT_RULE, MatrixRule


def random_masks_like(masks: Mapping[str, Tensor], *, seed: int) -> dict[str, Tensor]:
    """As many entries as ``masks`` holds in total, drawn uniformly at random over all entries of
    the same keys (the control group of C2): ``{key: bool mask of masks[key]'s shape}``, drawn on
    the CPU (the same draws whatever the device) and returned on the first mask's device."""
    keys = list(masks)
    sizes = [masks[k].numel() for k in keys]
    total, count = sum(sizes), int(sum(int(masks[k].sum()) for k in keys))
    gen = torch.Generator().manual_seed(seed)
    flat = torch.zeros(total, dtype=torch.bool)
    flat[torch.randperm(total, generator=gen)[:count]] = True
    flat = flat.to(masks[keys[0]].device) if keys else flat
    out, off = {}, 0
    for k, n in zip(keys, sizes):
        out[k] = flat[off:off + n].reshape(masks[k].shape)
        off += n
    return out


def perturb(state: Mapping[str, Tensor], masks: Mapping[str, Tensor], *, size: float, seed: int) -> dict[str, Tensor]:
    """A copy of ``state`` with ±``size`` (random signs) added at the masked entries (C2). The
    signs are drawn on the CPU (the same draws whatever the device); each perturbed tensor stays on
    its own device (the masks are moved there).

    Raises:
        KeyError: a mask key missing from ``state``; ValueError: shape mismatch.
    """
    gen = torch.Generator().manual_seed(seed)
    out = dict(state)
    for k, m in masks.items():
        if k not in state:
            raise KeyError(f"perturb: mask key {k!r} not in the state dict")
        if m.shape != state[k].shape:
            raise ValueError(f"perturb: mask {tuple(m.shape)} vs tensor {tuple(state[k].shape)} at {k!r}")
        v = state[k]
        signs = torch.randint(0, 2, m.shape, generator=gen).to(v.device, v.dtype) * 2 - 1
        out[k] = v + size * signs * m.to(v.device, v.dtype)
    return out


def restore(merged: Mapping[str, Tensor], source: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A copy of ``merged`` whose masked entries take ``source``'s values (C3: write θt's LBW
    entries back into the merged model). Each tensor stays on ``merged``'s device for its key
    (the mask and ``source``'s values are moved there)."""
    out = dict(merged)
    for k, m in masks.items():
        v = merged[k]
        out[k] = torch.where(m.to(v.device), source[k].to(v.device), v)
    return out


def ablate_subspaces(state: Mapping[str, Tensor], bases: Mapping[str, Tensor], *,
                     rule: MatrixRule = DEFAULT_RULE) -> dict[str, Tensor]:
    """W → W − W V Vᵀ for every matrix layer key with a basis V (n, r) in ``bases`` (C4)."""
    out = dict(state)
    for k, V in bases.items():
        if V.shape[1] == 0:
            continue
        W = rule.view(k, state[k]).float()  # (m, n)
        V = V.to(W.dtype)
        out[k] = rule.unview(k, W - (W @ V) @ V.mT, state[k].shape).to(state[k].dtype)
    return out


def random_basis(n: int, r: int, *, seed: int, within: Tensor | None = None) -> Tensor:
    """A random orthonormal basis (n, r) of R^n, or of the orthogonal complement of ``within``
    (n, k) when given (the two controls of C4)."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, r, generator=gen, dtype=torch.float64)
    if within is not None and within.shape[1]:
        W = within.double()
        X = X - W @ (W.mT @ X)
    Q, _ = torch.linalg.qr(X)
    return Q[:, :r].float()


def first_order_check(loss_fn: Callable[[dict[str, Tensor]], Tensor], theta: Mapping[str, Tensor],
                      removed: Mapping[str, Tensor], shields: Mapping[str, Tensor], *,
                      rule: MatrixRule = DEFAULT_RULE) -> dict[str, float]:
    """C12: predicted vs measured self-degradation of a task when its update loses ``removed``.

    With θ'_t = θt − Δt P_t (the part of the update PACT filters out, ``removed[k]`` = Δt P_t in
    stored shape) and P_t = S_t S_tᵀ the shield projector of each layer:

    - ``predicted`` = −⟨∇L_t(θt), Δt P_t⟩ (first order),
    - ``bound`` = Σ_layers ‖∇L_t P_t‖_F ‖Δt P_t‖_F (Cauchy–Schwarz on the projected parts),
    - ``measured`` = L_t(θ'_t) − L_t(θt).

    Args:
        loss_fn: state dict -> scalar loss (differentiable in the tensors it is given; it may run
            elsewhere, e.g. move them to a GPU, as long as the gradient flows back).
        theta: θt; removed: {key: Δt P_t}; shields: {key: S_t (n, s)}. ``removed`` and the shields
            are moved to each θt tensor's device (and the gradient's).

    Returns:
        ``predicted``, ``bound``, ``measured``, ``loss`` (= L_t(θt)), floats in the loss's unit.
    """
    params = {k: v.detach().clone().requires_grad_(k in removed) for k, v in theta.items()}
    loss = loss_fn(params)
    grads = torch.autograd.grad(loss, [params[k] for k in removed])
    predicted, bound = 0.0, 0.0
    for (k, r), g in zip(removed.items(), grads):
        r = r.to(g.device)
        predicted -= float((g * r).sum())
        G = rule.view(k, g)
        S = shields[k].to(G.device, G.dtype)
        gp = (G @ S)  # ‖G P‖_F = ‖G S‖_F for orthonormal S
        bound += float(gp.norm() * rule.view(k, r).norm())
    with torch.no_grad():
        after = {k: (v - removed[k].to(v.device) if k in removed else v) for k, v in theta.items()}
        measured = float(loss_fn(after)) - float(loss.detach())
    return dict(predicted=predicted, bound=bound, measured=measured, loss=float(loss.detach()))
