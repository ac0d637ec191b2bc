"""Testbeds: the model families the book's chapters run on, behind one seam.

A testbed gives θ0, θt per task, its :class:`~pactlib.matrix.MatrixRule`, an evaluator, a loss
model and input batches (:class:`~pactlib.testbeds.base.Testbed`, the whole protocol in one
file). Chapters name one by a registry name and load it here::

    from pactlib import testbeds
    tb = testbeds.load("lite0-8", seed=0, kind="full")
    testbeds.run(tb, "iso_c", pact="pact")

Built in: ``lite0-8``/``lite0-14``/``lite0-20`` (EfficientNet-Lite0 on real image tasks),
``synthetic-<n>`` (seconds-sized, for the smoke book and the tests), ``minilm-8``/``minilm-14``
(all-MiniLM-L6-v2 on real text tasks, :mod:`pactlib.testbeds.minilm`) and the ``clip`` family (CLIP
image encoders from the user's own files, :mod:`pactlib.testbeds.clip`). A family is registered by
its name prefix (:func:`register`), from its own package; ``book/adding-a-testbed.md`` says how.

A family whose testbeds need options (paths to checkpoints and data) gets *named definitions*:
``define("clip-vitb32-8", family="clip", checkpoint_dir=..., ...)`` makes ``load("clip-vitb32-8")``
call the clip loader with those options (the call's own options win). A parameter file's
top-level ``testbeds:`` mapping ``{name: {family: ..., option: value, ...}}`` is defined by the
book runner, which hands it to every kernel as JSON in ``$PACT_TESTBEDS``
(:data:`ENV`); this package defines what that variable holds when it is imported.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
from typing import Any, Callable, Mapping

from .base import (GRID_SPACING, REFINE, Testbed, alpha_grid, code_fingerprint, filtered, reference_records, run,
                   suite_of, with_frozen_head)

__all__ = ["Testbed", "load", "check_name", "register", "families", "define", "define_all", "definitions",
           "undefine", "missing_paths", "run", "filtered", "reference_records", "alpha_grid", "code_fingerprint",
           "suite_of", "with_frozen_head", "GRID_SPACING", "REFINE", "ENV"]

#: The environment variable that carries named testbed definitions into a process (a notebook
#: kernel): JSON ``{name: {"family": ..., option: value, ...}}``, defined on import.
ENV = "PACT_TESTBEDS"

#: family -> its loader, ``"module:function"`` (imported on first use) or a callable
#: ``loader(name, seed=..., kind=..., **options) -> Testbed``.
_FAMILIES: dict[str, str | Callable[..., Testbed]] = {
    "lite0": "pactlib.testbeds.lite0.testbed:load",
    "synthetic": "pactlib.testbeds.synthetic:load",
    "clip": "pactlib.testbeds.clip:load",
    "minilm": "pactlib.testbeds.minilm.testbed:load",
}

#: Named definitions: name -> (family, options) (:func:`define`).
_DEFINED: dict[str, tuple[str, dict[str, Any]]] = {}


def register(family: str, loader: str | Callable[..., Testbed]) -> None:
    """Make ``<family>-...`` names loadable. ``loader``: ``"module:function"`` or a callable
    ``loader(name, seed=..., kind=..., **options) -> Testbed``.

    Raises:
        ValueError: ``family`` is empty or holds ``-`` or ``:``; it is already registered to another loader.
    """
    if not family or "-" in family or ":" in family:
        raise ValueError(f"testbed family must be a non-empty name without '-' or ':', got {family!r}")
    if family in _FAMILIES and _FAMILIES[family] != loader:
        raise ValueError(f"testbed family {family!r} is already registered ({_FAMILIES[family]!r})")
    _FAMILIES[family] = loader


def _entry_points() -> None:
    """Families installed packages declare in the entry-point group ``pactlib.testbeds``
    (``mine = "mypkg.testbed:load"``): registered on first use, so no notebook imports them."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="pactlib.testbeds"):
        _FAMILIES.setdefault(ep.name, ep.value)


def families() -> list[str]:
    """The registered family names (built in, :func:`register`-ed, and entry points)."""
    _entry_points()
    return sorted(_FAMILIES)


def load(name: str, seed: int = 0, kind: str = "full", **options) -> Testbed:
    """Load the testbed ``name`` (``"<family>-<variant>"``, e.g. ``"lite0-8"``, ``"synthetic-4"``).

    Args:
        seed: fine-tuning seed; kind: ``"full"`` or ``"lora"``.
        options: the family's loader options (e.g. ``val_limit``, ``test_limit``; Lite0: ``profile``).

    Raises:
        KeyError: unknown family (lists the registered ones) or variant. ValueError: ``kind`` is
        neither ``"full"`` nor ``"lora"``.
    """
    if kind not in ("full", "lora"):
        raise ValueError(f"testbed kind must be 'full' or 'lora', got {kind!r}")
    family = check_name(str(name))
    if name in _DEFINED:
        options = {**_DEFINED[name][1], **options}
    return _loader(family)(str(name), seed=seed, kind=kind, **options)


def _loader(family: str) -> Callable[..., Testbed]:
    loader = _FAMILIES[family]
    if isinstance(loader, str):
        module, _, fn = loader.partition(":")
        loader = getattr(importlib.import_module(module), fn)
    return loader


def _loader_module(family: str):
    loader = _FAMILIES[family]
    return importlib.import_module(loader.partition(":")[0]) if isinstance(loader, str) else None


