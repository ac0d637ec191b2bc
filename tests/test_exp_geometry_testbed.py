"""Helpers of chapters 1, 2 and 12: the toy geometry of PACT, the testbed tables, the published
reference numbers, the paper-scale (CLIP) helpers, and the paper-scale parameter sets."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from pactlib import PactOptions, pact_filter, task_vectors_from
from pactlib.book import plotting, records, reference
from pactlib.book.experiments import geometry, testbed
from pactlib.testbeds.lite0.zoo import Recipe

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- geometry (ch. 1)

def _lbw_line(angle_deg: float) -> torch.Tensor:
    a = math.radians(angle_deg)
    return torch.tensor([-math.sin(a), math.cos(a), 0.0], dtype=torch.float64)


def test_toy_layer_matches_the_closed_form_without_noise():
    # v_t = (cos τ cos a, cos τ sin a, sin τ); core = span(e1, e2): σ = (1, sin τ), LBW_t ⟂ v_t in-plane
    tilt, angles = 20.0, (0.0, 40.0)
    toy = geometry.toy_layer(angles_deg=angles, tilt_deg=tilt, noise=0.0, seed=3)
    assert torch.allclose(toy.subspaces.core.abs(), torch.eye(3, 2, dtype=torch.float64), atol=1e-12)
    for t, a in enumerate(angles):
        lbw = toy.subspaces.lbw[t]
        assert torch.allclose(lbw.sigma, torch.tensor([1.0, math.sin(math.radians(tilt))], dtype=torch.float64),
                              atol=1e-9)
        assert lbw.basis.shape == (3, 1)
        assert abs(float(lbw.basis[:, 0] @ _lbw_line(a))) == pytest.approx(1.0, abs=1e-9)
    recs = geometry.toy_records(toy, params={}, seed=3)
    removed = math.cos(math.radians(tilt)) ** 2 * math.sin(math.radians(angles[1] - angles[0])) ** 2
    for r in recs:
        m = r["metrics"]
        assert m["lbw_rank"] == 1 and m["shield_rank"] == 1
        assert m["removed_pact"] == pytest.approx(removed, abs=1e-9)
        assert m["removed_spact"] == pytest.approx(math.cos(math.radians(tilt)) ** 2, abs=1e-9)
        assert m["tilt_deg"] == pytest.approx(tilt, abs=1e-6)
        assert m["intrusion_after"] < 1e-20 and m["engine_gap"] < 1e-12 and m["lbw_active_overlap"] < 1e-12
    # two tasks: what task 2 puts into task 1's LBW is exactly what the filter takes from task 2
    assert recs[0]["metrics"]["intrusion_before"] == pytest.approx(recs[1]["metrics"]["removed_pact"], abs=1e-12)


def test_toy_verdict_grades_the_identities_as_points_below_the_tolerance():
    toy = geometry.toy_layer(seed=0)
    frame = records.records_frame(geometry.toy_records(toy, params={}, seed=0))
    v = geometry.toy_verdict(frame)
    assert v["status"] == "reproduced" and [c["grade"] for c in v["conditions"]] == ["holds"] * 3
    assert all(c["lo"] == c["hi"] == c["estimate"] and c["threshold"] == 1e-12 and c["side"] == "<"
               for c in v["conditions"])
    assert v["evidence"].startswith("Identities of P3–P5 on the toy layer, each below 1e-12 (3 holds): ")
    broken = frame.copy()
    broken.loc[broken.index[0], "metrics.engine_gap"] = 1e-6  # the engine departs from the step-by-step filter
    v = geometry.toy_verdict(broken)
    assert v["status"] == "contradicted" and [c["grade"] for c in v["conditions"]] == ["holds", "holds", "fails"]
    assert "largest difference 1.0e-06" in v["evidence"]


def test_toy_layer_with_noise_still_protects_the_other_lbw_and_leaves_the_rng_alone():
    state = torch.random.get_rng_state()
    toy = geometry.toy_layer(angles_deg=(10.0, 70.0, 130.0), noise=0.05, seed=0)
    assert torch.equal(state, torch.random.get_rng_state())
    T = len(toy.deltas)
    for t in range(T):
        for j in range(T):
            if j != t:
                assert float((toy.filtered[t] @ toy.subspaces.lbw[j].basis).abs().max()) < 1e-12
        assert torch.allclose(toy.filtered[t], toy.engine_filtered[t], atol=1e-12)
    assert toy.shields[0].basis.shape[1] == 2  # two other tasks' LBW lines span the core plane


def test_toy_tilt_above_tau_keeps_the_whole_core():
    toy = geometry.toy_layer(tilt_deg=40.0, noise=0.0)  # sin 40° = 0.64 >= τ = 0.5
    assert [lbw.basis.shape[1] for lbw in toy.subspaces.lbw] == [2, 2]


@pytest.mark.parametrize("kw, fragment", [
    (dict(angles_deg=(0.0,)), "at least two task angles"),
    (dict(core_values=(1.0, 2.0, 3.0)), "three descending positive"),
    (dict(noise=-1.0), "noise must be >= 0"),
])
def test_toy_layer_rejects_bad_inputs(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        geometry.toy_layer(**kw)


def test_draw_toy_writes_a_two_panel_figure(tmp_path):
    toy = geometry.toy_layer()
    with plotting.figure("toy", chapter=1, number=9, caption="toy", size=(9, 4), ncols=2,
                         directory=tmp_path) as (fig, axes):
        geometry.draw_toy(fig, axes, toy)
        assert [ax.name for ax in fig.axes] == ["rectilinear", "3d"]
    assert (tmp_path / "fig01.9-toy.png").stat().st_size > 10_000


def test_toy_drawing_records_hold_the_figure_and_survive_json(tmp_path):
    toy = geometry.toy_layer(seed=2)
    recs = json.loads(json.dumps(geometry.toy_drawing_records(toy, params={"seed": 2}, seed=2)))
    assert [r["task"] for r in recs] == [1, 2] and all(r["method"] == "toy-drawing" for r in recs)
    for t, r in enumerate(recs):
        act, filt = torch.tensor(r["active"], dtype=torch.float64), torch.tensor(r["filtered"], dtype=torch.float64)
        assert act.norm().item() == pytest.approx(float(toy.deltas[t].norm()), rel=1e-12)
        assert filt.norm().item() == pytest.approx(float(toy.filtered[t].norm()), rel=1e-12)
        assert float(act @ toy.directions[t]) > 0 and float(filt @ act) >= 0  # signs fixed as drawn
        lbw = torch.tensor(r["lbw"], dtype=torch.float64).reshape(-1, 3).mT
        assert torch.equal(lbw, toy.subspaces.lbw[t].basis) and r["metrics"]["lbw_rank"] == lbw.shape[1]
        other = torch.tensor(recs[1 - t]["lbw"], dtype=torch.float64).reshape(-1, 3).mT
        assert (other.mT @ filt).abs().max() < 1e-12  # P5: Δ̃t has nothing along the other task's LBW
    pngs = []
    for name, source in (("from-toy", toy), ("from-records", recs)):
        with plotting.figure(name, chapter=1, number=9, caption="toy", size=(9, 4), ncols=2,
                             directory=tmp_path) as (fig, axes):
            geometry.draw_toy(fig, axes, source)
        pngs.append((tmp_path / f"fig01.9-{name}.png").read_bytes())
    assert pngs[0] == pngs[1]  # the records draw exactly the toy's figure


def test_merge_spectra_iso_c_is_flat_at_the_mean_of_the_sum():
    sp = geometry.merge_spectra(n=10, tasks=3, rank=2, seed=1)
    assert set(sp) == {"task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"}
    iso = sp["iso_c"]
    assert torch.allclose(iso, iso[0].expand_as(iso), rtol=1e-5)
    assert float(iso[0]) == pytest.approx(float(sp["task_arithmetic"].mean()), rel=1e-5)  # M4: σ̄ of ΣΔt
    assert float(sp["task_arithmetic"][0]) > float(iso[0])
    with pytest.raises(ValueError, match="rank <= n"):
        geometry.merge_spectra(n=4, rank=5)


def test_rsvd_check_finds_the_planted_subspace():
    out = geometry.rsvd_check(m=128, n=64, rank=8, r=8, seed=0, repeats=1)
    assert out["distance"] < 1e-2 and out["exact_seconds"] > 0 and out["rsvd_seconds"] > 0
    with pytest.raises(ValueError, match="r <= min"):
        geometry.rsvd_check(m=16, n=8, r=9)


# ----------------------------------------------------------------------------- testbed (ch. 2)

def test_task_table_reads_specs_and_manifest_counts(tmp_path):
    manifest = {"format": 1, "files": {"mnist-seed0.pt": {"counts": {"train": 4500, "val": 500, "test": 1000}}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    table = testbed.task_table(["mnist", "lfw_faces", "glyph_math"], cache_dir=tmp_path)
    assert table.loc["mnist", ["train", "val", "test"]].tolist() == [4500, 500, 1000]
    assert table["suite"].tolist() == ["8", "14", "20"]
    assert table.loc["mnist", "classes"] == 10 and table.loc["mnist", "derived"] == "no"
    assert table.loc["glyph_math", "derived"] == "yes" and math.isnan(table.loc["lfw_faces", "train"])
    with pytest.raises(KeyError, match="unknown task"):
        testbed.task_table(["nope"], cache_dir=tmp_path)


def test_sample_montage_places_every_image():
    a = torch.full((3, 3, 4, 4), 10, dtype=torch.uint8)
    b = torch.full((1, 3, 4, 4), 200, dtype=torch.uint8)
    img, centres = testbed.sample_montage({"a": a, "b": b}, per_task=2, pad=1)
    assert img.shape == (2 * 5 + 1, 2 * 5 + 1, 3) and centres == [3.0, 8.0]
    assert (img[1:5, 1:5] == 10).all() and (img[1:5, 6:10] == 10).all()
    assert (img[6:10, 1:5] == 200).all() and (img[6:10, 6:10] == 255).all()  # b has one image: white cell
    with pytest.raises(ValueError, match="different sizes"):
        testbed.sample_montage({"a": a, "c": torch.zeros(1, 3, 5, 5, dtype=torch.uint8)}, per_task=1)


def test_sample_records_round_trip_exactly_through_json():
    gen = torch.Generator().manual_seed(0)
    samples = {"a": torch.randint(0, 256, (3, 3, 8, 6), generator=gen, dtype=torch.uint8),
               "b": torch.randint(0, 256, (1, 3, 8, 6), generator=gen, dtype=torch.uint8)}
    recs = json.loads(json.dumps(testbed.sample_records(samples, params={"k": 1}, seed=0)))
    assert [(r["task"], r["shape"]) for r in recs] == [("a", [3, 3, 8, 6]), ("b", [1, 3, 8, 6])]
    back = testbed.samples_from_records(recs + [records.make_record("x", params={}, seed=None, metrics={})])
    assert list(back) == ["a", "b"] and all(torch.equal(back[k], samples[k]) for k in samples)
    with pytest.raises(ValueError, match="uint8 images"):
        testbed.sample_records({"a": samples["a"].float()})


def _state():
    return {"_conv_stem.weight": torch.zeros(8, 3, 3, 3), "_bn0.running_mean": torch.zeros(8),
            "_bn0.running_var": torch.ones(8), "_bn0.weight": torch.ones(8),
            "_bn0.num_batches_tracked": torch.tensor(0),
            "_blocks.0._project_conv.weight": torch.zeros(16, 8, 1, 1),
            "_blocks.0._depthwise_conv.weight": torch.zeros(16, 1, 3, 3),
            "_conv_head.weight": torch.zeros(32, 16, 1, 1)}


def test_layer_table_and_backbone_summary():
    lt = testbed.layer_table(_state())
    assert lt["key"].tolist() == ["_blocks.0._project_conv.weight", "_conv_head.weight"]
    assert lt["block"].tolist() == ["0", "head"] and lt["role"].tolist() == ["_project_conv", "_conv_head"]
    assert lt["m (out)"].tolist() == [16, 32] and lt["n (in)"].tolist() == [8, 16] and lt["params"].tolist() == [128, 512]
    s = testbed.backbone_summary(_state())
    assert s.loc["matrix", "entries"] == "2" and s.loc["matrix", "values"] == "640"
    assert s.loc["buffer", "entries"] == "1"
    assert s.loc["other: BatchNorm running statistics", "values"] == "16"
    assert s["share of values"].sum() == pytest.approx(1.0)


def _zoo_records():
    recipe = {"steps": 100, "lr": 0.001, "optimizer": "adamw"}
    out = []
    for task, zs, accs in (("mnist", 0.5, {("full", 0): 0.89, ("full", 1): 0.91, ("lora", 0): 0.8}),
                           ("optdigits", 0.4, {("full", 0): 0.7, ("full", 1): 0.7})):
        for (kind, seed), acc in accs.items():
            out.append({"task": task, "kind": kind, "seed": seed, "zero_shot": {"test": zs, "val": zs},
                        "finetuned": {"test": acc, "val": acc}, "train_seconds": 10.0 + seed, "n_train": 100,
                        "final_loss": 0.1, "recipe": {**recipe, **({"lora_lr": 0.003} if kind == "lora" else {})}})
    out.append({"task": "mnist", "kind": "head", "recipe": {"head_l2": 0.01}})
    return out


def test_run_records_accuracy_and_timing_tables():
    recs = testbed.run_records(_zoo_records(), tasks=["mnist", "optdigits"], seeds=[0, 1], params={"x": 1})
    assert [(r["method"], r["task"], r["seed"]) for r in recs] == [
        ("zero-shot", "mnist", None), ("full", "mnist", 0), ("full", "mnist", 1), ("lora", "mnist", 0),
        ("zero-shot", "optdigits", None), ("full", "optdigits", 0), ("full", "optdigits", 1)]
    frame = records.records_frame(recs)
    acc = testbed.accuracy_table(frame)
    assert acc.loc["mnist"].tolist() == ["50.0", "90.0 ± 1.4 (2)", "80.0 (1)"]
    assert acc.loc["optdigits"].tolist() == ["40.0", "70.0 ± 0.0 (2)", "—"]
    assert acc.loc["mean over tasks"].tolist() == ["45.0 (2 tasks)", "80.0 (2 tasks)", "80.0 (1 tasks)"]
    timing = testbed.timing_table(frame)
    assert timing.loc["full fine-tune", "runs"] == 4 and timing.loc["full fine-tune", "total s"] == pytest.approx(42.0)
    assert timing.loc["LoRA fine-tune", "mean s"] == pytest.approx(10.0)
    only_seed0 = testbed.run_records(_zoo_records(), tasks=["optdigits"], seeds=[0])
    assert [r["method"] for r in only_seed0] == ["zero-shot", "full"]
    planned = testbed.run_records(_zoo_records(), tasks=["mnist", "optdigits"], seeds=[0, 1],
                                  keep=lambda task, seed, kind: not (task == "mnist" and seed == 1))
    assert [(r["task"], r["seed"]) for r in planned if r["method"] == "full"] == [
        ("mnist", 0), ("optdigits", 0), ("optdigits", 1)]


def test_in_book_zoo_follows_the_plan():
    from pactlib.testbeds.lite0 import testbed as study

    # suite 8 (mnist): seeds 0-2, full and LoRA; tasks only in the 14/20 suites (lfw_faces): seed 0, full
    assert study.in_book_zoo("mnist", 2, "lora") and study.in_book_zoo("lfw_faces", 0, "full")
    assert not study.in_book_zoo("lfw_faces", 1, "full") and not study.in_book_zoo("lfw_faces", 0, "lora")
    assert not study.in_book_zoo("mnist", 3, "full")
    assert study.in_book_zoo("lfw_faces", 1, "full", plan=(("20", (1,), ("full",)),))


def test_recipe_table_and_accuracy_plot(tmp_path):
    table = testbed.recipe_table(_zoo_records())
    assert table.loc["steps", "full"] == "100" and table.loc["lora_lr", "lora"] == "0.003"
    assert table.loc["lora_lr", "full"] == "—" and table.loc["steps", "default"] == str(Recipe().steps)
    pinned = testbed.recipe_table(_zoo_records(), default=Recipe(steps=7), label="profile")
    assert list(pinned.columns) == ["full", "lora", "profile"] and pinned.loc["steps", "profile"] == "7"
    frame = records.records_frame(testbed.run_records(_zoo_records(), tasks=["mnist", "optdigits"], seeds=[0, 1]))
    with plotting.figure("acc", chapter=2, number=9, caption="acc", directory=tmp_path) as (fig, ax):
        testbed.plot_accuracy(frame, ax=ax)
        assert len(ax.patches) == 3 * 2  # three kinds x two tasks
        assert [t.get_text() for t in ax.get_xticklabels()] == ["mnist", "optdigits"]


def test_frozen_statistics_separates_running_stats_affine_and_matrices():
    pre = _state()
    ft = {k: v.clone() for k, v in pre.items()}
    ft["_bn0.weight"] += 0.25
    ft["_conv_head.weight"] -= 0.5
    out = testbed.frozen_statistics(pre, {"a": ft})
    assert out == {"bn_running_stats": 0.0, "bn_affine": 0.25, "matrix_layers": 0.5}
    ft["_bn0.running_var"] += 1.0
    assert testbed.frozen_statistics(pre, {"a": ft})["bn_running_stats"] == 1.0
    del ft["_conv_stem.weight"]
    with pytest.raises(KeyError, match="_conv_stem.weight"):
        testbed.frozen_statistics(pre, {"a": ft})


# ----------------------------------------------------------------------------- reference numbers (ch. 12)

def test_reference_file_loads_and_tabulates():
    ref = reference.load_reference()
    assert {n["source"] for n in ref.numbers} <= set(ref.sources)
    tsv = reference.reference_table(ref, source="tsv", model="ViT-B/32")
    assert tsv.loc[("ViT-B/32", "Task Arithmetic"), "8 tasks"] == "70.8 (76.6)"
    assert tsv.loc[("ViT-B/32", "weight averaging"), "20 tasks"] == "61.0 (67.5)"  # the source's precision kept
    assert tsv.loc[("ViT-B/32", "fine-tuned"), "14 tasks"] == "90.9"
    fb = reference.reference_table(ref, source="fusion_bench")
    assert fb.loc[("ViT-B/32", "Task Arithmetic (α = 0.3)"), "8 tasks"] == "68.0"
    assert fb.loc[("ViT-B/32", "TSV-M"), "8 tasks"] == "83.07" and list(fb.columns) == ["8 tasks"]
    assert {c["id"] for c in reference.caveats_for(ref, "fusion_bench")} >= {"dtd_split", "fixed_coefficients"}
    assert "l14_20_inconsistency" not in {c["id"] for c in reference.caveats_for(ref, "tsv")}
    with pytest.raises(KeyError, match="unknown reference source"):
        reference.reference_table(ref, source="nope")
    with pytest.raises(KeyError, match="no reference numbers"):
        reference.reference_table(ref, source="fusion_bench", model="ViT-L/14")


def test_consistency_flags_the_pact_headline_number():
    cons = reference.consistency(reference.load_reference())
    pact = cons[cons["source"] == "pact_paper"].iloc[0]
    assert pact["implied"] == pytest.approx(95.1 / 0.983) and pact["gap"] == pytest.approx(95.1 / 0.983 - 94.73)
    assert bool(pact["beats_finetuned"])
    merged_tsv = cons[(cons["source"] == "tsv") & (cons["method"] != "zero-shot")]
    assert len(merged_tsv) == 24 and not merged_tsv["beats_finetuned"].any()
    assert merged_tsv["gap"].abs().max() < pact["gap"]


_GOOD = """
sources: {s: {name: S}}
numbers:
  - {source: s, model: M, tasks: 8, method: TA, abs: 70.0, norm: 75.0}
