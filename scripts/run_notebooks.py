#!/usr/bin/env python
"""Execute the book's notebooks with papermill, keep their records, render with jupyter-book (v1).

    .venv/bin/python scripts/run_notebooks.py                       # present: render from records
    .venv/bin/python scripts/run_notebooks.py --mode compute        # recompute stale/missing chapters
    .venv/bin/python scripts/run_notebooks.py --mode compute --only 05 -p alpha_points=5
    .venv/bin/python scripts/run_notebooks.py --mode compute --only minilm/05   # one variant's run
    .venv/bin/python scripts/run_notebooks.py --params smoke --check-only
    .venv/bin/python scripts/run_notebooks.py --params default --needs   # what `make reproduce` builds first

1. **Parameters.** Every run of every notebook (the main run and the set's ``variants:``) gets
   ``common`` + its section of ``params/<set>.yaml`` (+ the variant's values) + ``-p``, checked by
   the chapter's model (:mod:`pactlib.book.chapters`) with the named testbeds' paths and
   ``threads`` before anything runs; each problem names the notebook, the set, the parameter and
   where its value was given (exit 2). ``--check-only`` stops here.
2. **Records** live in ``book/records/<store>/<run>/<chapter>/`` with a ``provenance.json``
   (:mod:`pactlib.book.provenance`); ``<store>`` is the set's name, or ``_scratch/<set>`` under
   ``-p``, so other parameters never overwrite a set's own. A chapter is current, stale or missing.
3. ``--mode compute`` runs each selected chapter that is not current (all with ``--force``) whole
   into ``.<chapter>.staging/`` and swaps it into place on success (a failed run keeps the old
   records and leaves ``<chapter>.failed.ipynb``), with a progress line and the time left.
   Chapters 6 and 11 wait for chapter 5 of their run (they reuse its memoised merges).
4. ``--mode present`` (also after a compute run, unless ``--no-render``) executes every chapter
   with its ``compute`` cells shown unexecuted, on a copy of its records under
   ``book/_executed/<store>/``, with its provenance, a banner when stale or missing, and only when
   its source, parameters, records, state or ``pactlib`` changed (a page shows the parameter values
   its run executes with; a variant's page links to the main page's sections that show only
   ``book/data/``, rather than repeating them); then the Verdicts page, the
   set's table of contents (variants as sections), ``jupyter-book build`` and the offline check.

``--threads N``: each kernel's torch threads (else the set's ``threads:``, else cores / ``--jobs``);
``--jobs N``: notebooks at once. ``--needs``: the make targets producing the selected runs' inputs.
Exit status: 0 on success, 1 on a failed notebook / build / check, 2 on bad parameters.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pactlib.book import params as pparams  # noqa: E402
from pactlib.book import findings, provenance, records, runplan, site  # noqa: E402
from pactlib.book.runplan import (NEEDS, Job, RunError, book_needs, parameters_cell,  # noqa: E402,F401
                                  parse_cli, threads_option)
from pactlib.io import write_atomic  # noqa: E402
from pactlib.paths import cache_dir  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "book" / "_executed"
RECORDS = ROOT / "book" / "records"
TOC = ROOT / "_toc.yml"
FINDINGS_TEXT = ROOT / "book" / "findings.yaml"
TOC_PREFIX = "book/_executed/default/"
DEFAULT_SET, SCRATCH, KERNEL = "default", "_scratch", "python3"
#: Kernel arguments: its own log is noise; a shell command (`!cmd`) that exits non-zero raises;
#: scripts/kernel_threads.py sets torch's thread count right after the notebook imports torch.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL", "--InteractiveShell.system_raise_on_error=True",
               f"--IPKernelApp.exec_files={Path(__file__).resolve().with_name('kernel_threads.py')}"]
#: Chapters that reuse another chapter's memoised merges: computed after it within a run.
AFTER = {"06_static_vs_dynamic": ("05_main_results",), "11_sensitivity": ("05_main_results",)}
#: The last cell of a compute run: the pactlib modules the kernel imported and its CPU seconds.
END_CELL = """\
import json as _j, resource as _r, sys as _s
_u = [_r.getrusage(w) for w in (_r.RUSAGE_SELF, _r.RUSAGE_CHILDREN)]
with open({path!r}, "w") as _f:
    _j.dump({{"modules": sorted(m for m in _s.modules if m == "pactlib" or m.startswith("pactlib.")),
             "cpu_seconds": sum(u.ru_utime + u.ru_stime for u in _u)}}, _f)
