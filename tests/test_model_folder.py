"""``pact merge --out DIR/`` writes a model folder that loads as the user's model, and its recipe
redoes the merge: tiny random models made here (a BERT and a Llama with transformers' config
classes, an open_clip CLIP), loaded offline as a user would (``AutoModel.from_pretrained``,
``open_clip.create_model("local-dir:…")``), equal to the state dict merged in memory."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import pactlib
from pactlib.cli import main
from pactlib.matrix import MatrixRule, detect_preset
from pactlib.recipe import RECIPE_NAME, RecipeError, input_sha256, parse_yaml, read_recipe

transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be fetched: the folders are local


def _perturbed(sd: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
            for k, v in sd.items()}


def _hf_folders(tmp_path: Path, model, T: int = 2) -> tuple[str, list[str]]:
    """θ0 and T fine-tuned model folders of ``model`` (save_pretrained), plus tokenizer files in θ0's."""
    base = tmp_path / "base"
    model.save_pretrained(base)
    (base / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\n")
    (base / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 32}))
    (base / "README.md").write_text("the base model's own card: not copied\n")
    sd = load_file(base / "model.safetensors")
    fts = []
    for t in range(T):
        d = tmp_path / f"ft{t}"
        d.mkdir()
        (d / "config.json").write_bytes((base / "config.json").read_bytes())
        save_file(_perturbed(sd, t), d / "model.safetensors", metadata={"format": "pt"})
        fts.append(str(d))
    return str(base), fts


def _in_memory(method: str, base: str, fts: list[str], alpha: float, weights: str = "model.safetensors", **kw):
    pre = load_file(Path(base) / weights)
    rule = MatrixRule.preset(detect_preset(pre.keys()))
    return pactlib.merge(method, pre, [load_file(Path(f) / weights) for f in fts], alpha=alpha, rule=rule, **kw)


def _merge(base, fts, out, *extra, method="task_arithmetic", alpha="0.5"):
    return main(["merge", "--method", method, "--alpha", alpha, "--pretrained", base, "--finetuned", *fts,
                 "--out", out, *extra])


def _assert_loaded_equals(model, merged: dict) -> None:
    sd = model.state_dict()
    shared = [k for k in merged if k in sd]
    assert len(shared) >= len(merged) - 1  # a model may drop a non-persistent buffer
    for k in shared:
        assert torch.equal(sd[k], merged[k]), k


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    tmp = tmp_path_factory.mktemp("bert")
    base, fts = _hf_folders(tmp, transformers.BertModel(cfg))
    out = tmp / "merged"
    assert _merge(base, fts, str(out) + "/") == 0
    return tmp, base, fts, out


def test_bert_folder_loads_with_auto_model(bert):
    tmp, base, fts, out = bert
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "config.json", "model.safetensors", RECIPE_NAME, "tokenizer_config.json",
                     "vocab.txt"]
    for f in ("config.json", "vocab.txt", "tokenizer_config.json"):  # copied byte for byte
        assert (out / f).read_bytes() == (Path(base) / f).read_bytes()
    model = transformers.AutoModel.from_pretrained(out)
    assert type(model).__name__ == "BertModel"
    _assert_loaded_equals(model, _in_memory("task_arithmetic", base, fts, 0.5))
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids(["hello", "world"]) == [4, 5]


def test_card_front_matter_records_the_merge(bert):
    tmp, base, fts, out = bert
    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    front = parse_yaml(text.split("---\n")[1])
    assert front["base_model"] == os.path.abspath(base)
    assert front["tags"] == ["merge", "pact"] and front["library_name"] == "transformers"
    rec = front["pact_merge"]
    assert rec["merge_method"] == "task_arithmetic" and rec["alpha"] == 0.5 and rec["pact"] is None
    assert [i["path"] for i in rec["inputs"]] == [os.path.abspath(p) for p in (base, *fts)]
    assert [i["sha256"] for i in rec["inputs"]] == [input_sha256(p) for p in (base, *fts)]
    import hashlib

    assert rec["inputs"][1]["sha256"] == hashlib.sha256((Path(fts[0]) / "model.safetensors").read_bytes()).hexdigest()
    yaml = pytest.importorskip("yaml")  # the engine's reader reads what PyYAML reads
    assert yaml.safe_load(text.split("---\n")[1]) == front
    assert yaml.safe_load((out / RECIPE_NAME).read_text()) == parse_yaml((out / RECIPE_NAME).read_text())


