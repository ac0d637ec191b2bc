"""Notebook parameters: read the defaults, load a YAML parameter set, validate before running.

Every chapter notebook has ONE cell tagged ``parameters`` that assigns CPU-sized literal
defaults, one per line (papermill's convention)::

    seeds = 3        # three seeds: enough for a spread, minutes on CPU
    methods = ["ta", "iso_c"]
    zoo_dir = ...    # required: no sensible default (``...`` marks a required parameter)

A parameter set ``params/<name>.yaml`` holds a ``common:`` mapping plus one mapping per
notebook (keyed by the notebook's file stem, e.g. ``05_main_results``), and optionally a
``testbeds:`` mapping of named testbed definitions, ``{name: {family: clip, option: value, ...}}``
(:func:`testbed_definitions`; the runner defines them with :func:`pactlib.testbeds.define_all` and
hands them to every kernel, so a notebook section can say ``testbed: <name>``). ``common`` and
``testbeds`` are reserved sections (:data:`RESERVED`), and so is ``variants:``, the book's runs on
more than one testbed (:func:`variant_definitions`: a chapter listed there is executed once more
per variant, with that variant's values on top of its section); every other key is a notebook. The book runner
(``scripts/run_notebooks.py``) calls :func:`parse_defaults`, :func:`load_params` and
:func:`validate` for every notebook *before* executing any, so a misspelt or mistyped
parameter fails in a second, not after an hour of work. Inside a notebook, :func:`check`
verifies value constraints (ranges, choices) and returns the parameter dict that goes into
result records::

    P = params.check(globals(), seeds=params.each(params.at_least(0), unique=True),
                     methods=params.each(params.merge_method()), alpha_points=params.at_least(2))

That call is the one place a notebook's allowed values are declared. The runner evaluates the
same rules before executing anything (:func:`check_notebook`), so an unknown merge method,
suite or zoo profile, a count of zero or a fraction outside (0, 1] fails as fast as a wrong
type. Choices that the library defines come from its registries (:func:`merge_method`,
:func:`testbed`, :func:`suite`, :func:`zoo_profile`, :func:`task_count`), never from lists copied into the
notebooks.

Type rules of :func:`validate` (default type -> accepted override):

- ``bool`` -> ``bool`` only (``1`` is not a bool, ``True`` is not an int);
- ``int`` -> ``int``; ``float`` -> ``float`` or ``int`` (widened to float, ``1`` -> ``1.0``);
- ``str`` -> ``str``; ``dict`` -> ``dict``;
- ``list``/``tuple`` -> ``list``/``tuple`` (returned as a list), each element checked against
  the type of the default's elements when the default is a non-empty list of one type;
- ``None`` default -> anything (the type is not known); ``...`` default -> required, anything.

Book: "Running the book" page.
"""
from __future__ import annotations

import ast
import builtins
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "REQUIRED",
    "ParameterError",
    "parse_defaults",
    "load_params",
    "sections",
    "validate",
    "check",
    "between",
    "at_least",
    "testbed",
    "one_of",
    "each",
    "fraction",
    "merge_method",
    "suite",
    "zoo_profile",
    "task_count",
    "check_notebook",
    "testbed_definitions",
    "variant_definitions",
    "existing_path",
    "RESERVED",
]

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
    """A notebook parameter is unknown, missing, of the wrong type or out of range."""


# ---------------------------------------------------------------------------------------------
# Reading the defaults of a ``parameters`` cell


