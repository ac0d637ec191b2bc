"""Nothing a merge writes lands outside its output: a symbolic link (or a hard link) at a name the
merge writes — its lock files, its temporary files, the files it publishes — is refused, naming
the link, on the fast path and on the torch path, for a file output and a folder output; the file
the link points to is left as it was (or not made, when the link dangles)."""
import json
import os
from pathlib import Path

import pytest
from safetensors.torch import save_file

from pactlib import native
from pactlib.cli import main
from tests.conftest import make_checkpoints

HAS_FAST = native.library() is not None


def inputs(tmp_path, folder_base=True):
    """`pact merge` flags of a Task Arithmetic merge of 2 tasks; θ0 a model folder (with a
    config.json and a tokenizer.json) or one file."""
    pre, fts = make_checkpoints(2, seed=5)
    if folder_base:
        base = tmp_path / "base"
        base.mkdir()
        save_file(pre, base / "model.safetensors")
        (base / "config.json").write_text('{"from": "base"}\n')
        (base / "tokenizer.json").write_text('{"tok": 1}\n')
    else:
        base = tmp_path / "base.safetensors"
        save_file(pre, base)
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    return ["--method", "task_arithmetic", "--alpha", "0.5", "--pretrained", str(base), "--finetuned", *paths]


def merge(argv, monkeypatch, capsys, fast, *, strict=None):
    """`pact merge argv` on the fast path or the torch path (PACT_NATIVE=0): (exit status,
    stderr). ``strict`` (default ``fast``): the torch path must not run (the fast path gives the
    result or the error itself)."""
    import pactlib.cli

    if fast and not HAS_FAST:
        pytest.skip("no C compiler: the fast path is off")
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    if fast if strict is None else strict:
        monkeypatch.setattr(pactlib.cli, "_merge", lambda args: pytest.fail("the torch path ran"))
    rc = main(["merge", *argv])
    err = capsys.readouterr().err
    monkeypatch.undo()
    return rc, err


def skip_checks(monkeypatch):
    """Let the links through the checks made before any work (as a link made after them): the
    writers' own opening of the lock must refuse them."""
    import pactlib.cli
    import pactlib.fastpath
    import pactlib.streaming

    for mod in (pactlib.cli, pactlib.fastpath, pactlib.streaming):
        monkeypatch.setattr(mod, "check_out_target", lambda *a, **k: None)


def said_link(err, link, target):
    return f"{link} is a symbolic link (to {target}); pact merge never writes through a link; remove it" in err


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("late", [False, True], ids=["checked-first", "made-after-the-checks"])
def test_a_link_at_a_file_outputs_lock_is_refused(tmp_path, monkeypatch, capsys, fast, dangling, late):
    argv = inputs(tmp_path, folder_base=False)
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir()
    if not dangling:
        victim.write_text("precious\n")
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    link = out.parent / ".m.safetensors.lock"
    link.symlink_to(victim)
    if late:
        skip_checks(monkeypatch)
    # checked first, the torch path names it (the fast path leaves every error to it); made
    # after the checks, the path that runs refuses it when it opens the lock
    rc, err = merge([*argv, "--out", str(out)], monkeypatch, capsys, fast, strict=fast and late)
    assert rc == 2
    assert said_link(err, link, victim), err
    assert f"pact: error: cannot write the output {out}" in err
    assert (victim.read_text() == "precious\n") if not dangling else not victim.exists()
    assert sorted(f.name for f in out.parent.iterdir()) == [".m.safetensors.lock"] and link.is_symlink()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
@pytest.mark.parametrize("name", [".m.safetensors.lock", "m.safetensors", "m.safetensors.index.json",
                                  "m-00001-of-00002.safetensors"])