def test_recipe_redoes_the_folder_byte_for_byte(bert):
    tmp, base, fts, out = bert
    recipe = read_recipe(out / RECIPE_NAME)
    assert recipe.merge_method == "task_arithmetic" and recipe.alpha == 0.5
    again = tmp / "again"
    assert main(["merge", "--config", str(out / RECIPE_NAME), "--out", str(again) + "/"]) == 0
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in out.iterdir())
    for f in out.iterdir():
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_llama_folder_sharded_loads_with_auto_model(tmp_path):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    base, fts = _hf_folders(tmp_path, transformers.LlamaForCausalLM(cfg))
    (Path(base) / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    out = tmp_path / "merged"
    out.mkdir()  # an existing folder, no trailing slash
    assert _merge(base, fts, str(out), "--max-shard-size", "4KB", "--set", "k=30", method="ties") == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(n.startswith("model-0") for n in shards)
    assert not (out / "model.safetensors").exists()
    assert (out / "generation_config.json").read_bytes() == (Path(base) / "generation_config.json").read_bytes()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    _assert_loaded_equals(model, _in_memory("ties", base, fts, 0.5, k=30.0))
    assert read_recipe(out / RECIPE_NAME).max_shard_size == "4KB"


def test_open_clip_folder_loads_with_open_clip(tmp_path):
    open_clip = pytest.importorskip("open_clip")
    from pactlib.models.clip import build_clip

    cfg = dict(embed_dim=16, vision_cfg=dict(image_size=32, layers=2, width=32, patch_size=8, head_width=16),
               text_cfg=dict(context_length=16, vocab_size=64, width=32, heads=2, layers=1))
    torch.manual_seed(2)
    model, _ = build_clip(cfg)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    folders = []
    for i, s in enumerate([sd, _perturbed(sd, 1), _perturbed(sd, 2)]):
        d = tmp_path / f"clip{i}"
        d.mkdir()
        (d / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": {}}))
        save_file(s, d / "open_clip_model.safetensors")
        folders.append(str(d))
    out = tmp_path / "merged"
    assert _merge(folders[0], folders[1:], str(out) + "/", method="ties", alpha="0.7") == 0
    assert (out / "open_clip_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    loaded = open_clip.create_model(f"local-dir:{out}")
    merged = _in_memory("ties", folders[0], folders[1:], 0.7, weights="open_clip_model.safetensors")
    vis = {k[len("visual."):]: v for k, v in merged.items() if k.startswith("visual.")}
    _assert_loaded_equals(loaded.visual, vis)
    _assert_loaded_equals(loaded, merged)
    assert "library_name: \"open_clip\"" in (out / "README.md").read_text()


# -- bad recipes and flags -----------------------------------------------------------------------

def _recipe(tmp_path, bert, edit) -> Path:
    _, _, _, out = bert
    text = edit((out / RECIPE_NAME).read_text())
    f = tmp_path / "r.yaml"
    f.write_text(text)
    return f


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("merge_method: \"task_arithmetic\"", "merge_method: \"slerp\""), "merge_method"),
    (lambda t: t.replace("  alpha: 0.5\n", ""), "parameters.alpha"),
    (lambda t: t.replace("  alpha: 0.5\n", "  alpha: 0.5\n  density: 0.5\n"), "parameters.density"),
    (lambda t: t + "tokenizer_source: base\n", "tokenizer_source"),
    (lambda t: t.replace("    sha256:", "    parameters:\n      weight: 1.0\n    sha256:", 1), "models[0].parameters"),
    (lambda t: t.replace("pact: null", "pact:\n  mode: pact\n  core_fraction: 0.1"), "pact.core_fraction"),
    (lambda t: t.replace("dtype: \"float32\"", "dtype: \"int8\""), "dtype"),
    (lambda t: t.replace("max_shard_size: null", "max_shard_size: lots"), "max_shard_size"),
    (lambda t: t.replace("rule: \"auto\"", "rule: \"sideways\""), "rule"),
])
def test_bad_recipe_names_the_field(tmp_path, bert, edit, field):
    with pytest.raises(RecipeError, match=rf"r\.yaml: {__import__('re').escape(field)}:"):
        read_recipe(_recipe(tmp_path, bert, edit))


