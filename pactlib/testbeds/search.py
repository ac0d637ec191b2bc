"""``pact search``: choose α on validation for a testbed from the command line.

    pact search --testbed synthetic-3 --method iso_c [--pact pact|s-pact] [--params FILE.yaml]
                [--alphas 0.1 0.5 1.0 | --alpha-points 5] [--seed 0] [--kind full|lora]
                [--device cpu|cuda|auto] [--threads N] [--set KEY=VALUE ...] [--option KEY=VALUE ...]
                [--widen 3] [--refine 0] [--out-records r.jsonl] [--out merged.safetensors]

It loads the testbed (:func:`pactlib.testbeds.load`), merges its task vectors with ``--method``
(after the PACT / S-PACT filter with ``--pact``), evaluates every α of the grid on the validation
split, takes the α with the best mean normalized accuracy, evaluates it on test
(:func:`pactlib.testbeds.run`: the book's own protocol, grid widened at an edge, book/method.md, protocol),
prints the α curve and the choice, and writes

- ``--out-records``: the record (:func:`pactlib.book.records.write_records`, appended);
- ``--out``: the merged checkpoint θ0 + α·D at the chosen α. A testbed that offers its checkpoint
  files (:func:`pactlib.testbeds.base.merge_sources`, e.g. ``clip``) gets D key by key
  (:func:`pactlib.testbeds.base.streamed_update`) and the file is written key by key
  (:func:`write_merged`, :class:`pactlib.lazy.CheckpointWriter`): no task vector is held; other
  testbeds merge in memory (:func:`pactlib.io.save_state_dict`). The same numbers either way.

The grid: ``--alphas`` as given, else ``--alpha-points`` values over the method's range
(:func:`pactlib.testbeds.alpha_grid`; LoRA testbeds: 0.1…3.0 for every method, book/method.md, protocol),
else the method's full grid. ``--set`` takes method parameters and PACT options
(``k=20``, ``core_frac=0.1``, ``svd=exact``; as ``pact merge``), ``--option`` the testbed
loader's options (``val_limit=64``, ``cache_dir=…``). ``--device`` is passed to the testbed's
loader as ``device=`` (``auto``: cuda when present); a family without that option runs on the
CPU, so ``cpu`` is then accepted and ``cuda`` refused. ``--threads`` sets torch's thread count
(the PACT filter runs that many layers at once, :mod:`pactlib.threads`).

Named testbeds (a family whose testbeds need options, e.g. ``clip``: checkpoint and data paths)
must be defined before they are named. ``--params FILE`` defines the ``testbeds:`` section of a
parameter set as the book runner does (:func:`define_from_params`), e.g.
``pact search --params params/paper-vitb32-8.yaml --testbed clip-vitb32-8 --method iso_c``; a
named testbed whose path options name no existing file is refused before anything is loaded.
``$PACT_TESTBEDS`` also defines testbeds: JSON ``{name: {"family": ..., option: value, ...}}``,
read when :mod:`pactlib.testbeds` is imported (the book runner hands a set's definitions to its
kernels this way); ``--params`` replaces a definition of the same name.

A plug-in of the ``pact`` command (entry point ``search`` of the group ``pactlib.cli``): it needs
the book's dependencies (numpy for the α grid). Errors (an unknown method or testbed, a bad
option) print ``pact: error: ...`` and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_cli", "cmd_search", "search", "resolve_device", "grid", "write_merged"]


def resolve_device(device: str | None) -> str | None:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; None stays None
    (:func:`pactlib.checks.check_device`).

    Raises:
        ValueError: ``"cuda"`` without a GPU, or another value.
    """
    from ..checks import check_device

    return None if device is None else check_device(device, name="--device")


def grid(method: str, kind: str, alphas=None, points: int | None = None) -> tuple[float, ...]:
    """The α grid of ``pact search`` (module docstring).

    Raises:
        ValueError: an empty, negative or non-finite ``alphas``, ``points`` < 1, both given.
        UnknownMethodError: unknown method.
    """
    from ..checks import check_alpha
    from .base import alpha_grid

    if alphas and points is not None:
        raise ValueError("give --alphas or --alpha-points, not both")
    if alphas:
        out = tuple(sorted({check_alpha(a) for a in alphas}))
        if out[0] < 0:
            raise ValueError(f"--alphas must be >= 0, got {out[0]}")
        return out
    if points is not None and points < 1:
        raise ValueError(f"--alpha-points must be >= 1, got {points}")
    lohi = dict(lo=0.1, hi=3.0) if kind == "lora" else {}
    return alpha_grid(method, points, **lohi)