caveats:
  - {id: c, title: T, text: x, applies_to: [s]}
"""


@pytest.mark.parametrize("bad, fragment", [
    (_GOOD.replace("source: s,", "source: t,"), r"numbers\[0\]: unknown source 't'"),
    (_GOOD.replace("tasks: 8", "tasks: 9"), r"numbers\[0\]: tasks must be one of"),
    (_GOOD.replace("abs: 70.0", "abs: 170.0"), r"abs must be a percentage"),
    (_GOOD.replace("abs: 70.0, norm: 75.0", "abs: null, norm: null"), "both are null"),
    (_GOOD.replace("method: TA,", ""), "missing field 'method'"),
    (_GOOD.replace("norm: 75.0}", "norm: 75.0, colour: red}"), r"unknown field\(s\) \['colour'\]"),
    (_GOOD.replace("applies_to: [s]", "applies_to: [s, z]"), r"caveats\[0\] \(c\): applies_to names unknown"),
    (_GOOD.replace("numbers:\n", "numbers:\n  - {source: s, model: M, tasks: 8, method: TA, abs: 1.0}\n"), "repeats"),
    ("numbers: [", "not valid YAML"),
])
def test_reference_file_errors_name_the_entry(tmp_path, bad, fragment):
    path = tmp_path / "ref.yaml"
    path.write_text(bad)
    with pytest.raises(reference.ReferenceError, match=fragment):
        reference.load_reference(path)


def test_reference_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        reference.load_reference(tmp_path / "missing.yaml")
    path = tmp_path / "ok.yaml"
    path.write_text(_GOOD)
    assert reference.numbers_frame(reference.load_reference(path))["abs"].tolist() == [70.0]


# ----------------------------------------------------------------------------- paper scale (ch. 12)

@pytest.fixture(scope="module")
def tiny_example(tmp_path_factory):
    pytest.importorskip("open_clip")
    from pactlib.book.experiments import paper_scale

    return paper_scale.write_tiny_example(tmp_path_factory.mktemp("tiny-clip"), tasks=3, seed=0)


def test_tiny_example_files_kinds_and_pact_report(tiny_example):
    from pactlib.book.experiments import paper_scale
    from pactlib.models import clip

    ex = tiny_example
    pre, fts = paper_scale.find_checkpoints(ex.checkpoint_dir, ex.tasks, pretrained_file="zeroshot.pt",
                                            finetuned_pattern="{task}/finetuned.pt")
    full = clip.load_clip_checkpoint(pre)
    kinds = paper_scale.key_kinds(full)
    assert kinds.loc[("vision", "matrix (stored transposed)"), "entries"] == 1  # visual.proj
    assert kinds.loc[("vision", "matrix"), "entries"] == 4 * 2  # in_proj, out_proj, c_fc, c_proj x 2 blocks
    assert "matrix" not in kinds.loc["text / shared"].index
    ft0 = clip.load_clip_checkpoint(fts[0])
    assert all(torch.equal(ft0[k], full[k]) for k in full if not k.startswith("visual."))  # text tower untouched
    theta0 = clip.vision_state_dict(pre)
    tvs = task_vectors_from(theta0, [clip.vision_state_dict(p) for p in fts], names=list(ex.tasks))
    W = theta0["visual.proj"].T  # the stored (in, out) matrix viewed (out, in)
    assert torch.linalg.matrix_rank(tvs[0]["visual.proj"].T.double(), rtol=1e-4) == 2  # float32 round-off aside
    assert float(tvs[0]["visual.proj"].norm() / W.norm()) == pytest.approx(0.05, rel=1e-4)
    _, rep = pact_filter(theta0, tvs, options=PactOptions())
    frame = paper_scale.layer_frame(rep, ex.tasks)
    assert len(frame) == 9 * 3 and frame["task"].tolist()[:3] == list(ex.tasks)
    assert frame["removed_energy"].between(0, 1).all() and (frame["removed_energy"] > 0).any()


def test_tiny_example_data_and_classifier(tiny_example):
    from pactlib.data import paper
    from pactlib.book.experiments import paper_scale

    ex = tiny_example
    check = paper_scale.data_check(ex.data_root, [*ex.tasks, "SUN397"])
    assert check.loc["task1", ["classes", "train", "test"]].tolist() == [3, 12, 12]
    assert check.loc["task1", "status"] == "ok" and check.loc["SUN397", "status"].startswith("FileNotFoundError")
    data = paper.load_paper_task("task2", paper.task_root(ex.data_root, "task2"), image_size=32)["test"]
    assert data.images.shape == (12, 3, 32, 32) and data.classes == ex.classes["task2"]


def test_chapter_12_tables_and_figure_from_records_equal_the_computed_ones(tiny_example, tmp_path):
    """The present cells of chapter 12 rebuild the rule and data tables from records alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from pactlib.book.experiments import paper_scale
    from pactlib.book.records import make_record, read_records, records_frame, write_records
    from pactlib.matrix import PRESETS
    from pactlib.models import clip

    ex = tiny_example
    pre, fts = paper_scale.find_checkpoints(ex.checkpoint_dir, ex.tasks, pretrained_file="zeroshot.pt",
                                            finetuned_pattern="{task}/finetuned.pt")
    theta0 = clip.vision_state_dict(pre)
    rules = {"ours": PRESETS["default"], "ref": PRESETS["reference_2d"]}
    diff = paper_scale.rule_differences(theta0, rules)
    assert len(diff) == 2  # visual.positional_embedding and visual.proj
    check = paper_scale.data_check(ex.data_root, [*ex.tasks, "SUN397"])
    path = write_records(tmp_path / "12.jsonl", [*paper_scale.rule_records(diff, params={}, seed=0),
                                                 *paper_scale.data_check_records(check, params={})])
    recs = read_records(path)
    pd.testing.assert_frame_equal(paper_scale.rule_table(recs, list(rules)), diff)
    pd.testing.assert_frame_equal(paper_scale.data_check_table(recs), check)  # NaN counts of SUN397 too
    assert paper_scale.rule_table([], list(rules)).columns.tolist() == ["pattern", "keys", "shape", "ours", "ref"]
    assert paper_scale.data_check_table([]).empty

    tvs = task_vectors_from(theta0, [clip.vision_state_dict(p) for p in fts], names=list(ex.tasks))
    _, rep = pact_filter(theta0, tvs, options=PactOptions())
    layers = paper_scale.layer_frame(rep, ex.tasks)
    frame = records_frame([make_record("pact-layer", params={}, seed=0, layer=r.layer, key=r.key, task=r.task,
                                       metrics={"n": r.n, "shield_rank": r.shield_rank, "capped": int(r.capped),
                                                "removed_energy": r.removed_energy}) for r in layers.itertuples()])
    fig, axes = plt.subplots(1, 2)
    per_layer = paper_scale.plot_pact_layers(frame, axes)
    plt.close(fig)
    assert per_layer["layer"].tolist() == list(range(9))
    want = layers.groupby("layer")["removed_energy"].agg(["mean", "min", "max"])
    assert per_layer["removed"].tolist() == pytest.approx(want["mean"].tolist())
    assert per_layer["removed_max"].tolist() == pytest.approx(want["max"].tolist())
    assert per_layer["capped"].tolist() == pytest.approx(layers.groupby("layer")["capped"].mean().tolist())
    assert len(axes[0].lines) == 1 and len(axes[1].lines) == 2
    with pytest.raises(ValueError, match="no 'pact-layer'"):
        paper_scale.plot_pact_layers(frame.iloc[:0], axes)


