"""The EfficientNet-Lite0 testbed: ImageNet Lite0 (θ0) fine-tuned on 20 real image tasks.

Registry names ``lite0-8``, ``lite0-14``, ``lite0-20`` (the nested suites 8 ⊂ 14 ⊂ 20 of
:mod:`pactlib.data`); ``lite0-<suite>:<n>`` keeps the first n tasks. The zoo (θt per task, seed
and kind, and each task's frozen head) is built by ``make zoo`` (:data:`BOOK_ZOO`) or, for what
is missing, by :func:`load` itself (``build=True``). Profiles (:data:`PROFILES`) pin the
fine-tuning recipe: ``default`` is the book's, ``smoke`` a seconds-sized one for tests.

    tb = testbeds.load("lite0-8", seed=0, kind="lora")

Book: chapter 2 ("The testbed") describes the tasks, the recipe and its choice.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

from torch import Tensor, nn

from ...matrix import DEFAULT_RULE, MatrixRule
from ...taskvector import TaskVector
from ...outcomes import Scores, pack
from ..base import code_fingerprint, with_frozen_head
from ..zoo_files import AccuracyMemo

FAMILY = "lite0"

#: Zoo profiles: where the zoo lives (under ``$PACT_CACHE``) and its recipe, as changes to the
#: fields of :class:`pactlib.testbeds.lite0.zoo.Recipe`. ``default`` is what ``make zoo`` builds:
#: ``Recipe``'s defaults, the one place the book's recipe is written (cosine prototype heads, 80
#: AdamW steps of batch 64 at 32 px, lr 3e-5 (full) / 1e-3 (LoRA rank 8, alpha 16));
#: ``tests/test_zoo.py`` pins the values the book's zoo was built with. ``smoke`` is a
#: seconds-sized zoo for tests. Why these: :class:`pactlib.testbeds.lite0.zoo.Recipe` and chapter 2.
PROFILES: dict[str, dict] = {
    "default": dict(dir="zoo", recipe={}),
    "smoke": dict(dir="zoo-smoke", recipe=dict(steps=3, warmup=1, train_limit=96, eval_limit=48, head_max_iter=15)),
}

#: What the default book needs: (suite, seeds, kinds). Nested suites share runs: the 20-task
#: build reuses the 8-task suite's seed-0 full fine-tunes.
BOOK_ZOO = (("8", (0,), ("full", "lora")), ("20", (0,), ("full",)), ("8", (1, 2), ("full", "lora")))

#: The code an evaluation on this testbed depends on (besides the engine's): part of every memo key.
EVAL_MODULES = ("pactlib.models.efficientnet", "pactlib.eval", "pactlib.testbeds.lite0.heads")


def zoo_profile(name: str):
    """(zoo directory, :class:`pactlib.testbeds.lite0.zoo.Recipe`) of a profile.

    Raises:
        KeyError: unknown profile (lists the known ones).
    """
    from .zoo import Recipe, default_zoo_dir

    if name not in PROFILES:
        raise KeyError(f"unknown zoo profile {name!r}; known: {', '.join(PROFILES)}")
    p = PROFILES[name]
    root = Path(os.environ["PACT_CACHE"]) if os.environ.get("PACT_CACHE") else default_zoo_dir().parent
    return root / p["dir"], Recipe(**p["recipe"])


def recipe_variant(name: str, settings: Sequence[str]):
    """(zoo directory, :class:`pactlib.testbeds.lite0.zoo.Recipe`) of profile ``name`` with some
    recipe fields changed, for benches that try another recipe without touching the profile's zoo.

    Args:
        name: a profile of :data:`PROFILES`.
        settings: ``"FIELD=VALUE"`` strings (e.g. ``["lr=3e-5", "steps=160"]``); each value is
            converted by the field's current type (int, float, str), else read as YAML.

    Returns:
        With no settings, :func:`zoo_profile`'s pair. Otherwise the changed recipe and a sibling
        directory ``zoo-<field><value>-...`` of the profile's zoo, so the runs never mix.

    Raises:
        KeyError: unknown profile. ValueError: a setting is not ``FIELD=VALUE`` with FIELD a recipe
        field (names the setting and the known fields), or its value does not convert.
    """
    import yaml

    zoo_dir, recipe = zoo_profile(name)
    if not settings:
        return zoo_dir, recipe
    known = {f.name for f in fields(recipe)}
    changes = {}
    for item in settings:
        field_name, sep, value = item.partition("=")
        if not sep or field_name not in known:
            raise ValueError(f"recipe setting {item!r}: expected FIELD=VALUE with FIELD one of {sorted(known)}")
        current = getattr(recipe, field_name)  # YAML reads "3e-5" as a string: convert by the field's type
        try:
            changes[field_name] = (type(current)(value) if isinstance(current, (int, float, str))
                                   else yaml.safe_load(value))
        except ValueError as e:
            raise ValueError(f"recipe setting {item!r}: {value!r} is not of type {type(current).__name__}") from e
    recipe = replace(recipe, **changes)  # Recipe.__post_init__ checks the combination
    return zoo_dir.with_name("zoo-" + "-".join(f"{k}{v}" for k, v in changes.items())), recipe


def suite_subset(suite: str, n_tasks: int = 0) -> list[str]:
    """The first ``n_tasks`` tasks of ``suite`` (all of them for 0).

    Raises:
        ValueError: ``n_tasks`` outside [0, suite size].
    """
    from ...data import suite_tasks

    tasks = list(suite_tasks(suite))
    if n_tasks < 0 or n_tasks > len(tasks):
        raise ValueError(f"n_tasks must be in [0, {len(tasks)}] for suite {suite!r}, got {n_tasks}")
    return tasks[: n_tasks or None]


@dataclass
class Lite0Testbed:
    """One slice of the Lite0 zoo ready for merging experiments (a :class:`~pactlib.testbeds.base.Testbed`).

    Attributes beyond the protocol:
        suite: the suite (``"8"``, ``"14"``, ``"20"``).
        heads: ``{task: Head}``, each task's frozen head.
        val, test: ``{task: TaskData}`` (capped); ``resolution``: input side in pixels.
        zoo: the loaded :class:`~pactlib.testbeds.lite0.zoo.Zoo`.
    """

    name: str
    suite: str
    seed: int
    kind: str
    tasks: list[str]
    pretrained: dict[str, Tensor]
    finetuned: dict[str, dict[str, Tensor]]
    heads: dict
    val: dict
    test: dict
    ft_val: dict[str, float]
    ft_test: dict[str, float]
    zs_test: dict[str, float]
    resolution: int = 32
    val_limit: int | None = None
    test_limit: int | None = None
    zoo: object = field(default=None, repr=False)
    cache_dir: Path | None = None
    family: str = FAMILY
    rule: MatrixRule = DEFAULT_RULE

    @classmethod
    def from_zoo(cls, name: str, suite: str, seed: int = 0, kind: str = "full", *, zoo_dir=None, data_dir=None,
                 val_limit: int | None = 256, test_limit: int | None = None,
                 tasks: Sequence[str] | None = None) -> "Lite0Testbed":
        """Load a zoo slice and its evaluation data; measure acc_ft and zero-shot on the capped splits
        (memoised in ``<zoo>/eval_memo.json``).

        Raises:
            FileNotFoundError: the zoo slice is not built (the message says how to build it).
        """
        from ... import eval as ev
        from ...data import load_task
        from .zoo import default_zoo_dir, load_zoo

        zoo = load_zoo(list(tasks) if tasks else str(suite), seed=seed, kind=kind, zoo_dir=zoo_dir)
        names = list(zoo.tasks)
        recipe = zoo.records[names[0]].get("recipe", {})
        data_seed, res = recipe.get("data_seed", 0), recipe.get("resolution", 32)
        val = {t: load_task(t, "val", cache_dir=data_dir, seed=data_seed, limit=val_limit) for t in names}
        test = {t: load_task(t, "test", cache_dir=data_dir, seed=data_seed, limit=test_limit) for t in names}
        zoo_dir = Path(zoo_dir) if zoo_dir is not None else default_zoo_dir()
        memo = _AccuracyMemo(zoo_dir / "eval_memo.json")

        def scored(which: str, t: str, split: dict, limit) -> tuple[float, str]:
            state = zoo.pretrained if which == "zero-shot" else zoo.finetuned[t]
            ident = "zero-shot" if which == "zero-shot" else zoo.records[t].get("sha256", "")
            key = f"{ident}|{zoo.records[t].get('head_sha256', t)}|{t}|{split[t].split}|{limit}|{data_seed}|{res}"

            def compute():
                s = ev.evaluate(state, {t: zoo.heads[t]}, {t: split[t]}, resolution=res)
                return s[t], pack(s.outcomes[t])
            return memo.scored(key, compute)

        ft_val, ft_test, zs_test = Scores(), Scores(), Scores()
        for t in names:
            ft_val.add(t, *scored("finetuned", t, val, val_limit))
            ft_test.add(t, *scored("finetuned", t, test, test_limit))
            zs_test.add(t, *scored("zero-shot", t, test, test_limit))
        memo.save()
        return cls(name, str(suite), seed, kind, names, zoo.pretrained, zoo.finetuned, zoo.heads, val, test,
                   ft_val, ft_test, zs_test, res, val_limit, test_limit, zoo, zoo_dir)

    # ---------------------------------------------------------------------------- the protocol
    def task_vectors(self) -> list[TaskVector]:
        """Δt per task in suite order (LoRA: exactly scale·B·A on the adapted layers)."""
        return [TaskVector(d, name=t) for t, d in self.zoo.task_vectors().items()]

    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """{task: accuracy} of one backbone state dict on the (capped) ``split``."""
        from ... import eval as ev

        datas = self.val if split == "val" else self.test
        return ev.evaluate(state, self.heads, {t: datas[t] for t in (tasks or self.tasks)}, resolution=self.resolution)

    def loss_model(self, state: Mapping[str, Tensor], task: str) -> nn.Module:
        """Backbone (weights ``state``) + ``task``'s frozen head: (N, 3, R, R) -> logits (N, C)."""
        from ...models.efficientnet import load_backbone

        h = self.heads[task]
        return with_frozen_head(load_backbone(self.resolution, dict(state)), h.weight, h.bias,
                                normalize=bool(getattr(h, "normalize", False)))

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Preprocessed inputs (N, 3, R, R) float32 and labels (N,) of a task split."""
        from ...models.efficientnet import preprocess

        d = (self.val if split == "val" else self.test)[task]
        n = len(d.labels) if limit is None else min(limit, len(d.labels))
        return preprocess(d.images[:n], self.resolution), d.labels[:n]

    def fingerprint(self) -> dict | None:
        """The zoo runs' and heads' sha256, the caps, the resolution, the evaluated examples' sha256
        and the evaluator's code."""
        recs = getattr(self.zoo, "records", None) or {}
        ids = [(t, recs.get(t, {}).get("sha256"), recs.get(t, {}).get("head_sha256")) for t in self.tasks]
        if any(sha is None for _, sha, _ in ids):
            return None  # no checkpoint hashes: cannot tell this zoo from another one
        return dict(runs=ids, val_limit=self.val_limit, test_limit=self.test_limit, resolution=self.resolution,
                    data=self._data_sha256(), eval_code=code_fingerprint(EVAL_MODULES))

    def _data_sha256(self) -> str:
        """sha256 of the evaluated examples themselves (every task's capped val and test images
        and labels), so a change of the data code that changes no example keeps the memo."""
        import hashlib

        cache = self.__dict__.get("_data_hash")
        if cache is None:
            h = hashlib.sha256()
            for t in self.tasks:
                for d in (self.val[t], self.test[t]):
                    h.update(t.encode() + d.images.contiguous().numpy().tobytes() + d.labels.numpy().tobytes())
            cache = self.__dict__["_data_hash"] = h.hexdigest()
        return cache

    # -------------------------------------------------------------------- family-specific
    def matrix_keys(self) -> list[str]:
        """θ0's keys the rule treats as maps (Lite0: the 32 pointwise convolutions)."""
        return self.rule.matrix_keys(self.pretrained)


