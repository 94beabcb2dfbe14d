"""How a member's returns on a set of tasks become the one fitness the search maximises.

A training's return is a statistic of its learning curve (``statistic_fn``). Given reference returns
per task, ``{"base": [...], "low": [...]}``, each return is normalised to ``(R - low) / (base - low)``:
the hand-designed baseline's return scores 1 and a random policy's 0, so that tasks whose returns
differ in scale weigh alike (docs/experiments.md). The scores are then reduced over tasks
(``AGGREGATES``), and that is the fitness.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

AGGREGATES = {"mean": jnp.mean, "median": jnp.median, "min": jnp.min}


def task_key(key: jax.Array, i: int) -> jax.Array:
    """The key task ``i`` trains from on a seed key (members, the control and the reference returns alike)."""
    return jax.random.fold_in(key, i) if i else key


def task_scores(trains: list, statistic: Callable, key: jax.Array) -> jax.Array:
    """Each task's ``statistic`` of its training's learning curve, task i trained from ``task_key(key, i)``: every
    task in one program. ``trains``: per task, ``train(key) -> (params, metrics)``."""
    return jnp.stack([statistic(train(task_key(key, i))[1]["episode_return"]) for i, train in enumerate(trains)])


def final_window_mean(curve, window: float):
    """The mean of the last ``window`` fraction (at least one point) of ``curve``'s last axis, a NumPy or
    JAX array: a training's final return."""
    n = max(1, math.ceil(window * curve.shape[-1]))
    return curve[..., -n:].mean(axis=-1)


def statistic_fn(name: str, window: float) -> Callable[[jax.Array], jax.Array]:
    return {"final": lambda curve: final_window_mean(curve, window), "auc": lambda curve: curve.mean(axis=-1)}[name]


def statistic_words(name: str, window: float) -> str:
    """What ``statistic_fn(name, window)`` measures, in words."""
    return {"final": f"mean episode return over the last {window:.0%} of updates",
            "auc": "mean episode return over all updates"}[name]


def spans(reference: dict) -> np.ndarray:
    """``base - low`` per task, kept positive so that a higher return always scores higher: where the
    baseline is no better than random play (a budget too short to learn) the gap's size is used, and
    1 where there is no gap at all. ``degenerate`` names those tasks."""
    low, base = np.asarray(reference["low"], np.float64), np.asarray(reference["base"], np.float64)
    gap = np.abs(base - low)
    return np.where(gap > 1e-6, gap, 1.0).astype(np.float32)


def degenerate(reference: dict, alpha: float = 0.05) -> list[str]:
    """Tasks whose baseline does not clear random play beyond noise (one-sided Welch p >= ``alpha``, as
    ``metarl.evaluate`` flags a pair): their normalised score has no scale. Each side's spread is read back
    from its stored 95% t-interval over ``num_seeds`` seeds; a reference stored with means alone compares
    the means."""
    if "base_ci" not in reference:
        return [n for n, b, lo in zip(reference["tasks"], reference["base"], reference["low"]) if not b > lo]
    import scipy.stats
    n = reference["num_seeds"]
    sd = lambda ci: (ci[1] - ci[0]) / (2 * scipy.stats.t.ppf(0.975, n - 1)) * math.sqrt(n)  # noqa: E731
    return [name for name, b, lo, b_ci, lo_ci in zip(reference["tasks"], reference["base"], reference["low"],
                                                     reference["base_ci"], reference["low_ci"])
            if not scipy.stats.ttest_ind_from_stats(b, max(sd(b_ci), 1e-12), n, lo, max(sd(lo_ci), 1e-12), n,
                                                    equal_var=False, alternative="greater").pvalue < alpha]


def normalize(raw, reference: Optional[dict]):
    """``(raw - low) / (base - low)`` per task along the last axis; raw when ``reference`` is None."""
    if reference is None:
        return raw
    low = np.asarray(reference["low"], np.float32)
    return (raw - low) / spans(reference)


def make_aggregate(reference: Optional[dict], how: str = "mean") -> Callable:
    """``aggregate(raw (popsize, tasks)) -> (fitness (popsize,), scores (popsize, tasks))`` for the
    evolution driver: scores normalised by ``reference`` (None: raw), then reduced over tasks."""
    reduce = AGGREGATES[how]

    def aggregate(raw):
        scores = normalize(raw, reference)
        return reduce(scores, axis=-1), scores

    return aggregate
