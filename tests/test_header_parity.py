"""One header reader for both merge paths (pactlib.safetensors_io.read_header_checked): the
fast path (torch-free) and the torch path refuse the same malformed safetensors files with the
same exit status and message, exactly the files safetensors' own reader refuses; and an input
that changes while a merge reads it is the error "FILE changed while it was read" on both paths,
with no output and no temporary file left."""
import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pactlib import native
from pactlib.cli import main
from pactlib.safetensors_io import read_header_checked
from tests.conftest import make_checkpoints

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the fast path is off")


def raw(header, data=b"", *, n=None) -> bytes:
    """A file: the 8-byte length (``n``, default the padded header's), the header (JSON of a dict,
    or bytes as given) padded with spaces to a multiple of 8, then ``data``."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def entry(**over) -> dict:
    return {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24], **over}}


D = bytes(range(24))
W = b'{"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]'  # a header's start, to end as bytes
#: name -> (file bytes, the problem the error names)
BAD = {
    "offsets_strings": (raw(entry(data_offsets=["0", "24"]), D),
                        """key 'w': data_offsets must be two non-negative integers, got ["0", "24"]"""),
    "offsets_floats": (raw(entry(data_offsets=[0.0, 24.0]), D),
                       "key 'w': data_offsets must be two non-negative integers, got [0.0, 24.0]"),
    "shape_strings": (raw(entry(shape=["2", "3"]), D),
                      """key 'w': shape must be a list of non-negative integers, got ["2", "3"]"""),
    "shape_floats": (raw(entry(shape=[2.0, 3.0]), D),
                     "key 'w': shape must be a list of non-negative integers, got [2.0, 3.0]"),
    "shape_bool": (raw(entry(shape=[True, 2, 3]), D),
                   "key 'w': shape must be a list of non-negative integers, got [true, 2, 3]"),
    "shape_negative": (raw(entry(shape=[-2, -3]), D),
                       "key 'w': shape must be a list of non-negative integers, got [-2, -3]"),
    "shape_minus_zero": (raw(b'{"w": {"dtype": "F32", "shape": [-0, 3], "data_offsets": [0, 0]}}'),
                         "key 'w': shape must be a list of non-negative integers, got [-0.0, 3]"),
    "shape_overflow": (raw({"w": {"dtype": "F32", "shape": [1 << 32, 1 << 32, 0], "data_offsets": [0, 0]}}),
                       "key 'w': shape [4294967296, 4294967296, 0] overflows"),
    "metadata_120mb": (raw({"__metadata__": {"k": "x" * 120_000_000}, **entry()}, D),
                       "a header of 120000096 bytes is longer than safetensors' limit of 100000000"),
    "truncated_length": (b"\x10\x00\x00", "a file of 3 bytes is shorter than the header's 8-byte length"),
    "truncated_header": (raw(entry(), D)[:30], "a header of 72 bytes in a file of 30 bytes"),
    "offsets_gap": (raw(entry(data_offsets=[4, 28]), bytes(28)),
                    "key 'w': data_offsets [4, 28] do not start where the entry before ends (byte 0 of the data)"),
    "offsets_overlap": (raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
                        "key 'b': data_offsets [4, 12] do not start where the entry before ends (byte 8 of the data)"),
    "offsets_past_end": (raw(entry(), D[:20]), "the entries end at byte 104 of a file of 100 bytes"),
    "bytes_after_end": (raw(entry(), D + bytes(8)), "the entries end at byte 104 of a file of 112 bytes"),
    "size_not_shape": (raw(entry(shape=[2, 2]), D),
                       "key 'w': shape [2, 2] of F32 is 16 bytes, its data_offsets [0, 24] hold 24"),
    "unknown_dtype": (raw(entry(dtype="F31"), D),
                      'key \'w\': unknown dtype "F31"; pactlib reads BF16, BOOL, C64, F16, F32, F64, F8_E4M3, '
                      "F8_E5M2, I16, I32, I64, I8, U16, U32, U64, U8"),
    "dtype_twice": (raw(b'{"w": {"dtype": "F16", "dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}', D),
                    "key 'w': dtype given twice"),
    "metadata_not_string": (raw({"__metadata__": {"k": 1}, **entry()}, D),
                            '__metadata__ must map strings to strings, got {"k": 1}'),
    "metadata_twice": (raw(b'{"__metadata__": {}, "__metadata__": {}, ' + W[1:] + b"}}", D),
                       "__metadata__ is given twice"),
    "not_json": (raw(b"{not json}", D), "the header is not JSON (Expecting property name enclosed in double "
                                        "quotes: line 1 column 2 (char 1))"),
    "nan": (raw(b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 24]}}', D),
            "the header is not JSON (NaN is not JSON)"),
    "not_utf8": (raw(b'{"w\xff": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}', D),
                 "the header is not UTF-8 (invalid start byte at byte 11)"),
    "not_an_object": (raw(b"[1, 2, 3]", D), "the header is a JSON list, not an object"),
    "entry_not_an_object": (raw({"w": [0, 24]}, D),
                            "key 'w': expected an object with dtype, shape and data_offsets, got [0, 24]"),
    "too_deep": (raw(W + b', "x": ' + b"[" * 126 + b"]" * 126 + b"}}", D),
                 "the header nests 128 levels deep, more than safetensors' 127"),
}
#: headers safetensors reads (what the reader must not refuse)
GOOD = {
    "metadata_null": raw({"__metadata__": None, **entry()}, D),
    "unknown_field": raw(entry(x=1), D),
    "empty_entry": raw({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}, **entry()}, D),
    "key_twice": raw(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' + W[1:] + b"}}", D),
    "depth_127": raw(W + b', "x": ' + b"[" * 125 + b"]" * 125 + b"}}", D),
    "whitespace": raw(b"\t\n " + W + b"}}\r\n", D),
}


@pytest.mark.parametrize("name", [*BAD, *GOOD])
def test_the_reader_refuses_what_safetensors_refuses(tmp_path, name):
    """safetensors' own reader (safe_open) and read_header_checked refuse the same files."""
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(BAD[name][0] if name in BAD else GOOD[name])
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
        theirs = None
    except Exception as e:  # safetensors' SafetensorError
        theirs = e
    if name in BAD:
        with pytest.raises(ValueError) as ours:
            read_header_checked(path)
        assert str(ours.value) == f"{path}: cannot read checkpoint (not a valid safetensors file: {BAD[name][1]})"
        assert theirs is not None
    else:
        assert theirs is None
        h = read_header_checked(path)
        assert h.entries["w"] == ((2, 3), "F32", 8 + h.n, 24)  # a key given twice: the last, as safetensors


