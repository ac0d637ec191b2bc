"""Merge recipes and model folders: what ``pact merge --out DIR/`` writes besides the weights.

A **recipe** records one merge: θ0, the T fine-tuned checkpoints (or PEFT adapters), the method,
α, its parameters, the PACT mode and options, the matrix rule and the output's shard size. Its
YAML uses mergekit's field names where they mean the same thing (``merge_method``,
``base_model``, ``models`` as a list of ``- model: PATH``, ``parameters``, ``dtype``), so a
mergekit user reads it at once::

    merge_method: "ties"
    base_model: "/models/base"
    models:
      - model: "/models/ft-a"
        sha256: "3b1f…"
    parameters:
      alpha: 0.3
      k: 20
    pact:
      mode: "pact"
      core_frac: 0.1
    dtype: "float32"

``parameters`` holds α (pactlib's global scale, θ = θ0 + α·D) and the method's parameters by
pactlib's names (TIES' ``k`` is a percentage kept; mergekit's per-model ``weight`` and
``density`` are refused, they are not the same thing). ``pact`` is null or the mode with its
options (:class:`pactlib.pact.PactOptions` field names). ``sha256`` (per model, and
``base_model_sha256``) pins each input: the hash of the bytes of the files it is read from
(:func:`input_sha256`); a rerun whose inputs hash otherwise is refused. ``dtype`` is θ0's: pact
writes θ0's dtypes and never casts, so a recipe naming another dtype is refused. Reading a recipe
does not turn on ``--trust-pickle`` (a recipe from someone else must not run code): that stays a
command-line choice. Relative paths are taken from the working directory, as on the command line.

The engine reads and writes recipes without PyYAML (it needs torch and safetensors only): it
writes block-style YAML with JSON-quoted strings, which any YAML reader takes, and reads that
form back, plus plain scalars, ``[a, b]`` lists and ``#`` comments; anchors, multi-line strings
and other YAML features are refused with the line named (:func:`parse_yaml`).

A **model folder** (:class:`FolderFiles` beside the weights) holds what ``save_pretrained`` writes: the
weights (``model.safetensors``, or shards and ``model.safetensors.index.json``; an open_clip
base's name ``open_clip_model.safetensors`` for open_clip's loader), the base folder's non-weight
files copied byte for byte (:data:`SUPPORT_FILES`), the recipe (:data:`RECIPE_NAME`) and a model
card ``README.md`` whose YAML front matter has Hugging Face's ``base_model`` and ``tags`` and
pact's record of the merge. Every file is written atomically; the card last. ``base_model`` and
the inputs are the absolute local paths the merge read: put the hub ids there before publishing
the card on the Hugging Face hub.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .checks import CheckpointError
from .io import close_quietly, new_temp, output_error
from .lazy import (FOLDER_LOCK, FOLDER_ORDER, PACT_RECIPE, checkpoint_files, held_locks,  # noqa: F401
                   is_folder_output, output_family, output_lock_path, parse_size, refuse_link, remove_published,
                   warn_earlier)  # (is_folder_output: here too)
from .matrix import PRESETS

#: The recipe's file name in a model folder.
RECIPE_NAME = PACT_RECIPE
#: The model card's file name.
CARD_NAME = "README.md"
#: Non-weight files of a model folder copied from θ0's folder as they are (config, tokenizer,
#: generation and processor files, open_clip's config).
SUPPORT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt",
                 "merges.txt", "spiece.model", "sentencepiece.bpe.model", "preprocessor_config.json",
                 "processor_config.json", "video_preprocessor_config.json", "chat_template.json",
                 "chat_template.jinja", "open_clip_config.json")
#: ``save_pretrained``'s default shard size (transformers 5), used for folder outputs.
DEFAULT_SHARD_SIZE = "50GB"
#: The dtype names a recipe may give.
DTYPES = ("float32", "float16", "bfloat16", "float64")
_TOP = ("merge_method", "base_model", "base_model_sha256", "models", "parameters", "pact", "dtype", "rule",
        "max_shard_size", "lora_key_map", "lora_extra")
_SHA = re.compile(r"^[0-9a-f]{64}$")


class RecipeError(CheckpointError):
    """A recipe that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Recipe:
    """One ``pact merge``, as a recipe file records it (module docstring).

    Attributes:
        merge_method: a registered method name. base_model: θ0's path. models: the fine-tuned
            checkpoints' paths (or PEFT adapter folders when ``lora`` is True).
        alpha: α. params: the method's parameters and PACT's options, by name (as ``--set``).
        pact: None, ``"pact"`` or ``"s-pact"``. rule: ``"auto"`` or a preset name.
        dtype: θ0's dtype name (None: not checked). max_shard_size: as ``--max-shard-size``.
        lora, lora_key_map, lora_extra: as ``--lora-adapters``, ``--lora-key-map``, ``--lora-extra``.
        sha256: {path: hex digest} of inputs to check before merging (:func:`input_sha256`).
    """

    merge_method: str
    base_model: str
    models: tuple[str, ...]
    alpha: float | int
    params: dict = field(default_factory=dict)
    pact: str | None = None
    rule: str = "auto"
    dtype: str | None = None
    max_shard_size: int | str | None = None
    lora: bool = False
    lora_key_map: str | None = None
    lora_extra: str = "error"
    sha256: dict = field(default_factory=dict)

    def split_params(self, method=None) -> tuple[dict, dict]:
        """(method parameters, PACT options) of :attr:`params`, by name. ``method``: the merge
        method's registry entry (its ``params``), default ``pactlib.merges.get(merge_method)``."""
        m = method or _method(self.merge_method)
        return ({k: v for k, v in self.params.items() if k in m.params},
                {k: v for k, v in self.params.items() if k not in m.params})

    def to_yaml(self, method=None) -> str:
        """The recipe file's text (deterministic: the same recipe gives the same bytes); ``method``
        as for :meth:`split_params`."""
        mparams, popts = self.split_params(method)
        role = "lora_adapter" if self.lora else "model"
        models = [{role: p, **({"sha256": self.sha256[p]} if p in self.sha256 else {})} for p in self.models]
        data = {"merge_method": self.merge_method, "base_model": self.base_model}
        if self.base_model in self.sha256:
            data["base_model_sha256"] = self.sha256[self.base_model]
        data["models"] = models
        data["parameters"] = {"alpha": self.alpha, **mparams}
        data["pact"] = None if self.pact is None else {"mode": self.pact, **popts}
        data["dtype"] = self.dtype
        data["rule"] = self.rule
        data["max_shard_size"] = self.max_shard_size
        if self.lora:
            data["lora_key_map"] = self.lora_key_map
            data["lora_extra"] = self.lora_extra
        return ("# pact merge recipe: redo this merge with: pact merge --config pact_recipe.yaml --out DIR/\n"
                "# Fields as mergekit's where they mean the same (merge_method, base_model, models, parameters,\n"
                "# dtype); alpha scales the merged update: theta = theta0 + alpha * D.\n" + dump_yaml(data))


