"""The experiment glue of the book: one loaded testbed (zoo slice + evaluation data) and the
merge → select-α → test loop that every results chapter runs.

    tb = Testbed.load("8", seed=0)                 # θ0, heads, θt, val/test data, acc_ft
    rec = tb.run("iso_c", pact="pact", alphas=grid("iso_c", 8))
    rec["metrics"]["norm_acc"]                     # test mean normalized accuracy at the chosen α

Every number a chapter shows is a record returned here (method, params, seed, metrics), written
with :func:`pactlib.book.records.write_records`. Book: chapters 2 and 5–11.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from pactlib import eval as ev
from pactlib import merges
from pactlib.api import merged_update
from pactlib.matrix import DEFAULT_RULE
from pactlib.pact import PactOptions
from pactlib.taskvector import TaskVector

#: Rounds of coarse-to-fine α refinement in :meth:`Testbed.run` (``pactlib.eval.select_alpha``'s
#: ``refine``). 0, by measurement (``bench/bench_alpha_search.py``, 14 merges, seed 0, chapter 5
#: "How α is searched"): refining a 4-point grid twice reaches a higher validation score than
#: the 5-point grid, but not a higher test score (both within ±0.6 points of the full 0.05 /
#: 0.1-step grid on average), and it costs 9 evaluations per merge instead of 5.6.
REFINE = 0

#: Spacing of the ``points``-value α grids of :func:`grid` (chapters' ``alpha_points``).
#: "geometric", by measurement on the book's recipe (lr 3e-5). With many tasks Task Arithmetic's
#: best α is about 0.1, between the 5 linear points' 0.05 and 0.29. TA's mean normalized test
#: accuracy minus the full grid's, suites 8 / 14 / 20 (chapter 2): linear −0.62 points (seed 0,
#: 3 merges), geometric +0.08 (3 seeds, 9 merges). Over every method ± PACT
#: (``bench/bench_alpha_search.py``, 14 merges, chapter 5) the two are alike (mean |difference|
#: from the full grid 0.60 geometric, 0.67 linear). On the first recipe (lr 1e-4) linear had been
#: slightly closer (0.58 vs 0.87; ``book/data/alpha_search_lr1e-4.jsonl``).
GRID_SPACING = "geometric"


def grid(method: str, points: int | None = None, *, lo: float | None = None, hi: float | None = None,
         spacing: str | None = None) -> tuple[float, ...]:
    """α grid of ``method`` (method.md §5), or ``points`` values over its range.

    ``lo``/``hi`` replace the range ends (e.g. 0.1…3.0 for every LoRA merge, method.md §5).
    ``spacing``: ``"linear"`` (evenly spaced) or ``"geometric"`` (a constant ratio between
    neighbours); None means :data:`GRID_SPACING`. Values are rounded to 4 decimals.

    Raises:
        ValueError: ``points`` < 1, or an unknown ``spacing``.
    """
    spacing = GRID_SPACING if spacing is None else spacing
    if spacing not in ("linear", "geometric"):
        raise ValueError(f"grid spacing must be 'linear' or 'geometric', got {spacing!r}")
    full = merges.get(method).alphas
    if lo is not None or hi is not None:
        lo, hi = lo if lo is not None else full[0], hi if hi is not None else full[-1]
        full = tuple(round(float(a), 4) for a in np.linspace(lo, hi, max(2, int(round((hi - lo) / 0.1)) + 1)))
    if points is None or points >= len(full):
        return full
    if points < 1:
        raise ValueError(f"alpha points must be >= 1, got {points}")
    space = np.geomspace if spacing == "geometric" and full[0] > 0 else np.linspace
    return tuple(round(float(a), 4) for a in space(full[0], full[-1], points))


@dataclass
class Testbed:
    """One slice of the zoo ready for merging experiments.

    Attributes:
        suite, seed, kind: which zoo slice (kind ``"full"`` or ``"lora"``).
        tasks: task names in suite order.
        pretrained: θ0 backbone state dict; ``finetuned``: {task: θt}; ``heads``: {task: Head}.
        val, test: {task: TaskData}; ``val_limit``/``test_limit``: the caps applied.
        ft_val, ft_test, zs_test: accuracies of θt / θ0 on exactly those (capped) splits.
    """

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
    zoo_dir: object = field(default=None, repr=False)

    @classmethod
    def load(cls, suite: str, seed: int = 0, kind: str = "full", *, zoo_dir=None, data_dir=None,
             val_limit: int | None = 256, test_limit: int | None = None, tasks: Sequence[str] | None = None) -> "Testbed":
        """Load a zoo slice and its evaluation data; measure acc_ft and zero-shot on the capped splits.

        Raises:
            FileNotFoundError: the zoo slice is not built (the message says how to build it).
        """
        from pactlib.data import load_task
        from pactlib.testbeds.lite0.zoo import load_zoo

        zoo = load_zoo(list(tasks) if tasks else str(suite), seed=seed, kind=kind, zoo_dir=zoo_dir)
        names = list(zoo.tasks)
        data_seed = zoo.records[names[0]].get("recipe", {}).get("data_seed", 0)
        res = zoo.records[names[0]].get("recipe", {}).get("resolution", 32)
        val = {t: load_task(t, "val", cache_dir=data_dir, seed=data_seed, limit=val_limit) for t in names}
        test = {t: load_task(t, "test", cache_dir=data_dir, seed=data_seed, limit=test_limit) for t in names}
        memo = _AccuracyMemo(zoo_dir)

        def acc(which: str, t: str, split: dict, limit) -> float:
            state = zoo.pretrained if which == "zero-shot" else zoo.finetuned[t]
            ident = "zero-shot" if which == "zero-shot" else zoo.records[t].get("sha256", "")
            key = f"{ident}|{zoo.records[t].get('head_sha256', t)}|{t}|{split[t].split}|{limit}|{data_seed}|{res}"
            return memo.get(key, lambda: ev.accuracy(state, zoo.heads[t], split[t], resolution=res))

        ft_val = {t: acc("finetuned", t, val, val_limit) for t in names}
        ft_test = {t: acc("finetuned", t, test, test_limit) for t in names}
        zs_test = {t: acc("zero-shot", t, test, test_limit) for t in names}
        memo.save()
        return cls(str(suite), seed, kind, names, zoo.pretrained, zoo.finetuned, zoo.heads, val, test,
                   ft_val, ft_test, zs_test, res, val_limit, test_limit, zoo, zoo_dir)

    def task_vectors(self) -> list[TaskVector]:
        """Δt per task in suite order (LoRA: exactly scale·B·A on the adapted layers); computed once."""
        cache = self.__dict__.setdefault("_tvs", None)
        if cache is None:
            cache = self.__dict__["_tvs"] = [TaskVector(d, name=t) for t, d in self.zoo.task_vectors().items()]
        return list(cache)

    def evaluate(self, state: dict[str, Tensor], split: str = "test", tasks: Sequence[str] | None = None) -> dict[str, float]:
        """{task: accuracy} of one backbone state dict on the (capped) ``split``."""
        datas = self.val if split == "val" else self.test
        datas = {t: datas[t] for t in (tasks or self.tasks)}
        return ev.evaluate(state, self.heads, datas, resolution=self.resolution)

    def run(self, method: str, *, pact: str | None = None, options: PactOptions | None = None,
            alphas: Sequence[float] | None = None, label: str | None = None,
            task_vectors: Sequence[TaskVector] | None = None, widen: int = 3, refine: int = REFINE,
            memo: bool = True, **params) -> dict:
        """Merge (optionally PACT/S-PACT-filtered), choose α on validation, test: one record.

        ``widen``: when the best α sits on an edge of the grid, up to this many more α values are
        tried beyond it (×1.5 each; method.md §5 "wider if the best α sits on the edge"); the
        record lists them in ``widened``. ``refine``: rounds of coarse-to-fine search around the best
        α (:func:`pactlib.eval.select_alpha`; the default :data:`REFINE` was chosen by
        ``bench/bench_alpha_search.py``); the record lists the added α in ``refined``.

        ``memo``: records are kept in ``<zoo>/run_memo/<key>.json`` (written atomically) and reused
        when the same merge is asked again — by another chapter, or after an interruption. The key
        holds every input: the zoo runs' and heads' sha256, suite, seed, kind, method, PACT mode
        and options, α grid, ``widen``, ``refine``, caps, label, merge parameters and a hash of pactlib's
        source. Explicit ``task_vectors`` other than this testbed's own are never memoised.

        The record (see :func:`pactlib.eval.select_alpha`) carries ``suite``, ``kind``, ``base``
        (method), ``pact`` (mode or None), the PACT options, the cap-binding rate and the time.
        """
        import time

        t0 = time.perf_counter()
        opts = (options or PactOptions()) if pact else None
        alphas = tuple(alphas or grid(method))
        own = task_vectors is None or (
            len(task_vectors) == len(self.tasks) and all(a is b for a, b in zip(task_vectors, self.task_vectors())))
        key = self._run_key(method, pact, opts, alphas, label, widen, refine, params) if memo and own else None
        if key is not None:
            hit = self._memo_read(key)
            if hit is not None:
                return hit
        if task_vectors is None and pact:  # the filter does not depend on the base method: reuse it
            tvs, report = self.filtered(pact, opts)
            D, _ = merged_update(method, self.pretrained, tvs, rule=DEFAULT_RULE, **params)
        else:
            tvs = list(task_vectors) if task_vectors is not None else self.task_vectors()
            D, report = merged_update(method, self.pretrained, tvs, pact=pact, options=options, rule=DEFAULT_RULE,
                                      **params)
        t_merge = time.perf_counter() - t0
        name = label or (f"{pact}-{method}" if pact else method)
        rec = ev.select_alpha(
            lambda a: D.apply_to(self.pretrained, a), alphas, heads=self.heads, val=self.val,
            test=self.test, ft_val=self.ft_val, ft_test=self.ft_test, method=name, widen=widen, refine=refine,
            params={**params, **({k: v for k, v in vars(opts).items()} if opts else {})}, seed=self.seed,
            resolution=self.resolution, suite=self.suite, kind=self.kind, base=method, pact=pact,
            cap_binding_rate=report.cap_binding_rate() if report else None, merge_seconds=t_merge,
            removed_energy=(float(np.nanmean([e for lr in report.layers for e in lr.removed_energy]))
                            if report and report.layers else None),
            seconds=None)
        rec["seconds"] = time.perf_counter() - t0
        if key is not None:
            self._memo_write(key, rec)
        return rec

    def _memo_dir(self):
        from pathlib import Path

        from pactlib.testbeds.lite0.zoo import default_zoo_dir

        return (Path(self.zoo_dir) if self.zoo_dir is not None else default_zoo_dir()) / "run_memo"

    def _run_key(self, method, pact, opts, alphas, label, widen, refine, params) -> str | None:
        import hashlib
        import json

        recs = getattr(self.zoo, "records", None) or {}
        ids = [(t, recs.get(t, {}).get("sha256"), recs.get(t, {}).get("head_sha256")) for t in self.tasks]
        if any(sha is None for _, sha, _ in ids):
            return None  # no checkpoint hashes: cannot tell this zoo from another one
        payload = dict(code=_source_hash(), tasks=ids, suite=self.suite, seed=self.seed, kind=self.kind,
                       method=method, pact=pact, options=vars(opts) if opts else None,
                       alphas=[float(a) for a in alphas], label=label, widen=widen, refine=refine, params=params,
                       val_limit=self.val_limit, test_limit=self.test_limit, resolution=self.resolution)
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()[:40]

    def _memo_read(self, key: str) -> dict | None:
        import json

        try:
            rec = json.loads((self._memo_dir() / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and "metrics" in rec else None

    def _memo_write(self, key: str, rec: dict) -> None:
        import json

        from pactlib.io import atomic_write

        path = self._memo_dir() / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(rec, default=float)
        atomic_write(path, lambda tmp: tmp.write_text(text))

    def reference_records(self, *, params=None, per_task: bool = False, **fields) -> list[dict]:
        """The two reference rows of a results table, as records on this testbed's test split:
        ``"zero-shot"`` (θ0 with each task's head) and ``"fine-tuned"`` (each task's own θt).

        Metrics: ``acc`` (mean test accuracy over the tasks) and ``norm_acc`` (mean of acc/acc_ft;
        1 for the fine-tuned row by definition, method.md §5); ``per_task`` adds
        ``norm_acc:<task>``. Each record has ``seed``, ``suite``, ``base`` (= its method) and the
        extra ``fields``; ``params`` defaults to ``{}``.
        """
        from pactlib.book.records import make_record

        out = []
        for name, accs in (("zero-shot", self.zs_test), ("fine-tuned", self.ft_test)):
            norm = {t: 1.0 if name == "fine-tuned" else accs[t] / self.ft_test[t] for t in self.tasks}
            metrics = {"acc": sum(accs[t] for t in self.tasks) / len(self.tasks),
                       "norm_acc": sum(norm.values()) / len(self.tasks)}
            if per_task:
                metrics.update({f"norm_acc:{t}": v for t, v in norm.items()})
            out.append(make_record(name, params=dict(params or {}), seed=self.seed,
                                   metrics=metrics, **{"suite": self.suite, "base": name, **fields}))
        return out

    def filtered(self, mode: str, options: PactOptions | None = None):
        """(filtered task vectors, PactReport) for ``mode``/``options``, computed once per testbed."""
        from pactlib.pact import pact_filter

        options = options or PactOptions()
        cache = self.__dict__.setdefault("_filtered", {})
        key = (mode, options)
        if key not in cache:
            cache[key] = pact_filter(self.pretrained, self.task_vectors(), mode=mode, options=options)
        return cache[key]

    def classifier(self, state: dict[str, Tensor], task: str) -> nn.Module:
        """A differentiable backbone + frozen head for ``task`` (for Fisher and gradients)."""
        from pactlib.models.efficientnet import load_backbone

        return Classifier(load_backbone(self.resolution, dict(state)), self.heads[task])

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Preprocessed inputs (N, 3, R, R) and labels (N,) of a task split."""
        from pactlib.models.efficientnet import preprocess

        d = (self.val if split == "val" else self.test)[task]
        n = len(d.labels) if limit is None else min(limit, len(d.labels))
        return preprocess(d.images[:n], self.resolution), d.labels[:n]


