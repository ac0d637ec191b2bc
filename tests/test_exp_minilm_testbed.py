"""Helpers of chapter 2's MiniLM part (:mod:`pactlib.book.experiments.minilm_testbed`): θ0's groups
and maps, what each fine-tune trains, where a full fine-tune's change lies, the head and wording
tables, the cost tables, the zoo's time and the precondition's gains. Synthetic state dicts and
records with MiniLM's key names and record fields (no model, no zoo, no text cache), plus the
records shipped in ``book/data``."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from pactlib.book.experiments import minilm_testbed as M
from pactlib.book.records import make_record, records_frame
from pactlib.testbeds.zoo_files import save_safetensors, write_json

ROOT = Path(__file__).resolve().parents[1]
D, FF, VOCAB, LAYERS = 8, 16, 50, 2


def _theta0(seed: int = 0) -> dict[str, torch.Tensor]:
    """A BERT state dict with MiniLM's key names (no pooler), tiny shapes."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"embeddings.word_embeddings.weight": (VOCAB, D), "embeddings.position_embeddings.weight": (16, D),
              "embeddings.token_type_embeddings.weight": (2, D), "embeddings.LayerNorm.weight": (D,),
              "embeddings.LayerNorm.bias": (D,)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[p + m + ".weight"], shapes[p + m + ".bias"] = (D, D), (D,)
        shapes[p + "attention.output.LayerNorm.weight"] = shapes[p + "attention.output.LayerNorm.bias"] = (D,)
        shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (FF, D), (FF,)
        shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (D, FF), (D,)
        shapes[p + "output.LayerNorm.weight"] = shapes[p + "output.LayerNorm.bias"] = (D,)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_groups_cover_theta0_and_maps_are_the_six_roles():
    sd = _theta0()
    summary = M.backbone_summary(sd)
    assert list(summary.index) == list(M.GROUPS)
    values = summary["values"].str.replace(",", "").astype(int)
    assert values.sum() == sum(t.numel() for t in sd.values())
    assert values[M.GROUPS[0]] == LAYERS * (4 * D * D + 2 * D * FF)
    assert values[M.GROUPS[1]] == (VOCAB + 16 + 2) * D
    assert summary["share of values"].sum() == pytest.approx(1.0)
    maps = M.map_table(sd)
    assert list(maps.index) == ["q", "k", "v", "out", "fc1", "fc2"] and (maps["layers"] == LAYERS).all()
    assert tuple(maps.loc["fc1", ["m (out)", "n (in)"]]) == (FF, D)
    assert tuple(maps.loc["fc2", ["m (out)", "n (in)"]]) == (D, FF)


def test_map_table_rejects_a_matrix_that_is_not_a_layer_map():
    sd = _theta0()
    sd["pooler.dense.weight"] = torch.zeros(D, D)  # a Linear weight the rule views as a matrix, outside any layer
    with pytest.raises(ValueError, match="not one of a layer's maps"):
        M.map_table(sd)


def test_trained_table_counts_lora_factors():
    sd = _theta0()
    t = M.trained_table(sd, rank=2, alpha=4.0, targets="all")
    lora = int(t.loc["lora", "trained values"].replace(",", ""))
    assert lora == LAYERS * (4 * 2 * (D + D) + 2 * (FF + D) + 2 * (D + FF))
    assert t.loc["lora", "entries trained"] == 6 * LAYERS
    assert t.loc["full", "entries trained"] == len(sd)
    assert t.loc["lora", "share of θ0"] == pytest.approx(lora / sum(v.numel() for v in sd.values()))
    qv = M.trained_table(sd, rank=2, alpha=4.0, targets="qv")
    assert qv.loc["lora", "entries trained"] == 2 * LAYERS


def _zoo_with_run(tmp_path, theta0, theta, task="spam", seed=0):
    path = tmp_path / "full" / task / f"seed{seed}.safetensors"
    path.parent.mkdir(parents=True)
    sha = save_safetensors(theta, path, {"task": task})
    write_json(path.with_suffix(".json"), {"task": task, "seed": seed, "kind": "full", "sha256": sha})
    return path


