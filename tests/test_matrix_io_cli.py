"""The matrix-view rule, checkpoint I/O and the `pact` CLI."""
import json
import pickle
import subprocess
import sys

import pytest
import torch

import pactlib
from pactlib.cli import main, parse_set
from pactlib.io import load_state_dict, save_state_dict
from pactlib.matrix import MatrixRule


def test_open_clip_visual_proj_is_viewed_transposed():
    rule = MatrixRule()
    proj = torch.arange(12.0).reshape(4, 3)  # stored (in=4, out=3): used as x @ proj
    v = rule.view("visual.proj", proj)
    assert v.shape == (3, 4)
    x = torch.randn(2, 4)
    torch.testing.assert_close(x @ proj, x @ v.T)  # the view acts like nn.Linear's (out, in)
    torch.testing.assert_close(rule.unview("visual.proj", v, proj.shape), proj)
    assert rule.view("model.visual.proj", proj).shape == (3, 4)


def test_clip_keys_classified():
    rule = MatrixRule()
    d = 8
    assert rule.kind("visual.transformer.resblocks.0.attn.in_proj_weight", torch.zeros(3 * d, d)) == "matrix"
    assert rule.kind("visual.transformer.resblocks.0.mlp.c_fc.weight", torch.zeros(4 * d, d)) == "matrix"
    assert rule.kind("visual.positional_embedding", torch.zeros(50, d)) == "other"
    assert rule.kind("visual.class_embedding", torch.zeros(d)) == "other"
    assert rule.kind("visual.conv1.weight", torch.zeros(d, 3, 4, 4)) == "other"
    assert rule.kind("transformer.resblocks.0.attn.in_proj_weight", torch.zeros(3 * d, d)) == "other"
    assert rule.kind("token_embedding.weight", torch.zeros(100, d)) == "other"
    assert rule.kind("text_projection", torch.zeros(d, d)) == "other"
    assert rule.kind("vision_model.encoder.layers.0.self_attn.q_proj.weight", torch.zeros(d, d)) == "matrix"
    assert rule.kind("vision_model.embeddings.position_embedding.weight", torch.zeros(50, d)) == "other"
    assert rule.kind("text_model.encoder.layers.0.mlp.fc1.weight", torch.zeros(4 * d, d)) == "other"
    assert rule.kind("_blocks.3._project_conv.weight", torch.zeros(40, 144, 1, 1)) == "matrix"


@pytest.mark.parametrize("ext", [".safetensors", ".pt"])
def test_save_load_roundtrip_atomic(tmp_path, ckpts, ext):
    pre, _ = ckpts
    p = save_state_dict(pre, tmp_path / f"m{ext}")
    back = load_state_dict(p)
    assert back.keys() == pre.keys()
    for k in pre:
        assert torch.equal(back[k], pre[k])
    assert [f.name for f in tmp_path.iterdir()] == [f"m{ext}"]  # no temp file left


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_state_dict(tmp_path / "nope.pt")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(pactlib.CheckpointError, match="unknown checkpoint extension"):
        load_state_dict(tmp_path / "x.txt")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(pactlib.CheckpointError, match="bad.safetensors: cannot read"):
        load_state_dict(tmp_path / "bad.safetensors")
    torch.save({"a": 1}, tmp_path / "notensor.pt")
    with pytest.raises(pactlib.CheckpointError, match="key 'a' holds a int"):
        load_state_dict(tmp_path / "notensor.pt")


