"""The filtered-layer cache of the clip testbed (issue 15): reports as JSON + safetensors (no
pickle), read back equal, a corrupted or foreign file named in a FilterCacheError; the folder
bounded (least recently used entries deleted, entries in use kept). Tiny random-init open_clip
models (the fixtures of test_clip_testbed)."""
from __future__ import annotations

import gc
import json
import os
import time

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from pactlib import testbeds  # noqa: E402
from pactlib.pact import PactOptions, pact_filter  # noqa: E402
from pactlib.taskvector import TaskVector  # noqa: E402
from pactlib.testbeds import base, lazy_vectors as lv  # noqa: E402
from pactlib.testbeds.lazy_vectors import FilterCacheError, load_report, prune_cache, save_report  # noqa: E402
from test_clip_testbed import _define, files  # noqa: E402,F401  (files: a fixture)


@pytest.fixture
def tb(files, tmp_path):  # noqa: F811
    _define("clip-fcache", files, cache_dir=str(tmp_path / "cache"))
    yield testbeds.load("clip-fcache", 0)
    testbeds.undefine("clip-fcache")


def _fresh():
    return testbeds.load("clip-fcache", 0)


def _in_memory(tb):
    return [TaskVector.from_checkpoints(tb.pretrained, dict(tb.finetuned[t]), name=t) for t in tb.tasks]


def _same_report(a, b):
    assert a.mode == b.mode and [lr.__dict__ for lr in a.layers] == [lr.__dict__ for lr in b.layers]
    assert list(a.shields) == list(b.shields) and list(a.subspaces) == list(b.subspaces)
    for k in b.shields:
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a.shields[k], b.shields[k]))
        sa, sb = a.subspaces[k], b.subspaces[k]
        assert torch.equal(sa.core, sb.core) and all(torch.equal(x, y) for x, y in zip(sa.active, sb.active))
        assert all(torch.equal(x.basis, y.basis) and torch.equal(x.sigma, y.sigma) for x, y in zip(sa.lbw, sb.lbw))


@pytest.mark.parametrize("mode", ["pact", "s-pact"])
def test_report_round_trip_without_pickle(tb, mode, tmp_path, monkeypatch):
    opts = PactOptions()
    _, want = pact_filter(tb.pretrained, _in_memory(tb), mode=mode, options=opts, rule=tb.rule, keep=True)
    path = save_report(want, tmp_path / "r.keep.json")
    assert path.is_file() and (tmp_path / "r.keep.safetensors").is_file()
    doc = json.loads(path.read_text())
    assert doc["format"] == "pactlib.filtered-report" and doc["mode"] == mode
    no_pickle = lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled"))  # noqa: E731
    monkeypatch.setattr(torch, "load", no_pickle)
    got = load_report(path, mode=mode, options=opts)
    _same_report(got, want)
    assert load_report(path).options == opts  # options rebuilt from the file
    if mode == "s-pact":  # one static shield for every task, stored once
        k = next(iter(want.shields))
        assert len(doc["shields"][k]) == 2 and len(set(doc["shields"][k])) == 1
    plain = save_report(pact_filter(tb.pretrained, _in_memory(tb), mode=mode, rule=tb.rule)[1], tmp_path / "p.json")
    assert json.loads(plain.read_text())["tensors"] is None and not (tmp_path / "p.safetensors").exists()
    assert [lr.__dict__ for lr in load_report(plain).layers] == [lr.__dict__ for lr in want.layers]
    # a cached read through the testbed does not unpickle either, and equals pact_filter
    monkeypatch.undo()
    _, first = base.filtered(tb, mode, opts, keep=True)
    _same_report(first, want)
    other = _fresh()
    other.pretrained, other.task_vectors()  # the testbed's own files read (θ0 may be a .pt)
    monkeypatch.setattr(torch, "load", no_pickle)
    _, again = base.filtered(other, mode, opts, keep=True)
    _same_report(again, want)


def test_corrupted_or_foreign_report_is_named(tb, tmp_path):
    p = tmp_path / "x.json"
    for text, match in (("{not json", "not a readable"), ('{"a": 1}', "not a pactlib filtered-layer report"),
                        (json.dumps({"format": "pactlib.filtered-report", "version": 99}), "report version 99"),
                        (json.dumps({"format": "pactlib.filtered-report", "version": 1, "mode": "pact"}),
                         "malformed")):
        p.write_text(text)
        with pytest.raises(FilterCacheError, match=match) as e:
            load_report(p)
        assert str(p) in str(e.value)
    torch.save({"evil": 1}, p)  # a pickle where the JSON should be
    with pytest.raises(FilterCacheError, match="not a readable") as e:
        load_report(p)
    assert str(p) in str(e.value)
    with pytest.raises(FilterCacheError, match="mode 'pact', not 's-pact'"):
        load_report(save_report(pact_filter(tb.pretrained, _in_memory(tb), rule=tb.rule)[1], p), mode="s-pact")
    _, rep = pact_filter(tb.pretrained, _in_memory(tb), rule=tb.rule, keep=True)
    q = save_report(rep, tmp_path / "k.json")
    (tmp_path / "k.safetensors").write_bytes(b"garbage")
    with pytest.raises(FilterCacheError, match="malformed") as e:
        load_report(q)
    assert str(q) in str(e.value)
    doc = json.loads(q.read_text())
    doc["tensors"] = "../elsewhere.safetensors"
    q.write_text(json.dumps(doc))
    with pytest.raises(FilterCacheError, match="outside the report's folder"):
        load_report(q)


