"""PACT (P4–P5, dynamic mutual protection) and S-PACT (P6, static), as a filter applied to task
vectors before **any** registered merge method.

For every matrix layer selected for filtering: compute the pre-trained core V0,K (P1, once per
layer), each task's active subspace Vt,k (P2) and LBW subspace (P3); build each task's shield from
the *other* tasks' LBW subspaces (P4, capped); filter Δ̃t = Δt − (Δt St) Stᵀ (P5). S-PACT uses the
same shield S = V0,K for every task. Non-matrix keys pass through unfiltered. Book: chapters 1,
5, 6, 7 and 11.
"""
from __future__ import annotations

import functools
import math
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, Sequence

import torch
from torch import Tensor

from .checks import CheckpointError, check_type
from .linalg import SvdMethod
from .matrix import DEFAULT_RULE, MatrixRule
from .order import canonical_order, in_user_order, mark_places, reorder_report
from .shield import build_shield, filter_update, iter_shields, shield_cap
from .subspaces import LBW, active_subspace, choose_rank, lbw_subspace, pretrained_core
from .taskvector import TaskVector
from .threads import map_ordered

Mode = Literal["pact", "s-pact"]
MODES = ("pact", "s-pact")


@dataclass(frozen=True)
class PactOptions:
    """PACT's own choices (book/method.md, subspaces and pact). Defaults are justified in book chapter 11.

    Ranks: ``core_frac``/``core_energy`` choose K (exactly one set), ``active_frac``/
    ``active_energy`` choose k. ``lbw_tol`` is τ (P3). ``shield_tol`` is the rank-revealing
    tolerance of the union (P4), ``max_shield_frac`` its cap. ``svd``/``oversample``/``n_iter``/
    ``active_oversample``/``active_n_iter``/``seed`` select exact or randomized SVD (P7).
    ``layers``: regular expressions selecting the matrix layers to filter (None = all).

    Defaults, chosen on validation (book chapter 11; 8-task suite, seed 0, PACT-Iso-C): K = 0.1·r
    and k = 0.05·r (r = min(m, n)), τ = 0.5 (book/method.md, P3), cap 0.5·n, shield tolerance 1e-4. A first
    sweep around k = 0.1·r found k = 0.05·r best on validation and no other single change better
    than that; the records are ``book/data/sensitivity_round1.jsonl``.

    Randomized SVD (``svd="rsvd"``, P7), with separate settings for the pre-trained core (P1:
    p = ``oversample``, q = ``n_iter``) and for the task updates' active subspaces (P2: p =
    ``active_oversample``, q = ``active_n_iter``); book/method.md, P7 sets p = 10, q = 2 for both.
    Both pairs were chosen on ViT-B/32-shaped synthetic layers by ``bench/bench_filter.py`` (its
    record, with the sweep of settings behind the choice: ``book/data/bench_filter.json``). The core
    of a trained weight has a slowly decaying spectrum past K and needs many power iterations;
    they are cheap there because ``linalg.top_singular`` then iterates with the Gram matrix,
    whose one-off product dominates the cost, and (60, 8) is among the cheapest settings of the
    sweep that keep the cores of all the benchmark's layers close to the exact ones. Task updates
    are effectively low-rank, so one power iteration with more oversampling (40, 1) keeps the
    LBW bases well within the benchmark's goal (projector distance / √r at most 0.1 from the
    exact ones) at a fraction of the cost of the core's setting; (10, 2) would be a little cheaper
    and further off (the sweep has both).

    Raises:
        TypeError: a field of the wrong type (named; an int is a valid float, a bool is not).
        ValueError: a value out of range (named; NaN and ±inf are out of every range: the fracs,
            energies and ``max_shield_frac`` in (0, 1], ``lbw_tol`` in [0, 1], ``shield_tol`` finite
            and >= 0, ``oversample``/``n_iter``/``active_oversample``/``active_n_iter`` >= 0, ``seed`` in
            [-2**63, 2**64)), both
            or neither of a frac/energy pair, or a ``layers`` entry that is not a valid regular
            expression (named).
    """

    core_frac: float | None = 0.1
    core_energy: float | None = None
    active_frac: float | None = 0.05
    active_energy: float | None = None
    lbw_tol: float = 0.5
    shield_tol: float = 1e-4
    max_shield_frac: float = 0.5
    svd: SvdMethod = "exact"
    oversample: int = 60
    n_iter: int = 8
    active_oversample: int = 40
    active_n_iter: int = 1
    seed: int = 0
    layers: tuple[str, ...] | None = None

    def __post_init__(self):
        if isinstance(self.layers, str):
            object.__setattr__(self, "layers", (self.layers,))
        for f in fields(self):
            check_type("PactOptions", f.name, getattr(self, f.name), self.field_types()[f.name])
        for a, b in (("core_frac", "core_energy"), ("active_frac", "active_energy")):
            va, vb = getattr(self, a), getattr(self, b)
            if (va is None) == (vb is None):
                raise ValueError(f"PactOptions: set exactly one of {a} / {b} (got {va!r}, {vb!r})")
            v = va if va is not None else vb
            if not (0 < v <= 1):
                raise ValueError(f"PactOptions: {a if va is not None else b} must be in (0, 1], got {v}")
        if not (0 <= self.lbw_tol <= 1):
            raise ValueError(f"PactOptions: lbw_tol must be in [0, 1], got {self.lbw_tol}")
        if not (0 <= self.shield_tol < math.inf):  # 0 is allowed: then only the relative 1e-7·σ_max floor applies
            raise ValueError(f"PactOptions.shield_tol must be a finite number >= 0, got {self.shield_tol}")
        if not (0 < self.max_shield_frac <= 1):
            raise ValueError(f"PactOptions: max_shield_frac must be in (0, 1], got {self.max_shield_frac}")
        if self.svd not in ("exact", "rsvd"):
            raise ValueError(f"PactOptions: svd must be 'exact' or 'rsvd', got {self.svd!r}")
        if not (-2**63 <= self.seed < 2**64):  # what torch's generators take
            raise ValueError(f"PactOptions.seed must be in [-2**63, 2**64), got {self.seed}")
        for name in ("oversample", "n_iter", "active_oversample", "active_n_iter"):  # checked even with svd="exact"
            if getattr(self, name) < 0:
                raise ValueError(f"PactOptions.{name} must be an integer >= 0, got {getattr(self, name)}")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            for pattern in self.layers:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"PactOptions: layers pattern {pattern!r} is not a regular expression ({e})") from None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    @functools.cache
    def field_types(cls) -> dict[str, object]:
        """{field: annotation}, resolved (used to check the types of options)."""
        return typing.get_type_hints(cls)

    def replace(self, **kw) -> "PactOptions":
        """A copy with some fields changed (validated). Unknown names raise TypeError listing the known ones."""
        unknown = set(kw) - self.field_names()
        if unknown:
            raise TypeError(f"unknown PACT option(s) {sorted(unknown)}; known: {', '.join(sorted(self.field_names()))}")
        # Setting one of a frac/energy pair clears the other.
        for a, b in (("core_frac", "core_energy"), ("active_frac", "active_energy")):
            if kw.get(a) is not None and b not in kw:
                kw[b] = None
            if kw.get(b) is not None and a not in kw:
                kw[a] = None
        return PactOptions(**{**asdict(self), **kw})

    @property
    def svd_kw(self) -> dict:
        """``top_singular`` arguments for the pre-trained core V0,K (P1)."""
        return dict(method=self.svd, oversample=self.oversample, n_iter=self.n_iter, seed=self.seed)

    @property
    def active_svd_kw(self) -> dict:
        """``top_singular`` arguments for the task updates' active subspaces Vt,k (P2)."""
        return dict(method=self.svd, oversample=self.active_oversample, n_iter=self.active_n_iter, seed=self.seed)

    def selects(self, key: str) -> bool:
        return self.layers is None or any(re.search(p, key) for p in self.layers)


