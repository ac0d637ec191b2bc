# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # At paper scale
#
# The paper merges CLIP ViT-B/32, ViT-B/16 and ViT-L/14 image encoders fine-tuned on 8, 14 and
# 20 datasets (SUN397, Cars, RESISC45, EuroSAT, SVHN, GTSRB, MNIST, DTD, …). Those checkpoints
# and datasets are in no package registry, so this book cannot download them. The default book
# runs chapters 3–11 on the two built-in testbeds of chapter 2 (EfficientNet-Lite0 on image
# tasks, MiniLM-L6 on text tasks). With your files, the parameter sets
# `params/paper-vit{b32,b16,l14}-{8,14,20}.yaml` run chapters 3–8, 10 and 11 on them instead,
# through the `clip` testbed (`pactlib.testbeds.clip`): merged CLIP models are evaluated there,
# with α chosen on the reference validation split and the test splits scored. Chapter 9 (LoRA)
# needs LoRA adapters, which the checkpoint releases do not have, so these sets run it on the
# *synthetic testbed* (`synthetic-8`: a seconds-sized four-layer network built in memory, with
# 8 synthetic classification tasks and full and LoRA fine-tunes; `pactlib.testbeds.synthetic`).
# Chapter 1 runs its toy examples as in the default book; chapter 2 describes Lite0 on its
# seconds-sized zoo.
# This chapter does three things:
#
# 1. it shows the **published** paper-scale numbers, from a data file with a source for each
#    number and the known caveats, in tables of their own: *nothing in them was measured by
#    this book*;
# 2. it shows how to run `pactlib` on real CLIP checkpoints and datasets, and runs the data-free
#    steps either on your files (the `testbed` parameter, set by `params/paper-*.yaml`) or, by
#    default, on a tiny CLIP-shaped model written on the fly;
# 3. it says where the measured paper-scale results of a parameter set are.
#
# *Equations and claims: M1–M5, P4–P7; C5–C7 at paper scale.*

# %% tags=["parameters"]
seed = 0                                   # seeds the tiny worked example (its CLIP, updates and images)
testbed = None                             # a clip testbed the parameter set defines (its files); None = the tiny worked example
reference_file = "book/reference_numbers.yaml"  # the published numbers and their sources

# %%
import warnings
from pathlib import Path

from IPython.display import Markdown, display

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice about notebook widgets
from pactlib.book import chapters, plotting, records, reference, report
from pactlib.book.experiments import paper_scale

P = chapters.PaperScale.check(globals())
ref = reference.load_reference(reference_file)
demo = testbed is None  # no checkpoints of the user's: the tiny worked example
path = records.records_path("12_paper_scale")
RULES = {"pactlib default": "default", "reference (every 2-d)": "reference_2d"}  # column -> pactlib.matrix.PRESETS

# %% [markdown]
# ## Published numbers (not measured here)
#
# Mean accuracy over tasks, in percent, absolute with the normalized accuracy (merged accuracy
# divided by the individual fine-tuned model's, averaged over tasks) in parentheses where the
# source gives it. They come from `book/reference_numbers.yaml`, read and checked by
# `pactlib.book.reference`; each table names its source. The main comparison rows come from the
# Task Singular Vectors repository, whose protocol matches {ref}`ours <method-protocol>` (α chosen on a
# validation split).

# %%
plotting.table(reference.reference_table(ref, source="tsv"), chapter=12, number=1,
               caption=f"Published, not measured here. {ref.sources['tsv']['name']}: {ref.sources['tsv']['what']}.")

# %%
plotting.table(reference.reference_table(ref, source=["tsv_checkpoints", "secondary"]), chapter=12, number=2,
               caption="Published, not measured here. Fine-tuned averages of the standard checkpoints (two decimals; "
                       f"{ref.sources['tsv_checkpoints']['name']}), then ViT-B/16 and ViT-L/14 Iso-CTS rows from "
                       f"{ref.sources['secondary']['name']} ({ref.sources['secondary']['what']}).")

