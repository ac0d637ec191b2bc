"""The one zoo trainer of every testbed family: frozen heads, full and LoRA fine-tunes of θ0.

A family (:mod:`pactlib.testbeds.lite0.zoo`, :mod:`pactlib.testbeds.minilm.zoo`) is a
:class:`ZooFamily` adapter: how θ0 is read, how a task split becomes model inputs, how a model
is built from a state dict, how its head is fit and its accuracy measured, which maps LoRA adapts.
Everything else lives here once. For every task t of a suite and every seed s a zoo holds

- ``pretrained.safetensors`` -- θ0 (shared); ``manifest.json`` keeps its sha256 (and what the
  family adds, e.g. a model config: :meth:`ZooFamily.make_pretrained`);
- ``heads/<t>.safetensors`` (+ ``.json``) -- the task's frozen head; its accuracy on θ0 is the
  zero-shot accuracy acc_0(t);
- ``full/<t>/seed<s>.safetensors`` (+ ``.json``) -- θt after fine-tuning every weight through the
  frozen head;
- ``lora/<t>/seed<s>.safetensors`` (+ ``.json``) -- LoRA adapters (A, B) on the family's maps,
  everything else frozen (:mod:`pactlib.lora`);
- ``manifest.json`` -- every file with its sha256, and every run's record.

Each run's JSON record holds the task, seed, kind, the recipe fields it depends on
(``Recipe.relevant``), zero-shot and fine-tuned accuracy on val and test, timings and the
checkpoint's sha256.

**Resumable and safe.** Files are written atomically, the checkpoint before its record; a run
counts as done only when its record matches the recipe, the head and the checkpoint's sha256
(:func:`pactlib.testbeds.zoo_files.record_problem`); :func:`load_zoo` checks every sha256.

**Randomness.** Splits are fixed by ``Recipe.data_seed``; the zoo seed drives the batch order
and the LoRA initialisation through one ``torch.Generator`` per run, seeded from (kind, task,
seed) (:func:`pactlib.testbeds.zoo_files.run_seed`); the global RNG is not used. Training runs in
eval mode and on one torch thread (:func:`build_zoo`: two threads sum the gradients in another
order and give fine-tunes that differ in float32 rounding), so a run gives the same tensors, and
with sorted safetensors headers the same file bytes, on every build on one CPU.
"""
from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pactlib import lora as lora_mod
from pactlib.matrix import DEFAULT_RULE, MatrixRule
from pactlib.testbeds.lite0.heads import Head, load_head, save_head
from pactlib.testbeds.zoo_files import (file_sha256, load_safetensors, read_json, record_problem, run_seed,
                                       save_safetensors, train_loop, update_manifest, write_json)
from pactlib.threads import single_threaded

log = logging.getLogger(__name__)

__all__ = ["KINDS", "RecipeFields", "ZooFamily", "TaskSplits", "Zoo", "run_path", "head_path", "ensure_pretrained",
           "ensure_head", "finetune_full", "finetune_lora", "build_run", "build_zoo", "load_zoo", "load_records",
           "missing", "add_build_arguments", "run_build_command"]

KINDS = ("full", "lora")


