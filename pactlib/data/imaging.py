"""Uniform image format for every task: uint8 RGB ``(N, 3, 32, 32)``.

Small images are upsampled bilinearly, large crops are area-averaged (box filter), and
grayscale is replicated to three channels. The model code normalises with mean = std = 0.5.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

__all__ = ["SIZE", "to_rgb32", "box_resize", "image_hashes"]

SIZE = 32  # side of every stored image, pixels


def to_rgb32(images: np.ndarray) -> np.ndarray:
    """Bring a batch of images to uint8 ``(N, 3, 32, 32)``.

    Args:
        images: uint8 ``(N, H, W)`` grayscale or ``(N, H, W, 3)`` RGB. Sides below 32 are
            upsampled bilinearly (``align_corners=False``); larger sides are area-averaged.

    Returns:
        A new uint8 array ``(N, 3, 32, 32)``; the input is not modified.

    Raises:
        ValueError: wrong dtype or rank.
    """
    if images.dtype != np.uint8:
        raise ValueError(f"to_rgb32 expects uint8 images, got {images.dtype}")
    if images.ndim == 3:
        x = torch.from_numpy(np.require(images, requirements=("C", "W"))).unsqueeze(1)  # (N, 1, H, W)
    elif images.ndim == 4 and images.shape[-1] == 3:
        x = torch.from_numpy(np.require(images, requirements=("C", "W"))).permute(0, 3, 1, 2)  # (N, 3, H, W)
    else:
        raise ValueError(f"to_rgb32 expects (N, H, W) or (N, H, W, 3), got {images.shape}")
    if x.shape[-2:] != (SIZE, SIZE):
        down = x.shape[-1] > SIZE or x.shape[-2] > SIZE
        xf = x.float()
        if down:
            xf = F.interpolate(xf, size=(SIZE, SIZE), mode="area")
        else:
            xf = F.interpolate(xf, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        x = xf.round_().clamp_(0, 255).to(torch.uint8)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return np.ascontiguousarray(x.numpy())


def box_resize(img: Image.Image, size: int = SIZE) -> Image.Image:
    """Area-average (box filter) a PIL image to ``size x size``."""
    return img.resize((size, size), Image.BOX)


def image_hashes(images: np.ndarray) -> list[str]:
    """sha1 of each image's bytes, ``images`` of shape ``(N, ...)``; used to check disjointness."""
    flat = np.ascontiguousarray(images).reshape(len(images), -1)
    return [hashlib.sha1(row.tobytes()).hexdigest() for row in flat]
