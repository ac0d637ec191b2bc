"""What the book finds: the bottom line, the findings page and the verdict cells, from verdict records.

Everything here is generated from the verdict records the chapters write (each with its graded
conditions, :mod:`pactlib.book.verdicts`) and from ``book/findings.yaml``, the authored part: an
interpretation of each claim for each status it may get, the likely reasons where a claim fails
or is inconclusive, the deviations from the paper's setup, and the bottom line's template. The
authored text never types a number: numbers enter through fields filled from the records
(:func:`fields`), e.g. ``{v[C5][main][effect]}`` or ``{counts[main][reproduced]}``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pactlib.book.claims import CHAPTERS, definition, statement
from pactlib.book.intervals import fmt
from pactlib.book.verdicts import CONTRADICTED, FAILS, HOLDS, INCONCLUSIVE, PARTLY, REPRODUCED, STATUSES

__all__ = ["FINDINGS_PAGE", "deciding", "effect_text", "cell", "fields", "bottom_line", "findings_page", "load_text"]

#: The generated page's stem (``book/_executed/<set>/findings.md``).
FINDINGS_PAGE = "findings"


def load_text(path: str | Path) -> dict[str, Any]:
    """``book/findings.yaml`` as a dict.

    Raises:
        ValueError: the file is not a YAML mapping with ``bottom_line`` and ``claims`` (named).
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "bottom_line" not in data or "claims" not in data:
        raise ValueError(f"{path}: expected a mapping with 'bottom_line' and 'claims'")
    return data


def _margin(c: Mapping[str, Any]) -> float:
    """How far a condition's interval clears its threshold (negative: it does not)."""
    return (c["lo"] - c["threshold"]) if c["side"] == ">" else (c["threshold"] - c["hi"])


def deciding(rec: Mapping[str, Any]) -> dict | None:
    """The condition that decides a verdict: the first that fails, else the weakest (the one whose
    interval clears its threshold by the least). None without conditions."""
    conds = rec.get("conditions") or []
    if not conds:
        return None
    failing = [c for c in conds if c["grade"] == FAILS]
    return failing[0] if failing else min(conds, key=_margin)


def effect_text(c: Mapping[str, Any] | None) -> str:
    """``'PACT-TA − TA, T = 8: +0.54 [−0.71, +1.79] points'`` (empty for None)."""
    if c is None:
        return ""
    d = c.get("digits", 2)
    unit = f" {c['unit']}" if c.get("unit") else ""
    return f"{c['name']}: {fmt(c['estimate'], d)} [{fmt(c['lo'], d)}, {fmt(c['hi'], d)}]{unit}"


def _counts(rec: Mapping[str, Any]) -> str:
    conds = rec.get("conditions") or []
    if not conds:
        return ""
    return f"{sum(c['grade'] == HOLDS for c in conds)} of {len(conds)} conditions hold"


def cell(rec: Mapping[str, Any], *, state: str | None = None, html: bool = False) -> str:
    """A table cell for one verdict: the status (and ``(stale)`` / ``(missing)`` when ``state``
    says so), the count of conditions that hold and the deciding condition's effect with its
    interval."""
    status = rec["status"] if state in (None, "current") else f"{rec['status']} ({state})"
    sep = "<br>" if html else "; "
    parts = [f"**{status}**", _counts(rec), effect_text(deciding(rec))]
    return sep.join(p for p in parts if p)


