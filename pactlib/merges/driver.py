"""One driver mapping per-layer kernels over a set of task vectors, with one matrix-view rule.

Merge kernels take stacked tensors and explicit scalars: ``matrix_fn(deltas (T, m, n)) -> (m, n)``
for matrix layers and ``other_fn(deltas (T, *shape)) -> (*shape)`` for every other floating key.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from ..matrix import MatrixRule
from ..taskvector import TaskVector
from ..threads import map_ordered


def map_layers(task_vectors: Sequence[TaskVector], rule: MatrixRule,
               matrix_fn: Callable[[Tensor], Tensor], other_fn: Callable[[Tensor], Tensor], *,
               workers: int | None = None) -> TaskVector:
    """Apply ``matrix_fn`` to the (T, m, n) stack of every matrix layer and ``other_fn`` to the
    (T, *shape) stack of every other key; return the merged update D.

    Layers run on ``workers`` threads (default: torch's intra-op thread count), each kernel
    single-threaded (:mod:`pactlib.threads`): the result is bit-identical for any thread count.

    A matrix layer whose updates are all zero (e.g. a frozen CLIP text tower) merges to zero
    without an SVD.

    Raises:
        ValueError: no task vectors.
    """
    if not task_vectors:
        raise ValueError("no task vectors to merge")
    first = task_vectors[0]

    def one(key: str) -> Tensor:
        ref = first[key]
        stack = stack_rows([tv[key] for tv in task_vectors])  # (T, *shape)
        if rule.kind(key, ref) != "matrix":
            return other_fn(stack)
        if not bool(stack.any()):
            return torch.zeros_like(ref)
        mats = rule.view(key, stack, stacked=True)  # (T, m, n)
        return rule.unview(key, matrix_fn(mats), ref.shape)

    keys = list(first.keys())
    return TaskVector._wrap(dict(zip(keys, map_ordered(one, keys, workers or torch.get_num_threads()))))


def stack_rows(rows: Sequence[Tensor]) -> Tensor:
    """``torch.stack(rows)``; when the rows already are the consecutive rows of one contiguous
    (T, *shape) tensor (as the streamed merge passes them, :mod:`pactlib.streaming`), that tensor
    itself, without a copy. Kernels never write into their input, so both are the same to them."""
    base = rows[0]._base if rows else None
    if (base is not None and base.is_contiguous() and base.dim() == rows[0].dim() + 1
            and base.shape[0] == len(rows) and base.shape[1:] == rows[0].shape
            and base.dtype == rows[0].dtype):
        step = base.stride(0) * base.element_size()
        if all(r._base is base and r.is_contiguous() and r.data_ptr() == base.data_ptr() + i * step
               for i, r in enumerate(rows)):
            return base
    return torch.stack(list(rows))


def task_sum(stack: Tensor) -> Tensor:
    """Σt of a (T, …) stack added up in task order, ((Δ1 + Δ2) + Δ3) + …: the same float values as
    a running sum over tasks read one at a time (:class:`RunningSum`, the streamed merges' reducer, :mod:`pactlib.streaming`)
    and as :meth:`TaskVector.sum`. ``stack.sum(0)`` may group the terms otherwise. A new tensor."""
    out = stack[0].clone()
    for t in range(1, stack.shape[0]):
        out += stack[t]
    return out


class TaskReducer(Protocol):
    """A merge method's D for one key from the tasks' deltas given one at a time, in task order
    (:attr:`pactlib.merges.MergeMethod.reducer`): ``add(Δt)`` T times, then ``result()``. ``add``
    may keep and modify the tensor it is given (the caller gives it up), unless the reducer says
    ``modifies_input = False``: then ``add`` never writes into its argument, nor keeps a tensor
    that shares its memory, and a caller may pass a tensor it still needs. Without the
    attribute: it may modify it.

    A reducer with ``passes = 2`` (Iso-CTS: the sum first, then each task against it) takes the
    T deltas twice, in task order each time, with ``next_pass()`` between; it does not modify
    them (a caller may keep them for the second pass). Without the attribute: one pass."""

    def add(self, delta: Tensor) -> None: ...

    def result(self) -> Tensor: ...


def passes_of(reducer: TaskReducer) -> int:
    """How many times ``reducer`` takes the T deltas (:class:`TaskReducer`): 1 or 2."""
    return getattr(reducer, "passes", 1)


def modifies_input(reducer: TaskReducer) -> bool:
    """Whether ``reducer``'s ``add`` may modify the tensor it is given (:class:`TaskReducer`)."""
    return getattr(reducer, "modifies_input", True)


class RunningSum:
    """S = Σt Δt in task order (as :func:`task_sum`), then ``finish(S)`` (default S itself): the
    reducer of Task Arithmetic (M1), of Iso-C (M4, ``finish`` its flat spectrum) and of every
    mean over tasks (``finish`` = S / T). It modifies its input: the sum starts as Δ1 itself."""

    modifies_input = True

    def __init__(self, finish: Callable[[Tensor], Tensor] | None = None):
        self.total: Tensor | None = None
        self.finish = finish

    def add(self, delta: Tensor) -> None:
        if self.total is None:
            self.total = delta  # the running sum starts as Δ1 itself (the caller gave it up)
        else:
            self.total += delta

    def result(self) -> Tensor:
        if self.total is None:
            raise ValueError("no task was added")
        return self.total if self.finish is None else self.finish(self.total)


def reduce_stack(reducer: TaskReducer, stack: Tensor) -> Tensor:
    """``reducer`` fed the rows of a (T, …) stack, once per pass; its result. The stack is not
    modified: the rows are copies, or the rows themselves when the reducer does not modify its
    input (:func:`modifies_input`)."""
    copy = modifies_input(reducer)
    for i in range(passes_of(reducer)):
        if i:
            reducer.next_pass()
        for t in range(stack.shape[0]):
            reducer.add(stack[t].clone() if copy else stack[t])
    return reducer.result()


def mean_of(stack: Tensor) -> Tensor:
    """Mean over tasks, Σt Δt / T (:func:`task_sum`): the rule for non-matrix keys of TSV-M,
    Iso-C and Iso-CTS."""
    return task_sum(stack) / stack.shape[0]
