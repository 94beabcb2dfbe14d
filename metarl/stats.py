"""Aggregate statistics over tasks (scores: runs x tasks) with stratified bootstrap confidence intervals, in numpy
and scipy, as rliable computes them (Agarwal et al., 2021; tests/test_stats.py checks against it), except that every
side's seeds and the mean that normalises are resampled together (``bootstrap``)."""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import numpy as np
import scipy.stats


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean over all runs and tasks: the mean of the middle 50% (a 25% trimmed mean)."""
    return float(scipy.stats.trim_mean(scores, proportiontocut=0.25, axis=None))


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) per task (ties count half), averaged over tasks: rliable's Mann-Whitney U / (n m), vectorised."""
    return float(np.mean((x[:, None] > y[None]) + 0.5 * (x[:, None] == y[None])))


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given."""
    p = np.asarray(p, float)
    order = np.argsort(p)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order]))
    return adjusted[np.argsort(order)]


def t_test(a: np.ndarray, b: np.ndarray, paired: bool = False, **kwargs):
    """scipy's Welch t-test (unequal variances), or with ``paired`` its paired one. A side with one value on every
    seed (a task at its ceiling) makes scipy warn of precision loss, though its zero variance is exact; the p it
    returns is the test's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        if paired:
            return scipy.stats.ttest_rel(a, b, **kwargs)
        return scipy.stats.ttest_ind(a, b, equal_var=False, **kwargs)


def t_interval(x: np.ndarray, axis: int = 0, level: float = 0.95):
    """Mean's t-based confidence interval over ``axis`` (NaN where fewer than 2 values)."""
    x = np.asarray(x, dtype=float)
    n, mean = np.sum(np.isfinite(x), axis=axis), np.nanmean(x, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):   # t.ppf is NaN below 2 values; a zero spread stays 0
        half = scipy.stats.t.ppf(0.5 + level / 2, n - 1) * np.nanstd(x, axis=axis, ddof=1) / np.sqrt(n)
    return mean - half, mean + half


def t_bounds(x: np.ndarray, level: float = 0.95) -> list[float]:
    """``t_interval`` of a sample as the ``[low, high]`` the reports store."""
    return [float(b) for b in t_interval(x, level=level)]


def bracket(bounds, spec: str = ".3f") -> str:
    """An interval as the reports print it: ``[low, high]``, each bound formatted by ``spec``."""
    return f"[{bounds[0]:{spec}}, {bounds[1]:{spec}}]"


def best_finite(values: np.ndarray) -> int:
    """The index of the largest value, a non-finite one (diverged) never chosen."""
    return int(np.argmax(np.where(np.isfinite(values), values, -np.inf)))


def bootstrap(statistic: Callable[[dict], list], raw: dict, random: np.ndarray, baseline: str, reps: int,
              rng: np.random.RandomState, paired: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(statistic(scores), draws)``: ``statistic`` of each side's normalised scores (seeds x tasks) and of ``reps``
    stratified resamples of every side's raw returns, the normalising baseline mean recomputed in each (see
    docs/results.md).
    ``paired``: one draw of seed indices for every side, else one per side (whose seeds may then differ in number)."""
    from metarl.outer_loops.fitness import spans
    n, tasks = raw[baseline].shape

    def scores(sides: dict) -> np.ndarray:
        span = np.asarray(spans({"base": np.nanmean(sides[baseline], axis=0), "low": random}), float)
        return np.asarray(statistic({k: np.nan_to_num((v - random) / span, nan=0.0) for k, v in sides.items()}), float)
    draws = []
    for _ in range(reps):
        shared = rng.randint(n, size=(n, tasks))
        draws.append(scores({k: v[shared if paired else rng.randint(len(v), size=v.shape), np.arange(tasks)]
                             for k, v in raw.items()}))
    return scores(raw), np.asarray(draws)


def percentile(draws: np.ndarray, level: float = 0.95) -> list[list[float]]:
    """Each column's percentile interval, ``[low, high]``, NaN draws left out."""
    return np.nanpercentile(draws, [50 - 50 * level, 50 + 50 * level], axis=0).T.tolist()


def fieller(num: float, den: float, draws: np.ndarray, level: float = 0.95) -> Optional[list[float]]:
    """Fieller's interval for ``num / den``, their (co)variances from bootstrap ``draws`` (reps x 2); None (unbounded)
    where the denominator is not clear of 0 at ``level``, so that no finite interval holds the ratio."""
    (var_num, cov), (_, var_den) = np.cov(np.asarray(draws, float).T)
    z2 = scipy.stats.norm.ppf(0.5 + level / 2) ** 2
    a, b, c = den * den - z2 * var_den, num * den - z2 * cov, num * num - z2 * var_num
    if not a > 0:
        return None
    root = np.sqrt(max(b * b - a * c, 0.0))
    return [float((b - root) / a), float((b + root) / a)]
