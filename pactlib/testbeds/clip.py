"""The ``clip`` testbed family: CLIP image encoders fine-tuned per task, from the user's own files.

The paper's models (CLIP ViT-B/32, B/16, L/14 fine-tuned on 8, 14 or 20 datasets) are in no
package registry, so a clip testbed is always a *named definition* (:func:`pactlib.testbeds.define`,
or a parameter file's ``testbeds:`` section) that says where the files are::

    testbeds.define("clip-vitb32-8", family="clip", arch="ViT-B-32", quick_gelu=True,
                    checkpoint_dir="/data/checkpoints/ViT-B-32", pretrained_file="MNISTVal/nonlinear_zeroshot.pt",
                    finetuned_pattern="{task}Val/nonlinear_finetuned.pt", trust_pickle=True,
                    data_root="/data/datasets", tasks=8, heads="zeroshot", text_file="/data/ViT-B-32.pt")
    tb = testbeds.load("clip-vitb32-8", seed=0, val_limit=5000, test_limit=None)

What it is, in the terms of :class:`pactlib.testbeds.base.Testbed`:

- θ0 and θt are the *vision towers* of the checkpoints (:func:`pactlib.models.clip.vision_state_dict`),
  read in any of the three formats :mod:`pactlib.models.clip` knows (open_clip; task_vectors /
  TSV pickled ``ImageEncoder`` modules, which need ``trust_pickle``; Hugging Face). With
  ``naming="open_clip"`` (the default) Hugging Face towers are converted to open_clip names, q/k/v
  fused into ``in_proj_weight`` as in the reference code, so the same weights give the same merge
  whatever files they came in; ``naming="native"`` keeps Hugging Face names (separate q/k/v
  matrices: a different per-layer view, hence different Iso-C / TSV-M / PACT updates; a warning
  says so). ``rule`` is the ``open_clip`` or ``hf_encoder`` preset of :data:`pactlib.matrix.PRESETS`.
- Heads: ``heads="zeroshot"`` computes each task's head from the text tower (of θ0's file, or of
  ``text_file`` when θ0's file is an image encoder only) with the dataset's class names and prompt
  templates (:func:`pactlib.data.paper.prompt_names`, :func:`pactlib.data.paper.templates_for`),
  averaged over every standard name of a class where the standard list gives several (FER2013:
  :func:`class_synonyms`, :func:`synonym_head`);
  a folder reads the task_vectors / TSV head files there (``head_pattern``, default
  ``head_{task}.pt``, then ``head_{task}Val.pt``) with :func:`pactlib.models.clip.read_head`.
- Data: one folder per dataset under ``data_root`` in the layouts of :mod:`pactlib.data.paper`;
  validation is the reference protocol's split of the train folder (10 %, at most 5,000, seed 0),
  test the dataset's test split; ``val_limit``/``test_limit`` keep seeded subsets.
- ``evaluate`` is :func:`pactlib.eval.clip_evaluate` on ``device`` (``"auto"``: CUDA when
  present); :func:`pactlib.testbeds.run` also merges and filters there (the testbed's ``device``).
- ``loss_model(state, task)`` is the vision tower with the task's head frozen, parameter names =
  the keys of ``state``; ``inputs`` are CLIP-normalised images; both on ``device``.

Memory does not grow with the number of tasks T on the chapters' path (load, :func:`pactlib.testbeds.run`,
:func:`pactlib.testbeds.reference_records`, ``evaluate``): every tower (θ0 and each θt, whatever its
format) is converted once into a safetensors file of the cache (``towers/``, keyed by the file's
sha256, the naming and the converter's code, written atomically), and ``finetuned[task]`` is a
lazy mapping whose tensors are read from that memory-mapped file key by key; ``run`` merges key
by key from those files (:meth:`ClipTestbed.merge_sources`, :func:`pactlib.testbeds.base.streamed_update`:
the streamed ``pact merge``'s reader and per-layer PACT filter), holding θ0, D and one layer's
(T, m, n) stack instead of T task vectors; each task's validation and test images are kept in a
file of their own (``splits/``) and read when that task is evaluated, then freed. Peak RSS,
ViT-B/32 widths (2 blocks), T = 2 vs 20: ``book/data/clip_testbed_memory.jsonl``
(``bench/bench_clip_memory.py``). TIES with ``scope="global"`` (a whole-vector threshold per
task) streams too, in passes over the keys (:func:`pactlib.testbeds.base.streamed_update`).
:meth:`ClipTestbed.task_vectors` and :func:`pactlib.testbeds.filtered` return read-only lazy task
vectors (:mod:`pactlib.testbeds.lazy_vectors`: each entry computed on access from the towers; the
filtered layers computed once and kept in ``<cache_dir>/filtered``), so the chapters that hold T task
vectors hold about one layer × T of them at a time.

Everything slow is cached on disk under ``cache_dir`` (default ``pactlib.paths.cache_dir("clip")``),
written atomically and keyed by content: the sha256 of every checkpoint file (itself remembered
per path, size and mtime), the converted towers, decoded splits, zero-shot heads, the fine-tuned and zero-shot
accuracies (keyed by checkpoint and head hashes, the data's digest and the evaluator's code), and,
through :func:`pactlib.testbeds.run`'s memo and :meth:`ClipTestbed.fingerprint`, merged-model scores.

Seeds: the files are one fine-tuning run, seed 0. A ``{seed}`` in ``checkpoint_dir``,
``pretrained_file`` or ``finetuned_pattern`` makes other seeds loadable.

Book: chapter 12 ("At paper scale") and ``params/paper-*.yaml``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..matrix import PRESETS, MatrixRule
from ..outcomes import scores
from ..taskvector import TaskVector
from .base import code_fingerprint, with_frozen_head

log = logging.getLogger(__name__)

FAMILY = "clip"

#: The code an evaluation on this testbed depends on: part of every cached accuracy and memo key.
EVAL_MODULES = ("pactlib.models.clip", "pactlib.eval", "pactlib.data.paper", "pactlib.testbeds.clip")

#: Options a definition must give (the rest have defaults).
REQUIRED = ("arch", "checkpoint_dir", "data_root")

_HEAD_PATTERNS = ("head_{task}.pt", "head_{task}Val.pt")


# ------------------------------------------------------------------------------- names, options

def parse_name(name: str) -> None:
    """Only reached for a ``clip-...`` name that is not defined: a clip testbed needs its files.

    Raises:
        KeyError: always (the message says how to define one).
    """
    raise KeyError(f"testbed {name!r} is not defined: a clip testbed reads your files, so it needs a definition "
                   "(pactlib.testbeds.define(name, family='clip', arch=..., checkpoint_dir=..., data_root=..., ...) "
                   "or a parameter file's `testbeds:` section; see params/paper-vitb32-8.yaml)")


def tasks_of(tasks) -> list[str]:
    """The task names of the option ``tasks``: 8, 14, 20 (:data:`pactlib.data.paper.PAPER_TASKS`)
    or a list of names.

    Raises:
        ValueError / TypeError: another int, an empty list, a repeated name.
    """
    from ..data.paper import PAPER_TASKS

    if isinstance(tasks, int) and not isinstance(tasks, bool):
        if tasks not in PAPER_TASKS:
            raise ValueError(f"option 'tasks': an int names a suite of the paper, {sorted(PAPER_TASKS)}; got {tasks}")
        return list(PAPER_TASKS[tasks])
    if isinstance(tasks, (list, tuple)) and tasks and all(isinstance(t, str) and t for t in tasks):
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"option 'tasks': a task is listed twice in {list(tasks)}")
        return list(tasks)
    raise TypeError(f"option 'tasks': 8, 14, 20 or a non-empty list of task names, got {tasks!r}")


def check_options(options: Mapping[str, Any]) -> None:
    """Check a definition's option values without touching a file (names are the loader's).

    Raises:
        ValueError / TypeError: a required option is missing, or a value has the wrong type or is
        out of range; the message names the option.
    """
    missing = [k for k in REQUIRED if options.get(k) in (None, "")]
    if missing:
        raise ValueError(f"option {missing[0]!r} is required (required: {list(REQUIRED)})")
    o = dict(options)
    if not isinstance(o["arch"], (str, dict)):
        raise TypeError(f"option 'arch': an open_clip architecture name (e.g. 'ViT-B-32') or a config dict, "
                        f"got {o['arch']!r}")
    if o.get("lora_key_map") is not None and not isinstance(o["lora_key_map"], str):
        raise TypeError(f"option 'lora_key_map': a name of pactlib.peft.KEY_MAPS, got {o['lora_key_map']!r}")
    for k in ("checkpoint_dir", "data_root", "pretrained_file", "finetuned_pattern", "text_file", "head_pattern",
              "lora", "cache_dir"):
        if k in o and o[k] is not None and not isinstance(o[k], (str, os.PathLike)):
            raise TypeError(f"option {k!r}: a path, got {o[k]!r}")
    for k, pattern in (("finetuned_pattern", "{task}"), ("head_pattern", "{task}"), ("lora", "{task}")):
        if o.get(k) is not None and pattern not in str(o[k]):
            raise ValueError(f"option {k!r}: {o[k]!r} has no {pattern} for the task name")
    if "tasks" in o:
        tasks_of(o["tasks"])
    for k in ("trust_pickle", "quick_gelu", "progress"):
        if k in o and not isinstance(o[k], bool):
            raise TypeError(f"option {k!r}: true or false, got {o[k]!r}")
    if "naming" in o and o["naming"] not in ("open_clip", "native"):
        raise ValueError(f"option 'naming': 'open_clip' or 'native', got {o['naming']!r}")
    if "device" in o and not (isinstance(o["device"], str) and o["device"].split(":")[0] in ("cpu", "cuda", "auto")):
        raise ValueError(f"option 'device': 'cpu', 'cuda', 'cuda:<n>' or 'auto', got {o['device']!r}")
    if "heads" in o and not isinstance(o["heads"], (str, os.PathLike)):
        raise TypeError(f"option 'heads': 'zeroshot' or a folder of head files, got {o['heads']!r}")
    for k, lo in (("image_size", 1), ("batch_size", 1), ("val_limit", 1), ("test_limit", 1)):
        v = o.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise ValueError(f"option {k!r}: an int >= {lo} or null, got {v!r}")


def _seeded(path: str | os.PathLike, seed: int) -> str:
    return str(path).replace("{seed}", str(seed))


def files_of(options: Mapping[str, Any], seed: int = 0) -> tuple[Path, Path, dict[str, Path]]:
    """(checkpoint folder, θ0 file, {task: θt file}) of a definition's options, for fine-tuning
    seed ``seed`` (nothing is read or checked; :func:`missing_paths` says what is missing)."""
    root = Path(_seeded(options["checkpoint_dir"], seed)).expanduser()
    pre = root / _seeded(options.get("pretrained_file", "zeroshot.pt"), seed)
    pattern = _seeded(options.get("finetuned_pattern", "{task}/finetuned.pt"), seed)
    return root, pre, {t: root / pattern.format(task=t) for t in tasks_of(options.get("tasks", 8))}


def _head_file(folder: Path, task: str, pattern: str | None) -> Path | None:
    for p in ([pattern] if pattern else _HEAD_PATTERNS):
        f = folder / p.format(task=task)
        if f.exists():
            return f
    return None


def missing_paths(options: Mapping[str, Any], seed: int = 0, kind: str | None = None) -> list[tuple[str, str]]:
    """The paths a definition names that do not exist: ``[(option, path), ...]``.

    A missing folder is named once (not every file under it). Looked up only, nothing is read:
    the checkpoint folder, θ0, every θt (``kind`` "full" or None) and LoRA adapter (``kind``
    "lora", or None with a ``lora`` option), the data root and every task's folder in it, the
    head files when ``heads`` is a folder, and ``text_file``.
    """
    from ..data.paper import task_root

    out: list[tuple[str, str]] = []
    try:
        root, pre, fts = files_of(options, seed)
        tasks = tasks_of(options.get("tasks", 8))
    except (KeyError, TypeError, ValueError):
        return out  # check_options reports those
    if not root.is_dir():
        out.append(("checkpoint_dir", str(root)))
    else:
        if not pre.exists():
            out.append(("pretrained_file", str(pre)))
        if kind in (None, "full"):
            out += [("finetuned_pattern", str(f)) for f in fts.values() if not f.exists()]
        if options.get("lora") and kind in (None, "lora"):
            out += [("lora", str(root / _seeded(options["lora"], seed).format(task=t))) for t in tasks
                    if not (root / _seeded(options["lora"], seed).format(task=t)).exists()]
    data = Path(str(options["data_root"])).expanduser()
    if not data.is_dir():
        out.append(("data_root", str(data)))
    else:
        for t in tasks:
            try:
                task_root(data, t)
            except FileNotFoundError:
                out.append(("data_root", f"{data}/<{t}> (no folder for task {t})"))
    heads = options.get("heads", "zeroshot")
    if heads != "zeroshot":
        folder = Path(str(heads)).expanduser()
        if not folder.is_dir():
            out.append(("heads", str(folder)))
        else:
            out += [("heads", str(folder / (options.get("head_pattern") or _HEAD_PATTERNS[0]).format(task=t)))
                    for t in tasks if _head_file(folder, t, options.get("head_pattern")) is None]
    if options.get("text_file") and not Path(str(options["text_file"])).expanduser().exists():
        out.append(("text_file", str(options["text_file"])))
    return out


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a CUDA device is present, else ``"cpu"``; others as given
    (:func:`pactlib.checks.check_device`).

    Raises:
        ValueError: ``"cuda"`` asked for on a machine without one, or another value.
    """
    from ..checks import check_device

    return check_device(device)