"""


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)


# ---------------------------------------------------------------------------------------------
# chapters, threads, parameters


def notebook_paths(only: list[str] | None) -> list[Path]:
    """The chapter notebooks, in order; ``only``: stems or unique prefixes ("05"), each
    optionally after its run (``minilm/05``)."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if not paths:
        raise RunError(f"no notebooks found under {NOTEBOOKS}")
    chosen = set()
    for want in (w.rpartition("/")[2] for w in only or []):
        hits = [p for p in paths if p.stem == want] or [p for p in paths if p.stem.startswith(want)]
        if len(hits) != 1:
            raise pparams.ParameterError(f"--only {want!r} matches {[p.stem for p in hits] or 'no notebook'}; "
                                         f"notebooks: {[p.stem for p in paths]}")
        chosen.add(hits[0])
    return sorted(chosen) if only else paths


def only_runs(only: list[str] | None) -> list[tuple[str | None, str]]:
    """``--only`` as ``(run or None, stem)`` pairs: ``minilm/05`` -> ``("minilm", "05_main_results")``."""
    return [(w.rpartition("/")[0] or None, notebook_paths([w])[0].stem) for w in only or []]


def toc_chapters(toc_path: Path = TOC) -> list[str]:
    """Stems of the chapters that ``_toc.yml`` takes from ``book/_executed/default/``."""
    files = re.findall(r"file:\s*(\S+)", toc_path.read_text(encoding="utf-8"))
    return [f[len(TOC_PREFIX):] for f in files if f.startswith(TOC_PREFIX)]


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
    """``--threads`` > the set's ``threads`` for the job > cores / jobs."""
    return cli or job.threads or default_threads(jobs)


def prepare(paths: list[Path], params_file: Path, cli: dict[str, Any]) -> list[Job]:
    """:func:`runplan.plan_jobs`: every run of the ``paths`` read and checked (nothing runs), in the
    repository root (the kernels' working directory: relative paths mean the same here and there)."""
    every = len(paths) == len(notebook_paths(None))
    with contextlib.chdir(ROOT):
        return runplan.plan_jobs(paths, params_file.resolve(), cli, every=every)


# ---------------------------------------------------------------------------------------------
# records, and executing a chapter


def store_name(set_name: str, cli: dict[str, Any]) -> str:
    """The records store of a run: the set's name, or ``_scratch/<set>`` under ``-p`` overrides."""
    return f"{SCRATCH}/{set_name}" if cli else set_name


def records_dir(store: str, job: Job) -> Path:
    return RECORDS / store / job.run / job.name


def assess(jobs: list[Job], store: str) -> None:
    """Fill ``job.reasons`` (:func:`provenance.staleness` of its records folder)."""
    for job in jobs:
        job.reasons = provenance.staleness(records_dir(store, job), job.params, runplan.notebook_hash(job.nb),
                                           root=ROOT, testbeds=runplan.testbed_hashes(job.testbeds))