# %%
plotting.table(reference.reference_table(ref, source="fusion_bench"), chapter=12, number=3,
               caption=f"Published, not measured here. {ref.sources['fusion_bench']['name']}: "
                       f"{ref.sources['fusion_bench']['what']}. Other checkpoints and protocol: not comparable "
                       "with Table 12.1.")

# %%
plotting.table(reference.reference_table(ref, source="pact_paper"), chapter=12, number=4,
               caption=f"Published, not measured here. {ref.sources['pact_paper']['name']}. The paper also claims: "
                       + " ".join(c["text"] for c in ref.claims if c["source"] == "pact_paper"))

# %% [markdown]
# ### Caveats
#
# The numbers above carry the caveats below (from the same data file). The first matters for
# every row: the standard checkpoints were fine-tuned with a broken DTD split.

# %%
display(Markdown("\n".join(f"- **{c['title']}** ({', '.join(c['applies_to'])}). {c['text']}" for c in ref.caveats)))

# %% [markdown]
# ### Does the PACT headline number fit?
#
# The paper reports 95.1 % absolute and 98.3 % normalized accuracy for PACT-Iso-C on ViT-L/14
# with 20 tasks. Two checks against the fine-tuned averages of the known checkpoints, computed
# by `reference.consistency`: does the merged model beat the individual models on average, and
# which fine-tuned average does abs / norm imply? Normalized accuracy is a mean of per-task
# ratios, so the implied value is only approximate; the rows of the TSV table show how far off
# it is for numbers that come from one consistent evaluation.

# %%
cons = reference.consistency(ref)
tsv_gap = cons[(cons["source"] == "tsv") & (cons["method"] != "zero-shot")]["gap"]
pact_row = cons[cons["source"] == "pact_paper"].iloc[0]
pact_cons = cons[cons["source"] == "pact_paper"].drop(columns="source").set_index(["model", "tasks", "method"])
pact_cons["beats_finetuned"] = pact_cons["beats_finetuned"].map({True: "yes", False: "no"})
plotting.table(pact_cons.rename(columns={"abs": "abs %", "norm": "norm. %", "finetuned": "fine-tuned %",
                                         "implied": "implied %", "gap": "gap", "beats_finetuned": "beats fine-tuned"}),
               chapter=12, number=5, floatfmt="{:.2f}",
               caption="The PACT paper's ViT-L/14 20-task number against the fine-tuned average of the known "
                       "checkpoints: implied = abs / norm; gap = implied − fine-tuned (points).")
display(Markdown(
    f"The merged model at {pact_row['abs']:.1f} % would beat the individual fine-tuned models "
    f"({pact_row['finetuned']:.2f} %) on average, and abs / norm implies a fine-tuned average of "
    f"{pact_row['implied']:.1f} %, {pact_row['gap']:+.2f} points from the known one. Over the "
    f"{len(tsv_gap)} merged-model rows of the TSV table the same gap lies between {tsv_gap.min():+.2f} and "
    f"{tsv_gap.max():+.2f} points. The headline number is the paper's claim; it does not fit the standard "
    "checkpoints, and the book does not use it as a target."))