@dataclass
class LayerReport:
    """What PACT did to one matrix layer. Lists are per task, in task order."""

    key: str
    m: int
    n: int
    core_rank: int
    shield_cap: int
    active_rank: list[int] = field(default_factory=list)
    lbw_rank: list[int] = field(default_factory=list)
    shield_rank: list[int] = field(default_factory=list)
    union_rank: list[int] = field(default_factory=list)
    capped: list[bool] = field(default_factory=list)
    removed_energy: list[float] = field(default_factory=list)  # ‖Δt St‖²_F / ‖Δt‖²_F


@dataclass
class PactReport:
    """Per-layer reports of one filtering run, plus the options and mode used."""

    mode: str
    options: PactOptions
    layers: list[LayerReport] = field(default_factory=list)
    #: with ``pact_filter(..., keep=True)``: {key: LayerSubspaces} and {key: [S_t (n, s_t) per task]}
    subspaces: dict = field(default_factory=dict, repr=False)
    shields: dict = field(default_factory=dict, repr=False)

    def cap_binding_rate(self) -> float:
        """Share of (layer, task) shields where the cap bound (0 when nothing was filtered)."""
        flags = [c for lr in self.layers for c in lr.capped]
        return sum(flags) / len(flags) if flags else 0.0

    def to_records(self) -> list[dict]:
        """One JSON-serialisable dict per (layer, task)."""
        out = []
        for lr in self.layers:
            for t in range(len(lr.active_rank)):
                out.append(dict(key=lr.key, m=lr.m, n=lr.n, task=t, core_rank=lr.core_rank,
                                shield_cap=lr.shield_cap, active_rank=lr.active_rank[t],
                                lbw_rank=lr.lbw_rank[t], shield_rank=lr.shield_rank[t],
                                union_rank=lr.union_rank[t], capped=lr.capped[t],
                                removed_energy=lr.removed_energy[t]))
        return out


