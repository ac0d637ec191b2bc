"""The MiniLM testbed: all-MiniLM-L6-v2 (θ0) fine-tuned on real text tasks, a transformer whose maps
are the paper's kind of layer (attention q/k/v/out, MLP fc1/fc2).

Registry names ``minilm-8`` and ``minilm-14`` (the nested text suites of
:mod:`pactlib.data.text`); ``minilm-<suite>:<n>`` keeps the first n tasks. The zoo is built by
:func:`pactlib.testbeds.minilm.zoo.build_zoo` or, for what is missing, by :func:`load` itself.

- **Maps** (:data:`pactlib.matrix.PRESETS` ``["hf_encoder"]``): the 36 ``nn.Linear`` weights of
  the 6 layers (query, key, value, attention output, intermediate = fc1, output = fc2). The word,
  position and token-type embedding tables are *not* maps (a table is not a linear map of the
  layer's input); with the biases and LayerNorms they are merged by each method's own rule.
- **Features**: mean pooling of the last hidden states over real tokens (what all-MiniLM-L6-v2
  is trained for).
- **Heads**: ``Recipe.head`` of the zoo, by default ``"prompt"``: cosine head on θ0's embeddings
  of one English description per class (CLIP's zero-shot head; chosen by measurement:
  ``book/data/minilm_heads.jsonl``, ``bench/bench_minilm.py --heads``).
- **Inputs**: ``x`` int64 ``(N, 2, L)`` = token ids and attention mask
  (:func:`pactlib.testbeds.minilm.model.tokenize`), cut to ``Recipe.max_tokens`` tokens.

    tb = testbeds.load("minilm-8", seed=0, kind="lora")
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from ...outcomes import Scores, pack, scores
from ...matrix import MatrixRule, PRESETS
from ...taskvector import TaskVector
from ..base import code_fingerprint, with_frozen_head

FAMILY = "minilm"

#: Zoo profiles: where the zoo lives (under ``$PACT_CACHE``) and its recipe. ``default`` is the
#: book's, written out so the zoo is pinned (the first measured recipe, :class:`Recipe
#: <pactlib.testbeds.minilm.zoo.Recipe>`; to be re-sized with the book's time budget:
#: ``book/data/minilm_timing.jsonl``); ``smoke`` a seconds-sized one for quick looks.
PROFILES: dict[str, dict] = {
    "default": dict(dir="zoo-minilm", recipe=dict(max_tokens=32, head="prompt", head_scale=20.0, steps=60,
                                                  batch_size=16, optimizer="adamw", lr=1e-4, lora_lr=1e-3,
                                                  weight_decay=0.0, warmup=6, lora_rank=8, lora_alpha=16.0,
                                                  lora_targets="all", data_seed=0)),
    "smoke": dict(dir="zoo-minilm-smoke", recipe=dict(steps=4, warmup=1, train_limit=64, eval_limit=32)),
}

#: The zoo the book uses (``make zoo``): (suite, seeds, kinds). Full and LoRA fine-tunes on 3 seeds
#: of the 8-task suite (the claims rest on >= 3 seeds), full fine-tunes of seed 0 on the 14-task
#: suite (chapters 5 and 7: how the gain changes with T). The 8 tasks are the 14's first.
BOOK_ZOO = (("8", (0, 1, 2), ("full", "lora")), ("14", (0,), ("full",)))

#: The code an evaluation on this testbed depends on (besides the engine's): part of every memo key.
EVAL_MODULES = ("pactlib.testbeds.minilm.model", "pactlib.testbeds.minilm.testbed", "pactlib.testbeds.lite0.heads")


def parse_name(name: str) -> tuple[str, int]:
    """``"minilm-8"`` -> (``"8"``, 0); ``"minilm-14:4"`` -> (``"14"``, 4) (the first 4 tasks).

    Raises:
        KeyError: not a MiniLM name (lists the suites).
    """
    from ...data.text import TEXT_SUITES

    rest = name[len(FAMILY) + 1:] if name.startswith(FAMILY + "-") else ""
    suite, _, n = rest.partition(":")
    if suite not in TEXT_SUITES or (n and (not n.isdigit() or not 1 <= int(n) <= len(TEXT_SUITES[suite]))):
        raise KeyError(f"unknown testbed {name!r}; MiniLM testbeds are "
                       f"{', '.join(f'{FAMILY}-{s}' for s in TEXT_SUITES)} (optionally ':<n>' for the first n tasks)")
    return suite, int(n or 0)


def zoo_profile(name: str, settings: Mapping | Sequence[str] | None = None):
    """(zoo directory, :class:`~pactlib.testbeds.minilm.zoo.Recipe`) of a profile, with ``settings``
    changed: ``{field: value}`` or ``"FIELD=VALUE"`` strings (converted by the field's type, as
    Lite0's ``recipe_variant``); a changed recipe lives in a sibling folder ``<dir>-<field><value>...``.

    Raises:
        KeyError: unknown profile. ValueError: an unknown recipe field or a value that does not convert.
    """
    from dataclasses import fields as dc_fields

    from ...paths import cache_dir
    from .zoo import Recipe

    if name not in PROFILES:
        raise KeyError(f"unknown MiniLM zoo profile {name!r}; known: {', '.join(PROFILES)}")
    p = PROFILES[name]
    recipe = Recipe(**p["recipe"])
    d = cache_dir(p["dir"])
    if settings and not isinstance(settings, Mapping):
        known = {f.name for f in dc_fields(recipe)}
        parsed = {}
        for item in settings:
            key, sep, value = str(item).partition("=")
            if not sep or key not in known:
                raise ValueError(f"recipe setting {item!r}: expected FIELD=VALUE with FIELD one of {sorted(known)}")
            cur = getattr(recipe, key)
            parsed[key] = None if value == "None" else type(cur)(value) if cur is not None else json.loads(value)
        settings = parsed
    if settings:
        bad = set(settings) - {f.name for f in dc_fields(recipe)}
        if bad:
            raise ValueError(f"unknown MiniLM recipe field(s) {sorted(bad)}")
        recipe = replace(recipe, **settings)
        d = d.with_name(p["dir"] + "-" + "-".join(f"{k}{v}" for k, v in settings.items()))
    return d, recipe


@dataclass
class MiniLMTestbed:
    """One slice of the MiniLM zoo (a :class:`~pactlib.testbeds.base.Testbed`).

    Attributes beyond the protocol:
        suite: ``"8"`` or ``"14"``. config: θ0's ``BertConfig`` as a dict. heads: ``{task: Head}``.
        val, test: ``{task: (x (N, 2, L), y (N,))}`` tokenized and capped. max_tokens: token budget.
        zoo: the loaded :class:`~pactlib.testbeds.minilm.zoo.Zoo`.
    """

    name: str
    suite: str
    seed: int
    kind: str
    tasks: list[str]
    pretrained: dict[str, Tensor]
    finetuned: dict[str, dict[str, Tensor]]
    config: dict
    heads: dict
    val: dict
    test: dict
    ft_val: dict[str, float]
    ft_test: dict[str, float]
    zs_test: dict[str, float]
    max_tokens: int = 32
    val_limit: int | None = None
    test_limit: int | None = None
    zoo: object = field(default=None, repr=False)
    cache_dir: Path | None = None
    eval_batch: int = 128
    family: str = FAMILY
    rule: MatrixRule = PRESETS["hf_encoder"]

    # ---------------------------------------------------------------------------- the protocol
    def task_vectors(self) -> list[TaskVector]:
        """Δt per task in suite order (LoRA: exactly scale·B·A on the adapted maps)."""
        return [TaskVector(d, name=t) for t, d in self.zoo.task_vectors().items()]

    def _encoder(self, state: Mapping[str, Tensor]) -> nn.Module:
        from .model import build_encoder

        return build_encoder(self.config, state)

    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """{task: accuracy} of one encoder state dict (θ0's keys) on the (capped) ``split``, with each
        example's correctness (:class:`~pactlib.outcomes.Scores`)."""
        from .model import encode

        datas = self.val if split == "val" else self.test
        model = self._encoder(state)
        out = {}
        for t in tasks or self.tasks:
            x, y = datas[t]
            out[t] = self.heads[t].logits(encode(model, x, self.eval_batch)).argmax(1) == y
        return scores(out)

    def loss_model(self, state: Mapping[str, Tensor], task: str) -> nn.Module:
        """Encoder (weights ``state``) + ``task``'s frozen head: x (N, 2, L) int64 -> logits (N, C).
        ``named_parameters()`` are θ0's keys."""
        h = self.heads[task]
        return with_frozen_head(self._encoder(state), h.weight, h.bias, normalize=bool(h.normalize))

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Packed inputs x int64 (N, 2, L) (ids, attention mask) and labels (N,) of a task split."""
        x, y = (self.val if split == "val" else self.test)[task]
        n = len(y) if limit is None else min(limit, len(y))
        x = x[:n]
        width = int(x[:, 1].sum(1).max()) if n else 0
        return x[:, :, :width], y[:n]

    def fingerprint(self) -> dict | None:
        """The runs' and heads' sha256, the caps, the token budget, the evaluated examples' sha256
        and the evaluator's code."""
        recs = getattr(self.zoo, "records", None) or {}
        ids = [(t, recs.get(t, {}).get("sha256"), recs.get(t, {}).get("head_sha256")) for t in self.tasks]
        if any(sha is None for _, sha, _ in ids):
            return None
        return dict(runs=ids, val_limit=self.val_limit, test_limit=self.test_limit, max_tokens=self.max_tokens,
                    data=self._data_sha256(), eval_code=code_fingerprint(EVAL_MODULES))

    def _data_sha256(self) -> str:
        cache = self.__dict__.get("_data_hash")
        if cache is None:
            h = hashlib.sha256()
            for t in self.tasks:
                for x, y in (self.val[t], self.test[t]):
                    h.update(t.encode() + x.contiguous().numpy().tobytes() + y.numpy().tobytes())
            cache = self.__dict__["_data_hash"] = h.hexdigest()
        return cache

    # -------------------------------------------------------------------- family-specific
    def matrix_keys(self) -> list[str]:
        """θ0's keys the rule treats as maps (the 36 Linear weights)."""
        return self.rule.matrix_keys(self.pretrained)

    def network_order(self) -> list[str]:
        """The maps from input to output: layer 0 to 5, in each q, k, v, attention output, fc1, fc2
        (θ0 is kept in the model's own key order; a sort by name would put the attention output
        before q)."""
        return self.matrix_keys()

    @classmethod
    def from_zoo(cls, name: str, suite: str, seed: int = 0, kind: str = "full", *, zoo_dir=None, tasks=None,
                 val_limit: int | None = 256, test_limit: int | None = None, tokenizer=None, loader=None,
                 data_dir=None) -> "MiniLMTestbed":
        """Load a zoo slice and its tokenized evaluation data; measure acc_ft and zero-shot on the
        capped splits (memoised in ``<zoo>/eval_memo.json``, keyed by checkpoint and head sha256).

        Raises:
            FileNotFoundError: the zoo slice is not built (the message says how to build it).
        """
        from ..zoo_files import AccuracyMemo
        from .model import load_tokenizer, tokenize
        from .zoo import default_zoo_dir, load_zoo

        zoo = load_zoo(list(tasks) if tasks else str(suite), seed=seed, kind=kind, zoo_dir=zoo_dir)
        names = list(zoo.tasks)
        recipe = zoo.records[names[0]].get("recipe", {})
        data_seed, max_tokens = recipe.get("data_seed", 0), recipe.get("max_tokens", 32)
        if loader is None:
            from ...data.text import load_text_task as loader
        tok = tokenizer or load_tokenizer()
        kw = {} if data_dir is None else {"cache_dir": data_dir}

        def split(s, limit):
            out = {}
            for t in names:
                d = loader(t, s, seed=data_seed, limit=limit, **kw)
                out[t] = (tokenize(tok, d.texts, max_tokens), d.labels)
            return out

        val, test = split("val", val_limit), split("test", test_limit)
        zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
        tb = cls(name, str(suite), seed, kind, names, zoo.pretrained, zoo.finetuned, zoo.config, zoo.heads, val, test,
                 Scores(), Scores(), Scores(), max_tokens, val_limit, test_limit, zoo, zoo_dir)
        memo = AccuracyMemo(zoo_dir / "eval_memo.json")
        data_id = tb._data_sha256()[:16]
        for t in names:
            head = zoo.records[t].get("head_sha256", t)
            for which, state, ident, sp, target in (
                    ("ft", zoo.finetuned[t], zoo.records[t]["sha256"], "val", tb.ft_val),
                    ("ft", zoo.finetuned[t], zoo.records[t]["sha256"], "test", tb.ft_test),
                    ("zs", zoo.pretrained, "zero-shot", "test", tb.zs_test)):
                key = f"{ident}|{head}|{t}|{sp}|{val_limit if sp == 'val' else test_limit}|{data_id}"

                def compute(state=state, sp=sp, t=t):
                    s = tb.evaluate(state, sp, [t])
                    return s[t], pack(s.outcomes[t])
                target.add(t, *memo.scored(key, compute))
        memo.save()
        return tb


def load(name: str, seed: int = 0, kind: str = "full", *, profile: str = "default",
         settings: Mapping | Sequence[str] | None = None,
         build: bool = True, progress: bool = False, val_limit: int | None = 256, test_limit: int | None = None,
         zoo_dir=None) -> MiniLMTestbed:
    """Load the MiniLM testbed ``name`` (``minilm-8``, ``minilm-14``, ``minilm-<suite>:<n>``).

    Args:
        seed, kind: fine-tuning seed and ``"full"``/``"lora"``.
        profile: a zoo profile of :data:`PROFILES`; ``settings``: recipe changes (``{field: value}`` or
            ``"FIELD=VALUE"`` strings, :func:`zoo_profile`).
        build: build what is missing of the zoo slice first.
        val_limit, test_limit: caps on examples per task (None: the whole split).
        zoo_dir: a zoo folder instead of the profile's.

    Raises:
        KeyError: unknown name or profile. FileNotFoundError: the slice is missing and ``build`` is False.
    """
    from ...data.text import text_suite_tasks
    from .zoo import build_zoo

    suite, n = parse_name(name)
    d, recipe = zoo_profile(profile, settings)
    zoo_dir = Path(zoo_dir) if zoo_dir is not None else d
    tasks = list(text_suite_tasks(suite))[: n or None]
    if build:
        build_zoo(tasks, [seed], kind=[kind], zoo_dir=zoo_dir, recipe=recipe, progress=progress)
    return MiniLMTestbed.from_zoo(name, suite, seed, kind, zoo_dir=zoo_dir, tasks=tasks, val_limit=val_limit,
                                  test_limit=test_limit)


def build_book_zoo(profile: str = "default", plan=BOOK_ZOO, progress: bool = True) -> list[dict]:
    """Build (or complete; finished runs are kept) every MiniLM zoo run the book's chapters use
    (:data:`BOOK_ZOO`); about a minute per run on one CPU core (``book/data/minilm_timing.jsonl``)."""
    from ...data.text import text_suite_tasks
    from .zoo import build_zoo

    zoo_dir, recipe = zoo_profile(profile)
    out = []
    for suite, seeds, kinds in plan:
        out += build_zoo(list(text_suite_tasks(suite)), seeds, kind=kinds, zoo_dir=zoo_dir, recipe=recipe,
                         progress=progress)
    return out


if __name__ == "__main__":  # python -m pactlib.testbeds.minilm.testbed [profile]: the zoo `make zoo` builds
    import sys

    recs = build_book_zoo(sys.argv[1] if len(sys.argv) > 1 else "default")
    print(f"MiniLM zoo ready: {len(recs)} runs")
