"""The book's generated pages and checks: the table of contents of a set, the Verdicts page, the
README's verdict table and the offline check of the rendered HTML.

Pure functions over data the runner (``scripts/run_notebooks.py``) gathers: verdict records
(``{"claim", "status", "evidence", "run"}`` per line of ``<chapter>.verdicts.jsonl``), the state
of each chapter's records (:mod:`pactlib.book.provenance`) and their provenance.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM_FLAGS", "page_requests", "look_at", "MAIN", "VERDICTS_PAGE", "BEGIN", "END", "read_verdicts", "toc", "verdicts_page", "records_section",
           "time_section", "merge_profile", "family", "split_sizes", "evaluation_work", "eval_speed",
           "evaluation_floor", "floor_lines", "runs_lines", "agreement_lines", "run_families", "zoo_rebuilds",
           "and_join", "signed", "readme_table", "replace_block", "html_problems",
           "provenance_box", "PROVENANCE_CLASS", "TABLE_CLASS", "short_reason", "banner"]

MAIN = "main"
VERDICTS_PAGE = "verdicts"
#: The README's generated block lies between these two lines.
BEGIN, END = "<!-- verdicts:begin -->", "<!-- verdicts:end -->"
CLAIM = re.compile(r"^C(\d+)")
#: Largest relative difference of a recompute's numbers that the Verdicts page calls float-level.
FLOAT_LEVEL = 1e-4
#: One claim of the paper: "C5", "C9a", "C9a (early layers give most of the gain)".
SINGLE = re.compile(r"^C(\d+)[a-z]?(?: \(.*\))?$")
#: Tags that make a browser fetch something; none of them may point off the machine.
FETCH = re.compile(r"""<(?:script|img|iframe|source|link)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)
REMOTE = re.compile(r"^(https?:)?//", re.I)


def read_verdicts(files: Iterable[tuple[str, str, Path]], runs: Sequence[str]) -> list[tuple[str, str, dict]]:
    """``(chapter, run, record)`` for every verdict in ``files`` (``(chapter, run, path)``; absent
    files are skipped). A verdict about another known run (its ``run`` field) is counted there."""
    out = []
    for chapter, run, path in files:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                out.append((chapter, rec["run"] if rec.get("run") in runs else run, rec))
    return out


def _claim_order(claims: Iterable[str]) -> list[str]:
    """The paper's claims in number order (C9a after C9), then rows that span claims ("C5–C7 at
    paper scale"), then the book's own checks."""
    def key(c: str) -> tuple[int, str]:
        if (m := SINGLE.match(c)):
            return int(m.group(1)), c
        return (500 if CLAIM.match(c) else 999), c
    return sorted(set(claims), key=key)


def toc(base: Mapping[str, Any], prefix_from: str, prefix_to: str, variants: Mapping[str, Sequence[str]]) -> dict:
    """The table of contents of a set: ``base`` (``_toc.yml`` as a dict, not modified) with every
    chapter file under ``prefix_from`` moved to ``prefix_to``, each chapter's variant pages
    (``{variant: [stems]}``) as its sections, and the Verdicts page as a part before "About"."""
    out = json.loads(json.dumps(base))
    for part in out.get("parts", []):
        for chapter in part.get("chapters", []):
            f = chapter.get("file", "")
            if f.startswith(prefix_from):
                stem = f[len(prefix_from):]
                chapter["file"] = prefix_to + stem
                extra = [{"file": f"{prefix_to}{v}/{stem}"} for v, stems in variants.items() if stem in stems]
                if extra:  # after the chapter's own sections (e.g. chapter 1's specification page)
                    chapter["sections"] = chapter.get("sections", []) + extra
    parts = out.setdefault("parts", [])
    at = next((i for i, p in enumerate(parts) if p.get("caption", "").startswith("About")), len(parts))
    parts.insert(at, {"caption": "Verdicts", "chapters": [{"file": prefix_to + VERDICTS_PAGE}]})
    from pactlib.book.findings import FINDINGS_PAGE

    for part in parts:  # the findings page: after the last chapter of the analysis (chapter 11)
        files = [c.get("file", "") for c in part.get("chapters", [])]
        if any(f.endswith("/11_sensitivity") for f in files):
            at = next(i for i, f in enumerate(files) if f.endswith("/11_sensitivity")) + 1
            part["chapters"].insert(at, {"file": prefix_to + FINDINGS_PAGE})
            break
    else:
        parts.insert(len(parts) - 1 if parts else 0, {"caption": "Findings", "chapters": [{"file": prefix_to + FINDINGS_PAGE}]})
    return out


#: The CSS class of the generated pages' tables: their cells wrap, so a narrow screen shows every
#: column (``book/_static/pact.css``).
TABLE_CLASS = "pact-wrap"


def _table(lines: Sequence[str]) -> list[str]:
    """A Markdown table's ``lines`` inside MyST's ``{table}`` directive with :data:`TABLE_CLASS`."""
    return ["```{table}", f":class: {TABLE_CLASS}", *lines, "```"]


def _stem(chapter: str) -> str:
    """A chapter stem for a table cell: a line may break after each underscore (``<wbr>``)."""
    return chapter.replace("_", "_<wbr>")


def _run(titles: Mapping[str, str], run: str) -> str:
    """A run's title for a dense table: up to its first comma ("MiniLM-L6, text tasks" -> "MiniLM-L6")."""
    return titles.get(run, run).split(",")[0]


def _mark(status: str, state: str | None) -> str:
    return status if state in (None, "current") else f"{status} ({state})"