_SOURCE_HASH: str | None = None


def _source_hash() -> str:
    """sha256 of every ``pactlib/**/*.py`` file's bytes (in path order), computed once per process."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        import hashlib
        from pathlib import Path

        h = hashlib.sha256()
        root = Path(__file__).resolve().parent
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
        _SOURCE_HASH = h.hexdigest()
    return _SOURCE_HASH


class _AccuracyMemo:
    """Accuracies of fixed checkpoints on fixed splits, memoised in ``<zoo>/eval_memo.json`` (keys
    hold the checkpoint's and head's sha256, the split, its cap, the data seed and resolution)."""

    def __init__(self, zoo_dir):
        import json
        from pathlib import Path

        from pactlib.testbeds.lite0.zoo import default_zoo_dir

        self.path = Path(zoo_dir) / "eval_memo.json" if zoo_dir is not None else default_zoo_dir() / "eval_memo.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def get(self, key: str, compute) -> float:
        if key not in self.data:
            self.data[key], self.dirty = float(compute()), True
        return self.data[key]

    def save(self) -> None:
        import json

        from pactlib.io import atomic_write

        if self.dirty:
            text = json.dumps(self.data, indent=0, sort_keys=True)
            atomic_write(self.path, lambda p: p.write_text(text))


class Classifier(nn.Module):
    """backbone (N, 3, R, R) -> (N, 1280) followed by a frozen linear head -> logits (N, C).

    Parameter names are the backbone's keys prefixed with ``net.``; :func:`unprefix` maps them back
    to task-vector keys."""

    def __init__(self, backbone: nn.Module, head):
        super().__init__()
        self.net = backbone
        self.register_buffer("head_w", head.weight.clone())
        self.register_buffer("head_b", head.bias.clone())
        self.normalize = bool(getattr(head, "normalize", False))

    def forward(self, x: Tensor) -> Tensor:
        f = self.net(x)
        if self.normalize:
            f = nn.functional.normalize(f, dim=1)
        return nn.functional.linear(f, self.head_w, self.head_b)


def unprefix(d: dict, prefix: str = "net.") -> dict:
    """{``net.key``: v} -> {``key``: v}."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in d.items()}


