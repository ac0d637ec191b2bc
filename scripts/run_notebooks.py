#!/usr/bin/env python
"""Execute the book's notebooks with papermill, keep their records, render with jupyter-book (v1).

    .venv/bin/python scripts/run_notebooks.py                       # present: render from records
    .venv/bin/python scripts/run_notebooks.py --mode compute        # recompute stale/missing chapters
    .venv/bin/python scripts/run_notebooks.py --mode compute --only 05 -p alpha_points=5
    .venv/bin/python scripts/run_notebooks.py --mode compute --only minilm/05   # one variant's run
    .venv/bin/python scripts/run_notebooks.py --params smoke --check-only
    .venv/bin/python scripts/run_notebooks.py --params default --needs   # what `make reproduce` builds first

1. **Parameters.** Every notebook of the book (main run and the set's ``variants:``) is read,
   ``common`` + its section of ``params/<set>.yaml`` (+ the variant's values) + ``-p`` overrides
   validated by the chapter's model (:mod:`pactlib.book.chapters`, which its notebook checks
   with too; its defaults must equal the ``parameters`` cell), with the paths of named testbeds
   and ``threads``, before anything runs; each problem names the notebook, the set, the
   parameter and where its value was given (exit 2). ``--check-only`` stops here.
2. **Records.** A chapter's records live in ``book/records/<store>/<run>/<chapter>/`` with a
   ``provenance.json`` (:mod:`pactlib.book.provenance`). ``<store>`` is the set's name, or
   ``_scratch/<set>`` when ``-p`` overrides are given, so records of other parameters never
   overwrite a set's own (only ``book/records/default/`` is committed). A chapter is *current*,
   *stale* (with reasons) or *missing*.
3. ``--mode compute`` runs each selected chapter that is not current (all with ``--force``)
   whole, with ``PACT_RECORDS_DIR`` at ``book/records/<store>/<run>/.<chapter>.staging/``; on
   success it writes the provenance there and swaps the folder into place (a failed or
   interrupted run keeps the old records; its partial notebook is ``<chapter>.failed.ipynb``).
   One progress line per chapter, with the time left estimated from the recorded minutes.
   Chapter 6 and 11 wait for chapter 5 of the same run (they reuse its memoised merges).
4. ``--mode present`` (also after a compute run, unless ``--no-render``) executes every chapter
   with its ``compute``-tagged cells turned into raw cells (shown unexecuted, code folded), reading
   a copy of the records under ``book/_executed/<store>/[<variant>/]records/<chapter>/``: nothing
   is written into ``book/records/``. A chapter with records shows their provenance in a folded
   box under its title; a stale one also a banner with the reasons; a missing one a banner and
   nothing executed past its parameters but the cells tagged ``bench-data`` (they read only the
   committed benchmark data in ``book/data/``). A present notebook is re-executed only when
   its source, parameters, records, state or ``pactlib`` code changed. Then the Verdicts page
   (claims x runs, stale/missing marked, "Where the time goes" from the provenance), the set's
   table of contents (variants as sections), ``jupyter-book build`` and the offline check.

``--threads N`` sets each kernel's torch threads (else the set's ``threads:``, else cores /
``--jobs``); ``--jobs N`` runs N notebooks at once. ``--needs`` prints the make targets that
produce the selected chapters' inputs (``data zoo`` when a run names a Lite0 / MiniLM testbed).
Exit status: 0 on success, 1 on a failed notebook / build / check, 2 on bad parameters.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pactlib.book import chapters as nbchapters  # noqa: E402
from pactlib.book import params as pparams  # noqa: E402
from pactlib.book import provenance, records, site  # noqa: E402
from pactlib.io import write_atomic  # noqa: E402
from pactlib.book.runplan import (MAX_THREADS, NEEDS, THREADS, ZOO_FAMILIES, book_needs, chapter_values,  # noqa: E402,F401
                                  check_threads, decorate_variant, define_testbeds, named_testbeds, parameters_cell,
                                  parse_cli, set_thread_problems, threads_option)

NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "book" / "_executed"
RECORDS = ROOT / "book" / "records"
PARAMS_DIR = ROOT / "params"
TOC = ROOT / "_toc.yml"
DEFAULT_SET = "default"
TOC_PREFIX = "book/_executed/default/"
SCRATCH = "_scratch"
KERNEL = "python3"
#: Kernel arguments: its own log is noise; a shell command (`!cmd`) that exits non-zero raises.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL", "--InteractiveShell.system_raise_on_error=True"]
#: Chapters that reuse another chapter's memoised merges: computed after it within a run.
AFTER = {"06_static_vs_dynamic": ("05_main_results",), "11_sensitivity": ("05_main_results",)}
COMPUTE_TAG = "compute"
#: Present cells that read only committed benchmark data (``book/data/``): they run even when the
#: chapter has no records yet.
BENCH_TAG = "bench-data"
VERDICTS_PAGE = site.VERDICTS_PAGE
#: The last cell of a compute run: the pactlib modules the kernel imported and its CPU seconds.
END_CELL = """\
import json as _j, resource as _r, sys as _s
_u = [_r.getrusage(w) for w in (_r.RUSAGE_SELF, _r.RUSAGE_CHILDREN)]
with open({path!r}, "w") as _f:
    _j.dump({{"modules": sorted(m for m in _s.modules if m == "pactlib" or m.startswith("pactlib.")),
             "cpu_seconds": sum(u.ru_utime + u.ru_stime for u in _u)}}, _f)