def test_a_corrupted_cache_entry_is_an_error_naming_it(tb):
    base.filtered(tb, "pact")
    folder = tb.cache_dir / "filtered"
    report = next(folder.glob("*.report.json"))
    report.write_text("garbage")
    with pytest.raises(FilterCacheError, match="delete it to filter again") as e:
        base.filtered(_fresh(), "pact")
    assert str(report) in str(e.value)
    report.unlink()  # deleting it: filtered again, then read
    base.filtered(_fresh(), "pact")
    layers = report.with_name(report.name.replace(".report.json", ".safetensors"))
    layers.write_bytes(b"\0" * 64)
    with pytest.raises(FilterCacheError) as e:
        base.filtered(_fresh(), "pact")
    assert str(layers) in str(e.value)


def _entry(folder, i, size, age):
    name = f"{i:040x}"
    f = folder / f"{name}.safetensors"
    f.write_bytes(b"x" * size)
    (folder / f"{name}.report.json").write_text("{}")
    t = time.time() - age
    for g in folder.glob(f"{name}.*"):
        os.utime(g, (t, t))
    return name


def test_prune_cache_keeps_the_most_recently_used_within_the_bound(tmp_path):
    names = [_entry(tmp_path, i, 1000, age=100 - i) for i in range(5)]  # names[4] newest
    (tmp_path / ".timed-x").mkdir()
    (tmp_path / ".tmpfile.tmp").write_bytes(b"y" * 10_000)
    (tmp_path / "README").write_text("not an entry")
    fd = lv._hold(tmp_path, names[1])  # in use (e.g. by another process): never deleted
    try:
        gone = prune_cache(tmp_path, 2500, keep=[names[0]])
    finally:
        os.close(fd)
    assert gone == [names[2], names[3]]  # names[0] kept (asked), names[4] newest (fits), names[1] in use
    left = {f.name.split(".")[0] for f in tmp_path.iterdir() if not f.name.startswith(".")}
    assert left == {names[0], names[1], names[4], "README"}
    assert (tmp_path / ".timed-x").is_dir() and (tmp_path / ".tmpfile.tmp").is_file()
    assert prune_cache(tmp_path, float("inf")) == []
    assert prune_cache(tmp_path, 0) == [names[0], names[1], names[4]]
    with pytest.raises(ValueError, match="must be >= 0"):
        prune_cache(tmp_path, -1)


def test_the_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(lv.CACHE_ENV, raising=False)
    assert lv.cache_limit() == lv.DEFAULT_CACHE_GB * 1e9
    monkeypatch.setenv(lv.CACHE_ENV, "0.5")
    assert lv.cache_limit() == 5e8 and lv.cache_limit(7) == 7.0
    monkeypatch.setenv(lv.CACHE_ENV, "inf")
    assert lv.cache_limit() == float("inf")
    monkeypatch.setenv(lv.CACHE_ENV, "lots")
    with pytest.raises(ValueError, match="PACT_FILTERED_CACHE_GB='lots'"):
        lv.cache_limit()


def test_a_sweep_of_options_stays_bounded_and_entries_in_use_survive(tb, monkeypatch):
    """With a bound of 0 bytes, a sweep of options keeps only the entries whose task vectors are
    alive: each new entry deletes the older ones nobody holds, and what is held still reads."""
    monkeypatch.setenv(lv.CACHE_ENV, "0")
    folder = tb.cache_dir / "filtered"
    want = pact_filter(tb.pretrained, _in_memory(tb), rule=tb.rule)[0]
    held, _ = lv.filtered_task_vectors(tb, "pact")  # in use throughout
    for frac in (0.05, 0.2, 0.3):
        tvs, _ = lv.filtered_task_vectors(tb, "pact", PactOptions(core_frac=frac))
        assert len(lv._entries(folder)) == 2  # the held one and the newest
        del tvs
        gc.collect()
    for a, b in zip(held, want):  # still on disk, still readable
        assert all(torch.equal(a[k], b[k]) for k in b)
    del held, a
    gc.collect()
    lv.filtered_task_vectors(tb, "s-pact")
    assert len(lv._entries(folder)) == 1
    monkeypatch.setenv(lv.CACHE_ENV, "inf")
    for frac in (0.05, 0.2):
        lv.filtered_task_vectors(tb, "pact", PactOptions(core_frac=frac))
    assert len(lv._entries(folder)) == 3


