"""The EfficientNet-Lite0 testbed: its fine-tuning zoo and frozen task heads."""
