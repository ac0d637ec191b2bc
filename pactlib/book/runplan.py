"""The book runner's plan: parameters from the command line, thread counts from a set, the
testbeds a set defines and names, the make targets a run needs, a variant's copy of a notebook,
the present copy of a notebook, and the pool that runs chapters side by side.

Used by ``scripts/run_notebooks.py`` before anything executes; errors are
:class:`pactlib.book.params.ParameterError` naming the parameter and where it was given.
"""
from __future__ import annotations

import json
import os
import re
import sys
import multiprocessing as mp
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pactlib.book import params as pparams
from pactlib.book import chapters as nbchapters

__all__ = ["ZOO_FAMILIES", "NEEDS", "relay_progress", "SHOW_TAG", "family_needs", "MAX_THREADS", "THREADS", "ChapterValues", "chapter_values", "book_needs",
           "check_threads", "threads_option",
           "set_thread_problems", "parameters_cell", "parse_cli", "define_testbeds", "named_testbeds",
           "decorate_variant", "RunError", "Job", "COMPUTE_TAG", "BENCH_TAG", "is_compute", "notebook_hash",
           "testbed_hashes", "kernel_env", "failure_message", "under_title", "present_copy", "restore_skipped",
           "shown_parameters", "bench_sections", "bench_label",
           "run_parallel", "plan_jobs", "ZooJob", "zoo_jobs", "job_families"]

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
#: What ``--needs`` prints when every family is needed (and when the set cannot be read): mk/book.mk's
#: targets. One family's runs need only its own targets, ``data-<family> zoo-<family>``.
NEEDS = ("data", "zoo")


def family_needs(family: str) -> list[str]:
    """The make targets that produce one :data:`ZOO_FAMILIES` family's inputs: its data and its zoo."""
    return [f"data-{family}", f"zoo-{family}"]