def depth_groups(keys: Sequence[str], parts: Sequence[str] = ("early", "middle", "late")) -> dict[str, list[str]]:
    """Split matrix-layer keys, in network order, into contiguous depth groups of (nearly) equal
    size, plus ``"all"`` (claim C9)."""
    keys = list(keys)
    out = {p: list(chunk) for p, chunk in zip(parts, np.array_split(np.array(keys, dtype=object), len(parts)))}
    out["all"] = keys
    return out


#: Zoo profiles a notebook can name: where the zoo lives (under ``$PACT_CACHE``) and its recipe
#: overrides. ``default`` is what ``make zoo`` builds; ``smoke`` is a seconds-sized zoo for tests.
#: The default recipe is written out here (not left to ``Recipe``'s defaults) so the book's zoo is
#: pinned: cosine prototype heads, 80 AdamW steps of batch 64 at 32 px, lr 3e-5 (full) / 1e-3 (LoRA rank 8,
#: alpha 16). Why these and not a trained probe head or lr 1e-4: :class:`pactlib.testbeds.lite0.zoo.Recipe` and the testbed chapter.
PROFILES: dict[str, dict] = {
    "default": dict(dir="zoo", recipe=dict(resolution=32, steps=80, batch_size=64, optimizer="adamw", lr=3e-5,
                                           lora_lr=1e-3, weight_decay=0.0, warmup=8, lora_rank=8, lora_alpha=16.0,
                                           augment="none", head="prototype", head_l2=1e-2, head_max_iter=300,
                                           data_seed=0)),
    "smoke": dict(dir="zoo-smoke", recipe=dict(steps=3, warmup=1, train_limit=96, eval_limit=48, head_max_iter=15)),
}


