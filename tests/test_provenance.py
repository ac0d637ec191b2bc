"""pactlib.book.provenance: module hashes, the engine fingerprint, the notebook hash and the
reasons a chapter's records are stale, on real files in a temporary repository."""
from __future__ import annotations

import json
import sys

import pytest

from pactlib.book import provenance as pv

ISO = '"""Iso-C."""\n\ndef iso(x):\n    """Flatten the spectrum."""\n    return x * 2  # twice\n'


@pytest.fixture
def repo(tmp_path):
    """A repository with pactlib/merges/iso.py, pactlib/book/report.py and a lock file."""
    (tmp_path / "pactlib" / "merges").mkdir(parents=True)
    (tmp_path / "pactlib" / "book").mkdir()
    for init in ("pactlib", "pactlib/merges", "pactlib/book"):
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "pactlib" / "merges" / "iso.py").write_text(ISO)
    (tmp_path / "pactlib" / "book" / "report.py").write_text("def table():\n    return 1\n")
    (tmp_path / "requirements.lock").write_text("torch==2.14.1\n")
    return tmp_path


NAMES = ["pactlib", "pactlib.merges", "pactlib.merges.iso", "pactlib.book", "pactlib.book.report", "numpy", "os"]


def _made(repo, params, notebook="nb1"):
    folder = repo / "book" / "records" / "default" / "main" / "05_main_results"
    pv.write(folder, {"chapter": "05_main_results", "params": params, "notebook": notebook,
                      "engine": pv.engine(NAMES, repo), "testbeds": {"lite0-8": "t1"}})
    return folder


def test_engine_lists_pactlib_modules_but_not_presentation_ones(repo):
    eng = pv.engine(NAMES, repo)
    assert list(eng["modules"]) == ["pactlib/__init__.py", "pactlib/book/__init__.py", "pactlib/merges/__init__.py",
                                    "pactlib/merges/iso.py"]
    assert eng["modules"]["pactlib/merges/iso.py"] == pv.ast_hash(repo / "pactlib" / "merges" / "iso.py")
    assert eng["fingerprint"] == pv.fingerprint(eng["modules"], eng["lock"])
    assert len(eng["fingerprint"]) == 64 and eng["lock"] != pv.engine(NAMES, repo / "pactlib")["lock"]
    (repo / "requirements.lock").write_text("torch==2.15.0\n")
    assert pv.engine(NAMES, repo)["fingerprint"] != eng["fingerprint"]  # the lock is part of it


def test_a_docstring_or_comment_edit_stales_nothing(repo):
    folder = _made(repo, {"seeds": [0, 1, 2]})
    iso = repo / "pactlib" / "merges" / "iso.py"
    iso.write_text(ISO.replace("Flatten the spectrum.", "Set every singular value to their mean.")
                   .replace("# twice", "# doubled"))
    assert pv.staleness(folder, {"seeds": [0, 1, 2]}, "nb1", root=repo, testbeds={"lite0-8": "t1"}) == []
    (repo / "pactlib" / "book" / "report.py").write_text("def table():\n    return 2\n")  # presentation
    assert pv.staleness(folder, {"seeds": [0, 1, 2]}, "nb1", root=repo) == []


def test_an_ast_edit_names_the_module(repo):
    folder = _made(repo, {"seeds": [0]})
    (repo / "pactlib" / "merges" / "iso.py").write_text(ISO.replace("x * 2", "x * 3"))
    assert pv.staleness(folder, {"seeds": [0]}, "nb1", root=repo) == ["engine changed: pactlib/merges/iso.py"]
    (repo / "pactlib" / "merges" / "iso.py").unlink()
    assert pv.staleness(folder, {"seeds": [0]}, "nb1", root=repo) == [
        "engine changed: pactlib/merges/iso.py (removed)"]