# %% [markdown]
# ## Running PACT on CLIP checkpoints
#
# **Checkpoints.** `pactlib.models.clip.load_clip_checkpoint(path, trust_pickle=False)` reads a
# checkpoint file or model folder into a flat state dict: open_clip state dicts (`.pt`, `.bin`,
# `.safetensors`, OpenAI TorchScript archives), the task_vectors / TSV files (a whole pickled
# `ImageEncoder` module: unpickling runs code from the file, so it needs `trust_pickle=True`),
# and Hugging Face CLIP weights. `vision_state_dict(source)` keeps the image tower only, with
# normalised keys. `build_clip(arch, weights=path)` builds an open_clip model offline (a hub tag
# or URL raises `DownloadRefused`; OpenAI weights need `quick_gelu=True`),
# `zeroshot_head(model, tokenizer, classnames, templates)` computes the (C, d) text head and
# `ClipClassifier` puts encoder and head together; `ClipClassifier.load_vision(...)` loads a
# fine-tuned or merged tower into it.
#
# **Datasets.** `pactlib.data.paper.paper_tasks(n)` lists the 8/14/20 tasks of the literature;
# `task_root(data_root, task)` finds a dataset folder; `load_paper_task(task, root,
# image_size=224)` reads ImageFolder, CSV, list or npz layouts into the same `TaskData` as the
# built-in tasks, with validation = 10 % of train (at most 5,000, seed 0), as in the reference
# code.
#
# **Merging.** The command line merges any set of state-dict files:
#
# ```bash
# pact merge --method iso_c --pact pact --alpha 1.5 \
#     --pretrained zeroshot.safetensors --finetuned SUN397.safetensors Cars.safetensors ... \
#     --out merged.safetensors --set core_frac=0.1 svd=rsvd
# ```
#
# It reads `.safetensors` files, sharded checkpoints and `.pt`/`.pth`/`.bin` state dicts,
# converting pickles once to safetensors in a cache, then merges one layer at a time (about one
# layer's memory, whatever the number of tasks). The task_vectors / TSV releases' files are whole
# pickled `ImageEncoder` modules: `--trust-pickle` reads them too (unpickling runs code from the
# files: trusted files only), keys unchanged (`model.visual.*`). PEFT LoRA adapters go in with
# `--lora-adapters`. In Python, `pactlib.merge_files` is the same streamed merge, `pactlib.merge`
# the in-memory one, and `pactlib.merged_update` returns D once for an α sweep.
#
# **Evaluating.** `pactlib.eval.clip_evaluate(state, heads, datas, classifier=...)` scores a
# vision tower (θ0, θt or a merge) on several tasks, each with its own head, loading the tower
# once; `clip_evaluator` makes it the `evaluate_fn` of `pactlib.eval.select_alpha`.
#
# **The clip testbed.** `pactlib.testbeds.clip` puts all of it behind the testbed seam that
# chapters 3–11 use: θ0 and θt are the vision towers of your files (any of the three formats;
# Hugging Face towers converted to open_clip names by default, see below), heads are zero-shot
# heads from the text tower with each dataset's class names and templates or the task_vectors /
# TSV head files, validation is the reference split, and evaluation, merging and the PACT filter
# run on the GPU when there is one. Fine-tuned and zero-shot accuracies, heads and merged-model
# scores are cached on disk, keyed by the files' sha256. A parameter set defines such a testbed
# by name in its `testbeds:` section and names it in the chapters' sections.
#
# **Parameter sets.** `params/paper-vit{b32,b16,l14}-{8,14,20}.yaml` define one clip testbed each
# (e.g. `clip-vitb32-8`) and run chapters 3–8, 10 and 11 on it and chapter 12 (this one) on its
# files; chapter 9 runs on the synthetic testbed and chapter 2 on Lite0's seconds-sized zoo.
# Edit the paths of the `testbeds:` section (the check refuses a path that does not exist,
# naming the option), then compute the whole set and render it with one command:
#
# ```bash
# make reproduce PARAMS=paper-vitb32-8
# ```
#
# (the same as `.venv/bin/python scripts/run_notebooks.py --params paper-vitb32-8 --mode compute`;
# neither builds the Lite0 or MiniLM zoo). `make book PARAMS=paper-vitb32-8` only renders the
# records already computed. Each file says which chapters do not apply to CLIP checkpoints and
# why.
#
# **One layout of the attention weights.** Hugging Face CLIP files hold q, k and v as three
# (d, d) matrices per layer; open_clip and task_vectors / TSV files hold one fused (3d, d)
# `in_proj_weight`, as the reference code merges it. SVD-based merges and PACT act per matrix, so
# the same weights in the two layouts merge differently: `pactlib.merged_update` warns when it is
# given the split layout, and the clip testbed converts Hugging Face towers to the fused one
# unless its option `naming` is `"native"`. This chapter reads towers the same way.

