"""What a testbed's merges share below :mod:`pactlib.testbeds.base` and
:mod:`pactlib.testbeds.lazy_vectors`: where they run (:func:`engine_device`), the files they read
(:func:`merge_sources`) and the fingerprint of the code their results depend on
(:func:`code_fingerprint` of :data:`ENGINE_MODULES`). :mod:`pactlib.testbeds.base` re-exports them.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path
from typing import Any, Sequence

import torch

from ..book.provenance import strip_docstrings as _strip_docstrings


#: The modules a merge's result depends on: every memo key holds a fingerprint of their code.
ENGINE_MODULES = ("pactlib.taskvector", "pactlib.checks", "pactlib.matrix", "pactlib.linalg", "pactlib.subspaces",
                  "pactlib.shield", "pactlib.pact", "pactlib.merges", "pactlib.lora", "pactlib.api", "pactlib.order",
                  "pactlib.threads", "pactlib.eval")

_CODE: dict[tuple[str, ...], str] = {}


def source_fingerprint(files: Sequence[Path], root: Path | None = None) -> str:
    """sha256 of the *code* of Python ``files`` (their syntax trees without docstrings, named
    relative to ``root``): editing a comment or a docstring keeps the fingerprint.

    Raises:
        SyntaxError: a file that does not parse. OSError: a file that cannot be read.
    """
    h = hashlib.sha256()
    for f in files:
        f = Path(f)
        tree = _strip_docstrings(ast.parse(f.read_text(encoding="utf-8"), str(f)))
        name = f.relative_to(root).as_posix() if root is not None else f.name
        h.update(f"{name}\0".encode() + ast.dump(tree).encode())
    return h.hexdigest()


def code_fingerprint(modules: Sequence[str]) -> str:
    """sha256 of the *code* of ``modules`` (a package means every ``.py`` file in it): the AST
    without docstrings, so editing a comment or a docstring keeps every memoised result.

    Raises:
        ModuleNotFoundError: a module that does not exist.
    """
    key = tuple(modules)
    if key not in _CODE:
        h = hashlib.sha256()
        for name in key:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                raise ModuleNotFoundError(f"code_fingerprint: no module {name!r}")
            origin = Path(spec.origin)
            files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
            h.update(f"{name}\0".encode() + source_fingerprint(files, origin.parent).encode())
        _CODE[key] = h.hexdigest()
    return _CODE[key]


def engine_device(tb: Any) -> torch.device | None:
    """Where :func:`run` merges and filters ``tb``'s task vectors: the testbed's optional
    ``device`` attribute (e.g. ``"cuda"``), or None for the CPU (a testbed without one, or
    ``"cpu"``). The engine itself takes no device argument: it computes where its tensors are."""
    dev = getattr(tb, "device", None)
    if dev is None:
        return None
    dev = torch.device(dev)
    return None if dev.type == "cpu" else dev


def merge_sources(tb: Any):
    """``tb.merge_sources()`` when the testbed has it (an optional part of the protocol), else None.

    A testbed whose checkpoints are files can offer them to the streamed merge: the method returns
    ``(θ0, [θt or Δt source per task])``, θ0 and each θt a :class:`pactlib.lazy.LazyCheckpoint`
    (keys read one at a time from memory-mapped safetensors), or a task-vector source with
    ``check(meta)`` and ``delta(key)`` (:func:`pactlib.streaming.is_delta_source`, e.g.
    :class:`pactlib.peft.AdapterSource`), in ``tb.tasks`` order, with ``tb.pretrained``'s keys and
    values. :func:`run` then merges key by key (:func:`streamed_update`), so its memory does not
    grow with the number of tasks."""
    fn = getattr(tb, "merge_sources", None)
    return fn() if callable(fn) else None