def _papermill(job: Job, nb: Any, out: Path, records_at: Path, set_name: str, progress: bool) -> Any:
    """Execute ``nb`` with the job's parameters and records folder; return the executed notebook.
    A failure leaves ``out/<chapter>.failed.ipynb`` and raises :class:`RunError` naming the cell."""
    import logging

    import nbformat
    import papermill as pm

    from pactlib import testbeds

    logging.getLogger("papermill").setLevel(logging.ERROR)  # the runner checked the parameters itself
    out.mkdir(parents=True, exist_ok=True)
    env = {**runplan.kernel_env(job.threads or default_threads(1)), "PACT_PARAMS": set_name,
           "PACT_RECORDS_DIR": str(records_at), "PACT_FIGURES_DIR": str(out / "figures"),
           "PACT_NOTEBOOK": job.name, "PACT_RUN": job.run, "PACT_RUN_TITLE": job.title or pparams.MAIN,
           "PACT_BOOK_DIR": str(ROOT / "book"), "PACT_CACHE": os.environ.get("PACT_CACHE") or str(ROOT / ".cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if testbeds.definitions():
        env[testbeds.ENV] = json.dumps(testbeds.definitions(), sort_keys=True)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    tmp, partial = out / f".{job.name}.{os.getpid()}.ipynb", out / f"{job.name}.failed.ipynb"
    try:
        with mock.patch.dict(os.environ, env):  # the kernel inherits this process's environment
            result = pm.execute_notebook(nb, str(tmp), parameters=job.overrides, kernel_name=KERNEL, cwd=str(ROOT),
                                         progress_bar=progress, log_output=False, request_save_on_cell_execute=False,
                                         extra_arguments=KERNEL_ARGS)
    except Exception as exc:
        if tmp.exists():
            os.replace(tmp, partial)
        raise RunError(runplan.failure_message(job.source, exc, _rel(partial))) from exc
    tmp.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    return nbformat.from_dict(result)


def _chapter_records(folder: Path) -> list[dict]:
    """Every record in a chapter's records folder, its verdicts left out."""
    return [r for f in sorted(folder.glob("*.jsonl")) if not f.name.endswith(".verdicts.jsonl")
            for r in records.read_records(f)]


def compute(job: Job, store: str, set_name: str, progress: bool = False) -> dict[str, Any]:
    """Execute the whole notebook into a staging folder, write its provenance, swap it into
    ``book/records/<store>/<run>/<chapter>/``; return the provenance."""
    import nbformat

    final = records_dir(store, job)
    staging = final.with_name(f".{job.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    end, nb = staging / ".kernel-end.json", nbformat.from_dict(job.nb)
    nb.cells.append(nbformat.v4.new_code_cell(END_CELL.format(path=str(end))))
    t0 = time.perf_counter()
    try:
        _papermill(job, nb, job.out_dir(EXECUTED / store), staging, set_name, progress)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # the old records stay as they were
        raise
    wall, kernel = time.perf_counter() - t0, json.loads(end.read_text())
    end.unlink()
    for lock in staging.glob("*.lock"):  # records.write_records' lock files
        lock.unlink()
    merges = _chapter_records(staging)
    prov = {"chapter": job.name, "run": job.run, "set": store, "params": job.params,
            "seeds": provenance.seeds_of(job.params), "testbeds": runplan.testbed_hashes(job.testbeds),
            "engine": provenance.engine(kernel["modules"], ROOT), "notebook": runplan.notebook_hash(job.nb),
            "made": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "git": provenance.git_state(ROOT),
            "machine": provenance.machine(usable_cores()), "threads": job.threads or default_threads(1),
            "wall_minutes": round(wall / 60, 2), "cpu_minutes": round(kernel["cpu_seconds"] / 60, 2),
            "merges": site.merge_profile(merges),
            "zoos": {f: provenance.zoo_fingerprint(cache_dir(), f) for f in sorted(runplan.job_families(job))}}
    provenance.write(staging, prov)
    provenance.swap_in(staging, final)
    return prov


def _command(job: Job, store: str) -> str:
    """The command that computes ``job``'s records in ``store``."""
    if store.startswith(f"{SCRATCH}/"):
        return f"`make chapter NB={job.name} ARGS=\"-p ...\"`"
    return f"`make reproduce NB={job.id}`"


def _banner(job: Job, store: str, prov: dict | None) -> str:
    bench = job.nb is not None and any(runplan.BENCH_TAG in c.metadata.get("tags", []) for c in job.nb.cells
                                       if c.cell_type == "code")
    return site.banner(_command(job, store), store=store, run=job.run, reasons=job.reasons, bench=bench,
                       made=None if prov is None else str(prov.get("made", "?")))


def present_key(job: Job, store: str, engine_code: str) -> str:
    """What a present notebook depends on: its source, parameters, run, records, their state and
    the code of ``pactlib``."""
    folder = records_dir(store, job)
    files = {p.name: provenance.sha(p.read_bytes()) for p in sorted(folder.glob("*"))
             if p.is_file() and not p.name.endswith(".verdicts.jsonl")}  # present's output, not its input
    return provenance.sha(_json({"notebook": provenance.sha(job.source.read_bytes()), "params": job.params,
                                 "run": [job.run, job.title], "records": files, "reasons": job.reasons,
                                 "code": engine_code}).encode())


def present(job: Job, store: str, set_name: str, key: str, progress: bool = False) -> float:
    """Execute the chapter's present cells on a copy of its records; write the executed notebook
    (``book/_executed/<store>/[<variant>/]<chapter>.ipynb``, its ``.key``) and its verdicts
    (``book/_executed/<store>/<run>/<chapter>.verdicts.jsonl``); return the seconds taken."""
    import nbformat

    src, out = records_dir(store, job), job.out_dir(EXECUTED / store)
    work, verdicts = out / "records" / job.name, f"{job.name}.verdicts.jsonl"
    shutil.rmtree(work, ignore_errors=True)
    if src.is_dir():
        shutil.copytree(src, work, ignore=shutil.ignore_patterns(verdicts))  # the present cells write them again
    work.mkdir(parents=True, exist_ok=True)
    prov = provenance.read(src) if src.is_dir() else None
    top = [_banner(job, store, prov)] if job.reasons else []
    if prov is not None:
        top.append(site.provenance_box(prov, _command(job, store), f"{_rel(src)}/"))
    nb = runplan.present_copy(job.nb, missing=prov is None, store=store, top="\n\n".join(top),
                              changed={k: v for k, v in job.overrides.items() if job.defaults.get(k) != v},
                              chapter=job.name, variant=job.variant)
    t0 = time.perf_counter()
    result = _papermill(job, nb, out, work, set_name, progress)
    seconds = round(time.perf_counter() - t0, 2)
    runplan.restore_skipped(result)
    result.metadata["pact"] = {"params_set": store, "state": provenance.state(job.reasons), "key": key,
                               "threads": job.threads, "seconds": seconds}
    _write(out / f"{job.name}.ipynb", nbformat.writes(result))
    made = next((f for f in (work / verdicts, src / verdicts) if f.is_file()), None)
    target = EXECUTED / store / job.run / verdicts
    target.parent.mkdir(parents=True, exist_ok=True)
    if made is not None:
        shutil.copyfile(made, target)
    else:
        target.unlink(missing_ok=True)
    refresh_verdicts(job, src / verdicts, work / verdicts)
    _write(out / f"{job.name}.key", _json({"key": key, "seconds": seconds, "threads": job.threads}))
    return seconds


def refresh_verdicts(job: Job, stored: Path, presented: Path) -> bool:
    """Keep a current chapter's committed verdicts equal to what its present cells derive now.

    Verdicts are drawn from the records by the verdict rules (:mod:`pactlib.book.verdicts` and the
    chapters' verdict functions); when a rule changes, the records stay current but the
    ``<chapter>.verdicts.jsonl`` that the compute run stored (read by ``make readme``) would say
    what the old rule said. For a chapter whose records are current (no ``job.reasons``), the
    presented verdicts replace the stored ones when they differ; a stale or missing chapter's are
    left as its compute run wrote them. Returns whether ``stored`` was rewritten."""
    if job.reasons or not presented.is_file() or not stored.parent.is_dir():
        return False
    new = presented.read_text(encoding="utf-8")
    old = stored.read_text(encoding="utf-8") if stored.is_file() else None
    if new == old:
        return False
    write_atomic(stored, new)
    before = {r["claim"]: r["status"] for r in records.read_json_lines(old, stored)} if old else {}
    moved = [f"{r['claim']}: {before.get(r['claim'], '-')} -> {r['status']}"
             for r in records.read_json_lines(new, presented) if before.get(r["claim"]) != r["status"]]
    print(f"    {job.id}: verdicts re-derived from its current records"
          + (f" ({'; '.join(moved)})" if moved else " (evidence text only)") + f" -> {_rel(stored)}")
    return True


def _tag(job: Job, jobs: list[Job]) -> str:
    """The prefix of a notebook's log lines: ``[ 5/12] 05_main_results   ``."""
    return f"[{jobs.index(job) + 1:2d}/{len(jobs)}] {job.id:<{max(26, len(job.id))}}"


def compute_all(jobs: list[Job], store: str, set_name: str, n: int, force: bool, zoos: bool = True) -> None:
    """Compute the chapters of ``jobs`` that are not current (all with ``force``), with a line per
    chapter and the time left, estimated from each one's last recorded wall minutes. With ``zoos``,
    the model zoos those chapters read are built (or completed) first as jobs of the same pool
    (:class:`pactlib.book.runplan.ZooJob`): a family's chapters wait for its zoo, the other family's
    chapters run beside the build."""
    work = [j for j in jobs if force or j.reasons]
    for job in jobs:
        if job not in work:
            print(f"{_tag(job, jobs)} current", flush=True)
    # a zoo build gets the kernels' thread count (--threads, else cores / jobs), as a chapter would
    builds = runplan.zoo_jobs(work, min(j.threads or default_threads(n) for j in work)) if zoos and work else []
    last = {j.id: (provenance.read(records_dir(store, j)) or {}).get("wall_minutes") for j in work}
    left = {"min": sum(v for v in last.values() if v), "untimed": sum(1 for v in last.values() if not v)}

    def start(job: Job) -> None:
        if isinstance(job, runplan.ZooJob):
            print(f"[{job.id}] building or completing the zoo ({' '.join(job.command()[1:])}; {job.threads} thread(s); "
                  f"finished runs are kept; log: {_rel(zoo_log(store, job))})", flush=True)
            return
        est = f"{last[job.id]:.0f} min last time" if last[job.id] else "no estimate"
        togo = (f"~{left['min'] / n:.0f} min left" if left["min"] else "time left unknown") \
            + (f" + {left['untimed']} chapter(s) never timed" if left["untimed"] and left["min"] else "")
        print(f"{_tag(job, jobs)} computing ({('; '.join(job.reasons) or '--force')[:160]}; {job.threads} "
              f"thread(s); {est}; {togo})", flush=True)

    ran: dict[str, dict] = {}

    def done(job: Job, prov: dict) -> None:
        ran[job.id] = {"wall_minutes": prov["wall_minutes"], "cpu_minutes": prov["cpu_minutes"]}
        if isinstance(job, runplan.ZooJob):
            print(f"[{job.id}] ready in {prov['wall_minutes']:.1f} min ({prov['cpu_minutes']:.1f} CPU min)", flush=True)
            record_zoos(store)
            return
        left["min"] -= last[job.id] or 0
        left["untimed"] -= 0 if last[job.id] else 1
        print(f"{_tag(job, jobs)} done in {prov['wall_minutes']:.1f} min ({prov['cpu_minutes']:.1f} CPU min) -> "
              f"{_rel(records_dir(store, job))}", flush=True)

    def run(job):
        return job.build(zoo_log(store, job)) if isinstance(job, runplan.ZooJob) else compute(job, store, set_name)

    record_zoos(store)
    for b in builds:
        print(zoo_plan(b, [j for j in work if b.family in runplan.job_families(j)]), flush=True)
    ids = {b.family: b.id for b in builds}
    began, t0 = datetime.now(timezone.utc), time.perf_counter()
    try:
        runplan.run_parallel(run, [*builds, *work], n, after=AFTER, on_start=start, on_done=done,
                             cost=lambda job: last.get(job.id) or 0.0,
                             needs=lambda job: set() if isinstance(job, runplan.ZooJob)
                             else {ids[f] for f in runplan.job_families(job) if f in ids})
    finally:
        if work:  # the whole run, for the Verdicts page: what ran, for how long, on what
            line = json.dumps({
                "started": began.strftime("%Y-%m-%dT%H:%M:%SZ"), "wall_minutes": round((time.perf_counter() - t0) / 60, 2),
                "jobs": n, "threads": sorted({j.threads or default_threads(n) for j in work}),
                "complete": len(ran) == len(builds) + len(work), "ran": ran,
                "git": provenance.git_state(ROOT), "machine": provenance.machine(usable_cores())}, sort_keys=True)
            path = RECORDS / store / REPRODUCTIONS
            _write(path, (path.read_text(encoding="utf-8") if path.is_file() else "") + line + "\n")


def zoo_plan(build: "runplan.ZooJob", readers: list[Job]) -> str:
    """One line before a compute run: which chapters read ``build``'s zoo, how many of its models
    the cache holds against the committed zoo record (``book/records/default/zoo.json``), and the
    minutes the missing ones took there (the whole build's when the cache holds none)."""
    full = (records.read_json_object(RECORDS / DEFAULT_SET / "zoo.json") or {}).get(build.family) or {}
    here = provenance.zoo_profile(cache_dir()).get(build.family) or {}
    total = sum(int(k.get("models") or 0) for k in (full.get("kinds") or {}).values())
    have = sum(int(k.get("models") or 0) for k in (here.get("kinds") or {}).values())
    minutes = sum(float(k.get("minutes") or 0) for k in (full.get("kinds") or {}).values())
    who = ", ".join(j.id for j in readers)
    if total and have >= total:
        state = f"all {total} models are in {_rel(cache_dir())} (the build only checks them)"
    elif total:
        state = (f"{have} of {total} models are in {_rel(cache_dir())}: training the others, "
                 f"~{minutes * (1 - have / total):.0f} min (the committed build took {minutes:.0f} min)")
    else:
        state = f"{have} models in {_rel(cache_dir())}; no committed build to estimate the time from"
    return (f"[{build.id}] {who} read the {build.family} zoo: {state}; "
            f"--run {' --run '.join(sorted({j.run for j in readers}))} computes only these")


#: Every compute run of the runner (``make reproduce``, ``make chapter``), a JSON line each, under
#: ``book/records/<store>/``: when it started, its wall minutes, the pool size and threads, each
#: job's wall and CPU minutes (chapters and zoo builds), and whether every job finished.
REPRODUCTIONS = "reproductions.jsonl"


def zoo_log(store: str, job: "runplan.ZooJob") -> Path:
    """Where a zoo build's output goes: ``book/_executed/<store>/zoo-<family>.log``."""
    return EXECUTED / store / f"{job.id}.log"


def record_zoos(store: str) -> None:
    """Keep the zoos' training minutes (their runs' records in the cache) in
    ``book/records/<store>/zoo.json``, for the Verdicts page."""
    zoos = provenance.zoo_profile(cache_dir())
    if zoos:
        path = RECORDS / store / "zoo.json"
        _write(path, json.dumps({**(records.read_json_object(path) or {}), **zoos}, indent=1, sort_keys=True) + "\n")


def present_all(jobs: list[Job], store: str, set_name: str, n: int, force: bool) -> None:
    """Present every chapter whose present key changed (all with ``force``)."""
    from pactlib.testbeds.base import source_fingerprint

    code = source_fingerprint(sorted(p for p in (ROOT / "pactlib").rglob("*.py") if "__pycache__" not in p.parts), ROOT)
    keys = {j.id: present_key(j, store, code) for j in jobs}

    def unchanged(job: Job) -> bool:
        out = job.out_dir(EXECUTED / store)
        with contextlib.suppress(OSError, ValueError, KeyError):
            return (out / f"{job.name}.ipynb").is_file() and \
                json.loads((out / f"{job.name}.key").read_text())["key"] == keys[job.id]
        return False

    work, t0 = [j for j in jobs if force or not unchanged(j)], time.perf_counter()
    runplan.run_parallel(lambda job: present(job, store, set_name, keys[job.id]), work, n, after=AFTER,
                         on_start=lambda job: None,
                         on_done=lambda job, s: print(f"{_tag(job, jobs)} presented ({provenance.state(job.reasons)}) "
                                                      f"in {s:.1f} s", flush=True))
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


def toc_for(store: str, params_file: Path) -> Path:
    """``book/_executed/<store>/_toc.yml``: ``_toc.yml`` pointed at the store's folder, variants as
    sections of their chapters, and the Verdicts page."""
    toc = site.toc(yaml.safe_load(TOC.read_text(encoding="utf-8")), TOC_PREFIX, f"book/_executed/{store}/",
                   variant_pages(params_file))
    return _write(EXECUTED / store / "_toc.yml", f"# generated by scripts/run_notebooks.py from _toc.yml and "
                  f"{params_file.name}\n" + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True))


def evaluation_work(store: str, jobs: list[Job], states: dict) -> dict:
    """:func:`site.evaluation_work` of every chapter with records; split sizes from chapter 2's
    tables of every run of ``store`` (None for a chapter whose examples cannot be counted)."""
    sizes: dict = {}
    for folder in sorted((RECORDS / store).glob("*/02_testbed")):
        sizes.update(site.split_sizes(_chapter_records(folder)))
    out = {}
    for job in jobs:
        prov = states[(job.name, job.run)]["provenance"]
        folder = records_dir(store, job)
        if prov is None or not folder.is_dir():
            continue
        try:
            out[(job.name, job.run)] = site.evaluation_work(
                _chapter_records(folder), test_limit=(prov.get("params") or {}).get("test_limit"), sizes=sizes) or None
        except ValueError:
            out[(job.name, job.run)] = None
    return out


def _json_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file (:func:`records.read_json_lines`), [] without it."""
    return records.read_json_lines(path.read_text(encoding="utf-8"), path) if path.is_file() else []


def eval_speed() -> dict:
    """:func:`site.eval_speed` of ``book/data/eval_speed.jsonl`` ({} without the file)."""
    path = ROOT / "book" / "data" / "eval_speed.jsonl"
    return site.eval_speed(records.read_records(path)) if path.is_file() else {}


def write_verdicts_page(store: str, params_file: Path, jobs: list[Job]) -> Path:
    """``book/_executed/<store>/verdicts.md`` from the present runs' verdicts and the records' states."""
    titles = {r: spec["title"] for r, spec in pparams.variant_definitions(params_file).items()}
    files = [(j.name, j.run, EXECUTED / store / j.run / f"{j.name}.verdicts.jsonl") for j in jobs]
    states = {(j.name, j.run): {"state": provenance.state(j.reasons), "reasons": j.reasons,
                                "provenance": provenance.read(records_dir(store, j))} for j in jobs}
    merges = {k: st["provenance"]["merges"] for k, st in states.items() if (st["provenance"] or {}).get("merges")}
    text = site.verdicts_page(store, titles, site.read_verdicts(files, list(titles)), states, merges,
                              records.read_json_object(RECORDS / store / "zoo.json"),
                              evaluation_work(store, jobs, states), eval_speed(),
                              reproductions=_json_lines(RECORDS / store / REPRODUCTIONS),
                              agreement=_json_lines(ROOT / "book" / "data" / "recompute_agreement.jsonl")
                              if store == "default" else ())
    _write(EXECUTED / store / f"{findings.FINDINGS_PAGE}.md", findings_text(store, params_file, jobs, states))
    return _write(EXECUTED / store / f"{site.VERDICTS_PAGE}.md", text)


def findings_text(store: str, params_file: Path, jobs: list[Job], states: dict | None = None) -> str:
    """The page *What this book finds* (:func:`pactlib.book.findings.findings_page`) from the
    present runs' verdicts, ``book/findings.yaml``, the set's parameters and its compute runs."""
    titles = {r: spec["title"] for r, spec in pparams.variant_definitions(params_file).items()}
    files = [(j.name, j.run, EXECUTED / store / j.run / f"{j.name}.verdicts.jsonl") for j in jobs]
    if states is None:
        states = {(j.name, j.run): {"state": provenance.state(j.reasons)} for j in jobs}
    params = {f"{j.run}/{j.name}" if j.run != "main" else j.name: dict(j.params) for j in jobs}
    return findings.findings_page(findings.load_text(FINDINGS_TEXT), site.read_verdicts(files, list(titles)), titles,
                                  states=states, params=params,
                                  compute=compute_used(store, states))


def compute_used(store: str, states: dict) -> dict:
    """What the set's records cost: the zoos' training minutes (``zoo.json``) and each chapter's
    CPU minutes from its provenance, summed; fields of the findings page's text."""
    zoo = records.read_json_object(RECORDS / store / "zoo.json") or {}
    zoo_min = sum(float(k.get("minutes") or 0) for fam in zoo.values() for k in (fam.get("kinds") or {}).values())
    cpu = 0.0
    for st in states.values():
        prov = st.get("provenance") or {}
        cpu += float(prov.get("cpu_minutes") or 0.0)
    runs = [r for r in _json_lines(RECORDS / store / REPRODUCTIONS) if r.get("complete")]
    full = max(runs, key=lambda r: len(r.get("ran") or {}), default={})
    return {"zoo_minutes": findings.minutes(zoo_min), "chapter_cpu_minutes": findings.minutes(cpu),
            "reproduce_wall_minutes": findings.minutes(full.get("wall_minutes")),
            "reproduce_started": str(full.get("started", "?"))[:10],
            "machine": ", ".join(f"{k} {v}" for k, v in (full.get("machine") or {}).items())}


def announcement(store: str) -> str:
    """The banner every page of the ``store`` book carries: none for the default set; for another
    set (``smoke``) or a scratch store (``-p`` values), that its numbers are not the book's results."""
    if store == DEFAULT_SET:
        return ""
    if store.startswith("_scratch/"):
        return (f"A scratch build: these pages show records computed with parameters changed by -p "
                f"(set {store.split('/', 1)[1]!r}), not the book's results.")
    return (f"A {store!r} build: every number on these pages is a {store} value (params/{store}.yaml), "
            "made to check that the chapters run, not a result.")


def no_records(store: str, params_file: Path) -> str:
    """The message for presenting a non-default set that has no records at all (a fresh clone
    commits only the default set's): what to run first. Empty when there are records."""
    if store == DEFAULT_SET or any((RECORDS / store).rglob(provenance.FILE)):
        return ""
    name = params_file.stem
    return (f"the {name!r} set has no records yet (only the default set's are committed): run "
            f"`make reproduce PARAMS={name}` first, then `make book PARAMS={name}` renders them")


def render(store: str, out: Path | None, params_file: Path, jobs: list[Job]) -> Path:
    """The Verdicts page, ``jupyter-book build`` into ``out`` (default: the repository for the
    default set, else ``_build/<store>``) and the offline check; return the HTML folder."""
    pages = expected_pages(params_file)
    if missing := [c for c in pages if not (EXECUTED / store / f"{c}.ipynb").is_file()]:
        raise RunError(f"cannot render the {store!r} book: not presented yet: {missing}")
    out = out or (ROOT if store == DEFAULT_SET else ROOT / "_build" / store)
    html = out / "_build" / "html"
    write_verdicts_page(store, params_file, jobs)
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT), "--toc",
           str(toc_for(store, params_file)), "--path-output", str(out), "-W", "-n", "--keep-going", "-q"]
    if note := announcement(store):  # a banner on every page of a book that is not the default set's
        config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
        config.setdefault("html", {})["announcement"] = note
        ext = config.get("sphinx", {}).get("local_extensions") or {}  # read relative to the config file
        config.get("sphinx", {})["local_extensions"] = {k: str(ROOT / v) for k, v in ext.items()}
        cmd += ["--config", str(_write(ROOT / "_build" / store / "_config.yml", yaml.safe_dump(config, sort_keys=False)))]
    print(f">> rendering with jupyter-book -> {_rel(html)}", flush=True)
    t0 = time.perf_counter()
    if (rc := subprocess.run(cmd, cwd=ROOT).returncode) != 0:
        raise RunError(f"jupyter-book build failed (exit {rc}); command: {' '.join(cmd)}")
    print(f">> rendered in {time.perf_counter() - t0:.1f} s", flush=True)
    if problems := site.html_problems(html, [f"book/_executed/{store}/{p}" for p in [*pages, site.VERDICTS_PAGE, findings.FINDINGS_PAGE]]):
        raise RunError("the rendered book failed its checks:\n  " + "\n  ".join(problems[:30]))
    return html


