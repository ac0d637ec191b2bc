"""Result records: one JSON object per line, written atomically, read back as dicts or a frame.

Every number the book shows comes from a record; figures and tables read records, never a
number typed into plotting code. A record is a JSON object with at least::

    {"method": "pact_iso_c", "params": {"alpha": 1.2, "T": 4}, "seed": 0,
     "metrics": {"acc": 0.91, "norm_acc": 0.97}}

plus any extra string/number fields (``"chapter"``, ``"task"``, ``"split"``, ...). ``seed`` is an
int, or None for a deterministic computation. Metric values are numbers (or None for a value
that could not be computed, e.g. a NaN, which JSON cannot hold).

Files are JSON lines (``.jsonl``). :func:`write_records` rewrites the whole file through a
temporary file and ``os.replace`` under an exclusive lock (``<file>.lock``), so a reader never
sees half a line and two writers never lose each other's records.

The book runner points ``PACT_RECORDS_DIR`` at a chapter's folder of the record store: in compute
mode a staging folder that becomes ``book/records/<set>/<run>/<chapter>/``, in present mode a copy of
that folder under ``book/_executed/``;
:func:`records_path` resolves a notebook's file there (or under ``results/`` when a notebook is
run by hand). Book: "Running the book" page.
"""
from __future__ import annotations

import fcntl
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pactlib.io import write_atomic

__all__ = ["read_json_object", "REQUIRED_FIELDS", "RecordError", "make_record", "write_records", "read_records", "read_json_lines",
           "records_frame", "records_path"]

REQUIRED_FIELDS = ("method", "params", "seed", "metrics")
ENV_DIR = "PACT_RECORDS_DIR"


class RecordError(ValueError):
    """A record is malformed, or a records file does not parse."""


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON types (numpy / torch scalars -> Python; NaN/inf -> None)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else None
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # numpy array / torch tensor
        return _plain(value.tolist(), where)  # 0-d -> a Python scalar, else nested lists
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise RecordError(f"{where}: cannot store a {type(value).__name__} in a record ({value!r})")


