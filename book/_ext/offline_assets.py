"""Sphinx extension: keep the rendered book free of remote scripts.

jupyter-book 1 always loads ``sphinx_thebe``, which writes the URL of its JavaScript bundle
(on unpkg.com) into every page, although nothing loads it while thebe and launch buttons are
off (``_config.yml``). This drops thebe's scripts from every page, so the HTML names no CDN at
all; ``scripts/run_notebooks.py`` then checks that no page fetches anything remote.
"""
from __future__ import annotations

REMOTE_MARKERS = ("://", "sphinx-thebe.js")


def _is_remote(script) -> bool:
    text = str(script) + str(getattr(script, "attributes", {}).get("body", ""))
    return any(marker in text for marker in REMOTE_MARKERS)


def _drop_remote_scripts(app, pagename, templatename, context, doctree) -> None:
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_remote(s)]


def setup(app):
    app.connect("html-page-context", _drop_remote_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