def _inputs(tmp_path):
    pre, fts = make_checkpoints(2, seed=3)
    save_file(pre, tmp_path / "base.safetensors")
    paths = []
    for t, ft in enumerate(fts):
        save_file(ft, tmp_path / f"ft{t}.safetensors")
        paths.append(tmp_path / f"ft{t}.safetensors")
    return tmp_path / "base.safetensors", paths


def _merge(monkeypatch, capsys, base, fts, out, *, fast: bool, method="task_arithmetic"):
    """``pact merge`` on the fast path (the torch path must not run) or the torch path:
    (exit status, stderr)."""
    import pactlib.cli

    monkeypatch.setenv(native.ENV, "1" if fast else "0")
    if fast:
        monkeypatch.setattr(pactlib.cli, "_merge", lambda args: pytest.fail("the torch path ran"))
    try:
        rc = main(["merge", "--method", method, "--alpha", "0.5", "--pretrained", str(base),
                   "--finetuned", *map(str, fts), "--out", str(out)])
    finally:
        monkeypatch.undo()
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", list(BAD))
def test_both_paths_refuse_a_malformed_file_alike(tmp_path, monkeypatch, capsys, name):
    base, fts = _inputs(tmp_path)
    fts[1].write_bytes(BAD[name][0])
    got = []
    for fast in (True, False):
        out = tmp_path / ("fast" if fast else "torch") / "m.safetensors"
        got.append(_merge(monkeypatch, capsys, base, fts, out, fast=fast))
        assert not out.parent.exists() or list(out.parent.iterdir()) == []  # no output, no temporary file
    want = f"pact: error: {fts[1]}: cannot read checkpoint (not a valid safetensors file: {BAD[name][1]})\n"
    assert got == [(2, want), (2, want)]


def test_a_malformed_base_model_is_refused_alike(tmp_path, monkeypatch, capsys):
    base, fts = _inputs(tmp_path)
    base.write_bytes(BAD["shape_negative"][0])
    got = [_merge(monkeypatch, capsys, base, fts, tmp_path / f"{fast}.safetensors", fast=fast) for fast in (True, False)]
    want = (f"pact: error: {base}: cannot read checkpoint (not a valid safetensors file: "
            f"key 'w': shape must be a list of non-negative integers, got [-2, -3])\n")
    assert got == [(2, want), (2, want)]


