"""Chapter 3's one pass per task on the tiny clip testbed (lazy task vectors, issue 15): the same
records as the former three passes (test_exp_scalar_pipeline has the synthetic-testbed checks)."""
from __future__ import annotations

import pytest

open_clip = pytest.importorskip("open_clip")

from pactlib.testbeds.lazy_vectors import LazyTaskVector  # noqa: E402
from test_clip_testbed import files, loaded  # noqa: E402,F401  (files: a fixture)
from test_exp_scalar_pipeline import KW, _by_method, _check_same, _merged, _one_pass, _three_passes  # noqa: E402


@pytest.fixture(scope="module")
def tb(files, tmp_path_factory):  # noqa: F811
    yield from loaded("clip-scalar", files, tmp_path_factory)


def test_one_pass_equals_the_three_passes_on_the_clip_testbed(tb):
    assert all(isinstance(tv, LazyTaskVector) for tv in tb.task_vectors())
    kw = dict(KW, fisher_samples=4, test_limit=6, draws=1)
    old = _three_passes(None, {0: tb}, _merged, {"q": 0.2}, **kw)
    new = _one_pass({0: tb}, _merged, {"q": 0.2}, **kw)
    _check_same(old, new)
    assert len(_by_method(new)["restore"]) == 2 * 4
