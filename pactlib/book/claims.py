"""The paper's claims in one sentence each, and where the book defines and tests them.

The Verdicts page, the findings page, each chapter's verdict box and the README's table print a
claim's label with :data:`STATEMENTS` beside it, linking :func:`definition` (book/method.md,
``claim-<label>``) and the chapter that grades it (:data:`CHAPTERS`).
"""
from __future__ import annotations

import re

__all__ = ["STATEMENTS", "CHAPTERS", "statement", "definition", "base_label"]

#: One line per claim label (the labels the verdict records use).
STATEMENTS: dict[str, str] = {
    "C1": "Each task has scalar LBW entries: weights fine-tuning barely moved hold more of the task's Fisher "
          "information than their share (enrichment E_t > 1).",
    "C2": "Nudging a task's scalar LBW entries costs it much more accuracy than nudging as many random entries.",
    "C3": "Merging moves a task's LBW entries, and writing its own values back wins back part of its loss.",
    "C4": "Removing a task's LBW subspace from its layers hurts it far more than removing a random subspace "
          "of the same size.",
    "C5": "PACT improves Task Arithmetic, TSV-M and Iso-C in absolute and normalized test accuracy.",
    "C6": "PACT-Iso-C is the best merge in every setting run.",
    "C7": "PACT's gain grows with the number of tasks T.",
    "C8": "The static shield (S-PACT) gains less than PACT's per-task shields.",
    "C9": "Filtering the early layers gives most of PACT's gain, but with many tasks every layer needs it.",
    "C9a": "Filtering the early layers only gives most of PACT's gain.",
    "C9b": "With many tasks, every layer needs the filter.",
    "C10": "PACT with randomized SVDs matches exact-SVD accuracy in a fraction of the time.",
    "C11": "PACT still improves the merges when the task vectors are LoRA updates.",
    "C12": "The filter's first-order loss change on each task is bounded by the Cauchy–Schwarz product the "
           "paper gives, and predicts the true change.",
    "C5–C7 at paper scale": "PACT's main results (C5–C7) on the paper's CLIP ViTs.",
    "the filter's geometry (P3–P5) on the toy layer": "The shield and filter have the geometry the method "
                                                         "defines (projectors, orthogonality) on a toy layer.",
    "the testbed's precondition (fine-tuning helps every task)": "Fine-tuning beats zero-shot on every task, so "
                                                                  "there is something to merge.",
    "the testbed's problem (merging loses more as T grows)": "Merging loses more accuracy as the number of tasks "
                                                              "grows, the problem PACT addresses.",
}

#: The chapter (notebook stem) that grades each claim.
CHAPTERS: dict[str, str] = {
    "C1": "03_scalar_perspective", "C2": "03_scalar_perspective", "C3": "03_scalar_perspective",
    "C4": "04_subspace_perspective", "C5": "05_main_results", "C6": "05_main_results", "C7": "05_main_results",
    "C8": "06_static_vs_dynamic", "C9": "07_layer_depth", "C9a": "07_layer_depth", "C9b": "07_layer_depth",
    "C10": "08_efficiency", "C11": "09_lora", "C12": "10_theory",
}


def base_label(claim: str) -> str:
    """``"C9a (early layers give most of the gain)"`` -> ``"C9a"``: the label before any words."""
    return claim.split(" (", 1)[0].strip()


def statement(claim: str) -> str:
    """The claim's one-line statement (its label when it has none).

    Labels with words after them (``"C9a (early layers …)"``) are looked up whole, then by
    :func:`base_label`."""
    return STATEMENTS.get(claim) or STATEMENTS.get(base_label(claim)) or claim


def definition(claim: str) -> str | None:
    """The MyST label of the claim's definition in book/method.md (``"claim-C9"`` for C9a), or
    None for the book's own checks."""
    m = re.fullmatch(r"(C\d+)[ab]?", base_label(claim))
    return f"claim-{m.group(1)}" if m else None
