"""The MiniLM testbed's model zoo: frozen heads, full and LoRA fine-tunes of all-MiniLM-L6-v2.

For every text task t (:mod:`pactlib.data.text`) and seed s the zoo holds, like Lite0's
(:mod:`pactlib.testbeds.lite0.zoo`, whose record and file helpers it shares through
:mod:`pactlib.testbeds.zoo_files`):

- ``pretrained.safetensors`` -- θ0, the ``BertModel`` state dict without pooler
  (:func:`pactlib.testbeds.minilm.model.load_pretrained`); ``manifest.json`` keeps its sha256 and
  the model config;
- ``heads/<t>.safetensors`` (+ ``.json``) -- the task's frozen head (:data:`HEADS`); its accuracy
  on θ0 is the zero-shot accuracy acc_0(t);
- ``full/<t>/seed<s>.safetensors`` (+ ``.json``) -- θt after fine-tuning every weight of the
  encoder (embedding tables included) through the frozen head;
- ``lora/<t>/seed<s>.safetensors`` (+ ``.json``) -- LoRA adapters (A, B) on the encoder's
  ``nn.Linear`` maps (:data:`LORA_TARGETS`), everything else frozen.

Each run's JSON record holds the task, seed, kind, the recipe fields it depends on, zero-shot and
fine-tuned accuracy on val and test, timings and the checkpoint's sha256. **Resumable and safe**
as Lite0's: files are written atomically, the checkpoint before its record; a run counts as done
only when its record matches the recipe, the head and the checkpoint's sha256
(:func:`pactlib.testbeds.zoo_files.record_problem`); :func:`load_zoo` checks every sha256.

**Randomness.** Splits are fixed by ``Recipe.data_seed``; the zoo seed drives the batch order
and the LoRA initialisation through one ``torch.Generator`` per run, seeded from (kind, task,
seed). Training runs in eval mode (no dropout) and on one torch thread (:func:`build_zoo`; two
threads sum in another order), so a run gives the same tensors, and with sorted safetensors
headers the same file bytes, on every build on one machine.

**LoRA (PEFT-style).** W_eff = W0 + (alpha / r) · B A with A (r, n) uniform in ±1/sqrt(n) and
B = 0 at the start (PEFT's ``LoraConfig(r, lora_alpha, init_lora_weights=True)``: its
``kaiming_uniform_(a=sqrt(5))`` is that same uniform law; no LoRA dropout), on ``target_modules`` = ``query``, ``key``, ``value``,
``attention.output.dense``, ``intermediate.dense``, ``output.dense`` of every layer
(``lora_targets="all"``: PEFT's ``"all-linear"``, 36 maps) or ``query``, ``value`` only
(``"qv"``: 12 maps, the LoRA paper's choice). Biases, LayerNorms and embedding tables stay at θ0.

CLI: ``python -m pactlib.testbeds.minilm.zoo --suite 8 --seeds 0 --kind full lora``.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib import lora as lora_mod
from pactlib.matrix import PRESETS
from pactlib.paths import cache_dir
from pactlib.threads import single_threaded
from pactlib.testbeds.lite0.heads import Head, fit_head, fit_logit_scale, fit_prototype_head, load_head, save_head
from pactlib.testbeds.zoo_files import (file_sha256, load_safetensors, read_json, record_problem, run_seed,
                                       save_safetensors, train_loop, update_manifest, write_json)

from .model import build_encoder, encode, in_model_order, load_pretrained, load_tokenizer, tokenize

log = logging.getLogger(__name__)

KINDS = ("full", "lora")
BACKBONE = "all-MiniLM-L6-v2"
RULE = PRESETS["hf_encoder"]
HEADS = ("prompt", "prototype", "probe")

#: Which weights LoRA adapts, by ``Recipe.lora_targets``: regexes over θ0's keys.
LORA_TARGETS = {
    "all": r"\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)\.weight$",
    "qv": r"\.attention\.self\.(query|value)\.weight$",
}


@dataclass(frozen=True)
class Recipe:
    """Everything a MiniLM zoo run depends on.

    The defaults are the first recipe that was measured (``bench/bench_minilm.py --parts finetune``,
    ``book/data/minilm_timing.jsonl``): 60 AdamW steps of 16 texts at 32 tokens, lr 1e-4 (full) /
    1e-3 (LoRA r = 8, alpha = 16, all 36 maps), 6 warm-up steps, prompt heads. On the 8-task suite
    (seed 0) every task's fine-tuned accuracy beats its zero-shot accuracy on val and test, full and
    LoRA (accuracies and run times in that record). Not yet tuned: the
    budget of the book sizes it (the ``default`` profile pins it).

    Attributes:
        max_tokens: token budget per text ([CLS] and [SEP] included); longer texts are cut.
        head: ``"prompt"`` (cosine head on θ0's embeddings of the class descriptions: CLIP's
            zero-shot head), ``"prototype"`` (cosine head on θ0's class means of the train
            split) or ``"probe"`` (logistic regression on θ0's train features).
        head_scale: the prompt head's logit scale (None: fit on train; :func:`fit_prompt_head`).
        head_max_iter: L-BFGS iterations of the head fit (logit scale, or the probe).
        head_l2: ridge strength of the probe.
        steps, batch_size, optimizer, lr, weight_decay, warmup: the fine-tuning loop
            (:func:`pactlib.testbeds.zoo_files.train_loop`); ``lr`` for full fine-tunes,
            ``lora_lr`` for LoRA.
        lora_rank, lora_alpha, lora_targets: r, alpha (scale alpha/r) and the adapted maps
            (:data:`LORA_TARGETS`).
        data_seed: split seed of the text tasks. train_limit, eval_limit: caps on train / val+test
            examples per task (None: the stored splits); for tests and quick looks.
        eval_batch: texts per forward pass when evaluating.
    """

    max_tokens: int = 32
    head: str = "prompt"
    head_scale: float | None = 20.0
    head_max_iter: int = 100
    head_l2: float = 1e-2
    steps: int = 60
    batch_size: int = 16
    optimizer: str = "adamw"
    lr: float = 1e-4
    lora_lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 6
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: str = "all"
    data_seed: int = 0
    train_limit: int | None = None
    eval_limit: int | None = None
    eval_batch: int = 128

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"Recipe.head must be one of {HEADS}, got {self.head!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"Recipe.optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.lora_targets not in LORA_TARGETS:
            raise ValueError(f"Recipe.lora_targets must be one of {sorted(LORA_TARGETS)}, got {self.lora_targets!r}")
        for name in ("steps", "batch_size", "lora_rank", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"Recipe.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens < 3:
            raise ValueError(f"Recipe.max_tokens must be >= 3 ([CLS], a token, [SEP]), got {self.max_tokens}")

    #: fields that decide a head, and in addition a full / LoRA run (eval_batch decides nothing).
    HEAD_FIELDS = ("max_tokens", "head", "head_scale", "head_max_iter", "head_l2", "data_seed", "train_limit", "eval_limit")
    RUN_FIELDS = ("steps", "batch_size", "optimizer", "weight_decay", "warmup")
    KIND_FIELDS = {"full": ("lr",), "lora": ("lora_lr", "lora_rank", "lora_alpha", "lora_targets")}

    def relevant(self, kind: str) -> dict[str, Any]:
        """The recipe fields a ``kind`` ("head", "full", "lora") depends on."""
        names = self.HEAD_FIELDS if kind == "head" else self.HEAD_FIELDS + self.RUN_FIELDS + self.KIND_FIELDS[kind]
        return {n: getattr(self, n) for n in names}


# ----------------------------------------------------------------------------- paths
def default_zoo_dir() -> Path:
    """``$PACT_CACHE/zoo-minilm`` (else the per-user cache's: :func:`pactlib.paths.cache_dir`)."""
    return cache_dir("zoo-minilm")


def run_path(zoo_dir: Path, kind: str, task: str, seed: int) -> Path:
    """Checkpoint path of one run; its record is the same path with ``.json``."""
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    return Path(zoo_dir) / kind / task / f"seed{seed}.safetensors"


def head_path(zoo_dir: Path, task: str) -> Path:
    return Path(zoo_dir) / "heads" / f"{task}.safetensors"


def lora_keys(state: Mapping[str, Tensor], targets: str = "all") -> list[str]:
    """θ0's keys LoRA adapts under ``targets`` (matrix keys of the hf_encoder rule that match)."""
    import re

    pat = re.compile(LORA_TARGETS[targets])
    return [k for k in RULE.matrix_keys(state) if pat.search(k)]


# ----------------------------------------------------------------------------- model source
@dataclass
class Source:
    """Where θ0, its config and the tokenizer come from: the real package by default; tests pass a
    tiny random ``BertModel`` (``state``, ``config``) and the package's tokenizer."""

    state: dict[str, Tensor] | None = None
    config: dict | None = None
    tokenizer: Any = None
    name: str = BACKBONE

    def pretrained(self) -> tuple[dict[str, Tensor], dict]:
        if self.state is None:
            self.state, self.config = load_pretrained()
        return self.state, self.config

    def get_tokenizer(self):
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer()
        return self.tokenizer


def ensure_pretrained(zoo_dir: Path, source: Source | None = None) -> tuple[dict[str, Tensor], dict]:
    """(θ0, config) from ``pretrained.safetensors`` (written, or rewritten when missing or corrupt,
    from ``source``); the manifest keeps its sha256, the config and the model's name."""
    source = source or Source()
    path = zoo_dir / "pretrained.safetensors"
    man = read_json(zoo_dir / "manifest.json") or {}
    pre = man.get("pretrained", {})
    if path.is_file() and pre.get("sha256") and pre.get("config") and file_sha256(path) == pre["sha256"]:
        return in_model_order(pre["config"], load_safetensors(path)[0]), pre["config"]
    sd, config = source.pretrained()
    sha = save_safetensors(sd, path, {"backbone": source.name})
    man = read_json(zoo_dir / "manifest.json") or {}
    man.update(backbone=source.name, pretrained={"file": path.name, "sha256": sha, "config": config})
    write_json(zoo_dir / "manifest.json", man)
    return sd, config


# ----------------------------------------------------------------------------- data
def _default_loader():
    from pactlib.data.text import load_text_task

    return load_text_task


class _Data:
    """Lazily loaded, tokenized splits of one task."""

    def __init__(self, task: str, loader: Callable, recipe: Recipe, tokenizer, data_dir=None):
        self.task, self.loader, self.recipe, self.tokenizer, self.data_dir = task, loader, recipe, tokenizer, data_dir
        self._splits: dict[str, Any] = {}

    def split(self, name: str):
        if name not in self._splits:
            limit = self.recipe.train_limit if name == "train" else self.recipe.eval_limit
            kw = {"seed": self.recipe.data_seed, "limit": limit}
            if self.data_dir is not None:
                kw["cache_dir"] = self.data_dir
            self._splits[name] = self.loader(self.task, name, **kw)
        return self._splits[name]

    def inputs(self, name: str) -> tuple[Tensor, Tensor]:
        key = f"_x_{name}"
        if key not in self._splits:
            d = self.split(name)
            self._splits[key] = (tokenize(self.tokenizer, d.texts, self.recipe.max_tokens), d.labels)
        return self._splits[key]


# ----------------------------------------------------------------------------- heads
def fit_prompt_head(class_features: Tensor, features: Tensor | None, labels: Tensor, classes: Sequence[str], *,
                    scale: float | None = 20.0, max_iter: int = 100) -> Head:
    """CLIP's zero-shot head on MiniLM: ``s · normalize(θ0 embedding of class c's description)``
    applied to normalised features. The class directions come from the descriptions alone, so the
    head's accuracy at θ0 is a zero-shot accuracy. ``s`` sets only the temperature (no prediction
    changes with it): fixed (default 20, the scale of sentence-transformers' contrastive loss that
    all-MiniLM-L6-v2 was trained with; CLIP fixes its own, 100; ``features`` are then not read)
    or, with ``scale=None``, fit by L-BFGS on log s to the train cross-entropy of ``features``. A
    fit scale collapses towards 0 where the descriptions barely beat chance, and then no gradient
    reaches the encoder: hence the fixed one."""
    P = F.normalize(class_features.detach().to(torch.float64), dim=1)  # (C, D)
    if scale is not None:
        return Head((float(scale) * P).float().contiguous(), torch.zeros(len(classes)), tuple(classes),
                    normalize=True)
    x = F.normalize(features.detach().to(torch.float64), dim=1)
    s = fit_logit_scale(x @ P.T, labels, max_iter=max_iter)
    return Head((s * P).float().contiguous(), torch.zeros(len(classes)), tuple(classes), normalize=True)


def fit_task_head(kind: str, model, data: _Data, recipe: Recipe) -> Head:
    """The ``kind`` head (:data:`HEADS`) of one task from θ0 (``model``: its encoder)."""
    x, y = data.inputs("train")
    tr = data.split("train")
    if kind == "prompt":
        prompts = encode(model, tokenize(data.tokenizer, tr.prompts, recipe.max_tokens), recipe.eval_batch)
        feats = None if recipe.head_scale is not None else encode(model, x, recipe.eval_batch)  # only to fit s
        return fit_prompt_head(prompts, feats, y, tr.classes, scale=recipe.head_scale, max_iter=recipe.head_max_iter)
    feats = encode(model, x, recipe.eval_batch)
    if kind == "prototype":
        return fit_prototype_head(feats, y, tr.classes, max_iter=recipe.head_max_iter)
    return fit_head(feats, y, tr.classes, l2=recipe.head_l2, max_iter=recipe.head_max_iter)


def accuracy(model, head: Head, x: Tensor, y: Tensor, batch: int = 128) -> float:
    """Accuracy of ``head(model(x))`` on labels ``y``."""
    if y.numel() == 0:
        raise ValueError("cannot compute an accuracy on zero examples")
    return float((head.logits(encode(model, x, batch)).argmax(1) == y).double().mean())


def ensure_head(zoo_dir: Path, data: _Data, pretrained: Mapping[str, Tensor], config: dict,
                recipe: Recipe) -> tuple[Head, dict]:
    """The task's head and its record (fit and saved when missing, stale or corrupt)."""
    path = head_path(zoo_dir, data.task)
    rec = read_json(path.with_suffix(".json"))
    if record_problem(rec, path, recipe.relevant("head")) is None:
        return load_head(path), rec
    t0 = time.perf_counter()
    model = build_encoder(config, pretrained)
    head = fit_task_head(recipe.head, model, data, recipe)
    zs = {s: accuracy(model, head, *data.inputs(s), recipe.eval_batch) for s in ("val", "test")}
    sha = save_head(head, path, task=data.task)
    rec = {"task": data.task, "kind": "head", "head": recipe.head, "recipe": recipe.relevant("head"), "sha256": sha,
           "file": str(path.relative_to(zoo_dir)), "classes": list(data.split("train").classes),
           "prompts": list(data.split("train").prompts) if recipe.head == "prompt" else None,
           "n_train": int(data.inputs("train")[1].numel()), "zero_shot": zs, "seconds": time.perf_counter() - t0}
    write_json(path.with_suffix(".json"), rec)
    update_manifest(zoo_dir, f"heads/{data.task}", rec, BACKBONE)
    return head, rec


# ----------------------------------------------------------------------------- fine-tuning
def finetune_full(pretrained, config, head: Head, x, y, *, recipe: Recipe, generator, desc="", progress=False):
    """Every weight of the encoder trained through the frozen head. Returns (θt, losses)."""
    model = build_encoder(config, pretrained)
    params = list(model.parameters())
    for p in params:
        p.requires_grad_(True)
    losses = train_loop(model, params, head.logits, x, y, steps=recipe.steps, batch_size=recipe.batch_size,
                        lr=recipe.lr, optimizer=recipe.optimizer, weight_decay=recipe.weight_decay,
                        warmup=recipe.warmup, generator=generator, desc=desc, progress=progress)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def finetune_lora(pretrained, config, head: Head, x, y, *, recipe: Recipe, generator, desc="", progress=False):
    """LoRA adapters on :func:`lora_keys` trained through the frozen head, the rest frozen.
    Returns (adapters, scale, losses)."""
    model = build_encoder(config, pretrained)
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = lora_mod.init_adapters(pretrained, recipe.lora_rank, generator=generator,
                                      keys=lora_keys(pretrained, recipe.lora_targets), rule=RULE)
    scale = lora_mod.lora_scale(recipe.lora_rank, recipe.lora_alpha)
    params = lora_mod.attach(model, adapters, scale, rule=RULE)
    losses = train_loop(model, params, head.logits, x, y, steps=recipe.steps, batch_size=recipe.batch_size,
                        lr=recipe.lora_lr, optimizer=recipe.optimizer, weight_decay=recipe.weight_decay,
                        warmup=recipe.warmup, generator=generator, desc=desc, progress=progress)
    trained = lora_mod.read_adapters(model)
    lora_mod.detach(model)
    return trained, scale, losses


def build_run(zoo_dir: Path, kind: str, data: _Data, seed: int, pretrained, config, head: Head, head_rec: dict,
              recipe: Recipe, *, progress: bool = False) -> dict:
    """One fine-tuning run (or its existing valid record). Returns the run's record."""
    path = run_path(zoo_dir, kind, data.task, seed)
    rec = read_json(path.with_suffix(".json"))
    why = record_problem(rec, path, recipe.relevant(kind), head_rec["sha256"])
    if why is None:
        return rec
    log.info("%s/%s/seed%d: %s -> training", kind, data.task, seed, why)
    t0 = time.perf_counter()
    x, y = data.inputs("train")
    gen = torch.Generator().manual_seed(run_seed(kind, data.task, seed))
    desc = f"{kind} {data.task} s{seed}"
    if kind == "full":
        theta, losses = finetune_full(pretrained, config, head, x, y, recipe=recipe, generator=gen, desc=desc,
                                      progress=progress)
        tensors, meta = theta, {"task": data.task, "seed": seed, "kind": kind}
    else:
        adapters, scale, losses = finetune_lora(pretrained, config, head, x, y, recipe=recipe, generator=gen,
                                                desc=desc, progress=progress)
        theta = lora_mod.merge_adapters(pretrained, adapters, scale, rule=RULE)
        tensors = lora_mod.adapters_to_tensors(adapters)
        meta = {"task": data.task, "seed": seed, "kind": kind, "scale": scale, "rank": recipe.lora_rank,
                "alpha": recipe.lora_alpha, "targets": recipe.lora_targets}
    t_train = time.perf_counter() - t0
    t1 = time.perf_counter()
    model = build_encoder(config, theta)
    ft = {s: accuracy(model, head, *data.inputs(s), recipe.eval_batch) for s in ("val", "test")}
    t_eval = time.perf_counter() - t1
    sha = save_safetensors(tensors, path, meta)
    rec = {"task": data.task, "seed": seed, "kind": kind, "backbone": BACKBONE, "recipe": recipe.relevant(kind),
           "sha256": sha, "file": str(path.relative_to(zoo_dir)), "head_sha256": head_rec["sha256"],
           "zero_shot": head_rec["zero_shot"], "finetuned": ft, "n_train": int(y.numel()),
           "first_loss": losses[0], "final_loss": sum(losses[-10:]) / len(losses[-10:]),
           "train_seconds": t_train, "eval_seconds": t_eval,
           "n_eval": int(sum(data.inputs(s)[1].numel() for s in ("val", "test"))),
           "seconds": time.perf_counter() - t0}
    if kind == "lora":
        rec["lora_scale"] = meta["scale"]
    write_json(path.with_suffix(".json"), rec)
    update_manifest(zoo_dir, f"{kind}/{data.task}/seed{seed}", rec, BACKBONE)
    return rec


def _task_names(suite: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(suite, str):
        from pactlib.data.text import text_suite_tasks

        return tuple(text_suite_tasks(suite))
    return tuple(suite)


@single_threaded()  # one thread: a fine-tune is a function of its recipe and seed (module docstring)
def build_zoo(suite: str | Sequence[str], seeds: Iterable[int] = (0,), *, kind: Sequence[str] = KINDS,
              zoo_dir: str | Path | None = None, recipe: Recipe = Recipe(), source: Source | None = None,
              loader: Callable | None = None, data_dir=None, progress: bool = True) -> list[dict]:
    """Build (or complete) the zoo for ``suite`` × ``seeds`` × ``kind``; returns every run's record.

    Args:
        suite: a text suite (``"8"``, ``"14"``) or task names. seeds: fine-tuning seeds.
        kind: subset of ("full", "lora"). zoo_dir: default :func:`default_zoo_dir`.
        source: θ0 / config / tokenizer (default: the real all-MiniLM-L6-v2).
        loader: ``loader(task, split, *, seed, limit[, cache_dir]) -> TextData`` (default
            :func:`pactlib.data.text.load_text_task`).

    Raises:
        ValueError: unknown kind. Errors of the loader propagate.
    """
    from tqdm.auto import tqdm

    kinds = tuple(kind)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown zoo kind(s) {bad}; use a subset of {KINDS}")
    seeds = [int(s) for s in seeds]
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
    zoo_dir.mkdir(parents=True, exist_ok=True)
    source = source or Source()
    loader = loader or _default_loader()
    tasks = _task_names(suite)
    pretrained, config = ensure_pretrained(zoo_dir, source)
    tokenizer = source.get_tokenizer()
    records = []
    bar = tqdm(total=len(tasks) * len(seeds) * len(kinds), desc="minilm zoo", disable=not progress)
    for task in tasks:
        data = _Data(task, loader, recipe, tokenizer, data_dir)
        head, head_rec = ensure_head(zoo_dir, data, pretrained, config, recipe)
        for s in seeds:
            for k in kinds:
                rec = build_run(zoo_dir, k, data, s, pretrained, config, head, head_rec, recipe, progress=progress)
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
        pretrained: θ0; config: its ``BertConfig`` as a dict. heads: ``{task: Head}``.
        finetuned: ``{task: θt}`` (LoRA: θ0 + scale·B A). records: ``{task: run record}``.
        adapters: LoRA only: ``{task: {key: (A, B)}}``.
    """

    kind: str
    seed: int
    pretrained: dict[str, Tensor]
    config: dict
    heads: dict[str, Head]
    finetuned: dict[str, dict[str, Tensor]]
    records: dict[str, dict]
    head_records: dict[str, dict]
    adapters: dict[str, dict] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return list(self.finetuned)

    def task_vectors(self) -> dict[str, dict[str, Tensor]]:
        """Exact Δt per task over floating keys, float32 (LoRA: scale·B A, zeros elsewhere)."""
        if self.kind == "lora":
            return {t: lora_mod.lora_task_vector(self.pretrained, a, self.records[t]["lora_scale"], rule=RULE)
                    for t, a in self.adapters.items()}
        return {t: {k: v.float() - self.pretrained[k].float() for k, v in sd.items() if v.is_floating_point()}
                for t, sd in self.finetuned.items()}


def _missing(what: str, path: Path, suite) -> FileNotFoundError:
    return FileNotFoundError(
        f"MiniLM zoo {what} missing or invalid at {path}; build it with: python -m pactlib.testbeds.minilm.zoo "
        f"--suite {suite} --seeds 0 (zoo dir {path.parents[0]}; the default is $PACT_CACHE/zoo-minilm, now "
        f"{default_zoo_dir()})")


def load_zoo(suite: str | Sequence[str], *, seed: int = 0, kind: str = "full", zoo_dir: str | Path | None = None) -> Zoo:
    """Load θ0, heads and fine-tuned checkpoints of ``suite`` for one ``seed`` and ``kind``; every file
    is checked against the sha256 in its record.

    Raises:
        FileNotFoundError: a file or record is missing or a sha256 does not match (names the file and
            the command that builds it). ValueError: unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown zoo kind {kind!r}; use one of {KINDS}")
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
    tasks = _task_names(suite)
    label = suite if isinstance(suite, str) else "<suite>"
    pre_path = zoo_dir / "pretrained.safetensors"
    pre = (read_json(zoo_dir / "manifest.json") or {}).get("pretrained", {})
    if not pre_path.is_file() or file_sha256(pre_path) != pre.get("sha256"):
        raise _missing("pretrained checkpoint", pre_path, label)
    pretrained = in_model_order(pre["config"], load_safetensors(pre_path)[0])
    heads, fts, recs, hrecs, adapters = {}, {}, {}, {}, {}
    for t in tasks:
        hp = head_path(zoo_dir, t)
        hrec = read_json(hp.with_suffix(".json"))
        if hrec is None or not hp.is_file() or file_sha256(hp) != hrec.get("sha256"):
            raise _missing(f"head of task {t!r}", hp, label)
        heads[t], hrecs[t] = load_head(hp), hrec
        rp = run_path(zoo_dir, kind, t, seed)
        rec = read_json(rp.with_suffix(".json"))
        if rec is None or not rp.is_file() or file_sha256(rp) != rec.get("sha256"):
            raise _missing(f"{kind} run of task {t!r} seed {seed}", rp, label)
        tensors, _ = load_safetensors(rp)
        if kind == "lora":
            adapters[t] = lora_mod.adapters_from_tensors(tensors)
            fts[t] = lora_mod.merge_adapters(pretrained, adapters[t], rec["lora_scale"], rule=RULE)
        else:
            fts[t] = in_model_order(pre["config"], tensors)
        recs[t] = rec
    return Zoo(kind, seed, pretrained, pre["config"], heads, fts, recs, hrecs, adapters)


# ----------------------------------------------------------------------------- PEFT export
def export_peft(zoo_dir: str | Path, task: str, seed: int, out_dir: str | Path) -> Path:
    """Write one LoRA run as a Hugging Face PEFT adapter folder (``adapter_model.safetensors`` +
    ``adapter_config.json``, keys ``base_model.model.<module>.lora_{A,B}.weight``), so that
    ``pact merge --lora-adapters`` and :func:`pactlib.peft.read_adapter` read the zoo's adapters as
    any PEFT fine-tune's; the folder's Δ equals the zoo's task vector (tested).

    Raises:
        FileNotFoundError: the run is missing or its sha256 does not match.
    """
    zoo_dir, out = Path(zoo_dir), Path(out_dir)
    path = run_path(zoo_dir, "lora", task, seed)
    rec = read_json(path.with_suffix(".json"))
    if rec is None or not path.is_file() or file_sha256(path) != rec.get("sha256"):
        raise _missing(f"lora run of task {task!r} seed {seed}", path, "<suite>")
    adapters = lora_mod.adapters_from_tensors(load_safetensors(path)[0])
    r = rec["recipe"]
    tensors = {}
    for key, (A, B) in adapters.items():
        module = key[: -len(".weight")]
        tensors[f"base_model.model.{module}.lora_A.weight"] = A
        tensors[f"base_model.model.{module}.lora_B.weight"] = B
    modules = sorted({k.rsplit(".", 2)[-2] for k in adapters})  # query, key, value, dense
    config = {"peft_type": "LORA", "task_type": "FEATURE_EXTRACTION", "r": r["lora_rank"],
              "lora_alpha": r["lora_alpha"], "lora_dropout": 0.0, "target_modules": modules, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
              "base_model_name_or_path": "sentence-transformers/all-MiniLM-L6-v2", "rank_pattern": {},
              "alpha_pattern": {}, "modules_to_save": None, "inference_mode": True}
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, out / "adapter_model.safetensors", {"format": "pt"})
    write_json(out / "adapter_config.json", config)
    return out


# ----------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pactlib.testbeds.minilm.zoo --suite 8 --seeds 0 1 2 --kind full lora [--steps N ...]``."""
    p = argparse.ArgumentParser(prog="python -m pactlib.testbeds.minilm.zoo",
                                description="build the MiniLM zoo (resumable)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--suite", required=True, help="text suite: 8 or 14")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--kind", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--zoo-dir", default=None, help="default $PACT_CACHE/zoo-minilm")
    p.add_argument("--no-progress", action="store_true")
    defaults = Recipe()
    for f in fields(Recipe):
        d = getattr(defaults, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(d) if d is not None else int,
                       default=None, help=f"Recipe.{f.name} (default {d})")
    args = p.parse_args(argv)
    recipe = replace(Recipe(), **{f.name: getattr(args, f.name) for f in fields(Recipe)
                                  if getattr(args, f.name) is not None})
    for r in build_zoo(args.suite, args.seeds, kind=args.kind, zoo_dir=args.zoo_dir, recipe=recipe,
                       progress=not args.no_progress):
        print(json.dumps({k: r[k] for k in ("kind", "task", "seed", "zero_shot", "finetuned", "seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
