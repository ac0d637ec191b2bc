"""The paper's datasets, read from local folders the user supplies (no download, ever).

The 8 / 14 / 20-task suites of the model-merging literature (:data:`PAPER_TASKS`) exist in no
package registry; a user who has them on disk points :func:`load_paper_task` at one folder per
dataset. Four layouts are recognised for a split ``S`` of a dataset folder ``root``:

- ``folder``: ``root/S/<class>/…/*.jpg`` (ImageFolder: classes are the sorted sub-folder
  names, files are collected recursively in sorted order, exactly as torchvision does, so the
  reference code's split indices are reproduced on the same folders);
- ``csv``: ``root/S.csv`` with a path column (``path``, ``filename``, ``file``, ``image``)
  and a label column (``label``, ``class``, ``classid``, ``target``), ``,`` ``;`` or tab
  separated (GTSRB's ``GT-final_test.csv`` style); paths relative to ``root/S`` or ``root``;
  labels are class indices or class names;
- ``list``: ``root/S.txt``, one image per line, relative to ``root`` (the class is the parent
  folder) or a bare file name looked up in ``root``'s class folders (RESISC45's split lists);
- ``npz``: ``root/S.npz`` with ``images`` (N, H, W), (N, H, W, C) or (N, C, H, W) uint8 and
  ``labels`` (N,) (digit sets converted once by the user).

Class names and prompt templates for zero-shot heads are the standard ones of each dataset,
recorded verbatim with their sources in ``pactlib/data/clip_prompts.json`` (:func:`clip_prompts`):
the templates of the task_vectors / TALL-masks code (which built the literature's heads), its
class names in the datasets' label order, and OpenAI CLIP's ``data/prompts.md`` as an
alternative where it differs. A dataset folder's classes are matched to the standard names by
name (folder spellings such as ``AnnualCrop`` or ``a_abbey`` included) or, for integer class
labels (``00000``, npz / CSV labels), by class index; ``root/classnames.txt`` (one name per line,
label order) overrides the standard names. Tasks outside the file use the cleaned folder names.

Splits follow the reference protocol (book/method.md, protocol): the validation split is 10 % of the
train split, at most 5,000 images, drawn by ``torch.randperm`` seeded 0, like
``torch.utils.data.random_split`` in the task_vectors / TSV code; the test split is the
dataset's own ``test`` folder (or ``val`` where a layout has no test, as their SUN397 and DTD
folders). Images are decoded once to uint8 (N, 3, S, S): RGB, shorter side resized to S
(bicubic), centre crop, the geometry of CLIP's evaluation transform. ``limit`` keeps a seeded
random subset of each split for CPU-sized runs; ``cache_dir`` stores decoded splits atomically.

Memory: a full split is held in memory (SUN397's 87k train images at 224 px take 13 GB); use
``limit`` or a smaller ``image_size`` on small machines.

Book: chapter "Paper scale".
"""
from __future__ import annotations

import csv
import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from pactlib.data.store import TaskData  # the built-in testbed's container: same fields

log = logging.getLogger(__name__)

#: The task suites of the literature (task_vectors / TALL masks / TSV / Iso-C), in their order.
PAPER_TASKS: dict[int, tuple[str, ...]] = {
    8: ("SUN397", "Cars", "RESISC45", "EuroSAT", "SVHN", "GTSRB", "MNIST", "DTD"),
}
PAPER_TASKS[14] = PAPER_TASKS[8] + ("CIFAR100", "STL10", "Flowers102", "OxfordIIITPet", "PCAM", "FER2013")
PAPER_TASKS[20] = PAPER_TASKS[14] + ("EMNIST", "CIFAR10", "Food101", "FashionMNIST", "RenderedSST2", "KMNIST")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VAL_FRACTION = 0.1
MAX_VAL = 5000

