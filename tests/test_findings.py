"""pactlib.book.findings: the bottom line, the findings page and verdict cells from verdict records;
the README and the front page carry the same bottom line."""
import importlib.util
from pathlib import Path

import pytest

from pactlib.book import findings, site
from pactlib.book.intervals import Interval
from pactlib.book.verdicts import condition, graded

ROOT = Path(__file__).resolve().parents[1]


def _v(claim, *ivs, threshold=0.0):
    conds = [condition(f"{claim} case {i}", Interval(*iv, se=(iv[2] - iv[1]) / 3.92, se_examples=(iv[2] - iv[1]) / 3.92,
                                                     n_examples=300), threshold=threshold) for i, iv in enumerate(ivs)]
    return {"claim": claim, **graded(conds, claim)}


VERDICTS = [("05_main_results", "main", _v("C5", (1.0, 0.2, 1.8), (0.3, -0.4, 1.0))),
            ("05_main_results", "minilm", _v("C5", (-1.0, -1.8, -0.2))),
            ("04_subspace_perspective", "main", _v("C4", (5.0, 3.0, 7.0))),
            ("05_main_results", "main", _v("C7", (0.1, -0.9, 1.1)))]
TITLES = {"main": "EfficientNet-Lite0, image tasks", "minilm": "MiniLM-L6, text tasks"}


def test_the_deciding_condition_is_the_first_failure_else_the_weakest():
    assert findings.deciding(VERDICTS[0][2])["name"] == "C5 case 1"  # clears 0 by the least
    assert findings.deciding(VERDICTS[1][2])["grade"] == "fails"
    assert findings.deciding({"status": "reproduced"}) is None
    assert findings.cell(VERDICTS[0][2]) == "**partly reproduced**; 1 of 2 conditions hold; C5 case 1: +0.30 [−0.40, +1.00] points"
    assert findings.cell(VERDICTS[2][2], state="stale").startswith("**reproduced (stale)**")


def test_fields_count_statuses_per_run_and_fill_text():
    f = findings.fields(VERDICTS, TITLES)
    assert f["counts"]["main"]["partly_reproduced"] == 1 and f["counts"]["main"]["reproduced"] == 1
    assert f["counts"]["main"]["inconclusive"] == 1 and f["counts"]["minilm"]["contradicted"] == 1
    assert f["v"]["C5"]["minilm"]["effect"] == "C5 case 0: −1.00 [−1.80, −0.20] points"
    text = {"bottom_line": "C5 is {v[C5][main][status]} on images, {v[C5][minilm][status]} on texts; "
                           "C6 is {v[C6][main][status]}.", "claims": {}}
    assert findings.bottom_line(text, f) == "C5 is partly reproduced on images, contradicted on texts; C6 is (not run)."


def test_findings_page_has_the_bottom_line_each_claim_in_words_and_its_interpretation():
    text = {"bottom_line": "C5: {v[C5][main][status]}.",
            "claims": {"C5": {"interpretation": {"partly reproduced": "Some gains are real.",
                                                 "contradicted": "PACT hurts somewhere."},
                              "reasons": ["Few tasks leave little interference."]}},
            "deviations": ["Test sizes: {params[05_main_results][test_limit]} per task."]}
    page = findings.findings_page(text, VERDICTS, TITLES, params={"05_main_results": {"test_limit": 300}})
    assert "# What this book finds" in page and "C5: partly reproduced." in page
    assert "## C5: PACT improves Task Arithmetic, TSV-M and Iso-C" in page
    assert "- **MiniLM-L6, text tasks** ({doc}`chapter 5 <minilm/05_main_results>`): **contradicted**" in page
    assert "Some gains are real." in page and "PACT hurts somewhere." in page
    assert "- Few tasks leave little interference." in page and "Test sizes: 300 per task." in page
    assert page.index("## C4") < page.index("## C5") < page.index("## C7")
    assert "{ref}`C5 <claim-C5>`" in page


def test_the_committed_text_fills_from_records_without_typed_numbers():
    import re
    raw = (ROOT / "book" / "findings.yaml").read_text(encoding="utf-8")
    body = "\n".join(line for line in raw.splitlines() if not line.lstrip().startswith("#"))
    body = re.sub(r"\{[^}]*\}", "", body)
    allowed = {"8", "14", "20", "0.05", "0.1", "95", "12"}  # suite sizes, the paper's α steps, the CI level
    numbers = set(re.findall(r"(?<![\w/.])\d+(?:\.\d+)?(?![\w/.])", body)) - allowed  # not C5, B/32, L6
    assert not numbers, f"numbers typed in book/findings.yaml: {sorted(numbers)}"
    text = findings.load_text(ROOT / "book" / "findings.yaml")
    f = findings.fields(VERDICTS, TITLES, params={"05_main_results": {}, "minilm/05_main_results": {}})
    page = findings.findings_page(text, VERDICTS, TITLES, params=f["params"])
    assert "{" not in page.replace("{ref}", "").replace("{doc}", "").replace("{admonition}", "")


def test_readme_and_front_page_carry_the_same_bottom_line_as_the_committed_records():
    spec = importlib.util.spec_from_file_location("readme_verdicts", ROOT / "scripts" / "readme_verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    line = mod.bottom_line(ROOT)
    for path in (ROOT / "README.md", ROOT / "book" / "intro.md"):
        text = path.read_text(encoding="utf-8")
        begin, end = mod.BOTTOM
        block = text.split(begin, 1)[1].split(end, 1)[0].strip()
        assert block == line, f"{path.name}: the bottom line is not the records' (run make readme)"


def test_toc_puts_the_findings_page_after_chapter_11():
    base = {"parts": [{"caption": "Analysis", "chapters": [{"file": "book/_executed/default/10_theory"},
                                                           {"file": "book/_executed/default/11_sensitivity"}]},
                      {"caption": "At paper scale", "chapters": [{"file": "book/_executed/default/12_paper_scale"}]},
                      {"caption": "About this book", "chapters": [{"file": "book/running"}]}]}
    toc = site.toc(base, "book/_executed/default/", "book/_executed/x/", {})
    files = [c["file"] for p in toc["parts"] for c in p["chapters"]]
    assert files == ["book/_executed/x/10_theory", "book/_executed/x/11_sensitivity", "book/_executed/x/findings",
                     "book/_executed/x/12_paper_scale", "book/_executed/x/verdicts", "book/running"]


def test_readme_table_gives_each_claim_in_words_and_the_deciding_effect():
    table = site.readme_table(VERDICTS, TITLES, "notebooks/{chapter}.py", definitions="book/method.md#claims")
    row = next(line for line in table.splitlines() if line.startswith("| [C5]"))
    assert row.startswith("| [C5](book/method.md#claims): PACT improves Task Arithmetic")
    assert "[partly reproduced](notebooks/05_main_results.py) +0.30 [−0.40, +1.00] points" in row
    assert "[contradicted](notebooks/05_main_results.py) −1.00 [−1.80, −0.20] points" in row