def _load(name: str, seed: int, kind: str, device: str | None, options: dict):
    from . import load

    if device is None:
        return load(name, seed=seed, kind=kind, **options)
    try:
        return load(name, seed=seed, kind=kind, device=device, **options)
    except TypeError as e:
        if "device" not in str(e):
            raise
        if device != "cpu":
            raise ValueError(f"--device {device}: testbed {name!r} takes no device option (it runs on the CPU)") \
                from None
        return load(name, seed=seed, kind=kind, **options)


def write_merged(out, pretrained, D, alpha: float, *, metadata: dict[str, str] | None = None):
    """Write θ0 + α·D to ``out`` key by key (book/method.md, merges; D of any of M1–M5, optionally after PACT),
    in θ0's dtypes, atomically (:class:`pactlib.lazy.CheckpointWriter`: a failed run leaves no
    file): one key of θ0 and of θ0 + α·D in memory at a time besides D.

    Args:
        out: ``*.safetensors`` or a torch file (``.pt``, collected in memory).
        pretrained: θ0 as a :class:`pactlib.lazy.LazyCheckpoint` (every key is written, in its
            order; keys without an entry in D, e.g. integer buffers, are copied from θ0).
        D: the merged update ``{key: Tensor}`` over θ0's floating keys, each of θ0's shape (any
            device). ``alpha``: α, a finite real number.
        metadata: the safetensors ``__metadata__`` strings.

    Returns:
        The paths written.

    Raises:
        ValueError: a bad ``out`` extension, α not finite; a key of D that θ0 lacks, or a float
            key of θ0 missing from D, or a shape mismatch (named).
        MergeOverflowError: a merged value overflows θ0's dtype (fp16).
    """
    from ..checks import check_alpha
    from ..streaming import apply_update
    from ..lazy import CheckpointWriter

    alpha = check_alpha(alpha)
    meta = pretrained.meta()
    extra = sorted(set(D) - set(meta))
    missing = sorted(k for k, v in meta.items() if v.is_floating_point() and k not in D)
    if extra or missing:
        raise ValueError(f"write_merged: D does not fit θ0 ({pretrained.name}): keys not in θ0 {extra[:5]}, "
                         f"floating keys of θ0 missing from D {missing[:5]}")
    for k in D:
        if tuple(D[k].shape) != tuple(meta[k].shape):
            raise ValueError(f"write_merged: key {k!r}: D has shape {tuple(D[k].shape)}, θ0 {tuple(meta[k].shape)}")
    with CheckpointWriter(out, [(k, v.shape, v.dtype) for k, v in meta.items()], metadata=metadata) as writer:
        for k in meta:
            p = pretrained.read(k)
            writer.write(k, apply_update(k, p, D[k].detach().cpu(), alpha) if k in D else p)
            del p
        return writer.commit()


