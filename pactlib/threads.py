"""The thread policy of the merges and the PACT filter: one thread per kernel, layers in parallel.

MKL's SVD and eigh give slightly different bits with different thread counts, so a merge computed
with 2 threads would differ (by float noise) from the same merge with 1. Every per-layer kernel
therefore runs single-threaded, and the layers are spread over a pool of worker threads (as many
as torch's intra-op thread count was when the call started). Results are then bit-identical for
any thread count, and two levels of threads never oversubscribe the cores.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def single_threaded() -> Iterator[int]:
    """Set torch's intra-op threads to 1 inside the block; yields the count it had (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield n
    finally:
        torch.set_num_threads(n)


def map_ordered(fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` over ``workers`` threads, each running torch single-threaded;
    results in the input order (so the outcome does not depend on ``workers``)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        with single_threaded():
            return [fn(x) for x in items]

    def one(x: T) -> R:
        torch.set_num_threads(1)  # the OpenMP thread count is per thread: set it in each worker
        return fn(x)

    with single_threaded(), ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))
