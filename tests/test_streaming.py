"""The streamed merge (pactlib.streaming.merge_files, `pact merge`): the same numbers as the
in-memory path, bit for bit, for every method with and without PACT / S-PACT, on single-file,
sharded and pickled inputs, whole or in chunks, into one file or shards; exact TIES trimming;
lazy reading, the writer, and errors that name the file and the key and leave no output."""
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import pactlib
from pactlib import merges
from pactlib.cli import main
from pactlib.io import load_state_dict, save_state_dict
from pactlib.lazy import CheckpointWriter, open_checkpoint, parse_size
from pactlib.matrix import MatrixRule
from pactlib.merges.ties import GlobalThreshold, trim_count, trim_mask
from pactlib.models.clip import load_clip_checkpoint
from pactlib.streaming import find_thresholds, trim_stack

from conftest import make_checkpoints

CASES = [(m, p, {}) for m in merges.names() for p in (None, "pact", "s-pact")] + \
        [("ties", p, {"scope": "per_key"}) for p in (None, "pact")] + [("ties", "pact", {"k": 55.0})]


def _files(tmp_path: Path, pre, fts, ext=".safetensors"):
    pp = save_state_dict(pre, tmp_path / f"pre{ext}")
    return str(pp), [str(save_state_dict(f, tmp_path / f"ft{i}{ext}")) for i, f in enumerate(fts)]


def _sharded(tmp_path: Path, sd, name: str) -> str:
    """``sd`` as two safetensors shards and a Hugging Face index (the first 4 keys, the rest)."""
    keys = list(sd)
    parts = {f"{name}-00001-of-00002.safetensors": keys[:4], f"{name}-00002-of-00002.safetensors": keys[4:]}
    for file, ks in parts.items():
        save_file({k: sd[k].contiguous() for k in ks}, str(tmp_path / file))
    index = tmp_path / f"{name}.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    return str(index)


def _read(path) -> dict:
    ck = open_checkpoint(path)
    return {k: ck.read(k).clone() for k in ck.keys()}


def _assert_identical(got: dict, want: dict):
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), f"{k}: max diff {float((got[k].double() - want[k].double()).abs().max())}"


@pytest.mark.parametrize("method,pact,params", CASES, ids=lambda x: str(x))
def test_streamed_merge_is_bit_identical_to_in_memory(tmp_path, ckpts, method, pact, params):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    want = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact, core_frac=0.3, **params) if pact else \
        pactlib.merge(method, pre, fts, alpha=0.7, **params)
    kw = dict(core_frac=0.3) if pact else {}
    res = pactlib.merge_files(method, p0, ps, tmp_path / "out.safetensors", alpha=0.7, pact=pact, **params, **kw)
    assert res.path == tmp_path / "out.safetensors" and res.files == [res.path] and res.tasks == 3
    got = load_file(str(res.path))
    _assert_identical(got, want)
    assert list(got) == list(load_state_dict(p0))  # θ0's keys, in θ0's order
    if pact:
        _, rep = pactlib.merged_update(method, pre, pactlib.task_vectors_from(pre, fts), pact=pact,
                                       options=pactlib.PactOptions(core_frac=0.3), **params)
        by_key = lambda recs: sorted(recs, key=lambda r: (r["key"], r["task"]))  # noqa: E731
        assert by_key(res.report.to_records()) == by_key(rep.to_records())  # layers in the file's order
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out.safetensors", "pre.safetensors", "ft0.safetensors", "ft1.safetensors", "ft2.safetensors"])


@pytest.mark.parametrize("method,pact", [("task_arithmetic", "pact"), ("ties", None), ("ties", "s-pact"),
                                         ("tsv_m", "pact"), ("iso_c", None), ("iso_cts", "pact")])
def test_streamed_sharded_inputs_chunks_workers_and_sharded_output(tmp_path, method, pact):
    """Sharded inputs (index.json), 64-byte chunks, two workers, fp16 θ (deltas in float32) and a
    sharded output: still the in-memory numbers, and an index Hugging Face can read."""
    pre, fts = make_checkpoints(T=4, seed=3, dtype=torch.float16)
    p0 = _sharded(tmp_path, pre, "pre")
    ps = [_sharded(tmp_path, f, f"ft{i}") for i, f in enumerate(fts)]
    # the in-memory reference reads the same files, in the same key order (TIES' position tie-break)
    pre_r, fts_r = _read(p0), [_read(p) for p in ps]
    assert list(pre_r) == list(load_clip_checkpoint(tmp_path / "pre-00001-of-00002.safetensors")) \
        + list(load_clip_checkpoint(tmp_path / "pre-00002-of-00002.safetensors"))
    want = pactlib.merge(method, pre_r, fts_r, alpha=0.6, pact=pact)
    res = pactlib.merge_files(method, p0, ps, tmp_path / "merged.safetensors", alpha=0.6, pact=pact,
                              max_shard_size=300, chunk_bytes=64, workers=2)
    assert res.path == tmp_path / "merged.safetensors.index.json" and res.files[-1] == res.path
    assert len(res.files) > 3 and not (tmp_path / "merged.safetensors").exists()
    index = json.loads(res.path.read_text())
    assert set(index["weight_map"]) == set(pre)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in pre.values())
    for f in res.files[:-1]:
        assert f.stat().st_size <= 300 + 8 + 1024 or len(load_file(str(f))) == 1  # header + data, or one big key
        assert f.name.startswith("merged-") and f.name.endswith(f"-of-{len(res.files) - 1:05d}.safetensors")
    _assert_identical(_read(res.path), want)


def test_streamed_output_named_by_its_index_is_always_sharded(tmp_path, ckpts):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    res = pactlib.merge_files("iso_c", p0, ps, tmp_path / "m.safetensors.index.json", alpha=1.0)
    assert [f.name for f in res.files] == ["m-00001-of-00001.safetensors", "m.safetensors.index.json"]
    _assert_identical(_read(res.path), pactlib.merge("iso_c", pre, fts, alpha=1.0))
    # a folder holding the index reads the same (as Hugging Face model folders)
    (tmp_path / "m.safetensors.index.json").rename(tmp_path / "model.safetensors.index.json")
    _assert_identical(_read(tmp_path), pactlib.merge("iso_c", pre, fts, alpha=1.0))


