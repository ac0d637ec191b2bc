"""The book's generated pieces (pactlib.book.site, scripts/readme_verdicts.py) and the Pages
workflow: the README's verdict table from committed verdict records, the marker block, the
offline HTML check, and the workflow rendering with the same make target users run."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from pactlib.book import site

ROOT = Path(__file__).resolve().parents[1]


def _verdicts(folder: Path, chapter: str, *recs: dict) -> Path:
    path = folder / f"{chapter}.verdicts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_readme_table_one_cell_per_claim_and_testbed(tmp_path):
    files = [("05_main_results", "main", _verdicts(tmp_path / "a", "05_main_results",
                                                   {"claim": "C5", "status": "partly reproduced", "run": "main"},
                                                   {"claim": "C10", "status": "reproduced", "run": "main"})),
             ("05_main_results", "minilm", _verdicts(tmp_path / "b", "05_main_results",
                                                     {"claim": "C5", "status": "reproduced", "run": "minilm"})),
             ("02_testbed", "main", _verdicts(tmp_path / "c", "02_testbed",
                                              {"claim": "precondition", "status": "reproduced", "run": "main"},
                                              {"claim": "precondition", "status": "partly reproduced",
                                               "run": "minilm"})),
             ("07_layer_depth", "main", tmp_path / "absent.jsonl")]
    titles = {"main": "Lite0", "minilm": "MiniLM"}
    table = site.readme_table(site.read_verdicts(files, list(titles)), titles, "notebooks/{chapter}.py")
    assert table.splitlines() == [
        "| claim | Lite0 | MiniLM |", "|---|---|---|",
        "| C5 | [partly reproduced](notebooks/05_main_results.py) | [reproduced](notebooks/05_main_results.py) |",
        "| C10 | [reproduced](notebooks/05_main_results.py) | – |",
        "| precondition | [reproduced](notebooks/02_testbed.py) | [partly reproduced](notebooks/02_testbed.py) |"]
    assert site.readme_table([], titles, "x").startswith("No verdict records are committed yet")


def test_replace_block_keeps_the_rest_and_refuses_bad_markers():
    text = f"intro\n{site.BEGIN}\nold table\n{site.END}\nafter\n"
    assert site.replace_block(text, "| new |\n") == f"intro\n{site.BEGIN}\n| new |\n{site.END}\nafter\n"
    assert site.replace_block(site.replace_block(text, "x"), "x") == site.replace_block(text, "x")  # idempotent
    for bad in ("no markers", f"{site.END}\n{site.BEGIN}", f"{site.BEGIN}\n{site.BEGIN}\n{site.END}"):
        with pytest.raises(ValueError, match="verdicts:begin"):
            site.replace_block(bad, "x")


def _readme_script():
    spec = importlib.util.spec_from_file_location("readme_verdicts", ROOT / "scripts" / "readme_verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_script_reads_the_committed_store_and_marks_stale_chapters(tmp_path):
    mod = _readme_script()
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "default.yaml").write_text(yaml.safe_dump(
        {"common": {}, "05_main_results": {}, "variants": {"main": {"title": "Lite0"},
                                    "minilm": {"title": "MiniLM", "chapters": {"05_main_results": {}}}}}))
    store = tmp_path / "book" / "records" / "default"
    _verdicts(store / "main" / "05_main_results", "05_main_results", {"claim": "C5", "status": "reproduced", "run": "main"})
    _verdicts(store / "minilm" / "05_main_results", "05_main_results",
              {"claim": "C5", "status": "not reproduced", "run": "minilm"})
    _verdicts(store / "smoke-like" / "x", "y", {"claim": "C9", "status": "reproduced"})  # not <chapter>/<chapter>: ignored
    assert mod.table(tmp_path).splitlines()[2] == (
        "| C5 | [reproduced](notebooks/05_main_results.py) | [not reproduced](notebooks/05_main_results.py) |")
    states = tmp_path / "book" / "_executed" / "default" / "states.json"
    states.parent.mkdir(parents=True)
    states.write_text(json.dumps({"main/05_main_results": "current", "minilm/05_main_results": "stale"}))
    assert "[not reproduced (stale)](notebooks/05_main_results.py)" in mod.table(tmp_path)


def test_readme_has_one_generated_block_that_is_up_to_date():
    text = (ROOT / "README.md").read_text()
    assert text.count(site.BEGIN) == 1 and text.count(site.END) == 1
    assert _readme_script().main(["--check"]) == 0, "README.md's verdict table is stale: run `make readme`"


def test_html_problems_names_remote_and_missing_assets(tmp_path):
    (tmp_path / "_static" / "es5").mkdir(parents=True)
    (tmp_path / "_static" / "es5" / "tex-mml-chtml.js").write_text("")
    (tmp_path / "index.html").write_text('<script src="_static/es5/tex-mml-chtml.js"></script>'
                                         '<link rel="next" href="https://example.org/next">')
    (tmp_path / "a.html").write_text('<img src="https://cdn.example.org/x.png"><img src="fig.png">')
    assert site.html_problems(tmp_path, ["a", "b"]) == [
        f"missing page {tmp_path / 'b'}.html", "a.html fetches a remote asset: https://cdn.example.org/x.png",
        "a.html refers to a missing file: fig.png"]


def test_toc_moves_chapters_adds_variant_sections_and_the_verdicts_page():
    base = {"root": "book/intro", "parts": [
        {"caption": "Main", "chapters": [{"file": "book/_executed/default/05_x"}, {"file": "book/_executed/default/06_y"}]},
        {"caption": "About this book", "chapters": [{"file": "book/running"}]}]}
    toc = site.toc(base, "book/_executed/default/", "book/_executed/smoke/", {"v": ["06_y"]})
    assert toc["parts"][0]["chapters"] == [{"file": "book/_executed/smoke/05_x"},
                                           {"file": "book/_executed/smoke/06_y",
                                            "sections": [{"file": "book/_executed/smoke/v/06_y"}]}]
    assert toc["parts"][1] == {"caption": "Verdicts", "chapters": [{"file": "book/_executed/smoke/verdicts"}]}
    assert base["parts"][0]["chapters"][0]["file"] == "book/_executed/default/05_x"  # not modified


def test_pages_workflow_renders_with_make_book_and_no_zoo_or_cache():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    steps = flow["jobs"]["build"]["steps"]
    runs = [s["run"].strip() for s in steps if "run" in s]
    assert runs == ["make book"]
    uses = [s.get("uses", "") for s in steps]
    assert not any("cache" in u for u in uses)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert flow["jobs"]["build"]["timeout-minutes"] <= 30
    assert re.search(r"^book: ", (ROOT / "mk" / "book.mk").read_text(), re.M)  # the target exists
    assert flow["jobs"]["deploy"]["steps"][0]["uses"].startswith("actions/deploy-pages")


def test_publish_and_ghp_import_are_pinned():
    mk = (ROOT / "mk" / "book.mk").read_text()
    assert "$(GHP_IMPORT) -n -p -f _build/html" in mk
    for req in ("requirements.txt", "requirements.lock"):
        assert re.search(r"^ghp-import==\d", (ROOT / req).read_text(), re.M), req


def test_look_at_screenshots_a_page_and_names_each_request_the_page_makes(tmp_path):
    """A page that loads a remote image and script is caught by the net log (Chromium's own
    background requests are not the page's); a local page makes none."""
    from pactlib.book import site

    (tmp_path / "pic.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>')
    local = tmp_path / "local.html"
    local.write_text('<html><body><img src="pic.svg"><p>offline</p></body></html>')
    remote = tmp_path / "remote.html"
    remote.write_text('<html><body><img src="https://example.com/x.png">'
                      '<script src="http://cdn.example.org/a.js"></script></body></html>')
    assert site.look_at(local, tmp_path / "local.png", width=320, height=240) == []
    assert (tmp_path / "local.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert site.look_at(remote, tmp_path / "remote.png", width=320, height=240) == [
        "http://cdn.example.org/a.js", "https://example.com/x.png"]
    with pytest.raises(FileNotFoundError, match="nowhere.html"):
        site.look_at(tmp_path / "nowhere.html", tmp_path / "x.png")


def test_merge_profile_counts_computed_and_reused_merges_and_splits_their_minutes():
    recs = [{"seconds": 120.0, "merge_seconds": 30.0}, {"seconds": 60.0, "merge_seconds": 60.0},
            {"seconds": 600.0, "merge_seconds": 300.0, "memo_hit": True},  # another chapter paid for it
            {"method": "fine-tuned", "metrics": {"acc": 0.9}},  # a reference row: no merge
            {"seconds": 120.0, "merge_seconds": 30.0, "params": {"rank": 8}}]  # the first, listed again
    assert site.merge_profile(recs) == {"computed": 2, "reused": 1, "merge_minutes": 1.5, "eval_minutes": 1.5}
    assert site.merge_profile([]) == {"computed": 0, "reused": 0, "merge_minutes": 0.0, "eval_minutes": 0.0}


# --- what a reader sees: the provenance box and tables that fit a narrow screen -----------------

def _myst(text: str):
    """``text`` parsed as the book parses it (MyST with colon fences): a docutils tree."""
    from docutils.core import publish_doctree
    from myst_parser.parsers.docutils_ import Parser

    return publish_doctree(text, parser=Parser(), settings_overrides={
        "myst_enable_extensions": ["colon_fence"], "report_level": 4, "halt_level": 5})


def test_provenance_box_is_one_folded_admonition_whose_title_says_command_date_and_minutes():
    from docutils import nodes

    prov = {"made": "2026-12-03T10:00:00Z", "cpu_minutes": 12.34, "wall_minutes": 7.0, "threads": 1,
            "git": "0123456789abcdef0123456789abcdef01234567-dirty", "engine": {"fingerprint": "ab" * 32},
            "machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.14.1"}}
    box = site.provenance_box(prov, "`make reproduce NB=08_efficiency`", "book/records/default/main/08_efficiency/")
    doc = _myst(f"# Chapter\n\n{box}\n\nThe chapter's first paragraph.\n")
    boxes = list(doc.findall(nodes.admonition))
    assert len(boxes) == 1 and boxes[0]["classes"] == ["dropdown", site.PROVENANCE_CLASS]
    title = boxes[0][0]
    assert isinstance(title, nodes.title)
    assert title.astext() == "Computed by make reproduce NB=08_efficiency on 2026-12-03, 12.3 CPU min"
    body = boxes[0][1].astext()
    assert "Engine abababababab, git 0123456-dirty; 7.0 wall min on AMD EPYC, 2 cores, torch 2.14.1" in body
    assert "book/records/default/main/08_efficiency/" in body
    # the box closes: the chapter's prose stays outside it
    assert [p.astext() for p in doc.findall(nodes.paragraph) if p.parent is doc] == ["The chapter's first paragraph."]
    bare = site.provenance_box({}, "`x`", "f/")
    assert "on ?, ? CPU min" in bare and "Engine `?`, git `?`" in bare


def _shown(node) -> str:
    """The text of a docutils node as a browser shows it (raw HTML such as ``<wbr>`` left out)."""
    from docutils import nodes

    return "".join(t.astext() for t in node.findall(nodes.Text) if not isinstance(t.parent, nodes.raw))


def test_verdicts_tables_wrap_and_say_why_in_short():
    from docutils import nodes

    titles = {"main": "EfficientNet-Lite0, image tasks", "minilm": "MiniLM-L6, text tasks"}
    engine = ("engine changed: pactlib/__init__.py, pactlib/checks.py, pactlib/testbeds/base.py, "
              "pactlib/merges/iso.py, pactlib/linalg.py")
    states = {("01_method", "main"): {"state": "stale", "reasons": [engine, "parameters differ: seed 0 -> 1"],
                                      "provenance": {"made": "2026-12-03T10:00:00Z", "cpu_minutes": 1.0,
                                                     "wall_minutes": 2.0}},
              ("04_subspace_perspective", "minilm"): {"state": "missing", "reasons": [
                  "missing: no records in book/records/default/minilm/04_subspace_perspective"], "provenance": None}}
    page = site.verdicts_page("default", titles, [("01_method", "main", {"claim": "C1", "status": "reproduced"})],
                              states)
    assert site.short_reason(engine) == "engine changed: pactlib, checks, testbeds/base, merges/iso, … (1 more)"
    assert site.short_reason("missing: no records in x") == "no records yet"
    assert site.short_reason("parameters differ: seed 0 -> 1") == "parameters differ: seed 0 -> 1"
    # every table of the page carries the wrapping class, and the stylesheet that wraps it is registered
    doc = _myst(page)
    tables = list(doc.findall(nodes.table))
    assert len(tables) == 3 and all(site.TABLE_CLASS in t["classes"] for t in tables)
    rows = [[_shown(c) for c in row.findall(nodes.entry)] for row in tables[1].findall(nodes.row)]
    assert rows[1] == ["01_method", "EfficientNet-Lite0", "stale", "2026-12-03",
                       "engine changed: pactlib, checks, testbeds/base, merges/iso, … (1 more); "
                       "parameters differ: seed 0 -> 1"]  # __init__ is no emphasis
    assert rows[2] == ["04_subspace_perspective", "MiniLM-L6", "missing", "–", "no records yet"]
    assert "| 04_<wbr>subspace_<wbr>perspective |" in page  # a line may break after an underscore
    assert "engine changed: pactlib, checks, testbeds/<wbr>base" in page
    prof = [[_shown(c) for c in row.findall(nodes.entry)] for row in tables[2].findall(nodes.row)]
    assert prof[0][:3] == ["Chapter, testbed", "Wall min", "CPU min"] and len(prof[0]) == 7
    assert prof[1][:3] == ["01_methodEfficientNet-Lite0", "2.0", "1.0"]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    assert "book/_static" in config["html_static_path"] and config["html_css_files"] == ["pact.css"]
    css = (ROOT / "book" / "_static" / "pact.css").read_text()
    assert f"table.{site.TABLE_CLASS} td" in css and "white-space: normal" in css
    assert f"div.admonition.{site.PROVENANCE_CLASS}" in css
