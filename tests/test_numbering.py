"""Figure and table numbers of the book, read from the notebooks' source (no execution).

Within a chapter, figures are numbered 1, 2, 3, … and tables 1, 2, 3, … separately, in reading
order, with no gaps; every "Figure C.N" / "Table C.N" the text cites exists. A number may repeat
only in calls that are conditional (the branches of an if/else, or ``a if demo else b``), where
one of them is shown.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
KINDS = {"figure": "Figure", "table": "Table"}


def _values(node: ast.expr, where: str) -> list[int]:
    """The int(s) a ``number=`` argument can take: a literal, or ``a if cond else b`` of literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _values(node.body, where) + _values(node.orelse, where)
    raise AssertionError(f"{where}: number= must be an int literal (or a literal if/else), "
                         f"not {ast.unparse(node)}")


def _calls(path: Path) -> list[dict]:
    """Every ``plotting.table(...)`` / ``plotting.figure(...)`` call of a notebook, in source order."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in KINDS and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "plotting"):
            continue
        where = f"{path.name}:{node.lineno}"
        kw = {k.arg: k.value for k in node.keywords}
        assert "chapter" in kw and "number" in kw, f"{where}: give chapter= and number="
        assert isinstance(kw["chapter"], ast.Constant), f"{where}: chapter= must be a literal"
        conditional, up = isinstance(kw["number"], ast.IfExp), node
        while up in parents:
            up = parents[up]
            conditional = conditional or isinstance(up, (ast.If, ast.IfExp, ast.Try))
        out.append({"kind": KINDS[node.func.attr], "chapter": kw["chapter"].value, "line": node.lineno,
                    "numbers": _values(kw["number"], where), "conditional": conditional, "where": where})
    return sorted(out, key=lambda c: c["line"])


def _declared() -> set[tuple[str, int, int]]:
    return {(c["kind"], c["chapter"], n) for p in NOTEBOOKS for c in _calls(p) for n in c["numbers"]}


def test_notebooks_found():
    assert len(NOTEBOOKS) >= 12
    assert any(_calls(p) for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_numbers_per_kind_run_1_to_n_in_reading_order(path):
    chapter = int(path.name[:2])
    calls = _calls(path)
    for c in calls:
        assert c["chapter"] == chapter, f"{c['where']}: chapter={c['chapter']} in chapter {chapter}'s notebook"
    for kind in KINDS.values():
        mine = [c for c in calls if c["kind"] == kind]
        used = sorted({n for c in mine for n in c["numbers"]})
        assert used == list(range(1, len(used) + 1)), \
            f"{path.name}: {kind.lower()} numbers {used} are not 1..{len(used)}"
        firsts = [min(c["numbers"]) for c in mine]  # reading order: never a smaller number later
        assert firsts == sorted(firsts), f"{path.name}: {kind.lower()}s out of reading order: {firsts}"
        seen: dict[int, dict] = {}
        for c in mine:
            for n in c["numbers"]:
                if n in seen:
                    assert c["conditional"] and seen[n]["conditional"], \
                        f"{c['where']}: {kind} {chapter}.{n} also at {seen[n]['where']}, both shown"
                seen[n] = c


CITE = re.compile(r"\b(figure|fig\.|table)s?\s+(\d+\.\d+(?:\s*(?:,|and|or|to|–|-)\s*\d+\.\d+)*)", re.IGNORECASE)


def _cited(text: str) -> list[tuple[str, int, int]]:
    out = []
    for m in CITE.finditer(text):
        kind = "Table" if m.group(1).lower() == "table" else "Figure"
        for num in re.findall(r"\d+\.\d+", m.group(2)):
            c, n = num.split(".")
            out.append((kind, int(c), int(n)))
    return out


def test_cite_pattern():
    assert _cited("as table 2.9 and Figures 1.1 and 1.2; Fig. 3 of the paper, Tab. 1") == \
        [("Table", 2, 9), ("Figure", 1, 1), ("Figure", 1, 2)]


@pytest.mark.parametrize("path", NOTEBOOKS + sorted((ROOT / "book").glob("*.md")),
                         ids=lambda p: p.name)
def test_cited_numbers_exist(path):
    declared = _declared()
    missing = sorted({f"{k} {c}.{n}" for k, c, n in _cited(path.read_text()) if (k, c, n) not in declared})
    assert not missing, f"{path.relative_to(ROOT)} cites what no notebook draws: {missing}"