def test_find_checkpoints_names_what_is_missing(tmp_path):
    from pactlib.book.experiments import paper_scale

    (tmp_path / "zeroshot.pt").write_bytes(b"x")
    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "finetuned.pt").write_bytes(b"x")
    pre, fts = paper_scale.find_checkpoints(tmp_path, ["A"], pretrained_file="zeroshot.pt",
                                            finetuned_pattern="{task}/finetuned.pt")
    assert pre == tmp_path / "zeroshot.pt" and fts == [tmp_path / "A" / "finetuned.pt"]
    with pytest.raises(FileNotFoundError, match=r"1 checkpoint\(s\) missing.*B/finetuned.pt"):
        paper_scale.find_checkpoints(tmp_path, ["A", "B"], pretrained_file="zeroshot.pt",
                                     finetuned_pattern="{task}/finetuned.pt")
    with pytest.raises(ValueError, match="no '{task}'"):
        paper_scale.find_checkpoints(tmp_path, ["A"], pretrained_file="zeroshot.pt", finetuned_pattern="x.pt")
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found"):
        paper_scale.find_checkpoints(tmp_path / "no", ["A"], pretrained_file="z", finetuned_pattern="{task}")


def test_classifier_accuracy_batches_and_restores_mode():
    from pactlib.book.experiments import paper_scale

    class FirstPixel(nn.Module):  # logits = (pixel, 128): class 0 when the first pixel is > 128
        def forward(self, x):
            p = x[:, 0, 0, 0].float()
            return torch.stack([p, torch.full_like(p, 128.0)], dim=1)

    images = torch.zeros(5, 3, 2, 2, dtype=torch.uint8)
    images[:3, 0, 0, 0] = 200
    labels = torch.tensor([0, 0, 1, 1, 1])
    model = FirstPixel().train()
    assert paper_scale.classifier_accuracy(model, images, labels, batch_size=2) == pytest.approx(4 / 5)
    assert model.training
    with pytest.raises(ValueError, match="5 images and 4 labels"):
        paper_scale.classifier_accuracy(model, images, labels[:4])


