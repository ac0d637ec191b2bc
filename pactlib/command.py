"""What ``pact merge`` shares between its two paths (:mod:`pactlib.cli`, the torch path, and
:mod:`pactlib.fastpath`): the merge a command line asks for (:func:`recipe_of`, with the ``--set``
parsing of :func:`parse_set`) and the finished merge's one JSON line (:func:`say_merged`).

Below both: the fast path imports it without importing the command line.
"""
from __future__ import annotations

import json
import signal
import threading

from .checks import check_alpha


def parse_literal(text: str):
    """One ``--set`` value without PyYAML: JSON when it is JSON (``null``, ``true``, ``3``,
    ``"a b"``, ``["^a", "^b"]``, ``{"k": 1}``); else ``[a, b]`` is a list whose items are read the
    same way; else ``None``/``True``/``False`` spelled ``null``, ``true``, ``false``; else the text
    itself (``svd=rsvd``).

    Raises:
        ValueError: an unbalanced ``[`` / ``]``, ``{`` / ``}`` or quote.
    """
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [parse_literal(item) for item in inner.split(",")] if inner else []
    if text[:1] in "[{\"'" or text[-1:] in "]}\"'":
        raise ValueError(f"unbalanced brackets or quotes in {text!r} (write lists as [a, b], strings as JSON)")
    return {"null": None, "true": True, "false": False}.get(text.lower(), text)


def parse_value(key: str, text: str):
    """One ``--set`` value: an int, else a float (``1e-1`` too, which YAML 1.1 reads as a
    string), else :func:`parse_literal` (``true``, ``null``, ``[a, b]``, JSON, a string).

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
        ValueError: an item without ``=``, with an empty key, an empty or unparsable value, or
            a key given twice (named).
    """
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        if key.strip() in out:
            raise ValueError(f"--set names {key.strip()!r} more than once; give each parameter one value")
        out[key.strip()] = parse_value(key.strip(), value)
    return out


#: ``pact merge`` flags that define the merge: a recipe (--config) gives them, so they are refused beside it
RECIPE_FLAGS = {"method": "--method", "pact": "--pact", "alpha": "--alpha", "pretrained": "--pretrained",
                "finetuned": "--finetuned", "lora_adapters": "--lora-adapters", "lora_key_map": "--lora-key-map",
                "lora_extra": "--lora-extra", "set": "--set", "rule": "--rule", "max_shard_size": "--max-shard-size"}


def recipe_of(args, **read):
    """The merge ``args`` ask for, as a :class:`pactlib.recipe.Recipe`: read from ``--config`` (then
    the flags that define a merge are refused: edit the recipe instead; ``--out``, ``--workers``,
    ``--threads``, ``--device`` and ``--trust-pickle`` stay command-line choices), else from the
    flags. Paths are made absolute (from the working directory), so that a recipe written into a
    model folder names its inputs wherever it is read from. ``read``: keywords of
    :func:`pactlib.recipe.read_recipe` (its ``methods`` and ``check``).

    Raises:
        ValueError: a flag beside ``--config``; a required flag missing without it.
        RecipeError: a bad recipe (the field named).
    """
    import dataclasses
    import os

    from .recipe import Recipe, read_recipe

    if args.config is not None:
        given = [flag for attr, flag in RECIPE_FLAGS.items() if getattr(args, attr) not in (None, [])]
        if given:
            raise ValueError(f"--config {args.config} gives the merge; {', '.join(given)} cannot be given beside it "
                             "(edit the recipe, or give the flags without --config)")
        r = read_recipe(args.config, **read)
    else:
        missing = [f for a, f in (("method", "--method"), ("alpha", "--alpha"), ("pretrained", "--pretrained"))
                   if getattr(args, a) is None]
        if not (args.finetuned or args.lora_adapters):
            missing.append("--finetuned (or --lora-adapters)")
        if missing:
            raise ValueError(f"pact merge needs {', '.join(missing)} (or a recipe: --config FILE)")
        check_alpha(args.alpha)
        lora = bool(args.lora_adapters)
        r = Recipe(args.method, args.pretrained, tuple(args.lora_adapters if lora else args.finetuned), args.alpha,
                   parse_set(args.set), args.pact, args.rule or "auto", None, args.max_shard_size, lora,
                   args.lora_key_map, args.lora_extra or "error")
    absolute = {p: os.path.abspath(p) for p in (r.base_model, *r.models)}
    return dataclasses.replace(r, base_model=absolute[r.base_model], models=tuple(absolute[p] for p in r.models),
                               sha256={absolute[p]: h for p, h in r.sha256.items()})


#: The signals :func:`pactlib.cli.main` unwinds on (SIGINT as KeyboardInterrupt, the others as Terminated)
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


#: non-empty while :func:`pactlib.cli._terminate_unwinds` holds the signals (so :func:`say_merged` may ignore
#: them: the handlers are put back, or the process ends, when it lets go)
_unwinding: list[bool] = []


def say_merged(summary: dict) -> None:
    """Print a finished merge's one JSON line. From here on the run only lets go of its lock, so
    within :func:`pactlib.cli.main` SIGINT / SIGTERM / SIGHUP are ignored first (main thread): a signal now
    would report a published, finished merge as stopped. :func:`main` gives an in-process caller
    its handlers back; called outside it (``pactlib.fastpath.try_merge`` directly), the
    handlers are left alone."""
    if _unwinding and threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    print(json.dumps(summary), flush=True)