"""


class RunError(RuntimeError):
    """A notebook failed, or the rendered book failed a check."""


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
    threads: int | None = None  # the kernel's torch threads; None: cores / jobs (see resolve_threads)
    params: dict[str, Any] = field(default_factory=dict)  # defaults + overrides: what the chapter runs with
    defaults: dict[str, Any] = field(default_factory=dict)  # its model's defaults (= its parameters cell)
    reasons: list[str] = field(default_factory=list)  # why its records are not current ([]: current)

    @property
    def id(self) -> str:
        """``05_main_results`` for the main run, ``minilm/05_main_results`` for a variant's."""
        return f"{self.variant}/{self.name}" if self.variant else self.name

    @property
    def run(self) -> str:
        return self.variant or pparams.MAIN

    def out_dir(self, base: Path) -> Path:
        """Where the executed notebook and its figures go: ``base`` or ``base/<variant>``."""
        return base / self.variant if self.variant else base


# ---------------------------------------------------------------------------------------------
# discovery and validation


def _rel(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (for messages)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def notebook_paths(only: list[str] | None) -> list[Path]:
    """The chapter notebooks, in order; ``only`` = stems or unique stem prefixes ("05"), each
    optionally after its run (``minilm/05``: :func:`only_runs`)."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if not paths:
        raise RunError(f"no notebooks found under {NOTEBOOKS}")
    if not only:
        return paths
    chosen = []
    for want in (w.rpartition("/")[2] for w in only):
        hits = [p for p in paths if p.stem == want] or [p for p in paths if p.stem.startswith(want)]
        if len(hits) != 1:
            raise pparams.ParameterError(
                f"--only {want!r} matches {[p.stem for p in hits] or 'no notebook'}; "
                f"notebooks: {[p.stem for p in paths]}")
        chosen.append(hits[0])
    return sorted(set(chosen))


def only_runs(only: list[str] | None) -> list[tuple[str | None, str]]:
    """``--only`` as ``(run or None, chapter stem)`` pairs: ``minilm/05`` -> ``("minilm", "05_main_results")``."""
    return [(w.rpartition("/")[0] or None, notebook_paths([w])[0].stem) for w in only or []]


def toc_chapters(toc_path: Path = TOC) -> list[str]:
    """Stems of the chapters that ``_toc.yml`` takes from ``book/_executed/default/``."""
    text = toc_path.read_text(encoding="utf-8")
    return [f[len(TOC_PREFIX):] for f in re.findall(r"file:\s*(\S+)", text)
            if f.startswith(TOC_PREFIX)]


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
    said: set[tuple[str, str]] = set()  # (notebook, problem): a variant inherits the main run's values and problems
    for variant, title, chapters in runs:  # the main run, then each variant's chapters
        for path in paths:
            if chapters is not None and path.stem not in chapters:
                continue
            where = f"{_rel(path)} with {_rel(params_file)}" + (f" (variant {variant!r})" if variant else "")
            try:
                nb = jupytext.read(path)
                values = chapter_values(nb, path, params_file, variant or None, cli)
                declared_any |= set(values.defaults)
                final = nbchapters.validate(values.model, values.given, where=where, origins=values.origins)
            except (pparams.ParameterError, FileNotFoundError) as exc:
                for problem in getattr(exc, "problems", None) or [str(exc)]:
                    if (path.stem, problem) not in said:
                        said.add((path.stem, problem))
                        problems.append(f"{where}: {problem}" if hasattr(exc, "problems") else problem)
                continue
            threads = values.threads if isinstance(values.threads, int) and not isinstance(values.threads, bool) \
                and values.threads >= 1 else None  # unset, or bad: set_thread_problems reports it
            if variant:
                decorate_variant(nb, variant, title, params_file.stem, chapters[path.stem])
            jobs.append(Job(path.stem, path, nb, {k: final[k] for k in values.given}, variant=variant, title=title,
                            threads=threads, params=final, defaults=values.defaults,
                            testbeds={n: testbeds.definitions()[n] for n in sorted(named_testbeds(list(final.values())))}))
    for name in sorted(set().union(*(j.testbeds for j in jobs)) if jobs else ()):
        users = [j.name[:2] for j in jobs if name in j.testbeds]
        missing = testbeds.missing_paths(name)
        if missing:
            problems.append(f"{_rel(params_file)}: testbeds: {name!r} (used by chapters {', '.join(users)}) names "
                            f"paths that do not exist; edit them: "
                            + "; ".join(f"option {option!r}: {path}" for option, path in missing))
    if len(paths) == len(notebook_paths(None)):  # every notebook: `common` must be used somewhere
        try:
            common = (yaml.safe_load(params_file.read_text()) or {}).get(pparams.COMMON) or {}
        except (OSError, yaml.YAMLError, AttributeError):
            common = {}  # load_params above already reported it
        unused = sorted(set(common) - declared_any - {THREADS})
        if unused:
            problems.append(f"{_rel(params_file)}: common {unused} is declared by no notebook; "
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
# records and their state


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def store_name(set_name: str, cli: dict[str, Any]) -> str:
    """The records store of a run: the set's name, or ``_scratch/<set>`` under ``-p`` overrides."""
    return f"{SCRATCH}/{set_name}" if cli else set_name


def records_dir(store: str, job: Job) -> Path:
    return RECORDS / store / job.run / job.name


def is_compute(cell: Any) -> bool:
    return cell.cell_type == "code" and COMPUTE_TAG in cell.get("metadata", {}).get("tags", [])


def notebook_hash(job: Job) -> str:
    """:func:`provenance.notebook_hash` of the chapter's compute cells (every code cell but the
    parameters when none is tagged ``compute`` yet)."""
    cells = [c for c in job.nb.cells if is_compute(c)] or \
        [c for c in job.nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    return provenance.notebook_hash([c.source for c in cells])


def testbed_hashes(job: Job) -> dict[str, str]:
    return {name: provenance.sha(_json(spec).encode()) for name, spec in job.testbeds.items()}


def assess(jobs: list[Job], store: str) -> None:
    """Fill ``job.reasons`` (:func:`provenance.staleness` of its records folder)."""
    for job in jobs:
        job.reasons = provenance.staleness(records_dir(store, job), job.params, notebook_hash(job), root=ROOT,
                                           testbeds=testbed_hashes(job))


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("-dirty" if dirty else "")


def _machine() -> dict[str, Any]:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"cpu": cpu, "cores": usable_cores(), "torch": torch.__version__, "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------
# execution


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


def _papermill(job: Job, nb: Any, out_dir: Path, env: dict[str, str], progress: bool) -> Any:
    """Execute ``nb`` (a copy of ``job.nb``) with the job's parameters and ``env`` added to the
    kernel's environment; return the executed notebook. A failure leaves
    ``out_dir/<chapter>.failed.ipynb`` and raises :class:`RunError` naming notebook and cell."""
    import logging

    import nbformat
    import papermill as pm

    from pactlib import testbeds

    logging.getLogger("papermill").setLevel(logging.ERROR)  # the runner validated the parameters itself
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = job.threads or default_threads(1)
    kernel_env = {**kernel_threads_env(threads), **env,
                  "PACT_NOTEBOOK": job.name, "PACT_RUN": job.run, "PACT_RUN_TITLE": job.title or pparams.MAIN,
                  "PACT_BOOK_DIR": str(ROOT / "book"),
                  "PACT_CACHE": os.environ.get("PACT_CACHE") or str(ROOT / ".cache"),
                  "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if testbeds.definitions():
        kernel_env[testbeds.ENV] = json.dumps(testbeds.definitions(), sort_keys=True)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    tmp, partial = out_dir / f".{job.name}.{os.getpid()}.ipynb", out_dir / f"{job.name}.failed.ipynb"
    saved = dict(os.environ)
    os.environ.update(kernel_env)  # the kernel inherits this process's environment
    try:
        result = pm.execute_notebook(
            nb, str(tmp), parameters=job.overrides, kernel_name=KERNEL, cwd=str(ROOT), progress_bar=progress,
            log_output=False, request_save_on_cell_execute=False,
            extra_arguments=[*KERNEL_ARGS, f"--IPKernelApp.exec_files={KERNEL_THREADS}"])
    except Exception as exc:
        if tmp.exists():
            os.replace(tmp, partial)
        raise RunError(_failure(job, exc, partial)) from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)
    tmp.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    return result if isinstance(result, nbformat.NotebookNode) else nbformat.from_dict(result)


def compute(job: Job, store: str, set_name: str, progress: bool = False) -> dict[str, Any]:
    """Execute the whole notebook into a staging folder, write its provenance, swap it into
    ``book/records/<store>/<run>/<chapter>/``; return the provenance."""
    import nbformat

    final = records_dir(store, job)
    staging, old = final.with_name(f".{job.name}.staging"), final.with_name(f".{job.name}.old")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    end = staging / ".kernel-end.json"
    nb = copy.deepcopy(job.nb)
    nb.cells.append(nbformat.v4.new_code_cell(END_CELL.format(path=str(end))))
    out = job.out_dir(EXECUTED / store)
    t0 = time.perf_counter()
    try:
        _papermill(job, nb, out, {"PACT_PARAMS": set_name, "PACT_RECORDS_DIR": str(staging),
                                  "PACT_FIGURES_DIR": str(out / "figures")}, progress)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # the old records stay as they were
        raise
    wall = time.perf_counter() - t0
    kernel = json.loads(end.read_text())
    end.unlink()
    for lock in staging.glob("*.lock"):  # records.write_records' lock files
        lock.unlink()
    prov = {"chapter": job.name, "run": job.run, "set": store, "params": job.params,
            "seeds": provenance.seeds_of(job.params), "testbeds": testbed_hashes(job),
            "engine": provenance.engine(kernel["modules"], ROOT), "notebook": notebook_hash(job),
            "made": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "git": _git(),
            "machine": _machine(), "threads": job.threads or default_threads(1),
            "wall_minutes": round(wall / 60, 2), "cpu_minutes": round(kernel["cpu_seconds"] / 60, 2),
            "merges": site.merge_profile(r for f in sorted(staging.glob("*.jsonl"))
                                         if not f.name.endswith(".verdicts.jsonl") for r in records.read_records(f))}
    provenance.write(staging, prov)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    return prov


def _command(job: Job, store: str) -> str:
    """The command that computes ``job``'s records in ``store``: ``make chapter ... -p`` for the
    scratch store of overridden parameters, else ``make reproduce`` (``NB=<variant>/<chapter>`` for a variant)."""
    if store.startswith(f"{SCRATCH}/"):
        return f"`make chapter NB={job.name} ARGS=\"-p ...\"`"
    return f"`make reproduce NB={job.id}`"


def _banner(job: Job, store: str, prov: dict | None) -> str:
    again = _command(job, store)
    if prov is None:
        bench = job.nb is not None and any(BENCH_TAG in c.metadata.get("tags", []) for c in job.nb.cells
                                           if c.cell_type == "code")
        ran = ("only the cells that read the committed benchmark data (`book/data/`) were executed" if bench
               else "nothing past the parameters was executed")
        return (f"```{{warning}}\nNo records yet for this chapter (parameter set `{store}`, run `{job.run}`): its "
                f"code is shown, {ran}. Run {again} to compute them.\n```")
    why = "\n".join(f"- {r}".replace("_", "\\_") for r in job.reasons)  # pactlib/__init__.py is no emphasis
    return (f"```{{warning}}\nThese results are **stale**: the records were made on {prov.get('made', '?')[:10]} "
            f"with other inputs than today's:\n\n{why}\n\nRun {again} to recompute them.\n```")


def _provenance_box(job: Job, store: str, prov: dict) -> str:
    return site.provenance_box(prov, _command(job, store), f"{_rel(records_dir(store, job))}/")


def _under_title(nb: Any, text: str) -> None:
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


def present_key(job: Job, store: str, engine_code: str) -> str:
    """What a present notebook depends on: its source, parameters, run, records, their state and
    the code of ``pactlib``."""
    folder = records_dir(store, job)
    files = {p.name: provenance.sha(p.read_bytes()) for p in sorted(folder.glob("*")) if p.is_file()} if folder.is_dir() else {}
    return provenance.sha(_json({"notebook": provenance.sha(job.source.read_bytes()), "params": job.params, "run": [job.run, job.title],
                       "records": files, "reasons": job.reasons, "code": engine_code}).encode())


def present(job: Job, store: str, set_name: str, key: str, progress: bool = False) -> float:
    """Execute the chapter's present cells on a copy of its records; write the executed notebook
    (``book/_executed/<store>/[<variant>/]<chapter>.ipynb``, its ``.key``) and its verdicts
    (``book/_executed/<store>/<run>/<chapter>.verdicts.jsonl``); return the seconds taken."""
    import nbformat

    src, out = records_dir(store, job), job.out_dir(EXECUTED / store)
    work = out / "records" / job.name
    shutil.rmtree(work, ignore_errors=True)
    if src.is_dir():
        shutil.copytree(src, work)
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{job.name}.verdicts.jsonl").unlink(missing_ok=True)  # the present cells write them again
    prov = provenance.read(src) if src.is_dir() else None
    missing = prov is None
    nb = copy.deepcopy(job.nb)
    seen_params = False
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "parameters" in tags:
            seen_params = True
            continue
        if cell.cell_type != "code":
            continue
        if ".check(globals())" in cell.source and "remove-input" not in tags:
            tags.append("remove-input")  # plumbing: the values are in the parameters cell
        if is_compute(cell) or (missing and seen_params and BENCH_TAG not in tags):
            cell.cell_type = "raw"
            cell.metadata["pact_skipped"] = True
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    changed = {k: v for k, v in job.overrides.items() if job.defaults.get(k) != v}
    if changed:  # papermill's cell with the values in effect is removed: say them under the defaults
        nb.cells.insert(at + 1, nbformat.v4.new_markdown_cell(
            f"*This run (parameter set `{store}`) sets " + ", ".join(f"`{k} = {v!r}`" for k, v in changed.items())
            + ".*", metadata={"tags": ["pact-parameters"]}))
    top = [_banner(job, store, prov)] if job.reasons else []
    if prov is not None:
        top.append(_provenance_box(job, store, prov))
    _under_title(nb, "\n\n".join(top))
    t0 = time.perf_counter()
    result = _papermill(job, nb, out, {"PACT_PARAMS": set_name, "PACT_RECORDS_DIR": str(work),
                                       "PACT_FIGURES_DIR": str(out / "figures")}, progress)
    seconds = time.perf_counter() - t0
    for cell in result.cells:
        if cell.metadata.pop("pact_skipped", False):
            cell.cell_type, cell.outputs, cell.execution_count = "code", [], None
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-input"]
        elif "injected-parameters" in cell.metadata.get("tags", []):
            cell.metadata["tags"] = [*cell.metadata["tags"], "remove-cell"]  # the values are in the note below
    result.metadata["pact"] = {"params_set": store, "state": provenance.state(job.reasons), "key": key,
                               "threads": job.threads, "seconds": round(seconds, 2)}
    tmp = out / f".{job.name}.{os.getpid()}.ipynb"
    nbformat.write(result, str(tmp))
    os.replace(tmp, out / f"{job.name}.ipynb")
    verdicts = EXECUTED / store / job.run / f"{job.name}.verdicts.jsonl"
    verdicts.parent.mkdir(parents=True, exist_ok=True)
    made = work / f"{job.name}.verdicts.jsonl"
    stored = src / f"{job.name}.verdicts.jsonl"
    if made.is_file() or stored.is_file():
        shutil.copyfile(made if made.is_file() else stored, verdicts)
    else:
        verdicts.unlink(missing_ok=True)
    _atomic_write(out / f"{job.name}.key", _json({"key": key, "seconds": round(seconds, 2), "threads": job.threads}))
    return seconds


def _present_keyed(job: Job, keys: dict[str, str], store: str, set_name: str) -> float:
    return present(job, store, set_name, keys[job.id])


def _tag(i: int, total: int, name: str) -> str:
    """The prefix of a notebook's log lines: ``[ 5/12] 05_main_results   ``."""
    return f"[{i:2d}/{total}] {name:<{max(26, len(name))}}"


def _child(fn, job: Job, queue) -> None:
    try:
        queue.put((job.id, fn(job), None))
    except RunError as exc:
        queue.put((job.id, None, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, which fails the run
        queue.put((job.id, None, f"notebook {job.id}: {type(exc).__name__}: {exc}"))


def run_all(work: list[Job], fn, jobs: int, on_start, on_done) -> None:
    """Run ``fn(job)`` for every job, up to ``jobs`` at once in forked workers (in this process
    when ``jobs`` is 1); a job waits for the jobs of its run that :data:`AFTER` names, and a job
    others wait for starts before the rest. After a
    failure no new job starts; the running ones finish, then :class:`RunError` lists every failure."""
    pending, errors = list(work), []
    if jobs == 1:
        for job in work:
            on_start(job)
            on_done(job, fn(job))
        return
    ctx = mp.get_context("fork")
    queue, running = ctx.Queue(), {}
    while pending or running:
        while pending and len(running) < jobs and not errors:
            waiting = {j.id for j in pending} | set(running)
            ready = [j for j in pending if not {f"{j.variant}/{d}" if j.variant else d for d in AFTER.get(j.name, ())}
                     & (waiting - {j.id})]
            if not ready:
                break
            blocking = {f"{j.variant}/{d}" if j.variant else d for j in pending for d in AFTER.get(j.name, ())}
            ready.sort(key=lambda j: j.id not in blocking)  # what others wait for starts first
            pending.remove(job := ready[0])
            on_start(job)
            proc = ctx.Process(target=_child, args=(fn, job, queue))
            proc.start()
            running[job.id] = (proc, job)
        if not running:
            break
        try:
            name, value, err = queue.get(timeout=5)
        except Exception:  # noqa: BLE001 - queue.Empty: look for a worker that died silently
            for name, (proc, job) in list(running.items()):
                if not proc.is_alive() and proc.exitcode != 0:
                    running.pop(name)
                    errors.append(f"notebook {name}: its worker died (exit code {proc.exitcode})")
            continue
        proc, job = running.pop(name)
        proc.join()
        if err:
            errors.append(err)
            print(f"   {name} FAILED", flush=True)
        else:
            on_done(job, value)
    if errors:
        raise RunError("\n".join(errors))


def compute_all(jobs: list[Job], store: str, set_name: str, n: int, force: bool) -> None:
    """Compute the chapters of ``jobs`` that are not current (all with ``force``), with a line per
    chapter and the time left, estimated from each one's last recorded wall minutes."""
    work = [j for j in jobs if force or j.reasons]
    for job in jobs:
        if job not in work:
            print(f"{_tag(jobs.index(job) + 1, len(jobs), job.id)} current", flush=True)
    last = {j.id: (provenance.read(records_dir(store, j)) or {}).get("wall_minutes") for j in work}
    state = {"left": sum(v for v in last.values() if v), "unknown": sum(1 for v in last.values() if not v)}

    def start(job: Job) -> None:
        why = "; ".join(job.reasons) or "--force"
        est = f"{last[job.id]:.0f} min last time" if last[job.id] else "no estimate"
        left = (f"~{state['left'] / n:.0f} min left" if state["left"] else "time left unknown") \
            + (f" + {state['unknown']} chapter(s) never timed" if state["unknown"] and state["left"] else "")
        print(f"{_tag(jobs.index(job) + 1, len(jobs), job.id)} computing ({why[:160]}; {job.threads} thread(s); "
              f"{est}; {left})", flush=True)

    def done(job: Job, prov: dict) -> None:
        state["left"] -= last[job.id] or 0
        state["unknown"] -= 0 if last[job.id] else 1
        print(f"{_tag(jobs.index(job) + 1, len(jobs), job.id)} done in {prov['wall_minutes']:.1f} min "
              f"({prov['cpu_minutes']:.1f} CPU min) -> {_rel(records_dir(store, job))}", flush=True)

    write_zoo_profile(store)
    run_all(work, functools.partial(compute, store=store, set_name=set_name), n, start, done)


def present_all(jobs: list[Job], store: str, set_name: str, n: int, force: bool) -> None:
    """Present every chapter whose present key changed (all with ``force``)."""
    from pactlib.testbeds.base import source_fingerprint

    code = source_fingerprint(sorted(p for p in (ROOT / "pactlib").rglob("*.py") if "__pycache__" not in p.parts), ROOT)
    keys, work = {}, []
    for job in jobs:
        keys[job.id] = present_key(job, store, code)
        key_file = job.out_dir(EXECUTED / store) / f"{job.name}.key"
        try:
            old = json.loads(key_file.read_text())["key"]
        except (OSError, ValueError, KeyError):
            old = None
        if force or old != keys[job.id] or not key_file.with_suffix(".ipynb").is_file():
            work.append(job)
    t0 = time.perf_counter()

    def start(job: Job) -> None:
        pass

    def done(job: Job, seconds: float) -> None:
        print(f"{_tag(jobs.index(job) + 1, len(jobs), job.id)} presented ({provenance.state(job.reasons)}) "
              f"in {seconds:.1f} s", flush=True)

    run_all(work, functools.partial(_present_keyed, keys=keys, store=store, set_name=set_name), n, start, done)
    print(f">> presented {len(work)} of {len(jobs)} notebook(s) in {time.perf_counter() - t0:.1f} s "
          f"({len(jobs) - len(work)} unchanged)", flush=True)


# ---------------------------------------------------------------------------------------------
# rendering


def variant_pages(params_file: Path) -> dict[str, list[str]]:
    """``{variant: [chapter stems]}`` of a set's variants (the main run not included)."""
    return {v: list(spec["chapters"]) for v, spec in pparams.variant_definitions(params_file).items()
            if v != pparams.MAIN}


def expected_pages(params_file: Path) -> list[str]:
    """Executed notebooks the set's book shows: ``stem`` and ``<variant>/<stem>``."""
    return toc_chapters() + [f"{v}/{stem}" for v, stems in variant_pages(params_file).items() for stem in stems]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def toc_for(store: str, params_file: Path) -> Path:
    """``book/_executed/<store>/_toc.yml``: ``_toc.yml`` pointed at the store's folder, variants as
    sections of their chapters, and the Verdicts page."""
    toc = site.toc(yaml.safe_load(TOC.read_text(encoding="utf-8")), TOC_PREFIX, f"book/_executed/{store}/",
                   variant_pages(params_file))
    path = EXECUTED / store / "_toc.yml"
    _atomic_write(path, f"# generated by scripts/run_notebooks.py from _toc.yml and {params_file.name}\n"
                  + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True))
    return path


#: The zoos whose training records the Verdicts page profiles: testbed -> folder under the cache.
ZOOS = {"lite0": "zoo", "minilm": "zoo-minilm"}


def zoo_profile() -> dict[str, dict]:
    """Per built zoo, the number of models and the summed wall minutes of their training (each
    model's own JSON record: ``kind``, ``seconds``), by kind; {} when no zoo is built."""
    from pactlib.paths import cache_dir

    out: dict[str, dict] = {}
    for testbed, folder in ZOOS.items():
        kinds: dict[str, dict] = {}
        for f in sorted(cache_dir(folder).rglob("*.json")):
            if "run_memo" in f.parts:  # merges' records, not models
                continue
            rec = records.read_json_object(f)
            if rec and isinstance(rec.get("seconds"), (int, float)) and isinstance(rec.get("kind"), str):
                k = kinds.setdefault(rec["kind"], {"models": 0, "minutes": 0.0})
                k["models"] += 1
                k["minutes"] = round(k["minutes"] + rec["seconds"] / 60, 2)
        if kinds:
            out[testbed] = {"kinds": kinds}
    return out


def write_zoo_profile(store: str) -> None:
    """``book/records/<store>/zoo.json``: :func:`zoo_profile` of the zoos built here, merged over
    what an earlier reproduction recorded for zoos not built here."""
    path = RECORDS / store / "zoo.json"
    now = zoo_profile()
    if now:
        _atomic_write(path, json.dumps({**(records.read_json_object(path) or {}), **now}, indent=1, sort_keys=True)
                      + "\n")


def write_verdicts_page(store: str, params_file: Path, jobs: list[Job]) -> Path:
    """``book/_executed/<store>/verdicts.md`` from the present runs' verdicts and the records' states."""
    titles = {r: spec["title"] for r, spec in pparams.variant_definitions(params_file).items()}
    files = [(j.name, j.run, EXECUTED / store / j.run / f"{j.name}.verdicts.jsonl") for j in jobs]
    states = {(j.name, j.run): {"state": provenance.state(j.reasons), "reasons": j.reasons,
                                "provenance": provenance.read(records_dir(store, j))} for j in jobs}
    merges = {k: st["provenance"]["merges"] for k, st in states.items() if (st["provenance"] or {}).get("merges")}
    text = site.verdicts_page(store, titles, site.read_verdicts(files, list(titles)), states, merges,
                              records.read_json_object(RECORDS / store / "zoo.json"))
    path = EXECUTED / store / f"{VERDICTS_PAGE}.md"
    _atomic_write(path, text)
    _atomic_write(EXECUTED / store / "states.json",  # read by scripts/readme_verdicts.py
                  json.dumps({f"{r}/{c}": st["state"] for (c, r), st in sorted(states.items())}, indent=1) + "\n")
    return path


def html_dir_for(store: str, out: Path | None) -> tuple[Path, Path]:
    """(``--path-output`` for jupyter-book, the HTML folder it produces)."""
    if out is None:
        out = ROOT if store == DEFAULT_SET else ROOT / "_build" / store
    return out, out / "_build" / "html"


def render(store: str, out: Path | None, params_file: Path, jobs: list[Job]) -> Path:
    missing = [c for c in expected_pages(params_file) if not (EXECUTED / store / f"{c}.ipynb").is_file()]
    if missing:
        raise RunError(f"cannot render the {store!r} book: not presented yet: {missing}")
    path_output, html = html_dir_for(store, out)
    write_verdicts_page(store, params_file, jobs)
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT),
           "--toc", str(toc_for(store, params_file)), "--path-output", str(path_output), "-W", "-n", "--keep-going", "-q"]
    print(f">> rendering with jupyter-book -> {_rel(html)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise RunError(f"jupyter-book build failed (exit {proc.returncode}); command: {' '.join(cmd)}")
    print(f">> rendered in {time.perf_counter() - t0:.1f} s", flush=True)
    problems = site.html_problems(html, [f"book/_executed/{store}/{p}" for p in
                                         [*expected_pages(params_file), VERDICTS_PAGE]])
    if problems:
        raise RunError("the rendered book failed its checks:\n  " + "\n  ".join(problems[:30]))
    return html


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("present", "compute"), default="present",
                    help="present: render from the records (default); compute: recompute stale/missing chapters")
    ap.add_argument("--params", default=DEFAULT_SET,
                    help="parameter set: a name under params/ (default: default) or a YAML path")
    ap.add_argument("--only", nargs="+", metavar="NB",
                    help="notebook stems or prefixes (e.g. 05), or one run of one: <variant>/<stem> (minilm/05)")
    ap.add_argument("-p", dest="set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a parameter (YAML value) in the selected notebooks that have it; the records "
                         "then go to book/records/_scratch/<set>/")
    ap.add_argument("--run", action="append", default=None, metavar="RUN",
                    help="only this run of the selected notebooks: 'main' or a variant (repeatable)")
    ap.add_argument("--force", action="store_true", help="recompute (compute) / re-present (present) even when current")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("PACT_BOOK_JOBS", "1")),
                    help="notebooks executed at once (default: $PACT_BOOK_JOBS or 1)")
    ap.add_argument("--threads", default=None, metavar="N",
                    help="torch threads of each kernel, 1-4096 (else the set's `threads:`, else cores / --jobs); "
                         "not part of any key: merges are bit-identical for any count")
    ap.add_argument("--no-render", action="store_true",
                    help="no jupyter-book: present mode presents only, compute mode computes only")
    ap.add_argument("--render-only", action="store_true", help="render what is presented, execute nothing")
    ap.add_argument("--path-output", type=Path, default=None, help="jupyter-book output folder (HTML in <it>/_build/html)")
    ap.add_argument("--check-only", action="store_true", help="validate notebooks and parameters, execute nothing")
    ap.add_argument("--status", action="store_true", help="print each chapter's records state, execute nothing")
    ap.add_argument("--needs", action="store_true",
                    help="print the make targets producing the selected notebooks' inputs, run nothing")
    args = ap.parse_args(argv)

    params_file = Path(args.params) if args.params.endswith((".yaml", ".yml")) else PARAMS_DIR / f"{args.params}.yaml"
    if args.needs:
        try:
            with contextlib.chdir(ROOT):
                specs = only_runs(args.only)
                runs = args.run or ([r for r, _ in specs] if specs and all(r for r, _ in specs) else None)
                needs = book_needs(notebook_paths(args.only), params_file.resolve(), parse_cli(args.set), runs)
        except (pparams.ParameterError, FileNotFoundError, RunError) as exc:
            print(f"run_notebooks: --needs: {exc}; answering {' '.join(NEEDS)!r}", file=sys.stderr)
            print(" ".join(NEEDS))
            return 2
        print(" ".join(needs))
        return 0
    set_name = params_file.stem
    t_all = time.perf_counter()
    try:
        odd = sorted(set(p.stem for p in notebook_paths(None)) ^ set(toc_chapters()))
        if odd:
            raise RunError(f"notebooks and _toc.yml disagree on chapters: {odd}")
        cli_threads = threads_option(args.threads)
        if args.jobs < 1:
            raise pparams.ParameterError(f"--jobs must be a whole number >= 1, got {args.jobs}")
        cli = parse_cli(args.set)
        selected = {p.stem for p in notebook_paths(args.only)}
        # every chapter is validated when the book is rendered (it shows them all); -p applies to the
        # selected ones. With --no-render only the selected chapters are run, so only they are checked.
        others = [] if args.no_render else [p for p in notebook_paths(None) if p.stem not in selected]
        jobs = prepare(notebook_paths(args.only), params_file, cli) + (prepare(others, params_file, {}) if others else [])
        runs = pparams.variant_definitions(params_file)
        jobs.sort(key=lambda j: (list(runs).index(j.run), j.name))
        if args.run:
            unknown = sorted(set(args.run) - set(runs))
            if unknown:
                raise pparams.ParameterError(f"--run {unknown}: {params_file.name} has the runs {list(runs)}")
        specs = only_runs(args.only)
        for run, stem in specs:
            if run and run not in runs:
                raise pparams.ParameterError(f"--only {run}/{stem}: {params_file.name} has no run {run!r}; its runs: "
                                             f"{list(runs)}")
            if run and not any(j.run == run and j.name == stem for j in jobs):
                raise pparams.ParameterError(f"--only {run}/{stem}: variant {run!r} of {params_file.name} does not run "
                                             f"{stem}; it runs {[j.name for j in jobs if j.run == run]}")
        chosen = [j for j in jobs if any(j.name == stem and run in (None, j.run) for run, stem in specs or
                                         [(None, n) for n in selected]) and (not args.run or j.run in args.run)]
        for job in jobs:
            job.threads = resolve_threads(cli_threads, job, args.jobs)
        if args.check_only:
            extra = len(chosen) - len(selected)
            counts = sorted({j.threads for j in chosen})
            print(f"parameters of {len(selected)} notebook(s) are valid ({params_file.name}"
                  + (f"; {extra} more run(s) in variants)" if extra else ")")
                  + (f"; torch threads per kernel: {', '.join(map(str, counts))}" if counts else ""))
            return 0
        store = store_name(set_name, cli)
        assess(jobs, store)
        if args.status:
            for job in chosen:
                print(f"{job.id:<36} {provenance.state(job.reasons):<8} {'; '.join(job.reasons)}")
            return 0
        if args.mode == "compute" and not args.render_only:
            compute_all(chosen, store, set_name, args.jobs, args.force)
            assess(jobs, store)
        if not args.render_only and (args.mode == "present" or not args.no_render):
            # present what was chosen, and every page never presented (the book renders them all)
            todo = [j for j in jobs if j in chosen or not (j.out_dir(EXECUTED / store) / f"{j.name}.ipynb").is_file()]
            present_all(todo, store, set_name, args.jobs, args.force and args.mode == "present")
        if not args.no_render:
            html = render(store, args.path_output, params_file, jobs)
            bad = [j.id for j in jobs if j.reasons]
            print(f">> book ready: {html / 'index.html'} ({time.perf_counter() - t_all:.1f} s total)"
                  + (f"; not current: {', '.join(bad)}" if bad else ""))
    except pparams.ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (RunError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