def search(testbed: str, method: str, *, pact: str | None = None, alphas=None, alpha_points: int | None = None,
           seed: int = 0, kind: str = "full", device: str | None = None, params: dict | None = None,
           options: dict | None = None, widen: int = 3, refine: int = 0, out: str | None = None):
    """Load ``testbed``, run ``method`` (± PACT) over the α grid, and return ``(record, merged
    state dict at the chosen α or None, testbed)``; with ``out`` the merged state is also saved
    (module docstring). The merged state is None without ``out``, and also when the testbed
    offers its checkpoint files: D is then computed key by key and the file written key by key
    (:func:`write_merged`); read ``out`` for the state.

    Raises:
        KeyError / UnknownMethodError: unknown testbed or method. ValueError, TypeError: bad
        parameters, options or grid (named).
    """
    from .. import merges
    from ..api import merged_update, resolve_kwargs
    from . import check_name
    from .base import filtered, own_task_vectors, run

    merges.get(method)  # named errors before anything is loaded
    check_name(testbed)
    mparams, opts = resolve_kwargs(method, pact, dict(params or {}))
    alphas = grid(method, kind, alphas, alpha_points)
    if out is not None:
        from ..lazy import check_out_suffix

        check_out_suffix(out)
    tb = _load(testbed, seed, kind, resolve_device(device), dict(options or {}))
    rec = run(tb, method, pact=pact, options=opts, alphas=alphas, widen=widen, refine=refine, **mparams)
    merged = None
    streamed = None
    if out is not None:
        from .base import merge_sources, streamed_update

        sources = merge_sources(tb)
        if sources is not None:
            streamed = streamed_update(tb, method, pact=pact, options=opts, **mparams)  # its own files
    meta = None if out is None else {"testbed": tb.name, "method": rec["method"], "alpha": repr(rec["alpha"]),
                                     "seed": str(tb.seed), "kind": tb.kind}
    if streamed is not None:  # key by key: no task vector in memory
        write_merged(out, sources[0], streamed[0], rec["alpha"], metadata=meta)
    elif out is not None:
        if pact:  # as run() merges: the filter once per testbed, then the base method
            tvs, _ = filtered(tb, pact, opts)
            D, _ = merged_update(method, tb.pretrained, tvs, rule=tb.rule, **mparams)
        else:
            D, _ = merged_update(method, tb.pretrained, own_task_vectors(tb), rule=tb.rule, **mparams)
        merged = D.apply_to(tb.pretrained, rec["alpha"])
        from ..io import save_state_dict

        save_state_dict({k: v.detach().cpu() for k, v in merged.items()}, out, metadata=meta)
    return rec, merged, tb


def _table(rec: dict) -> str:
    lines = [f"{'alpha':>8}  {'val acc':>8}  {'val norm':>8}"]
    for c in rec["curve"]:
        mark = "  <- chosen" if c["alpha"] == rec["alpha"] else ""
        extra = "  (widened)" if c["alpha"] in rec.get("widened", []) else ""
        lines.append(f"{c['alpha']:8.4g}  {c['mean_acc']:8.4f}  {c['mean_normalized']:8.4f}{mark}{extra}")
    m = rec["metrics"]
    lines.append(f"chosen alpha {rec['alpha']:.4g}{' (on the edge of the grid)' if rec.get('on_edge') else ''}: "
                 f"val norm acc {m['val_norm_acc']:.4f} (acc {m['val_acc']:.4f}); "
                 f"test norm acc {m['norm_acc']:.4f} (acc {m['acc']:.4f})")
    return "\n".join(lines)


def define_from_params(path) -> list[str]:
    """Define the ``testbeds:`` section of the parameter set ``path`` (a YAML file, or a set's name:
    ``params/<name>.yaml`` under the current folder, as the book runner takes it), as the book
    runner does (:func:`pactlib.book.params.testbed_definitions`, then
    :func:`pactlib.testbeds.define_all` replacing same-named definitions).

    Returns:
        The names defined, in file order (``[]`` for a set without a ``testbeds:`` section).

    Raises:
        FileNotFoundError: no such file. ValueError (``ParameterError``): not YAML, a malformed
            section, an unknown family or option, a bad option value (every problem at once,
            naming the file, the testbed and the key).
    """
    from pathlib import Path as _Path

    from ..book.params import testbed_definitions
    from . import define_all

    path = _Path(path)
    if path.suffix not in (".yaml", ".yml") and not path.exists():  # a set's name, as the book runner takes it
        named = _Path("params") / f"{path}.yaml"
        if not named.is_file():
            raise FileNotFoundError(f"--params {path}: no such file, and no parameter set {named} under the "
                                    f"current folder (give a path, or a set's name from the repository's root)")
        path = named
    return define_all(testbed_definitions(path), where=f"{path.name}: testbeds", replace=True)


def _check_paths(name: str) -> None:
    """Refuse a defined testbed whose path options name no existing file (placeholders)."""
    from . import missing_paths

    missing = missing_paths(name)
    if missing:
        raise ValueError(f"testbed {name!r}: " + "; ".join(f"{opt} {path} does not exist" for opt, path in missing)
                         + " (edit the definition's paths)")