#: Folder names under a data root that :func:`task_root` tries, besides the task name itself.
ALIASES: dict[str, tuple[str, ...]] = {
    "SUN397": ("sun397",), "Cars": ("cars", "stanford_cars", "StanfordCars"),
    "RESISC45": ("resisc45", "NWPU-RESISC45"), "EuroSAT": ("eurosat", "EuroSAT_splits"),
    "SVHN": ("svhn",), "GTSRB": ("gtsrb",), "MNIST": ("mnist",), "DTD": ("dtd",),
    "CIFAR100": ("cifar100", "cifar-100"), "STL10": ("stl10",), "Flowers102": ("flowers102", "flowers"),
    "OxfordIIITPet": ("oxford_pets", "oxford-iiit-pet", "pets"), "PCAM": ("pcam",), "FER2013": ("fer2013",),
    "EMNIST": ("emnist",), "CIFAR10": ("cifar10", "cifar-10"), "Food101": ("food101", "food-101"),
    "FashionMNIST": ("fashion_mnist", "fashion-mnist"), "RenderedSST2": ("rendered_sst2", "renderedsst2"),
    "KMNIST": ("kmnist",),
}

#: The package data file of standard class names and templates (see :func:`clip_prompts`).
PROMPTS_FILE = "clip_prompts.json"
#: The recorded variants: the literature's (default), OpenAI CLIP's ``data/prompts.md``, the TSV code's.
PROMPT_VARIANTS = ("default", "openai", "task_singular_vectors")


@functools.lru_cache(maxsize=1)
def _prompts_doc() -> dict:
    text = importlib.resources.files(__package__).joinpath(PROMPTS_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@dataclass(frozen=True)
class ClipPrompts:
    """A dataset's standard class names and prompt templates, as recorded in ``clip_prompts.json``.

    Attributes:
        task: the task name (a key of :data:`PAPER_TASKS`' suites).
        variant: one of :data:`PROMPT_VARIANTS`.
        classnames: C names, in the label order of the variant's source.
        templates: T strings, each with one ``{}`` for the class name.
        source: {"classnames": {repo, path, commit, ...}, "templates": {...}}.
        note: where sources differ, in words ("" if they agree).
    """

    task: str
    variant: str
    classnames: tuple[str, ...]
    templates: tuple[str, ...]
    source: dict
    note: str = ""


def prompt_tasks() -> tuple[str, ...]:
    """The tasks with recorded class names and templates (the 20-task suite)."""
    return tuple(_prompts_doc()["datasets"])


def clip_prompts(task: str, variant: str = "default") -> ClipPrompts:
    """The standard class names and templates of ``task`` (``pactlib/data/clip_prompts.json``).

    ``default`` is what the merging literature's zero-shot heads were built with (templates of
    mlfoundations/task_vectors ``src/datasets/templates.py``, extended to 20 tasks by
    nik-dim/tall_masks; class names in the datasets' label order); ``openai`` is OpenAI CLIP's
    ``data/prompts.md``; ``task_singular_vectors`` the TSV code's templates. A variant that
    records no difference for ``task`` gives the default lists.

    Raises:
        KeyError: ``task`` not recorded (the recorded tasks are named).
        ValueError: an unknown variant, or ``openai`` for a dataset prompts.md lacks.
    """
    if variant not in PROMPT_VARIANTS:
        raise ValueError(f"unknown prompt variant {variant!r}; one of {PROMPT_VARIANTS}")
    datasets = _prompts_doc()["datasets"]
    if task not in datasets:
        raise KeyError(f"no standard class names / templates recorded for {task!r} in {PROMPTS_FILE}; "
                       f"recorded: {', '.join(datasets)}")
    e = datasets[task]
    names, templates = e["classnames"], e["templates"]
    source = {k: dict(v) for k, v in e["source"].items()}  # copies: the parsed file stays as read
    if variant != "default":
        alt = e.get("alternatives", {}).get(variant)
        if alt is None and variant == "openai":
            raise ValueError(f"{task}: openai/CLIP data/prompts.md has no prompts for this dataset "
                             f"(use the default variant)")
        if alt is not None:
            if "classnames" in alt:
                names, source["classnames"] = alt["classnames"], dict(alt["source"])
            if "templates" in alt:
                templates, source["templates"] = alt["templates"], dict(alt["source"])
    return ClipPrompts(task, variant, tuple(names), tuple(templates), source, e.get("note", ""))


def _generic_templates() -> tuple[str, ...]:
    return tuple(_prompts_doc()["generic"]["templates"])


def paper_tasks(n: int) -> tuple[str, ...]:
    """The task names of the ``n``-task suite (8, 14 or 20).

    Raises:
        ValueError: ``n`` not one of the suites.
    """
    if n not in PAPER_TASKS:
        raise ValueError(f"no {n}-task suite; the paper uses {sorted(PAPER_TASKS)}")
    return PAPER_TASKS[n]


def templates_for(task: str, variant: str = "default") -> tuple[str, ...]:
    """Prompt templates of ``task``: the standard ones (:func:`clip_prompts`), each with one ``{}``.

    A task outside ``clip_prompts.json`` gets CLIP's generic prompt (the ``generic`` entry:
    OpenAI CLIP README's zero-shot example).
    """
    if task in _prompts_doc()["datasets"]:
        return clip_prompts(task, variant).templates
    return _generic_templates()


def task_root(data_root: str | Path, task: str) -> Path:
    """The folder of ``task`` under ``data_root``: the task name or a known alias, any case.

    Raises:
        FileNotFoundError: none found (the names tried and the folders present are listed).
    """
    data_root = Path(data_root)
    if not data_root.is_dir():
        raise FileNotFoundError(f"data root not found: {data_root}")
    wanted = [task, *ALIASES.get(task, ())]
    present = {p.name.lower(): p for p in data_root.iterdir() if p.is_dir()}
    for name in wanted:
        if name.lower() in present:
            return present[name.lower()]
    raise FileNotFoundError(f"no folder for task {task!r} in {data_root} (tried {wanted}); "
                            f"folders there: {sorted(present)[:20]}")


# --------------------------------------------------------------------------- indexing splits


@dataclass(frozen=True)
class SplitIndex:
    """Files and labels of one split before decoding.

    Attributes:
        layout: ``"folder"``, ``"csv"``, ``"list"`` or ``"npz"``.
        files: N image paths (empty for ``npz``, whose images are in ``array``).
        labels: int64 (N,).
        classes: the folder / file class names, in label order (not yet prompt names).
        array: for ``npz`` only, the uint8 images as stored.
    """

    layout: str
    files: tuple[Path, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    array: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def _class_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively), in torchvision's ImageFolder order."""
    out = []
    for dirpath, _, names in sorted(os.walk(folder, followlinks=True)):  # as torchvision's make_dataset
        out.extend(Path(dirpath) / n for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS))
    return out


