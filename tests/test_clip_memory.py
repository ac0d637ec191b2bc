"""The clip testbed's bounded-memory path (issue 15): towers converted once and read key by key,
`testbeds.run` merging key by key (the streamed merge's reader and per-layer filter) with the same
D as the in-memory path for every method ± PACT, evaluation data read per task, loss model and
inputs on the testbed's device, and FER2013's zero-shot head over every class synonym.
Tiny random-init open_clip models and image folders (the fixtures of test_clip_testbed)."""
from __future__ import annotations

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from pactlib import merges, testbeds  # noqa: E402
from pactlib.api import merged_update  # noqa: E402
from pactlib.models import clip  # noqa: E402
from pactlib.pact import PactOptions  # noqa: E402
from pactlib.testbeds import base  # noqa: E402
from pactlib.testbeds import clip as ctb  # noqa: E402
from test_clip_testbed import TASKS, TINY, _define, files  # noqa: E402,F401  (files: a fixture)


@pytest.fixture(scope="module")
def tb(files):  # noqa: F811
    _define("clip-mem", files)
    yield testbeds.load("clip-mem", 0)
    testbeds.undefine("clip-mem")


def _equal(a, b):
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
def test_streamed_update_equals_the_in_memory_merge(tb, pact):
    """Every registered method that merges key by key, ± PACT / S-PACT: D bit for bit."""
    opts = PactOptions() if pact else None
    tvs = base.filtered(tb, pact, opts)[0] if pact else tb.task_vectors()
    runs = [(method, {}) for method in merges.names()] + [("ties", {"scope": "per_key"}), ("ties", {"k": 55.0})]
    for method, params in runs:  # TIES: scope="global" (the default) in passes, and per key
        D, report = base.streamed_update(tb, method, pact=pact, options=opts, **params)
        want, _ = merged_update(method, tb.pretrained, tvs, rule=tb.rule, **params)
        _equal(D, want)
        if pact:
            assert report is not None and report.layers
            assert report.cap_binding_rate() == base.filtered(tb, pact, opts)[1].cap_binding_rate()