@pytest.mark.parametrize("method", ["task_arithmetic", "ties"])
def test_a_valid_file_merges_alike(tmp_path, monkeypatch, capsys, method):
    base, fts = _inputs(tmp_path)
    data = []
    for fast in (True, False):
        out = tmp_path / f"{fast}.safetensors"
        assert _merge(monkeypatch, capsys, base, fts, out, fast=fast, method=method)[0] == 0
        data.append(out.read_bytes())
    assert data[0] == data[1]
    assert set(load_file(tmp_path / "True.safetensors")) == set(load_file(base))


def _changed_after_first_read(monkeypatch, path: Path, how: str, fast: bool, method: str) -> None:
    """Make ``path`` change once the merge has read its first data: truncated to half, or
    rewritten in place with other bytes of the same size."""
    import pactlib.fastpath as fp
    from pactlib.lazy import LazyCheckpoint

    done = []

    def change():
        if done:
            return
        done.append(1)
        data = path.read_bytes()
        if how == "truncated":
            os.truncate(path, len(data) // 2)
        else:
            with open(path, "r+b") as f:  # the same size, other bytes: a new mtime and ctime
                f.seek(len(data) - 64)
                f.write(bytes(64))
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    if not fast:
        read = LazyCheckpoint.read

        def read_then_change(self, *a, **kw):
            out = read(self, *a, **kw)
            change()
            return out

        monkeypatch.setattr(LazyCheckpoint, "read", read_then_change)
    elif method == "task_arithmetic":
        merge = native.task_arithmetic

        def merge_then_change(*a):
            out = merge(*a)
            change()
            return out

        monkeypatch.setattr(fp.native, "task_arithmetic", merge_then_change)
    else:  # TIES: after the first radix pass
        select = native.select_digit

        def select_then_change(*a):
            out = select(*a)
            change()
            return out

        monkeypatch.setattr(fp.native, "select_digit", select_then_change)


@pytest.mark.parametrize("how", ["truncated", "rewritten"])
@pytest.mark.parametrize("fast,method", [(True, "task_arithmetic"), (True, "ties"), (False, "task_arithmetic"),
                                         (False, "ties")])
def test_an_input_changed_while_it_is_read_is_an_error(tmp_path, monkeypatch, capsys, how, fast, method):
    base, fts = _inputs(tmp_path)
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    _changed_after_first_read(monkeypatch, fts[0], how, fast, method)
    rc, err = _merge(monkeypatch, capsys, base, fts, out, fast=fast, method=method)
    # the torch path may find the file cut short by a read, and then names the key too
    assert rc == 2 and re.fullmatch(rf"pact: error: {re.escape(str(fts[0]))} changed while it was read"
                                    r"( \(cannot read key '[\w.]+': the file ends \d+ byte\(s\) early\))?\n", err), err
    assert list(out.parent.iterdir()) == []  # no output, no temporary file, no lock


def test_a_file_cut_short_between_check_and_read_in_a_radix_pass_is_an_error(tmp_path, monkeypatch, capsys):
    """TIES' radix passes read every span with ``pread``, so a file truncated right after the check
    that precedes a read reads short and is the error, where a mapped read faulted (SIGBUS)."""
    import pactlib.fastpath as fp

    g = torch.Generator().manual_seed(5)
    pre = {"w": torch.randn(256, 256, generator=g)}  # 256 KiB: a mapped read past the cut would fault
    base, fts = tmp_path / "base.safetensors", [tmp_path / f"ft{t}.safetensors" for t in range(2)]
    save_file(pre, base)
    for f in fts:
        save_file({"w": pre["w"] + 0.01 * torch.randn(256, 256, generator=g)}, f)
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    armed, cut = [], []
    select, check = native.select_digit, fp._Inputs.check

    def select_then_arm(*a):
        armed.append(1)  # the first radix pass is over: the next reads are the second pass's spans
        return select(*a)

    def check_then_cut(self, i):
        check(self, i)
        if armed and not cut and i == 1:
            cut.append(self.files[i])  # the first θt in content order
            os.truncate(self.files[i], 8)  # past the check, before the read

    monkeypatch.setattr(fp.native, "select_digit", select_then_arm)
    monkeypatch.setattr(fp._Inputs, "check", check_then_cut)
    rc, err = _merge(monkeypatch, capsys, base, fts, out, fast=True, method="ties")
    assert cut, "the radix pass read no span after the first digit"
    assert rc == 2 and err == f"pact: error: {cut[0]} changed while it was read\n", err
    assert list(out.parent.iterdir()) == []
