"""Experiment helpers of the book's chapters: one module per chapter topic, each a few small
functions that a notebook calls (notebooks define no functions themselves).

Every helper takes plain tensors, frames or records and explicit parameters, and returns data
(tables as pandas frames, records as dicts) for :mod:`pactlib.book.records` and :mod:`pactlib.book.plotting`.
"""
