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
from .checks import check_alpha, check_task_set, check_type
from .matrix import DEFAULT_RULE, MatrixRule, split_attention_note
from .pact import MODES, PactOptions, PactReport, pact_filter
from .taskvector import TaskVector, check_compute_dtype

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


def resolve_kwargs(method: str, pact: str | None, kw: Mapping) -> tuple[dict, PactOptions | None]:
    """(method parameters, PACT options or None) from ``merge``'s keyword arguments, all checked
    (names, types, values) without touching a checkpoint.

    Raises:
        UnknownMethodError: unknown ``method``.
        ValueError: unknown ``pact`` mode, or an invalid PACT option value.
        TypeError: unknown name, wrong type, or PACT options with ``pact=None``.
    """
    mparams, popts = split_kwargs(method, kw)
    if pact is not None and pact not in MODES:
        raise ValueError(f"unknown pact mode {pact!r}; use None or one of {MODES}")
    if popts and pact is None:
        raise TypeError(f"PACT option(s) {sorted(popts)} given but pact=None")
    return mparams, (PactOptions().replace(**popts) if popts else None)


def task_vectors_from(pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]], *,
                      names: Sequence[str] | None = None, dtype: torch.dtype = torch.float32) -> list[TaskVector]:
    """Δt = θt − θ0 for every fine-tuned checkpoint, after checking them all (keys, shapes,
    NaN/Inf, named by task). Warns on an all-zero task vector and on identical task vectors.

    Raises:
        ValueError: ``dtype`` is not float32 / float64 (checked first).
        CheckpointError: as :func:`pactlib.checks.check_task_set`.
    """
    check_compute_dtype(dtype)
    names = check_task_set(pretrained, finetuned, names)
    tvs = [TaskVector.from_checkpoints(pretrained, ft, name=nm, dtype=dtype) for ft, nm in zip(finetuned, names)]
    for tv in tvs:
        if tv.norm() == 0:
            warnings.warn(f"task vector of {tv.name!r} is all zero (fine-tuned == pre-trained)", stacklevel=3)
    for i in range(len(tvs)):
        for j in range(i + 1, len(tvs)):
            if all(torch.equal(tvs[i][k], tvs[j][k]) for k in tvs[i]):
                warnings.warn(f"task vectors of {tvs[i].name!r} and {tvs[j].name!r} are identical", stacklevel=3)
    return tvs


def merged_update(method: str, pretrained: Mapping[str, Tensor], task_vectors: Sequence[TaskVector], *,
                  pact: str | None = None, options: PactOptions | None = None, rule: MatrixRule = DEFAULT_RULE,
                  **method_params) -> tuple[TaskVector, PactReport | None]:
    """The merged update D of ``method`` over (optionally PACT-filtered) task vectors.

    Compute it once and apply it with several α (``D.apply_to(pretrained, alpha)``).

    Raises:
        UnknownMethodError: unknown ``method`` (lists the known names).
        ValueError: unknown ``pact`` mode.
        TypeError: unknown method parameter, or one of the wrong type (named).

    Warns:
        UserWarning: PACT changed nothing (see :func:`pactlib.pact.pact_filter`); θ0 has Hugging
            Face CLIP keys, whose separate q/k/v matrices merge differently from open_clip's fused
            ``in_proj_weight`` (:func:`pactlib.matrix.split_attention_note`).
    """
    m = merges.get(method)
    check_method_params(method, method_params)
    note = split_attention_note(pretrained.keys(), where=f"{method}: ")
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    report = None
    if pact is not None:
        if pact not in MODES:
            raise ValueError(f"unknown pact mode {pact!r}; use None or one of {MODES}")
        task_vectors, report = pact_filter(dict(pretrained), task_vectors, mode=pact,
                                           options=options or PactOptions(), rule=rule)
        log.info("%s: cap bound on %.1f%% of (layer, task) shields", pact, 100 * report.cap_binding_rate())
    return m(task_vectors, rule=rule, **method_params), report


def merge(method: str, pretrained: Mapping[str, Tensor], finetuned: Sequence[Mapping[str, Tensor]], *,
          alpha: float, pact: str | None = None, rule: MatrixRule = DEFAULT_RULE,
          names: Sequence[str] | None = None, **kw) -> dict[str, Tensor]:
    """Merge fine-tuned checkpoints: θ = θ0 + α·D (book/method.md, merges), D from ``method`` after the
    optional ``pact`` filter (``None``, ``"pact"`` or ``"s-pact"``).

    Everything is in memory (θ0, the T checkpoints, their task vectors, D). For files,
    :func:`pactlib.merge_files` gives the same result, bit for bit, one layer at a time.

    Args:
        method: a registered name, one of :func:`pactlib.merges.names` (e.g. ``task_arithmetic``).
        pretrained: θ0, a state dict; never modified.
        finetuned: T state dicts with θ0's keys and shapes; never modified.
        alpha: scaling coefficient α.
        pact: ``None`` (plain method), ``"pact"`` or ``"s-pact"``.
        rule: the matrix-view rule.
        names: task names for messages.
        **kw: method parameters (e.g. ``k=20`` for TIES) and PACT options (e.g. ``core_frac=0.1``,
            ``svd="rsvd"``), routed by name.

    Returns:
        A new state dict in θ0's dtypes (fp16/bf16 in, computed in float32, returned as given);
        non-floating buffers copied from θ0.

    Raises:
        TypeError, ValueError: α not a real number, or NaN / ±Inf (before any work).
        CheckpointError: key/shape mismatch or NaN/Inf in any input (named, before any SVD).
        MergeOverflowError: a merged value overflows θ0's dtype (fp16), naming key and dtype.
        UnknownMethodError, TypeError, ValueError: as :func:`resolve_kwargs` (before any work).
    """
    alpha = check_alpha(alpha)
    mparams, options = resolve_kwargs(method, pact, kw)
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in pretrained.values()) else torch.float32
    tvs = task_vectors_from(pretrained, finetuned, names=names, dtype=dtype)
    D, _ = merged_update(method, pretrained, tvs, pact=pact, options=options, rule=rule, **mparams)
    return D.apply_to(pretrained, alpha)