# %% tags=["compute"]
import tempfile

from pactlib import testbeds
from pactlib.testbeds import clip as clip_testbeds

if demo:  # tiny CLIP-shaped checkpoints and image folders in the layout a real run reads
    example = paper_scale.write_tiny_example(Path(tempfile.mkdtemp(prefix="pact-tiny-clip-")), seed=seed)
    ckpt_root, tasks, data_dir = example.checkpoint_dir, example.tasks, example.data_root
    trust_pickle, naming = False, "native"
    pre_path, ft_paths = paper_scale.find_checkpoints(ckpt_root, tasks, pretrained_file="zeroshot.pt",
                                                      finetuned_pattern="{task}/finetuned.pt")
else:  # the files of the clip testbed the parameter set defines (testbeds: section)
    spec = testbeds.definitions()[testbed]
    ckpt_root, pre_path, ft_by_task = clip_testbeds.files_of(spec)
    tasks, ft_paths, data_dir = list(ft_by_task), list(ft_by_task.values()), spec["data_root"]
    trust_pickle, naming = spec.get("trust_pickle", False), spec.get("naming", "open_clip")
records.write_records(path, [records.make_record(  # the example's temporary folder is not worth a record
    "files", params=P, seed=seed if demo else None, tasks=list(tasks), pretrained=pre_path.name,
    checkpoint_dir=None if demo else str(ckpt_root), metrics={"tasks": len(tasks)})], replace=True)

# %%
files = next(r for r in records.read_records(path) if r["method"] == "files")
tasks = files["tasks"]
display(Markdown(("**Worked example**: a tiny open_clip ViT (width 32, 2 layers) and "
                  f"{len(tasks)} copies with seeded rank-2 updates on its vision matrix layers; the text tower is "
                  "left as it is, as in the paper's fine-tunes. Its numbers say nothing about the paper's claims."
                  if demo else f"**Your checkpoints**: {len(tasks)} tasks under `{files['checkpoint_dir']}`.")))

# %% [markdown]
# ### What the matrix rule makes of a CLIP checkpoint
#
# Under `pactlib.MatrixRule` the vision tower's matrix layers are the fused attention input
# projections (3d, d), the attention output projections, the two MLP weights of every block
# and `visual.proj`, which is stored (in, out) and viewed transposed. The patch convolution,
# the class and positional embeddings, norms and biases are "other". The text tower is
# "other" too: fine-tuning leaves it untouched, so its task vectors are zero.

# %% tags=["compute"]
from pactlib.models import clip

full_state = clip.load_clip_checkpoint(pre_path, trust_pickle=trust_pickle)
kinds = paper_scale.key_kinds(full_state)
records.write_records(path, [records.make_record("key-kinds", params=P, seed=seed if demo else None, tower=tw,
                                                 kind=kd, metrics=dict(row))
                             for (tw, kd), row in kinds.iterrows()])

# %%
frame = records.records_frame(path)
plotting.table(frame[frame["method"] == "key-kinds"].set_index(["tower", "kind"])[["metrics.entries", "metrics.values"]]
               .rename(columns=lambda c: c.removeprefix("metrics.")), chapter=12, number=6, floatfmt="{:,.0f}",
               caption=f"Entries and values of θ0 ({'the tiny example' if demo else files['pretrained']}) per tower and "
                       "matrix-rule kind.")

