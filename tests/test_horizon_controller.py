"""HorizonController: a learned controller of PPO's lr, ent_coef and clip_eps from the budget, the
fraction done and the previous update's statistics; zero is PPO bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl.inner_loops.components import (
    OPTIONAL_OBSERVED,
    HorizonController,
    Observed,
    training_progress,
)
from metarl.inner_loops.ppo import PPOConfig, make_train

pytestmark = pytest.mark.timeout(600)

TINY = dict(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, update_epochs=2, num_minibatches=2)
H = HorizonController.FEATURES.index("h")
NAN = jnp.float32(jnp.nan)


def _budget(num_updates, ref=256):
    return float(np.clip((np.log(num_updates) - np.log(ref)) / np.log(4.0), -3.0, 3.0))


def test_features_hold_the_budget_and_fraction_and_no_statistic_before_the_first_update():
    hc = HorizonController()
    short, long = PPOConfig(**TINY), PPOConfig(**dict(TINY, total_timesteps=4 * 16 * 64))
    assert (short.num_updates, long.num_updates) == (4, 64)
    # The same fraction done on two horizons: only the budget feature differs.
    x_short = hc.features(training_progress(jnp.int32(2), short.num_updates))
    x_long = hc.features(training_progress(jnp.int32(32), long.num_updates))
    assert x_short.shape == (len(HorizonController.FEATURES),)
    np.testing.assert_allclose(float(x_short[H]), _budget(4), rtol=1e-5)
    np.testing.assert_allclose(float(x_long[H]), _budget(64), rtol=1e-5)
    assert float(x_long[H]) - float(x_short[H]) == pytest.approx(2.0, rel=1e-5)   # 16x the updates: 2 units
    keep = [i for i in range(len(x_short)) if i != H]
    np.testing.assert_array_equal(np.asarray(x_short)[keep], np.asarray(x_long)[keep])
    assert float(x_short[1]) == 0.5 and float(x_short[0]) == 1.0
    assert float(hc.features(training_progress(jnp.int32(0), 256))[H]) == 0.0           # ref_updates: 0
    assert float(hc.features(training_progress(jnp.int32(0), 2 ** 30))[H]) == 3.0       # clipped
    # Before the first update (Observed all NaN), and without observed (the figure), the statistics are 0.
    progress = training_progress(jnp.int32(0), 4)
    nothing = Observed(NAN, NAN, NAN, NAN, NAN)
    for x in (hc.features(progress, nothing), hc.features(progress), hc.features(progress, Observed(NAN, NAN))):
        np.testing.assert_array_equal(np.asarray(x)[3:], 0.0)
    assert {k: float(v) for k, v in hc.apply(hc.init(None), progress, nothing).items()} == \
        {"lr": 1.0, "ent_coef": 1.0, "clip_eps": 1.0}
    # Each statistic is finite and bounded whatever its scale: log ratios and the trend are clipped
    # (the clip fraction is in [0, 1], so c in [-0.5, 4.5], and the trend in [-1, 1]).
    for value in (0.0, 1e-30, 1e30, np.inf):
        stats = (value, min(value, 1.0), value, value, min(value, 1.0))
        x = np.asarray(hc.features(progress, Observed(*(jnp.float32(v) for v in stats))))
        assert np.all(np.isfinite(x)) and np.all(np.abs(x[3:]) <= 4.5), (value, x)
    # The figure: the multipliers over training without observed, vmapped over the fraction done.
    meta = dict(hc.init(None), lr=jnp.array([0.0, 1.0, 0, 0, 0, 0, 0, 0]))
    curve = jax.vmap(lambda f: hc.apply(meta, training_progress(f * 100, 100)))(jnp.linspace(0.0, 0.99, 5))
    np.testing.assert_allclose(np.asarray(curve["lr"]), np.exp(np.linspace(0.0, 0.99, 5)), rtol=1e-5)


def test_multipliers_follow_the_features():
    hc = HorizonController()
    zero = hc.init(None)
    assert set(zero) == {"lr", "ent_coef", "clip_eps"} and all(v.shape == (8,) for v in zero.values())
    w = 0.7
    lr_on_budget = np.zeros(8)
    lr_on_budget[H] = w
    meta = dict(zero, lr=jnp.asarray(lr_on_budget, jnp.float32))
    for n in (4, 256, 4096):
        scales = hc.apply(meta, training_progress(jnp.int32(1), n), Observed(NAN, NAN, NAN, NAN, NAN))
        np.testing.assert_allclose(float(scales["lr"]), np.exp(w * _budget(n)), rtol=1e-5)
        assert float(scales["ent_coef"]) == float(scales["clip_eps"]) == 1.0
    # One weight per statistic: k = log(KL / kl_ref), c = clip_fraction / 0.2 - 0.5, v and g log ratios,
    # r = 10 x the return's relative change.
    observed = Observed(jnp.float32(0.1), jnp.float32(0.3), jnp.float32(0.5), jnp.float32(4.0), jnp.float32(0.05))
    expected = {"k": np.log(10.0), "c": 1.0, "v": np.log(0.5), "g": np.log(4.0), "r": 0.5}
    progress = training_progress(jnp.int32(1), 256)
    x = hc.features(progress, observed)
    for name, value in expected.items():
        np.testing.assert_allclose(float(x[HorizonController.FEATURES.index(name)]), value, rtol=1e-5)
        weights = np.zeros(8, np.float32)
        weights[HorizonController.FEATURES.index(name)] = -1.0
        scales = hc.apply(dict(zero, clip_eps=jnp.asarray(weights)), progress, observed)
        np.testing.assert_allclose(float(scales["clip_eps"]), np.exp(-value), rtol=1e-5)
    only_lr = HorizonController(fields=("lr",), ref_updates=4)
    assert set(only_lr.init(None)) == {"lr"}
    assert float(only_lr.features(training_progress(jnp.int32(0), 4))[H]) == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"fields": ("gamma",)}, r"^fields: \['gamma'\]; allowed: one or more of lr, ent_coef, clip_eps$"),
    ({"fields": ()}, r"^fields: \[\]; allowed: one or more of lr, ent_coef, clip_eps$"),
    ({"ref_updates": 0}, r"^ref_updates: 0; allowed: an integer >= 1$"),
    ({"ref_updates": 2.5}, r"^ref_updates: 2.5; allowed: an integer >= 1$"),
    ({"kl_ref": 0}, r"^kl_ref: 0; allowed: a number > 0$"),
])
def test_bad_constructor_input_is_one_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HorizonController(**kwargs)


def test_zero_is_ppo_bit_for_bit_and_a_budget_weight_is_a_scaled_lr():
    cfg = PPOConfig(**TINY, env="CartPole-v1")
    key = jax.random.key(3)
    hc = HorizonController()
    ppo, controlled = jax.jit(make_train(cfg)), jax.jit(make_train(cfg, schedule=hc))
    p_ppo, m_ppo = ppo(key)
    p_zero, m_zero = controlled(key, {"schedule": hc.init(None)})
    assert set(m_zero) == set(m_ppo)
    for name in m_ppo:
        np.testing.assert_array_equal(m_zero[name], m_ppo[name], err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, p_zero, p_ppo)
    # A weight on the budget alone is a constant multiplier: PPO with lr times exp(w h).
    w = -0.5
    weights = np.zeros(8, np.float32)
    weights[H] = w
    _, m_meta = controlled(key, {"schedule": dict(hc.init(None), lr=jnp.asarray(weights))})
    _, m_cfg = ppo(key, {"lr": jnp.float32(cfg.lr * np.exp(w * _budget(cfg.num_updates)))})
    for name in m_cfg:
        np.testing.assert_allclose(m_meta[name], m_cfg[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert not np.allclose(m_meta["value_loss"], m_ppo["value_loss"])


class _Recorder:
    """An adaptive schedule of no multipliers that records what it is handed, one Observed per update."""
    adaptive = True

    def __init__(self, observes):
        self.observes, self.seen = observes, []

    def init(self, key):
        return {}

    def apply(self, meta_params, progress, observed):
        jax.debug.callback(lambda *o: self.seen.append(Observed(*(float(v) for v in o))), *observed, ordered=True)
        return {}


def test_the_trainer_hands_over_the_statistics_asked_for_and_only_those():
    cfg = PPOConfig(**dict(TINY, total_timesteps=4 * 16 * 8))
    key = jax.random.key(1)
    every = _Recorder(OPTIONAL_OBSERVED)
    _, m = jax.jit(make_train(cfg, schedule=every))(key, {"schedule": {}})
    jax.effects_barrier()
    seen = every.seen
    assert len(seen) == cfg.num_updates and all(np.isnan(v) for v in seen[0])
    for i in range(1, cfg.num_updates):
        prev = seen[i]
        assert prev.approx_kl == pytest.approx(float(m["approx_kl"][i - 1]), rel=1e-6)
        assert prev.clip_fraction == pytest.approx(float(m["clip_fraction"][i - 1]), rel=1e-6)
        assert 0.0 < prev.relative_value_loss < np.inf and 0.0 < prev.relative_grad_norm < np.inf
    # The trend: the change of the episode_return metric relative to its size, from the first return seen.
    returns, episodes = np.asarray(m["episode_return"]), np.asarray(m["episodes"])
    first = int(np.argmax(episodes > 0))
    assert episodes[first] > 0 and first + 2 < cfg.num_updates
    assert all(np.isnan(seen[i].return_trend) for i in range(first + 2))
    for i in range(first + 1, cfg.num_updates - 1):
        expected = (returns[i] - returns[i - 1]) / (abs(returns[i]) + abs(returns[i - 1]) + 1e-8)
        assert seen[i + 1].return_trend == pytest.approx(expected, rel=1e-5, abs=1e-7)
    # Asking for one statistic computes only it; the others stay NaN, and the run is the same.
    one = _Recorder(("return_trend",))
    _, m_one = jax.jit(make_train(cfg, schedule=one))(key, {"schedule": {}})
    jax.effects_barrier()
    assert all(np.isnan(o.relative_value_loss) and np.isnan(o.relative_grad_norm) for o in one.seen)
    np.testing.assert_array_equal([o.return_trend for o in one.seen], [o.return_trend for o in seen])
    with pytest.raises(ValueError, match=r"^schedule.observes: \['loss'\]; allowed: some of relative_value_loss"):
        make_train(cfg, schedule=_Recorder(("loss",)))


def test_a_population_of_controllers_vmaps_through_one_program():
    cfg = PPOConfig(**TINY)
    hc = HorizonController()
    zero = hc.init(None)
    weights = np.zeros(8, np.float32)
    weights[HorizonController.FEATURES.index("g")] = 1.0     # a larger step when the gradient was clipped
    members = jax.tree.map(lambda a, b: jnp.stack([a, b]), zero, dict(zero, lr=jnp.asarray(weights)))
    train = make_train(cfg, schedule=hc)
    key = jax.random.key(2)
    _, m = jax.jit(jax.vmap(lambda meta: train(key, {"schedule": meta})))(members)
    assert m["value_loss"].shape == (2, cfg.num_updates)
    assert np.all(np.isfinite(np.asarray(m["value_loss"])))
    _, m_zero = jax.jit(make_train(cfg))(key)
    for name in m_zero:   # member 0 is PPO (a vmapped program may round differently)
        np.testing.assert_allclose(m[name][0], m_zero[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The first update has seen nothing (the same for both); later ones differ.
    assert float(m["approx_kl"][0, 0]) == pytest.approx(float(m["approx_kl"][1, 0]), rel=1e-5)
    assert not np.allclose(m["approx_kl"][0, 1:], m["approx_kl"][1, 1:])
