"""95 % intervals for the gains the book reports, from per-example test outcomes.

Every evaluated model's record keeps which test examples it got right (:mod:`pactlib.outcomes`).
Two merges evaluated on the same examples are compared example by example. For one fine-tuning
seed s, a contrast "A − B" is

    g_s = 100 · (1/T) Σ_t (1/n_t) Σ_i (a_sti − b_sti) / f_st        (points)

with a, b ∈ {0, 1} the outcomes of A and B on example i of task t, and f_st = 1 (absolute
accuracy) or the fine-tuned model's test accuracy on t (normalized accuracy, book/method.md,
protocol; held fixed as the normalizer's definition). The estimate is the mean of g_s over seeds.

Its standard error has two parts (book/method.md, "How sure is a number"):

- **test examples**: a paired bootstrap over the test examples, stratified by task (each task's
  examples resampled with replacement, :func:`scipy.stats.bootstrap` with one sample per task), of
  the seed-averaged per-example differences — the seeds are evaluated on the same examples, so one
  resampling serves every seed;
- **seeds**: with ≥ :data:`MIN_SEEDS` seeds, the variance of g_s over seeds divided by their
  number (fine-tuning randomness and the α choice, which the fixed test set does not show).

The two add: SE² = SE²_examples + SE²_seeds; the interval is estimate ± q·SE, with q the 97.5 %
quantile of Student's t at the Welch–Satterthwaite degrees of freedom (the normal quantile when
there is no seed part). Bouthillier et al., *Accounting for Variance in Machine Learning
Benchmarks* (MLSys 2021), argue for counting both sources; Efron & Tibshirani (1993) for the
bootstrap.

    iv = contrast(pact_records, plain_records, metric="norm_acc")
    iv.estimate, iv.lo, iv.hi        # points
    iv.text()                        # '+0.54 [−0.71, +1.79]'
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Interval", "MIN_SEEDS", "LEVEL", "N_RESAMPLES", "NO_OUTCOMES", "contrast", "difference", "point",
           "over_seeds", "needed", "fmt", "field", "packed", "has_outcomes"]

#: Seeds from which the spread over seeds enters an interval.
MIN_SEEDS = 3
#: The intervals' coverage.
LEVEL = 0.95
#: Bootstrap resamples per interval.
N_RESAMPLES = 2000
#: What a verdict says when its records carry no per-example outcomes (made before they were kept).
NO_OUTCOMES = "records without per-example outcomes: recompute"


@dataclass(frozen=True)
class Interval:
    """A 95 % interval around an estimate (points unless said otherwise).

    Attributes:
        estimate, lo, hi: the estimate and the interval's ends.
        se: the standard error; ``se_examples`` and ``se_seeds`` its parts (SE² = sum of squares).
        n_examples: test examples per task behind it (the smallest task's count; 0: no outcomes).
        n_seeds: fine-tuning seeds behind it.
        df: degrees of freedom of the quantile (``inf``: normal).
    """

    estimate: float
    lo: float
    hi: float
    se: float
    se_examples: float = 0.0
    se_seeds: float = 0.0
    n_examples: int = 0
    n_seeds: int = 1
    df: float = math.inf

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def text(self, digits: int = 2) -> str:
        """``'+0.54 [−0.71, +1.79]'``."""
        return f"{fmt(self.estimate, digits)} [{fmt(self.lo, digits)}, {fmt(self.hi, digits)}]"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["df"] = None if math.isinf(self.df) else self.df
        return d


def fmt(x: float, digits: int = 2) -> str:
    """A signed number with a true minus sign: ``+0.54``, ``−0.71``."""
    s = f"{x:+.{digits}f}"
    return s.replace("-", "−")


def _quantile(df: float) -> float:
    from scipy import stats

    p = 0.5 + LEVEL / 2
    return float(stats.norm.ppf(p) if math.isinf(df) else stats.t.ppf(p, df))


def _combine(estimate: float, se_ex: float, se_seed: float, n_ex: int, n_seeds: int) -> Interval:
    se = math.hypot(se_ex, se_seed)
    if se_seed > 0:
        df = se ** 4 * (n_seeds - 1) / se_seed ** 4  # Welch–Satterthwaite; the bootstrap part counts as df = inf
    else:
        df = math.inf
    q = _quantile(df)
    return Interval(float(estimate), float(estimate - q * se), float(estimate + q * se), float(se),
                    float(se_ex), float(se_seed), int(n_ex), int(n_seeds), float(df))


def point(value: float, *, n_seeds: int = 1) -> Interval:
    """A quantity without sampling error (a statistic of the checkpoints themselves): [v, v]."""
    return Interval(float(value), float(value), float(value), 0.0, n_seeds=n_seeds)


def over_seeds(values: Sequence[float]) -> Interval:
    """The mean of per-seed values (no per-example outcomes behind them) with its t interval over
    seeds; one value or fewer than :data:`MIN_SEEDS` gives :func:`point` of the mean."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        raise ValueError("over_seeds needs at least one value")
    if v.size < MIN_SEEDS:
        return point(float(v.mean()), n_seeds=int(v.size))
    se = float(v.std(ddof=1) / math.sqrt(v.size))
    return _combine(float(v.mean()), 0.0, se, 0, int(v.size)) if se > 0 else point(float(v.mean()), n_seeds=int(v.size))


def field(rec, name: str, default=None):
    """Field ``name`` of a record: a dict (``"metrics"`` nested) or a row of
    :func:`pactlib.book.records.records_frame` (``"metrics.acc"`` flat); ``default`` when absent,
    None or NaN."""
    if isinstance(rec, Mapping):
        return rec.get(name, default)
    try:  # a row of pactlib.book.records.records_frame
        v = rec[name]
    except (KeyError, IndexError):
        return default
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def packed(rec) -> Mapping | None:
    """A record's per-example test outcomes, ``{task: packed}`` (:mod:`pactlib.outcomes`), or None
    when it has none (records made before they were kept)."""
    p = field(rec, "outcomes.test")
    if p is None:
        o = field(rec, "outcomes")
        p = o.get("test") if isinstance(o, Mapping) else None
    return p if isinstance(p, Mapping) and p else None


def has_outcomes(recs) -> bool:
    """Whether there are records and every one keeps per-example test outcomes (``recs``: records,
    rows, or a records frame)."""
    if hasattr(recs, "iterrows"):
        recs = [r for _, r in recs.iterrows()]
    return bool(len(recs)) and all(packed(r) is not None for r in recs)


def _outcomes(rec) -> dict[str, np.ndarray]:
    from pactlib.outcomes import unpack

    p = packed(rec)
    if p is None:
        raise ValueError(f"record of {field(rec, 'method')!r} (seed {field(rec, 'seed')}, testbed "
                         f"{field(rec, 'testbed')!r}) has no per-example test outcomes: recompute its chapter")
    return {t: unpack(v).numpy().astype(np.float64) for t, v in p.items()}


def _normalizers(rec, tasks) -> dict[str, float]:
    """f_t of a record: acc:<t> / norm_acc:<t> from its metrics (the fine-tuned test accuracy)."""
    out = {}
    for t in tasks:
        a, n = field(rec, f"metrics.acc:{t}"), field(rec, f"metrics.norm_acc:{t}")
        if a is None:
            m = field(rec, "metrics") or {}
            a, n = m.get(f"acc:{t}"), m.get(f"norm_acc:{t}")
        if a is None or n is None or n == 0:
            raise ValueError(f"record of {field(rec, 'method')!r} has no acc:{t} / norm_acc:{t} to normalize by")
        out[t] = float(a) / float(n) if a else math.nan
    return out


def _by_seed(recs) -> dict[Any, list]:
    out: dict[Any, list] = {}
    for r in recs:
        out.setdefault((field(r, "testbed"), field(r, "seed")), []).append(r)
    return out


def contrast(plus: Sequence, minus: Sequence, *, metric: str = "acc", scale: float = 100.0,
             normalizers: Sequence | None = None, seed: int = 0, n_resamples: int = N_RESAMPLES) -> Interval:
    """The 95 % interval of "mean of ``plus`` − mean of ``minus``" in test accuracy (points).

    Args:
        plus, minus: records (dicts or rows of a records frame) with per-example test outcomes,
            grouped by ``(testbed, seed)``: every group must have records on both sides, and the
            same tasks with the same example counts. Within a group the sides are averaged (e.g.
            the mean PACT gain over five base methods: five records a side).
        metric: ``"acc"`` (absolute) or ``"norm_acc"`` (each task's difference divided by the
            fine-tuned accuracy f_t, read from the records' ``acc:<t>`` / ``norm_acc:<t>``, or
            from ``normalizers``: records of the fine-tuned models, one per group).
        scale: 100 gives points.
        seed, n_resamples: of the bootstrap (the interval is a function of its inputs).

    Returns:
        An :class:`Interval` (module docstring for the method).

    Raises:
        ValueError: no common group, a group with one side missing, records without outcomes,
            tasks or example counts that differ, an unknown metric.
    """
    from scipy.stats import bootstrap

    if metric not in ("acc", "norm_acc"):
        raise ValueError(f"contrast: metric must be 'acc' or 'norm_acc', got {metric!r}")
    P, M = _by_seed(plus), _by_seed(minus)
    N = _by_seed(normalizers) if normalizers is not None else {}
    groups = sorted(set(P) | set(M), key=str)
    if not groups:
        raise ValueError("contrast: no records")
    missing = [g for g in groups if g not in P or g not in M]
    if missing:
        raise ValueError(f"contrast: (testbed, seed) {missing} have records on one side only")
    diffs, gains = [], []
    for g in groups:
        sides = []
        for recs in (P[g], M[g]):
            outs = [_outcomes(r) for r in recs]
            tasks = list(outs[0])
            for o in outs[1:]:
                if list(o) != tasks or any(o[t].size != outs[0][t].size for t in tasks):
                    raise ValueError(f"contrast: records of {g} differ in tasks or example counts")
            sides.append((tasks, {t: np.mean([o[t] for o in outs], axis=0) for t in tasks}, recs))
        (tp, ap, rp), (tm, am, _) = sides
        if tp != tm or any(ap[t].size != am[t].size for t in tp):
            raise ValueError(f"contrast: the two sides of {g} differ in tasks or example counts")
        if metric == "norm_acc":
            f = _normalizers(N[g][0], tp) if g in N else _normalizers(rp[0], tp)
        else:
            f = {t: 1.0 for t in tp}
        d = {t: scale * (ap[t] - am[t]) / f[t] / len(tp) for t in tp}  # per example, already / T
        diffs.append(d)
        gains.append(sum(float(v.mean()) for v in d.values()))
    tasks = list(diffs[0])
    same = all(list(d) == tasks and all(d[t].size == diffs[0][t].size for t in tasks) for d in diffs)
    testbeds = {g[0] for g in groups}
    if same and len(testbeds) == 1:  # one test set: resample it once for every seed
        samples = [np.mean([d[t] for d in diffs], axis=0) for t in tasks]
        var_ex = _boot_var(samples, bootstrap, seed, n_resamples)
    else:  # different test sets (e.g. suites): independent
        var_ex = sum(_boot_var([d[t] for t in d], bootstrap, seed, n_resamples) for d in diffs) / len(diffs) ** 2
    S = len(groups) if len(testbeds) == 1 else min(len([g for g in groups if g[0] == tb]) for tb in testbeds)
    est = float(np.mean(gains))
    var_seed = float(np.var(gains, ddof=1) / len(gains)) if len(testbeds) == 1 and len(gains) >= MIN_SEEDS else 0.0
    n_ex = min(v.size for d in diffs for v in d.values())
    return _combine(est, math.sqrt(var_ex), math.sqrt(var_seed), n_ex, S)


def _boot_var(samples, bootstrap, seed: int, n_resamples: int) -> float:
    """Bootstrap variance of Σ_t mean(samples[t]) with each task resampled on its own."""
    if all(np.all(s == s[0]) for s in samples):
        return 0.0  # constant per task: no sampling error (e.g. identical models)

    def stat(*xs, axis=-1):
        return sum(np.mean(x, axis=axis) for x in xs)

    res = bootstrap(tuple(samples), stat, n_resamples=n_resamples, vectorized=True, paired=False,
                    method="percentile", rng=np.random.default_rng(seed))
    return float(res.standard_error) ** 2


def difference(a: Interval, b: Interval) -> Interval:
    """``a − b`` for estimates from independent data (e.g. two suites' test sets): SEs add in
    quadrature, each part on its own."""
    se_ex, se_seed = math.hypot(a.se_examples, b.se_examples), math.hypot(a.se_seeds, b.se_seeds)
    n_seeds = min(a.n_seeds, b.n_seeds)
    iv = _combine(a.estimate - b.estimate, se_ex, 0.0, min(a.n_examples, b.n_examples), n_seeds)
    if se_seed > 0:
        se = math.hypot(se_ex, se_seed)
        df = se ** 4 / sum(s ** 4 / (i.n_seeds - 1) for s, i in ((a.se_seeds, a), (b.se_seeds, b)) if s > 0)
        q = _quantile(df)
        est = a.estimate - b.estimate
        iv = Interval(est, est - q * se, est + q * se, se, se_ex, se_seed, iv.n_examples, n_seeds, df)
    return iv


def needed(iv: Interval, threshold: float = 0.0) -> dict[str, Any] | None:
    """How much more data would decide a condition whose interval spans ``threshold``, at the
    effect observed (a power estimate at 50 %: the interval's end would just reach the threshold).

    Returns:
        None when the interval does not span the threshold; else ``{"factor": k, "examples_per_task":
        N, "seeds": S or None, "text": ...}``: ``k`` times the data on every source (test examples
        and, when the seed part counts, seeds) shrinks the SE by √k. ``factor`` is ``inf`` when the
        effect equals the threshold.
    """
    if not (iv.lo <= threshold <= iv.hi) or iv.se == 0:
        return None
    gap = abs(iv.estimate - threshold)
    q = _quantile(math.inf)
    if gap < 1e-12:
        return {"factor": math.inf, "examples_per_task": None, "seeds": None,
                "text": "the effect sits on the threshold: no amount of data decides it"}
    k = (q * iv.se / gap) ** 2
    n = math.ceil(iv.n_examples * k) if iv.n_examples else None
    s = math.ceil(iv.n_seeds * k) if iv.se_seeds > 0 else None
    parts = [f"≈ {n:,} test examples per task" if n else None, f"{s} seeds" if s else None]
    text = f"needs ≈ {k:.1f}× the data to decide at this effect ({' and '.join(p for p in parts if p)})" if any(parts) \
        else f"needs ≈ {k:.1f}× the data to decide at this effect"
    return {"factor": k, "examples_per_task": n, "seeds": s, "text": text}
