"""The synthetic testbed: a seconds-sized stand-in for a real model family (smoke book, tests).

Registry names ``synthetic-<n>`` with 2 <= n <= 20 tasks (``synthetic`` alone is
``synthetic-4``); the n tasks are the first n of one fixed list of 20, so suites nest.

Everything is built in memory, on the CPU, deterministically:

- **Inputs.** x = tanh(z M) + noise in R^32 with a latent z ~ N(0, I_8): every task sees the
  same input distribution, which has 8-dimensional structure (:func:`sample_inputs`).
- **Network** (:class:`SynthNet`): four ``nn.Linear`` layers 32 -> 64 -> 64 -> 64 -> 64 with
  GELU between them and a final ``LayerNorm``: features (N, 64). Keys ``fc1.weight`` …
  ``fc4.weight`` are the maps of :data:`~pactlib.matrix.DEFAULT_RULE` (early ``fc1``/``fc2``,
  middle ``fc3``, late ``fc4``); the biases and the norm are its non-matrix keys.
- **θ0** is "pre-trained" from a random start on a generic 16-class problem that sees only the
  first 5 of the 8 latent directions (the class whose random direction is nearest), with its own
  head, which is then discarded: its features are useful for the tasks, but not complete.
- **Tasks.** Task t labels an input by the arg max over C_t ∈ {3, 4, 5, 6} classes of a
  task-specific mix of a linear and a periodic function of all of z (:func:`task_labels`), so
  each task needs features θ0 does not quite have, and different tasks pull the shared layers
  different ways (merging loses accuracy). Each task gets a frozen cosine head: the normalised class means
  of θ0's features on its training split (the analogue of CLIP's zero-shot head), so zero-shot
  accuracy is above chance and below fine-tuned.
- **Fine-tuning** (:data:`RECIPE`): Adam on the backbone with the task's head frozen; ``seed``
  drives the batch order (and the LoRA A init). ``kind="lora"`` trains rank-4 adapters on the
  four maps (:mod:`pactlib.lora`), so the task vectors are exactly scale·B·A there and zero
  elsewhere.
- **Matrix rule.** :data:`~pactlib.matrix.DEFAULT_RULE` unless the load option ``rule`` names
  another (:func:`matrix_rule`): e.g. ``rule={"not_matrix": ["^fc4\\."]}`` makes a testbed on
  which ``fc4.weight`` is not a map, so that a chapter that ignores ``tb.rule`` shows it
  (``tests/test_rule_threading.py`` runs chapters 4, 7, 8 and 10 on one). Fine-tuning and the
  LoRA adapters do not depend on it.

Built parts are memoised in-process (``functools.lru_cache`` on θ0, on each task's data and
head, and on each (task, seed, kind) fine-tune), so loading the same or a nested testbed again
costs only copies. ``cache_dir`` (a load option, default None) turns on the seam's on-disk memo
of :func:`pactlib.testbeds.base.run` results; nothing else touches the disk.

    tb = testbeds.load("synthetic-4", seed=0, kind="full")
"""
from __future__ import annotations

import functools
import hashlib
import math
import re
from numbers import Integral
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..lora import attach, init_adapters, lora_scale, lora_task_vector, merge_adapters, read_adapters
from ..matrix import DEFAULT_RULE, PRESETS, MatrixRule
from ..taskvector import TaskVector
from ..outcomes import Scores, scores
from ..threads import single_threaded
from .base import code_fingerprint, with_frozen_head

__all__ = ["FAMILY", "MAX_TASKS", "DEFAULT_TASKS", "Recipe", "RECIPE", "SynthNet", "SyntheticTestbed", "load",
           "parse_name", "task_names", "sample_inputs", "task_labels", "clear_cache", "matrix_rule", "check_options"]

