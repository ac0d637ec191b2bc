"""Nested task suites: ``"8"`` ⊂ ``"14"`` ⊂ ``"20"``.

Suite 8 holds the most "real" and diverse tasks (five shipped datasets of handwriting,
clothing, animal shapes and printed-glyph / texture / photo domains); 14 and 20 add derived
tasks (label groupings, class subsets, more glyph sets, font style). The order inside a suite
is fixed and is the order results are reported in.
"""
from __future__ import annotations

from collections.abc import Iterable

from .tasks import TASKS

__all__ = ["SUITES", "suite_tasks", "resolve"]

_CORE = ("mnist", "fashion_mnist", "animal_mnist", "optdigits", "glyph_letters", "textures",
         "photo_patches", "font_style")
_MORE = ("fashion_coarse", "mnist_parity", "glyph_digits", "glyph_greek", "lfw_faces",
         "fashion_footwear")
_MOST = ("animal_hoofed", "fashion_tops", "glyph_lower", "glyph_symbols", "glyph_math",
         "glyph_letters_kt")

SUITES: dict[str, tuple[str, ...]] = {
    "8": _CORE,
    "14": _CORE + _MORE,
    "20": _CORE + _MORE + _MOST,
}


def suite_tasks(suite: str) -> tuple[str, ...]:
    """Task names of a suite, in reporting order.

    Raises:
        KeyError: unknown suite (the message lists the known suites).
    """
    key = str(suite)
    if key not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; known suites: {sorted(SUITES, key=int)}")
    return SUITES[key]


def resolve(tasks_or_suite: str | Iterable[str]) -> tuple[str, ...]:
    """A suite name, a task name or an iterable of task names -> tuple of task names.

    Raises:
        KeyError: a name that is neither a suite nor a task (lists both).
    """
    if isinstance(tasks_or_suite, (str, int)):
        key = str(tasks_or_suite)
        if key in SUITES:
            return SUITES[key]
        names: Iterable[str] = (key,)
    else:
        names = tasks_or_suite
    out = tuple(names)
    unknown = [n for n in out if n not in TASKS]
    if unknown:
        raise KeyError(f"unknown task or suite {unknown}; suites: {sorted(SUITES, key=int)}, "
                       f"tasks: {sorted(TASKS)}")
    return out
