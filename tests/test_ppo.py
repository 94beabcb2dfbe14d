"""PPO: maths on probe environments, the library contract (jit, vmap, one compile), seams, validation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import probe_envs  # noqa: F401  (registers the Probe-* environments)
from clihelp import at_metarl_level
from metarl.inner_loops.components import (
    CLIPPED_SURROGATE,
    L2_VALUE_LOSS,
    AdaptiveSchedules,
    DriftFamily,
    LearnedSchedules,
    LPODrift,
    MLPValueLoss,
    Observed,
    ValueLossFamily,
    training_progress,
)
from metarl.inner_loops.ppo import (
    Batch,
    PPOConfig,
    compute_gae,
    make_agent,
    make_train,
    ppo_loss,
    random_permutations,
    update_draws,
)
from metarl.inner_loops.draws import gumbel_from_bits, normal_from_bits, uniform_from_bits

TINY = dict(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, update_epochs=2, num_minibatches=2)


# --- networks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("features", [1, 2, 6, 7, 64])
def test_dense_is_flax_dense_with_narrow_layers_by_column(features):
    import flax.linen as nn
    from flax.linen.initializers import orthogonal

    from metarl.inner_loops.networks import Dense

    x = jax.random.normal(jax.random.key(1), (3, 5, 8))
    ours = Dense(features, kernel_init=orthogonal(0.5))
    flax_dense = nn.Dense(features, kernel_init=orthogonal(0.5))
    params = ours.init(jax.random.key(0), x)
    jax.tree.map(np.testing.assert_array_equal, params, flax_dense.init(jax.random.key(0), x))
    params = jax.tree.map(lambda p: p + 0.1, params)  # a non-zero bias too
    np.testing.assert_allclose(ours.apply(params, x), flax_dense.apply(params, x), rtol=1e-5, atol=1e-6)

    def loss(module, p, x):
        return jnp.sum(jnp.sin(module.apply(p, x)))
    g_ours = jax.grad(loss, argnums=(1, 2))(ours, params, x)
    g_flax = jax.grad(loss, argnums=(1, 2))(flax_dense, params, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g_ours, g_flax)


# --- minibatch shuffles ---------------------------------------------------------------------------

def test_random_permutations_are_permutations_drawn_uniformly():
    perms = np.asarray(random_permutations(jax.random.key(0), 24_000, 4))
    assert perms.dtype == np.int32 and perms.shape == (24_000, 4)
    np.testing.assert_array_equal(np.sort(perms, axis=1), np.broadcast_to(np.arange(4), perms.shape))
    _, counts = np.unique(perms, axis=0, return_counts=True)
    assert len(counts) == 24  # every ordering of 4 occurs, each about 1000 times (sd about 31)
    assert counts.min() > 850 and counts.max() < 1150, counts
    big = np.asarray(random_permutations(jax.random.key(1), 2_000, 512))
    np.testing.assert_array_equal(np.sort(big, axis=1), np.broadcast_to(np.arange(512), big.shape))
    # each element lands in each position with probability 1/512: position 0's mean is 255.5 (sd 3.3)
    assert abs(big[:, 0].mean() - 255.5) < 20
    assert len({tuple(row) for row in big}) == 2_000  # rows are independent draws
    np.testing.assert_array_equal(random_permutations(jax.random.key(2), 3, 1), np.zeros((3, 1)))
    huge = np.asarray(random_permutations(jax.random.key(3), 1, (1 << 20) + 1))  # the fallback
    np.testing.assert_array_equal(np.sort(huge[0]), np.arange((1 << 20) + 1))


def test_an_update_draws_its_noise_keys_and_shuffles_at_once():
    key = jax.random.key(0)
    # The noise is JAX's own, made from the same bits as jax.random.gumbel and jax.random.normal make it.
    bits = jax.random.bits(key, (4096,), jnp.uint32)
    np.testing.assert_allclose(gumbel_from_bits(bits), jax.random.gumbel(key, (4096,)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(normal_from_bits(bits), jax.random.normal(key, (4096,)), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(uniform_from_bits(bits), jax.random.uniform(key, (4096,)))
    for continuous, mean, var in ((False, np.euler_gamma, np.pi ** 2 / 6), (True, 0.0, 1.0)):
        noise, steps, resets, perms = update_draws(key, 128, 8, 3, continuous, 4, 1024)
        assert noise.shape == (128, 8, 3) and steps.shape == resets.shape == (128, 8) and perms.shape == (4, 1024)
        assert abs(float(noise.mean()) - mean) < 0.05 and abs(float(noise.var()) - var) < 0.1 * var
        np.testing.assert_array_equal(np.sort(perms, axis=1), np.broadcast_to(np.arange(1024), perms.shape))
        data = np.concatenate([np.asarray(jax.random.key_data(k)).reshape(-1, 2) for k in (steps, resets)])
        assert len({tuple(row) for row in data}) == 2 * 128 * 8  # every step and reset has a key of its own
    _, _, _, perms = update_draws(key, 1, 1, 2, False, 1, (1 << 20) + 1)  # the shuffle's fallback
    np.testing.assert_array_equal(np.sort(perms[0]), np.arange((1 << 20) + 1))


# --- GAE ------------------------------------------------------------------------------------------

def test_gae_matches_hand_computation():
    gamma, lam = 0.9, 0.8
    rewards = jnp.array([1.0, 2.0, 3.0])
    values = jnp.array([0.5, 0.4, 0.3])
    dones = jnp.array([False, True, False])  # the observation after step 1 starts a new episode
    last = jnp.array(0.2)
    adv, target = compute_gae(rewards, values, dones, last, gamma, lam)
    d2 = 3.0 + gamma * 0.2 - 0.3
    d1 = 2.0 - 0.4  # nothing bootstrapped across the episode end
    d0 = 1.0 + gamma * 0.4 - 0.5
    expected = np.array([d0 + gamma * lam * d1, d1, d2])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(target, expected + np.array([0.5, 0.4, 0.3]), rtol=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value():
    rewards = jnp.ones(5)
    values = jnp.zeros(5)
    adv, _ = compute_gae(rewards, values, jnp.zeros(5, bool), jnp.array(10.0), 0.5, 1.0)
    expected = [sum(0.5**k for k in range(5 - t)) + 0.5 ** (5 - t) * 10.0 for t in range(5)]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


# --- probe environments: the critic must learn the known values ------------------------------------

def _learned_values(env, obs_values, gamma, **kw):
    cfg = PPOConfig(env=env, num_envs=8, num_steps=16, total_timesteps=8 * 16 * 150, update_epochs=4,
                    num_minibatches=4, lr=3e-3, anneal_lr=False, gamma=gamma, gae_lambda=0.95,
                    clip_value_loss=False, **kw)
    params, _ = jax.jit(make_train(cfg))(jax.random.key(0))
    _, _, network = make_agent(cfg)
    from metarl.inner_loops.networks import ActorCritic
    obs = jnp.array(obs_values, jnp.float32)[:, None]
    return np.asarray(network.apply(params, obs, method=ActorCritic.value))


@pytest.mark.timeout(300)
def test_probe_constant_reward_one_step():
    v = _learned_values("Probe-constant", [0.0], gamma=0.99)
    np.testing.assert_allclose(v, [1.0], atol=0.05)


@pytest.mark.timeout(300)
def test_probe_observation_dependent_reward():
    v = _learned_values("Probe-one_step_obs", [-1.0, 1.0], gamma=0.99)
    np.testing.assert_allclose(v, [-1.0, 1.0], atol=0.1)


@pytest.mark.timeout(300)
def test_probe_two_step_discounting():
    v = _learned_values("Probe-two_step", [0.0, 1.0], gamma=0.5)
    np.testing.assert_allclose(v, [0.5, 1.0], atol=0.08)


@pytest.mark.timeout(300)
def test_probe_time_limit_bootstraps_from_final_observation():
    # Reward 1 forever, cut only by a 5-step time limit. Bootstrapping through the cut gives
    # V = 1 / (1 - gamma) = 2; treating the cut as a terminal state would give about 1.61.
    v = _learned_values("Probe-time_limit", [0.0], gamma=0.5)
    np.testing.assert_allclose(v, [2.0], atol=0.1)


# --- the library contract ------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_vmap_over_keys_matches_separate_calls():
    # The bandit draws its reward from its key in every step: each agent's environment comes from its own
    # key, not from the batch it is vmapped in (as an RngBitGenerator key's would: it draws a batch from
    # its first key).
    train = jax.jit(make_train(PPOConfig(env="BernoulliBandit-misc", **TINY)))
    keys = jax.random.split(jax.random.key(3), 4)
    batched_params, batched_metrics = jax.jit(jax.vmap(train))(keys)
    for i in range(4):
        params, metrics = train(keys[i])
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(batched_params)):
            np.testing.assert_allclose(a, b[i], rtol=1e-4, atol=1e-5)
        for name in metrics:
            np.testing.assert_allclose(metrics[name], batched_metrics[name][i], rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
def test_vmap_over_learning_rates_traces_once():
    traces = []
    cfg = PPOConfig(**TINY)

    def train_lr(lr, key):
        traces.append(1)
        return make_train(cfg.replace(lr=lr))(key)[1]["episode_return"]

    fn = jax.jit(jax.vmap(train_lr))
    lrs = jnp.array([1e-4, 3e-4, 1e-3, 3e-3])
    keys = jax.random.split(jax.random.key(0), 4)
    out1 = fn(lrs, keys)
    out2 = fn(lrs * 2, keys)
    assert len(traces) == 1
    assert out1.shape == (4, cfg.num_updates)
    assert np.all(np.isfinite(out2))


@pytest.mark.timeout(300)
def test_float_hyperparameters_in_meta_params_replace_the_config():
    # The layout DQN and Q-learning take as well: meta_params keyed by what each entry replaces.
    cfg = PPOConfig(**TINY)
    key = jax.random.key(3)
    p_meta, m_meta = jax.jit(make_train(cfg))(key, {"lr": jnp.float32(3e-3), "gamma": jnp.float32(0.9)})
    p_cfg, m_cfg = jax.jit(make_train(cfg.replace(lr=3e-3, gamma=0.9)))(key)
    p_base, _ = jax.jit(make_train(cfg))(key)
    np.testing.assert_allclose(m_meta["value_loss"], m_cfg["value_loss"], rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(p_meta), jax.tree.leaves(p_cfg)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(p_meta), jax.tree.leaves(p_base)))
    with pytest.raises(ValueError, match="meta_params: unknown keys"):
        make_train(cfg)(key, {"num_envs": 2})


@pytest.mark.timeout(300)
def test_metrics_are_scalars_per_update():
    cfg = PPOConfig(**TINY)
    _, metrics = jax.jit(make_train(cfg))(jax.random.key(0))
    assert set(metrics) == {"episode_return", "episodes", "value_loss", "policy_loss", "entropy", "approx_kl",
                            "clip_fraction"}
    for value in metrics.values():
        assert value.shape == (cfg.num_updates,)
        assert np.all(np.isfinite(value))


# --- seams --------------------------------------------------------------------------------------

def _hand_written_ppo_loss(params, network, batch, clip_eps, vf_coef, ent_coef):
    """PPO's loss written out in one piece, as in PureJaxRL, to check the seams against."""
    (logits, _), value = network.apply(params, batch.obs)
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, batch.action[:, None], axis=1)[:, 0]
    v_clipped = batch.value + jnp.clip(value - batch.value, -clip_eps, clip_eps)
    v_loss = 0.5 * jnp.maximum((value - batch.target) ** 2, (v_clipped - batch.target) ** 2).mean()
    ratio = jnp.exp(logp - batch.log_prob)
    adv = (batch.advantage - batch.advantage.mean()) / (batch.advantage.std() + 1e-8)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv).mean()
    ent = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
    return pg + vf_coef * v_loss - ent_coef * ent


