"""The model zoo of the built-in testbed: heads, full and LoRA fine-tunes of EfficientNet-Lite0.

For every task t of a suite and every seed s, the zoo holds

- ``pretrained.safetensors`` -- θ0, the ImageNet Lite0 backbone (shared);
- ``heads/<t>.safetensors`` (+ ``.json``) -- the task's frozen linear head, fit on θ0's features
  of the train split (:mod:`pactlib.testbeds.lite0.heads`); its accuracy on θ0 is the "zero-shot" acc_0(t);
- ``full/<t>/seed<s>.safetensors`` (+ ``.json``) -- θt after full fine-tuning of the backbone
  (head frozen, BatchNorm in eval mode: see :mod:`pactlib.models.efficientnet`);
- ``lora/<t>/seed<s>.safetensors`` (+ ``.json``) -- LoRA adapters (A, B) on the 32 pointwise
  convolutions, everything else frozen (:mod:`pactlib.lora`);
- ``manifest.json`` -- every file with its sha256, and every run's record.

Each run's JSON record holds the task, seed, kind, the full :class:`Recipe`, zero-shot and
fine-tuned accuracy on val and test, the seconds it took and the checkpoint's sha256.

**Resumable and safe.** Every file is written atomically (temp file + ``os.replace``), the
checkpoint before its record. A run counts as done only when its record exists, was made with
the same recipe (the fields that matter for its kind), and the checkpoint's sha256 matches the
record; anything else (interrupted run, truncated or corrupt file, changed recipe) is rebuilt,
never used. Loading (:func:`load_zoo`) checks the same sha256s and raises on a mismatch.

**Randomness.** The split is fixed by ``Recipe.data_seed`` (the data module's seed); the zoo
seed s drives the batch order and the LoRA initialisation through one ``torch.Generator`` per
run, seeded from (kind, task, s); the global RNG is not used. :func:`build_zoo` trains on one
torch thread whatever the machine's cores: two threads sum the gradients in another order and
give fine-tunes that differ in float32 rounding (up to 3e-5 on a smoke-sized run), one thread
gives the same tensors on every build on a given CPU; files are written with sorted headers
(:func:`pactlib.testbeds.lite0.heads.save_safetensors`), so their sha256 repeat too. The book's
runner builds a zoo beside other jobs anyway (``scripts/run_notebooks.py``).

CLI: ``pact zoo build --suite 8 --seeds 0 1 2 [--kind full lora]`` (see :func:`add_cli`).
Book: chapter "The testbed".
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib import lora as lora_mod
from pactlib.eval import accuracy, features
from pactlib.testbeds.lite0.heads import Head, file_sha256, fit_head, fit_prototype_head, load_head, load_safetensors, save_head, save_safetensors
from pactlib.testbeds.zoo_files import (read_json, record_problem, run_seed, update_manifest, warmup_cosine,
                                       write_json)
from pactlib.testbeds.zoo_files import train_loop as _train_loop
from pactlib.paths import cache_dir
from pactlib.threads import single_threaded
from pactlib.models.efficientnet import backbone_state_dict, load_backbone, preprocess

log = logging.getLogger(__name__)

KINDS = ("full", "lora")
BACKBONE = "efficientnet-lite0"


@dataclass(frozen=True)
class Recipe:
    """Hyper-parameters of the zoo. The defaults *are* the book's recipe: the ``default`` profile
    (``pactlib.testbeds.lite0.testbed.PROFILES``) takes them as they are, and ``tests/test_zoo.py``
    pins them, since every zoo record is keyed by them (:meth:`relevant`).

    The book's recipe: cosine prototype heads (CLIP-like), 80 AdamW steps of 64 images at 32 px,
    lr 3e-5 (full) / 1e-3 (LoRA r = 8, alpha = 16), chosen by measurement on the 8 / 14 / 20-task
    suites (chapter 2, "Why a prototype head" and "How the recipe was chosen"). The time a run
    takes is in the zoo's run records (chapter 2, the fine-tuning time table). Rejected by
    measurement:

    - ``head="probe"`` (a ridge logistic-regression head trained on θ0's raw features): zero-shot
      is already high and Task Arithmetic barely beats it, its best α at the grid floor:
      fine-tuning grows the unnormalised features, which breaks the other tasks' heads
      (``book/data/head_choice.jsonl``, ``bench/bench_heads.py``).
    - lr 5e-4 (with the probe head): every merge stayed at or below the zero-shot model.
    - lr 1e-4, the book's first default: Task Arithmetic's loss on the 8 shared tasks grows from 8
      to 14 tasks but its step from 14 to 20 stays inside the seed spread; ``steps=160``,
      ``resolution=48`` and ``head_shots=2`` on top of it move the levels, not that shape
      (``book/data/interference_lr1e-4*.jsonl``).

    lr 3e-5 gives shorter task vectors; Task Arithmetic on the 8 shared tasks then falls from 8 to
    14 to 20 tasks, every step on every seed and beyond the seed spread, provided the α grid
    resolves small α (the full grid or 5 geometric values, ``pactlib.testbeds.GRID_SPACING``):
    ``book/data/interference.jsonl`` and ``interference_fullgrid.jsonl``
    (``bench/bench_interference.py``).

    Attributes:
        resolution: input side in pixels (images are 32x32; larger means bilinear upsampling).
        steps: optimizer steps per fine-tuning run.
        batch_size: images per step.
        optimizer: ``"adamw"`` or ``"sgd"`` (momentum 0.9).
        lr: peak learning rate of full fine-tuning.
        lora_lr: peak learning rate of LoRA fine-tuning.
        weight_decay: decoupled weight decay (AdamW) / L2 (SGD), on trained tensors.
        warmup: linear warm-up steps, then cosine decay to 0.
        lora_rank: r of the adapters; lora_alpha: scale = lora_alpha / lora_rank.
        augment: ``"none"`` or ``"shift"`` (random translation by up to 2 px, zero padded).
        head: ``"probe"`` (ridge logistic regression on raw θ0 features, :func:`pactlib.testbeds.lite0.heads.fit_head`)
            or ``"prototype"`` (cosine class-mean head, CLIP-like, :func:`pactlib.testbeds.lite0.heads.fit_prototype_head`).
        head_l2, head_max_iter: ridge strength (probe) and L-BFGS cap of the head fit.
        head_shots: prototype head only: class embeddings from this many train images per class
            (None: all); see :func:`pactlib.testbeds.lite0.heads.fit_prototype_head`.
        data_seed: seed of the data splits (``load_task(..., seed=data_seed)``).
        train_limit, eval_limit: caps on train / val+test examples per task (None: all); for
            tests and quick looks only.
    """

    resolution: int = 32
    steps: int = 80
    batch_size: int = 64
    optimizer: str = "adamw"
    lr: float = 3e-5
    lora_lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 8
    lora_rank: int = 8
    lora_alpha: float = 16.0
    augment: str = "none"
    head: str = "prototype"
    head_l2: float = 1e-2
    head_max_iter: int = 300
    head_shots: int | None = None
    data_seed: int = 0
    train_limit: int | None = None
    eval_limit: int | None = None

    def __post_init__(self):
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"Recipe.optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.head not in ("probe", "prototype"):
            raise ValueError(f"Recipe.head must be 'probe' or 'prototype', got {self.head!r}")
        if self.augment not in ("none", "shift"):
            raise ValueError(f"Recipe.augment must be 'none' or 'shift', got {self.augment!r}")
        for name in ("steps", "batch_size", "lora_rank", "resolution"):
            if getattr(self, name) < 1:
                raise ValueError(f"Recipe.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_shots is not None:
            if self.head != "prototype":
                raise ValueError(f"Recipe.head_shots applies to the prototype head only, got head={self.head!r}")
            if self.head_shots < 1:
                raise ValueError(f"Recipe.head_shots must be >= 1 or None, got {self.head_shots}")

    #: fields that decide a head, and in addition a full / LoRA run.
    HEAD_FIELDS = ("resolution", "head", "head_l2", "head_max_iter", "head_shots", "data_seed", "train_limit",
                   "eval_limit")
    RUN_FIELDS = ("steps", "batch_size", "optimizer", "weight_decay", "warmup", "augment")
    KIND_FIELDS = {"full": ("lr",), "lora": ("lora_lr", "lora_rank", "lora_alpha")}

    #: fields added after zoos were built: listed only when set, so older records stay valid.
    OPTIONAL_FIELDS = ("head_shots",)

    def relevant(self, kind: str) -> dict[str, Any]:
        """The recipe fields a ``kind`` ("head", "full", "lora") depends on, as a dict
        (an :attr:`OPTIONAL_FIELDS` entry only when it is not None)."""
        names = self.HEAD_FIELDS if kind == "head" else self.HEAD_FIELDS + self.RUN_FIELDS + self.KIND_FIELDS[kind]
        return {n: getattr(self, n) for n in names
                if not (n in self.OPTIONAL_FIELDS and getattr(self, n) is None)}


# ----------------------------------------------------------------------------- paths, records
def default_zoo_dir() -> Path:
    """``$PACT_CACHE/zoo``, else the per-user cache's ``zoo/`` (:func:`pactlib.paths.cache_dir`;
    the Makefile exports ``PACT_CACHE=<repo>/.cache``)."""
    return cache_dir("zoo")


def run_path(zoo_dir: Path, kind: str, task: str, seed: int) -> Path:
    """Checkpoint path of one run; its record is the same path with ``.json``."""
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    return Path(zoo_dir) / kind / task / f"seed{seed}.safetensors"


def head_path(zoo_dir: Path, task: str) -> Path:
    return Path(zoo_dir) / "heads" / f"{task}.safetensors"


_write_json = write_json
_read_json = read_json
_run_seed = run_seed


def _upgrade_recipe(got: dict) -> dict:
    """Records older than ``Recipe.head`` were made with the probe head."""
    return {**got, "head": "probe"} if "head" not in got else got


def _valid(record: dict | None, ckpt: Path, wanted: Mapping[str, Any], head_sha256: str | None = None) -> str | None:
    """None when ``record`` describes ``ckpt`` made with ``wanted`` (and, for a run, through the head
    whose file has ``head_sha256``); else why not (:func:`pactlib.testbeds.zoo_files.record_problem`)."""
    return record_problem(record, ckpt, wanted, head_sha256,
                          upgrade=_upgrade_recipe if "head" in wanted else None)


def _update_manifest(zoo_dir: Path, entry_key: str, entry: dict) -> None:
    update_manifest(zoo_dir, entry_key, entry, BACKBONE)


# ----------------------------------------------------------------------------- training
def _schedule(step: int, recipe: Recipe) -> float:
    """LR multiplier: linear warm-up over ``recipe.warmup`` steps, then cosine to 0."""
    return warmup_cosine(step, recipe.steps, recipe.warmup)


def _shift(x: Tensor, gen: torch.Generator, pad: int = 2) -> Tensor:
    """Random translation of each image (N, 3, R, R) by up to ``pad`` px, zero (= mid-grey) filled."""
    n, _, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    off = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)
    return torch.stack([xp[i, :, a : a + h, b : b + w] for i, (a, b) in enumerate(off.tolist())])


def train_loop(model: torch.nn.Module, params: list[Tensor], head: Head, x: Tensor, y: Tensor, *,
               recipe: Recipe, lr: float, generator: torch.Generator, desc: str = "",
               progress: bool = False) -> list[float]:
    """Minimise cross-entropy of ``head(model(x))`` over ``params`` (the head stays frozen).

    The model stays in eval mode (BatchNorm statistics frozen). Batches are drawn epoch-wise from
    a random permutation of ``generator``.

    Args:
        x: preprocessed inputs (N, 3, R, R); y: labels (N,).

    Returns:
        the loss of every step.
    """
    return _train_loop(model, params, head.logits, x, y, steps=recipe.steps, batch_size=recipe.batch_size, lr=lr,
                       optimizer=recipe.optimizer, weight_decay=recipe.weight_decay, warmup=recipe.warmup,
                       generator=generator, augment=None if recipe.augment == "none" else _shift, desc=desc,
                       progress=progress)


def finetune_full(pretrained: Mapping[str, Tensor], head: Head, x: Tensor, y: Tensor, *, recipe: Recipe,
                  generator: torch.Generator, desc: str = "", progress: bool = False):
    """Full fine-tune of every floating parameter (BN statistics frozen). Returns (θt, losses)."""
    model = load_backbone(recipe.resolution, dict(pretrained))
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    losses = train_loop(model, params, head, x, y, recipe=recipe, lr=recipe.lr, generator=generator,
                        desc=desc, progress=progress)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def finetune_lora(pretrained: Mapping[str, Tensor], head: Head, x: Tensor, y: Tensor, *, recipe: Recipe,
                  generator: torch.Generator, desc: str = "", progress: bool = False):
    """LoRA fine-tune of the matrix layers only. Returns (adapters, scale, losses)."""
    model = load_backbone(recipe.resolution, dict(pretrained))
    adapters = lora_mod.init_adapters(pretrained, recipe.lora_rank, generator=generator)
    scale = lora_mod.lora_scale(recipe.lora_rank, recipe.lora_alpha)
    params = lora_mod.attach(model, adapters, scale)
    losses = train_loop(model, params, head, x, y, recipe=recipe, lr=recipe.lora_lr, generator=generator,
                        desc=desc, progress=progress)
    trained = lora_mod.read_adapters(model)
    lora_mod.detach(model)
    return trained, scale, losses


# ----------------------------------------------------------------------------- build
def _default_loader():
    from pactlib.data import load_task

    return load_task


def _suite_task_names(suite: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(suite, str):
        from pactlib.data import suite_tasks

        return tuple(suite_tasks(suite))
    return tuple(suite)


class _Data:
    """Lazily loaded splits of one task (train preprocessed once)."""

    def __init__(self, task: str, loader: Callable, recipe: Recipe, data_dir):
        self.task, self.loader, self.recipe, self.data_dir = task, loader, recipe, data_dir
        self._splits: dict[str, Any] = {}

    def split(self, name: str):
        if name not in self._splits:
            limit = self.recipe.train_limit if name == "train" else self.recipe.eval_limit
            kw = {"seed": self.recipe.data_seed, "limit": limit}
            if self.data_dir is not None:
                kw["cache_dir"] = self.data_dir
            self._splits[name] = self.loader(self.task, name, **kw)
        return self._splits[name]

    def train_inputs(self) -> tuple[Tensor, Tensor]:
        if "_x" not in self._splits:
            tr = self.split("train")
            self._splits["_x"] = (preprocess(tr.images, self.recipe.resolution), tr.labels)
        return self._splits["_x"]


def ensure_pretrained(zoo_dir: Path) -> dict[str, Tensor]:
    """θ0 from ``pretrained.safetensors`` (written, or rewritten when corrupt, from the package)."""
    path = zoo_dir / "pretrained.safetensors"
    man = _read_json(zoo_dir / "manifest.json") or {}
    sha = man.get("pretrained", {}).get("sha256")
    if path.is_file() and sha and file_sha256(path) == sha:
        return load_safetensors(path)[0]
    sd = backbone_state_dict()
    sha = save_safetensors(sd, path, {"backbone": BACKBONE})
    man = _read_json(zoo_dir / "manifest.json") or {}
    man.update(backbone=BACKBONE, pretrained={"file": path.name, "sha256": sha})
    _write_json(zoo_dir / "manifest.json", man)
    return sd


def ensure_head(zoo_dir: Path, data: _Data, pretrained: Mapping[str, Tensor], recipe: Recipe) -> tuple[Head, dict]:
    """The task's head and its record (fit and saved when missing, stale or corrupt)."""
    path = head_path(zoo_dir, data.task)
    rec = _read_json(path.with_suffix(".json"))
    why = _valid(rec, path, recipe.relevant("head"))
    if why is None:
        return load_head(path), rec
    log.info("head %s: %s -> fitting", data.task, why)
    t0 = time.perf_counter()
    x, y = data.train_inputs()
    tr = data.split("train")
    feats = features(pretrained, x, resolution=recipe.resolution)
    if recipe.head == "prototype":
        head = fit_prototype_head(feats, y, tr.classes, max_iter=recipe.head_max_iter, shots=recipe.head_shots,
                                  seed=recipe.data_seed)
    else:
        head = fit_head(feats, y, tr.classes, l2=recipe.head_l2, max_iter=recipe.head_max_iter)
    zs = {s: accuracy(pretrained, head, data.split(s), resolution=recipe.resolution) for s in ("val", "test")}
    sha = save_head(head, path, task=data.task)
    rec = {"task": data.task, "kind": "head", "recipe": recipe.relevant("head"), "sha256": sha,
           "file": str(path.relative_to(zoo_dir)), "classes": list(tr.classes), "n_train": int(y.numel()),
           "zero_shot": zs, "seconds": time.perf_counter() - t0}
    _write_json(path.with_suffix(".json"), rec)
    _update_manifest(zoo_dir, f"heads/{data.task}", rec)
    return head, rec