def test_recipe_whose_input_changed_or_dtype_differs_is_refused(tmp_path, bert, capsys):
    _, _, fts, out = bert
    digest = input_sha256(fts[0])
    f = _recipe(tmp_path, bert, lambda t: t.replace(digest, "0" * 64))
    assert main(["merge", "--config", str(f), "--out", str(tmp_path / "x") + "/"]) == 2
    assert "models[0].sha256" in capsys.readouterr().err and not (tmp_path / "x" / "model.safetensors").exists()
    f = _recipe(tmp_path, bert, lambda t: t.replace("dtype: \"float32\"", "dtype: \"bfloat16\""))
    assert main(["merge", "--config", str(f), "--out", str(tmp_path / "y") + "/"]) == 2
    err = capsys.readouterr().err
    assert "dtype: bfloat16" in err and "float32" in err


def test_flags_beside_config_are_refused(bert, tmp_path, capsys):
    _, _, _, out = bert
    assert main(["merge", "--config", str(out / RECIPE_NAME), "--alpha", "1", "--out", str(tmp_path / "z.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "--alpha cannot be given beside it" in err
    assert main(["merge", "--out", str(tmp_path / "z.safetensors")]) == 2
    assert "--method, --alpha, --pretrained, --finetuned" in capsys.readouterr().err


def test_folder_of_an_input_is_refused(bert, capsys):
    _, base, fts, _ = bert
    assert _merge(base, fts, base + "/") == 2
    assert "is the folder of the input" in capsys.readouterr().err


def test_lora_adapter_recipe_round_trips(tmp_path):
    g = torch.Generator().manual_seed(4)
    save_file({"lin.weight": torch.randn(6, 4, generator=g), "lin.bias": torch.randn(6, generator=g)},
              tmp_path / "pre.safetensors")
    dirs = []
    for i in range(2):
        d = tmp_path / f"ad{i}"
        d.mkdir()
        save_file({"base_model.model.lin.lora_A.weight": torch.randn(2, 4, generator=g),
                   "base_model.model.lin.lora_B.weight": torch.randn(6, 2, generator=g)}, d / "adapter_model.safetensors")
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                           "target_modules": ["lin"]}))
        dirs.append(str(d))
    out = tmp_path / "merged"
    assert main(["merge", "--method", "task_arithmetic", "--alpha", "0.5", "--pretrained",
                 str(tmp_path / "pre.safetensors"), "--lora-adapters", *dirs, "--out", str(out) + "/"]) == 0
    recipe = read_recipe(out / RECIPE_NAME)
    assert recipe.lora and recipe.models == tuple(dirs) and recipe.lora_extra == "error"
    assert "  - lora_adapter: " in (out / RECIPE_NAME).read_text()
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model.safetensors", RECIPE_NAME]
    again = tmp_path / "again"
    assert main(["merge", "--config", str(out / RECIPE_NAME), "--out", str(again) + "/"]) == 0
    for f in out.iterdir():
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_hand_written_recipe_reads_as_pyyaml_reads_it(tmp_path, bert):
    """A mergekit-style hand-written recipe: plain scalars, comments, a list at its key's indentation."""
    _, base, fts, _ = bert
    text = (f"# my merge\nmerge_method: ties   # trim, elect, mean\nbase_model: {base}\nmodels:\n"
            f"- model: {fts[0]}\n- model: '{fts[1]}'\nparameters:\n  alpha: 1e-1\n  k: 30\n  scope: global\n"
            "pact:\n  mode: pact\n  layers: [\"^encoder\", x]\n  core_frac: .1\ndtype: float32\n")
    yaml = pytest.importorskip("yaml")
    expected = yaml.safe_load(text)
    expected["parameters"]["alpha"] = 0.1  # PyYAML (YAML 1.1) reads 1e-1 as a string; YAML 1.2 as 0.1
    assert parse_yaml(text) == expected
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    r = read_recipe(f)
    assert (r.merge_method, r.models, r.alpha, r.pact) == ("ties", tuple(fts), 0.1, "pact")
    assert r.params == {"k": 30, "scope": "global", "layers": ["^encoder", "x"], "core_frac": 0.1}
    with pytest.raises(RecipeError, match="line 2: .*YAML feature"):
        parse_yaml("a: 1\nb: &anchor 2\n")