def verdicts_page(set_name: str, titles: Mapping[str, str], verdicts: Sequence[tuple[str, str, dict]],
                  states: Mapping[tuple[str, str], Mapping[str, Any]],
                  merges: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                  zoo: Mapping[str, Mapping[str, Any]] | None = None,
                  work: Mapping[tuple[str, str], Mapping[str, Mapping[str, int]] | None] | None = None,
                  speed: Mapping[str, Mapping[str, float]] | None = None,
                  reproductions: Sequence[Mapping[str, Any]] = (),
                  agreement: Sequence[Mapping[str, Any]] = ()) -> str:
    """The Verdicts page (MyST markdown): a row per claim, a column per run (``titles``: run ->
    title, main first), the chapter that tests it; a status whose chapter's records are stale or
    missing says so; then :func:`records_section`, :func:`time_section`, :func:`runs_lines`
    (``reproductions``) and :func:`agreement_lines` (``agreement``).

    ``states``: ``{(chapter, run): {"state": "current"|"stale"|"missing", "reasons": [...],
    "provenance": {...} or None}}``; ``merges``, ``zoo``, ``work`` and ``speed``: see :func:`time_section`.
    """
    from pactlib.book.claims import definition, statement
    from pactlib.book.findings import FINDINGS_PAGE, cell

    rows: dict[str, dict[str, str]] = {}
    chapter_of: dict[str, str] = {}
    for chapter, run, rec in verdicts:
        state = (states.get((chapter, run)) or {}).get("state")
        status = _mark(rec["status"], state)
        rows.setdefault(rec["claim"], {})[run] = (
            f"{{ref}}`{status} <{verdict_label(run, rec['claim'])}>`" + cell(rec, html=True).split("**", 2)[2]
            if rec.get("conditions") else status)
        chapter_of.setdefault(rec["claim"], chapter)
    used = [r for r in titles if any(r in v for v in rows.values())] or [MAIN]
    lines = ["# Verdicts at a glance", "",
             "Every claim's verdict, from the chapter that tests it, on each testbed the book ran "
             f"(parameter set `{set_name}`), graded by {{ref}}`the verdict rule <method-verdict-rule>` on 95 % "
             "intervals: a claim is *reproduced* when every condition holds, *contradicted* when one fails, "
             "*partly reproduced* when some hold and the rest are inconclusive, *inconclusive* when none is "
             "decided. Each cell gives the condition that decides it (the first that fails, else the one "
             "closest to its threshold) and links to the chapter's verdict. "
             f"{{doc}}`What this book finds <{FINDINGS_PAGE}>` says what the verdicts mean. A verdict "
             "marked *(stale)* comes from records made with other parameters, notebook code or engine "
             "than the book's current ones (see below).", ""]
    table = ["| Claim | Chapter | " + " | ".join(titles.get(r, r) for r in used) + " |",
             "|---|---|" + "---|" * len(used)]
    for claim in _claim_order(rows):
        ref = definition(claim)
        label = f"{{ref}}`{claim} <{ref}>`" if ref else claim
        said = statement(claim)
        text = f"{label}: {said}" if said != claim else label
        number = chapter_of[claim].split("_")[0].lstrip("0")
        table.append(f"| {text} | {{doc}}`{number} <{chapter_of[claim]}>` | "
                     + " | ".join(rows[claim].get(r, "not run") for r in used) + " |")
    if not rows:
        table.append("| (no verdicts recorded yet) | | " + " | " * len(used))
    return "\n".join(lines + _table(table) + records_section(titles, states)
                     + time_section(titles, states, merges, zoo, work, speed)
                     + runs_lines(reproductions)
                     + agreement_lines(agreement, titles=titles, families=run_families(states),
                                       rebuilt=zoo_rebuilds(reproductions, agreement, zoo),
                                       now={(f"{run}/{chapter}", rec["claim"]): rec["status"]
                                            for chapter, run, rec in verdicts})) + "\n"


def runs_lines(runs: Sequence[Mapping[str, Any]], most: int = 6) -> list[str]:
    """Markdown lines "Recompute runs": the last ``most`` compute runs of the runner
    (``book/records/<set>/reproductions.jsonl``, a line per run: ``started``, ``wall_minutes``,
    ``jobs``, ``threads``, ``complete``, ``ran``: ``{job id: {"wall_minutes", "cpu_minutes"}}``,
    ``machine``), newest first: what each run computed (chapters, zoo builds) and how long it took
    from start to end. [] without runs."""
    if not runs:
        return []
    table = ["| Started (UTC) | Wall min | Pool | Chapters | Zoo builds (wall min) | CPU min | Finished |",
             "|---|---:|---|---:|---|---:|---|"]
    shown = sorted(runs, key=lambda r: r.get("started", ""), reverse=True)[:most]
    for r in shown:
        ran = r.get("ran") or {}
        zoos = {k: v for k, v in ran.items() if k.startswith("zoo-")}
        chapters = len(ran) - len(zoos)
        cpu = sum(float(v.get("cpu_minutes") or 0.0) for v in ran.values())
        threads = "/".join(str(t) for t in r.get("threads") or []) or "?"
        table.append(f"| {str(r.get('started', '?')).replace('T', ' ').rstrip('Z')} | {_min(r.get('wall_minutes'))} "
                     f"| {r.get('jobs', '?')} × {threads} thread(s) | {chapters} | "
                     + (", ".join(f"{k[4:]} {_min(v.get('wall_minutes'))}" for k, v in sorted(zoos.items())) or "–")
                     + f" | {cpu:.1f} | {'yes' if r.get('complete') else 'no'} |")
    notes = [f"*{str(r.get('started', '?')).replace('T', ' ').rstrip('Z')}*: {r['note']}." for r in shown
             if r.get("note")]
    return ["", "### Recompute runs", "",
            "Each `make reproduce` (or `make chapter`) run from start to end: its "
            "pool (kernels at once × torch threads each), the chapters it computed, the zoos it built or "
            "completed beside them, the CPU minutes of all of them and whether every job finished "
            "(`book/records/<set>/reproductions.jsonl`).", ""] + _table(table) + ([""] + notes if notes else [])


def run_families(states: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, set[str]]:
    """``{"<run>/<chapter>": families}``: the model zoos each chapter's records were made from
    (their provenance's ``zoos``); a chapter whose provenance does not say (made before it was
    recorded) gets the zoos its run's other chapters name; ``{}`` in its provenance: none."""
    out: dict[str, set[str]] = {}
    by_run: dict[str, set[str]] = {}
    unknown = []
    for (chapter, run), st in states.items():
        zoos = (st.get("provenance") or {}).get("zoos")
        if isinstance(zoos, Mapping):
            out[f"{run}/{chapter}"] = set(zoos)
            if len(zoos) == 1:  # a chapter that reads one zoo names its run's (chapter 2 reads both)
                by_run.setdefault(run, set()).update(zoos)
        else:
            unknown.append((chapter, run))
    for chapter, run in unknown:
        if run in by_run:
            out[f"{run}/{chapter}"] = set(by_run[run])
    return out