def build_run(zoo_dir: Path, kind: str, data: _Data, seed: int, pretrained: Mapping[str, Tensor],
              head: Head, head_rec: dict, recipe: Recipe, *, progress: bool = False) -> dict:
    """One fine-tuning run (or its existing valid record). Returns the run's record."""
    path = run_path(zoo_dir, kind, data.task, seed)
    rec = _read_json(path.with_suffix(".json"))
    why = _valid(rec, path, recipe.relevant(kind), head_rec["sha256"])
    if why is None:
        return rec
    log.info("%s/%s/seed%d: %s -> training", kind, data.task, seed, why)
    t0 = time.perf_counter()
    x, y = data.train_inputs()
    gen = torch.Generator().manual_seed(_run_seed(kind, data.task, seed))
    desc = f"{kind} {data.task} s{seed}"
    if kind == "full":
        theta, losses = finetune_full(pretrained, head, x, y, recipe=recipe, generator=gen, desc=desc,
                                      progress=progress)
        tensors, meta = theta, {"task": data.task, "seed": seed, "kind": kind}
    else:
        adapters, scale, losses = finetune_lora(pretrained, head, x, y, recipe=recipe, generator=gen,
                                                desc=desc, progress=progress)
        theta = lora_mod.merge_adapters(pretrained, adapters, scale)
        tensors = lora_mod.adapters_to_tensors(adapters)
        meta = {"task": data.task, "seed": seed, "kind": kind, "scale": scale, "rank": recipe.lora_rank,
                "alpha": recipe.lora_alpha}
    t_train = time.perf_counter() - t0
    ft = {s: accuracy(theta, head, data.split(s), resolution=recipe.resolution) for s in ("val", "test")}
    sha = save_safetensors(tensors, path, meta)
    rec = {"task": data.task, "seed": seed, "kind": kind, "backbone": BACKBONE,
           "recipe": recipe.relevant(kind), "sha256": sha, "file": str(path.relative_to(zoo_dir)),
           "head_sha256": head_rec["sha256"], "zero_shot": head_rec["zero_shot"], "finetuned": ft,
           "n_train": int(y.numel()), "first_loss": losses[0], "final_loss": sum(losses[-10:]) / len(losses[-10:]),
           "train_seconds": t_train, "seconds": time.perf_counter() - t0}
    if kind == "lora":
        rec["lora_scale"] = meta["scale"]
    _write_json(path.with_suffix(".json"), rec)
    _update_manifest(zoo_dir, f"{kind}/{data.task}/seed{seed}", rec)
    return rec