def test_delta_shares_split_the_squared_change_and_count_embedding_rows(tmp_path):
    sd = _theta0()
    theta = {k: v.clone() for k, v in sd.items()}
    theta["encoder.layer.0.attention.self.query.weight"] += 3.0  # 64 entries of 3: ‖·‖² = 576
    theta["embeddings.word_embeddings.weight"][[1, 7]] += 1.0   # 2 rows of 8: ‖·‖² = 16
    theta["encoder.layer.1.output.LayerNorm.weight"] += 2.0     # 8 entries of 2: ‖·‖² = 32
    _zoo_with_run(tmp_path, sd, theta)
    out = M.delta_shares(tmp_path, ["spam"], pretrained=sd)
    r = out.loc["spam"]
    total = 576 + 16 + 32
    assert r[M.GROUPS[0]] == pytest.approx(576 / total) and r[M.GROUPS[1]] == pytest.approx(16 / total)
    assert r[M.GROUPS[3]] == pytest.approx(32 / total) and r[M.GROUPS[2]] == pytest.approx(0.0)
    assert r["‖Δ‖"] == pytest.approx(math.sqrt(total), rel=1e-6)
    assert (r["embedding rows changed"], r["of rows"]) == (2, VOCAB)
    with pytest.raises(ValueError, match="by construction"):
        M.delta_shares(tmp_path, ["spam"], kind="lora", pretrained=sd)


def test_delta_shares_refuse_a_missing_or_altered_run(tmp_path):
    sd = _theta0()
    path = _zoo_with_run(tmp_path, sd, {k: v + 1 for k, v in sd.items()})
    with pytest.raises(FileNotFoundError, match="party"):
        M.delta_shares(tmp_path, ["party"], pretrained=sd)
    rec = json.loads(path.with_suffix(".json").read_text())
    rec["sha256"] = "0" * 64
    path.with_suffix(".json").write_text(json.dumps(rec))
    with pytest.raises(FileNotFoundError, match="spam"):
        M.delta_shares(tmp_path, ["spam"], pretrained=sd)


def test_load_records_reads_the_manifest_and_filters_by_kind(tmp_path):
    assert M.load_records(tmp_path) == []
    write_json(tmp_path / "manifest.json", {"entries": {"full/a/seed0": {"kind": "full", "task": "a"},
                                                        "heads/a": {"kind": "head", "task": "a"}}})
    assert len(M.load_records(tmp_path)) == 2 and [r["kind"] for r in M.load_records(tmp_path, "head")] == ["head"]
    with pytest.raises(FileNotFoundError, match="θ0"):
        M.load_pretrained(tmp_path)


def test_task_table_reads_counts_and_flags_derived_tasks(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"files": {"spam-seed0.json.gz": {"counts": {"train": 10, "val": 3, "test": 5}}}}))
    t = M.task_table(["spam", "gloss_pos"], cache_dir=tmp_path)
    assert tuple(t.loc["spam", ["train", "val", "test"]]) == (10, 3, 5)
    assert math.isnan(t.loc["gloss_pos", "train"])  # not cached
    assert (t.loc["spam", "derived"], t.loc["gloss_pos", "derived"]) == ("no", "yes")
    assert t.loc["spam", "suite"] == "8" and t.loc["gloss_pos", "suite"] == "14"
    assert list(M.derived_notes(["spam", "gloss_pos"])) == ["gloss_pos"]
    with pytest.raises(KeyError, match="nope"):
        M.task_table(["nope"], cache_dir=tmp_path)


def test_sample_texts_take_each_class_first_text_and_cut_it():
    from pactlib.data.text import TextData

    def loader(task, split, *, seed, limit):
        texts = ("b one", "a " + "x" * 200, "b two")
        return TextData(texts, torch.tensor([1, 0, 1]), ("neg", "pos"), ("n", "p"), task, split)

    out = M.sample_texts(["spam"], loader=loader, width=20)
    assert list(out.index) == [("spam", "neg"), ("spam", "pos")]
    assert out.loc[("spam", "pos"), "text"] == "b one" and len(out.loc[("spam", "neg"), "text"]) == 20


