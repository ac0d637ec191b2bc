"""Glyph tasks: characters rendered from real typefaces (notMNIST-style), split by writer.

Character tasks (``glyph_*``) hold out whole fonts: train, val and test use disjoint fonts.
``font_style`` (regular / bold / italic / bold italic) holds out characters instead. All are
``derived=True``; rendering is in :mod:`~pactlib.data.glyphs`.
"""
from __future__ import annotations

from collections.abc import Sequence

from . import glyphs
from .imaging import to_rgb32
from .registry import balanced, ordered, register, split_counts
from .splits import VAL_FRACTION, partition_items, rng_for

__all__ = ["FONT_STYLES"]

_FONT_PROV = ("glyphs rendered with Pillow from matplotlib's bundled TrueType fonts (DejaVu, "
              "STIX, BaKoMa Computer Modern)")
_FONT_LICENSE = "Bitstream Vera / DejaVu licence; SIL OFL (STIX); BaKoMa fonts licence (free)"


def _jobs(chars: Sequence[str], fonts: Sequence[str], n: int, rng) -> list[tuple[str, str, int]]:
    """``n`` (font, char, label) jobs, balanced over chars, fonts cycled in a shuffled order."""
    jobs = []
    for label, (char, k) in enumerate(zip(chars, balanced(list(chars), n).values())):
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
    for split, n in split_counts(max_trainval, max_test).items():
        x, y = glyphs.render_batch(_jobs(chars, groups[split], n, rng), rng)
        arrays[split] = (to_rgb32(x), y)
    return ordered(arrays, seed, name), {"fonts": groups, "characters": chars}


def _glyph(name: str, chars: str, fonts: Sequence[str], classes: Sequence[str], what: str):
    desc = (f"Derived: {what} rendered from {len(fonts)} real typefaces (notMNIST-style: each font "
            "a writer), white on dark with random rotation, shear, size, position, stroke and "
            "contrast; train, val and test use disjoint fonts.")

    @register(name=name, classes=tuple(classes), source="pypi:matplotlib (bundled fonts)", derived=True,
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
_MATH_FONTS = glyphs.DEJAVU + ("STIXGeneral.ttf", "STIXGeneralBol.ttf")  # STIX italics lack some
_glyph("glyph_math", "∑∫∞√∂≈≠≤±×", _MATH_FONTS,
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


@register(name="font_style", classes=tuple(FONT_STYLES), source="pypi:matplotlib (bundled fonts)",
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
    for split, n in split_counts(max_trainval, max_test).items():
        jobs = []
        for label, (style, k) in enumerate(balanced(list(FONT_STYLES), n).items()):
            fonts = FONT_STYLES[style]
            chars = groups[split]
            jobs += [(fonts[int(rng.integers(len(fonts)))], chars[int(rng.integers(len(chars)))], label)
                     for _ in range(k)]
        x, y = glyphs.render_batch(jobs, rng, fit="em")
        arrays[split] = (to_rgb32(x), y)
    return ordered(arrays, seed, "font_style"), {"characters": {s: "".join(c) for s, c in groups.items()}}


