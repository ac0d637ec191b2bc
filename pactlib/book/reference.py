"""Published paper-scale numbers: read ``book/reference_numbers.yaml``, check it, tabulate it.

The numbers are other people's (their CLIP ViT checkpoints, their datasets); the book shows
them in tables of their own, apart from anything it measured. Every number carries its source
id; every caveat names the sources it qualifies::

    ref = load_reference()                                   # $PACT_BOOK_DIR/reference_numbers.yaml
    reference_table(ref, source="tsv", model="ViT-B/32")     # methods x task counts, "abs (norm)"
    consistency(ref)                                         # abs / norm against fine-tuned means

Book: chapter 12 ("At paper scale").
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

__all__ = ["DEFAULT_NAME", "ReferenceError", "Reference", "default_path", "load_reference", "numbers_frame",
           "reference_table", "caveats_for", "consistency"]

#: The data file shipped with the book, relative to the book folder (:func:`pactlib.book.paths.book_dir`).
DEFAULT_NAME = "reference_numbers.yaml"
TASK_COUNTS = (8, 14, 20)
_NUMBER_FIELDS = {"source", "model", "tasks", "method", "abs", "norm", "alpha", "note"}
_CAVEAT_FIELDS = {"id", "title", "text", "applies_to"}


class ReferenceError(ValueError):
    """The reference-numbers file is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class Reference:
    """The checked content of a reference-numbers file.

    Attributes:
        sources: ``{source id: {"name", "what", "selection"}}``.
        numbers: one dict per published number: source, model, tasks (int), method, abs and
            norm (percent or None), alpha (or None), note (or "").
        claims: ``[{"source", "text"}]``, statements without a number.
        caveats: ``[{"id", "title", "text", "applies_to": [source ids]}]``.
        path: the file read.
    """

    sources: dict[str, dict[str, str]]
    numbers: list[dict[str, Any]]
    claims: list[dict[str, str]] = field(default_factory=list)
    caveats: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None


