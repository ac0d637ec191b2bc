"""Compare a chapter's records with those of another git revision: what a recompute changed.

    python scripts/compare_records.py --rev HEAD~3                  # every chapter of the default set
    python scripts/compare_records.py --rev 4722968 --only main/05_main_results --show 5

For each chapter folder ``book/records/<set>/<run>/<chapter>/`` present in both the working tree
and ``--rev``, the records of each ``.jsonl`` file are paired in order (a chapter writes its
records in a fixed order) and every number in them is compared, timings aside (fields whose name
holds ``seconds``, ``minutes`` or ``_time``); a pair must agree on what the record is (method,
seed, testbed, parameters other than a chosen α, …). It prints, per chapter: records paired, numbers
identical, numbers that differ with the largest absolute and relative difference, and every
verdict whose status changed. ``--json FILE`` appends one JSON line per chapter with the same
counts, for the book's records. Reads only; exits 1 when records cannot be paired (another
count, or a pair whose method, seed or parameters differ).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path("book/records")
TIMING = ("seconds", "minutes", "_time")
IDENTITY = ("method", "base", "kind", "seed", "params", "part", "pact", "testbed", "task", "claim")
#: Parameters that are results, not settings: the α a search chose.
CHOSEN = ("alpha",)


def git_files(rev: str, folder: Path) -> dict[str, str]:
    """{relative path: text} of the ``.jsonl`` files under ``folder`` at ``rev``."""
    out = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, str(folder)], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return {p: subprocess.run(["git", "show", f"{rev}:{p}"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout for p in out if p.endswith(".jsonl")}


def leaves(value, path: str = "") -> Iterator[tuple[str, float]]:
    """(path, number) of every int/float leaf, timings left out; booleans and strings are not numbers."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not any(t in k for t in TIMING):
                yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, float(value)


def _identity(record: dict) -> dict:
    """The fields that say which record this is (a chosen α in ``params`` left out)."""
    out = {k: record.get(k) for k in IDENTITY}
    if isinstance(out["params"], dict):
        out["params"] = {k: v for k, v in out["params"].items() if k not in CHOSEN}
    return out


def compare_file(old_text: str, new_text: str, name: str) -> dict:
    old = [json.loads(line) for line in old_text.splitlines() if line.strip()]
    new = [json.loads(line) for line in new_text.splitlines() if line.strip()]
    if len(old) != len(new):
        raise ValueError(f"{name}: {len(old)} records at the revision, {len(new)} now")
    out = dict(records=len(new), numbers=0, identical=0, max_abs=0.0, max_rel=0.0, diffs=[], verdicts=[])
    for i, (a, b) in enumerate(zip(old, new)):
        ida, idb = (_identity(r) for r in (a, b))
        if ida != idb:
            raise ValueError(f"{name}: record {i} is another one now ({ida} vs {idb})")
        if "claim" in a and a.get("status") != b.get("status"):
            out["verdicts"].append(f"{a['claim']}: {a.get('status')} -> {b.get('status')}")
        la, lb = dict(leaves(a)), dict(leaves(b))
        for path in sorted(la.keys() & lb.keys()):
            x, y = la[path], lb[path]
            out["numbers"] += 1
            if x == y or (math.isnan(x) and math.isnan(y)):
                out["identical"] += 1
                continue
            d = abs(x - y)
            rel = d / max(abs(x), abs(y))
            out["max_abs"], out["max_rel"] = max(out["max_abs"], d), max(out["max_rel"], rel)
            out["diffs"].append((d, f"record {i} ({a.get('method', a.get('claim', '?'))}, seed {a.get('seed')}) "
                                    f"{path}: {x:.6g} -> {y:.6g}"))
    return out


def chapter_folders(files, base: Path) -> list[str]:
    """The ``<run>/<chapter>`` folders of the record ``files`` (paths under ``base``, the set's
    store), sorted; files of the store itself (``reproductions.jsonl``, a log of runs) are not a
    chapter's records and are left out."""
    return sorted({Path(f).parent.relative_to(base).as_posix() for f in files
                   if len(Path(f).parent.relative_to(base).parts) == 2})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="the git revision to compare with (e.g. HEAD~3)")
    p.add_argument("--set", default="default", help="records set under book/records (default: default)")
    p.add_argument("--only", nargs="*", help="<run>/<chapter> folders (default: every one in both)")
    p.add_argument("--show", type=int, default=3, help="largest differences listed per chapter")
    p.add_argument("--json", type=Path, help="append one JSON line per chapter to this file")
    args = p.parse_args(argv)
    base = RECORDS / args.set
    old = git_files(args.rev, base)
    chapters = chapter_folders(old, base)
    if args.only:
        if missing := sorted(set(args.only) - set(chapters)):
            p.error(f"no records at {args.rev} for {', '.join(missing)}; there are: {', '.join(chapters)}")
        chapters = args.only
    bad = 0
    for ch in chapters:
        files = {f: t for f, t in old.items() if str(Path(f).parent.relative_to(base)) == ch}
        total = dict(records=0, numbers=0, identical=0, max_abs=0.0, max_rel=0.0, diffs=[], verdicts=[])
        try:
            for f, text in sorted(files.items()):
                now = ROOT / f
                if not now.is_file():
                    raise ValueError(f"{f}: gone from the working tree")
                r = compare_file(text, now.read_text(encoding="utf-8"), f)
                for k in ("records", "numbers", "identical"):
                    total[k] += r[k]
                total["max_abs"], total["max_rel"] = max(total["max_abs"], r["max_abs"]), max(total["max_rel"], r["max_rel"])
                total["diffs"] += r["diffs"]
                total["verdicts"] += r["verdicts"]
        except ValueError as err:
            print(f"{ch}: cannot pair the records: {err}")
            bad += 1
            continue
        differ = total["numbers"] - total["identical"]
        print(f"{ch}: {total['records']} records, {total['identical']:,} of {total['numbers']:,} numbers identical"
              + (f"; {differ} differ (max |Δ| {total['max_abs']:.3g}, max relative {total['max_rel']:.3g})" if differ else "")
              + (f"; verdicts changed: {'; '.join(total['verdicts'])}" if total["verdicts"] else "; verdicts unchanged"))
        for _, line in sorted(total["diffs"], reverse=True)[:args.show]:
            print(f"    {line}")
        if args.json:
            row = {"chapter": ch, "rev": args.rev, **{k: total[k] for k in ("records", "numbers", "identical", "max_abs",
                                                                             "max_rel", "verdicts")}}
            with args.json.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
