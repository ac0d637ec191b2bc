"""Per-task linear heads on frozen pre-trained features: the testbed's "zero-shot" classifiers.

CLIP classifies with a head built from class names, before any fine-tuning; fine-tuning then
moves only the image encoder and the head stays frozen (book/method.md, protocol). The Lite0 testbed has no
text tower, so its analogue is a classifier ``features (N, 1280) -> logits (N, C)`` built once
per task from the *pre-trained* backbone's features of the task's train split, then frozen for
every fine-tuning run, every seed and every merge. Its accuracy on θ0 is the "zero-shot"
accuracy acc_0(t). Two kinds (``pactlib.testbeds.lite0.zoo.Recipe.head``):

- ``"prototype"`` (the default, :func:`fit_prototype_head`): CLIP's form, a cosine classifier
  ``s · normalize(class mean) · normalize(feature)`` with one fitted logit scale ``s``;
- ``"probe"`` (:func:`fit_head`): L2-regularised multinomial logistic regression on the raw
  features, by full-batch L-BFGS in float64 from zero. Stronger at θ0, but fine-tuning through
  it grows the unnormalised features and breaks the other tasks' heads, so Task Arithmetic
  barely beats zero-shot (measured: ``bench/bench_heads.py``).

Both fits are deterministic (no random numbers).

Book: chapter "The testbed".
"""
from __future__ import annotations

import hashlib
import math
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor



@dataclass(frozen=True)
class Head:
    """A frozen linear classifier on backbone features.

    Attributes:
        weight: float32 (C, D), D = feature dimension (1280 for Lite0).
        bias: float32 (C,).
        classes: the C class names, in label order.
        normalize: when True the head is a cosine classifier: features are L2-normalised
            before the linear map (CLIP's zero-shot head; :func:`fit_prototype_head`).
    """

    weight: Tensor
    bias: Tensor
    classes: tuple[str, ...]
    normalize: bool = False

    def __post_init__(self):
        if self.weight.ndim != 2 or self.bias.shape != (self.weight.shape[0],):
            raise ValueError(
                f"head weight must be (C, D) and bias (C,), got {tuple(self.weight.shape)} and "
                f"{tuple(self.bias.shape)}"
            )
        if len(self.classes) != self.weight.shape[0]:
            raise ValueError(
                f"head has {self.weight.shape[0]} outputs but {len(self.classes)} class names"
            )

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    def logits(self, features: Tensor) -> Tensor:
        """(N, D) features -> (N, C) logits."""
        if features.ndim != 2 or features.shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"features must be (N, {self.weight.shape[1]}), got {tuple(features.shape)}"
            )
        if self.normalize:
            features = F.normalize(features, dim=1)
        return F.linear(features, self.weight.to(features.dtype), self.bias.to(features.dtype))


def _check_fit_inputs(features: Tensor, labels: Tensor, classes) -> None:
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(
            f"features must be (N, D) and labels (N,), got {tuple(features.shape)} and "
            f"{tuple(labels.shape)}"
        )
    C = len(classes)
    if labels.numel() == 0 or int(labels.min()) < 0 or int(labels.max()) >= C:
        raise ValueError(f"labels must lie in [0, {C}) for classes {tuple(classes)[:5]}...")
    counts = torch.bincount(labels, minlength=C)
    if (counts == 0).any():
        missing = [classes[i] for i in (counts == 0).nonzero().flatten().tolist()]
        raise ValueError(f"no training example for class(es) {missing}: cannot fit the head")


