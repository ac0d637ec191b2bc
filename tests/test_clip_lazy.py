"""Lazy task vectors and disk-cached PACT filtering on the clip testbed (issue 15): the chapters'
task vectors read key by key, equal to the in-memory ones bit for bit. Tiny random-init open_clip
models (the fixtures of test_clip_testbed)."""
from __future__ import annotations

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

import pactlib.pact  # noqa: E402
from pactlib import testbeds  # noqa: E402
from pactlib.pact import PactOptions, pact_filter  # noqa: E402
from pactlib.taskvector import TaskVector  # noqa: E402
from pactlib.testbeds import base  # noqa: E402
from pactlib.testbeds.lazy_vectors import LazyTaskVector  # noqa: E402
from test_clip_testbed import TASKS, files, loaded  # noqa: E402,F401  (files: a fixture)


@pytest.fixture(scope="module")
def tb(files, tmp_path_factory):  # noqa: F811
    yield from loaded("clip-lazy", files, tmp_path_factory)


def _in_memory(tb):
    return [TaskVector.from_checkpoints(tb.pretrained, dict(tb.finetuned[t]), name=t) for t in tb.tasks]


def _same(a, b):
    assert list(a) == list(b)
    for k in a:
        x, y = a[k], b[k]
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k


def test_task_vectors_are_lazy_and_equal_the_in_memory_ones(tb):
    lazy, want = tb.task_vectors(), _in_memory(tb)
    assert all(isinstance(tv, LazyTaskVector) for tv in lazy) and [tv.name for tv in lazy] == TASKS
    for tv, w in zip(lazy, want):
        _same(tv, w)
        _same(tv.materialize(), w)
        assert tv.dtype == torch.float32 and len(tv) == len(w) and "visual.conv1.weight" in tv
        x = tv["visual.conv1.weight"]
        x.add_(1.0)  # a fresh tensor: the task vector does not change
        assert torch.equal(tv["visual.conv1.weight"], w["visual.conv1.weight"])
        with pytest.raises(TypeError):
            tv["visual.conv1.weight"] = x  # read-only
        with pytest.raises(KeyError):
            tv["no.such.key"]
    s = sum(lazy)  # arithmetic gives in-memory task vectors
    _same(s, sum(want))
    assert type(s) is TaskVector and abs(lazy[0].norm() - want[0].norm()) == 0.0


