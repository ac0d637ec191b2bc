"""The ``pact`` command line.

    pact merge --method NAME [--pact pact|s-pact] --alpha A --pretrained FILE \\
               --finetuned FILE [FILE ...] --out FILE [--set key=value ...] [--trust-pickle]
               [--rule auto|default|hf_encoder|gpt2|decoder_lm|reference_2d] [--max-shard-size 2GB] [--workers N]
    pact methods
    pact data prepare --suite 8            (built-in testbed: a plug-in, see below)
    pact zoo build --suite 8 --seeds 0 1 2 (built-in testbed: a plug-in)

``pact merge`` streams: it reads one key of every checkpoint at a time and writes the merged key
before reading the next (:func:`pactlib.streaming.merge_files`; the numbers are those of
:func:`pactlib.merge`), so its memory is about one layer's, whatever the number of tasks.
Checkpoints are ``.safetensors`` files, sharded checkpoints (their ``*.index.json``, or a model
folder), or ``.pt``/``.pth``/``.bin`` state dicts, converted once to safetensors in a cache
(:mod:`pactlib.lazy`). The output is ``.safetensors`` (with ``--max-shard-size``, shards and a
``*.index.json`` when needed) or ``.pt`` (held in memory). With ``--trust-pickle``
they are read by the trusted reader (:func:`pactlib.lazy.trusted_reader`; pactlib's is
:func:`pactlib.models.clip.load_clip_checkpoint`), which also unpickles whole saved modules (the
task-vectors repositories' ``ImageEncoder`` files; this runs code from the files) and takes their
state dict, keys unchanged (``model.visual.*``). ``--set`` values are parsed as numbers when they
read as one (``k=20``, ``core_frac=1e-1``), else as a YAML flow literal (``svd=rsvd``,
``layers=[a, b]``, ``x=null``; :func:`parse_literal`, no PyYAML needed), routed to the method's
parameters or PACT's options by name and checked against their types.

Sub-command groups other than ``merge`` and ``methods`` are plug-ins: every entry point of the
group ``pactlib.cli`` names a function ``add_cli(subparsers)`` that adds its sub-parsers
(pactlib's own pyproject.toml declares ``data`` and ``zoo``, the built-in testbed's). A plug-in
whose module cannot be imported (e.g. numpy missing: ``pip install pactlib[book]``) is listed
as unavailable, and running it prints why.

``pact merge`` checks everything that needs no checkpoint before it loads one: α finite, the
``--out`` extension, ``--out`` not one of the inputs, ``--set`` names, types and values. Errors
print as ``pact: error: ...`` (exit status 2), warnings as ``pact: warning: ...``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path

from . import merges
from .api import resolve_kwargs
from .checks import CheckpointError, check_alpha
from .io import load_state_dict
from .lazy import check_out_suffix, parse_size, trusted_reader
from .matrix import PRESETS, MatrixRule, detect_preset
from .streaming import merge_files


_NULL = {"~", "null", "Null", "NULL"}
_TRUE = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}
_FALSE = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}


def _plain(text: str):
    """A plain scalar: YAML 1.1's nulls and booleans, an int (``0x1f`` too), a float, else the
    string itself."""
    if text in _NULL:
        return None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    for number in (int, float, lambda t: int(t, 0)):
        try:
            return number(text)
        except ValueError:
            pass
    return text


class _Literal:
    """Recursive descent over one YAML flow literal: ``[a, b]``, ``{k: v}``, quoted strings,
    plain scalars (:func:`_plain`), nested."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def fail(self, what: str):
        raise ValueError(f"{what} at character {self.i + 1}")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def value(self, top: bool = False):
        self.ws()
        if self.i >= len(self.s):
            self.fail("expected a value")
        c = self.s[self.i]
        if c == "[":
            return self.sequence()
        if c == "{":
            return self.mapping()
        if c in "'\"":
            return self.quoted(c)
        if top:  # the rest of the text, as YAML reads a block plain scalar
            text, self.i = self.s[self.i:].strip(), len(self.s)
            return _plain(text)
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in ",]}" and not self._colon():
            self.i += 1
        text = self.s[start:self.i].strip()
        if not text:
            self.fail("expected a value")
        return _plain(text)

    def _colon(self) -> bool:
        return self.s[self.i] == ":" and (self.i + 1 == len(self.s) or self.s[self.i + 1] in " \t,]}")

    def quoted(self, q: str) -> str:
        start, self.i = self.i, self.i + 1
        while self.i < len(self.s):
            c = self.s[self.i]
            if q == "'" and c == "'":
                if self.s[self.i + 1:self.i + 2] == "'":  # '' is one quote
                    self.i += 2
                    continue
                self.i += 1
                return self.s[start + 1:self.i - 1].replace("''", "'")
            if q == '"' and c == "\\":
                self.i += 2
                continue
            if q == '"' and c == '"':
                self.i += 1
                try:
                    return json.loads(self.s[start:self.i])
                except ValueError:
                    self.i = start
                    self.fail("bad escape in a double-quoted string")
            self.i += 1
        self.i = start
        self.fail(f"unclosed {q} quote")

    def _items(self, close: str, item):
        self.i += 1
        out = []
        self.ws()
        if self.s[self.i:self.i + 1] == close:
            self.i += 1
            return out
        while True:
            out.append(item())
            self.ws()
            if self.i >= len(self.s):
                self.fail(f"missing {close!r}")
            if self.s[self.i] == close:
                self.i += 1
                return out
            if self.s[self.i] != ",":
                self.fail(f"expected ',' or {close!r}")
            self.i += 1
            self.ws()
            if self.s[self.i:self.i + 1] == close:  # a trailing comma
                self.i += 1
                return out

    def _pair(self, close: str):
        """``key[: value]`` -> (key, value or None, whether a colon was there)."""
        key = self.value()
        self.ws()
        if self.i < len(self.s) and self._colon():
            self.i += 1
            self.ws()
            if self.i < len(self.s) and self.s[self.i] in "," + close:
                return key, None, True
            return key, self.value(), True
        return key, None, False

    def _hashable(self, key):
        try:
            hash(key)
        except TypeError:
            self.fail("a mapping key must be a scalar")
        return key

    def sequence(self) -> list:
        def item():  # YAML: `[a: 1]` is a list holding the mapping {a: 1}
            key, value, colon = self._pair("]")
            return {self._hashable(key): value} if colon else key
        return self._items("]", item)

    def mapping(self) -> dict:
        return {self._hashable(k): v for k, v, _ in self._items("}", lambda: self._pair("}"))}