def _method(name: str):
    """The registry entry of merge method ``name`` (``params``, ``pretty``, ``reference``); the
    registry imports torch, so callers without it pass an entry of their own
    (:data:`pactlib.fastpath.METHODS`)."""
    from . import merges

    return merges.get(name)


def input_sha256(path: str | os.PathLike, *, lora: bool = False) -> str:
    """The sha256 (hex) of an input: of the bytes of the files it is read from, concatenated in
    the reader's order (:func:`pactlib.lazy.checkpoint_files`: a file alone, or a sharded
    checkpoint's index then its shards; a PEFT adapter's weights then its config). For one file
    it is the file's ``sha256sum``; for several, that of ``cat`` of them in that order.

    Raises:
        FileNotFoundError: the input has no file to read.
    """
    if lora:
        from .peft import adapter_files

        files = list(adapter_files(path))
    else:
        files = checkpoint_files(path)
    if not files:
        raise FileNotFoundError(f"checkpoint not found: {path}" if not Path(path).exists()
                                else f"{path}: no checkpoint file to hash")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


# -- YAML without PyYAML ----------------------------------------------------------------------------

def _scalar_text(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write the non-finite number {v} in a recipe")
        text = repr(v)
        if "e" in text and "." not in text.split("e")[0]:  # 1e-05 -> 1.0e-05: YAML 1.1 readers want the dot
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
        return text
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (list, tuple, Mapping)) for x in v):
        return "[" + ", ".join(_scalar_text(x) for x in v) + "]"
    raise ValueError(f"cannot write a {type(v).__name__} in a recipe")


def dump_yaml(data: Mapping, indent: int = 0) -> str:
    """Block-style YAML of nested mappings, lists of mappings and scalars (strings JSON-quoted,
    lists of scalars in flow style ``[a, b]``)."""
    pad = " " * indent
    lines = []
    for k, v in data.items():
        if isinstance(v, Mapping) and v:
            lines.append(f"{pad}{k}:")
            lines.append(dump_yaml(v, indent + 2).rstrip("\n"))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            lines.append(f"{pad}{k}:")
            for item in v:
                body = dump_yaml(item, indent + 4).rstrip("\n").split("\n")
                lines.append(f"{pad}  - {body[0].lstrip()}")
                lines += body[1:]
        else:
            lines.append(f"{pad}{k}: {'{}' if isinstance(v, Mapping) else _scalar_text(v)}")
    return "\n".join(lines) + "\n"


_NUMBER = re.compile(r"^[-+]?(\d[\d_]*)?(\.\d*)?([eE][-+]?\d+)?$")


#: how deep a recipe may nest mappings and lists (a recipe needs 3 levels)
MAX_DEPTH = 64


def _too_deep(where: str) -> RecipeError:
    return RecipeError(f"{where}: nested deeper than {MAX_DEPTH} levels (a recipe needs 3)")


def _parse_scalar(text: str, where: str, depth: int = 0):
    text = text.strip()
    if text == "":
        return None
    if text == "{}":
        return {}
    if text[0] in "&*!|>@`{":
        raise RecipeError(f"{where}: {text[:20]!r}: this YAML feature is not read here (write plain values, "
                          "\"quoted strings\" and [a, b] lists)")
    if text[0] in "\"'":
        if text[0] == "'":
            if len(text) < 2 or text[-1] != "'":
                raise RecipeError(f"{where}: unbalanced quote in {text!r}")
            return text[1:-1].replace("''", "'")
        try:
            return json.loads(text)
        except ValueError:
            raise RecipeError(f"{where}: cannot read the quoted string {text!r}") from None
    if text[0] == "[":
        if text[-1] != "]":
            raise RecipeError(f"{where}: unbalanced [ in {text!r}")
        if depth >= MAX_DEPTH:
            raise _too_deep(where)
        inner = text[1:-1].strip()
        return [_parse_scalar(x, where, depth + 1) for x in inner.split(",")] if inner else []
    low = text.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if _NUMBER.match(text) and any(c.isdigit() for c in text):
        t = text.replace("_", "")
        try:
            return int(t)
        except ValueError:
            return float(t)
    return text