# ----------------------------------------------------------------------------- parameter sets

def _runner():
    from conftest import load_runner

    return load_runner()


@pytest.mark.parametrize("model", ["vitb32", "vitb16", "vitl14"])
@pytest.mark.parametrize("n", [8, 14, 20])
def test_paper_parameter_sets_refuse_placeholders_and_run_on_their_clip_testbed(n, model, tmp_path):
    """Each paper set defines one clip testbed on the n-task suite; its placeholder paths fail the
    check (named), and once they exist every chapter that applies names that testbed."""
    import yaml

    from pactlib.book.params import ParameterError
    from pactlib.data import paper

    run = _runner()
    path = ROOT / "params" / f"paper-{model}-{n}.yaml"
    data = yaml.safe_load(path.read_text())
    (name, spec), = data["testbeds"].items()
    assert spec["family"] == "clip" and spec["tasks"] == n and spec["trust_pickle"] is False
    assert all(t in path.read_text() for t in paper.paper_tasks(n))
    with pytest.raises(ParameterError, match="checkpoint_dir"):
        run.prepare(run.notebook_paths(None), path, {})
    for key, value in spec.items():  # the user's edit: every placeholder path now exists
        if isinstance(value, str) and value.startswith("/path/to/"):
            spec[key] = str(tmp_path / key)
            (tmp_path / key).mkdir()
    ckpt, tasks = tmp_path / "checkpoint_dir", paper.paper_tasks(n)
    files = [ckpt / spec["pretrained_file"]] + [ckpt / spec["finetuned_pattern"].format(task=t) for t in tasks]
    files += [tmp_path / "heads" / f"head_{t}.pt" for t in tasks]
    for f in files:  # the check looks for the files, it does not read them
        f.parent.mkdir(parents=True, exist_ok=True)
        f.touch()
    for t in tasks:
        (tmp_path / "data_root" / t).mkdir()
    edited = tmp_path / path.name
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    jobs = {j.name: j for j in run.prepare(run.notebook_paths(None), edited, {})}
    assert jobs["05_main_results"].overrides["testbeds"] == [name]
    assert jobs["03_scalar_perspective"].overrides["testbed"] == name


