"""The book's one plotting helper: style, size, DPI, file naming, captions, numbering.

Use it as a context manager in a chapter notebook; the data come from result records
(:mod:`pactlib.book.records`), never from numbers typed into the cell::

    with figure("alpha-sweep", chapter=5, number=1, paper="Fig. 3",
                caption="Mean normalized accuracy against alpha.") as (fig, ax):
        sns.lineplot(data=frame, x="params.alpha", y="metrics.norm_acc", hue="method", ax=ax)

On leaving the block the figure is written to ``<figures dir>/fig05.1-alpha-sweep.png`` and,
inside a notebook kernel, displayed as a PNG followed by its caption
("**Figure 5.1** (paper: Fig. 3). Mean normalized accuracy ..."). The figures dir is
``$PACT_FIGURES_DIR`` (the book runner sets ``book/_executed/<params>/figures``) or
``results/figures`` by hand. Rendering uses the Agg backend and never opens a window.
Numbers are explicit arguments (chapter.number, as in the book's numbering), so re-running a
cell never renumbers a figure. Book: "Running the book" page.
"""
from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display needed or wanted: figures go to files and notebook outputs
import matplotlib.pyplot as plt  # noqa: E402

from pactlib.book.verdicts import STATUSES  # noqa: E402
from pactlib.io import write_atomic  # noqa: E402

__all__ = ["SIZES", "DPI", "VERDICTS", "figure", "figure_path", "legend_outside", "table", "verdict",
           "verdict_text", "alt_text", "COLUMN_PX", "MIN_TEXT_PX", "displayed_px"]

#: Named figure sizes in inches (width, height).
SIZES: dict[str, tuple[float, float]] = {
    "single": (5.0, 3.2),
    "wide": (9.0, 3.4),
    "square": (4.2, 4.0),
    "tall": (5.0, 6.0),
}
DPI = 150
ENV_DIR = "PACT_FIGURES_DIR"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: The statuses a claim's verdict may have (:data:`pactlib.book.verdicts.STATUSES`).
VERDICTS = STATUSES


def repo_path(relative: str | Path) -> Path:
    """A file shipped with the book, named as in the repository (``"book/data/x.jsonl"``): the
    same as :func:`pactlib.book.paths.book_path` of the part after ``book/`` (the book folder is
    ``$PACT_BOOK_DIR``, else ``./book``; nothing is found from this package's location).

    Raises:
        ValueError: ``relative`` does not start with ``book/``.
        FileNotFoundError: no such file (names the path and ``$PACT_BOOK_DIR``).
    """
    from pactlib.book.paths import book_path

    parts = Path(relative).parts
    if not parts or parts[0] != "book":
        raise ValueError(f"repo_path({str(relative)!r}): only the book's files (book/...) are shipped; "
                         "use pactlib.book.paths.book_path for a path inside the book folder")
    return book_path(Path(*parts[1:]))


#: The width in px of the book's article column in a 1280 px wide window (sphinx-book-theme): a
#: figure wider than this many pixels is shown scaled down to it.
COLUMN_PX = 676
#: The smallest text of a figure (tick labels, legend), in px as shown in that column.
MIN_TEXT_PX = 10.5


def displayed_px(points: float, width_in: float) -> float:
    """Text of ``points`` pt in a figure ``width_in`` inches wide, in px as the book shows it (the
    PNG at :data:`DPI`, scaled down to :data:`COLUMN_PX` when wider)."""
    return points * DPI / 72 * min(1.0, COLUMN_PX / (width_in * DPI))


