"""Glyph images rendered from real typefaces, the way notMNIST was made.

Each font is a different "writer". Glyphs are drawn white on black at 64 px with Pillow and
area-averaged to 32 px. Two placements:

* ``fit="box"`` (character tasks): the glyph's ink box is scaled to fill 60-92 % of the
  canvas, then jittered by rotation (±12°), shear (±0.2), position, stroke dilation and ink /
  background intensity -- so the class is the character, not its size.
* ``fit="em"`` (font-style task): the font is drawn at an em size of 44-53 px on the 64 px
  canvas (no rescaling to the ink box) with position jitter only, so stroke weight and slant
  survive.

Only matplotlib's bundled fonts are used (pinned with matplotlib), so renders are
reproducible; :func:`check_coverage` refuses a font that lacks a character.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from .imaging import SIZE
from .sources import font_file

__all__ = ["DEJAVU", "STIX", "CM_TEXT", "render_glyph", "check_coverage", "render_batch"]

CANVAS = 2 * SIZE  # render resolution before the 2x box downsample

DEJAVU = tuple(f"DejaVu{fam}{sty}.ttf" for fam in ("Sans", "SansMono")
               for sty in ("", "-Bold", "-Oblique", "-BoldOblique")) + tuple(
    f"DejaVuSerif{sty}.ttf" for sty in ("", "-Bold", "-Italic", "-BoldItalic"))
STIX = ("STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf")
# Computer Modern text faces whose ASCII letters/digits are the usual glyphs (checked by eye:
# cmmi10 has old-style digits, cmsy10 maps capitals to calligraphic letters only).
CM_TEXT = ("cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmti10.ttf", "cmtt10.ttf")


@functools.lru_cache(maxsize=None)
def _font(filename: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_file(filename)), size)


def check_coverage(fonts: Sequence[str], chars: str) -> None:
    """Raise ``ValueError`` naming the font and character if a font has no glyph for a char."""
    from matplotlib.ft2font import FT2Font

    for f in fonts:
        ft = FT2Font(str(font_file(f)))
        missing = [c for c in chars if ft.get_char_index(ord(c)) == 0]
        if missing:
            raise ValueError(f"font {f} has no glyph for {missing!r}")


@functools.lru_cache(maxsize=4096)
def _ink(filename: str, char: str, size: int) -> Image.Image:
    """The glyph drawn white on black, cropped to its ink box (mode "L")."""
    font = _font(filename, size)
    left, top, right, bottom = font.getbbox(char)
    img = Image.new("L", (right - left + 8, bottom - top + 8), 0)
    ImageDraw.Draw(img).text((4 - left, 4 - top), char, font=font, fill=255)
    box = img.getbbox()
    if box is None:
        raise ValueError(f"font {filename} draws no ink for {char!r}")
    return img.crop(box)


def _affine(img: Image.Image, matrix: np.ndarray) -> Image.Image:
    """Apply the 2x2 ``matrix`` about the image centre, expanding the canvas to fit."""
    w, h = img.size
    corners = np.array([[0, 0], [w, 0], [0, h], [w, h]], dtype=np.float64) - [w / 2, h / 2]
    out = corners @ matrix.T
    ow, oh = (int(np.ceil(v)) + 2 for v in out.max(0) - out.min(0))
    inv = np.linalg.inv(matrix)
    # PIL maps output (x, y) to input: x_in = a x + b y + c, y_in = d x + e y + f
    shift = np.array([w / 2, h / 2]) - inv @ np.array([ow / 2, oh / 2])
    coeffs = (inv[0, 0], inv[0, 1], shift[0], inv[1, 0], inv[1, 1], shift[1])
    return img.transform((ow, oh), Image.AFFINE, coeffs, resample=Image.BICUBIC)


def render_glyph(filename: str, char: str, rng: np.random.Generator, *, fit: str = "box",
                 jitter: bool = True) -> np.ndarray:
    """Render one glyph as uint8 ``(32, 32)`` (white ink on dark background).

    Args:
        filename: a font in matplotlib's ``fonts/ttf`` folder.
        char: one character.
        rng: source of all jitter (consumed in a fixed order, so renders are reproducible).
        fit: ``"box"`` or ``"em"`` (see module docstring).
        jitter: ``False`` gives the centred, upright, canonical render.

    Raises:
        ValueError: unknown ``fit`` or the font draws nothing for ``char``.
    """
    if fit == "box":
        ink = _ink(filename, char, 96)
        if jitter:
            angle = np.deg2rad(rng.uniform(-12, 12))
            shear = rng.uniform(-0.2, 0.2)
            rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            ink = _affine(ink, rot @ np.array([[1.0, shear], [0.0, 1.0]]))
        fill = rng.uniform(0.60, 0.92) if jitter else 0.80
        scale = fill * CANVAS / max(ink.size)
        ink = ink.resize((max(1, round(ink.width * scale)), max(1, round(ink.height * scale))),
                         Image.BICUBIC)
    elif fit == "em":
        size = int(rng.integers(44, 54)) if jitter else 48
        ink = _ink(filename, char, size)
        if max(ink.size) > CANVAS - 2:  # very wide glyph: shrink to fit, keeping its aspect
            scale = (CANVAS - 2) / max(ink.size)
            ink = ink.resize((max(1, round(ink.width * scale)), max(1, round(ink.height * scale))),
                             Image.BICUBIC)
    else:
        raise ValueError(f"fit must be 'box' or 'em', got {fit!r}")
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    free_x, free_y = CANVAS - ink.width, CANVAS - ink.height
    if jitter:
        x, y = int(rng.integers(0, free_x + 1)), int(rng.integers(0, free_y + 1))
    else:
        x, y = free_x // 2, free_y // 2
    canvas.paste(ink, (x, y))
    if jitter and fit == "box" and rng.random() < 0.3:
        canvas = canvas.filter(ImageFilter.MaxFilter(3))  # bolder stroke
    small = np.asarray(canvas.reduce(2), dtype=np.float64) / 255.0  # (32, 32) in [0, 1]
    if jitter:
        bg, fg = rng.uniform(0, 40), rng.uniform(190, 255)
    else:
        bg, fg = 0.0, 255.0
    return np.round(bg + (fg - bg) * small).astype(np.uint8)


def render_batch(jobs: Sequence[tuple[str, str, int]], rng: np.random.Generator, *,
                 fit: str = "box") -> tuple[np.ndarray, np.ndarray]:
    """Render ``jobs`` = ``[(font, char, label), ...]`` with jitter.

    Returns:
        ``(images, labels)``: uint8 ``(N, 32, 32)`` and int64 ``(N,)``.
    """
    images = np.empty((len(jobs), SIZE, SIZE), dtype=np.uint8)
    for i, (font, char, _) in enumerate(jobs):
        images[i] = render_glyph(font, char, rng, fit=fit)
    return images, np.array([lab for _, _, lab in jobs], dtype=np.int64)
