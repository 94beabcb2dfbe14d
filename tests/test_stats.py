"""metarl.stats gives rliable's numbers: the same IQM, probability of improvement and stratified
bootstrap intervals, from the same random draws (rliable draws its bootstrap indices from numpy's
global generator; metarl.stats from the RandomState it is given)."""
import warnings

import numpy as np
import pytest

from metarl import evaluate, stats

rliable_library = pytest.importorskip("rliable.library")
rliable_metrics = pytest.importorskip("rliable.metrics")

REPS = 300


def scores():
    rng = np.random.default_rng(3)
    learned = rng.normal(1.0, 0.4, (7, 3))
    baseline = rng.normal(0.9, 0.4, (5, 3))
    baseline[:, 2] = learned[:5, 2]  # a tie within a task
    return learned, baseline


def rliable_aggregate(learned, baseline, seed):
    """evaluate.aggregate's numbers, computed by rliable."""
    np.random.seed(seed)
    with warnings.catch_warnings():  # rliable hands arch a RandomState, which arch 7 calls deprecated
        warnings.simplefilter("ignore", FutureWarning)
        point, ci = rliable_library.get_interval_estimates(
            {"learned": learned, "baseline": baseline},
            lambda x: np.array([rliable_metrics.aggregate_iqm(x)]), reps=REPS)
        p_point, p_ci = rliable_library.get_interval_estimates(
            {"p": (learned, baseline)}, rliable_metrics.probability_of_improvement, reps=REPS)
    return {"tasks": learned.shape[1],
            "iqm_learned": point["learned"][0], "iqm_learned_ci95": list(ci["learned"][:, 0]),
            "iqm_baseline": point["baseline"][0], "iqm_baseline_ci95": list(ci["baseline"][:, 0]),
            "probability_of_improvement": p_point["p"], "probability_of_improvement_ci95": list(np.ravel(p_ci["p"]))}


def test_aggregate_equals_rliable_on_a_fixed_input():
    learned, baseline = scores()
    ours = evaluate.aggregate(learned, baseline, reps=REPS)  # seeded with RandomState(0)
    theirs = rliable_aggregate(learned, baseline, seed=0)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-12, atol=1e-12, err_msg=key)
    # Seeded: the same scores give the same intervals; another seed gives others.
    assert evaluate.aggregate(learned, baseline, reps=REPS) == ours
    assert stats.interval(stats.iqm, (learned,), REPS, np.random.RandomState(1))[1] != ours["iqm_learned_ci95"]


def test_estimators_equal_rliable():
    learned, baseline = scores()
    assert stats.iqm(learned) == pytest.approx(rliable_metrics.aggregate_iqm(learned), abs=1e-15)
    assert stats.probability_of_improvement(learned, baseline) == pytest.approx(
        rliable_metrics.probability_of_improvement(learned, baseline), abs=1e-15)
    assert stats.probability_of_improvement(baseline, baseline) == 0.5


def test_welch_at_a_ceiling_gives_its_p_without_scipys_precision_warning():
    # CartPole at 500 on every seed on one side: scipy warns of precision loss although the variance is exactly 0.
    ceiling, other = np.full(16, 500.0), np.r_[np.full(12, 500.0), 480.0, 470.0, 490.0, 495.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate.compare(ceiling, other)
        p = stats.welch(ceiling, other, alternative="less").pvalue
    assert not [w for w in caught if "Precision loss" in str(w.message)]
    assert 0.0 < result["welch_p"] < 1.0 and result["welch_df"] == pytest.approx(15.0)
    assert p == pytest.approx(1.0 - result["welch_p"] / 2)   # one-sided (less) of a positive t