# ---------------------------------------------------------------------------------------------


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--mode", choices=("present", "compute"), default="present",
        help="present: render from the records (default); compute: recompute stale/missing chapters")
    add("--params", default=DEFAULT_SET, help="parameter set: a name under params/ (default: default) or a YAML path")
    add("--only", nargs="+", metavar="NB",
        help="notebook stems or prefixes (e.g. 05), or one run of one: <variant>/<stem> (minilm/05)")
    add("-p", dest="set", action="append", default=[], metavar="NAME=VALUE",
        help="override a parameter (YAML value) in the selected notebooks that have it; the records then go to "
             "book/records/_scratch/<set>/")
    add("--run", action="append", default=None, metavar="RUN",
        help="only this run of the selected notebooks: 'main' or a variant (repeatable)")
    add("--force", action="store_true", help="recompute (compute) / re-present (present) even when current")
    add("--jobs", type=int, default=int(os.environ.get("PACT_BOOK_JOBS", "1")),
        help="notebooks executed at once (default: $PACT_BOOK_JOBS or 1)")
    add("--threads", default=None, metavar="N",
        help="torch threads of each kernel, 1-4096 (else the set's `threads:`, else cores / --jobs); not part of any "
             "key: merges are bit-identical for any count")
    add("--no-render", action="store_true",
        help="no jupyter-book: present mode presents only, compute mode computes only")
    add("--render-only", action="store_true", help="render what is presented, execute nothing")
    add("--path-output", type=Path, default=None, help="jupyter-book output folder (HTML in <it>/_build/html)")
    add("--check-only", action="store_true", help="validate notebooks and parameters, execute nothing")
    add("--status", action="store_true", help="print each chapter's records state, execute nothing")
    add("--needs", action="store_true",
        help="print the make targets producing the selected notebooks' inputs, run nothing")
    return ap.parse_args(argv)


