"""Merge methods (M1–M5) in a registry: ``get(name)``, ``names()``.

Registered: ``task_arithmetic``, ``ties``, ``tsv_m``, ``iso_c``, ``iso_cts``.
"""
from . import task_arithmetic, ties, tsv_m, iso  # noqa: F401  (registration side effects)
from .registry import MergeMethod, UnknownMethodError, alpha_grid, get, names, register

__all__ = ["MergeMethod", "UnknownMethodError", "alpha_grid", "get", "names", "register"]