def cmd_search(args) -> int:
    from ..cli import parse_set, set_threads
    from ..merges import UnknownMethodError

    set_threads(args.threads)
    if args.params is not None:
        define_from_params(args.params)
    _check_paths(args.testbed)
    if args.out_records is not None and Path(args.out_records).is_dir():
        raise ValueError(f"--out-records {args.out_records} is a folder; name a .jsonl file")
    try:
        rec, _, tb = search(args.testbed, args.method, pact=args.pact, alphas=args.alphas,
                            alpha_points=args.alpha_points, seed=args.seed, kind=args.kind, device=args.device,
                            params=parse_set(args.set), options=parse_set(args.option), widen=args.widen,
                            refine=args.refine, out=args.out)
    except UnknownMethodError:
        raise
    except KeyError as e:  # an unknown testbed / variant: KeyError quotes its message
        raise ValueError(e.args[0] if e.args else str(e)) from None
    print(f"{rec['method']} on {tb.name} (seed {tb.seed}, {tb.kind}; {len(tb.tasks)} tasks)")
    print(_table(rec))
    if args.out_records is not None:
        from ..book.records import write_records

        write_records(args.out_records, [rec])
    print(json.dumps({"testbed": tb.name, "method": args.method, "pact": args.pact, "seed": tb.seed, "kind": tb.kind,
                      "alpha": rec["alpha"], "val_norm_acc": rec["metrics"]["val_norm_acc"],
                      "norm_acc": rec["metrics"]["norm_acc"], "acc": rec["metrics"]["acc"],
                      "records": args.out_records, "out": args.out}))
    sys.stdout.flush()
    return 0


def add_cli(sub) -> None:
    """Add ``pact search`` to the ``pact`` sub-parsers (entry point ``search`` of ``pactlib.cli``)."""
    p = sub.add_parser("search", help="choose α on validation for a testbed (method ± PACT), write the record "
                                      "and the merged checkpoint",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="named testbeds (e.g. the clip family, read from your checkpoint files) need a\n"
                              "definition: --params FILE defines the testbeds: section of a parameter set, as the\n"
                              "book runner does, e.g.\n"
                              "  pact search --params params/paper-vitb32-8.yaml --testbed clip-vitb32-8 \\\n"
                              "      --method iso_c --pact pact\n"
                              "$PACT_TESTBEDS also defines testbeds: JSON {name: {\"family\": ..., option: value, ...}},\n"
                              "read when pactlib.testbeds is imported; --params replaces a definition of the same name.")
    p.add_argument("--testbed", required=True,
                   help="a testbed name, e.g. synthetic-3, lite0-8, or one defined by --params / $PACT_TESTBEDS")
    p.add_argument("--params", default=None, metavar="SET",
                   help="a parameter set (a YAML file, or a name under ./params/, e.g. paper-vitb32-8) whose "
                        "testbeds: section defines named testbeds (as the book runner)")
    p.add_argument("--method", required=True, help="a merge method (pact methods lists them)")
    p.add_argument("--pact", choices=["pact", "s-pact"], default=None, help="filter the task vectors first")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--alphas", type=float, nargs="+", default=None, metavar="A", help="the α grid")
    g.add_argument("--alpha-points", type=int, default=None, metavar="N",
                   help="N α values over the method's range (default: the method's full grid)")
    p.add_argument("--seed", type=int, default=0, help="fine-tuning seed of the testbed (default 0)")
    p.add_argument("--kind", choices=["full", "lora"], default="full", help="full or LoRA fine-tunes")
    p.add_argument("--device", default=None, metavar="cpu|cuda|auto",
                   help="passed to the testbed's loader (auto: cuda when present); default: the testbed's own")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch's thread count for the command (1 to 4096; default: torch's): the merge and "
                        "the PACT filter run N layers at once, with the same result for any N; restored after")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="method parameters / PACT options, e.g. k=20 core_frac=0.1 svd=exact")
    p.add_argument("--option", nargs="*", default=[], metavar="KEY=VALUE",
                   help="testbed loader options, e.g. val_limit=64 cache_dir=/tmp/memo")
    p.add_argument("--widen", type=int, default=3, help="extra α values tried beyond an edge of the grid (default 3)")
    p.add_argument("--refine", type=int, default=0, help="rounds of coarse-to-fine α refinement (default 0)")
    p.add_argument("--out-records", default=None, metavar="FILE.jsonl", help="append the record here")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write θ0 + α·D at the chosen α here (.safetensors or .pt)")
    p.set_defaults(func=cmd_search)
