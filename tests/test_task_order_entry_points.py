"""Every entry point merges the SET of tasks (pactlib.order): ``pact merge`` on both paths,
``merge_files``, ``pact_filter`` called directly and the testbeds' streamed merge give the same
bytes for any order of the same tasks, the same bytes as each other where they claim it, and
name and report the tasks in the caller's order."""
from __future__ import annotations

import itertools

import pytest
import torch
from safetensors.torch import load_file, save_file

import pactlib
from pactlib import native
from pactlib.matrix import MatrixRule
from pactlib.pact import PactOptions, pact_filter
from tests.conftest import make_checkpoints
from tests.test_fastpath import run

T = 4
#: three orders of four tasks, the given one first
ORDERS = [(0, 1, 2, 3), (2, 0, 3, 1), (3, 2, 1, 0)]
#: (method, --set) pairs of the torch path
TORCH_MERGES = [("task_arithmetic", []), ("ties", ["k=30"]), ("ties", ["k=30", "scope=per_key"]), ("tsv_m", []),
                ("iso_c", []), ("iso_cts", [])]


def _files(tmp_path, dtype=torch.float32):
    pre, fts = make_checkpoints(T, seed=43, dtype=dtype)
    save_file(pre, tmp_path / "base.safetensors")
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
    return pre, fts, str(tmp_path / "base.safetensors"), paths


def _cli(monkeypatch, capsys, argv, *, fast: bool):
    """``pact merge argv`` through test_fastpath's runner, which must succeed: (JSON line, stderr)."""
    rc, line, err = run(argv, monkeypatch, capsys, fast=fast)
    assert rc == 0, err
    return line, err


def _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, *, fast, extra=(), tag=""):
    """The output bytes of ``pact merge`` for each order of ORDERS, and the stderr of each."""
    outs, errs = [], []
    for i, order in enumerate(ORDERS):
        out = tmp_path / f"{'fast' if fast else 'torch'}{tag}{i}" / "m.safetensors"
        argv = ["--method", method, "--alpha", "0.4", "--pretrained", base, "--finetuned",
                *[fts[t] for t in order], "--out", str(out), *extra]
        if sets:
            argv += ["--set", *sets]
        _, err = _cli(monkeypatch, capsys, argv, fast=fast)
        outs.append(out.read_bytes())
        errs.append(err)
    return outs, errs


@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
@pytest.mark.parametrize("method,sets", TORCH_MERGES)
def test_pact_merge_torch_path_gives_the_same_bytes_for_every_order(tmp_path, monkeypatch, capsys, method, sets,
                                                                    pact):
    pre, fts_sd, base, fts = _files(tmp_path)
    extra = ["--pact", pact, "--set", "core_frac=0.3"] if pact else []
    outs, _ = _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, fast=False, extra=extra)
    assert outs[0] == outs[1] == outs[2], f"{method} {sets} / {pact}: another order, other bytes"
    # the in-memory merge of the same set, in yet another order, is the same bits
    params = dict(s.split("=") for s in sets)
    params = {k: (float(v) if k == "k" else v) for k, v in params.items()}
    kw = dict(core_frac=0.3) if pact else {}
    want = pactlib.merge(method, pre, [fts_sd[t] for t in (1, 3, 0, 2)], alpha=0.4, pact=pact, **kw, **params)
    got = load_file(str(tmp_path / "torch0" / "m.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the fast path is off")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method,sets", [("task_arithmetic", []), ("ties", ["k=30"]),
                                         ("ties", ["k=30", "scope=per_key"])])
def test_fast_path_gives_the_torch_paths_bytes_for_every_order(tmp_path, monkeypatch, capsys, method, sets, dtype):
    _, _, base, fts = _files(tmp_path, dtype)
    fast, _ = _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, fast=True)
    slow, _ = _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, fast=False)
    assert fast[0] == fast[1] == fast[2] == slow[0] == slow[1] == slow[2]
    if method == "ties":  # any number of threads: the same bytes
        more, _ = _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, fast=True,
                                extra=["--workers", "2"], tag="w2")
        torch2, _ = _merge_orders(tmp_path, monkeypatch, capsys, base, fts, method, sets, fast=False,
                                  extra=["--workers", "2"], tag="w2")
        assert more == fast and torch2 == fast


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the fast path is off")
@pytest.mark.parametrize("fast", [True, False])
def test_warnings_name_the_tasks_in_the_callers_order(tmp_path, monkeypatch, capsys, fast):
    """Two identical fine-tunes and an all-zero one: the warnings name them as given, whatever the
    content order merged them in."""
    pre, fts_sd, base, fts = _files(tmp_path)
    save_file(pre, tmp_path / "zero.safetensors")
    save_file(fts_sd[1], tmp_path / "again.safetensors")
    given = [fts[1], str(tmp_path / "zero.safetensors"), fts[0], str(tmp_path / "again.safetensors")]
    errs = []
    for i, order in enumerate([(0, 1, 2, 3), (3, 2, 1, 0)]):
        out = tmp_path / f"w{fast}{i}" / "m.safetensors"
        _, err = _cli(monkeypatch, capsys, ["--method", "task_arithmetic", "--alpha", "0.4", "--pretrained", base,
                                            "--finetuned", *[given[t] for t in order], "--out", str(out)], fast=fast)
        errs.append(err)
    assert f"'{given[0]}' and '{given[3]}' are identical" in errs[0]
    assert f"'{given[3]}' and '{given[0]}' are identical" in errs[1]
    assert "zero.safetensors" in errs[0] and "is all zero" in errs[0]
    a, b = (tmp_path / f"w{fast}{i}" / "m.safetensors" for i in (0, 1))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("pact,options", [("pact", PactOptions(core_frac=0.3)),
                                          ("pact", PactOptions(core_frac=0.3, svd="rsvd", seed=3)),
                                          ("s-pact", PactOptions(core_frac=0.3))])
