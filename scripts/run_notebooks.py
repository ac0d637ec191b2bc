#!/usr/bin/env python
"""Execute the book's notebooks with papermill, then render them with jupyter-book (v1).

    .venv/bin/python scripts/run_notebooks.py                      # the whole book, params/default.yaml
    .venv/bin/python scripts/run_notebooks.py --params smoke       # tiny values (tests)
    .venv/bin/python scripts/run_notebooks.py --only 05_main_results -p alpha_points=5
    .venv/bin/python scripts/run_notebooks.py --params paper-vitb32-8 --needs   # what `make` builds first
    .venv/bin/python scripts/run_notebooks.py --params paper-vitb32-8 --threads 16  # torch threads per kernel

Steps, in order:

1. For every selected ``notebooks/NN_*.py`` (jupytext percent scripts): read it, find its ONE
   cell tagged ``parameters``, parse the defaults (``pactlib.book.params.parse_defaults``), load
   ``common`` + its section of ``params/<set>.yaml``, add ``-p name=value`` overrides, and
   validate them: names and types (unknown / wrong type / missing required,
   ``pactlib.book.params.validate``), then values against the rules of the notebook's own
   ``params.check(globals(), ...)`` call (unknown merge method, suite or zoo profile, counts and
   fractions out of range, ``pactlib.book.params.check_notebook``). A parameter set's
   ``testbeds:`` section (named testbed definitions, ``{name: {family: clip, option: value}}``)
   is defined first (``pactlib.testbeds.define_all``: unknown family or option -> error), so a
   notebook section may name one (``testbed: clip-vitb32-8``); the paths of every definition a
   selected notebook names must exist (each missing one is named with its option). All
   notebooks are validated before any is executed, with the repository root as working
   directory, as the kernels have it; ``--check-only`` stops there (``make book`` / ``make
   chapter`` run it before they build data or a zoo).
   ``threads`` is the runner's, not a notebook parameter: each kernel's torch thread count
   (``torch.set_num_threads`` as the notebook imports torch: ``scripts/kernel_threads.py``, run
   at kernel start-up; ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` in its environment). Precedence: ``--threads N`` (``make ...
   THREADS=N``) > ``threads:`` in the set (a variant's chapter values > the chapter's section >
   ``common:``; ``null`` at any level resets to the default, it does not inherit) > cores /
   ``--jobs`` (the cores this process may use). A value that is not a whole number from 1 to
   4096 is an error naming where it was given, before anything runs; so is a notebook that
   declares a parameter named ``threads``, ``-p threads=N`` and ``--jobs`` < 1. The merges and
   the PACT filter run N layers at once, so N also multiplies their layer memory.
2. Execute each notebook whose key changed; key = sha256 of the notebook source, its final
   parameters, the code of every ``pactlib/**/*.py`` (syntax trees without docstrings, so comment
   edits re-run nothing), ``requirements.lock``, the content of files named
   by path-valued parameters, the definitions of the testbeds the notebook names (and a listing
   of the files and folders they name), and of the ``--inputs`` files (zoo / data manifests).
   The thread count is not part of the key: merges and filters are bit-identical for any thread
   count (``pactlib.threads``; evaluations, Fisher and loss sums may differ by float noise, and
   chapter 8's timings depend on it), so a change of ``threads`` re-executes nothing (the ``.key``
   and the notebook's ``pact`` metadata say which count a notebook ran with; ``--force``
   re-times chapter 8 with a new count). The result
   is ``book/_executed/<set>/<name>.ipynb`` with ``<name>.key`` beside it (both written
   atomically); records go to ``book/_executed/<set>/records/<name>.jsonl`` and figure files
   to ``book/_executed/<set>/figures/``. Every kernel gets the testbed definitions as JSON in
   ``$PACT_TESTBEDS`` (``pactlib.testbeds`` defines them on import). A notebook that raises stops the run: the message
   names the notebook and the failing cell, and the partial notebook is kept as
   ``<name>.failed.ipynb``. A shell command (``!cmd``) that exits non-zero raises too
   (``subprocess.CalledProcessError``; the kernel runs with IPython's
   ``InteractiveShell.system_raise_on_error``).
3. Render with ``jupyter-book build -W -n --keep-going`` (execution off) into ``_build/html``
   (set ``default``) or ``_build/<set>/_build/html`` (other sets), then check that every
   chapter page exists and that no page loads anything from a CDN (MathJax is local).

``--needs`` runs nothing: it prints the make targets that produce the selected notebooks'
inputs, ``data zoo`` when any run of them (main or variant, after ``-p``) names a built-in
testbed that reads the book's data and model zoo (:data:`ZOO_FAMILIES`: Lite0 with its default
zoo profile, MiniLM), else nothing (``mk/book.mk``'s ``BOOK_DEPS``). A set that cannot be read
prints ``data zoo`` (the safe answer) and the reason on stderr, with status 2.

Exit status: 0 on success, 1 on a failed notebook / build / check, 2 on bad parameters.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pactlib.book import params as pparams  # noqa: E402
from pactlib.io import write_atomic  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "book" / "_executed"
PARAMS_DIR = ROOT / "params"
TOC = ROOT / "_toc.yml"
DEFAULT_SET = "default"
TOC_PREFIX = "book/_executed/default/"
KEY_VERSION = 1
KERNEL = "python3"
#: Arguments of every kernel: its own log (TCP notice, shutdown chatter) is noise, cell errors
#: are reported from the notebook itself; a shell command (`!cmd`, `x = !cmd`) that exits
#: non-zero raises CalledProcessError and so fails the notebook (IPython only stores its status
#: in `_exit_code` by default, and the cell would go on).
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL", "--InteractiveShell.system_raise_on_error=True"]
#: Seconds between the "... running:" lines of a parallel run.
STATUS_EVERY = 60
#: Chapters that reuse another chapter's merges (``pactlib.testbeds.run``'s memo): with
#: ``--jobs`` > 1 they start only after those finish, so the merges are computed once.
AFTER = {"06_static_vs_dynamic": ("05_main_results",), "11_sensitivity": ("05_main_results",)}
#: Tags that make a browser fetch something; none of them may point off the machine.
FETCH = re.compile(r"""<(?:script|img|iframe|source|link)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""",
                   re.I)
REMOTE = re.compile(r"^(https?:)?//", re.I)
#: The runner's own key of a parameter set (in ``common:``, a chapter's section or a variant's
#: chapter values) and its option ``--threads``: each kernel's torch thread count. No notebook
#: may declare a parameter of that name (one name, one meaning).
THREADS = "threads"


class RunError(RuntimeError):
    """A notebook failed, or the rendered book failed a check."""


@dataclass
class Job:
    name: str
    source: Path
    nb: Any  # nbformat.NotebookNode
    overrides: dict[str, Any]
    key: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    testbeds: dict[str, dict] = field(default_factory=dict)  # definitions of the testbeds it names
    variant: str = ""  # "" for the main run, else a variant of the set's `variants:` section
    title: str = ""    # the run's title (the variant's, or the main run's)
    threads: int | None = None  # the kernel's torch threads; None: cores / jobs (see resolve_threads)

    @property
    def id(self) -> str:
        """``05_main_results`` for the main run, ``minilm/05_main_results`` for a variant's."""
        return f"{self.variant}/{self.name}" if self.variant else self.name

    def out_dir(self, base: Path) -> Path:
        """Where the executed notebook, its records and figures go: ``base`` or ``base/<variant>``."""
        return base / self.variant if self.variant else base


