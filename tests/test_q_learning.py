"""Tabular Q-learning on GridWorld with real jax/gymnax: optimal path, values, tie-breaking, vmap."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl.inner_loops.q_learning import QLearningConfig, build_tables, greedy_path, make_train
from metarl.inner_loops.envs import make

GAMMA = 0.9
START_VALUE = GAMMA**17 / (1 - GAMMA**18)  # 0.196: reward 1 every 18 steps, forever


def test_learns_shortest_path_and_start_value_on_8x12():
    config = QLearningConfig(total_timesteps=1_000_000, log_interval=100_000, lr=0.1, gamma=GAMMA, epsilon=0.1)
    q, metrics = jax.jit(jax.vmap(make_train(config)))(jax.random.split(jax.random.key(0), 4))
    assert q.shape == (4, 96, 4)
    assert metrics["episode_return"].shape == (4, 10) and metrics["episodes"].shape == (4, 10)
    for seed in range(4):
        path = greedy_path(config, q[seed])
        assert len(path) == 18, f"seed {seed}: greedy path has {len(path)} steps"
        assert path[0] == 95
    np.testing.assert_allclose(q[:, 95].max(-1), START_VALUE, atol=2e-3)
    # continuing task: every trip to the goal is an episode with return 1 (return_sum / episodes: on a
    # GPU, XLA's float32 division may be 1 ulp off, 0.99999994, so not exact equality)
    np.testing.assert_allclose(np.asarray(metrics["episode_return"]), 1.0, rtol=1e-6)
    # greedy with epsilon 0.1 needs a bit more than 18 steps per trip on average
    assert 100_000 / 30 < float(metrics["episodes"][:, -1].mean()) < 100_000 / 18


def test_expected_sarsa_and_episodic_variant_learn_the_path():
    config = QLearningConfig(
        env_kwargs=(("size", 5), ("continuing", False)), algorithm="expected_sarsa",
        total_timesteps=50_000, log_interval=10_000,
    )
    q, metrics = jax.jit(make_train(config))(jax.random.key(1))
    assert len(greedy_path(config, q)) == 8
    # episodic: the goal is terminal, so the value of its neighbours is just the reward
    assert float(q[1, 2]) == pytest.approx(1.0, abs=0.05)  # (0, 1) moving left
    assert int(metrics["episodes"].sum()) > 50_000 / 20


def test_ties_are_broken_uniformly():
    # Optimistic, equal initial values and no exploration: the first action from the start is a
    # tie among all four, and the one taken is the only entry the update lowers.
    config = QLearningConfig(total_timesteps=1, log_interval=1, unroll=1, epsilon=0.0, q_init=1.0)
    n = 4000
    q, _ = jax.jit(jax.vmap(make_train(config)))(jax.random.split(jax.random.key(3), n))
    changed = np.asarray(q[:, 95] < 1.0)
    assert np.all(changed.sum(-1) == 1)
    counts = changed.sum(0)
    chi2 = float(((counts - n / 4) ** 2 / (n / 4)).sum())
    assert chi2 < 16.3, f"counts {counts} are not uniform (chi2 {chi2:.1f}, 3 dof, p=0.001)"


def test_epsilon_one_explores_uniformly_even_when_values_differ():
    config = QLearningConfig(total_timesteps=1, log_interval=1, unroll=1, epsilon=1.0, q_init=1.0)
    n = 2000
    q, _ = jax.jit(jax.vmap(make_train(config)))(jax.random.split(jax.random.key(4), n))
    counts = np.asarray(q[:, 95] < 1.0).sum(0)
    assert counts.min() > n / 4 * 0.8


def test_vmap_over_seeds_and_lrs_compiles_once():
    traces = {"n": 0}
    config = QLearningConfig(total_timesteps=2_000, log_interval=1_000, unroll=2)

    def run(lr, key):
        traces["n"] += 1
        return make_train(config.replace(lr=lr))(key)

    batched = jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, 0)), in_axes=(0, None)))
    keys = jax.random.split(jax.random.key(0), 3)
    q1, m1 = batched(jnp.array([0.05, 0.1]), keys)
    q2, _ = batched(jnp.array([0.3, 0.9]), keys)
    assert traces["n"] == 1
    assert q1.shape == (2, 3, 96, 4) and m1["episode_return"].shape == (2, 3, 2)
    assert not np.allclose(q1, q2)


def test_meta_params_override_float_hyperparameters():
    config = QLearningConfig(total_timesteps=2_000, log_interval=1_000, unroll=2)
    train = jax.jit(make_train(config))
    key = jax.random.key(0)
    q_meta, _ = train(key, {"lr": jnp.float32(0.5)})
    q_cfg, _ = jax.jit(make_train(config.replace(lr=0.5)))(key)
    np.testing.assert_allclose(q_meta, q_cfg)
    with pytest.raises(ValueError, match="meta_params"):
        train(key, {"hidden": 3})


@pytest.mark.parametrize(
    "change, field",
    [
        ({"total_timesteps": 0}, "total_timesteps"),
        ({"total_timesteps": 1500, "log_interval": 1000}, "total_timesteps"),
        ({"env": "NoSuchEnv"}, "env"),
        ({"algorithm": "sarsa_lambda"}, "algorithm"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"gamma": -0.1}, "gamma"),
        ({"lr": 0.0}, "lr"),
        ({"lr": "fast"}, "lr"),
        ({"q_init": float("inf")}, "q_init"),
        ({"log_interval": 2**31}, "log_interval"),
        ({"env": "CartPole-v1"}, "env"),  # no numbered states to keep a table of
        ({"env": "Pendulum-v1"}, "env"),
    ],
)
def test_validate_names_the_field(change, field):
    with pytest.raises(ValueError, match=rf"^{field}: .*allowed"):
        QLearningConfig(**change).validate()


def test_validate_skips_traced_values():
    jax.vmap(lambda a: QLearningConfig(lr=a).validate().lr)(jnp.array([0.1, 2.0]))


def test_tables_follow_the_env_class():
    env, params = make("GridWorld")
    tables = build_tables(env, params)
    key = jax.random.key(0)
    for state_index, action in [(95, 2), (1, 2), (12, 3), (0, 0), (50, 1)]:
        state = env.state_from_index(jnp.int32(state_index), params)
        _, nxt, reward, terminated, _, info = env.step(key, state, action, params)
        flat = state_index * 4 + action
        assert int(tables.next_state[flat]) == int(env.state_index(nxt, params))
        assert float(tables.reward[flat]) == float(reward)
        assert bool(tables.episode_end[flat]) == bool(info["episode_end"])


def test_doors_with_time_limit_runs_and_finds_the_goal():
    config = QLearningConfig(
        env="Doors", env_kwargs=(("max_steps_in_episode", 100),), total_timesteps=200_000,
        log_interval=20_000, gamma=0.95, lr=0.5, epsilon=0.1, q_init=1.0,  # optimism explores
    )
    q, metrics = jax.jit(make_train(config))(jax.random.key(0))
    assert q.shape == (225, 5)
    assert len(greedy_path(config, q)) == 24
    assert float(metrics["episode_return"][-1]) > 0.5