def zoo_rebuilds(runs: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
                 zoo: Mapping[str, Mapping[str, Any]] | None) -> dict[str, float] | None:
    """The zoos trained again since the revision the recompute is compared with: ``{family:
    wall minutes}`` over the compute runs (``reproductions.jsonl``) whose ``git`` starts with the
    ``rev`` of the agreement ``rows`` (a run from that revision, or a range ``rev..end``), where a
    ``zoo-<family>`` job took at least half the zoo's summed training minutes (``zoo``, from
    ``zoo.json``); a shorter job only checked the zoo. None when no run is logged from that
    revision: then nothing is known about the zoos."""
    revs = {str(r.get("rev")) for r in rows if r.get("rev")}
    mine = [r for r in runs if any(str(r.get("git") or "").startswith(rev) for rev in revs)]
    if not mine:
        return None
    out: dict[str, float] = {}
    for r in mine:
        for job, t in (r.get("ran") or {}).items():
            if not job.startswith("zoo-"):
                continue
            fam = job[4:]
            total = sum(float(k.get("minutes") or 0.0) for k in ((zoo or {}).get(fam) or {}).get("kinds", {}).values())
            wall = float(t.get("wall_minutes") or 0.0)
            if total > 0 and wall >= total / 2:
                out[fam] = out.get(fam, 0.0) + wall
    return out


