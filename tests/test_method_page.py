"""book/method.md is the specification: every label has an anchor and every citation resolves."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "method.md"
LABELS = ([f"P{i}" for i in range(1, 8)] + [f"M{i}" for i in range(1, 6)] + ["S1", "S2"])
CLAIMS = [f"C{i}" for i in range(1, 13)]
SECTIONS = ["matrix-view", "subspaces", "pact", "scalar", "merges", "protocol", "claims"]
CODE = ["pactlib", "tests", "bench", "scripts", "mk"]


def anchors() -> set[str]:
    return set(re.findall(r"^\(([\w-]+)\)=$", PAGE.read_text(encoding="utf-8"), flags=re.M))


def anchor_of(label: str) -> str:
    if label in SECTIONS:
        return f"method-{label}"
    return ("claim-" if label in CLAIMS else "eq-") + label


def sources():
    for d in CODE:
        yield from (ROOT / d).rglob("*.py")
    yield from (ROOT / "mk").glob("*.mk")
    yield from (ROOT / "book").glob("*.md")
    yield ROOT / "_toc.yml"


def test_every_label_has_an_anchor_in_the_page():
    missing = [lab for lab in LABELS + CLAIMS + SECTIONS if anchor_of(lab) not in anchors()]
    assert missing == []


def test_every_citation_names_a_label_of_the_page():
    bad = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        if re.search(r"method\.md\s*§", text):
            bad.append(f"{rel}: cites a section number")
        for label in re.findall(r"book/method\.md(?:,\s*| \()([\w-]+)", text):
            if label not in LABELS + CLAIMS + SECTIONS:
                bad.append(f"{rel}: unknown label {label!r}")
        for target in re.findall(r"\{ref\}`[^`<]*<((?:eq|claim|method)-[\w-]+)>`", text):
            if target not in anchors():
                bad.append(f"{rel}: {{ref}} to a missing anchor {target!r}")
    assert bad == []


def test_the_page_is_in_the_table_of_contents():
    assert re.search(r"file:\s*book/method\s*$", (ROOT / "_toc.yml").read_text(), flags=re.M)
