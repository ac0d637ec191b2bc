"""Public entry points: ``merged_update`` (D once, for α sweeps) and ``merge`` (a new state dict).

θ = θ0 + α·D with D from a registered method (M1–M5), optionally after the PACT or S-PACT filter
(P4–P6). Book: chapter 5.
"""
from __future__ import annotations

import logging
import typing
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from . import merges
from .merges.driver import passes_of
from .checks import (CheckpointError, check_alpha, check_compatible, check_finite, check_state_dict, check_type,
                     task_names, task_set_warnings)
from .order import content_order, merge_order, reorder_report, segments
from .safetensors_io import tensor_bytes_view
from .matrix import DEFAULT_RULE, MatrixRule, no_matrix_note, split_attention_note
from .pact import MODES, PactOptions, PactReport, pact_filter
from .taskvector import TaskVector, check_compute_dtype, report_buffers

log = logging.getLogger(__name__)


def method_param_types(method: str) -> dict[str, object]:
    """{parameter: expected type} of a registered method: its annotation, else its default's type."""
    m = merges.get(method)
    try:
        hints = typing.get_type_hints(m.fn)
    except Exception:  # an annotation that does not resolve: fall back to the defaults
        hints = {}
    return {k: hints.get(k, object if d is None else type(d)) for k, d in m.params.items()}


def check_method_params(method: str, params: Mapping) -> None:
    """Check the types of ``method``'s parameters (an int is a valid float, a bool is not).

    Raises:
        UnknownMethodError: unknown ``method``.
        TypeError: a parameter of the wrong type (named, with the expected type).
    """
    types_ = method_param_types(method)
    for k, v in params.items():
        if k in types_:
            check_type(method, k, v, types_[k])


def split_kwargs(method: str, kw: Mapping) -> tuple[dict, dict]:
    """Split ``kw`` into (method parameters, PACT options) by name, checking their types against
    the method's annotations / defaults and :class:`PactOptions`' field types.

    Raises:
        TypeError: a name that is neither (listing the valid ones for this method), or a value
            of the wrong type (naming the parameter and its expected type).
    """
    m = merges.get(method)
    mparams, popts = {}, {}
    for k, v in kw.items():
        if k in m.params:
            mparams[k] = v
        elif k in PactOptions.field_names():
            check_type("PACT option", k, v, PactOptions.field_types()[k])
            popts[k] = v
        else:
            valid = sorted(set(m.params) | PactOptions.field_names())
            raise TypeError(f"unknown parameter {k!r} for method {method!r}; valid: {', '.join(valid)}")
    check_method_params(method, mparams)
    return mparams, popts


def resolve_kwargs(method: str, pact: str | None, kw: Mapping, *,
                   pact_hint: str = "pact='pact' or 's-pact'") -> tuple[dict, PactOptions | None]:
    """(method parameters, PACT options or None) from ``merge``'s keyword arguments, all checked
    (names, types, values) without touching a checkpoint. ``pact_hint``: how the caller's user
    sets a PACT mode (the CLI: ``--pact``), for the message of PACT options without one.

    Raises:
        UnknownMethodError: unknown ``method``.
        ValueError: unknown ``pact`` mode, or an invalid PACT option value.
        TypeError: unknown name, wrong type, or PACT options with ``pact=None``.
    """
    mparams, popts = split_kwargs(method, kw)
    if pact is not None and pact not in MODES:
        raise ValueError(f"unknown pact mode {pact!r}; use None or one of {MODES}")
    if popts and pact is None:
        raise TypeError(f"PACT option(s) {sorted(popts)} given but pact=None: set {pact_hint}")
    return mparams, (PactOptions().replace(**popts) if popts else None)