def and_join(items: Sequence[str]) -> str:
    """Words as a list in prose: ["a"] -> "a"; ["a", "b", "c"] -> "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def signed(value: float, fmt: str = "{:+.2f}") -> str:
    """``value`` in ``fmt`` with a typographic minus ("−0.42", "+0.05" with the default ``fmt``), as
    the formulas of the generated prose write it."""
    return fmt.format(value).replace("-", "−")


def _numbers(ids: Sequence[str]) -> str:
    """Chapter numbers as a short list: ["02_testbed", "03_x", "04_y", "09_z"] -> "2–4 and 9"."""
    nums = sorted({int(c.split("_")[0]) for c in ids if c.split("_")[0].isdigit()})
    spans: list[list[int]] = []
    for n in nums:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    parts = [x for a, b in spans for x in ([f"{a}"] if a == b else [f"{a}", f"{b}"] if b == a + 1 else [f"{a}–{b}"])]
    return and_join(parts)


def _chapters(titles: Mapping[str, str], keys: Sequence[str]) -> str:
    """``["main/02_testbed", "minilm/09_lora", ...]`` as "EfficientNet-Lite0 chapters 2–11; MiniLM-L6 chapter 9"."""
    by_run: dict[str, list[str]] = {}
    for k in keys:
        run, _, chapter = k.partition("/")
        by_run.setdefault(run, []).append(chapter)
    order = list(titles)
    out = []
    for run in sorted(by_run, key=lambda r: order.index(r) if r in order else 99):
        chs = by_run[run]
        out.append(f"{_run(titles, run)} chapter{'s' if len(chs) > 1 else ''} {_numbers(chs)}")
    return "; ".join(out)


def agreement_lines(rows: Sequence[Mapping[str, Any]], *, titles: Mapping[str, str] | None = None,
                    families: Mapping[str, set[str]] | None = None,
                    rebuilt: Mapping[str, float] | None = None,
                    now: Mapping[tuple[str, str], str] | None = None) -> list[str]:
    """Markdown lines "What the last recompute changed": per chapter and run, the records of the
    recompute against those of the revision before it (``scripts/compare_records.py --json``, in
    ``book/data/recompute_agreement.jsonl``: ``chapter``, ``rev``, ``records``, ``numbers``,
    ``identical``, ``max_abs``, ``max_rel``, ``verdicts``). [] without rows.

    Above the table, a list drawn from the rows: the chapters whose numbers are all identical;
    those that read a zoo trained again in the recompute (``rebuilt``: :func:`zoo_rebuilds`;
    ``families``: :func:`run_families`), whose fine-tunes differ; those whose zoo was not rebuilt
    (or that read none), where only float rounding differs; and every verdict that changed.
    ``rebuilt`` None: the runs do not say whether a zoo was rebuilt, and the list says so. ``now``:
    ``{("<run>/<chapter>", claim): status}`` as the book grades the claims today; a changed verdict
    whose grade differs today says so. Rows whose numbers all differ by at most
    :data:`FLOAT_LEVEL` (relative) are float-level, whatever the zoo."""
    if not rows:
        return []
    titles = titles or {}
    families = families or {}
    table = ["| Chapter | Records | Numbers identical | Largest difference (abs / rel) | Verdicts changed |",
             "|---|---:|---:|---|---|"]
    same_rows, tiny_rows, zoo_rows, float_rows, unknown_rows, changed = [], [], [], [], [], []
    for r in rows:
        n, same = int(r.get("numbers") or 0), int(r.get("identical") or 0)
        diff = "–" if n == same else f"{float(r.get('max_abs') or 0):.3g} / {float(r.get('max_rel') or 0):.3g}"
        table.append(f"| {r.get('chapter')} | {r.get('records')} | {same:,} of {n:,} ({same / max(n, 1):.1%}) | {diff} | "
                     + ("; ".join(v.replace(" -> ", " → ") + _graded_now(now, str(r.get("chapter")), v)
                                  for v in r.get("verdicts") or []) or "none") + " |")
        key = str(r.get("chapter"))
        if n == same:
            same_rows.append(r)
        elif float(r.get("max_rel") or 0.0) <= FLOAT_LEVEL:
            tiny_rows.append(r)
        elif rebuilt is None:
            unknown_rows.append(r)
        elif families.get(key, set()) & set(rebuilt):
            zoo_rows.append(r)
        else:
            float_rows.append(r)
        changed += [(key, v) for v in r.get("verdicts") or []]
    revs = sorted({str(r.get("rev")) for r in rows})
    moved = {str(r["chapter"]) for r in zoo_rows}
    same_keys = {str(r["chapter"]) for r in same_rows}
    names = {f: _UNITS.get(f, (f, ""))[0] for f in (rebuilt or {})}
    items = []
    if same_rows:
        items.append(f"- **Identical**: {_chapters(titles, [str(r['chapter']) for r in same_rows])}.")
    if tiny_rows:
        items.append(f"- **Float-level**: {_chapters(titles, [str(r['chapter']) for r in tiny_rows])}: every "
                     f"number within {max(float(r.get('max_rel') or 0.0) for r in tiny_rows):.1g} of its old value "
                     "(relative), the rounding of a different order of operations.")
    if zoo_rows:
        fams = sorted({f for r in zoo_rows for f in families.get(str(r["chapter"]), set()) & set(rebuilt or {})})
        share = [int(r.get("identical") or 0) / max(int(r.get("numbers") or 0), 1) for r in zoo_rows]
        zoos = " and ".join(f"the {names[f]} zoo ({rebuilt[f]:.1f} wall min)" for f in fams)
        items.append(f"- **Moved with a rebuilt zoo**: {zoos} {'was' if len(fams) == 1 else 'were'} trained again "
                     f"in this recompute (see *Recompute runs* above), so {'its' if len(fams) == 1 else 'their'} "
                     f"fine-tunes differ, and so do the merges made from them: "
                     f"{_chapters(titles, [str(r['chapter']) for r in zoo_rows])} "
                     f"({min(share):.1%} to {max(share):.1%} of their numbers identical).")
    if float_rows:
        eight = any(str(r["chapter"]).endswith("/08_efficiency") for r in float_rows)
        items.append(f"- **Float rounding only**: {_chapters(titles, [str(r['chapter']) for r in float_rows])} "
                     "read a zoo that was not rebuilt (or none), so only the engine changed. Their numbers "
                     "differ by float rounding and by what rounding tips over: a prediction (an accuracy "
                     "moves by one example) or an entry at a threshold (a count changes)."
                     + (" Chapter 8's speed-ups are ratios of measured times, so they differ from run to run."
                        if eight else ""))
    if unknown_rows:
        items.append(f"- **Differ**: {_chapters(titles, [str(r['chapter']) for r in unknown_rows])}; the compute "
                     f"runs logged since `{', '.join(revs)}` do not say whether their zoo was rebuilt.")
    items.append("- **Verdicts changed**: " + ("; ".join(
        f"{v.split(':')[0]} in {_chapters(titles, [k])}: {v.partition(': ')[2].replace(' -> ', ' → ')}"
        + (" (rebuilt zoo)" if k in moved else " (the same numbers: the rule that grades them changed)"
           if k in same_keys else "") + _graded_now(now, k, v) for k, v in changed) + "." if changed else "none."))
    return (["", "### What the last recompute changed", "",
            f"Every number of each recomputed chapter against the committed records of `{', '.join(revs)}` "
            "(timings aside; `scripts/compare_records.py`), and the verdicts as they were graded when the "
            "recompute ran (a later change of a grading rule is not a change of the records):", ""]
            + items + [""] + _table(table))


def _graded_now(now: Mapping[tuple[str, str], str] | None, chapter: str, change: str) -> str:
    """" (graded now: <status>)" when today's grade of the claim in ``change`` ("C6: a -> b")
    differs from the grade the recompute gave it; else ""."""
    claim, _, moved = change.partition(": ")
    status = (now or {}).get((chapter, claim))
    return f" (graded now: {status})" if status and status != moved.split(" -> ")[-1] else ""


def records_section(titles: Mapping[str, str], states: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
    """Markdown lines: the state of every chapter's records per run (current / stale with the
    reasons / missing) and when they were made; [] when every chapter is current."""
    bad = {k: v for k, v in states.items() if v.get("state") != "current"}
    if not bad:
        return []
    lines = ["", "## Records that are not current", "",
             "These chapters render records made with other parameters, code or engine than the book's current "
             "ones, or have "
             "none yet; `make reproduce NB=<chapter>` recomputes one.", ""]
    table = ["| Chapter | Run | State | Made | Why |", "|---|---|---|---|---|"]
    for (chapter, run), st in sorted(bad.items(), key=lambda kv: (kv[0][0], list(titles).index(kv[0][1])
                                                                    if kv[0][1] in titles else 99)):
        made = ((st.get("provenance") or {}).get("made") or "–")[:10]
        why = "; ".join(short_reason(r) for r in st.get("reasons") or [])
        why = why.replace("|", "/").replace("_", "\\_").replace("/", "/<wbr>")
        table.append(f"| {_stem(chapter)} | {_run(titles, run)} | {st['state']} | {made} | {why} |")
    return lines + _table(table)


def short_reason(reason: str, most: int = 4) -> str:
    """A reason of :func:`pactlib.book.provenance.staleness` as the Verdicts page's table cell: a
    missing chapter's folder left out (the row names it), engine modules without ``pactlib/``
    and ``.py``, and at most ``most`` of them (``"… (n more)"``)."""
    if reason.startswith("missing:"):
        return "no records yet"
    head, sep, rest = reason.partition(": ")
    if head != "engine changed" or not sep:
        return reason
    names = [n.replace("/__init__.py", "").removeprefix("pactlib/").removesuffix(".py") for n in rest.split(", ")]
    more = f", … ({len(names) - most} more)" if len(names) > most else ""
    return f"{head}: {', '.join(names[:most])}{more}"


#: The CSS class of a chapter's provenance box (``book/_static/pact.css`` styles it).
PROVENANCE_CLASS = "pact-provenance"


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def provenance_box(prov: Mapping[str, Any], command: str, folder: str) -> str:
    """A chapter's provenance as a folded MyST admonition (a dropdown; a colon fence, since its
    title holds backticks), put under its title.

    Its title, the one line a reader sees: the ``command`` that computes the records (Markdown,
    e.g. ``"`make reproduce NB=08_efficiency`"``), the date they were made and their CPU minutes;
    opened, it gives the engine fingerprint (12 hex digits), the git commit (7 hex digits, ``-dirty`` kept
    and explained),
    the wall minutes, the machine, the torch threads and the records ``folder``. ``prov``: a
    ``provenance.json`` (:mod:`pactlib.book.provenance`); a missing field reads ``?``.
    """
    engine = str((prov.get("engine") or {}).get("fingerprint") or "?")[:12]
    git = str(prov.get("git") or "?")
    git = git[:7] + ("-dirty" if git.endswith("-dirty") else "")
    machine = prov.get("machine") or {}
    where = ", ".join(x for x in (str(machine.get("cpu") or ""),
                                  f"{machine['cores']} cores" if machine.get("cores") else "",
                                  f"torch {machine['torch']}" if machine.get("torch") else "") if x)
    return (f":::{{admonition}} Computed by {command} on {str(prov.get('made') or '?')[:10]}, "
            f"{_num(prov.get('cpu_minutes'))} CPU min\n:class: dropdown {PROVENANCE_CLASS}\n\n"
            f"Engine `{engine}`, git `{git}`"
            + (" (uncommitted changes to the code beside that commit: the engine fingerprint, a hash of every "
               "engine module the chapter imported, names the code that ran)" if git.endswith("-dirty") else "")
            + f"; {_num(prov.get('wall_minutes'))} wall min"
            f"{f' on {where}' if where else ''}, {prov.get('threads', '?')} torch thread(s). Records: `{folder}`. "
            "The folded code cells ran then; here their records are read back, and every figure, table and "
            "verdict of this page is drawn from them.\n:::")


def banner(command: str, *, store: str, run: str, reasons: Sequence[str], made: str | None, bench: bool) -> str:
    """The warning at the top of a chapter whose records are missing (``made`` is None: then
    ``bench`` says whether the cells reading ``book/data/`` ran) or stale (``reasons``, from
    :func:`pactlib.book.provenance.staleness`); ``command`` computes them (Markdown)."""
    if made is None:
        ran = ("only the cells that read the committed benchmark data (`book/data/`) were executed" if bench
               else "nothing past the parameters was executed")
        return (f"```{{warning}}\nNo records yet for this chapter (parameter set `{store}`, run `{run}`): its "
                f"code is shown, {ran}. Run {command} to compute them.\n```")
    why = "\n".join(f"- {r}".replace("_", "\\_") for r in reasons)  # pactlib/__init__.py is no emphasis
    return (f"```{{warning}}\nThese results are **stale**: the records were made on {made[:10]} "
            f"with other inputs than the current ones:\n\n{why}\n\nRun {command} to recompute them.\n```")


def merge_profile(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """What a chapter's merges cost, from the records :func:`pactlib.testbeds.run` returns (those
    with ``seconds`` and ``merge_seconds``): ``computed`` and ``reused`` (read back from the run
    memo, ``memo_hit``) merges, minutes spent merging (the PACT filter included) and minutes
    spent choosing α on validation and testing (``seconds − merge_seconds``) by computed merges.
    A record repeated (the same ``seconds`` and ``merge_seconds``) counts once."""
    out = {"computed": 0, "reused": 0, "merge_minutes": 0.0, "eval_minutes": 0.0}
    seen = set()
    for rec in records:
        sec, merge = rec.get("seconds"), rec.get("merge_seconds")
        if not isinstance(sec, (int, float)) or not isinstance(merge, (int, float)) or (sec, merge) in seen:
            continue  # not a merge's record, or a copy of one already counted (a chapter may list it twice)
        seen.add((sec, merge))
        if rec.get("memo_hit"):
            out["reused"] += 1
            continue
        out["computed"] += 1
        out["merge_minutes"] += merge / 60
        out["eval_minutes"] += max(sec - merge, 0.0) / 60
    return out


def family(testbed: Any) -> str | None:
    """The testbed family of a testbed name: ``"lite0-8"`` -> ``"lite0"``, ``"minilm-14:4"`` ->
    ``"minilm"``; None for a record without a testbed name."""
    if not isinstance(testbed, str):
        return None
    return testbed.split("-")[0].split(":")[0] or None


def split_sizes(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{task: (validation examples, test examples)}`` from chapter 2's task tables: the table
    records (:func:`pactlib.book.records.table_record`) named ``tasks`` (image tasks) and
    ``text-tasks``, whose columns include ``val`` and ``test``; other records are ignored."""
    out: dict[str, tuple[int, int]] = {}
    for rec in records:
        if rec.get("method") != "table" or rec.get("table") not in ("tasks", "text-tasks"):
            continue
        cols, skip = list(rec["columns"]), len(rec.get("index") or [])
        for row in rec["rows"]:
            cell = dict(zip(cols, row[skip:]))
            out[str(row[0])] = (int(cell["val"]), int(cell["test"]))
    return out


