"""Patches cropped from bundled photographs, split by image region.

A photo is cut into a grid of ``cell x cell`` pixel cells; each cell belongs to exactly one
split, and every patch lies inside one cell, so no pixel of a test patch is ever seen in
training. A patch is a square of random side (32 px up to the cell size) at a random place in
its cell, optionally flipped / rotated by multiples of 90°, area-averaged to 32x32.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from .imaging import SIZE, box_resize

__all__ = ["grid_cells", "crop_patch"]


def grid_cells(shape: Sequence[int], cell: int) -> list[tuple[int, int]]:
    """Top-left corners ``(row, col)`` of the full ``cell x cell`` cells of an ``(H, W, ...)`` image.

    Raises:
        ValueError: the image is smaller than one cell.
    """
    h, w = int(shape[0]), int(shape[1])
    if h < cell or w < cell:
        raise ValueError(f"image of shape {tuple(shape)} is smaller than one {cell}px cell")
    return [(r * cell, c * cell) for r in range(h // cell) for c in range(w // cell)]


def crop_patch(img: np.ndarray, corner: tuple[int, int], cell: int, rng: np.random.Generator, *,
               rotate: bool) -> np.ndarray:
    """One random square patch inside the cell at ``corner``, resized to 32x32.

    Args:
        img: uint8 ``(H, W)`` or ``(H, W, 3)``; not modified.
        corner: ``(row, col)`` of the cell's top-left pixel.
        cell: cell side in pixels (>= 32).
        rng: source of side, position, flips.
        rotate: also apply a random multiple of 90° (for orientation-free textures); a
            horizontal flip is always drawn with probability 1/2.

    Returns:
        uint8 ``(32, 32)`` or ``(32, 32, 3)``.
    """
    side = int(rng.integers(SIZE, cell + 1))
    r = corner[0] + int(rng.integers(0, cell - side + 1))
    c = corner[1] + int(rng.integers(0, cell - side + 1))
    crop = img[r:r + side, c:c + side]
    if side != SIZE:
        crop = np.asarray(box_resize(Image.fromarray(crop)))
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    if rotate:
        crop = np.rot90(crop, int(rng.integers(0, 4)))
    return np.ascontiguousarray(crop)
