"""The search's signal (fitness spread against seed noise) and the baseline as a control in every
generation: the statistics on populations with known variances, and a tiny real run with the control."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import TINY, evolve

from metarl import inspect
from metarl.config import ConfigError, load, search_differences
from metarl.outer_loops.evolution import (CONTROL_FIELDS, SIGNAL_FIELDS, ESConfig, Evolution, signal_stats,
                                          update_signal)
from metarl.outer_loops.evolution import NOISE_THRESHOLD, noise_warning


def test_signal_statistics_of_a_population_with_known_variances():
    # Member means 0, 1, 2, 3 (V_b = var([0, 1, 2, 3], ddof=1) = 5/3); each member's two seeds are
    # its mean -+ 0.5 (var over seeds, ddof=1: 0.5), so V_w = 0.5 and the noise of a mean 0.25.
    means = jnp.array([0.0, 1.0, 2.0, 3.0])
    f = jnp.stack([means - 0.5, means + 0.5], axis=1)
    stats = {k: float(v) for k, v in signal_stats(f).items()}
    assert stats["signal_between"] == pytest.approx(5 / 3)
    assert stats["signal_within"] == pytest.approx(0.5)
    assert stats["seed_noise"] == pytest.approx(0.25)
    assert stats["signal"] == pytest.approx((5 / 3 - 0.25) / (5 / 3))
    # All spread is noise: signal 0 (clipped), never negative.
    noisy = jnp.array([[0.0, 10.0], [10.0, 1.0], [5.0, 5.0]])  # means 5, 5.5, 5
    assert float(signal_stats(noisy)["signal"]) == 0.0
    # A member not finite on some seed is left out.
    with_nan = jnp.concatenate([f, jnp.array([[jnp.nan, 100.0]])])
    assert float(signal_stats(with_nan)["signal"]) == pytest.approx(stats["signal"])
    # One seed: no noise estimate; the spread is still measured.
    one = signal_stats(means[:, None])
    assert float(one["signal_between"]) == pytest.approx(5 / 3)
    assert all(np.isnan(float(one[k])) for k in ("signal_within", "seed_noise", "signal"))


def test_update_signal_splits_the_seeds():
    directions = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    # Half A says (1, 0), half B says (1, 1) (identity shaping): S = g_A.g_B, N = |g_A - g_B|^2 / 4.
    f = jnp.array([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.5], [0.0, -0.5]])
    g_a, g_b = np.array([1.0, 0.0]), np.array([1.0, 1.0])
    s, n = g_a @ g_b, np.sum((g_a - g_b) ** 2) / 4
    assert float(update_signal(f, directions)) == pytest.approx(s / (s + n))
    # Halves that disagree: no signal. One seed: not measured.
    opposed = jnp.array([[1.0, -1.0], [-1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    assert float(update_signal(opposed, directions)) == 0.0
    assert np.isnan(float(update_signal(f[:, :1], directions)))


def _member_plus_seed(params, key):
    # A member's part (its parameters' sum) plus seed noise that every member shares on a seed.
    return jnp.sum(params["x"]) + 3.0 * jax.random.normal(key)


def test_the_generation_measures_its_signal():
    evo = Evolution(ESConfig(popsize=8, std_init=0.5), {"x": jnp.zeros(3)}, _member_plus_seed, num_seeds=3)
    state = evo.init(jax.random.key(0))
    seed_keys = evo.generation_keys(state.key)[2]
    _, stats = evo.step(state)
    assert set(SIGNAL_FIELDS) <= set(stats) and not set(CONTROL_FIELDS) & set(stats)
    noise = np.asarray(jax.vmap(lambda k: 3.0 * jax.random.normal(k))(seed_keys))
    np.testing.assert_allclose(float(stats["signal_between"]), np.var(stats["fitness"], ddof=1), rtol=1e-4)
    np.testing.assert_allclose(float(stats["signal_within"]), np.var(noise, ddof=1), rtol=1e-4)
    np.testing.assert_allclose(float(stats["seed_noise"]), np.var(noise, ddof=1) / 3, rtol=1e-4)


def test_paired_fitness_is_member_minus_control_on_the_same_seeds():
    def control(key):
        return 2.0 + 3.0 * jax.random.normal(key)

    kwargs = dict(num_seeds=2, control_fn=control)
    config, template = ESConfig(popsize=8, std_init=0.5), {"x": jnp.zeros(3)}
    plain = Evolution(config, template, _member_plus_seed, **kwargs)
    paired = Evolution(config, template, _member_plus_seed, paired=True, **kwargs)
    state = plain.init(jax.random.key(1))
    _, a = plain.step(state)
    _, b = paired.step(state)
    seed_keys = plain.generation_keys(state.key)[2]
    assert float(a["control"]) == float(jnp.mean(jax.vmap(control)(seed_keys)))
    assert float(a["control"]) == float(b["control"])
    np.testing.assert_allclose(b["fitness"], a["fitness"] - a["control"], rtol=0, atol=1e-5)
    assert float(b["best"]) == float(b["best_vs_control"])
    assert float(a["best_vs_control"]) == pytest.approx(float(a["best"] - a["control"]))
    assert float(a["mean_vs_control"]) == pytest.approx(float(a["mean"] - a["control"]))
    # The seed noise that members share with the control cancels in the paired fitness.
    assert float(b["signal_within"]) < 1e-3 < float(a["signal_within"])
    with pytest.raises(ValueError, match="^fitness.control: paired"):
        Evolution(config, template, _member_plus_seed, num_seeds=2, paired=True)


def test_fitness_control_is_validated_and_absent_from_older_runs_means_none():
    with pytest.raises(ConfigError) as err:
        load("value_loss", ["fitness.control=yes"])
    assert str(err.value) == "fitness.control: 'yes'; allowed: none, baseline, paired"
    new = load("value_loss", []).to_dict()
    old = {**new, "fitness": {k: v for k, v in new["fitness"].items() if k != "control"}}
    assert search_differences(old, new) == []
    paired = {**new, "fitness": {**new["fitness"], "control": "paired"}}
    assert search_differences(old, paired) == ["fitness.control: '<unset>' -> 'paired'"]


def test_noise_warning_once_after_the_first_generations():
    low = [{"generation": g, "signal": 0.05} for g in (1, 2, 3, 4)]
    assert noise_warning(low[:2]) is None
    warning = noise_warning(low[:3])
    assert warning.startswith("warning: the search is noise-dominated") and "\n" not in warning
    for lever in ("fitness.num_seeds", "es.std_init", "es.popsize"):
        assert lever in warning
    assert noise_warning(low) is None  # said once, at generation 3
    assert noise_warning([*low[:2], {"generation": 3, "signal": NOISE_THRESHOLD}]) is None
    assert noise_warning([{"generation": g, "signal": None} for g in (1, 2, 3)]) is None  # one seed
    assert noise_warning(low[:1], generations=1) is not None  # a run shorter than 3 generations


@pytest.mark.timeout(300)
def test_a_run_with_the_baseline_as_control(tmp_path):
    """A tiny CLI run with fitness.control=paired: the signal and the margin over the baseline on the
    console, in metrics.jsonl and in inspect's figure; the control is the baseline trained on the
    generation's seeds, exactly."""
    # Long enough that episodes end, and members far enough apart (hyperparameters) that returns differ.
    args = [a for a in TINY if a not in ("fitness.num_seeds=1", "inner.total_timesteps=64", "component.hidden=[4]")]
    run_dir = tmp_path / "run"
    proc = evolve(["experiment=hyperparams", *args, "fitness.num_seeds=2", "inner.total_timesteps=512",
                   "es.std_init=2", "fitness.control=paired", "es.generations=3", f"run_dir={run_dir}"],
                  cwd=tmp_path, check=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("gen ")]
    assert len(lines) == 3 and all(" | signal " in line and " | vs baseline " in line for line in lines), proc.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert set(SIGNAL_FIELDS) | set(CONTROL_FIELDS) <= set(r)
        assert r["best"] == r["best_vs_control"]  # paired: the fitness is the margin over the control
    noisy = all(r["signal"] is not None and r["signal"] < NOISE_THRESHOLD for r in records)
    assert proc.stdout.count("the search is noise-dominated") == int(noisy), proc.stdout

    from metarl.results import load_run
    from metarl.run import build_evolution

    cfg, task = load_run(run_dir)
    _, evo = build_evolution(cfg, task=task, mesh=None)
    baseline = jax.jit(jax.vmap(lambda k: task.statistic(task.baselines[0](k)[1]["episode_return"])))
    key = evo.init(jax.random.key(cfg.seed)).key
    for r in records:
        key, _, seed_keys, _ = evo.generation_keys(key)
        assert r["control"] == float(jnp.mean(baseline(seed_keys)))

    assert inspect.main([f"run_dir={run_dir}"]) == 0
    assert (run_dir / "figures" / "signal.png").is_file()


def test_the_memory_estimate_counts_the_controls_runs():
    from metarl.tasks import build_task, check_memory

    need = {}
    for control in ("none", "baseline"):
        cfg = load("value_loss", ["fitness.num_seeds=3", f"fitness.control={control}"])
        need[control] = check_memory(cfg, build_task(cfg), None, members_here=4)
    # One more training per seed: a quarter more of the members' share (the ES's own floats aside).
    per_run = (need["baseline"] - need["none"]) / 3
    assert per_run > 0 and need["none"] > 4 * 3 * per_run