def check_options(options, named: PactOptions | None, pact: str | None) -> PactOptions | None:
    """The PACT options of a call that takes them as ``options=`` (one :class:`PactOptions`) or
    by name (``named``, from :func:`resolve_kwargs`).

    Raises:
        TypeError: ``options`` is not a PactOptions; options given both ways, or with ``pact=None``.
    """
    if options is None:
        return named
    if not isinstance(options, PactOptions):
        raise TypeError(f"options: expected a PactOptions (pactlib.PactOptions(core_frac=...)), got "
                        f"{type(options).__name__}; or give the options by name")
    if named is not None:
        raise TypeError("PACT options given both as options= and by name; give them one way")
    if pact is None:
        raise TypeError("PACT options given (options=) but pact=None")
    return options


def task_vectors_from(pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]], *,
                      names: Sequence[str] | None = None, dtype: torch.dtype = torch.float32) -> list[TaskVector]:
    """Δt = θt − θ0 for every fine-tuned checkpoint, after checking them all (keys, shapes,
    NaN/Inf, named by task). Warns on an all-zero task vector and on identical task vectors.

    The checks cost no pass of their own over the fine-tuned checkpoints: a NaN or Inf in θt (θ0
    is checked first) makes Δt non-finite, so one sum per key of Δt clears θt (θt's keys are
    looked at one by one only when a sum is not finite); the same sums tell most pairs of tasks
    apart before any entry-by-entry comparison.

    Raises:
        ValueError: ``dtype`` is not float32 / float64 (checked first).
        CheckpointError: as :func:`pactlib.checks.check_task_set`, in its order (θ0's values,
            then each task's keys and shapes, then its values).
    """
    check_compute_dtype(dtype)
    names = task_names(finetuned, names)
    check_state_dict(pretrained, name="pre-trained")
    check_finite(pretrained, name="pre-trained")
    floats = [k for k, v in pretrained.items() if torch.is_floating_point(v)]
    report_buffers([k for k, v in pretrained.items() if not torch.is_floating_point(v)])
    pre = {k: pretrained[k].to(dtype) for k in floats}  # no copy when θ0 is in dtype already
    tvs, sums = [], []
    for ft, nm in zip(finetuned, names):
        check_compatible(pretrained, ft, name=nm)
        d = {k: ft[k].to(dtype) - pre[k] for k in floats}  # the values of TaskVector.from_checkpoints
        s = torch.stack([v.sum() for v in d.values()]) if d else torch.zeros(0, dtype=dtype)
        if not bool(torch.isfinite(s).all()):  # NaN / Inf in θt, or a sum that overflows: look closer
            check_finite(ft, name=nm)
        tvs.append(TaskVector._wrap(d, nm))
        sums.append(s)
    nonzero = [bool(s.any()) or any(bool(v.any()) for v in tv.values()) for tv, s in zip(tvs, sums)]
    same = [(i, j) for i in range(len(tvs)) for j in range(i + 1, len(tvs))
            if torch.equal(sums[i], sums[j]) and all(torch.equal(tvs[i][k], tvs[j][k]) for k in tvs[i])]
    for message in task_set_warnings([tv.name for tv in tvs], nonzero, same):
        warnings.warn(message, stacklevel=3)
    return tvs


