"""The streamed merge's I/O: reads with pread from files opened once (no memory map), buffers
reused chunk after chunk, and the allocator settings ``pact merge`` asks for."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pactlib.checks import CheckpointError
from pactlib.lazy import open_checkpoint
from pactlib.merges.ties import ties_kernel
from pactlib.streaming import CHUNK_BYTES, DeltaReader, allocator_settings


@pytest.fixture
def sd():
    g = torch.Generator().manual_seed(3)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(11, generator=g),
            "c": torch.randn(3, 4, 2, generator=g).to(torch.float16), "d": torch.tensor(2.5, dtype=torch.float64),
            "e": torch.arange(6, dtype=torch.int64).reshape(2, 3), "f": torch.empty(0, 4)}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().reshape(-1).view(torch.uint8)


def test_read_is_safetensors_bytes(tmp_path, sd):
    """Whole keys, rows along dim 0 and 1 (clipped as a slice is), with and without ``out``: the
    bytes safetensors' own reader gives."""
    f = tmp_path / "m.safetensors"
    save_file(sd, f)
    ck = open_checkpoint(f)
    with safe_open(str(f), framework="pt") as ref:
        for k in sd:
            assert torch.equal(_bits(ck.read(k)), _bits(ref.get_tensor(k))), k
        for rows in [(0, 3), (2, 7), (5, 100), (4, 4)]:
            want = ref.get_slice("a.weight")[rows[0]:rows[1]]
            assert torch.equal(ck.read("a.weight", rows), want)
            out = torch.full(tuple(want.shape), -1.0)
            assert ck.read("a.weight", rows, out=out) is out and torch.equal(out, want)
        want = ref.get_slice("c")[:, 1:3]
        assert torch.equal(_bits(ck.read("c", (1, 3), dim=1)), _bits(want))
    with pytest.raises(ValueError, match="out must be"):
        ck.read("a.weight", out=torch.empty(5, 7))