def zoo_profile(name: str):
    """(zoo directory, :class:`pactlib.testbeds.lite0.zoo.Recipe`) of a profile.

    Raises:
        KeyError: unknown profile (lists the known ones).
    """
    import os
    from pathlib import Path

    from pactlib.testbeds.lite0.zoo import Recipe, default_zoo_dir

    if name not in PROFILES:
        raise KeyError(f"unknown zoo profile {name!r}; known: {', '.join(PROFILES)}")
    p = PROFILES[name]
    root = Path(os.environ["PACT_CACHE"]) if os.environ.get("PACT_CACHE") else default_zoo_dir().parent
    return root / p["dir"], Recipe(**p["recipe"])


def recipe_variant(name: str, settings: Sequence[str]):
    """(zoo directory, :class:`pactlib.testbeds.lite0.zoo.Recipe`) of profile ``name`` with some recipe fields
    changed, for benches that try another recipe without touching the profile's zoo.

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
    from dataclasses import fields, replace

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
    """The first ``n_tasks`` tasks of ``suite`` (all of them for 0)."""
    from pactlib.data import suite_tasks

    tasks = list(suite_tasks(suite))
    if n_tasks < 0 or n_tasks > len(tasks):
        raise ValueError(f"n_tasks must be in [0, {len(tasks)}] for suite {suite!r}, got {n_tasks}")
    return tasks[: n_tasks or None]


def ensure_testbed(profile: str, suite: str, seed: int = 0, kind: str = "full", *, n_tasks: int = 0,
                   progress: bool = False, settings: Sequence[str] = (), **load_kw) -> Testbed:
    """Build what is missing of the zoo slice (a no-op when ``make zoo`` ran), then load it.

    ``settings``: recipe changes (``"FIELD=VALUE"``, :func:`recipe_variant`); the slice then
    lives in that variant's own zoo."""
    from pactlib.testbeds.lite0.zoo import build_zoo

    zoo_dir, recipe = recipe_variant(profile, settings)
    tasks = suite_subset(suite, n_tasks)
    build_zoo(tasks, [seed], kind=[kind], zoo_dir=zoo_dir, recipe=recipe, progress=progress)
    return Testbed.load(str(suite), seed, kind, zoo_dir=zoo_dir, tasks=tasks, **load_kw)