def test_load_reads_what_pact_merge_reads_folders_and_indexes(tmp_path, ckpts):
    """A user trial: load_state_dict refused a model folder ("checkpoint not found") and a sharded
    checkpoint's index. Both now load whole, the same tensors as the files, under the rules of
    pact merge's reader (a key of the index in no shard is named; an index naming itself, or
    another index, as a shard is not followed); a PEFT adapter's folder gets a hint."""
    import json

    pre, fts = ckpts
    out = pactlib.merge_files("task_arithmetic", save_state_dict(pre, tmp_path / "p.safetensors"),
                              [save_state_dict(fts[0], tmp_path / "f.safetensors")],
                              tmp_path / "m" / "model.safetensors", alpha=0.5, max_shard_size=300)
    assert len(out.files) > 3  # shards and the index
    want = pactlib.merge("task_arithmetic", pre, fts[:1], alpha=0.5)
    for src in (tmp_path / "m", tmp_path / "m" / "model.safetensors.index.json"):
        back = load_state_dict(src)
        assert back.keys() == want.keys() and all(torch.equal(back[k], want[k]) for k in want), src
    index = tmp_path / "m" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["ghost.weight"] = next(iter(data["weight_map"].values()))
    index.write_text(json.dumps(data))
    with pytest.raises(pactlib.CheckpointError, match=r"1 key\(s\) of the weight_map are in no shard: \['ghost.weight'\]"):
        load_state_dict(tmp_path / "m")
    data["weight_map"] = {"x": index.name}
    index.write_text(json.dumps(data))
    with pytest.raises(pactlib.CheckpointError, match="unknown checkpoint extension '.json'"):
        load_state_dict(index)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no checkpoint in folder .*PEFT adapter.*--lora-adapters.*read_adapter"):
        load_state_dict(tmp_path / "adapter")


def test_parse_set():
    assert parse_set(["k=20", "svd=rsvd", "core_frac=0.05", "layers=[a, b]"]) == \
        {"k": 20, "svd": "rsvd", "core_frac": 0.05, "layers": ["a", "b"]}
    with pytest.raises(ValueError, match="key=value"):
        parse_set(["k20"])