@dataclass
class LayerSubspaces:
    """Subspaces of one matrix layer: core V0,K (n, K), actives Vt,k and LBW subspaces per task."""

    core: Tensor
    active: list[Tensor]
    lbw: list[LBW]


def layer_subspaces(W0: Tensor, deltas: Sequence[Tensor], options: PactOptions = PactOptions(), *,
                    nonzero: Sequence[bool] | None = None) -> LayerSubspaces:
    """P1–P3 for one layer: W0 (m, n), deltas T x (m, n), all as matrix views.

    The core is computed once per layer and shared by all tasks; each task's active subspace once.
    With ``options.svd == "rsvd"`` the core uses (``oversample``, ``n_iter``) and the task updates
    (``active_oversample``, ``active_n_iter``). ``nonzero``: whether each Δt has a non-zero entry,
    when the caller knows (else checked here).
    """
    core = layer_core(W0, options)
    nonzero = [bool(d.any()) for d in deltas] if nonzero is None else nonzero
    actives = [task_active(d, nz, options) for d, nz in zip(deltas, nonzero)]
    return _with_lbw(core, actives, options)


def task_active(delta: Tensor, nonzero: bool, options: PactOptions) -> Tensor:
    """Vt,k (n, k) of one task's Δt (m, n) (P2), k chosen by ``options`` (``active_frac`` /
    ``active_energy``); (n, 0) for an all-zero Δt."""
    k = choose_rank(delta, frac=options.active_frac, energy=options.active_energy, nonzero=nonzero)
    return active_subspace(delta, k, nonzero=nonzero, **options.active_svd_kw) if k else delta.new_zeros(delta.shape[1], 0)


def layer_core(W0: Tensor, options: PactOptions) -> Tensor:
    """V0,K (n, K) of θ0's matrix W0 (m, n) (P1), K chosen by ``options`` (``core_frac`` /
    ``core_energy``)."""
    K = choose_rank(W0, frac=options.core_frac, energy=options.core_energy)
    return pretrained_core(W0, K, **options.svd_kw)


def _with_lbw(core: Tensor, actives: list[Tensor], options: PactOptions) -> LayerSubspaces:
    """The layer's subspaces: each task's LBW subspace (P3) from its active one and the core."""
    lbws = [lbw_subspace(core, act.to(core.dtype), tol=options.lbw_tol) for act in actives]
    return LayerSubspaces(core, actives, lbws)