def test_streamed_float64_and_pickled_inputs_converted_once(tmp_path):
    """.pt inputs (one wrapped in {"state_dict": ...}) are converted to safetensors once, in the
    cache folder, and reused; float64 θ0 makes the deltas float64 as in memory."""
    pre, fts = make_checkpoints(T=2, seed=5, dtype=torch.float64)
    p0 = save_state_dict(pre, tmp_path / "pre.pt")
    torch.save({"state_dict": fts[0]}, tmp_path / "a.pt")
    ps = [str(tmp_path / "a.pt"), str(save_state_dict(fts[1], tmp_path / "b.pth"))]
    cache = tmp_path / "cache"
    want = pactlib.merge("tsv_m", pre, fts, alpha=0.9, pact="pact")
    res = pactlib.merge_files("tsv_m", p0, ps, tmp_path / "o.safetensors", alpha=0.9, pact="pact", cache_dir=cache)
    _assert_identical(load_file(str(res.path)), want)
    converted = sorted(cache.iterdir())
    assert len(converted) == 3 and all(f.suffix == ".safetensors" and not f.name.startswith(".") for f in converted)
    stamps = {f: f.stat().st_mtime_ns for f in converted}
    res = pactlib.merge_files("tsv_m", p0, ps, tmp_path / "o.pt", alpha=0.9, pact="pact", cache_dir=cache)
    assert {f: f.stat().st_mtime_ns for f in cache.iterdir()} == stamps  # reused, not rewritten
    _assert_identical(torch.load(res.path, weights_only=True), want)
    # a changed file gets a new conversion, and the old one goes
    torch.save({"state_dict": {k: v + 1 if v.is_floating_point() else v for k, v in fts[0].items()}}, tmp_path / "a.pt")
    open_checkpoint(tmp_path / "a.pt", cache_dir=cache)
    assert len(list(cache.iterdir())) == 3 and set(cache.iterdir()) != set(converted)


def test_trim_mask_breaks_ties_by_position():
    x = torch.ones(10)
    assert trim_mask(x, 20).tolist() == [True, True] + [False] * 8
    x = torch.tensor([0.5, -2.0, 1.0, -1.0, 1.0, 2.0, 0.0, 1.0])
    # keep 4: the two |2|, then the first two of the four |1| by position
    assert trim_mask(x, 50).tolist() == [False, True, True, True, False, True, False, False]
    assert trim_count(8, 50) == 4 and trim_count(7, 10) == 1 and trim_count(3, 100) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_global_threshold_finds_trim_mask_exactly(dtype, gen):
    """Radix selection over chunks keeps the entries trim_mask keeps, with many tied values."""
    T, n = 3, 5000
    x = (torch.randint(-40, 41, (T, n), generator=gen) / 8).to(dtype)  # many ties, zeros included
    x[1, :100] = 1e-30
    for k in (0.01, 7.5, 20.0, 63.0, 100.0):
        gt = GlobalThreshold(T, trim_count(n, k), dtype)
        cuts = [0, 1, 700, 701, 2500, n]
        while not gt.done:
            for t in range(T):
                for a, b in zip(cuts, cuts[1:]):
                    gt.observe(t, x[t, a:b])
            gt.end_pass()
        for t in range(T):
            want = trim_mask(x[t], k)
            got = torch.cat([gt.mask(t, x[t, a:b]) for a, b in zip(cuts, cuts[1:])])
            assert torch.equal(got, want), (k, t)
            assert float(gt.threshold(t)) == float(x[t].abs()[want].min())


def test_global_threshold_run_and_trim_on_stacks(gen):
    """find_thresholds (the passes over (T, …) stacks, in any order) and trim_stack (position
    order) give what trim_mask gives on each whole task vector; a stack of the wrong T is refused."""
    T, n = 4, 3000
    x = (torch.randint(-20, 21, (T, n), generator=gen) / 4).float()
    cuts = [0, 5, 1000, 1001, n]
    calls = []

    def passes(first):
        calls.append(first)
        for a, b in reversed(list(zip(cuts, cuts[1:]))):  # counting does not depend on the order
            yield x[:, a:b]

    gt = find_thresholds(GlobalThreshold(T, trim_count(n, 20.0), torch.float32), passes)
    assert gt.done and calls == [True, False]
    got = torch.cat([trim_stack(gt, x[:, a:b]) for a, b in zip(cuts, cuts[1:])], dim=1)
    want = torch.stack([x[t] * trim_mask(x[t], 20.0) for t in range(T)])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="3 rows for 4 tasks"):
        find_thresholds(GlobalThreshold(T, 10, torch.float32), lambda first: iter([x[:3]]))


def test_streamed_ties_with_tied_magnitudes_is_exact(tmp_path):
    """Quantized updates: thousands of entries tie at every task's threshold; the streamed TIES
    keeps the same ones (by position across keys and chunks) as the in-memory one."""
    pre, fts = make_checkpoints(T=3, seed=7)
    fts = [{k: (pre[k] + torch.round((v - pre[k]) * 200) / 200) if v.is_floating_point() else v
            for k, v in ft.items()} for ft in fts]
    p0, ps = _files(tmp_path, pre, fts)
    pre_r, fts_r = load_state_dict(p0), [load_state_dict(p) for p in ps]
    tv = pactlib.task_vectors_from(pre_r, fts_r)[0]
    flat = torch.cat([v.reshape(-1) for v in tv.values()]).abs()
    v = torch.topk(flat, trim_count(flat.numel(), 30.0)).values.min()
    assert int((flat == v).sum()) > 10 and int((flat > v).sum()) < trim_count(flat.numel(), 30.0)
    for chunk in (64, 1 << 20):
        want = pactlib.merge("ties", pre_r, fts_r, alpha=0.5, k=30.0)
        res = pactlib.merge_files("ties", p0, ps, tmp_path / "t.safetensors", alpha=0.5, k=30.0, chunk_bytes=chunk)
        _assert_identical(load_file(str(res.path)), want)


def test_streamed_global_ties_is_the_same_for_any_worker_count(tmp_path):
    """Global TIES runs its tasks on ``workers`` threads (each task's counts and mask its own):
    the same file, byte for byte, for 1, 2 and 5 workers, with entries tied at the thresholds,
    chunks of a few rows, and with PACT (filtered layers read back from the spill)."""
    pre, fts = make_checkpoints(T=5, seed=11)
    fts = [{k: (pre[k] + torch.round((v - pre[k]) * 200) / 200) if v.is_floating_point() else v
            for k, v in ft.items()} for ft in fts]
    p0, ps = _files(tmp_path, pre, fts)
    for pact in (None, "pact"):
        outs = []
        for workers in (1, 2, 5):
            out = tmp_path / f"t{workers}-{pact}.safetensors"
            pactlib.merge_files("ties", p0, ps, out, alpha=0.5, k=30.0, chunk_bytes=256, workers=workers, pact=pact)
            outs.append(out.read_bytes())
        assert outs[0] == outs[1] == outs[2]
    want = pactlib.merge("ties", load_state_dict(p0), [load_state_dict(p) for p in ps], alpha=0.5, k=30.0)
    _assert_identical(load_file(str(tmp_path / "t5-None.safetensors")), want)