def _strip_comment(line: str) -> str:
    quote, escaped = None, False
    for i, c in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\" and quote == '"':
                escaped = True
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _json_too_deep(text: str) -> int | None:
    """The line where the JSON ``text`` first nests deeper than :data:`MAX_DEPTH`, else None."""
    depth, line, quoted, escaped = 0, 1, False, False
    for c in text:
        if c == "\n":
            line += 1
        if quoted:
            escaped, quoted = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            quoted = True
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        elif c in "]}":
            depth -= 1
    return None


def parse_yaml(text: str, *, name: str = "recipe", lines: dict[str, int] | None = None):
    """Read the YAML subset of recipes: block mappings and sequences (of mappings or scalars),
    scalars as :func:`_parse_scalar` reads them, ``#`` comments; a JSON document too. Nesting
    deeper than :data:`MAX_DEPTH` is refused.

    ``lines``, when given, is filled with the line of each key and list item of a YAML text, by
    its field path as :func:`read_recipe` names fields (``models[1].model``, ``parameters.k``).

    Raises:
        RecipeError: a tab, a bad indentation, an unsupported feature, too deep a nesting
            (naming ``name`` and the line).
    """
    if text.lstrip()[:1] in ("[", "{"):
        deep = _json_too_deep(text)
        if deep is not None:
            raise _too_deep(f"{name} line {deep}")
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = {} if lines is None else lines
    rows = []
    for n, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise RecipeError(f"{name} line {n}: a tab in the indentation (YAML indents with spaces)")
        line = _strip_comment(raw).rstrip()
        if line.strip() in ("", "---"):
            continue
        rows.append((n, len(line) - len(line.lstrip()), line.strip()))
    pos = 0

    def block(indent: int, depth: int, at: str):
        nonlocal pos
        n, ind, s = rows[pos]
        if depth >= MAX_DEPTH:
            raise _too_deep(f"{name} line {n}")
        if s.startswith("- ") or s == "-":
            out = []
            while pos < len(rows) and rows[pos][1] == indent and (rows[pos][2].startswith("- ") or rows[pos][2] == "-"):
                n, _, s = rows[pos]
                item = f"{at}[{len(out)}]"
                lines[item] = n
                rest = s[1:].lstrip()
                item_indent = indent + (len(s) - len(rest))
                if not rest:
                    pos += 1
                    out.append(block(rows[pos][1], depth + 1, item) if pos < len(rows) and rows[pos][1] > indent
                               else None)
                elif _key(rest) is not None:
                    rows[pos] = (n, item_indent, rest)  # the item's first key, then its other keys
                    out.append(block(item_indent, depth + 1, item))
                else:
                    out.append(_parse_scalar(rest, f"{name} line {n}", depth + 1))
                    pos += 1
            return out
        out = {}
        while pos < len(rows) and rows[pos][1] == indent:
            n, _, s = rows[pos]
            kv = _key(s)
            if kv is None:
                raise RecipeError(f"{name} line {n}: expected 'key: value', got {s!r}")
            k, rest = kv
            if k in out:
                raise RecipeError(f"{name} line {n}: {k!r} is given twice")
            field = f"{at}.{k}" if at else str(k)
            lines[field] = n
            pos += 1
            if rest:
                out[k] = _parse_scalar(rest, f"{name} line {n}", depth + 1)
            elif pos < len(rows) and (rows[pos][1] > indent or
                                      (rows[pos][1] == indent and rows[pos][2].startswith("-"))):
                out[k] = block(rows[pos][1], depth + 1, field)
            else:
                out[k] = None
        if pos < len(rows) and rows[pos][1] > indent:
            raise RecipeError(f"{name} line {rows[pos][0]}: unexpected indentation")
        return out

    if not rows:
        raise RecipeError(f"{name}: the file is empty")
    data = block(rows[0][1], 0, "")
    if pos < len(rows):
        raise RecipeError(f"{name} line {rows[pos][0]}: unexpected indentation")
    return data


def _key(s: str):
    """(key, rest) of ``key: rest`` (a quoted or plain key), else None."""
    m = re.match(r'^("(?:[^"\\]|\\.)*"|\'[^\']*\'|[^:#\[\]{},"\'][^:]*?)\s*:(?:\s+(.*))?$', s)
    if not m:
        return None
    k = m.group(1)
    if k[0] in "\"'":
        k = json.loads(k) if k[0] == '"' else k[1:-1]
    return k, (m.group(2) or "").strip()


# -- reading a recipe ----------------------------------------------------------------------------

