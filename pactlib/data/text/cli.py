"""``pact text ...`` sub-commands (registered by :func:`add_cli`), the text twin of ``pact data``.

    pact text prepare --suite 14 --seeds 0     build + cache a suite (skips valid files)
    pact text prepare --tasks spam party       some tasks
    pact text list [--suite 8]                 the task table (name, classes, unit, real/derived, source)
"""
from __future__ import annotations

import argparse
import json
import time

__all__ = ["add_cli"]


def _cmd_prepare(args) -> int:
    from .store import prepare_text
    from .suites import resolve

    if (args.suite is None) == (not args.tasks):
        raise ValueError("give exactly one of --suite or --tasks")
    what = args.suite if args.suite is not None else args.tasks
    t0 = time.perf_counter()
    paths = prepare_text(what, cache_dir=args.cache_dir, seed=args.seeds, progress=not args.no_progress,
                         force=args.force)
    print(json.dumps({"prepared": len(paths), "tasks": list(resolve(what)), "seeds": args.seeds,
                      "cache_dir": str(paths[0].parent) if paths else None,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


def _cmd_list(args) -> int:
    from .suites import TEXT_SUITES, resolve
    from .tasks import TEXT_TASKS

    for n in resolve(args.suite) if args.suite else tuple(TEXT_TASKS):
        s = TEXT_TASKS[n]
        in_suites = ",".join(k for k, v in TEXT_SUITES.items() if n in v)
        print(f"{n:18s} {len(s.classes):2d} classes  {s.unit:10s} {'derived' if s.derived else 'real   '}  "
              f"suites {in_suites:6s} {s.source}")
    return 0


def add_cli(subparsers) -> None:
    """Register ``pact text prepare`` and ``pact text list`` on an argparse sub-parsers object."""
    text = subparsers.add_parser("text", help="the MiniLM testbed's text tasks")
    tsub = text.add_subparsers(dest="text_command", required=True)
    p = tsub.add_parser("prepare", help="build and cache text tasks (valid cached files are kept)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--suite", default=None, help="suite name: 8 or 14")
    p.add_argument("--tasks", nargs="+", default=None, help="task names instead of a suite")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="data split seeds")
    p.add_argument("--cache-dir", default=None, help="default $PACT_CACHE/data/text")
    p.add_argument("--force", action="store_true", help="rebuild even valid cached files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_prepare)
    ls = tsub.add_parser("list", help="list the text tasks")
    ls.add_argument("--suite", default=None, help="only this suite")
    ls.set_defaults(func=_cmd_list)