def test_writer_streams_chunks_and_checks_order(tmp_path):
    a, b = torch.arange(12.0).reshape(4, 3), torch.tensor(5, dtype=torch.int64)
    c = torch.randn(2, 2).to(torch.bfloat16)
    entries = [("a", a.shape, a.dtype), ("b", b.shape, b.dtype), ("c", c.shape, c.dtype), ("e", (0,), torch.float32)]
    with CheckpointWriter(tmp_path / "w.safetensors", entries) as w:
        w.write("a", a[:1])
        w.write("a", a[1:])
        w.write("b", b)
        w.write("c", c)
        w.write("e", torch.zeros(0))
        assert not (tmp_path / "w.safetensors").exists()
        w.commit()
    got = load_file(str(tmp_path / "w.safetensors"))
    assert list(got) == ["a", "b", "c", "e"] and torch.equal(got["a"], a) and torch.equal(got["c"], c)
    assert (tmp_path / "w.safetensors").read_bytes()[:8] != b"" and int.from_bytes(
        (tmp_path / "w.safetensors").read_bytes()[:8], "little") % 8 == 0
    with CheckpointWriter(tmp_path / "x.safetensors", entries) as w:
        with pytest.raises(ValueError, match="expected key 'a', got 'b'"):
            w.write("b", b)
        w.write("a", a)
        with pytest.raises(ValueError, match="declared torch.int64"):
            w.write("b", b.float())
        with pytest.raises(ValueError, match="not written"):
            w.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]  # no temp file left
    assert parse_size("2GB") == 2 * 10**9 and parse_size("1.5GiB") == 3 * 2**29 and parse_size(123) == 123
    with pytest.raises(ValueError, match="500MB"):
        parse_size("lots")


def test_streamed_task_arithmetic_names_the_first_non_finite_checkpoint(tmp_path):
    """Task Arithmetic checks θt once per chunk, on the running sum: a NaN in task 1 and an Inf in
    task 2 of one chunk of rows name task 1's file (task order, as a check per task did); finite
    checkpoints whose update overflows float16 are the overflow error, as before."""
    g = torch.Generator().manual_seed(0)
    pre = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
    fts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in pre.items()} for _ in range(3)]
    fts[1]["w"][40, 3] = float("nan")
    fts[2]["w"][41, 0] = float("inf")
    p0, ps = _files(tmp_path, pre, fts)
    out = tmp_path / "o.safetensors"
    for chunk in (1 << 20, 1024):  # the key whole, and in chunks of rows
        with pytest.raises(pactlib.CheckpointError, match=r"ft1\.safetensors: key 'w' holds 1 NaN and 0 Inf"):
            pactlib.merge_files("task_arithmetic", p0, ps, out, alpha=1.0, chunk_bytes=chunk)
        assert not out.exists()
    half = {k: v.half() for k, v in pre.items()}
    big = [{k: torch.full_like(v, 60000.0) for k, v in half.items()} for _ in range(2)]
    p0, ps = _files(tmp_path / "half", half, big)
    with pytest.raises(pactlib.MergeOverflowError, match="'b'|'w'"):
        pactlib.merge_files("task_arithmetic", p0, ps, out, alpha=1.0)


def test_streamed_errors_name_file_and_key_and_leave_no_output(tmp_path, ckpts, monkeypatch):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    out = tmp_path / "o.safetensors"
    short = {k: v for k, v in fts[1].items() if k != "head.weight"}
    save_state_dict(short, tmp_path / "short.safetensors")
    with pytest.raises(pactlib.CheckpointError, match=r"short.safetensors: 1 key\(s\) missing: 'head.weight'"):
        pactlib.merge_files("iso_c", p0, [ps[0], str(tmp_path / "short.safetensors")], out, alpha=1.0)
    wide = {**fts[1], "lin.weight": torch.zeros(12, 11)}
    save_state_dict(wide, tmp_path / "wide.safetensors")
    with pytest.raises(pactlib.CheckpointError, match=r"wide.safetensors: shape mismatch at key 'lin.weight': "
                                                      r"pre-trained \(12, 10\) vs .*wide.safetensors \(12, 11\)"):
        pactlib.merge_files("iso_c", p0, [ps[0], str(tmp_path / "wide.safetensors")], out, alpha=1.0)
    nan = {**fts[1], "logit_scale": torch.tensor(float("nan"))}  # the last key: found after writing others
    save_state_dict(nan, tmp_path / "nan.safetensors")
    with pytest.raises(pactlib.CheckpointError, match=r"nan.safetensors: key 'logit_scale' holds 1 NaN"):
        pactlib.merge_files("task_arithmetic", p0, [ps[0], str(tmp_path / "nan.safetensors")], out, alpha=1.0)
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        pactlib.merge_files("iso_c", p0, [str(tmp_path / "nope.safetensors")], out, alpha=1.0)
    with pytest.raises(ValueError, match="is the input"):
        pactlib.merge_files("iso_c", p0, ps, ps[0], alpha=1.0)
    with pytest.raises(ValueError, match="TIES trim percentage"):  # parameter values, before any file
        pactlib.merge_files("ties", p0, ps, out, alpha=1.0, k=0)
    # an interrupted run (here: Ctrl-C while writing the third key) leaves no output, no temp file
    from pactlib import lazy

    calls = []
    real = lazy._SafetensorsFile.write

    def interrupted(self, data):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, data)

    monkeypatch.setattr(lazy._SafetensorsFile, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "sharded.safetensors.index.json", alpha=1.0,
                            max_shard_size=100)
    before = {"pre.safetensors", "short.safetensors", "wide.safetensors", "nan.safetensors"} | {Path(p).name for p in ps}
    assert {p.name for p in tmp_path.iterdir()} == before


def test_streamed_warnings_match_in_memory(tmp_path, ckpts):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, [fts[0], fts[0], pre])
    with pytest.warns(UserWarning) as rec:
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "o.safetensors", alpha=1.0, pact="pact", layers=["nomatch"])
    msgs = [str(w.message) for w in rec]
    assert any("is all zero" in m and ps[2] in m for m in msgs)
    assert any("are identical" in m and ps[0] in m and ps[1] in m for m in msgs)
    assert any("match no matrix layer" in m for m in msgs) and any("changed no task vector" in m for m in msgs)