def parse_literal(text: str):
    """``text`` as a YAML flow literal, without PyYAML: ``null``/``~`` -> None, YAML 1.1 booleans
    (``true``, ``yes``, ``on``, ...), ints, floats, ``'single'`` / ``"double"`` quoted strings,
    ``[a, b]`` lists and ``{k: v}`` mappings (nested), anything else the string itself.

    Raises:
        ValueError: an unbalanced bracket or quote, or text after the literal.
    """
    p = _Literal(text)
    value = p.value(top=True)
    p.ws()
    if p.i != len(p.s):
        p.fail("unexpected text after the value")
    return value


def parse_value(key: str, text: str):
    """One ``--set`` value: an int, else a float (``1e-1`` too, which YAML 1.1 reads as a
    string), else a YAML flow literal (:func:`parse_literal`: ``true``, ``null``, ``[a, b]``, a
    string).

    Raises:
        ValueError: an empty value or a literal that does not parse (naming ``key``).
    """
    text = text.strip()
    if not text:
        raise ValueError(f"--set {key}=: empty value for {key!r} (write {key}=null for None)")
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    try:
        return parse_literal(text)
    except ValueError as e:
        raise ValueError(f"--set {key}={text}: cannot parse the value of {key!r} ({e})") from None


def parse_set(items: list[str]) -> dict:
    """``["k=20", "svd=rsvd"]`` -> ``{"k": 20, "svd": "rsvd"}`` (values: :func:`parse_value`).

    Raises:
        ValueError: an item without ``=``, with an empty key, an empty or unparsable value.
    """
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = parse_value(key.strip(), value)
    return out


