"""PPO's optimiser seam (metarl.inner_loops.optimisers): Adam through it is PPO as it was, and OPEN's learned
optimiser trains, starts from Adam when residual, and makes a diverged training's returns NaN."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metarl.inner_loops import optimisers
from metarl.inner_loops.networks import ActorCritic
from metarl.inner_loops.optimisers import ADAM, Adam, LearnedOptimiser
from metarl.inner_loops.ppo import PPOConfig, make_train

CONFIG = PPOConfig(env="CartPole-v1", num_envs=4, num_steps=16, total_timesteps=512, hidden=(8, 8),
                   num_minibatches=2, update_epochs=2, unroll=1)


@dataclasses.dataclass(frozen=True)
class BeforeTheSeam:
    """PPO's optimiser as ppo.py built it inline before the seam existed, written out here."""

    def init(self, key):
        return {}

    def apply(self, meta_params, config):
        if config.anneal_lr:
            steps_per_update = config.update_epochs * config.num_minibatches

            def lr_schedule(count):
                return config.lr * (1.0 - (count // steps_per_update) / config.num_updates)
        else:
            lr_schedule = config.lr
        return optax.flatten(optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                         optax.adam(lr_schedule, eps=1e-5)))


def train(config, meta=None, **seams):
    return jax.jit(make_train(config, **seams))(jax.random.key(7), meta)


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("anneal_lr", [True, False])
def test_adam_through_the_seam_is_ppo_as_it_was_bit_for_bit(anneal_lr):
    config = CONFIG.replace(anneal_lr=anneal_lr)
    default = train(config)
    assert_same(default, train(config, optimiser=BeforeTheSeam()))
    assert_same(default, train(config, optimiser=Adam()))   # a new instance: the divergence guard on, same numbers
    assert ADAM == Adam() and make_train.__defaults__[-1] is ADAM


@pytest.mark.timeout(300)
def test_learned_optimiser_trains_residual_zero_is_adam_and_nan_counts_as_diverged():
    opt = LearnedOptimiser(hidden=(4,))
    meta = opt.init(jax.random.key(0))
    assert sum(x.size for x in jax.tree.leaves(meta)) == 19 * 4 + 4 + 4 * 3 + 3
    params, metrics = train(CONFIG, {"optimiser": meta}, optimiser=opt)
    assert np.isfinite(np.asarray(metrics["episode_return"])).all()
    moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(train(CONFIG)[0]))]
    assert max(moved) > 0

    # Zero meta-parameters with residual: Adam's step plus zero. The two programs fuse differently, so equal to
    # float rounding rather than bit for bit.
    zero = jax.tree.map(jnp.zeros_like, meta)
    residual = train(CONFIG, {"optimiser": zero}, optimiser=dataclasses.replace(opt, residual=True))
    adam = train(CONFIG)
    for x, y in zip(jax.tree.leaves(residual[0]), jax.tree.leaves(adam[0])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-6)

    # A step that overflows (exp(0.001 * 1e6)): the parameters turn inf/NaN, and so does every return after.
    bad = jax.tree.map(lambda x: x, meta)
    bad["params"]["Dense_1"]["bias"] = bad["params"]["Dense_1"]["bias"].at[1].set(1e6)
    returns = np.asarray(train(CONFIG, {"optimiser": bad}, optimiser=opt)[1]["episode_return"])
    assert np.isnan(returns[-1]) and np.isnan(returns).sum() >= 1


def test_inputs_layer_positions_actor_mask_and_dormancy():
    network = ActorCritic(2, False, (8, 8), "relu")
    obs = jax.random.normal(jax.random.key(1), (32, 4))
    params = network.init(jax.random.key(0), obs)
    positions = optimisers.layer_positions(params)["params"]
    assert [positions["actor"][f"Dense_{i}"]["kernel"] for i in range(3)] == [0.0, 0.5, 1.0]
    mask = optimisers.actor_mask(params)["params"]
    assert mask["actor"]["Dense_0"]["bias"] == 1.0 and mask["critic"]["Dense_2"]["kernel"] == 0.0
    dorm = optimisers.dormancy(network, params, obs, "relu")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        d = dict(jax.tree_util.tree_leaves_with_path(dorm))[path]
        assert d.shape == leaf.shape and bool(jnp.all(d >= 0))
    # a hidden layer's dormancy averages 1 over its neurons; a relu neuron that never fires has 0
    hidden = dorm["params"]["actor"]["Dense_0"]["bias"]
    np.testing.assert_allclose(float(hidden.mean()), 1.0, rtol=1e-5)
    dead = jax.tree.map(lambda x: x, params)
    dead["params"]["actor"]["Dense_0"]["bias"] = dead["params"]["actor"]["Dense_0"]["bias"].at[0].set(-1e3)
    assert float(optimisers.dormancy(network, dead, obs, "relu")["params"]["actor"]["Dense_0"]["bias"][0]) == 0.0


def test_figures_describe_finite_curves():
    opt = LearnedOptimiser(hidden=(4,))
    specs = opt.figures(opt.init(jax.random.key(0)), CONFIG)
    assert set(specs) == {"optimiser_update.png", "optimiser_step_size.png"}
    for x, rows, xlabel, note in specs.values():
        for panel in (p for row in rows for p in row):
            for label, y, style in panel["curves"]:
                assert np.shape(y) == np.shape(x) and np.isfinite(y).all() and style in ("learned", "formula",
                                                                                         "baseline"), label


def test_bad_hidden_is_one_line():
    with pytest.raises(ValueError, match="hidden"):
        LearnedOptimiser(hidden=(0,))
