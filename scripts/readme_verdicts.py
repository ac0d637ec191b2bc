#!/usr/bin/env python
"""Regenerate the README's verdict table from the committed verdict records (`make readme`).

Reads ``book/records/default/<run>/<chapter>/<chapter>.verdicts.jsonl`` (the verdicts of the
default set's compute runs), the run titles from ``params/default.yaml`` (``variants:``) and
the records' states, judged from the committed provenance as ``run_notebooks.py --status`` judges
them (a verdict of a stale or missing chapter says so; nothing rendered is read), and rewrites
what lies between ``<!-- verdicts:begin -->`` and ``<!-- verdicts:end -->`` in ``README.md``: a
row per claim, a column per testbed, each cell the status linked to the chapter.

    .venv/bin/python scripts/readme_verdicts.py [--check]   # --check: exit 1 when README.md is out of date
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pactlib.book import params as pparams  # noqa: E402
from pactlib.book import findings, provenance, site  # noqa: E402
from pactlib.io import write_atomic  # noqa: E402

#: Where a cell links: the chapter's notebook in the repository.
LINK = "notebooks/{chapter}.py"
#: Where a claim's label links: the claims' definitions.
DEFINITIONS = "book/method.md#the-papers-claims-as-checks-claims"
#: The bottom line's markers (README.md and book/intro.md).
BOTTOM = ("<!-- bottom-line:begin -->", "<!-- bottom-line:end -->")


def record_states(set_name: str = "default") -> dict[str, str]:
    """``{"<run>/<chapter>": "current"|"stale"|"missing"}`` of this repository's ``set_name`` records
    (``scripts/run_notebooks.py``'s ``prepare`` and ``assess``: parameters, compute cells, engine
    modules and lock compared with the provenance)."""
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    jobs = runner.prepare(runner.notebook_paths(None), ROOT / "params" / f"{set_name}.yaml", {})
    runner.assess(jobs, set_name)
    return {f"{j.run}/{j.name}": provenance.state(j.reasons) for j in jobs}


def _verdicts(root: Path, set_name: str) -> tuple[dict[str, str], list]:
    titles = {r: spec["title"] for r, spec in pparams.variant_definitions(root / "params" / f"{set_name}.yaml").items()}
    store = root / "book" / "records" / set_name
    files = [(p.parent.name, p.parent.parent.name, p) for p in sorted(store.glob("*/*/*.verdicts.jsonl"))
             if p.name == f"{p.parent.name}.verdicts.jsonl"]
    return titles, site.read_verdicts(files, list(titles))


def table(root: Path, set_name: str = "default", states: dict[str, str] | None = None) -> str:
    """The generated block for ``root``'s README (see the module docstring); ``states`` as
    :func:`record_states` gives them (None: no verdict is marked)."""
    titles, found = _verdicts(root, set_name)
    states = states or {}
    verdicts = []
    for chapter, run, rec in found:
        state = states.get(f"{run}/{chapter}", "current")
        verdicts.append((chapter, run, rec if state == "current" else {**rec, "status": f"{rec['status']} ({state})"}))
    return site.readme_table(verdicts, titles, LINK, definitions=DEFINITIONS)


def bottom_line(root: Path, set_name: str = "default") -> str:
    """The bottom line (:func:`pactlib.book.findings.bottom_line`) of the committed verdicts: the
    same text the findings page, the front page (book/intro.md) and the README open with."""
    titles, found = _verdicts(root, set_name)
    text = findings.load_text(root / "book" / "findings.yaml")
    return findings.bottom_line(text, findings.fields(found, titles))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--intro", type=Path, default=ROOT / "book" / "intro.md", help="the front page (its bottom line)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's table is out of date")
    args = ap.parse_args(argv)
    line = bottom_line(ROOT)
    out = 0
    for path, blocks in ((args.readme, [(site.BEGIN, site.END, None), (*BOTTOM, line)]),
                         (args.intro, [(*BOTTOM, line)])):
        text = path.read_text(encoding="utf-8")
        new = text
        try:
            for begin, end, block in blocks:
                new = site.replace_block(new, table(ROOT, states=record_states()) if block is None else block,
                                         begin=begin, end=end)
        except ValueError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
        if args.check:
            out |= int(new != text)
        elif new != text:
            write_atomic(path, new)
            print(f"updated the generated blocks of {path.name}")
    return out


if __name__ == "__main__":
    sys.exit(main())