def test_merge_files_reports_in_the_callers_order_and_workers_do_not_matter(tmp_path, pact, options):
    pre, fts_sd, base, fts = _files(tmp_path)
    seen, data = {}, set()
    for i, (order, workers) in enumerate(zip(ORDERS, (1, 2, 1))):
        res = pactlib.merge_files("iso_c", base, [fts[t] for t in order], tmp_path / f"o{i}.safetensors", alpha=0.4,
                                  pact=pact, options=options, workers=workers)
        data.add(res.path.read_bytes())
        seen[order] = {lr.key: {order[c]: (lr.active_rank[c], lr.lbw_rank[c], lr.shield_rank[c], lr.capped[c],
                                           lr.removed_energy[c]) for c in range(T)} for lr in res.report.layers}
    assert len(data) == 1
    first = seen[ORDERS[0]]
    assert first and all(s == first for s in seen.values())
    # the in-memory report of the same set agrees, task by task
    _, report = pactlib.merged_update("iso_c", pre, pactlib.task_vectors_from(pre, fts_sd), pact=pact,
                                      options=options)
    assert {lr.key: {t: (lr.active_rank[t], lr.lbw_rank[t], lr.shield_rank[t], lr.capped[t], lr.removed_energy[t])
                     for t in range(T)} for lr in report.layers} == first


@pytest.mark.parametrize("mode,options", [("pact", PactOptions(core_frac=0.3)),
                                          ("pact", PactOptions(core_frac=0.3, svd="rsvd", seed=5)),
                                          ("s-pact", PactOptions(core_frac=0.3))])
def test_pact_filter_gives_each_task_the_same_filtered_vector_in_every_order(mode, options):
    pre, fts = make_checkpoints(T, seed=43)
    tvs = pactlib.task_vectors_from(pre, fts)
    got = {}
    for order in itertools.permutations(range(T)):
        out, report = pact_filter(pre, [tvs[t] for t in order], mode=mode, options=options)
        assert [tv.name for tv in out] == [tvs[t].name for t in order]  # in the order given
        for c, t in enumerate(order):
            mine = (out[c], {lr.key: lr.removed_energy[c] for lr in report.layers})
            if t not in got:
                got[t] = mine
            else:
                assert all(torch.equal(out[c][k], got[t][0][k]) for k in out[c]), (order, t)
                assert mine[1] == got[t][1]
        # filter, then merge: the bytes of one merge with PACT, for the filtered vectors in any order
        D, _ = pactlib.merged_update("tsv_m", pre, [out[c] for c in reversed(range(T))])
        want, _ = pactlib.merged_update("tsv_m", pre, tvs, pact=mode, options=options)
        assert all(torch.equal(D[k], want[k]) for k in want)


class _FileTestbed:
    """The least of a testbed whose checkpoints are files (pactlib.testbeds.engine.merge_sources)."""

    name, kind, seed, device = "order-files", "full", 0, None

    def __init__(self, folder, pre, base, fts, order):
        self.pretrained, self.rule, self.cache_dir = pre, MatrixRule(), folder / "cache"
        self.base, self.fts = base, [fts[t] for t in order]
        self.tasks = [f"task{t}" for t in order]

    def merge_sources(self):
        from pactlib.lazy import open_checkpoint

        return open_checkpoint(self.base), [open_checkpoint(f, name=n) for f, n in zip(self.fts, self.tasks)]


@pytest.mark.parametrize("method,pact", [("iso_cts", None), ("tsv_m", "pact"), ("iso_c", "s-pact"), ("ties", "pact")])
def test_the_testbeds_streamed_merge_is_a_function_of_the_task_set(tmp_path, method, pact):
    from pactlib.testbeds import base as tbase

    pre, fts_sd, base, fts = _files(tmp_path)
    opts = PactOptions(core_frac=0.3) if pact else None
    Ds, reports = [], []
    for order in ORDERS:
        tb = _FileTestbed(tmp_path, pre, base, fts, order)
        D, report = tbase.streamed_update(tb, method, pact=pact, options=opts)
        D2, _ = tbase.streamed_update(tb, method, pact=pact, options=opts)  # from the filtered-layer cache
        assert all(torch.equal(D[k], D2[k]) for k in D)
        Ds.append(D)
        if report is not None:
            reports.append({lr.key: {order[c]: lr.removed_energy[c] for c in range(T)} for lr in report.layers})
    assert all(torch.equal(D[k], Ds[0][k]) for D in Ds for k in D)
    assert all(r == reports[0] for r in reports)
    tvs = pactlib.task_vectors_from(pre, [fts_sd[t] for t in (1, 0, 3, 2)])
    want, _ = pactlib.merged_update(method, pre, tvs, pact=pact, options=opts)
    assert all(torch.equal(Ds[0][k], want[k]) for k in want)
