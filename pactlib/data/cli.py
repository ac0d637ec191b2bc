"""``pact data ...`` sub-commands (registered by :func:`add_cli`, called from ``pactlib.cli``).

    pact data prepare --suite 8 --seeds 0 1 2      build + cache a suite (skips valid files)
    pact data prepare --tasks mnist textures       some tasks
    pact data list [--suite 20]                    the task table (name, classes, source, derived)
"""
from __future__ import annotations

import argparse
import json
import time

from .store import prepare
from .suites import SUITES, resolve
from .tasks import DEFAULT_MAX_TEST, DEFAULT_MAX_TRAINVAL, TASKS

__all__ = ["add_cli"]


def _cmd_prepare(args) -> int:
    if (args.suite is None) == (not args.tasks):
        raise ValueError("give exactly one of --suite or --tasks")
    what = args.suite if args.suite is not None else args.tasks
    t0 = time.perf_counter()
    paths = prepare(what, cache_dir=args.cache_dir, seed=args.seeds, progress=not args.no_progress,
                    max_trainval=args.max_trainval, max_test=args.max_test, force=args.force)
    print(json.dumps({"prepared": len(paths), "tasks": list(resolve(what)), "seeds": args.seeds,
                      "cache_dir": str(paths[0].parent) if paths else None,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


def _cmd_list(args) -> int:
    names = resolve(args.suite) if args.suite else tuple(TASKS)
    for n in names:
        s = TASKS[n]
        in_suites = ",".join(k for k, v in SUITES.items() if n in v)
        print(f"{n:18s} {len(s.classes):2d} classes  {'derived' if s.derived else 'real   '}  "
              f"suites {in_suites:8s} {s.source}")
    return 0


def add_cli(subparsers) -> None:
    """Register ``pact data prepare`` and ``pact data list`` on an argparse sub-parsers object."""
    data = subparsers.add_parser("data", help="the built-in testbed's image tasks")
    dsub = data.add_subparsers(dest="data_command", required=True)
    p = dsub.add_parser("prepare", help="build and cache tasks (valid cached files are kept)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--suite", default=None, help=f"suite name: {', '.join(SUITES)}")
    p.add_argument("--tasks", nargs="+", default=None, help="task names instead of a suite")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="data split seeds")
    p.add_argument("--cache-dir", default=None, help="default $PACT_CACHE/data, else ~/.cache/pactlib/data")
    p.add_argument("--max-trainval", type=int, default=DEFAULT_MAX_TRAINVAL, help="train+val cap per task")
    p.add_argument("--max-test", type=int, default=DEFAULT_MAX_TEST, help="test cap per task")
    p.add_argument("--force", action="store_true", help="rebuild even valid cached files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_prepare)
    ls = dsub.add_parser("list", help="list the tasks")
    ls.add_argument("--suite", default=None, help="only this suite")
    ls.set_defaults(func=_cmd_list)
