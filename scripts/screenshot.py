#!/usr/bin/env python
"""Look at the rendered book as a reader would: headless-Chromium screenshots of the front page,
chapter 5 and the Verdicts page (also 420 px wide, as on a phone), and a check that none of them
makes a network request.

    .venv/bin/python scripts/screenshot.py [--html _build/html] [--set default] [--out _build/screenshots]

Exit status: 0 when every page rendered and fetched nothing from the network; 1 otherwise (each
request is printed with its page).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pactlib.book import site  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--set", default="default", help="the parameter set whose book --html holds")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "screenshots")
    args = ap.parse_args(argv)
    chapters = args.html / "book" / "_executed" / args.set
    # name: (page, window width in px); the narrow one is a phone's, where wide tables get cut off
    pages = {"index": (args.html / "book" / "intro.html", 1280),  # index.html only redirects here
             "05_main_results": (chapters / "05_main_results.html", 1280),
             "verdicts": (chapters / f"{site.VERDICTS_PAGE}.html", 1280),
             "verdicts-narrow": (chapters / f"{site.VERDICTS_PAGE}.html", 420)}
    bad = 0
    for name, (page, width) in pages.items():
        try:
            requests = site.look_at(page, args.out / f"{name}.png", width=width)
        except (FileNotFoundError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for url in requests:
            print(f"error: {page.relative_to(args.html)} requested {url}", file=sys.stderr)
        bad += len(requests)
        print(f">> {args.out / f'{name}.png'}: {len(requests)} network request(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