def merged_update(method: str, pretrained: Mapping[str, Tensor], task_vectors: Sequence[TaskVector], *,
                  pact: str | None = None, options: PactOptions | None = None, rule: MatrixRule = DEFAULT_RULE,
                  **method_params) -> tuple[TaskVector, PactReport | None]:
    """The merged update D of ``method`` over (optionally PACT-filtered) task vectors.

    Compute it once and apply it with several α (``D.apply_to(pretrained, alpha)``).

    Args:
        task_vectors: T :class:`TaskVector` (:func:`task_vectors_from`), not state dicts. They are
            filtered and merged in their content order (:mod:`pactlib.order`; task vectors that
            :func:`pactlib.pact_filter` returned, in the order it filtered them in): any order of
            the same task vectors gives the same bytes of D; the report's per-task lists are in
            the order given.
        options: PACT options; or give them by name (``core_frac=0.1``), as :func:`merge` takes
            them, not both.
        **method_params: the method's parameters (e.g. ``k=20`` for TIES) and PACT options.

    Raises:
        UnknownMethodError: unknown ``method`` (lists the known names).
        ValueError: unknown ``pact`` mode, or an invalid PACT option value.
        TypeError: a task vector that is not a :class:`TaskVector` (named by position); unknown
            method parameter, or one of the wrong type (named); PACT options with ``pact=None``,
            or given both as ``options`` and by name.

    Warns:
        UserWarning: PACT changed nothing (see :func:`pactlib.pact.pact_filter`); θ0 has Hugging
            Face CLIP keys, whose separate q/k/v matrices merge differently from open_clip's fused
            ``in_proj_weight`` (:func:`pactlib.matrix.split_attention_note`); a method that merges
            matrix layers finds none under ``rule`` (:func:`pactlib.matrix.no_matrix_note`).
    """
    m = merges.get(method)
    if isinstance(task_vectors, Mapping):
        raise TypeError(f"task_vectors: expected a sequence of TaskVector, got one {type(task_vectors).__name__}")
    task_vectors = list(task_vectors)  # a generator is read once, here
    for t, tv in enumerate(task_vectors):
        if not isinstance(tv, TaskVector):
            raise TypeError(f"task vector {t}: expected a TaskVector, got {type(tv).__name__} (from checkpoints: "
                            "pactlib.task_vectors_from(pretrained, finetuned), or pactlib.merge)")
    method_params, named = resolve_kwargs(method, pact, method_params)
    options = check_options(options, named, pact)
    check_method_params(method, method_params)
    for note in (split_attention_note(pretrained.keys(), where=f"{method}: "),
                 no_matrix_note(m, rule, pretrained, where=f"{method}: ")):
        if note:
            warnings.warn(note, UserWarning, stacklevel=2)
    report = None
    perm = merge_order(task_vectors)  # the merge is a function of the set of tasks (pactlib.order)
    task_vectors = [task_vectors[i] for i in perm]
    if pact is not None:
        task_vectors, report = pact_filter(dict(pretrained), task_vectors, mode=pact,
                                           options=options or PactOptions(), rule=rule)
        log.info("%s: cap bound on %.1f%% of (layer, task) shields", pact, 100 * report.cap_binding_rate())
    return m(task_vectors, rule=rule, **method_params), reorder_report(report, perm)


