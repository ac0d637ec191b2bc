"""The ``pact`` command line.

    pact merge --method NAME [--pact pact|s-pact] --alpha A --pretrained FILE \\
               --finetuned FILE [FILE ...] --out FILE [--set key=value ...] [--trust-pickle]
               [--rule default|reference_2d]
    pact methods
    pact data prepare --suite 8            (built-in testbed)
    pact zoo build --suite 8 --seeds 0 1 2 (built-in testbed)

Checkpoints are ``.safetensors`` or ``.pt``/``.pth``/``.bin`` state dicts. With ``--trust-pickle``
they are read by :func:`pactlib.models.clip.load_clip_checkpoint`, which also unpickles whole
saved modules (the task-vectors repositories' ``ImageEncoder`` files; this runs code from the
files) and takes their state dict, keys unchanged (``model.visual.*``). ``--set`` values are
parsed as numbers when they read as one (``k=20``, ``core_frac=1e-1``), else as YAML
(``svd=rsvd``, ``layers=[a, b]``, ``x=null``), routed to the method's parameters or PACT's options
by name and checked against their types.

``pact merge`` checks everything that needs no checkpoint before it loads one: α finite, the
``--out`` extension, ``--out`` not one of the inputs, ``--set`` names, types and values. Errors
print as ``pact: error: ...`` (exit status 2), warnings as ``pact: warning: ...``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path

import yaml

from . import merges
from .api import merge, resolve_kwargs
from .checks import CheckpointError, check_alpha
from .io import check_suffix, load_state_dict, save_state_dict
from .matrix import PRESETS, MatrixRule


def parse_value(key: str, text: str):
    """One ``--set`` value: an int, else a float (``1e-1`` too, which YAML 1.1 reads as a
    string), else YAML (``true``, ``null``, ``[a, b]``, a string).

    Raises:
        ValueError: an empty value or YAML that does not parse (naming ``key``).
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
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--set {key}={text}: cannot parse the value of {key!r} ({str(e).splitlines()[0]})") from None


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


def check_out_path(out: str, inputs: list[str]) -> None:
    """Check ``--out`` before any work: a supported extension, and not one of the inputs.

    Raises:
        CheckpointError: unknown extension (supported ones listed).
        ValueError: ``out`` is (resolves to, or is the same file as) an input.
    """
    check_suffix(out)
    o = Path(out)
    for p in inputs:
        same = o.resolve() == Path(p).resolve()
        if not same and o.exists() and Path(p).exists():
            same = os.path.samefile(o, p)
        if same:
            raise ValueError(f"--out {out} is the input {p}: writing there would overwrite it; choose another file")


def load_checkpoint(path: str, *, trust_pickle: bool = False) -> dict:
    """State dict of one ``pact merge`` input.

    Without ``trust_pickle``: :func:`pactlib.io.load_state_dict` (no pickled code runs). With
    it: :func:`pactlib.models.clip.load_clip_checkpoint` (``trust_pickle=True``), which also
    reads a whole pickled ``nn.Module`` (returning its ``state_dict()``, keys unchanged) and
    model folders.

    Raises:
        CheckpointError: unreadable file; for a pickled module without ``trust_pickle``, the
            message names the file and ``--trust-pickle``.
        FileNotFoundError: no such file.
    """
    if trust_pickle:
        from .models.clip import load_clip_checkpoint

        return load_clip_checkpoint(path, trust_pickle=True)
    try:
        return load_state_dict(path)
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
    check_out_path(args.out, [args.pretrained, *args.finetuned])
    kw = parse_set(args.set)
    resolve_kwargs(args.method, args.pact, kw)
    pre = load_checkpoint(args.pretrained, trust_pickle=args.trust_pickle)
    fts = [load_checkpoint(p, trust_pickle=args.trust_pickle) for p in args.finetuned]
    out = merge(args.method, pre, fts, alpha=args.alpha, pact=args.pact, names=args.finetuned,
                rule=MatrixRule.preset(args.rule), **kw)
    save_state_dict(out, args.out)
    print(json.dumps({"out": args.out, "method": args.method, "pact": args.pact, "alpha": args.alpha,
                      "tasks": len(fts), "rule": args.rule, "params": kw}))
    return 0


def cmd_methods(args) -> int:
    for name in merges.names():
        m = merges.get(name)
        print(f"{name:16s} {m.pretty:16s} params={m.params}  α∈[{m.alphas[0]}, {m.alphas[-1]}]  ({m.reference})")
    return 0


#: Sub-command groups contributed by other modules: (module, function adding the sub-parsers).
EXTENSIONS = (("pactlib.data", "add_cli"), ("pactlib.zoo", "add_cli"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pact", description="PACT model merging (pactlib)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress and reports")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge fine-tuned checkpoints into one")
    m.add_argument("--method", required=True, help=f"one of: {', '.join(merges.names())}")
    m.add_argument("--pact", choices=["pact", "s-pact"], default=None, help="filter task vectors first")
    m.add_argument("--alpha", type=float, required=True, help="scaling coefficient α")
    m.add_argument("--pretrained", required=True, help="θ0 checkpoint file")
    m.add_argument("--finetuned", nargs="+", required=True, help="fine-tuned checkpoint files")
    m.add_argument("--out", required=True, help="output file (.safetensors or .pt)")
    m.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="method parameters / PACT options, e.g. k=20 core_frac=0.1 svd=rsvd")
    m.add_argument("--trust-pickle", action="store_true",
                   help="also read checkpoints that are whole pickled modules (task-vectors "
                        "ImageEncoder files); unpickling runs code from the files: trusted files only")
    m.add_argument("--rule", choices=list(PRESETS), default="default",
                   help="matrix rule: which keys are merged as matrices (default: pactlib's; reference_2d: "
                        "every 2-d tensor but text_projection, as the reference TSV-M / Iso-C code)")
    m.set_defaults(func=cmd_merge)
    sub.add_parser("methods", help="list the registered merge methods").set_defaults(func=cmd_methods)
    for module, fn in EXTENSIONS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, fn):
            getattr(mod, fn)(sub)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"pact: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