def select_layers(refs: Mapping[str, Tensor], *, mode: Mode, options: PactOptions, rule: MatrixRule,
                  stacklevel: int = 2) -> tuple[list[str], list[str]]:
    """(matrix keys, keys PACT filters) among ``refs`` (key -> a tensor of that key's shape and
    dtype; a ``meta`` tensor will do), in their order. Warns when a ``layers`` pattern matches no
    matrix layer (the patterns named)."""
    matrix_keys = [k for k, ref in refs.items() if rule.kind(k, ref) == "matrix"]
    selected = [k for k in matrix_keys if options.selects(k)]
    unmatched = [p for p in options.layers or () if not any(re.search(p, k) for k in matrix_keys)]
    if unmatched:
        warnings.warn(f"{mode}: layers pattern(s) {unmatched} match no matrix layer "
                      f"({len(matrix_keys)} matrix layers, e.g. {matrix_keys[:3]})", stacklevel=stacklevel)
    return matrix_keys, selected


def warn_if_unchanged(report: PactReport, matrix_keys: Sequence[str], selected: Sequence[str],
                      stacklevel: int = 2) -> None:
    """Warn (naming the reason) when the filter changed no task vector: every shield empty."""
    if not any(r for lr in report.layers for r in lr.shield_rank):
        options, mode = report.options, report.mode
        reason = ("no matrix layer under the matrix rule" if not matrix_keys else
                  f"the layers patterns {list(options.layers)} select no matrix layer" if not selected else
                  "every selected layer's task vectors are zero" if not report.layers else
                  "every shield is empty (one task only, or no load-bearing directions)")
        warnings.warn(f"{mode} changed no task vector: {reason}; the merge is the plain method's",
                      stacklevel=stacklevel)


def filter_layer(key: str, W0: Tensor, deltas: Sequence[Tensor], *, mode: Mode = "pact",
                 options: PactOptions = PactOptions(), rule: MatrixRule = DEFAULT_RULE,
                 out: Sequence[Tensor] | None = None, keep: bool = True
                 ) -> tuple[LayerReport, list[Tensor], list[Tensor], LayerSubspaces | None] | None:
    """PACT (P1–P5) or S-PACT (P6) on one matrix layer: what :func:`pact_filter` does per layer
    (:func:`filter_tasks` on a list).

    Args:
        key: the checkpoint key (the matrix view depends on it).
        W0: θ0's entry, stored shape (cast to the deltas' dtype).
        deltas: the T tasks' Δt of this key, stored shape, one dtype (not modified unless ``out``
            aliases them).
        out: optional T tensors of the stored shape receiving the filtered updates (they may be
            the ``deltas`` themselves: task t's filter reads only Δt and the subspaces, computed
            before any is written). The streamed merge filters its (T, …) stack in place this way.
        keep: also return the shields and the subspaces (else ``[]`` and None: each shield is
            freed once used; T shields of up to n/2 columns each are T·n²/2 floats).

    Returns:
        None when every Δt is zero (nothing to protect; nothing written), else (the layer's
        :class:`LayerReport`, the filtered updates in stored shape (``out`` when given), the
        shields S_t (n, s_t), the layer's subspaces).
    """
    filtered_all: list[Tensor] = []

    def emit(t: int, filtered: Tensor) -> None:
        if out is not None:
            out[t].copy_(filtered)
            filtered = out[t]
        filtered_all.append(filtered)

    res = filter_tasks(key, W0, deltas.__getitem__, len(deltas), emit=emit, mode=mode, options=options,
                       rule=rule, keep=keep)
    if res is None:
        return None
    lr, shields, subs = res
    return lr, filtered_all, shields, subs


