"""Constructed per-example outcomes for the tests of chapters 3, 4 and 10's verdicts.

A task has ``N`` test examples; θt gets the first ``N - FT_WRONG`` right. A perturbed / ablated /
restored model is described by how many of θt's right examples it gets wrong (``lost``) and how
many of θt's wrong ones it gets right (``won``), so a paired difference is known exactly.
"""
from __future__ import annotations

import torch

from pactlib.outcomes import pack

N = 400
FT_WRONG = 40


def correct(lost: int = 0, won: int = 0, n: int = N, ft_wrong: int = FT_WRONG) -> torch.Tensor:
    """(n,) bool: θt's outcomes with ``lost`` of its right examples made wrong and ``won`` of its
    wrong examples made right."""
    c = torch.zeros(n, dtype=torch.bool)
    c[: n - ft_wrong] = True
    c[:lost] = False
    c[n - ft_wrong: n - ft_wrong + won] = True
    return c


def outcomes(task: str, lost: int = 0, won: int = 0) -> dict:
    """The ``outcomes`` field of a one-task record."""
    return {"test": {task: pack(correct(lost, won))}}


def acc(lost: int = 0, won: int = 0) -> float:
    return float(correct(lost, won).float().mean())
