"""Shared fixtures: tiny synthetic checkpoints shaped like a small network with every kind of key."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# OpenMP threads that wait for work sleep instead of spinning (set before torch loads OpenMP; every
# subprocess and notebook kernel a test starts inherits it). Spinning threads are what made small
# parallel torch ops (a 65536-bin bincount per chunk: streamed global TIES) 10-20 times slower once
# the cores are shared: between the `make test` workers (pytest-xdist, one per core) or with other
# work on the machine. Only how idle threads wait changes: thread counts and results do not.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# pactlib finds its caches by configuration only ($PACT_CACHE, else ~/.cache/pactlib): the tests use
# the checkout's .cache (data sources, the zoo of the slow tests), as `make` does (the Makefile
# exports the same), unless PACT_CACHE is already set; the book folder is this checkout's.
os.environ.setdefault("PACT_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("PACT_BOOK_DIR", str(ROOT / "book"))


def load_runner():
    """``scripts/run_notebooks.py`` executed as a fresh module (registered as ``run_notebooks``
    the first time, so dataclasses and pickling resolve)."""
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("run_notebooks", mod)
    spec.loader.exec_module(mod)
    return mod


def planted(m: int, n: int, rank: int, *, gen: torch.Generator, decay: float = 0.7, noise: float = 0.0) -> torch.Tensor:
    """An (m, n) matrix of planted rank with geometrically decaying singular values (+ optional noise)."""
    U, _ = torch.linalg.qr(torch.randn(m, rank, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, rank, generator=gen, dtype=torch.float64))
    S = decay ** torch.arange(rank, dtype=torch.float64) * 10
    W = (U * S) @ V.T
    if noise:
        W = W + noise * torch.randn(m, n, generator=gen, dtype=torch.float64)
    return W


def make_checkpoints(T: int = 3, seed: int = 0, dtype=torch.float32):
    """θ0 and T fine-tuned state dicts with linear, 1x1-conv, kxk-conv, bias, norm, scalar and int keys."""
    g = torch.Generator().manual_seed(seed)
    pre = {
        "lin.weight": planted(12, 10, 10, gen=g, decay=0.8).float(),
        "lin.bias": torch.randn(12, generator=g),
        "pw.weight": torch.randn(9, 12, 1, 1, generator=g),
        "dw.weight": torch.randn(9, 1, 3, 3, generator=g),
        "bn.weight": torch.ones(9),
        "bn.running_mean": torch.zeros(9),
        "bn.num_batches_tracked": torch.tensor(7),
        "head.weight": torch.randn(4, 9, generator=g),
        "logit_scale": torch.tensor(2.0),
    }
    fts = []
    for _ in range(T):
        ft = {}
        for k, v in pre.items():
            if not v.is_floating_point():
                ft[k] = v.clone()
            elif v.ndim >= 2:  # low-rank-plus-noise update
                m = v.shape[0]
                n = v[0].numel()
                upd = planted(m, n, 2, gen=g, decay=0.5).float() * 0.02 + 0.002 * torch.randn(m, n, generator=g)
                ft[k] = v + upd.reshape(v.shape)
            else:
                ft[k] = v + 0.01 * torch.randn(v.shape, generator=g)
        fts.append(ft)
    cast = lambda sd: {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
    return cast(pre), [cast(f) for f in fts]


@pytest.fixture(autouse=True)
def _conversion_cache(tmp_path_factory, monkeypatch):
    """``pact merge`` converts .pt inputs to safetensors once, in a cache: a per-session temporary
    folder in the tests, never the user's or the project's cache."""
    monkeypatch.setenv("PACT_CONVERT_CACHE", str(tmp_path_factory.getbasetemp() / "converted"))


@pytest.fixture
def ckpts():
    return make_checkpoints()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