def test_a_packages_c_source_is_engine_code(repo):
    """A package that compiles a C file at run time (pactlib/native): the C file is hashed byte
    for byte with the package, and any edit to it stales the records."""
    (repo / "pactlib" / "native").mkdir()
    (repo / "pactlib" / "native" / "__init__.py").write_text("SOURCE = 'ties.c'\n")
    (repo / "pactlib" / "native" / "ties.c").write_text("int f(void) { return 1; }\n")
    (repo / "pactlib" / "native" / "notes.txt").write_text("not code\n")
    names = [*NAMES, "pactlib.native"]
    eng = pv.engine(names, repo)
    assert [m for m in eng["modules"] if "native" in m] == ["pactlib/native/__init__.py", "pactlib/native/ties.c"]
    assert eng["modules"]["pactlib/native/ties.c"] == pv.sha(b"int f(void) { return 1; }\n")
    folder = repo / "book" / "records" / "default" / "main" / "05_main_results"
    pv.write(folder, {"chapter": "05_main_results", "params": {}, "notebook": "nb1", "engine": eng})
    assert pv.staleness(folder, {}, "nb1", root=repo) == []
    (repo / "pactlib" / "native" / "ties.c").write_text("int f(void) { return 2; }\n")
    assert pv.staleness(folder, {}, "nb1", root=repo) == ["engine changed: pactlib/native/ties.c"]


def test_params_notebook_lock_and_testbeds_are_named(repo):
    folder = _made(repo, {"seeds": [0, 1, 2], "alpha_points": 5})
    reasons = pv.staleness(folder, {"seeds": [0], "alpha_points": 5, "methods": ["ties"]}, "nb2", root=repo,
                           testbeds={"lite0-8": "t2"})
    assert reasons == ['parameters differ: methods (unset) -> ["ties"]; seeds [0, 1, 2] -> [0]',
                       "notebook's compute cells changed", "testbeds changed: lite0-8"]
    assert pv.state(reasons) == "stale"
    (repo / "requirements.lock").write_text("torch==2.15.0\n")
    assert pv.staleness(folder, {"seeds": [0, 1, 2], "alpha_points": 5}, "nb1", root=repo) == [
        "requirements.lock changed"]


def test_missing_and_unreadable(repo):
    folder = repo / "book" / "records" / "default" / "main" / "07_layer_depth"
    reasons = pv.staleness(folder, {}, "nb", root=repo)
    assert reasons == ["missing: no records in book/records/default/main/07_layer_depth"]
    assert pv.state(reasons) == "missing" and pv.state([]) == "current"
    folder.mkdir(parents=True)
    (folder / pv.FILE).write_text("[1, 2]")
    assert pv.staleness(folder, {}, "nb", root=repo)[0].startswith("unreadable provenance:")


def test_write_is_sorted_and_round_trips(tmp_path):
    path = pv.write(tmp_path / "c", {"b": 1, "a": {"y": 2, "x": 1}})
    assert path.read_text() == '{\n "a": {\n  "x": 1,\n  "y": 2\n },\n "b": 1\n}\n'
    assert pv.read(tmp_path / "c") == {"a": {"x": 1, "y": 2}, "b": 1}
    assert pv.read(tmp_path / "none") is None
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["provenance.json"]  # no temporary left


def test_notebook_hash_ignores_comments_and_blank_lines_but_not_code():
    a = pv.notebook_hash(["x = run(tb)  # merge\n\n\ny = 2\n", "!echo hi\n"])
    assert a == pv.notebook_hash(["# the merges\nx = run(tb)\ny = 2", "!echo hi"])
    assert a != pv.notebook_hash(["x = run(tb)\ny = 3\n", "!echo hi\n"])
    assert a != pv.notebook_hash(["x = run(tb)\ny = 2\n", "!echo bye\n"])


def test_seeds_are_copied_out():
    assert pv.seeds_of({"seeds": [0, 1], "zoo_seed": 3, "alpha": 1, "seed": 0}) == {
        "seed": 0, "seeds": [0, 1], "zoo_seed": 3}


def test_the_real_engine_hashes_what_a_kernel_imports():
    import pactlib.merges  # noqa: F401
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    eng = pv.engine([n for n in sys.modules if n.startswith("pactlib")], root)
    assert "pactlib/merges/iso.py" in eng["modules"] and "pactlib/book/provenance.py" not in eng["modules"]
    assert json.loads(json.dumps(eng)) == eng