def _zoo_families(values: dict[str, Any]) -> set[str]:
    """The :data:`ZOO_FAMILIES` a notebook's final parameter values name a testbed of (in a
    parameter whose name holds ``testbed``: ``testbed``, ``testbeds``, ``minilm_testbed``)."""
    from pactlib import testbeds

    smoke = values.get("zoo_profile") == "smoke"
    found = set()
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
                found.add(family)
    return found


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
    """The make targets that produce the inputs of ``paths`` run with ``params_file`` and the
    ``-p`` values ``cli``: for each family of :data:`ZOO_FAMILIES` that a run (the main one and
    the set's variants, or only ``runs``) names a testbed of, its :func:`family_needs`
    (:data:`NEEDS` when every family is named), else ``[]``. Reads
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
    families: set[str] = set()
    for variant, chapters in plan:
        for path in paths:
            if chapters is not None and path.stem not in chapters:
                continue
            values = chapter_values(jupytext.read(path), path, params_file, variant or None, cli)
            families |= _zoo_families({**values.defaults, **values.given})
    if families == set(ZOO_FAMILIES):
        return list(NEEDS)
    return [target for family in ZOO_FAMILIES if family in families for target in family_needs(family)]


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
        ParameterError: a pair is not ``name=value`` with a Python name, a name is given twice,
            or a value is not YAML (a one-line message: the runner prints it and exits with status 2).
    """
    out, raws = {}, {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise pparams.ParameterError(f"-p {pair!r}: expected name=value (e.g. -p alpha_points=5)")
        if not name.isidentifier():
            raise pparams.ParameterError(f"-p {pair!r}: {name!r} is not a parameter name")
        if name in raws:
            raise pparams.ParameterError(f"-p {name}: given twice ({raws[name]!r}, then {raw!r}); give each "
                                         f"parameter once")
        raws[name] = raw
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


# ---------------------------------------------------------------------------------------------
# one run of one chapter, and what the runner does to its notebook


class RunError(RuntimeError):
    """A notebook failed, or the rendered book failed a check."""


#: A code cell that runs only in compute mode; in present mode it is shown, folded, unexecuted.
COMPUTE_TAG = "compute"
#: Present cells that read only committed benchmark data (``book/data/``): they run even when the
#: chapter has no records yet.
BENCH_TAG = "bench-data"


def _tags(cell: Any) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


@dataclass
class Job:
    """One run of one chapter: the notebook, its parameters and the state of its records."""
    name: str
    source: Path
    nb: Any  # nbformat.NotebookNode
    overrides: dict[str, Any]
    testbeds: dict[str, dict] = field(default_factory=dict)  # definitions of the testbeds it names
    variant: str = ""  # "" for the main run, else a variant of the set's `variants:` section
    title: str = ""    # the run's title (the variant's, or the main run's)
    threads: int | None = None  # the kernel's torch threads; None: the runner's default
    params: dict[str, Any] = field(default_factory=dict)  # defaults + overrides: what the chapter runs with
    defaults: dict[str, Any] = field(default_factory=dict)  # its model's defaults (= its parameters cell)
    reasons: list[str] = field(default_factory=list)  # why its records are not current ([]: current)

    @property
    def id(self) -> str:
        """``05_main_results`` for the main run, ``minilm/05_main_results`` for a variant's."""
        return self.sibling(self.name)

    @property
    def run(self) -> str:
        return self.variant or pparams.MAIN

    def sibling(self, chapter: str) -> str:
        """The id of ``chapter`` in this job's run."""
        return f"{self.variant}/{chapter}" if self.variant else chapter

    def out_dir(self, base: Path) -> Path:
        """Where the executed notebook and its figures go: ``base`` or ``base/<variant>``."""
        return base / self.variant if self.variant else base


@dataclass
class ZooJob:
    """Building (or completing) one family's model zoo, ``python -m pactlib.testbeds.<family>.testbed
    default`` (what ``make zoo-<family>`` runs), as a job of the runner: chapters that read that
    zoo wait for it (:func:`run_parallel`'s ``needs``), the other family's chapters run beside it.
    Finished zoo runs are kept (the build resumes), so on a complete zoo it only checks the files.
    """
    family: str
    threads: int = 1
    variant: str = ""

    @property
    def name(self) -> str:
        return f"zoo-{self.family}"

    @property
    def id(self) -> str:
        return self.name

    def sibling(self, chapter: str) -> str:
        return chapter

    def command(self) -> list[str]:
        return [sys.executable, "-m", f"pactlib.testbeds.{self.family}.testbed", "default"]

    def build(self, log: Path) -> dict[str, Any]:
        """Run the build with :attr:`threads` torch threads, its output to ``log``; return
        ``{"wall_minutes": …, "cpu_minutes": …}``.

        Raises:
            RunError: the build failed (its exit status and the last lines of ``log``).
        """
        import resource
        import subprocess
        import time

        log.parent.mkdir(parents=True, exist_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        with log.open("wb") as fh:
            proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env={**os.environ, **kernel_env(self.threads)})
            relay_progress(proc.stdout, fh, self.id)
            rc = proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if rc:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RunError(f"{self.id}: `{' '.join(self.command()[1:])}` exited with {rc}; the end of {_rel(log)}:\n"
                           + "\n".join(tail))
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return {"wall_minutes": round((time.perf_counter() - t0) / 60, 2), "cpu_minutes": round(cpu / 60, 2)}


def relay_progress(stream: Any, log: Any, tag: str, *, every: float = 30.0, out: Any = None) -> None:
    """Copy a build's output ``stream`` (bytes) into ``log`` as it comes, and print its latest
    line (a tqdm bar ends its updates with a carriage return) to ``out`` (default: stdout) as
    ``[tag] <line>`` at most once every ``every`` seconds, and its last line at the end: the
    terminal shows a zoo build's progress and time left while the log keeps everything."""
    import time

    out = out or sys.stdout
    latest, pending, last = b"", b"", time.monotonic()

    def show(line: bytes) -> None:
        print(f"[{tag}] {line.decode('utf-8', errors='replace').strip()}", file=out, flush=True)

    while chunk := stream.read1(1 << 16):
        log.write(chunk)
        log.flush()
        *lines, pending = re.split(rb"[\r\n]", pending + chunk)
        if shown := [ln for ln in lines if ln.strip()]:
            latest = shown[-1]
        if latest and time.monotonic() - last >= every:
            show(latest)
            latest, last = b"", time.monotonic()
    if pending.strip():
        latest = pending
    if latest:
        show(latest)


def zoo_jobs(jobs: Sequence[Job], threads: int) -> list[ZooJob]:
    """One :class:`ZooJob` per :data:`ZOO_FAMILIES` family a job of ``jobs`` names a testbed of
    (its final parameter values; a Lite0 testbed on the ``smoke`` zoo profile builds its own)."""
    families = set().union(*(job_families(j) for j in jobs)) if jobs else set()
    return [ZooJob(f, threads) for f in ZOO_FAMILIES if f in families]


def job_families(job: Job) -> set[str]:
    """The :data:`ZOO_FAMILIES` whose zoo ``job`` reads."""
    return _zoo_families(job.params)


def is_compute(cell: Any) -> bool:
    return cell.cell_type == "code" and COMPUTE_TAG in _tags(cell)


def notebook_hash(nb: Any) -> str:
    """:func:`pactlib.book.provenance.notebook_hash` of the compute cells of ``nb`` (every code
    cell but the parameters when none is tagged ``compute``)."""
    from pactlib.book import provenance

    cells = [c for c in nb.cells if is_compute(c)] or \
        [c for c in nb.cells if c.cell_type == "code" and "parameters" not in _tags(c)]
    return provenance.notebook_hash([c.source for c in cells])


def testbed_hashes(definitions: dict[str, dict]) -> dict[str, str]:
    """``{testbed: sha256 of its definition}`` for the provenance."""
    from pactlib.book import provenance

    return {name: provenance.sha(json.dumps(spec, sort_keys=True, default=str).encode())
            for name, spec in definitions.items()}


def kernel_env(threads: int) -> dict[str, str]:
    """The environment that gives a kernel ``threads`` torch threads (with
    ``scripts/kernel_threads.py``); BLAS libraries reading ``OMP_NUM_THREADS`` follow it too."""
    return {"PACT_THREADS": str(int(threads)), "OMP_NUM_THREADS": str(int(threads)),
            "MKL_NUM_THREADS": str(int(threads))}


def failure_message(source: Path, exc: BaseException, partial: str) -> str:
    """What the runner says when papermill failed on the notebook ``source``: the cell (its line
    in ``source``), its first lines, the exception and the ``partial`` notebook kept."""
    from papermill.exceptions import PapermillExecutionError

    if not isinstance(exc, PapermillExecutionError):
        return f"notebook {_rel(source)} failed: {type(exc).__name__}: {exc}\n    partial notebook (if any): {partial}"
    text = Path(source).read_text(encoding="utf-8")
    at = text.find(exc.source) if exc.source.strip() else -1
    where = f"the cell at line {text.count(chr(10), 0, at) + 1}" if at >= 0 else "a cell"
    code = "\n".join("      | " + line for line in exc.source.splitlines()[:12])
    return (f"notebook {_rel(source)} failed in {where} (code cell [{exc.exec_count}] of the executed notebook):\n"
            f"{code}\n    {exc.ename}: {exc.evalue}\n    partial notebook with the traceback: {partial}")


def under_title(nb: Any, text: str) -> None:
    """Put markdown ``text`` right under the notebook's title (its first ``# `` line), in place."""
    import nbformat

    if not text:
        return
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
            title, _, rest = cell.source.lstrip().partition("\n")
            cell.source = f"{title}\n\n{text}\n\n{rest.lstrip()}".rstrip() + "\n"
            return
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))


