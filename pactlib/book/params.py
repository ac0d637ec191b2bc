"""Parameter sets: the YAML files under ``params/`` that the book runner executes the chapters with.

A parameter set ``params/<name>.yaml`` holds a ``common:`` mapping plus one mapping per notebook
(keyed by the notebook's file stem, e.g. ``05_main_results``), and optionally a ``testbeds:``
mapping of named testbed definitions, ``{name: {family: clip, option: value, ...}}``
(:func:`testbed_definitions`; the runner defines them with :func:`pactlib.testbeds.define_all` and
hands them to every kernel, so a notebook section can say ``testbed: <name>``). ``common`` and
``testbeds`` are reserved sections (:data:`RESERVED`), and so is ``variants:``, the book's runs on
more than one testbed (:func:`variant_definitions`: a chapter listed there is executed once more
per variant, with that variant's values on top of its section); every other key is a notebook.

The values themselves are checked by the chapters' models (:mod:`pactlib.book.chapters`), in the
runner before anything executes and in each notebook's second cell.

Book: "Running the book" page.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError, model_validator

__all__ = ["REQUIRED", "ParameterError", "ParameterSet", "Variant", "load_params", "sections", "testbed_definitions",
           "variant_definitions",
           "RESERVED", "COMMON", "TESTBEDS", "VARIANTS", "MAIN"]

#: The marker of a required parameter in a ``parameters`` cell (``name = ...``).
REQUIRED = Ellipsis
COMMON = "common"
#: The section of named testbed definitions (:func:`testbed_definitions`).
TESTBEDS = "testbeds"
#: The section of the book's variants (:func:`variant_definitions`).
VARIANTS = "variants"
#: The variant name of the main run (it takes a ``title`` only).
MAIN = "main"
#: Top-level keys of a parameter set that are not notebooks.
RESERVED = (COMMON, TESTBEDS, VARIANTS)


class ParameterError(ValueError):
    """A notebook parameter or a parameter set is unknown, missing, of the wrong type or out of range."""


# ---------------------------------------------------------------------------------------------
# Loading a parameter set


def _variant_name(name: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
        raise ValueError("a variant name is lower-case letters, digits, '-' and '_' (it names a folder)")
    return name


_Name = Annotated[str, AfterValidator(_variant_name)]
_Mapping = Optional[dict[str, Any]]


class Variant(BaseModel):
    """One run of a set's ``variants:`` section (:func:`variant_definitions`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
    chapters: Optional[dict[str, _Mapping]] = None


