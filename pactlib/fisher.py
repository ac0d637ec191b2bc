"""The scalar-weight view: diagonal Fisher (S1) and enrichment of sensitive entries among
barely-updated ones (S2). Book: chapter 3.

- :func:`diagonal_fisher` estimates F_t = E_x E_{y~p(y|x;θt)} [(∂θ log p(y|x;θt))²] from per-example
  gradients (``torch.func``), with y sampled from the model (default) or the label
  (``empirical=True``).
- :func:`lowest_mask` / :func:`highest_mask` select exactly ⌊q·N⌋ entries (ties broken by position).
- :func:`enrichment` is E_t = |U_t ∩ H_t| / (|U_t|·|H_t| / N), globally and per key.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn


def diagonal_fisher(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, n_samples: int,
                    empirical: bool = False, seed: int = 0, chunk: int = 32,
                    names: Iterable[str] | None = None, per_sample: str = "auto") -> dict[str, Tensor]:
    """Diagonal Fisher of ``model`` (logits (B, C)) over the first ``n_samples`` examples (S1).

    Devices: the examples are moved to the model's device (that of its first parameter or buffer;
    the CPU for a model with neither), the sampled labels are drawn on the CPU from a CPU
    generator (so a seed gives the same labels on every device) and moved there, and the Fisher is
    returned on the CPU.

    Args:
        model: a classifier returning logits; evaluated in eval mode (BatchNorm statistics frozen).
        batches: iterable of (inputs (B, …), labels (B,)), on any device.
        n_samples: N, the number of examples used (the estimate is a mean over them).
        empirical: use the given labels (empirical Fisher) instead of sampling y ~ p(y|x; θ).
        seed: seed of the label sampling (a private generator; global RNG untouched).
        chunk: examples per vectorised per-sample-gradient call (memory knob only).
        names: parameter names to include (default: all that require grad).
        per_sample: how per-example gradients are taken: ``"vmap"`` (``torch.func.vmap`` over
            ``grad``: one call per chunk), ``"loop"`` (``grad`` one example at a time: for models
            whose forward has data-dependent control flow, e.g. a transformer that trims padding)
            or ``"auto"`` (vmap, and the loop from the first chunk vmap cannot run). Same result.

    Returns:
        {parameter name: F (same shape as the parameter), float32, on the CPU}.

    Raises:
        ValueError: ``n_samples`` < 1, fewer examples available than ``n_samples``, or an unknown
            ``per_sample``.
    """
    from torch.func import functional_call, grad, vmap

    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if per_sample not in ("auto", "vmap", "loop"):
        raise ValueError(f"per_sample must be 'auto', 'vmap' or 'loop', got {per_sample!r}")
    was_training = model.training
    model.eval()
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    if names is not None:
        wanted = set(names)
        missing = wanted - params.keys()
        if missing:
            raise ValueError(f"diagonal_fisher: unknown parameter name(s) {sorted(missing)[:5]}")
        params = {k: v for k, v in params.items() if k in wanted}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    device = next(iter([*params.values(), *buffers.values()]), torch.empty(0)).device
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same draws whatever the device

    def nll(p, x, y):  # one example
        logits = functional_call(model, ({**p}, buffers), (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, y.unsqueeze(0))  # −log p(y|x)

    one = grad(nll)
    batched = vmap(one, in_dims=(None, 0, 0))
    mode = [per_sample]

    def accumulate(xb, yb):  # total += the chunk's squared per-example gradients
        if mode[0] != "loop":
            try:
                g = batched(params, xb, yb)
            except RuntimeError as exc:  # data-dependent control flow (.item(), int(tensor)) under vmap
                if mode[0] == "vmap" or "vmap" not in str(exc):
                    raise
                mode[0] = "loop"
            else:
                for k in total:
                    total[k] += (g[k].float() ** 2).sum(0)
                return
        for i in range(len(xb)):  # one example at a time: memory of one gradient
            g = one(params, xb[i], yb[i])
            for k in total:
                total[k] += g[k].float() ** 2
    total = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in params.items()}
    seen = 0
    try:
        for x, y in batches:
            for s in range(0, len(x), chunk):
                if seen >= n_samples:
                    break
                xb = x[s:s + min(chunk, n_samples - seen)].to(device)
                yb = y[s:s + len(xb)].to(device)
                if not empirical:
                    with torch.no_grad():
                        probs = torch.softmax(model(xb), -1)
                    yb = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(device)
                accumulate(xb, yb)
                seen += len(xb)
            if seen >= n_samples:
                break
    finally:
        model.train(was_training)
    if seen < n_samples:
        raise ValueError(f"diagonal_fisher: asked for n_samples={n_samples} but the batches held only {seen}")
    return {k: (v / seen).cpu() for k, v in total.items()}


def _exact_mask(values: Tensor, count: int, largest: bool) -> Tensor:
    flat = values.reshape(-1)
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    if count > 0:
        mask[torch.topk(flat, count, largest=largest, sorted=False).indices] = True
    return mask.reshape(values.shape)


def lowest_mask(values: Tensor, q: float) -> Tensor:
    """Mask of exactly ⌊q·N⌋ entries of smallest value (U: small |Δ|, S2): bool, ``values``'
    shape, on ``values``' device.

    Raises:
        ValueError: q outside (0, 1)."""
    _check_q(q)
    return _exact_mask(values, int(q * values.numel()), largest=False)


def highest_mask(values: Tensor, q: float) -> Tensor:
    """Mask of exactly ⌊q·N⌋ entries of largest value (H: high Fisher, S2): bool, ``values``'
    shape, on ``values``' device.

    Raises:
        ValueError: q outside (0, 1)."""
    _check_q(q)
    return _exact_mask(values, int(q * values.numel()), largest=True)


def _check_q(q: float) -> None:
    if not (0 < q < 1):
        raise ValueError(f"quantile q must be in (0, 1), got {q}")


@dataclass
class Enrichment:
    """E = |U ∩ H| / (|U|·|H| / N): global score, per-key scores, and the counts behind the global one."""

    score: float
    per_key: dict[str, float]
    n_params: int
    n_small: int
    n_sensitive: int
    n_both: int


def enrichment_score(small: Tensor, sensitive: Tensor) -> float:
    """E for two boolean masks of equal shape (S2). NaN if either is empty."""
    n, u, h = small.numel(), int(small.sum()), int(sensitive.sum())
    if u == 0 or h == 0:
        return float("nan")
    return int((small & sensitive).sum()) / (u * h / n)


def enrichment(delta: Mapping[str, Tensor], fisher: Mapping[str, Tensor], *, q: float = 0.1) -> Enrichment:
    """Enrichment of high-Fisher entries among barely-updated ones (S2), globally and per key.

    U = entries with |Δ| in the lowest q-quantile, H = entries with F in the top q-quantile.
    Globally the quantiles are taken over all keys of ``fisher`` together; per key, within it.
    E > 1: sensitive entries are over-represented among barely-updated ones (claim C1).

    Raises:
        KeyError: a Fisher key missing from ``delta``; ValueError: shape mismatch or bad q.
    """
    keys = list(fisher)
    for k in keys:
        if k not in delta:
            raise KeyError(f"enrichment: Fisher key {k!r} has no task-vector entry")
        if delta[k].shape != fisher[k].shape:
            raise ValueError(f"enrichment: shape mismatch at {k!r}: Δ {tuple(delta[k].shape)} vs F {tuple(fisher[k].shape)}")
    d = torch.cat([delta[k].reshape(-1).abs().float() for k in keys])
    f = torch.cat([fisher[k].reshape(-1).float() for k in keys])
    U, H = lowest_mask(d, q), highest_mask(f, q)
    per_key = {}
    for k in keys:
        if delta[k].numel() >= 1 / q:
            per_key[k] = enrichment_score(lowest_mask(delta[k].abs(), q), highest_mask(fisher[k], q))
    return Enrichment(enrichment_score(U, H), per_key, d.numel(), int(U.sum()), int(H.sum()), int((U & H).sum()))


def scalar_lbw_masks(delta: Mapping[str, Tensor], fisher: Mapping[str, Tensor], *, q: float = 0.1) -> dict[str, Tensor]:
    """Scalar LBW entries U ∩ H (global quantiles) as a boolean mask per key of ``fisher``."""
    keys = list(fisher)
    d = torch.cat([delta[k].reshape(-1).abs().float() for k in keys])
    f = torch.cat([fisher[k].reshape(-1).float() for k in keys])
    both = lowest_mask(d, q) & highest_mask(f, q)
    out, off = {}, 0
    for k in keys:
        n = fisher[k].numel()
        out[k] = both[off:off + n].reshape(fisher[k].shape)
        off += n
    return out
