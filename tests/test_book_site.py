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
                                                   {"claim": "C10", "status": "reproduced", "run": "main"},
                                                   {"claim": "C5–C7 at paper scale", "status": "not yet tested",
                                                    "run": "main"},
                                                   {"claim": "C9a (early layers)", "status": "reproduced",
                                                    "run": "main"})),
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
        "| C5: PACT improves Task Arithmetic, TSV-M and Iso-C in absolute and normalized test accuracy. | "
        "[partly reproduced](notebooks/05_main_results.py) | [reproduced](notebooks/05_main_results.py) |",
        "| C9a (early layers): Filtering the early layers only gives most of PACT's gain. | "
        "[reproduced](notebooks/05_main_results.py) | not run |",
        "| C10: PACT with randomized SVDs matches exact-SVD accuracy in a fraction of the time. | "
        "[reproduced](notebooks/05_main_results.py) | not run |",
        "| C5–C7 at paper scale: PACT's main results (C5–C7) on the paper's CLIP ViTs. | "
        "[not yet tested](notebooks/05_main_results.py) | not run |",
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
        "| [C5](book/method.md#the-papers-claims-as-checks-claims): PACT improves Task Arithmetic, TSV-M and Iso-C in "
        "absolute and normalized test accuracy. | [reproduced](notebooks/05_main_results.py) | "
        "[not reproduced](notebooks/05_main_results.py) |")
    states = {"main/05_main_results": "current", "minilm/05_main_results": "stale"}
    assert "[not reproduced (stale)](notebooks/05_main_results.py)" in mod.table(tmp_path, states=states)


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


# --- the evaluation floor: examples counted from the records, minutes from the measured speed ----

#: Chapter 2's task tables as records (index "task", then the columns), sizes as in the book.
SIZE_TABLES = [
    {"method": "table", "table": "tasks", "index": ["task"], "columns": ["suite", "classes", "val", "test"],
     "rows": [["mnist", "8", 10, 500, 1000], ["lfw_faces", "14", 5, 16, 40]], "params": {}, "seed": None,
     "metrics": {}},
    {"method": "table", "table": "text-tasks", "index": ["task"], "columns": ["suite", "val", "test"],
     "rows": [["spam", "8", 300, 500]], "params": {}, "seed": None, "metrics": {}},
    {"method": "table", "table": "recipe", "index": ["what"], "columns": ["val", "test"], "rows": [["x", 1, 2]]}]


def _alpha_record(testbed, tasks, n_alpha, val_limit, **extra):
    """A select_alpha record as the records hold it: one curve point per α, per-task accuracies."""
    acc = {t: 0.5 for t in tasks}
    return {"method": "task_arithmetic", "testbed": testbed, "seed": 0, "val_limit": val_limit,
            "curve": [{"alpha": 0.1 * (i + 1), "mean_acc": 0.5, "mean_normalized": 0.6} for i in range(n_alpha)],
            "per_task": {"val": {"acc": acc, "normalized": acc}, "test": {"acc": acc, "normalized": acc}},
            "seconds": 10.0 + n_alpha, "merge_seconds": 1.0, **extra}


def test_split_sizes_reads_chapter_2s_task_tables_only():
    assert site.split_sizes(SIZE_TABLES) == {"mnist": (500, 1000), "lfw_faces": (16, 40), "spam": (300, 500)}
    assert site.split_sizes([]) == {}


def test_evaluation_work_counts_each_alpha_on_validation_and_one_test_per_computed_merge():
    sizes = site.split_sizes(SIZE_TABLES)
    lite = _alpha_record("lite0-8", ["mnist", "lfw_faces"], 5, 100)
    recs = [lite, dict(lite),  # the same merge listed twice counts once
            _alpha_record("lite0-8", ["mnist"], 9, 100, memo_hit=True),  # paid by another chapter
            {"method": "zero-shot", "testbed": "lite0-8", "metrics": {"acc": 0.4}},  # a reference row
            _alpha_record("minilm-8:2", ["spam", "new_task"], 3, 64)]  # new_task: no size, its caps count
    work = site.evaluation_work(recs, test_limit=300, sizes=sizes)
    # lite0: 5 α × (min(100, 500) + min(100, 16)) on validation, min(300, 1000) + min(300, 40) on test
    assert work == {"lite0": {"merges": 1, "evaluations": 6, "val": 5 * 116, "test": 340},
                    "minilm": {"merges": 1, "evaluations": 4, "val": 3 * 128, "test": 600}}
    # no test cap: the whole split
    assert site.evaluation_work([lite], test_limit=None, sizes=sizes)["lite0"]["test"] == 1040
    assert site.evaluation_work([], test_limit=300) == {}  # a run with no records yet
    with pytest.raises(ValueError, match="new_task"):
        site.evaluation_work(recs, test_limit=None, sizes=sizes)


