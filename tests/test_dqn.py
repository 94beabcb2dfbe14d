"""DQN with real jax/gymnax/optax: config checks, smoke runs on CartPole and Doors, learning."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import at_metarl_level
from metarl.inner_loops.dqn import DQNConfig, epsilon_at, greedy_action, make_train

TINY = dict(total_timesteps=400, log_interval=200, buffer_size=128, batch_size=8, hidden=(16,), learning_starts=50,
            target_update_period=10, unroll=1)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"total_timesteps": 0}, "total_timesteps"),
        ({"total_timesteps": 1500, "log_interval": 1000}, "total_timesteps"),
        ({"num_envs": 3, "log_interval": 1000, "total_timesteps": 3000}, "log_interval"),
        ({"num_envs": 3, "buffer_size": 100, "log_interval": 300, "total_timesteps": 3000}, "buffer_size"),
        ({"env": "NoSuchEnv"}, "env"),
        ({"epsilon_schedule": "cosine"}, "epsilon_schedule"),
        ({"loss": "l1"}, "loss"),
        ({"gamma": 1.5}, "gamma"),
        ({"tau": -0.5}, "tau"),
        ({"lr": -1e-3}, "lr"),
        ({"hidden": ()}, "hidden"),
        ({"hidden": 64}, "hidden"),
        ({"lr": "fast"}, "lr"),
        ({"total_timesteps": 2**31}, "total_timesteps"),
        ({"env": "Pendulum-v1"}, "env"),  # continuous actions: DQN scores a finite set
    ],
)
def test_validate_names_the_field(change, field):
    with pytest.raises(ValueError, match=rf"^{field}: .*allowed"):
        DQNConfig(**change).validate()


def test_validate_skips_traced_values():
    jax.vmap(lambda g: DQNConfig(gamma=g).validate().gamma)(jnp.array([0.9, 2.0]))


def test_epsilon_schedules():
    linear = DQNConfig(total_timesteps=1000, log_interval=100, epsilon_start=1.0, epsilon_end=0.1, epsilon_fraction=0.5)
    assert float(epsilon_at(linear, jnp.int32(0))) == pytest.approx(1.0)
    assert float(epsilon_at(linear, jnp.int32(250))) == pytest.approx(0.55)
    assert float(epsilon_at(linear, jnp.int32(900))) == pytest.approx(0.1)
    inverse = linear.replace(epsilon_schedule="inverse", epsilon_start=0.3, epsilon_end=0.0, epsilon_decay_rate=1e-3)
    assert float(epsilon_at(inverse, jnp.int32(1000))) == pytest.approx(0.15)


@pytest.mark.parametrize(
    "env, extra",
    [
        ("CartPole-v1", {"double_dqn": True, "loss": "huber", "num_envs": 2, "tau": 0.5}),
        ("Doors", {"epsilon_schedule": "inverse", "env_kwargs": (("max_steps_in_episode", 30),)}),
    ],
)
def test_smoke_runs_and_shapes(env, extra):
    config = DQNConfig(env=env, **{**TINY, **extra})
    params, metrics = jax.jit(make_train(config))(jax.random.key(0))
    assert set(metrics) >= {"episode_return", "episodes", "loss", "epsilon"}
    for value in metrics.values():
        assert value.shape == (2,) and bool(jnp.all(jnp.isfinite(value)))
    assert int(metrics["episodes"].sum()) > 0
    assert float(metrics["loss"][-1]) > 0.0  # updates ran after learning_starts
    leaves = jax.tree.leaves(params)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)
    obs = jnp.zeros((3, *((4,) if env == "CartPole-v1" else (15, 15, 4))))
    assert greedy_action(config, params, obs).shape == (3,)


def test_vmap_over_seeds_and_learning_rates_compiles_once_and_meta_params():
    traces = {"n": 0}
    config = DQNConfig(**TINY)

    def run(lr, key):
        traces["n"] += 1
        return make_train(config.replace(lr=lr))(key)

    batched = jax.jit(jax.vmap(run))
    keys = jax.random.split(jax.random.key(0), 2)
    p1, m1 = batched(jnp.array([1e-3, 3e-4]), keys)
    _, m2 = batched(jnp.array([1e-2, 1e-4]), keys)
    assert traces["n"] == 1 and m1["loss"].shape == (2, 2)
    assert not np.allclose(m1["loss"], m2["loss"])
    # meta_params feed the same leaves as config.replace
    p_meta, _ = jax.jit(make_train(config))(keys[0], {"lr": jnp.float32(1e-3)})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b[0], rtol=1e-3, atol=1e-5), p_meta, p1)


def test_nothing_is_learned_before_learning_starts_and_the_skip_stays_a_branch_under_vmap():
    # learning_starts at the run's end: whatever the learning rate, the parameters stay the initial ones.
    config = DQNConfig(**{**TINY, "learning_starts": TINY["total_timesteps"]})
    keys = jax.random.split(jax.random.key(0), 2)
    batched = jax.jit(jax.vmap(lambda lr, k: make_train(config.replace(lr=lr))(k)))
    (p1, m1), (p2, _) = batched(jnp.array([1e-3, 1e-1]), keys), batched(jnp.array([1e-1, 1e-3]), keys)
    jax.tree.map(np.testing.assert_array_equal, p1, p2)
    assert not np.any(np.asarray(m1["loss"])) and int(m1["episodes"].sum()) > 0
    # Under vmap over seeds and hyperparameters the skip is a real conditional, not a select of both sides.
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda lr, k: make_train(config.replace(lr=lr))(k)))(
        jnp.array([1e-3, 1e-1]), keys))
    assert jaxpr.count("cond[") >= 2


def test_an_agent_trains_the_same_beside_any_other_agent_and_alone():
    # The bandit draws its reward from its key in every step: an agent's environment must come from its own
    # key alone, not from the batch it is vmapped in (JAX's RngBitGenerator keys draw a batch from its first key).
    config = DQNConfig(env="BernoulliBandit-misc", **TINY)
    batched = jax.jit(jax.vmap(make_train(config)))
    a, b, c = (jax.random.key(i) for i in (1, 2, 3))
    beside_a = batched(jnp.stack([a, b]))[1]["episode_return"][1]
    beside_c = batched(jnp.stack([c, b]))[1]["episode_return"][1]
    alone = jax.jit(make_train(config))(b)[1]["episode_return"]
    np.testing.assert_array_equal(beside_a, beside_c)
    np.testing.assert_array_equal(beside_a, alone)


def test_learns_cartpole_quickly():
    # Random play scores about 22; two seeds after 15k steps are far above that.
    config = DQNConfig(total_timesteps=15_000, log_interval=5_000)
    _, metrics = at_metarl_level(jax.jit(jax.vmap(make_train(config))), jax.random.split(jax.random.key(0), 2))
    final = float(metrics["episode_return"][:, -1].mean())
    assert final > 60.0, f"mean return {final:.1f} after 15k steps"


@pytest.mark.slow
def test_reaches_200_on_cartpole_over_four_seeds_within_1e5_steps():
    config = DQNConfig(total_timesteps=100_000, log_interval=5_000)
    _, metrics = at_metarl_level(jax.jit(jax.vmap(make_train(config))), jax.random.split(jax.random.key(0), 4))
    returns = np.asarray(metrics["episode_return"])  # (4 seeds, 20 intervals)
    print("per-seed final interval returns:", returns[:, -1].round(1), "mean curve:", returns.mean(0).round(0))
    assert returns[:, -1].mean() >= 200.0


def test_flat_mlp_matches_flax_and_autodiff():
    from metarl.inner_loops.dqn import QNetwork
    from metarl.inner_loops.flat_mlp import FlatMLP, adam_init, adam_step
    import optax

    net, mlp = QNetwork(hidden=(16, 8), num_actions=3), FlatMLP((5, 16, 8, 3))
    params = net.init(jax.random.key(1), jnp.zeros((1, 5)))
    flat = mlp.from_flax(params)
    assert flat.shape == (mlp.size,)
    x = jax.random.normal(jax.random.key(2), (7, 5))
    q, inputs = mlp.forward(flat, x)
    np.testing.assert_allclose(q, net.apply(params, x), rtol=1e-5, atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, mlp.to_flax(flat), params)
    # Hand-written backward == autodiff, using only the first 4 rows (the rest are "acting" rows).
    d_out = jax.random.normal(jax.random.key(3), (4, 3))
    expected = jax.grad(lambda f: jnp.sum(d_out * mlp.forward(f, x[:4])[0]))(flat)
    np.testing.assert_allclose(mlp.backward(flat, inputs, d_out), expected, rtol=1e-5, atol=1e-6)
    # Fused Adam == optax.adam for three steps.
    opt, lr = optax.adam(1e-2), jnp.float32(1e-2)
    o_state, state, ref, mine = opt.init(flat), adam_init(flat), flat, flat
    for i in range(3):
        g = jnp.sin(flat * (i + 1))
        upd, o_state = opt.update(g, o_state, ref)
        ref = ref + upd
        mine, state = adam_step(mine, g, state, lr, jnp.float32(1e-8))
    np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-7)
    assert int(state.count) == 3
