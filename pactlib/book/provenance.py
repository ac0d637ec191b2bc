"""Provenance of a chapter's committed records, and whether they are still current.

A compute run of chapter ``c`` (``scripts/run_notebooks.py --mode compute``) writes its records
into ``book/records/<set>/<run>/<c>/`` with a ``provenance.json``::

    {"chapter": "05_main_results", "run": "main", "set": "default",
     "params": {...}, "seeds": {...}, "testbeds": {"lite0-8": "<sha256>"},
     "engine": {"fingerprint": "<sha256>", "modules": {"pactlib/merges/iso.py": "<sha256>"},
                "lock": "<sha256 of requirements.lock>"},
     "notebook": "<sha256>", "made": "2026-12-03T12:34:56Z", "git": "<commit>[-dirty]",
     "machine": {...}, "threads": 1, "wall_minutes": 12.3, "cpu_minutes": 22.1,
     "zoos": {"lite0": "<sha256>"}}

The *engine* is the set of ``pactlib`` modules the compute kernel had imported, minus the
presentation modules (:data:`PRESENTATION`: they only read and draw records). Every module is
hashed by its syntax tree without docstrings (:func:`ast_hash`), so editing a comment or a
docstring stales nothing. The *notebook* hash covers the code of the chapter's compute cells
(:func:`notebook_hash`).

``zoos`` names the model zoos the chapter read (:func:`zoo_fingerprint`: their checkpoints'
sha256): a zoo rebuilt on another machine may differ in float32 rounding, and this says which one
made the records. It is recorded, not compared: a fresh clone has no zoo to compare with.

Records are **current** when the parameters, the notebook hash, every engine module's hash, the
lock hash and the testbed hashes equal today's; :func:`staleness` lists what differs in words.
Only the standard library is used here.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pactlib.book.records import read_json_object
from pactlib.io import write_atomic

__all__ = ["sha", "PRESENTATION", "FILE", "strip_docstrings", "ast_hash", "module_file", "engine_modules",
           "fingerprint", "engine", "code_hash", "COMPILED_SUFFIXES", "notebook_hash", "seeds_of", "write", "read", "staleness", "state", "git_state", "machine",
           "zoo_profile", "zoo_fingerprint", "swap_in", "ZOOS", "CODE_PATHS"]

#: Modules that only read records and draw them, or check parameters (whose values the provenance
#: holds itself): not part of a chapter's engine fingerprint.
PRESENTATION = frozenset(f"pactlib/book/{m}.py" for m in ("plotting", "report", "verdicts", "records", "params",
                                                           "chapters", "speed", "paths", "provenance", "site"))
#: The provenance file of a chapter's records folder.
FILE = "provenance.json"
#: The lock file whose hash is part of the engine.
LOCK = "requirements.lock"


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function removed (in place)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def sha(data: bytes) -> str:
    """The sha256 of ``data``, in hex: every hash of a provenance and of the runner's keys."""
    return hashlib.sha256(data).hexdigest()


def ast_hash(path: str | os.PathLike) -> str:
    """sha256 of the code of a Python file: ``ast.dump`` of its tree without docstrings.

    Raises:
        SyntaxError: the file does not parse. OSError: it cannot be read.
    """
    path = Path(path)
    return sha(ast.dump(strip_docstrings(ast.parse(path.read_text(encoding="utf-8"), str(path)))).encode())


#: Non-Python sources an engine package compiles at run time (pactlib/native's C file): part of
#: the engine whenever the package is imported, hashed byte for byte (:func:`code_hash`).
COMPILED_SUFFIXES = (".c", ".h")


def code_hash(path: str | os.PathLike) -> str:
    """:func:`ast_hash` of a Python file; the sha256 of the bytes of any other source (a C file
    the engine compiles, :data:`COMPILED_SUFFIXES`).

    Raises:
        SyntaxError: a Python file does not parse. OSError: the file cannot be read.
    """
    path = Path(path)
    return ast_hash(path) if path.suffix == ".py" else sha(path.read_bytes())


def module_file(name: str, root: Path) -> str | None:
    """The repository path (``pactlib/merges/iso.py``) of module ``name`` under ``root``, or None
    when it has no source file there."""
    base = root.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand.relative_to(root).as_posix()
    return None