def _map_labels(found: Sequence[str], classes: Sequence[str] | None, where: str) -> tuple[str, ...]:
    if classes is None:
        return tuple(found)
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise ValueError(f"{where}: classes {unknown[:5]} are not among the train split's classes")
    return tuple(classes)


def _index_folder(folder: Path, classes: Sequence[str] | None) -> SplitIndex:
    found = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not found:
        raise FileNotFoundError(f"{folder}: no class sub-folders (expected {folder}/<class>/<image>)")
    classes = _map_labels(found, classes, str(folder))
    files, labels = [], []
    for name in found:
        fs = _class_files(folder / name)
        files += fs
        labels += [classes.index(name)] * len(fs)
    if not files:
        raise FileNotFoundError(f"{folder}: class folders hold no images ({', '.join(IMAGE_EXTENSIONS)})")
    return SplitIndex("folder", tuple(files), np.asarray(labels, dtype=np.int64), classes)


def _pick(fieldnames: Sequence[str], options: Sequence[str], path: Path) -> str:
    lower = {f.strip().lower(): f for f in fieldnames}
    for o in options:
        if o in lower:
            return lower[o]
    raise ValueError(f"{path}: no column among {list(options)}; columns are {list(fieldnames)}")


def _index_csv(path: Path, root: Path, split: str, classes: Sequence[str] | None) -> SplitIndex:
    text = path.read_text()
    dialect = csv.Sniffer().sniff(text.splitlines()[0], delimiters=",;\t")
    rows = list(csv.DictReader(text.splitlines(), dialect=dialect, skipinitialspace=True))
    if not rows:
        raise ValueError(f"{path}: no rows")
    pcol = _pick(rows[0].keys(), ("path", "filename", "file", "image", "image_path"), path)
    lcol = _pick(rows[0].keys(), ("label", "class", "classid", "class_id", "target"), path)
    base = root / split if (root / split).is_dir() else root
    files = [base / r[pcol].strip() for r in rows]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: {len(missing)} listed image(s) not found, e.g. {missing[0]}")
    raw = [r[lcol].strip() for r in rows]
    if all(v.lstrip("-").isdigit() for v in raw):
        labels = np.asarray([int(v) for v in raw], dtype=np.int64)
        if classes is None:
            classes = tuple(str(i) for i in range(int(labels.max()) + 1))
        if labels.min() < 0 or labels.max() >= len(classes):
            raise ValueError(f"{path}: labels span {labels.min()}..{labels.max()}, {len(classes)} classes")
    else:
        classes = _map_labels(sorted(set(raw)), classes, str(path))
        pos = {c: i for i, c in enumerate(classes)}
        labels = np.asarray([pos[v] for v in raw], dtype=np.int64)
    return SplitIndex("csv", tuple(files), labels, tuple(classes))