def _speed_rows():
    common = {"params": {}, "seed": None, "load_avg": 3.0}
    return [{**common, "method": "eval_throughput", "run": "2026-01-01T00:00:00Z", "params": {"testbed": "lite0"},
             "metrics": {"examples_per_cpu_s": 1.0, "flops_per_example": 1.0}},
            {**common, "method": "eval_throughput", "run": "2026-02-01T00:00:00Z", "params": {"testbed": "lite0"},
             "metrics": {"examples_per_cpu_s": 460.0, "flops_per_example": 1e6}},
            {**common, "method": "gemm", "run": "2026-02-01T00:00:00Z", "metrics": {"flops_per_cpu_s": 1e9}},
            {**common, "method": "gemm", "run": "2026-02-01T00:00:00Z", "metrics": {"flops_per_cpu_s": 5e8}},
            {**common, "method": "gemm", "run": "2026-01-01T00:00:00Z", "metrics": {"flops_per_cpu_s": 9e9}},
            {**common, "method": "eval_option", "run": "2026-03-01T00:00:00Z", "metrics": {}}]


def test_eval_speed_takes_the_last_runs_rates_and_its_best_gemm():
    speed = site.eval_speed(_speed_rows())
    assert speed == {"lite0": {"examples_per_s": 460.0, "flops_per_example": 1e6, "load_avg": 3.0},
                     "gemm": {"flops_per_s": 1e9}}
    assert site.eval_speed([]) == {}


def test_evaluation_floor_is_examples_over_rate_and_flops_over_gemm_rate():
    speed = site.eval_speed(_speed_rows())
    work = {"lite0": {"merges": 1, "evaluations": 6, "val": 580, "test": 340}}
    floor = site.evaluation_floor(work, speed)
    assert floor["examples"] == 920
    assert floor["minutes"] == pytest.approx(920 / 460 / 60)  # 2 s
    assert floor["compute_minutes"] == pytest.approx(920 * 1e6 / 1e9 / 60)  # 0.92 s
    # a family without a measured rate: no floor
    both = {**work, "minilm": {"merges": 1, "evaluations": 4, "val": 384, "test": 600}}
    assert site.evaluation_floor(both, speed) == {"examples": 1904, "minutes": None, "compute_minutes": None}


def test_floor_lines_tabulate_the_floor_beside_the_measured_minutes_and_the_whole_book_at_the_floor():
    speed = site.eval_speed(_speed_rows())
    titles = {"main": "EfficientNet-Lite0, image tasks"}
    work = {("05_main_results", "main"): {"lite0": {"merges": 50, "evaluations": 300, "val": 220_800,
                                                    "test": 55_200}},
            ("02_testbed", "main"): None}  # nothing countable: no row
    lines = site.floor_lines(titles, work, speed, {("05_main_results", "main"): 30.0}, zoo_minutes=200.0,
                             other_minutes=50.0)
    text = "\n".join(lines)
    # 276,000 examples at 460/s = 10 core-min; at 1e6 FLOP each and 1e9 FLOP/s: 4.6 core-min
    assert "| 05_<wbr>main_<wbr>results<br>*EfficientNet-Lite0* | 300 | 276,000 | 30.0 | 10.0 | 4.6 |" in text
    assert "| **all chapters** | **300** | **276,000** | **30.0** | **10.0** | **4.6** |" in text
    assert "02_<wbr>testbed" not in text
    assert "80% of them on validation" in text
    # measured minutes are one core's (one thread per chapter): core-minutes against core-minutes
    assert "3.00× its floor (5.0 minutes on the machine's 2 cores)" in text and "below their floor" not in text
    fast = "\n".join(site.floor_lines(titles, work, speed, {("05_main_results", "main"): 5.0}))
    assert "0.50× its floor" in fast and "1 row(s) measure below their floor" in fast
    assert "runs at 46% of the matrix-multiply rate: a perfect one would need 4.6 core-minutes, 2.3 minutes " \
           "on the 2 cores" in text
    # (zoos 200 + other 50 + floor 10) / 2 = 130 min
    assert "all spread over 2 cores, the whole book with evaluation at its floor would take about 130 minutes; " \
           "the measured whole reproductions" in text
    assert "goal" not in text and "today" not in text
    assert site.floor_lines(titles, {}, speed) == []
    assert site.floor_lines(titles, {("05_main_results", "main"): None}, speed) == []


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
    assert "Engine abababababab, git 0123456-dirty (uncommitted changes" in body
    assert "names the code that ran); 7.0 wall min on AMD EPYC, 2 cores, torch 2.14.1" in body
    clean = site.provenance_box({**prov, "git": "0123456789abcdef"}, "`x`", "f/")
    assert "git `0123456`; 7.0 wall min" in clean and "uncommitted" not in clean
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