def test_a_pact_merge_filters_once_into_the_cache_for_every_method_and_process(tb, monkeypatch):
    """The streamed PACT merge of ``run`` (before any ``filtered()`` call) writes the filtered-layer
    cache and reads it back: each selected layer is filtered once, for every base method and for a
    new testbed object over the same files (another process), and the merges equal the in-memory
    ones on the filtered task vectors, bit for bit."""
    import pactlib.pact
    from pactlib.api import merged_update

    real, calls = pactlib.pact.filter_layer, []

    def counting(key, *a, **k):
        calls.append(key)
        return real(key, *a, **k)

    monkeypatch.setattr(pactlib.pact, "filter_layer", counting)
    D, report = base.streamed_update(tb, "iso_c", pact="pact")
    assert calls and sorted(calls) == sorted(set(calls))  # every filtered layer once
    assert sorted(calls) == sorted(lr.key for lr in report.layers)
    assert len(lv._entries(tb.cache_dir / "filtered")) == 1  # the persistent entry, no temporary spill
    assert not list(tb.cache_dir.glob(".filtered-spill-*"))
    n = len(calls)
    for method in ("task_arithmetic", "ties", "tsv_m"):
        base.streamed_update(tb, method, pact="pact")
    other = _fresh()
    D2, report2 = base.streamed_update(other, "iso_c", pact="pact")
    ftvs, _ = base.filtered(other, "pact")
    assert len(calls) == n  # nobody filtered again
    assert [lr.__dict__ for lr in report2.layers] == [lr.__dict__ for lr in report.layers]
    monkeypatch.undo()
    want, _ = merged_update("iso_c", tb.pretrained, pact_filter(tb.pretrained, _in_memory(tb), rule=tb.rule)[0],
                            rule=tb.rule)
    for k in want:
        assert torch.equal(D[k], want[k]) and torch.equal(D2[k], want[k]), k


def test_changed_checkpoint_contents_invalidate_every_cache(files, tmp_path, monkeypatch):
    """Overwriting one fine-tuned checkpoint (same path) gives a new fingerprint, a re-converted
    tower, a new filtered-layer cache entry equal to the filter of the new files, and a run-memo
    miss; the old entry is not read for the new files."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(files["ckpt"], ckpt)
    _define("clip-inval", files, checkpoint_dir=str(ckpt), cache_dir=str(tmp_path / "cache"))
    try:
        tb = testbeds.load("clip-inval", 0)
        first, _ = base.filtered(tb, "pact")
        first = [{k: tv[k].clone() for k in tv} for tv in first]
        rec = testbeds.run(tb, "task_arithmetic", alphas=(0.5,))
        task = tb.tasks[1]
        path = ckpt / task / "finetuned.pt"
        theta0 = files["theta0"]
        torch.save({k: theta0[k] + 3 * (v - theta0[k]) if v.is_floating_point() else v
                    for k, v in torch.load(path).items()}, path)
        new = testbeds.load("clip-inval", 0)
        assert new.fingerprint() != tb.fingerprint()
        old_tv, new_tv = tb.task_vectors()[1], new.task_vectors()[1]  # the tower converted again
        assert all(torch.allclose(new_tv[k], 3 * old_tv[k], atol=1e-6) for k in old_tv)
        assert not torch.equal(new_tv[next(iter(old_tv))], old_tv[next(iter(old_tv))])
        got, _ = base.filtered(new, "pact")
        want = pact_filter(new.pretrained, _in_memory(new), rule=new.rule)[0]
        for a, b, old in zip(got, want, first):
            assert all(torch.equal(a[k], b[k]) for k in b)
        assert any(not torch.equal(got[1][k], first[1][k]) for k in first[1])
        assert len(lv._entries(tmp_path / "cache" / "filtered")) == 2
        evaluated = []
        real = new.evaluate
        monkeypatch.setattr(new, "evaluate", lambda *a, **k: evaluated.append(1) or real(*a, **k))
        testbeds.run(new, "task_arithmetic", alphas=(0.5,))
        assert evaluated  # no memo hit on the old files' record
        assert len(list((tmp_path / "cache" / "run_memo").glob("*.json"))) == 2
        assert testbeds.run(tb, "task_arithmetic", alphas=(0.5,)) == dict(rec, memo_hit=True)  # still the old files'
    finally:
        testbeds.undefine("clip-inval")