class RecipeFields:
    """Mixin of a family's frozen ``Recipe`` dataclass: which fields a zoo file depends on.

    A subclass sets ``HEAD_FIELDS`` (fields that decide a head), ``RUN_FIELDS`` (in addition, a
    full or LoRA run), ``KIND_FIELDS`` (``{"full": (...), "lora": (...)}``, in addition per kind)
    and optionally ``OPTIONAL_FIELDS`` (fields added after zoos were built: listed only when set,
    so older records stay valid). The trainer reads ``steps``, ``batch_size``, ``optimizer``,
    ``lr``, ``lora_lr``, ``weight_decay``, ``warmup``, ``lora_rank``, ``lora_alpha``,
    ``data_seed``, ``train_limit`` and ``eval_limit``.
    """

    HEAD_FIELDS: tuple[str, ...] = ()
    RUN_FIELDS: tuple[str, ...] = ()
    KIND_FIELDS: dict[str, tuple[str, ...]] = {}
    OPTIONAL_FIELDS: tuple[str, ...] = ()

    def relevant(self, kind: str) -> dict[str, Any]:
        """The recipe fields a ``kind`` ("head", "full", "lora") depends on, as a dict (an
        ``OPTIONAL_FIELDS`` entry only when it is not None). Raises KeyError for another kind."""
        names = self.HEAD_FIELDS if kind == "head" else self.HEAD_FIELDS + self.RUN_FIELDS + self.KIND_FIELDS[kind]
        return {n: getattr(self, n) for n in names
                if not (n in self.OPTIONAL_FIELDS and getattr(self, n) is None)}

    def check_common(self) -> None:
        """Raise ValueError when the optimizer, steps, batch size or LoRA rank are not usable."""
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"Recipe.optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        for name in ("steps", "batch_size", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"Recipe.{name} must be >= 1, got {getattr(self, name)}")


class ZooFamily:
    """What a testbed family tells the zoo trainer; subclass it and override the methods.

    Attributes:
        backbone: θ0's name, written into the manifest and every run record.
        zoo_dirname: the zoo's folder under ``$PACT_CACHE`` (:meth:`default_zoo_dir`).
        label: the family's name in messages and progress bars.
        rule: the :class:`~pactlib.matrix.MatrixRule` that says which keys are maps (LoRA, Δ).
    """

    backbone: str = ""
    zoo_dirname: str = "zoo"
    label: str = ""
    rule: MatrixRule = DEFAULT_RULE

    @property
    def pretrained_name(self) -> str:
        """θ0's name in its file's header and the manifest (default :attr:`backbone`)."""
        return self.backbone

    # --- where things are
    def default_zoo_dir(self) -> Path:
        """``$PACT_CACHE/<zoo_dirname>`` (else the per-user cache's: :func:`pactlib.paths.cache_dir`)."""
        from pactlib.paths import cache_dir

        return cache_dir(self.zoo_dirname)

    def build_command(self, suite) -> str:
        """The command that builds the zoo of ``suite`` (named in missing-file errors)."""
        raise NotImplementedError

    def task_names(self, suite: str) -> tuple[str, ...]:
        """Task names of a suite name, in reporting order. Raises KeyError for an unknown suite."""
        raise NotImplementedError

    def default_loader(self) -> Callable:
        """``loader(task, split, *, seed, limit[, cache_dir]) -> data`` of the family's tasks."""
        raise NotImplementedError

    # --- θ0
    def make_pretrained(self) -> tuple[dict[str, Tensor], dict]:
        """θ0 as shipped and the extra fields of the manifest's ``pretrained`` entry (e.g. a config)."""
        raise NotImplementedError

    #: manifest ``pretrained`` fields that must be present for a stored θ0 to be used.
    pretrained_fields: tuple[str, ...] = ()

    def arrange(self, state: dict[str, Tensor], pre: Mapping) -> dict[str, Tensor]:
        """A state dict read from a file, in the model's own key order (``pre``: the manifest's
        ``pretrained`` entry). Default: as read."""
        return state

    # --- tasks, models, heads
    def inputs(self, data, recipe) -> tuple[Tensor, Tensor]:
        """Model inputs ``x`` and labels ``y`` (N,) of one loaded task split."""
        raise NotImplementedError

    def model(self, state: Mapping[str, Tensor], pre: Mapping, recipe) -> nn.Module:
        """A model (eval mode) holding ``state``, whose ``named_parameters()`` are θ0's keys."""
        raise NotImplementedError

    def fit_head(self, pretrained: Mapping[str, Tensor], pre: Mapping, data: "TaskSplits", recipe) -> Head:
        """The task's frozen head, fit from θ0 on its train split."""
        raise NotImplementedError

    def accuracy(self, state: Mapping[str, Tensor], pre: Mapping, head: Head, data: "TaskSplits", split: str,
                 recipe) -> float:
        """Accuracy in [0, 1] of ``head`` over the model holding ``state`` on ``split``."""
        raise NotImplementedError

    def head_record(self, data: "TaskSplits", recipe) -> dict:
        """Fields a head record adds to the common ones (default none)."""
        return {}

    def run_record(self, data: "TaskSplits", eval_seconds: float) -> dict:
        """Fields a run record adds to the common ones (default none)."""
        return {}

    def upgrade_recipe(self, got: dict) -> dict:
        """An older record's recipe in today's form, before the comparison (default unchanged)."""
        return got

    # --- fine-tuning
    def augment(self, recipe) -> Callable | None:
        """``augment(x_batch, generator) -> x_batch`` of the training loop, or None."""
        return None

    def lora_keys(self, pretrained: Mapping[str, Tensor], recipe) -> list[str] | None:
        """θ0's keys LoRA adapts (None: every map of :attr:`rule`)."""
        return None

    def lora_meta(self, recipe) -> dict:
        """Fields a LoRA checkpoint's header adds to task, seed, kind, scale, rank and alpha."""
        return {}