def fit_head(
    features: Tensor,
    labels: Tensor,
    classes: tuple[str, ...] | list[str],
    *,
    l2: float = 1e-2,
    max_iter: int = 300,
) -> Head:
    """Fit an L2-regularised multinomial logistic-regression head (full batch, L-BFGS).

    Minimises ``mean_i CE(W x_i + b, y_i) + l2/2 * ||W||_F^2`` on the raw features, from
    W = 0, b = 0. Deterministic: no random numbers. The features are *not* standardised: at
    32 px most of Lite0's 1280 pooled ReLU6 features are (nearly) constant zero, and dividing by
    their tiny spread gives huge weights, i.e. a head whose logits swing wildly under small
    feature changes, which makes fine-tuning through it unstable (measured). The ridge keeps
    the head's spectral norm small.

    Args:
        features: (N, D) frozen features (any float dtype).
        labels: int64 (N,), values in [0, C).
        classes: the C class names; C = len(classes).
        l2: ridge strength on the weights (not on the bias).
        max_iter: L-BFGS iteration cap.

    Returns:
        :class:`Head` with float32 weight (C, D) and bias (C,).

    Raises:
        ValueError: shape mismatch, a label outside [0, C), or a class with no example.
    """
    _check_fit_inputs(features, labels, classes)
    C = len(classes)

    x = features.detach().to(torch.float64)  # (N, D)
    W = torch.zeros(C, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(C, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [W, b], lr=1.0, max_iter=max_iter, history_size=20, tolerance_grad=1e-9,
        tolerance_change=1e-12, line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ W.T + b, labels) + 0.5 * l2 * (W * W).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    W_raw, b_raw = W.detach(), b.detach()
    return Head(W_raw.float().contiguous(), b_raw.float().contiguous(), tuple(classes))


def fit_prototype_head(
    features: Tensor,
    labels: Tensor,
    classes: tuple[str, ...] | list[str],
    *,
    max_iter: int = 100,
    shots: int | None = None,
    seed: int = 0,
) -> Head:
    """A cosine "prototype" head: the CLIP-style zero-shot classifier of the testbed.

    CLIP's zero-shot head is ``s · normalize(text embedding of class c)`` applied to normalised
    image features, with a fixed logit scale s (book/method.md, protocol). The testbed has no text tower, so
    the class embedding is the normalised mean of the normalised θ0 features of the class's
    train images, and ``s`` is the one scalar fit (by L-BFGS on log s, from s = 10) to minimise
    the train cross-entropy. Nothing else is trained: the head is as weak as a nearest-class-mean
    classifier, which leaves fine-tuning (and merging) the headroom CLIP's zero-shot heads leave.

    Args:
        features: (N, D) frozen θ0 features (any float dtype).
        labels: int64 (N,), values in [0, C).
        classes: the C class names.
        max_iter: L-BFGS iteration cap for the logit scale.
        shots: build each class embedding from only this many train images of the class, drawn
            at random (``seed``); None: all of them. The logit scale is still fit on every
            example. Few shots give a weaker head, closer to how far CLIP's zero-shot heads sit
            from fine-tuned accuracy.
        seed: seed of the draw of ``shots`` images per class.

    Returns:
        :class:`Head` with ``normalize=True``, weight ``s · P`` (C, D) with unit-norm rows P, bias 0.

    Raises:
        ValueError: shape mismatch, a label outside [0, C), a class with no example, ``shots`` < 1,
            or a class with fewer than ``shots`` examples.
    """
    _check_fit_inputs(features, labels, classes)
    C = len(classes)
    x = F.normalize(features.detach().to(torch.float64), dim=1)
    keep = torch.ones_like(labels, dtype=torch.bool)
    if shots is not None:
        if shots < 1:
            raise ValueError(f"shots must be >= 1 or None, got {shots}")
        counts = torch.bincount(labels, minlength=C)
        if int(counts.min()) < shots:
            few = [classes[i] for i in (counts < shots).nonzero().flatten().tolist()]
            raise ValueError(f"shots={shots} but class(es) {few} have fewer train examples")
        g = torch.Generator().manual_seed(seed)
        keep = torch.zeros_like(keep)
        for c in range(C):
            idx = (labels == c).nonzero().flatten()
            keep[idx[torch.randperm(idx.numel(), generator=g)[:shots]]] = True
    onehot = F.one_hot(labels[keep], C).to(x.dtype)  # (n, C)
    protos = F.normalize(onehot.T @ x[keep], dim=1)  # (C, D): class sums, then unit rows
    s = fit_logit_scale(x @ protos.T, labels, max_iter=max_iter)
    return Head((s * protos).float().contiguous(), torch.zeros(C), tuple(classes), normalize=True)


def fit_logit_scale(cos: Tensor, labels: Tensor, *, max_iter: int = 100) -> float:
    """The logit scale s > 0 of a cosine head: L-BFGS on log s (from s = 10) minimising the
    cross-entropy of ``s · cos``. ``cos``: float64 (N, C) cosines; ``labels``: int64 (N,)."""
    log_s = torch.tensor(math.log(10.0), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_s], lr=1.0, max_iter=max_iter, tolerance_grad=1e-10,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(log_s.exp() * cos, labels)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(log_s.detach().exp())


def head_accuracy(head: Head, features: Tensor, labels: Tensor) -> float:
    """Fraction of ``labels`` (N,) predicted correctly from ``features`` (N, D); in [0, 1]."""
    if labels.numel() == 0:
        raise ValueError("cannot compute an accuracy on zero examples")
    pred = head.logits(features.float()).argmax(1)
    return float((pred == labels).double().mean())


def save_safetensors(tensors: dict[str, Tensor], path: str | Path, metadata: dict | None = None) -> str:
    """Save ``tensors`` as safetensors atomically; returns the file's sha256 (hex).

    ``metadata`` values are JSON-encoded into the safetensors header (strings only there). The
    bytes are a function of the tensors and the metadata (:func:`pactlib.io.write_safetensors`:
    ``safetensors.torch.save``'s layout with the metadata keys sorted, where that library writes
    them in hash order), so a rebuilt zoo file has the same sha256 when its tensors are the same.
    """
    from pactlib.io import write_safetensors

    meta = {k: json.dumps(v) for k, v in (metadata or {}).items()}
    write_safetensors({k: v.detach() for k, v in tensors.items()}, path, metadata=meta)
    return file_sha256(path)


def load_safetensors(path: str | Path) -> tuple[dict[str, Tensor], dict]:
    """Load a safetensors file written by :func:`save_safetensors`: (tensors, metadata).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is truncated or its header is corrupt (names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no safetensors file at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise ValueError(f"corrupt or truncated safetensors file {path}: {err}") from err
    return tensors, meta


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_head(head: Head, path: str | Path, **metadata) -> str:
    """Save ``head`` (weight, bias, class names + ``metadata``) atomically; returns its sha256."""
    return save_safetensors(
        {"weight": head.weight, "bias": head.bias}, path,
        {"classes": list(head.classes), "normalize": head.normalize, **metadata}
    )


def load_head(path: str | Path) -> Head:
    """Load a head written by :func:`save_head`.

    Raises:
        FileNotFoundError / ValueError: missing or corrupt file, or missing entries (names them).
    """
    tensors, meta = load_safetensors(path)
    missing = {"weight", "bias"} - tensors.keys()
    if missing or "classes" not in meta:
        raise ValueError(f"head file {path} lacks {sorted(missing) or ['classes metadata']}")
    return Head(tensors["weight"], tensors["bias"], tuple(meta["classes"]), bool(meta.get("normalize", False)))
