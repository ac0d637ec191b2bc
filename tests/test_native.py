"""The fused C passes of the streamed global TIES (pactlib.native) against the torch expressions
they replace, bit for bit: the radix histograms, the trim with its ties kept by position, and the
election and disjoint mean with sums over tasks in task_sum's order; and that order itself: one
per entry, whatever the chunking."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pactlib import native
from pactlib.merges.ties import GlobalThreshold, ties_kernel, trim_count
from pactlib.merges.ties import task_sum as ties_task_sum

ROOT = Path(__file__).resolve().parents[1]
lib = native.library()
needs_lib = pytest.mark.skipif(lib is None, reason="no C compiler")


def _stack(T: int, n: int, seed: int = 0) -> torch.Tensor:
    """(T, n) float32 with magnitudes over many octaves (sums that round differently in another
    order), a third of the entries rounded to integers (many ties at the thresholds), signed zeros."""
    g = torch.Generator().manual_seed(seed)
    st = torch.randn(T, n, generator=g) * torch.exp(4 * torch.randn(T, n, generator=g))
    st[:, : n // 3] = st[:, : n // 3].round()
    st[:, n // 3: n // 3 + 5] = 0.0
    st[0, n // 3 + 5: n // 3 + 9] = -0.0
    return st


def _thresholds(st: torch.Tensor, chunks: int = 1) -> tuple[GlobalThreshold, GlobalThreshold]:
    """The same thresholds counted by torch (first) and by the C histograms (second), each pass
    over ``chunks`` pieces of every row; asserts the counts of every pass are equal."""
    T, n = st.shape
    a, b = (GlobalThreshold(T, trim_count(n, 20.0), torch.float32) for _ in range(2))
    while not a.done:
        for piece in st.tensor_split(chunks, dim=1):
            for t in range(T):
                a.observe(t, piece[t])
                native.digit_hist(lib, piece[t], b.prefix[t], b.shift, b.hist[t])
        assert torch.equal(a.hist, b.hist)
        a.end_pass()
        b.end_pass()
    assert (a.prefix, a.rank, a.above) == (b.prefix, b.rank, b.above)
    return a, b


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@needs_lib
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8, 13, 16, 17, 20, 33, 64, 100])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 31, 32, 48, 63, 64, 97, 3001, 3040, 4096])
def test_merge_is_torch_bit_for_bit(T, n):
    """One chunk: trim (ties by position), elect, disjoint mean; the same bits as trim_stack then
    ties_kernel, with and without its work buffers, for task counts on both sides of the cascade's
    16-row level and column counts around the C kernel's vector widths."""
    st = _stack(T, n, seed=T * 7919 + n)
    a, b = _thresholds(st)
    want = ties_kernel(torch.stack([st[t] * a.mask(t, st[t]) for t in range(T)]))
    a._left = None
    want_work = ties_kernel(torch.stack([st[t] * a.mask(t, st[t], work={}) for t in range(T)]), work={})
    left = torch.tensor(b.pending_ties())
    got = native.ties_merge(lib, st, torch.tensor(b.prefix), left, torch.empty(n), native.merge_workspace(T))
    assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(_bits(got), _bits(want_work))
    assert left.tolist() == [0] * T  # every tie kept by the end of the task vector


@needs_lib
def test_ties_carry_over_from_chunk_to_chunk():
    """Chunks of one task vector in position order: the ties kept are the first ones of the whole
    vector, as the in-memory trim keeps them, and the counters advance as GlobalThreshold.mask's."""
    T, n = 6, 5000
    st = _stack(T, n, seed=3)
    st[:, :] = st.round()  # every magnitude an integer: thousands of ties at each threshold
    a, b = _thresholds(st, chunks=7)
    assert max(a.rank) > 1
    want = ties_kernel(torch.stack([st[t] * a.mask(t, st[t]) for t in range(T)]))
    outs, work = [], native.merge_workspace(T)
    for piece in st.tensor_split(5, dim=1):
        left = torch.tensor(b.pending_ties())
        outs.append(native.ties_merge(lib, piece.contiguous(), torch.tensor(b.prefix), left,
                                      torch.empty(piece.shape[1]), work))
        b.set_pending_ties(left.tolist())
    assert torch.equal(_bits(torch.cat(outs)), _bits(want))
    assert b.pending_ties() == [0] * T