def _literal(value: Any) -> str:
    """``value`` (a YAML value: str, number, bool, None, list, dict) as Python source, strings in
    double quotes as the notebooks write them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def shown_parameters(source: str, changed: dict[str, Any]) -> str:
    """The parameters cell ``source`` as a run that sets ``changed`` executes it: each assignment of
    a changed name shows the run's value, and its comment the notebook's default instead of the
    default's description (which may not hold for the run's value). Other lines stay as they are.
    What runs is unchanged: papermill's cell after it sets the same values."""
    import ast

    lines = source.split("\n")
    for node in reversed(ast.parse(source).body):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in changed):
            continue
        name, default = node.targets[0].id, " ".join(ast.get_source_segment(source, node.value).split())
        last = lines[node.end_lineno - 1].encode()
        rest = last[node.end_col_offset:].decode()
        column = len(last[:node.end_col_offset].decode()) + len(rest) - len(rest.lstrip()) \
            if node.lineno == node.end_lineno and rest.lstrip().startswith("#") else 0
        code = f"{name} = {_literal(changed[name])}"
        lines[node.lineno - 1:node.end_lineno] = [
            f"{code.ljust(column - 2)}  # this run's value; the notebook's default: {default}"]
    return "\n".join(lines)


_HEADING = re.compile(r"^(#{2,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})")