# ------------------------------------------------------------------------------- disk caches

class _Cache:
    """Small files under one folder, each written atomically: checkpoint hashes, accuracies, heads."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @staticmethod
    def _name(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()[:40]

    def file_sha256(self, path: Path) -> str:
        """sha256 of a file's bytes (a folder: of its files' names and bytes, in sorted order),
        remembered per (real path, size, mtime) so a file is hashed once."""
        path = Path(path).resolve()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        memo = self.root / "sha256" / f"{self._name(json.dumps(stats))}.txt"
        try:
            return memo.read_text().strip()
        except OSError:
            pass
        h = hashlib.sha256()
        for f in files:
            if len(files) > 1:
                h.update(str(f.relative_to(path)).encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
        digest = h.hexdigest()
        self._write_text(memo, digest)
        return digest

    def _write_text(self, path: Path, text: str) -> None:
        from ..io import write_atomic

        write_atomic(path, text)

    def accuracy(self, key: str, compute) -> float:
        path = self.root / "accuracy" / f"{self._name(key)}.json"
        try:
            rec = json.loads(path.read_text())
            if rec.get("key") == key:
                return float(rec["acc"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        acc = float(compute())
        self._write_text(path, json.dumps({"key": key, "acc": acc}))
        return acc

    def head(self, key: str, compute) -> tuple[Tensor, float]:
        from ..io import atomic_write

        path = self.root / "heads" / f"{self._name(key)}.pt"
        try:
            rec = torch.load(path, map_location="cpu", weights_only=True)
            if rec.get("key") == key:
                return rec["head"], float(rec["scale"])
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError, EOFError):
            pass
        head, scale = compute()
        atomic_write(path, lambda tmp: torch.save({"key": key, "head": head.cpu(), "scale": float(scale)}, tmp))
        return head, float(scale)


def _digest(*tensors: Tensor) -> str:
    """sha256 of tensors' bytes (with dtype and shape)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# ------------------------------------------------------------------------------- fine-tuned towers

