"""Photo-patch tasks: crops of real bundled photographs, split by image region.

``textures`` (7 grayscale texture classes) and ``photo_patches`` (which of 8 colour photos a
crop comes from). Both are ``derived=True``; every photo is cut into 64 px cells and train,
val and test take their patches from disjoint cells (:mod:`~pactlib.data.patches`). The two
tasks use disjoint photographs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from . import patches, sources
from .imaging import to_rgb32
from .registry import balanced, ordered, register, split_counts
from .splits import SPLITS, VAL_FRACTION, partition_items, rng_for

__all__ = ["TEXTURES", "SCENES"]

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
    counts = split_counts(max_trainval, max_test)
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
        for (label, cells), k in zip(per_split[split], balanced(range(len(classes)), n).values()):
            for _ in range(k):
                photo, corner = cells[int(rng.integers(len(cells)))]
                xs.append(patches.crop_patch(imgs[photo], corner, cell, rng, rotate=rotate))
                ys.append(label)
        arrays[split] = (to_rgb32(np.stack(xs)), np.array(ys, dtype=np.int64))
    return ordered(arrays, seed, name), {"cell_px": cell, "cells": cells_used}


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


@register(name="textures", classes=tuple(TEXTURES), source="pypi:scikit-image (bundled photos)",
          derived=True,
          description="Derived: grayscale texture patches (brick, grass, gravel, lunar surface, deep-"
                      "field galaxies, stained tissue, printed text) cropped from 8 real photographs "
                      "at random scale (32-64 px) with flips and 90° turns; each photo is cut into "
                      "64 px cells and train, val and test use disjoint cells.",
          provenance=_photo_prov(TEXTURES)[0], license=_photo_prov(TEXTURES)[1])
def _build_textures(seed, max_trainval, max_test):
    return _patch_task("textures", TEXTURES, seed, max_trainval, max_test, gray=True, rotate=True)


@register(name="photo_patches", classes=tuple(SCENES),
          source="pypi:scikit-image, scikit-learn, matplotlib (bundled photos)", derived=True,
          description="Derived: which of 8 colour photographs (astronaut, coffee cup, cat, rocket, "
                      "retina, temple, flower, portrait) a 32-64 px crop comes from; each photo is "
                      "cut into 64 px cells and train, val and test use disjoint cells.",
          provenance=_photo_prov(SCENES)[0], license=_photo_prov(SCENES)[1])
def _build_photo_patches(seed, max_trainval, max_test):
    return _patch_task("photo_patches", SCENES, seed, max_trainval, max_test, gray=False, rotate=False)
