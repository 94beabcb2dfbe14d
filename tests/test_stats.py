"""metarl.stats gives rliable's numbers: the same IQM, probability of improvement and stratified
bootstrap intervals, from the same random draws (rliable draws its bootstrap indices from numpy's
global generator; metarl.stats from the RandomState it is given)."""
import warnings

import numpy as np
import pytest

from metarl import evaluate, payoff, report as report_lib, stats

rliable_library = pytest.importorskip("rliable.library")
rliable_metrics = pytest.importorskip("rliable.metrics")

REPS = 300


def scores():
    rng = np.random.default_rng(3)
    learned = rng.normal(1.0, 0.4, (7, 3))
    baseline = rng.normal(0.9, 0.4, (5, 3))
    baseline[:, 2] = learned[:5, 2]  # a tie within a task
    return learned, baseline


LEARNED, BASE, PER_TASK = "learned schedule", "tuned baseline: PPO", "tuned per task at k=16"


def fabricated(tasks: dict, seed: int = 0) -> dict:
    """A held-out evaluation as ``metarl.evaluate`` writes it before its statistics, from normal final returns:
    ``tasks``: {name: {side: (mean, sd), "random": (mean, sd), "n": seeds}}."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, spec in tasks.items():
        draw = {side: rng.normal(*spec[side], spec["n"]) for side in (LEARNED, BASE, PER_TASK, "random")}
        rows.append({"task": name, "split": "held-out", "total_timesteps": spec.get("frames", 4096),
                     "random_return": float(draw["random"].mean()), "random_returns": draw.pop("random").tolist(),
                     "sides": {side: evaluate.summarise(v) for side, v in draw.items()}})
    return {"sides": [{"label": LEARNED, "role": "learned"}, {"label": BASE, "role": "baseline"},
                      {"label": PER_TASK, "role": "per_task"}], "tasks": rows, "per_task": {"ks": [16]},
            "compute": {"learned": {"search": 100, "tuning": 50}, "baseline": {"tuning": 150}}}


def task(learned, base=(10.0, 1.0), per_task=(12.0, 1.0), random=(0.0, 1.0), n=16, **extra) -> dict:
    return {LEARNED: learned, BASE: base, PER_TASK: per_task, "random": random, "n": n, **extra}


def test_bootstrap_with_an_exact_normaliser_gives_rliables_iqm_interval():
    # A baseline of 1 on every seed and random play at 0: the normalised scores are the raw ones, and the
    # stratified bootstrap interval of the IQM is rliable's (other draws: equal to sampling error).
    learned, _ = scores()
    raw = {"learned": learned, "baseline": np.ones_like(learned)}
    point, draws = stats.bootstrap(lambda n: [stats.iqm(n["learned"])], raw, np.zeros(3), "baseline", 4000,
                                   np.random.RandomState(0), paired=False)
    np.random.seed(0)
    with warnings.catch_warnings():  # rliable hands arch a RandomState, which arch 7 calls deprecated
        warnings.simplefilter("ignore", FutureWarning)
        theirs, ci = rliable_library.get_interval_estimates(
            {"learned": learned}, lambda x: np.array([rliable_metrics.aggregate_iqm(x)]), reps=4000)
    assert point[0] == pytest.approx(theirs["learned"][0], abs=1e-12)
    np.testing.assert_allclose(stats.percentile(draws)[0], ci["learned"][:, 0], atol=0.03)


def test_the_baselines_noise_widens_the_interval_against_a_normaliser_taken_as_exact():
    report = fabricated({f"t{i}": task((10.0, 0.2), base=(10.0, 4.0)) for i in range(3)})
    agg = evaluate.restate(report, frames_per_training=1000)["aggregate"]["held-out"]
    # the same learned scores, normalised once by the baseline's sample mean, resampled alone (the old interval)
    rows = report["tasks"]
    fixed = np.stack([np.asarray(r["sides"][LEARNED]["final_returns"]) for r in rows], axis=1)
    fixed = (fixed - [r["random_return"] for r in rows]) / [r["sides"][BASE]["mean"] - r["random_return"] for r in rows]
    _, draws = stats.bootstrap(lambda n: [stats.iqm(n["x"])], {"x": fixed, "one": np.ones_like(fixed)}, np.zeros(3),
                               "one", 2000, np.random.RandomState(0))
    exact = stats.percentile(draws)[0]
    assert agg["iqm_learned_ci95"][1] - agg["iqm_learned_ci95"][0] > 3 * (exact[1] - exact[0])
    low, high = agg["iqm_difference_ci95"]
    assert low < agg["iqm_difference"] < high and low < 0 < high


def test_a_pair_whose_baseline_does_not_clear_random_play_is_flagged_and_left_out():
    report = evaluate.restate(fabricated({"A": task((11.0, 1.0)), "B": task((3.0, 1.0), base=(0.1, 1.0)),
                                          "C": task((11.0, 1.0))}), frames_per_training=1000)
    assert [r["degenerate"] for r in report["tasks"]] == [False, True, False]
    agg = report["aggregate"]["held-out"]
    assert agg["tasks"] == 2 and agg["left_out"] == ["B"] and agg["with_left_out"]["tasks"] == 3
    # B's baseline barely above random play: the learned side scores about 30 there, which swings the aggregate
    assert agg["with_left_out"]["iqm_learned"] > agg["iqm_learned"] + 1
    assert report["payoff"]["tasks"] == ["A", "C"] and report["payoff"]["flagged"] == ["B"]
    roles = {side["role"]: side["label"] for side in report["sides"]}
    text = "\n".join(report_lib._table(report, roles) + report_lib._aggregate_lines(report, roles))
    assert "flagged: B: the baseline does not clear random play beyond noise" in text
    assert "(2 task(s); B flagged, left out)" in text and "(flagged in: " in text


def test_a_low_power_pair_does_not_pass_non_inferiority():
    # the same 3% deficit: on 4 noisy seeds nothing is shown; on 64 precise ones, "not worse by 0.05" is
    low = evaluate.restate(fabricated({"A": task((9.7, 3.0), base=(10.0, 3.0), n=4)}), frames_per_training=1000)
    high = evaluate.restate(fabricated({"A": task((9.7, 0.1), base=(10.0, 0.1), n=64)}), frames_per_training=1000)
    assert low["payoff"]["not_worse_pairs"] == [] and not low["payoff"]["by_k"]["16"]["win"]["not_worse"]
    assert high["payoff"]["not_worse_pairs"] == ["A"] and high["payoff"]["by_k"]["16"]["win"]["not_worse"]
    # a clear 20% deficit is listed as worse beyond noise, and is not shown non-inferior
    worse = evaluate.restate(fabricated({"A": task((8.0, 0.5), base=(10.0, 0.5)), "B": task((10.0, 0.5))}),
                             frames_per_training=1000)["payoff"]
    assert worse["worse_pairs"] == ["A"] and "A" not in worse["not_worse_pairs"]


def test_the_recovered_share_has_fiellers_interval_or_says_how_often_it_is_undefined():
    # Fieller's bounds solve (a - r b)^2 = z^2 (Va - 2 r C + r^2 Vb)
    rng = np.random.default_rng(1)
    draws = rng.multivariate_normal([0.3, 0.6], [[0.01, 0.004], [0.004, 0.02]], 20000)
    bounds = stats.fieller(0.3, 0.6, draws)
    (va, c), (_, vb) = np.cov(draws.T)
    for r in bounds:
        assert (0.3 - r * 0.6) ** 2 == pytest.approx(1.959964 ** 2 * (va - 2 * r * c + r * r * vb), rel=1e-4)
    ratio = draws[:, 0] / draws[:, 1]   # far from 0 below: near the percentile interval of the ratio
    np.testing.assert_allclose(bounds, np.percentile(ratio, [2.5, 97.5]), atol=0.05)
    assert stats.fieller(0.3, 0.05, draws) is None   # a denominator not clear of 0: unbounded
    clear = evaluate.restate(fabricated({"A": task((11.0, 1.0)), "B": task((11.0, 1.0))}), frames_per_training=1000)
    b = clear["payoff"]["by_k"]["16"]
    assert b["recovered_undefined"] == 0.0 and b["recovered_ci95"][0] < b["recovered"] < b["recovered_ci95"][1]
    assert b["after"] is not None and set(b["after_per_pair"]) == {"A", "B"}
    # per-task tuning gains nothing beyond noise: no interval, and the share of undefined resamples is stated
    none = evaluate.restate(fabricated({"A": task((11.0, 1.0), per_task=(10.0, 1.0))}), frames_per_training=1000)
    b = none["payoff"]["by_k"]["16"]
    assert b["recovered_ci95"] is None and 0.02 < b["recovered_undefined"] < 0.98
    assert "Fieller; denominator <= 0 in " in "\n".join(payoff.lines(none["payoff"]))
    # a learned side below the baseline recovers nothing: no break-even anywhere
    below = evaluate.restate(fabricated({"A": task((9.0, 0.5)), "B": task((9.0, 0.5), frames=1 << 20)}),
                             frames_per_training=1000)["payoff"]["by_k"]["16"]
    assert below["recovered"] < 0 and below["after"] is None and not below["win"]["break_even"]
    assert below["after_without"] == {"task": "B", "after": None} and below["after_per_pair"] == {"A": None, "B": None}


def test_the_pick_prints_its_interval_adjusted_for_the_choice():
    from metarl.stages import _say_pick

    rows = [{"candidate": "top 1", "validation_fitness": 0.5, "validation_ci95": [0.41, 0.59],
             "validation_ci95_best_of": [0.37, 0.63]},
            {"candidate": "search mean", "validation_fitness": 0.4, "validation_ci95": [0.3, 0.5],
             "validation_ci95_best_of": [0.26, 0.54]}]
    said = []
    _say_pick({"seeds": 8, "picked": "top 1", "candidates": rows}, said.append, "picked")
    assert "fitness 0.500 [0.370, 0.630] (adjusted for the best of 2; " in said[0]
    assert "0.410" not in said[0] and "0.590" not in said[0]


def test_estimators_equal_rliable():
    learned, baseline = scores()
    assert stats.iqm(learned) == pytest.approx(rliable_metrics.aggregate_iqm(learned), abs=1e-15)
    assert stats.probability_of_improvement(learned, baseline) == pytest.approx(
        rliable_metrics.probability_of_improvement(learned, baseline), abs=1e-15)
    assert stats.probability_of_improvement(baseline, baseline) == 0.5


def test_t_interval_of_a_constant_sample_is_the_constant_and_of_one_value_nan():
    assert stats.t_bounds(np.full(4, 500.0)) == [500.0, 500.0]
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):   # numpy's, of a standard deviation of one value
        assert np.isnan(stats.t_bounds(np.array([1.0]))).all()
    low, high = stats.t_bounds(np.array([1.0, 2.0, 3.0, 4.0]))
    assert low == pytest.approx(2.5 - 3.182446 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-5) and high > 2.5


def test_welch_at_a_ceiling_gives_its_p_without_scipys_precision_warning():
    # CartPole at 500 on every seed on one side: scipy warns of precision loss although the variance is exactly 0.
    ceiling, other = np.full(16, 500.0), np.r_[np.full(12, 500.0), 480.0, 470.0, 490.0, 495.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate.compare(ceiling, other)
        paired = stats.t_test(ceiling, other, paired=True).pvalue
        p = stats.t_test(ceiling, other, alternative="less").pvalue
    assert not [w for w in caught if "Precision loss" in str(w.message)]
    assert 0.0 < result["welch_p"] < 1.0 and result["welch_df"] == pytest.approx(15.0)
    assert p == pytest.approx(1.0 - result["welch_p"] / 2)   # one-sided (less) of a positive t
    assert result["paired_p"] == paired and 0.0 < paired < 1.0
    # both sides the same on every seed (before any update, say): no t to compute, and no difference
    assert evaluate.compare(ceiling, ceiling)["paired_p"] == 1.0 and evaluate.compare(ceiling + 1, ceiling)["paired_p"] == 0


def test_headroom_resamples_tunings_as_clusters_and_adjusts_for_its_tests():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "headroom.py"
    spec = importlib.util.spec_from_file_location("headroom", path)
    headroom = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headroom)
    # 3 tunings whose picks land far apart (seed i trained with tuning i % 3), each tight within
    rng = np.random.default_rng(0)
    a = np.array([[10.0, 20.0, 30.0][i % 3] + rng.normal(0, 0.5) for i in range(16)])
    clustered = headroom.resampled_means(a, 3, np.random.RandomState(0))
    plain = headroom.resampled_means(a, 1, np.random.RandomState(0))   # seeds alone: the tunings' spread unseen
    assert clustered.std() > 2 * plain.std() and abs(plain.mean() - a.mean()) < 0.1
    sides = {"per task": {"final_returns": a.tolist()}, "once": {"final_returns": rng.normal(18, 1, 16).tolist()}}
    g = headroom.gain({"sides": sides, "random_return": 0.0}, "per task", "once", tunings=3)
    assert g["ci_family"][0] < g["ci95"][0] < g["gain"] < g["ci95"][1] < g["ci_family"][1]
    assert headroom.FAMILY == 30   # a pair wins if any of its k does: every (pair, k) is a test of the family
