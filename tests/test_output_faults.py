"""The faults found by trying to break ``pact merge``: a full disk, two runs on one output, a
``.pt`` replaced in place, repeated ``--set`` names. Each test failed on the code before its fix."""
import contextlib
import fcntl
import os
import resource
import signal
import threading
from pathlib import Path

import pytest
import torch

from conftest import make_checkpoints
from pactlib import lazy
from pactlib.cli import main, parse_set
from pactlib.io import save_state_dict
from pactlib.streaming import merge_files


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes that would make a file larger than ``nbytes`` fail (EFBIG, as a full disk fails
    them with ENOSPC), for this process, inside the block."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel's signal ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)


def big_checkpoints(tmp_path, T=2):
    """θ0 and T fine-tuned safetensors files of about 400 kB each."""
    g = torch.Generator().manual_seed(0)
    pre = {"a.weight": torch.randn(160, 160, generator=g), "b.weight": torch.randn(320, 160, generator=g)}
    paths = [tmp_path / "pre.safetensors"]
    save_state_dict(pre, paths[0])
    for t in range(T):
        p = tmp_path / f"ft{t}.safetensors"
        save_state_dict({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in pre.items()}, p)
        paths.append(p)
    return [str(p) for p in paths]


def merge_args(paths, out, method="task_arithmetic"):
    return ["merge", "--method", method, "--alpha", "0.5", "--pretrained", paths[0], "--finetuned",
            *paths[1:], "--out", str(out)]


@pytest.mark.parametrize("name", ["merged.safetensors", "merged.pt"])
def test_a_full_disk_leaves_nothing_behind_and_names_the_output(tmp_path, capsys, name):
    paths = big_checkpoints(tmp_path)
    out = tmp_path / "out" / name
    out.parent.mkdir()
    with file_size_limit(200_000):  # the output needs about 300 kB
        rc = main(merge_args(paths, out))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("pact: error: ") and err.count("\n") == 1, err  # one line, no traceback
    assert str(out) in err and "File too large" in err
    assert sorted(os.listdir(out.parent)) == []  # no temporary file left
    # a rerun that fits succeeds
    assert main(merge_args(paths, out)) == 0
    assert sorted(os.listdir(out.parent)) == [name]


def test_a_full_disk_in_the_writer_names_the_output_and_removes_its_temporary_file(tmp_path, monkeypatch):
    """ENOSPC from the write itself or from the flush at close: the temporary file goes either way."""
    import errno

    from pactlib import io as pio

    real = pio.open_output

    class Full:
        def __init__(self, f, room):
            self.f, self.room = f, room

        def write(self, b):
            if len(b) > self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.room -= len(b)
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

    paths = big_checkpoints(tmp_path)
    out = tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    monkeypatch.setattr(pio, "open_output", lambda fd: Full(real(fd), 150_000))
    with pytest.raises(OSError) as e:
        merge_files("task_arithmetic", paths[0], paths[1:], out, alpha=0.5)
    assert e.value.errno == errno.ENOSPC and str(out) in str(e.value) and "No space left" in str(e.value)
    assert os.listdir(out.parent) == []


def test_one_run_at_a_time_writes_an_output(tmp_path, capsys):
    paths = big_checkpoints(tmp_path)
    out = tmp_path / "merged.safetensors"
    lock = lazy.output_lock_path(out)
    # another run holds the output: this one fails at once, naming it, and touches nothing of it
    live_tmp = tmp_path / ".merged.safetensors.live1234.tmp"
    live_tmp.write_bytes(b"being written")
    with lazy.output_lock(out):
        rc = main(merge_args(paths, out))
    err = capsys.readouterr().err
    assert rc == 2 and str(out) in err and "another run" in err, err
    assert live_tmp.read_bytes() == b"being written" and not out.exists()
    # once it is released the run goes ahead; the lock file goes with the run
    live_tmp.unlink()
    assert main(merge_args(paths, out)) == 0
    assert not lock.exists() and out.is_file()