def _text_floor(fig: Any, points: float) -> None:
    """Raise every text of ``fig`` smaller than ``points`` pt (a legend or label a caller set to
    ``fontsize=7``, say) to ``points``: no text of a book figure shows below :data:`MIN_TEXT_PX`."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < points:
            text.set_fontsize(points)


def _rc(width_in: float = SIZES["single"][0]) -> dict[str, Any]:
    """The book's matplotlib settings (seaborn's whitegrid / paper / colorblind), applied only
    inside :func:`figure` through ``plt.rc_context``: the caller's global style is untouched. A
    figure ``width_in`` inches wide gets fonts large enough that its smallest text shows at
    :data:`MIN_TEXT_PX` or more (:func:`displayed_px`), the others in proportion."""
    import seaborn as sns
    from cycler import cycler

    rc: dict[str, Any] = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper")}
    small = max(8.8, MIN_TEXT_PX / displayed_px(1.0, width_in))  # pt of ticks and legend
    k = small / 8.8
    rc.update({"axes.prop_cycle": cycler(color=sns.color_palette("colorblind")),
               "figure.dpi": DPI, "savefig.dpi": DPI, "axes.titlesize": 10.5 * k, "axes.labelsize": 9.6 * k,
               "xtick.labelsize": small, "ytick.labelsize": small, "legend.fontsize": small,
               "legend.title_fontsize": 9.6 * k, "font.size": 9.6 * k, "figure.titlesize": 10.5 * k,
               "font.family": "DejaVu Sans"})
    return rc


def figure_path(name: str, *, chapter: int, number: int,
                directory: str | Path | None = None) -> Path:
    """The file of figure ``chapter.number``: ``<dir>/fig{chapter:02d}.{number}-{name}.png``.

    Raises:
        ValueError: ``name`` is not lower-case letters, digits and dashes, or ``chapter`` /
            ``number`` is not a positive int.
    """
    if not _NAME.match(name):
        raise ValueError(f"figure name {name!r}: use lower-case letters, digits and dashes")
    for label, v in (("chapter", chapter), ("number", number)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"figure {name!r}: {label} must be a positive int, got {v!r}")
    base = Path(directory if directory is not None
                else os.environ.get(ENV_DIR, "results/figures"))
    return base / f"fig{chapter:02d}.{number}-{name}.png"


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def _show(*objs: Any) -> None:
    if _in_kernel():
        from IPython.display import display

        display(*objs)


def _caption(kind: str, chapter: int, number: int, caption: str, paper: str | None) -> str:
    if not caption or not caption.strip():
        raise ValueError(f"{kind} {chapter}.{number}: a caption is required")
    ref = f" (paper: {paper})" if paper else ""
    return f"**{kind} {chapter}.{number}**{ref}. {caption.strip()}"


@contextmanager
def figure(name: str, *, chapter: int, number: int, caption: str, paper: str | None = None,
           size: str | tuple[float, float] = "single", nrows: int = 1, ncols: int = 1,
           directory: str | Path | None = None, **subplots_kw: Any) -> Iterator[tuple[Any, Any]]:
    """Make, save and show one numbered, captioned figure.

    Args:
        name: short file-name stem, lower-case with dashes (``"alpha-sweep"``).
        chapter, number: the book's numbering, ``Figure {chapter}.{number}``.
        caption: what the figure shows (required; the book prints it under the image).
        paper: the paper's figure/table this reproduces, e.g. ``"Fig. 3a"`` (optional).
        size: a key of :data:`SIZES` or ``(width, height)`` in inches.
        nrows, ncols, **subplots_kw: passed to ``plt.subplots``.
        directory: where the PNG goes (default ``$PACT_FIGURES_DIR`` or ``results/figures``).

    Yields:
        ``(fig, axes)`` as from ``plt.subplots``.

    Raises:
        ValueError: bad name / numbering / size, or an empty caption (before any drawing).
        KeyError: ``size`` is not a known name (the message lists them).

    If the block raises, the figure is closed and nothing is written.
    """
    path = figure_path(name, chapter=chapter, number=number, directory=directory)
    text = _caption("Figure", chapter, number, caption, paper)
    if isinstance(size, str):
        if size not in SIZES:
            raise KeyError(f"figure {name!r}: unknown size {size!r}; known: {sorted(SIZES)}")
        figsize = SIZES[size]
    else:
        figsize = tuple(size)
        if len(figsize) != 2 or not all(isinstance(v, (int, float)) and v > 0 for v in figsize):
            raise ValueError(f"figure {name!r}: size must be (width, height) in inches, got {size!r}")
    with plt.rc_context(_rc(figsize[0])):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, **subplots_kw)
        try:
            yield fig, axes
            _text_floor(fig, MIN_TEXT_PX / displayed_px(1.0, figsize[0]))
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        finally:
            plt.close(fig)
    png = buf.getvalue()
    write_atomic(path, png)
    from IPython.display import Image, Markdown

    _show(Image(data=png, format="png", metadata={"alt": alt_text(text)}), Markdown(text))


def alt_text(caption: str) -> str:
    """A figure's alt text: its caption (``**Figure 5.1** (paper: Fig. 3). What it shows.``) as
    plain text, ``Figure 5.1 (paper: Fig. 3). What it shows.``: markup removed, on one line."""
    plain = re.sub(r"\{[a-z]+\}`([^`]*)`", r"\1", caption)  # MyST roles: {ref}`text` -> text
    plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", plain)  # links keep their text
    return " ".join(re.sub(r"[*`$]", "", plain).split())


def pad_y(ax: Any, frac: float = 0.08) -> None:
    """Widen ``ax``'s y limits by ``frac`` of its height at each end, measured in the axis' own
    scale (log and symlog included), so marks that reach the limits do not run into the frame.
    On a symmetric-log axis, also keep only the major ticks at 0 and at |y| ≥ the linear threshold:
    a tick inside the linear band sits too close to 0 for both labels to be read."""
    import numpy as np

    t = ax.yaxis.get_transform()
    lo, hi = t.transform(np.array(ax.get_ylim()))
    pad = frac * (hi - lo)
    ax.set_ylim(*t.inverted().transform(np.array([lo - pad, hi + pad])))
    if ax.get_yscale() == "symlog":
        ax.set_yticks([y for y in ax.get_yticks() if y == 0 or abs(y) >= t.linthresh])


def legend_outside(ax: Any, where: str = "above", **kw: Any) -> Any:
    """Redraw ``ax``'s legend outside the axes, so it hides no data: ``"above"`` (one row over
    the axes) or ``"right"`` (a column beside them). The legend's entries and title are kept;
    ``kw`` goes to ``ax.legend``. :func:`figure`'s tight layout makes room for it.

    Returns:
        The new legend, or None when ``ax`` has nothing to put in one.

    Raises:
        ValueError: ``where`` is neither ``"above"`` nor ``"right"``.
    """
    places = {"above": dict(loc="lower center", bbox_to_anchor=(0.5, 1.01)),
              "right": dict(loc="center left", bbox_to_anchor=(1.01, 0.5))}
    if where not in places:
        raise ValueError(f"legend_outside: where must be one of {sorted(places)}, got {where!r}")
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    old = ax.get_legend()
    title = old.get_title().get_text() if old is not None else ""
    opts = places[where] | ({"ncols": len(handles)} if where == "above" else {}) | {"title": title or None} | kw
    return ax.legend(handles, labels, **opts)


def table(frame: Any, *, chapter: int, number: int, caption: str, paper: str | None = None,
          floatfmt: str = "{:.3f}", formats: dict[Any, str] | None = None) -> None:
    """Show a DataFrame (built from records) as a numbered, captioned table.

    Float columns are formatted with ``floatfmt``, integer columns (counts, seeds) as integers;
    ``formats`` ({column: format}) overrides ``floatfmt`` for the columns it names (e.g. knob
    values that range from 1e-4 to 0.5: ``"{:g}"``). The frame itself is not modified.

    Raises:
        ValueError: an empty caption.
    """
    text = _caption("Table", chapter, number, caption, paper)
    from IPython.display import Markdown

    _show(Markdown(text), table_style(frame, floatfmt, formats))


#: What a table shows for a missing value (NaN, None).
NA_REP = "–"


def _one_header_row(frame: Any) -> tuple[Any, list[Any]]:
    """``frame`` laid out so its table has one header row: pandas puts the names of the index in a
    second header row of their own (empty but for those names). A named single-level index gives
    its name to the header row's corner cell; the levels of a named MultiIndex become leading
    columns headed by their names, repeats blanked in all but the last level so a group label
    shows once (as in pandas' own sparse index). A name of the columns (what the column headers
    are, e.g. "condition") is dropped: the headers say it. Beside columns of several levels, a
    named single-level index gives its name to the corner of the last header row, the one just
    above the row labels (when that level has no name). Also returns the names of the new columns.
    Any other frame (an unnamed index level, a MultiIndex beside columns of several levels) is
    returned as it is, with ``[]``."""
    names = list(frame.index.names)
    if any(n is None for n in names):
        return frame, []
    if frame.columns.nlevels > 1:
        last = frame.columns.nlevels - 1
        if len(names) > 1 or frame.columns.names[last] is not None:
            return frame, []
        out = frame.rename_axis(index=None)
        out.columns = out.columns.set_names(names[0], level=last)  # the header row just above the row labels
        return out, []
    if len(names) == 1:
        return frame.rename_axis(index=None, columns=names[0]), []
    if any(n in frame.columns for n in names):
        return frame, []
    out = frame.reset_index().rename_axis(columns=None)
    for i, name in enumerate(names[:-1]):
        key = out[names[: i + 1]].astype(str).agg("\x1f".join, axis=1)
        out[name] = out[name].astype(object).where(key.ne(key.shift()), "")
    return out, names


def table_style(frame: Any, floatfmt: str = "{:.3f}", formats: dict[Any, str] | None = None):
    """The pandas Styler :func:`table` shows: ``floatfmt`` on float columns only (``formats``,
    {column: format}, on the columns it names instead), missing values
    (NaN, None) as :data:`NA_REP`, float row labels with ``{:g}``, no row numbers (an unnamed
    integer index is hidden) and one header row (:func:`_one_header_row`)."""
    from pandas.api.types import is_integer_dtype

    floats = list(frame.select_dtypes("floating").columns)
    shown, index_cols = _one_header_row(frame)
    style = shown.style.format(na_rep=NA_REP)
    if floats:
        style = style.format(floatfmt, subset=floats, na_rep=NA_REP)
    for col, fmt in (formats or {}).items():
        if col in shown.columns:
            style = style.format(fmt, subset=[col], na_rep=NA_REP)
    def label(v: Any) -> Any:  # a float row label (an α, a fraction) as written: 0.1, not 0.100000
        return f"{v:g}" if isinstance(v, float) else v

    if index_cols:
        style = style.format(label, subset=index_cols, na_rep=NA_REP)
    style = style.format_index(label, axis="index", na_rep=NA_REP)
    index = frame.index  # the frame's own: a named index moved to the header corner is a label
    if index_cols or (index.nlevels == 1 and index.name is None and is_integer_dtype(index.dtype)):
        style = style.hide(axis="index")  # row numbers 0..n-1 say nothing
    return style


def verdict_text(claim: str, status: str, evidence: str, conditions: list | None = None) -> str:
    """The Markdown of a claim's verdict (see :func:`verdict`): the claim in words
    (:func:`pactlib.book.claims.statement`, linked to its definition), the status, a table of its
    graded conditions (each effect with its 95 % interval; :mod:`pactlib.book.verdicts`) when
    given, then the evidence as a sentence.

    Raises:
        ValueError: ``status`` is not one of :data:`VERDICTS`, or ``evidence`` is empty.
    """
    from pactlib.book.claims import definition, statement
    from pactlib.book.verdicts import condition_text  # noqa: F401  (the same words as the evidence)

    if status not in VERDICTS:
        raise ValueError(f"verdict for {claim}: status {status!r} is not one of {list(VERDICTS)}")
    if not evidence or not evidence.strip():
        raise ValueError(f"verdict for {claim}: give the evidence (numbers from records)")
    text = evidence.strip()
    if "a" <= text[0] <= "z":
        text = text[0].upper() + text[1:]
    label = f"{{ref}}`{claim} <{definition(claim)}>`" if definition(claim) else claim
    said = statement(claim)
    head = f"**Verdict on {label}: {status}.**" + (f" *{said}*" if said != claim else "")
    if not conditions:
        return f"{head} {text}"
    return f"{head}\n\n{conditions_table(conditions)}\n\n{text}"


def conditions_table(conditions: list) -> str:
    """A Markdown table of graded conditions: condition, effect [95 % interval], threshold, grade,
    and what would decide an inconclusive one."""
    from pactlib.book.intervals import fmt

    rows = ["| condition | effect [95 % interval] | needs to be | grade | to decide |", "|---|---|---|---|---|"]
    for c in conditions:
        d = c.get("digits", 2)
        unit = f" {c['unit']}" if c.get("unit") else ""
        rows.append(f"| {c['name']} | {fmt(c['estimate'], d)} [{fmt(c['lo'], d)}, {fmt(c['hi'], d)}]{unit} | "
                    f"{c['side']} {c['threshold']:g} | {c['grade']} | {c.get('needs') or ''} |")
    return "\n".join(rows)


def verdict(claim: str, status, evidence: str | None = None, *, run: str | None = None) -> None:
    """Show a claim's verdict and record it: ``verdict("C5", v)`` with ``v`` a verdict dict of
    :mod:`pactlib.book.verdicts` (``status``, ``evidence``, ``conditions``), or
    ``verdict("C5", status, evidence)``.

    ``evidence`` should be built from records (f-strings over a frame), not typed numbers.
    ``run``: the run (a testbed column of the book's Verdicts page) the verdict is about, when it
    is not the run executing the notebook (chapter 2 judges the MiniLM testbed in the main run).
    Returns None, so a verdict as a cell's last line prints once.

    Raises:
        ValueError: as :func:`verdict_text`.
    """
    from IPython.display import Markdown

    conditions = None
    if isinstance(status, dict):
        v = status
        status, evidence, conditions = v["status"], v["evidence"], v.get("conditions")
    from pactlib.book.site import verdict_label

    text = verdict_text(claim, status, evidence, conditions)
    record_verdict(claim, status, evidence, run=run, conditions=conditions)
    target = verdict_label(run or os.environ.get("PACT_RUN", "main"), claim)
    _show(Markdown(f"({target})=\n\n{text}" if os.environ.get("PACT_NOTEBOOK") else text))


def record_verdict(claim: str, status: str, evidence: str, *, run: str | None = None,
                   conditions: list | None = None) -> Path | None:
    """Append the verdict to ``$PACT_RECORDS_DIR/<$PACT_NOTEBOOK>.verdicts.jsonl`` (one JSON line:
    claim, status, evidence, its graded conditions, notebook, run and its title) when the book runner executes the
    notebook, so the book can list every claim per testbed; outside the runner nothing is written.
    ``run``: the run the verdict is about (default ``$PACT_RUN``: the run executing the notebook).

    Returns:
        The file written to, or None.
    """
    import json

    notebook, folder = os.environ.get("PACT_NOTEBOOK"), os.environ.get("PACT_RECORDS_DIR")
    if not notebook or not folder:
        return None
    path = Path(folder) / f"{notebook}.verdicts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = dict(claim=claim, status=status, evidence=evidence.strip(), notebook=notebook,
               run=run or os.environ.get("PACT_RUN", "main"),
               title=run or os.environ.get("PACT_RUN_TITLE", "main"))
    if conditions:
        rec["conditions"] = [{k: v for k, v in c.items()} for c in conditions]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path
