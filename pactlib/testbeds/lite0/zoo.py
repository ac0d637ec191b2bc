"""The Lite0 family's zoo adapter: heads, full and LoRA fine-tunes of EfficientNet-Lite0.

The trainer, the files and the records are :mod:`pactlib.testbeds.zoo_trainer`'s; this module
is what the Lite0 family adds (:class:`Lite0Zoo`: θ0, inputs, model, heads, augmentation) and
its :class:`Recipe`. For every task t of a suite and every seed s, the zoo holds

- ``pretrained.safetensors`` -- θ0, the ImageNet Lite0 backbone (shared);
- ``heads/<t>.safetensors`` (+ ``.json``) -- the task's frozen linear head, fit on θ0's features
  of the train split (:mod:`pactlib.testbeds.lite0.heads`); its accuracy on θ0 is the "zero-shot" acc_0(t);
- ``full/<t>/seed<s>.safetensors`` (+ ``.json``) -- θt after full fine-tuning of the backbone
  (head frozen, BatchNorm in eval mode: see :mod:`pactlib.models.efficientnet`);
- ``lora/<t>/seed<s>.safetensors`` (+ ``.json``) -- LoRA adapters (A, B) on the 32 pointwise
  convolutions, everything else frozen (:mod:`pactlib.lora`);
- ``manifest.json`` -- every file with its sha256, and every run's record.

Resumability, the sha256 checks and the randomness (one generator per run, one torch thread)
are the trainer's (:mod:`pactlib.testbeds.zoo_trainer`). Lite0 adds the ``augment`` option (random
shifts) and the upgrade of records older than ``Recipe.head`` (made with the probe head).

CLI: ``pact zoo build --suite 8 --seeds 0 1 2 [--kind full lora]`` (see :func:`add_cli`).
Book: chapter "The testbed".
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib.eval import accuracy, features
from pactlib.models.efficientnet import backbone_state_dict, load_backbone, preprocess
from pactlib.testbeds import zoo_trainer as T
from pactlib.testbeds.lite0.heads import Head, fit_head, fit_prototype_head
from pactlib.testbeds.zoo_files import record_problem
from pactlib.testbeds.zoo_trainer import KINDS, RecipeFields, Zoo, head_path, run_path

log = logging.getLogger(__name__)

BACKBONE = "efficientnet-lite0"


@dataclass(frozen=True)
class Recipe(RecipeFields):
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
        self.check_common()
        if self.head not in ("probe", "prototype"):
            raise ValueError(f"Recipe.head must be 'probe' or 'prototype', got {self.head!r}")
        if self.augment not in ("none", "shift"):
            raise ValueError(f"Recipe.augment must be 'none' or 'shift', got {self.augment!r}")
        if self.resolution < 1:
            raise ValueError(f"Recipe.resolution must be >= 1, got {self.resolution}")
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


# ----------------------------------------------------------------------------- the family
def _upgrade_recipe(got: dict) -> dict:
    """Records older than ``Recipe.head`` were made with the probe head."""
    return {**got, "head": "probe"} if "head" not in got else got


def _shift(x: Tensor, gen: torch.Generator, pad: int = 2) -> Tensor:
    """Random translation of each image (N, 3, R, R) by up to ``pad`` px, zero (= mid-grey) filled."""
    n, _, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    off = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)
    return torch.stack([xp[i, :, a : a + h, b : b + w] for i, (a, b) in enumerate(off.tolist())])


class Lite0Zoo(T.ZooFamily):
    """EfficientNet-Lite0 on the image tasks of :mod:`pactlib.data`: θ0 from the package,
    inputs preprocessed at ``Recipe.resolution`` px, the backbone in eval mode (BatchNorm
    statistics frozen), prototype or probe heads on θ0's features, LoRA on every map of
    :data:`pactlib.matrix.DEFAULT_RULE` (the 32 pointwise convolutions)."""

    backbone = BACKBONE
    zoo_dirname = "zoo"
    label = "lite0"

    def build_command(self, suite) -> str:
        return f"pact zoo build --suite {suite} --seeds 0"

    def task_names(self, suite: str) -> tuple[str, ...]:
        from pactlib.data import suite_tasks

        return tuple(suite_tasks(suite))

    def default_loader(self) -> Callable:
        from pactlib.data import load_task

        return load_task

    def make_pretrained(self) -> tuple[dict[str, Tensor], dict]:
        return backbone_state_dict(), {}

    def inputs(self, data, recipe: Recipe) -> tuple[Tensor, Tensor]:
        return preprocess(data.images, recipe.resolution), data.labels

    def model(self, state, pre, recipe: Recipe):
        return load_backbone(recipe.resolution, dict(state))

    def fit_head(self, pretrained, pre, data: T.TaskSplits, recipe: Recipe) -> Head:
        x, y = data.inputs("train")
        tr = data.split("train")
        feats = features(pretrained, x, resolution=recipe.resolution)
        if recipe.head == "prototype":
            return fit_prototype_head(feats, y, tr.classes, max_iter=recipe.head_max_iter, shots=recipe.head_shots,
                                      seed=recipe.data_seed)
        return fit_head(feats, y, tr.classes, l2=recipe.head_l2, max_iter=recipe.head_max_iter)

    def accuracy(self, state, pre, head: Head, data: T.TaskSplits, split: str, recipe: Recipe) -> float:
        return accuracy(state, head, data.split(split), resolution=recipe.resolution)

    def upgrade_recipe(self, got: dict) -> dict:
        return _upgrade_recipe(got)

    def augment(self, recipe: Recipe):
        return None if recipe.augment == "none" else _shift


FAMILY = Lite0Zoo()


# ----------------------------------------------------------------------------- module API
def default_zoo_dir() -> Path:
    """``$PACT_CACHE/zoo``, else the per-user cache's ``zoo/`` (:func:`pactlib.paths.cache_dir`;
    the Makefile exports ``PACT_CACHE=<repo>/.cache``)."""
    return FAMILY.default_zoo_dir()


def _valid(record: dict | None, ckpt: Path, wanted: Mapping[str, Any], head_sha256: str | None = None) -> str | None:
    """None when ``record`` describes ``ckpt`` made with ``wanted`` (and, for a run, through the head
    whose file has ``head_sha256``); else why not (:func:`pactlib.testbeds.zoo_files.record_problem`)."""
    return record_problem(record, ckpt, wanted, head_sha256, upgrade=_upgrade_recipe)


def finetune_full(pretrained: Mapping[str, Tensor], head: Head, x: Tensor, y: Tensor, *, recipe: Recipe,
                  generator: torch.Generator, desc: str = "", progress: bool = False):
    """Full fine-tune of every floating parameter (BN statistics frozen); x (N, 3, R, R), y (N,).
    Returns (θt, losses)."""
    return T.finetune_full(FAMILY, pretrained, {}, head, x, y, recipe=recipe, generator=generator, desc=desc,
                           progress=progress)


def finetune_lora(pretrained: Mapping[str, Tensor], head: Head, x: Tensor, y: Tensor, *, recipe: Recipe,
                  generator: torch.Generator, desc: str = "", progress: bool = False):
    """LoRA fine-tune of the matrix layers only. Returns (adapters, scale, losses)."""
    return T.finetune_lora(FAMILY, pretrained, {}, head, x, y, recipe=recipe, generator=generator, desc=desc,
                           progress=progress)


def build_zoo(suite: str | Sequence[str], seeds: Iterable[int] = (0,), *, kind: Sequence[str] = KINDS,
              zoo_dir: str | Path | None = None, recipe: Recipe = Recipe(), loader: Callable | None = None,
              data_dir: str | Path | None = None, progress: bool = True) -> list[dict]:
    """Build (or complete) the Lite0 zoo for ``suite`` ("8", "14", "20" or task names) × ``seeds``
    × ``kind``; ``loader`` defaults to :func:`pactlib.data.load_task`. Returns every run's record
    (:func:`pactlib.testbeds.zoo_trainer.build_zoo`, which documents the arguments and errors)."""
    return T.build_zoo(FAMILY, suite, seeds, kind=kind, zoo_dir=zoo_dir, recipe=recipe, loader=loader,
                       data_dir=data_dir, progress=progress)


def load_zoo(suite: str | Sequence[str], *, seed: int = 0, kind: str = "full",
             zoo_dir: str | Path | None = None) -> Zoo:
    """Load θ0, heads and fine-tuned checkpoints of ``suite`` for one ``seed`` and ``kind``, every
    file checked against its sha256 (:func:`pactlib.testbeds.zoo_trainer.load_zoo`).

    Raises:
        FileNotFoundError: a file or record is missing, or a sha256 does not match (the message
            names the file and the ``pact zoo build`` command that makes it).
        ValueError: unknown kind.
    """
    return T.load_zoo(FAMILY, suite, seed=seed, kind=kind, zoo_dir=zoo_dir)


def load_records(zoo_dir: str | Path | None = None, kind: str | None = None) -> list[dict]:
    """Every run record in the zoo's manifest (optionally one ``kind``, or ``"head"``)."""
    return T.load_records(Path(zoo_dir) if zoo_dir is not None else default_zoo_dir(), kind)


# ----------------------------------------------------------------------------- CLI
def _cmd_build(args) -> int:
    return T.run_build_command(Recipe, args, build_zoo)


def add_cli(subparsers) -> None:
    """Register ``pact zoo build`` on an argparse sub-parsers object (called by pactlib.cli)."""
    zoo = subparsers.add_parser("zoo", help="the built-in testbed's model zoo (Lite0 fine-tunes)")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    b = zsub.add_parser("build", help="fit heads and fine-tune (full and/or LoRA); resumable",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    T.add_build_arguments(b, Recipe, suites="8, 14 or 20", zoo_dirname=FAMILY.zoo_dirname)
    b.set_defaults(func=_cmd_build)
