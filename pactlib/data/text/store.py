"""The on-disk cache of the text tasks: one gzip'd JSON file per (task, seed), a sidecar and a manifest.

Layout of the cache folder (``cache_dir``, else ``$PACT_CACHE/data/text``, else the per-user
cache's ``data/text/``: :func:`pactlib.paths.cache_dir`)::

    <task>-seed<seed>.json.gz   {"train": {"texts": [...], "labels": [...]}, "val": ..., "test": ...}
    <task>-seed<seed>.json      sidecar: spec (classes, prompts, provenance, licence), counts, build
                                notes, sha256 of the .json.gz file
    manifest.json               every prepared task and the provenance table, rebuilt after each prepare

Non-default caps add ``-cap<train>-<val>-<test>`` to the stem. Both files are written atomically
(:func:`pactlib.io.write_atomic`), the data first, so a sidecar never describes a partial file;
:func:`load_text_task` checks the sha256 before reading, and a corrupt, partial or outdated file
is rebuilt (with a warning), never used. The gzip stream has no timestamp, so the same task and
seed give the same bytes.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from pactlib.io import write_atomic
from pactlib.paths import cache_dir as _cache_dir

from ..splits import SPLITS
from .suites import TEXT_SUITES, resolve
from .tasks import DEFAULT_CAPS, MAX_WORDS, TEST_FRACTION, TEXT_TASKS, VAL_FRACTION, build_text_task

__all__ = ["TextData", "TextCacheError", "FORMAT", "text_cache_root", "text_task_path", "prepare_text",
           "load_text_task", "provenance_table", "write_text_manifest"]

# Bump when the builders change what they produce; cached files of another format are rebuilt.
FORMAT = 1


class TextCacheError(RuntimeError):
    """A cached text task file is missing its sidecar, has the wrong checksum or format."""


@dataclass(frozen=True)
class TextData:
    """One split of one text task.

    Attributes:
        texts: the examples (cleaned, at most ``MAX_WORDS`` words each).
        labels: int64 ``(N,)`` in ``0 .. len(classes) - 1``.
        classes: class names, ``classes[label]``; ``prompts``: one description per class.
        task, split: names.
    """
    texts: tuple[str, ...]
    labels: torch.Tensor
    classes: tuple[str, ...]
    prompts: tuple[str, ...]
    task: str
    split: str

    def __len__(self) -> int:
        return len(self.texts)


def text_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$PACT_CACHE/data/text`` (:func:`pactlib.paths.cache_dir`)."""
    return Path(cache_dir) if cache_dir is not None else _cache_dir("data", "text")


def text_task_path(name: str, seed: int = 0, *, cache_dir=None, caps: dict | None = None) -> Path:
    """Path of the ``.json.gz`` file of ``(name, seed)``; its sidecar is ``<stem>.json``."""
    caps = {**DEFAULT_CAPS, **(caps or {})}
    stem = f"{name}-seed{int(seed)}"
    if caps != DEFAULT_CAPS:
        stem += "-cap" + "-".join(str(int(caps[s])) for s in SPLITS)
    return text_cache_root(cache_dir) / f"{stem}.json.gz"


def _sidecar_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(".json.gz")] + ".json")


def _serialise(splits) -> bytes:
    payload = {s: {"texts": list(t), "labels": [int(v) for v in y]} for s, (t, y) in splits.items()}
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return gzip.compress(raw, mtime=0)


def _build_and_write(name: str, seed: int, path: Path, caps: dict) -> dict:
    t0 = time.perf_counter()
    splits, notes = build_text_task(name, seed, caps=caps)
    blob = _serialise(splits)
    spec = TEXT_TASKS[name]
    sidecar = {
        "format": FORMAT, "task": name, "seed": int(seed), "file": path.name,
        "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), "caps": caps,
        "max_words": MAX_WORDS, "test_fraction": TEST_FRACTION, "val_fraction": VAL_FRACTION,
        "counts": {s: len(splits[s][0]) for s in SPLITS},
        "class_counts": {s: [int((splits[s][1] == c).sum()) for c in range(len(spec.classes))] for s in SPLITS},
        **dataclasses.asdict(spec),
        "build": notes, "build_seconds": round(time.perf_counter() - t0, 3),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, blob)
    side = json.dumps(sidecar, indent=1, ensure_ascii=False)
    write_atomic(_sidecar_path(path), side)
    return sidecar


def read_verified(path: str | os.PathLike) -> tuple[dict, dict]:
    """Read a cached text task after checking it against its sidecar: ``(payload, sidecar)``.

    Raises:
        FileNotFoundError: no file. TextCacheError: no/unreadable sidecar, other format, sha256 mismatch.
    """
    path = Path(path)
    blob = path.read_bytes()
    side = _sidecar_path(path)
    try:
        sidecar = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TextCacheError(f"{path}: sidecar {side.name} missing or unreadable ({e})") from e
    if sidecar.get("format") != FORMAT:
        raise TextCacheError(f"{path}: cache format {sidecar.get('format')} != current {FORMAT}")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != sidecar.get("sha256"):
        raise TextCacheError(f"{path}: sha256 {digest} does not match sidecar {sidecar.get('sha256')} "
                             "(corrupt or partial file)")
    return json.loads(gzip.decompress(blob)), sidecar


