"""A plain registry of merge methods, filled by a decorator.

A merge method maps T task vectors to one merged update D (a :class:`TaskVector`); the merged
model is θ0 + α·D. Every method has a name, a pretty name, its paper reference, its α grid
(book/method.md, merges and protocol) and its tunable parameters with defaults. PACT wraps any of them
(:mod:`pactlib.pact`). Adding a method: see ``book/adding-a-merge-method.md``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..matrix import MatrixRule
from ..taskvector import TaskVector

MergeFn = Callable[..., TaskVector]

if TYPE_CHECKING:
    from .driver import TaskReducer


def alpha_grid(lo: float, hi: float, step: float) -> tuple[float, ...]:
    """Inclusive grid lo, lo+step, …, hi rounded to 4 decimals.

    The n = round((hi - lo) / step) + 1 points are ``lo + i·(hi - lo)/(n - 1)`` with the last one
    exactly ``hi``: the same floats as ``numpy.linspace(lo, hi, n)``, without numpy.
    """
    n = int(round((hi - lo) / step)) + 1
    if n < 0:
        raise ValueError(f"alpha_grid({lo}, {hi}, {step}): the step goes away from hi")
    if n <= 1:
        return (round(float(lo), 4),)[:n]
    delta = (hi - lo) / (n - 1)
    return tuple(round(float(lo + i * delta), 4) for i in range(n - 1)) + (round(float(hi), 4),)


@dataclass(frozen=True)
class MergeMethod:
    """A registered merge method. ``fn(task_vectors, *, rule, **params) -> TaskVector``.

    ``per_key`` (a bool, or a function of the full parameter dict) says whether the merged update
    of each key depends only on the T task vectors' entries of that key (true of every map_layers
    method); the streamed merge (:mod:`pactlib.streaming`) then calls ``fn`` on one key at a time.
    ``elementwise`` says more: each *entry* of D depends only on the tasks' entries at the same
    position (Task Arithmetic), so large keys may be streamed in chunks of rows.

    ``reducer`` (optional) says the merged update of a key can be built from the tasks' deltas
    given one at a time, in task order, keeping less than all of them (Task Arithmetic and Iso-C:
    a running sum; TSV-M: each task's top singular triplets): ``reducer(T, matrix, **params)``
    returns a :class:`pactlib.merges.driver.TaskReducer` whose ``add(Δt)`` takes each delta (the
    matrix view (m, n) of a matrix layer, with ``matrix`` True; the stored shape otherwise) and
    whose ``result()`` is that key's D, the same values as ``fn``. The streamed merges then read
    one task at a time instead of building the (T, m, n) stack, so their memory does not grow
    with T (:mod:`pactlib.streaming`).

    ``matrix_layers`` says the method merges a matrix layer (under the rule,
    :class:`pactlib.matrix.MatrixRule`) as a matrix, through its SVD (TSV-M, Iso-C, Iso-CTS),
    and other keys entry by entry; a method without it treats every key alike (Task
    Arithmetic, TIES). Finding no matrix layer is then worth a warning
    (:func:`pactlib.matrix.no_matrix_note`).
    """

    name: str
    pretty: str
    reference: str
    fn: MergeFn
    alphas: tuple[float, ...]
    params: dict = field(default_factory=dict)
    per_key: bool | Callable[[Mapping], bool] = True
    elementwise: bool = False
    reducer: Callable[..., "TaskReducer"] | None = None
    matrix_layers: bool = False

    def is_per_key(self, params: Mapping) -> bool:
        """Whether the method with ``params`` (defaults filled in) merges every key on its own."""
        full = {**self.params, **params}
        return bool(self.per_key(full) if callable(self.per_key) else self.per_key)

    def __call__(self, task_vectors: Sequence[TaskVector], *, rule: MatrixRule, **params) -> TaskVector:
        unknown = set(params) - set(self.params)
        if unknown:
            known = ", ".join(sorted(self.params)) or "none"
            raise TypeError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; known: {known}")
        return self.fn(list(task_vectors), rule=rule, **params)


_REGISTRY: dict[str, MergeMethod] = {}


class UnknownMethodError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def register(name: str, *, pretty: str, reference: str, alphas: tuple[float, ...],
             per_key: bool | Callable[[Mapping], bool] = True, elementwise: bool = False,
             reducer: Callable[..., "TaskReducer"] | None = None, matrix_layers: bool = False):
    """Decorator registering ``fn`` under ``name``; its keyword-only parameters with defaults
    (other than ``rule``) become the method's tunable parameters. ``per_key`` / ``elementwise`` /
    ``reducer`` / ``matrix_layers``: see :class:`MergeMethod` (a method that is not per key needs
    its own streamed form)."""

    def deco(fn: MergeFn) -> MergeFn:
        if name in _REGISTRY:
            raise ValueError(f"merge method {name!r} is already registered")
        sig = inspect.signature(fn)
        params = {p.name: p.default for p in sig.parameters.values()
                  if p.kind is p.KEYWORD_ONLY and p.name != "rule"}
        _REGISTRY[name] = MergeMethod(name, pretty, reference, fn, alphas, params, per_key, elementwise, reducer,
                                      matrix_layers)
        return fn

    return deco


def get(name: str) -> MergeMethod:
    """The method registered as ``name``.

    Raises:
        UnknownMethodError: ``name`` is not registered; the message lists the known names.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownMethodError(f"unknown merge method {name!r}; known: {', '.join(names())}") from None


def names() -> list[str]:
    """Registered method names, in registration order."""
    return list(_REGISTRY)