def make_record(method: str, *, params: Mapping[str, Any], seed: int | None,
                metrics: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A validated record with plain JSON values.

    Args:
        method: the method's registry name (e.g. ``"pact_iso_c"``) or what was measured.
        params: the parameters that produced the metrics (e.g. the dict from
            :meth:`pactlib.book.chapters.Chapter.check`, plus method settings).
        seed: the seed of the run, or None for a deterministic computation.
        metrics: ``{name: number}`` (numpy / 0-d torch scalars accepted; NaN/inf stored as None).
        **extra: other fields (``task=...``, ``split=...``); must not shadow the four above.

    Raises:
        RecordError: a field has the wrong type or a value is not JSON-representable.
    """
    if not isinstance(method, str) or not method:
        raise RecordError(f"record 'method' must be a non-empty str, got {method!r}")
    if not isinstance(params, Mapping):
        raise RecordError(f"record {method!r}: 'params' must be a mapping, got {type(params).__name__}")
    if not isinstance(metrics, Mapping):
        raise RecordError(
            f"record {method!r}: 'metrics' must be a mapping, got {type(metrics).__name__}")
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
        raise RecordError(f"record {method!r}: 'seed' must be an int or None, got {seed!r}")
    rec = {"method": method, "params": _plain(dict(params), f"{method}.params"),
           "seed": None if seed is None else int(seed),
           "metrics": _plain(dict(metrics), f"{method}.metrics")}
    for key, value in extra.items():
        rec[key] = _plain(value, f"{method}.{key}")
    for name, value in rec["metrics"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RecordError(f"record {method!r}: metric {name!r} must be a number, got {value!r}")
    return rec


def _check(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, Mapping):
        raise RecordError(f"{where}: a record must be a mapping, got {type(rec).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in rec]
    if missing:
        raise RecordError(f"{where}: record lacks field(s) {missing}; it has {sorted(rec)}")
    extra = {k: v for k, v in rec.items() if k not in REQUIRED_FIELDS}
    return make_record(rec["method"], params=rec["params"], seed=rec["seed"],
                       metrics=rec["metrics"], **extra)


@contextmanager
def _locked(path: Path):
    lock = path.with_name(path.name + ".lock")
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_records(path: str | Path, records: Iterable[Mapping[str, Any]], *,
                  replace: bool = False) -> Path:
    """Append records to a JSON-lines file (or replace its content), atomically.

    Args:
        path: the ``.jsonl`` file; its folder is created if needed.
        records: mappings with at least ``method``, ``params``, ``seed``, ``metrics``
            (see :func:`make_record`). The caller's objects are not modified.
        replace: start the file afresh instead of appending.

    Returns:
        The path written.

    Raises:
        RecordError: a record is malformed (nothing is written then), or the existing file
            does not parse.
    """
    path = Path(path)
    clean = [_check(r, f"{path}: record {i}") for i, r in enumerate(records)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        old = "" if replace or not path.exists() else path.read_text(encoding="utf-8")
        if old and not old.endswith("\n"):
            raise RecordError(f"{path}: the last line is incomplete; refusing to append")
        if old:
            read_json_lines(old, path, REQUIRED_FIELDS)  # never append to a file that no longer parses
        new = "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in clean)
        write_atomic(path, old + new, sync=True)
    return path


def read_json_lines(text: str, path: str | Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The JSON objects of ``text``, one per non-blank line (``path`` names the file in errors),
    each with every field of ``required``.

    Raises:
        RecordError: a line is not JSON, not a JSON object, or lacks a ``required`` field
            (naming file and line).
    """
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}, line {lineno}: not JSON ({exc.msg})") from exc
        if required and (not isinstance(rec, dict) or any(f not in rec for f in required)):
            raise RecordError(f"{path}, line {lineno}: not a record (needs {list(required)})")
        if not isinstance(rec, dict):
            raise RecordError(f"{path}, line {lineno}: not a JSON object")
        out.append(rec)
    return out


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file, in file order.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        RecordError: a line is not JSON or lacks a required field (naming file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file not found: {path}")
    return read_json_lines(path.read_text(encoding="utf-8"), path, REQUIRED_FIELDS)


def records_frame(records: Iterable[Mapping[str, Any]] | str | Path):
    """Records as a pandas DataFrame, one row per record.

    ``params`` and ``metrics`` are flattened into columns ``params.<name>`` and
    ``metrics.<name>``; other fields keep their names.

    Args:
        records: a list of records, or a path to a records file.
    """
    import pandas as pd

    if isinstance(records, (str, Path)):
        records = read_records(records)
    records = list(records)
    if not records:
        return pd.DataFrame(columns=list(REQUIRED_FIELDS))
    return pd.json_normalize(records, max_level=1)


def records_path(name: str, *, root: str | Path | None = None) -> Path:
    """Where a notebook's records go: ``<root>/<name>.jsonl``.

    ``root`` defaults to ``$PACT_RECORDS_DIR`` (set by the book runner) or ``results``.
    """
    base = Path(root if root is not None else os.environ.get(ENV_DIR, "results"))
    return base / f"{name}.jsonl"


# ----------------------------------------------------------------------------- tables as records
#: ``method`` of a record made by :func:`table_record`.
TABLE = "table"


def table_record(frame, *, table: str, params: Mapping[str, Any], seed: int | None = None,
                 **extra: Any) -> dict[str, Any]:
    """A small pandas table as one record, so a book cell can show it from records alone.

    The record has ``method`` ``"table"``, empty ``metrics`` and the fields ``table`` (the
    name), ``index`` (the index level names), ``columns``, ``dtypes`` (of the index levels,
    then the columns) and ``rows`` (one list per row: index values, then column values), in
    the frame's order. NaN is stored as null. :func:`table_frame` reads it back with the same
    index, columns, order and dtypes (int, float, bool, object).

    Args:
        frame: a DataFrame with flat (not MultiIndex) columns; keep it small (summary data).
        table: the table's name, unique within its records file.
        params, seed, **extra: as :func:`make_record`.

    Raises:
        RecordError: the columns are a MultiIndex, or a value cannot be stored.
    """
    import pandas as pd

    if isinstance(frame.columns, pd.MultiIndex):
        raise RecordError(f"table {table!r}: MultiIndex columns cannot be stored; flatten them first")
    index = [None if n is None else str(n) for n in frame.index.names]
    flat = frame.reset_index(names=[f"__index{i}__" for i in range(len(index))])
    return make_record(TABLE, params=params, seed=seed, metrics={}, table=table, index=index,
                       columns=list(frame.columns), dtypes=[str(d) for d in flat.dtypes],
                       rows=flat.to_numpy(dtype=object).tolist(), **extra)


def table_frame(records: Iterable[Mapping[str, Any]] | str | Path, table: str):
    """The DataFrame stored by :func:`table_record` under the name ``table``.

    Args:
        records: records (e.g. from :func:`read_records`) or a records file.
        table: the table's name.

    Raises:
        KeyError: no table of that name (lists the tables there are).
        FileNotFoundError: ``records`` is a path that does not exist.
    """
    import pandas as pd

    if isinstance(records, (str, Path)):
        records = read_records(records)
    found = [r for r in records if r.get("method") == TABLE]
    rec = next((r for r in found if r.get("table") == table), None)
    if rec is None:
        raise KeyError(f"no table {table!r} in the records; tables: {sorted(r.get('table') for r in found)}")
    names = [f"__index{i}__" for i in range(len(rec["index"]))]
    frame = pd.DataFrame(rec["rows"], columns=names + list(rec["columns"]))
    frame = frame.astype(dict(zip(frame.columns, rec["dtypes"])))
    return frame.set_index(names).rename_axis(rec["index"]) if names else frame


__all__ += ["TABLE", "table_record", "table_frame"]


def read_json_object(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a provenance or benchmark file), or None when there is no file.

    Raises:
        ValueError: the file is not JSON, or not a JSON object (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