def engine_modules(names: Iterable[str], root: str | os.PathLike) -> dict[str, str]:
    """``{repository path: ast_hash}`` of the ``pactlib`` modules among ``names`` (e.g. the keys
    of a kernel's ``sys.modules``), presentation modules (:data:`PRESENTATION`) left out, and the
    C sources in the folder of each package among them (:func:`code_hash`)."""
    root = Path(root)
    out = {}
    for name in names:
        if name != "pactlib" and not name.startswith("pactlib."):
            continue
        rel = module_file(name, root)
        if rel is not None and rel not in PRESENTATION:
            out[rel] = ast_hash(root / rel)
            if rel.endswith("/__init__.py"):  # a package's compiled sources (pactlib/native/ties.c)
                for src in sorted((root / rel).parent.iterdir()):
                    if src.suffix in COMPILED_SUFFIXES and src.is_file():
                        out[src.relative_to(root).as_posix()] = code_hash(src)
    return dict(sorted(out.items()))


def fingerprint(modules: Mapping[str, str], lock: str | None) -> str:
    """sha256 over the sorted ``(path, hash)`` pairs of ``modules`` and the lock hash."""
    rows = [f"{p}\0{h}" for p, h in sorted(modules.items())] + [f"{LOCK}\0{lock or ''}"]
    return sha("\n".join(rows).encode())


def _lock_hash(root: Path) -> str | None:
    lock = root / LOCK
    return sha(lock.read_bytes()) if lock.is_file() else None


def engine(names: Iterable[str], root: str | os.PathLike) -> dict[str, Any]:
    """The ``engine`` entry of a provenance: ``{"fingerprint", "modules", "lock"}``."""
    root = Path(root)
    modules = engine_modules(names, root)
    lock = _lock_hash(root)
    return {"fingerprint": fingerprint(modules, lock), "modules": modules, "lock": lock}


def _code_text(source: str) -> str:
    """A cell's code as a canonical string: its AST dump, after IPython's syntax (``!cmd``,
    ``%magic``) is turned into Python; the source without comment lines when it does not parse."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except ImportError:  # no IPython: plain Python cells still parse
        pass
    try:
        return ast.dump(ast.parse(source))
    except SyntaxError:
        return "\n".join(line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def notebook_hash(sources: Sequence[str]) -> str:
    """sha256 of the code of a chapter's compute cells (``sources``, in order): comments and
    blank lines are not part of it."""
    return sha("\n\0".join(_code_text(s) for s in sources).encode())


def seeds_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """The seed-valued parameters (a name ``seed``, ``seeds`` or ending in ``_seed(s)``)."""
    return {k: v for k, v in sorted(params.items()) if k in ("seed", "seeds") or k.endswith(("_seed", "_seeds"))}


def write(folder: str | os.PathLike, prov: Mapping[str, Any]) -> Path:
    """Write ``prov`` as ``folder/provenance.json`` (sorted keys, indent 1), atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return write_atomic(folder / FILE, json.dumps(prov, sort_keys=True, indent=1, default=str) + "\n")


