"""Reading and writing state dicts (``.safetensors``, ``.pt``/``.pth``/``.bin``), atomically.

Reading ``.pt`` uses ``torch.load(weights_only=True)``: no pickled code runs. A checkpoint that
is a whole pickled module (as some task-vector repositories save) needs
:func:`pactlib.models.clip.load_clip_checkpoint` with an explicit opt-in.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .checks import CheckpointError

SAFETENSORS = (".safetensors",)
TORCH = (".pt", ".pth", ".bin", ".ckpt")


def check_suffix(path: str | os.PathLike) -> str:
    """The checkpoint extension of ``path`` (lower case).

    Raises:
        CheckpointError: an extension that is neither safetensors nor torch (the supported ones listed).
    """
    s = Path(path).suffix.lower()
    if s not in SAFETENSORS + TORCH:
        raise CheckpointError(f"{path}: unknown checkpoint extension {s or '(none)'!r}; "
                              f"use one of {', '.join(SAFETENSORS + TORCH)}")
    return s


def load_state_dict(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Tensor]:
    """Load a state dict from ``path``.

    Accepts a plain ``{name: tensor}`` dict, or one wrapped under ``"state_dict"``/``"model"``.
    With ``mmap`` a torch file's tensors are memory-mapped (``torch.load(mmap=True)``; a file in
    the legacy, non-zip format is read whole); safetensors files are read whole either way.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: unknown extension, unreadable file, or content that is not a mapping of
            tensors (naming the file and the offending key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    suffix = check_suffix(path)
    try:
        if suffix in SAFETENSORS:
            from safetensors.torch import load_file
            sd = load_file(str(path))
        else:
            sd = _torch_load(path, mmap)
    except Exception as e:  # corrupt / truncated / pickled module
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {str(e)[:200]})") from e
    if isinstance(sd, Mapping):
        for wrapper in ("state_dict", "model"):
            if wrapper in sd and isinstance(sd[wrapper], Mapping) and len(sd) <= 4:
                sd = sd[wrapper]
                break
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path}: expected a state dict, found {type(sd).__name__}")
    for k, v in sd.items():
        if not isinstance(v, Tensor):
            raise CheckpointError(f"{path}: key {k!r} holds a {type(v).__name__}, not a tensor")
    return dict(sd)


def _torch_load(path: Path, mmap: bool):
    if mmap:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
    return torch.load(path, map_location="cpu", weights_only=True)


def atomic_write(path: str | os.PathLike, write_fn) -> Path:
    """Call ``write_fn(tmp_path)`` then atomically rename the temporary file to ``path``.

    The temporary file lives in the destination directory, so ``os.replace`` is atomic; on any
    error it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_fn(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_state_dict(sd: Mapping[str, Tensor], path: str | os.PathLike, *, metadata: dict[str, str] | None = None) -> Path:
    """Save ``sd`` atomically as safetensors or torch format, chosen by the extension.

    Tensors are made contiguous copies for safetensors (shared storage is not allowed there).

    Raises:
        CheckpointError: unknown extension (the supported ones listed) or a non-tensor value,
            before anything is written.
    """
    path = Path(path)
    suffix = check_suffix(path)
    for k, v in sd.items():
        if not isinstance(v, Tensor):
            raise CheckpointError(f"cannot save key {k!r}: a {type(v).__name__}, not a tensor")
    if suffix in SAFETENSORS:
        from safetensors.torch import save_file
        data = {k: v.detach().contiguous().clone() for k, v in sd.items()}
        return atomic_write(path, lambda p: save_file(data, str(p), metadata=metadata))
    return atomic_write(path, lambda p: torch.save(dict(sd), p))