class TaskSplits:
    """Lazily loaded splits of one task and their model inputs (each computed once)."""

    def __init__(self, family: ZooFamily, task: str, loader: Callable, recipe, data_dir=None):
        self.family, self.task, self.loader, self.recipe, self.data_dir = family, task, loader, recipe, data_dir
        self._splits: dict[str, Any] = {}
        self._inputs: dict[str, tuple[Tensor, Tensor]] = {}

    def split(self, name: str):
        """The loaded split ``name`` ("train", "val", "test"), capped by the recipe's limits."""
        if name not in self._splits:
            limit = self.recipe.train_limit if name == "train" else self.recipe.eval_limit
            kw = {"seed": self.recipe.data_seed, "limit": limit}
            if self.data_dir is not None:
                kw["cache_dir"] = self.data_dir
            self._splits[name] = self.loader(self.task, name, **kw)
        return self._splits[name]

    def inputs(self, name: str) -> tuple[Tensor, Tensor]:
        """``(x, y)`` of split ``name`` (:meth:`ZooFamily.inputs`)."""
        if name not in self._inputs:
            self._inputs[name] = self.family.inputs(self.split(name), self.recipe)
        return self._inputs[name]


# ----------------------------------------------------------------------------- paths
def run_path(zoo_dir: Path, kind: str, task: str, seed: int) -> Path:
    """Checkpoint path of one run; its record is the same path with ``.json``.

    Raises:
        ValueError: unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    return Path(zoo_dir) / kind / task / f"seed{seed}.safetensors"


def head_path(zoo_dir: Path, task: str) -> Path:
    """The head file of ``task``; its record is the same path with ``.json``."""
    return Path(zoo_dir) / "heads" / f"{task}.safetensors"


def _task_names(family: ZooFamily, suite: str | Sequence[str]) -> tuple[str, ...]:
    return family.task_names(suite) if isinstance(suite, str) else tuple(suite)


# ----------------------------------------------------------------------------- θ0, heads
def ensure_pretrained(family: ZooFamily, zoo_dir: Path) -> tuple[dict[str, Tensor], dict]:
    """(θ0, the manifest's ``pretrained`` entry) from ``pretrained.safetensors``, written (or
    rewritten when missing or corrupt) from :meth:`ZooFamily.make_pretrained`."""
    path = Path(zoo_dir) / "pretrained.safetensors"
    pre = (read_json(Path(zoo_dir) / "manifest.json") or {}).get("pretrained", {})
    if (path.is_file() and pre.get("sha256") and all(pre.get(f) for f in family.pretrained_fields)
            and file_sha256(path) == pre["sha256"]):
        return family.arrange(load_safetensors(path)[0], pre), pre
    sd, extra = family.make_pretrained()
    sha = save_safetensors(sd, path, {"backbone": family.pretrained_name})
    man = read_json(Path(zoo_dir) / "manifest.json") or {}
    pre = {"file": path.name, "sha256": sha, **extra}
    man.update(backbone=family.pretrained_name, pretrained=pre)
    write_json(Path(zoo_dir) / "manifest.json", man)
    return sd, pre


def ensure_head(family: ZooFamily, zoo_dir: Path, data: TaskSplits, pretrained: Mapping[str, Tensor],
                pre: Mapping, recipe) -> tuple[Head, dict]:
    """The task's head and its record (fit and saved when missing, stale or corrupt)."""
    path = head_path(zoo_dir, data.task)
    rec = read_json(path.with_suffix(".json"))
    why = record_problem(rec, path, recipe.relevant("head"), upgrade=family.upgrade_recipe)
    if why is None:
        return load_head(path), rec
    log.info("head %s: %s -> fitting", data.task, why)
    t0 = time.perf_counter()
    head = family.fit_head(pretrained, pre, data, recipe)
    zs = {s: family.accuracy(pretrained, pre, head, data, s, recipe) for s in ("val", "test")}
    sha = save_head(head, path, task=data.task)
    rec = {"task": data.task, "kind": "head", "recipe": recipe.relevant("head"), "sha256": sha,
           "file": str(path.relative_to(zoo_dir)), "classes": list(data.split("train").classes),
           "n_train": int(data.inputs("train")[1].numel()), "zero_shot": zs, **family.head_record(data, recipe),
           "seconds": time.perf_counter() - t0}
    write_json(path.with_suffix(".json"), rec)
    update_manifest(zoo_dir, f"heads/{data.task}", rec, family.backbone)
    return head, rec