# %% [markdown]
# ### Our matrix rule and the reference code's
#
# The public TSV-M and Iso-C / Iso-CTS code (and the task-vectors code under it) merges *every*
# 2-d tensor except `text_projection` by SVD, as stored. Ours ({ref}`the matrix view <method-matrix-view>`) differs on two
# kinds of key of the vision tower:
#
# - `visual.positional_embedding` (tokens × width) is a table of vectors, not a map, so we merge
#   it by the method's rule for other keys (the mean for TSV-M and Iso-C). The reference code
#   flattens its spectrum like any weight matrix.
# - `visual.proj` is used as `x @ proj`: stored (in, out). We view it transposed, so its right
#   singular vectors live in its input space like every other layer's. TSV-M and Iso-C give the
#   same merged update either way (an SVD of the transpose is the transpose of the SVD). Iso-CTS
#   does not: it projects the common subspace out on one side only. PACT does not either: its
#   subspaces live in the input space.
#
# The reference rule is a named preset, `pactlib.MatrixRule.preset("reference_2d")` (in Python,
# `pactlib.merge(..., rule=MatrixRule.preset("reference_2d"))`); use it to reproduce the
# reference merges exactly. The table lists the keys of this checkpoint on which the two rules
# disagree; the next one measures what that changes in the merged update.

# %% tags=["compute"]
from pactlib.matrix import PRESETS

theta0_vision = clip.vision_state_dict(pre_path, trust_pickle=trust_pickle, naming=naming)
rule_frame = paper_scale.rule_differences(theta0_vision, {name: PRESETS[preset] for name, preset in RULES.items()})
records.write_records(path, paper_scale.rule_records(rule_frame, params=P, seed=seed if demo else None))

# %%
plotting.table(paper_scale.rule_table(records.read_records(path), list(RULES)), chapter=12, number=7,
               caption="Vision-tower keys on which pactlib's default matrix rule and the reference code's 2-d "
                       "rule disagree (block indices folded to *). The reference rule also takes the text "
                       "tower's 2-d tensors as matrices; their task vectors are zero, so that changes nothing.")

# %% [markdown]
# Merging the same task vectors under each rule (Iso-C, Iso-CTS, TSV-M and PACT-Iso-C), the relative
# difference ‖D_ours − D_ref‖ / ‖D_ref‖ of the merged update, over the keys where the rules
# disagree and over the whole vision tower:

# %% tags=["compute"]
from pactlib import merged_update, task_vectors_from

rows = []
tvs_vision = task_vectors_from(theta0_vision, [clip.vision_state_dict(p, trust_pickle=trust_pickle, naming=naming)
                                               for p in ft_paths], names=list(tasks))
differ = [k for k in theta0_vision if paper_scale._rule_view(PRESETS["default"], k, theta0_vision[k])
          != paper_scale._rule_view(PRESETS["reference_2d"], k, theta0_vision[k])]
for method, mode in (("iso_c", None), ("iso_cts", None), ("tsv_m", None), ("iso_c", "pact")):
    ours, _ = merged_update(method, theta0_vision, tvs_vision, pact=mode, rule=PRESETS["default"])
    ref, _ = merged_update(method, theta0_vision, tvs_vision, pact=mode, rule=PRESETS["reference_2d"])
    rel = lambda keys: (sum(float((ours[k] - ref[k]).norm() ** 2) for k in keys)
                        / max(sum(float(ref[k].norm() ** 2) for k in keys), 1e-30)) ** 0.5
    rows.append({"merge": f"PACT-{method}" if mode else method,
                 "keys that differ": rel(differ) if differ else float("nan"), "whole tower": rel(list(ours.keys()))})
records.write_records(path, [records.make_record("rule-difference", params=P, seed=seed if demo else None,
                                                 merge=r["merge"], metrics={"rel_keys": r["keys that differ"],
                                                                            "rel_all": r["whole tower"]})
                             for r in rows])

# %%
import pandas as pd

frame = records.records_frame(path)
diffs = frame[frame["method"] == "rule-difference"]
# the records name the merges "iso_c", ..., "PACT-iso_c"
plotting.table(pd.DataFrame({"merge": [report.pretty(f"pact-{m[5:]}" if m.startswith("PACT-") else m)
                                       for m in diffs["merge"]],
                             "keys that differ": diffs["metrics.rel_keys"],
                             "whole tower": diffs["metrics.rel_all"]}).reset_index(drop=True),
               chapter=12, number=8, floatfmt="{:.3f}",
               caption="Relative difference of the merged update, pactlib's rule vs the reference 2-d rule "
                       + ("(tiny worked example)." if demo else f"({Path(files['checkpoint_dir']).name})."))