def summarize(records, by: Sequence[str] = ("method", "suite"), metrics: Sequence[str] = ("acc", "norm_acc")):
    """Mean, standard deviation and seed count of test metrics over seeds, grouped by ``by``.

    Accepts records or a frame from :func:`pactlib.book.records.records_frame`. Columns:
    ``<metric>_mean``, ``<metric>_std``, ``n_seeds`` (percentages are left to the caller)."""
    import pandas as pd

    from pactlib.book.records import records_frame

    frame = records if isinstance(records, pd.DataFrame) else records_frame(list(records))
    cols = {f"metrics.{m}": m for m in metrics}
    g = frame.groupby(list(by), sort=False)
    out = pd.DataFrame({f"{m}_mean": g[c].mean() for c, m in cols.items()})
    for c, m in cols.items():
        out[f"{m}_std"] = g[c].std(ddof=1).fillna(0.0)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index()


def paired_gain(records, base: str, treated: str, metric: str = "norm_acc", by: Sequence[str] = ("suite",)):
    """Per seed (and ``by`` group) gain ``treated − base`` of a test metric; mean, std, n and the
    number of seeds where the gain is positive."""
    import pandas as pd

    from pactlib.book.records import records_frame

    frame = records if isinstance(records, pd.DataFrame) else records_frame(list(records))
    col = f"metrics.{metric}"
    keys = list(by) + ["seed"]
    a = frame[frame["method"] == base].set_index(keys)[col]
    b = frame[frame["method"] == treated].set_index(keys)[col]
    d = (b - a).dropna().reset_index()
    g = d.groupby(list(by), sort=False)[col]
    return pd.DataFrame({"gain_mean": g.mean(), "gain_std": g.std(ddof=1).fillna(0.0), "n_seeds": g.size(),
                         "n_positive": g.apply(lambda s: int((s > 0).sum()))}).reset_index()


