"""Where the book's files are, by configuration: never found by walking up from this package.

- :func:`book_dir`: ``$PACT_BOOK_DIR``, else ``book/`` under the current working directory. ``make``
  and the notebooks run from the repository root, and ``scripts/run_notebooks.py`` exports
  ``PACT_BOOK_DIR`` to the kernels; set it to use an installed pactlib with a checkout elsewhere.
- :func:`book_path`: a file shipped with the book (``book_path("data/head_choice.jsonl")``,
  ``book_path("reference_numbers.yaml")``), checked to exist.
- :func:`cache_dir`: :func:`pactlib.paths.cache_dir` (``$PACT_CACHE``, else the per-user cache
  ``$XDG_CACHE_HOME/pactlib`` / ``~/.cache/pactlib``; the Makefile exports ``<repo>/.cache``).
"""
from __future__ import annotations

import os
from pathlib import Path

from pactlib.paths import CACHE_ENV, cache_dir

__all__ = ["BOOK_ENV", "CACHE_ENV", "book_dir", "book_path", "cache_dir"]

#: The environment variable naming the book folder (the repository's ``book/``).
BOOK_ENV = "PACT_BOOK_DIR"


def book_dir() -> Path:
    """``$PACT_BOOK_DIR``, else ``./book`` (relative to the current working directory, made
    absolute). Not checked: :func:`book_path` says what is missing."""
    env = os.environ.get(BOOK_ENV)
    return Path(env) if env else Path.cwd() / "book"


def book_path(relative: str | os.PathLike, *, must_exist: bool = True) -> Path:
    """The book's file ``relative`` (to :func:`book_dir`), e.g. ``"data/alpha_search.jsonl"``.

    Raises:
        FileNotFoundError: ``must_exist`` and there is no such file; the message names the path
            looked at and ``$PACT_BOOK_DIR``.
    """
    root = book_dir()
    path = root / relative
    if must_exist and not path.exists():
        how = (f"${BOOK_ENV} = {os.environ[BOOK_ENV]}" if os.environ.get(BOOK_ENV)
               else f"${BOOK_ENV} is unset, so the book folder is ./book under the working directory {Path.cwd()}")
        raise FileNotFoundError(f"book file {relative} not found: no {path} ({how}); run from the repository "
                                f"root or set {BOOK_ENV} to the repository's book/ folder")
    return path
