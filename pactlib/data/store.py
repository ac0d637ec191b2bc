"""The on-disk task cache: one ``.pt`` file per (task, seed) plus a JSON sidecar and a manifest.

Layout of the cache folder (``cache_dir``, else ``$PACT_CACHE/data``, else the per-user cache's
``data/``: :func:`pactlib.paths.cache_dir`)::

    <task>-seed<seed>.pt      torch.save({"train": {"images", "labels"}, "val": ..., "test": ...});
                              grayscale tasks store images as (N, 1, 32, 32), expanded on load
    <task>-seed<seed>.json    sidecar: spec, counts, build notes, sha256 of the .pt file
    manifest.json             every prepared task, rebuilt from the sidecars after each prepare

Non-default sizes add ``-tv<max_trainval>-te<max_test>`` to the stem. Both files are written
atomically (temporary file in the same folder, then ``os.replace``), the ``.pt`` first, so a
sidecar never describes a partial file. :func:`load_task` checks the sha256 before reading; a
corrupt, partial or outdated file is rebuilt (with a warning), never silently used.
"""
from __future__ import annotations

import dataclasses
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

from .splits import SPLITS
from .suites import resolve
from .tasks import DEFAULT_MAX_TEST, DEFAULT_MAX_TRAINVAL, TASKS, build_task

__all__ = ["TaskData", "CacheError", "FORMAT", "cache_root", "task_path", "prepare", "load_task",
           "read_verified", "write_manifest"]

# Bump when the builders change what they produce (tests/test_data.py pins golden digests that
# flag such a change); cached files of another format are then rebuilt.
FORMAT = 1


class CacheError(RuntimeError):
    """A cached task file is missing its sidecar, has the wrong checksum or format."""