def test_cli_merge_streams_into_shards(tmp_path, ckpts, capsys):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts, ext=".pt")
    out = tmp_path / "merged.safetensors"
    rc = main(["merge", "--method", "ties", "--pact", "s-pact", "--alpha", "0.4", "--pretrained", p0,
               "--finetuned", *ps, "--out", str(out), "--max-shard-size", "400B", "--set", "k=30"])
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["out"] == str(tmp_path / "merged.safetensors.index.json") and len(rec["files"]) > 2
    _assert_identical(_read(rec["out"]), pactlib.merge("ties", pre, fts, alpha=0.4, pact="s-pact", k=30))
    rc = main(["merge", "--method", "ties", "--alpha", "0.4", "--pretrained", p0, "--finetuned", *ps,
               "--out", str(tmp_path / "m.pt"), "--max-shard-size", "1GB"])
    assert rc == 2 and "sharded output is written as safetensors" in capsys.readouterr().err
    rc = main(["merge", "--method", "ties", "--alpha", "0.4", "--pretrained", p0, "--finetuned", *ps,
               "--out", str(out), "--max-shard-size", "big"])
    assert rc == 2 and "max shard size" in capsys.readouterr().err


@pytest.mark.parametrize("method,pact,params,workers", [
    ("task_arithmetic", "pact", {}, 1), ("tsv_m", None, {}, 1), ("iso_cts", "pact", {}, 1),
    ("ties", "pact", {"scope": "per_key"}, 1), ("ties", "pact", {}, 1), ("ties", "pact", {}, 2)], ids=str)
def test_streamed_merge_on_a_named_device_is_the_same_merge(tmp_path, ckpts, method, pact, params, workers):
    """``device=`` moves each layer's deltas to the device and D back: named as "cpu" every move
    is a no-op, so the result is the in-memory one bit for bit on every path (reducers, stacks,
    TIES' global one-task-at-a-time and per-layer filters). On a GPU scripts/gpu_check.sh runs it."""
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    kw = dict(params, core_frac=0.3) if pact else params
    want = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact, **kw)
    res = pactlib.merge_files(method, p0, ps, tmp_path / "out.safetensors", alpha=0.7, pact=pact, device="cpu",
                              workers=workers, **kw)
    _assert_identical(load_file(str(res.path)), want)


@pytest.mark.parametrize("method,pact,params,workers", [
    ("task_arithmetic", None, {}, 1), ("iso_c", "pact", {"svd": "rsvd"}, 1), ("tsv_m", "s-pact", {}, 1),
    ("iso_cts", "pact", {}, 1), ("ties", None, {"scope": "per_key"}, 1), ("ties", "pact", {"svd": "rsvd"}, 1)],
    ids=str)  # one worker: the fake device's dispatch mode holds in the thread that entered it only
def test_streamed_merge_on_a_device_moves_each_layer_there_and_back(tmp_path, ckpts, method, pact, params,
                                                                   workers):
    """On the fake accelerator of tests/fake_device.py (CPU values, CUDA's device rules: mixing
    devices in one op raises): every path of the streamed merge computes on the device and
    writes the CPU's numbers, bit for bit (the same kernels run)."""
    from fake_device import fake_gpu
    from pactlib.threads import single_threaded

    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    kw = dict(params, core_frac=0.3) if pact else params
    with single_threaded():  # as fake_gpu() runs
        want = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact, **kw)
    with fake_gpu() as dev:
        res = pactlib.merge_files(method, p0, ps, tmp_path / "out.safetensors", alpha=0.7, pact=pact, device=dev,
                                  workers=workers, **kw)
    _assert_identical(load_file(str(res.path)), want)


def test_a_device_torch_does_not_see_fails_before_any_output(tmp_path, ckpts, capsys):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    out = tmp_path / "out.safetensors"
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got 'gpu'"):
        pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, device="gpu")
    with pytest.raises(ValueError, match="got 'cuda:x'"):
        pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, device="cuda:x")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device cuda: torch sees no GPU"):
            pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, device="cuda")
        assert main(["merge", "--method", "iso_c", "--alpha", "1", "--pretrained", p0, "--finetuned", *ps,
                     "--out", str(out), "--device", "cuda"]) == 2
        assert "--device cuda: torch sees no GPU" in capsys.readouterr().err
    else:  # the index past the last GPU
        with pytest.raises(ValueError, match="GPU\\(s\\) here"):
            pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, device=f"cuda:{torch.cuda.device_count()}")
    assert not out.exists()
    assert main(["merge", "--method", "iso_c", "--alpha", "1", "--pretrained", p0, "--finetuned", *ps,
                 "--out", str(out), "--device", "auto"]) == 0
    _assert_identical(load_file(str(out)), pactlib.merge("iso_c", pre, fts, alpha=1.0))


@pytest.mark.parametrize("method,sig,rc,word,twice", [
    ("iso_cts", "SIGTERM", 143, "terminated (SIGTERM)", False), ("ties", "SIGTERM", 143, "terminated (SIGTERM)", False),
    ("iso_cts", "SIGINT", 130, "interrupted", False), ("ties", "SIGINT", 130, "interrupted", False),
    ("ties", "SIGHUP", 129, "terminated (SIGHUP)", False), ("ties", "SIGINT", 130, "interrupted", True)], ids=str)
def test_a_signal_mid_merge_leaves_no_output_and_no_temporary_files(tmp_path, method, sig, rc, word, twice):
    """``pact merge`` killed by SIGTERM (``timeout``, a scheduler), SIGHUP (a closed terminal) or
    Ctrl-C while it writes: exit status 128 + the signal, one line saying so (no traceback),
    nothing published and no temporary file or spill folder left next to the output (TIES +
    PACT spills its filtered task vectors there). A second Ctrl-C during the clean-up, with two
    workers, is ignored (it ended in std::terminate, found in a user trial)."""
    import signal
    import subprocess
    import sys
    import time

    g = torch.Generator().manual_seed(0)
    pre = {f"b{i}.weight": torch.randn(256, 256, generator=g) for i in range(40)}
    p0 = str(save_state_dict(pre, tmp_path / "pre.safetensors"))
    ps = [str(save_state_dict({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in pre.items()},
                              tmp_path / f"ft{t}.safetensors")) for t in range(3)]
    out = tmp_path / "out" / "m.safetensors"
    cmd = [sys.executable, "-m", "pactlib.cli", "merge", "--method", method, "--pact", "pact", "--alpha", "0.5",
           "--pretrained", p0, "--finetuned", *ps, "--out", str(out)] + (["--workers", "2"] if twice else [])
    # a background job (CI under nohup) inherits SIGINT (and SIGHUP) ignored, and pact then leaves
    # them so: give the child the default actions, as a terminal's foreground process has
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)])
    t0 = time.time()
    while not (out.parent.exists() and any(out.parent.iterdir())) and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.02)
    assert proc.poll() is None, "the merge ended before it could be interrupted: make it bigger"
    time.sleep(0.3)  # well inside the merge
    proc.send_signal(getattr(signal, sig))
    if twice:
        time.sleep(0.2)
        proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    # twice: a second Ctrl-C that lands after the clean-up (the handlers are back) ends the process
    # by SIGINT, which a shell reports as 130 too; during the clean-up it is ignored
    assert proc.returncode == rc or twice and proc.returncode == -getattr(signal, sig), err[-2000:]
    assert f"pact: {word}" in err and "Traceback" not in err and "terminate called" not in err
    assert sorted(p.name for p in out.parent.iterdir()) == []