#: What the default book needs: (suite, seeds, kinds). Nested suites share runs: the 20-task
#: build reuses the 8-task suite's seed-0 full fine-tunes.
BOOK_ZOO = (("8", (0,), ("full", "lora")), ("20", (0,), ("full",)), ("8", (1, 2), ("full", "lora")))


def in_book_zoo(task: str, seed: int, kind: str, plan=BOOK_ZOO) -> bool:
    """Whether ``make zoo`` builds this run (``plan``: :data:`BOOK_ZOO`). Benchmarks may add runs
    to the same zoo (e.g. ``bench/bench_interference.py``: the 20-task suite on seeds 1 and 2);
    chapters that list the zoo's runs keep to the planned ones, so the book reads the same on a
    fresh clone."""
    from pactlib.data import suite_tasks

    return any(task in suite_tasks(suite) and int(seed) in seeds and kind in kinds for suite, seeds, kinds in plan)


def build_book_zoo(profile: str = "default", plan=BOOK_ZOO, progress: bool = True) -> list[dict]:
    """Build (or complete; finished runs are kept) every zoo run the book's chapters use."""
    from pactlib.testbeds.lite0.zoo import build_zoo

    zoo_dir, recipe = zoo_profile(profile)
    out = []
    for suite, seeds, kinds in plan:
        out += build_zoo(suite, seeds, kind=kinds, zoo_dir=zoo_dir, recipe=recipe, progress=progress)
    return out


if __name__ == "__main__":  # python -m pactlib.book.study [profile]: the zoo `make zoo` builds
    import sys

    recs = build_book_zoo(sys.argv[1] if len(sys.argv) > 1 else "default")
    print(f"zoo ready: {len(recs)} runs")