#: Version of the tower conversion (:func:`_tower_file`): part of every converted file's name.
_TOWER_VERSION = "v1"


def _tower_file(cache_root: Path, sha: str, naming: str, read, *, source: Path) -> Path:
    """The vision tower of one checkpoint file as safetensors in ``<cache_root>/towers``, in the
    testbed's ``naming``: converted once (``read() -> (state dict, format)``), written atomically
    (:class:`pactlib.lazy.CheckpointWriter`), keyed by the file's content (its sha256 ``sha``),
    the naming and the conversion code (:mod:`pactlib.models.clip`). The detected format is kept
    in the file's metadata (``clip_format``). Peak memory: one checkpoint, while it is converted.

    Raises:
        CheckpointError / PickleRefused: the file cannot be read (as ``read``).
        OSError: the cache folder is not writable.
    """
    from ..lazy import CheckpointWriter

    code = code_fingerprint(["pactlib.models.clip"])[:12]
    dest = Path(cache_root) / "towers" / f"{sha[:40]}-{naming}-{code}-{_TOWER_VERSION}.safetensors"
    if dest.is_file():
        return dest
    state, fmt = read()
    entries = [(k, tuple(v.shape), v.dtype) for k, v in state.items()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with CheckpointWriter(dest, entries, metadata={"format": "pt", "clip_format": fmt, "naming": naming,
                                                    "source": str(source)}) as w:
        for k, v in state.items():
            w.write(k, v)
        w.commit()
    return dest


def _tower_format(path: Path) -> str:
    """The source format recorded in a converted tower's metadata (:func:`_tower_file`)."""
    from ..lazy import read_header

    return read_header(Path(path))[1].get("clip_format", "")


class _LazyTower(Mapping):
    """One vision tower ``{key: Tensor}`` whose tensors are read from a memory-mapped safetensors
    file when asked for (:class:`pactlib.lazy.LazyCheckpoint`), each a fresh copy the caller may
    modify; nothing is held between reads, so many towers cost no memory until they are read.
    ``dict(tower)`` materialises one tower."""

    def __init__(self, ckpt):
        self._ckpt = ckpt

    @property
    def checkpoint(self):
        """The :class:`pactlib.lazy.LazyCheckpoint` the tensors are read from."""
        return self._ckpt

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._ckpt:
            raise KeyError(key)
        return self._ckpt.read(key).clone()

    def __contains__(self, key) -> bool:
        return key in self._ckpt

    def __iter__(self) -> Iterator[str]:
        return iter(self._ckpt.keys())

    def __len__(self) -> int:
        return len(self._ckpt)

    def __repr__(self) -> str:
        return f"<vision tower of {len(self)} keys, read from {self._ckpt.name} on access>"


class _Towers(Mapping):
    """``{task: vision state dict}`` read from the files when asked for; the last ``keep`` are kept
    (a :class:`_LazyTower` costs nothing until its tensors are read)."""

    def __init__(self, reader, tasks: Sequence[str], keep: int):
        self._read, self._tasks, self._keep = reader, list(tasks), max(1, int(keep))
        self._held: OrderedDict[str, Mapping[str, Tensor]] = OrderedDict()

    def __getitem__(self, task: str) -> Mapping[str, Tensor]:
        if task not in self._tasks:
            raise KeyError(task)
        if task in self._held:
            self._held.move_to_end(task)
            return self._held[task]
        state = self._read(task)
        self._held[task] = state
        while len(self._held) > self._keep:
            self._held.popitem(last=False)
        return state

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return f"<{len(self._tasks)} fine-tuned vision towers, read from disk on access>"


# ------------------------------------------------------------------------------- evaluation data

class _Splits(Mapping):
    """``{task: TaskData}`` of one split, each task's images read from its file in
    ``<cache_dir>/splits`` when asked for (a memory map, copied), the last one kept: memory holds
    about one task's split, whatever the number of tasks."""

    def __init__(self, split: str, files: Mapping[str, Path], classes: Mapping[str, tuple[str, ...]]):
        self._split, self._files, self._classes = split, dict(files), dict(classes)
        self._held: tuple[str, Any] | None = None

    def __getitem__(self, task: str):
        from ..data.store import TaskData
        from ..lazy import open_checkpoint

        if task not in self._files:
            raise KeyError(task)
        if self._held is not None and self._held[0] == task:
            return self._held[1]
        ck = open_checkpoint(self._files[task], name=f"{task} {self._split} split")
        d = TaskData(images=ck.read("images").clone(), labels=ck.read("labels").clone(),
                     classes=self._classes[task], task=task, split=self._split)
        self._held = (task, d)
        return d

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def release(self) -> None:
        """Drop the split held in memory."""
        self._held = None

    def __repr__(self) -> str:
        return f"<{self._split} splits of {len(self)} tasks, read from disk on access>"


def _split_file(cache_root: Path, data) -> tuple[Path, str]:
    """(the safetensors file holding ``data``'s images and labels under ``<cache_root>/splits``,
    written atomically once, named by their digest; that digest, :func:`_digest`)."""
    from ..lazy import CheckpointWriter

    digest = _digest(data.images, data.labels)
    dest = Path(cache_root) / "splits" / f"{digest[:40]}.safetensors"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        images, labels = data.images.contiguous(), data.labels.contiguous()
        with CheckpointWriter(dest, [("images", tuple(images.shape), images.dtype),
                                     ("labels", tuple(labels.shape), labels.dtype)]) as w:
            w.write("images", images)
            w.write("labels", labels)
            w.commit()
    return dest, digest


# ------------------------------------------------------------------------------- the loss model

def _get(module: nn.Module, key: str) -> Tensor:
    for part in key.split("."):
        module = getattr(module, part)
    return module


class _NamedTower(nn.Module):
    """The open_clip vision tower run on parameters registered under the state's own keys.

    ``named_parameters()`` are exactly the keys of ``state`` (``visual.*`` or Hugging Face
    ``vision_model.*``); ``forward`` renames them to the tower's (:func:`pactlib.models.clip.hf_to_open_clip`
    for Hugging Face names: q/k/v concatenated, the projection transposed, all differentiable) and
    runs ``tower`` with them (``torch.func.functional_call``; the tower's own weights are used
    only for keys the state lacks, e.g. a Hugging Face vision-only file's projection). The
    parameters are float32 copies of the state's tensors on ``device`` (the tower's device).
    """

    def __init__(self, tower: nn.Module, state: Mapping[str, Tensor], hf: bool, device: str | torch.device = "cpu"):
        super().__init__()
        object.__setattr__(self, "_tower", tower)  # not a sub-module: its parameters are not ours
        self._keys, self._hf = list(state), hf
        for key, value in state.items():
            *path, leaf = key.split(".")
            mod: nn.Module = self
            for part in path:
                if part not in mod._modules:
                    mod.add_module(part, nn.Module())
                mod = mod._modules[part]
            mod.register_parameter(leaf, nn.Parameter(value.detach().to(device, torch.float32, copy=True)))

    def forward(self, x: Tensor) -> Tensor:
        from torch.func import functional_call

        from ..models.clip import hf_to_open_clip

        flat = {k: _get(self, k) for k in self._keys}  # the tensors functional_call put in, if any
        if self._hf:
            flat = hf_to_open_clip(flat)
        inner = {k[len("visual."):]: v for k, v in flat.items() if k.startswith("visual.")}
        return functional_call(self._tower, inner, (x,), strict=False)


# ------------------------------------------------------------------------------- the testbed

class ClipTestbed:
    """CLIP vision towers, heads and paper datasets from local files (a
    :class:`~pactlib.testbeds.base.Testbed`; build it with :func:`load`).

    Attributes beyond the protocol:
        device: where evaluation, merging, the PACT filter, ``loss_model`` and ``inputs`` run
            (``"cpu"``, ``"cuda"``).
        heads: ``{task: (H (C, d) unit rows, scale)}``; val, test: ``{task: TaskData}`` (capped;
            each task's uint8 images (N, 3, S, S) and labels (N,) read from the cache when asked
            for, the last one kept).
        finetuned: ``{task: θt}``, each a lazy mapping read key by key from its converted tower.
        classifier: the :class:`~pactlib.models.clip.ClipClassifier` whose tower evaluates every state.
        format: θ0's checkpoint format; naming: ``"open_clip"`` or ``"native"``.
        files: ``{"pretrained": path, task: path, ...}``; options: the loader's options.
    """

    family = FAMILY

    def __init__(self, name: str, seed: int, kind: str, tasks: list[str], **fields):
        self.name, self.seed, self.kind, self.tasks = name, seed, kind, tasks
        for k, v in fields.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return (f"ClipTestbed({self.name!r}, seed={self.seed}, kind={self.kind!r}, {len(self.tasks)} tasks, "
                f"format={self.format!r}, device={self.device!r})")

    # ---------------------------------------------------------------------------- the protocol
    def task_vectors(self) -> list[TaskVector]:
        """Δt = θt − θ0 per task, float32, in task order (LoRA: exactly the adapter's scale·B·A),
        as read-only :class:`pactlib.testbeds.lazy_vectors.LazyTaskVector` objects: ``tv[key]``
        (the key's stored shape) is computed when asked for, from the memory-mapped converted tower
        (or the adapter) of :meth:`merge_sources`, and nothing is held, so T of them cost no memory
        until read; the values are ``TaskVector.from_checkpoints(pretrained, finetuned[t])``'s, bit
        for bit (``tv.materialize()`` gives that in-memory task vector).

        Raises:
            CheckpointError: a tower's keys or shapes differ from θ0's, NaN / Inf in θ0 (here) or
                in a θt entry (when it is read)."""
        from .lazy_vectors import lazy_task_vectors

        _, sources = self.merge_sources()
        return lazy_task_vectors(self.pretrained, sources, self.tasks)

    def merge_sources(self):
        """θ0 and the T fine-tuned towers as the streamed merge reads them, one key at a time
        (:func:`pactlib.testbeds.base.streamed_update`, as ``pact merge`` does).

        Returns:
            ``(θ0 as a pactlib.lazy.LazyCheckpoint, [per task: a LazyCheckpoint of θt, or for
            kind="lora" a pactlib.peft.AdapterSource giving Δt key by key])``, in task order.
            The tensors are in the converted towers of the cache (``<cache_dir>/towers``).

        Raises:
            CheckpointError: an adapter whose keys fit θ0 under no key map.
        """
        from ..lazy import open_checkpoint

        pre = open_checkpoint(self._tower_files["pretrained"], name=f"θ0 ({self.files['pretrained']})")
        if self.kind == "full":
            return pre, [self.finetuned[t].checkpoint for t in self.tasks]
        return pre, [self._lora_source(t, pre.meta()) for t in self.tasks]

    def evaluate(self, state: Mapping[str, Tensor], split: str = "test",
                 tasks: Sequence[str] | None = None) -> dict[str, float]:
        """``{task: top-1 accuracy in [0, 1]}`` of the vision tower ``state`` (θ0's keys) on the
        (capped) ``split``, ``"val"`` or ``"test"``. The tower is loaded once; each task's images
        are read from disk when its turn comes and freed after (one task's split in memory).

        Raises:
            KeyError: an unknown task. CheckpointError: ``state`` does not fit the tower."""
        from ..eval import clip_evaluate

        datas = self.val if split == "val" else self.test
        tasks = list(tasks or self.tasks)
        unknown = [t for t in tasks if t not in self.heads]
        if unknown:
            raise KeyError(f"testbed {self.name!r}: unknown task(s) {unknown}; tasks: {self.tasks}")
        self.classifier.load_vision(state)
        out = {}
        for t in tasks:
            out[t] = clip_evaluate(None, {t: self.heads[t]}, {t: datas[t]}, classifier=self.classifier,
                                   batch_size=self.batch_size, resize=self._resize,
                                   progress=self.progress).outcomes[t]
        datas.release()
        return scores(out)

    def loss_model(self, state: Mapping[str, Tensor], task: str) -> nn.Module:
        """The vision tower (weights ``state``, parameter names = its keys) with ``task``'s head
        frozen: CLIP-normalised images (N, 3, S, S) -> logits (N, C) = scale · f̂ Hᵀ, on the
        testbed's ``device`` (parameters and head there; give it :meth:`inputs`)."""
        head, scale = self.heads[task]
        features = _NamedTower(self.classifier.visual, state, hf=any(k.startswith("vision_model.") for k in state),
                               device=self.device)
        return with_frozen_head(features, (scale * head).to(self.device), None, normalize=True)

    def inputs(self, task: str, split: str = "val", limit: int | None = None) -> tuple[Tensor, Tensor]:
        """CLIP-normalised float32 images (N, 3, S, S) and int64 labels (N,) of a task split (the
        first ``limit`` examples), on the testbed's ``device``.

        Raises:
            KeyError: an unknown task."""
        d = (self.val if split == "val" else self.test)[task]
        n = len(d.labels) if limit is None else min(int(limit), len(d.labels))
        x = self.classifier.prepare(d.images[:n].to(self.device))
        return x, d.labels[:n].long().to(self.device)

    def fingerprint(self) -> dict | None:
        """sha256 of every checkpoint, head and data split, the caps, the settings and the
        evaluator's code: what a merged model's scores depend on besides the merge."""
        return dict(self._identity, data={t: [self._data_digest("val", t), self._data_digest("test", t)]
                                          for t in self.tasks})

    # -------------------------------------------------------------------- family-specific
    def matrix_keys(self) -> list[str]:
        """θ0's keys the rule treats as maps."""
        return self.rule.matrix_keys(self.pretrained)

    def network_order(self) -> list[str]:
        """The matrix keys from input to output: the patch embedding (``conv1`` /
        ``patch_embedding``), the transformer blocks in order (each block's keys as stored), then
        the rest, e.g. the output projection (``visual.proj`` / ``visual_projection``), which state
        dicts (and a sort by name) put before the blocks."""
        import re

        keys = self.matrix_keys()
        block = {k: int(m.group(1)) for k in keys if (m := re.search(r"\.(?:resblocks|layers)\.(\d+)\.", k))}
        first = [k for k in keys if k not in block and re.search(r"(conv1|patch_embedding)\.", k)]
        return first + sorted((k for k in keys if k in block), key=lambda k: block[k]) + [
            k for k in keys if k not in block and k not in first]

    def _data_digest(self, split: str, task: str) -> str:
        """sha256 of a task split's images and labels (:func:`_digest`), computed at load."""
        key = (split, task)
        if key not in self._digests:
            d = (self.val if split == "val" else self.test)[task]
            self._digests[key] = _digest(d.images, d.labels)
        return self._digests[key]

    def _lora_source(self, task: str, meta: Mapping[str, Tensor]):
        """The PEFT adapter of ``task`` as a streamed-merge source (``pactlib.peft.AdapterSource``),
        its keys mapped onto θ0's as :meth:`_lora_delta` maps them.

        Raises:
            CheckpointError: the adapter's keys fit θ0 under no key map (the first error)."""
        from ..checks import CheckpointError
        from ..peft import AdapterSource

        path = self.files[f"lora:{task}"]
        key_map = self.options.get("lora_key_map")
        first = None
        for m in ([key_map] if key_map else [None, "hf_clip_to_open_clip"]):
            src = AdapterSource(path, key_map=m, name=task)
            try:
                src.check(meta)
                return src
            except CheckpointError as e:
                first = first or e
        raise first

    def _lora_delta(self, task: str) -> dict[str, Tensor]:
        """Δ of one PEFT LoRA adapter over θ0's floating keys (zero where the adapter does not act),
        the scale applied once (:func:`pactlib.peft.read_adapter`). Adapter keys are mapped onto θ0's
        with the option ``lora_key_map``; None tries them as they are, then Hugging Face CLIP names
        onto open_clip ones (``"hf_clip_to_open_clip"``)."""
        from ..checks import CheckpointError

        read_adapter = _adapter_reader()
        path = self.files[f"lora:{task}"]
        key_map = self.options.get("lora_key_map")
        maps = [key_map] if key_map else [None, "hf_clip_to_open_clip"]
        first = None
        for m in maps:
            try:
                return read_adapter(path, base_keys=self.pretrained, key_map=m, name=task).to_dict()
            except CheckpointError as e:
                first = first or e
        raise first


def _adapter_reader():
    """``pactlib.peft.read_adapter`` when it exists.

    Raises:
        RuntimeError: it does not exist yet (LoRA adapters are not readable in this version).
    """
    try:
        from ..peft import read_adapter  # type: ignore[attr-defined]
    except ImportError as e:
        raise RuntimeError("kind='lora' on a clip testbed reads PEFT LoRA adapters with pactlib.peft.read_adapter, "
                           f"which this version of pactlib does not have yet ({e}); LoRA adapters are not readable "
                           "yet: load the testbed with kind='full'") from None
    return read_adapter


def load(name: str, seed: int = 0, kind: str = "full", *, arch: str | dict | None = None,
         checkpoint_dir: str | None = None, pretrained_file: str = "zeroshot.pt",
         finetuned_pattern: str = "{task}/finetuned.pt", trust_pickle: bool = False, data_root: str | None = None,
         tasks: int | Sequence[str] = 8, heads: str = "zeroshot", head_pattern: str | None = None,
         text_file: str | None = None, quick_gelu: bool = False, naming: str = "open_clip",
         image_size: int | None = None, val_limit: int | None = None, test_limit: int | None = None,
         device: str = "auto", batch_size: int = 128, lora: str | None = None, lora_key_map: str | None = None,
         cache_dir: str | None = None, progress: bool = False) -> ClipTestbed:
    """Load a clip testbed from the user's files (see the module docstring).

    Args:
        name: the defined name it is loaded under. seed: the fine-tuning seed (0 unless a path
            holds ``{seed}``). kind: ``"full"``, or ``"lora"`` (adapters at ``lora``).
        arch: open_clip architecture name (``"ViT-B-32"``, ``"ViT-L-14"``) or config dict; built
            with random weights, then yours (never downloaded). quick_gelu: OpenAI's CLIP weights need it.
        checkpoint_dir: folder of the checkpoints; ``pretrained_file`` (θ0) and
            ``finetuned_pattern`` (``{task}``: the task name) are relative to it.
        trust_pickle: allow unpickling task_vectors / TSV ``ImageEncoder`` files (runs their code).
        data_root: one folder per dataset (:mod:`pactlib.data.paper` layouts and aliases).
        tasks: 8, 14 or 20 (:data:`pactlib.data.paper.PAPER_TASKS`) or a list of task names.
        heads: ``"zeroshot"`` or a folder of head files (``head_pattern``, default
            ``head_{task}.pt`` then ``head_{task}Val.pt``). text_file: a full CLIP checkpoint whose
            text tower makes the zero-shot heads, when θ0's file has none.
        naming: ``"open_clip"`` (Hugging Face towers converted: the reference code's per-layer view)
            or ``"native"``.
        image_size: side the images are decoded at (default: the architecture's).
        val_limit, test_limit: seeded subsets of each split (None: all).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when present): evaluation, merging and PACT.
        batch_size: images per forward pass. lora: PEFT adapter folder pattern (``{task}``) under
            ``checkpoint_dir``; lora_key_map: a key map of :data:`pactlib.peft.KEY_MAPS` (None: the
            adapter's keys as they are, else Hugging Face CLIP names onto open_clip ones).
        cache_dir: the disk cache (default ``pactlib.paths.cache_dir("clip")``).
        progress: progress bars while evaluating.

    Raises:
        KeyError / TypeError / ValueError: a missing or bad option (named). FileNotFoundError: a
        missing file or folder (named with its option). CheckpointError / PickleRefused: unreadable
        or mismatched checkpoints. RuntimeError: ``kind="lora"`` without a LoRA reader.
    """
    from .. import paths
    from ..data import paper
    from ..models import clip as mclip

    options = dict(arch=arch, checkpoint_dir=checkpoint_dir, pretrained_file=pretrained_file,
                   finetuned_pattern=finetuned_pattern, trust_pickle=trust_pickle, data_root=data_root, tasks=tasks,
                   heads=str(heads), head_pattern=head_pattern, text_file=text_file, quick_gelu=quick_gelu,
                   naming=naming, image_size=image_size, val_limit=val_limit, test_limit=test_limit, device=device,
                   batch_size=batch_size, lora=lora, lora_key_map=lora_key_map, cache_dir=cache_dir,
                   progress=progress)
    check_options(options)
    if kind not in ("full", "lora"):
        raise ValueError(f"testbed kind must be 'full' or 'lora', got {kind!r}")
    if kind == "lora" and not lora:
        raise ValueError(f"testbed {name!r}: kind='lora' needs the option 'lora' (adapter path pattern with {{task}})")
    if seed != 0 and not any("{seed}" in str(p) for p in (checkpoint_dir, pretrained_file, finetuned_pattern)):
        raise ValueError(f"testbed {name!r}: its files are one fine-tuning run (seed 0); put {{seed}} into "
                         f"checkpoint_dir, pretrained_file or finetuned_pattern to load seed {seed}")
    task_names = tasks_of(tasks)
    missing = missing_paths(options, seed, kind)
    if missing:
        raise FileNotFoundError(f"testbed {name!r}: " + "; ".join(f"{k}: {p} does not exist" for k, p in missing[:8]))
    device = resolve_device(device)
    cache = _Cache(Path(cache_dir) if cache_dir else paths.cache_dir("clip"))
    root, pre_path, ft_paths = files_of(options, seed)
    files: dict[str, Path] = {"pretrained": pre_path}
    if kind == "full":
        files.update(ft_paths)
    else:
        files.update({f"lora:{t}": root / _seeded(lora, seed).format(task=t) for t in task_names})

    # θ0: the vision tower in one naming; the rule by format
    sha = {k: cache.file_sha256(p) for k, p in files.items()}
    raw0 = mclip.load_clip_checkpoint(pre_path, trust_pickle=trust_pickle)
    fmt = mclip.detect_format(raw0)
    theta0 = mclip.vision_state_dict(raw0, naming=naming)
    hf_native = fmt == "hf" and naming == "native"
    rule: MatrixRule = PRESETS["hf_encoder" if hf_native else "open_clip"]
    if hf_native:
        warnings.warn(f"testbed {name!r}: Hugging Face CLIP files kept in their own naming (naming='native'): "
                      "q, k and v are three (d, d) matrices here, one fused (3d, d) in_proj_weight in open_clip "
                      "files and in the reference code, so Iso-C, TSV-M, Iso-CTS and PACT give different updates "
                      "for the same weights; naming='open_clip' (the default) converts them to one view",
                      UserWarning, stacklevel=2)

    # every tower converted once to safetensors in the cache (keyed by content), then read key by key
    from ..checks import CheckpointError
    from ..lazy import open_checkpoint

    tower_files = {"pretrained": _tower_file(cache.root, sha["pretrained"], naming, lambda: (theta0, fmt),
                                             source=pre_path)}

    def read_tower(task: str):
        raw = mclip.load_clip_checkpoint(ft_paths[task], trust_pickle=trust_pickle)
        return mclip.vision_state_dict(raw, naming=naming), mclip.detect_format(raw)

    if kind == "full":
        for t in task_names:
            tower_files[t] = _tower_file(cache.root, sha[t], naming, lambda t=t: read_tower(t), source=ft_paths[t])
            f = _tower_format(tower_files[t])
            if naming == "native" and (f == "hf") != (fmt == "hf"):
                raise CheckpointError(f"testbed {name!r}: θ0 ({pre_path.name}) is a {fmt} checkpoint but θt of {t} "
                                      f"({ft_paths[t]}) is {f}: their keys differ (separate q/k/v vs fused "
                                      "in_proj); with naming='open_clip' (the default) both are read in one naming")
    finetuned = _Towers(lambda t: _LazyTower(open_checkpoint(tower_files[t], name=f"θt of {t} ({ft_paths[t]})")),
                        task_names, keep=len(task_names))

    # the model: vision tower + (for zero-shot heads) the text tower; random init, then the user's weights
    text_source: Any = raw0
    if heads == "zeroshot":
        if text_file:
            text_source = mclip.load_clip_checkpoint(text_file, trust_pickle=trust_pickle)
        elif not _has_text(raw0):
            raise ValueError(f"testbed {name!r}: heads='zeroshot' needs CLIP's text tower, and θ0's file {pre_path} "
                             "holds the image encoder only; give text_file (a full CLIP checkpoint of the same "
                             "architecture, e.g. OpenAI's ViT-B-32.pt) or a folder of head files as heads")
    model, tokenizer = mclip.build_clip(arch, weights=text_source, quick_gelu=quick_gelu, trust_pickle=trust_pickle)
    size = model.visual.image_size
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    image_size = int(image_size or size)

    # data: the reference protocol's validation split and the test split, decoded once (cached),
    # each split kept in a file of its own and read per task when evaluated
    limit = {"train": 0, "val": val_limit, "test": test_limit}
    split_files: dict[str, dict[str, Path]] = {"val": {}, "test": {}}
    classes: dict[str, tuple[str, ...]] = {}
    digests: dict[tuple[str, str], str] = {}
    for t in task_names:
        splits = paper.load_paper_task(t, paper.task_root(data_root, t), image_size=image_size, seed=0, limit=limit,
                                       cache_dir=cache.root / "data")
        classes[t] = tuple(splits["val"].classes)
        for split in ("val", "test"):
            split_files[split][t], digests[split, t] = _split_file(cache.root, splits[split])
        del splits
    val, test = _Splits("val", split_files["val"], classes), _Splits("test", split_files["test"], classes)

    # heads
    text_sha = cache.file_sha256(Path(text_file)) if (heads == "zeroshot" and text_file) else sha["pretrained"]
    head_of: dict[str, tuple[Tensor, float]] = {}
    head_ids: dict[str, str] = {}
    clip_code = code_fingerprint(["pactlib.models.clip"])
    for t in task_names:
        if heads == "zeroshot":
            templates = paper.templates_for(t)
            names = list(classes[t])
            synonyms = class_synonyms(t, names)
            spec = dict(text=text_sha, arch=arch, quick_gelu=quick_gelu, classes=names, templates=list(templates),
                        code=clip_code)
            if any(len(s) > 1 for s in synonyms):  # only then: the other heads' keys stay as they were
                spec["synonyms"] = synonyms
            key = json.dumps(spec, sort_keys=True)

            def compute(synonyms=synonyms, templates=templates):
                h = synonym_head(model, tokenizer, synonyms, templates)
                return h, float(model.logit_scale.detach().exp())

            head_of[t] = cache.head(key, compute)
            head_ids[t] = hashlib.sha256(key.encode()).hexdigest()
        else:
            f = _head_file(Path(heads), t, head_pattern)
            head_of[t] = mclip.read_head(f, trust_pickle=trust_pickle)
            head_ids[t] = cache.file_sha256(f)
    classifier = mclip.ClipClassifier.from_clip(model, head_of[task_names[0]][0])
    classifier.load_vision(raw0)  # θ0's tower (the model may hold text_file's)
    del model, raw0, text_source  # the text tower is not needed any more
    classifier.to(device).eval()

    identity = dict(family=FAMILY, kind=kind, pretrained=sha["pretrained"],
                    checkpoints=[[t, sha[t] if kind == "full" else sha[f"lora:{t}"]] for t in task_names],
                    heads=[[t, head_ids[t]] for t in task_names], arch=arch, quick_gelu=quick_gelu, naming=naming,
                    image_size=image_size, val_limit=val_limit, test_limit=test_limit,
                    device=torch.device(device).type, eval_code=code_fingerprint(EVAL_MODULES))
    tb = ClipTestbed(name, seed, kind, task_names, pretrained=theta0, finetuned=finetuned, rule=rule,
                     heads=head_of, val=val, test=test, classifier=classifier, device=device, format=fmt,
                     naming=naming, files=files, options=options, val_limit=val_limit, test_limit=test_limit,
                     cache_dir=cache.root, batch_size=int(batch_size), progress=bool(progress),
                     _resize=image_size != size, _identity=identity, _digests=digests, _tower_files=tower_files,
                     ft_val={}, ft_test={}, zs_test={})
    if kind == "lora":  # θ0 + Δt, formed when asked for; one kept
        tb.finetuned = _Towers(lambda t: TaskVector(tb._lora_delta(t), name=t).apply_to(theta0, 1.0), task_names,
                               keep=1)

    # reference accuracies, cached by content
    def acc(which: str, t: str, split: str) -> float:
        ident = sha["pretrained"] if which == "zero-shot" else identity["checkpoints"][task_names.index(t)][1]
        key = json.dumps(dict(which=which, model=ident, pretrained=sha["pretrained"], head=head_ids[t], task=t,
                              split=split, data=tb._data_digest(split, t), kind=kind, naming=naming,
                              arch=arch, quick_gelu=quick_gelu, device=identity["device"],
                              code=identity["eval_code"]), sort_keys=True)
        state = theta0 if which == "zero-shot" else None
        return cache.accuracy(key, lambda: tb.evaluate(state if state is not None else tb.finetuned[t], split, [t])[t])

    for t in task_names:
        tb.ft_val[t] = acc("fine-tuned", t, "val")
        tb.ft_test[t] = acc("fine-tuned", t, "test")
        tb.zs_test[t] = acc("zero-shot", t, "test")
    return tb


def class_synonyms(task: str, names: Sequence[str]) -> list[list[str]]:
    """Every standard name of each class: ``[[name, synonym, ...], ...]`` in the order of ``names``.

    For a dataset whose standard class list gives several names per class (FER2013, as in OpenAI
    CLIP's ``data/prompts.md`` and tall_masks' ``fer2013.py``; the ``synonyms`` of its entry in
    ``clip_prompts.json``), a class whose prompt name is the first of its synonyms gets them all;
    every other class (and every other dataset, or names from ``classnames.txt`` that are not the
    standard ones) gets ``[name]``.
    """
    from ..data.paper import _prompts_doc

    e = _prompts_doc()["datasets"].get(task, {})
    syn = {cls: list(s) for cls, s in zip(e.get("classnames", ()), e.get("synonyms", ())) if s and s[0] == cls}
    return [syn.get(n, [n]) for n in names]


def synonym_head(model: nn.Module, tokenizer, synonyms: Sequence[Sequence[str]], templates: Sequence) -> Tensor:
    """Zero-shot head with several names per class: (C, d) float32 unit rows.

    Row c is the normalised mean of the unit text embeddings of every prompt ``template.format(s)``
    over every template and every name ``s`` of ``synonyms[c]`` (OpenAI CLIP's construction for
    classes with synonyms); with one name per class it is :func:`pactlib.models.clip.zeroshot_head`
    exactly (the same call). tall_masks' ``heads.py`` instead formats the Python list itself into
    each template (``"a photo of a ['happy', 'smiling'] looking face."``); that is not done here.

    Raises:
        ValueError: as :func:`pactlib.models.clip.zeroshot_head` (no classes, no templates, a
        template without ``{}``), or a class with no name.
    """
    from ..models.clip import zeroshot_head

    if any(len(s) == 0 for s in synonyms):
        raise ValueError("synonym_head: a class has no name")
    if all(len(s) == 1 for s in synonyms):
        return zeroshot_head(model, tokenizer, [s[0] for s in synonyms], templates)
    if not templates:
        raise ValueError("zeroshot_head: templates is empty")
    for t in templates:
        if isinstance(t, str) and "{}" not in t:
            raise ValueError(f"zeroshot_head: template {t!r} has no '{{}}' for the class name")
    rows = []
    for names in synonyms:
        prompts = [t.format(n) if isinstance(t, str) else t(n) for n in names for t in templates]
        rows.append(zeroshot_head(model, tokenizer, [names[0]], [lambda _c, p=p: p for p in prompts]))
    return torch.cat(rows)


def _has_text(raw: Mapping[str, Tensor]) -> bool:
    """Whether a raw CLIP state dict holds a text transformer (open_clip or Hugging Face keys)."""
    from ..models.clip import _strip_wrappers

    return any(k.startswith(("transformer.", "text_model.")) for k in _strip_wrappers(raw))