# ----------------------------------------------------------------------------- fine-tuning
def _train(family: ZooFamily, model: nn.Module, params: list[Tensor], head: Head, x: Tensor, y: Tensor, recipe,
           lr: float, generator: torch.Generator, desc: str, progress: bool) -> list[float]:
    return train_loop(model, params, head.logits, x, y, steps=recipe.steps, batch_size=recipe.batch_size, lr=lr,
                      optimizer=recipe.optimizer, weight_decay=recipe.weight_decay, warmup=recipe.warmup,
                      generator=generator, augment=family.augment(recipe), desc=desc, progress=progress)


def finetune_full(family: ZooFamily, pretrained: Mapping[str, Tensor], pre: Mapping, head: Head, x: Tensor,
                  y: Tensor, *, recipe, generator: torch.Generator, desc: str = "",
                  progress: bool = False) -> tuple[dict[str, Tensor], list[float]]:
    """Every floating weight trained through the frozen head (BatchNorm statistics frozen, no
    dropout). Returns (θt, the loss of every step)."""
    model = family.model(pretrained, pre, recipe)
    params = list(model.parameters())
    for p in params:
        p.requires_grad_(True)
    losses = _train(family, model, params, head, x, y, recipe, recipe.lr, generator, desc, progress)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def finetune_lora(family: ZooFamily, pretrained: Mapping[str, Tensor], pre: Mapping, head: Head, x: Tensor,
                  y: Tensor, *, recipe, generator: torch.Generator, desc: str = "", progress: bool = False):
    """LoRA adapters on :meth:`ZooFamily.lora_keys` trained through the frozen head, the rest
    frozen. Returns (``{key: (A, B)}``, scale, the loss of every step)."""
    model = family.model(pretrained, pre, recipe)
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = lora_mod.init_adapters(pretrained, recipe.lora_rank, generator=generator,
                                      keys=family.lora_keys(pretrained, recipe), rule=family.rule)
    scale = lora_mod.lora_scale(recipe.lora_rank, recipe.lora_alpha)
    params = lora_mod.attach(model, adapters, scale, rule=family.rule)
    losses = _train(family, model, params, head, x, y, recipe, recipe.lora_lr, generator, desc, progress)
    trained = lora_mod.read_adapters(model)
    lora_mod.detach(model)
    return trained, scale, losses