def _head_records():
    out = []
    for head, zs, ta, a in (("probe", 0.8, 0.82, 0.03), ("prototype", 0.7, 0.8, 0.2)):
        common = dict(params={"head": head}, seed=0, suite="8", head=head)
        out.append(records.make_record("zero-shot", metrics={"acc": zs * 0.9, "norm_acc": zs}, **common))
        out.append(records.make_record("fine-tuned", metrics={"acc": 0.9, "norm_acc": 1.0}, **common))
        curve = [{"alpha": x, "mean_acc": 0.0, "mean_normalized": ta - abs(x - a)} for x in (0.01, 0.03, 0.2, 1.0)]
        for m, bonus in (("task_arithmetic", 0.0), ("iso_c", 0.05)):
            out.append(records.make_record(m, metrics={"acc": (ta + bonus) * 0.9, "norm_acc": ta + bonus},
                                           alpha=a, curve=curve, **common))
    return out


def test_head_choice_table_and_plot(tmp_path):
    path = records.write_records(tmp_path / "h.jsonl", _head_records())
    frame = testbed.head_choice_frame(path)
    tab = testbed.head_choice_table(frame)
    assert list(tab.index) == [("probe", 8), ("prototype", 8)]
    assert tab.loc[("prototype", 8), "zero-shot norm"] == pytest.approx(70.0)
    assert tab.loc[("prototype", 8), "Task Arithmetic norm"] == pytest.approx(80.0)
    assert tab.loc[("probe", 8), "Iso-C norm"] == pytest.approx(87.0)
    assert tab.loc[("probe", 8), "Task Arithmetic α"] == pytest.approx(0.03)
    assert tab.loc[("probe", 8), "fine-tuned acc"] == pytest.approx(90.0)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    testbed.plot_head_choice(frame, ax=ax)
    lines = [l for l in ax.get_lines() if l.get_label().endswith("tasks")]
    assert len(lines) == 2 and max(lines[1].get_ydata()) == pytest.approx(80.0)
    assert len(ax.get_lines()) == 4  # + two zero-shot reference lines
    plt.close(fig)
    with pytest.raises(FileNotFoundError, match="bench_heads.py"):
        testbed.head_choice_frame(tmp_path / "none.jsonl")


