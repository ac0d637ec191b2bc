"""Where pactlib keeps files it builds: one cache folder, chosen by configuration, never found by
walking up from this package to a repository.

``cache_dir()`` is ``$PACT_CACHE`` when set, else the per-user cache ``$XDG_CACHE_HOME/pactlib``
(``~/.cache/pactlib`` when ``XDG_CACHE_HOME`` is unset). Its sub-folders: ``converted/`` (pickled
checkpoints converted to safetensors by :mod:`pactlib.lazy`; ``$PACT_CONVERT_CACHE`` overrides),
and, for the book's built-in testbed, ``data/`` (the task cache), ``npm/`` (raw sources installed
by ``scripts/setup_sources.sh``) and ``zoo*/`` (model zoos). The repository's ``Makefile`` exports
``PACT_CACHE=<repo>/.cache``, so ``make`` keeps everything in the checkout.

Standard library only: part of the engine.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

#: The environment variable naming the cache folder.
CACHE_ENV = "PACT_CACHE"


def cache_dir(*parts: str) -> Path:
    """``$PACT_CACHE`` (else ``$XDG_CACHE_HOME/pactlib``, else ``~/.cache/pactlib``), joined with
    ``parts``. Nothing is created."""
    env = os.environ.get(CACHE_ENV)
    root = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pactlib"
    return root.joinpath(*parts)