def _percent(value: Any, where: str, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= 100:
        raise ReferenceError(f"{where}: {name} must be a percentage in [0, 100] or null, got {value!r}")
    return float(value)


def _check_number(i: int, raw: Any, sources: Mapping[str, Any], where: str) -> dict[str, Any]:
    here = f"{where}: numbers[{i}]"
    if not isinstance(raw, Mapping):
        raise ReferenceError(f"{here}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _NUMBER_FIELDS
    if unknown:
        raise ReferenceError(f"{here}: unknown field(s) {sorted(unknown)}; known: {sorted(_NUMBER_FIELDS)}")
    for name in ("source", "model", "tasks", "method"):
        if name not in raw:
            raise ReferenceError(f"{here}: missing field {name!r}")
    if raw["source"] not in sources:
        raise ReferenceError(f"{here}: unknown source {raw['source']!r}; sources: {sorted(sources)}")
    if raw["tasks"] not in TASK_COUNTS:
        raise ReferenceError(f"{here}: tasks must be one of {TASK_COUNTS}, got {raw['tasks']!r}")
    abs_, norm = _percent(raw.get("abs"), here, "abs"), _percent(raw.get("norm"), here, "norm")
    if abs_ is None and norm is None:
        raise ReferenceError(f"{here}: give abs and/or norm (both are null)")
    alpha = raw.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0):
        raise ReferenceError(f"{here}: alpha must be a positive number or absent, got {alpha!r}")
    return {"source": str(raw["source"]), "model": str(raw["model"]), "tasks": int(raw["tasks"]),
            "method": str(raw["method"]), "abs": abs_, "norm": norm,
            "alpha": None if alpha is None else float(alpha), "note": str(raw.get("note") or "")}


def _check_caveat(i: int, raw: Any, sources: Mapping[str, Any], where: str) -> dict[str, Any]:
    here = f"{where}: caveats[{i}]"
    if not isinstance(raw, Mapping):
        raise ReferenceError(f"{here}: expected a mapping, got {type(raw).__name__}")
    missing = _CAVEAT_FIELDS - set(raw)
    if missing:
        raise ReferenceError(f"{here}: missing field(s) {sorted(missing)}")
    bad = [s for s in raw["applies_to"] if s not in sources]
    if bad:
        raise ReferenceError(f"{here} ({raw['id']}): applies_to names unknown source(s) {bad}; "
                             f"sources: {sorted(sources)}")
    return {"id": str(raw["id"]), "title": str(raw["title"]), "text": " ".join(str(raw["text"]).split()),
            "applies_to": list(raw["applies_to"])}


def default_path() -> Path:
    """The book's reference-numbers file, ``$PACT_BOOK_DIR/reference_numbers.yaml`` (else
    ``./book/...``: :func:`pactlib.book.paths.book_dir`); not checked."""
    from pactlib.book.paths import book_path

    return book_path(DEFAULT_NAME, must_exist=False)


def load_reference(path: str | Path | None = None) -> Reference:
    """Read and check a reference-numbers file (default: :func:`default_path`).

    Raises:
        FileNotFoundError: the file does not exist (named; the default one also names
            ``$PACT_BOOK_DIR``).
        ReferenceError: not valid YAML, a missing section, an entry with a missing or unknown
            field, an unknown source id, a task count not in (8, 14, 20), a percentage outside
            [0, 100], a duplicate (source, model, tasks, method), or a duplicate caveat id.
    """
    if path is None:
        from pactlib.book.paths import book_path

        path = book_path(DEFAULT_NAME)  # raises naming the path and $PACT_BOOK_DIR
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference numbers not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ReferenceError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ReferenceError(f"{path}: expected a mapping with sources / numbers / caveats")
    for section in ("sources", "numbers"):
        if not data.get(section):
            raise ReferenceError(f"{path}: missing or empty section {section!r}")
    sources = {str(k): dict(v or {}) for k, v in data["sources"].items()}
    numbers = [_check_number(i, n, sources, str(path)) for i, n in enumerate(data["numbers"])]
    seen: set[tuple] = set()
    for i, n in enumerate(numbers):
        key = (n["source"], n["model"], n["tasks"], n["method"])
        if key in seen:
            raise ReferenceError(f"{path}: numbers[{i}] repeats {key}")
        seen.add(key)
    caveats = [_check_caveat(i, c, sources, str(path)) for i, c in enumerate(data.get("caveats") or [])]
    ids = [c["id"] for c in caveats]
    if len(ids) != len(set(ids)):
        raise ReferenceError(f"{path}: duplicate caveat id(s) {sorted({x for x in ids if ids.count(x) > 1})}")
    claims = [{"source": str(c["source"]), "text": " ".join(str(c["text"]).split())}
              for c in data.get("claims") or []]
    bad = [c["source"] for c in claims if c["source"] not in sources]
    if bad:
        raise ReferenceError(f"{path}: claims name unknown source(s) {bad}")
    return Reference(sources, numbers, claims, caveats, path)


def numbers_frame(ref: Reference) -> pd.DataFrame:
    """Every published number as one row (columns source, model, tasks, method, abs, norm,
    alpha, note), in file order."""
    return pd.DataFrame(ref.numbers, columns=["source", "model", "tasks", "method", "abs", "norm",
                                              "alpha", "note"])


def _fmt(v: float) -> str:
    """A percentage with the precision sources use: one decimal, two when the value has them."""
    return f"{v:.2f}" if round(v, 1) != round(v, 2) else f"{v:.1f}"


def _cell(abs_: float | None, norm: float | None) -> str:
    if abs_ is None:
        return f"({_fmt(norm)})"
    return _fmt(abs_) if norm is None else f"{_fmt(abs_)} ({_fmt(norm)})"


def reference_table(ref: Reference, *, source: str | Sequence[str], model: str | None = None) -> pd.DataFrame:
    """Published numbers of one or more sources as a table of strings ``"abs (norm)"``.

    Rows: (model, method) in file order; columns: ``"8 tasks"``, ``"14 tasks"``, ``"20 tasks"``
    (those present); an empty string where the source gives nothing. Numbers are shown with the
    precision the source gives. A method evaluated at a fixed alpha shows it in the row label.

    Raises:
        KeyError: an unknown source, or no number for that source / model (the message lists
            what exists).
    """
    wanted = [source] if isinstance(source, str) else list(source)
    unknown = [s for s in wanted if s not in ref.sources]
    if unknown:
        raise KeyError(f"unknown reference source(s) {unknown}; known: {sorted(ref.sources)}")
    rows = [n for n in ref.numbers if n["source"] in wanted and (model is None or n["model"] == model)]
    if not rows:
        models = sorted({n["model"] for n in ref.numbers if n["source"] in wanted})
        raise KeyError(f"no reference numbers for source(s) {wanted} and model {model!r}; models: {models}")
    counts = [t for t in TASK_COUNTS if any(n["tasks"] == t for n in rows)]
    table: dict[tuple[str, str], dict[str, str]] = {}
    for n in rows:
        label = n["method"] + (f" (α = {n['alpha']:g})" if n["alpha"] is not None else "")
        table.setdefault((n["model"], label), {f"{t} tasks": "" for t in counts})[f"{n['tasks']} tasks"] = \
            _cell(n["abs"], n["norm"])
    out = pd.DataFrame.from_dict(table, orient="index")
    out.index = pd.MultiIndex.from_tuples(out.index, names=["model", "method"])
    return out


def caveats_for(ref: Reference, sources: str | Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The caveats that apply to any of ``sources`` (all caveats for None), in file order."""
    if sources is None:
        return list(ref.caveats)
    wanted = {sources} if isinstance(sources, str) else set(sources)
    return [c for c in ref.caveats if wanted & set(c["applies_to"])]


def consistency(ref: Reference, *, finetuned_source: str = "tsv_checkpoints") -> pd.DataFrame:
    """Check published (abs, norm) pairs against the fine-tuned average of the same setting.

    For every number with both abs and norm (a merged or zero-shot model), ``implied = abs /
    (norm / 100)`` is the fine-tuned average that the pair would imply if normalized accuracy
    were the ratio of the means; ``finetuned`` is the recorded mean accuracy of the individual
    models (from ``finetuned_source``) for the same model and task count. Normalized accuracy
    is a mean of per-task ratios, so ``implied - finetuned`` is not zero even for consistent
    numbers: the rows of a consistent source show how large that gap usually is.
    ``beats_finetuned`` flags a merged model whose absolute mean exceeds the individual models'.

    Returns:
        One row per checked number: source, model, tasks, method, abs, norm, finetuned,
        implied, gap (implied - finetuned, points), beats_finetuned (bool). Settings without a
        recorded fine-tuned average are skipped.

    Raises:
        KeyError: ``finetuned_source`` is not a source of ``ref``.
    """
    if finetuned_source not in ref.sources:
        raise KeyError(f"unknown reference source {finetuned_source!r}; known: {sorted(ref.sources)}")
    ft = {(n["model"], n["tasks"]): n["abs"] for n in ref.numbers
          if n["source"] == finetuned_source and n["method"] == "fine-tuned" and n["abs"] is not None}
    rows = []
    for n in ref.numbers:
        key = (n["model"], n["tasks"])
        if n["abs"] is None or n["norm"] is None or key not in ft:
            continue
        implied = n["abs"] / (n["norm"] / 100.0)
        rows.append({"source": n["source"], "model": n["model"], "tasks": n["tasks"], "method": n["method"],
                     "abs": n["abs"], "norm": n["norm"], "finetuned": ft[key], "implied": implied,
                     "gap": implied - ft[key], "beats_finetuned": n["method"] != "zero-shot" and n["abs"] > ft[key]})
    return pd.DataFrame(rows, columns=["source", "model", "tasks", "method", "abs", "norm", "finetuned",
                                       "implied", "gap", "beats_finetuned"])