def test_recompute_runs_newest_first_with_their_jobs_and_zoo_builds():
    runs = [{"started": "2026-12-01T10:00:00Z", "wall_minutes": 50.0, "jobs": 2, "threads": [1], "complete": True,
             "ran": {"05_main_results": {"wall_minutes": 30.0, "cpu_minutes": 29.5}}},
            {"started": "2026-12-03T20:52:00Z", "wall_minutes": 130.25, "jobs": 2, "threads": [1], "complete": False,
             "ran": {"zoo-lite0": {"wall_minutes": 36.04, "cpu_minutes": 35.0},
                     "03_scalar_perspective": {"wall_minutes": 20.0, "cpu_minutes": 19.0}}}]
    lines = site.runs_lines(runs)
    rows = [line for line in lines if line.startswith("| 2026")]
    assert rows == ["| 2026-12-03 20:52:00 | 130.2 | 2 × 1 thread(s) | 1 | lite0 36.0 | 54.0 | no |",
                    "| 2026-12-01 10:00:00 | 50.0 | 2 × 1 thread(s) | 1 | – | 29.5 | yes |"]
    assert site.runs_lines([]) == [] and not any(line.startswith("*2026") for line in lines)
    noted = site.runs_lines([{**runs[0], "note": "scheduled by hand"}])
    assert noted[-1] == "*2026-12-01 10:00:00*: scheduled by hand."


def test_recompute_agreement_counts_and_names_changed_verdicts():
    rows = [{"chapter": "main/05_main_results", "rev": "4722968", "records": 63, "numbers": 5525, "identical": 5400,
             "max_abs": 0.0067, "max_rel": 0.0089, "verdicts": ["C6: not reproduced -> partly reproduced"]},
            {"chapter": "main/01_method", "rev": "4722968", "records": 125, "numbers": 659, "identical": 659,
             "max_abs": 0.0, "max_rel": 0.0, "verdicts": []}]
    lines = site.agreement_lines(rows)
    assert "| main/05_main_results | 63 | 5,400 of 5,525 (97.7%) | 0.0067 / 0.0089 | C6: not reproduced → partly reproduced |" in lines
    assert "| main/01_method | 125 | 659 of 659 (100.0%) | – | none |" in lines
    assert any("`4722968`" in line for line in lines) and site.agreement_lines([]) == []
    assert "- **Identical**: main chapter 1." in lines
    assert any(line.startswith("- **Differ**: main chapter 5; the compute runs") for line in lines)  # no run logged
    # graded again since (a rule changed): the page says what the grade is now, in the list and the table
    regraded = site.agreement_lines(rows, now={("main/05_main_results", "C6"): "not reproduced"})
    assert "| main/05_main_results | 63 | 5,400 of 5,525 (97.7%) | 0.0067 / 0.0089 | C6: not reproduced → partly " \
           "reproduced (graded now: not reproduced) |" in regraded
    assert any("partly reproduced (graded now: not reproduced)." in line for line in regraded if "Verdicts changed" in line)
    assert not any("graded now" in line for line in site.agreement_lines(
        rows, now={("main/05_main_results", "C6"): "partly reproduced"}))
    # float-level differences are their own item, whatever the zoo
    tiny = site.agreement_lines([{**rows[0], "max_abs": 1e-6, "max_rel": 2e-5, "verdicts": []}, rows[1]])
    assert "- **Float-level**: main chapter 5: every number within 2e-05 of its old value (relative), the " \
           "rounding of a different order of operations." in tiny


