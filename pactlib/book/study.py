"""Statistics over the book's records: means over seeds, paired gains, depth groups.

Merging, α search and reference rows are free functions over any testbed
(:mod:`pactlib.testbeds.base`); this module only reads what they return. Book: chapters 2 and 5–11.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def depth_groups(keys: Sequence[str], parts: Sequence[str] = ("early", "middle", "late")) -> dict[str, list[str]]:
    """Split matrix-layer keys, in network order, into contiguous depth groups of (nearly) equal
    size, plus ``"all"`` (claim C9)."""
    keys = list(keys)
    out = {p: list(chunk) for p, chunk in zip(parts, np.array_split(np.array(keys, dtype=object), len(parts)))}
    out["all"] = keys
    return out


def summarize(records, by: Sequence[str] = ("method", "suite"), metrics: Sequence[str] = ("acc", "norm_acc")):
    """Mean, standard deviation and seed count of test metrics over seeds, grouped by ``by``.

    Accepts records or a frame from :func:`pactlib.book.records.records_frame`. Columns:
    ``<metric>_mean``, ``<metric>_std``, ``n_seeds`` (percentages are left to the caller)."""
    import pandas as pd

    from pactlib.book.records import records_frame

    frame = records if isinstance(records, pd.DataFrame) else records_frame(list(records))
    cols = {f"metrics.{m}": m for m in metrics}
    g = frame.groupby(list(by), sort=False)
    out = pd.DataFrame({f"{m}_mean": g[c].mean() for c, m in cols.items()})
    for c, m in cols.items():
        out[f"{m}_std"] = g[c].std(ddof=1).fillna(0.0)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index()


def paired_gain(records, base: str, treated: str, metric: str = "norm_acc", by: Sequence[str] = ("suite",)):
    """Per seed (and ``by`` group) gain ``treated − base`` of a test metric; mean, std, n and the
    number of seeds where the gain is positive."""
    import pandas as pd

    from pactlib.book.records import records_frame

    frame = records if isinstance(records, pd.DataFrame) else records_frame(list(records))
    col = f"metrics.{metric}"
    keys = list(by) + ["seed"]
    a = frame[frame["method"] == base].set_index(keys)[col]
    b = frame[frame["method"] == treated].set_index(keys)[col]
    d = (b - a).dropna().reset_index()
    g = d.groupby(list(by), sort=False)[col]
    return pd.DataFrame({"gain_mean": g.mean(), "gain_std": g.std(ddof=1).fillna(0.0), "n_seeds": g.size(),
                         "n_positive": g.apply(lambda s: int((s > 0).sum()))}).reset_index()
