"""Task vectors Δt = θt − θ0 as a strict little value type (book/method.md, matrix-view).

A :class:`TaskVector` holds one floating tensor per floating checkpoint key, in float32 (or
float64 when asked), whatever the checkpoints' dtype: bf16/fp16 arithmetic and SVDs are
inaccurate. Non-floating buffers (BatchNorm's ``num_batches_tracked``) have no task vector: they
are copied from θ0 by :meth:`TaskVector.apply_to` and reported once per process.

Arithmetic (``+``, ``-``, unary ``-``, scalar ``*``, ``sum()``) returns new objects and raises on
any key or shape mismatch, naming the key and both shapes. Book: chapter 1.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from numbers import Real

import torch
from torch import Tensor

from .checks import CheckpointError, MergeOverflowError, all_finite, check_alpha, check_compatible, check_finite

log = logging.getLogger(__name__)
_REPORTED_BUFFERS: set[frozenset[str]] = set()

_COMPUTE_DTYPES = (torch.float32, torch.float64)


def check_compute_dtype(dtype) -> None:
    """Raise ValueError unless ``dtype`` is a task vector's dtype (float32 or float64), naming both."""
    if dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype} "
                         "(half-precision checkpoints are fine: task vectors are computed in float32)")


def report_buffers(keys: list[str]) -> None:
    """Log, once per process and set of keys, that the non-floating buffers ``keys`` have no task
    vector (they are copied from θ0)."""
    fs = frozenset(keys)
    if keys and fs not in _REPORTED_BUFFERS:
        _REPORTED_BUFFERS.add(fs)
        shown = ", ".join(sorted(keys)[:4]) + (" …" if len(keys) > 4 else "")
        log.info("%d non-floating buffer(s) have no task vector; copied from θ0: %s", len(keys), shown)