FAMILY = "synthetic"
MAX_TASKS = 20
DEFAULT_TASKS = 4
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Recipe:
    """Every setting the synthetic testbed is built from (part of :meth:`SyntheticTestbed.fingerprint`).

    Data: ``latent``-dimensional z, inputs of ``d_in``, ``noise`` added; ``n_train``/``n_val``/
    ``n_test`` examples per task and split; ``data_seed`` fixes inputs, tasks and θ0.
    Network: ``width`` features, 4 linear layers. θ0: ``pre_classes``-way problem on the first
    ``pre_latent`` latent directions, ``pre_steps`` Adam steps at ``pre_lr``, batch 2·``batch``.
    Tasks: linear part plus ``task_amp``·sin(``task_freq``·…). Heads: cosine, logit scale
    ``head_scale``.
    Fine-tuning: ``steps`` Adam steps of ``batch`` at ``lr`` (full) or ``lora_lr`` (LoRA rank
    ``lora_rank``, alpha ``lora_alpha``).
    """

    data_seed: int = 0
    latent: int = 8
    d_in: int = 32
    width: int = 64
    noise: float = 0.1
    n_pretrain: int = 4096
    n_train: int = 1024
    n_val: int = 256
    n_test: int = 512
    pre_classes: int = 16
    pre_latent: int = 5
    pre_steps: int = 120
    pre_lr: float = 3e-3
    task_amp: float = 1.0
    task_freq: float = 0.5
    head_scale: float = 10.0
    steps: int = 60
    batch: int = 128
    lr: float = 3e-3
    lora_lr: float = 1e-2
    lora_rank: int = 4
    lora_alpha: float = 8.0


RECIPE = Recipe()


def parse_name(name: str) -> int:
    """``"synthetic-4"`` -> 4; ``"synthetic"`` -> :data:`DEFAULT_TASKS`.

    Raises:
        KeyError: not ``synthetic`` or ``synthetic-<n>`` with 2 <= n <= 20 (names the bad name).
    """
    if name == FAMILY:
        return DEFAULT_TASKS
    rest = name[len(FAMILY) + 1:] if name.startswith(FAMILY + "-") else ""
    if not rest.isdigit() or not 2 <= int(rest) <= MAX_TASKS:
        raise KeyError(f"unknown testbed {name!r}; synthetic testbeds are '{FAMILY}-<n>' with 2 <= n <= {MAX_TASKS} "
                       f"tasks (or '{FAMILY}' = '{FAMILY}-{DEFAULT_TASKS}')")
    return int(rest)


def task_names(n: int) -> list[str]:
    """The first ``n`` task names of the fixed list (``task01`` … ``task20``)."""
    return [f"task{i + 1:02d}" for i in range(n)]


def _gen(*parts: int) -> torch.Generator:
    """A generator seeded from integers (stable across runs and platforms)."""
    h = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))


# ------------------------------------------------------------------------------------- data

@functools.lru_cache(maxsize=None)
def _mixing(r: Recipe) -> Tensor:
    g = _gen(r.data_seed, 1)
    return torch.randn(r.latent, r.d_in, generator=g) * (1.5 / math.sqrt(r.latent))  # (latent, d_in)