def filter_tasks(key: str, W0: Tensor, read: Callable[[int], Tensor], T: int, *, emit: Callable[[int, Tensor], None],
                 mode: Mode = "pact", options: PactOptions = PactOptions(), rule: MatrixRule = DEFAULT_RULE,
                 keep: bool = False) -> tuple[LayerReport, list[Tensor], LayerSubspaces | None] | None:
    """PACT (P1–P5) or S-PACT (P6) on one matrix layer whose T task vectors are read one at a
    time, in two passes: the first reads each Δt for its norm and active subspace (P2), then the
    layer's core (P1) and LBW subspaces (P3) follow; the second reads each Δt again, filters it
    with its shield (P4–P5, :func:`pactlib.shield.iter_shields`, made one at a time) and hands it
    to ``emit``. Peak memory: a few (m, n) matrices and the subspaces, whatever T. The streamed
    merges of methods with a per-task reducer (Task Arithmetic, TSV-M, Iso-C:
    :attr:`pactlib.merges.MergeMethod.reducer`) filter this way, each filtered Δ̃t going to the reducer; :func:`filter_layer` is this on a list.

    Args:
        key: the checkpoint key (the matrix view depends on it).
        W0: θ0's entry, stored shape (cast to the deltas' dtype).
        read: ``read(t)`` -> task t's Δt of this key, stored shape, the same dtype for every t;
            called twice per task (t = 0..T−1, then again), it must give the same values both
            times. Not modified.
        T: the number of tasks.
        emit: ``emit(t, Δ̃t)`` for t = 0..T−1 in order, Δ̃t in stored shape (a tensor of its own).
        keep: also return the shields and the subspaces (else ``[]`` and None).

    Returns:
        None when every Δt is zero (nothing to protect; ``emit`` is not called), else (the
        layer's :class:`LayerReport`, the shields S_t (n, s_t), the layer's subspaces).
    """
    norms, nonzero, actives = [], [], []
    dtype = shape = None
    for t in range(T):  # pass 1: norms (also the removed energy's denominator) and actives
        x = read(t)
        dtype, shape = x.dtype, x.shape
        d = rule.view(key, x)  # (m, n)
        nv = float(torch.linalg.vector_norm(d))
        nz = nv > 0 or bool(d.any())  # any(): a norm that underflowed
        norms.append(nv)
        nonzero.append(nz)
        actives.append(task_active(d, nz, options))
        del x, d
    if not any(nonzero):
        return None  # e.g. a frozen text tower: nothing to protect against
    W0 = rule.view(key, W0.to(dtype))  # (m, n)
    m, n = W0.shape
    subs = _with_lbw(layer_core(W0, options), actives, options)
    lr = LayerReport(key, m, n, subs.core.shape[1], shield_cap(n, options.max_shield_frac))
    shields = []
    if mode == "pact":  # all T shields from one decomposition of the union (P4), made one at a time
        task_shields = iter_shields([lbw.basis for lbw in subs.lbw], n, max_frac=options.max_shield_frac,
                                    tol=options.shield_tol)
    else:  # S-PACT: one shield, the core's, for every task (P6)
        static = build_shield([subs.core], n, max_frac=options.max_shield_frac, tol=options.shield_tol)
        task_shields = (static for _ in range(T))
    for t, sh in enumerate(task_shields):  # pass 2: filter each task with its shield
        filtered = filter_update(rule.view(key, read(t)), sh.basis)
        if keep:
            shields.append(sh.basis)
        e0 = norms[t] ** 2
        removed = e0 - float(torch.linalg.vector_norm(filtered)) ** 2
        lr.active_rank.append(subs.active[t].shape[1])
        lr.lbw_rank.append(subs.lbw[t].basis.shape[1])
        lr.shield_rank.append(sh.basis.shape[1])
        lr.union_rank.append(sh.union_rank)
        lr.capped.append(sh.capped)
        lr.removed_energy.append(removed / e0 if e0 > 0 else math.nan)
        emit(t, rule.unview(key, filtered, shape))
        del filtered
    return lr, shields, subs if keep else None