def _examples(tasks: Iterable[str], limit: int | None, sizes: Mapping[str, tuple[int, int]], split: int,
              where: str) -> int:
    n = 0
    for t in tasks:
        size = sizes.get(t, (None, None))[split]
        if size is None and limit is None:
            raise ValueError(f"{where}: task {t!r} has no split size and no cap: cannot count its examples")
        n += min(x for x in (size, limit) if x is not None)
    return n


def evaluation_work(records: Iterable[Mapping[str, Any]], *, test_limit: int | None,
                    sizes: Mapping[str, tuple[int, int]] | None = None) -> dict[str, dict[str, int]]:
    """What choosing α and testing cost a chapter, counted in examples, by testbed family
    (book/method.md, protocol; :func:`pactlib.eval.select_alpha`).

    A record of :func:`pactlib.eval.select_alpha` (one with ``curve`` and ``per_task``) evaluated
    the merged model once on validation per α of its ``curve`` and once on test:
    ``len(curve) × Σ_t min(val_limit, n_val(t))`` validation and ``Σ_t min(test_limit, n_test(t))``
    test examples over its tasks ``t`` (the keys of ``per_task["val"]["acc"]``), where n(t) is
    the split's size (``sizes``, :func:`split_sizes`; the cap alone where a task has none, the
    split alone where the cap is None). ``val_limit`` is the record's own; ``test_limit`` is the
    chapter's parameter (the testbed caps its test split when loaded). Records read back from
    the run memo (``memo_hit``) and repeats of one record are left out, as in
    :func:`merge_profile`: their evaluation was paid by another chapter.

    Returns:
        ``{family: {"merges": n, "evaluations": models evaluated, "val": examples, "test":
        examples}}`` (:func:`family` of the record's ``testbed``; ``"?"`` without one); {} for no
        record of that kind.

    Raises:
        ValueError: a task has neither a split size nor a cap.
    """
    sizes = sizes or {}
    out: dict[str, dict[str, int]] = {}
    seen = set()
    for i, rec in enumerate(records):
        curve, per_task = rec.get("curve"), rec.get("per_task")
        if not isinstance(curve, list) or not isinstance(per_task, Mapping) or rec.get("memo_hit"):
            continue
        key = (rec.get("seconds"), rec.get("merge_seconds"), rec.get("method"), rec.get("seed"), rec.get("testbed"))
        if key in seen:
            continue
        seen.add(key)
        tasks = list((per_task.get("val") or {}).get("acc") or {})
        where = f"record {i} ({rec.get('method')}, {rec.get('testbed')})"
        w = out.setdefault(family(rec.get("testbed")) or "?", {"merges": 0, "evaluations": 0, "val": 0, "test": 0})
        w["merges"] += 1
        w["evaluations"] += len(curve) + 1
        w["val"] += len(curve) * _examples(tasks, rec.get("val_limit"), sizes, 0, where)
        w["test"] += _examples(tasks, test_limit, sizes, 1, where)
    return out