@single_threaded()  # one thread: a fine-tune is a function of its recipe and seed (module docstring)
def build_zoo(suite: str | Sequence[str], seeds: Iterable[int] = (0,), *, kind: Sequence[str] = KINDS,
              zoo_dir: str | Path | None = None, recipe: Recipe = Recipe(), loader: Callable | None = None,
              data_dir: str | Path | None = None, progress: bool = True) -> list[dict]:
    """Build (or complete) the zoo for ``suite`` x ``seeds`` x ``kind``; returns every run's record.

    Args:
        suite: a suite name ("8", "14", "20") or an explicit sequence of task names.
        seeds: fine-tuning seeds.
        kind: subset of ("full", "lora").
        zoo_dir: output folder (default :func:`default_zoo_dir`).
        recipe: the :class:`Recipe`.
        loader: ``loader(task, split, *, seed, limit[, cache_dir]) -> TaskData``; default
            :func:`pactlib.data.load_task`.
        data_dir: ``cache_dir`` passed to the loader (default: the loader's own default).
        progress: tqdm bars (one over runs, one per run over steps).

    Returns:
        list of run records, in (task, seed, kind) order; finished valid runs are not redone.

    Raises:
        ValueError: unknown kind. Errors of the loader (unknown task, missing data) propagate.
    """
    from tqdm.auto import tqdm

    kinds = tuple(kind)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown zoo kind(s) {bad}; use a subset of {KINDS}")
    seeds = [int(s) for s in seeds]
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
    zoo_dir.mkdir(parents=True, exist_ok=True)
    loader = loader or _default_loader()
    tasks = _suite_task_names(suite)
    pretrained = ensure_pretrained(zoo_dir)
    records = []
    jobs = [(t, s, k) for t in tasks for s in seeds for k in kinds]
    bar = tqdm(total=len(jobs), desc=f"zoo {suite if isinstance(suite, str) else len(tasks)}",
               disable=not progress)
    for task in tasks:
        data = _Data(task, loader, recipe, data_dir)
        head, head_rec = ensure_head(zoo_dir, data, pretrained, recipe)
        for s in seeds:
            for k in kinds:
                rec = build_run(zoo_dir, k, data, s, pretrained, head, head_rec, recipe, progress=progress)
                records.append(rec)
                bar.set_postfix(task=task, acc=f"{rec['zero_shot']['test']:.2f}->{rec['finetuned']['test']:.2f}")
                bar.update()
    bar.close()
    return records


