"""A model folder output is published whole: a run killed (SIGKILL) at any step of the publish
leaves the earlier folder or the new one, each whole (all its files describe the same weights),
and the next run removes what the killed one left, saying so."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from pactlib import native
from pactlib.cli import main
from tests.conftest import make_checkpoints

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["pactlib.io:StreamedFile.publish",  # the weights renamed in the staging folder
         "exchange", "exchanged", "swapped", "moved back"]


def inputs(tmp_path):
    pre, fts = make_checkpoints(2, seed=7)
    base = tmp_path / "base"
    base.mkdir()
    save_file(pre, base / "model.safetensors")
    (base / "config.json").write_text('{"from": "base"}\n')
    (base / "tokenizer.json").write_text('{"tok": 1}\n')
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    return ["--method", "task_arithmetic", "--pretrained", str(base), "--finetuned", *paths]


#: `pact merge` in a child process killed (SIGKILL) when it first calls argv[1] ("module:Class.method")
_KILL_AT = """
import importlib, os, signal, sys
where, name = sys.argv[1].split(":")
cls, meth = name.split(".")
owner = getattr(importlib.import_module(where), cls)
original = getattr(owner, meth)
def killed(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(owner, meth, killed)
from pactlib.cli import main
sys.exit(main(sys.argv[2:]))
"""


def killed_run(step, argv, fast):
    env = {**os.environ, native.ENV: "1" if fast else "0"}
    if ":" in step:
        cmd = [sys.executable, "-c", _KILL_AT, step, *argv]
    else:
        env["PACT_TEST_KILL_AT"] = step
        cmd = [sys.executable, "-m", "pactlib.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)


def contents(folder):
    """{name: bytes} of the folder's files, but for the lock a killed run leaves."""
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file() and f.name != ".pact-merge.lock"}


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
@pytest.mark.parametrize("step", STEPS)
def test_a_run_killed_at_any_step_of_the_publish_leaves_a_whole_folder(tmp_path, monkeypatch, capsys, fast, step):
    if fast and native.library() is None:
        pytest.skip("no C compiler: the fast path is off")
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = inputs(tmp_path)
    old_ref, new_ref, out = tmp_path / "old_ref", tmp_path / "new_ref", tmp_path / "out"
    for folder, alpha in ((old_ref, "0.25"), (new_ref, "0.5"), (out, "0.25")):
        assert main(["merge", *argv, "--alpha", alpha, "--out", f"{folder}/"]) == 0
    capsys.readouterr()
    (out / "notes.txt").write_text("mine\n")  # a user's own file and folder stay through every run
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref\n")
    old, new = contents(old_ref), contents(new_ref)
    assert old["model.safetensors"] != new["model.safetensors"] and old["README.md"] != new["README.md"]
    proc = killed_run(step, ["merge", *argv, "--alpha", "0.5", "--out", f"{out}/"], fast)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    now = contents(out)
    assert now.pop("notes.txt") == b"mine\n"
    assert now in (old, new)  # whole: every file the earlier merge's, or every file the new one's
    assert now == (new if step in ("exchanged", "swapped", "moved back") else old)
    assert (out / ".git" / "HEAD").is_file() == (step not in ("exchanged", "swapped"))  # moved in after
    left = sorted(f.name for f in tmp_path.iterdir() if f.name.startswith(".out.pact-"))
    assert len(left) == 1, left
    # the next run removes what the killed one left (its staging or earlier folder), with a line
    assert main(["merge", *argv, "--alpha", "0.5", "--out", f"{out}/"]) == 0
    err = capsys.readouterr().err
    pid = left[0].split("-")[2]
    assert (f"pact: warning: {out}: removed {tmp_path / left[0]}, left by a run (process {pid}) that was killed "
            "while it wrote or published this folder") in err
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".out.pact-")]
    assert contents(out) == {**new, "notes.txt": b"mine\n"}
    assert (out / ".git" / "HEAD").read_text() == "ref\n"
    assert sorted(f.name for f in out.iterdir()) == sorted([*new, "notes.txt", ".git"])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
def test_a_new_folder_killed_before_the_swap_is_left_empty(tmp_path, monkeypatch, capsys, fast):
    """A new folder: killed before the swap, the folder holds no weights without their card
    (only the run's lock); the re-run fills it and removes the staging folder."""
    if fast and native.library() is None:
        pytest.skip("no C compiler: the fast path is off")
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = inputs(tmp_path)
    out = tmp_path / "out"
    proc = killed_run("exchange", ["merge", *argv, "--alpha", "0.5", "--out", f"{out}/"], fast)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [f.name for f in out.iterdir()] == [".pact-merge.lock"]
    assert main(["merge", *argv, "--alpha", "0.5", "--out", f"{out}/"]) == 0
    assert "that was killed while it wrote or published this folder" in capsys.readouterr().err
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                     "pact_recipe.yaml", "tokenizer.json"]
    assert sorted(f.name for f in tmp_path.iterdir() if f.name.startswith(".")) == []


def test_without_an_exchange_call_the_folder_is_swapped_by_two_renames(tmp_path, monkeypatch, capsys):
    """Where renameat2 is missing, the swap is two renames; the result is the same folder."""
    from pactlib import recipe

    monkeypatch.setenv(native.ENV, "0")
    argv = inputs(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert main(["merge", *argv, "--alpha", "0.5", "--out", f"{ref}/"]) == 0
    assert main(["merge", *argv, "--alpha", "0.25", "--out", f"{out}/"]) == 0
    monkeypatch.setattr(recipe, "_exchange", lambda a, b: False)
    (out / "notes.txt").write_text("mine\n")
    assert main(["merge", *argv, "--alpha", "0.5", "--out", f"{out}/"]) == 0
    assert contents(out) == {**contents(ref), "notes.txt": b"mine\n"}
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]