def sample_inputs(r: Recipe, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """(z (n, latent), x (n, d_in)) float32: the shared input distribution x = tanh(z M) + noise."""
    z = torch.randn(n, r.latent, generator=g)
    x = torch.tanh(z @ _mixing(r)) + r.noise * torch.randn(n, r.d_in, generator=g)
    return z, x


def _task_def(r: Recipe, i: int) -> dict:
    g = _gen(r.data_seed, 2, i)
    c = 3 + i % 4
    return dict(classes=c, lin=torch.randn(r.latent, c, generator=g), per=torch.randn(r.latent, c, generator=g),
                phase=torch.rand(c, generator=g) * 2 * math.pi)


def task_labels(r: Recipe, i: int, z: Tensor) -> Tensor:
    """Labels (n,) int64 of task ``i`` (0-based): arg max_c of z·a_c + amp·sin(freq·z·b_c + φ_c)."""
    d = _task_def(r, i)
    score = z @ d["lin"] + r.task_amp * torch.sin(r.task_freq * (z @ d["per"]) + d["phase"])
    return score.argmax(1)


def _pretrain_labels(r: Recipe, z: Tensor) -> Tensor:
    G = torch.randn(r.pre_latent, r.pre_classes, generator=_gen(r.data_seed, 3))
    zp = z[:, :r.pre_latent]
    return (F.normalize(zp, dim=1) @ F.normalize(G, dim=0)).argmax(1)


# ---------------------------------------------------------------------------------- network

class SynthNet(nn.Module):
    """x (N, d_in) -> features (N, width): fc1 -> GELU -> fc2 -> GELU -> fc3 -> GELU -> fc4 -> LayerNorm."""

    def __init__(self, r: Recipe = RECIPE, device=None):
        super().__init__()
        self.fc1 = nn.Linear(r.d_in, r.width, device=device)
        self.fc2 = nn.Linear(r.width, r.width, device=device)
        self.fc3 = nn.Linear(r.width, r.width, device=device)
        self.fc4 = nn.Linear(r.width, r.width, device=device)
        self.norm = nn.LayerNorm(r.width, device=device)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.fc1(x))
        h = F.gelu(self.fc2(h))
        h = F.gelu(self.fc3(h))
        return self.norm(self.fc4(h))


def _net(r: Recipe, state: Mapping[str, Tensor]) -> SynthNet:
    """A :class:`SynthNet` holding float32 copies of ``state`` (built on the meta device, so the
    global random stream is not touched). Raises RuntimeError on missing, extra or misshapen keys."""
    net = SynthNet(r, device="meta")
    net.load_state_dict({k: v.detach().to(torch.float32, copy=True) for k, v in state.items()}, strict=True,
                        assign=True)
    return net.eval()


def _init_state(r: Recipe, g: torch.Generator) -> dict[str, Tensor]:
    """A random start (uniform ±1/sqrt(fan_in), as ``nn.Linear``), drawn from ``g`` only."""
    state = {}
    for name, (m, n) in (("fc1", (r.width, r.d_in)), ("fc2", (r.width, r.width)), ("fc3", (r.width, r.width)),
                         ("fc4", (r.width, r.width))):
        b = 1.0 / math.sqrt(n)
        state[f"{name}.weight"] = (torch.rand(m, n, generator=g) * 2 - 1) * b
        state[f"{name}.bias"] = (torch.rand(m, generator=g) * 2 - 1) * b
    state["norm.weight"], state["norm.bias"] = torch.ones(r.width), torch.zeros(r.width)
    return state


def _train(params: list[Tensor], loss_fn, x: Tensor, y: Tensor, steps: int, batch: int, lr: float,
           g: torch.Generator) -> None:
    """``steps`` Adam steps (``torch.optim.Adam``, default betas) on random batches drawn from ``g``."""
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (batch,), generator=g)
        opt.zero_grad(set_to_none=True)
        loss_fn(x[idx], y[idx]).backward()
        opt.step()


# ------------------------------------------------------------------------- memoised parts