def filter_stack(key: str, pre: Tensor, stack: Tensor, *, mode: Mode, options: PactOptions, rule: MatrixRule,
                 dev: torch.device | None = None, keep: bool = False):
    """PACT / S-PACT on one layer's (T, …) stack of task vectors, filtered in place
    (:func:`filter_layer` with ``out`` = the stack's rows): the one per-layer job of the streamed
    ``pact merge`` (:mod:`pactlib.streaming`), of the clip testbed's filtered-layer cache
    (:func:`pactlib.testbeds.lazy_vectors.filtered_task_vectors`) and of its streamed merges
    (:func:`pactlib.testbeds.base.streamed_update`).

    Args:
        key: the checkpoint key; pre: θ0's entry, stored shape (…); stack: (T, …) Δt in the
            compute dtype, a tensor the caller gives up (it is overwritten); dev: move both there
            first (None: where they are); keep: as :func:`pactlib.pact.filter_layer`.

    Returns:
        ``(stack, result)``: the (T, …) filtered stack on ``dev`` (unchanged when every Δt of the
        layer is zero) and :func:`pactlib.pact.filter_layer`'s result (None in that case).
    """
    if dev is not None:
        pre, stack = pre.to(dev), stack.to(dev)
    rows = [stack[t] for t in range(stack.shape[0])]  # views: filter_layer writes the filtered rows here
    res = filter_layer(key, pre, rows, mode=mode, options=options, rule=rule, out=rows, keep=keep)
    return stack, res


def pact_filter(pretrained: dict[str, Tensor], task_vectors: Sequence[TaskVector], *, mode: Mode = "pact",
                options: PactOptions = PactOptions(), rule: MatrixRule = DEFAULT_RULE, keep: bool = False
                ) -> tuple[list[TaskVector], PactReport]:
    """Filter task vectors with PACT (P4, P5) or S-PACT (P6); return new task vectors and a report.

    Args:
        pretrained: θ0 state dict (its matrix layers give the core V0,K).
        task_vectors: T task vectors over θ0's floating keys (not modified).
        mode: ``"pact"`` (shield of task t = union of the other tasks' LBW subspaces) or
            ``"s-pact"`` (shield = V0,K for every task).
        options: :class:`PactOptions`.
        rule: the matrix-view rule.
        keep: also keep every layer's subspaces (P1–P3) and shields (P4) in the report (memory:
            a few bases per layer; used by the book's theory and depth chapters).

    Returns:
        (filtered task vectors in the input order, :class:`PactReport`, its per-task lists in the
        input order too). The layers are filtered with the tasks in their content order
        (:mod:`pactlib.order`), so each task's filtered vector and report entries are the same bits
        for any order of the same task vectors; the filtered vectors are marked with that order
        (:func:`pactlib.order.mark_places`), which :func:`pactlib.merged_update` merges them in.

    Raises:
        ValueError: unknown mode, or no task vectors.
        CheckpointError: a key or shape mismatch between θ0 and a task vector.

    Warns:
        UserWarning: a ``options.layers`` pattern matches no matrix layer (patterns named), or
            the filter changed no task vector (no matrix layer, none selected, all deltas zero,
            or every shield empty, e.g. one task only): the result is the plain merge.
    """
    if mode not in MODES:
        raise ValueError(f"unknown PACT mode {mode!r}; use one of {MODES}")
    tvs = list(task_vectors)
    if not tvs:
        raise ValueError("pact_filter: no task vectors")
    perm = canonical_order(tvs)  # filtered in the content order: a function of the set of tasks
    tvs = [tvs[i] for i in perm]
    report = PactReport(mode, options)
    out = [dict(tv.items()) for tv in tvs]  # shallow: filtered layers get new tensors below
    matrix_keys, selected = select_layers(tvs[0], mode=mode, options=options, rule=rule, stacklevel=3)
    for key in selected:
        if key not in pretrained or pretrained[key].shape != tvs[0][key].shape:
            raise CheckpointError(f"pact_filter: key {key!r} missing from θ0 or of another shape")

    def one(key: str):
        return filter_layer(key, pretrained[key], [tv[key] for tv in tvs], mode=mode, options=options, rule=rule,
                            keep=keep)

    # one thread per layer kernel, layers in parallel: bit-identical for any thread count
    for key, res in zip(selected, map_ordered(one, selected, torch.get_num_threads())):
        if res is None:
            continue
        lr, filtered_all, shields, subs = res
        for t, filtered in enumerate(filtered_all):
            out[t][key] = filtered
        report.layers.append(lr)
        if keep:
            report.shields[key] = shields
            report.subspaces[key] = subs
    warn_if_unchanged(report, matrix_keys, selected, stacklevel=3)
    result = in_user_order([TaskVector._wrap(d, tv.name) for d, tv in zip(out, tvs)], perm)
    mark_places(result, perm)
    return result, reorder_report(report, perm)