def test_a_live_temporary_file_is_never_removed_as_stale(tmp_path):
    """A writer holds a lock on its temporary file while it writes: a run publishing an output of
    the same family (here ``x-00001-of-00002.safetensors``, a shard name of ``x.safetensors``)
    leaves it alone, and removes a dead one."""
    paths = big_checkpoints(tmp_path)
    live = tmp_path / ".x-00001-of-00002.safetensors.live.tmp"
    dead = tmp_path / ".x-00001-of-00002.safetensors.dead.tmp"
    dead.write_bytes(b"left by a killed run")
    with open(live, "wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        merge_files("task_arithmetic", paths[0], paths[1:], tmp_path / "x.safetensors", alpha=0.5)
        assert live.exists()
    assert not dead.exists()


def test_two_runs_on_one_output_at_once_do_not_collide(tmp_path):
    paths = big_checkpoints(tmp_path)
    out = tmp_path / "merged.safetensors"
    results = []

    def run():
        try:
            merge_files("task_arithmetic", paths[0], paths[1:], out, alpha=0.5)
            results.append("ok")
        except OSError as e:
            results.append(str(e))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "ok" in results and all(r == "ok" or "another run" in r for r in results), results
    assert sorted(os.listdir(tmp_path)) == sorted(["merged.safetensors", *(os.path.basename(p) for p in paths)])


def test_a_pt_replaced_in_place_with_the_same_size_and_mtime_is_converted_again(tmp_path):
    pre, (ft, ft2) = make_checkpoints(T=2)
    src = tmp_path / "model.pt"
    torch.save(ft, src)
    st = src.stat()
    cache = tmp_path / "cache"
    first = lazy.convert_pickle(src, cache_dir=cache)
    assert torch.equal(lazy.open_checkpoint(first).read("lin.weight"), ft["lin.weight"])
    with open(src, "r+b") as f:  # the same bytes' count, other values; then the old mtime back
        f.write(_same_size_bytes(ft2, src.stat().st_size, tmp_path))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (src.stat().st_size, src.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = lazy.convert_pickle(src, cache_dir=cache)
    assert torch.equal(lazy.open_checkpoint(second).read("lin.weight"), ft2["lin.weight"])
    assert [p.name for p in cache.iterdir()] == [second.name]  # the old conversion is gone


def _same_size_bytes(sd, size, tmp_path):
    other = tmp_path / "other" / "model.pt"  # the same file name: torch's zip holds it
    other.parent.mkdir()
    torch.save(sd, other)
    data = other.read_bytes()
    assert len(data) == size  # the same keys and shapes: torch's zip layout has the same size
    return data


def test_repeated_set_names_are_refused_naming_the_key(tmp_path, capsys):
    with pytest.raises(ValueError, match="'k'.*more than once"):
        parse_set(["k=20", "svd=rsvd", "k=30"])
    assert parse_set(["k=20", "svd=rsvd"]) == {"k": 20, "svd": "rsvd"}
    paths = big_checkpoints(tmp_path)
    rc = main([*merge_args(paths, tmp_path / "m.safetensors", method="ties"), "--set", "k=20", "k=30"])
    assert rc == 2 and "'k'" in capsys.readouterr().err and not (tmp_path / "m.safetensors").exists()


def test_set_given_twice_as_flags_is_refused_too(tmp_path, capsys):
    """``--set k=20 --set k=30`` collects both flags' items (argparse ``extend``), so the repeat
    is refused as in one flag; it used to keep the last silently."""
    paths = big_checkpoints(tmp_path)
    rc = main([*merge_args(paths, tmp_path / "m.safetensors", method="ties"), "--set", "k=20", "--set", "k=30"])
    assert rc == 2 and "'k'" in capsys.readouterr().err and not (tmp_path / "m.safetensors").exists()
    rc = main([*merge_args(paths, tmp_path / "m.safetensors", method="ties"), "--set", "k=20", "--set", "scope=per_key"])
    assert rc == 0 and (tmp_path / "m.safetensors").is_file()


def test_a_failed_folder_merge_leaves_no_folder(tmp_path, capsys):
    """A merge into a new model folder that fails after the folder was made (a bad TIES k, a
    missing fine-tuned file) removes the folder again, and a missing file is named as such."""
    paths = big_checkpoints(tmp_path)
    out = tmp_path / "merged"
    rc = main([*merge_args(paths, f"{out}/", method="ties"), "--set", "k=250"])
    assert rc == 2 and "k" in capsys.readouterr().err and not out.exists()
    args = merge_args(paths, f"{out}/", method="task_arithmetic")
    missing = str(tmp_path / "missing.safetensors")
    args[args.index("--finetuned") + 1] = missing
    rc = main(args)
    assert rc != 0 and f"checkpoint not found: {missing}" in capsys.readouterr().err and not out.exists()


class _Stop(BaseException):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_signals_held_deliver_after_the_block_and_record_what_it_published(tmp_path):
    """A SIGTERM raised inside :func:`signals_held` runs the handler in place before it only
    once the block has ended (the block's later statements ran); what the block published,
    nested blocks' included, is in published_outputs by then; a block that fails publishes
    nothing and still gets its signal; an ignored signal stays ignored and does not hide one
    that came after it; the handlers are restored."""
    from pactlib.io import published_outputs, signals_held

    seen = []

    def handler(signum, frame):
        seen.append(signum)
        if signum == signal.SIGTERM:
            raise _Stop()

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    signal.signal(signal.SIGTERM, handler)
    try:
        mark = len(published_outputs())
        with pytest.raises(_Stop):
            with signals_held() as held:
                signal.raise_signal(signal.SIGTERM)
                assert seen == []
                held.append(tmp_path / "a")
                with signals_held() as inner:
                    inner.append(tmp_path / "b")
                    signal.raise_signal(signal.SIGTERM)
                assert seen == []
        assert seen == [signal.SIGTERM] and published_outputs()[mark:] == [tmp_path / "a", tmp_path / "b"]
        assert signal.getsignal(signal.SIGTERM) is handler
        with pytest.raises(_Stop) as e:
            with signals_held() as held:
                held.append(tmp_path / "c")
                signal.raise_signal(signal.SIGTERM)
                raise OSError("a rename failed")
        assert isinstance(e.value.__context__, OSError) and published_outputs()[mark:] == [tmp_path / "a", tmp_path / "b"]
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        signal.signal(signal.SIGINT, handler)  # a handler that returns: the next signal is delivered too
        seen.clear()
        with pytest.raises(_Stop):
            with signals_held() as held:
                for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGINT):
                    signal.raise_signal(sig)
                held.append(tmp_path / "d")
        assert seen == [signal.SIGINT, signal.SIGTERM] and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert published_outputs()[-1] == tmp_path / "d"
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def test_the_pact_process_ignores_signals_once_its_command_returned(tmp_path, monkeypatch, capsys):
    """A user trial: SIGINT a few ms after a merge had published and printed its summary gave an
    "Exception ignored … KeyboardInterrupt" traceback with exit 0, or, later, death by the
    signal. Run as the process (``argv`` None), pact ignores the signals once the command
    returned; called in-process with ``argv``, it gives the caller its handlers back."""
    import signal
    import sys

    from pactlib.cli import _SIGNALS, main

    before = {s: signal.getsignal(s) for s in _SIGNALS}
    try:
        assert main(["methods"]) == 0
        assert {s: signal.getsignal(s) for s in _SIGNALS} == before
        monkeypatch.setattr(sys, "argv", ["pact", "methods"])
        assert main() == 0
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in _SIGNALS)
        for s in _SIGNALS:
            signal.signal(s, before[s])
        monkeypatch.setattr(sys, "argv", ["pact", "merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained",
                                          str(tmp_path / "no.safetensors"), "--finetuned", str(tmp_path / "a.safetensors"),
                                          "--out", str(tmp_path / "o.safetensors")])
        assert main() == 2  # a failed command too: what it says is said
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in _SIGNALS)
    finally:
        for s in _SIGNALS:
            signal.signal(s, before[s])
    assert "task_arithmetic" in capsys.readouterr().out


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="a folder no file can be made in: Linux's /proc")
@pytest.mark.parametrize("folder", [False, True])
def test_an_output_whose_lock_cannot_be_made_is_named(tmp_path, ckpts, capsys, folder):
    """A user trial: ``--out /proc/x.safetensors`` said "No such file or directory:
    '/proc/.x.safetensors.lock'", naming only pact's own lock file. The output is named first."""
    pre, fts = ckpts
    p0 = str(save_state_dict(pre, tmp_path / "p.safetensors"))
    ps = [str(save_state_dict(f, tmp_path / f"f{i}.safetensors")) for i, f in enumerate(fts)]
    out = "/proc/self/" if folder else f"/proc/pact-{os.getpid()}.safetensors"
    assert main(["merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained", p0, "--finetuned", *ps,
                 "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"pact: error: cannot write the output {out.rstrip('/')} (" in err and "lock file" in err, err


@pytest.mark.parametrize("method", ["task_arithmetic", "iso_c"])  # the fast path and the torch path
@pytest.mark.parametrize("folder", [False, True])
def test_a_signal_just_after_the_summary_leaves_a_success(tmp_path, ckpts, monkeypatch, capsys, method, folder):
    """A second user trial: SIGINT within a few ms of the JSON summary (before the run let go of
    its lock) ended a finished, published merge with 130 and "interrupted once the output was
    published". The summary is the last word: signals are ignored from it on, and pact exits 0."""
    from pactlib import cli, command

    pre, fts = ckpts
    p0 = str(save_state_dict(pre, tmp_path / "p.safetensors"))
    ps = [str(save_state_dict(f, tmp_path / f"f{i}.safetensors")) for i, f in enumerate(fts)]
    said = cli.say_merged

    def say_then_signal(summary):
        said(summary)
        os.kill(os.getpid(), signal.SIGINT)  # delivered at once: the handler runs before the next bytecode

    monkeypatch.setattr(cli, "say_merged", say_then_signal)  # the torch path
    monkeypatch.setattr(command, "say_merged", say_then_signal)  # the fast path
    before = signal.getsignal(signal.SIGINT)
    said({"out": "x"})  # outside main (pactlib.fastpath.try_merge called directly): the handlers stay
    assert signal.getsignal(signal.SIGINT) == before and '"out": "x"' in capsys.readouterr().out
    out = f"{tmp_path / 'out'}/" if folder else str(tmp_path / "out.safetensors")
    assert main(["merge", "--method", method, "--alpha", "1", "--pretrained", p0, "--finetuned", *ps,
                 "--out", out]) == 0
    captured = capsys.readouterr()
    assert '"out": ' in captured.out and "interrupted" not in captured.err
    assert signal.getsignal(signal.SIGINT) == before  # the caller's handler is back
