"""Testbeds: the model families the book's chapters run on, behind one seam.

A testbed gives θ0, θt per task, its :class:`~pactlib.matrix.MatrixRule`, an evaluator, a loss
model and input batches (:class:`~pactlib.testbeds.base.Testbed`, the whole protocol in one
file). Chapters name one by a registry name and load it here::

    from pactlib import testbeds
    tb = testbeds.load("lite0-8", seed=0, kind="full")
    testbeds.run(tb, "iso_c", pact="pact")

Built in: ``lite0-8``/``lite0-14``/``lite0-20`` (EfficientNet-Lite0 on real image tasks) and
``synthetic-<n>`` (seconds-sized, for the smoke book and the tests). A family is registered by
its name prefix (:func:`register`), from its own package; ``book/adding-a-testbed.md`` says how.
"""
from __future__ import annotations

import importlib
from typing import Callable

from .base import (GRID_SPACING, REFINE, Testbed, alpha_grid, code_fingerprint, filtered, reference_records, run,
                   suite_of, with_frozen_head)

__all__ = ["Testbed", "load", "check_name", "register", "families", "run", "filtered", "reference_records", "alpha_grid",
           "code_fingerprint", "suite_of", "with_frozen_head", "GRID_SPACING", "REFINE"]

#: family -> its loader, ``"module:function"`` (imported on first use) or a callable
#: ``loader(name, seed=..., kind=..., **options) -> Testbed``.
_FAMILIES: dict[str, str | Callable[..., Testbed]] = {
    "lite0": "pactlib.testbeds.lite0.testbed:load",
    "synthetic": "pactlib.testbeds.synthetic:load",
}


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
    loader = _FAMILIES[family]
    if isinstance(loader, str):
        module, _, fn = loader.partition(":")
        loader = getattr(importlib.import_module(module), fn)
    return loader(str(name), seed=seed, kind=kind, **options)


def _loader_module(family: str):
    loader = _FAMILIES[family]
    return importlib.import_module(loader.partition(":")[0]) if isinstance(loader, str) else None


def check_name(name: str) -> str:
    """Check a testbed name without loading anything; returns its family.

    The family's module may define ``parse_name(name)`` (raising KeyError for an unknown
    variant); families registered with a callable are checked by family only.

    Raises:
        TypeError: ``name`` is not a str. KeyError: unknown family (lists the registered ones) or variant.
    """
    if not isinstance(name, str):
        raise TypeError(f"a testbed name is a str, got {type(name).__name__}")
    family = name.split("-", 1)[0]
    if family not in _FAMILIES:
        _entry_points()
    if family not in _FAMILIES:
        raise KeyError(f"unknown testbed {name!r}: no family {family!r}; registered: {', '.join(families())}")
    module = _loader_module(family)
    if module is not None and hasattr(module, "parse_name"):
        module.parse_name(name)
    return family
