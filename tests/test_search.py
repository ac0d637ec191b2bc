"""``pact search`` (pactlib.testbeds.search) on the synthetic testbed: the record is what
pactlib.testbeds.run gives, the merged checkpoint is θ0 + α·D at the chosen α, recomputed here,
and bad method / testbed names exit with status 2 naming them."""
from __future__ import annotations

import json

import pytest
import torch

from pactlib import PactOptions, merged_update
from pactlib.book.records import read_records
from pactlib.cli import main
from pactlib.io import load_state_dict
from pactlib import testbeds


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_search_record_and_merged_checkpoint(tmp_path, capsys):
    recs, out = tmp_path / "r.jsonl", tmp_path / "merged.safetensors"
    argv = ["search", "--testbed", "synthetic-3", "--method", "iso_c", "--pact", "pact", "--alphas", "0.5", "1", "2",
            "--set", "svd=exact", "--threads", "1", "--out-records", str(recs), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "pact-iso_c on synthetic-3" in printed and "<- chosen" in printed and "chosen alpha" in printed
    summary = _last_json(printed)
    [rec] = read_records(recs)
    assert rec["method"] == "pact-iso_c" and rec["testbed"] == "synthetic-3" and rec["pact"] == "pact"
    assert rec["base"] == "iso_c" and rec["kind"] == "full" and rec["seed"] == 0
    assert rec["params"]["alpha"] == rec["alpha"] == summary["alpha"] and rec["params"]["svd"] == "exact"
    assert set(rec["alphas"]) >= {0.5, 1.0, 2.0} and rec["alpha"] in rec["alphas"]
    m = rec["metrics"]
    assert summary["norm_acc"] == pytest.approx(m["norm_acc"]) and summary["val_norm_acc"] == pytest.approx(m["val_norm_acc"])
    best = max(rec["curve"], key=lambda c: (c["mean_normalized"], -c["alpha"]))
    assert best["alpha"] == rec["alpha"] and best["mean_normalized"] == pytest.approx(m["val_norm_acc"])
    # the same numbers as the seam's own run on a fresh testbed
    tb = testbeds.load("synthetic-3", seed=0, kind="full")
    opts = PactOptions(svd="exact")
    ref = testbeds.run(tb, "iso_c", pact="pact", options=opts, alphas=(0.5, 1.0, 2.0), memo=False)
    assert ref["alpha"] == rec["alpha"]
    for k in ("acc", "norm_acc", "val_acc", "val_norm_acc"):
        assert m[k] == pytest.approx(ref["metrics"][k], abs=1e-12), k
    # the checkpoint: θ0 + α·D, D recomputed from the testbed's own task vectors
    D, _ = merged_update("iso_c", tb.pretrained, tb.task_vectors(), pact="pact", options=opts, rule=tb.rule)
    want = D.apply_to(tb.pretrained, rec["alpha"])
    got = load_state_dict(out)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert tb.evaluate(got, "test") == pytest.approx({t: ref["metrics"][f"acc:{t}"] for t in tb.tasks})
    # records are appended
    assert main(argv) == 0
    assert len(read_records(recs)) == 2


def test_search_lora_grid_and_plain_method(tmp_path, capsys):
    assert main(["search", "--testbed", "synthetic-2", "--method", "task_arithmetic", "--kind", "lora",
                 "--alpha-points", "3", "--widen", "0", "--seed", "1", "--option", "val_limit=64"]) == 0
    s = _last_json(capsys.readouterr().out)
    assert s["method"] == "task_arithmetic" and s["pact"] is None and s["kind"] == "lora" and s["seed"] == 1
    assert s["alpha"] in (0.1, 0.5477, 3.0)  # LoRA merges: 0.1 … 3.0 for every method (book/method.md, protocol)
    assert s["records"] is None and s["out"] is None


@pytest.mark.parametrize("args,needle", [
    (["--testbed", "synthetic-3", "--method", "nope"], "unknown merge method 'nope'"),
    (["--testbed", "nope-3", "--method", "iso_c"], "unknown testbed 'nope-3'"),
    (["--testbed", "synthetic-99", "--method", "iso_c"], "unknown testbed 'synthetic-99'"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--set", "bogus=1"], "'bogus'"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--alphas", "nan"], "alpha must be a finite number"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--option", "colour=red"], "'colour'"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--out", "x.txt"], "x.txt"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--threads", "0"], "--threads must be from 1 to 4096"),
    (["--testbed", "synthetic-3", "--method", "iso_c", "--threads", "99999999999999999999"], "--threads must be from 1 to 4096"),
])
def test_search_errors_exit_2_naming_the_culprit(args, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["search", *args, "--alpha-points", "2"] if "--alphas" not in args else ["search", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pact: error:") and needle in err, err
    assert not (tmp_path / "x.txt").exists()


def test_search_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal below is for CPU-only machines")
    assert main(["search", "--testbed", "synthetic-2", "--method", "ties", "--device", "cuda"]) == 2
    assert "--device cuda: torch sees no GPU" in capsys.readouterr().err
    # the synthetic family has no device option: cpu (and auto, here) run on the CPU
    assert main(["search", "--testbed", "synthetic-2", "--method", "ties", "--device", "auto", "--alpha-points", "2",
                 "--widen", "0"]) == 0
    with pytest.raises(SystemExit):  # --alphas and --alpha-points are exclusive (argparse: status 2)
        main(["search", "--testbed", "synthetic-2", "--method", "ties", "--alphas", "1", "--alpha-points", "2"])


def test_threads_option_does_not_leak_into_the_caller(tmp_path):
    """``--threads`` sets torch's thread count for the command only: an in-process caller (a test,
    a notebook) gets its own count back, or later work would run (and round) differently."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        argv = ["search", "--testbed", "synthetic-3", "--method", "task_arithmetic", "--alphas", "0.5",
                "--threads", "1", "--out-records", str(tmp_path / "r.jsonl")]
        assert main(argv) == 0
        assert torch.get_num_threads() == 2
        assert main(["search", "--testbed", "synthetic-3", "--method", "nope", "--threads", "1"]) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