class ParameterSet(BaseModel):
    """The shape of a parameter set: reserved sections typed, every other key a notebook's mapping."""

    model_config = ConfigDict(extra="allow", strict=True)
    common: _Mapping = None
    testbeds: Optional[dict[str, dict[str, Any]]] = None
    variants: Optional[dict[_Name, Variant]] = None

    @model_validator(mode="after")
    def _sections_and_variants(self) -> ParameterSet:
        problems, notebooks = [], sorted(self.model_extra or {})
        for name, body in (self.model_extra or {}).items():
            if body is not None and not isinstance(body, dict):
                problems.append(f"section {name!r} must be a mapping, got {type(body).__name__}")
        for name, spec in (self.variants or {}).items():
            if name == MAIN and spec.chapters:
                problems.append(f"variants: {name}: the main run takes a title only (its values are the sections)")
            elif name != MAIN and not spec.chapters:
                problems.append(f"variants: {name}: 'chapters' must map notebook names to their values")
            problems += [f"variants: {name}: chapters: {nb!r} is not a notebook section of the set; sections: "
                         f"{notebooks}" for nb in spec.chapters or {} if nb not in notebooks]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _read_set(path: str | Path) -> dict[str, Any]:
    """A parameter set's top-level mapping, checked by :class:`ParameterSet`.

    Raises:
        FileNotFoundError: ``path`` does not exist. ParameterError: not YAML, or not of the shape
            :class:`ParameterSet` says (every problem, each named by its place in the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parameter set not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ParameterError(f"{path}: not valid YAML: {exc}") from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ParameterError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    try:
        ParameterSet.model_validate(data)
    except ValidationError as exc:
        raise ParameterError("; ".join(f"{path}: " + ": ".join([*(str(k) for k in e["loc"] if k != "[key]"),
                                                                e["msg"].removeprefix("Value error, ")])
                                       for e in exc.errors())) from None
    return data


def load_params(path: str | Path, notebook: str, *,
                declared: Iterable[str] | None = None, variant: str | None = None,
                with_origins: bool = False) -> dict[str, Any] | tuple[dict[str, Any], dict[str, str]]:
    """The overrides of one notebook: ``common`` merged with the notebook's own section (and,
    for ``variant``, that variant's values for the notebook on top).

    Args:
        path: a parameter set, e.g. ``params/default.yaml``: a mapping with an optional
            ``common`` mapping, an optional ``testbeds`` mapping (read by
            :func:`testbed_definitions`, never a notebook's) and one mapping (possibly empty) per
            notebook stem.
        notebook: the notebook's stem, e.g. ``"05_main_results"``.
        declared: the notebook's parameter names. When given, ``common`` entries the notebook
            does not declare are skipped (common values apply where they make sense); entries
            of the notebook's own section are always kept, so a typo there fails in
            the chapter's model.
        variant: a variant of :func:`variant_definitions` that lists this notebook.
        with_origins: also return where each value was given, for messages.

    Returns:
        ``{name: value}``; the variant wins over the notebook section, which wins over ``common``.
        With ``with_origins``, ``(values, {name: "common" | "<notebook>" | "variants: <v>: <notebook>"})``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParameterError: the YAML does not parse, is not a mapping of mappings, or has no
            section for ``notebook`` (the message lists the sections it has; a reserved section
            name is never a notebook's).
    """
    path = Path(path)
    data = _read_set(path)
    if notebook not in data or notebook in RESERVED:
        known = sorted(k for k in data if k not in RESERVED)
        raise ParameterError(
            f"{path}: no section for notebook {notebook!r}; sections present: {known}")
    common = dict(data.get(COMMON) or {})
    if declared is not None:
        names = set(declared)
        common = {k: v for k, v in common.items() if k in names}
    extra = {}
    if variant is not None:
        chapters = variant_definitions(path).get(variant, {}).get("chapters", {})
        if notebook not in chapters:
            raise ParameterError(f"{path}: variants: {variant!r} has no values for notebook {notebook!r}")
        extra = chapters[notebook]
    own = data[notebook] or {}
    values = {**common, **own, **extra}
    if not with_origins:
        return values
    origins = {**dict.fromkeys(common, COMMON), **dict.fromkeys(own, notebook),
               **dict.fromkeys(extra, f"{VARIANTS}: {variant}: {notebook}")}
    return values, origins


def sections(path: str | Path) -> list[str]:
    """The notebook sections of a parameter set (every top-level key but :data:`RESERVED`)."""
    return [k for k in _read_set(path) if k not in RESERVED]


def testbed_definitions(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``testbeds:`` section of a parameter set: ``{name: {"family": ..., option: value}}``
    (``{}`` when there is none). Only the shape is checked here; families and options are
    checked by :func:`pactlib.testbeds.define_all`.

    Raises:
        FileNotFoundError, ParameterError: as :func:`load_params`.
    """
    return {name: dict(spec) for name, spec in (_read_set(path).get(TESTBEDS) or {}).items()}


def variant_definitions(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``variants:`` section of a parameter set: the book's runs beyond the main one.

    ::

        variants:
          main: {title: "Lite0 (images)"}        # the main run's name in the book (optional)
          minilm:
            title: "MiniLM (text)"               # shown in the variant's page titles and verdicts
            chapters:                            # notebook -> values on top of its own section
              03_scalar_perspective: {testbed: minilm-8, val_limit: 32}

    Every chapter listed under a variant is executed once more with those values, into
    ``book/_executed/<set>/<variant>/``, and shown as a section of the main chapter.

    Returns:
        ``{variant: {"title": str, "chapters": {notebook: {name: value}}}}`` in file order; the
        main run's entry (``main``, no chapters) is always there, its title defaulting to "main".

    Raises:
        FileNotFoundError: as :func:`load_params`. ParameterError: the section or a variant is not
            a mapping, a variant name is not ``[a-z][a-z0-9_-]*`` (it names a folder), a key other
            than ``title`` / ``chapters``, a missing or empty title, ``main`` with chapters, a
            chapter that is not a section of the set, or values that are not a mapping.
    """
    out = {MAIN: {"title": "main", "chapters": {}}}
    for name, spec in (_read_set(path).get(VARIANTS) or {}).items():
        chapters = spec.get("chapters") or {}
        out[name] = {"title": spec["title"].strip(), "chapters": {k: dict(v or {}) for k, v in chapters.items()}}
    return out
