"""scripts/gpu_check.sh (bench/gpu_check.py): without a GPU it exits 0 saying so; with
--cpu-smoke it runs the whole path (PACT filter exact/RSVD, every merge, the streamed merge of
files on a named device, CLIP evaluation, the α search, chapters 3 and 10 on a clip testbed) on tiny shapes on the CPU and writes its JSON report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args, out: Path, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args, "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_cpu_smoke_runs_the_paper_path(tmp_path):
    proc = _run("--cpu-smoke", out=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["info"]["mode"] == "cpu-smoke" and report["info"]["tasks"] == 3
    rows = {(r["stage"], r["variant"].split(",")[0]): r for r in report["stages"]}
    want = {("filter", "pact (rsvd)"), ("filter", "pact (exact)"), ("eval", "θ0"), ("path", "PACT(rsvd)+Iso-C")} | \
        {("merge", m) for m in ("task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts")} | \
        {("chapter 3", "task 0 on the testbed"), ("chapter 10", "task 0 on the testbed")} | \
        {("files", v) for v in ("Iso-C", "PACT-RSVD-Iso-C", "PACT-RSVD-TIES")} | \
        {("svd", f"{shape} {way}") for shape in ("256×64", "64×256")
         for way in ("pactlib.linalg.svd", "torch default", "Gram eigh float32", "Gram eigh float64", "T as one batch")}
    assert set(rows) == want
    for (stage, variant), r in rows.items():  # the SVD ways: each timed, its σ within float32's noise, or exact
        if stage == "svd":
            assert r["ms_per_svd"] > 0 and r["sigma_error"] < (1e-12 if "float64" in variant else 1e-5), r
    for r in rows.values():
        assert r["error"] is None and r["seconds"] > 0 and r["device"] == "cpu", r
    assert rows["eval", "θ0"]["images_per_second"] > 0
    assert rows["path", "PACT(rsvd)+Iso-C"]["alpha"] in (0.5, 1.0, 2.0)
    assert rows["chapter 3", "task 0 on the testbed"]["note"].endswith(" records")
    assert "measured" in rows["chapter 10", "task 0 on the testbed"]["note"]
    assert rows["files", "PACT-RSVD-Iso-C"]["ratio_to_iso_c"] > 0  # the streamed merge with a device named
    assert "Iso-C's time" in rows["files", "PACT-RSVD-Iso-C"]["note"]
    assert "speed-up" in proc.stdout and "peak GPU MiB" in proc.stdout and "wrote" in proc.stdout


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present here")
    proc = _run(out=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no GPU here" in proc.stdout and not (tmp_path / "gpu_check.json").exists()


def test_files_stage_compares_a_second_device_with_the_first(tmp_path):
    """The ``files`` stage run twice (as on cuda, then on the CPU; here the CPU both times, into
    two folders): the second run's outputs are compared with the first's, bit for bit here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    from conftest import make_checkpoints
    from pactlib import task_vectors_from

    pre, fts = make_checkpoints(T=3, seed=1)
    p0, ps = gc.write_checkpoints(pre, task_vectors_from(pre, fts), tmp_path / "in")
    timer, first = gc.Timer(budget_s=1e9), {}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        gc.files_checks(p0, ps, "cpu", timer, tmp_path / folder, budget=False, first=first)
    assert [r["variant"] for r in timer.rows] == [v for v, _, _ in gc.FILE_MERGES] * 2
    assert all(r["error"] is None for r in timer.rows)
    second = timer.rows[len(gc.FILE_MERGES):]
    assert [r["max_rel_diff_to_first"] for r in second] == [0.0] * len(gc.FILE_MERGES)
    assert all(str(first[v]).startswith(str(tmp_path / "a")) for v, _, _ in gc.FILE_MERGES)
    assert "x Iso-C's time (goal <= 2)" in second[1]["note"] and second[1]["ratio_to_iso_c"] > 0
