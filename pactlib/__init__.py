"""pactlib: PACT (Preserving Anchored Cores in Task-vectors) for model merging.

Task vectors, matrix views, LBW subspaces, shields, the PACT filter, merges (Task Arithmetic,
TIES, TSV-M, Iso-C, Iso-CTS), randomized SVD, Fisher/enrichment, evaluation, models and data.
Specification: ``book/method.md`` (equations P1–P7, M1–M5, S1–S2; claims C1–C12). Book: ``_build/html``.
"""
import warnings as _warnings

# tqdm.auto falls back to text bars in headless kernels (papermill) and says so on every import;
# the text bars are what the book wants, so the notice is noise in every executed chapter.
_warnings.filterwarnings("ignore", message="IProgress not found")

import importlib as _importlib

#: Public names -> the module that defines them, imported on first use (PEP 562), so that
#: ``import pactlib`` and ``pact merge`` of Task Arithmetic do not import torch
#: (:mod:`pactlib.fastpath`).
_LAZY = {"merge": "api", "merged_update": "api", "task_vectors_from": "api",
         "CheckpointError": "checks", "MergeOverflowError": "checks", "PrecisionWarning": "checks",
         "load_state_dict": "io", "save_state_dict": "io", "MatrixRule": "matrix",
         "PactOptions": "pact", "PactReport": "pact", "pact_filter": "pact",
         "MergedFiles": "streaming", "merge_files": "streaming", "TaskVector": "taskvector",
         "merges": None, "peft": None}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pactlib' has no attribute {name!r}")
    module = _importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"
__all__ = ["CheckpointError", "MatrixRule", "MergeOverflowError", "MergedFiles", "PactOptions", "PrecisionWarning", "PactReport",
           "TaskVector", "load_state_dict", "merge", "merge_files", "merged_update", "merges", "pact_filter",
           "peft", "save_state_dict", "task_vectors_from"]
