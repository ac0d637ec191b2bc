"""The book runner's thread count (issue 15): ``--threads N`` > a set's ``threads:`` (a variant's
chapter values > the chapter's section > ``common:``) > cores / jobs; the value reaches torch in the
kernel; bad values fail before anything runs, naming where they were given; the count is not part
of a chapter's cache key.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# prints: torch imported before the notebook did (no: the kernel stays light), a name the start-up
# file left behind (none), then torch's thread count and the environment's
TINY = ('# %% tags=["parameters"]\nsize = 1  # unused\n\n'
        '# %%\nimport os\nimport sys\nbefore = "torch" in sys.modules\nimport torch\n'
        'print(before, "_pact_threads_on_torch_import" in globals(), torch.get_num_threads(), '
        'os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"))\n')


@pytest.fixture
def rn(tmp_path, monkeypatch):
    """The runner, its chapters = two tiny notebooks ``01_a``, ``02_b`` in a temporary folder, its
    output under the temporary folder."""
    from conftest import load_runner

    runner = load_runner()
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    for stem in ("01_a", "02_b"):
        (nbs / f"{stem}.py").write_text(TINY)
    monkeypatch.setattr(runner, "NOTEBOOKS", nbs)
    monkeypatch.setattr(runner, "toc_chapters", lambda *a, **k: ["01_a", "02_b"])
    monkeypatch.setattr(runner, "EXECUTED", tmp_path / "executed")
    monkeypatch.setattr(runner, "RECORDS", tmp_path / "records")
    monkeypatch.delenv("PACT_BOOK_INPUTS", raising=False)
    return runner


def _set(tmp_path, data, name="set.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"common": {}, "01_a": {}, "02_b": {}, **data}))
    return path


def _paths(rn):
    return rn.notebook_paths(None)


def test_precedence_cli_over_variant_over_section_over_common_over_default(rn, tmp_path, monkeypatch):
    monkeypatch.setattr(rn, "usable_cores", lambda: 8)
    path = _set(tmp_path, {"common": {"threads": 2}, "01_a": {"threads": 3},
                           "variants": {"v": {"title": "V", "chapters": {"01_a": {"threads": 6}, "02_b": {}}}}})
    jobs = {j.id: j for j in rn.prepare(_paths(rn), path, {})}
    assert {i: j.threads for i, j in jobs.items()} == {"01_a": 3, "02_b": 2, "v/01_a": 6, "v/02_b": 2}
    assert all("threads" not in j.overrides for j in jobs.values())  # the runner's, never a notebook parameter
    assert [rn.resolve_threads(None, j, 2) for j in jobs.values()] == [3, 2, 6, 2]
    assert [rn.resolve_threads(7, j, 2) for j in jobs.values()] == [7, 7, 7, 7]  # --threads wins
    # unset (no key, or null over common's value): cores / jobs
    path = _set(tmp_path, {"common": {"threads": 2}, "01_a": {"threads": None}})
    a, b = rn.prepare(_paths(rn), path, {})
    assert (a.threads, b.threads) == (None, 2)
    assert [rn.resolve_threads(None, a, jobs) for jobs in (1, 2, 3, 16)] == [8, 4, 2, 1]


def test_check_only_names_the_counts(rn, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rn, "usable_cores", lambda: 8)
    path = _set(tmp_path, {"01_a": {"threads": 3}})
    assert rn.main(["--params", str(path), "--check-only", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.strip().endswith("torch threads per kernel: 3, 4")
    assert rn.main(["--params", str(path), "--check-only", "--threads", "5"]) == 0
    assert capsys.readouterr().out.strip().endswith("torch threads per kernel: 5")


@pytest.mark.parametrize("where, value", [
    ("common", "eight"), ("common", 0), ("01_a", -2), ("01_a", 2.5), ("01_a", True),
    ("variants: v: 02_b", [2]),
])
def test_bad_set_value_fails_naming_where_before_anything_runs(rn, tmp_path, monkeypatch, capsys, where, value):
    section = {"threads": value}
    data = {"variants": {"v": {"title": "V", "chapters": {"02_b": section if where.startswith("variants") else {}}}}}
    if not where.startswith("variants"):
        data[where] = section
    path = _set(tmp_path, data)
    monkeypatch.setattr(rn, "present", lambda *a, **k: pytest.fail("executed despite a bad thread count"))
    assert rn.main(["--params", str(path), "--no-render"]) == 2
    err = capsys.readouterr().err
    assert f"set.yaml: {where}: threads must be a whole number from 1 to 4096 (torch threads per kernel), got {value!r}" in err, err
    assert err.count("threads must be") == 1  # once, not once per chapter


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5", "", "4097", "99999999999999999999"])
def test_bad_option_fails_naming_it_before_anything_runs(rn, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setattr(rn, "present", lambda *a, **k: pytest.fail("executed despite a bad --threads"))
    assert rn.main(["--params", str(_set(tmp_path, {})), "--no-render", "--threads", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --threads must be a whole number from 1 to 4096") and err.count("\n") == 1, err


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_bad_jobs_fail_before_anything_even_with_check_only(rn, tmp_path, capsys, jobs):
    assert rn.main(["--params", str(_set(tmp_path, {})), "--check-only", "--jobs", jobs]) == 2
    assert f"--jobs must be a whole number >= 1, got {jobs}" in capsys.readouterr().err


def test_threads_is_no_notebook_parameter(rn, tmp_path, capsys):
    path = _set(tmp_path, {})
    assert rn.main(["--params", str(path), "--check-only", "-p", "threads=2"]) == 2
    assert "-p threads=2: the kernels' thread count is not a notebook parameter; use --threads N" in capsys.readouterr().err
    (rn.NOTEBOOKS / "02_b.py").write_text(TINY.replace("size = 1", "threads = 1"))
    assert rn.main(["--params", str(path), "--check-only"]) == 2
    assert "02_b.py: declares a parameter 'threads'" in capsys.readouterr().err


def test_no_chapter_declares_threads_and_the_key_ignores_the_count(tmp_path):
    from conftest import load_runner

    from pactlib.book import chapters

    rn = load_runner()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        import jupytext

        assert "threads" not in chapters.parse_defaults(rn.parameters_cell(jupytext.read(path), path.stem).source)
    smoke = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    keys = []
    for threads in (None, 1, 8):
        data = {**smoke, "common": {**smoke["common"], **({"threads": threads} if threads else {})}}
        path = tmp_path / f"smoke-{threads}.yaml"
        path.write_text(yaml.safe_dump(data))
        job = rn.prepare([ROOT / "notebooks" / "05_main_results.py"], path, {})[0]
        assert job.threads == threads
        keys.append(rn.present_key(job, "smoke", "x"))
    assert keys[0] == keys[1] == keys[2]


@pytest.mark.slow
def test_thread_count_reaches_torch_in_the_kernel_and_a_new_count_reexecutes_nothing(rn, tmp_path, monkeypatch,
                                                                                       capsys):
    """One parallel run (--jobs 2) of two tiny notebooks: 01_a's section says 3 (more than this
    machine may have: torch.set_num_threads in the kernel, not the environment alone, gets it
    there), 02_b says nothing (cores / 2); the kernels do not import torch before the notebook
    does. Then --threads 1 re-executes nothing; --threads 4 --force hands 4 to both."""
    path = _set(tmp_path, {"01_a": {"threads": 3}})
    out = rn.EXECUTED / "set"
    assert rn.main(["--params", str(path), "--mode", "compute", "--no-render", "--jobs", "2"]) == 0
    assert rn.main(["--params", str(path), "--no-render", "--jobs", "2"]) == 0  # present: the records are current
    default = rn.default_threads(2)
    for stem, want in (("01_a", 3), ("02_b", default)):
        nb = json.loads((out / f"{stem}.ipynb").read_text())
        assert "".join(nb["cells"][-1]["outputs"][0]["text"]).split() == ["False", "False"] + [str(want)] * 3, stem
        assert nb["metadata"]["pact"]["threads"] == want
        assert json.loads((out / f"{stem}.key").read_text())["threads"] == want
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert rn.main(["--params", str(path), "--no-render", "--jobs", "2", "--threads", "1"]) == 0
    log = capsys.readouterr().out
    assert "presented 0 of 2 notebook(s)" in log and "(2 unchanged)" in log, log
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    seen = {}
    monkeypatch.setattr(rn, "present", lambda job, *a, **k: seen.setdefault(job.id, job.threads) and 0.0)
    assert rn.main(["--params", str(path), "--no-render", "--jobs", "1", "--threads", "4", "--force"]) == 0
    assert seen == {"01_a": 4, "02_b": 4}


def test_a_problem_of_the_set_itself_is_said_once(rn, tmp_path, capsys):
    """A missing set or a malformed section is met once per notebook; the error says it once."""
    assert rn.main(["--params", str(tmp_path / "missing.yaml"), "--check-only"]) == 2
    assert capsys.readouterr().err.count("parameter set not found") == 1
    (tmp_path / "top.yaml").write_text("threads: 4\n")
    assert rn.main(["--params", str(tmp_path / "top.yaml"), "--check-only"]) == 2
    assert capsys.readouterr().err.count("section 'threads' must be a mapping") == 1


def _sleepy(item):
    import time

    time.sleep(item.seconds)
    return item.name


def test_run_parallel_starts_what_others_wait_for_then_the_longest(tmp_path):
    from dataclasses import dataclass

    from pactlib.book import runplan

    @dataclass(frozen=True)
    class Item:
        name: str
        seconds: float
        variant: str | None = None

        @property
        def id(self):
            return self.name

        def sibling(self, chapter):
            return chapter

    items = [Item("a", 0.05), Item("b", 0.3), Item("c", 0.1), Item("d", 0.2), Item("e", 0.05)]
    events = []
    runplan.run_parallel(_sleepy, items, 2, after={"d": ("c",)}, on_start=lambda i: events.append(("start", i.name)),
                         on_done=lambda i, v: events.append(("done", v)), cost=lambda i: i.seconds)
    started = [n for e, n in events if e == "start"]
    # c first (d waits for it), then b (longest); d only once c is done, then a and e in list order
    assert started == ["c", "b", "d", "a", "e"]
    assert events.index(("start", "d")) > events.index(("done", "c"))
    assert sorted(n for e, n in events if e == "done") == list("abcde")
    order = []
    runplan.run_parallel(_sleepy, items[:3], 2, after={}, on_start=lambda i: order.append(i.name),
                         on_done=lambda i, v: None)
    assert order == ["a", "b", "c"]  # no cost: list order