# %% [markdown]
# ### What PACT does to every vision layer (data-free)
#
# The task vectors are the differences of the vision towers (`pactlib.task_vectors_from`,
# which checks keys, shapes and finiteness first). `pact_filter` with the default options
# (`PactOptions()`: K a tenth and k a twentieth of each layer's rank bound min(m, n), τ = 0.5,
# shield capped at half the input dimension, exact SVDs) reports per layer and task the LBW and
# shield ranks, whether the cap bound and the share of the update the filter removed. No data
# are needed for any of it.

# %% tags=["compute"]
from pactlib import PactOptions, pact_filter

theta0 = theta0_vision
task_vectors = tvs_vision
_, pact_report = pact_filter(theta0, task_vectors, options=PactOptions())
layers = paper_scale.layer_frame(pact_report, tasks)
records.write_records(path, [records.make_record("pact-layer", params=P, seed=seed if demo else None, layer=r.layer,
                                                 key=r.key, task=r.task, metrics={
                                                     "n": r.n, "core_rank": r.core_rank, "lbw_rank": r.lbw_rank,
                                                     "shield_rank": r.shield_rank, "capped": int(r.capped),
                                                     "removed_energy": r.removed_energy})
                             for r in layers.itertuples()])

# %%
frame = records.records_frame(path)
with plotting.figure("pact-per-layer", chapter=12, number=1, size="wide", ncols=2,
                     caption="PACT on the vision layers of "
                             + ("the tiny worked example" if demo else f"the checkpoints in {Path(files['checkpoint_dir']).name}")
                             + ", in network order. Left: share of ‖Δt‖² the filter removes (line: mean over tasks, "
                               "band: min–max). Right: shield size as a share of the input dimension n (mean over "
                               "tasks) and the share of tasks whose shield hit the cap.") as (fig, axes):
    paper_scale.plot_pact_layers(frame, axes)

# %% [markdown]
# ### Merging with the command line, and loading the result into a classifier
#
# In the worked example the files are plain state dicts, so `pact merge` reads them as they
# are. We merge with PACT-Iso-C at α = 1 (an arbitrary value: there is nothing to tune on
# here), load the merged vision tower into a `ClipClassifier` whose head comes from the tiny
# text tower, and score it on the tiny image folders read by `load_paper_task`. Random
# weights and random colours: the accuracies only show that every piece connects. On a tiny
# task's few test images an accuracy can land anywhere from 0 to 1, whatever the merge does,
# so Table 12.9 says nothing about how good the merge is. With real checkpoints this step is
# skipped: the chapters of the parameter set evaluate the merges (next section).

# %% tags=["compute"]
from pactlib import cli
from pactlib.data import paper

if demo:
    merged_path = ckpt_root / "merged-pact-iso_c.pt"
    exit_code = cli.main(["merge", "--method", "iso_c", "--pact", "pact", "--alpha", "1.0", "--pretrained",
                          str(pre_path), "--finetuned", *map(str, ft_paths), "--out", str(merged_path)])
    model, tokenizer = clip.build_clip(example.arch, weights=pre_path)
    test = {t: paper.load_paper_task(t, paper.task_root(data_dir, t), image_size=32, seed=seed)["test"] for t in tasks}
    heads = {t: clip.zeroshot_head(model, tokenizer, test[t].classes, paper.templates_for(t)) for t in tasks}
    zero_shot = {t: paper_scale.classifier_accuracy(clip.ClipClassifier.from_clip(model, heads[t]), test[t].images,
                                                    test[t].labels) for t in tasks}
    clip.ClipClassifier.from_clip(model, heads[tasks[0]]).load_vision(merged_path)  # the shared tower is now merged
    demo_records = [records.make_record("demo-accuracy", params=P, seed=seed, task=t, metrics={
        "zero_shot": zero_shot[t], "n_test": len(test[t].labels), "cli_exit": exit_code,
        "merged": paper_scale.classifier_accuracy(clip.ClipClassifier.from_clip(model, heads[t]), test[t].images,
                                                  test[t].labels)}) for t in tasks]
    records.write_records(path, demo_records)