def read_recipe(path: str | os.PathLike, *, methods: Mapping | None = None, check=None) -> Recipe:
    """The :class:`Recipe` in the file ``path`` (module docstring), checked field by field.

    ``methods`` ({name: registry entry}) and ``check`` (``check(method, pact, kwargs)``, raising
    ValueError or TypeError) default to the merge methods' registry and
    :func:`pactlib.api.resolve_kwargs`, which import torch; a caller without torch passes its own
    (:mod:`pactlib.fastpath`, for the merges it takes).

    Raises:
        RecipeError: an unreadable file (not UTF-8, too deeply nested: the line named), a missing or
            unknown field, a value of the wrong type or out of range (each message names the file
            and the field, e.g. ``models[1].model``, and the field's line, or its holder's, in a
            YAML recipe: ``… (line 7)``).
        FileNotFoundError: no such file.
    """
    if methods is None:
        from . import merges  # the registry imports torch

        methods = {name: merges.get(name) for name in merges.names()}
    path = Path(path)
    where = str(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, column = raw.count(b"\n", 0, e.start) + 1, e.start - raw.rfind(b"\n", 0, e.start)
        raise RecipeError(f"{where} line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {column}); "
                          "a recipe is UTF-8 text") from None
    lines: dict[str, int] = {}
    data = parse_yaml(text, name=where, lines=lines)
    if not isinstance(data, Mapping):
        raise RecipeError(f"{where}: expected a mapping of fields ({', '.join(_TOP)}), got {type(data).__name__}")

    def line_of(fld: str) -> str:
        """`` (line N)`` of the field ``fld`` or of the nearest field that holds it, else nothing."""
        while fld not in lines:
            holder = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", fld)
            if holder == fld:
                return ""
            fld = holder
        return f" (line {lines[fld]})"

    def fail(fld: str, msg: str):
        raise RecipeError(f"{where}: {fld}: {msg}{line_of(fld)}")

    unknown = [k for k in data if k not in _TOP]
    if unknown:
        fail(unknown[0], f"unknown field (pact merge reads: {', '.join(_TOP)})")
    for req in ("merge_method", "base_model", "models"):
        if data.get(req) is None:
            fail(req, "missing (required)")
    method = data["merge_method"]
    if not isinstance(method, str) or method not in methods:
        fail("merge_method", f"unknown merge method {method!r}; known: {', '.join(methods)}")
    if not isinstance(data["base_model"], str) or not data["base_model"]:
        fail("base_model", f"expected a path, got {data['base_model']!r}")
    sha = {}
    if data.get("base_model_sha256") is not None:
        if not isinstance(data["base_model_sha256"], str) or not _SHA.match(data["base_model_sha256"]):
            fail("base_model_sha256", "expected 64 lower-case hex digits")
        sha[data["base_model"]] = data["base_model_sha256"]
    models = data["models"]
    if not isinstance(models, list) or not models:
        fail("models", "expected a non-empty list of '- model: PATH' entries")
    paths, kinds = [], set()
    for i, item in enumerate(models):
        at = f"models[{i}]"
        if isinstance(item, str):
            item = {"model": item}
        if not isinstance(item, Mapping):
            fail(at, f"expected '- model: PATH', got {item!r}")
        if "parameters" in item:
            fail(f"{at}.parameters", "pact merges take no per-model parameters (mergekit's weight / density); "
                                     "give alpha and the method's parameters under the top-level parameters")
        extra = [k for k in item if k not in ("model", "lora_adapter", "sha256")]
        if extra:
            fail(f"{at}.{extra[0]}", "unknown field (an entry has model or lora_adapter, and sha256)")
        roles = [k for k in ("model", "lora_adapter") if k in item]
        if len(roles) != 1:
            fail(at, "give exactly one of model (a fine-tuned checkpoint) or lora_adapter (a PEFT adapter folder)")
        p = item[roles[0]]
        if not isinstance(p, str) or not p:
            fail(f"{at}.{roles[0]}", f"expected a path, got {p!r}")
        kinds.add(roles[0])
        paths.append(p)
        if item.get("sha256") is not None:
            if not isinstance(item["sha256"], str) or not _SHA.match(item["sha256"]):
                fail(f"{at}.sha256", "expected 64 lower-case hex digits")
            sha[p] = item["sha256"]
    if len(kinds) > 1:
        fail("models", "mixes model and lora_adapter entries; give one kind")
    params = {} if data.get("parameters") is None else data["parameters"]
    if not isinstance(params, Mapping):
        fail("parameters", f"expected a mapping (alpha: …, the method's parameters), got {params!r}")
    params = dict(params)
    if "alpha" not in params:
        fail("parameters.alpha", "missing (required: θ = θ0 + α·D)")
    alpha = params.pop("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        fail("parameters.alpha", f"expected a finite number, got {alpha!r}")
    m = methods[method]
    for k in params:
        if k not in m.params:
            known = ", ".join(["alpha", *m.params])
            fail(f"parameters.{k}", f"not a parameter of {method} (known: {known}; PACT options go under pact)")
    pact, popts = data.get("pact"), {}
    if pact is not None:
        from .pact import MODES, PactOptions  # imports torch

        if isinstance(pact, str):
            pact = {"mode": pact}
        if not isinstance(pact, Mapping) or pact.get("mode") not in MODES:
            fail("pact.mode" if isinstance(pact, Mapping) else "pact",
                 f"expected null or a mapping with mode: one of {', '.join(MODES)}")
        popts = {k: v for k, v in pact.items() if k != "mode"}
        for k in popts:
            if k not in PactOptions.field_names():
                fail(f"pact.{k}", f"not a PACT option (known: {', '.join(sorted(PactOptions.field_names()))})")
        pact = pact["mode"]
    kw = {**params, **popts}
    if check is None:
        from .api import resolve_kwargs as check
    try:
        check(method, pact, kw)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: parameters / pact: {e}{line_of('parameters') or line_of('pact')}") from None
    dtype = data.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        fail("dtype", f"expected one of {', '.join(DTYPES)} or null, got {dtype!r}")
    rule = data.get("rule") or "auto"
    if rule not in ("auto", *PRESETS):
        fail("rule", f"expected auto or one of {', '.join(PRESETS)}, got {rule!r}")
    shard = data.get("max_shard_size")
    if shard is not None:
        try:
            parse_size(shard)
        except (ValueError, TypeError) as e:
            fail("max_shard_size", str(e))
    lora = kinds == {"lora_adapter"}
    key_map, lora_extra = data.get("lora_key_map"), data.get("lora_extra") or "error"
    if not lora and (key_map is not None or data.get("lora_extra") is not None):
        fail("lora_key_map" if key_map is not None else "lora_extra", "only with lora_adapter models")
    if lora_extra not in ("error", "skip"):
        fail("lora_extra", f"expected error or skip, got {lora_extra!r}")
    return Recipe(method, data["base_model"], tuple(paths), alpha, kw, pact, rule, dtype, shard, lora, key_map,
                  lora_extra, sha)


def check_sha256(recipe: Recipe, *, where: str = "recipe", workers: int = 1) -> dict[str, str]:
    """Hash every input (:func:`input_sha256`, ``workers`` files at a time) and compare with the
    recipe's digests; returns {path: digest} of all inputs (θ0 first).

    Raises:
        RecipeError: an input whose digest differs from the recipe's (the field named).
    """
    from concurrent.futures import ThreadPoolExecutor

    paths = (recipe.base_model, *recipe.models)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # hashlib releases the GIL
        digests = list(pool.map(lambda ip: input_sha256(ip[1], lora=recipe.lora and ip[0] > 0), enumerate(paths)))
    out = {}
    for i, (p, digest) in enumerate(zip(paths, digests)):
        out[p] = digest
        want = recipe.sha256.get(p)
        if want is not None and want != out[p]:
            fld = "base_model_sha256" if i == 0 else f"models[{i - 1}].sha256"
            raise RecipeError(f"{where}: {fld}: {p} now hashes to {out[p]}, the recipe says {want} (the input "
                              "changed; remove the field to merge the file as it is now)")
    return out


# -- the model folder ------------------------------------------------------------------------------

def base_folder(pretrained: str | os.PathLike) -> Path | None:
    """The model folder of θ0 whose non-weight files a folder output copies: θ0 itself when it
    is a folder, the folder of θ0's file when that file has a model folder's name
    (:data:`pactlib.lazy.FOLDER_ORDER`), else None."""
    p = Path(pretrained)
    if p.is_dir():
        return p
    return p.parent if p.name in FOLDER_ORDER else None


#: The weights' names a folder output may have (:func:`weights_name`)
WEIGHT_NAMES = ("model.safetensors", "open_clip_model.safetensors")


def weights_name(pretrained: str | os.PathLike) -> str:
    """The weights' file name in a folder output: ``open_clip_model.safetensors`` when θ0's
    folder is an open_clip one (read by ``open_clip.create_model("local-dir:…")``), else
    ``model.safetensors`` (``save_pretrained``'s)."""
    folder = base_folder(pretrained)
    if folder is not None and (folder / "open_clip_config.json").is_file():
        return WEIGHT_NAMES[1]
    return WEIGHT_NAMES[0]


def check_model_folder_out(out: str | os.PathLike) -> None:
    """Refuse a single-file ``--out`` (or its index) that names a file already in a model folder
    no merge wrote (it has ``config.json`` and no :data:`RECIPE_NAME`): writing would replace
    that model's weights. :func:`pactlib.lazy.check_out_target`, called first, refuses the
    output's other names there (shards, index); this adds the one it names. ``pact merge --out
    DIR/`` is the way to write a model folder.

    Raises:
        ValueError: the named file is there.
    """
    out = Path(out)
    folder = out.parent
    if out.is_file() and (folder / "config.json").is_file() and not (folder / RECIPE_NAME).exists():
        raise ValueError(f"--out {out}: its folder is a model folder no merge wrote (it has config.json), and "
                         f"writing there would replace or remove its {out.name}; choose another name or "
                         "folder (--out DIR/ writes a model folder), or remove them first")


def check_folder_target(folder: str | os.PathLike, inputs: Sequence[str | os.PathLike], *,
                        written: bool = True) -> None:
    """Refuse a folder output in the folder of an input (its config, tokenizer or card would be
    overwritten), in a file, or in a folder that holds files no merge wrote (it has no
    :data:`RECIPE_NAME`): its card, config and weights would be replaced. Names starting with
    a dot (``.git``, a run's lock) do not count, so a new repository's folder takes a merge.
    ``written=False`` skips that last check (the inputs' check comes first).

    A symbolic link at a name the merge writes there (:data:`SUPPORT_FILES`, the recipe, the
    card) is refused: nothing is written through a link.

    Raises:
        ValueError: the folder holds a file of an input, or files no merge wrote (named).
        CheckpointError: the path is a file.
        OutputError: a name the merge writes is a symbolic link (named).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"--out {folder}: is a file, not a folder")
    for name in (*SUPPORT_FILES, RECIPE_NAME, CARD_NAME):
        refuse_link(folder / name, folder)
    target = folder.resolve()
    for p in inputs:
        for f in checkpoint_files(p):
            if f.resolve().parent == target:
                raise ValueError(f"--out {folder}/ is the folder of the input {p}: writing the model folder there "
                                 "would overwrite its files; choose another folder")
    if written and folder.is_dir() and not (folder / RECIPE_NAME).exists():
        foreign = sorted(f.name for f in folder.iterdir() if not f.name.startswith("."))
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise ValueError(f"--out {folder}/ holds files no pact merge wrote ({', '.join(foreign[:3])}{more}): "
                             "a model folder goes into a new or empty folder, or one an earlier merge wrote; "
                             "choose another folder")


def card_text(recipe: Recipe, *, sha256: Mapping[str, str], library: str | None, weights: Sequence[str],
              method=None) -> str:
    """The model card: YAML front matter (``base_model``, ``tags``, ``library_name`` and pact's
    record of the merge: method, α, parameters, PACT mode and options, each input's sha256), then
    a short text and the recipe. ``method``: as for :meth:`Recipe.split_params`."""
    m = method or _method(recipe.merge_method)
    mparams, popts = recipe.split_params(m)
    front = {"base_model": recipe.base_model, "tags": ["merge", "pact"]}
    if library:
        front["library_name"] = library
    inputs = [{"role": "base_model", "path": recipe.base_model, "sha256": sha256[recipe.base_model]}]
    inputs += [{"role": "lora_adapter" if recipe.lora else "model", "path": p, "sha256": sha256[p]}
               for p in recipe.models]
    front["pact_merge"] = {"merge_method": recipe.merge_method, "alpha": recipe.alpha,
                           "parameters": {**m.params, **mparams}, "pact": recipe.pact, "pact_options": popts,
                           "rule": recipe.rule, "inputs": inputs}
    text = dump_yaml(front)
    how = f"{m.pretty} ({m.reference})"
    if recipe.pact is not None:
        opts = ", ".join(f"{k}={v!r}" for k, v in popts.items()) or "default options"
        how = f"{recipe.pact.upper()} ({opts}) then {how}"
    rows = "\n".join(f"| {i['role']} | `{i['path']}` | `{i['sha256']}` |" for i in inputs)
    return (f"---\n{text}---\n\n# Merged model\n\n"
            f"Made with `pact merge` (pactlib): θ = θ0 + α·D with α = {recipe.alpha!r} and D the merged update "
            f"of {how} over {len(recipe.models)} task vectors.\n\n"
            f"Weights: {', '.join(f'`{w}`' for w in weights)}.\n\n"
            f"| role | input | sha256 |\n|---|---|---|\n{rows}\n\n"
            f"## Recipe\n\nRedo it with `pact merge --config {RECIPE_NAME} --out DIR/`:\n\n"
            f"```yaml\n{recipe.to_yaml(m)}```\n")


def _support_file(path: Path) -> bytes | None:
    """The bytes of a support file of θ0's folder, None when there is none by that name.

    Raises:
        CheckpointError: the name is there but is not a readable regular file (a dangling link,
            a folder, a FIFO; an I/O error), naming it.
    """
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file; pact merge copies the pre-trained folder's "
                              f"{path.name} into the model folder as it is")
    try:
        return path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the pre-trained folder's {path.name} ({e.strerror or e})") from e


def _warn_if_outside(src: Path, name: str, folder: Path) -> None:
    """Warn when θ0's support file ``src / name`` is a link to a file outside θ0's folder ``src``:
    the file it points to is what is copied into the folder output ``folder``."""
    path = src / name
    if not path.is_symlink():
        return
    target = path.resolve()
    if not target.is_relative_to(src.resolve()):
        warnings.warn(f"{path} is a link to {target}, outside the pre-trained folder {src}; copied into {folder} "
                      f"as the pre-trained model's {name}", stacklevel=3)


class FolderFiles:
    """The files of a folder output besides its weights: θ0's folder's :data:`SUPPORT_FILES` as
    they are, the recipe (:data:`RECIPE_NAME`) and the card (:data:`CARD_NAME`, naming ``weights``,
    the weight files' names). ``method``: as for :meth:`Recipe.split_params`.

    The folder is published whole by a swap: entering makes a staging folder beside it
    (``.<name>.pact-new-<pid>-<random>``, in the same parent) and writes each file there as a
    locked temporary file (:func:`pactlib.io.new_temp`); the weights are written there too
    (:meth:`staged` gives their path). :meth:`publish`, called once the weights are published
    there, renames the files, links in what the folder holds that this merge does not write (a
    user's files), and exchanges the staging folder with the folder in one step (Linux's
    ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames); the earlier folder is then removed.
    So a run killed at any moment leaves the earlier folder whole or the new one whole, and a later
    run removes what a killed one left (its staging or earlier folder), saying so. Folders in the
    folder (``.git``) are moved into the new one after the exchange. Where no staging folder can be
    made (a parent folder that is not writable, a folder that is a mount point, or the working
    folder of the run or one above it), the files are written and renamed in the folder itself, the
    card last.

    Leaving the block without :meth:`publish` (a support file that cannot be read, a full disk, a
    failed merge) removes the staging folder, so a failure before the weights are published
    leaves an existing folder as it was.

    Raises:
        CheckpointError: a support file's name in θ0's folder is not a readable regular file;
        OutputError: a file cannot be written (both named).
    """

    def __init__(self, folder: str | os.PathLike, recipe: Recipe, *, sha256: Mapping[str, str],
                 weights: Sequence[str], method=None):
        self.folder, self.recipe, self.sha256, self.weights, self.method = \
            Path(folder), recipe, sha256, list(weights), method
        self._staged: list[tuple[Path, Path, object]] = []  # (temporary file, its name, open file)
        self.stage: Path | None = None  # the staging folder, while there is one

    def staged(self, path: str | os.PathLike) -> Path:
        """Where the file of the folder named ``path`` is written: in the staging folder."""
        path = Path(path)
        return self.stage / path.name if self.stage is not None and path.parent == self.folder else path

    def final(self, path: str | os.PathLike) -> Path:
        """The name in the folder of ``path``, a file written in the staging folder."""
        path = Path(path)
        return self.folder / path.name if self.stage is not None and path.parent == self.stage else path

    def _stage(self, name: str, data: bytes) -> None:
        tmp, f = new_temp(self.staged(self.folder / name))
        self._staged.append((tmp, self.folder / name, f))
        try:
            f.write(data)
            f.flush()
        except OSError as e:
            raise output_error(self.folder / name, e) from e

    def __enter__(self) -> FolderFiles:
        try:
            self._remove_dead_stages()
            self.stage = self._make_stage()
            src = base_folder(self.recipe.base_model)
            if src is not None and src.resolve() != self.folder.resolve():
                for name in SUPPORT_FILES:
                    data = _support_file(src / name)
                    if data is not None:
                        _warn_if_outside(src, name, self.folder)
                        self._stage(name, data)
            copied = {path.name for _, path, _ in self._staged}
            library = ("open_clip" if "open_clip_config.json" in copied else
                       "transformers" if "config.json" in copied else None)
            self._stage(RECIPE_NAME, self.recipe.to_yaml(self.method).encode("utf-8"))
            self._stage(CARD_NAME, card_text(self.recipe, sha256=self.sha256, library=library, weights=self.weights,
                                             method=self.method).encode("utf-8"))
        except BaseException:
            self._discard()
            raise
        return self

    def _stage_prefix(self) -> tuple[Path, str]:
        real = self.folder.resolve()  # a folder named through a link: the swap is the real folder's
        return real, f".{real.name}.pact-"

    def _make_stage(self) -> Path | None:
        real, prefix = self._stage_prefix()
        try:
            if not real.is_dir() or os.stat(real).st_dev != os.stat(real.parent).st_dev:
                return None
            if not os.access(real.parent, os.W_OK | os.X_OK):
                return None
            cwd = Path.cwd().resolve()
            if cwd == real or real in cwd.parents:  # swapped, the run would work in the removed folder
                return None
            stage = real.parent / f"{prefix}new-{os.getpid()}-{os.urandom(4).hex()}"
            stage.mkdir(mode=stat.S_IMODE(os.stat(real).st_mode))  # never through a link: EEXIST
        except OSError:
            return None
        return stage

    def _remove_dead_stages(self) -> None:
        """Remove the staging and earlier folders that a killed run of this folder left beside
        it (their process gone), saying so; folders a user kept in the folder that one of them
        still holds are moved back first."""
        real, prefix = self._stage_prefix()
        if not real.parent.is_dir():
            return
        for d in sorted(real.parent.glob(glob.escape(prefix) + "*")):
            m = re.fullmatch(re.escape(prefix) + r"(?:new|old)-(\d+)-[0-9a-f]{8}", d.name)
            if m is None or d.is_symlink() or not d.is_dir() or _alive(int(m.group(1))):
                continue
            if real.is_dir():
                for child in d.iterdir():
                    if child.is_dir() and not child.is_symlink() and not os.path.lexists(real / child.name):
                        with contextlib.suppress(OSError):
                            os.rename(child, real / child.name)
            shutil.rmtree(d, ignore_errors=True)
            warnings.warn(f"{self.folder}: removed {d}, left by a run (process {m.group(1)}) that was killed while "
                          "it wrote or published this folder", stacklevel=3)

    def publish(self) -> list[Path]:
        """Rename the temporary files to their names, the card last, and swap the staging folder
        in (class docstring); return the files' names in the folder. In a folder an earlier merge
        wrote (it holds :data:`RECIPE_NAME`), the :data:`SUPPORT_FILES` that θ0's folder does not
        have, and weights under the other name of :data:`WEIGHT_NAMES`, are not kept, with a
        warning naming each: this merge does not write them (an earlier merge from another θ0
        did, or a hand put them there), and they would describe another model. A θ0 that is one
        file, not a folder, leaves the support files, but for an earlier open_clip θ0's
        ``open_clip_config.json`` (it names weights the folder no longer has). Temporary files a
        killed run left for these names are removed too.

        Raises:
            OutputError: a rename failed (naming the file).
        """
        done = []
        stale = self._stale_files()
        self._remove_leftover_temps()
        while self._staged:  # each renamed file leaves the list: a failure discards only the rest
            tmp, path, f = self._staged[0]
            try:
                os.replace(tmp, self.staged(path))
            except OSError as e:
                raise output_error(path, e) from e
            del self._staged[0]
            close_quietly(f)
            done.append(path)
        why = "which this merge does not write; it would describe another model"
        if self.stage is not None:
            self._swap(stale)
            for path in stale:
                warnings.warn(f"{self.folder}: removed {path.name}, {why}", stacklevel=2)
            return done
        for path in remove_published(stale, where=self.folder, why=why):
            warnings.warn(f"{self.folder}: removed {path.name}, {why}", stacklevel=2)
        return done

    def _swap(self, stale: Sequence[Path]) -> None:
        """Make the staging folder the folder (class docstring): the folder's files this merge
        neither writes nor drops (``stale``, the earlier weights, leftovers) are linked in, the
        folder's lock is made there and held, the two are exchanged, the folders it held moved
        in and the earlier folder removed."""
        from .io import OutputError, signals_held

        real, prefix = self._stage_prefix()
        stage = self.stage
        new = {f.name for f in stage.iterdir()}
        lock = real / FOLDER_LOCK
        drop = {p.name for p in stale} | {FOLDER_LOCK}
        ours = [n for n in WEIGHT_NAMES if self.weights and output_family(real / n)(self.weights[0])]
        weights = output_family(real / (ours[0] if ours else self.weights[0]))
        earlier = []
        dirs = []
        for f in sorted(real.iterdir()):
            if f.name in new or f.name in drop:
                if f.name in new and f.is_dir() and not f.is_symlink():
                    raise OutputError(errno.EISDIR, f"cannot write the output {self.folder / f.name}: a folder is "
                                                    "there; nothing was published")
                continue
            if weights(f.name) or _leftover(f.name):
                if weights(f.name) and not f.name.endswith(".tmp"):
                    earlier.append(self.folder / f.name)
                continue
            if f.is_dir() and not f.is_symlink():
                dirs.append(f.name)
                continue
            try:
                os.link(f, stage / f.name, follow_symlinks=False)
            except OSError as e:
                raise output_error(self.folder / f.name, e) from e
        for w in self.weights:  # the writer's lock in the staging folder (its writer lets go of it after)
            output_lock_path(stage / w).unlink(missing_ok=True)
        key = os.path.abspath(self.folder / FOLDER_LOCK)
        if key in held_locks and os.path.lexists(lock):  # the folder is held: the new one is, from before the swap
            fd = os.open(stage / FOLDER_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{os.getpid()}\n".encode())
            held_locks[key].append(fd)
        old = real.parent / f"{prefix}old-{os.getpid()}-{os.urandom(4).hex()}"
        step("exchange")
        try:
            if _exchange(stage, real):
                step("exchanged")
                os.rename(stage, old)
            else:
                os.rename(real, old)
                step("moved aside")
                os.rename(stage, real)
        except OSError as e:
            raise output_error(self.folder, e) from e
        self.stage = None
        with signals_held() as held:  # what the signals_held block published has its names in the folder
            held[:] = [self.folder / Path(p).name if Path(p).parent == stage else p for p in held]
        step("swapped")
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rename(old / name, real / name)
        step("moved back")
        shutil.rmtree(old, ignore_errors=True)
        warn_earlier(self.folder / (ours[0] if ours else self.weights[0]), earlier, stacklevel=4)

    def _stale_files(self) -> list[Path]:
        """In a folder an earlier merge wrote: the support files θ0's folder lacks, and the
        weight files under the other weights name (:data:`WEIGHT_NAMES`, e.g. an earlier
        open_clip θ0's), shards and index included."""
        if not (self.folder / RECIPE_NAME).is_file():
            return []
        staged = {path.name for _, path, _ in self._staged}
        names = [n for n in SUPPORT_FILES if n not in staged] if base_folder(self.recipe.base_model) else []
        others = self._other_weights()
        if "open_clip_config.json" not in staged and WEIGHT_NAMES[1] in others:
            names.append("open_clip_config.json")  # it would make open_clip look for weights this folder no longer has
        members = [output_family(self.folder / n) for n in others]
        names += sorted(f.name for f in self.folder.iterdir()
                        if not f.name.endswith(".tmp") and any(member(f.name) for member in members))
        return [self.folder / n for n in names if (self.folder / n).is_file() or (self.folder / n).is_symlink()]

    def _other_weights(self) -> list[str]:
        """The names of :data:`WEIGHT_NAMES` whose files this merge does not write."""
        return [n for n in WEIGHT_NAMES if self.weights and not output_family(self.folder / n)(self.weights[0])]

    def _remove_leftover_temps(self) -> None:
        """What a killed run left (the folder's lock keeps any other run out, so none of it is
        live): temporary files of this class's names, and the temporary files and lock file of
        the weights under the other name of :data:`WEIGHT_NAMES`."""
        ours = {tmp.name for tmp, _, _ in self._staged}
        left = [f for name in (*SUPPORT_FILES, RECIPE_NAME, CARD_NAME)
                for f in self.folder.glob(f".{glob.escape(name)}.*.tmp") if f.name not in ours]
        for n in self._other_weights():
            member = output_family(self.folder / n)
            left += [f for f in self.folder.iterdir() if f.name.endswith(".tmp") and member(f.name)]
            left.append(output_lock_path(self.folder / n))
        for f in left:
            with contextlib.suppress(OSError):
                f.unlink()

    def _discard(self) -> None:
        for tmp, _, f in self._staged:
            close_quietly(f)
            tmp.unlink(missing_ok=True)
        self._staged = []
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    def __exit__(self, *exc) -> None:
        self._discard()


def step(name: str) -> None:
    """A named step of a folder's swap (:meth:`FolderFiles.publish`); ``PACT_TEST_KILL_AT=name``
    kills the process there (SIGKILL), as a test of what a killed run leaves."""
    if os.environ.get("PACT_TEST_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether the process ``pid`` runs (one of another user counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _leftover(name: str) -> bool:
    """Whether ``name`` is what a killed run leaves in a folder output: a temporary file, a lock
    file, a spill folder of global TIES (:func:`pactlib.lazy.spill_prefix`)."""
    return name.startswith(".") and (name.endswith((".tmp", ".lock"))
                                     or any(name.startswith(f".{n}.spill-") for n in WEIGHT_NAMES))


def _exchange(a: Path, b: Path) -> bool:
    """Exchange the folders ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``); False
    where the system has no such call (nothing done).

    Raises:
        OSError: the call failed otherwise.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))