def parse_defaults(source: str, *, where: str = "parameters cell") -> dict[str, Any]:
    """Names and literal default values assigned in a ``parameters`` cell.

    Args:
        source: the cell's Python source.
        where: a label for error messages (e.g. ``"notebooks/05_main_results.py"``).

    Returns:
        ``{name: default}`` in source order; ``...`` marks a required parameter.

    Raises:
        ParameterError: the source does not parse, a statement is not a plain ``name = literal``
            assignment (no calls, no expressions of other names, no imports), or a name is
            assigned twice.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"{where}: cannot parse the parameters cell: {exc}") from exc
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # a docstring-like comment string
        else:
            raise ParameterError(
                f"{where}, line {node.lineno}: a parameters cell may only hold "
                f"`name = literal` assignments, got {ast.unparse(node)!r}")
        if not isinstance(target, ast.Name):
            raise ParameterError(
                f"{where}, line {node.lineno}: assign to a plain name, got {ast.unparse(target)!r}")
        try:
            default = ast.literal_eval(value)
        except ValueError as exc:
            raise ParameterError(
                f"{where}, line {node.lineno}: the default of {target.id!r} must be a literal "
                f"(number, string, list, dict, None, ...), got {ast.unparse(value)!r}") from exc
        if target.id in out:
            raise ParameterError(f"{where}, line {node.lineno}: {target.id!r} is assigned twice")
        out[target.id] = default
    return out


# ---------------------------------------------------------------------------------------------
# Loading a parameter set


def _read_set(path: str | Path) -> dict[str, Any]:
    """A parameter set's top-level mapping, its sections checked to be mappings.

    Raises:
        FileNotFoundError: ``path`` does not exist. ParameterError: not YAML, not a mapping of
            mappings, or a ``testbeds`` entry that is not a mapping.
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
    for section, body in data.items():
        if body is not None and not isinstance(body, dict):
            raise ParameterError(
                f"{path}: section {section!r} must be a mapping, got {type(body).__name__}")
    for name, spec in (data.get(TESTBEDS) or {}).items():
        if not isinstance(spec, dict):
            raise ParameterError(f"{path}: testbeds: {name!r} must be a mapping with a 'family' and its "
                                 f"options, got {type(spec).__name__}")
    return data


def load_params(path: str | Path, notebook: str, *,
                declared: Iterable[str] | None = None, variant: str | None = None) -> dict[str, Any]:
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
            :func:`validate`.
        variant: a variant of :func:`variant_definitions` that lists this notebook.

    Returns:
        ``{name: value}``; the variant wins over the notebook section, which wins over ``common``.

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
    return {**common, **(data[notebook] or {}), **extra}


def sections(path: str | Path) -> list[str]:
    """The notebook sections of a parameter set (every top-level key but :data:`RESERVED`)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return [k for k in data if k not in RESERVED]


def testbed_definitions(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``testbeds:`` section of a parameter set: ``{name: {"family": ..., option: value}}``
    (``{}`` when there is none). Only the shape is checked here; families and options are
    checked by :func:`pactlib.testbeds.define_all`.

    Raises:
        FileNotFoundError, ParameterError: as :func:`load_params`.
    """
    return {name: dict(spec) for name, spec in (_read_set(path).get(TESTBEDS) or {}).items()}


