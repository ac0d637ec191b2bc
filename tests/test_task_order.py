"""A merge is a function of the SET of task vectors: every order of the same tasks gives the same
bytes, for every registered method and every PACT mode (pactlib.order), and per-task results
come back in the caller's order."""
from __future__ import annotations

import itertools

import pytest
import torch

import pactlib
from pactlib import merges
from pactlib.order import CHUNK, canonical_order, content_order
from pactlib.safetensors_io import tensor_bytes_view
from pactlib.pact import PactOptions

#: PACT modes: (pact, options) — none, exact PACT, PACT with randomized SVDs (fixed seed), S-PACT
MODES = {"none": (None, None), "pact": ("pact", None),
         "pact-rsvd": ("pact", PactOptions(svd="rsvd", seed=7)), "s-pact": ("s-pact", None)}


def _checkpoints(T: int = 4):
    """θ0 and T fine-tunes with matrix keys (two linear layers) and non-matrix keys (biases, a norm)."""
    g = torch.Generator().manual_seed(43)
    pre = {"l1.weight": torch.randn(24, 16, generator=g), "l1.bias": torch.randn(24, generator=g),
           "l2.weight": torch.randn(10, 24, generator=g), "norm.weight": torch.ones(10)}
    fts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) * (1 + t) for k, v in pre.items()} for t in range(T)]
    return pre, fts


def _orders(T: int):
    return list(itertools.permutations(range(T)))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("method", merges.names())
def test_every_order_merges_to_the_same_bytes(method, mode):
    pact, options = MODES[mode]
    pre, fts = _checkpoints(4)
    outs = []
    for order in _orders(4)[::5]:  # 5 of the 24 orders, the identity among them
        out = pactlib.merge(method, pre, [fts[i] for i in order], alpha=0.4, pact=pact, options=options)
        outs.append(out)
    for out in outs[1:]:
        assert out.keys() == outs[0].keys()
        assert all(torch.equal(out[k], outs[0][k]) for k in out), f"{method} / {mode}: another order, other bytes"


@pytest.mark.parametrize("mode", ["pact", "pact-rsvd", "s-pact"])
def test_merged_update_reports_per_task_in_the_callers_order(mode):
    pact, options = MODES[mode]
    pre, fts = _checkpoints(3)
    tvs = pactlib.task_vectors_from(pre, fts)
    reports, updates = {}, {}
    for order in _orders(3):
        D, report = pactlib.merged_update("iso_c", pre, [tvs[i] for i in order], pact=pact, options=options)
        updates[order] = D
        reports[order] = {lr.key: {t: (lr.active_rank[c], lr.lbw_rank[c], lr.shield_rank[c], lr.union_rank[c],
                                       lr.capped[c], lr.removed_energy[c]) for c, t in enumerate(order)}
                          for lr in report.layers}
    first = next(iter(updates.values()))
    assert all(torch.equal(D[k], first[k]) for D in updates.values() for k in first)
    # position c of a report is the caller's c-th task: task t's numbers are the same in every order
    assert all(r == reports[(0, 1, 2)] for r in reports.values())
    # and the numbers differ between tasks (the check above would hold trivially otherwise)
    ranks = {lr: {reports[(0, 1, 2)][lr][t] for t in range(3)} for lr in reports[(0, 1, 2)]}
    assert any(len(v) > 1 for v in ranks.values())


def _content(tv) -> bytes:
    return b"".join(bytes(tensor_bytes_view(tv[k].contiguous())) for k in sorted(tv))


def test_the_canonical_order_is_the_order_of_the_task_vectors_bytes_and_ties_keep_their_places():
    pre, fts = _checkpoints(3)
    tvs = pactlib.task_vectors_from(pre, fts)
    perm = canonical_order(tvs)
    assert sorted(perm) == [0, 1, 2]
    assert [_content(tvs[i]) for i in perm] == sorted(_content(tv) for tv in tvs)
    # the order of the set, whatever order it comes in
    for order in _orders(3):
        assert [order[i] for i in canonical_order([tvs[j] for j in order])] == perm
    # identical task vectors: equal contents, in the order given
    with pytest.warns(UserWarning, match="identical"):
        same = pactlib.task_vectors_from(pre, [fts[0], fts[1], fts[0]])
    assert canonical_order(same) in ([0, 2, 1], [1, 0, 2])


def test_a_chunk_is_read_only_while_its_task_agrees_with_another():
    asked = []
    contents = [[b"b", b"x"], [b"a", b"y"], [b"b", b"w"], [b"c", b"z"]]

    def chunk(t, c):
        asked.append((t, c))
        return contents[t][c]

    assert content_order(4, 2, chunk) == [1, 2, 0, 3]
    assert sorted(asked) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert CHUNK > 0