def _index_list(path: Path, root: Path, classes: Sequence[str] | None) -> SplitIndex:
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    by_name: dict[str, Path] | None = None
    files = []
    for ln in lines:
        rel = ln.lstrip("/")
        if "/" in rel:
            f = root / rel
        else:  # a bare file name (RESISC45's lists): find it in the class folders
            if by_name is None:
                by_name = {p.name: p for p in root.rglob("*") if _is_image(p)}
            f = by_name.get(rel, root / rel)
        if not f.is_file():
            raise FileNotFoundError(f"{path}: listed image {ln!r} not found under {root}")
        files.append(f)
    names = [str(f.parent.relative_to(root)) for f in files]
    classes = _map_labels(sorted(set(names)), classes, str(path))
    pos = {c: i for i, c in enumerate(classes)}
    labels = np.asarray([pos[n] for n in names], dtype=np.int64)
    return SplitIndex("list", tuple(files), labels, classes)


def _index_npz(path: Path, classes: Sequence[str] | None) -> SplitIndex:
    with np.load(path, allow_pickle=False) as z:
        if "images" not in z or "labels" not in z:
            raise ValueError(f"{path}: needs arrays 'images' and 'labels', has {list(z.keys())}")
        images, labels = z["images"], z["labels"].astype(np.int64)
        stored = tuple(str(c) for c in z["classes"]) if "classes" in z else None
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(labels):
        raise ValueError(f"{path}: images must be uint8 (N, H, W[, C]) or (N, C, H, W) with N = "
                         f"{len(labels)} labels; got {images.dtype} {images.shape}")
    classes = tuple(classes or stored or (str(i) for i in range(int(labels.max()) + 1)))
    if labels.min() < 0 or labels.max() >= len(classes):
        raise ValueError(f"{path}: labels span {labels.min()}..{labels.max()}, {len(classes)} classes")
    return SplitIndex("npz", (), labels, classes, array=images)


