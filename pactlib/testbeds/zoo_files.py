"""Files and records of a model zoo, shared by the testbed families through
:mod:`pactlib.testbeds.zoo_trainer`.

A zoo run is a checkpoint written atomically (temporary file + ``os.replace``) *before* its JSON
record; the record holds the recipe fields the run depends on and the checkpoint's sha256. A run
counts as done only when :func:`record_problem` finds nothing wrong: the record exists, was made
with the same recipe (and through the same head), and the file's sha256 matches. Anything else
(an interrupted run, a truncated or corrupt file, a changed recipe) is rebuilt, never used.

The safetensors helpers (:func:`save_safetensors`,
:func:`load_safetensors`, :func:`file_sha256`) are generic too but stay defined in
:mod:`pactlib.testbeds.lite0.heads` and are re-exported here: that module is part of the Lite0
evaluator's code fingerprint (``EVAL_MODULES``), so moving them would re-key every memoised Lite0
merge for no change in behaviour.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from pactlib.io import write_atomic
from pactlib.testbeds.lite0.heads import file_sha256, load_safetensors, save_safetensors

__all__ = ["save_safetensors", "load_safetensors", "file_sha256", "write_json", "read_json", "record_problem",
           "run_seed", "update_manifest", "warmup_cosine", "train_loop", "AccuracyMemo"]


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically."""
    text = json.dumps(obj, indent=1, sort_keys=True)
    write_atomic(path, text)


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def record_problem(record: dict | None, ckpt: Path, wanted: Mapping[str, Any], head_sha256: str | None = None,
                   *, upgrade: Callable[[dict], dict] | None = None) -> str | None:
    """None when ``record`` describes ``ckpt`` made with recipe fields ``wanted`` (and, for a run,
    through the head whose file has ``head_sha256``); else why not. ``upgrade`` maps an older
    record's recipe to today's form before the comparison (a family's own compatibility rule)."""
    if record is None:
        return "no record"
    got = dict(record.get("recipe") or {})
    if upgrade is not None:
        got = upgrade(got)
    if got != dict(wanted):
        return "recipe changed"
    if head_sha256 is not None and record.get("head_sha256") != head_sha256:
        return "head changed (the run was fine-tuned through another head)"
    if not ckpt.is_file():
        return "checkpoint missing"
    if file_sha256(ckpt) != record.get("sha256"):
        return "checkpoint sha256 mismatch (partial or corrupt file)"
    return None


def run_seed(kind: str, task: str, seed: int) -> int:
    """A stable 63-bit seed for one run (independent of Python's hash randomisation)."""
    return int(hashlib.sha256(f"{kind}/{task}/{seed}".encode()).hexdigest()[:15], 16)


def update_manifest(zoo_dir: Path, entry_key: str, entry: dict, backbone: str) -> None:
    """Set ``entries[entry_key]`` of ``<zoo_dir>/manifest.json`` (atomic rewrite)."""
    path = Path(zoo_dir) / "manifest.json"
    man = read_json(path) or {}
    man.setdefault("backbone", backbone)
    man.setdefault("entries", {})[entry_key] = entry
    write_json(path, man)


def warmup_cosine(step: int, steps: int, warmup: int) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine to 0 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def train_loop(model, params: list, logits: Callable, x: Tensor, y: Tensor, *, steps: int, batch_size: int,
               lr: float, optimizer: str, weight_decay: float, warmup: int, generator, augment: Callable | None = None,
               desc: str = "", progress: bool = False) -> list[float]:
    """Minimise cross-entropy of ``logits(model(x_batch))`` over ``params`` (anything else frozen).

    The model stays in eval mode (BatchNorm statistics frozen, dropout off). AdamW (``optimizer=
    "adamw"``) or SGD with momentum 0.9, warm-up then cosine (:func:`warmup_cosine`). Batches are
    drawn epoch-wise from random permutations of ``generator`` (``augment(x_batch, generator)``
    may change them); the global RNG is not used.

    Returns:
        the loss of every step.
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    model.eval()
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warmup))
    n, bs = x.shape[0], min(batch_size, x.shape[0])
    order, pos, losses = torch.randperm(n, generator=generator), 0, []
    bar = tqdm(range(steps), desc=desc, leave=False, disable=not progress)
    for _ in bar:
        if pos + bs > n:
            order, pos = torch.randperm(n, generator=generator), 0
        idx = order[pos : pos + bs]
        pos += bs
        xb = x[idx] if augment is None else augment(x[idx], generator)
        loss = F.cross_entropy(logits(model(xb)), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if len(losses) % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / 10:.3f}")
    return losses


class AccuracyMemo:
    """Accuracies of fixed checkpoints on fixed splits, memoised in a JSON file (keys hold the
    checkpoint's and head's sha256, the split, its cap, the data seed and resolution)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def get(self, key: str, compute) -> float:
        if key not in self.data:
            self.data[key], self.dirty = float(compute()), True
        return self.data[key]

    def scored(self, key: str, compute) -> tuple[float, str]:
        """``(accuracy, packed outcomes)`` under ``key`` (:func:`pactlib.outcomes.pack`);
        ``compute() -> (accuracy, packed outcomes)`` when the memo has no outcomes for it."""
        v = self.data.get(key)
        if not isinstance(v, dict):
            acc, packed = compute()
            v = self.data[key] = {"acc": float(acc), "outcomes": packed}
            self.dirty = True
        return v["acc"], v["outcomes"]

    def save(self) -> None:
        if self.dirty:
            text = json.dumps(self.data, indent=0, sort_keys=True)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, text)
