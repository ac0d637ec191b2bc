"""``pact merge`` of Task Arithmetic without torch (pactlib.fastpath): the torch path's bytes,
warnings, errors and JSON line, on real files; torch is never imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pactlib import native
from pactlib.cli import main
from tests.conftest import make_checkpoints

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the fast path is off")


def write(tmp_path, T=3, dtype=torch.float32, seed=0, edit=None):
    pre, fts = make_checkpoints(T, seed=seed, dtype=dtype)
    if edit is not None:
        edit(pre, fts)
    save_file(pre, tmp_path / "base.safetensors")
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    return str(tmp_path / "base.safetensors"), paths


def run(argv, monkeypatch, capsys, *, fast: bool, fallback: bool = False):
    """``pact merge argv``: (exit status, JSON line or None, stderr); ``fast`` False: PACT_NATIVE=0.
    With ``fast`` and not ``fallback``, the torch path must not run."""
    import pactlib.cli

    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    torch_path = pactlib.cli._merge
    if fast and not fallback:
        monkeypatch.setattr(pactlib.cli, "_merge", lambda args: pytest.fail("the torch path ran"))
    try:
        rc = main(["merge", *argv])
    finally:
        monkeypatch.setattr(pactlib.cli, "_merge", torch_path)
    out, err = capsys.readouterr()
    return rc, (json.loads(out.strip().splitlines()[-1]) if rc == 0 else None), err


def both(tmp_path, monkeypatch, capsys, base, fts, *extra, alpha="0.3", fallback=False, method="task_arithmetic"):
    """The same merge by the fast path and by the torch path: (results, bytes of each output)."""
    res, data = [], []
    for fast in (True, False):
        out = tmp_path / ("fast" if fast else "torch") / "merged.safetensors"
        argv = ["--method", method, "--alpha", alpha, "--pretrained", base, "--finetuned", *fts,
                "--out", str(out), *extra]
        res.append(run(argv, monkeypatch, capsys, fast=fast, fallback=fallback))
        data.append(sorted((f.name, f.read_bytes()) for f in out.parent.iterdir()) if out.parent.exists() else [])
    return res, data


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fast_path_writes_the_torch_paths_bytes(tmp_path, monkeypatch, capsys, dtype):
    base, fts = write(tmp_path, T=4, dtype=dtype)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts)
    assert fast[0] == slow[0] == 0 and a == b and len(a) == 1
    assert {**fast[1], "out": None, "files": None} == {**slow[1], "out": None, "files": None}
    merged = __import__("safetensors.torch", fromlist=["load_file"]).load_file(fast[1]["out"])
    assert merged["bn.num_batches_tracked"].item() == 7 and merged["lin.weight"].dtype == dtype


def test_sharded_output_and_its_index_are_the_same_files(tmp_path, monkeypatch, capsys):
    base, fts = write(tmp_path, T=2)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts, "--max-shard-size", "600")
    assert fast[0] == slow[0] == 0 and a == b and len(a) > 2
    assert fast[1]["out"].endswith(".index.json")


@pytest.mark.parametrize("folder", [False, True])
def test_merge_runs_without_torch(tmp_path, folder):
    base, fts = write(tmp_path, T=3)
    out = tmp_path / ("merged/" if folder else "merged.safetensors")
    code = ("import sys; sys.modules['torch'] = None\n"  # any import of torch fails
            "from pactlib.cli import main\n"
            f"sys.exit(main(['merge', '--method', 'task_arithmetic', '--alpha', '0.5', '--pretrained', {base!r}, "
            f"'--finetuned', *{fts!r}, '--out', {str(out) + ('/' if folder else '')!r}]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), native.ENV: "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from pactlib import merge

    pre, fts_sd = make_checkpoints(3)
    want = merge("task_arithmetic", pre, fts_sd, alpha=0.5)
    got = __import__("safetensors.torch", fromlist=["load_file"]).load_file(out / "model.safetensors" if folder
                                                                             else out)
    assert all(torch.equal(got[k], want[k]) for k in want)
    if folder:  # the model folder: weights, recipe and card (θ0 is a file: no support files)
        assert json.loads(proc.stdout.strip().splitlines()[-1])["folder"] == str(out)
        assert {f.name for f in out.iterdir()} == {"model.safetensors", "pact_recipe.yaml", "README.md"}


def test_identical_and_all_zero_task_vectors_warn_alike(tmp_path, monkeypatch, capsys):
    def edit(pre, fts):
        fts[2].update({k: v.clone() for k, v in fts[0].items()})
        fts[1].update({k: v.clone() for k, v in pre.items()})

    base, fts = write(tmp_path, T=3, edit=edit)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts)
    assert a == b and fast[2] == slow[2]
    assert "is all zero" in fast[2] and "ft1.safetensors" in fast[2]
    assert "ft0.safetensors' and '" in fast[2] and "are identical" in fast[2]


@pytest.mark.parametrize("problem", ["nan", "overflow"])
def test_a_value_that_is_not_finite_gives_the_torch_paths_error(tmp_path, monkeypatch, capsys, problem):
    def edit(pre, fts):
        if problem == "nan":
            fts[1]["head.weight"][2, 3] = float("nan")
        else:
            fts[0]["lin.bias"][0] = 60000.0
            fts[1]["lin.bias"][0] = 60000.0

    base, fts = write(tmp_path, T=2, dtype=torch.float32 if problem == "nan" else torch.float16, edit=edit)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts, alpha="1.0", fallback=True)
    assert fast[0] == slow[0] == 2 and fast[2] == slow[2] and a == b == []
    assert ("head.weight" in fast[2] and "ft1" in fast[2]) if problem == "nan" else "lin.bias" in fast[2]
    assert not list(tmp_path.glob("fast/.*"))  # no temporary file or lock left behind


def test_what_it_does_not_take_goes_to_the_torch_path(tmp_path, monkeypatch, capsys):
    from pactlib import fastpath
    from pactlib.cli import build_parser

    base, fts = write(tmp_path, T=2)
    out = str(tmp_path / "m.safetensors")
    parse = lambda *a: build_parser(plugins=False).parse_args(["merge", "--pretrained", base, "--out", out, *a])
    monkeypatch.setenv(native.ENV, "1")
    assert fastpath.plan(parse("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts)) is not None
    assert fastpath.plan(parse("--method", "ties", "--alpha", "1", "--finetuned", *fts, "--set", "k=30")) is not None
    assert fastpath.plan(parse("--method", "ties", "--alpha", "1", "--finetuned", *fts, "--set", "scope=per_key"))
    with monkeypatch.context() as m:
        m.setattr(fastpath, "_libc", None)  # not a POSIX system: no mmap(2) of a range
        assert fastpath.plan(parse("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts)) is None
    for refused in (("--method", "ties", "--alpha", "1", "--finetuned", *fts, "--set", "scope=both"),
                    ("--method", "ties", "--alpha", "1", "--finetuned", *fts, "--set", "k=0"),
                    ("--method", "ties", "--alpha", "1", "--finetuned", *fts, "--set", "other=1"),
                    ("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts, "--set", "k=1"),
                    ("--method", "tsv_m", "--alpha", "1", "--finetuned", *fts),
                    ("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts, "--pact", "pact"),
                    ("--method", "task_arithmetic", "--alpha", "nan", "--finetuned", *fts),
                    ("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts, "--device", "cuda"),
                    ("--method", "task_arithmetic", "--alpha", "1", "--finetuned", base + ".missing")):
        assert fastpath.plan(parse(*refused)) is None, refused
    # a shape mismatch: the torch path names it
    pre, bad = make_checkpoints(1)
    bad[0]["head.weight"] = torch.zeros(4, 8)
    save_file(bad[0], tmp_path / "bad.safetensors")
    assert fastpath.plan(parse("--method", "task_arithmetic", "--alpha", "1", "--finetuned",
                               str(tmp_path / "bad.safetensors"))) is None
    monkeypatch.setenv(native.ENV, "0")
    assert fastpath.plan(parse("--method", "task_arithmetic", "--alpha", "1", "--finetuned", *fts)) is None


def test_keys_longer_than_a_block_are_merged_block_by_block(tmp_path, monkeypatch, capsys):
    from pactlib import fastpath

    def edit(pre, fts):  # keys of 4000 and 5003 entries: four and five blocks of 1024
        g = torch.Generator().manual_seed(3)
        pre["emb.weight"], pre["odd.bias"] = torch.randn(160, 25, generator=g), torch.randn(5003, generator=g)
        for ft in fts:
            ft["emb.weight"] = pre["emb.weight"] + 0.01 * torch.randn(160, 25, generator=g)
            ft["odd.bias"] = pre["odd.bias"] + 0.01 * torch.randn(5003, generator=g)

    monkeypatch.setattr(fastpath, "BUDGET_BYTES", 1)
    base, fts = write(tmp_path, T=5, dtype=torch.bfloat16, edit=edit)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts)
    assert fast[0] == slow[0] == 0 and a == b


def test_importing_pactlib_and_its_cli_does_not_import_torch():
    code = "import sys, pactlib, pactlib.cli, pactlib.fastpath; assert 'torch' not in sys.modules, 'torch'; " \
           "pactlib.TaskVector; assert 'torch' in sys.modules"  # the public names load on first use
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr



def quantized(pre, fts):
    """Task vectors of few distinct magnitudes: many ties at every threshold, across keys and blocks."""
    g = torch.Generator().manual_seed(11)
    for ft in fts:
        for k, v in pre.items():
            if v.is_floating_point():
                ft[k] = v + (torch.randint(-3, 4, v.shape, generator=g) * 0.125).to(v.dtype)
    pre["big.weight"] = torch.randn(700, 30, generator=g).to(pre["lin.weight"].dtype)  # 21,000 entries
    for ft in fts:
        ft["big.weight"] = pre["big.weight"] + (torch.randint(-2, 3, (700, 30), generator=g) * 0.25).to(
            pre["big.weight"].dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,budget,workers", [(20, None, "1"), (35, 1, "3"), (35, None, "2"), (100, None, "2")])
@pytest.mark.parametrize("scope", ["global", "per_key"])
def test_ties_writes_the_torch_paths_bytes(tmp_path, monkeypatch, capsys, dtype, k, budget, workers, scope):
    from pactlib import fastpath

    if budget is not None:  # blocks of 1024 entries: thresholds' ties cut across blocks and keys
        monkeypatch.setattr(fastpath, "BUDGET_BYTES", budget)
    split = []  # blocks whose column parts start from ties counted in the parts before them
    starts = fastpath._Left.starts
    monkeypatch.setattr(fastpath._Left, "starts", lambda self, counts: (split.append(any(counts)),
                                                                        starts(self, counts))[1])
    base, fts = write(tmp_path, T=5, dtype=dtype, edit=quantized if k != 100 else None)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts, "--set", f"k={k}", f"scope={scope}",
                                "--workers", workers, method="ties")
    assert fast[0] == slow[0] == 0 and a == b
    assert {**fast[1], "out": None, "files": None} == {**slow[1], "out": None, "files": None}
    assert fast[1]["params"] == {"k": k, "scope": scope}
    assert any(split) == (k == 35)  # k = 20: one worker (one part); k = 100: every tie kept


@pytest.mark.parametrize("scope", ["global", "per_key"])
def test_ties_warns_and_refuses_alike(tmp_path, monkeypatch, capsys, scope):
    def edit(pre, fts):
        fts[2].update({k: v.clone() for k, v in fts[0].items()})

    base, fts = write(tmp_path, T=3, edit=edit)
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, base, fts, "--set", f"scope={scope}", method="ties")
    assert a == b and fast[2] == slow[2] and "are identical" in fast[2]

    def nan(pre, fts):
        fts[1]["head.weight"][1, 1] = float("nan")

    (tmp_path / "nan").mkdir()
    base, fts = write(tmp_path / "nan", T=3, edit=nan)
    (fast, slow), (a, b) = both(tmp_path / "nan", monkeypatch, capsys, base, fts, "--set", f"scope={scope}",
                                method="ties", fallback=True)
    assert fast[0] == slow[0] == 2 and fast[2] == slow[2] and "head.weight" in fast[2] and a == b == []


def test_trim_count_is_the_torch_paths():
    from pactlib import fastpath
    from pactlib.merges.ties import trim_count as torch_trim_count
    from pactlib.streaming import CHUNK_BYTES

    for n, k in ((1, 20.0), (7, 20.0), (10**9 + 7, 33.3), (12345, 100.0), (99, 0.5)):
        assert fastpath.trim_count(n, k) == torch_trim_count(n, k)
    assert fastpath.TORCH_CHUNK_BYTES == CHUNK_BYTES


@pytest.mark.parametrize("method", ["task_arithmetic", "ties"])
def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, capsys, method):
    from pactlib.lazy import CheckpointWriter

    base, fts = write(tmp_path, T=3)
    (tmp_path / "out").mkdir()
    seen = []

    def full_disk(self, key, data):
        seen.append(key)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(CheckpointWriter, "write_bytes", full_disk)
    rc, _, err = run(["--method", method, "--alpha", "0.3", "--pretrained", base, "--finetuned", *fts,
                      "--out", str(tmp_path / "out" / "m.safetensors")], monkeypatch, capsys, fast=True)
    assert rc == 2 and "No space left" in err and seen
    assert list((tmp_path / "out").iterdir()) == []  # no output, no temporary file, no lock


def test_the_fast_paths_loops_are_checked_against_native_ones(tmp_path, monkeypatch, capsys):
    """kernels.c's loops pass their probe against pactlib.native's; a loop that miscounts one tie
    fails it, and TIES then runs the torch path (same bytes)."""
    from pactlib import fastpath
    from pactlib.cli import build_parser
    from pactlib.fastpath import kernels

    base = native.compiled() or native.library()
    lib = kernels.library(base)
    assert lib is not None and kernels._agrees(lib, base)

    class OffByOne:
        def __getattr__(self, name):
            return getattr(lib, name)

        def pact_count_ties(self, *args):
            return lib.pact_count_ties(*args) + 1

    assert not kernels._agrees(OffByOne(), base)
    monkeypatch.setattr(kernels, "_lib", [None])  # as when the check failed
    monkeypatch.setenv(native.ENV, "1")
    pre, fts = write(tmp_path, T=3)
    args = build_parser(plugins=False).parse_args(["merge", "--method", "ties", "--alpha", "1", "--pretrained", pre,
                                                   "--finetuned", *fts, "--out", str(tmp_path / "x.safetensors")])
    assert fastpath.plan(args) is None
    (fast, slow), (a, b) = both(tmp_path, monkeypatch, capsys, pre, fts, method="ties", fallback=True)
    assert fast[0] == slow[0] == 0 and a == b


def test_the_method_entries_are_the_registrys():
    """fastpath.METHODS (what a folder output's card and recipe need, without torch) equals the
    merge methods' registry."""
    from pactlib import fastpath, merges

    for name, entry in fastpath.METHODS.items():
        m = merges.get(name)
        assert (entry.params, entry.pretty, entry.reference) == (m.params, m.pretty, m.reference), name


@pytest.mark.parametrize("method,extra", [("task_arithmetic", ()), ("ties", ("--set", "k=35", "scope=per_key")),
                                          ("ties", ("--max-shard-size", "200B"))])
def test_a_folder_output_is_the_torch_paths_folder(tmp_path, monkeypatch, capsys, method, extra):
    """``--out DIR/`` on the fast path: the torch path's model folder byte for byte (weights, the
    base folder's config and tokenizer files, recipe, card), the same JSON line; torch not run.
    ``--config`` of its recipe gives the same folder, on the fast path too."""
    pre, fts = make_checkpoints(3, seed=5)
    base = tmp_path / "base"
    base.mkdir()
    save_file(pre, base / "model.safetensors")
    (base / "config.json").write_text('{"model_type": "toy"}\n')
    (base / "tokenizer.json").write_text('{"version": "1.0"}\n')
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    results, folders = [], []
    for fast in (True, False):
        out = tmp_path / ("fast" if fast else "torch") / "merged"
        argv = ["--method", method, "--alpha", "0.4", "--pretrained", str(base), "--finetuned", *paths,
                "--out", f"{out}/", *extra]
        rc, line, err = run(argv, monkeypatch, capsys, fast=fast)
        assert rc == 0, err
        results.append({**line, "out": Path(line["out"]).name, "folder": Path(line["folder"]).name,
                        "files": sorted(Path(f).name for f in line["files"])})
        folders.append(sorted((f.name, f.read_bytes()) for f in out.iterdir()))
    assert results[0] == results[1] and folders[0] == folders[1]
    names = [n for n, _ in folders[0]]
    assert {"config.json", "tokenizer.json", "README.md", "pact_recipe.yaml"} <= set(names)
    sharded = "--max-shard-size" in extra
    assert ("model.safetensors.index.json" in names) == sharded and ("model.safetensors" in names) != sharded
    card = dict(folders[0])["README.md"].decode()  # names the weight files written (staged before them)
    weights = [n for n in names if n.endswith(".safetensors")]
    assert len(weights) > sharded and f"Weights: {', '.join(f'`{n}`' for n in weights)}." in card
    again = tmp_path / "again"  # the recipe replayed, on the fast path too: the same folder
    rc, line, err = run(["--config", str(tmp_path / "fast" / "merged" / "pact_recipe.yaml"), "--out", f"{again}/"],
                        monkeypatch, capsys, fast=True)
    assert rc == 0, err
    assert sorted((f.name, f.read_bytes()) for f in again.iterdir()) == folders[0]


@pytest.mark.parametrize("broken", ["unreadable", "dangling", "folder"])
@pytest.mark.parametrize("fast", [True, False])
def test_a_folder_whose_support_file_fails_is_left_as_it_was(tmp_path, monkeypatch, capsys, fast, broken):
    """A support file of θ0's folder that cannot be read (an I/O error), or a name there that is
    not a regular file, fails the merge naming it, after the weights are written and before they
    are published: the folder this run created is removed, and an existing folder keeps what it
    held, byte for byte (an earlier merge's weights included), with no new file and no temporary
    one, on both paths."""
    pre, fts = make_checkpoints(2, seed=3)
    base = tmp_path / "base"
    base.mkdir()
    save_file(pre, base / "model.safetensors")
    (base / "config.json").write_text("{}")
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    argv = ["--method", "task_arithmetic", "--alpha", "0.5", "--pretrained", str(base), "--finetuned", *paths]
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    (tmp_path / "old").mkdir()
    assert main(["merge", *argv[:3], "0.25", *argv[4:], "--out", f"{tmp_path / 'old'}/"]) == 0  # an earlier merge
    (tmp_path / "old" / "keep.txt").write_text("mine")
    before = {f.name: f.read_bytes() for f in (tmp_path / "old").iterdir()}
    capsys.readouterr()
    (base / "config.json").unlink()
    if broken == "unreadable":
        (base / "config.json").symlink_to("/proc/self/mem")  # a regular file whose reads fail (EIO)
        said = "cannot read the pre-trained folder's config.json"
    elif broken == "dangling":
        (base / "config.json").symlink_to(base / "gone.json")
        said = "config.json: not a regular file"
    else:
        (base / "config.json").mkdir()
        said = "config.json: not a regular file"
    assert main(["merge", *argv, "--out", f"{tmp_path / 'new'}/"]) != 0
    assert said in capsys.readouterr().err and not (tmp_path / "new").exists()
    assert main(["merge", *argv, "--out", f"{tmp_path / 'old'}/"]) != 0
    assert said in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in (tmp_path / "old").iterdir()} == before
    assert {"model.safetensors", "config.json", "pact_recipe.yaml", "README.md", "keep.txt"} == set(before)


