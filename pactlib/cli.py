"""The ``pact`` command line.

    pact merge --method NAME [--pact pact|s-pact] --alpha A --pretrained FILE \\
               --finetuned FILE [FILE ...] --out FILE [--set key=value ...] [--trust-pickle]
    pact methods
    pact data prepare --suite 8            (built-in testbed)
    pact zoo build --suite 8 --seeds 0 1 2 (built-in testbed)

Checkpoints are ``.safetensors`` or ``.pt``/``.pth``/``.bin`` state dicts. With ``--trust-pickle``
they are read by :func:`pactlib.models.clip.load_clip_checkpoint`, which also unpickles whole
saved modules (the task-vectors repositories' ``ImageEncoder`` files; this runs code from the
files) and takes their state dict, keys unchanged (``model.visual.*``). ``--set`` values are
parsed as YAML scalars (``k=20``, ``svd=rsvd``, ``core_frac=0.05``) and routed to the method's
parameters or PACT's options by name.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import pickle
import sys

import yaml

from . import merges
from .api import merge, split_kwargs
from .checks import CheckpointError
from .io import load_state_dict, save_state_dict


def parse_set(items: list[str]) -> dict:
    """``["k=20", "svd=rsvd"]`` -> ``{"k": 20, "svd": "rsvd"}``.

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return out


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
    kw = parse_set(args.set)
    split_kwargs(args.method, kw)  # fail on unknown names before loading anything
    pre = load_checkpoint(args.pretrained, trust_pickle=args.trust_pickle)
    fts = [load_checkpoint(p, trust_pickle=args.trust_pickle) for p in args.finetuned]
    out = merge(args.method, pre, fts, alpha=args.alpha, pact=args.pact, names=args.finetuned, **kw)
    save_state_dict(out, args.out)
    print(json.dumps({"out": args.out, "method": args.method, "pact": args.pact, "alpha": args.alpha,
                      "tasks": len(fts), "params": kw}))
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.func(args)
    except (CheckpointError, FileNotFoundError, ValueError, TypeError, KeyError) as e:
        print(f"pact: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
