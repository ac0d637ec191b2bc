"""Task Arithmetic (M1): D = Σt Δt over all keys.

Ilharco et al., "Editing Models with Task Arithmetic", ICLR 2023.
"""
from __future__ import annotations

from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .driver import RunningSum
from .registry import alpha_grid, register


@register("task_arithmetic", pretty="Task Arithmetic", reference="Ilharco et al., ICLR 2023",
          alphas=alpha_grid(0.05, 1.0, 0.05), elementwise=True, reducer=lambda T, matrix: RunningSum())
def task_arithmetic(task_vectors: list[TaskVector], *, rule: MatrixRule) -> TaskVector:
    """D = Σt Δt (M1); every key, matrix or not. Returns a new task vector."""
    return TaskVector.sum(task_vectors)