def eval_speed(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The evaluator's speed from ``book/data/eval_speed.jsonl`` rows (``bench/bench_eval.py``):
    the last run's ``eval_throughput`` records, ``{family: {"examples_per_s", "flops_per_example",
    "load_avg"}}`` (rates per CPU second of one thread), and ``"gemm": {"flops_per_s"}``, the best
    single-thread ``torch.mm`` rate of that run. {} without throughput records."""
    rows = [r for r in rows if r.get("method") in ("eval_throughput", "gemm") and r.get("run")]
    if not any(r["method"] == "eval_throughput" for r in rows):
        return {}
    last = max(r["run"] for r in rows if r["method"] == "eval_throughput")
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["run"] != last:
            continue
        m = r["metrics"]
        if r["method"] == "gemm":
            g = out.setdefault("gemm", {"flops_per_s": 0.0})
            g["flops_per_s"] = max(g["flops_per_s"], float(m["flops_per_cpu_s"]))
        else:
            out[str(r["params"]["testbed"])] = {"examples_per_s": float(m["examples_per_cpu_s"]),
                                                "flops_per_example": float(m["flops_per_example"]),
                                                "load_avg": float(r.get("load_avg") or 0.0)}
    return out


def evaluation_floor(work: Mapping[str, Mapping[str, int]], speed: Mapping[str, Mapping[str, float]]
                     ) -> dict[str, float | None]:
    """One chapter's evaluation floor in minutes of one core: ``examples`` (validation + test),
    ``minutes`` at the evaluator's measured rate (``speed``: :func:`eval_speed`) and
    ``compute_minutes``, its FLOPs at the machine's GEMM rate. A minutes value is None when a
    family in ``work`` has no measured rate."""
    examples = sum(w["val"] + w["test"] for w in work.values())
    minutes: float | None = 0.0
    compute: float | None = 0.0
    gemm = (speed.get("gemm") or {}).get("flops_per_s")
    for fam, w in work.items():
        n, s = w["val"] + w["test"], speed.get(fam)
        if not n:
            continue
        if not s:
            minutes = compute = None
            break
        minutes += n / s["examples_per_s"] / 60
        compute = None if compute is None or not gemm else compute + n * s["flops_per_example"] / gemm / 60
    return {"examples": examples, "minutes": minutes, "compute_minutes": compute}


def _min(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


#: The cores of the machine the book's timings are spread over.
CORES = 2
#: How the book names a testbed family's examples.
_UNITS = {"lite0": ("Lite0", "images"), "minilm": ("MiniLM", "texts")}


def floor_lines(titles: Mapping[str, str], work: Mapping[tuple[str, str], Mapping[str, Mapping[str, int]] | None],
                speed: Mapping[str, Mapping[str, float]],
                measured: Mapping[tuple[str, str], float] | None = None, zoo_minutes: float | None = None,
                other_minutes: float | None = None) -> list[str]:
    """Markdown lines "The evaluation floor": per chapter and run, the models and examples its α
    searches and tests evaluated (``work``: :func:`evaluation_work` per ``(chapter, run)``; None:
    not countable), the minutes ``measured`` for them (provenance: merges' ``eval_minutes``), and
    the floor (:func:`evaluation_floor` with ``speed``, :func:`eval_speed`); then sentences on
    how far the measured reproduction is from the floor on the machine's cores, and how long a whole
    reproduction would take with evaluation at its floor, given ``zoo_minutes`` (training the zoos)
    and ``other_minutes`` (the chapters' time besides evaluation). [] when nothing was counted."""
    measured = measured or {}
    order = list(titles)
    rows = sorted(((c, r, w) for (c, r), w in work.items() if w), key=lambda x: (
        order.index(x[1]) if x[1] in order else 99, x[0]))
    if not rows:
        return []
    table = ["| Chapter, testbed | Models evaluated | Examples | Measured min | Floor min | Compute floor min |",
             "|---|---:|---:|---:|---:|---:|"]
    tot = {"n": 0, "ex": 0, "val": 0, "meas": 0.0, "floor": 0.0, "compute": 0.0}
    floor_ok = compute_ok = True
    for chapter, run, w in rows:
        f = evaluation_floor(w, speed)
        m = measured.get((chapter, run))
        n = sum(x["evaluations"] for x in w.values())
        tot["n"] += n
        tot["ex"] += f["examples"]
        tot["val"] += sum(x["val"] for x in w.values())
        tot["meas"] += m or 0.0
        floor_ok = floor_ok and f["minutes"] is not None
        compute_ok = compute_ok and f["compute_minutes"] is not None
        tot["floor"] += f["minutes"] or 0.0
        tot["compute"] += f["compute_minutes"] or 0.0
        table.append(f"| {_stem(chapter)}<br>*{_run(titles, run)}* | {n:,} | {f['examples']:,} | {_min(m)} "
                     f"| {_min(f['minutes'])} | {_min(f['compute_minutes'])} |")
    table.append(f"| **all chapters** | **{tot['n']:,}** | **{tot['ex']:,}** | **{tot['meas']:.1f}** | "
                 f"**{_min(tot['floor'] if floor_ok else None)}** | **{_min(tot['compute'] if compute_ok else None)}** |")
    rates = ", ".join(f"{_UNITS.get(k, (k, 'examples'))[0]} {v['examples_per_s']:.0f} {_UNITS.get(k, (k, 'examples'))[1]}"
                      f"/s at {v['flops_per_example'] / 1e6:.0f} MFLOP each"
                      for k, v in sorted(speed.items()) if k != "gemm")
    gemm = (speed.get("gemm") or {}).get("flops_per_s")
    lines = ["", "### The evaluation floor", "",
             "The work the protocol asks of the α searches and tests: each merge is evaluated on validation "
             "once per α of its grid and on test once, on every task of its suite, at the chapter's caps "
             "(counted from the records; merges reused from another chapter are counted there). *Floor* is "
             "that work at the evaluator's own rate on one core with nothing else running"
             + (f" ({rates}; `bench/bench_eval.py`, `book/data/eval_speed.jsonl`)" if rates else "")
             + "; *compute floor* is its floating-point work at the machine's single-thread matrix-multiply rate"
             + (f" ({gemm / 1e9:.0f} GFLOP/s)" if gemm else "") + ". Both are minutes of one core.", ""]
    lines += _table(table)
    if floor_ok and tot["meas"] > 0:
        cores = CORES
        text = (f"The chapters evaluated {tot['ex']:,} examples, {tot['val'] / max(tot['ex'], 1):.0%} of them on "
                f"validation. Measured, that took {tot['meas']:.1f} minutes of one core (each chapter evaluates "
                f"on one thread); at the floor it is {tot['floor']:.1f} core-minutes, so the measured evaluation "
                f"is {tot['meas'] / max(tot['floor'], 1e-9):.2f}× its floor ({tot['floor'] / cores:.1f} minutes "
                f"on the machine's {cores} cores).")
        below = [k for k, w in work.items() if w and measured and (measured.get(k) or 0) > 0
                 and evaluation_floor(w, speed)["minutes"] and measured[k] < evaluation_floor(w, speed)["minutes"]]
        if below:
            text += (f" {len(below)} row(s) measure below their floor: the evaluator has become faster than "
                     "the rate `bench/bench_eval.py` recorded, or the chapter evaluated fewer examples than "
                     "counted; re-run the benchmark to refresh the rate.")
        if compute_ok and tot["compute"] > 0:
            text += (f" The evaluator itself runs at {tot['compute'] / max(tot['floor'], 1e-9):.0%} of the "
                     f"matrix-multiply rate: a perfect one would need {tot['compute']:.1f} core-minutes, "
                     f"{tot['compute'] / cores:.1f} minutes on the {cores} cores.")
        if zoo_minutes is not None:
            other = other_minutes or 0.0
            need = (zoo_minutes + other + tot["floor"]) / cores
            text += (f" With the zoos' {zoo_minutes:.0f} minutes of training and the chapters' other work as "
                     f"measured ({other:.0f} min), all spread over {cores} cores, the whole book with evaluation "
                     f"at its floor would take about {need:.0f} minutes; the measured whole "
                     "reproductions are listed under *Recompute runs* below.")
        lines += ["", text]
    return lines


def time_section(titles: Mapping[str, str], states: Mapping[tuple[str, str], Mapping[str, Any]],
                 merges: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                 zoo: Mapping[str, Mapping[str, Any]] | None = None,
                 work: Mapping[tuple[str, str], Mapping[str, Mapping[str, int]] | None] | None = None,
                 speed: Mapping[str, Mapping[str, float]] | None = None) -> list[str]:
    """Markdown lines "Where the time goes": the profile of the last reproduction.

    A row per chapter and run (the chapter, its testbed below it): wall and CPU minutes of its
    compute run (provenance), and of those the merges (``merges``: :func:`merge_profile` per
    ``(chapter, run)``): how many were computed and how many reused from another chapter's run,
    minutes merging (filter included), minutes choosing α and testing, and the rest (the
    chapter's own experiments, loading). ``zoo``: per
    testbed, ``{"kinds": {kind: {"models": n, "minutes": m}}}`` (the zoo's training records).
    ``work`` (:func:`evaluation_work` per ``(chapter, run)``) and ``speed`` (:func:`eval_speed`):
    the evaluation floor (:func:`floor_lines`) after them. [] when nothing has been timed."""
    merges = merges or {}
    rows = []
    for (chapter, run), st in states.items():
        prov = st.get("provenance") or {}
        if isinstance(prov.get("cpu_minutes"), (int, float)):
            rows.append((chapter, run, float(prov.get("wall_minutes") or 0.0), float(prov["cpu_minutes"]),
                         merges.get((chapter, run))))
    if not rows and not zoo:
        return []
    order = list(titles)
    rows.sort(key=lambda r: (order.index(r[1]) if r[1] in order else 99, r[0]))
    lines = ["", "## Where the time goes", "",
             "The profile of the last reproduction (`make reproduce`), from the records' provenance: each "
             "chapter's compute run in wall and CPU minutes, and the part of it spent merging (the PACT filter "
             "included), choosing α on validation and testing. *Reused* merges were read back from the run memo "
             "(`pactlib.testbeds.run`): another chapter computed them. Rendering the book from the records takes "
             "none of this.", "",
             "| Chapter, testbed | Wall min | CPU min | Merges computed / reused | Merging min | α search + test min "
             "| Rest min |", "|---|---:|---:|---:|---:|---:|---:|"]
    at = len(lines) - 2
    tot = {"wall": 0.0, "cpu": 0.0, "c": 0, "r": 0, "m": 0.0, "e": 0.0}
    for chapter, run, wall, cpu, mp in rows:
        tot["wall"] += wall
        tot["cpu"] += cpu
        if mp and (mp["computed"] or mp["reused"]):
            rest = max(wall - mp["merge_minutes"] - mp["eval_minutes"], 0.0)
            cells = [f"{mp['computed']} / {mp['reused']}", _min(mp["merge_minutes"]), _min(mp["eval_minutes"]), _min(rest)]
            tot["c"] += mp["computed"]
            tot["r"] += mp["reused"]
            tot["m"] += mp["merge_minutes"]
            tot["e"] += mp["eval_minutes"]
        else:
            cells = ["–", "–", "–", _min(wall)]
        lines.append(f"| {_stem(chapter)}<br>*{_run(titles, run)}* | {wall:.1f} | {cpu:.1f} | "
                     + " | ".join(cells) + " |")
    if rows:
        lines.append(f"| **all chapters** | **{tot['wall']:.1f}** | **{tot['cpu']:.1f}** | {tot['c']} / {tot['r']} "
                     f"| {tot['m']:.1f} | {tot['e']:.1f} | {max(tot['wall'] - tot['m'] - tot['e'], 0.0):.1f} |")
        lines[at:] = _table(lines[at:])
    else:
        del lines[at:]
    if zoo:
        lines += ["", "Training the model zoos (`make zoo`), from each fine-tune's own record (wall minutes "
                  "of the training and its evaluation):", ""]
        table = ["| Testbed | Kind | Models | Minutes |", "|---|---|---:|---:|"]
        total = 0.0
        for testbed, z in sorted(zoo.items()):
            for kind, k in sorted((z.get("kinds") or {}).items()):
                total += float(k.get("minutes") or 0.0)
                table.append(f"| {testbed} | {kind} | {k.get('models', 0)} | {_min(k.get('minutes'))} |")
        table.append(f"| **all zoos** | | | **{total:.1f}** |")
        lines += _table(table)
    if work:
        zoo_minutes = sum(float(k.get("minutes") or 0.0) for z in (zoo or {}).values()
                          for k in (z.get("kinds") or {}).values()) if zoo else None
        measured = {k: float(v["eval_minutes"]) for k, v in merges.items() if "eval_minutes" in v}
        lines += floor_lines(titles, work, speed or {}, measured, zoo_minutes,
                             max(tot["wall"] - tot["e"], 0.0) if rows else None)
    return lines


def readme_table(verdicts: Sequence[tuple[str, str, dict]], titles: Mapping[str, str], link: str,
                 definitions: str | None = None) -> str:
    """The README's verdict table: a row per claim (its label, linked to ``definitions`` when
    given, and its one-line statement), a column per run (testbed), each cell the status, linked
    to the chapter (``link.format(chapter=...)``), and the deciding effect with its 95 % interval."""
    from pactlib.book.claims import definition, statement
    from pactlib.book.findings import deciding, effect_text

    cells: dict[str, dict[str, str]] = {}
    for chapter, run, rec in verdicts:
        d = deciding(rec)
        effect = effect_text(d).split(": ", 1)[-1] if d else ""
        cells.setdefault(rec["claim"], {})[run] = (f"[{rec['status']}]({link.format(chapter=chapter)})"
                                                   + (f" {effect}" if effect else ""))
    used = [r for r in titles if any(r in v for v in cells.values())]
    if not cells:
        return "No verdict records are committed yet: `make reproduce` computes them.\n"
    lines = ["| claim | " + " | ".join(titles[r] for r in used) + " |", "|---|" + "---|" * len(used)]
    for claim in _claim_order(cells):
        label = f"[{claim}]({definitions})" if definitions and definition(claim) else claim
        said = statement(claim)
        lines.append(f"| {label}{': ' + said if said != claim else ''} | "
                     + " | ".join(cells[claim].get(r, "not run") for r in used) + " |")
    return "\n".join(lines) + "\n"


def verdict_label(run: str, claim: str) -> str:
    """The MyST target of a claim's verdict in its chapter (``verdict-main-C9a``), set where the
    chapter shows it (:func:`pactlib.book.plotting.verdict`)."""
    from pactlib.book.claims import base_label

    return "verdict-" + re.sub(r"[^A-Za-z0-9]+", "-", f"{run}-{base_label(claim)}").strip("-").lower()


def replace_block(text: str, block: str, *, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with what lies between the ``begin`` and ``end`` lines (default :data:`BEGIN`,
    :data:`END`) replaced by ``block``.

    Raises:
        ValueError: the markers are missing, repeated or out of order.
    """
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin!r} line followed by one {end!r} line")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block.rstrip()}\n{end}{tail}"


def html_problems(html: Path, pages: Sequence[str]) -> list[str]:
    """What is wrong with a rendered book in ``html``: a page of ``pages`` (paths relative to
    ``html`` without ``.html``) missing, an asset fetched from the network, a local asset missing,
    no page loading the local MathJax."""
    problems = [] if (html / "index.html").is_file() else [f"missing {html / 'index.html'}"]
    problems += [f"missing page {html / p}.html" for p in pages if not (html / f"{p}.html").is_file()]
    mathjax_ok = False
    for page in sorted(html.rglob("*.html")):
        if "_static" in page.relative_to(html).parts:
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for tag in FETCH.finditer(text):
            url, whole = tag.group(1), tag.group(0).lower()
            if whole.startswith("<link") and not any(w in whole for w in ("stylesheet", "preload", "icon")):
                continue  # <link rel="next"/"search"/...>: navigation, nothing is fetched
            if REMOTE.match(url):
                problems.append(f"{page.relative_to(html)} fetches a remote asset: {url}")
            elif not url.startswith(("data:", "#")) and not (page.parent / url.split("?")[0].split("#")[0]).exists():
                problems.append(f"{page.relative_to(html)} refers to a missing file: {url}")
            elif "tex-mml-chtml.js" in url:
                mathjax_ok = True
    if not mathjax_ok:
        problems.append("no page loads the local MathJax (run scripts/setup_book_assets.sh)")
    return problems


#: Chromium's flags for looking at a page the way a reader's browser would, with its own background
#: services (sync, updates, component downloads) off.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def page_requests(netlog: str | Path) -> list[str]:
    """The network requests a page made, from a Chromium net log (``--log-net-log=FILE``).

    Chromium's own requests (updates, time, spelling dictionaries) have no origin and are left
    out; a request a page makes carries the page's origin (``"null"`` for a ``file://`` page).
    A book that works offline has none.

    Raises:
        ValueError: the file is not a Chromium net log (the message names it).
    """
    try:
        events = json.loads(Path(netlog).read_text(encoding="utf-8"))["events"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{netlog}: not a Chromium net log ({exc})") from None
    urls = []
    for event in events:
        params = event.get("params") or {}
        url, origin = params.get("url"), params.get("initiator")
        if url and origin is not None and origin != "not an origin" and not url.startswith(("file:", "data:")):
            urls.append(url)
    return sorted(set(urls))


def look_at(page: str | Path, png: str | Path, browser: str = "chromium", *, width: int = 1280,
            height: int = 1600) -> list[str]:
    """Open ``page`` in headless Chromium, write a screenshot to ``png`` and return the network
    requests the page made (:func:`page_requests`).

    Raises:
        FileNotFoundError: ``page`` or the browser does not exist.
        RuntimeError: Chromium failed or wrote no screenshot (its exit status named).
    """
    import shutil
    import subprocess
    import tempfile

    page, png = Path(page).resolve(), Path(png)
    if not page.is_file():
        raise FileNotFoundError(f"page not found: {page}")
    exe = shutil.which(browser)
    if exe is None:
        raise FileNotFoundError(f"{browser} not found (scripts/setup_sources.sh installs Debian's chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        log = Path(profile) / "net.json"
        proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}/user", f"--log-net-log={log}",
                               f"--window-size={width},{height}", "--virtual-time-budget=4000",
                               f"--screenshot={png.resolve()}", page.as_uri()],
                              capture_output=True, timeout=120)
        if proc.returncode != 0 or not png.is_file() or png.stat().st_size == 0:
            raise RuntimeError(f"chromium could not screenshot {page} (exit {proc.returncode})")
        return page_requests(log)
