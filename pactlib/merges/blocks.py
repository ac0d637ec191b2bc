"""Shared pieces of the SVD-based merges (M3–M5): how null directions are treated, and the
stack -> polar-orthogonalise step of TSV-M and Iso-CTS.

TSV-M and Iso-CTS build U = [U_1 … U_T] (m, Σ r_t), S and V = [V_1 … V_T] (n, Σ r_t) from
per-task singular triplets, replace U and V by their orthogonal polar factors, and recombine
D = U⊥ diag(S) V⊥ᵀ.

**Rank-deficient layers.** The PACT filter removes the same directions from every task, and LoRA
task vectors have rank ≤ r, so the matrices these merges decompose are often exactly
rank-deficient. Their SVD then pairs the null directions arbitrarily (the pairing changes with the
order of the tasks), and the reference implementations, which flatten or stack *every* singular
triplet, write merged weight into those arbitrary directions. ``null_space="drop"`` (default)
keeps only the directions the matrix's values resolve (:func:`pactlib.linalg.resolved_rank`): its
singular values computed in float64, above the rounding noise of its float32 values. The null
directions that algebra creates sit at that rounding level; every direction above it is kept, so
on full-rank layers the two conventions give the same merge, however small the layer's smallest
singular values. The merge is then a function of the *set* of task vectors.
``null_space="literal"`` is the reference code's convention, kept so the book can show both
(chapter 5, "Rank-deficient layers"). ``rank_rtol`` replaces the decision by a plain relative
tolerance on the SVD's values (singular values above ``rank_rtol`` times the layer's scale), e.g.
``max(m, n)·eps``, the tolerance of ``torch.linalg.matrix_rank``, which on a float32 layer cuts
real directions up to max(m, n)·eps·σ_max (1.2e-4·σ_max at 1024 x 1024).
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import Tensor

from ..linalg import Triplets, polar, resolved_rank

NullSpace = Literal["drop", "literal"]
NULL_SPACES = ("drop", "literal")


def check_null_space(null_space: str, rank_rtol: float | None) -> None:
    """Validate the two rank-deficiency parameters shared by TSV-M, Iso-C and Iso-CTS.

    Raises:
        ValueError: ``null_space`` not one of ``NULL_SPACES``, or ``rank_rtol`` negative / not finite.
    """
    if null_space not in NULL_SPACES:
        raise ValueError(f"null_space must be one of {NULL_SPACES}, got {null_space!r}")
    if rank_rtol is not None and not (0 <= float(rank_rtol) < 1):
        raise ValueError(f"rank_rtol must be in [0, 1) or None, got {rank_rtol!r}")


def kept_rank(X: Tensor, S: Tensor, rank_rtol: float | None, *, scale: float | None = None,
              norm: float | None = None, limit: int | None = None) -> int:
    """How many leading singular triplets of X (m, n) ``null_space="drop"`` keeps: the one rank
    decision of TSV-M, Iso-C and Iso-CTS (M3–M5), in memory, streamed and on any device.

    Args:
        X: the decomposed matrix (m, n); S: its singular values from the SVD the merge takes
            (descending, X's compute dtype).
        rank_rtol: None (default): :func:`pactlib.linalg.resolved_rank` (``norm``, ``limit`` as
            there). A number: the values of S above ``rank_rtol · scale`` (``scale`` default S[0]).

    Returns:
        r with 0 <= r <= min(limit, len(S)).
    """
    if rank_rtol is None:
        return resolved_rank(X, S, norm=norm, limit=limit)
    top = (float(S[0]) if S.numel() else 0.0) if scale is None else float(scale)
    r = int((S > float(rank_rtol) * top).sum())
    return r if limit is None else min(r, limit)


def in_range(block: Triplets, tol: float) -> Triplets:
    """The triplets of ``block`` whose singular value exceeds ``tol`` (values are descending):
    the ``rank_rtol`` decision over blocks that share one scale."""
    return leading(block, int((block.S > tol).sum()))


def leading(block: Triplets, r: int) -> Triplets:
    """The first r triplets of ``block`` (views; all of them when r >= their number)."""
    return block if r >= block.S.shape[0] else Triplets(block.U[:, :r], block.S[:r], block.V[:, :r])


def combine_blocks(blocks: Sequence[Triplets], *, values: Tensor | None = None,
                   literal: bool = False) -> Tensor:
    """D = polar(U) diag(S) polar(V)ᵀ from stacked blocks (U_i (m, r_i), S_i, V_i (n, r_i)).

    Args:
        blocks: the per-task (or common) singular blocks, stacked in order (a block may be empty).
        values: replacement singular values (Σ r_i,); default the blocks' own values.
        literal: polar factors over every direction (reference code) instead of the directions
            the stacked factors resolve (:func:`pactlib.linalg.polar`).

    Returns:
        D (m, n); zero when every block is empty. When Σ r_i > min(m, n) the polar factors have
        orthonormal rows instead of columns (a documented degenerate case of many tasks on a small
        layer); when the stacked directions are linearly dependent, the canonical factor (not
        ``literal``) is a partial isometry that maps the dependent combinations to zero.
    """
    U = torch.cat([b.U for b in blocks], dim=1)  # (m, R)
    V = torch.cat([b.V for b in blocks], dim=1)  # (n, R)
    S = torch.cat([b.S for b in blocks]) if values is None else values  # (R,)
    if U.shape[1] == 0:
        return U.new_zeros(U.shape[0], V.shape[0])
    return (polar(U, literal=literal) * S) @ polar(V, literal=literal).mT