# %%
if demo:
    frame = records.records_frame(path)
    demo_acc = frame[frame["method"] == "demo-accuracy"].set_index("task")
    plotting.table(pd.DataFrame({"θ0, zero-shot (%)": 100 * demo_acc["metrics.zero_shot"],
                                 "PACT-Iso-C merge (%)": 100 * demo_acc["metrics.merged"],
                                 "test images": demo_acc["metrics.n_test"].astype(int)}),
        chapter=12, number=9, floatfmt="{:.1f}",
        caption="Tiny worked example only (random weights, random images): test accuracy (%) of θ0 and of the "
                "PACT-Iso-C merge written by `pact merge`, per tiny task. Chance is 33.3%.")

# %% [markdown]
# ### Datasets
#
# With `data_root` set (and, in the worked example, on its tiny folders), every task's folder
# is looked up and indexed without decoding an image: the number of classes and of train and
# test images, or what is missing.

# %% tags=["compute"]
if data_dir is not None:
    records.write_records(path, paper_scale.data_check_records(paper_scale.data_check(data_dir, tasks), params=P))

# %%
check = paper_scale.data_check_table(records.read_records(path))
if len(check):
    plotting.table(check, chapter=12, number=10 if demo else 9, floatfmt="{:,.0f}",
                   caption="Dataset folders found under data_root: classes, train and test images, status.")

# %% [markdown]
# ## Where the measured results are
#
# With a parameter set of `params/paper-*.yaml`, the merges of your checkpoints are measured in
# the chapters before this one, each on the clip testbed of the set: the main table (every base
# method with and without PACT, α chosen on validation, test accuracy) in
# [chapter 5](05_main_results.ipynb), PACT against S-PACT in [chapter 6](06_static_vs_dynamic.ipynb),
# PACT by depth in [chapter 7](07_layer_depth.ipynb), the cost of the filter on these layers in
# [chapter 8](08_efficiency.ipynb) and the sensitivity to PACT's options in
# [chapter 11](11_sensitivity.ipynb); chapters 3, 4 and 10 test the LBW claims and the theory on
# the same checkpoints. Their records are in `book/records/<set>/main/<chapter>/` (for example
# `book/records/paper-vitb32-8/main/05_main_results/`), on your machine only: git ignores
# `book/records/paper-*/`. The default book has none of them: there those chapters run on the
# built-in testbeds.
#
# ## Verdict
#
# The paper-scale claims need the paper's checkpoints and an evaluation on its datasets.

# %%
frame = records.records_frame(path)
layers = frame[frame["method"] == "pact-layer"].rename(columns=lambda c: c.removeprefix("metrics."))
plotting.verdict(
    "C5–C7 at paper scale", "not yet tested",
    ("no paper-scale checkpoints were supplied; the tables show published numbers only, and the worked example "
     f"ran the CLIP path on a tiny random model ({len(tasks)} tasks, {len(layers['key'].unique())} vision matrix "
     f"layers, PACT removed {100 * layers['removed_energy'].mean():.0f} % of the update energy on average)")
    if demo else
    (f"checkpoints of {len(tasks)} tasks ({testbed}) were read and filtered here (PACT removed "
     f"{100 * layers['removed_energy'].mean():.1f} % of the update energy on average over "
     f"{len(layers['key'].unique())} layers, cap bound on {100 * layers['capped'].mean():.1f} % of shields); "
     "the merged models are evaluated in the earlier chapters of this parameter set, and chapter 5's verdicts "
     "decide C5–C7 on them"))