def _one_thread(fn):
    """Run a training function with torch single-threaded (:func:`pactlib.threads.single_threaded`):
    SGD sums in a different order with another thread count, so θ0 and θt would differ in their
    last bits depending on the caller's thread count (a CLI ``--threads``, a notebook's kernel).
    One thread makes the testbed the same in every process."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with single_threaded():
            return fn(*args, **kwargs)
    return wrapper


@functools.lru_cache(maxsize=None)
@_one_thread
def _pretrained(r: Recipe) -> dict[str, Tensor]:
    """θ0: the network trained from a random start on the generic ``pre_classes``-way problem."""
    g = _gen(r.data_seed, 4)
    z, x = sample_inputs(r, r.n_pretrain, g)
    y = _pretrain_labels(r, z)
    net = _net(r, _init_state(r, g))
    head_w = (torch.randn(r.pre_classes, r.width, generator=g) * 0.1).requires_grad_(True)  # discarded after
    head_b = torch.zeros(r.pre_classes, requires_grad=True)
    with torch.enable_grad():
        _train(list(net.parameters()) + [head_w, head_b],
               lambda xb, yb: F.cross_entropy(F.linear(net(xb), head_w, head_b), yb), x, y, r.pre_steps,
               r.batch * 2, r.pre_lr, g)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@functools.lru_cache(maxsize=None)
def _task(r: Recipe, i: int) -> dict:
    """Task ``i``'s splits ``{split: (x, y)}`` and frozen cosine head (C, width) fitted on θ0's features."""
    data = {}
    for s, (k, n) in zip(SPLITS, ((5, r.n_train), (6, r.n_val), (7, r.n_test))):
        z, x = sample_inputs(r, n, _gen(r.data_seed, k, i))
        data[s] = (x, task_labels(r, i, z))
    x, y = data["train"]
    c = _task_def(r, i)["classes"]
    with torch.no_grad():
        f = F.normalize(_net(r, _pretrained(r))(x), dim=1)
    protos = torch.stack([f[y == k].mean(0) if bool((y == k).any()) else torch.zeros(r.width) for k in range(c)])
    return dict(data=data, head=F.normalize(protos, dim=1) * r.head_scale)


def _classifier(r: Recipe, state: Mapping[str, Tensor], head: Tensor) -> nn.Module:
    return with_frozen_head(_net(r, state), head, None, normalize=True)


@functools.lru_cache(maxsize=None)
@_one_thread
def _finetune(r: Recipe, i: int, seed: int, kind: str) -> tuple[dict[str, Tensor], dict | None]:
    """(θt, LoRA adapters or None) of task ``i`` fine-tuned with ``seed`` and ``kind``."""
    theta0 = _pretrained(r)
    t = _task(r, i)
    x, y = t["data"]["train"]
    g = _gen(r.data_seed, 8, i, seed, 0 if kind == "full" else 1)
    model = _classifier(r, theta0, t["head"]).train()
    with torch.enable_grad():
        if kind == "full":
            _train(list(model.parameters()), lambda xb, yb: F.cross_entropy(model(xb), yb), x, y, r.steps,
                   r.batch, r.lr, g)
            return {k: v.detach().clone() for k, v in model.state_dict().items() if k in theta0}, None
        for p in model.parameters():
            p.requires_grad_(False)
        adapters = init_adapters(theta0, r.lora_rank, generator=g, rule=DEFAULT_RULE)
        params = attach(model, adapters, lora_scale(r.lora_rank, r.lora_alpha), rule=DEFAULT_RULE)
        _train(params, lambda xb, yb: F.cross_entropy(model(xb), yb), x, y, r.steps, r.batch, r.lora_lr, g)
        adapters = read_adapters(model)
    scale = lora_scale(r.lora_rank, r.lora_alpha)
    return merge_adapters(theta0, adapters, scale, rule=DEFAULT_RULE), adapters


def clear_cache() -> None:
    """Forget every memoised part (θ0, tasks, fine-tunes): the next load builds from scratch."""
    for f in (_mixing, _pretrained, _task, _finetune):
        f.cache_clear()


def _cap(xy: tuple[Tensor, Tensor], limit: int | None) -> tuple[Tensor, Tensor]:
    x, y = xy
    return (x, y) if limit is None else (x[:limit], y[:limit])


# -------------------------------------------------------------------------------- testbed

@dataclass
class SyntheticTestbed:
    """The synthetic testbed (a :class:`~pactlib.testbeds.base.Testbed`).

    Attributes beyond the protocol:
        recipe: the :class:`Recipe` it was built from.
        heads: ``{task: (C, width)}`` frozen cosine heads (logit scale folded in).
        data: ``{task: {split: (x, y)}}``; val and test are capped by ``val_limit``/``test_limit``.
        adapters: LoRA only: ``{task: {key: (A, B)}}``; ``lora_scale``: alpha / r.
    """

    name: str
    seed: int
    kind: str
    tasks: list[str]
    pretrained: dict[str, Tensor]
    finetuned: dict[str, dict[str, Tensor]]
    heads: dict[str, Tensor]
    data: dict[str, dict[str, tuple[Tensor, Tensor]]]
    ft_val: dict[str, float] = field(default_factory=dict)
    ft_test: dict[str, float] = field(default_factory=dict)
    zs_test: dict[str, float] = field(default_factory=dict)
    val_limit: int | None = None
    test_limit: int | None = None
    cache_dir: Path | None = None
    recipe: Recipe = RECIPE
    adapters: dict[str, dict] | None = field(default=None, repr=False)
    lora_scale: float | None = None
    family: str = FAMILY
    rule: MatrixRule = DEFAULT_RULE

    # ---------------------------------------------------------------------------- the protocol
    def task_vectors(self) -> list[TaskVector]:
        """Δt per task in ``tasks`` order (LoRA: exactly scale·B·A on the four maps, zero elsewhere)."""
        if self.kind == "lora":
            # the adapters were trained under DEFAULT_RULE (_finetune), whatever rule merges them
            return [TaskVector(lora_task_vector(self.pretrained, self.adapters[t], self.lora_scale, rule=DEFAULT_RULE),
                               name=t) for t in self.tasks]
        return [TaskVector.from_checkpoints(self.pretrained, self.finetuned[t], name=t) for t in self.tasks]

    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """``{task: accuracy}`` of ``state`` on the (capped) ``"val"`` or ``"test"`` split.

        Raises:
            ValueError: another split. KeyError: an unknown task (named). RuntimeError: ``state``
            does not have exactly θ0's keys and shapes.
        """
        if split not in ("val", "test"):
            raise ValueError(f"evaluate: split must be 'val' or 'test', got {split!r}")
        tasks = list(self.tasks if tasks is None else tasks)
        self._check_tasks(tasks)
        with torch.no_grad():
            net = _net(self.recipe, state)
            out = {}
            for t in tasks:
                x, y = self.data[t][split]
                logits = F.linear(F.normalize(net(x), dim=1), self.heads[t])
                out[t] = logits.argmax(1) == y
        return scores(out)

    def loss_model(self, state: Mapping[str, Tensor], task: str) -> nn.Module:
        """:class:`SynthNet` with weights ``state`` and ``task``'s frozen cosine head: x (N, d_in) -> logits (N, C)."""
        self._check_tasks([task])
        return _classifier(self.recipe, state, self.heads[task])

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """``(x (N, d_in) float32, y (N,) int64)`` of a task's split (``"train"``, or the capped
        ``"val"``/``"test"`` that :meth:`evaluate` scores), at most ``limit`` examples.

        Raises:
            ValueError: an unknown split. KeyError: an unknown task.
        """
        if split not in SPLITS:
            raise ValueError(f"inputs: split must be one of {SPLITS}, got {split!r}")
        self._check_tasks([task])
        return _cap(self.data[task][split], limit)

    def fingerprint(self) -> dict | None:
        """Recipe, tasks, seed, kind, caps, sha256 of θ0, θt, heads and evaluation data, and the code."""
        if "_fp" not in self.__dict__:
            h = hashlib.sha256()
            tensors = [self.pretrained] + [self.finetuned[t] for t in self.tasks]
            for sd in tensors:
                for k in sorted(sd):
                    h.update(k.encode() + sd[k].detach().contiguous().numpy().tobytes())
            for t in self.tasks:
                h.update(self.heads[t].numpy().tobytes())
                for s in ("val", "test"):
                    for a in self.data[t][s]:
                        h.update(a.numpy().tobytes())
            self.__dict__["_fp"] = dict(family=FAMILY, recipe=asdict(self.recipe), tasks=list(self.tasks),
                                        seed=self.seed, kind=self.kind, val_limit=self.val_limit,
                                        test_limit=self.test_limit, tensors=h.hexdigest(),
                                        code=code_fingerprint(["pactlib.testbeds.synthetic"]),
                                        torch=torch.__version__)
            if self.rule != DEFAULT_RULE:  # another rule merges otherwise (the default keeps its old keys)
                self.__dict__["_fp"]["rule"] = asdict(self.rule)
        return dict(self.__dict__["_fp"])

    # --------------------------------------------------------------------------------- helpers
    def matrix_keys(self) -> list[str]:
        """θ0's keys the rule treats as maps: ``fc1.weight`` … ``fc4.weight`` (under the default rule)."""
        return self.rule.matrix_keys(self.pretrained)

    def _check_tasks(self, tasks: Sequence[str]) -> None:
        bad = [t for t in tasks if t not in self.heads]
        if bad:
            raise KeyError(f"{self.name}: unknown task(s) {bad}; tasks: {', '.join(self.tasks)}")


