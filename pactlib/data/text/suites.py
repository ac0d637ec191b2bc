"""Nested text-task suites of the MiniLM testbed: ``"8"`` ⊂ ``"14"``.

Suite 8 holds eight distinct kinds of label on six sources: e-mail spam, movie-review sentiment
and subjectivity, fortune topics, language identification, WordNet noun and verb supersenses
and political party. Suite 14 adds six more: debate speaker, UDHR language identification
(10 other languages), Roget thesaurus category, moral foundation and sentiment of single words,
and the part of speech of a dictionary definition (the one derived task). There is no 20-task
suite yet: the candidates left (easy vs hard ham, moderator vs candidate, adjective classes,
groupings of supersenses, more fortune topics) are derived or near-copies of tasks already here.
The order inside a suite is fixed and is the order results are reported in.
"""
from __future__ import annotations

from collections.abc import Iterable

from .tasks import TEXT_TASKS

__all__ = ["TEXT_SUITES", "text_suite_tasks", "resolve"]

_CORE = ("spam", "movie_sentiment", "subjectivity", "fortune_topic", "language", "noun_supersense",
         "verb_supersense", "party")
_MORE = ("debate_speaker", "udhr_language", "roget_category", "moral_foundation", "word_sentiment", "gloss_pos")

TEXT_SUITES: dict[str, tuple[str, ...]] = {"8": _CORE, "14": _CORE + _MORE}


def text_suite_tasks(suite: str) -> tuple[str, ...]:
    """Task names of a text suite, in reporting order. Raises KeyError for an unknown suite."""
    key = str(suite)
    if key not in TEXT_SUITES:
        raise KeyError(f"unknown text suite {suite!r}; known: {sorted(TEXT_SUITES, key=int)}")
    return TEXT_SUITES[key]


def resolve(tasks_or_suite: str | Iterable[str]) -> tuple[str, ...]:
    """A suite name, a task name or task names -> tuple of task names. Raises KeyError (lists both)."""
    if isinstance(tasks_or_suite, (str, int)):
        key = str(tasks_or_suite)
        if key in TEXT_SUITES:
            return TEXT_SUITES[key]
        names: Iterable[str] = (key,)
    else:
        names = tasks_or_suite
    out = tuple(names)
    unknown = [n for n in out if n not in TEXT_TASKS]
    if unknown:
        raise KeyError(f"unknown text task or suite {unknown}; suites: {sorted(TEXT_SUITES, key=int)}, "
                       f"tasks: {sorted(TEXT_TASKS)}")
    return out