def _sha(folder: Path) -> dict:
    import hashlib

    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_an_output_that_may_write_a_file_of_an_input_is_refused_before_any_work(tmp_path, ckpts, capsys):
    """Found in a user trial: --out inside an input folder, onto a shard or the index of a
    sharded input, or a single-file name whose shards would land on an input's, replaced the
    input and exited 0. Every such name is refused, naming both; the inputs are unchanged."""
    pre, fts = ckpts
    folder = tmp_path / "pre_model"
    folder.mkdir()
    save_state_dict(pre, folder / "model.safetensors")
    sharded = _sharded(tmp_path, fts[0], "model")  # model-0000i-of-00002.safetensors + model.safetensors.index.json
    (tmp_path / "x").mkdir()
    ps = [sharded, *_files(tmp_path / "x", pre, fts[1:])[1]]
    before = _sha(tmp_path)
    bad = [(folder / "model.safetensors", {}),  # a folder input's file
           (folder / "model.safetensors.index.json", {}),  # its single-file name is that file
           (tmp_path / "model-00001-of-00002.safetensors", {}),  # a shard of the sharded input
           (tmp_path / "model.safetensors.index.json", {}),  # its index
           (tmp_path / "model.safetensors", {"max_shard_size": 300})]  # would write its shards and index
    for out, kw in bad:
        with pytest.raises(ValueError, match="a file of the input|is the input"):
            pactlib.merge_files("iso_c", str(folder), ps, out, alpha=0.5, **kw)
        args = ["merge", "--method", "iso_c", "--alpha", "0.5", "--pretrained", str(folder), "--finetuned", *ps,
                "--out", str(out)] + (["--max-shard-size", "300"] if kw else [])
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("pact: error: --out ") and "overwrite" in err, err
    assert _sha(tmp_path) == before
    # a name of another family in the same folder is fine
    res = pactlib.merge_files("iso_c", str(folder), ps, tmp_path / "merged.safetensors", alpha=0.5)
    assert res.path.exists() and {k: v for k, v in _sha(tmp_path).items() if k != "merged.safetensors"} == before


def test_the_input_check_reads_what_the_reader_reads(tmp_path, ckpts):
    """Found in a second user trial. A folder input is read from one file (Hugging Face's order),
    not all of its files: the same merge run twice into that folder is not refused. An index's
    shards in a subfolder are protected where they are. A PEFT adapter's file (merge_files,
    not only the CLI) is protected too. And a name with glob characters removes only its own
    spill leftovers."""
    from pactlib.lazy import checkpoint_files, folder_checkpoint

    pre, fts = ckpts
    folder = tmp_path / "fp"
    folder.mkdir()
    save_state_dict(pre, folder / "model.safetensors")
    _, ps = _files(tmp_path, pre, fts)
    for _ in range(2):  # the second run: merged.safetensors now sits beside the input's file
        pactlib.merge_files("iso_c", str(folder), ps, folder / "merged.safetensors", alpha=0.5)
    assert checkpoint_files(folder) == [folder / "model.safetensors"]
    # Hugging Face's order: model.safetensors before a (stale) index and before pytorch_model.bin
    (folder / "pytorch_model.bin.index.json").write_text("{}")
    assert folder_checkpoint(folder) == folder / "model.safetensors"
    # an index whose weight_map points into a subfolder
    sub = tmp_path / "sub"
    (sub / "s").mkdir(parents=True)
    names = {"s/model-00001-of-00002.safetensors": list(fts[0])[:4], "s/model-00002-of-00002.safetensors": list(fts[0])[4:]}
    for f, ks in names.items():
        save_file({k: fts[0][k].contiguous() for k in ks}, str(sub / f))
    (sub / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, ks in names.items() for k in ks}}))
    before = _sha(sub)
    for out in (sub / "s" / "model.safetensors", sub / "s" / "model-00001-of-00002.safetensors"):
        with pytest.raises(ValueError, match="a file of the input"):
            pactlib.merge_files("iso_c", str(folder), [str(sub), *ps[1:]], out, alpha=0.5)
    assert _sha(sub) == before
    # glob characters in the output's name: another output's spill leftovers stay
    other = tmp_path / ".m1.safetensors.spill-abc"
    other.mkdir()
    own = tmp_path / ".m[1].safetensors.spill-xyz"
    own.mkdir()
    pactlib.merge_files("ties", str(folder), ps, tmp_path / "m[1].safetensors", alpha=0.5)
    assert other.is_dir() and not own.exists()


def test_merge_files_protects_a_peft_adapters_file(tmp_path):
    from pactlib.peft import AdapterSource

    pytest.importorskip("safetensors")
    g = torch.Generator().manual_seed(0)
    pre = {"lin.weight": torch.randn(6, 5, generator=g)}
    p0 = str(save_state_dict(pre, tmp_path / "pre.safetensors"))
    ad = tmp_path / "a1"
    ad.mkdir()
    save_file({"base_model.model.lin.lora_A.weight": torch.randn(2, 5, generator=g),
               "base_model.model.lin.lora_B.weight": torch.randn(6, 2, generator=g)},
              str(ad / "adapter_model.safetensors"))
    (ad / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2, "peft_type": "LORA"}))
    before = _sha(ad)
    with pytest.raises(ValueError, match="a file of the input"):
        pactlib.merge_files("task_arithmetic", p0, [AdapterSource(ad)], ad / "adapter_model.safetensors", alpha=1.0)
    assert _sha(ad) == before