@dataclass(frozen=True)
class TaskData:
    """One split of one task, ready for a model.

    Attributes:
        images: uint8 ``(N, 3, 32, 32)`` RGB (normalise with mean = std = 0.5 after ``/255``).
        labels: int64 ``(N,)`` in ``0 .. len(classes) - 1``.
        classes: class names, ``classes[label]``.
        task: task name. split: ``"train"``, ``"val"`` or ``"test"``.
    """
    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    task: str
    split: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$PACT_CACHE/data``, else ``$XDG_CACHE_HOME/pactlib/data``
    (``~/.cache/pactlib/data``): :func:`pactlib.paths.cache_dir`."""
    if cache_dir is not None:
        return Path(cache_dir)
    return _cache_dir("data")


def task_path(name: str, seed: int = 0, *, cache_dir=None, max_trainval: int = DEFAULT_MAX_TRAINVAL,
              max_test: int = DEFAULT_MAX_TEST) -> Path:
    """Path of the ``.pt`` file of ``(name, seed)``; its sidecar has suffix ``.json``."""
    stem = f"{name}-seed{int(seed)}"
    if (max_trainval, max_test) != (DEFAULT_MAX_TRAINVAL, DEFAULT_MAX_TEST):
        stem += f"-tv{int(max_trainval)}-te{int(max_test)}"
    return cache_root(cache_dir) / f"{stem}.pt"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _serialise(arrays) -> bytes:
    """Grayscale tasks (all three channels equal everywhere) are stored with one channel."""
    import io
    gray = all((x == x[:, :1]).all() for x, _ in arrays.values())
    payload = {s: {"images": torch.from_numpy(x[:, :1].copy() if gray else x),
                   "labels": torch.from_numpy(y)} for s, (x, y) in arrays.items()}
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def _build_and_write(name: str, seed: int, path: Path, max_trainval: int, max_test: int) -> dict:
    t0 = time.perf_counter()
    arrays, notes = build_task(name, seed, max_trainval=max_trainval, max_test=max_test)
    blob = _serialise(arrays)
    spec = TASKS[name]
    sidecar = {
        "format": FORMAT, "task": name, "seed": int(seed), "file": path.name,
        "sha256": _sha256(blob), "bytes": len(blob),
        "max_trainval": max_trainval, "max_test": max_test,
        "counts": {s: int(len(arrays[s][1])) for s in SPLITS},
        "class_counts": {s: torch.bincount(torch.from_numpy(arrays[s][1]),
                                           minlength=len(spec.classes)).tolist() for s in SPLITS},
        "image_format": "uint8 (N, 3, 32, 32) RGB (stored (N, 1, 32, 32) when grayscale)",
        **dataclasses.asdict(spec),
        "build": notes, "build_seconds": round(time.perf_counter() - t0, 3),
        "versions": _versions(),
    }
    write_atomic(path, blob, sync=True)
    write_atomic(path.with_suffix(".json"), json.dumps(sidecar, indent=1, ensure_ascii=False), sync=True)
    return sidecar


def _versions() -> dict[str, str]:
    import PIL
    import matplotlib
    import numpy
    return {"torch": torch.__version__.split("+")[0], "numpy": numpy.__version__,
            "pillow": PIL.__version__, "matplotlib": matplotlib.__version__}


def read_verified(path: str | os.PathLike) -> tuple[dict, dict]:
    """Read a cached ``.pt`` file after checking it against its sidecar.

    Returns:
        ``(payload, sidecar)`` where ``payload[split] = {"images": uint8 tensor, "labels":
        int64 tensor}``.

    Raises:
        FileNotFoundError: the ``.pt`` file does not exist.
        CacheError: no/unreadable sidecar, other format version, or sha256 mismatch (names the
            file and both digests).
    """
    path = Path(path)
    blob = path.read_bytes()
    side_path = path.with_suffix(".json")
    try:
        sidecar = json.loads(side_path.read_text())
    except (OSError, ValueError) as e:
        raise CacheError(f"{path}: sidecar {side_path.name} missing or unreadable ({e})") from e
    if sidecar.get("format") != FORMAT:
        raise CacheError(f"{path}: cache format {sidecar.get('format')} != current {FORMAT}")
    digest = _sha256(blob)
    if digest != sidecar.get("sha256"):
        raise CacheError(f"{path}: sha256 {digest} does not match sidecar {sidecar.get('sha256')} "
                         "(corrupt or partial file)")
    import io
    payload = torch.load(io.BytesIO(blob), weights_only=True)
    return payload, sidecar


def _ensure(name: str, seed: int, cache_dir, max_trainval: int, max_test: int,
            force: bool = False) -> tuple[Path, dict | None]:
    """Make sure a valid file exists; return ``(path, payload)``, payload ``None`` if just built."""
    path = task_path(name, seed, cache_dir=cache_dir, max_trainval=max_trainval, max_test=max_test)
    if not force and path.exists():
        try:
            return path, read_verified(path)[0]
        except CacheError as e:
            warnings.warn(f"rebuilding {name} (seed {seed}): {e}", RuntimeWarning, stacklevel=3)
    _build_and_write(name, seed, path, max_trainval, max_test)
    return path, None


def prepare(tasks_or_suite: str | Iterable[str], *, cache_dir=None, seed: int | Iterable[int] = 0,
            progress: bool = True, max_trainval: int = DEFAULT_MAX_TRAINVAL,
            max_test: int = DEFAULT_MAX_TEST, force: bool = False) -> list[Path]:
    """Build and cache tasks (skipping valid cached ones), then rewrite ``manifest.json``.

    Args:
        tasks_or_suite: a suite name (``"8"``, ``"14"``, ``"20"``), one task name, or an
            iterable of task names.
        cache_dir: cache folder (see :func:`cache_root`).
        seed: one seed or several; each (task, seed) is one file.
        progress: show a tqdm bar.
        max_trainval, max_test: size caps (defaults 5,000 / 1,000).
        force: rebuild even when a valid file exists.

    Returns:
        The ``.pt`` paths, in task-then-seed order.

    Raises:
        KeyError: unknown suite or task (lists the known ones).
        SourceMissingError: a raw source is not installed (says what to install).
    """
    from tqdm.auto import tqdm

    names = resolve(tasks_or_suite)
    seeds = [int(seed)] if isinstance(seed, int) else [int(s) for s in seed]
    jobs = [(n, s) for n in names for s in seeds]
    paths = []
    bar = tqdm(jobs, desc="prepare tasks", unit="task", disable=not progress)
    for name, s in bar:
        bar.set_postfix_str(f"{name} seed {s}")
        paths.append(_ensure(name, s, cache_dir, max_trainval, max_test, force)[0])
    write_manifest(cache_dir)
    return paths


def load_task(name: str, split: str, *, cache_dir=None, seed: int = 0, limit: int | None = None,
              max_trainval: int = DEFAULT_MAX_TRAINVAL, max_test: int = DEFAULT_MAX_TEST) -> TaskData:
    """Load one split of one task, building and caching it first if needed.

    Args:
        name: task name (see ``TASKS``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        cache_dir, seed, max_trainval, max_test: select the cached file (see :func:`prepare`).
        limit: keep only the first ``limit`` examples (deterministic; stored order interleaves
            classes, so a prefix is close to class-balanced).

    Raises:
        KeyError: unknown task. ValueError: unknown split or negative ``limit``.
        SourceMissingError: the file must be built and a raw source is missing.
    """
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for task {name!r}; expected one of {SPLITS}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path, payload = _ensure(name, seed, cache_dir, max_trainval, max_test)
    if payload is None:  # built just now
        write_manifest(cache_dir)
        payload = read_verified(path)[0]
    part = payload[split]
    images, labels = part["images"], part["labels"]
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    if images.shape[1] == 1:  # stored as grayscale
        images = images.expand(-1, 3, -1, -1).contiguous()
    return TaskData(images=images, labels=labels, classes=TASKS[name].classes, task=name, split=split)


def write_manifest(cache_dir=None) -> Path:
    """Rewrite ``<cache>/manifest.json`` from every sidecar in the folder (atomic).

    The manifest maps each file name to its sidecar minus the bulky build notes, plus the
    suites; the book reads it to list the tasks.
    """
    from .suites import SUITES

    root = cache_root(cache_dir)
    entries = {}
    for side in sorted(root.glob("*.json")):
        if side.name == "manifest.json":
            continue
        try:
            info = json.loads(side.read_text())
        except ValueError:
            continue
        if info.get("format") != FORMAT or not side.with_suffix(".pt").exists():
            continue
        # build notes and timings stay in the sidecar: the manifest changes only with content
        entries[info["file"]] = {k: v for k, v in info.items() if k not in ("build", "build_seconds")}
    manifest = {"format": FORMAT, "suites": {k: list(v) for k, v in SUITES.items()},
                "files": entries}
    path = root / "manifest.json"
    write_atomic(path, json.dumps(manifest, indent=1, ensure_ascii=False), sync=True)
    return path
