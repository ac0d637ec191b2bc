"""check_compatible's precision warning: a fine-tuned checkpoint in a coarser dtype than θ0."""
import warnings

import pytest
import torch
from safetensors.torch import save_file

import pactlib
from pactlib import PrecisionWarning
from pactlib.checks import check_compatible


def _pair(ft_dtype):
    g = torch.Generator().manual_seed(0)
    pre = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    return pre, {k: (v + 0.01).to(ft_dtype) for k, v in pre.items()}


@pytest.mark.parametrize("ft_dtype", [torch.float16, torch.bfloat16])
def test_coarser_fine_tune_warns_naming_key_and_dtypes(ft_dtype):
    pre, ft = _pair(ft_dtype)
    with pytest.warns(PrecisionWarning, match=rf"task-a: 2 floating key\(s\).*'w': {ft_dtype} vs torch.float32"):
        check_compatible(pre, ft, name="task-a")


@pytest.mark.parametrize("ft_dtype", [torch.float32, torch.float64])
def test_same_or_finer_fine_tune_does_not_warn(ft_dtype):
    pre, ft = _pair(ft_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_compatible(pre, ft, name="task-a")


def test_streamed_merge_warns_and_still_merges(tmp_path):
    pre, ft = _pair(torch.float16)
    save_file(pre, tmp_path / "pre.safetensors")
    save_file(ft, tmp_path / "ft.safetensors")
    with pytest.warns(PrecisionWarning, match="ft.safetensors"):
        pactlib.merge_files("task_arithmetic", tmp_path / "pre.safetensors", [tmp_path / "ft.safetensors"],
                            tmp_path / "out.safetensors", alpha=1.0)
    from safetensors.torch import load_file

    out = load_file(tmp_path / "out.safetensors")
    assert out["w"].dtype == torch.float32
    torch.testing.assert_close(out["w"], ft["w"].float(), rtol=0, atol=0)  # θ0 + (θt − θ0) = θt, exactly here
