"""The search's signal (fitness spread against seed noise) and the baseline as a control in every
generation: the statistics on populations with known variances, and a tiny real run with the control."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import TINY, evolve

from metarl import inspect
from metarl.config import load, search_differences
from metarl.errors import ConfigError
from metarl.errors import layer_path
from metarl.outer_loops.evolution import (CONTROL_FIELDS, SIGNAL_FIELDS, ESConfig, Evolution, signal_stats,
                                          update_signal)
from metarl.outer_loops.evolution import NOISE_THRESHOLD, noise_warning


def test_signal_statistics_of_a_population_with_known_variances():
    # F[m, s] = a_m + b_s + e[m, s]: member means a = 0, 1, 2, 3 (V_b = var(a, ddof=1) = 5/3), a seed
    # effect b that every member shares, and an interaction e = -+0.5, its sign alternating by member,
    # so the seed means hold b alone and V_w = 8 * 0.25 / ((4 - 1)(2 - 1)) = 2/3.
    means = jnp.array([0.0, 1.0, 2.0, 3.0])
    e = 0.5 * jnp.array([1.0, -1.0, 1.0, -1.0])[:, None] * jnp.array([1.0, -1.0])
    f = means[:, None] + e
    stats = {k: float(v) for k, v in signal_stats(f).items()}
    assert stats["signal_between"] == pytest.approx(5 / 3)
    assert stats["signal_within"] == pytest.approx(2 / 3)
    assert stats["seed_noise"] == pytest.approx(1 / 3)
    assert stats["signal"] == pytest.approx((5 / 3 - 1 / 3) / (5 / 3))
    # What a seed does to every member alike cannot reorder them and is no noise: a lucky seed, or
    # the control's C[s] that fitness.control=paired subtracts.
    for seed_effect in (jnp.array([-0.5, 0.5]), jnp.array([-50.0, 80.0])):
        shifted = {k: float(v) for k, v in signal_stats(f + seed_effect).items()}
        assert shifted == pytest.approx(stats, rel=1e-5)
    assert float(signal_stats(means[:, None] + jnp.array([-3.0, 3.0]))["signal"]) == pytest.approx(1.0)
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


def _member_and_seed_noise(params, key):
    # As above, plus noise of the member's own on each seed (a stream keyed by the member's parameters).
    own = jax.random.fold_in(key, jax.lax.bitcast_convert_type(jnp.sum(params["x"]), jnp.uint32))
    return _member_plus_seed(params, key) + jax.random.normal(own)


def test_the_generation_measures_its_signal():
    evo = Evolution(ESConfig(popsize=8, std_init=0.5), {"x": jnp.zeros(3)}, _member_plus_seed, num_seeds=3)
    state = evo.init(jax.random.key(0))
    _, stats = evo.step(state)
    assert set(SIGNAL_FIELDS) <= set(stats) and not set(CONTROL_FIELDS) & set(stats)
    np.testing.assert_allclose(float(stats["signal_between"]), np.var(stats["fitness"], ddof=1), rtol=1e-4)
    # The seed noise (variance 9) is the same for every member on a seed: it cannot reorder them.
    assert float(stats["signal_within"]) < 1e-5 and float(stats["signal"]) == pytest.approx(1.0)
    # Noise of each member's own (variance 1) is what the members' ranking suffers from.
    evo = Evolution(ESConfig(popsize=8, std_init=0.5), {"x": jnp.zeros(3)}, _member_and_seed_noise, num_seeds=3)
    _, stats = evo.step(state)
    assert 0.3 < float(stats["signal_within"]) < 3.0
    assert float(stats["seed_noise"]) == pytest.approx(float(stats["signal_within"]) / 3)


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
    # The control is the same number for every member on a seed: the seed noise is the same with it
    # subtracted, here where each member has noise of its own and the control noise independent of theirs.
    def noisy_control(key):
        return 2.0 + 3.0 * jax.random.normal(key) + jax.random.normal(jax.random.fold_in(key, 7))

    kwargs = dict(num_seeds=4, control_fn=noisy_control)
    plain = Evolution(config, template, _member_and_seed_noise, **kwargs)
    paired = Evolution(config, template, _member_and_seed_noise, paired=True, **kwargs)
    _, a = plain.step(state)
    _, b = paired.step(state)
    assert 0.2 < float(a["signal_within"]) < 4.0
    for field in ("signal_between", "signal_within", "signal"):
        assert float(b[field]) == pytest.approx(float(a[field]), rel=1e-4)
    with pytest.raises(ValueError, match="^paired: True needs a control_fn"):  # in outer_loops' own terms
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
    assert all(f" {lever} (" in warning for lever in ("num_seeds", "std_init", "popsize"))
    # The harness names the levers as the config does.
    warning = noise_warning(low[:3], name=lambda lever: layer_path("evolution", lever))
    assert all(f" {lever} (" in warning for lever in ("fitness.num_seeds", "es.std_init", "es.popsize"))
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
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(records) == 3, proc.stdout
    for line, r in zip(lines, records):
        assert set(SIGNAL_FIELDS) | set(CONTROL_FIELDS) <= set(r)
        assert r["best"] == r["best_vs_control"]  # paired: the fitness is the margin over the control
        # The console shows the signal where it is measured: not where every member scores alike (V_b = 0).
        assert " | vs baseline " in line and (" | signal " in line) == (r["signal"] is not None), line
    assert any(r["signal"] is not None for r in records)
    noisy = all(r["signal"] is not None and r["signal"] < NOISE_THRESHOLD for r in records)
    assert proc.stdout.count("the search is noise-dominated") == int(noisy), proc.stdout

    from metarl.results import load_run
    from metarl.search import build_evolution

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