@pytest.mark.parametrize("mode", ["pact", "s-pact"])
def test_filtered_is_lazy_cached_on_disk_and_equals_pact_filter(tb, mode, monkeypatch):
    opts = PactOptions()
    want, want_rep = pact_filter(tb.pretrained, _in_memory(tb), mode=mode, options=opts, rule=tb.rule, keep=True)
    got, rep = base.filtered(tb, mode, opts, keep=True)
    assert all(isinstance(tv, LazyTaskVector) for tv in got)
    for g, w in zip(got, want):
        _same(g, w)
    assert [lr.__dict__ for lr in rep.layers] == [lr.__dict__ for lr in want_rep.layers]
    assert list(rep.subspaces) == list(want_rep.subspaces) and list(rep.shields) == list(want_rep.shields)
    for k in want_rep.shields:
        assert all(torch.equal(a, b) for a, b in zip(rep.shields[k], want_rep.shields[k]))
        assert torch.equal(rep.subspaces[k].core, want_rep.subspaces[k].core)
    files = sorted((tb.cache_dir / "filtered").glob("*.safetensors"))
    assert files and all(f.parent.parent == tb.cache_dir for f in files)
    plain, prep = base.filtered(tb, mode, opts)  # keep=False: the layers file is shared
    assert prep.cap_binding_rate() == want_rep.cap_binding_rate() and not prep.shields
    # another testbed object (another chapter, a later process) reads the file: no layer filtered again
    monkeypatch.setattr(pactlib.pact, "filter_layer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("again")))
    again = testbeds.load("clip-lazy", 0)
    got2, rep2 = base.filtered(again, mode, opts, keep=True)
    for g, w in zip(got2, want):
        _same(g, w)
    assert rep2.cap_binding_rate() == want_rep.cap_binding_rate()
    # and its PACT merges read the filtered layers instead of filtering (streamed_update's spill)
    rec = testbeds.run(again, "iso_c", pact=mode, options=opts, alphas=(0.5,), memo=False)
    assert rec["cap_binding_rate"] == want_rep.cap_binding_rate()
    monkeypatch.undo()
    changed = opts.replace(core_frac=opts.core_frac / 2)
    base.filtered(tb, mode, changed)  # other options: another file
    assert len(list((tb.cache_dir / "filtered").glob("*.safetensors"))) > len(files)


def test_in_memory_testbeds_keep_in_memory_task_vectors():
    syn = testbeds.load("synthetic-3", 0)
    tvs = syn.task_vectors()
    assert not any(isinstance(tv, LazyTaskVector) for tv in tvs)
    f, rep = base.filtered(syn, "pact")
    want, wrep = pact_filter(syn.pretrained, base.own_task_vectors(syn), mode="pact", rule=syn.rule)
    assert type(f[0]) is TaskVector
    for a, b in zip(f, want):
        _same(a, b)
    fk, krep = base.filtered(syn, "pact", keep=True)
    assert krep.subspaces and krep.cap_binding_rate() == wrep.cap_binding_rate()


def _strip(rec):
    return {k: v for k, v in rec.items() if k not in ("seconds", "merge_seconds")}


def test_chapter_7_records_on_the_clip_testbed_equal_the_in_memory_ones(tb):
    """Chapter 7 (depth): the intrusion records and a depth group's merge record from the lazy task
    vectors and the disk-cached filter equal those of the in-memory task vectors and pact_filter."""
    from pactlib.book.experiments import depth

    opts = PactOptions()
    keys = tb.network_order()
    raw_mem = _in_memory(tb)
    filt_mem, rep_mem = pact_filter(tb.pretrained, raw_mem, options=opts, keep=True, rule=tb.rule)
    raw = tb.task_vectors()
    filt, rep = base.filtered(tb, "pact", opts, keep=True)
    want = depth.intrusion_records(raw_mem, rep_mem.subspaces, keys=keys, params={}, seed=0, rule=tb.rule)
    got = depth.intrusion_records(raw, rep.subspaces, keys=keys, params={}, seed=0, rule=tb.rule)
    assert got == want and got
    group = keys[: len(keys) // 2]
    lazy_group = depth.group_task_vectors(raw, filt, group)
    assert all(isinstance(tv, LazyTaskVector) for tv in lazy_group)
    for a, b in zip(lazy_group, depth.group_task_vectors(raw_mem, filt_mem, group)):
        _same(a, b)
    for g, ks in (("none", []), ("early", group)):
        r_lazy = depth.group_record(tb, "iso_c", g, keys=ks, raw=raw, filtered=filt, options=opts, alphas=(0.5, 1.0))
        r_mem = depth.group_record(tb, "iso_c", g, keys=ks, raw=raw_mem, filtered=filt_mem, options=opts,
                                   alphas=(0.5, 1.0))
        assert _strip(r_lazy) == _strip(r_mem)


def test_chapter_8_timed_filter_and_chapter_11_runs_on_the_clip_testbed(tb):
    """Chapter 8's timed filter (lazy, into a fresh folder each repeat) gives pact_filter's task
    vectors and subspaces; chapter 11's PACT run without task_vectors (streamed, memoised) gives
    the record of the in-memory merge of the in-memory task vectors."""
    from pactlib.book.experiments import efficiency

    opts = PactOptions(svd="rsvd", n_iter=1)
    raw_mem = _in_memory(tb)
    want, wrep = pact_filter(tb.pretrained, raw_mem, options=opts, keep=True, rule=tb.rule)
    secs, got, rep = efficiency.time_filter(tb.pretrained, tb.task_vectors(), opts, repeats=2, rule=tb.rule, tb=tb)
    assert secs > 0 and all(isinstance(tv, LazyTaskVector) for tv in got)
    for a, b in zip(got, want):
        _same(a, b)
    keys = tb.network_order()
    assert efficiency.basis_records(wrep, rep, params={}, seed=0, keys=keys, tasks=tb.tasks) == \
        efficiency.basis_records(wrep, wrep, params={}, seed=0, keys=keys, tasks=tb.tasks)
    streamed = testbeds.run(tb, "iso_c", pact="pact", options=opts, alphas=(0.5, 1.0), memo=False)
    in_memory = testbeds.run(tb, "iso_c", pact="pact", options=opts, alphas=(0.5, 1.0), task_vectors=raw_mem)
    assert _strip(streamed) == _strip(in_memory)
