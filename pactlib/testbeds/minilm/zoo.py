"""The MiniLM testbed's model zoo: frozen heads, full and LoRA fine-tunes of all-MiniLM-L6-v2.

The trainer, the files and the records are :mod:`pactlib.testbeds.zoo_trainer`'s; this module is
what the MiniLM family adds (:class:`MiniLMZoo`: θ0 and its config, tokenized inputs, the
mean-pooled encoder, prompt / prototype / probe heads, the LoRA targets) and its :class:`Recipe`.
For every text task t (:mod:`pactlib.data.text`) and seed s the zoo holds

- ``pretrained.safetensors`` -- θ0, the ``BertModel`` state dict without pooler
  (:func:`pactlib.testbeds.minilm.model.load_pretrained`); ``manifest.json`` keeps its sha256 and
  the model config;
- ``heads/<t>.safetensors`` (+ ``.json``) -- the task's frozen head (:data:`HEADS`); its accuracy
  on θ0 is the zero-shot accuracy acc_0(t);
- ``full/<t>/seed<s>.safetensors`` (+ ``.json``) -- θt after fine-tuning every weight of the
  encoder (embedding tables included) through the frozen head;
- ``lora/<t>/seed<s>.safetensors`` (+ ``.json``) -- LoRA adapters (A, B) on the encoder's
  ``nn.Linear`` maps (:data:`LORA_TARGETS`), everything else frozen.

Records, resumability, the sha256 checks and the randomness are the trainer's
(:mod:`pactlib.testbeds.zoo_trainer`); MiniLM's records add the evaluation time and size.

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
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pactlib import lora as lora_mod
from pactlib.matrix import PRESETS
from pactlib.testbeds import zoo_trainer as T
from pactlib.testbeds.lite0.heads import Head, fit_head, fit_logit_scale, fit_prototype_head
from pactlib.testbeds.zoo_files import file_sha256, load_safetensors, read_json, save_safetensors, write_json
from pactlib.testbeds.zoo_trainer import KINDS, RecipeFields, Zoo, head_path, run_path

from .model import build_encoder, encode, in_model_order, load_pretrained, load_tokenizer, tokenize

log = logging.getLogger(__name__)

BACKBONE = "all-MiniLM-L6-v2"
RULE = PRESETS["hf_encoder"]
HEADS = ("prompt", "prototype", "probe")

#: Which weights LoRA adapts, by ``Recipe.lora_targets``: regexes over θ0's keys.
LORA_TARGETS = {
    "all": r"\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)\.weight$",
    "qv": r"\.attention\.self\.(query|value)\.weight$",
}


@dataclass(frozen=True)
class Recipe(RecipeFields):
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
        self.check_common()
        if self.lora_targets not in LORA_TARGETS:
            raise ValueError(f"Recipe.lora_targets must be one of {sorted(LORA_TARGETS)}, got {self.lora_targets!r}")
        if self.eval_batch < 1:
            raise ValueError(f"Recipe.eval_batch must be >= 1, got {self.eval_batch}")
        if self.max_tokens < 3:
            raise ValueError(f"Recipe.max_tokens must be >= 3 ([CLS], a token, [SEP]), got {self.max_tokens}")

    #: fields that decide a head, and in addition a full / LoRA run (eval_batch decides nothing).
    HEAD_FIELDS = ("max_tokens", "head", "head_scale", "head_max_iter", "head_l2", "data_seed", "train_limit", "eval_limit")
    RUN_FIELDS = ("steps", "batch_size", "optimizer", "weight_decay", "warmup")
    KIND_FIELDS = {"full": ("lr",), "lora": ("lora_lr", "lora_rank", "lora_alpha", "lora_targets")}


# ----------------------------------------------------------------------------- paths
def default_zoo_dir() -> Path:
    """``$PACT_CACHE/zoo-minilm`` (else the per-user cache's: :func:`pactlib.paths.cache_dir`)."""
    return MiniLMZoo().default_zoo_dir()


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


def fit_task_head(kind: str, model, data: T.TaskSplits, recipe: Recipe) -> Head:
    """The ``kind`` head (:data:`HEADS`) of one task from θ0 (``model``: its encoder); ``data``'s
    family (a :class:`MiniLMZoo`) tokenizes the class descriptions."""
    x, y = data.inputs("train")
    tr = data.split("train")
    if kind == "prompt":
        prompts = encode(model, tokenize(data.family.tokenizer(), tr.prompts, recipe.max_tokens), recipe.eval_batch)
        feats = None if recipe.head_scale is not None else encode(model, x, recipe.eval_batch)  # only to fit s
        return fit_prompt_head(prompts, feats, y, tr.classes, scale=recipe.head_scale, max_iter=recipe.head_max_iter)
    feats = encode(model, x, recipe.eval_batch)
    if kind == "prototype":
        return fit_prototype_head(feats, y, tr.classes, max_iter=recipe.head_max_iter)
    return fit_head(feats, y, tr.classes, l2=recipe.head_l2, max_iter=recipe.head_max_iter)


def accuracy(model, head: Head, x: Tensor, y: Tensor, batch: int = 128) -> float:
    """Accuracy of ``head(model(x))`` on labels ``y``.

    Raises:
        ValueError: no examples.
    """
    if y.numel() == 0:
        raise ValueError("cannot compute an accuracy on zero examples")
    return float((head.logits(encode(model, x, batch)).argmax(1) == y).double().mean())


# ----------------------------------------------------------------------------- the family
class MiniLMZoo(T.ZooFamily):
    """all-MiniLM-L6-v2 on the text tasks of :mod:`pactlib.data.text`: θ0 and its ``BertConfig``
    from ``source`` (the manifest keeps the config), texts tokenized to ``Recipe.max_tokens``,
    the mean-pooled encoder (:func:`pactlib.testbeds.minilm.model.build_encoder`), the
    ``Recipe.head`` head, LoRA on :func:`lora_keys` under the ``hf_encoder`` rule."""

    backbone = BACKBONE
    zoo_dirname = "zoo-minilm"
    label = "MiniLM"
    rule = RULE
    pretrained_fields = ("config",)

    def __init__(self, source: Source | None = None):
        self.source = source or Source()

    @property
    def pretrained_name(self) -> str:
        return self.source.name

    def tokenizer(self):
        """The source's tokenizer (loaded on first use)."""
        return self.source.get_tokenizer()

    def build_command(self, suite) -> str:
        return f"python -m pactlib.testbeds.minilm.zoo --suite {suite} --seeds 0"

    def task_names(self, suite: str) -> tuple[str, ...]:
        from pactlib.data.text import text_suite_tasks

        return tuple(text_suite_tasks(suite))

    def default_loader(self) -> Callable:
        from pactlib.data.text import load_text_task

        return load_text_task

    def make_pretrained(self) -> tuple[dict[str, Tensor], dict]:
        sd, config = self.source.pretrained()
        return sd, {"config": config}

    def arrange(self, state, pre):
        return in_model_order(pre["config"], state)

    def inputs(self, data, recipe: Recipe) -> tuple[Tensor, Tensor]:
        return tokenize(self.tokenizer(), data.texts, recipe.max_tokens), data.labels

    def model(self, state, pre, recipe: Recipe):
        return build_encoder(pre["config"], state)

    def fit_head(self, pretrained, pre, data: T.TaskSplits, recipe: Recipe) -> Head:
        return fit_task_head(recipe.head, build_encoder(pre["config"], pretrained), data, recipe)

    def accuracy(self, state, pre, head: Head, data: T.TaskSplits, split: str, recipe: Recipe) -> float:
        return accuracy(build_encoder(pre["config"], state), head, *data.inputs(split), recipe.eval_batch)

    def head_record(self, data: T.TaskSplits, recipe: Recipe) -> dict:
        return {"head": recipe.head, "prompts": list(data.split("train").prompts) if recipe.head == "prompt" else None}

    def run_record(self, data: T.TaskSplits, eval_seconds: float) -> dict:
        return {"eval_seconds": eval_seconds, "n_eval": int(sum(data.inputs(s)[1].numel() for s in ("val", "test")))}

    def lora_keys(self, pretrained, recipe: Recipe) -> list[str]:
        return lora_keys(pretrained, recipe.lora_targets)

    def lora_meta(self, recipe: Recipe) -> dict:
        return {"targets": recipe.lora_targets}


def ensure_pretrained(zoo_dir: Path, source: Source | None = None) -> tuple[dict[str, Tensor], dict]:
    """(θ0, config) from ``pretrained.safetensors`` (written, or rewritten when missing or corrupt,
    from ``source``); the manifest keeps its sha256, the config and the model's name."""
    sd, pre = T.ensure_pretrained(MiniLMZoo(source), Path(zoo_dir))
    return sd, pre["config"]


def finetune_full(pretrained, config, head: Head, x, y, *, recipe: Recipe, generator, desc="", progress=False):
    """Every weight of the encoder trained through the frozen head; x (N, 2, L), y (N,).
    Returns (θt, losses)."""
    return T.finetune_full(MiniLMZoo(), pretrained, {"config": config}, head, x, y, recipe=recipe,
                           generator=generator, desc=desc, progress=progress)


def finetune_lora(pretrained, config, head: Head, x, y, *, recipe: Recipe, generator, desc="", progress=False):
    """LoRA adapters on :func:`lora_keys` trained through the frozen head, the rest frozen.
    Returns (adapters, scale, losses)."""
    return T.finetune_lora(MiniLMZoo(), pretrained, {"config": config}, head, x, y, recipe=recipe,
                           generator=generator, desc=desc, progress=progress)


def build_zoo(suite: str | Sequence[str], seeds: Iterable[int] = (0,), *, kind: Sequence[str] = KINDS,
              zoo_dir: str | Path | None = None, recipe: Recipe = Recipe(), source: Source | None = None,
              loader: Callable | None = None, data_dir=None, progress: bool = True) -> list[dict]:
    """Build (or complete) the MiniLM zoo for ``suite`` ("8", "14" or task names) × ``seeds`` ×
    ``kind``; ``source`` gives θ0 / config / tokenizer (default: the real all-MiniLM-L6-v2),
    ``loader`` defaults to :func:`pactlib.data.text.load_text_task`. Returns every run's record
    (:func:`pactlib.testbeds.zoo_trainer.build_zoo`, which documents the arguments and errors)."""
    return T.build_zoo(MiniLMZoo(source), suite, seeds, kind=kind, zoo_dir=zoo_dir, recipe=recipe, loader=loader,
                       data_dir=data_dir, progress=progress)


def load_zoo(suite: str | Sequence[str], *, seed: int = 0, kind: str = "full", zoo_dir: str | Path | None = None) -> Zoo:
    """Load θ0 (in the model's key order), its config, heads and fine-tuned checkpoints of ``suite``
    for one ``seed`` and ``kind``; every file is checked against the sha256 in its record.

    Raises:
        FileNotFoundError: a file or record is missing or a sha256 does not match (names the file and
            the command that builds it). ValueError: unknown kind.
    """
    return T.load_zoo(MiniLMZoo(), suite, seed=seed, kind=kind, zoo_dir=zoo_dir)


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
        raise T.missing(MiniLMZoo(), f"lora run of task {task!r} seed {seed}", path, "<suite>")
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
    T.add_build_arguments(p, Recipe, suites="8 or 14", zoo_dirname=MiniLMZoo.zoo_dirname)
    return T.run_build_command(Recipe, p.parse_args(argv), build_zoo)


if __name__ == "__main__":
    raise SystemExit(main())