def test_an_output_path_that_cannot_be_written_is_named_before_any_work(tmp_path, ckpts, monkeypatch, capsys):
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    (tmp_path / "adir.safetensors").mkdir()
    with pytest.raises(pactlib.CheckpointError, match="adir.safetensors is a folder"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "adir.safetensors", alpha=1.0)
    with pytest.raises(pactlib.CheckpointError, match="pre.safetensors is a file, not a folder"):
        pactlib.merge_files("iso_c", p0, ps, Path(p0) / "m.safetensors", alpha=1.0)
    (tmp_path / "o-00001-of-00002.safetensors").mkdir()  # a folder with a name the output may write
    with pytest.raises(pactlib.CheckpointError, match="o-00001-of-00002.safetensors is a folder with a name"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "o.safetensors", alpha=1.0)
    with pytest.raises(pactlib.CheckpointError, match="the name is too long; its temporary files would need"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / ("x" * 230 + ".safetensors"), alpha=1.0)
    with pytest.raises(ValueError, match=r"workers \(--workers\) must be a positive integer, got 0"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "new" / "o.safetensors", alpha=1.0, workers=0)
    assert not (tmp_path / "new").exists()  # refused before the output's folder is made
    with pytest.raises(ValueError, match="a meta device holds no values"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "o2.safetensors", alpha=1.0, device=torch.device("meta"))
    with pytest.raises(ValueError, match=r"PactOptions.seed must be in \[-2\*\*63, 2\*\*64\), got 18446744073709551616"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "o2.safetensors", alpha=1.0, pact="pact", seed=2**64)
    import pactlib.lazy as lazy

    monkeypatch.setattr(lazy.os, "access", lambda path, mode: False)  # root may write anywhere: simulate
    assert main(["merge", "--method", "iso_c", "--alpha", "1", "--pretrained", p0, "--finetuned", *ps,
                 "--out", str(tmp_path / "ro" / "m.safetensors")]) == 2
    assert f"cannot write into the folder {tmp_path}" in capsys.readouterr().err
    assert not (tmp_path / "ro").exists()


def test_a_new_output_removes_the_stale_files_of_an_earlier_one_under_its_name(tmp_path, ckpts):
    """Found in a user trial: a single-file output written where a sharded one had been kept the
    old shards and index, and a reader of the folder (which prefers the index) read the old
    model. Now the folder holds only the new output (and what is not the output's), and a
    warning names what was removed (a later trial: it went without a word)."""
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    out = tmp_path / "st" / "model.safetensors"
    first = pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, max_shard_size=300)
    n_first = len(first.files)
    assert n_first > 3 and not out.exists()
    (out.parent / "other.safetensors").write_bytes(b"x")  # not the output's
    (out.parent / ".model.safetensors.abc.tmp").write_bytes(b"left by a killed run")
    (out.parent / ".model.safetensors.spill-xyz").mkdir()
    with pytest.warns(UserWarning, match=rf"st: removed model-00001-of-0*{n_first - 1}.safetensors, .* and "
                      rf"{n_first - 1 - 4} more: the files of an earlier output named model.safetensors") as got:
        res = pactlib.merge_files("iso_c", p0, ps, out, alpha=0.1, max_shard_size=600)
    assert not any(".tmp" in str(w.message) for w in got)  # a killed run's file goes without a word
    names = sorted(f.name for f in out.parent.iterdir())
    assert names == sorted(["other.safetensors", *(f.name for f in res.files)])
    n = len(res.files) - 1  # the shards, and the index
    listed = ", ".join(["model.safetensors.index.json", *(f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, 4))])
    more = f" and {n - 3} more" if n > 3 else ""
    with pytest.warns(UserWarning, match=f"{listed}{more}: the files of an earlier output named model.safetensors"):
        pactlib.merge_files("iso_c", p0, ps, out, alpha=0.1)  # one file
    assert n > 2 and sorted(f.name for f in out.parent.iterdir()) == ["model.safetensors", "other.safetensors"]
    _assert_identical(_read(out.parent), pactlib.merge("iso_c", pre, fts, alpha=0.1))


def test_outputs_get_the_mode_open_would_give_them(tmp_path, ckpts):
    """mkstemp makes 0o600 files; a merged model is shared like any file the user writes."""
    import os

    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    old = os.umask(0o022)
    try:
        for out, kw in [(tmp_path / "a.safetensors", {}), (tmp_path / "b.pt", {}),
                        (tmp_path / "c.safetensors", {"max_shard_size": 300})]:
            res = pactlib.merge_files("iso_c", p0, ps, out, alpha=1.0, **kw)
            assert {oct(f.stat().st_mode & 0o777) for f in res.files} == {"0o644"}, out
    finally:
        os.umask(old)


def test_empty_matrix_keys_stream_through_every_path(tmp_path, ckpts):
    """A (0, n) matrix key is a zero-byte key: TIES + PACT's spill writes it once per task, which
    the writer took for the next key's start (found in a user trial)."""
    pre, fts = ckpts
    pre = {**pre, "e0": torch.zeros(0, 6), "e1": torch.zeros(6, 0)}
    fts = [{**f, "e0": torch.zeros(0, 6), "e1": torch.zeros(6, 0)} for f in fts]
    p0, ps = _files(tmp_path, pre, fts)
    for method in ("ties", "iso_c", "tsv_m"):
        res = pactlib.merge_files(method, p0, ps, tmp_path / f"{method}.safetensors", alpha=0.7, pact="pact",
                                  core_frac=0.3)
        _assert_identical(load_file(str(res.path)), pactlib.merge(method, pre, fts, alpha=0.7, pact="pact",
                                                                  core_frac=0.3))


def test_a_method_that_is_not_per_key_needs_a_streamed_form(tmp_path, ckpts, monkeypatch):
    from pactlib.merges import registry

    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    whole = registry.MergeMethod("whole", "Whole", "-", lambda tvs, *, rule: pactlib.TaskVector.sum(tvs),
                                 (1.0,), {}, per_key=False)
    monkeypatch.setitem(registry._REGISTRY, "whole", whole)
    with pytest.raises(ValueError, match="'whole' .* does not merge key by key .* use pactlib.merge"):
        pactlib.merge_files("whole", p0, ps, tmp_path / "o.safetensors", alpha=1.0)
    assert merges.get("ties").is_per_key({"scope": "per_key"}) and not merges.get("ties").is_per_key({})
    assert merges.get("task_arithmetic").elementwise and merges.get("iso_c").is_per_key({})