def _folder_inputs(tmp_path, support=("config.json", "tokenizer.json"), name="base", seed=3):
    pre, fts = make_checkpoints(2, seed=seed)
    base = tmp_path / name
    base.mkdir()
    save_file(pre, base / "model.safetensors")
    for n in support:
        (base / n).write_text(f'{{"from": "{name}"}}\n')
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"{name}_ft{t}.safetensors")
        paths.append(str(tmp_path / f"{name}_ft{t}.safetensors"))
    return ["--method", "task_arithmetic", "--alpha", "0.5", "--pretrained", str(base), "--finetuned", *paths]


#: `pact merge` in a child process that sends itself SIGTERM when it first calls argv[1]
#: ("module:Class.method"), before the call
_SIGNAL_AT = """
import importlib, os, signal, sys
where, name = sys.argv[1].split(":")
cls, meth = name.split(".")
owner = getattr(importlib.import_module(where), cls)
original = getattr(owner, meth)
def signalled(*a, **k):
    if not getattr(signalled, "sent", False):
        signalled.sent = True
        os.kill(os.getpid(), signal.SIGTERM)
    return original(*a, **k)
setattr(owner, meth, signalled)
from pactlib.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _signalled_run(at: str, argv: list, fast: bool) -> subprocess.CompletedProcess:
    import signal

    return subprocess.run([sys.executable, "-c", _SIGNAL_AT, at, *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, native.ENV: "1" if fast else "0"},
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))


@pytest.mark.parametrize("at", ["pactlib.io:StreamedFile.publish",  # between the weights and the card
                                "pactlib.recipe:FolderFiles.__exit__"])  # just after all is published
@pytest.mark.parametrize("earlier", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_a_signal_while_a_folder_is_published_stops_the_run_once_it_is_whole(tmp_path, monkeypatch, capsys,
                                                                              fast, earlier, at):
    """SIGTERM between the weights' rename and the card's is held until the whole folder is
    published; one just after it is published stops the run there. Either way the folder is
    the one a run without the signal writes, byte for byte (an earlier merge's folder replaced
    whole, a new folder not removed), the run exits 143 and says the output was published,
    naming its files."""
    argv = _folder_inputs(tmp_path)
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    ref = tmp_path / "ref"
    assert main(["merge", *argv, "--out", f"{ref}/"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    if earlier:  # an earlier merge into the folder, at another α
        assert main(["merge", *argv[:3], "0.25", *argv[4:], "--out", f"{out}/"]) == 0
    proc = _signalled_run(at, ["merge", *argv, "--out", f"{out}/"], fast)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert "pact: terminated (SIGTERM) once the output was published, whole: " in proc.stderr
    assert str(out / "model.safetensors") in proc.stderr and str(out / "README.md") in proc.stderr
    assert "Traceback" not in proc.stderr
    files = sorted((f.name, f.read_bytes()) for f in out.iterdir())
    assert files == sorted((f.name, f.read_bytes()) for f in ref.iterdir())
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "pact_recipe.yaml"} == set(dict(files))


def test_a_signal_while_a_spill_file_is_published_publishes_no_output(tmp_path):
    """TIES with PACT spills its filtered task vectors to a file of its own, published by a
    checkpoint writer too: a SIGTERM then is not "the output published". The run says no
    output was published and removes the folder it made."""
    argv = _folder_inputs(tmp_path)
    argv[1], argv[3] = "ties", "0.7"
    out = tmp_path / "sub" / "out"
    proc = _signalled_run("pactlib.io:StreamedFile.publish",
                          ["merge", *argv, "--pact", "pact", "--out", f"{out}/"], fast=False)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert "no output was published" in proc.stderr and not (tmp_path / "sub").exists()


@pytest.mark.parametrize("fast", [True, False])
def test_support_files_of_an_earlier_base_are_removed_from_a_reused_folder(tmp_path, monkeypatch, capsys, fast):
    """A folder merged from a θ0 with a tokenizer, merged again from a θ0 without one: the earlier
    tokenizer goes (with a warning naming it), config.json is the new θ0's, a user's own file
    stays. Then an open_clip θ0 (weights `open_clip_model.safetensors`): the earlier weights and
    config go. Back from a θ0 that is one file: the open_clip config goes (it names weights the
    folder no longer has). A θ0 that is one file, not a folder, leaves the other support files
    as they are."""
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    first = _folder_inputs(tmp_path, ("config.json", "tokenizer.json", "vocab.txt"), name="a")
    second = _folder_inputs(tmp_path, ("config.json",), name="b", seed=4)
    out = tmp_path / "out"
    assert main(["merge", *first, "--out", f"{out}/"]) == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["merge", *second, "--out", f"{out}/"]) == 0
    err = capsys.readouterr().err
    assert "removed tokenizer.json, which this merge does not write" in err and "removed vocab.txt" in err
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "notes.txt",
                                                     "pact_recipe.yaml"]
    assert (out / "config.json").read_text() == '{"from": "b"}\n'
    clip = _folder_inputs(tmp_path, ("open_clip_config.json",), name="c", seed=5)  # other weights' name
    (out / ".tokenizer.json.abcd1234.tmp").write_text("left by a killed run")
    assert main(["merge", *clip, "--out", f"{out}/"]) == 0
    err = capsys.readouterr().err
    assert "removed model.safetensors, which this merge does not write" in err and "removed config.json" in err
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "notes.txt", "open_clip_config.json",
                                                     "open_clip_model.safetensors", "pact_recipe.yaml"]
    __import__("shutil").copyfile(tmp_path / "b" / "model.safetensors", tmp_path / "b.safetensors")  # no folder's
    single = [*second[:5], str(tmp_path / "b.safetensors"), *second[6:]]
    assert main(["merge", *single, "--out", f"{out}/"]) == 0  # and back, from one file: no open_clip config left
    assert "removed open_clip_config.json" in capsys.readouterr().err
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "model.safetensors", "notes.txt", "pact_recipe.yaml"]
    assert main(["merge", *second[:5], str(tmp_path / "b"), *second[6:], "--out", f"{out}/"]) == 0
    capsys.readouterr()
    (out / "tokenizer.json").write_text("put back by hand")
    assert main(["merge", *single, "--out", f"{out}/"]) == 0
    assert "removed" not in capsys.readouterr().err
    assert (out / "tokenizer.json").read_text() == "put back by hand" and (out / "config.json").is_file()


@pytest.mark.parametrize("fast", [True, False])
def test_a_folder_output_is_held_whole_by_one_run(tmp_path, monkeypatch, capsys, fast):
    """While one run holds a model folder, a second into it fails naming the first, whatever
    weight names its θ0 would give (the lock is the folder's, not its weight files'), and
    leaves the folder as it was."""
    from pactlib.lazy import output_lock

    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = _folder_inputs(tmp_path)
    out = tmp_path / "out"
    assert main(["merge", *argv, "--out", f"{out}/"]) == 0
    before = sorted((f.name, f.read_bytes()) for f in out.iterdir())
    capsys.readouterr()
    (tmp_path / "link").symlink_to(out)
    with output_lock(out, folder=True) as lock:
        assert lock == out / ".pact-merge.lock"
        assert main(["merge", *argv[:3], "0.25", *argv[4:], "--out", f"{out}/"]) == 2
        err = capsys.readouterr().err
        assert f"{out}: another run is writing this output (process {os.getpid()}" in err
        assert main(["merge", *argv[:3], "0.25", *argv[4:], "--out", f"{tmp_path / 'link'}/"]) == 2  # the same folder
        assert "another run is writing this output" in capsys.readouterr().err
        new = tmp_path / "new"  # a folder another run has just made: not removed
        new.mkdir()
        with output_lock(new, folder=True):
            assert main(["merge", *argv, "--out", f"{new}/"]) == 2
            assert new.is_dir()
    assert sorted((f.name, f.read_bytes()) for f in out.iterdir()) == before


@pytest.mark.parametrize("fast", [True, False])
def test_a_failed_folder_merge_removes_the_parents_it_made(tmp_path, monkeypatch, capsys, fast):
    """A folder output in folders that do not exist yet, refused after they were made (a bad
    α): the folder and the parents the run made are gone, the ones that were there stay."""
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = _folder_inputs(tmp_path)
    (tmp_path / "q").mkdir()
    assert main(["merge", *argv[:3], "nan", *argv[4:], "--out", f"{tmp_path / 'q' / 'r' / 's' / 'out'}/"]) == 2
    assert "alpha" in capsys.readouterr().err
    assert (tmp_path / "q").is_dir() and list((tmp_path / "q").iterdir()) == []


@pytest.mark.parametrize("fast", [True, False])
def test_a_folder_output_named_dot_is_the_working_folder(tmp_path, monkeypatch, capsys, fast):
    """``--out ./`` (run inside the folder to fill) writes the model folder there; its lock is
    ``.NAME.lock`` beside it, removed after."""
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = _folder_inputs(tmp_path)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert main(["merge", *argv, "--out", "./"]) == 0, capsys.readouterr().err
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "pact_recipe.yaml"} == \
        {f.name for f in Path().iterdir()}


@pytest.mark.parametrize("fast", [True, False])
def test_a_failed_run_leaves_a_folder_another_run_took_since(tmp_path, monkeypatch, capsys, fast):
    """A run that made the folder and failed empties it while it still holds the lock, keeps
    its lock file until it lets go, and then removes the folder only if it is empty: another
    run that took the folder's lock in between (its lock file in the folder) keeps the folder
    and its lock."""
    import contextlib

    from pactlib import lazy

    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = _folder_inputs(tmp_path)
    out = tmp_path / "out"
    real = lazy.output_lock

    @contextlib.contextmanager
    def then_another(path, **kw):
        try:
            with real(path, **kw) as lock:
                try:
                    yield lock
                finally:
                    seen.append(sorted(f.name for f in out.iterdir()))  # as the failed run lets go
        finally:
            (out / lazy.FOLDER_LOCK).write_text("4242\n")  # another run takes the folder as this one lets go

    seen = []

    monkeypatch.setattr(lazy, "output_lock", then_another)
    assert main(["merge", *argv[:3], "nan", *argv[4:], "--out", f"{out}/"]) == 2
    assert seen == [[lazy.FOLDER_LOCK]]  # emptied, all but its lock
    assert [f.name for f in out.iterdir()] == [lazy.FOLDER_LOCK] and (out / lazy.FOLDER_LOCK).read_text() == "4242\n"


@pytest.mark.parametrize("fast", [True, False])
def test_a_signal_before_the_folder_is_held_removes_the_folders_made(tmp_path, monkeypatch, capsys, fast):
    """Ctrl-C while the run takes the folder's lock, in folders it made: they are all removed."""
    from pactlib import lazy

    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    argv = _folder_inputs(tmp_path)

    def interrupted(path, **kw):
        raise KeyboardInterrupt()

    monkeypatch.setattr(lazy, "output_lock", interrupted)
    assert main(["merge", *argv, "--out", f"{tmp_path / 'q' / 'r' / 's'}/"]) == 130
    assert "no output was published" in capsys.readouterr().err and not (tmp_path / "q").exists()


@pytest.mark.parametrize("fast", [True, False])
def test_what_a_killed_run_left_for_the_other_weights_name_is_removed(tmp_path, monkeypatch, capsys, fast):
    """A run killed (SIGKILL) while writing `model.safetensors` into a new folder leaves its
    temporary file and lock file; a merge there from an open_clip θ0 (whose weights are
    `open_clip_model.safetensors`) removes both."""
    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    clip = _folder_inputs(tmp_path, ("open_clip_config.json",), name="c")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".model.safetensors.k1ll3d00.tmp").write_bytes(b"\0" * 100)
    (out / ".model.safetensors.lock").write_text("1234\n")
    assert main(["merge", *clip, "--out", f"{out}/"]) == 0
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "open_clip_config.json",
                                                     "open_clip_model.safetensors", "pact_recipe.yaml"]