_AccuracyMemo = AccuracyMemo  # moved to pactlib.testbeds.zoo_files (shared with the MiniLM testbed)


def parse_name(name: str) -> tuple[str, int]:
    """``"lite0-8"`` -> (``"8"``, 0); ``"lite0-20:4"`` -> (``"20"``, 4) (the first 4 tasks).

    Raises:
        KeyError: not a Lite0 name (lists the suites).
    """
    from ...data import SUITES

    rest = name[len(FAMILY) + 1:] if name.startswith(FAMILY + "-") else ""
    suite, _, n = rest.partition(":")
    if suite not in SUITES or (n and not n.isdigit()):
        raise KeyError(f"unknown testbed {name!r}; Lite0 testbeds are "
                       f"{', '.join(f'{FAMILY}-{s}' for s in SUITES)} (optionally ':<n>' for the first n tasks)")
    return suite, int(n or 0)


def load(name: str, seed: int = 0, kind: str = "full", *, profile: str = "default", settings: Sequence[str] = (),
         build: bool = True, progress: bool = False, val_limit: int | None = 256, test_limit: int | None = None,
         data_dir=None) -> Lite0Testbed:
    """Load the Lite0 testbed ``name`` (``lite0-8``, ``lite0-14``, ``lite0-20``, ``lite0-<suite>:<n>``).

    Args:
        seed, kind: fine-tuning seed and ``"full"``/``"lora"``.
        profile: a zoo profile of :data:`PROFILES`; ``settings``: recipe changes
            (``"FIELD=VALUE"``, :func:`recipe_variant`; the slice then lives in that variant's zoo).
        build: build what is missing of the zoo slice first (a no-op when ``make zoo`` ran).
        val_limit, test_limit: caps on examples per task (None: the whole split).

    Raises:
        KeyError: unknown name or profile. FileNotFoundError: the slice is missing and ``build`` is False.
    """
    from .zoo import build_zoo

    suite, n_tasks = parse_name(name)
    zoo_dir, recipe = recipe_variant(profile, settings)
    tasks = suite_subset(suite, n_tasks)
    if build:
        build_zoo(tasks, [seed], kind=[kind], zoo_dir=zoo_dir, recipe=recipe, progress=progress)
    return Lite0Testbed.from_zoo(name, suite, seed, kind, zoo_dir=zoo_dir, tasks=tasks, val_limit=val_limit,
                                 test_limit=test_limit, data_dir=data_dir)


def in_book_zoo(task: str, seed: int, kind: str, plan=BOOK_ZOO) -> bool:
    """Whether ``make zoo`` builds this run (``plan``: :data:`BOOK_ZOO`). Benchmarks may add runs
    to the same zoo; chapters that list the zoo's runs keep to the planned ones, so the book reads
    the same on a fresh clone."""
    from ...data import suite_tasks

    return any(task in suite_tasks(suite) and int(seed) in seeds and kind in kinds for suite, seeds, kinds in plan)


def build_book_zoo(profile: str = "default", plan=BOOK_ZOO, progress: bool = True) -> list[dict]:
    """Build (or complete; finished runs are kept) every zoo run the book's chapters use."""
    from .zoo import build_zoo

    zoo_dir, recipe = zoo_profile(profile)
    out = []
    for suite, seeds, kinds in plan:
        out += build_zoo(suite, seeds, kind=kinds, zoo_dir=zoo_dir, recipe=recipe, progress=progress)
    return out


if __name__ == "__main__":  # python -m pactlib.testbeds.lite0.testbed [profile]: the zoo `make zoo` builds
    import sys

    recs = build_book_zoo(sys.argv[1] if len(sys.argv) > 1 else "default")
    print(f"zoo ready: {len(recs)} runs")
