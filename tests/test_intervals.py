"""pactlib.outcomes (per-example outcomes, packed) and pactlib.book.intervals (95 % intervals)."""
import math

import numpy as np
import pytest
import torch

from pactlib.book import intervals
from pactlib.book.intervals import Interval, contrast, difference, needed, over_seeds
from pactlib.outcomes import Scores, outcomes_of, pack, scores, unpack


def test_pack_round_trips_and_matches_numpy_packbits():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 300, 1001):
        bits = rng.random(n) < 0.6
        text = pack(torch.from_numpy(bits))
        assert torch.equal(unpack(text), torch.from_numpy(bits))
        import base64
        assert base64.b64decode(text.split(":")[1]) == np.packbits(bits).tobytes()
    assert pack(torch.tensor([True, False, True, True])) == "4:sA=="


@pytest.mark.parametrize("bad, match", [("x:AA==", "not '<N>:<base64>'"), ("9:AA==", "fewer than N = 9"),
                                        ("4:@@", "not '<N>:<base64>'")])
def test_unpack_names_bad_text(bad, match):
    with pytest.raises(ValueError, match=match):
        unpack(bad)


def test_scores_are_accuracies_with_their_outcomes():
    s = scores({"a": torch.tensor([True, False, True, True]), "b": torch.tensor([False, False])})
    assert s == {"a": 0.75, "b": 0.0} and isinstance(s, dict)
    assert s.outcomes["a"].dtype == torch.bool and s.outcomes["a"].tolist() == [True, False, True, True]
    with pytest.raises(ValueError, match="'c': no examples"):
        scores({"c": torch.tensor([], dtype=torch.bool)})
    with pytest.raises(ValueError, match="1-D"):
        scores({"d": torch.ones(2, 2, dtype=torch.bool)})
    rec = {"outcomes": {"test": {"a": pack(s.outcomes["a"])}}}
    assert outcomes_of(rec)["a"].tolist() == [True, False, True, True] and outcomes_of({}) == {}
    t = Scores()
    assert t.add("a", 0.5, "2:gA==") == 0.5 and t.outcomes["a"].tolist() == [True, False]


def _rec(bits_by_task, seed=0, testbed="tb", method="m", ft=None):
    ft = ft or {t: 1.0 for t in bits_by_task}
    acc = {t: float(np.mean(b)) for t, b in bits_by_task.items()}
    return {"method": method, "seed": seed, "testbed": testbed,
            "outcomes": {"test": {t: pack(torch.tensor(b, dtype=torch.bool)) for t, b in bits_by_task.items()}},
            "metrics": {**{f"acc:{t}": acc[t] for t in acc}, **{f"norm_acc:{t}": acc[t] / ft[t] for t in acc}}}


def test_one_seed_gain_matches_the_closed_form_standard_error():
    rng = np.random.default_rng(1)
    a = {t: rng.random(400) < 0.75 for t in "abc"}
    b = {t: rng.random(400) < 0.70 for t in "abc"}
    iv = contrast([_rec(a)], [_rec(b)])
    d = [a[t].astype(float) - b[t].astype(float) for t in "abc"]
    est = 100 * np.mean([x.mean() for x in d])
    se = 100 * math.sqrt(sum(x.var() / x.size for x in d)) / 3  # the plug-in SE of the mean over tasks
    assert iv.estimate == pytest.approx(est, abs=1e-12)
    assert iv.se == pytest.approx(se, rel=0.06) and iv.se_seeds == 0.0 and math.isinf(iv.df)
    assert iv.lo == pytest.approx(est - 1.959964 * iv.se) and iv.hi == pytest.approx(est + 1.959964 * iv.se)
    assert iv.n_examples == 400 and iv.n_seeds == 1
    assert contrast([_rec(a)], [_rec(b)]) == iv  # seeded: the same interval every time


def test_identical_models_give_a_zero_interval_and_normalized_divides_by_ft():
    a = {"a": [True, False, True, True], "b": [True, True, False, False]}
    assert contrast([_rec(a)], [_rec(a)]) == Interval(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4, 1)
    b = {"a": [True, False, True, False], "b": [True, True, False, False]}
    ft = {"a": 0.5, "b": 0.8}
    iv = contrast([_rec(a, ft=ft)], [_rec(b, ft=ft)], metric="norm_acc")
    assert iv.estimate == pytest.approx(100 * (0.25 / 0.5) / 2)
    with pytest.raises(ValueError, match="metric must be"):
        contrast([_rec(a)], [_rec(b)], metric="loss")


def test_seeds_add_their_spread_with_satterthwaite_df():
    rng = np.random.default_rng(2)
    base = {t: rng.random(300) < 0.7 for t in "ab"}
    plus, minus = [], []
    for s, shift in enumerate((0.02, 0.06, 0.10)):  # per-seed gains differ: a seed part
        flip = {t: base[t] | (rng.random(300) < shift) for t in "ab"}
        plus.append(_rec(flip, seed=s))
        minus.append(_rec(base, seed=s))
    iv = contrast(plus, minus)
    gains = [contrast([p], [m]).estimate for p, m in zip(plus, minus)]
    assert iv.estimate == pytest.approx(np.mean(gains))
    assert iv.se_seeds == pytest.approx(np.std(gains, ddof=1) / math.sqrt(3))
    assert iv.se == pytest.approx(math.hypot(iv.se_examples, iv.se_seeds))
    assert iv.n_seeds == 3 and 2.0 <= iv.df < math.inf
    from scipy import stats
    assert iv.hi - iv.estimate == pytest.approx(stats.t.ppf(0.975, iv.df) * iv.se)
    two = contrast(plus[:2], minus[:2])  # fewer than MIN_SEEDS: the seed part is left out
    assert two.se_seeds == 0.0 and two.n_seeds == 2


def test_contrast_refuses_what_it_cannot_pair():
    a = {"a": [True, False]}
    with pytest.raises(ValueError, match="one side only"):
        contrast([_rec(a, seed=0)], [_rec(a, seed=1)])
    with pytest.raises(ValueError, match="no per-example test outcomes"):
        contrast([{"method": "m", "seed": 0, "testbed": "tb"}], [_rec(a)])
    with pytest.raises(ValueError, match="differ in tasks or example counts"):
        contrast([_rec({"a": [True, False, True]})], [_rec(a)])


def test_difference_of_independent_intervals_and_power():
    a = Interval(2.0, 1.0, 3.0, 1 / 1.959964, se_examples=1 / 1.959964, n_examples=300)
    b = Interval(1.0, 0.0, 2.0, 1 / 1.959964, se_examples=1 / 1.959964, n_examples=300)
    d = difference(a, b)
    assert d.estimate == 1.0 and d.se == pytest.approx(math.sqrt(2) / 1.959964)
    need = needed(d)
    assert need["factor"] == pytest.approx(2.0) and need["examples_per_task"] == 600
    assert needed(a) is None  # decided already
    p = over_seeds([1.0, 2.0, 3.0])
    assert p.estimate == 2.0 and p.se == pytest.approx(1 / math.sqrt(3)) and p.df == pytest.approx(2.0)
    assert over_seeds([1.0]) == intervals.point(1.0)
    assert Interval(0.54, -0.71, 1.79, 0.6).text() == "+0.54 [−0.71, +1.79]"