def _pieces(nb: Any) -> list[dict[str, Any]]:
    """The notebook as a sequence of pieces: each code cell, and each markdown cell cut before
    every section heading (``##`` to ``######``, outside fenced blocks): ``{"cell": index,
    "lines": [...], "level": heading level or 0, "title": heading text}``."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            out.append({"cell": i, "lines": None, "level": 0, "title": ""})
            continue
        fence, piece = None, None
        for line in cell.source.split("\n"):
            m = None if fence else _HEADING.match(line)
            if f := _FENCE.match(line):
                mark = f.group(1)
                if fence is None:
                    fence = mark
                elif line.strip() == fence[0] * len(line.strip()) and len(line.strip()) >= len(fence):
                    fence = None
            if m or piece is None:
                piece = {"cell": i, "lines": [], "level": len(m.group(1)) if m else 0,
                         "title": m.group(2) if m else ""}
                out.append(piece)
            piece["lines"].append(line)
    return out


def bench_label(chapter: str, title: str) -> str:
    """The MyST label of a :func:`bench_sections` section of ``chapter`` on the main run's page."""
    return "pact-" + re.sub(r"[^a-z0-9]+", "-", f"{chapter} {title}".lower()).strip("-")


def bench_sections(nb: Any, chapter: str, variant: str) -> list[str]:
    """Sections that show only committed benchmark data (every code cell in them, and at least one,
    tagged :data:`BENCH_TAG`), in place: the same on every run, so the main run's page shows them
    and a variant's page points there. On the main run (``variant`` empty) each such heading gets
    a label (:func:`bench_label`); on a variant's run its heading stays, followed by one line that
    links to the main page's section, its other markdown is dropped and its code cells still run
    (later cells may use what they define) but are removed from the page (``remove-cell``).
    Returns the titles of those sections (outermost only)."""
    pieces = _pieces(nb)
    chosen, i = [], 0
    while i < len(pieces):
        level = pieces[i]["level"]
        if not level:
            i += 1
            continue
        j = next((k for k in range(i + 1, len(pieces)) if 0 < pieces[k]["level"] <= level), len(pieces))
        code = [nb.cells[p["cell"]] for p in pieces[i:j] if p["lines"] is None and nb.cells[p["cell"]].cell_type == "code"]
        if code and all(BENCH_TAG in _tags(c) for c in code):
            chosen.append((i, j))
            i = j
        else:
            i += 1
    if not chosen:
        return []
    for i, j in chosen:
        head = pieces[i]
        label = bench_label(chapter, head["title"])
        if not variant:  # a target starts a block: after a blank line when text comes right before it
            before = pieces[i - 1] if i and pieces[i - 1]["cell"] == head["cell"] else None
            gap = [""] if before and before["lines"] and before["lines"][-1].strip() else []
            head["lines"] = [*gap, f"({label})=", *head["lines"]]
            continue
        head["lines"] = [head["lines"][0], "", f"This section shows committed benchmark data (`book/data/`), not this "
                         f"run's records, so it is the same on every run; it is in the main run's chapter: "
                         f"{{ref}}`{label}`."]
        for p in pieces[i + 1:j]:
            if p["lines"] is None:
                cell = nb.cells[p["cell"]]
                cell.metadata["tags"] = [*_tags(cell), "remove-cell"]
            else:
                p["lines"] = []
    changed = {p["cell"] for i, j in chosen for p in pieces[i:j]}
    for index in sorted(changed, reverse=True):
        cell = nb.cells[index]
        if cell.cell_type != "markdown":
            continue
        text = "\n".join(line for p in pieces if p["cell"] == index for line in p["lines"]).rstrip()
        if text.strip():
            cell.source = text
        else:
            del nb.cells[index]
    return [pieces[i]["title"] for i, _ in chosen]


