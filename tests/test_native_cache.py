"""The native library cache (pactlib.native.cache) under a broken, replaced or unsafe cache: a
cached library whose bytes are not the ones recorded at its build is rebuilt with one warning and
never loaded, a cache folder others may write to is refused with a warning naming it, and a
compile killed midway leaves nothing the next run keeps. Each case runs ``pact merge`` (or the
loader) in a subprocess of its own cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from pactlib import native
from tests.conftest import make_checkpoints

ROOT = Path(__file__).resolve().parents[1]
CC = native.compiler()
pytestmark = pytest.mark.skipif(CC is None or not sys.platform.startswith("linux"), reason="no C compiler")

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *p = getenv("PLANTED_MARK");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (f) { fputs("ran", f); fclose(f); }
}
int pact_digit_hist_f32(void) { return 0; }
"""


def _env(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CC", native.ENV)}
    return {**env, "PYTHONPATH": str(ROOT), "PACT_CACHE": str(cache), **extra}


def _python(cache: Path, code: str, *flags: str, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], env=_env(cache, **extra), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A cache holding the probed native library and the fast path's (TIES) of the current sources
    (built once)."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    code = "from pactlib import native; from pactlib.fastpath import kernels; import sys; " \
           "sys.exit(0 if kernels.library(native.library()) else 3)"
    r = _python(cache, code)
    assert r.returncode == 0, r.stderr
    return cache


@pytest.fixture
def cache(built, tmp_path) -> Path:
    c = tmp_path / "cache"
    shutil.copytree(built, c)
    return c


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[str, list[str]]:
    d = tmp_path_factory.mktemp("models")
    pre, fts = make_checkpoints(3, seed=0)
    save_file(pre, d / "base.safetensors")
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, d / f"ft{t}.safetensors")
        paths.append(str(d / f"ft{t}.safetensors"))
    return str(d / "base.safetensors"), paths


def _merge(cache: Path, files, out: Path, method: str = "task_arithmetic", **extra) -> subprocess.CompletedProcess:
    base, fts = files
    argv = ["merge", "--method", method, "--alpha", "0.3", "--pretrained", base, "--finetuned", *fts,
            "--out", str(out)]
    return subprocess.run([sys.executable, "-m", "pactlib.cli", *argv], env=_env(cache, **extra),
                          capture_output=True, text=True, timeout=300)


def _library(cache: Path, stem: str = "ties") -> Path:
    (lib,) = (cache / "native").glob(f"{stem}-*.so")
    return lib


def _healed(cache: Path) -> None:
    """The cache now holds a library that loads without torch, without a probe and without any
    warning (its bytes are the recorded ones, and it is marked as probed)."""
    code = "from pactlib import native; import sys; sys.exit(0 if native.compiled() is not None else 3)"
    r = _python(cache, code, "-W", "error")
    assert (r.returncode, r.stderr) == (0, "")


def _torch_bytes(tmp_path: Path, files, method: str = "task_arithmetic") -> bytes:
    out = tmp_path / "torch" / "m.safetensors"
    r = _merge(tmp_path / "unused", files, out, method, **{native.ENV: "0"})
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


def _rebuilt(cache: Path, files, tmp_path: Path, why: str, stem: str = "ties", method: str = "task_arithmetic",
             **extra) -> None:
    """``pact merge`` with the cache as it is: exit 0, the torch path's bytes, exactly one warning
    (the rebuild, naming the library and ``why``), and a healed cache."""
    lib = _library(cache, stem)
    out = tmp_path / "fast" / "m.safetensors"
    r = _merge(cache, files, out, method, **extra)
    assert r.returncode == 0, r.stderr
    warns = [ln for ln in r.stderr.splitlines() if ln.startswith("pact: warning:")]
    assert len(warns) == 1, r.stderr
    assert warns[0].startswith(f"pact: warning: rebuilding the native library {lib}: {why}"), r.stderr
    assert out.read_bytes() == _torch_bytes(tmp_path, files, method)
    _healed(cache)