@pytest.mark.parametrize("T", [1, 2, 5, 16, 17, 20, 33, 64, 300])
def test_task_sum_is_one_order_for_every_column(T):
    """task_sum is ATen's cascade on every column: equal to torch.sum on whole groups of 64
    columns, and on any column the same bits whether summed alone or with others."""
    st = _stack(T, 640, seed=T)
    assert torch.equal(_bits(ties_task_sum(st)), _bits(torch.sum(st, 0)))
    cols = torch.cat([ties_task_sum(st[:, j:j + 1].contiguous()) for j in range(0, 640, 37)])
    assert torch.equal(_bits(cols), _bits(ties_task_sum(st)[::37]))
    if T <= 16:  # sequential, from 0
        acc = torch.zeros(640)
        for r in st:
            acc = acc + r
        assert torch.equal(_bits(ties_task_sum(st)), _bits(acc + 0.0))


@needs_lib
def test_bad_inputs_are_named():
    st, w = torch.zeros(2, 32), native.merge_workspace(2)
    v, left, out = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.empty(32)
    with pytest.raises(ValueError, match="stack: expected a float32"):
        native.ties_merge(lib, st.double(), v, left, out, w)
    with pytest.raises(ValueError, match="1 to 255 task rows"):
        native.ties_merge(lib, torch.zeros(256, 32), torch.zeros(256, dtype=torch.int64),
                          torch.zeros(256, dtype=torch.int64), out, native.merge_workspace(256))
    with pytest.raises(ValueError, match="out: expected 32"):
        native.ties_merge(lib, st, v, left, torch.empty(31), w)
    with pytest.raises(ValueError, match="left: expected 2"):
        native.ties_merge(lib, st, v, torch.zeros(3, dtype=torch.int64), out, w)
    with pytest.raises(ValueError, match="work: too small"):
        native.ties_merge(lib, st, v, left, out, torch.empty(10))
    with pytest.raises(ValueError, match="hist: expected 65536"):
        native.digit_hist(lib, st[0], 0, 16, torch.zeros(10, dtype=torch.int64))


@needs_lib
@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_same_bits_without_avx512(capability):
    """The torch path's bits do not depend on the SIMD level torch dispatches to: the probe the
    library runs at load passes under AVX2 and without SIMD as under AVX-512."""
    code = "from pactlib import native; import sys; sys.exit(0 if native.library() is not None else 3)"
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    assert native.library() is None


def _files(tmp_path: Path, T: int) -> tuple[str, list[str]]:
    """θ0 and T fine-tuned float32 files: odd shapes (chunks whose columns end in every group of
    torch's sum, keys narrower than 16 entries), quantized deltas (ties at the thresholds)."""
    g = torch.Generator().manual_seed(T)
    shapes = {"a.weight": (37, 19), "b.weight": (64, 48), "bias": (10,), "c.weight": (5, 3001), "scale": ()}
    pre = {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}
    save_file(pre, tmp_path / "pre.safetensors")
    paths = []
    for t in range(T):
        ft = {k: v + torch.round(torch.randn(v.shape, generator=g) * 3000 * 10 ** (t % 3 - 4)) / 3000
              for k, v in pre.items()}
        paths.append(str(tmp_path / f"ft{t}.safetensors"))
        save_file(ft, paths[-1])
    return str(tmp_path / "pre.safetensors"), paths


@needs_lib
@pytest.mark.parametrize("T", [3, 20])
def test_streamed_ties_is_the_same_with_and_without_native(tmp_path, monkeypatch, T):
    """`pact merge`'s global TIES in chunks of a few rows and of whole keys, with one and two
    workers, with the C passes and with the torch passes: the in-memory merge's bytes every time."""
    import pactlib
    from pactlib.streaming import merge_files

    pre, fts = _files(tmp_path, T)
    mem = pactlib.merge("ties", load_file(pre), [load_file(f) for f in fts], alpha=0.7, k=20.0, scope="global")
    for use, chunk_bytes, workers in ((lib, T * 4 * 3001, 1), (lib, T * 4 * 3001, 2), (lib, 1 << 26, 1),
                                      (lib, T * 4 * 19 * 3, 2), (None, T * 4 * 19 * 3, 1), (None, 1 << 26, 2)):
        monkeypatch.setattr(native, "_lib", [use])
        out = tmp_path / f"{use is None}-{chunk_bytes}-{workers}.safetensors"
        merge_files("ties", pre, fts, out, alpha=0.7, k=20.0, scope="global", chunk_bytes=chunk_bytes,
                    workers=workers)
        got = load_file(out)
        for key in mem:
            assert torch.equal(_bits(got[key]), _bits(mem[key])), (key, use, chunk_bytes, workers)