def _head_records():
    recs = []
    for task, accs in (("spam", (0.7, 0.86, 0.92)), ("party", (0.54, 0.46, 0.50))):
        recs.append(make_record("head_choice", params={"head_train": 512, "head_val": 300}, seed=None, task=task,
                                classes=2, metrics={"majority": 0.5, **{f"val_acc:{h}": a for h, a in
                                                                         zip(("prompt", "prototype", "probe"), accs)}}))
    for i, acc in enumerate((0.48, 0.72)):
        recs.append(make_record("prompt_wording", params={"prompts": [f"w{i} a", f"w{i} b"]}, seed=None, task="spam",
                                wording=i, in_use=i == 1, metrics={"val_acc:prompt": acc}))
    return records_frame(recs)


def test_head_and_wording_tables():
    frame = _head_records()
    t = M.head_table(frame)
    assert list(t.index) == ["spam", "party", "mean over tasks"]
    assert t.loc["spam", "best"] == "probe" and t.loc["party", "best"] == "prompt"
    assert t.loc["mean over tasks", "prompt"] == pytest.approx(62.0)
    assert t.loc["spam", "classes"] == 2 and pd.isna(t.loc["mean over tasks", "classes"])
    w = M.wording_table(frame)
    assert list(w.index) == [("spam", 0), ("spam", 1)] and list(w["in use"]) == ["", "yes"]
    assert w.loc[("spam", 1), "val acc"] == pytest.approx(72.0) and w.loc[("spam", 0), "descriptions"] == "w0 a | w0 b"


def test_plots_draw_from_the_tables():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    M.plot_heads(M.head_table(_head_records()), ax=ax)
    assert len(ax.patches) == 2  # majority bars, the mean row left out
    shares = pd.DataFrame({g: [0.25, 0.25] for g in M.GROUPS}, index=["a", "b"])
    fig2, ax2 = plt.subplots()
    M.plot_delta_shares(shares, ax=ax2)
    assert len(ax2.patches) == 2 * len(M.GROUPS)
    plt.close("all")


def test_cost_tables_on_the_shipped_timing_records():
    frame = M.timing_frame(ROOT / "book" / M.TIMING)
    costs = M.cost_table(frame)
    assert (costs["seconds"] > 0).all() and any(i.startswith("first load of") for i in costs.index)
    steps = M.step_table(frame)
    assert {"full", "lora", "full: texts/s"} <= set(steps.columns) and steps.index.names == ["tokens", "batch"]
    with pytest.raises(ValueError, match="load"):
        M.cost_table(frame[frame["method"] != "load"])


def test_heads_on_the_shipped_records_choose_a_head_for_every_task():
    t = M.head_table(M.heads_frame(ROOT / "book" / M.HEADS))
    assert len(t) > 1 and t.drop(index="mean over tasks")[["prompt", "prototype", "probe"]].notna().all(axis=None)


def test_zoo_seconds_and_gains():
    recs = [{"kind": "head", "task": "a", "seconds": 2.0}, {"kind": "full", "task": "a", "seed": 0, "seconds": 30.0},
            {"kind": "full", "task": "a", "seed": 1, "seconds": 40.0}, {"kind": "lora", "task": "a", "seed": 0,
                                                                         "seconds": 10.0},
            {"kind": "full", "task": "b", "seed": 0, "seconds": 99.0}]
    z = M.zoo_seconds(recs, tasks=["a"], seeds=[0])
    assert list(z.index) == ["head", "full", "lora"] and list(z["seconds"]) == [2.0, 30.0, 10.0]
    runs = pd.DataFrame({"method": ["zero-shot", "full", "full", "zero-shot", "full"],
                         "task": ["a", "a", "a", "b", "b"], "metrics.acc": [0.5, 0.7, 0.8, 0.9, 0.85]})
    zs, ft, gain = M.fine_tune_gains(runs)
    assert list(gain.index) == ["a", "b"] and gain["a"] == pytest.approx(25.0) and gain["b"] == pytest.approx(-5.0)
    with pytest.raises(ValueError, match="lora"):
        M.fine_tune_gains(runs, "lora")