def build_run(family: ZooFamily, zoo_dir: Path, kind: str, data: TaskSplits, seed: int,
              pretrained: Mapping[str, Tensor], pre: Mapping, head: Head, head_rec: dict, recipe, *,
              progress: bool = False) -> dict:
    """One fine-tuning run (or its existing valid record). Returns the run's record."""
    path = run_path(zoo_dir, kind, data.task, seed)
    rec = read_json(path.with_suffix(".json"))
    why = record_problem(rec, path, recipe.relevant(kind), head_rec["sha256"], upgrade=family.upgrade_recipe)
    if why is None:
        return rec
    log.info("%s/%s/seed%d: %s -> training", kind, data.task, seed, why)
    t0 = time.perf_counter()
    x, y = data.inputs("train")
    gen = torch.Generator().manual_seed(run_seed(kind, data.task, seed))
    desc = f"{kind} {data.task} s{seed}"
    meta = {"task": data.task, "seed": seed, "kind": kind}
    if kind == "full":
        theta, losses = finetune_full(family, pretrained, pre, head, x, y, recipe=recipe, generator=gen, desc=desc,
                                      progress=progress)
        tensors = theta
    else:
        adapters, scale, losses = finetune_lora(family, pretrained, pre, head, x, y, recipe=recipe, generator=gen,
                                                desc=desc, progress=progress)
        theta = lora_mod.merge_adapters(pretrained, adapters, scale, rule=family.rule)
        tensors = lora_mod.adapters_to_tensors(adapters)
        meta.update(scale=scale, rank=recipe.lora_rank, alpha=recipe.lora_alpha, **family.lora_meta(recipe))
    t_train = time.perf_counter() - t0
    t1 = time.perf_counter()
    ft = {s: family.accuracy(theta, pre, head, data, s, recipe) for s in ("val", "test")}
    t_eval = time.perf_counter() - t1
    sha = save_safetensors(tensors, path, meta)
    rec = {"task": data.task, "seed": seed, "kind": kind, "backbone": family.backbone,
           "recipe": recipe.relevant(kind), "sha256": sha, "file": str(path.relative_to(zoo_dir)),
           "head_sha256": head_rec["sha256"], "zero_shot": head_rec["zero_shot"], "finetuned": ft,
           "n_train": int(y.numel()), "first_loss": losses[0], "final_loss": sum(losses[-10:]) / len(losses[-10:]),
           "train_seconds": t_train, **family.run_record(data, t_eval), "seconds": time.perf_counter() - t0}
    if kind == "lora":
        rec["lora_scale"] = meta["scale"]
    write_json(path.with_suffix(".json"), rec)
    update_manifest(zoo_dir, f"{kind}/{data.task}/seed{seed}", rec, family.backbone)
    return rec