@needs_lib
@pytest.mark.parametrize("dtype,code", [(torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16")])
def test_deltas_of_raw_bytes_are_torchs_with_value_equality_for_identical_pairs(dtype, code):
    import ctypes

    g = torch.Generator().manual_seed(5)
    pre = torch.randn(1000, generator=g).to(dtype)
    fts = [(pre.float() + 0.1 * torch.randn(1000, generator=g)).to(dtype) for _ in range(3)]
    pre[7] = fts[0][7] = 0.0
    fts.append(fts[0].clone())  # task 3 equals task 0 as values: its Δ[7] is −0, task 0's +0
    fts[3][7] = -0.0
    fts.append(pre.clone())  # task 4 is all zero
    T = len(fts)
    addrs = (ctypes.c_void_p * T)(*(f.data_ptr() for f in fts))
    codes = (ctypes.c_int32 * T)(*([native.CODES[code]] * T))
    nonzero, same = (ctypes.c_uint8 * T)(), (ctypes.c_uint8 * (T * T))(*([1] * (T * T)))
    stack = torch.empty(T, 1000)
    lib.pact_deltas(pre.data_ptr(), native.CODES[code], addrs, codes, T, 1000, stack.data_ptr(), nonzero, same, 1)
    want = torch.stack([f.float() - pre.float() for f in fts])
    assert torch.equal(want.view(torch.int32), stack.view(torch.int32))
    assert list(nonzero) == [1, 1, 1, 1, 0]
    pairs = {(i, k) for i in range(T) for k in range(i + 1, T) if same[i * T + k]}
    assert pairs == {(i, k) for i in range(T) for k in range(i + 1, T) if torch.equal(want[i], want[k])} == {(0, 3)}
    same = (ctypes.c_uint8 * (T * T))(*([1] * (T * T)))  # by bits: −0 differs from +0
    lib.pact_deltas(pre.data_ptr(), native.CODES[code], addrs, codes, T, 1000, stack.data_ptr(), nonzero, same, 2)
    assert not any(same[i * T + k] for i in range(T) for k in range(i + 1, T))


@needs_lib
@pytest.mark.parametrize("dtype,code", [(torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16")])
def test_apply_is_task_vector_apply_to_and_counts_overflows(dtype, code):
    from pactlib.checks import MergeOverflowError
    from pactlib.taskvector import TaskVector

    g = torch.Generator().manual_seed(6)
    pre = torch.randn(3000, generator=g).to(dtype)
    D = torch.randn(3000, generator=g) * torch.exp(2 * torch.randn(3000, generator=g))
    out = torch.empty_like(pre)
    bad = native.apply(lib, D.data_ptr(), pre.data_ptr(), native.CODES[code], 3000, 0.7, out.data_ptr())
    want = TaskVector._wrap({"w": D.clone()}).apply_to({"w": pre}, 0.7)["w"]
    assert bad == 0 and torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    D[5] = 1e5  # beyond float16's range after α·D + θ0
    bad = native.apply(lib, D.data_ptr(), pre.data_ptr(), native.CODES[code], 3000, 0.7, out.data_ptr())
    assert bad == (1 if dtype == torch.float16 else 0)
    if dtype == torch.float16:
        with pytest.raises(MergeOverflowError):
            TaskVector._wrap({"w": D.clone()}).apply_to({"w": pre}, 0.7)


@needs_lib
@pytest.mark.parametrize("dtype,code", [(torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16")])
def test_radix_passes_on_raw_task_vectors_find_global_thresholds_thresholds(dtype, code):
    """pact_digit_hist_delta counts |θt − θ0| as GlobalThreshold.observe counts Δt, and
    pact_select_digit picks the digit GlobalThreshold.end_pass picks, ties and all."""
    import ctypes

    g = torch.Generator().manual_seed(8)
    pre = torch.randn(20000, generator=g).to(dtype)
    ft = (pre.float() + (torch.randint(-4, 5, (20000,), generator=g) * 0.0625)).to(dtype)  # many ties
    d = ft.float() - pre.float()
    for keep in (1, 777, 4000, 20000):
        gt = GlobalThreshold(1, keep, torch.float32)
        hist = torch.zeros(1 << 16, dtype=torch.int64)
        prefix, rank, shift = 0, keep, 16
        while not gt.done:
            gt.observe(0, d)
            hist.zero_()
            nz = lib.pact_digit_hist_delta(pre.data_ptr(), native.CODES[code], ft.data_ptr(), native.CODES[code],
                                           20000, prefix, shift, hist.data_ptr())
            assert nz == 1 and torch.equal(hist, gt.hist[0])
            higher = ctypes.c_int64()
            j = lib.pact_select_digit(hist.data_ptr(), rank, ctypes.byref(higher))
            gt.end_pass()
            rank, prefix, shift = rank - higher.value, (prefix << 16) | j, shift - 16
            assert (prefix, rank) == (gt.prefix[0], gt.rank[0])
    zero = lib.pact_digit_hist_delta(pre.data_ptr(), native.CODES[code], pre.data_ptr(), native.CODES[code], 20000, 0,
                                     16, hist.data_ptr())
    assert zero == 0