def _fixed_batch(cfg, n=64):
    _, _, network = make_agent(cfg)
    k = jax.random.split(jax.random.key(7), 6)
    obs = jax.random.normal(k[0], (n, 4))
    params = network.init(k[1], obs)
    batch = Batch(obs=obs, action=jax.random.randint(k[2], (n,), 0, 2),
                  log_prob=jnp.log(jax.random.uniform(k[3], (n,), minval=0.3, maxval=0.7)),
                  value=jax.random.normal(k[4], (n,)), advantage=jax.random.normal(k[5], (n,)),
                  target=jax.random.normal(k[0], (n,)) * 2)
    return network, params, batch


def test_default_seams_give_the_hand_written_ppo_gradient():
    cfg = PPOConfig()
    network, params, batch = _fixed_batch(cfg)

    def seam_loss(p):
        return ppo_loss(p, network.apply, batch, cfg, None, L2_VALUE_LOSS, CLIPPED_SURROGATE, False)[0]

    def hand_loss(p):
        return _hand_written_ppo_loss(p, network, batch, cfg.clip_eps, cfg.vf_coef, cfg.ent_coef)

    np.testing.assert_allclose(seam_loss(params), hand_loss(params), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(jax.grad(seam_loss)(params)), jax.tree.leaves(jax.grad(hand_loss)(params))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_lpo_with_zero_network_is_ppo_clipping():
    cfg = PPOConfig()
    lpo = LPODrift()
    zero = jax.tree.map(jnp.zeros_like, lpo.init(jax.random.key(0)))
    ratio = jnp.exp(jax.random.normal(jax.random.key(1), (256,)) * 0.3)
    adv = jax.random.normal(jax.random.key(2), (256,))
    # relu(x - 1e-4) shaves at most 1e-4 off PPO's drift.
    np.testing.assert_allclose(lpo.apply(zero, ratio, adv, cfg), CLIPPED_SURROGATE.apply(None, ratio, adv, cfg),
                               atol=1.1e-4)
    assert np.all(lpo.drift(lpo.init(jax.random.key(3)), ratio, adv, cfg) >= 0)


def test_residual_mlp_value_loss_with_zero_network_is_l2():
    loss = MLPValueLoss(residual=True, inputs=("error", "target"))
    zero = jax.tree.map(jnp.zeros_like, loss.init(jax.random.key(0)))
    v, old, t = jnp.array([1.0, -2.0]), jnp.array([0.0, 0.0]), jnp.array([0.5, 1.0])
    np.testing.assert_allclose(loss.apply(zero, v, old, t), 0.5 * (v - t) ** 2)


def test_zero_temporal_components_give_exactly_the_hand_designed_gradient():
    """Temporal inputs (training progress) leave a zero-initialised component at the hand-designed rule."""
    cfg = PPOConfig(clip_value_loss=False)
    network, params, batch = _fixed_batch(cfg)
    progress = training_progress(jnp.int32(37), 100)
    value_loss = MLPValueLoss(residual=True, inputs=("error", "progress", "log_updates"))
    lpo = LPODrift(inputs=("progress", "log_updates"))
    assert value_loss.temporal and lpo.temporal
    meta = {"value_loss": jax.tree.map(jnp.zeros_like, value_loss.init(jax.random.key(0))),
            "policy_objective": jax.tree.map(jnp.zeros_like, lpo.init(jax.random.key(1)))}

    def temporal_loss(p):
        return ppo_loss(p, network.apply, batch, cfg, meta, value_loss, lpo, False, progress)[0]

    def hand_loss(p):
        return ppo_loss(p, network.apply, batch, cfg, None, L2_VALUE_LOSS, CLIPPED_SURROGATE, False)[0]

    # LPO's relu(x - 1e-4) shaves at most 1e-4 off PPO's drift per sample.
    np.testing.assert_allclose(temporal_loss(params), hand_loss(params), atol=1.1e-4)
    for a, b in zip(jax.tree.leaves(jax.grad(temporal_loss)(params)), jax.tree.leaves(jax.grad(hand_loss)(params))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # A non-zero network does see the progress: the loss changes with it.
    random = {"value_loss": value_loss.init(jax.random.key(2)), "policy_objective": meta["policy_objective"]}
    early, late = (ppo_loss(params, network.apply, batch, cfg, random, value_loss, lpo, False,
                            training_progress(jnp.int32(i), 100))[0] for i in (0, 99))
    assert abs(float(early) - float(late)) > 1e-6


def _assert_same_loss_and_gradient(loss_a, loss_b, params):
    np.testing.assert_allclose(loss_a(params), loss_b(params), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(jax.grad(loss_a)(params)), jax.tree.leaves(jax.grad(loss_b)(params))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def _zeros(component):
    return jax.tree.map(jnp.zeros_like, component.init(jax.random.key(0)))


@pytest.mark.parametrize("clip_value_loss", [True, False])
def test_small_families_at_zero_are_ppo_in_loss_and_gradient(clip_value_loss):
    """Zero meta-parameters of the drift and value-loss families are PPO's clipped surrogate and L2
    (clipped or not), with the clip-range schedule on and the progress handed in."""
    cfg = PPOConfig(clip_value_loss=clip_value_loss)
    network, params, batch = _fixed_batch(cfg)
    drift, value_loss = DriftFamily(), ValueLossFamily()
    assert drift.temporal and sum(x.size for x in jax.tree.leaves(drift.init(None))) == 14
    assert sum(x.size for x in jax.tree.leaves(value_loss.init(None))) == 4
    meta = {"policy_objective": _zeros(drift), "value_loss": _zeros(value_loss)}
    progress = training_progress(jnp.int32(37), 100)

    def family_loss(p):
        return ppo_loss(p, network.apply, batch, cfg, meta, value_loss, drift, False, progress)[0]

    def hand_loss(p):
        return ppo_loss(p, network.apply, batch, cfg, None, L2_VALUE_LOSS, CLIPPED_SURROGATE, False)[0]

    _assert_same_loss_and_gradient(family_loss, hand_loss, params)
    # The batch's ratios lie on both sides of the clip range, so the clipping is exercised.
    logits = network.apply(params, batch.obs)[0][0]
    ratio = jnp.exp(jnp.take_along_axis(jax.nn.log_softmax(logits), batch.action[:, None], 1)[:, 0] - batch.log_prob)
    assert float(jnp.min(ratio)) < 0.8 and float(jnp.max(ratio)) > 1.2


def _published_dpo_objective(ratio, adv, alpha=2.0, beta=0.6):
    """r A - drift of Lu et al. 2022, written out on its own to check the family against."""
    x = (ratio - 1) * adv
    y = jnp.log(ratio) * adv
    drift = jnp.where(adv >= 0, jnp.maximum(x - alpha * jnp.tanh(x / alpha), 0),
                      jnp.maximum(y - beta * jnp.tanh(y / beta), 0))
    return ratio * adv - drift


def test_dpo_is_a_point_of_the_drift_family():
    cfg = PPOConfig()
    ratio = jnp.exp(jax.random.normal(jax.random.key(1), (512,)) * 0.5)
    adv = jax.random.normal(jax.random.key(2), (512,)) * 2
    progress = training_progress(jnp.int32(10), 100)
    from_dpo = DriftFamily(baseline="dpo")
    from_ppo = DriftFamily()  # PPO's start, moved to DPO: weight -1 on PPO's drift and +1 on DPO's
    moved = _zeros(from_ppo)
    moved["weights"] = moved["weights"].at[:, :2].set(jnp.array([-1.0, 1.0]))
    for family, meta in ((from_dpo, _zeros(from_dpo)), (from_ppo, moved)):
        def objective(r, family=family, meta=meta):
            return family.apply(meta, r, adv, cfg, progress=progress).sum()

        np.testing.assert_allclose(family.apply(meta, ratio, adv, cfg, progress=progress),
                                   _published_dpo_objective(ratio, adv), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(jax.grad(objective)(ratio), jax.grad(lambda r: _published_dpo_objective(
            r, adv).sum())(ratio), rtol=1e-6, atol=1e-6)
    # DPO's drift differs from PPO's on these samples, so the two points are distinct.
    assert not np.allclose(_published_dpo_objective(ratio, adv), CLIPPED_SURROGATE.apply(None, ratio, adv, cfg))
    with pytest.raises(ValueError, match="^baseline: 'trpo'; allowed: ppo, dpo$"):
        DriftFamily(baseline="trpo")


def test_the_clip_range_schedule_moves_with_training_progress():
    cfg = PPOConfig()
    family = DriftFamily()
    ratio = jnp.linspace(0.5, 1.5, 101)
    adv = jnp.ones_like(ratio)
    meta = _zeros(family)
    early, late = (family.apply(meta, ratio, adv, cfg, progress=training_progress(jnp.int32(i), 100))
                   for i in (0, 99))
    np.testing.assert_array_equal(early, late)  # zero: the constant clip range
    meta["clip_schedule"] = jnp.array([-1.0, 0.0])  # the clip range shrinks to e^-1 of itself
    early, late = (family.apply(meta, ratio, adv, cfg, progress=training_progress(jnp.int32(i), 100))
                   for i in (0, 99))
    np.testing.assert_allclose(early, CLIPPED_SURROGATE.apply(None, ratio, adv, cfg), rtol=1e-6)
    np.testing.assert_allclose(float(late.max()), 1.0 + 0.2 * np.exp(-0.99), rtol=1e-5)


def test_learned_schedules_at_zero_are_ppo_and_a_constant_scale_is_a_scaled_hyperparameter():
    # The schedule seam: zero is PPO's own hyperparameters (every multiplier exactly 1 all through
    # training); exp(c0) on a field trains as the config with that field times exp(c0).
    family = LearnedSchedules()
    zero = family.init(None)
    for i in (0, 3, 99):
        scales = family.apply(zero, training_progress(jnp.int32(i), 100))
        assert {k: float(v) for k, v in scales.items()} == {"lr": 1.0, "ent_coef": 1.0, "clip_eps": 1.0}
    cfg = PPOConfig(**TINY, ent_coef=0.05)
    key = jax.random.key(5)
    learned, ppo = jax.jit(make_train(cfg, schedule=family)), jax.jit(make_train(cfg))
    _, m_ppo = ppo(key)
    _, m_zero = learned(key, {"schedule": zero})
    for name in m_ppo:
        np.testing.assert_allclose(m_zero[name], m_ppo[name], rtol=1e-5, atol=1e-6)
    scaled = {"lr": 2.0, "ent_coef": 3.0, "clip_eps": 0.5}
    meta = {k: jnp.array([np.log(v), 0.0, 0.0]) for k, v in scaled.items()}
    _, m_meta = learned(key, {"schedule": meta})
    _, m_cfg = ppo(key, {k: jnp.float32(getattr(cfg, k) * v) for k, v in scaled.items()})
    for name in m_cfg:
        np.testing.assert_allclose(m_meta[name], m_cfg[name], rtol=1e-4, atol=1e-5)
    assert not np.allclose(m_meta["value_loss"], m_ppo["value_loss"])
    with pytest.raises(ValueError, match=r"^fields: \['gamma'\]; allowed: one or more of lr, ent_coef, clip_eps$"):
        LearnedSchedules(fields=("gamma",))


class _StepsOnlyAfterSeeing:
    """An adaptive schedule whose learning rate is 0 until something has been observed (``after=True``),
    or 0 from then on (``after=False``)."""
    adaptive = True

    def __init__(self, after):
        self.after = after

    def init(self, key):
        return {}

    def apply(self, meta_params, progress, observed):
        seen = ~jnp.isnan(observed.approx_kl)
        return {"lr": jnp.where(seen == self.after, 1.0, 0.0)}


def test_an_adaptive_schedule_sees_the_previous_update_and_at_zero_is_ppo():
    cfg = PPOConfig(**TINY, anneal_lr=False, lr=1e-3)   # steps of one size, large enough that each moves the KL
    key = jax.random.key(7)
    # The trainer hands an adaptive schedule what the previous update saw, nothing before the first:
    # a step only in the first update moves the policy then and never after (KL 0), and the converse.
    _, first_only = jax.jit(make_train(cfg, schedule=_StepsOnlyAfterSeeing(after=False)))(key, {"schedule": {}})
    _, later_only = jax.jit(make_train(cfg, schedule=_StepsOnlyAfterSeeing(after=True)))(key, {"schedule": {}})
    # (Unmoved parameters give a KL of 0 up to rounding: the rollout and the loss compute the log-probabilities
    # in different kernels, which at some compiler levels round differently, by about 1e-9.)
    unmoved, moved = 1e-8, 1e-7
    assert float(first_only["approx_kl"][0]) > moved and np.all(np.abs(np.asarray(first_only["approx_kl"][1:])) < unmoved)
    assert abs(float(later_only["approx_kl"][0])) < unmoved and np.all(np.asarray(later_only["approx_kl"][1:]) > moved)
    assert np.all(np.asarray(first_only["clip_fraction"][1:]) == 0)
    # AdaptiveSchedules at zero is PPO (every multiplier exactly 1; the compiled programs differ, so
    # rounding may); its multipliers follow the observed KL and clip fraction.
    family = AdaptiveSchedules()
    zero = family.init(None)
    _, m_ppo = jax.jit(make_train(cfg))(key)
    _, m_zero = jax.jit(make_train(cfg, schedule=family))(key, {"schedule": zero})
    for name in m_ppo:
        np.testing.assert_allclose(m_zero[name], m_ppo[name], rtol=1e-5, atol=1e-6)
    progress = training_progress(jnp.int32(5), 10)
    meta = dict(zero, lr=jnp.array([0.0, 0.0, -1.0, 0.0]), clip_eps=jnp.array([0.0, 0.0, 0.0, 1.0]))
    high = family.apply(meta, progress, Observed(jnp.float32(0.1), jnp.float32(0.3)))
    low = family.apply(meta, progress, Observed(jnp.float32(0.001), jnp.float32(0.1)))
    np.testing.assert_allclose(float(high["lr"]), 0.1, rtol=1e-5)      # KL 10x kl_ref: exp(-log 10)
    np.testing.assert_allclose(float(low["lr"]), 10.0, rtol=1e-5)
    np.testing.assert_allclose(float(high["clip_eps"]), np.exp(1.0), rtol=1e-5)   # clip fraction 0.3: c = 1
    assert float(family.apply(meta, progress, Observed(jnp.float32(100.0), jnp.float32(0.1)))["lr"]) == \
        pytest.approx(np.exp(-3.0), rel=1e-5)   # log(KL / kl_ref) is clipped to [-3, 3]
    nothing = family.apply(meta, progress, Observed(jnp.float32(jnp.nan), jnp.float32(jnp.nan)))
    assert {k: float(v) for k, v in nothing.items()} == {"lr": 1.0, "ent_coef": 1.0, "clip_eps": 1.0}
    with pytest.raises(ValueError, match=r"^kl_ref: 0; allowed: a number > 0$"):
        AdaptiveSchedules(kl_ref=0)


def test_value_loss_family_moves_between_clipped_and_unclipped_l2():
    v, old, t = (jax.random.normal(jax.random.key(i), (256,)) for i in range(3))
    family = ValueLossFamily()
    meta = _zeros(family)
    clipped, unclipped = PPOConfig(), PPOConfig(clip_value_loss=False)
    np.testing.assert_array_equal(family.apply(meta, v, old, t, clipped), L2_VALUE_LOSS.apply({}, v, old, t, clipped))
    meta["clip_mix"] = jnp.float32(-1.0)
    np.testing.assert_allclose(family.apply(meta, v, old, t, clipped), L2_VALUE_LOSS.apply({}, v, old, t, unclipped),
                               rtol=1e-6, atol=1e-7)
    meta = dict(_zeros(family), over=jnp.float32(1.0))  # over-estimates cost twice as much
    loss = family.apply(meta, v, old, t, unclipped)
    np.testing.assert_allclose(loss, jnp.where(v > t, 2.0, 1.0) * 0.5 * (v - t) ** 2, rtol=1e-6)
    meta = dict(_zeros(family), huber=jnp.float32(1.0), log_scale=jnp.float32(np.log(3.0)))
    error = np.abs(np.asarray(v - t))
    huber = np.where(error <= 1, 0.5 * error ** 2, error - 0.5)
    np.testing.assert_allclose(family.apply(meta, v, old, t, unclipped), 1.5 * error ** 2 + huber, rtol=1e-5)


@pytest.mark.timeout(300)
def test_learned_value_loss_plugs_into_training():
    loss = MLPValueLoss(inputs=("error", "progress"))  # temporal: the trainer hands it the progress
    cfg = PPOConfig(**TINY)
    meta = {"value_loss": loss.init(jax.random.key(1))}
    _, metrics = jax.jit(make_train(cfg, value_loss=loss))(jax.random.key(0), meta)
    assert np.all(np.isfinite(metrics["value_loss"]))


# --- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(num_minibatches=3), "num_minibatches"),
    (dict(env="NoSuchEnv-v0"), "env"),
    (dict(lr=0.0), "lr"),
    (dict(lr=-1e-3), "lr"),
    (dict(total_timesteps=0), "total_timesteps"),
    (dict(total_timesteps=-5), "total_timesteps"),
    (dict(gamma=1.5), "gamma"),
    (dict(num_envs=0), "num_envs"),
    (dict(activation="sigmoidish"), "activation"),
    (dict(lr="fast"), "lr"),
    (dict(hidden=64), "hidden"),
    (dict(num_steps=2**32), "num_steps"),
    (dict(gamma=float("nan")), "gamma"),
])
def test_bad_config_raises_naming_the_field(kwargs, field):
    with pytest.raises(ValueError) as err:
        make_train(PPOConfig(**kwargs))
    message = str(err.value)
    assert message.startswith(field + ":") and "\n" not in message


# --- learning -----------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_cartpole_default_config_solves_on_four_seeds():
    cfg = PPOConfig()  # PureJaxRL's defaults: 4 envs, 128 steps, 5e5 frames
    _, metrics = at_metarl_level(jax.jit(jax.vmap(make_train(cfg))), jax.random.split(jax.random.key(42), 4))
    final = np.asarray(metrics["episode_return"][:, -10:]).mean(axis=1)
    assert final.mean() >= 450, final


@pytest.mark.timeout(600)
def test_pendulum_continuous_actions_improve():
    cfg = PPOConfig(env="Pendulum-v1", num_envs=16, num_steps=64, total_timesteps=300_000,
                    update_epochs=10, num_minibatches=8, lr=3e-3, gamma=0.95, gae_lambda=0.95,
                    ent_coef=0.0, clip_eps=0.2, max_grad_norm=0.5)
    _, metrics = at_metarl_level(jax.jit(jax.vmap(make_train(cfg))), jax.random.split(jax.random.key(0), 2))
    ret = np.asarray(metrics["episode_return"])
    first, last = ret[:, 3:8].mean(), ret[:, -5:].mean()
    assert last > first + 200, (first, last)