@single_threaded()  # one thread: a fine-tune is a function of its recipe and seed (module docstring)
def build_zoo(family: ZooFamily, suite: str | Sequence[str], seeds: Iterable[int] = (0,), *,
              kind: Sequence[str] = KINDS, zoo_dir: str | Path | None = None, recipe=None,
              loader: Callable | None = None, data_dir: str | Path | None = None, progress: bool = True) -> list[dict]:
    """Build (or complete) ``family``'s zoo for ``suite`` × ``seeds`` × ``kind``.

    Args:
        family: the family adapter. suite: a suite name or an explicit sequence of task names.
        seeds: fine-tuning seeds. kind: subset of ("full", "lora").
        zoo_dir: output folder (default :meth:`ZooFamily.default_zoo_dir`).
        recipe: the family's ``Recipe`` (required).
        loader: ``loader(task, split, *, seed, limit[, cache_dir])`` (default
            :meth:`ZooFamily.default_loader`). data_dir: ``cache_dir`` passed to the loader.
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
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else family.default_zoo_dir()
    zoo_dir.mkdir(parents=True, exist_ok=True)
    loader = loader or family.default_loader()
    tasks = _task_names(family, suite)
    pretrained, pre = ensure_pretrained(family, zoo_dir)
    records = []
    bar = tqdm(total=len(tasks) * len(seeds) * len(kinds),
               desc=f"{family.label} zoo {suite if isinstance(suite, str) else len(tasks)}", disable=not progress)
    for task in tasks:
        data = TaskSplits(family, task, loader, recipe, data_dir)
        head, head_rec = ensure_head(family, zoo_dir, data, pretrained, pre, recipe)
        for s in seeds:
            for k in kinds:
                rec = build_run(family, zoo_dir, k, data, s, pretrained, pre, head, head_rec, recipe,
                                progress=progress)
                records.append(rec)
                bar.set_postfix(task=task, acc=f"{rec['zero_shot']['test']:.2f}->{rec['finetuned']['test']:.2f}")
                bar.update()
    bar.close()
    return records


# ----------------------------------------------------------------------------- load
@dataclass
class Zoo:
    """A loaded slice of a zoo: one kind, one seed, a list of tasks (in suite order).

    Attributes:
        pretrained: θ0's state dict (in the model's key order).
        heads: ``{task: Head}``; head_records: ``{task: head record}``.
        finetuned: ``{task: θt}`` (LoRA: θ0 + scale·B A, a full state dict).
        records: ``{task: run record}``.
        adapters: LoRA only: ``{task: {key: (A, B)}}``; scales in ``records[t]["lora_scale"]``.
        config: the manifest's ``config`` of θ0 (None for a family without one).
        rule: the family's matrix rule (which keys LoRA adapted).
    """

    kind: str
    seed: int
    pretrained: dict[str, Tensor]
    heads: dict[str, Head]
    finetuned: dict[str, dict[str, Tensor]]
    records: dict[str, dict]
    adapters: dict[str, dict] = field(default_factory=dict)
    head_records: dict[str, dict] = field(default_factory=dict)
    config: dict | None = None
    rule: MatrixRule = DEFAULT_RULE

    @property
    def tasks(self) -> list[str]:
        return list(self.finetuned)

    def task_vectors(self) -> dict[str, dict[str, Tensor]]:
        """Exact Δt per task over floating keys, float32 (LoRA: scale·B A, zeros elsewhere)."""
        if self.kind == "lora":
            return {t: lora_mod.lora_task_vector(self.pretrained, a, self.records[t]["lora_scale"], rule=self.rule)
                    for t, a in self.adapters.items()}
        return {t: {k: v.float() - self.pretrained[k].float() for k, v in sd.items() if v.is_floating_point()}
                for t, sd in self.finetuned.items()}

    def accuracies(self, split: str = "test", which: str = "finetuned") -> dict[str, float]:
        """``{task: acc}`` from the records; ``which`` is "finetuned" or "zero_shot"."""
        return {t: r[which][split] for t, r in self.records.items()}


def missing(family: ZooFamily, what: str, path: Path, suite) -> FileNotFoundError:
    """The error for a zoo file that is missing or fails its sha256 (names the build command)."""
    return FileNotFoundError(
        f"{family.label} zoo {what} missing or invalid at {path}; build it with: {family.build_command(suite)} "
        f"(zoo dir {path.parents[0]}; the default is $PACT_CACHE/{family.zoo_dirname}, now "
        f"{family.default_zoo_dir()})")


def load_zoo(family: ZooFamily, suite: str | Sequence[str], *, seed: int = 0, kind: str = "full",
             zoo_dir: str | Path | None = None) -> Zoo:
    """Load θ0, heads and fine-tuned checkpoints of ``suite`` for one ``seed`` and ``kind``; every
    file is checked against the sha256 in its record. Reads only.

    Raises:
        FileNotFoundError: a file or record is missing, or a sha256 does not match (the message
            names the file and the command that builds it).
        ValueError: unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else family.default_zoo_dir()
    tasks = _task_names(family, suite)
    label = suite if isinstance(suite, str) else "<suite>"
    pre_path = zoo_dir / "pretrained.safetensors"
    pre = (read_json(zoo_dir / "manifest.json") or {}).get("pretrained", {})
    if (not pre_path.is_file() or not all(pre.get(f) for f in family.pretrained_fields)
            or file_sha256(pre_path) != pre.get("sha256")):
        raise missing(family, "pretrained checkpoint", pre_path, label)
    pretrained = family.arrange(load_safetensors(pre_path)[0], pre)
    heads, fts, recs, hrecs, adapters = {}, {}, {}, {}, {}
    for t in tasks:
        hp = head_path(zoo_dir, t)
        hrec = read_json(hp.with_suffix(".json"))
        if hrec is None or not hp.is_file() or file_sha256(hp) != hrec.get("sha256"):
            raise missing(family, f"head of task {t!r}", hp, label)
        heads[t], hrecs[t] = load_head(hp), hrec
        rp = run_path(zoo_dir, kind, t, seed)
        rec = read_json(rp.with_suffix(".json"))
        if rec is None or not rp.is_file() or file_sha256(rp) != rec.get("sha256"):
            raise missing(family, f"{kind} run of task {t!r} seed {seed}", rp, label)
        tensors, _ = load_safetensors(rp)
        if kind == "lora":
            adapters[t] = lora_mod.adapters_from_tensors(tensors)
            fts[t] = lora_mod.merge_adapters(pretrained, adapters[t], rec["lora_scale"], rule=family.rule)
        else:
            fts[t] = family.arrange(tensors, pre)
        recs[t] = rec
    return Zoo(kind, seed, pretrained, heads, fts, recs, adapters, hrecs, pre.get("config"), family.rule)