def test_a_link_at_any_name_a_file_output_writes_is_refused(tmp_path, monkeypatch, capsys, fast, name):
    argv = inputs(tmp_path, folder_base=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    (out.parent / name).symlink_to(victim)
    rc, err = merge([*argv, "--out", str(out), "--max-shard-size", "600"], monkeypatch, capsys, fast, strict=False)
    assert rc == 2 and said_link(err, out.parent / name, victim), err
    assert victim.read_text() == "precious\n"
    assert [f.name for f in out.parent.iterdir()] == [name]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
@pytest.mark.parametrize("lock", [".pact-merge.lock", ".model.safetensors.lock"])
@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "earlier-merge"])
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("late", [False, True], ids=["checked-first", "made-after-the-checks"])
def test_a_link_at_a_folder_outputs_lock_is_refused(tmp_path, monkeypatch, capsys, fast, lock, earlier, dangling,
                                                    late):
    argv = inputs(tmp_path)
    out = tmp_path / "out"
    if earlier:
        assert merge([*argv, "--out", f"{out}/"], monkeypatch, capsys, fast)[0] == 0
    else:
        out.mkdir()
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious\n")
    (out / lock).symlink_to(victim)
    if late:
        skip_checks(monkeypatch)
    rc, err = merge([*argv[:3], "0.25", *argv[4:], "--out", f"{out}/"], monkeypatch, capsys, fast,
                    strict=fast and late and lock != ".pact-merge.lock")
    assert (victim.read_text() == "precious\n") if not dangling else not victim.exists()
    if late and lock != ".pact-merge.lock":  # past the checks: the weights' lock is the staging folder's
        assert rc == 0, err
        assert not os.path.lexists(out / lock) and (out / "pact_recipe.yaml").read_text().count("0.25") == 1
        return
    assert rc == 2 and said_link(err, out / lock, victim), err
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.name != lock} == before
    assert (out / lock).is_symlink()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
def test_a_hard_link_at_a_lock_is_refused(tmp_path, monkeypatch, capsys, fast):
    """A hard link at the lock's name shares its bytes with a file outside: the PID is not
    written into it."""
    argv = inputs(tmp_path, folder_base=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    os.link(victim, out.parent / ".m.safetensors.lock")
    rc, err = merge([*argv, "--out", str(out)], monkeypatch, capsys, fast, strict=False)
    assert rc == 2, err
    assert (f"pact: error: cannot write the output {out}: its lock file {out.parent / '.m.safetensors.lock'} is a "
            "hard link (2 names); pact merge writes only files it makes; remove it") in err
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "pact_recipe.yaml", "README.md"])
def test_a_link_at_a_file_a_folder_output_writes_is_refused(tmp_path, monkeypatch, capsys, fast, name):
    argv = inputs(tmp_path)
    out = tmp_path / "out"
    assert merge([*argv, "--out", f"{out}/"], monkeypatch, capsys, fast)[0] == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / name).unlink()
    (out / name).symlink_to(victim)
    before = {f.name: (f.read_bytes() if not f.is_symlink() else os.readlink(f)) for f in out.iterdir()}
    rc, err = merge([*argv[:3], "0.25", *argv[4:], "--out", f"{out}/"], monkeypatch, capsys, fast, strict=False)
    assert rc == 2 and said_link(err, out / name, victim), err
    assert victim.read_text() == "precious\n"
    assert {f.name: (f.read_bytes() if not f.is_symlink() else os.readlink(f)) for f in out.iterdir()} == before


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
def test_a_stale_lock_of_an_ended_run_is_taken_over_with_a_line(tmp_path, monkeypatch, capsys, caplog, fast):
    import logging

    argv = inputs(tmp_path, folder_base=False)
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    (out.parent / ".m.safetensors.lock").write_text("4242\n")  # SIGKILLed: no one holds it
    with caplog.at_level(logging.INFO, logger="pactlib.lazy"):
        rc, err = merge([*argv, "--out", str(out)], monkeypatch, capsys, fast)
    assert rc == 0, err
    assert f"{out}: took over the lock file .m.safetensors.lock that an ended run (process 4242) left" in caplog.messages
    assert sorted(f.name for f in out.parent.iterdir()) == ["m.safetensors"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "torch"])
def test_a_support_file_linking_out_of_the_base_folder_is_named(tmp_path, monkeypatch, capsys, fast):
    """θ0's tokenizer.json links to a file outside θ0's folder: the warning names the link and
    its target (it is copied, as a link inside the folder is, without a word)."""
    argv = inputs(tmp_path)
    base = tmp_path / "base"
    outside = tmp_path / "secret" / "tok.json"
    outside.parent.mkdir()
    outside.write_text('{"outside": true}\n')
    (base / "tokenizer.json").unlink()
    (base / "tokenizer.json").symlink_to(outside)
    (base / "vocab.json").write_text("{}\n")
    (base / "merges.txt").symlink_to(base / "vocab.json")  # inside: copied without a word
    out = tmp_path / "out"
    rc, err = merge([*argv, "--out", f"{out}/"], monkeypatch, capsys, fast)
    assert rc == 0, err
    assert (f"pact: warning: {base / 'tokenizer.json'} is a link to {outside}, outside the pre-trained folder "
            f"{base}; copied into {out} as the pre-trained model's tokenizer.json") in err
    assert err.count("outside the pre-trained folder") == 1
    assert (out / "tokenizer.json").read_text() == '{"outside": true}\n' and not (out / "tokenizer.json").is_symlink()
    assert json.loads((out / "config.json").read_text()) == {"from": "base"}
