"""The book runner's plan: parameters from the command line, thread counts from a set, the
testbeds a set defines and names, the make targets a run needs, a variant's copy of a notebook.

Used by ``scripts/run_notebooks.py`` before anything executes; errors are
:class:`pactlib.book.params.ParameterError` naming the parameter and where it was given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pactlib.book import params as pparams
from pactlib.book import chapters as nbchapters

__all__ = ["ZOO_FAMILIES", "NEEDS", "MAX_THREADS", "THREADS", "ChapterValues", "chapter_values", "book_needs",
           "check_threads", "threads_option",
           "set_thread_problems", "parameters_cell", "parse_cli", "define_testbeds", "named_testbeds",
           "decorate_variant"]

#: The runner's own key of a parameter set and its option ``--threads``: each kernel's torch
#: thread count. No notebook may declare a parameter of that name.
THREADS = "threads"


def _rel(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it (for messages)."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


#: Testbed families whose testbeds read what `make data zoo` builds (the prepared datasets and the
#: book's model zoos); a Lite0 testbed with ``zoo_profile: smoke`` builds its seconds-sized zoo itself.
ZOO_FAMILIES = ("lite0", "minilm")
#: What ``--needs`` prints when a run needs them: mk/book.mk's targets.
NEEDS = ("data", "zoo")


def _names_zoo_testbed(values: dict[str, Any]) -> bool:
    """Whether a notebook's final parameter values name a testbed of :data:`ZOO_FAMILIES` (in a
    parameter whose name holds ``testbed``: ``testbed``, ``testbeds``, ``minilm_testbed``)."""
    from pactlib import testbeds

    smoke = values.get("zoo_profile") == "smoke"
    for name, value in values.items():
        if "testbed" not in name:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(v, str) or not v:
                continue
            try:
                family = testbeds.check_name(v)
            except (KeyError, ValueError, TypeError):  # not a testbed name, or one that needs a definition
                continue
            if family in ZOO_FAMILIES and not (family == "lite0" and smoke):
                return True
    return False


@dataclass(frozen=True)
class ChapterValues:
    """What a parameter set gives one run of one chapter, before its model checks it."""
    model: type  # the chapter's model (pactlib.book.chapters.model_for)
    defaults: dict[str, Any]  # the model's defaults, equal to the notebook's parameters cell
    given: dict[str, Any]  # common + the chapter's section + the variant's values + -p, for its parameters
    origins: dict[str, str]  # where each given value comes from: common, <chapter>, variants: <v>: <chapter>, -p
    threads: Any  # the set's `threads:` for this run (None: unset; set_thread_problems checks it)


def chapter_values(nb: Any, path: Path, params_file: Path, variant: str | None, cli: dict[str, Any]) -> ChapterValues:
    """The values ``params_file`` (its ``variant``'s when given) and the ``-p`` values ``cli`` give
    the chapter ``path`` (read as ``nb``); ``cli`` names that it does not declare are left out.

    Raises:
        FileNotFoundError: no such set. ParameterError: a malformed set or parameters cell, a
            parameter named ``threads``, or a parameters cell that differs from the chapter's model.
    """
    cell = nbchapters.parse_defaults(parameters_cell(nb, _rel(path)).source, where=_rel(path))
    if THREADS in cell:
        raise pparams.ParameterError(
            f"{_rel(path)}: declares a parameter {THREADS!r}, the runner's name for each kernel's torch thread count "
            f"(--threads, a set's `threads:`); use torch.get_num_threads() in the notebook, or rename the parameter")
    model = nbchapters.model_for(path.stem, cell)
    defaults = nbchapters.defaults(model)
    if json.dumps(list(defaults.items()), default=str) != json.dumps(list(cell.items()), default=str):
        raise pparams.ParameterError(f"{_rel(path)}: its parameters cell and pactlib.book.chapters.{model.__name__} "
                                     f"differ: {cell} != {defaults}")
    given, origins = pparams.load_params(params_file, path.stem, declared=[*defaults, THREADS], variant=variant,
                                         with_origins=True)
    threads = given.pop(THREADS, None)
    origins.pop(THREADS, None)
    flags = {k: v for k, v in cli.items() if k in defaults}
    return ChapterValues(model, defaults, {**given, **flags}, {**origins, **dict.fromkeys(flags, "-p")}, threads)


def book_needs(paths: list[Path], params_file: Path, cli: dict[str, Any], runs: list[str] | None = None) -> list[str]:
    """The make targets (:data:`NEEDS`) that produce the inputs of ``paths`` run with
    ``params_file`` and the ``-p`` values ``cli``: all of them when any run (the main one and the
    set's variants, or only ``runs``) names a testbed of :data:`ZOO_FAMILIES`, else ``[]``. Reads
    the parameter cells and the set; validates nothing else and loads no testbed.

    Raises:
        FileNotFoundError: no such set. ParameterError: a malformed set or parameter cell.
    """
    import jupytext

    variants = pparams.variant_definitions(params_file)
    variants.pop(pparams.MAIN, None)
    plan = [("", None)] + [(v, spec["chapters"]) for v, spec in variants.items()]
    if runs:
        plan = [(v, chapters) for v, chapters in plan if (v or pparams.MAIN) in runs]
    for variant, chapters in plan:
        for path in paths:
            if chapters is not None and path.stem not in chapters:
                continue
            values = chapter_values(jupytext.read(path), path, params_file, variant or None, cli)
            if _names_zoo_testbed({**values.defaults, **values.given}):
                return list(NEEDS)
    return []


#: the largest kernel thread count accepted (torch.set_num_threads refuses more than 2^31 - 1)
MAX_THREADS = 4096


def check_threads(value: Any, where: str) -> int | None:
    """``value`` as a kernel thread count: None (unset) or a whole number in [1, :data:`MAX_THREADS`].

    Raises:
        ParameterError: anything else (a bool, a float, a string, a number < 1 or too large), naming ``where``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise pparams.ParameterError(f"{where} must be a whole number from 1 to {MAX_THREADS} (torch threads per "
                                     f"kernel), got {value!r}")
    return value


def threads_option(text: str | None) -> int | None:
    """The value of ``--threads`` (a string from the command line or make's ``THREADS``)."""
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = text
    return check_threads(value, "--threads")


def set_thread_problems(params_file: Path) -> list[str]:
    """Every ``threads:`` of a parameter set that is not a valid count (``common:``, each chapter's
    section, each variant's chapter values), each named by where it is. A set that does not read
    gives ``[]`` here (its loading reports it)."""
    try:
        data = yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(data, dict):
        return []
    places = [(name, body) for name, body in data.items()
              if name not in (pparams.TESTBEDS, pparams.VARIANTS)]
    variants = data.get(pparams.VARIANTS)
    for v, spec in (variants.items() if isinstance(variants, dict) else ()):
        chapters = spec.get("chapters") if isinstance(spec, dict) else None
        places += [(f"variants: {v}: {nb}", body) for nb, body in
                   (chapters.items() if isinstance(chapters, dict) else ())]
    problems = []
    for where, body in places:
        if isinstance(body, dict) and THREADS in body:
            try:
                check_threads(body[THREADS], f"{params_file.name}: {where}: {THREADS}")
            except pparams.ParameterError as exc:
                problems.append(str(exc))
    return problems


def parameters_cell(nb: Any, where: str) -> Any:
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise pparams.ParameterError(
            f"{where}: needs exactly one cell tagged 'parameters' (`# %% tags=[\"parameters\"]`), "
            f"found {len(cells)}")
    if cells[0].cell_type != "code":
        raise pparams.ParameterError(f"{where}: the 'parameters' cell must be a code cell")
    return cells[0]


def parse_cli(pairs: list[str]) -> dict[str, Any]:
    """``["alpha_points=5", "methods=[ties, iso_c]"]`` -> values parsed as YAML.

    Raises:
        ParameterError: a pair is not ``name=value`` with a Python name, or its value is not
            YAML (a one-line message: the runner prints it and exits with status 2).
    """
    out = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise pparams.ParameterError(f"-p {pair!r}: expected name=value (e.g. -p alpha_points=5)")
        if not name.isidentifier():
            raise pparams.ParameterError(f"-p {pair!r}: {name!r} is not a parameter name")
        try:
            out[name] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            why = " ".join(str(getattr(exc, "problem", None) or exc).split())
            mark = getattr(exc, "problem_mark", None)
            at = f" at column {mark.column + 1}" if mark is not None else ""
            raise pparams.ParameterError(
                f"-p {pair!r}: the value {raw!r} is not valid YAML ({why}{at}); quote lists for "
                f"the shell, e.g. -p \"seeds=[0, 1]\"") from None
    return out


def define_testbeds(params_file: Path) -> dict[str, dict]:
    """Define the ``testbeds:`` section of ``params_file`` (``pactlib.testbeds.define_all``) and
    return it, ``{name: {"family": ..., option: value}}``.

    Raises:
        ParameterError: the section is malformed, names an unknown family, or an option its
            family does not take or of a bad value (every problem, each naming testbed and key).
    """
    from pactlib import testbeds

    specs = pparams.testbed_definitions(params_file)
    try:
        testbeds.define_all(specs, where=f"{params_file.name}: testbeds", replace=True)
    except ValueError as exc:
        raise pparams.ParameterError(str(exc)) from None
    return specs


def named_testbeds(values: Any) -> set[str]:
    """The defined testbed names among parameter values (strings, or inside lists and dicts)."""
    from pactlib import testbeds

    defined = testbeds.definitions()
    if isinstance(values, str):
        return {values} if values in defined else set()
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, (list, tuple)):
        return set().union(*(named_testbeds(v) for v in values)) if values else set()
    return set()


def decorate_variant(nb: Any, variant: str, title: str, set_name: str, values: dict[str, Any]) -> None:
    """Mark a variant's copy of a notebook (in place): its title gets `` · <title>`` and a note
    after the title says which run this is and that the prose was written from the main run."""
    import nbformat

    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            lines = cell.source.split("\n")
            i = next(k for k, line in enumerate(lines) if line.startswith("# "))
            lines[i] = f"{lines[i].rstrip()} · {title}"
            cell.source = "\n".join(lines)
            at = nb.cells.index(cell) + 1
            break
    else:
        at = 0
    shown = ", ".join(f"`{k}={v!r}`" for k, v in values.items())
    note = nbformat.v4.new_markdown_cell(
        f"```{{note}}\nThis page is this chapter run again on **{title}** (variant `{variant}` of the "
        f"`{set_name}` parameter set: {shown}). Its code, tables, figures and verdicts are this run's. The "
        f"prose between them was written while reading the main run, the chapter this page belongs "
        f"to: where it says what a result shows, check it against the output here.\n```")
    note.metadata["tags"] = ["variant-note"]
    nb.cells.insert(at, note)