def check_out_path(out: str, inputs: list[str], max_shard_size=None) -> None:
    """Check ``--out`` before any work: a supported extension (``.safetensors``, a torch file, or
    ``*.safetensors.index.json`` for a sharded output), and not one of the inputs.

    Raises:
        CheckpointError: unknown extension (supported ones listed), or a torch file with
            ``--max-shard-size``.
        ValueError: ``out`` is (resolves to, or is the same file as) an input.
    """
    check_out_suffix(out, max_shard_size)
    o = Path(out)
    for p in inputs:
        same = o.resolve() == Path(p).resolve()
        if not same and o.exists() and Path(p).exists():
            same = os.path.samefile(o, p)
        if same:
            raise ValueError(f"--out {out} is the input {p}: writing there would overwrite it; choose another file")


def load_checkpoint(path: str, *, trust_pickle: bool = False, mmap: bool = False) -> dict:
    """State dict of one pickled ``pact merge`` input (read to convert it to safetensors once).

    Without ``trust_pickle``: :func:`pactlib.io.load_state_dict` (no pickled code runs;
    memory-mapped with ``mmap``). With it: the trusted reader (:func:`pactlib.lazy.trusted_reader`;
    pactlib's is :func:`pactlib.models.clip.load_clip_checkpoint`, ``trust_pickle=True``), which
    also reads a whole pickled ``nn.Module`` (returning its ``state_dict()``, keys unchanged) and
    model folders.

    Raises:
        CheckpointError: unreadable file; for a pickled module without ``trust_pickle``, the
            message names the file and ``--trust-pickle``.
        FileNotFoundError: no such file.
    """
    if trust_pickle:
        return trusted_reader()(path, trust_pickle=True)
    try:
        return load_state_dict(path, mmap=mmap)
    except CheckpointError as e:
        if isinstance(e.__cause__, pickle.UnpicklingError):
            raise CheckpointError(
                f"{path} holds pickled Python objects, not a plain state dict (e.g. a whole "
                "ImageEncoder module saved with torch.save(module), as the task-vectors "
                "repositories do). Unpickling it runs code from the file; if you trust the file, "
                "rerun with --trust-pickle") from e
        raise


def cmd_merge(args) -> int:
    # every check that needs no checkpoint, before loading any
    check_alpha(args.alpha)
    if args.max_shard_size is not None:
        parse_size(args.max_shard_size)
    check_out_path(args.out, [args.pretrained, *args.finetuned], args.max_shard_size)
    kw = parse_set(args.set)
    resolve_kwargs(args.method, args.pact, kw)

    def loader(path):
        return load_checkpoint(path, trust_pickle=args.trust_pickle, mmap=True)

    loader.cache_tag = "trusted" if args.trust_pickle else "plain"
    rule = args.rule
    if rule == "auto":  # from θ0's key names (its header; a pickle is converted here, once)
        from .lazy import open_checkpoint

        rule = detect_preset(open_checkpoint(args.pretrained, loader=loader).keys())
    res = merge_files(args.method, args.pretrained, args.finetuned, args.out, alpha=args.alpha, pact=args.pact,
                      names=args.finetuned, rule=MatrixRule.preset(rule), max_shard_size=args.max_shard_size,
                      loader=loader, workers=args.workers, **kw)
    print(json.dumps({"out": str(res.path), "method": args.method, "pact": args.pact, "alpha": args.alpha,
                      "tasks": res.tasks, "rule": rule, "params": kw, "files": [str(f) for f in res.files]}))
    return 0