def fields(verdicts: Sequence[tuple[str, str, dict]], titles: Mapping[str, str],
           params: Mapping[str, Mapping[str, Any]] | None = None,
           compute: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The values the authored text may use: ``v[claim][run]`` -> ``{status, effect, counts,
    estimate, lo, hi}``; ``counts[run][status]`` (claims of the paper only, C1–C12); ``n[run]``
    (claims graded there); ``title[run]``; ``params[chapter][name]``; ``compute[...]``."""
    v: dict[str, dict[str, dict]] = {}
    counts: dict[str, dict[str, int]] = {r: {s.replace(" ", "_"): 0 for s in STATUSES} for r in titles}
    for _chapter, run, rec in verdicts:
        d = deciding(rec)
        v.setdefault(rec["claim"], {})[run] = {
            "status": rec["status"], "effect": effect_text(d) or "(no interval recorded)", "counts": _counts(rec),
            "estimate": fmt(d["estimate"], d.get("digits", 2)) if d else "", "lo": fmt(d["lo"]) if d else "",
            "hi": fmt(d["hi"]) if d else ""}
        if definition(rec["claim"]):
            key = rec["status"].replace(" ", "_")
            per = counts.setdefault(run, {s.replace(" ", "_"): 0 for s in STATUSES})
            per[key] = per.get(key, 0) + 1
    return {"v": v, "counts": counts, "n": {r: sum(c.values()) for r, c in counts.items()},
            "title": dict(titles), "params": dict(params or {}), "compute": dict(compute or {})}


class _Missing(dict):
    def __missing__(self, key):  # a field the records do not have yet
        return _Missing()

    def __format__(self, spec):
        return "(not run)"

    def __str__(self):
        return "(not run)"


def _deep(x):
    if isinstance(x, Mapping):
        return _Missing({k: _deep(val) for k, val in x.items()})
    return x


def _fill(text: str, f: Mapping[str, Any]) -> str:
    return str(text).strip().format_map(_deep(f))


def bottom_line(text: Mapping[str, Any], f: Mapping[str, Any]) -> str:
    """The bottom line (3–5 sentences): ``text["bottom_line"]`` filled with :func:`fields`."""
    return " ".join(_fill(text["bottom_line"], f).split())


def _interpretation(entry: Mapping[str, Any], status: str, f: Mapping[str, Any]) -> str:
    said = entry.get("interpretation") or {}
    body = said.get(status) or said.get("any") or ""
    return " ".join(_fill(body, f).split())


def findings_page(text: Mapping[str, Any], verdicts: Sequence[tuple[str, str, dict]], titles: Mapping[str, str],
                  *, states: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                  params: Mapping[str, Mapping[str, Any]] | None = None, compute: Mapping[str, Any] | None = None,
                  link: str = "{chapter}") -> str:
    """The page *What this book finds* (MyST): the bottom line; per claim its statement, the
    verdict per testbed with the deciding effect and its interval, and the interpretation for the
    status it got (with the likely reasons and the experiments run to test them where it fails
    or is inconclusive); the deviations from the paper; the compute used."""
    f = fields(verdicts, titles, params, compute)
    by_claim: dict[str, dict[str, tuple[str, dict]]] = {}
    for chapter, run, rec in verdicts:
        by_claim.setdefault(rec["claim"], {})[run] = (chapter, rec)
    lines = ["(findings)=", "# What this book finds", "", "```{admonition} The bottom line", ":class: tip", "",
             bottom_line(text, f), "```", "",
             "Each claim below is graded by {ref}`the verdict rule <method-verdict-rule>`: a condition *holds* "
             "when its 95 % interval ({ref}`how it is computed <method-intervals>`) lies on the claimed side of "
             "its threshold, *fails* when it lies on the other side, and is *inconclusive* when it spans it. "
             "Each effect shown is the condition that decides the verdict: the first that fails, else the one "
             "closest to its threshold.", ""]
    runs = [r for r in titles if any(r in per for per in by_claim.values())]
    entries = text.get("claims") or {}
    for claim in [c for c in CHAPTERS if c in by_claim] + [c for c in by_claim if c not in CHAPTERS]:
        per = by_claim[claim]
        ref = definition(claim)
        head = f"## {claim}: {statement(claim)}" if statement(claim) != claim else f"## {claim}"
        lines += [head, ""]
        for run in runs:
            if run not in per:
                continue
            chapter, rec = per[run]
            state = ((states or {}).get((chapter, run)) or {}).get("state")
            page = link.format(chapter=chapter if run == "main" else f"{run}/{chapter}")
            lines.append(f"- **{titles.get(run, run)}** ({{doc}}`chapter {chapter.split('_')[0].lstrip('0')} <{page}>`): "
                         + cell(rec, state=state))
        lines.append("")
        entry = entries.get(claim) or entries.get(claim.split(" (")[0]) or {}
        statuses = {rec["status"] for _, rec in per.values()}
        said = [s for s in (_interpretation(entry, st, f) for st in sorted(statuses, key=STATUSES.index)) if s]
        for s in dict.fromkeys(said):
            lines += [s, ""]
        if statuses & {CONTRADICTED, INCONCLUSIVE, PARTLY} and entry.get("reasons"):
            lines += ["*Why it may not reproduce here:*", ""]
            lines += [f"- {_fill(r, f)}" for r in entry["reasons"]] + [""]
        if ref:
            lines += [f"Definition: {{ref}}`{claim.split(' (')[0]} <{ref}>`.", ""]
    if text.get("experiments"):
        lines += ["## Follow-up experiments", ""] + [" ".join(_fill(e, f).split()) + "\n" for e in text["experiments"]]
    if text.get("deviations"):
        lines += ["## How this setting differs from the paper's", ""]
        lines += [f"- {' '.join(_fill(d, f).split())}" for d in text["deviations"]] + [""]
    if text.get("compute"):
        lines += ["## Compute used", "", " ".join(_fill(text["compute"], f).split()), ""]
    return "\n".join(lines).rstrip() + "\n"


def minutes(value: Any) -> str:
    """Minutes as text: ``'112'`` (``'?'`` for None or NaN)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "?"
    return "?" if math.isnan(x) else f"{x:.0f}"