def _ensure(name: str, seed: int, cache_dir, caps: dict | None, force: bool = False) -> tuple[Path, dict | None]:
    path = text_task_path(name, seed, cache_dir=cache_dir, caps=caps)
    if not force and path.exists():
        try:
            return path, read_verified(path)[0]
        except (TextCacheError, ValueError, OSError) as e:
            warnings.warn(f"rebuilding text task {name} (seed {seed}): {e}", RuntimeWarning, stacklevel=3)
    _build_and_write(name, seed, path, {**DEFAULT_CAPS, **(caps or {})})
    return path, None


def prepare_text(tasks_or_suite: str | Iterable[str], *, cache_dir=None, seed: int | Iterable[int] = 0,
                 caps: dict | None = None, progress: bool = True, force: bool = False) -> list[Path]:
    """Build and cache text tasks (valid cached files are kept), then rewrite ``manifest.json``.

    Args:
        tasks_or_suite: a suite of :data:`~pactlib.data.text.suites.TEXT_SUITES`, a task name or names.
        seed: one split seed or several; caps: ``{split: max examples}`` over the defaults.
        force: rebuild even valid files.

    Returns:
        The ``.json.gz`` paths, task-then-seed order.

    Raises:
        KeyError: unknown suite or task. SourceMissingError: a raw source is not installed.
    """
    from tqdm.auto import tqdm

    names = resolve(tasks_or_suite)
    seeds = [int(seed)] if isinstance(seed, int) else [int(s) for s in seed]
    paths = []
    bar = tqdm([(n, s) for n in names for s in seeds], desc="prepare text tasks", unit="task", disable=not progress)
    for name, s in bar:
        bar.set_postfix_str(f"{name} seed {s}")
        paths.append(_ensure(name, s, cache_dir, caps, force)[0])
    write_text_manifest(cache_dir)
    return paths


def load_text_task(name: str, split: str, *, cache_dir=None, seed: int = 0, limit: int | None = None,
                   caps: dict | None = None) -> TextData:
    """One split of one text task, built and cached first if needed; ``limit`` keeps a prefix
    (stored class-interleaved, so a prefix is close to balanced).

    Raises:
        KeyError: unknown task. ValueError: unknown split or negative limit. SourceMissingError.
    """
    if name not in TEXT_TASKS:
        raise KeyError(f"unknown text task {name!r}; known: {sorted(TEXT_TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for text task {name!r}; expected one of {SPLITS}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path, payload = _ensure(name, seed, cache_dir, caps)
    if payload is None:
        write_text_manifest(cache_dir)
        payload = read_verified(path)[0]
    part = payload[split]
    texts, labels = part["texts"], part["labels"]
    if limit is not None:
        texts, labels = texts[:limit], labels[:limit]
    spec = TEXT_TASKS[name]
    return TextData(tuple(texts), torch.tensor(labels, dtype=torch.int64), spec.classes, spec.prompts, name, split)


def provenance_table(tasks: Iterable[str] | None = None) -> list[dict]:
    """One row per text task (in suite order): name, classes, unit, source, real/derived,
    description, provenance, licence and the suites it is in: the table the book prints."""
    names = list(tasks) if tasks is not None else list(TEXT_TASKS)
    rows = []
    for n in names:
        s = TEXT_TASKS[n]
        rows.append({"task": n, "classes": len(s.classes), "class_names": list(s.classes), "unit": s.unit,
                     "source": s.source, "derived": s.derived, "description": s.description,
                     "provenance": s.provenance, "license": s.license,
                     "suites": [k for k, v in TEXT_SUITES.items() if n in v]})
    return rows


def write_text_manifest(cache_dir=None) -> Path:
    """Rewrite ``<cache>/manifest.json`` from every sidecar (atomic): files (sidecars minus build
    notes), suites and the provenance table."""
    root = text_cache_root(cache_dir)
    entries = {}
    for side in sorted(root.glob("*-seed*.json")):
        try:
            info = json.loads(side.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if info.get("format") != FORMAT or not (root / info.get("file", "")).exists():
            continue
        entries[info["file"]] = {k: v for k, v in info.items() if k not in ("build", "build_seconds")}
    manifest = {"format": FORMAT, "suites": {k: list(v) for k, v in TEXT_SUITES.items()},
                "provenance": provenance_table(), "files": entries}
    path = root / "manifest.json"
    root.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, indent=1, ensure_ascii=False)
    write_atomic(path, text)
    return path