# ---------------------------------------------------------------------------------------------
# discovery and validation


def _rel(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (for messages)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def notebook_paths(only: list[str] | None) -> list[Path]:
    """The chapter notebooks, in order; ``only`` = stems or unique stem prefixes ("05")."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if not paths:
        raise RunError(f"no notebooks found under {NOTEBOOKS}")
    if not only:
        return paths
    chosen = []
    for want in only:
        hits = [p for p in paths if p.stem == want] or [p for p in paths if p.stem.startswith(want)]
        if len(hits) != 1:
            raise pparams.ParameterError(
                f"--only {want!r} matches {[p.stem for p in hits] or 'no notebook'}; "
                f"notebooks: {[p.stem for p in paths]}")
        chosen.append(hits[0])
    return sorted(set(chosen))


def toc_chapters(toc_path: Path = TOC) -> list[str]:
    """Stems of the chapters that ``_toc.yml`` takes from ``book/_executed/default/``."""
    text = toc_path.read_text(encoding="utf-8")
    return [f[len(TOC_PREFIX):] for f in re.findall(r"file:\s*(\S+)", text)
            if f.startswith(TOC_PREFIX)]


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
            defaults = pparams.parse_defaults(parameters_cell(jupytext.read(path), _rel(path)).source, where=_rel(path))
            values = {**defaults, **pparams.load_params(params_file, path.stem, declared=defaults, variant=variant or None),
                      **{k: v for k, v in cli.items() if k in defaults}}
            if _names_zoo_testbed(values):
                return list(NEEDS)
    return []


# ---------------------------------------------------------------------------------------------
# threads: each kernel's torch thread count (the runner's setting, not a notebook parameter)


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads(jobs: int) -> int:
    """A kernel's thread count when neither ``--threads`` nor the set gives one: cores / jobs."""
    return max(1, usable_cores() // max(1, jobs))


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


def resolve_threads(cli: int | None, job: Job, jobs: int) -> int:
    """A kernel's thread count: ``--threads`` > the set's ``threads`` for the job > cores / jobs."""
    return cli or job.threads or default_threads(jobs)


#: Run in every kernel at start-up: torch.set_num_threads($PACT_THREADS) right after the notebook
#: imports torch (the environment alone does not do it: MKL caps OMP_NUM_THREADS at the physical
#: cores), without importing torch in a kernel that does not (see the file).
KERNEL_THREADS = Path(__file__).resolve().with_name("kernel_threads.py")


def kernel_threads_env(threads: int) -> dict[str, str]:
    """The environment that gives a kernel ``threads`` torch threads (with :data:`KERNEL_THREADS`);
    BLAS libraries that read ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` follow it too."""
    return {"PACT_THREADS": str(int(threads)), "OMP_NUM_THREADS": str(int(threads)),
            "MKL_NUM_THREADS": str(int(threads))}


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


def prepare(paths: list[Path], params_file: Path, cli: dict[str, Any]) -> list[Job]:
    """Read, parse and validate every selected notebook (nothing runs yet), in the repository
    root (the kernels' working directory: relative paths mean the same here and there)."""
    params_file = params_file.resolve()
    with contextlib.chdir(ROOT):
        return _prepare(paths, params_file, cli)


def _prepare(paths: list[Path], params_file: Path, cli: dict[str, Any]) -> list[Job]:
    import jupytext

    from pactlib import testbeds

    jobs, problems, declared_any = [], [], set()
    problems += set_thread_problems(params_file)
    try:
        define_testbeds(params_file)
    except (pparams.ParameterError, FileNotFoundError) as exc:
        problems.append(str(exc))
    try:
        variants = pparams.variant_definitions(params_file)
    except (pparams.ParameterError, FileNotFoundError) as exc:
        problems.append(str(exc))
        variants = {}
    main_spec = variants.pop(pparams.MAIN, {})
    runs = [("", main_spec.get("title", ""), None)] + [(v, spec["title"], spec["chapters"]) for v, spec in variants.items()]
    for variant, title, chapters in runs:  # the main run, then each variant's chapters
        for path in paths:
            if chapters is not None and path.stem not in chapters:
                continue
            where = _rel(path) + (f" (variant {variant!r})" if variant else "")
            try:
                nb = jupytext.read(path)
                defaults = pparams.parse_defaults(parameters_cell(nb, where).source, where=where)
                if THREADS in defaults:
                    raise pparams.ParameterError(
                        f"{where}: declares a parameter {THREADS!r}, the runner's name for each kernel's torch "
                        f"thread count (--threads, a set's `threads:`); use torch.get_num_threads() in the "
                        f"notebook, or rename the parameter")
                declared_any |= set(defaults)
                overrides = pparams.load_params(params_file, path.stem, declared=[*defaults, THREADS],
                                                variant=variant or None)
                threads = overrides.pop(THREADS, None)  # the runner's, not the notebook's
                if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
                    threads = None  # unset, or bad: set_thread_problems reports it
                overrides.update({k: v for k, v in cli.items() if k in defaults})
                overrides = pparams.validate(defaults, overrides, notebook=where)
                pparams.check_notebook([c.source for c in nb.cells if c.cell_type == "code"],
                                       {**defaults, **overrides}, notebook=where)
            except (pparams.ParameterError, FileNotFoundError) as exc:
                problems.append(str(exc))
                continue
            named = named_testbeds(list({**defaults, **overrides}.values()))
            if variant:
                decorate_variant(nb, variant, title, params_file.stem, chapters[path.stem])
            jobs.append(Job(path.stem, path, nb, overrides, variant=variant, title=title, threads=threads,
                            testbeds={n: testbeds.definitions()[n] for n in sorted(named)}))
    for name in sorted(set().union(*(j.testbeds for j in jobs)) if jobs else ()):
        users = [j.name[:2] for j in jobs if name in j.testbeds]
        missing = testbeds.missing_paths(name)
        if missing:
            problems.append(f"{params_file.name}: testbeds: {name!r} (used by chapters {', '.join(users)}) names "
                            f"paths that do not exist; edit them: "
                            + "; ".join(f"option {option!r}: {path}" for option, path in missing))
    if len(paths) == len(notebook_paths(None)):  # every notebook: `common` must be used somewhere
        try:
            common = (yaml.safe_load(params_file.read_text()) or {}).get(pparams.COMMON) or {}
        except (OSError, yaml.YAMLError, AttributeError):
            common = {}  # load_params above already reported it
        unused = sorted(set(common) - declared_any - {THREADS})
        if unused:
            problems.append(f"{params_file.name}: common {unused} is declared by no notebook; "
                            f"known: {sorted(declared_any)}")
    if THREADS in cli:
        problems.append(f"-p {THREADS}={cli[THREADS]!r}: the kernels' thread count is not a notebook parameter; "
                        f"use --threads N (make book/chapter THREADS=N)")
    stray = sorted(set(cli) - declared_any - {THREADS})
    if stray:
        problems.append(f"-p {stray}: no selected notebook has such a parameter; "
                        f"known: {sorted(declared_any)}")
    if problems:  # a problem of the set itself is met once per notebook: each said once
        raise pparams.ParameterError("\n  ".join(["bad parameters:", *dict.fromkeys(problems)]))
    return jobs


# ---------------------------------------------------------------------------------------------
# cache keys


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_path(path: Path) -> str:
    """Content hash of a file; for a folder, a hash of its listing (names, sizes, mtimes)."""
    if path.is_file():
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    rows = []
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            rows.append(f"{p.relative_to(path)}\t{st.st_size}\t{st.st_mtime_ns}")
    return _sha("\n".join(rows).encode())


_HASHED: dict[str, str] = {}


def _hash_path_once(path: Path) -> str:
    """:func:`_hash_path`, once per path and run (a data root named by several notebooks'
    testbeds is listed once)."""
    if str(path) not in _HASHED:
        _HASHED[str(path)] = _hash_path(path)
    return _HASHED[str(path)]


def path_values(value: Any) -> list[Path]:
    """Existing files/folders named by string parameter values (relative to the repo root)."""
    if isinstance(value, str) and value and len(value) < 500 and "\n" not in value:
        p = (ROOT / value) if not os.path.isabs(value) else Path(value)
        try:
            if p.exists() and p.resolve() != ROOT:
                return [p]
        except OSError:
            return []
    if isinstance(value, (list, tuple)):
        return [q for v in value for q in path_values(v)]
    if isinstance(value, dict):
        return [q for v in value.values() for q in path_values(v)]
    return []


def compute_key(job: Job, shared: dict[str, str]) -> None:
    """Fill ``job.key``: what the executed notebook depends on (see module docstring)."""
    defaults = pparams.parse_defaults(parameters_cell(job.nb, job.name).source)
    named = {str(p): _hash_path(p) for v in [*defaults.values(), *job.overrides.values()]
             for p in path_values(v)}
    named.update({str(p): _hash_path_once(p) for spec in job.testbeds.values() for p in path_values(spec)})
    job.inputs = {**shared, **named}
    payload = {
        "version": KEY_VERSION,
        "notebook": _sha(job.source.read_bytes()),
        "params": job.overrides,
        "inputs": job.inputs,
    }
    if job.testbeds:  # named testbed definitions: what the notebook's testbeds are
        payload["testbeds"] = job.testbeds
    if job.variant:  # a variant's copy differs from the source by its title and note
        payload["variant"] = [job.variant, job.title]
    job.key = _sha(json.dumps(payload, sort_keys=True, default=str).encode())


def shared_inputs(patterns: list[str]) -> dict[str, str]:
    from pactlib.testbeds.base import source_fingerprint

    # the library's code, not its text: a comment or docstring edit re-runs no notebook
    out = {"pactlib": source_fingerprint(sorted(p for p in (ROOT / "pactlib").rglob("*.py")
                                                if "__pycache__" not in p.parts), ROOT)}
    lock = ROOT / "requirements.lock"
    if lock.exists():
        out["requirements.lock"] = _hash_path(lock)
    for pattern in patterns:
        for hit in sorted(glob.glob(pattern, recursive=True)):
            out[hit] = _hash_path(Path(hit))
    return out


# ---------------------------------------------------------------------------------------------
# execution


def stale_reason(job: Job, out_dir: Path) -> str | None:
    """None when the executed notebook is up to date, else what changed (for the log line)."""
    out_dir = job.out_dir(out_dir)
    nb_path, key_path = out_dir / f"{job.name}.ipynb", out_dir / f"{job.name}.key"
    if not (nb_path.is_file() and key_path.is_file()):
        return "not executed yet"
    try:
        old = json.loads(key_path.read_text())
        if old["key"] == job.key:
            return None
    except (ValueError, KeyError):
        return "unreadable key file"
    changed = []
    if old.get("notebook") != _sha(job.source.read_bytes()):
        changed.append("notebook")
    if old.get("params") != json.loads(json.dumps(job.overrides, default=str)):
        changed.append("parameters")
    old_inputs = old.get("inputs", {})
    changed += sorted(k for k in set(old_inputs) | set(job.inputs)
                      if old_inputs.get(k) != job.inputs.get(k))
    return "changed: " + ", ".join(changed) if changed else "key format changed"


def _failure(job: Job, exc: Exception, partial: Path) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        src = "\n".join("      | " + line for line in exc.source.splitlines()[:12])
        text = job.source.read_text(encoding="utf-8")
        at = text.find(exc.source) if exc.source.strip() else -1
        where = f"the cell at line {text.count(chr(10), 0, at) + 1}" if at >= 0 else "a cell"
        return (f"notebook {_rel(job.source)} failed in {where} "
                f"(code cell [{exc.exec_count}] of the executed notebook):\n{src}\n"
                f"    {exc.ename}: {exc.evalue}\n"
                f"    partial notebook with the traceback: {_rel(partial)}")
    return (f"notebook {_rel(job.source)} failed: {type(exc).__name__}: {exc}\n"
            f"    partial notebook (if any): {_rel(partial)}")


def execute(job: Job, out_dir: Path, set_name: str, *, progress: bool) -> float:
    """Run one notebook with papermill; write ``<name>.ipynb`` and ``<name>.key`` atomically.

    The kernel runs torch with ``job.threads`` threads (None: all the cores, :func:`default_threads`
    of one job); the count is recorded in the ``.key`` and the notebook's metadata, not hashed."""
    import logging

    import nbformat
    import papermill as pm

    # papermill's own parameter inference trips on comments such as "method.md's" and then
    # warns about "unknown" parameters; the runner has already parsed and validated them
    # (pactlib.book.params), so only papermill's errors are worth showing
    logging.getLogger("papermill").setLevel(logging.ERROR)

    out_dir = job.out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records_dir, figures_dir = out_dir / "records", out_dir / "figures"
    records_dir.mkdir(exist_ok=True)
    (records_dir / f"{job.name}.jsonl").unlink(missing_ok=True)  # records belong to a run
    (records_dir / f"{job.name}.verdicts.jsonl").unlink(missing_ok=True)
    for old in figures_dir.glob(f"fig{job.name[:2]}.*"):
        old.unlink()
    threads = job.threads or default_threads(1)
    kernel_env = {
        **kernel_threads_env(threads),  # the kernel's torch thread count (KERNEL_THREADS sets it)
        "PACT_PARAMS": set_name,
        "PACT_RECORDS_DIR": str(records_dir),
        "PACT_FIGURES_DIR": str(figures_dir),
        # which run this is: verdicts are recorded with it (pactlib.book.plotting.verdict)
        "PACT_NOTEBOOK": job.name,
        "PACT_RUN": job.variant or pparams.MAIN,
        "PACT_RUN_TITLE": job.title or pparams.MAIN,
        # pactlib finds the book's files and the caches by configuration only (pactlib.book.paths):
        # the book folder of this checkout, and the checkout's .cache unless PACT_CACHE says otherwise
        # (the Makefile exports the same)
        "PACT_BOOK_DIR": str(ROOT / "book"),
        "PACT_CACHE": os.environ.get("PACT_CACHE") or str(ROOT / ".cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    from pactlib import testbeds

    if testbeds.definitions():  # named testbeds (the parameter set's `testbeds:`), defined on import there
        kernel_env[testbeds.ENV] = json.dumps(testbeds.definitions(), sort_keys=True)
    nb = job.nb
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    tmp = out_dir / f".{job.name}.{os.getpid()}.ipynb"
    partial = out_dir / f"{job.name}.failed.ipynb"
    key_path = out_dir / f"{job.name}.key"
    t0 = time.perf_counter()
    saved_env = dict(os.environ)
    os.environ.update(kernel_env)  # the kernel inherits this process's environment
    try:
        result = pm.execute_notebook(
            nb, str(tmp), parameters=job.overrides, kernel_name=KERNEL, cwd=str(ROOT),
            progress_bar=progress, log_output=False, request_save_on_cell_execute=False,
            extra_arguments=[*KERNEL_ARGS, f"--IPKernelApp.exec_files={KERNEL_THREADS}"])
    except Exception as exc:  # papermill wrote the partial notebook to tmp
        if tmp.exists():
            os.replace(tmp, partial)
        raise RunError(_failure(job, exc, partial)) from exc
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    seconds = time.perf_counter() - t0
    result.metadata["pact"] = {"params_set": set_name, "key": job.key, "seconds": round(seconds, 2),
                               "threads": threads}
    nbformat.write(result, str(tmp))
    key_path.unlink(missing_ok=True)
    os.replace(tmp, out_dir / f"{job.name}.ipynb")
    partial.unlink(missing_ok=True)
    write_atomic(key_path, json.dumps({"key": job.key, "params": job.overrides,
                                        "notebook": _sha(job.source.read_bytes()),
                                        "inputs": job.inputs, "seconds": round(seconds, 2),
                                        "threads": threads},  # not part of the key: same results
                                       indent=1, sort_keys=True, default=str))
    return seconds


def _tag(i: int, total: int, name: str) -> str:
    """The prefix of a notebook's log lines: ``[ 5/12] 05_main_results   ``."""
    return f"[{i:2d}/{total}] {name:<{max(26, len(name))}}"


def _last_seconds(job: Job, out_dir: Path) -> float:
    """Seconds the notebook took last time (its key file), +inf when unknown: schedules it first."""
    try:
        return float(json.loads((job.out_dir(out_dir) / f"{job.name}.key").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return float("inf")


def _child(job: Job, out_dir: Path, set_name: str, queue) -> None:
    try:
        queue.put((job.id, execute(job, out_dir, set_name, progress=False), None))
    except RunError as exc:
        queue.put((job.id, None, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, which fails the run
        queue.put((job.id, None, f"notebook {job.id}: {type(exc).__name__}: {exc}"))


def execute_parallel(work: list[tuple[Job, str]], out_dir: Path, set_name: str, jobs: int,
                     total: int, index: dict[str, int]) -> None:
    """Execute ``work`` ((job, why) pairs) in up to ``jobs`` forked workers, longest first (by the
    time each took last; never-timed notebooks that others wait for start before the rest).

    Each worker runs :func:`execute`, its kernel with ``job.threads`` torch threads (None:
    ``max(1, cores // jobs)``, :func:`default_threads`). A job
    waits for the jobs :data:`AFTER` names when they are part of ``work``. After a failure no
    new job starts; the running ones finish, then :class:`RunError` lists every failure.
    """
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    for job, _ in work:
        job.threads = job.threads or default_threads(jobs)
    # longest first; among notebooks never timed, those that others wait for (AFTER) first
    waited_for = {dep for deps in AFTER.values() for dep in deps}
    pending = sorted(work, key=lambda jw: (-_last_seconds(jw[0], out_dir), jw[0].name not in waited_for))

    def after(job: Job) -> set[str]:  # the ids a job waits for: AFTER, within its own run
        return {Job(d, job.source, None, {}, variant=job.variant).id for d in AFTER.get(job.name, ())}

    running: dict[str, tuple[Any, float]] = {}
    errors: list[str] = []
    suspects: set[str] = set()
    last_status = time.perf_counter()
    tag = lambda name: _tag(index[name], total, name)  # noqa: E731
    while pending or running:
        while pending and len(running) < jobs and not errors:
            waiting = {j.id for j, _ in pending} | set(running)
            ready = [jw for jw in pending if not after(jw[0]) & (waiting - {jw[0].id})]
            if not ready:
                break
            job, why = ready[0]
            pending.remove((job, why))
            proc = ctx.Process(target=_child, args=(job, out_dir, set_name, queue), daemon=False)
            proc.start()
            running[job.id] = (proc, time.perf_counter())
            print(f"{tag(job.id)} executing with {set_name} ({why}; {job.threads} thread(s)) ...", flush=True)
        if not running:
            break
        try:
            name, seconds, err = queue.get(timeout=2)
        except queue_mod.Empty:  # show what runs now and then; look for a worker that died
            now = time.perf_counter()
            if now - last_status >= STATUS_EVERY:
                last_status = now
                print("   ... running: " + ", ".join(f"{n} ({now - t0:.0f} s)" for n, (_, t0) in running.items())
                      + (f"; waiting: {len(pending)}" if pending else ""), flush=True)
            # a worker reports before it exits: dead and still silent one timeout later = died
            dead = {n for n, (proc, _) in running.items() if not proc.is_alive()}
            for n in dead & suspects:
                proc = running.pop(n)[0]
                proc.join()
                errors.append(f"notebook {n}: its worker died without a report (exit code {proc.exitcode})")
            suspects = dead
            continue
        running.pop(name)[0].join()
        if err:
            errors.append(err)
            print(f"{tag(name)} FAILED", flush=True)
        else:
            print(f"{tag(name)} done in {seconds:.1f} s", flush=True)
    if pending and not errors:  # only a cycle in AFTER leaves jobs that can never start
        errors.append(f"cannot order {[j.id for j, _ in pending]}: they wait for each other (AFTER)")
    if errors:
        raise RunError("\n".join(errors))


# ---------------------------------------------------------------------------------------------
# rendering


VERDICTS_PAGE = "verdicts"
CLAIM = re.compile(r"^C(\d+)")


def variant_pages(params_file: Path) -> dict[str, list[str]]:
    """``{variant: [chapter stems]}`` of a set's variants (the main run not included)."""
    return {v: list(spec["chapters"]) for v, spec in pparams.variant_definitions(params_file).items()
            if v != pparams.MAIN}


def write_verdicts_page(set_name: str, params_file: Path) -> Path:
    """``book/_executed/<set>/verdicts.md``: every claim's verdict in every run (main and variants),
    read from the verdict records the chapters wrote (``records/<notebook>.verdicts.jsonl``)."""
    runs = pparams.variant_definitions(params_file)
    base = EXECUTED / set_name
    rows: dict[str, dict[str, str]] = {}
    chapter_of: dict[str, str] = {}
    for run in runs:
        folder = base / "records" if run == pparams.MAIN else base / run / "records"
        for path in sorted(folder.glob("*.verdicts.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    about = rec.get("run") if rec.get("run") in runs else run  # a verdict on another run's testbed
                    rows.setdefault(rec["claim"], {})[about] = rec["status"]
                    chapter_of.setdefault(rec["claim"], path.name.split("_")[0].lstrip("0"))
    order = sorted(rows, key=lambda c: (int(m.group(1)) if (m := CLAIM.match(c)) else 999, c))
    used = [r for r in runs if any(r in rows[c] for c in rows)] or [pparams.MAIN]
    lines = ["# Verdicts at a glance", "",
             "Every claim's verdict, from the chapter that tests it, on each testbed the book ran "
             f"(parameter set `{set_name}`). The evidence is in the chapter, beside the verdict.", "",
             "| Claim | Chapter | " + " | ".join(runs[r]["title"] for r in used) + " |",
             "|---|---|" + "---|" * len(used)]
    for claim in order:
        lines.append(f"| {claim} | {chapter_of[claim]} | "
                     + " | ".join(rows[claim].get(r, "not run") for r in used) + " |")
    if not order:
        lines.append("| (no verdicts recorded yet) | | " + " | " * len(used))
    lines += execution_times(base, runs)
    path = base / f"{VERDICTS_PAGE}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def execution_times(base: Path, runs: dict[str, dict]) -> list[str]:
    """Markdown lines: minutes of kernel time of each chapter's last execution in each run (the
    ``seconds`` of its ``.key`` under ``base``), with a total per run; [] when nothing ran. Where a
    book's time goes, measured by the runner itself (issue: the book's budget)."""
    cols = [r for r in runs if any((base if r == pparams.MAIN else base / r).glob("*.key"))]
    if not cols:
        return []
    secs: dict[str, dict[str, float]] = {}
    for run in cols:
        for key in sorted((base if run == pparams.MAIN else base / run).glob("*.key")):
            try:
                secs.setdefault(key.stem, {})[run] = float(json.loads(key.read_text(encoding="utf-8"))["seconds"])
            except (ValueError, KeyError, TypeError):
                continue  # an old or hand-made key without a time: left out
    fmt = lambda s: f"{s / 60:.1f}"  # noqa: E731
    lines = ["", "## Where the time goes", "",
             "Minutes of kernel time of each chapter's last execution, as the runner measured it "
             "(the `seconds` of the chapter's `.key`; chapters run two at a time, so a book's wall "
             "time is about half the total on two cores, less the waits).", "",
             "| Chapter | " + " | ".join(runs[r]["title"] for r in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for stem in sorted(secs):
        lines.append(f"| {stem} | " + " | ".join(fmt(secs[stem][r]) if r in secs[stem] else "–" for r in cols) + " |")
    lines.append("| **total** | " + " | ".join(f"**{fmt(sum(v.get(r, 0.0) for v in secs.values()))}**"
                                             for r in cols) + " |")
    return lines


def toc_for(set_name: str, params_file: Path | None = None) -> Path:
    """The set's table of contents, ``book/_executed/<set>/_toc.yml``: ``_toc.yml`` pointed at the
    set's folder, each chapter with its variants' pages as sections, and the verdicts page."""
    prefix = f"book/_executed/{set_name}/"
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    variants = variant_pages(params_file) if params_file is not None else {}
    titles = pparams.variant_definitions(params_file) if params_file is not None else {}
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            f = chapter.get("file", "")
            if f.startswith(TOC_PREFIX):
                stem = f[len(TOC_PREFIX):]
                chapter["file"] = prefix + stem
                extra = [{"file": f"{prefix}{v}/{stem}"} for v, stems in variants.items() if stem in stems]
                if extra:
                    chapter["sections"] = extra
    at = next((i for i, p in enumerate(toc.get("parts", [])) if p.get("caption", "").startswith("About")),
              len(toc.get("parts", [])))
    toc.setdefault("parts", []).insert(at, {"caption": "Verdicts", "chapters": [{"file": prefix + VERDICTS_PAGE}]})
    path = EXECUTED / set_name / "_toc.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "# generated by scripts/run_notebooks.py from _toc.yml and params/" + set_name
                  + ".yaml (variants: " + ", ".join(t["title"] for t in titles.values()) + ")\n"
                  + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True))
    return path


def expected_pages(params_file: Path) -> list[str]:
    """Executed notebooks the set's book shows: ``stem`` and ``<variant>/<stem>``."""
    return toc_chapters() + [f"{v}/{stem}" for v, stems in variant_pages(params_file).items() for stem in stems]


def html_dir_for(set_name: str, out: Path | None) -> tuple[Path, Path]:
    """(``--path-output`` for jupyter-book, the HTML folder it produces)."""
    if out is None:
        out = ROOT if set_name == DEFAULT_SET else ROOT / "_build" / set_name
    return out, out / "_build" / "html"


def render(set_name: str, out: Path | None, params_file: Path) -> Path:
    missing = [c for c in expected_pages(params_file) if not (EXECUTED / set_name / f"{c}.ipynb").is_file()]
    if missing:
        raise RunError(f"cannot render the {set_name!r} book: not executed yet: {missing} "
                       f"(run the whole set, or pass --no-render)")
    path_output, html = html_dir_for(set_name, out)
    write_verdicts_page(set_name, params_file)
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT),
           "--toc", str(toc_for(set_name, params_file)), "--path-output", str(path_output),
           "-W", "-n", "--keep-going", "-q"]
    print(f">> rendering with jupyter-book -> {_rel(html)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise RunError(f"jupyter-book build failed (exit {proc.returncode}); command: {' '.join(cmd)}")
    print(f">> rendered in {time.perf_counter() - t0:.1f} s", flush=True)
    return html


def check_html(html: Path, set_name: str, params_file: Path) -> None:
    """Every chapter page (variants' too) exists, shows its figures, and nothing is fetched from the web."""
    problems = []
    index = html / "index.html"
    if not index.is_file():
        problems.append(f"missing {index}")
    for stem in [*expected_pages(params_file), VERDICTS_PAGE]:
        page = html / "book" / "_executed" / set_name / f"{stem}.html"
        if not page.is_file():
            problems.append(f"missing chapter page {page}")
    mathjax_ok = False
    pages = [p for p in sorted(html.rglob("*.html")) if "_static" not in p.relative_to(html).parts]
    for page in pages:
        text = page.read_text(encoding="utf-8", errors="replace")
        for tag in FETCH.finditer(text):
            url = tag.group(1)
            if tag.group(0).lower().startswith("<link") and "stylesheet" not in tag.group(0) \
                    and "preload" not in tag.group(0) and "icon" not in tag.group(0):
                continue  # <link rel="next"/"search"/...>: navigation, nothing is fetched
            if REMOTE.match(url):
                problems.append(f"{page.relative_to(html)} fetches a remote asset: {url}")
            elif not url.startswith(("data:", "#")) and \
                    not (page.parent / url.split("?")[0].split("#")[0]).exists():
                problems.append(f"{page.relative_to(html)} refers to a missing file: {url}")
            elif "tex-mml-chtml.js" in url:
                mathjax_ok = True
    if not mathjax_ok:
        problems.append("no page loads the local MathJax (run scripts/setup_book_assets.sh)")
    if problems:
        raise RunError("the rendered book failed its checks:\n  " + "\n  ".join(problems[:30]))


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=DEFAULT_SET,
                    help="parameter set: a name under params/ (default: default) or a YAML path")
    ap.add_argument("--only", nargs="+", metavar="NB", help="notebook stems or prefixes (e.g. 05)")
    ap.add_argument("-p", dest="set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a parameter (YAML value) in the selected notebooks that have it")
    ap.add_argument("--inputs", action="append", default=None, metavar="GLOB",
                    help="files whose content is part of every notebook's key (zoo/data "
                         "manifests); default: $PACT_BOOK_INPUTS (space-separated globs)")
    ap.add_argument("--run", action="append", default=None, metavar="RUN",
                    help="only this run of the selected notebooks: 'main' or a variant of the set "
                         "(repeatable; default: every run)")
    ap.add_argument("--force", action="store_true", help="re-execute even when up to date")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("PACT_BOOK_JOBS", "1")),
                    help="notebooks executed at once (default: $PACT_BOOK_JOBS or 1)")
    ap.add_argument("--threads", default=None, metavar="N",
                    help="torch threads of each kernel (torch.set_num_threads as it imports torch), a "
                         "whole number from 1 to 4096; merges and the PACT filter run that many layers "
                         "at once. Precedence: this option (make THREADS=N) > the set's `threads:` (a "
                         "variant's chapter values > the chapter's section > common:; null = the "
                         "default) > cores / --jobs (the default). Not part of the cache key: merges and "
                         "filters are bit-identical for any count (other sums may differ by float noise, "
                         "chapter 8's timings do depend on it), so a new count re-executes nothing; add "
                         "--force to re-time")
    ap.add_argument("--no-render", action="store_true", help="execute only")
    ap.add_argument("--render-only", action="store_true", help="render what is executed")
    ap.add_argument("--path-output", type=Path, default=None,
                    help="jupyter-book output folder (HTML in <it>/_build/html)")
    ap.add_argument("--check-only", action="store_true",
                    help="validate notebooks and parameters, execute nothing")
    ap.add_argument("--needs", action="store_true",
                    help="print the make targets producing the selected notebooks' inputs ('data zoo' when "
                         "a run names a Lite0 / MiniLM testbed, else nothing), run nothing")
    args = ap.parse_args(argv)

    params_file = Path(args.params) if args.params.endswith((".yaml", ".yml")) \
        else PARAMS_DIR / f"{args.params}.yaml"
    if args.needs:
        try:
            with contextlib.chdir(ROOT):
                needs = book_needs(notebook_paths(args.only), params_file.resolve(), parse_cli(args.set), args.run)
        except (pparams.ParameterError, FileNotFoundError, RunError) as exc:
            print(f"run_notebooks: --needs: {exc}; answering {' '.join(NEEDS)!r}", file=sys.stderr)
            print(" ".join(NEEDS))
            return 2
        print(" ".join(needs))
        return 0
    set_name = params_file.stem
    out_dir = EXECUTED / set_name
    t_all = time.perf_counter()
    try:
        missing = sorted(set(p.stem for p in notebook_paths(None)) ^ set(toc_chapters()))
        if missing:
            raise RunError(f"notebooks and _toc.yml disagree on chapters: {missing}")
        cli_threads = threads_option(args.threads)
        if args.jobs < 1:  # before anything runs (make book-check passes it too)
            raise pparams.ParameterError(f"--jobs must be a whole number >= 1, got {args.jobs}")
        paths = notebook_paths(args.only)
        jobs = prepare(paths, params_file, parse_cli(args.set))
        if args.run:
            runs = pparams.variant_definitions(params_file)
            unknown = sorted(set(args.run) - set(runs))
            if unknown:
                raise pparams.ParameterError(f"--run {unknown}: {params_file.name} has the runs {list(runs)}")
            jobs = [j for j in jobs if (j.variant or pparams.MAIN) in args.run]
        if args.check_only:
            extra = len(jobs) - len(paths)
            counts = sorted({resolve_threads(cli_threads, j, args.jobs) for j in jobs})
            print(f"parameters of {len(paths)} notebook(s) are valid ({params_file.name}"
                  + (f"; {extra} more run(s) in variants)" if extra else ")")
                  + (f"; torch threads per kernel: {', '.join(map(str, counts))}" if counts else ""))
            return 0
        if not args.render_only:
            patterns = args.inputs if args.inputs is not None else \
                os.environ.get("PACT_BOOK_INPUTS", "").split()
            shared = shared_inputs(patterns)
            progress = sys.stderr.isatty()
            work, index = [], {}
            for i, job in enumerate(jobs, 1):
                job.threads = resolve_threads(cli_threads, job, args.jobs)
                compute_key(job, shared)
                index[job.id] = i
                why = "--force" if args.force else stale_reason(job, out_dir)
                if why is None:
                    print(f"{_tag(i, len(jobs), job.id)} up to date", flush=True)
                else:
                    work.append((job, why))
            t_exec = time.perf_counter()
            if args.jobs > 1 and len(work) > 1:
                execute_parallel(work, out_dir, set_name, args.jobs, len(jobs), index)
            else:
                for job, why in work:
                    tag = _tag(index[job.id], len(jobs), job.id)
                    print(f"{tag} executing with {set_name} ({why}; {job.threads} thread(s)) ...", flush=True)
                    seconds = execute(job, out_dir, set_name, progress=progress)
                    print(f"{tag} done in {seconds:.1f} s", flush=True)
            if work:
                print(f">> executed {len(work)} notebook(s) in {time.perf_counter() - t_exec:.1f} s", flush=True)
        missing = [c for c in expected_pages(params_file) if not (EXECUTED / set_name / f"{c}.ipynb").is_file()]
        if args.only and missing and not args.no_render:
            # one chapter of a set whose others never ran: executing it was the point; the book
            # is rendered once every chapter has been executed (a run without --only)
            print(f">> not rendering the {set_name!r} book yet: chapter(s) {', '.join(missing)} not executed "
                  f"(run the set without --only to render); executed notebooks: {_rel(out_dir)}", flush=True)
        elif not args.no_render:
            html = render(set_name, args.path_output, params_file)
            check_html(html, set_name, params_file)
            print(f">> book ready: {html / 'index.html'} ({time.perf_counter() - t_all:.1f} s total)")
    except pparams.ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (RunError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
