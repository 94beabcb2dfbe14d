"""Aggregate statistics over tasks (scores: runs x tasks) with stratified bootstrap confidence intervals, in numpy
and scipy, as rliable computes them (Agarwal et al., 2021): given a ``RandomState`` seeded as numpy's global
generator, ``interval`` returns ``rliable.library.get_interval_estimates``'s numbers (tests/test_stats.py)."""
from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
from scipy import special


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean over all runs and tasks: the mean of the middle 50% (a 25% trimmed mean)."""
    import scipy.stats  # a second to import, which a run (it needs only ``t_interval``) does without
    return float(scipy.stats.trim_mean(scores, proportiontocut=0.25, axis=None))


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) per task by Mann-Whitney U (ties count half; equal columns: 0.5), averaged over tasks."""
    import scipy.stats  # as in iqm
    per_task = [0.5 if np.array_equal(a, b) else
                scipy.stats.mannwhitneyu(a, b, alternative="greater").statistic / (len(a) * len(b))
                for a, b in zip(x.T, y.T)]
    return float(np.mean(per_task))


def welch(a: np.ndarray, b: np.ndarray, **kwargs):
    """scipy's Welch t-test (unequal variances). A side with one value on every seed (a task at its ceiling) makes
    scipy warn of precision loss, though its zero variance is exact; the p it returns is the test's."""
    import scipy.stats  # as in iqm
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        return scipy.stats.ttest_ind(a, b, equal_var=False, **kwargs)


def t_interval(x: np.ndarray, axis: int = 0, level: float = 0.95):
    """Mean's t-based confidence interval over ``axis`` (NaN where fewer than 2 values)."""
    x = np.asarray(x, dtype=float)
    n, mean = np.sum(np.isfinite(x), axis=axis), np.nanmean(x, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = special.stdtrit(np.maximum(n - 1, 1), 0.5 + level / 2) * np.nanstd(x, axis=axis, ddof=1) / np.sqrt(n)
    half = np.where(n >= 2, half, np.nan)
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


def interval(statistic: Callable[..., float], scores: tuple[np.ndarray, ...], reps: int,
             rng: np.random.RandomState, size: float = 0.95) -> tuple[float, list[float]]:
    """``(statistic(*scores), [lower, upper])``: a stratified bootstrap interval, ``reps`` draws (NaN ones left out)."""
    results = [statistic(*[s[rng.choice(s.shape[0], s.shape, replace=True), np.arange(s.shape[1])] for s in scores])
               for _ in range(reps)]
    alpha = (1.0 - size) / 2
    lower, upper = np.nanpercentile(results, [100 * alpha, 100 * (1.0 - alpha)])
    return float(statistic(*scores)), [float(lower), float(upper)]