@pytest.mark.parametrize("stem, method", [("ties", "task_arithmetic"), ("fastpath", "ties")])
def test_a_truncated_library_is_rebuilt_not_loaded(cache, files, tmp_path, stem, method):
    """Truncated to 1,000 bytes (loading it raised SIGBUS): native's library, and the fast path's."""
    lib = _library(cache, stem)
    with open(lib, "r+b") as f:
        f.truncate(1000)
    _rebuilt(cache, files, tmp_path, "its SHA-256 (", stem, method)
    assert _library(cache, stem).stat().st_size > 1000


@pytest.mark.parametrize("content", [os.urandom(36000), b""], ids=["random-bytes", "empty"])
def test_a_library_of_random_bytes_or_empty_is_rebuilt(cache, files, tmp_path, content):
    _library(cache).write_bytes(content)
    _rebuilt(cache, files, tmp_path, "its SHA-256 (")
    assert b"\x7fELF" == _library(cache).read_bytes()[:4]


@pytest.mark.parametrize("mark", ["kept", "removed"])
def test_a_replaced_library_is_never_loaded(cache, files, tmp_path, mark):
    """Another valid library (its constructor would leave a file) in the cached one's place, with
    the probe's mark kept or removed: it is rebuilt, and its code never runs."""
    lib = _library(cache)
    (tmp_path / "planted.c").write_text(PLANTED)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(tmp_path / "planted.so"), str(tmp_path / "planted.c")],
                   check=True)
    os.replace(tmp_path / "planted.so", lib)
    if mark == "removed":
        for m in lib.parent.glob("*.agrees"):
            m.unlink()
    ran = tmp_path / "ran"
    _rebuilt(cache, files, tmp_path, "its SHA-256 (", PLANTED_MARK=str(ran))
    assert not ran.exists()


@pytest.mark.parametrize("mode, who", [(0o777, "its group and other users"), (0o757, "other users"),
                                       (0o775, "its group")])
def test_a_cache_folder_others_may_write_is_refused(cache, files, tmp_path, mode, who):
    folder = cache / "native"
    folder.chmod(mode)
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "m.safetensors"
    r = _merge(cache, files, out, PLANTED_MARK=str(tmp_path / "ran"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"pact: warning: native code not used: the cache folder {folder} is writable "
                                     f"by {who} (mode {mode:o}; chmod go-w it to use native code); the torch "
                                     f"path runs instead"]
    assert out.read_bytes() == _torch_bytes(tmp_path, files)
    assert sorted(p.name for p in folder.iterdir()) == before
    code = "from pactlib import native; import sys; sys.exit(0 if native.library() is None else 3)"
    assert _python(cache, code).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder to another user")
def test_a_cache_folder_of_another_user_is_refused(cache):
    folder = cache / "native"
    os.chown(folder, 54321, -1)
    r = _python(cache, "from pactlib import native; import sys; sys.exit(0 if native.library() is None else 3)")
    assert r.returncode == 0
    assert (f"native code not used: the cache folder {folder} is owned by uid 54321, not by this user (uid 0); "
            f"the torch path runs instead") in r.stderr


def test_a_killed_compile_leaves_nothing_that_lasts(tmp_path):
    """A compile whose process is killed midway leaves its temporary; the next run removes it
    (a warning names it) and builds the library."""
    cache = tmp_path / "cache"
    cc = tmp_path / "killing-cc"
    cc.write_text('#!/bin/sh\nfor a; do [ "$a" = --version ] && exec cc --version; done\n'
                  'prev=; for a; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
                  'printf partial > "$out"\nkill -9 $PPID\nsleep 30\n')
    cc.chmod(0o755)
    r = _python(cache, "from pactlib import native; native.library()", CC=str(cc))
    assert r.returncode == -9
    (temp,) = [p for p in (cache / "native").iterdir()]
    assert temp.read_bytes() == b"partial"
    r = _python(cache, "from pactlib import native; import sys; sys.exit(0 if native.library() else 3)")
    assert r.returncode == 0, r.stderr
    assert f"removed {temp}: the temporary file of a native library build whose process (" in r.stderr
    assert not any(p.name.startswith(".") for p in (cache / "native").iterdir())
    _healed(cache)