def test_zoo_profile_sums_training_minutes_by_kind_and_skips_merge_memos(tmp_path):
    lite = tmp_path / "zoo" / "seed0"
    lite.mkdir(parents=True)
    (lite / "a.json").write_text(json.dumps({"kind": "full", "seconds": 90}))
    (lite / "b.json").write_text(json.dumps({"kind": "full", "seconds": 30}))
    (lite / "c.json").write_text(json.dumps({"kind": "lora", "seconds": 6}))
    (lite / "d.json").write_text(json.dumps({"kind": "full"}))  # no time: not a model record
    (tmp_path / "zoo" / "run_memo").mkdir()
    (tmp_path / "zoo" / "run_memo" / "m.json").write_text(json.dumps({"kind": "full", "seconds": 600}))
    assert pv.zoo_profile(tmp_path) == {"lite0": {"kinds": {"full": {"models": 2, "minutes": 2.0},
                                                            "lora": {"models": 1, "minutes": 0.1}}}}
    assert pv.zoo_profile(tmp_path / "nothing") == {}


def test_swap_in_replaces_the_folder_whole(tmp_path):
    final, staging = tmp_path / "05", tmp_path / ".05.staging"
    final.mkdir()
    (final / "old.jsonl").write_text("old\n")
    staging.mkdir()
    (staging / "new.jsonl").write_text("new\n")
    pv.swap_in(staging, final)
    assert [p.name for p in final.iterdir()] == ["new.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["05"]  # no staging or old folder left


def test_zoo_fingerprint_follows_the_checkpoints_not_the_timings(tmp_path):
    man = {"pretrained": {"file": "pretrained.safetensors", "sha256": "p0"},
           "entries": {"full/mnist/seed0": {"sha256": "a", "head_sha256": "h", "seconds": 41.5},
                       "full/optdigits/seed0": {"sha256": "b", "head_sha256": "h2", "seconds": 12.0}}}
    folder = tmp_path / pv.ZOOS["lite0"]
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(man))
    first = pv.zoo_fingerprint(tmp_path, "lite0")
    assert len(first) == 64 and pv.zoo_fingerprint(tmp_path, "minilm") is None  # no MiniLM zoo there
    man["entries"]["full/mnist/seed0"]["seconds"] = 99.0  # timings: the same zoo
    man["entries"] = dict(reversed(man["entries"].items()))  # order: the same zoo
    (folder / "manifest.json").write_text(json.dumps(man))
    assert pv.zoo_fingerprint(tmp_path, "lite0") == first
    man["entries"]["full/mnist/seed0"]["sha256"] = "a2"  # another checkpoint: another zoo
    (folder / "manifest.json").write_text(json.dumps(man))
    assert pv.zoo_fingerprint(tmp_path, "lite0") != first


def test_git_state_is_dirty_only_when_code_differs(tmp_path):
    """Records written by a run (tracked or new) leave the state clean; a changed or new file of
    the engine, a chapter or the lock makes it ``-dirty``; no repository: ``unknown``."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert pv.git_state(tmp_path) == "unknown"
    git("init", "-q")
    for rel in ("pactlib/merge.py", "notebooks/05.py", "book/records/default/main/05/r.jsonl", "requirements.lock"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("a\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert pv.git_state(tmp_path) == head
    (tmp_path / "book/records/default/main/05/r.jsonl").write_text("b\n")
    (tmp_path / "book/records/default/main/06").mkdir()
    (tmp_path / "book/records/default/main/06/r.jsonl").write_text("new\n")
    assert pv.git_state(tmp_path) == head
    for rel in ("pactlib/merge.py", "requirements.lock"):
        (tmp_path / rel).write_text("changed\n")
        assert pv.git_state(tmp_path) == head + "-dirty"
        git("checkout", "--", rel)
    (tmp_path / "pactlib/new_module.py").write_text("x = 1\n")
    assert pv.git_state(tmp_path) == head + "-dirty"