def _correct(n_right, n=300):
    from pactlib.outcomes import pack

    return pack(torch.arange(n) < n_right)


def _ft(gain, zs, n):
    """Fine-tuned outcomes: ``gain`` more right than zero-shot's first ``zs``, or (up, down): the first
    ``down`` of those wrong and ``up`` more right."""
    from pactlib.outcomes import pack

    up, down = (gain, 0) if isinstance(gain, int) else gain
    c = torch.arange(n) < zs + up
    c[:down] = False
    return pack(c)


def _reference(gains_by_seed, zs=150, n=300):
    """reference_outcomes-like records: {seed: {task: fine-tuned correct − zero-shot correct, or (up, down)}}."""
    out = []
    for seed, gains in gains_by_seed.items():
        tasks = list(gains)
        out.append({"method": "zero-shot (outcomes)", "seed": seed, "testbed": "tb", "tasks": tasks,
                    "outcomes": {"test": {t: _correct(zs, n) for t in tasks}}})
        out.append({"method": "fine-tuned (outcomes)", "seed": seed, "testbed": "tb", "tasks": tasks,
                    "outcomes": {"test": {t: _ft(g, zs, n) for t, g in gains.items()}}})
    return out


@pytest.mark.parametrize("gains, status, grades", [
    ({0: {"a": 30, "b": 20}}, "reproduced", ["holds", "holds"]),
    ({0: {"a": 30, "b": (4, 3)}}, "partly reproduced", ["holds", "inconclusive"]),  # b: +4 −3 examples
    ({0: {"a": 30, "b": 0}}, "contradicted", ["holds", "fails"]),  # b: no example differs, [0, 0] is not > 0
    ({0: {"a": 30, "b": -20}}, "contradicted", ["holds", "fails"]),
])
def test_precondition_is_one_paired_condition_per_task(gains, status, grades):
    v = testbed.precondition_verdict(_reference(gains), tasks=["a", "b"])
    assert v["status"] == status and [c["grade"] for c in v["conditions"]] == grades
    assert v["conditions"][0]["estimate"] == pytest.approx(10.0) and v["conditions"][0]["name"] == "a: fine-tuned − zero-shot"
    assert "2 tasks on 1 seed; 300 test examples per task" in v["evidence"]
    claim = "the testbed's precondition (fine-tuning helps every task)"
    assert testbed.testbed_meaning(claim, v["status"], "Lite0").startswith("On Lite0, ")
    assert testbed.testbed_meaning(claim, "reproduced", "Lite0") == ("On Lite0, fine-tuning helps every task, beyond "
                                                                     "the sampling error of its test sets and seeds.")


def test_precondition_pairs_each_task_over_the_seeds_that_hold_it():
    # a on three seeds (+10, +12, +8 points: the seed spread enters), b on seed 0 only
    v = testbed.precondition_verdict(_reference({0: {"a": 30, "b": 20}, 1: {"a": 36}, 2: {"a": 24}}), tasks=["a", "b"])
    a, b = v["conditions"]
    assert (a["n_seeds"], b["n_seeds"]) == (3, 1) and a["estimate"] == pytest.approx(10.0)
    same = testbed.precondition_verdict(_reference({0: {"a": 30}, 1: {"a": 30}, 2: {"a": 30}}), tasks=["a"])
    assert a["hi"] - a["lo"] > same["conditions"][0]["hi"] - same["conditions"][0]["lo"]  # the seed spread widens it
    assert "1 tasks on 1 seed; 1 tasks on 3 seeds" in v["evidence"]
    old = [{**r, "outcomes": {}} for r in _reference({0: {"a": 30}})]
    assert testbed.precondition_verdict(old, tasks=["a"]) == {
        "status": "not yet tested",
        "evidence": "zero-shot and fine-tuned test outcomes: records without per-example outcomes: recompute"}


def _growth_records(right_by_T, n=300):
    """Merges of suites 2 (tasks a, b) and 3 (adds c), two seeds: {T: correct of 300 on a and b}."""
    out = []
    for seed in (0, 1):
        for T, right in right_by_T.items():
            tasks = "abc"[:T]
            for m in ("task_arithmetic", "iso_c"):
                acc = {t: (right if t in "ab" else 200) / n for t in tasks}
                out.append(records.make_record(
                    m, params={}, seed=seed, suite=str(T), testbed=f"tb-{T}", alpha=0.1,
                    metrics={"acc": 0.5, "norm_acc": 0.5, **{f"acc:{t}": v for t, v in acc.items()},
                             **{f"norm_acc:{t}": v / 0.9 for t, v in acc.items()}},
                    outcomes={"test": {t: _correct(round(acc[t] * n), n) for t in tasks}}))
    return out


def test_problem_verdict_grades_each_step_on_the_shared_tasks(tmp_path):
    frame = testbed.interference_frame(records.write_records(tmp_path / "i.jsonl", _growth_records({2: 250, 3: 220})))
    steps = testbed.step_contrasts(frame)
    assert list(steps["method"]) == ["Task Arithmetic", "Iso-C"]
    assert steps["drop"].tolist() == pytest.approx([100 * 30 / 300 / 0.9] * 2)  # 30 of 300 lost, normalized
    v = testbed.problem_verdict(frame)
    assert v["status"] == "reproduced"
    assert [c["name"] for c in v["conditions"]] == ["Task Arithmetic, T = 2 → 3: loss of the shared tasks",
                                                    "Iso-C, T = 2 → 3: loss of the shared tasks"]
    assert "2 seed(s), 300 test examples per shared task" in v["evidence"]
    same = testbed.interference_frame(records.write_records(tmp_path / "s.jsonl", _growth_records({2: 250, 3: 250})))
    assert testbed.problem_verdict(same)["status"] == "contradicted"  # no example differs: [0, 0] is not > 0
    old = testbed.interference_frame(records.write_records(tmp_path / "o.jsonl", _interference_records()))
    v = testbed.problem_verdict(old, note="x")
    assert v == {"status": "not yet tested", "evidence": "merges of the book's suites (`data/interference.jsonl`): "
                                                         "records without per-example outcomes: recompute. x"}
    with pytest.raises(ValueError, match="only the shared tasks"):
        testbed.step_contrasts(frame, column="metrics.norm_acc")