def _check_limit(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")
    return int(value)


_RULE_FIELDS = {"not_matrix": tuple, "transposed": tuple, "kxk_conv": bool, "conv_1x1": bool}


def matrix_rule(value: str | Mapping | MatrixRule | None) -> MatrixRule:
    """The testbed's matrix rule from the load option ``rule``.

    Args:
        value: None (:data:`~pactlib.matrix.DEFAULT_RULE`); a :class:`~pactlib.matrix.MatrixRule`;
            a preset name of :data:`~pactlib.matrix.PRESETS`; or a mapping of MatrixRule fields
            (``not_matrix``, ``transposed``: lists of regular expressions; ``kxk_conv``,
            ``conv_1x1``: bools), each *replacing* the default's, e.g. ``{"not_matrix": ["^fc4\\."]}``
            (JSON / YAML-able, for a parameter file's ``testbeds:`` section).

    Raises:
        KeyError: an unknown preset (lists them). TypeError: another type, an unknown field or a
        field of the wrong type (named). ValueError: a regular expression that does not compile.
    """
    if value is None:
        return DEFAULT_RULE
    if isinstance(value, MatrixRule):
        return value
    if isinstance(value, str):
        return MatrixRule.preset(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"synthetic testbed: rule must be None, a preset name ({', '.join(PRESETS)}), a MatrixRule "
                        f"or a mapping of its fields, got {type(value).__name__}")
    unknown = sorted(set(value) - set(_RULE_FIELDS))
    if unknown:
        raise TypeError(f"synthetic testbed: rule has no field {unknown[0]!r}; its fields: {list(_RULE_FIELDS)}")
    fields = {}
    for k, v in value.items():
        if _RULE_FIELDS[k] is bool:
            if not isinstance(v, bool):
                raise TypeError(f"synthetic testbed: rule field {k!r} must be a bool, got {v!r}")
            fields[k] = v
            continue
        if isinstance(v, str) or not isinstance(v, Sequence) or not all(isinstance(p, str) for p in v):
            raise TypeError(f"synthetic testbed: rule field {k!r} must be a list of regular expressions, got {v!r}")
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"synthetic testbed: rule field {k!r}: bad regular expression {pattern!r} "
                                 f"({e})") from None
        fields[k] = tuple(v)
    return replace(DEFAULT_RULE, **fields)


