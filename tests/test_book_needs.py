"""What `make book` / `make chapter` build before the notebooks (mk/book.mk's BOOK_DEPS): the
runner's ``--needs`` answer, from the testbeds the chapters name under the set, whatever way
PARAMS names the set (issue 15 review: a path to a paper set used to build the Lite0 + MiniLM
zoos, because the old rule looked at the set's name)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_runner

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def runner():
    return load_runner()


@pytest.fixture
def needs(runner, capsys):
    def run(*args) -> tuple[str, int]:
        rc = runner.main(["--needs", *args])
        return capsys.readouterr().out.strip(), rc
    return run


@pytest.mark.parametrize("args,want", [
    (["--params", "default"], "data zoo"),                      # Lite0 + MiniLM chapters
    (["--params", "smoke"], ""),                                # synthetic + Lite0's smoke zoo: builds itself
    (["--params", "paper-vitb32-8"], ""),                       # the user's CLIP files
    (["--params", str(ROOT / "params" / "paper-vitl14-20.yaml")], ""),  # a path, not a name
    (["--params", "default", "--only", "01"], ""),              # chapter 1: synthetic only
    (["--params", "default", "--only", "03", "--run", "minilm"], "data-minilm zoo-minilm"),  # a variant's testbed
    (["--params", "default", "--only", "minilm/03"], "data-minilm zoo-minilm"),  # the same run, as NB=minilm/03
    (["--params", "default", "--only", "main/03"], "data-lite0 zoo-lite0"),  # the main run: Lite0 only
    (["--params", "default", "--only", "03"], "data zoo"),      # both runs of chapter 3: both families
    (["--params", "default", "--only", "main/01"], ""),
    (["--params", "smoke", "--only", "syn4/05"], ""),
    (["--params", "paper-vitb32-8", "--only", "03", "-p", "testbed=lite0-8"], "data-lite0 zoo-lite0"),  # -p counts
    (["--params", "paper-vitb32-8", "--only", "02", "-p", "zoo_profile=default"], "data-lite0 zoo-lite0"),
])
def test_needs_follow_the_testbeds_the_chapters_name(needs, args, want):
    assert needs(*args) == (want, 0)


def test_needs_of_a_set_that_cannot_be_read_is_the_safe_answer(needs, tmp_path):
    out, rc = needs("--params", str(tmp_path / "none.yaml"))
    assert (out, rc) == ("data zoo", 2)


def _make_n(*args) -> str:
    proc = subprocess.run(["make", "-n", "--no-print-directory", *args, f"PY={sys.executable}"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_reproduce_prepares_data_only_for_sets_that_need_it_and_leaves_zoos_to_the_runner():
    data = ("pact data prepare", "pact text prepare")
    zoo = ("pactlib.testbeds.lite0.testbed default", "pactlib.testbeds.minilm.testbed default")
    default = _make_n("reproduce")  # the default book: both families' data; the runner builds the zoos as jobs
    assert all(d in default for d in data) and "setup data" in default
    assert not any(z in default for z in zoo) and "run_notebooks.py --params default" in default
    assert not any(z in _make_n("book") for z in (*data, *zoo))  # rendering from records needs neither
    for params in ("paper-vitb32-8", str(ROOT / "params" / "paper-vitb32-8.yaml")):
        out = _make_n("reproduce", f"PARAMS={params}")
        assert not any(z in out for z in (*data, *zoo)), params
        assert "run_notebooks.py --params " + params in out
    lite0 = _make_n("reproduce", "NB=main/10_theory")  # one Lite0 run: the Lite0 data, not MiniLM's
    assert "pact data prepare" in lite0 and "pact text prepare" not in lite0
    chapter = _make_n("chapter", "NB=12_paper_scale")  # one chapter of the default set: its own needs (none)
    assert not any(z in chapter for z in (*data, *zoo)) and "--only 12_paper_scale" in chapter
    assert not any(d in _make_n("reproduce", "BOOK_DEPS=") for d in data)  # empty: skip, as before