def select(jobs: list[Job], only: list[str] | None, run: list[str] | None, params_file: Path) -> list[Job]:
    """The jobs ``--only`` (stems, ``<run>/<stem>``) and ``--run`` choose, after checking that they name
    runs the set has."""
    runs = pparams.variant_definitions(params_file)
    if unknown := sorted(set(run or ()) - set(runs)):
        raise pparams.ParameterError(f"--run {unknown}: {params_file.name} has the runs {list(runs)}")
    specs = only_runs(only) or [(None, p.stem) for p in notebook_paths(None)]
    for r, stem in specs:
        if r and r not in runs:
            raise pparams.ParameterError(f"--only {r}/{stem}: {params_file.name} has no run {r!r}; "
                                         f"its runs: {list(runs)}")
        if r and not any(j.run == r and j.name == stem for j in jobs):
            raise pparams.ParameterError(f"--only {r}/{stem}: variant {r!r} of {params_file.name} does not run "
                                         f"{stem}; it runs {[j.name for j in jobs if j.run == r]}")
    return [j for j in jobs if any(j.name == stem and r in (None, j.run) for r, stem in specs)
            and (not run or j.run in run)]


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    params_file = Path(args.params) if args.params.endswith((".yaml", ".yml")) \
        else ROOT / "params" / f"{args.params}.yaml"
    t_all = time.perf_counter()
    try:
        if args.needs:
            try:
                with contextlib.chdir(ROOT):
                    specs = only_runs(args.only)
                    runs = args.run or ([r for r, _ in specs] if specs and all(r for r, _ in specs) else None)
                    print(" ".join(book_needs(notebook_paths(args.only), params_file.resolve(), parse_cli(args.set),
                                              runs)))
                return 0
            except (pparams.ParameterError, FileNotFoundError, RunError) as exc:
                print(f"run_notebooks: --needs: {exc}; answering {' '.join(NEEDS)!r}", file=sys.stderr)
                print(" ".join(NEEDS))
                return 2
        if odd := sorted({p.stem for p in notebook_paths(None)} ^ set(toc_chapters())):
            raise RunError(f"notebooks and _toc.yml disagree on chapters: {odd}")
        cli_threads, cli = threads_option(args.threads), parse_cli(args.set)
        if args.jobs < 1:
            raise pparams.ParameterError(f"--jobs must be a whole number >= 1, got {args.jobs}")
        selected = notebook_paths(args.only)
        # the rendered book shows every chapter, so every one is checked; -p applies to the selected ones
        others = [] if args.no_render else [p for p in notebook_paths(None) if p not in selected]
        jobs = prepare(selected, params_file, cli) + (prepare(others, params_file, {}) if others else [])
        order = list(pparams.variant_definitions(params_file))
        jobs.sort(key=lambda j: (order.index(j.run), j.name))
        chosen = select(jobs, args.only, args.run, params_file)
        for job in jobs:
            job.threads = resolve_threads(cli_threads, job, args.jobs)
        if args.check_only:
            extra, counts = len(chosen) - len(selected), sorted({j.threads for j in chosen})
            print(f"parameters of {len(selected)} notebook(s) are valid ({params_file.name}"
                  + (f"; {extra} more run(s) in variants)" if extra else ")")
                  + (f"; torch threads per kernel: {', '.join(map(str, counts))}" if counts else ""))
            return 0
        store = store_name(params_file.stem, cli)
        assess(jobs, store)
        if args.status:
            for job in chosen:
                print(f"{job.id:<36} {provenance.state(job.reasons):<8} {'; '.join(job.reasons)}")
            return 0
        if args.mode == "compute" and not args.render_only:
            compute_all(chosen, store, params_file.stem, args.jobs, args.force)
            assess(jobs, store)
        if args.mode == "present" and not cli and (missing := no_records(store, params_file)):
            raise RunError(missing)
        if not args.render_only and (args.mode == "present" or not args.no_render):
            # present what was chosen, and every page never presented (the book renders them all)
            todo = [j for j in jobs if j in chosen or not (j.out_dir(EXECUTED / store) / f"{j.name}.ipynb").is_file()]
            present_all(todo, store, params_file.stem, args.jobs, args.force and args.mode == "present")
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