def test_cli_merge_matches_python_api(tmp_path, ckpts, capsys):
    pre, fts = ckpts
    save_state_dict(pre, tmp_path / "pre.safetensors")
    paths = []
    for i, f in enumerate(fts):
        paths.append(str(save_state_dict(f, tmp_path / f"ft{i}.pt")))
    out = tmp_path / "merged.safetensors"
    rc = main(["merge", "--method", "iso_c", "--pact", "pact", "--alpha", "0.8", "--pretrained",
               str(tmp_path / "pre.safetensors"), "--finetuned", *paths, "--out", str(out),
               "--set", "core_frac=0.2", "svd=exact"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 3
    want = pactlib.merge("iso_c", pre, fts, alpha=0.8, pact="pact", core_frac=0.2)
    got = load_state_dict(out)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_cli_rule_preset_matches_python_api(tmp_path, ckpts, capsys):
    """--rule reference_2d: 1x1 convs are not matrices there, so pw.weight is merged by the mean."""
    from pactlib.matrix import MatrixRule

    pre, fts = ckpts
    paths = [str(save_state_dict(f, tmp_path / f"ft{i}.pt")) for i, f in enumerate(fts)]
    save_state_dict(pre, tmp_path / "pre.pt")
    out = tmp_path / "merged.safetensors"
    rc = main(["merge", "--method", "iso_c", "--alpha", "0.5", "--pretrained", str(tmp_path / "pre.pt"),
               "--finetuned", *paths, "--out", str(out), "--rule", "reference_2d"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["rule"] == "reference_2d"
    got = load_state_dict(out)
    want = pactlib.merge("iso_c", pre, fts, alpha=0.5, rule=MatrixRule.preset("reference_2d"))
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    mean = sum(f["pw.weight"] - pre["pw.weight"] for f in fts) / len(fts)
    torch.testing.assert_close(got["pw.weight"], pre["pw.weight"] + 0.5 * mean)
    default = pactlib.merge("iso_c", pre, fts, alpha=0.5)
    assert not torch.allclose(default["pw.weight"], got["pw.weight"])


def test_cli_errors_are_clear(tmp_path, ckpts, capsys):
    pre, fts = ckpts
    save_state_dict(pre, tmp_path / "pre.pt")
    save_state_dict(fts[0], tmp_path / "a.pt")
    rc = main(["merge", "--method", "nope", "--alpha", "1", "--pretrained", str(tmp_path / "pre.pt"),
               "--finetuned", str(tmp_path / "a.pt"), "--out", str(tmp_path / "o.pt")])
    assert rc == 2 and "known: task_arithmetic" in capsys.readouterr().err
    rc = main(["merge", "--method", "ties", "--alpha", "1", "--pretrained", str(tmp_path / "pre.pt"),
               "--finetuned", str(tmp_path / "a.pt"), "--out", str(tmp_path / "o.pt"), "--set", "kk=1"])
    assert rc == 2 and "unknown parameter 'kk'" in capsys.readouterr().err
    assert not (tmp_path / "o.pt").exists()


def test_cli_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "pactlib.cli", "methods"], capture_output=True, text=True, check=True)
    assert "iso_cts" in r.stdout and "Iso-CTS" in r.stdout


def _as_module(sd):
    """A plain nn.Module tree whose state_dict() is ``sd`` (for a whole-module pickle)."""
    root = torch.nn.Module()
    for key, v in sd.items():
        *path, name = key.split(".")
        m = root
        for p in path:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        if v.is_floating_point():
            m.register_parameter(name, torch.nn.Parameter(v.clone()))
        else:
            m.register_buffer(name, v.clone())
    return root


def test_cli_merge_pickled_modules_need_trust_pickle(tmp_path, ckpts, capsys):
    pre, fts = ckpts
    torch.save(_as_module(pre), tmp_path / "pre_module.pt")  # torch.save(module): needs unpickling
    paths = []
    for i, f in enumerate(fts):
        torch.save(_as_module(f), tmp_path / f"ft{i}_module.pt")
        paths.append(str(tmp_path / f"ft{i}_module.pt"))
    out = tmp_path / "merged.pt"
    args = ["merge", "--method", "task_arithmetic", "--pact", "s-pact", "--alpha", "0.4", "--pretrained",
            str(tmp_path / "pre_module.pt"), "--finetuned", *paths, "--out", str(out)]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "pre_module.pt holds pickled Python objects" in err and "rerun with --trust-pickle" in err
    assert not out.exists()
    assert main([*args, "--trust-pickle"]) == 0
    want = pactlib.merge("task_arithmetic", pre, fts, alpha=0.4, pact="s-pact")
    got = load_state_dict(out)
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    # the flag changes nothing for plain state dicts
    save_state_dict(pre, tmp_path / "pre.safetensors")
    plain = [str(save_state_dict(f, tmp_path / f"ft{i}.pt")) for i, f in enumerate(fts)]
    out2 = tmp_path / "merged2.pt"
    assert main(["merge", "--method", "task_arithmetic", "--pact", "s-pact", "--alpha", "0.4", "--pretrained",
                 str(tmp_path / "pre.safetensors"), "--finetuned", *plain, "--out", str(out2),
                 "--trust-pickle"]) == 0
    got2 = load_state_dict(out2)
    for k in want:
        torch.testing.assert_close(got2[k], want[k])


def _not_torch_files(tmp_path, ckpts):
    """{name: why} of .pt files that are no torch checkpoint: random bytes, a safetensors file cut in
    half and renamed, an empty file, torch.save files (zip and legacy) cut short, a plain pickle."""
    pre, _ = ckpts
    st = save_state_dict(pre, tmp_path / "pre.safetensors").read_bytes()
    torch.save(pre, tmp_path / "whole.pt")
    torch.save(pre, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    files = {"random.pt": (bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
                                 .to(torch.uint8).tolist()), r"neither a zip archive nor a pickle \(starts with"),
             "truncated_st.pt": (st[: len(st) // 2], "neither a zip archive nor a pickle"),
             "empty.pt": (b"", "the file is empty"),
             "truncated_zip.pt": ((tmp_path / "whole.pt").read_bytes()[:300], "BadZipFile"),
             "truncated_legacy.pt": ((tmp_path / "legacy.pt").read_bytes()[:60], "ValueError: expected"),
             "plain_pickle.pt": (pickle.dumps({"w": 1}, protocol=2), "a pickle without torch's magic number")}
    assert files["random.pt"][0][:1] not in (b"P", b"\x80")
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: why for name, (_, why) in files.items()}


def test_load_of_a_pt_that_is_no_torch_checkpoint_says_so(tmp_path, ckpts):
    for name, why in _not_torch_files(tmp_path, ckpts).items():
        for mmap in (False, True):
            with pytest.raises(pactlib.CheckpointError, match=rf"{name}: not a readable torch checkpoint, "
                                                               rf"corrupt or of another format \(.*{why}") as e:
                load_state_dict(tmp_path / name, mmap=mmap)
            assert "trust" not in str(e.value) and not isinstance(e.value.__cause__, pickle.UnpicklingError)


def test_cli_merge_of_a_pt_that_is_no_torch_checkpoint_does_not_suggest_trust_pickle(tmp_path, ckpts, capsys):
    _, fts = ckpts
    pre = str(tmp_path / "pre.safetensors")
    ft = str(save_state_dict(fts[0], tmp_path / "ft0.pt"))
    out = tmp_path / "merged.safetensors"
    for name, why in _not_torch_files(tmp_path, ckpts).items():
        as_pre = ["--pretrained", str(tmp_path / name), "--finetuned", ft]
        as_ft = ["--pretrained", pre, "--finetuned", ft, str(tmp_path / name)]  # the same reader: one file is enough
        for args in ([as_pre, as_ft] if name == "random.pt" else [as_pre]):
            assert main(["merge", "--method", "task_arithmetic", "--alpha", "1", *args, "--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"pact: error: {tmp_path / name}: not a readable torch checkpoint, corrupt or of "
                                  "another format (") and "trust" not in err and "Traceback" not in err
            assert not out.exists()
    with pytest.raises(pactlib.CheckpointError, match=r"random\.pt: not a readable torch checkpoint"):
        pactlib.merge_files("task_arithmetic", pre, [ft, tmp_path / "random.pt"], out=out, alpha=1.0)
    # a well-formed torch file holding a pickled module still gets the --trust-pickle hint
    torch.save(_as_module(fts[0]), tmp_path / "module.pt")
    with pytest.raises(pactlib.CheckpointError, match=r"module\.pt: cannot read checkpoint \(UnpicklingError") as e:
        load_state_dict(tmp_path / "module.pt")
    assert isinstance(e.value.__cause__, pickle.UnpicklingError)
    assert main(["merge", "--method", "task_arithmetic", "--alpha", "1", "--pretrained", pre,
                 "--finetuned", str(tmp_path / "module.pt"), "--out", str(out)]) == 2
    assert "module.pt holds pickled Python objects" in capsys.readouterr().err


@pytest.mark.parametrize("method", pactlib.merges.names())
@pytest.mark.parametrize("pact", [None, "pact", "s-pact"])
def test_empty_matrices_merge_to_their_pretrained_value(method, pact):
    # a (0, 64) key (no rows: reshape cannot infer a -1) and a (64, 0) key beside a normal (8, 6) one
    rule = MatrixRule()
    assert rule.view("e.weight", torch.zeros(0, 64)).shape == (0, 64)
    assert rule.view("e.weight", torch.zeros(3, 0, 64), stacked=True).shape == (3, 0, 64)
    assert rule.view("c.weight", torch.zeros(0, 4, 1, 1)).shape == (0, 4)
    g = torch.Generator().manual_seed(0)
    pre = {"w.weight": torch.randn(8, 6, generator=g)}
    fts = [{"w.weight": pre["w.weight"] + 0.1 * torch.randn(8, 6, generator=g)} for _ in range(3)]
    want = pactlib.merge(method, pre, fts, alpha=0.7, pact=pact)
    empty = {"rows.weight": torch.zeros(0, 64), "cols.weight": torch.zeros(64, 0)}
    got = pactlib.merge(method, {**pre, **empty}, [{**f, **empty} for f in fts], alpha=0.7, pact=pact)
    assert list(got) == ["w.weight", "rows.weight", "cols.weight"]
    assert got["rows.weight"].shape == (0, 64) and got["cols.weight"].shape == (64, 0)
    torch.testing.assert_close(got["w.weight"], want["w.weight"], rtol=0, atol=0)