def check_name(name: str) -> str:
    """Check a testbed name without loading anything; returns its family.

    The family's module may define ``parse_name(name)`` (raising KeyError for an unknown
    variant); families registered with a callable are checked by family only.

    A name defined with :func:`define` is known as it is (its family's ``parse_name`` is not asked).

    Raises:
        TypeError: ``name`` is not a str. KeyError: unknown family (lists the registered ones) or variant.
    """
    if not isinstance(name, str):
        raise TypeError(f"a testbed name is a str, got {type(name).__name__}")
    if name in _DEFINED:
        return _DEFINED[name][0]
    family = name.split("-", 1)[0]
    if family not in _FAMILIES:
        _entry_points()
    if family not in _FAMILIES:
        raise KeyError(f"unknown testbed {name!r}: no family {family!r}; registered: {', '.join(families())}")
    module = _loader_module(family)
    if module is not None and hasattr(module, "parse_name"):
        module.parse_name(name)
    return family


# ------------------------------------------------------------------------------ definitions

def _option_names(family: str) -> tuple[set[str] | None, Callable[..., Testbed]]:
    """(the keyword options ``family``'s loader takes, None when it takes ``**options``; the loader)."""
    loader = _loader(family)
    params = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None, loader
    return {n for n, p in params.items() if n not in ("name", "seed", "kind")
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}, loader


def define(name: str, family: str, *, replace: bool = False, **options) -> None:
    """Name a testbed: ``load(name, seed, kind, **more)`` then calls ``family``'s loader with
    ``options`` updated by ``more`` (the call's options win).

    Options are checked now, without touching a file: every name must be a keyword of the loader
    (unless it takes ``**options``), and the family's module may check values in
    ``check_options(options)`` (raising ValueError or TypeError that names the option).
    Whether paths exist is :func:`missing_paths`' question.

    Args:
        name: any non-empty name without whitespace (e.g. ``"clip-vitb32-8"``); it need not start
            with the family's prefix. ``replace``: redefine a name defined with other options.

    Raises:
        KeyError: unknown family (lists the registered ones). TypeError: ``name`` not a str, or an
        option the loader does not take (named, with the options it takes). ValueError: a bad name,
        a bad option value (from the family), or ``name`` already defined otherwise and not ``replace``.
    """
    if not isinstance(name, str):
        raise TypeError(f"a testbed name is a str, got {type(name).__name__}")
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"testbed name must be non-empty, without whitespace, got {name!r}")
    if not isinstance(family, str) or family not in _FAMILIES:
        _entry_points()
    if not isinstance(family, str) or family not in _FAMILIES:
        raise KeyError(f"testbed {name!r}: unknown family {family!r}; registered: {', '.join(families())}")
    known, _ = _option_names(family)
    if known is not None:
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"testbed {name!r}: family {family!r} has no option {unknown[0]!r}"
                            f"{f' (nor {unknown[1:]})' if len(unknown) > 1 else ''}; its options: {sorted(known)}")
    module = _loader_module(family)
    if module is not None and hasattr(module, "check_options"):
        try:
            module.check_options(dict(options))
        except (ValueError, TypeError) as e:
            raise type(e)(f"testbed {name!r}: {e}") from None
    old = _DEFINED.get(name)
    if old is not None and old != (family, options) and not replace:
        raise ValueError(f"testbed {name!r} is already defined (family {old[0]!r}) with other options; "
                         "pass replace=True to redefine it")
    _DEFINED[name] = (family, dict(options))


def undefine(name: str) -> None:
    """Forget the definition of ``name`` (no error when there is none)."""
    _DEFINED.pop(name, None)


def definitions() -> dict[str, dict[str, Any]]:
    """The defined names: ``{name: {"family": ..., option: value, ...}}`` (the format of
    :data:`ENV` and of a parameter file's ``testbeds:`` section)."""
    return {n: {"family": f, **o} for n, (f, o) in _DEFINED.items()}


def define_all(specs: Mapping[str, Any], *, where: str = "testbeds", replace: bool = False) -> list[str]:
    """:func:`define` every entry of ``{name: {"family": ..., option: value, ...}}``.

    Every problem is collected and raised together, each naming ``where``, the testbed and the
    bad key. Returns the names defined.

    Raises:
        ValueError: ``specs`` is not a mapping of mappings, an entry has no ``family``, or any
            :func:`define` error (all of them, in one message).
    """
    if not isinstance(specs, Mapping):
        raise ValueError(f"{where}: expected a mapping {{name: {{family: ..., options}}}}, got {type(specs).__name__}")
    problems, names = [], []
    for name, spec in specs.items():
        if not isinstance(spec, Mapping):
            problems.append(f"testbed {name!r}: expected a mapping with 'family' and options, "
                            f"got {type(spec).__name__}")
            continue
        spec = dict(spec)
        family = spec.pop("family", None)
        if family is None:
            problems.append(f"testbed {name!r}: no 'family' key (registered families: {', '.join(families())})")
            continue
        try:
            define(name, family, replace=replace, **spec)
            names.append(name)
        except (KeyError, TypeError, ValueError) as e:
            problems.append(e.args[0] if e.args else str(e))
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    return names


def missing_paths(name: str) -> list[tuple[str, str]]:
    """The paths a defined testbed's options name that do not exist: ``[(option, path), ...]``
    from its family module's ``missing_paths(options)`` (``[]`` for a family without one, or a
    name that is not defined). Nothing is read, only looked up."""
    if name not in _DEFINED:
        return []
    family, options = _DEFINED[name]
    module = _loader_module(family)
    fn = getattr(module, "missing_paths", None) if module is not None else None
    return list(fn(dict(options))) if fn is not None else []


def _define_from_env() -> None:
    text = os.environ.get(ENV)
    if not text:
        return
    try:
        specs = json.loads(text)
    except ValueError as e:
        raise ValueError(f"${ENV} is not JSON ({e}); it holds {{name: {{family: ..., options}}}}") from None
    define_all(specs, where=f"${ENV}", replace=True)


_define_from_env()