_VARIANT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


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
            a mapping, a variant name is not ``[a-z][a-z0-9_-]*``, a key other than ``title`` /
            ``chapters``, a missing or empty title, ``main`` with chapters, a chapter that is not
            a section of the set, or values that are not a mapping.
    """
    path = Path(path)
    data = _read_set(path)
    raw = data.get(VARIANTS) or {}
    if not isinstance(raw, dict):
        raise ParameterError(f"{path}: variants must be a mapping of variant names, got {type(raw).__name__}")
    out = {MAIN: {"title": "main", "chapters": {}}}
    for name, spec in raw.items():
        where = f"{path}: variants: {name!r}"
        if not isinstance(name, str) or not _VARIANT_NAME.match(name):
            raise ParameterError(f"{where}: a variant name is lower-case letters, digits, '-' and '_' "
                                 f"(it names a folder)")
        if not isinstance(spec, dict):
            raise ParameterError(f"{where} must be a mapping with 'title' and 'chapters'")
        bad = sorted(set(spec) - {"title", "chapters"})
        if bad:
            raise ParameterError(f"{where}: unknown key(s) {bad}; a variant has 'title' and 'chapters'")
        title = spec.get("title")
        if not isinstance(title, str) or not title.strip():
            raise ParameterError(f"{where}: needs a non-empty string 'title'")
        chapters = spec.get("chapters") or {}
        if name == MAIN:
            if chapters:
                raise ParameterError(f"{where}: the main run takes a title only (its values are the sections)")
        elif not isinstance(chapters, dict) or not chapters:
            raise ParameterError(f"{where}: 'chapters' must map notebook names to their values")
        for nb, values in chapters.items():
            if nb not in data or nb in RESERVED:
                known = sorted(k for k in data if k not in RESERVED)
                raise ParameterError(f"{where}: chapter {nb!r} is not a notebook section of the set; "
                                     f"sections: {known}")
            if values is not None and not isinstance(values, dict):
                raise ParameterError(f"{where}: the values of {nb!r} must be a mapping, got {type(values).__name__}")
        out[name] = {"title": title.strip(), "chapters": {k: dict(v or {}) for k, v in chapters.items()}}
    return out


# ---------------------------------------------------------------------------------------------
# Validation


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _coerce(name: str, default: Any, value: Any) -> Any:
    """``value`` checked (and widened int -> float) against the type of ``default``."""
    if default is None or default is REQUIRED:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        ok = isinstance(value, float)
    elif isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise ParameterError(
                f"parameter {name!r}: expected list, got {_type_name(value)} ({value!r})")
        kinds = {type(x) for x in default}
        if len(default) and len(kinds) == 1:
            elem = default[0]
            return [_coerce(f"{name}[{i}]", elem, v) for i, v in enumerate(value)]
        return list(value)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ParameterError(
            f"parameter {name!r}: expected {_type_name(default)}, got {_type_name(value)} "
            f"({value!r})")
    return value


def validate(defaults: Mapping[str, Any], overrides: Mapping[str, Any], *,
             notebook: str = "notebook") -> dict[str, Any]:
    """Check overrides against a notebook's defaults; return the overrides, type-coerced.

    Args:
        defaults: ``{name: default}`` from :func:`parse_defaults` (``...`` = required).
        overrides: ``{name: value}``, e.g. from :func:`load_params` plus command-line values.
        notebook: a label for error messages.

    Returns:
        The overrides to pass to papermill (only the names given, int widened to float where
        the default is a float). The defaults themselves stay in the notebook.

    Raises:
        ParameterError: an override names an unknown parameter (the message lists the known
            ones), has the wrong type (naming parameter, expected and got), or a required
            parameter gets no value. All problems are reported together.
    """
    problems: list[str] = []
    out: dict[str, Any] = {}
    for name, value in overrides.items():
        if name not in defaults:
            problems.append(f"unknown parameter {name!r}; known: {sorted(defaults)}")
            continue
        try:
            out[name] = _coerce(name, defaults[name], value)
        except ParameterError as exc:
            problems.append(str(exc))
    for name, default in defaults.items():
        if default is REQUIRED and name not in overrides:
            problems.append(f"missing required parameter {name!r} (its default is `...`)")
    if problems:
        raise ParameterError(f"{notebook}: " + "; ".join(problems))
    return out


# ---------------------------------------------------------------------------------------------
# In-notebook constraints

#: A constraint: returns None when the value is fine, else a short description of the rule.
Rule = Callable[[Any], "str | None"]


def between(lo: float, hi: float) -> Rule:
    """The value (a number) lies in the closed interval [lo, hi]."""
    def rule(v: Any) -> str | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
        return None if ok else f"a number in [{lo}, {hi}]"
    return rule


def at_least(lo: float) -> Rule:
    """The value (a number) is >= lo and finite."""
    def rule(v: Any) -> str | None:
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and v >= lo)
        return None if ok else f"a finite number >= {lo}"
    return rule


def one_of(*choices: Any) -> Rule:
    """The value is one of ``choices``."""
    def rule(v: Any) -> str | None:
        return None if v in choices else f"one of {list(choices)}"
    return rule


def each(inner: Rule, *, nonempty: bool = True, unique: bool = False) -> Rule:
    """The value is a list (non-empty unless ``nonempty=False``) whose every element passes
    (and, with ``unique=True``, in which no element repeats: seeds, suites, methods)."""
    def rule(v: Any) -> str | None:
        if not isinstance(v, (list, tuple)) or (nonempty and not v):
            return "a non-empty list" if nonempty else "a list"
        for i, x in enumerate(v):
            why = inner(x)
            if why is not None:
                return f"a list whose every element is {why} (element {i} = {x!r})"
        if unique:
            seen: list[Any] = []
            for i, x in enumerate(v):
                if x in seen:
                    return f"a list without repeats (element {i} = {x!r} repeats)"
                seen.append(x)
        return None
    return rule


def fraction() -> Rule:
    """The value (a number) lies in (0, 1]: a share of something, never none of it."""
    def rule(v: Any) -> str | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1
        return None if ok else "a number in (0, 1]"
    return rule


def existing_path(*, none_ok: bool = True) -> Rule:
    """The value is the path of an existing file or folder (relative to the working directory,
    the repository root for the book runner); None allowed with ``none_ok``. Catches a
    parameter file whose placeholder paths (``/path/to/...``) were not edited."""
    def rule(v: Any) -> str | None:
        if v is None and none_ok:
            return None
        if isinstance(v, str) and v and Path(v).expanduser().exists():
            return None
        what = "None or the path of an existing file or folder" if none_ok else "the path of an existing file or folder"
        return what + ("; nothing exists at that path" if isinstance(v, str) else "")
    return rule


# The choices below come from the library's registries (looked up when the rule runs, so this
# module imports nothing heavy): a new merge method, suite or zoo profile is allowed everywhere
# at once, and the runner's pre-run check and the notebook's own check agree.


def merge_method() -> Rule:
    """The value names a registered merge method (:func:`pactlib.merges.names`)."""
    def rule(v: Any) -> str | None:
        from pactlib import merges

        return one_of(*merges.names())(v)
    return rule


def suite() -> Rule:
    """The value names a task suite (:data:`pactlib.data.suites.SUITES`: ``"8"``, ``"14"``, ...)."""
    def rule(v: Any) -> str | None:
        from pactlib.data.suites import SUITES

        return one_of(*SUITES)(v)
    return rule


def testbed(*, family: str | None = None, none_ok: bool = False) -> Rule:
    """The value names a testbed (:func:`pactlib.testbeds.check_name`: ``"lite0-8"``,
    ``"lite0-20:4"``, ``"synthetic-3"``, a name the parameter set's ``testbeds:`` defines, ...);
    nothing is loaded or built. ``family``: it must be of that family; ``none_ok``: None is
    allowed too."""
    def rule(v: Any) -> str | None:
        from pactlib.testbeds import check_name, definitions, families

        if v is None and none_ok:
            return None
        what = f"a {family} testbed" if family else "a testbed name"
        try:
            got = check_name(v)
        except (KeyError, ValueError, TypeError) as e:
            defined = sorted(definitions())
            return (f"{'None or ' if none_ok else ''}{what} ({', '.join(f'{f}-...' for f in families())}"
                    f"{'; defined: ' + ', '.join(defined) if defined else ''}): {e.args[0] if e.args else e}")
        if family is not None and got != family:
            return f"{'None or ' if none_ok else ''}{what} (a name of family {family!r}; {v!r} is {got!r})"
        return None
    return rule


def zoo_profile() -> Rule:
    """The value names a Lite0 zoo profile (:data:`pactlib.testbeds.lite0.testbed.PROFILES`)."""
    def rule(v: Any) -> str | None:
        from pactlib.testbeds.lite0.testbed import PROFILES

        return one_of(*PROFILES)(v)
    return rule


def task_count(suites: Any) -> Rule:
    """``n_tasks`` of a notebook: 0 (every task of the suite) or an int up to the size of the
    smallest of ``suites`` (one suite name or a list of them; unknown names are left to their
    own rule)."""
    def rule(v: Any) -> str | None:
        from pactlib.data.suites import SUITES

        names = [suites] if isinstance(suites, str) else list(suites) \
            if isinstance(suites, (list, tuple)) else []
        sizes = {str(s): len(SUITES[str(s)]) for s in names if str(s) in SUITES}
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if not sizes:
            return None if ok else "an int >= 0 (0 = every task of the suite)"
        smallest = min(sizes, key=sizes.get)
        hi = sizes[smallest]
        return None if ok and v <= hi else \
            f"an int in [0, {hi}] (0 = every task; suite {smallest!r} has {hi} tasks)"
    return rule


def check(namespace: Mapping[str, Any], **rules: Rule | None) -> dict[str, Any]:
    """Check a notebook's parameters (after papermill's injection) and return them.

    Call it in the cell right after the ``parameters`` cell, naming *every* parameter once
    (``None`` = no constraint beyond the runner's type check)::

        P = check(globals(), seeds=at_least(1), lbw_tol=between(0, 1), methods=None)

    Args:
        namespace: usually ``globals()``.
        **rules: one entry per parameter name.

    Returns:
        ``{name: value}`` for the named parameters, in the order given (for result records).

    Raises:
        ParameterError: a named parameter is not defined, still holds ``...`` (required and
            not given), or breaks its rule; every problem is reported, naming the parameter,
            the rule and the value.
    """
    problems = []
    values: dict[str, Any] = {}
    for name, rule in rules.items():
        if name not in namespace:
            problems.append(f"{name!r} is not defined (is it in the parameters cell?)")
            continue
        value = namespace[name]
        if value is REQUIRED:
            problems.append(f"required parameter {name!r} has no value (pass it with -p or YAML)")
            continue
        why = rule(value) if rule is not None else None
        if why is not None:
            problems.append(f"parameter {name!r} must be {why}, got {value!r}")
        values[name] = value
    if problems:
        raise ParameterError("; ".join(problems))
    return values


# ---------------------------------------------------------------------------------------------
# Checking values before a run (the runner)

#: What a rule expression may use besides ``params`` and the notebook's parameters.
RULE_BUILTINS = {name: getattr(builtins, name)
                 for name in ("abs", "len", "list", "max", "min", "range", "sorted", "str", "tuple")}


def _check_call(sources: Iterable[str]) -> ast.Call | None:
    """The first ``<module>.check(globals(), ...)`` call in ``sources`` (code cells)."""
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # IPython syntax (`!cmd`, `%magic`): no check() call there
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "check" and isinstance(node.func.value, ast.Name)
                    and node.args and isinstance(node.args[0], ast.Call)
                    and isinstance(node.args[0].func, ast.Name)
                    and node.args[0].func.id == "globals"):
                return node
    return None


def check_notebook(sources: Iterable[str], values: Mapping[str, Any], *,
                   notebook: str = "notebook") -> dict[str, Any]:
    """Check a notebook's final parameter values against its own rules, before it runs.

    The rules are those of the notebook's ``params.check(globals(), name=rule, ...)`` call (the
    one place they are declared): each rule expression is evaluated with ``params`` (this
    module, under the name the call uses), the parameter values and :data:`RULE_BUILTINS`, so
    the runner refuses exactly what the notebook's first cells would refuse, in a second
    instead of after the data and zoo are built. A notebook without such a call has no value
    rules (its types are still checked by :func:`validate`).

    Args:
        sources: the notebook's code cells (cells that are not plain Python are skipped).
        values: every parameter's final value: the defaults updated with the overrides.
        notebook: a label for error messages.

    Returns:
        ``{name: value}`` of the checked parameters, as :func:`check` returns them.

    Raises:
        ParameterError: a value breaks its rule (naming the notebook, the parameter, what is
            allowed and the value), or a rule cannot be evaluated from the parameters alone.
    """
    call = _check_call(sources)
    if call is None:
        return {}
    module = sys.modules[__name__]
    scope = {"__builtins__": RULE_BUILTINS, call.func.value.id: module}
    rules: dict[str, Rule | None] = {}
    problems = []
    for kw in call.keywords:
        expr = ast.unparse(kw.value)
        if kw.arg is None:
            problems.append(f"check() takes one `name=rule` per parameter, got **{expr}")
            continue
        try:
            rule = eval(compile(ast.Expression(kw.value), notebook, "eval"), scope, dict(values))  # noqa: S307
        except Exception as exc:  # noqa: BLE001 - reported as a parameter problem
            problems.append(
                f"the rule of {kw.arg!r} (`{expr}`) cannot be evaluated before the run "
                f"({type(exc).__name__}: {exc}); a rule may use only `params.*`, the "
                f"parameters and {sorted(RULE_BUILTINS)}")
            continue
        if rule is not None and not callable(rule):
            problems.append(f"the rule of {kw.arg!r} (`{expr}`) is not a rule: {rule!r}")
            continue
        rules[kw.arg] = rule
    try:
        checked = check(values, **rules)
    except ParameterError as exc:
        problems.append(str(exc))
        checked = {}
    if problems:
        raise ParameterError(f"{notebook}: " + "; ".join(problems))
    return checked
