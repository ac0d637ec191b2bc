"""The experiment glue of the book: one loaded testbed (zoo slice + evaluation data) and the
merge → select-α → test loop that every results chapter runs.

    tb = Testbed.load("8", seed=0)                 # θ0, heads, θt, val/test data, acc_ft
    rec = tb.run("iso_c", pact="pact", alphas=grid("iso_c", 8))
    rec["metrics"]["norm_acc"]                     # test mean normalized accuracy at the chosen α

Every number a chapter shows is a record returned here (method, params, seed, metrics), written
with :func:`pactlib.records.write_records`. Book: chapters 2 and 5–11.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from . import eval as ev
from . import merges
from .api import merged_update
from .matrix import DEFAULT_RULE
from .pact import PactOptions
from .taskvector import TaskVector


def grid(method: str, points: int | None = None) -> tuple[float, ...]:
    """α grid of ``method`` (method.md §5), or ``points`` evenly spaced values over its range."""
    full = merges.get(method).alphas
    if points is None or points >= len(full):
        return full
    if points < 1:
        raise ValueError(f"alpha points must be >= 1, got {points}")
    return tuple(round(float(a), 4) for a in np.linspace(full[0], full[-1], points))


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

    @classmethod
    def load(cls, suite: str, seed: int = 0, kind: str = "full", *, zoo_dir=None, data_dir=None,
             val_limit: int | None = 256, test_limit: int | None = None, tasks: Sequence[str] | None = None) -> "Testbed":
        """Load a zoo slice and its evaluation data; measure acc_ft and zero-shot on the capped splits.

        Raises:
            FileNotFoundError: the zoo slice is not built (the message says how to build it).
        """
        from .data import load_task
        from .zoo import load_zoo

        zoo = load_zoo(tasks or suite, seed=seed, kind=kind, zoo_dir=zoo_dir)
        names = list(zoo.tasks)
        data_seed = zoo.records[names[0]].get("recipe", {}).get("data_seed", 0)
        res = zoo.records[names[0]].get("recipe", {}).get("resolution", 32)
        val = {t: load_task(t, "val", cache_dir=data_dir, seed=data_seed, limit=val_limit) for t in names}
        test = {t: load_task(t, "test", cache_dir=data_dir, seed=data_seed, limit=test_limit) for t in names}
        ft_val = {t: ev.accuracy(zoo.finetuned[t], zoo.heads[t], val[t], resolution=res) for t in names}
        ft_test = {t: ev.accuracy(zoo.finetuned[t], zoo.heads[t], test[t], resolution=res) for t in names}
        zs_test = ev.evaluate(zoo.pretrained, zoo.heads, test, resolution=res)
        return cls(str(suite), seed, kind, names, zoo.pretrained, zoo.finetuned, zoo.heads, val, test,
                   ft_val, ft_test, zs_test, res, val_limit, test_limit, zoo)

    def task_vectors(self) -> list[TaskVector]:
        """Δt per task in suite order (LoRA: exactly scale·B·A on the adapted layers)."""
        return [TaskVector(d, name=t) for t, d in self.zoo.task_vectors().items()]

    def evaluate(self, state: dict[str, Tensor], split: str = "test", tasks: Sequence[str] | None = None) -> dict[str, float]:
        """{task: accuracy} of one backbone state dict on the (capped) ``split``."""
        datas = self.val if split == "val" else self.test
        datas = {t: datas[t] for t in (tasks or self.tasks)}
        return ev.evaluate(state, self.heads, datas, resolution=self.resolution)

    def run(self, method: str, *, pact: str | None = None, options: PactOptions | None = None,
            alphas: Sequence[float] | None = None, label: str | None = None,
            task_vectors: Sequence[TaskVector] | None = None, **params) -> dict:
        """Merge (optionally PACT/S-PACT-filtered), choose α on validation, test: one record.

        The record (see :func:`pactlib.eval.select_alpha`) carries ``suite``, ``kind``, ``base``
        (method), ``pact`` (mode or None), the PACT options, the cap-binding rate and the time.
        """
        import time

        t0 = time.perf_counter()
        tvs = list(task_vectors) if task_vectors is not None else self.task_vectors()
        D, report = merged_update(method, self.pretrained, tvs, pact=pact, options=options, rule=DEFAULT_RULE, **params)
        t_merge = time.perf_counter() - t0
        opts = (options or PactOptions()) if pact else None
        name = label or (f"{pact}-{method}" if pact else method)
        rec = ev.select_alpha(
            lambda a: D.apply_to(self.pretrained, a), alphas or grid(method), heads=self.heads, val=self.val,
            test=self.test, ft_val=self.ft_val, ft_test=self.ft_test, method=name,
            params={**params, **({k: v for k, v in vars(opts).items()} if opts else {})}, seed=self.seed,
            resolution=self.resolution, suite=self.suite, kind=self.kind, base=method, pact=pact,
            cap_binding_rate=report.cap_binding_rate() if report else None, merge_seconds=t_merge,
            seconds=None)
        rec["seconds"] = time.perf_counter() - t0
        return rec

    def classifier(self, state: dict[str, Tensor], task: str) -> nn.Module:
        """A differentiable backbone + frozen head for ``task`` (for Fisher and gradients)."""
        from .models.efficientnet import load_backbone

        return Classifier(load_backbone(self.resolution, dict(state)), self.heads[task])

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Preprocessed inputs (N, 3, R, R) and labels (N,) of a task split."""
        from .models.efficientnet import preprocess

        d = (self.val if split == "val" else self.test)[task]
        n = len(d.labels) if limit is None else min(limit, len(d.labels))
        return preprocess(d.images[:n], self.resolution), d.labels[:n]


class Classifier(nn.Module):
    """backbone (N, 3, R, R) -> (N, 1280) followed by a frozen linear head -> logits (N, C).

    Parameter names are the backbone's keys prefixed with ``net.``; :func:`unprefix` maps them back
    to task-vector keys."""

    def __init__(self, backbone: nn.Module, head):
        super().__init__()
        self.net = backbone
        self.register_buffer("head_w", head.weight.clone())
        self.register_buffer("head_b", head.bias.clone())

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(self.net(x), self.head_w, self.head_b)


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