def check_options(options: Mapping) -> None:
    """Check a definition's options without building anything (:func:`pactlib.testbeds.define`):
    the known names, the caps and the ``rule`` (:func:`matrix_rule`).

    Raises:
        TypeError: an unknown option, a bad ``rule``. ValueError: a bad cap or regular expression.
    """
    unknown = sorted(set(options) - {"val_limit", "test_limit", "cache_dir", "progress", "rule"})
    if unknown:
        raise TypeError(f"synthetic testbed: unknown option(s) {unknown}; "
                        "known: val_limit, test_limit, cache_dir, progress, rule")
    for cap in ("val_limit", "test_limit"):
        _check_limit(cap, options.get(cap))
    matrix_rule(options.get("rule"))


def load(name: str, seed: int = 0, kind: str = "full", *, val_limit: int | None = None,
         test_limit: int | None = None, cache_dir: str | Path | None = None, progress: bool = False,
         rule: str | Mapping | MatrixRule | None = None, **options) -> SyntheticTestbed:
    """Build (or take from the in-process memo) the synthetic testbed ``name``.

    Args:
        name: ``synthetic-<n>`` (2 <= n <= 20) or ``synthetic`` (= ``synthetic-4``).
        seed: fine-tuning seed (batch order, LoRA init); kind: ``"full"`` or ``"lora"``.
        val_limit, test_limit: caps on the validation / test examples per task (None: all
            256 / 512).
        cache_dir: where :func:`pactlib.testbeds.base.run` memoises results (None, the default:
            no memo; every merge is recomputed, in well under a second).
        progress: accepted for symmetry with the Lite0 loader; there is nothing to report.
        rule: the testbed's matrix rule, ``tb.rule`` (:func:`matrix_rule`; default
            :data:`~pactlib.matrix.DEFAULT_RULE`, whose maps are ``fc1.weight`` … ``fc4.weight``).

    Returns:
        A fresh :class:`SyntheticTestbed` (its tensors are copies: changing them does not touch
        the memo) named ``synthetic-<n>``.

    Raises:
        KeyError: a bad name or preset. ValueError: a bad ``kind``, ``seed`` or cap.
        TypeError: an option this loader does not know (named), a bad ``rule``.
    """
    if options:
        raise TypeError(f"synthetic testbed: unknown option(s) {sorted(options)}; "
                        "known: val_limit, test_limit, cache_dir, progress, rule")
    matrix = matrix_rule(rule)
    n = parse_name(str(name))
    if kind not in ("full", "lora"):
        raise ValueError(f"testbed kind must be 'full' or 'lora', got {kind!r}")
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    val_limit, test_limit = _check_limit("val_limit", val_limit), _check_limit("test_limit", test_limit)
    r = RECIPE
    names = task_names(n)
    theta0 = _pretrained(r)
    parts = [_task(r, i) for i in range(n)]
    seed = int(seed)
    fts = [_finetune(r, i, seed, kind) for i in range(n)]

    def copy(sd):
        return {k: v.clone() for k, v in sd.items()}

    data = {t: {"train": p["data"]["train"], "val": _cap(p["data"]["val"], val_limit),
                "test": _cap(p["data"]["test"], test_limit)} for t, p in zip(names, parts)}
    data = {t: {s: (x.clone(), y.clone()) for s, (x, y) in d.items()} for t, d in data.items()}
    heads = {t: p["head"].clone() for t, p in zip(names, parts)}
    tb = SyntheticTestbed(
        name=f"{FAMILY}-{n}", seed=int(seed), kind=kind, tasks=names, pretrained=copy(theta0),
        finetuned={t: copy(ft) for t, (ft, _) in zip(names, fts)}, heads=heads, data=data, val_limit=val_limit,
        test_limit=test_limit, cache_dir=None if cache_dir is None else Path(cache_dir), recipe=r,
        adapters={t: {k: (A.clone(), B.clone()) for k, (A, B) in ad.items()} for t, (_, ad) in zip(names, fts)}
        if kind == "lora" else None,
        lora_scale=lora_scale(r.lora_rank, r.lora_alpha) if kind == "lora" else None, rule=matrix)
    tb.ft_val, tb.ft_test, tb.zs_test = Scores(), Scores(), Scores()
    for t in names:
        for target, split in ((tb.ft_val, "val"), (tb.ft_test, "test")):
            s = tb.evaluate(tb.finetuned[t], split, [t])
            target.add(t, s[t], s.outcomes[t])
    zs = tb.evaluate(tb.pretrained, "test")
    for t in names:
        tb.zs_test.add(t, zs[t], zs.outcomes[t])
    return tb