def cmd_methods(args) -> int:
    for name in merges.names():
        m = merges.get(name)
        print(f"{name:16s} {m.pretty:16s} params={m.params}  α∈[{m.alphas[0]}, {m.alphas[-1]}]  ({m.reference})")
    return 0


#: Entry-point group of sub-command plug-ins: each names a function ``add_cli(subparsers)``.
CLI_GROUP = "pactlib.cli"


def _unavailable(name: str, error: BaseException):
    def run(args) -> int:
        raise ValueError(f"'pact {name}' is unavailable: its plug-in (entry point {name!r} of {CLI_GROUP!r}) "
                         f"cannot be loaded ({type(error).__name__}: {error}); for pactlib's own, "
                         "install the book's dependencies: pip install -e '.[book]'")
    return run


def add_plugins(sub) -> None:
    """Add the sub-commands of every ``pactlib.cli`` entry point (sorted by name) to ``sub``; one
    that fails to load gets a placeholder that says why when run."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=CLI_GROUP), key=lambda e: e.name):
        if ep.name in sub.choices:
            continue  # a second distribution declaring the same group name
        try:
            add_cli = ep.load()
        except Exception as e:  # an optional dependency missing, ...
            stub = sub.add_parser(ep.name, help=f"(unavailable: {type(e).__name__}: {e})")
            stub.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            stub.set_defaults(func=_unavailable(ep.name, e))
            continue
        add_cli(sub)


#: The engine's own sub-commands: running one loads no plug-in.
BUILTIN = ("merge", "methods")


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The ``pact`` parser; with ``plugins`` also the sub-commands of :data:`CLI_GROUP`."""
    p = argparse.ArgumentParser(prog="pact", description="PACT model merging (pactlib)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress and reports")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge fine-tuned checkpoints into one")
    m.add_argument("--method", required=True, help=f"one of: {', '.join(merges.names())}")
    m.add_argument("--pact", choices=["pact", "s-pact"], default=None, help="filter task vectors first")
    m.add_argument("--alpha", type=float, required=True, help="scaling coefficient α")
    m.add_argument("--pretrained", required=True, help="θ0 checkpoint file")
    m.add_argument("--finetuned", nargs="+", required=True, help="fine-tuned checkpoint files")
    m.add_argument("--out", required=True,
                   help="output file (.safetensors, .pt, or x.safetensors.index.json for a sharded output)")
    m.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="method parameters / PACT options, e.g. k=20 core_frac=0.1 svd=rsvd")
    m.add_argument("--trust-pickle", action="store_true",
                   help="also read checkpoints that are whole pickled modules (task-vectors "
                        "ImageEncoder files); unpickling runs code from the files: trusted files only")
    m.add_argument("--rule", choices=["auto", *PRESETS], default="auto",
                   help="matrix rule: which keys are merged as matrices. auto (default): the preset of the "
                        "family the key names belong to (gpt2, decoder_lm, hf_encoder, else default = CLIP / "
                        "conv nets); reference_2d: every 2-d tensor but text_projection, as the reference "
                        "TSV-M / Iso-C code")
    m.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="split a .safetensors output into shards of at most SIZE (e.g. 2GB, 500MB, 1.5GiB, bytes) "
                        "with a Hugging Face *.index.json, when it needs more than one")
    m.add_argument("--workers", type=int, default=1,
                   help="layers merged at once, each on one thread (default 1; same result for any value, "
                        "memory grows with it)")
    m.set_defaults(func=cmd_merge)
    sub.add_parser("methods", help="list the registered merge methods").set_defaults(func=cmd_methods)
    if plugins:
        add_plugins(sub)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"pact: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(plugins=command not in BUILTIN).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.func(args)
        except (CheckpointError, FileNotFoundError, ValueError, TypeError, KeyError) as e:
            print(f"pact: error: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