def merge(method: str, pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]], *,
          alpha: float, pact: str | None = None, rule: MatrixRule = DEFAULT_RULE,
          names: Sequence[str] | None = None, options: PactOptions | None = None, **kw) -> dict[str, Tensor]:
    """Merge fine-tuned checkpoints: θ = θ0 + α·D (book/method.md, merges), D from ``method`` after the
    optional ``pact`` filter (``None``, ``"pact"`` or ``"s-pact"``).

    Everything is in memory (θ0, the T checkpoints, their task vectors, D). Task Arithmetic
    without PACT holds no task vectors: D is summed key by key from the checkpoints
    (:func:`update_from_checkpoints`) and θ0 + α·D formed in D's tensors; the same values. For
    files, :func:`pactlib.merge_files` gives the same result, bit for bit, one layer at a time.
    The tasks are merged in their content order (:mod:`pactlib.order`), as :func:`merged_update`
    merges them: any order of the same checkpoints gives the same bytes; ``names`` follow
    ``finetuned``.

    Args:
        method: a registered name, one of :func:`pactlib.merges.names` (e.g. ``task_arithmetic``).
        pretrained: θ0, a state dict; never modified.
        finetuned: T state dicts with θ0's keys and shapes; never modified.
        alpha: scaling coefficient α.
        pact: ``None`` (plain method), ``"pact"`` or ``"s-pact"``.
        rule: the matrix-view rule.
        names: task names for messages.
        options: PACT options as one :class:`PactOptions`, as :func:`merged_update` takes them
            (or give them by name in ``kw``; not both).
        **kw: method parameters (e.g. ``k=20`` for TIES) and PACT options (e.g. ``core_frac=0.1``,
            ``svd="rsvd"``), routed by name.

    Returns:
        A new state dict in θ0's dtypes (fp16/bf16 in, computed in float32, returned as given);
        non-floating buffers copied from θ0.

    Raises:
        TypeError, ValueError: α not a real number, or NaN / ±Inf (before any work).
        CheckpointError: key/shape mismatch or NaN/Inf in any input (named, before any SVD).
        MergeOverflowError: a merged value overflows θ0's dtype (fp16), naming key and dtype.
        UnknownMethodError, TypeError, ValueError: as :func:`resolve_kwargs` and
            :func:`check_options` (before any work).

    Warns:
        UserWarning: as :func:`merged_update`, and as :func:`task_vectors_from` (an all-zero or
            two identical task vectors).
    """
    alpha = check_alpha(alpha)
    mparams, named = resolve_kwargs(method, pact, kw)
    options = check_options(options, named, pact)
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in pretrained.values()) else torch.float32
    m = merges.get(method)
    if pact is None and m.elementwise and m.reducer is not None:  # Task Arithmetic: no T task vectors held
        check_method_params(method, mparams)
        note = split_attention_note(pretrained.keys(), where=f"{method}: ")
        if note:
            warnings.warn(note, UserWarning, stacklevel=2)
        names = task_names(finetuned, names)  # a sequence of state dicts, before it is copied to a list
        finetuned = list(finetuned)
        D = update_from_checkpoints(m, pretrained, finetuned, names=names, dtype=dtype, rule=rule,
                                    order=checkpoint_order(pretrained, finetuned, dtype), **mparams)
        return D._apply(pretrained, alpha, consume=True)  # D is ours: θ0 + α·D in its own tensors
    tvs = task_vectors_from(pretrained, finetuned, names=names, dtype=dtype)
    D, _ = merged_update(method, pretrained, tvs, pact=pact, options=options, rule=rule, **mparams)
    return D.apply_to(pretrained, alpha)


