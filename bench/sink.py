"""The bench scripts' JSON-lines output: one record per line, each written as it comes.

    sink = Sink(path, append=args.append, head={"bench": "...", "label": args.label})
    emit = sink.emit        # emit(rec): head keys first, then rec's; kept in sink.records,
    ...                     # written, flushed, and echoed to stdout on one line
    sink.close()            # or: with Sink(...) as sink: ...

Written and flushed record by record, so that an interrupted run keeps what it measured.
Standard library only; the scripts put ``bench/`` on ``sys.path`` to import it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


class Sink:
    """A JSON-lines file opened for writing (``append``: added to, else overwritten).

    ``head``: keys put first in every record (a record's own value wins, in head's place);
    ``records``: the list each emitted record is appended to (a new one if not given);
    ``echo``: print each record's line to stdout too (flushed); ``ensure_ascii``: as ``json.dumps``;
    ``mkdir``: create the file's missing parent folders first.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False, head: dict | None = None,
                 records: list[dict] | None = None, echo: bool = True, ensure_ascii: bool = True,
                 mkdir: bool = True) -> None:
        if mkdir:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.head = dict(head or {})
        self.records: list[dict] = [] if records is None else records
        self.echo = echo
        self.ensure_ascii = ensure_ascii
        self.file = open(path, "a" if append else "w")

    def emit(self, rec: dict) -> dict:
        """Write ``rec`` (after the head keys) as one line, flush it, and return the record kept."""
        if self.head:
            rec = {**self.head, **rec}
        self.records.append(rec)
        line = json.dumps(rec, ensure_ascii=self.ensure_ascii)
        self.file.write(line + "\n")
        self.file.flush()
        if self.echo:
            print(line, flush=True)
        return rec

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
