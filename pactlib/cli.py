"""The ``pact`` command line.

    pact merge --method NAME [--pact pact|s-pact] --alpha A --pretrained FILE \\
               (--finetuned FILE [FILE ...] | --lora-adapters DIR [DIR ...] [--lora-key-map NAME])
               --out FILE|DIR/ [--set key=value ...] [--trust-pickle]
               [--rule auto|default|hf_encoder|gpt2|decoder_lm|reference_2d] [--max-shard-size 2GB]
               [--workers N] [--threads N]
    pact merge --config pact_recipe.yaml --out FILE|DIR/ [--trust-pickle] [--workers N] [--threads N]
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
read as one (``k=20``, ``core_frac=1e-1``), else as JSON or a plain value (``svd=rsvd``, ``layers=[a, b]``, ``x=null``;
:func:`parse_literal`, no PyYAML needed), routed to the method's
parameters or PACT's options by name and checked against their types.

Sub-command groups other than ``merge`` and ``methods`` are plug-ins: every entry point of the
group ``pactlib.cli`` names a function ``add_cli(subparsers)`` that adds its sub-parsers
(pactlib's own pyproject.toml declares ``data`` and ``zoo``, the built-in testbed's). A plug-in
whose module cannot be imported (e.g. numpy missing: ``pip install pactlib[book]``) is listed
as unavailable, and running it prints why.

``--lora-adapters`` takes PEFT LoRA adapter folders instead of fine-tuned checkpoints
(:mod:`pactlib.peft`): each task vector is Δ = scale·B·A on the adapted weights (zero elsewhere),
scale from ``adapter_config.json`` (``lora_alpha``/``r``, ``use_rslora``, ``rank_pattern``,
``alpha_pattern``), fed to the streamed merge key by key as Δ itself; ``--lora-key-map`` maps
PEFT's module names onto θ0's keys (``hf_clip_to_open_clip``: q/k/v into ``in_proj_weight``).

``--out DIR/`` (a trailing slash, or an existing folder) writes a model folder as
``save_pretrained`` does: the weights, θ0's folder's config / tokenizer / processor files, a model
card and a recipe (:mod:`pactlib.recipe`); ``--config FILE`` redoes a recipe, and the flags that
define a merge are then refused (:func:`recipe_of`).

``pact merge`` checks everything that needs no checkpoint before it loads one: α finite, the
``--out`` extension, ``--out`` not one of the inputs, ``--set`` names, types and values. Errors
print as ``pact: error: ...`` (exit status 2), warnings as ``pact: warning: ...``.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import pickle
import signal
import sys
import threading
import warnings
from pathlib import Path

from .checks import CheckpointError, check_alpha, check_device
from .io import load_state_dict, published_outputs
from .lazy import check_out_suffix, check_out_target, parse_size, trusted_reader
from .matrix import PRESETS, MatrixRule, detect_preset
from .command import (RECIPE_FLAGS, _SIGNALS, _unwinding, parse_literal, parse_set, parse_value,  # noqa: F401
                      recipe_of, say_merged)


def check_out_path(out: str, inputs: list[str], max_shard_size=None) -> None:
    """Check ``--out`` before any work: a supported extension (``.safetensors``, a torch file, or
    ``*.safetensors.index.json`` for a sharded output), no file of an input among what it may
    write, and a writable place (:func:`pactlib.lazy.check_out_target`).

    Raises:
        CheckpointError: unknown extension (supported ones listed), a torch file with
            ``--max-shard-size``, a folder, an unwritable folder.
        ValueError: ``out`` would overwrite a file of an input, or another model's weights in
            a model folder no merge wrote (:func:`pactlib.recipe.check_model_folder_out`).
    """
    check_out_suffix(out, max_shard_size)
    check_out_target(out, inputs, name="--out")
    from .recipe import check_model_folder_out

    check_model_folder_out(out)


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
    """``pact merge``. A model folder is held whole for the run (:func:`pactlib.lazy.output_lock`,
    a lock file inside it): a second run into it fails, naming this one. The folder and the
    parents this run made are removed again, with all they hold, when the run fails or is
    stopped before its output is published. Task Arithmetic and TIES on safetensors files run
    without torch when :mod:`pactlib.fastpath` takes them."""
    import shutil

    from .io import OutputError, output_error, published_outputs
    from .lazy import FOLDER_LOCK, is_folder_output, output_lock
    from .recipe import check_folder_target

    def run() -> int:
        from .fastpath import try_merge

        status = try_merge(args)  # without torch, when the fast path takes the merge
        return _merge(args) if status is None else status

    if not is_folder_output(args.out):
        return run()
    folder = Path(args.out)
    check_folder_target(folder, [], written=False)  # a file is named as such, before anything is made
    made: list[Path] = []  # the folders this run made: the output and its missing parents, outermost first
    mark = len(published_outputs())
    try:
        for d in [*reversed(folder.parents), folder]:
            if not d.is_dir():
                with contextlib.suppress(FileExistsError):
                    d.mkdir()
                    made.append(d)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(output_lock(folder, folder=True))
            except OutputError:  # another run holds it: named as it is
                raise
            except OSError as e:  # a folder this run cannot write into
                raise output_error(folder / FOLDER_LOCK, e) from e
            try:
                return run()
            except BaseException:
                if made and len(published_outputs()) == mark:  # all but the lock, still held
                    for child in list(folder.iterdir()):
                        if child.name != FOLDER_LOCK:
                            if child.is_dir() and not child.is_symlink():
                                shutil.rmtree(child, ignore_errors=True)
                            else:
                                child.unlink(missing_ok=True)
                raise
    except BaseException:
        if len(published_outputs()) == mark:  # the folders made, once empty: a run that took one since keeps it
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    break
        raise


def _merge(args) -> int:
    import dataclasses

    from . import recipe as rc
    from .api import resolve_kwargs
    from .streaming import allocator_settings, merge_files, return_freed_memory

    r = recipe_of(args)
    # every check that needs no checkpoint, before loading any
    check_alpha(r.alpha)
    folder = Path(args.out) if rc.is_folder_output(args.out) else None
    max_shard_size = r.max_shard_size if folder is None or r.max_shard_size is not None else rc.DEFAULT_SHARD_SIZE
    if max_shard_size is not None:
        parse_size(max_shard_size)
    set_threads(args.threads)
    if args.device is not None:
        check_device(args.device, name="--device")
    adapters = list(r.models) if r.lora else []
    inputs = [r.base_model, *([] if r.lora else r.models)]
    if adapters:
        from .peft import adapter_files

        inputs += [str(f) for d in adapters for f in adapter_files(d)]
    out = args.out
    if folder is not None:
        rc.check_folder_target(folder, inputs)
        out = str(folder / rc.weights_name(r.base_model))
    check_out_path(out, inputs, max_shard_size)
    kw = dict(r.params)
    mparams, _ = resolve_kwargs(r.merge_method, r.pact, kw, pact_hint="--pact pact (or s-pact)")
    # freed buffers go back to the OS; chunk-sized ones are reused from the heap (the docstrings say why)
    return_freed_memory(*allocator_settings(r.merge_method, r.pact, mparams))
    workers = args.workers if args.workers is not None else (args.threads or 1)
    if adapters:
        from .peft import resolve_key_map

        resolve_key_map(r.lora_key_map)  # an unknown name fails before any file is read

    def loader(path):
        return load_checkpoint(path, trust_pickle=args.trust_pickle, mmap=True)

    loader.cache_tag = "trusted" if args.trust_pickle else "plain"
    from .lazy import open_checkpoint

    base = open_checkpoint(r.base_model, loader=loader)  # θ0's header (a pickle is converted once)
    dtypes = sorted({str(base.dtype(k)).removeprefix("torch.") for k in base.keys() if base.dtype(k).is_floating_point})
    if r.dtype is not None and dtypes != [r.dtype]:
        raise rc.RecipeError(f"{args.config or 'recipe'}: dtype: {r.dtype}, but the pre-trained checkpoint's "
                             f"weights are {', '.join(dtypes)}; pact merge writes θ0's dtypes and does not cast")
    if folder is not None or r.sha256:  # inputs pinned by the recipe are checked before merging
        r = dataclasses.replace(r, sha256=rc.check_sha256(r, where=args.config or "recipe", workers=workers),
                                dtype=dtypes[0] if len(dtypes) == 1 else None)
    rule = r.rule
    if rule == "auto":  # from θ0's key names
        rule = detect_preset(base.keys())
    # merge_files warns on Hugging Face CLIP's separate q/k/v (another per-layer view than open_clip's fused in_proj)
    if adapters:
        from .peft import AdapterSource

        finetuned = [AdapterSource(d, key_map=r.lora_key_map, extra=r.lora_extra, name=d,
                                   rule=MatrixRule.preset(rule)) for d in adapters]
        names = list(adapters)
    else:
        finetuned = names = list(r.models)
    folder_files = contextlib.nullcontext()
    if folder is not None:  # the folder's other files are written before the weights are published, renamed after
        from .lazy import CheckpointWriter

        shards = CheckpointWriter(out, [(k, v.shape, v.dtype) for k, v in base.meta().items()],
                                  max_shard_size=max_shard_size).files  # the names merge_files will write
        folder_files = rc.FolderFiles(folder, r, sha256=r.sha256, weights=[f.path.name for f in shards])
    with folder_files:  # a folder's files are written in its staging folder, swapped in whole (FolderFiles)
        res = merge_files(r.merge_method, r.base_model, finetuned, folder_files.staged(out) if folder else out,
                          alpha=r.alpha, pact=r.pact, names=names, rule=MatrixRule.preset(rule),
                          max_shard_size=max_shard_size, loader=loader, workers=workers, device=args.device,
                          on_publish=folder_files.publish if folder is not None else None, **kw)
    final = (lambda f: folder / Path(f).name) if folder is not None else (lambda f: f)
    extra = {"lora_adapters": adapters, "lora_key_map": r.lora_key_map} if adapters else {}
    say_merged({"out": str(final(res.path)), "method": r.merge_method, "pact": r.pact, "alpha": r.alpha,
                "tasks": res.tasks, "rule": rule, "params": kw, **extra,
                **({"folder": str(folder)} if folder is not None else {}),
                "files": [str(final(f)) for f in res.files]})
    return 0


#: torch's thread count before ``--threads`` changed it (:func:`set_threads`, :func:`main`)
_threads: dict[str, int] = {}


def set_threads(threads: int | None) -> None:
    """``--threads N``: torch's intra-op thread count (None: leave it as it is).

    Raises:
        ValueError: N < 1 or N > 4096.
    """
    if threads is None:
        return
    if not 1 <= threads <= 4096:
        raise ValueError(f"--threads must be from 1 to 4096, got {threads}")
    import torch

    _threads.setdefault("before", torch.get_num_threads())  # restored by main() for a caller in the same process
    torch.set_num_threads(threads)


def cmd_methods(args) -> int:
    from . import merges

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
    m.add_argument("--config", default=None, metavar="FILE",
                   help="a recipe (pact_recipe.yaml, as a folder output writes it; mergekit's field names) giving "
                        "the merge instead of --method/--alpha/--pretrained/--finetuned/--set/...: those are then "
                        "refused; --out, --workers, --threads, --device and --trust-pickle stay flags")
    m.add_argument("--method", default=None, help="a merge method: task_arithmetic, ties, tsv_m, iso_c, iso_cts, ... (`pact methods` lists them)")
    m.add_argument("--pact", choices=["pact", "s-pact"], default=None, help="filter task vectors first")
    m.add_argument("--alpha", type=float, default=None, help="scaling coefficient α")
    m.add_argument("--pretrained", default=None,
                   help="θ0: a checkpoint file (.safetensors, .pt, .bin), a sharded checkpoint's *.index.json, or "
                        "a model folder")
    src = m.add_mutually_exclusive_group()
    src.add_argument("--finetuned", nargs="+",
                     help="the fine-tuned checkpoints, each as --pretrained takes θ0 (file, *.index.json or folder)")
    src.add_argument("--lora-adapters", nargs="+", metavar="DIR",
                     help="PEFT LoRA adapter folders (adapter_model.safetensors + adapter_config.json) instead of "
                          "--finetuned: each task vector is scale·B·A per adapted weight (pactlib.peft)")
    m.add_argument("--lora-key-map", default=None, metavar="NAME",
                   help="how PEFT module names map onto --pretrained's keys: identity (default), "
                        "hf_clip_to_open_clip (HF CLIP adapters on an open_clip checkpoint: q/k/v into in_proj_weight), "
                        "hf_clip_to_image_encoder (the same under model.)")
    m.add_argument("--lora-extra", choices=["error", "skip"], default=None,
                   help="adapter entries that are whole weights, not LoRA factors (modules_to_save, trained biases): "
                        "error (default) or skip (left out, with a warning)")
    m.add_argument("--out", required=True,
                   help="output file (.safetensors, .pt, or x.safetensors.index.json for a sharded output), or a "
                        "model folder (DIR/ with a trailing slash, or an existing folder): weights, θ0's folder's "
                        "config and tokenizer files, a model card README.md and the recipe pact_recipe.yaml")
    m.add_argument("--set", nargs="*", action="extend", default=None, metavar="KEY=VALUE",
                   help="method parameters / PACT options, e.g. k=20 core_frac=0.1 svd=rsvd")
    m.add_argument("--trust-pickle", action="store_true",
                   help="also read checkpoints that are whole pickled modules (task-vectors "
                        "ImageEncoder files); unpickling runs code from the files: trusted files only")
    m.add_argument("--rule", choices=["auto", *PRESETS], default=None,
                   help="matrix rule: which keys are merged as matrices. auto (default): the preset of the "
                        "family the key names belong to (gpt2, decoder_lm, hf_encoder, else default = CLIP / "
                        "conv nets); reference_2d: every 2-d tensor but text_projection, as the reference "
                        "TSV-M / Iso-C code")
    m.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="split a .safetensors output into shards of at most SIZE (e.g. 2GB, 500MB, 1.5GiB, bytes) "
                        "with a Hugging Face *.index.json, when it needs more than one (a folder output: default 50GB, as "
                        "save_pretrained)")
    m.add_argument("--workers", type=int, default=None,
                   help="layers merged at once (global TIES: tasks), each on one thread (default --threads, else 1; "
                        "same result for any value, memory grows with it)")
    m.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch's thread count (reading, converting pickles) and the default of --workers")
    m.add_argument("--device", default=None, metavar="DEV",
                   help="where each layer is filtered and merged: cpu (default), cuda, cuda:N or auto (cuda when "
                        "torch sees a GPU); files are read and written on the CPU")
    m.set_defaults(func=cmd_merge)
    sub.add_parser("methods", help="list the registered merge methods").set_defaults(func=cmd_methods)
    if plugins:
        add_plugins(sub)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"pact: warning: {message}", file=sys.stderr)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread (:func:`main`): unwinds like Ctrl-C, so every
    temporary output file and spill is removed on the way out. ``signum``: the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _terminate_unwinds(restore: bool = True):
    """While inside: the first SIGINT / SIGTERM / SIGHUP raises (KeyboardInterrupt /
    :class:`Terminated`) and the later ones are ignored, so that a second Ctrl-C cannot cut the
    clean-up short (with worker threads it ended in ``std::terminate``). Main thread only; the
    previous handlers are restored after (``restore``; the ``pact`` process, which ends right
    after, ignores the signals from then on). A SIGINT the process was started ignoring (a
    background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)

    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        if previous[sig] is not signal.SIG_IGN:
            signal.signal(sig, handler)
    _unwinding.append(True)
    try:
        yield
    finally:
        _unwinding.pop()
        for sig, h in previous.items():
            signal.signal(sig, (h if h is not None else signal.SIG_DFL) if restore else signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """Run ``pact`` with ``argv``; the exit status: 0, 2 for an input error (``pact: error: …``),
    128 + the signal on Ctrl-C (130), SIGTERM (143) and SIGHUP (129), with the temporary files
    removed and nothing published; a signal that arrives while the output is published stops the
    run once all of it is, and the message says so. Called as the ``pact`` process (``argv``
    None), a command that returned ignores these signals from then on: its output is published
    and said (or its failure), and a signal during the interpreter's exit would only add a
    traceback or make a success look failed."""
    process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(plugins=command not in BUILTIN).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    _threads.clear()  # --threads is the command's: restored for a caller in the same process
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        signum, mark = None, len(published_outputs())
        try:
            with _terminate_unwinds(restore=not process):
                try:
                    return args.func(args)
                except (KeyboardInterrupt, Terminated) as e:
                    signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
                # what garbage collection cleans up (spill folders' finalizers) goes now, while a
                # second signal is still ignored, not at interpreter exit where it would interrupt it
                gc.collect()
        except (CheckpointError, OSError, ValueError, TypeError, KeyError) as e:
            print(f"pact: error: {e}", file=sys.stderr)
            done = published_outputs()[mark:]
            if done:  # e.g. the JSON line could not be written
                print(f"pact: the output was published, whole: {', '.join(map(str, done))}", file=sys.stderr)
            return 2
        finally:
            if "before" in _threads:
                import torch

                torch.set_num_threads(_threads.pop("before"))
    how = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    published = published_outputs()[mark:]
    if published:  # the signal came while the output was published: it was held until all of it was
        print(f"pact: {how} once the output was published, whole: {', '.join(map(str, published))}",
              file=sys.stderr)
    else:
        print(f"pact: {how}; no output was published and its temporary files were removed", file=sys.stderr)
    return 128 + int(signum)


if __name__ == "__main__":
    sys.exit(main())
