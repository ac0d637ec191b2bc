"""pactlib: PACT (Preserving Anchored Cores in Task-vectors) for model merging.

Task vectors, matrix views, LBW subspaces, shields, the PACT filter, merges (Task Arithmetic,
TIES, TSV-M, Iso-C, Iso-CTS), randomized SVD, Fisher/enrichment, evaluation, models and data.
Specification: ``book/method.md`` (equations P1–P7, M1–M5, S1–S2; claims C1–C12). Book: ``_build/html``.
"""
import warnings as _warnings

# tqdm.auto falls back to text bars in headless kernels (papermill) and says so on every import;
# the text bars are what the book wants, so the notice is noise in every executed chapter.
_warnings.filterwarnings("ignore", message="IProgress not found")

from . import merges, peft  # noqa: E402  (pactlib.peft.read_adapter: PEFT adapters, no PEFT needed)
from .api import merge, merged_update, task_vectors_from
from .checks import CheckpointError, MergeOverflowError, PrecisionWarning
from .io import load_state_dict, save_state_dict
from .matrix import MatrixRule
from .pact import PactOptions, PactReport, pact_filter
from .streaming import MergedFiles, merge_files
from .taskvector import TaskVector

__version__ = "0.1.0"
__all__ = ["CheckpointError", "MatrixRule", "MergeOverflowError", "MergedFiles", "PactOptions", "PrecisionWarning", "PactReport",
           "TaskVector", "load_state_dict", "merge", "merge_files", "merged_update", "merges", "pact_filter",
           "peft", "save_state_dict", "task_vectors_from"]