def test_recompute_agreement_says_which_chapters_moved_with_a_rebuilt_zoo():
    def row(chapter, same, verdicts=()):
        return {"chapter": chapter, "rev": "4722968", "records": 10, "numbers": 100, "identical": same,
                "max_abs": 0.0 if same == 100 else 0.5, "max_rel": 0.0 if same == 100 else 0.1,
                "verdicts": list(verdicts)}

    rows = [row("main/01_method", 100), row("main/05_main_results", 40, ["C11: partly reproduced -> reproduced"]),
            row("main/09_lora", 60), row("minilm/05_main_results", 99), row("minilm/09_lora", 100)]
    zoo = {"lite0": {"kinds": {"full": {"models": 4, "minutes": 30.0}, "head": {"models": 2, "minutes": 6.0}}},
           "minilm": {"kinds": {"full": {"models": 4, "minutes": 20.0}}}}
    runs = [{"git": "4722968..4ba20b3", "ran": {"zoo-lite0": {"wall_minutes": 35.3}, "zoo-minilm": {"wall_minutes": 0.2}}},
            {"git": "0a1c7da-dirty", "ran": {"zoo-minilm": {"wall_minutes": 25.0}}}]  # a later run: not this recompute
    assert site.zoo_rebuilds(runs, rows, zoo) == {"lite0": 35.3}
    assert site.zoo_rebuilds(runs[1:], rows, zoo) is None
    prov = {"zoos": {"lite0": "f1"}}
    states = {("01_method", "main"): {"provenance": {"zoos": {}}}, ("05_main_results", "main"): {"provenance": prov},
              ("09_lora", "main"): {"provenance": {}},  # made before provenance named its zoos: its run's
              ("05_main_results", "minilm"): {"provenance": {"zoos": {"minilm": "f2"}}}}
    families = site.run_families(states)
    assert families == {"main/01_method": set(), "main/05_main_results": {"lite0"}, "main/09_lora": {"lite0"},
                        "minilm/05_main_results": {"minilm"}}
    titles = {"main": "EfficientNet-Lite0, image tasks", "minilm": "MiniLM-L6, text tasks"}
    lines = site.agreement_lines(rows, titles=titles, families=families, rebuilt=site.zoo_rebuilds(runs, rows, zoo))
    assert "- **Identical**: EfficientNet-Lite0 chapter 1; MiniLM-L6 chapter 9." in lines
    moved = next(line for line in lines if line.startswith("- **Moved with a rebuilt zoo**"))
    assert "the Lite0 zoo (35.3 wall min) was trained again" in moved
    assert "EfficientNet-Lite0 chapters 5 and 9 (40.0% to 60.0% of their numbers identical)" in moved
    assert any(line.startswith("- **Float rounding only**: MiniLM-L6 chapter 5 read a zoo that was not rebuilt")
               for line in lines)
    assert "- **Verdicts changed**: C11 in EfficientNet-Lite0 chapter 5: partly reproduced → reproduced " \
           "(rebuilt zoo)." in lines
    rows[-1] = row("minilm/09_lora", 100, ["C11: partly reproduced -> not reproduced"])  # same numbers, new rule
    lines = site.agreement_lines(rows, titles=titles, families=families, rebuilt=site.zoo_rebuilds(runs, rows, zoo))
    assert "C11 in MiniLM-L6 chapter 9: partly reproduced → not reproduced (the same numbers: the rule that " \
           "grades them changed)." in next(line for line in lines if line.startswith("- **Verdicts changed**"))


def test_chapter_numbers_read_as_a_list():
    assert site._numbers(["04_a", "06_b", "07_c"]) == "4, 6 and 7"
    assert site._numbers(["02_a", "03_b", "04_c", "09_z"]) == "2–4 and 9"
    assert site._numbers(["06_b", "07_c"]) == "6 and 7" and site._numbers(["05_x"]) == "5"