def test_run_streams_and_matches_the_in_memory_record(tb, monkeypatch):
    streamed = testbeds.run(tb, "iso_c", pact="pact", alphas=(0.5, 1.0), memo=False)
    monkeypatch.setattr(base, "merge_sources", lambda tb: None)  # the in-memory path
    in_memory = testbeds.run(tb, "iso_c", pact="pact", alphas=(0.5, 1.0), memo=False)
    for k in ("merge_seconds", "seconds"):
        streamed.pop(k), in_memory.pop(k)
    assert streamed == in_memory
    monkeypatch.undo()
    import pactlib.pact

    spill, _ = base._cache(tb)["filtered_spill"][("pact", PactOptions())]
    assert spill.files[0].parent.parent == tb.cache_dir and set(spill) == set(tb.matrix_keys())
    monkeypatch.setattr(pactlib.pact, "filter_layer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("again")))
    other = testbeds.run(tb, "tsv_m", pact="pact", alphas=(0.5,), memo=False)  # filtered layers read back
    assert other["cap_binding_rate"] == streamed["cap_binding_rate"]
    monkeypatch.undo()

    def refuse(*a, **k):
        raise AssertionError("every task vector materialised")

    monkeypatch.setattr(tb, "task_vectors", refuse)
    base._cache(tb).clear()
    testbeds.run(tb, "task_arithmetic", alphas=(0.5,), memo=False)  # streamed: no task vector asked for
    testbeds.run(tb, "ties", alphas=(0.5,), memo=False)  # global TIES too, in passes over the keys
    testbeds.run(tb, "ties", pact="pact", alphas=(0.5,), memo=False)


@pytest.fixture(scope="module")
def tied(files, tmp_path_factory):  # noqa: F811
    """The clip testbed over fine-tuned towers whose updates are multiples of 2^-9: thousands of
    entries tie at every task's global TIES threshold; the tasks in the order given."""
    root = tmp_path_factory.mktemp("tied")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    pre = files["theta0"]
    torch.save(pre, ckpt / "zeroshot.pt")
    for t in TASKS:
        (ckpt / t).mkdir()
        ft = {k: pre[k] + torch.round((v - pre[k]) * 512) / 512 if v.is_floating_point() else v
              for k, v in files["fts"][t].items()}
        torch.save(ft, ckpt / t / "finetuned.pt")
    made = []

    def load(tasks, name):
        _define(name, files, checkpoint_dir=str(ckpt), tasks=list(tasks), cache_dir=str(root / "cache"))
        made.append(name)
        return testbeds.load(name, 0)

    yield load
    for name in made:
        testbeds.undefine(name)


@pytest.mark.parametrize("order", [TASKS, TASKS[::-1]])
def test_streamed_global_ties_keeps_the_in_memory_entries_with_tied_magnitudes(tied, order, monkeypatch):
    """Global TIES (M2) streamed in passes = the in-memory TIES bit for bit, with thousands of
    magnitudes tied at each task's threshold (kept by position over θ0's key order), in either task
    order, plain and after PACT (the filtered layers read back, or filtered again in every pass
    when there is no room for them on disk), whatever the chunk size."""
    from pactlib.merges.ties import trim_count

    tb = tied(order, "clip-tied-" + "-".join(order).lower())
    tvs = tb.task_vectors()
    flat = torch.cat([v.reshape(-1) for v in tvs[0].values()]).abs()
    keep = trim_count(flat.numel(), 30.0)
    v = torch.topk(flat, keep).values.min()
    assert int((flat == v).sum()) > 100 and int((flat > v).sum()) < keep  # ties decide which entries count
    want, _ = merged_update("ties", tb.pretrained, tvs, rule=tb.rule, k=30.0)
    D, _ = base.streamed_update(tb, "ties", k=30.0)
    _equal(D, want)
    assert list(D) == list(want)  # θ0's key order, as the in-memory task vectors
    import pactlib.streaming

    monkeypatch.setattr(pactlib.streaming, "CHUNK_BYTES", 256)  # many chunks per key
    _equal(base.streamed_update(tb, "ties", k=30.0)[0], want)
    monkeypatch.undo()
    ftvs, rep = base.filtered(tb, "pact", PactOptions())
    want, _ = merged_update("ties", tb.pretrained, ftvs, rule=tb.rule, k=30.0)
    monkeypatch.setattr(base, "_room", lambda tb, entries: False)  # no room on disk: filter in every pass
    D, report = base.streamed_update(tb, "ties", pact="pact", k=30.0)
    _equal(D, want)
    assert report.cap_binding_rate() == rep.cap_binding_rate()
    monkeypatch.undo()
    D, _ = base.streamed_update(tb, "ties", pact="pact", k=30.0)  # filtered once, spilled
    _equal(D, want)
    assert ("pact", PactOptions()) in base._cache(tb)["filtered_spill"]
    _equal(base.streamed_update(tb, "ties", pact="pact", k=30.0)[0], want)  # read back from the spill


def test_streamed_global_ties_refuses_bad_parameters(tb):
    with pytest.raises(ValueError, match="k must be in"):
        base.streamed_update(tb, "ties", k=0.0)
    with pytest.raises(ValueError, match="scope"):
        base.streamed_update(tb, "ties", scope="everywhere")


@pytest.mark.parametrize("method,pact,suffix", [("iso_c", "pact", "safetensors"), ("ties", None, "pt")])
def test_search_out_writes_the_streamed_merge_key_by_key(tb, method, pact, suffix, tmp_path, monkeypatch):
    """``pact search --out`` on a testbed with merge_sources: D streamed, the file written key by
    key (write_merged), equal bit for bit to θ0 + α·D of the in-memory merge; no task vector asked for."""
    from pactlib.io import load_state_dict
    from pactlib.testbeds import search

    out = tmp_path / f"merged.{suffix}"

    def refuse(self):
        raise AssertionError("every task vector materialised")

    monkeypatch.setattr(ctb.ClipTestbed, "task_vectors", refuse)
    rec, merged, fresh = search.search("clip-mem", method, pact=pact, alphas=(0.5, 1.0), params={}, out=str(out),
                                       options={"cache_dir": str(tmp_path / "memo")})
    monkeypatch.undo()
    assert merged is None and rec["alpha"] > 0
    opts = PactOptions() if pact else None
    tvs = base.filtered(tb, pact, opts)[0] if pact else tb.task_vectors()
    D, _ = merged_update(method, tb.pretrained, tvs, rule=tb.rule)
    _equal(load_state_dict(out), D.apply_to(tb.pretrained, rec["alpha"]))


def test_write_merged_refuses_a_d_that_does_not_fit(tb, tmp_path):
    from pactlib.testbeds.search import write_merged

    pre, _ = tb.merge_sources()
    D = {k: torch.zeros(v.shape) for k, v in pre.meta().items() if v.is_floating_point()}
    k = next(iter(D))
    with pytest.raises(ValueError, match="missing from D"):
        write_merged(tmp_path / "a.safetensors", pre, {j: v for j, v in D.items() if j != k}, 1.0)
    with pytest.raises(ValueError, match="has shape"):
        write_merged(tmp_path / "a.safetensors", pre, {**D, k: torch.zeros(3, 3, 3)}, 1.0)
    with pytest.raises(ValueError, match="finite"):
        write_merged(tmp_path / "a.safetensors", pre, D, float("nan"))
    assert not (tmp_path / "a.safetensors").exists()
    write_merged(tmp_path / "a.safetensors", pre, D, 1.0)
    from pactlib.io import load_state_dict

    _equal(load_state_dict(tmp_path / "a.safetensors"), dict(tb.pretrained))


def test_towers_and_splits_are_read_per_key_and_per_task(tb, files, monkeypatch):  # noqa: F811
    ft = tb.finetuned[TASKS[0]]
    assert isinstance(ft, ctb._LazyTower) and set(ft) == set(tb.pretrained)
    k = "visual.transformer.resblocks.0.attn.in_proj_weight"
    torch.testing.assert_close(ft[k], clip.vision_state_dict(files["fts"][TASKS[0]])[k], rtol=0, atol=0)
    ft[k].add_(1.0)  # a copy: the file is not written
    assert torch.equal(ft[k], clip.vision_state_dict(files["fts"][TASKS[0]])[k])
    tb.evaluate(tb.pretrained, "val")
    assert tb.val._held is None  # freed after the evaluation
    assert tb.val[TASKS[1]].images.dtype == torch.uint8 and tb.val._held[0] == TASKS[1]
    # a second load reads the converted towers: no fine-tuned file is unpickled again
    real = clip.load_clip_checkpoint

    def only_theta0(path, **kw):
        assert "finetuned" not in str(path), f"{path} read again"
        return real(path, **kw)

    monkeypatch.setattr(clip, "load_clip_checkpoint", only_theta0)
    again = testbeds.load("clip-mem", 0)
    assert again.fingerprint() == tb.fingerprint() and again.ft_test == tb.ft_test
    assert [c.files for c in again.merge_sources()[1]] == [c.files for c in tb.merge_sources()[1]]


def test_loss_model_and_inputs_on_the_testbed_device(tb):
    t = TASKS[0]
    model = tb.loss_model(tb.finetuned[t], t)
    x, y = tb.inputs(t, "test", limit=3)
    dev = torch.device(tb.device)
    assert {p.device for p in model.parameters()} == {dev} and model.head_weight.device == dev
    assert x.device == dev and y.device == dev and x.shape[0] == 3 == y.shape[0]
    with torch.no_grad():
        assert model(x).shape == (3, len(tb.heads[t][0]))


def test_fer2013_head_averages_every_class_synonym():
    names = ["angry", "disgusted", "fearful", "happy", "sad", "surprised", "neutral"]
    syn = ctb.class_synonyms("FER2013", names)
    assert syn[3] == ["happy", "smiling"] and syn[5] == ["surprised", "shocked", "spooked"] and syn[0] == ["angry"]
    assert ctb.class_synonyms("FER2013", ["a", "happy"]) == [["a"], ["happy", "smiling"]]
    assert ctb.class_synonyms("MNIST", ["0", "1"]) == [["0"], ["1"]]
    torch.manual_seed(0)
    model, tok = clip.build_clip(TINY)
    templates = ("a photo of a {} looking face.", "they look {}.")
    H = ctb.synonym_head(model, tok, syn, templates)
    assert H.shape == (7, 16)
    with torch.no_grad():
        e = torch.nn.functional.normalize(model.encode_text(tok([t.format(n) for n in syn[5] for t in templates])),
                                          dim=-1)
    torch.testing.assert_close(H[5], torch.nn.functional.normalize(e.mean(0), dim=0))
    torch.testing.assert_close(H[0], clip.zeroshot_head(model, tok, ["angry"], templates)[0])
    single = [[n] for n in names]
    assert torch.equal(ctb.synonym_head(model, tok, single, templates), clip.zeroshot_head(model, tok, names, templates))
    with pytest.raises(ValueError, match="no '\\{\\}'"):
        ctb.synonym_head(model, tok, syn, ("no slot",))


@pytest.mark.parametrize("method", ["task_arithmetic", "tsv_m", "iso_c"])
def test_streamed_reducer_methods_read_one_task_at_a_time(tb, monkeypatch, method):
    """Task Arithmetic, TSV-M and Iso-C over the testbed's files never stack the T deltas: plain, PACT
    read back from the filtered-layer cache, and PACT filtered inside the merge (no room on disk);
    D is the in-memory merge's, bit for bit."""
    from pactlib.streaming import DeltaReader

    opts = PactOptions()
    ftvs, rep = base.filtered(tb, "pact", opts)  # the cache, before stacking is forbidden
    plain, _ = merged_update(method, tb.pretrained, tb.task_vectors(), rule=tb.rule)
    want, _ = merged_update(method, tb.pretrained, ftvs, rule=tb.rule)

    def no_stack(*a, **k):
        raise AssertionError("a method with a reducer stacked the T deltas")

    monkeypatch.setattr(DeltaReader, "deltas", no_stack)
    _equal(base.streamed_update(tb, method)[0], plain)
    D, report = base.streamed_update(tb, method, pact="pact", options=opts)  # from the cache
    _equal(D, want)
    monkeypatch.setattr(base, "_cache", lambda tb, _c={}: _c)  # a fresh object: no spill known
    monkeypatch.setattr(base, "_room", lambda tb, entries: False)  # no room on disk: filter in the merge
    import pactlib.streaming

    filtered_keys = []
    original = pactlib.streaming.filter_tasks
    monkeypatch.setattr(pactlib.streaming, "filter_tasks", lambda key, *a, **k: filtered_keys.append(key) or original(key, *a, **k))
    D, report = base.streamed_update(tb, method, pact="pact", options=opts)
    _equal(D, want)
    assert sorted(filtered_keys) == sorted(lr.key for lr in rep.layers)
    assert [lr.removed_energy for lr in report.layers] == [lr.removed_energy for lr in rep.layers]