def test_read_maps_nothing(tmp_path, sd):
    """A tensor read stays a tensor of its own: the file is not mapped into the process (a map
    faults in every page on every pass, and its pages count in the resident size)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("Linux only")
    f = tmp_path / "mapped-or-not.safetensors"
    save_file(sd, f)
    ck = open_checkpoint(f)
    x = ck.read("a.weight")
    y = ck.read("a.weight", (1, 4))
    assert str(f) not in maps.read_text()
    assert torch.equal(x[1:4], y)


def test_truncated_file_names_key(tmp_path, sd):
    f = tmp_path / "cut.safetensors"
    save_file(sd, f)
    ck = open_checkpoint(f)
    with open(f, "r+b") as h:
        h.truncate(f.stat().st_size - 8)
    last = max((k for k in sd if sd[k].numel()), key=lambda k: ck.entry(k).offset)
    with pytest.raises(CheckpointError, match=f"{last!r}.*ends"):
        ck.read(last)


def test_deltas_into_a_reused_buffer(tmp_path, sd):
    """``deltas(out=)`` on a :meth:`DeltaReader.stack_buffer` is the fresh stack, bit for bit."""
    floats = {k: v.float() for k, v in sd.items() if v.is_floating_point() and v.dim()}
    g = torch.Generator().manual_seed(4)
    save_file(floats, tmp_path / "p.safetensors")
    for t in range(3):
        save_file({k: v + torch.randn(v.shape, generator=g) for k, v in floats.items()}, tmp_path / f"t{t}.safetensors")
    inputs = DeltaReader(open_checkpoint(tmp_path / "p.safetensors"),
                         [open_checkpoint(tmp_path / f"t{t}.safetensors") for t in range(3)], ["0", "1", "2"])
    buf = torch.empty(1000)
    for k in floats:
        for rows in [None, (0, 2)] if floats[k].shape[0] > 2 else [None]:
            p, want = inputs.deltas(k, rows)
            out = inputs.stack_buffer(k, rows, buf)
            assert out.numel() == 0 or out.data_ptr() == buf.data_ptr()
            p2, got = inputs.deltas(k, rows, out=out)
            assert got is out and torch.equal(got, want) and torch.equal(p, p2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_kernel_workspace_is_bit_identical(dtype):
    """The streamed TIES' election with a reused workspace: the in-memory kernel's values, for
    chunks of changing size (the workspace grows and is reused), signed zeros and full ties."""
    g = torch.Generator().manual_seed(5)
    work: dict = {}
    for T, shape in [(2, (1000, 37)), (5, (333,)), (3, (64, 64)), (20, (4096,)), (2, (10,))]:
        x = torch.randn((T, *shape), generator=g).to(dtype)
        x[x.abs() < 0.8] = 0
        x.view(T, -1)[:, :4] = torch.tensor([1.0, -1.0, 0.0, -0.0], dtype=dtype)
        a, b = ties_kernel(x), ties_kernel(x, work=work)
        assert a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def test_allocator_settings():
    """Chunked paths (Task Arithmetic; TIES of either scope, no PACT) reuse chunk-sized buffers
    from the heap; every other path keeps each large buffer its own map (1 MB)."""
    chunked = (2 * CHUNK_BYTES, CHUNK_BYTES)
    assert allocator_settings("task_arithmetic", None, {}) == chunked
    assert allocator_settings("ties", None, {}) == chunked
    assert allocator_settings("ties", None, {"scope": "global", "k": 10}) == chunked
    assert allocator_settings("ties", None, {"scope": "per_key"}) == chunked
    assert allocator_settings("ties", "pact", {}) == (1 << 20, None)
    assert allocator_settings("task_arithmetic", "s-pact", {}) == (1 << 20, None)
    for m in ("tsv_m", "iso_c", "iso_cts"):
        assert allocator_settings(m, None, {}) == (1 << 20, None)
    assert allocator_settings("ties", None, {}, chunk_bytes=1 << 20) == (2 << 20, 1 << 20)


def test_many_shards_keep_few_descriptors(tmp_path, monkeypatch):
    """A checkpoint of more shards than :data:`pactlib.lazy.OPEN_FILES` reads every key right and
    keeps at most that many files open."""
    import json

    import pactlib.lazy as lazy

    monkeypatch.setattr(lazy, "OPEN_FILES", 3)
    g = torch.Generator().manual_seed(6)
    sd = {f"k{i:02d}": torch.randn(4, 3, generator=g) for i in range(10)}
    wm = {}
    for i, (k, v) in enumerate(sd.items()):
        save_file({k: v}, tmp_path / f"s{i}.safetensors")
        wm[k] = f"s{i}.safetensors"
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    ck = open_checkpoint(tmp_path / "m.safetensors.index.json")
    for _ in range(2):
        for k, v in sd.items():
            assert torch.equal(ck.read(k), v)
            assert len(ck._fds) <= 3
    ck.close()
    assert not ck._fds


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_threshold_counting_with_work_buffers_is_the_same(dtype):
    """GlobalThreshold.observe / mask with reused buffers count and keep exactly what they do
    without (chunks of changing size, many tied magnitudes, zeros, the largest magnitudes near
    the top of the bit range); join of one-task thresholds masks as the T-task one."""
    from pactlib.merges.ties import GlobalThreshold, trim_count, trim_mask

    g = torch.Generator().manual_seed(8)
    T, n = 3, 4000
    x = (torch.randint(-30, 31, (T, n), generator=g) / 8).to(dtype)
    x[0, :50] = torch.finfo(dtype).max  # the highest digit of |x| (no sign bit): 0x7f7f / 0x7fef
    x[2, 7:900] = 0.0
    cuts = [0, 1, 333, 334, 2500, n]
    for k in (0.5, 20.0, 77.0):
        plain, buffered, work = GlobalThreshold(T, trim_count(n, k), dtype), GlobalThreshold(T, trim_count(n, k), dtype), {}
        parts = [GlobalThreshold(1, trim_count(n, k), dtype) for _ in range(T)]
        while not plain.done:
            for t in range(T):
                for a, b in zip(cuts, cuts[1:]):
                    plain.observe(t, x[t, a:b])
                    buffered.observe(t, x[t, a:b], work=work)
                parts[t].observe(0, x[t], work=work)
                parts[t].end_pass()
            assert torch.equal(plain.hist, buffered.hist)
            plain.end_pass()
            buffered.end_pass()
        joined = GlobalThreshold.join(parts)
        for t in range(T):
            want = trim_mask(x[t], k)
            for gt, w in ((plain, None), (buffered, work), (joined, {})):
                got = torch.cat([gt.mask(t, x[t, a:b], work=w).clone() for a, b in zip(cuts, cuts[1:])])
                assert torch.equal(got, want), (k, t)
    with pytest.raises(ValueError, match="finished one-task"):
        GlobalThreshold.join([GlobalThreshold(1, 3, torch.float32)])
    with pytest.raises(ValueError, match="finished one-task"):
        GlobalThreshold.join([])


def _ties_files(tmp_path, dtype=torch.float32, T=4):
    """θ0 and T fine-tuned files whose even tasks have quantized deltas (thousands of tied
    magnitudes at the trim thresholds), with a large key, an empty one, a 0-d one and an int one."""
    g = torch.Generator().manual_seed(9)
    shapes = {"emb.weight": (300, 16), "q.weight": (16, 16), "norm.weight": (16,), "empty.weight": (0, 4),
              "scale": (), "head.weight": (40, 16)}
    pre = {k: (torch.randn(s, generator=g) * 0.02).to(dtype) for k, s in shapes.items()}
    pre["ids"] = torch.arange(5)
    fts = []
    for t in range(T):
        ft = dict(pre)
        for k, s in shapes.items():
            d = torch.randn(s, generator=g, dtype=torch.float64) * 1e-3
            ft[k] = (pre[k].double() + (torch.round(d * 3000) / 3000 if t % 2 == 0 else d)).to(dtype)
        fts.append(ft)
    save_file(pre, tmp_path / "pre.safetensors")
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
    return pre, fts, str(tmp_path / "pre.safetensors"), [str(tmp_path / f"ft{t}.safetensors") for t in range(T)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_per_key_ties_streams_each_key_in_chunks_read_at_most_twice(tmp_path, monkeypatch, dtype):
    """TIES with scope="per_key": the in-memory merge bit for bit, for chunk budgets from a few
    rows to the whole model and one or two workers; a key whose (T, …) stack exceeds a chunk is
    never read as a whole stack, and no θt key is read more than twice by the merge (the content-order
    pass before it reads each file's rows of a key at most once more)."""
    import pactlib
    from pactlib.lazy import LazyCheckpoint

    pre, fts, p0, ps = _ties_files(tmp_path, dtype)
    from pactlib import streaming

    reads: list = []
    ordering: list = []  # reads of the content-order pass (pactlib.order), counted apart
    original, order_pass = LazyCheckpoint.read, streaming.delta_order
    phase = {"order": False}

    def counted(self, key, rows=None, **kw):
        (ordering if phase["order"] else reads).append((self.name, key, rows))
        return original(self, key, rows, **kw)

    def in_order_pass(inputs):
        phase["order"] = True
        try:
            return order_pass(inputs)
        finally:
            phase["order"] = False

    monkeypatch.setattr(LazyCheckpoint, "read", counted)
    monkeypatch.setattr(streaming, "delta_order", in_order_pass)
    for k in (20.0, 35.0):
        want = pactlib.merge("ties", pre, fts, alpha=0.4, k=k, scope="per_key")
        for chunk, workers in ((256, 1), (256, 2), (4096, 1), (CHUNK_BYTES, 2)):
            reads.clear()
            ordering.clear()
            out = tmp_path / f"m-{chunk}-{workers}.safetensors"
            pactlib.merge_files("ties", p0, ps, out, alpha=0.4, k=k, scope="per_key", chunk_bytes=chunk,
                                workers=workers)
            got = load_file(str(out))
            for key in want:
                assert torch.equal(_bits(got[key]), _bits(want[key])), (k, chunk, workers, key)
            rows_read: dict = {}  # (file, key) -> rows read in all (a whole key: all its rows)
            for name, key, rows in reads:
                n = (pre[key].shape[0] if pre[key].dim() else 1) if rows is None else rows[1] - rows[0]
                rows_read[(name, key)] = rows_read.get((name, key), 0) + n
            for (name, key), n in rows_read.items():
                whole = pre[key].shape[0] if pre[key].dim() else 1
                assert n <= 2 * whole, (name, key, n)  # the threshold read (whole) and the merge read (chunks)
                if chunk == CHUNK_BYTES and name in ps:  # every key's stack fits in a chunk: read once
                    assert n == whole, (name, key, n)
            ordered: dict = {}  # the order pass reads each file's rows at most once (θ0's once for all tasks)
            for name, key, rows in ordering:
                n = (pre[key].shape[0] if pre[key].dim() else 1) if rows is None else rows[1] - rows[0]
                ordered[(name, key)] = ordered.get((name, key), 0) + n
            assert ordering and all(n <= (pre[key].shape[0] if pre[key].dim() else 1) for (_, key), n in ordered.items())
            emb = [rows for name, key, rows in reads if key == "emb.weight" and name == ps[0]]
            if chunk == 256:  # a (T, 300, 16) stack far over a chunk: whole once (one task), then rows
                assert emb.count(None) == 1 and len(emb) > 10


def _bench():
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_io_floor", root / "bench" / "bench_io_floor.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_io_floor", mod)
    spec.loader.exec_module(mod)
    return mod


def test_bench_floor_reads_every_input_and_records_the_readers_cpu(tmp_path):
    """bench_io_floor's floor: cat's wall time plus the write's, and the pread reader's own user
    and system time per phase (the floor's kernel time), nothing left behind."""
    bench = _bench()
    files = []
    for i in range(3):
        f = tmp_path / f"in{i}.bin"
        f.write_bytes(bytes([i]) * (300_000 + i))
        files.append(f)
    fl = bench.floor(files, 200_000, tmp_path, block=65536)
    assert fl["block_bytes"] == 65536 and fl["floor_s"] == pytest.approx(fl["read_s"] + fl["write_s"], abs=2e-3)
    assert fl["floor_sys_s"] == pytest.approx(fl["read_sys_s"] + fl["write_sys_s"], abs=2e-3)
    assert fl["floor_user_s"] == pytest.approx(fl["read_user_s"] + fl["write_user_s"], abs=2e-3)
    assert min(fl[k] for k in ("read_s", "write_s", "pread_s", "floor_sys_s", "floor_user_s")) >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in0.bin", "in1.bin", "in2.bin"]


def test_bench_merge_record_ratios_and_kernel_floor():
    """A merge record's ratios from the process's rusage, the runner's phases and the floor: the
    goal's ratio (whole process) and the merge phase's, and the floor's kernel time as a share of
    the process's and of the merge phase's CPU time."""
    bench = _bench()
    r = {"wall_s": 8.0, "user_s": 5.0, "sys_s": 1.0, "peak_rss_mb": 900.0}
    phases = {"import": [3.0, 3.5, 0.5, 70_000], "import_rss_mb": 800.0, "merge": [4.0, 1.5, 0.5, 1_000]}
    fl = {"floor_s": 2.0, "floor_sys_s": 0.4}
    rec = bench.merge_record(r, phases, fl)
    assert (rec["cpu_s"], rec["wall_ratio"], rec["cpu_ratio"], rec["kernel_share"]) == (6.0, 4.0, 3.0, 0.167)
    assert (rec["merge_wall_ratio"], rec["merge_cpu_s"], rec["merge_cpu_ratio"]) == (2.0, 2.0, 1.0)
    assert (rec["merge_kernel_share"], rec["merge_rss_mb"], rec["import_cpu_s"]) == (0.25, 100.0, 4.0)
    assert (rec["floor_kernel_share"], rec["merge_floor_kernel_share"], rec["kernel_excess_s"]) == (0.067, 0.2, 0.1)
    assert "floor_kernel_share" not in bench.merge_record(r, phases, {"floor_s": 2.0})  # a floor without CPU


def _resident_pages(path: Path) -> int:
    """How many of ``path``'s pages the page cache holds (``mincore`` of a map of it)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        ptr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    try:
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ptr, size, vec) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vec)
    finally:
        libc.munmap(ptr, size)


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fadvise"), reason="posix_fadvise: Linux")
def test_bench_drop_cached_empties_the_page_cache_of_written_files(tmp_path):
    """``--reread``'s first step: a file just written (dirty pages) leaves the page cache whole,
    its bytes unchanged; reading it brings it back."""
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    fs = max((m for m in mounts if str(tmp_path).startswith(m[0])), key=lambda m: len(m[0]))[1]
    if fs not in ("ext4", "xfs", "btrfs", "overlay"):  # tmpfs keeps them (they are the file), NFS and ZFS may
        pytest.skip(f"{tmp_path} is on {fs}, which may keep a file's pages when asked to drop them")
    bench = _bench()
    f = tmp_path / "in.bin"
    data = bytes(range(256)) * 4096  # 1 MiB
    pages = len(data) // __import__("mmap").PAGESIZE
    f.write_bytes(data)
    assert _resident_pages(f) == pages
    bench.drop_cached([f])
    assert _resident_pages(f) == 0
    assert f.read_bytes() == data and _resident_pages(f) == pages