# ----------------------------------------------------------------------------- load
@dataclass
class Zoo:
    """A loaded slice of the zoo: one kind, one seed, a list of tasks (in suite order).

    Attributes:
        pretrained: θ0 backbone state dict.
        heads: ``{task: Head}``.
        finetuned: ``{task: θt}`` (LoRA: θ0 + scale·B A, a full state dict).
        records: ``{task: run record}``.
        adapters: LoRA only: ``{task: {key: (A, B)}}``; scales in ``records[t]["lora_scale"]``.
    """

    kind: str
    seed: int
    pretrained: dict[str, Tensor]
    heads: dict[str, Head]
    finetuned: dict[str, dict[str, Tensor]]
    records: dict[str, dict]
    adapters: dict[str, dict] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return list(self.finetuned)

    def task_vectors(self) -> dict[str, dict[str, Tensor]]:
        """Exact Δt per task over floating keys, float32 (LoRA: scale·B A, zeros elsewhere)."""
        if self.kind == "lora":
            return {t: lora_mod.lora_task_vector(self.pretrained, a, self.records[t]["lora_scale"])
                    for t, a in self.adapters.items()}
        return {t: {k: v.float() - self.pretrained[k].float() for k, v in sd.items() if v.is_floating_point()}
                for t, sd in self.finetuned.items()}

    def accuracies(self, split: str = "test", which: str = "finetuned") -> dict[str, float]:
        """``{task: acc}`` from the records; ``which`` is "finetuned" or "zero_shot"."""
        return {t: r[which][split] for t, r in self.records.items()}