class TaskVector(Mapping):
    """Δ = θt − θ0 over the floating keys of a checkpoint.

    Args:
        deltas: mapping key -> floating tensor. Copied to ``dtype`` (a new tensor; the caller's
            tensors are never aliased for writing).
        name: optional task name used in error messages.
        dtype: ``torch.float32`` (default) or ``torch.float64``.

    Raises:
        CheckpointError: a non-floating or non-tensor value.
        ValueError: an unsupported ``dtype``.
    """

    __slots__ = ("_d", "name", "_place")  # _place: pactlib.order.mark_places

    def __init__(self, deltas: Mapping[str, Tensor], *, name: str | None = None,
                 dtype: torch.dtype = torch.float32):
        check_compute_dtype(dtype)
        d = {}
        for k, v in deltas.items():
            if not isinstance(v, Tensor) or not torch.is_floating_point(v):
                raise CheckpointError(f"{name or 'task vector'}: key {k!r} is not a floating tensor")
            d[k] = v.detach().to(dtype=dtype, copy=True)
        self._d = d
        self.name = name

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_checkpoints(cls, pretrained: Mapping[str, Tensor], finetuned: Mapping[str, Tensor], *,
                         name: str | None = None, dtype: torch.dtype = torch.float32) -> "TaskVector":
        """Δ = finetuned − pretrained, key by key, in ``dtype`` (book/method.md, matrix-view).

        Raises:
            CheckpointError: keys missing or extra, a shape mismatch, NaN/Inf (all named).
            ValueError: an unsupported ``dtype`` (not float32 / float64).
        """
        check_compute_dtype(dtype)
        nm = name or "fine-tuned"
        check_compatible(pretrained, finetuned, name=nm)
        check_finite(pretrained, name="pre-trained")
        check_finite(finetuned, name=nm)
        buffers = [k for k, v in pretrained.items() if not torch.is_floating_point(v)]
        report_buffers(buffers)
        d = {k: finetuned[k].to(dtype) - v.to(dtype)
             for k, v in pretrained.items() if torch.is_floating_point(v)}
        return cls._wrap(d, name)

    @classmethod
    def _wrap(cls, d: dict[str, Tensor], name: str | None = None) -> "TaskVector":
        tv = cls.__new__(cls)
        tv._d, tv.name = d, name
        return tv

    # -- mapping protocol -----------------------------------------------------------------
    def __getitem__(self, key: str) -> Tensor:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"TaskVector(name={self.name!r}, keys={len(self)}, norm={self.norm():.4g})"

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self._d.values())).dtype if self._d else torch.float32

    # -- arithmetic -----------------------------------------------------------------------
    def _check_same(self, other: "TaskVector") -> None:
        if not isinstance(other, TaskVector):
            raise TypeError(f"cannot combine TaskVector with {type(other).__name__}")
        missing, extra = self.keys() - other.keys(), other.keys() - self.keys()
        if missing or extra:
            raise CheckpointError(
                f"task vectors {self.name!r} and {other.name!r} have different keys: "
                f"only in the first {sorted(missing)[:5]}, only in the second {sorted(extra)[:5]}")
        for k, v in self._d.items():
            if v.shape != other._d[k].shape:
                raise CheckpointError(f"shape mismatch at key {k!r}: {tuple(v.shape)} vs {tuple(other._d[k].shape)}")

    def __add__(self, other):
        if isinstance(other, (int, float)) and other == 0:  # lets builtin sum() start at 0
            return self
        self._check_same(other)
        return TaskVector._wrap({k: v + other._d[k] for k, v in self._d.items()})

    __radd__ = __add__

    def __neg__(self) -> "TaskVector":
        return TaskVector._wrap({k: -v for k, v in self._d.items()}, self.name)

    def __sub__(self, other: "TaskVector") -> "TaskVector":
        return self + (-other)

    def __mul__(self, scalar) -> "TaskVector":
        if not isinstance(scalar, Real) or isinstance(scalar, bool):
            raise TypeError(f"a task vector can only be scaled by a real number, got {type(scalar).__name__}")
        return TaskVector._wrap({k: v * float(scalar) for k, v in self._d.items()}, self.name)

    __rmul__ = __mul__

    @staticmethod
    def sum(vectors) -> "TaskVector":
        """Σ of a non-empty sequence of task vectors (Task Arithmetic's D, M1)."""
        vectors = list(vectors)
        if not vectors:
            raise ValueError("sum of an empty sequence of task vectors")
        for v in vectors[1:]:
            vectors[0]._check_same(v)
        out = {}
        for k, t in vectors[0]._d.items():  # key by key: the key's running sum stays in cache over the tasks
            acc = t.clone()
            for v in vectors[1:]:  # ((Δ1 + Δ2) + Δ3) + …, in place: the values of out + v, no new tensors
                if acc.dtype == v._d[k].dtype:
                    acc += v._d[k]
                else:  # mixed float32 / float64: promoted, as out + v
                    acc = acc + v._d[k]
            out[k] = acc
        return TaskVector._wrap(out)

    def map(self, fn) -> "TaskVector":
        """A new task vector with ``fn(key, tensor)`` applied to every entry."""
        return TaskVector._wrap({k: fn(k, v) for k, v in self._d.items()}, self.name)

    def norm(self) -> float:
        """Frobenius norm over all entries."""
        return float(torch.sqrt(sum((v.double() ** 2).sum() for v in self._d.values()))) if self._d else 0.0

    def to_dict(self) -> dict[str, Tensor]:
        """A shallow copy as a plain dict (tensors shared; do not write into them)."""
        return dict(self._d)

    # -- application ----------------------------------------------------------------------
    def apply_to(self, pretrained: Mapping[str, Tensor], alpha: float = 1.0) -> dict[str, Tensor]:
        """θ = θ0 + α·Δ, returned as a new state dict in θ0's dtypes (θ0 is not modified).

        Non-floating buffers are copied from θ0 (cloned). Floating keys of θ0 absent from the
        task vector are an error (a task vector covers every floating key). The sum is computed
        in the task vector's dtype and cast to θ0's; a value that would become ±inf there (fp16
        holds |x| <= 65504) is an error, never a silent inf.

        Raises:
            CheckpointError: floating keys of θ0 missing here, extra keys here, or a shape mismatch.
            MergeOverflowError: a merged value overflows θ0's dtype (names key, dtype, max |value|).
            TypeError, ValueError: α not a real number, or NaN / ±Inf.
        """
        return self._apply(pretrained, check_alpha(alpha), consume=False)

    def _apply(self, pretrained: Mapping[str, Tensor], alpha: float, *, consume: bool) -> dict[str, Tensor]:
        """:meth:`apply_to`; with ``consume`` the task vector's own tensors hold α·Δ and then the
        sum (no new tensor where θ0 is in the task vector's dtype): the task vector is spent. The
        same values either way: α·Δ, then θ0 (cast to Δ's dtype) added to it."""
        floats = {k for k, v in pretrained.items() if torch.is_floating_point(v)}
        missing, extra = floats - self.keys(), self.keys() - pretrained.keys()
        if missing or extra:
            raise CheckpointError(f"apply_to: task vector misses {sorted(missing)[:5]} / has extra {sorted(extra)[:5]}")
        out = {}
        for k, v in pretrained.items():
            if k in self._d:
                d = self._d[k]
                if d.shape != v.shape:
                    raise CheckpointError(f"apply_to: shape mismatch at key {k!r}: θ0 {tuple(v.shape)} vs Δ {tuple(d.shape)}")
                merged = d.mul_(alpha) if consume else alpha * d
                merged += v.to(d.dtype)  # = θ0 + α·Δ (addition commutes, bit for bit)
                out[k] = merged.to(v.dtype)
                if not all_finite(out[k]):
                    raise MergeOverflowError(
                        f"apply_to: key {k!r}: merged values reach max |value| {float(merged.abs().max()):.6g}, "
                        f"beyond the range of {v.dtype} (max {torch.finfo(v.dtype).max:.6g}) at alpha={alpha}; "
                        "use a smaller alpha or a float32 pre-trained checkpoint")
            else:
                out[k] = v.clone()
        return out
