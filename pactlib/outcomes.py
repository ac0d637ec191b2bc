"""Per-example test outcomes: which examples a model classified correctly, kept beside its accuracy.

An accuracy is a mean of 0/1 outcomes; two models evaluated on the same examples are compared
example by example (a paired comparison, :mod:`pactlib.book.intervals`), which needs the outcomes
themselves. Evaluators return :class:`Scores`, a ``{task: accuracy}`` dict that also carries
``outcomes`` ``{task: (N_t,) bool tensor}``; records store them packed (:func:`pack`, one bit per
example, base64), so a record of 20 tasks × 1,000 examples costs about 3.4 kB.

    s = scores({"mnist": torch.tensor([True, False, True, True])})
    s["mnist"]                    # 0.75
    pack(s.outcomes["mnist"])     # "4:sA=="
    unpack("4:sA==")              # tensor([True, False, True, True])
"""
from __future__ import annotations

import base64
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["Scores", "scores", "pack", "unpack", "packed", "outcomes_of"]


class Scores(dict):
    """``{task: accuracy in [0, 1]}`` with the per-example outcomes behind each value.

    Attributes:
        outcomes: ``{task: (N_t,) bool tensor}``: True where the example was classified
            correctly, in the split's order; ``Scores[t] == outcomes[t].float().mean()``.
    """

    def __init__(self, acc: Mapping[str, float] | None = None, outcomes: Mapping[str, Tensor] | None = None):
        super().__init__(acc or {})
        self.outcomes = dict(outcomes or {})

    def add(self, task: str, acc: float, outcomes: Tensor | str | None) -> float:
        """Set ``task``'s accuracy and outcomes (a bool tensor or :func:`pack`'s text); return ``acc``."""
        self[task] = float(acc)
        if outcomes is not None:
            self.outcomes[task] = unpack(outcomes) if isinstance(outcomes, str) else torch.as_tensor(outcomes, dtype=torch.bool)
        return self[task]


def scores(correct: Mapping[str, Tensor]) -> Scores:
    """:class:`Scores` from ``{task: (N_t,) bool tensor}`` of per-example correctness.

    Raises:
        ValueError: a task has no examples or its tensor is not 1-D.
    """
    acc, out = {}, {}
    for t, c in correct.items():
        c = torch.as_tensor(c).detach()
        if c.dim() != 1:
            raise ValueError(f"task {t!r}: outcomes must be a 1-D tensor of per-example correctness")
        if c.numel() == 0:
            raise ValueError(f"task {t!r}: no examples to evaluate")
        c = c.to("cpu", torch.bool)
        acc[t], out[t] = int(c.sum()) / c.numel(), c
    return Scores(acc, out)


def pack(correct: Tensor) -> str:
    """``"<N>:<base64>"``: the N outcomes as bits, most significant bit first, padded with zeros
    to whole bytes (the layout of ``numpy.packbits``)."""
    bits = torch.as_tensor(correct).to(torch.bool).reshape(-1).tolist()
    data = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            data[i >> 3] |= 0x80 >> (i & 7)
    return f"{len(bits)}:{base64.b64encode(bytes(data)).decode('ascii')}"


def unpack(text: str) -> Tensor:
    """The (N,) bool tensor :func:`pack` wrote.

    Raises:
        ValueError: ``text`` is not ``"<N>:<base64>"`` or holds fewer than N bits.
    """
    n_text, sep, body = str(text).partition(":")
    try:
        n = int(n_text)
        data = base64.b64decode(body, validate=True)
    except ValueError as e:
        raise ValueError(f"packed outcomes {str(text)[:40]!r} are not '<N>:<base64>': {e}") from None
    if not sep or n < 0 or len(data) * 8 < n:
        raise ValueError(f"packed outcomes {str(text)[:40]!r} hold {len(data) * 8} bits, fewer than N = {n}")
    return torch.tensor([bool(data[i >> 3] & (0x80 >> (i & 7))) for i in range(n)], dtype=torch.bool)


def packed(s: Mapping[str, float]) -> dict[str, str] | None:
    """``{task: pack(outcomes)}`` of a :class:`Scores` (None for a plain dict without outcomes)."""
    out = getattr(s, "outcomes", None)
    if not out:
        return None
    return {t: pack(out[t]) for t in s if t in out}


def outcomes_of(record: Mapping, split: str = "test") -> dict[str, Tensor]:
    """``{task: (N_t,) bool tensor}`` stored in a record's ``outcomes[split]`` (empty when the
    record has none)."""
    return {t: unpack(v) for t, v in ((record.get("outcomes") or {}).get(split) or {}).items()}
