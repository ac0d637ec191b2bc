"""Chapters 3 and 10 on a clip testbed whose ``device`` is not the CPU (issue 15): the Fisher's
label draws, the masks, the loss / scoring of CPU weights by the testbed's model. Without a GPU
the device is ``fakegpu`` (tests/fake_device.py: CPU values, CUDA's device rules enforced), so
a CPU tensor reaching a model on the device, or a CPU generator drawing from its tensors, fails
here as it would on CUDA; the records must equal the CPU run's."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

open_clip = pytest.importorskip("open_clip")

from fake_device import fake_gpu  # noqa: E402
from pactlib import fisher, testbeds  # noqa: E402
from pactlib.book.experiments import scalar, theory  # noqa: E402
from pactlib.taskvector import TaskVector  # noqa: E402
from pactlib.threads import single_threaded  # noqa: E402
from test_clip_testbed import files, loaded  # noqa: E402,F401  (files: a fixture)


@pytest.fixture(scope="module")
def tb(files, tmp_path_factory):  # noqa: F811
    yield from loaded("clip-device", files, tmp_path_factory)


def _chapter3(tb):
    """Chapter 3's loop body for the first task (notebooks/03_scalar_perspective.py)."""
    tvs = tb.task_vectors()
    merged = TaskVector.sum(tvs).apply_to(tb.pretrained, 0.4)
    return scalar.task_records(tb, tb.tasks[0], tvs[0], fisher_samples=4, fisher_chunk=2, quantile=0.2, seed=1,
                               scales=[1.0, 4.0], draws=1, test_limit=6, params={}, merged=merged,
                               merge_fields=dict(alpha=0.4))


def _chapter10(tb):
    """Chapter 10's loop body for every task (notebooks/10_theory.py)."""
    tvs = tb.task_vectors()
    filtered, report = testbeds.filtered(tb, "pact", keep=True)
    return [r for i, t in enumerate(tb.tasks)
            for r in theory.theory_records(tb, i, tvs[i], filtered[i], report, xy_loss=tb.inputs(t, "val", 4),
                                           xy_test=tb.inputs(t, "test", 6), fracs=[0.5, 1.0], seed=0, params={},
                                           rule=tb.rule)]


def _same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k != "metrics"} == {k: v for k, v in rb.items() if k != "metrics"}
        for k, v in ra["metrics"].items():
            w = rb["metrics"][k]
            assert (v is None and w is None) or w == pytest.approx(v, rel=1e-4, abs=1e-5), (ra["method"], k, v, w)


def _on_device(tb, dev):
    """Move ``tb`` to ``dev`` as load(device=...) puts it there; forget its filtered task vectors."""
    tb.device = str(dev)
    tb.classifier.to(dev)
    for k in ("filtered_lazy", "filtered_spill", "filtered_keep"):
        testbeds.base._cache(tb).pop(k, None)


def test_chapters_3_and_10_run_on_the_testbeds_device(tb):
    with single_threaded():  # as fake_gpu() runs: the same kernels, so the same bits
        cpu3, cpu10 = _chapter3(tb), _chapter10(tb)
    with fake_gpu() as dev:
        x, y = tb.inputs(tb.tasks[0], "val", 2)
        assert x.device.type == y.device.type == "cpu"
        _on_device(tb, dev)
        try:
            x, y = tb.inputs(tb.tasks[0], "val", 2)
            assert x.device == y.device == dev and next(tb.loss_model(tb.finetuned[tb.tasks[0]], tb.tasks[0])
                                                        .parameters()).device == dev
            F_t = scalar.task_fisher(tb, tb.tasks[0], tb.finetuned[tb.tasks[0]], n_samples=4, seed=1, chunk=2)
            assert {v.device.type for v in F_t.values()} == {"cpu"}  # returned on the CPU
            dev3, dev10 = _chapter3(tb), _chapter10(tb)
        finally:
            _on_device(tb, "cpu")
    _same(cpu3, dev3)
    _same(cpu10, dev10)
    assert {r["method"] for r in dev3} == {"enrichment", "finetuned", "perturb", "restore"}
    assert {r["method"] for r in dev10} == {"finetuned", "first-order", "path", "layer"}
    assert all(math.isfinite(r["metrics"]["measured"]) for r in dev10 if r["method"] == "first-order")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("empirical", [False, True])
def test_fisher_and_masks_on_a_device_equal_the_cpus(empirical):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(10, 5, generator=g), torch.randint(0, 3, (10,), generator=g)
    cpu = fisher.diagonal_fisher(_Net(), [(x, y)], n_samples=9, seed=4, chunk=4, empirical=empirical)
    with fake_gpu() as dev:
        net = _Net().to(dev)
        # the examples on the CPU (moved to the model) or already on the device
        for xy in [(x, y), (x.to(dev), y.to(dev))]:
            got = fisher.diagonal_fisher(net, [xy], n_samples=9, seed=4, chunk=4, empirical=empirical)
            assert all(v.device.type == "cpu" for v in got.values())
            for k in cpu:
                assert torch.equal(got[k], cpu[k]), k
        f = cpu["a.weight"]
        for fn in (fisher.lowest_mask, fisher.highest_mask):
            m = fn(f.to(dev), 0.3)
            assert m.device == dev and torch.equal(m.cpu(), fn(f, 0.3))