def index_split(root: str | Path, split: str, *, classes: Sequence[str] | None = None) -> SplitIndex:
    """Find split ``split`` of the dataset folder ``root`` in any of the four layouts.

    Args:
        classes: the train split's class list; given for val/test splits so that labels mean
            the same classes (a class folder missing from a split is fine, an unknown one not).

    Raises:
        FileNotFoundError: no layout found (the paths tried are named), or listed images missing.
        ValueError: malformed CSV / npz, or classes not in ``classes``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    if (root / split).is_dir():
        return _index_folder(root / split, classes)
    if (root / f"{split}.csv").is_file():
        return _index_csv(root / f"{split}.csv", root, split, classes)
    if (root / f"{split}.txt").is_file():
        return _index_list(root / f"{split}.txt", root, classes)
    if (root / f"{split}.npz").is_file():
        return _index_npz(root / f"{split}.npz", classes)
    tried = [f"{split}/", f"{split}.csv", f"{split}.txt", f"{split}.npz"]
    present = sorted(p.name for p in root.iterdir())[:20]
    raise FileNotFoundError(f"split {split!r} not found in {root}: tried {tried}; present: {present}")


def has_split(root: str | Path, split: str) -> bool:
    """Whether ``root`` holds split ``split`` in one of the layouts of :func:`index_split`."""
    root = Path(root)
    return (root / split).is_dir() or any((root / f"{split}{e}").is_file() for e in (".csv", ".txt", ".npz"))


# --------------------------------------------------------------------------- decoding


def _square(img: Image.Image, size: int) -> np.ndarray:
    """RGB, shorter side -> ``size`` (bicubic), centre crop: uint8 (size, size, 3).

    The arithmetic of torchvision's ``Resize(size)`` + ``CenterCrop(size)`` on PIL images
    (the long side truncated, the crop offset rounded), i.e. CLIP's evaluation transform.
    """
    img = img.convert("RGB")
    w, h = img.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    if (nw, nh) != (w, h):
        img = img.resize((nw, nh), Image.BICUBIC)
    left, top = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)), dtype=np.uint8)


def decode(index: SplitIndex, rows: np.ndarray, image_size: int) -> Tensor:
    """Decode the images ``rows`` of ``index``: uint8 (len(rows), 3, S, S), S = ``image_size``.

    Raises:
        OSError: an unreadable image (the file is named).
    """
    out = np.empty((len(rows), image_size, image_size, 3), dtype=np.uint8)
    for j, i in enumerate(rows):
        if index.array is not None:
            a = index.array[i]
            if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
                a = np.moveaxis(a, 0, -1)  # (C, H, W) -> (H, W, C)
            img = Image.fromarray(a.squeeze(-1) if a.ndim == 3 and a.shape[-1] == 1 else a)
        else:
            try:
                with Image.open(index.files[i]) as f:
                    img = f.copy()
            except OSError as err:
                raise OSError(f"cannot read image {index.files[i]}: {err}") from err
        out[j] = _square(img, image_size)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()  # (N, 3, S, S)


# --------------------------------------------------------------------------- splits


def train_val_indices(n: int, *, val_fraction: float = VAL_FRACTION, max_val: int | None = MAX_VAL,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Reference train/validation split of ``n`` train items (book/method.md, protocol).

    val = min(⌊n · val_fraction⌋, max_val) items; a permutation from ``torch.randperm`` with a
    generator seeded ``seed`` gives train its first n − val entries and validation the rest --
    the indices ``torch.utils.data.random_split(range(n), [n - val, val], generator)`` returns.

    Raises:
        ValueError: a fraction outside (0, 1) or a split that would be empty.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = int(n * val_fraction)
    if max_val is not None:
        n_val = min(n_val, int(max_val))
    if n_val <= 0 or n_val >= n:
        raise ValueError(f"{n} train items give an empty train or validation split (val = {n_val})")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    return perm[: n - n_val].astype(np.int64), perm[n - n_val:].astype(np.int64)


def _subset(rows: np.ndarray, limit: int | None, seed: int, salt: int) -> np.ndarray:
    """A seeded random subset of ``rows`` of size ``limit``, kept in the original order."""
    if limit is None or limit >= len(rows):
        return rows
    g = torch.Generator().manual_seed(seed * 1_000_003 + salt)
    keep = torch.randperm(len(rows), generator=g)[:limit].sort().values.numpy()
    return rows[keep]


def _norm(name: str) -> str:
    """A class name compared loosely: CamelCase split, lower case, runs of other characters -> one space."""
    name = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    return " ".join(re.sub(r"[^0-9a-z]+", " ", name.lower()).split())


def _candidates(name: str) -> list[str]:
    """Loose forms of a folder class name, most literal first: the whole name ('a/abbey', 'a_abbey'),
    without a leading one-letter group (SUN397's 'a/' prefix), its last path component; then the
    same without spaces ('annualcrop')."""
    out = []
    for s in (name, name.replace("\\", "/").rsplit("/", 1)[-1]):
        n = _norm(s)
        tokens = n.split()
        out.append(n)
        if len(tokens) > 1 and len(tokens[0]) == 1 and tokens[0].isalpha():
            out.append(" ".join(tokens[1:]))
    out += [c.replace(" ", "") for c in out]
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=None)
def _name_index(task: str) -> dict[str, int]:
    """Loose name -> default label index, from the recorded names and aliases of ``task``."""
    e = _prompts_doc()["datasets"][task]
    aliases = e.get("aliases") or [[] for _ in e["classnames"]]
    seen: dict[str, set[int]] = {}
    for i, (name, more) in enumerate(zip(e["classnames"], aliases)):
        for n in (name, *more):
            for key in {_norm(n), _norm(n).replace(" ", "")}:
                seen.setdefault(key, set()).add(i)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


@functools.lru_cache(maxsize=None)
def _aligned_names(task: str, variant: str) -> tuple[str, ...]:
    """The ``variant``'s class names in the default label order (matched by name).

    Raises:
        ValueError: the variant's names do not match the default ones one to one.
    """
    default, rec = clip_prompts(task), clip_prompts(task, variant)
    if rec.classnames == default.classnames:
        return rec.classnames
    index = _name_index(task)
    pos = [index.get(_norm(n)) for n in rec.classnames]
    if sorted(p for p in pos if p is not None) != list(range(len(default.classnames))):
        raise ValueError(f"{task}: the {variant} class names do not match the default ones one to one")
    out = [""] * len(pos)
    for j, i in enumerate(pos):
        out[i] = rec.classnames[j]
    return tuple(out)


def _standard_names(task: str, root: Path, classes: Sequence[str], variant: str) -> tuple[str, ...]:
    """The standard names of ``task`` for the folder classes ``classes`` (label order)."""
    names = _aligned_names(task, variant)
    n = len(names)
    fix = f"write {root / 'classnames.txt'} (one name per class, in label order) to name the classes yourself"
    if len(classes) != n:
        raise ValueError(f"{task}: the dataset folder {root} has {len(classes)} classes, the standard {task} "
                         f"class list has {n} ({PROMPTS_FILE}); check the folder is {task}, or {fix}")
    if all(re.fullmatch(r"\d+", c) for c in classes):  # class indices: 00000..00042, npz / CSV labels
        ids = [int(c) for c in classes]
        for base in (0, 1):
            if sorted(ids) == list(range(base, n + base)):
                return tuple(names[i - base] for i in ids)
    index = _name_index(task)
    found, unmatched = [], []
    for c in classes:
        i = next((index[k] for k in _candidates(c) if k in index), None)
        (unmatched.append(c) if i is None else found.append(i))
    if unmatched or len(set(found)) != n:
        what = (f"classes {unmatched[:5]} are not among its names" if unmatched
                else "several folder classes match the same standard class")
        raise ValueError(f"{task}: cannot match the classes of {root} to the standard {task} class names "
                         f"({PROMPTS_FILE}): {what}; {fix}")
    return tuple(names[i] for i in found)


def prompt_names(root: str | Path, classes: Sequence[str], task: str | None = None, *,
                 variant: str = "default") -> tuple[str, ...]:
    """Class names for prompts, in label order.

    ``root/classnames.txt`` if present (one per line: the user's names win); else, for a task of
    ``clip_prompts.json``, its standard names (``variant``, see :func:`clip_prompts`) matched to
    the folder classes by name (loosely: case, ``_`` / ``-`` / ``/``, CamelCase, SUN397's
    ``a/`` prefix and the recorded aliases such as EuroSAT's ``AnnualCrop``) or, when every class
    is an integer (0..C-1 or 1..C), by class index in the dataset's label order; else the
    folder names cleaned (``a/abbey`` -> ``abbey``, ``_`` -> space).

    Raises:
        ValueError: ``classnames.txt`` with a number of lines other than ``len(classes)``; for a
            standard task, a folder whose class count differs from the standard list's or whose
            classes cannot be matched to it (the dataset and the fix are named).
    """
    f = Path(root) / "classnames.txt"
    if f.is_file():
        names = tuple(ln.strip() for ln in f.read_text().splitlines() if ln.strip())
        if len(names) != len(classes):
            raise ValueError(f"{f}: {len(names)} names for {len(classes)} classes")
        return names
    if task is not None and task in _prompts_doc()["datasets"]:
        return _standard_names(task, Path(root), classes, variant)
    # 'a/abbey' (SUN397) -> 'abbey'; 'dense_residential' -> 'dense residential'
    return tuple(c.replace("\\", "/").rsplit("/", 1)[-1].replace("_", " ").strip() for c in classes)


def _cache_key(task, split, idx: SplitIndex, rows, image_size) -> str:
    h = hashlib.sha1(f"{task}|{split}|{image_size}|{idx.layout}|{len(idx)}".encode())
    h.update(np.ascontiguousarray(rows).tobytes())
    for f in idx.files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}".encode())
    if idx.array is not None:
        h.update(hashlib.sha1(np.ascontiguousarray(idx.array).tobytes()).digest())
    return h.hexdigest()[:16]


def _decoded(task, split, idx, rows, image_size, cache_dir) -> Tensor:
    if cache_dir is None:
        return decode(idx, rows, image_size)
    from pactlib.io import atomic_write

    path = Path(cache_dir) / f"{task}-{split}-{image_size}px-{_cache_key(task, split, idx, rows, image_size)}.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    images = decode(idx, rows, image_size)
    atomic_write(path, lambda p: torch.save(images, p))
    return images


def load_paper_task(task: str, root: str | Path, *, image_size: int = 224, seed: int = 0,
                    val_fraction: float = VAL_FRACTION, max_val: int | None = MAX_VAL,
                    test_split: str | None = None, limit: int | Mapping[str, int] | None = None,
                    cache_dir: str | Path | None = None, prompt_variant: str = "default") -> dict[str, TaskData]:
    """Train / validation / test splits of one paper dataset from its local folder.

    Args:
        task: the task name (e.g. ``"EuroSAT"``), stored in each ``TaskData``.
        root: the dataset's folder (see :func:`task_root` to find it under a data root).
        image_size: side S of the decoded square images, pixels (224 for ViT-B/32, B/16, L/14).
        seed: seed of the train/validation permutation (the reference protocol uses 0).
        val_fraction, max_val: validation share of train and its cap.
        test_split: the split evaluated as test; None: ``"test"``, else ``"val"``.
        limit: keep at most this many images per split (an int, or {split: int}); the subset
            is seeded by ``seed`` and drawn after the train/validation split.
        cache_dir: if given, decoded splits are cached there (atomic writes).
        prompt_variant: the standard class names used (:func:`prompt_names`, :func:`clip_prompts`).

    Returns:
        {"train", "val", "test"} -> TaskData with uint8 images (N, 3, S, S), int64 labels (N,)
        and the prompt class names (all splits share the train split's classes).

    Raises:
        FileNotFoundError: the folder, a split or an image is missing (named).
        ValueError: the same image file in train and test, malformed annotations, or classes
            that do not fit the task's standard class names (:func:`prompt_names`).
    """
    root = Path(root)
    train = index_split(root, "train")
    if test_split is None:
        test_split = "test" if has_split(root, "test") else "val"
        if test_split == "val":
            log.info("%s: no 'test' split in %s; the 'val' split is used as test", task, root)
    test = index_split(root, test_split, classes=train.classes)
    overlap = set(train.files) & set(test.files)
    if overlap:
        raise ValueError(f"{task}: {len(overlap)} image(s) in both train and {test_split}, e.g. {next(iter(overlap))}")
    tr_rows, va_rows = train_val_indices(len(train), val_fraction=val_fraction, max_val=max_val, seed=seed)
    lim = limit if isinstance(limit, Mapping) else {"train": limit, "val": limit, "test": limit}
    rows = {
        "train": _subset(tr_rows, lim.get("train"), seed, 1),
        "val": _subset(va_rows, lim.get("val"), seed, 2),
        "test": _subset(np.arange(len(test), dtype=np.int64), lim.get("test"), seed, 3),
    }
    classes = prompt_names(root, train.classes, task, variant=prompt_variant)
    out = {}
    for split, idx in (("train", train), ("val", train), ("test", test)):
        r = rows[split]
        images = _decoded(task, split, idx, r, image_size, cache_dir)
        labels = torch.from_numpy(idx.labels[r].copy())
        out[split] = TaskData(task=task, split=split, images=images, labels=labels, classes=classes)
    return out