def read(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The provenance of a records folder, or None when it has none.

    Raises:
        ValueError: the file is not a JSON object (the message names it).
    """
    return read_json_object(Path(folder) / FILE)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def staleness(folder: str | os.PathLike, params: Mapping[str, Any], notebook: str, *,
              root: str | os.PathLike, testbeds: Mapping[str, str] | None = None) -> list[str]:
    """Why the records in ``folder`` are not current, in words; ``[]`` when they are.

    Args:
        folder: ``book/records/<set>/<run>/<chapter>``.
        params: the chapter's final parameters now (compared as JSON).
        notebook: :func:`notebook_hash` of the chapter's compute cells now.
        root: the repository root (engine module paths are relative to it).
        testbeds: ``{name: hash}`` of the testbeds the parameters name now (None: not compared).

    Returns:
        e.g. ``["parameters differ: seeds [0, 1, 2] -> [0]", "engine changed: pactlib/merges/iso.py"]``,
        or ``["missing: no records in book/records/..."]`` when ``folder`` has no provenance.
    """
    root = Path(root)
    try:
        prov = read(folder)
    except ValueError as exc:
        return [f"unreadable provenance: {exc}"]
    if prov is None:
        where = Path(folder)
        where = where.relative_to(root) if where.is_absolute() and where.is_relative_to(root) else where
        return [f"missing: no records in {where.as_posix()}"]
    reasons = []
    old, new = _plain(prov.get("params", {})), _plain(dict(params))
    diff = [f"{k} {_short(old[k]) if k in old else '(unset)'} -> {_short(new[k]) if k in new else '(unset)'}"
            for k in sorted(set(old) | set(new)) if old.get(k, "\0") != new.get(k, "\0")]
    if diff:
        reasons.append("parameters differ: " + "; ".join(diff))
    if prov.get("notebook") != notebook:
        reasons.append("notebook's compute cells changed")
    eng = prov.get("engine") or {}
    changed = []
    for rel, h in sorted((eng.get("modules") or {}).items()):
        path = root / rel
        try:
            now = code_hash(path) if path.is_file() else None
        except SyntaxError:
            now = "unparsable"
        if now != h:
            changed.append(rel if now is not None else f"{rel} (removed)")
    if changed:
        reasons.append("engine changed: " + ", ".join(changed))
    if eng.get("lock") != _lock_hash(root):
        reasons.append(f"{LOCK} changed")
    if testbeds is not None and "testbeds" in prov:
        tb_old = prov.get("testbeds") or {}
        moved = sorted(n for n in set(tb_old) | set(testbeds) if tb_old.get(n) != testbeds.get(n))
        if moved:
            reasons.append("testbeds changed: " + ", ".join(moved))
    return reasons


def state(reasons: Sequence[str]) -> str:
    """``"current"``, ``"missing"`` or ``"stale"`` for the reasons :func:`staleness` gave."""
    if not reasons:
        return "current"
    return "missing" if reasons[0].startswith("missing:") else "stale"


#: What makes records (:func:`git_state`): the engine, the chapters, their parameters, the runner
#: and the lock. Records, data and the built book are outputs, not code.
CODE_PATHS = ("pactlib", "notebooks", "params", "scripts", "requirements.lock", "requirements.txt", "pyproject.toml")


def git_state(root: str | os.PathLike) -> str:
    """The commit of ``HEAD`` in ``root``, with ``-dirty`` when the code that makes records
    (:data:`CODE_PATHS`: a tracked file changed, or a new file there) differs from it; records
    being written by the same run do not count. ``unknown`` without git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        if not head:
            return "unknown"
        return head + ("-dirty" if git("status", "--porcelain", "--", *CODE_PATHS) else "")
    except OSError:
        return "unknown"


def machine(cores: int) -> dict[str, Any]:
    """The provenance's ``machine``: CPU model, the ``cores`` the run could use, torch and Python."""
    import torch

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": cores, "torch": torch.__version__, "python": platform.python_version()}


#: The zoos whose training records the Verdicts page profiles: testbed -> folder under the cache.
ZOOS = {"lite0": "zoo", "minilm": "zoo-minilm"}


def zoo_profile(cache: str | os.PathLike) -> dict[str, dict]:
    """Per zoo built under ``cache`` (:data:`ZOOS`), the number of models and the summed wall
    minutes of their training (each model's JSON record: ``kind``, ``seconds``), by kind:
    ``{"lite0": {"kinds": {"full": {"models": 4, "minutes": 6.0}}}}``; {} when none is built."""
    out: dict[str, dict] = {}
    for testbed, folder in ZOOS.items():
        kinds: dict[str, dict] = {}
        for f in sorted((Path(cache) / folder).rglob("*.json")):
            rec = None if "run_memo" in f.parts else read_json_object(f)  # run_memo: merges, not models
            if rec and isinstance(rec.get("seconds"), (int, float)) and isinstance(rec.get("kind"), str):
                k = kinds.setdefault(rec["kind"], {"models": 0, "minutes": 0.0})
                k["models"] += 1
                k["minutes"] = round(k["minutes"] + rec["seconds"] / 60, 2)
        if kinds:
            out[testbed] = {"kinds": kinds}
    return out


def zoo_fingerprint(cache: str | os.PathLike, family: str) -> str | None:
    """sha256 of what a family's zoo under ``cache`` (:data:`ZOOS`) holds: every run's key with its
    checkpoint's and head's sha256 from the zoo's ``manifest.json`` (timings left out), so two
    builds that wrote the same bytes have the same fingerprint; None without a manifest."""
    folder = ZOOS.get(family)
    man = read_json_object(Path(cache) / folder / "manifest.json") if folder else None
    if not man or not isinstance(man.get("entries"), dict):
        return None
    runs = sorted((k, v.get("sha256"), v.get("head_sha256")) for k, v in man["entries"].items() if isinstance(v, dict))
    pre = (man.get("pretrained") or {}).get("sha256") if isinstance(man.get("pretrained"), dict) else None
    return sha(json.dumps([pre, runs]).encode())


def swap_in(staging: str | os.PathLike, final: str | os.PathLike) -> None:
    """Replace the folder ``final`` by ``staging`` (two renames: the old folder is moved aside,
    then removed); ``final`` holds either the old or the new records at every moment a reader
    can see, never a mix."""
    final = Path(final)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