def load_records(zoo_dir: str | Path, kind: str | None = None) -> list[dict]:
    """Every record in the zoo's manifest (optionally of one ``kind``: "full", "lora" or "head")."""
    man = read_json(Path(zoo_dir) / "manifest.json") or {}
    recs = list(man.get("entries", {}).values())
    return [r for r in recs if kind is None or r.get("kind") == kind]


# ----------------------------------------------------------------------------- CLI
def add_build_arguments(parser: argparse.ArgumentParser, recipe_class: type, *, suites: str, zoo_dirname: str) -> None:
    """The arguments of a zoo build command: ``--suite``, ``--seeds``, ``--kind``, ``--zoo-dir``,
    ``--data-dir``, ``--no-progress`` and one ``--<field>`` per field of ``recipe_class``."""
    parser.add_argument("--suite", required=True, help=f"suite name: {suites}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds")
    parser.add_argument("--kind", nargs="+", choices=KINDS, default=list(KINDS), help="which fine-tunes")
    parser.add_argument("--zoo-dir", default=None, help=f"output folder (default $PACT_CACHE/{zoo_dirname})")
    parser.add_argument("--data-dir", default=None, help="data cache folder (default: the data module's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    defaults = recipe_class()
    for f in fields(recipe_class):
        default = getattr(defaults, f.name)
        typ = type(default) if default is not None else int
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=typ, default=None,
                            help=f"Recipe.{f.name} (default {default})")


def run_build_command(recipe_class: type, args: argparse.Namespace, build: Callable) -> int:
    """Build what ``args`` (:func:`add_build_arguments`) ask for with ``build`` (a family's
    ``build_zoo``) and print one JSON line per run; returns the exit status 0."""
    import json

    over = {f.name: getattr(args, f.name) for f in fields(recipe_class) if getattr(args, f.name, None) is not None}
    recs = build(args.suite, args.seeds, kind=args.kind, zoo_dir=args.zoo_dir, recipe=replace(recipe_class(), **over),
                 data_dir=args.data_dir, progress=not args.no_progress)
    for r in recs:
        print(json.dumps({k: r[k] for k in ("kind", "task", "seed", "zero_shot", "finetuned", "seconds")}))
    return 0