def _missing(what: str, path: Path, suite) -> FileNotFoundError:
    return FileNotFoundError(
        f"zoo {what} missing or invalid at {path}; build it with: pact zoo build --suite {suite} "
        f"--seeds 0 (zoo dir {path.parents[0]}; the default zoo is $PACT_CACHE/zoo, now {default_zoo_dir()})")


def load_zoo(suite: str | Sequence[str], *, seed: int = 0, kind: str = "full",
             zoo_dir: str | Path | None = None) -> Zoo:
    """Load θ0, heads and fine-tuned checkpoints of ``suite`` for one ``seed`` and ``kind``.

    Every file is checked against the sha256 in its record.

    Raises:
        FileNotFoundError: a file or record is missing, or a sha256 does not match (the message
            names the file and the ``pact zoo build`` command that makes it).
        ValueError: unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
    tasks = _suite_task_names(suite)
    label = suite if isinstance(suite, str) else "<suite>"
    pre_path = zoo_dir / "pretrained.safetensors"
    man = _read_json(zoo_dir / "manifest.json") or {}
    if not pre_path.is_file() or file_sha256(pre_path) != man.get("pretrained", {}).get("sha256"):
        raise _missing("pretrained checkpoint", pre_path, label)
    pretrained = load_safetensors(pre_path)[0]
    heads, fts, recs, adapters = {}, {}, {}, {}
    for t in tasks:
        hp = head_path(zoo_dir, t)
        hrec = _read_json(hp.with_suffix(".json"))
        if hrec is None or not hp.is_file() or file_sha256(hp) != hrec.get("sha256"):
            raise _missing(f"head of task {t!r}", hp, label)
        heads[t] = load_head(hp)
        rp = run_path(zoo_dir, kind, t, seed)
        rec = _read_json(rp.with_suffix(".json"))
        if rec is None or not rp.is_file() or file_sha256(rp) != rec.get("sha256"):
            raise _missing(f"{kind} run of task {t!r} seed {seed}", rp, label)
        tensors, _ = load_safetensors(rp)
        if kind == "lora":
            adapters[t] = lora_mod.adapters_from_tensors(tensors)
            fts[t] = lora_mod.merge_adapters(pretrained, adapters[t], rec["lora_scale"])
        else:
            fts[t] = tensors
        recs[t] = rec
    return Zoo(kind, seed, pretrained, heads, fts, recs, adapters)


def load_records(zoo_dir: str | Path | None = None, kind: str | None = None) -> list[dict]:
    """Every run record in the zoo's manifest (optionally one ``kind``, or ``"head"``)."""
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
    man = _read_json(zoo_dir / "manifest.json") or {}
    recs = list(man.get("entries", {}).values())
    return [r for r in recs if kind is None or r.get("kind") == kind]


