"""The outcome helpers every chapter shares: intervals.packed / has_outcomes and experiments.paired."""
import pytest

import outcome_records as oc
from pactlib.book import intervals, records
from pactlib.book.experiments import paired


def _rec(method, task, seed=0, lost=0, with_outcomes=True, **extra):
    out = {"outcomes": oc.outcomes(task, lost=lost)} if with_outcomes else {}
    return records.make_record(method, params={}, seed=seed, task=task, testbed="tb",
                               metrics={"acc": oc.acc(lost), f"acc:{task}": oc.acc(lost),
                                        f"norm_acc:{task}": oc.acc(lost) / 0.9}, **out, **extra)


def test_packed_and_has_outcomes_read_dicts_rows_and_frames():
    good, bare = _rec("perturb", "a"), _rec("perturb", "a", with_outcomes=False)
    assert set(intervals.packed(good)) == {"a"} and intervals.packed(bare) is None
    frame = records.records_frame([good, bare])
    rows = [r for _, r in frame.iterrows()]
    assert intervals.packed(rows[0]) is not None and intervals.packed(rows[1]) is None
    assert not intervals.has_outcomes(frame) and intervals.has_outcomes(frame.iloc[:1])
    assert not intervals.has_outcomes([]) and not intervals.has_outcomes(records.records_frame([bare]))
    assert intervals.field(rows[0], "metrics.acc") == pytest.approx(oc.acc())
    assert intervals.field(rows[1], "outcomes.test", "none") == "none"


def test_stacked_joins_a_seeds_tasks_and_refuses_records_without_outcomes():
    frame = records.records_frame([_rec("perturb", t, lost=n, draw=0) for t, n in (("a", 4), ("b", 8))]
                                  + [_rec("finetuned", t) for t in ("a", "b")])
    lbw = paired.stacked(frame[frame["method"] == "perturb"], by=["draw"])
    ft = paired.stacked(frame[frame["method"] == "finetuned"])
    assert len(lbw) == 1 and list(lbw[0]["outcomes"]["test"]) == ["a", "b"]
    assert intervals.contrast(ft, lbw).estimate == pytest.approx(100 * (4 + 8) / 2 / oc.N)
    bare = records.records_frame([_rec("perturb", "a", with_outcomes=False)])
    with pytest.raises(paired.MissingOutcomes, match=intervals.NO_OUTCOMES):
        paired.stacked(bare)


def test_rows_restrict_and_weights():
    r = records.make_record("iso_c", params={}, seed=1, suite="8", testbed="tb",
                            metrics={"acc:a": 0.9, "norm_acc:a": 1.0, "acc:b": 0.8, "norm_acc:b": 0.9},
                            outcomes={"test": {**oc.outcomes("a")["test"], **oc.outcomes("b")["test"]}})
    frame = records.records_frame([r])
    assert len(paired.rows(frame, suite="8", method="iso_c")) == 1 and paired.rows(frame, group="early") == []
    cut = paired.restrict(paired.rows(frame, suite="8")[0], ["b"], testbed="shared")
    assert cut["testbed"] == "shared" and list(cut["outcomes"]["test"]) == ["b"]
    assert cut["metrics"] == {"acc:b": 0.8, "norm_acc:b": 0.9}
    with pytest.raises(KeyError, match="no outcomes for \\['c'\\]"):
        paired.restrict(r, ["c"])
    assert paired.weights(0.5) == (1, 2) and paired.weights(1.0) == (1, 1)
    with pytest.raises(ValueError):
        paired.weights(1.5)