def present_copy(nb: Any, *, missing: bool, changed: dict[str, Any], store: str, top: str,
                 chapter: str = "", variant: str = "") -> Any:
    """A copy of ``nb`` for present mode: compute cells (with ``missing`` records: every code cell
    after the parameters but the :data:`BENCH_TAG` ones) become raw cells, unexecuted; the
    parameters' ``.check(globals())`` plumbing hides its input; the parameters cell shows the
    ``changed`` values (:func:`shown_parameters`), a sentence before it says them; ``top``
    (markdown) goes under the title. With ``chapter``, the sections of benchmark data are the main
    run's (a variant's page links to them, :func:`bench_sections`)."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    if chapter:
        bench_sections(nb, chapter, variant)
    seen_params = False
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        seen_params |= "parameters" in tags
        if cell.cell_type != "code" or "parameters" in tags:
            continue
        if ".check(globals())" in cell.source and "remove-input" not in tags:
            tags.append("remove-input")  # plumbing: the values are in the parameters cell
        if is_compute(cell) or (missing and seen_params and BENCH_TAG not in tags):
            cell.cell_type = "raw"
            cell.metadata["pact_skipped"] = True
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    if changed:  # papermill's cell with the values in effect is removed from the page: the cell shows them
        at = next(i for i, c in enumerate(nb.cells) if "parameters" in _tags(c))
        nb.cells[at].source = shown_parameters(nb.cells[at].source, changed)
        if not any("variant-note" in _tags(c) for c in nb.cells):  # a variant's note lists its values
            nb.cells.insert(at, nbformat.v4.new_markdown_cell(
                f"*This run (parameter set `{store}`) sets " + ", ".join(f"`{k} = {v!r}`" for k, v in changed.items())
                + ".*", metadata={"tags": ["pact-parameters"]}))
    under_title(nb, top)
    return nb


#: A code cell with this tag keeps its code open on the page (every other one but the parameters
#: cell is folded: the page shows what the code drew, the reader opens the code on demand).
SHOW_TAG = "show-input"
_OPEN = frozenset({"parameters", SHOW_TAG, "hide-input", "remove-input", "remove-cell", "injected-parameters"})


def restore_skipped(nb: Any) -> None:
    """After execution (in place): the skipped cells are code again, without output and folded;
    papermill's injected-parameters cell is removed from the page; every other code cell but the
    parameters cell and those tagged :data:`SHOW_TAG` is folded (``hide-input``: its figures, tables
    and verdicts stay open); a cell that drew a figure gets the figure's alt text
    (:func:`pactlib.book.plotting.figure` puts it in the PNG output's metadata) as its image option."""
    for cell in nb.cells:
        if cell.metadata.pop("pact_skipped", False):
            cell.cell_type, cell.outputs, cell.execution_count = "code", [], None
            cell.metadata["tags"] = [*_tags(cell), "hide-input"]
        elif "injected-parameters" in _tags(cell):
            cell.metadata["tags"] = [*cell.metadata["tags"], "remove-cell"]
        elif cell.cell_type == "code":
            if not _OPEN & set(_tags(cell)):
                cell.metadata["tags"] = [*_tags(cell), "hide-input"]
            alts = [o.get("metadata", {}).get("image/png", {}).get("alt") for o in cell.get("outputs", [])
                    if "image/png" in o.get("data", {})]
            if alts := [a for a in alts if a]:  # myst-nb reads an image's alt from its cell only
                cell.metadata.setdefault("mystnb", {}).setdefault("image", {})["alt"] = " / ".join(alts)


def plan_jobs(paths: list[Path], params_file: Path, cli: dict[str, Any], *, every: bool) -> list[Job]:
    """Every run (the main one, then each of the set's variants) of the notebooks ``paths`` with the
    set ``params_file`` and the ``-p`` values ``cli``, checked by each chapter's model; nothing
    runs. ``every``: ``paths`` are all the book's notebooks (then ``common`` must be used).

    Raises:
        ParameterError: every problem (each said once), naming notebook, set and parameter.
    """
    import jupytext

    from pactlib import testbeds

    problems, variants = set_thread_problems(params_file), {}
    for step in (define_testbeds, pparams.variant_definitions):
        try:
            variants = step(params_file)
        except (pparams.ParameterError, FileNotFoundError) as exc:
            problems.append(str(exc))
            variants = {}
    main = variants.pop(pparams.MAIN, {})
    jobs, declared, said = [], set(), set()  # said: (chapter, problem); a variant meets the main run's
    for variant, spec in [("", {**main, "chapters": None}), *variants.items()]:
        for path in paths:
            if spec["chapters"] is not None and path.stem not in spec["chapters"]:
                continue
            where = f"{_rel(path)} with {_rel(params_file)}" + (f" (variant {variant!r})" if variant else "")
            try:
                nb = jupytext.read(path)
                values = chapter_values(nb, path, params_file, variant or None, cli)
                declared |= set(values.defaults)
                final = nbchapters.validate(values.model, values.given, where=where, origins=values.origins)
            except (pparams.ParameterError, FileNotFoundError) as exc:
                for problem in getattr(exc, "problems", None) or [str(exc)]:
                    if (path.stem, problem) not in said:
                        said.add((path.stem, problem))
                        problems.append(f"{where}: {problem}" if hasattr(exc, "problems") else problem)
                continue
            threads = values.threads if type(values.threads) is int and values.threads >= 1 else None
            if variant:
                decorate_variant(nb, variant, spec["title"], params_file.stem, spec["chapters"][path.stem])
            used = sorted(named_testbeds(list(final.values())))
            jobs.append(Job(path.stem, path, nb, {k: final[k] for k in values.given}, variant=variant,
                            title=spec.get("title", ""), threads=threads, params=final, defaults=values.defaults,
                            testbeds={n: testbeds.definitions()[n] for n in used}))
    for name in sorted({n for j in jobs for n in j.testbeds}):
        if missing := testbeds.missing_paths(name):
            users = ", ".join(j.name[:2] for j in jobs if name in j.testbeds)
            problems.append(f"{_rel(params_file)}: testbeds: {name!r} (used by chapters {users}) names paths that "
                            "do not exist; edit them: " + "; ".join(f"option {o!r}: {p}" for o, p in missing))
    if every:  # every notebook: `common` must be used somewhere
        try:
            common = (yaml.safe_load(params_file.read_text()) or {}).get(pparams.COMMON) or {}
        except (OSError, yaml.YAMLError, AttributeError):
            common = {}  # already reported
        if unused := sorted(set(common) - declared - {THREADS}):
            problems.append(f"{_rel(params_file)}: common {unused} is declared by no notebook; "
                            f"known: {sorted(declared)}")
    if THREADS in cli:
        problems.append(f"-p {THREADS}={cli[THREADS]!r}: the kernels' thread count is not a notebook parameter; "
                        f"use --threads N (make book/chapter THREADS=N)")
    if stray := sorted(set(cli) - declared - {THREADS}):
        problems.append(f"-p {stray}: no selected notebook has such a parameter; known: {sorted(declared)}")
    if problems:  # a problem of the set itself is met once per notebook and run: each said once
        raise pparams.ParameterError("\n  ".join(["bad parameters:", *dict.fromkeys(problems)]))
    return jobs


# ---------------------------------------------------------------------------------------------
# running jobs side by side

#: What the forked workers run: token -> (function, items). A worker is a fork of the runner, so it
#: sees this table as it was at the pool's start and only an index crosses the process boundary.
_TASKS: dict[int, tuple[Callable, Sequence]] = {}


def _call(token: int, i: int) -> tuple[Any, str | None]:
    fn, items = _TASKS[token]
    try:
        return fn(items[i]), None
    except RunError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - the parent reports it and fails the run
        return None, f"notebook {getattr(items[i], 'id', i)}: {type(exc).__name__}: {exc}"


def run_parallel(fn: Callable[[Any], Any], items: Sequence[Job], jobs: int, *, after: dict[str, Sequence[str]],
                 on_start: Callable[[Any], None], on_done: Callable[[Any, Any], None],
                 cost: Callable[[Any], float] | None = None,
                 needs: Callable[[Any], Iterable[str]] | None = None) -> None:
    """Run ``fn(item)`` for every item, up to ``jobs`` at once in forked workers
    (``concurrent.futures.ProcessPoolExecutor``; in this process when ``jobs`` is 1, in list
    order). An item waits for the items of its run that ``after`` names for its chapter, and for
    the items whose ids ``needs(item)`` gives (e.g. the zoo its testbed reads); of the items ready to
    start, one that others wait for goes first, then the one with the largest ``cost`` (e.g. its
    last recorded minutes: longest first keeps the workers busy to the end), then list order.
    After a failure no new item starts; the running ones finish.

    Raises:
        RunError: every failure, one per line.
    """
    if jobs == 1:
        for item in items:
            on_start(item)
            on_done(item, fn(item))
        return
    waits = [{item.sibling(d) for d in after.get(item.name, ())} | set(needs(item) if needs else ()) for item in items]
    token, errors = id(items), []
    _TASKS[token] = (fn, items)
    pending, running = list(range(len(items))), {}
    try:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            while pending or running:
                while pending and len(running) < jobs and not errors:
                    busy = {items[i].id for i in [*pending, *running.values()]}
                    ready = [i for i in pending if not waits[i] & (busy - {items[i].id})]
                    if not ready:
                        break
                    blocking = set().union(*(waits[i] for i in pending))
                    pending.remove(i := min(ready, key=lambda i: (items[i].id not in blocking,
                                                                  -(cost(items[i]) if cost else 0.0), i)))
                    on_start(items[i])
                    running[pool.submit(_call, token, i)] = i
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    try:
                        value, err = future.result()
                    except BrokenProcessPool as exc:
                        value, err = None, f"notebook {items[i].id}: its worker died ({exc})"
                    if err:
                        errors.append(err)
                        print(f"   {items[i].id} FAILED", flush=True)
                    else:
                        on_done(items[i], value)
    finally:
        _TASKS.pop(token, None)
    if errors:
        raise RunError("\n".join(errors))