@pytest.mark.parametrize("method", ["task_arithmetic", "iso_c"])  # the fast path hands a refusal to the torch path
def test_a_folder_no_merge_wrote_is_refused_and_kept(tmp_path, bert, method, capsys):
    """Found in a user trial: ``--out DIR/`` into another model's folder (or one holding the
    user's README) replaced its card and config and removed its shards, without a word. Such a
    folder is refused before anything is written; one that holds only dot files (a new git
    repository) takes the merge."""
    _, base, fts, _ = bert
    other = tmp_path / "other"
    other.mkdir()
    files = {"README.md": b"# my notes\n", "config.json": b"{}", "model-00001-of-00002.safetensors": b"x",
             "model-00002-of-00002.safetensors": b"y", "model.safetensors.index.json": b"{}"}
    for name, data in files.items():
        (other / name).write_bytes(data)
    assert _merge(base, fts, f"{other}/", method=method) == 2
    err = capsys.readouterr().err
    assert "holds files no pact merge wrote (README.md, config.json, model-00001-of-00002.safetensors and 2 more)" in err
    assert {f.name: f.read_bytes() for f in other.iterdir()} == files  # as it was: no lock, no temporary file
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert _merge(base, fts, f"{repo}/", method=method) == 0
    assert (repo / RECIPE_NAME).is_file() and (repo / ".git").is_dir()


def test_moving_between_one_file_and_shards_in_a_folder_warns(tmp_path, bert, capsys):
    """A later run that writes one file where shards were (or shards where one file was) removes
    the earlier weights with a warning naming them (a user trial: it went without a word)."""
    _, base, fts, _ = bert
    out = f"{tmp_path / 'm'}/"
    assert _merge(base, fts, out) == 0
    capsys.readouterr()
    assert _merge(base, fts, out, "--max-shard-size", "2KB") == 0
    err = capsys.readouterr().err
    assert "m: removed model.safetensors: the files of an earlier output named model.safetensors" in err
    shards = sorted(f.name for f in (tmp_path / "m").glob("model-*.safetensors"))
    assert len(shards) > 3
    assert _merge(base, fts, out) == 0
    err = capsys.readouterr().err
    listed = ", ".join(["model.safetensors.index.json", *shards[:3]])
    assert f"removed {listed} and {len(shards) - 3} more: the files of an earlier output" in err
    assert not list((tmp_path / "m").glob("model-*")) and not (tmp_path / "m" / "model.safetensors.index.json").exists()


def test_a_single_file_output_may_not_remove_another_models_weights(tmp_path, bert, capsys):
    """A second user trial: ``--out other_model/model.safetensors`` into a sharded model's folder
    (which no merge wrote) removed its seven shards and index, with only a warning. Such an
    output is refused before any work when the folder is a model folder (config.json) without a
    recipe; the folder stays as it was. The same holds for an index beside another's single file."""
    _, base, fts, _ = bert
    other = tmp_path / "other"
    other.mkdir()
    files = {"config.json": b"{}", "model-00001-of-00002.safetensors": b"x", "model-00002-of-00002.safetensors": b"y",
             "model.safetensors.index.json": b"{}"}
    for name, data in files.items():
        (other / name).write_bytes(data)
    for out in ("model.safetensors", "model.safetensors.index.json"):
        assert _merge(base, fts, str(other / out)) == 2
        err = capsys.readouterr().err
        assert ("its folder is a model folder no merge wrote (it has config.json), and writing " + out) in err, err
        assert "model-00001-of-00002.safetensors" in err
        assert {f.name: f.read_bytes() for f in other.iterdir()} == files
    with pytest.raises(ValueError, match="would replace or remove its model-00001-of-00002.safetensors"):
        pactlib.merge_files("task_arithmetic", str(Path(base) / "model.safetensors"),
                            [str(Path(f) / "model.safetensors") for f in fts], other / "model.safetensors", alpha=0.5)
    assert {f.name: f.read_bytes() for f in other.iterdir()} == files


@pytest.mark.parametrize("method", ["task_arithmetic", "iso_c"])  # the fast path and the torch path
@pytest.mark.parametrize("shards", [[], ["--max-shard-size", "2KB"]], ids=["one file", "sharded"])
def test_a_single_file_output_may_not_replace_another_models_weights(tmp_path, bert, capsys, method, shards):
    """A third user trial: ``--out model_dir/model.safetensors`` into a model folder no merge wrote
    replaced its weights silently, and with --max-shard-size removed them (a warning only). Both
    are refused before any work; the folder stays as it was."""
    _, base, fts, _ = bert
    other = tmp_path / "other"
    other.mkdir()
    files = {"config.json": b"{}", "model.safetensors": b"their weights"}
    for name, data in files.items():
        (other / name).write_bytes(data)
    assert _merge(base, fts, str(other / "model.safetensors"), *shards, method=method) == 2
    err = capsys.readouterr().err
    assert "its folder is a model folder no merge wrote (it has config.json)" in err
    assert "replace or remove its model.safetensors" in err and "--out DIR/" in err
    assert {f.name: f.read_bytes() for f in other.iterdir()} == files