# ----------------------------------------------------------------------------- CLI
def _cmd_build(args) -> int:
    over = {f.name: getattr(args, f.name) for f in fields(Recipe) if getattr(args, f.name, None) is not None}
    recipe = replace(Recipe(), **over)
    recs = build_zoo(args.suite, args.seeds, kind=args.kind, zoo_dir=args.zoo_dir, recipe=recipe,
                     data_dir=args.data_dir, progress=not args.no_progress)
    for r in recs:
        print(json.dumps({k: r[k] for k in ("kind", "task", "seed", "zero_shot", "finetuned", "seconds")}))
    return 0


def add_cli(subparsers) -> None:
    """Register ``pact zoo build`` on an argparse sub-parsers object (called by pactlib.cli)."""
    zoo = subparsers.add_parser("zoo", help="the built-in testbed's model zoo (Lite0 fine-tunes)")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    b = zsub.add_parser("build", help="fit heads and fine-tune (full and/or LoRA); resumable",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--suite", required=True, help="suite name: 8, 14 or 20")
    b.add_argument("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds")
    b.add_argument("--kind", nargs="+", choices=KINDS, default=list(KINDS), help="which fine-tunes")
    b.add_argument("--zoo-dir", default=None, help="output folder (default $PACT_CACHE/zoo)")
    b.add_argument("--data-dir", default=None, help="data cache folder (default: the data module's)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    defaults = Recipe()
    for f in fields(Recipe):
        default = getattr(defaults, f.name)
        typ = type(default) if default is not None else int
        b.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=typ, default=None,
                       help=f"Recipe.{f.name} (default {default})")
    b.set_defaults(func=_cmd_build)