def test_merge_files_warns_on_hugging_face_attention_layout_as_merge_does(tmp_path):
    """Separate q/k/v (Hugging Face CLIP keys) merge differently from a fused in_proj_weight:
    merge_files says so, with pactlib.merge's words, once; open_clip keys get no such warning."""
    g = torch.Generator().manual_seed(0)
    hf = {f"vision_model.encoder.layers.0.self_attn.{p}_proj.weight": torch.randn(4, 4, generator=g) for p in "qkv"}
    fused = {"visual.transformer.resblocks.0.attn.in_proj_weight": torch.randn(12, 4, generator=g)}
    for sd, split in ((hf, True), (fused, False)):
        fts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in sd.items()} for _ in range(2)]
        p0, ps = _files(tmp_path, sd, fts)
        with pytest.warns(UserWarning) as streamed:
            pactlib.merge_files("iso_c", p0, ps, tmp_path / "m.safetensors", alpha=1.0)
            warnings.warn("sentinel", UserWarning)  # pytest.warns needs one warning when none is expected
        with pytest.warns(UserWarning) as memory:
            pactlib.merge("iso_c", sd, fts, alpha=1.0)
            warnings.warn("sentinel", UserWarning)
        said = [str(w.message) for w in streamed if "Hugging Face CLIP keys" in str(w.message)]
        assert said == ([str(w.message) for w in memory if "Hugging Face CLIP keys" in str(w.message)]
                        if split else [])
        assert len(said) == int(split)
        if split:
            assert said[0].startswith("iso_c: Hugging Face CLIP keys") and "naming='open_clip'" in said[0]


@pytest.mark.parametrize("method,pact", [("task_arithmetic", None), ("task_arithmetic", "pact"), ("tsv_m", None),
                                         ("tsv_m", "pact"), ("iso_c", None), ("iso_c", "pact"), ("iso_c", "s-pact"),
                                         ("iso_cts", None), ("iso_cts", "pact")])
def test_reducer_methods_read_one_task_at_a_time(tmp_path, ckpts, monkeypatch, method, pact):
    """Task Arithmetic and Iso-C (a running sum), TSV-M (each task's top triplets) and Iso-CTS (the
    sum, then each task against it) take the tasks one at a time: the streamed merge never builds a
    (T, m, n) stack of deltas. PACT reads each task's delta twice (subspaces, then filtering);
    Iso-CTS reads each matrix's deltas twice, or keeps PACT's filtered ones for its second pass.
    The result is still the in-memory one, bit for bit."""
    from pactlib.streaming import DeltaReader

    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    kw = dict(core_frac=0.3) if pact else {}
    want = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact, **kw)
    reads: list[tuple[str, int]] = []
    original = DeltaReader.delta

    def delta(self, key, t, *a, **k):
        reads.append((key, t))
        return original(self, key, t, *a, **k)

    def no_stack(*a, **k):
        raise AssertionError("a method with a reducer stacked the T deltas")

    import pactlib.streaming as streaming

    order_of = streaming.delta_order

    def delta_order(inputs):  # its chunks read first (the content order), then the merge's reads
        perm = order_of(inputs)
        reads.clear()
        return perm

    monkeypatch.setattr(DeltaReader, "deltas", no_stack)
    monkeypatch.setattr(DeltaReader, "delta", delta)
    monkeypatch.setattr(streaming, "delta_order", delta_order)
    res = pactlib.merge_files(method, p0, ps, tmp_path / "out.safetensors", alpha=0.7, pact=pact, **kw)
    _assert_identical(load_file(str(res.path)), want)
    T = len(fts)
    matrices = {k for k, v in pre.items() if MatrixRule().kind(k, v) == "matrix"}
    for key in (k for k in pre if torch.is_floating_point(pre[k])):
        order = [t for k, t in reads if k == key]
        twice = (pact is not None or method == "iso_cts") and key in matrices
        assert order == (list(range(T)) * (2 if twice else 1)), key


def test_a_method_without_a_reducer_still_stacks(tmp_path, ckpts, monkeypatch):
    """TIES per key trims each key's stack: the (T, m, n) stack path (the check above can fail)."""
    from pactlib.streaming import DeltaReader

    assert merges.get("ties").reducer is None
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)

    def no_stack(*a, **k):
        raise AssertionError("stacked")

    monkeypatch.setattr(DeltaReader, "deltas", no_stack)
    with pytest.raises(AssertionError, match="stacked"):
        pactlib.merge_files("ties", p0, ps, tmp_path / "out.safetensors", alpha=0.7, scope="per_key")


_RETAIN = """
import ctypes, sys, torch
from pactlib.streaming import return_freed_memory
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
print(return_freed_memory() if sys.argv[1] == "set" else "-")
a = torch.empty(4 << 20)  # 16 MB, mapped; freeing it raises glibc's dynamic threshold above 16 MB
del a
before = libc.mallinfo2().hblks
b = torch.empty(4 << 20)  # mapped again only with the fixed threshold
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux (glibc) only")
def test_return_freed_memory_maps_layer_sized_buffers(monkeypatch):
    """glibc's dynamic map threshold serves a 16 MB buffer from the heap once one was freed (where
    small survivors keep freed memory from going back); after return_freed_memory it gets its own
    map again (unmapped when freed): mallinfo2's count of mapped blocks shows which."""
    import subprocess
    import sys

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    run = lambda how: subprocess.run([sys.executable, "-c", _RETAIN, how], capture_output=True, text=True,  # noqa: E731
                                     check=False).stdout.split()
    out = run("set")
    if len(out) != 2 or out[0] != "True":
        pytest.skip("not glibc >= 2.33 (mallopt / mallinfo2)")
    assert int(out[1]) == 1
    assert int(run("default")[1]) == 0  # the control: from the heap without the call
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    from pactlib.streaming import return_freed_memory

    assert return_freed_memory() is False  # the user's own setting is kept


def test_global_ties_with_pact_filters_one_task_at_a_time(tmp_path, ckpts, monkeypatch):
    """TIES' first pass with PACT (one worker) filters each layer from its tasks read one at a
    time and spills each filtered task as it comes: no selected layer is read as a (T, m, n) stack;
    the merge is still the in-memory one, bit for bit."""
    from pactlib.streaming import DeltaReader

    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    want = pactlib.merge("ties", pre, fts, alpha=0.7, pact="pact", core_frac=0.3)
    stacked = []  # keys read into a (T, rows…) stack: all at once, or task by task into its rows
    original, one = DeltaReader.deltas, DeltaReader.delta
    monkeypatch.setattr(DeltaReader, "deltas", lambda self, key, *a, **k: stacked.append(key) or original(self, key, *a, **k))
    monkeypatch.setattr(DeltaReader, "delta", lambda self, key, *a, **k: (k.get("out") is not None and stacked.append(key))
                        or one(self, key, *a, **k))
    res = pactlib.merge_files("ties", p0, ps, tmp_path / "out.safetensors", alpha=0.7, pact="pact", core_frac=0.3)
    _assert_identical(load_file(str(res.path)), want)
    matrices = {lr.key for lr in res.report.layers}
    assert matrices and not matrices & set(stacked) and stacked  # the other keys still come in stacked chunks