def _interference_records():
    """Two seeds; suite 2 = tasks a, b; suite 3 adds c. Task a loses 0.1 per added task under TA."""
    out = []
    for seed in (0, 1):
        for suite, tasks in (("2", "ab"), ("3", "abc")):
            common = dict(params={}, seed=seed, suite=suite)
            lose = 0.1 * (len(tasks) - 2) + 0.02 * seed
            per = {"zero-shot": {t: 0.6 for t in tasks},
                   "task_arithmetic": {"a": 0.9 - lose, "b": 0.8, "c": 0.7},
                   "iso_c": {"a": 0.95, "b": 0.85, "c": 0.75}}
            out.append(records.make_record("fine-tuned", metrics={"acc": 0.9, "norm_acc": 1.0}, **common))
            for m, vals in per.items():
                vals = {t: vals[t] for t in tasks}
                metrics = {"acc": 0.0, "norm_acc": sum(vals.values()) / len(vals),
                           **{f"norm_acc:{t}": v for t, v in vals.items()}}
                extra = {} if m == "zero-shot" else {"alpha": 0.1 * (seed + 1)}
                out.append(records.make_record(m, metrics=metrics, **extra, **common))
    return out


def test_interference_table_follows_the_first_suite_as_T_grows(tmp_path):
    path = records.write_records(tmp_path / "i.jsonl", _interference_records())
    frame = testbed.interference_frame(path)
    tab = testbed.interference_table(frame)
    assert list(tab.index) == [2, 3] and list(tab["seeds"]) == [2, 2]
    # first suite's tasks (a, b): TA (0.9 - 0.02 s + 0.8)/2 -> 84.5 ± 0.7 at T = 2; 0.1 lower on a at T = 3
    assert tab.loc[2, "Task Arithmetic (first)"] == "84.5 ± 0.7"
    assert tab.loc[3, "Task Arithmetic (first)"] == "79.5 ± 0.7"
    assert tab.loc[3, "Task Arithmetic (all)"] == "76.3 ± 0.5"  # (0.8 - 0.02 s + 0.8 + 0.7) / 3
    assert tab.loc[3, "Iso-C (first)"] == "90.0 ± 0.0" and tab.loc[2, "Task Arithmetic α"] == pytest.approx(0.15)
    assert tab.loc[3, "zero-shot (all)"] == "60.0 ± 0.0"
    steps = testbed.interference_steps(frame)
    ta = steps[steps["method"] == "Task Arithmetic"].iloc[0]
    assert (ta["T_from"], ta["T_to"]) == (2, 3) and ta["drop"] == pytest.approx(5.0) and ta["grows"]
    assert ta["spread"] == pytest.approx(100 * 0.01 / 2 ** 0.5)  # first-suite means 0.85, 0.84: std 0.71 points
    assert (ta["seeds_falling"], ta["n_seeds"]) == (2, 2)  # a loses 0.1 on both seeds
    iso = steps[steps["method"] == "Iso-C"].iloc[0]
    assert iso["drop"] == pytest.approx(0.0) and not iso["grows"] and iso["seeds_falling"] == 0
    assert testbed.interference_steps(frame, T_values=[2]).empty  # one T: no step
    assert testbed.steps_text(steps) == ("Task Arithmetic 2 → 3: 84.5 → 79.5 % (drop +5.0, spread 0.7, falls on 2/2 "
                                         "seeds); Iso-C 2 → 3: 90.0 → 90.0 % (drop +0.0, spread 0.0, falls on 0/2 seeds)")
    assert testbed.steps_text(steps, sep="\n").count("\n") == 1
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    testbed.plot_interference(frame, axes=axes)
    ta_first = [c for c in axes[1].containers][1]  # zero-shot, TA, Iso-C
    assert list(ta_first.lines[0].get_ydata()) == pytest.approx([84.5, 79.5])
    plt.close(fig)
    with pytest.raises(FileNotFoundError, match="bench_interference.py"):
        testbed.interference_frame(tmp_path / "none.jsonl")
    bad = [r for r in _interference_records() if not (r["method"] == "iso_c" and r["suite"] == "3")]
    bad.append(records.make_record("iso_c", params={}, seed=0, suite="3", metrics={"acc": 0.0, "norm_acc": 0.5}))
    with pytest.raises(ValueError, match="per-task"):
        testbed.interference_frame(records.write_records(tmp_path / "bad.jsonl", bad))


def test_random_task_sets_keep_the_first_suite_and_are_fixed_by_size_and_draw():
    first, last = list("abc"), list("abcdefgh")
    sets = testbed.random_task_sets(first, last, [4, 6], 3)
    assert [(T, i) for T, i, _ in sets] == [(4, 0), (4, 1), (4, 2), (6, 0), (6, 1), (6, 2)]
    for T, i, tasks in sets:
        assert len(tasks) == T and tasks[:3] == first and len(set(tasks)) == T
        assert set(tasks[3:]) <= set("defgh") and tasks[3:] == sorted(tasks[3:])  # the last suite's order
    assert sets == testbed.random_task_sets(first, last, [4, 6], 3)  # same sets on every call
    assert len({tuple(t) for T, _, t in sets if T == 6}) > 1  # draws differ
    # the draw does not depend on which other sizes are asked for
    assert testbed.random_task_sets(first, last, [6], 1)[0] == sets[3]
    with pytest.raises(ValueError, match="strictly between 3 and 8"):
        testbed.random_task_sets(first, last, [8], 1)
    with pytest.raises(ValueError, match="not the start"):
        testbed.random_task_sets(list("xa"), last, [4], 1)
    with pytest.raises(ValueError, match="draws must be >= 1"):
        testbed.random_task_sets(first, last, [4], 0)


