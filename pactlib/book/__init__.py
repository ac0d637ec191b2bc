"""The book's machinery: parameters, records, tables and figures, the chapters' experiments.

Nothing in the engine (``pactlib.taskvector``, ``matrix``, ``linalg``, ``subspaces``, ``shield``,
``pact``, ``merges``, ``lora``, ``api``, ``cli``, ...) imports this package
(``tests/test_boundary.py``). It needs the ``book`` extra (pandas, matplotlib, seaborn, ...).
"""