@pytest.mark.parametrize("method", ["tsv_m", "iso_c", "iso_cts"])
def test_streamed_merge_keeps_the_small_real_directions_of_a_full_rank_layer(tmp_path, method, gen):
    """One task whose update of a (64, 48) layer is full rank with singular values from 1 to 1e-6:
    the streamed merge (reducer or stack), in memory, and on the fake accelerator make the same
    merge, and the default null_space="drop" is the reference's "literal" one there."""
    from fake_device import fake_gpu
    from pactlib.threads import single_threaded
    from test_merge_invariance import log_spectrum

    pre = {"lin.weight": torch.randn(64, 48, generator=gen), "lin.bias": torch.randn(64, generator=gen)}
    ft = {"lin.weight": pre["lin.weight"] + log_spectrum(64, 48, 1e-6, gen), "lin.bias": pre["lin.bias"] + 0.1}
    p0, ps = _files(tmp_path, pre, [ft])
    want = pactlib.merge(method, pre, [ft], alpha=1.0, null_space="literal")
    for kw in ({}, {"null_space": "literal"}):
        res = pactlib.merge_files(method, p0, ps, tmp_path / "out.safetensors", alpha=1.0, **kw)
        got = load_file(str(res.path))
        torch.testing.assert_close(got["lin.weight"], want["lin.weight"], rtol=0, atol=1e-6)
    _assert_identical(got, pactlib.merge(method, pre, [ft], alpha=1.0, null_space="literal"))
    _assert_identical(load_file(str(pactlib.merge_files(method, p0, ps, tmp_path / "d.safetensors", alpha=1.0).path)),
                      pactlib.merge(method, pre, [ft], alpha=1.0))
    with single_threaded():
        here = pactlib.merge(method, pre, [ft], alpha=1.0)
    with fake_gpu() as dev:
        res = pactlib.merge_files(method, p0, ps, tmp_path / "g.safetensors", alpha=1.0, device=dev)
    _assert_identical(load_file(str(res.path)), here)
    torch.testing.assert_close(here["lin.weight"], want["lin.weight"], rtol=0, atol=1e-6)


def test_empty_tensors_come_in_one_order_in_every_run(tmp_path):
    """Empty tensors share their offset with a neighbour; safetensors orders such ties in a
    per-process hash order, read_layout by (begin, end, key): merged files are the same bytes in
    every run (a run of six empties has 720 orders, so a hash order passes by chance rarely)."""
    import subprocess
    import sys

    from pactlib.safetensors_io import read_layout

    g = torch.Generator().manual_seed(0)
    pre = {"w": torch.randn(50, 3, generator=g), **{f"e{i}": torch.zeros(0) for i in (5, 1, 4, 0, 3, 2)},
           "z": torch.zeros(3, 0)}
    save_file(pre, str(tmp_path / "pre.safetensors"))
    layout, _ = read_layout(tmp_path / "pre.safetensors")
    with open(tmp_path / "pre.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    spans = {k: tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}
    assert list(layout) == sorted(spans, key=lambda k: (*spans[k], k))
    for t in range(3):
        save_file({k: v + 0.1 * (t + 1) for k, v in pre.items()}, str(tmp_path / f"ft{t}.safetensors"))
    outs = []
    for run in range(2):  # two processes: two hash seeds in safetensors
        out = tmp_path / f"m{run}.safetensors"
        subprocess.run([sys.executable, "-m", "pactlib.cli", "merge", "--method", "task_arithmetic",
                        "--pretrained", str(tmp_path / "pre.safetensors"), "--alpha", "0.3", "--out", str(out),
                        "--finetuned", *(str(tmp_path / f"ft{t}.safetensors") for t in range(3))],
                       check=True, capture_output=True, env={**os.environ, "PACT_NATIVE": "0"})
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert list(read_layout(tmp_path / "m0.safetensors")[0]) == list(layout)


def test_read_layout_orders_by_begin_end_key_whatever_the_header_order(tmp_path):
    """read_layout's order (from safe_open's, ties by key) is the header's entries sorted by
    (begin, end, key), on headers written in a random order with empty entries among the others,
    each file read several times (safetensors' hash order differs from one read to the next)."""
    import random

    from pactlib.safetensors_io import _data_order, _header, header_bytes, read_layout, tensor_bytes

    rng = random.Random(0)
    shapes = [(0,), (3, 0), (2, 3), (5,), (), (0, 4)]
    dtypes = [torch.float32, torch.float16, torch.int64, torch.bool]
    for i in range(40):
        entries = [(f"k{rng.randrange(100)}_{j}", rng.choice(shapes), rng.choice(dtypes))
                   for j in range(rng.randint(1, 12))]
        path = tmp_path / f"f{i}.safetensors"
        path.write_bytes(header_bytes(entries, None) + bytes(sum(tensor_bytes(s, d) for _, s, d in entries)))
        want = _data_order(_header(path)[1])
        for _ in range(3):
            layout, _ = read_layout(path)
            assert list(layout) == want
            assert all(layout[k] == (s, d) for k, s, d in entries)


def test_merge_files_to_a_folder_says_it_writes_a_file(tmp_path, ckpts):
    """A user trial: ``merge_files(..., "dir/")`` failed with "unknown checkpoint extension
    '(none)'", the slash dropped. A folder is named as such, with the file to give instead."""
    pre, fts = ckpts
    p0, ps = _files(tmp_path, pre, fts)
    (tmp_path / "there").mkdir()
    for out in (f"{tmp_path / 'new'}/", f"{tmp_path / 'there'}/", tmp_path / "there"):
        with pytest.raises(pactlib.CheckpointError, match=rf"{out} is a folder; name the output file \(e.g. "
                                                          r".*model.safetensors\): .*pact merge --out DIR/"):
            pactlib.merge_files("task_arithmetic", p0, ps, out, alpha=1.0)
    assert not (tmp_path / "new").exists() and not list((tmp_path / "there").iterdir())