def update_from_checkpoints(m: merges.MergeMethod, pretrained: Mapping[str, Tensor],
                            finetuned: Sequence[Mapping[str, Tensor]], *, names: Sequence[str] | None = None,
                            dtype: torch.dtype = torch.float32, rule: MatrixRule = DEFAULT_RULE,
                            order: Sequence[int] | None = None, **params) -> TaskVector:
    """The merged update D of a method with a per-task reducer (:attr:`pactlib.merges.MergeMethod.reducer`,
    e.g. Task Arithmetic's running sum, M1) straight from the checkpoints, key by key: each task's
    Δt = θt − θ0 of the key is formed and handed to the key's reducer, in task order, so only D
    and one Δt are held, never the T task vectors, and θ0's key and the running result stay in
    cache over the tasks. The same values as ``m`` on the task vectors in ``order`` (the reducers add the
    tasks in that order, as the methods do; ``order``: the caller's indices of the tasks in the
    order they are added, default the given one; :func:`merge` passes the content order,
    :func:`checkpoint_order`), with the same checks and warnings as
    :func:`task_vectors_from`, the first failing one raised as there (θ0's values; then task by
    task its keys and shapes, then its values).

    Raises:
        ValueError: ``m`` has no reducer; ``dtype`` is not float32 / float64.
        CheckpointError: as :func:`task_vectors_from`.
    """
    if m.reducer is None:
        raise ValueError(f"merge method {m.name!r} has no per-task reducer")
    check_compute_dtype(dtype)
    names = task_names(finetuned, names)
    check_state_dict(pretrained, name="pre-trained")
    check_finite(pretrained, name="pre-trained")

    def check_values(upto: int) -> None:
        """The exact finiteness checks of tasks 0 … upto − 1 in task order (raises the first)."""
        for ft, nm in zip(finetuned[:upto], names[:upto]):
            check_finite(ft, name=nm)

    for j, (ft, nm) in enumerate(zip(finetuned, names)):
        try:
            check_compatible(pretrained, ft, name=nm)
        except CheckpointError:
            check_values(j)  # a NaN in an earlier task is the first error, as task by task
            raise
    floats = [k for k, v in pretrained.items() if torch.is_floating_point(v)]
    report_buffers([k for k, v in pretrained.items() if not torch.is_floating_point(v)])
    T = len(finetuned)
    order = list(range(T)) if order is None else list(order)
    if sorted(order) != list(range(T)):
        raise ValueError(f"order: {order} is not an order of the {T} tasks")
    looked = False  # the exact checks of every task ran (a sum overflowed, no NaN / Inf found)
    sums = torch.empty((T, len(floats)), dtype=dtype)  # per task and key: Σ of Δt's entries
    nonzero = [False] * T
    D = {}
    for i, k in enumerate(floats):
        pre = pretrained[k].to(dtype)  # no copy when θ0 is in dtype already
        matrix = rule.kind(k, pre) == "matrix"
        reducer = m.reducer(T, matrix, **params)
        for t in order:
            d = finetuned[t][k].to(dtype) - pre  # the values of TaskVector.from_checkpoints
            sums[t, i] = s = d.sum()
            if not looked and not bool(torch.isfinite(s)):  # NaN / Inf in a θt, or an overflowing sum
                check_values(T)
                looked = True
            nonzero[t] = nonzero[t] or bool(s != 0) or bool(d.any())
            reducer.add(rule.view(k, d) if matrix else d)  # the reducer keeps d
        if passes_of(reducer) == 2:  # Iso-CTS: each Δt again, against the sum
            reducer.next_pass()
            for t in order:
                d = finetuned[t][k].to(dtype) - pre
                reducer.add(rule.view(k, d) if matrix else d)
        r = reducer.result()
        D[k] = rule.unview(k, r, pre.shape) if matrix else r
    same = [(i, j) for i in range(T) for j in range(i + 1, T)
            if torch.equal(sums[i], sums[j]) and all(
                torch.equal(finetuned[i][k].to(dtype) - pretrained[k].to(dtype),
                            finetuned[j][k].to(dtype) - pretrained[k].to(dtype)) for k in floats)]
    for message in task_set_warnings(names, nonzero, same):
        warnings.warn(message, stacklevel=3)
    return TaskVector._wrap(D)


def checkpoint_order(pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]],
                     dtype: torch.dtype = torch.float32) -> list[int]:
    """The content order (:mod:`pactlib.order`) of the task vectors Δt = θt − θ0 in ``dtype`` of
    the checkpoints, the order :func:`merged_update` merges ``task_vectors_from(...)`` in, formed
    a chunk at a time (no task vector held): ``perm[c]`` is the index of the task merged c-th. The
    given order when a θt's keys or shapes are not θ0's (the merge then names the first problem)."""
    floats = {k: v for k, v in pretrained.items() if isinstance(v, Tensor) and torch.is_floating_point(v)}
    if not all(isinstance(ft, Mapping) and ft.keys() == pretrained.keys()
               and all(isinstance(ft[k], Tensor) and ft[k].shape == v.shape for k, v in floats.items())
               for ft in finetuned):
        return list(range(len(finetuned)))
    segs = segments({k: v.shape for k, v in floats.items()})

    def chunk(t: int, c: int) -> bytes:
        key, a, b = segs[c]
        x = finetuned[t][key].detach().reshape(-1)[a:b].to(dtype) - floats[key].detach().reshape(-1)[a:b].to(dtype)
        return bytes(tensor_bytes_view(x.cpu().contiguous()))

    return content_order(len(finetuned), len(segs), chunk)