def test_alpha_curves_average_the_validation_curves_on_common_alphas():
    def rec(T, seed, pts):
        return records.make_record("task_arithmetic", params={}, seed=seed, suite=str(T), alpha=pts[0][0],
                                   curve=[{"alpha": a, "mean_acc": 0.0, "mean_normalized": v} for a, v in pts],
                                   metrics={"acc": 0.0, "norm_acc": 0.5, "norm_acc:a": 0.5})
    recs = [rec(2, 0, [(0.1, 0.80), (0.2, 0.70)]), rec(2, 1, [(0.1, 0.84), (0.2, 0.74), (0.3, 0.6)]),
            rec(3, 0, [(0.1, 0.60), (0.2, 0.50)])]
    frame = pd.DataFrame([{**r, "T": int(r["suite"])} for r in recs])
    cur = testbed.alpha_curves(frame)
    t2 = cur[cur["T"] == 2].set_index("alpha")
    assert list(t2.index) == [0.1, 0.2]  # 0.3 only on one seed: dropped
    assert t2.loc[0.1, "mean"] == pytest.approx(82.0) and t2.loc[0.1, "std"] == pytest.approx(4 * 2 ** -0.5)
    assert t2.loc[0.2, "n"] == 2 and cur[cur["T"] == 3]["std"].tolist() == [0.0, 0.0]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    testbed.plot_alpha_curves(cur, ax=ax, zero_shot={2: 60.0})
    assert list(ax.lines[0].get_ydata()) == pytest.approx([82.0, 72.0])
    assert ax.lines[1].get_xdata()[0] == pytest.approx(0.1)  # the best α of T = 2, starred
    plt.close(fig)
    with pytest.raises(ValueError, match="no 'iso_c' records"):
        testbed.alpha_curves(frame, "iso_c")


def test_interference_table_counts_random_task_sets(tmp_path):
    recs = _interference_records()
    for r in recs:
        if r["suite"] == "3":
            r["draw"] = 0
    extra = [dict(r, draw=1) for r in recs if r["suite"] == "3"]  # a second set at T = 3
    frame = testbed.interference_frame(records.write_records(tmp_path / "d.jsonl", recs + extra))
    tab = testbed.interference_table(frame)
    assert list(tab["sets"]) == [1, 2] and list(tab["seeds"]) == [2, 2]
    # seed 1's second set loses nothing on a: its mean over sets still falls, by half as much
    for r in extra:
        if r["seed"] == 1 and r["method"] == "task_arithmetic":
            r["metrics"] = {**r["metrics"], "norm_acc:a": 0.88}
    frame = testbed.interference_frame(records.write_records(tmp_path / "d2.jsonl", recs + extra))
    ta = testbed.interference_steps(frame).iloc[0]
    assert (ta["seeds_falling"], ta["n_seeds"]) == (2, 2)
    # rows at T = 3: 0.80, 0.80 (seed 0), 0.79, 0.84 (seed 1) -> 80.75; at T = 2: 85, 84 -> 84.5
    assert ta["drop"] == pytest.approx(3.75)
    assert "sets" not in testbed.interference_table(testbed.interference_frame(
        records.write_records(tmp_path / "n.jsonl", _interference_records())))


def test_recipe_variants_table_one_row_per_recipe(tmp_path):
    frame = testbed.interference_frame(records.write_records(tmp_path / "i.jsonl", _interference_records()))
    seed0 = frame[frame["seed"] == 0]
    tab = testbed.recipe_variants_table({"book": frame, "seed 0 only": seed0})
    assert list(tab.index) == ["book", "seed 0 only"] and list(tab["seeds"]) == [2, 1]
    # first suite (a, b): TA 84.5 -> 79.5 over both seeds, 85.0 -> 80.0 on seed 0; Iso-C 90 at both T
    assert tab.loc["book", "Task Arithmetic T=2"] == pytest.approx(84.5)
    assert tab.loc["seed 0 only", "Task Arithmetic T=3"] == pytest.approx(80.0)
    assert tab.loc["book", "Task Arithmetic last step"] == pytest.approx(5.0)
    assert tab.loc["book", "Iso-C last step"] == pytest.approx(0.0) and tab.loc["book", "zero-shot"] == pytest.approx(60.0)
    with pytest.raises(ValueError, match="different T values"):
        testbed.recipe_variants_table({"book": frame, "T = 2 only": frame[frame["T"] == 2]})
    with pytest.raises(ValueError, match="no frames"):
        testbed.recipe_variants_table({})


def test_add_one_table_costs_against_each_seeds_base(tmp_path):
    recs = []
    for seed, base in ((0, 0.80), (1, 0.78)):
        mk = lambda added, v: records.make_record("task_arithmetic", params={"alpha": 0.2}, seed=seed, added=added,
                                                  metrics={"norm_acc": v})
        recs += [mk(None, base), mk("x", base - 0.01 - 0.01 * seed), mk("y", base - 0.03)]
    path = records.write_records(tmp_path / "a.jsonl", recs)
    tab = testbed.add_one_table(path, joins={"x": "14", "y": "20"})
    assert list(tab.index) == ["y", "x"] and list(tab["joins"]) == ["20", "14"]
    assert tab.loc["y", "cost"] == pytest.approx(3.0) and tab.loc["y", "std"] == pytest.approx(0.0, abs=1e-9)
    assert tab.loc["x", "cost"] == pytest.approx(1.5) and tab.loc["x", "std"] == pytest.approx(2 ** -0.5)
    assert list(tab["seeds"]) == [2, 2]
    with pytest.raises(ValueError, match=r"seeds \[1\] have no base"):
        testbed.add_one_table(records.write_records(tmp_path / "b.jsonl", [r for r in recs if r["added"] or r["seed"] == 0]))
    with pytest.raises(FileNotFoundError, match="--add-one"):
        testbed.add_one_table(tmp_path / "none.jsonl")


def test_cosine_matrix_over_all_entries():
    a = {"w": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([[1.0, 1.0]]), "b": torch.tensor([0.0])}
    c = {"w": torch.tensor([[0.0, 0.0]]), "b": torch.tensor([2.0])}
    cos = testbed.cosine_matrix([a, b, c], ["a", "b", "c"])
    assert cos.loc["a", "b"] == pytest.approx(2 ** -0.5) and cos.loc["b", "a"] == cos.loc["a", "b"]
    assert cos.loc["a", "c"] == 0.0 and list(cos.values.diagonal()) == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="zero task vector"):
        testbed.cosine_matrix([a, {"w": torch.zeros(1, 2), "b": torch.zeros(1)}], ["a", "z"])
    with pytest.raises(ValueError, match="keys and shapes"):
        testbed.cosine_matrix([a, {"w": torch.ones(2, 1), "b": torch.zeros(1)}], ["a", "bad"])
    with pytest.raises(ValueError, match="2 names for 3"):
        testbed.cosine_matrix([a, b, c], ["a", "b"])
