"""The evolution driver on toy problems with known optima (real evosax, no RL)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evosax.algorithms import algorithms as evosax_algorithms

from metarl.outer_loops.evolution import ESConfig, Evolution, replace_nonfinite, strategy_tables

STRATEGIES, UNSUPPORTED, _ = strategy_tables()

TARGET = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(1.5)}
TEMPLATE = jax.tree.map(jnp.zeros_like, TARGET)


def toy_fitness(params, key):
    # Higher is better; the optimum is TARGET. The key adds a little noise, as an RL fitness would.
    err = sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGET)))
    return -err + 0.01 * jax.random.normal(key)


def distance(params):
    return float(sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGET))))


# The settings of every toy run, so the strategies tested twice compile once (the compilation cache).
TOY = dict(popsize=16, std_init=0.3, lr=0.1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["Open_ES", "SNES", "Sep_CMA_ES", "CMA_ES", "PGPE", "SimpleES"])
def test_driver_maximises_toward_the_optimum(strategy):
    evo = Evolution(ESConfig(strategy=strategy, **TOY), TEMPLATE, toy_fitness, num_seeds=2)
    state = evo.init(jax.random.key(0))
    first = None
    for _ in range(60):
        state, stats = evo.step(state)
        first = float(stats["mean"]) if first is None else first
    start = distance(TEMPLATE)
    assert distance(evo.mean(state)) < 0.2 * start, strategy
    assert float(stats["mean"]) > first
    assert float(state.best_fitness) > -0.2 * start
    assert evo.step._cache_size() == 1  # one trace and compilation of the generation


@pytest.mark.timeout(300)
def test_nonfinite_members_are_counted_and_the_run_goes_on():
    def sometimes_nan(params, key):
        f = toy_fitness(params, key)
        return jnp.where(params["b"] > 0.0, jnp.nan, f)  # about half the population diverges

    evo = Evolution(ESConfig(popsize=16, std_init=0.3, lr=0.1), TEMPLATE, sometimes_nan, num_seeds=1)
    state = evo.init(jax.random.key(1))
    counts = []
    for _ in range(5):
        state, stats = evo.step(state)
        counts.append(int(stats["nonfinite"]))
        assert np.all(np.isfinite(stats["fitness"]))
        assert float(stats["worst"]) == pytest.approx(float(np.min(stats["fitness"])))
    assert sum(counts) > 0
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(evo.mean(state)))


def test_replace_nonfinite_uses_worst_finite_or_floor():
    f = jnp.array([3.0, jnp.nan, 1.0, jnp.inf])
    fixed, n = replace_nonfinite(f)
    np.testing.assert_allclose(fixed, [3.0, 1.0, 1.0, 1.0])
    assert int(n) == 2
    fixed, _ = replace_nonfinite(f, floor=-100.0)
    np.testing.assert_allclose(fixed, [3.0, -100.0, 1.0, -100.0])
    fixed, n = replace_nonfinite(jnp.array([jnp.nan, jnp.nan]))
    assert np.all(np.isfinite(fixed)) and int(n) == 2


@pytest.mark.timeout(300)
def test_generation_is_traced_once_across_generations():
    evo = Evolution(ESConfig(popsize=8), TEMPLATE, toy_fitness, num_seeds=3)
    state = evo.init(jax.random.key(0))
    for _ in range(4):
        state, _ = evo.step(state)
    assert evo.step._cache_size() == 1  # one trace and compilation of the generation


@pytest.mark.parametrize("kwargs, field", [
    (dict(strategy="NoSuchES"), "strategy"),
    (dict(popsize=7), "popsize"),
    (dict(strategy="PGPE", popsize=5), "popsize"),
    (dict(std_init=0.0), "std_init"),
    (dict(optimizer="rmsprop"), "optimizer"),
    (dict(fitness_shaping="magic"), "fitness_shaping"),
    (dict(lr=float("inf")), "lr"),
    (dict(std_init=float("nan")), "std_init"),
    (dict(adam_b1=1.0), "adam_b1"),
])
def test_bad_es_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError) as err:
        ESConfig(**kwargs).validate()
    assert str(err.value).startswith(field + ":")


def test_odd_population_allowed_where_the_strategy_takes_one():
    ESConfig(strategy="SNES", popsize=7).validate()
    ESConfig(strategy="CMA_ES", popsize=7).validate()
    with pytest.raises(ValueError, match="^popsize: 7 is odd"):  # evosax's Open_ES asserts it regardless
        ESConfig(strategy="Open_ES", popsize=7, antithetic=False).validate()


# Wider than the population: LM_MA_ES's update is only defined for fewer members than dimensions
# (its c_c = popsize / dims must stay below 1), as real meta-parameters always are.
WIDE = {"w": jnp.zeros((20,)), "b": jnp.zeros(())}


def wide_fitness(params, key):
    return -jnp.sum((params["w"] - 1.0) ** 2) - (params["b"] + 1.0) ** 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_by_name_runs_two_generations(strategy):
    evo = Evolution(ESConfig(strategy=strategy, **TOY), WIDE, wide_fitness, num_seeds=1)
    state = evo.init(jax.random.key(0))
    for expected in (1, 2):
        state, stats = evo.step(state)
        assert int(stats["generation"]) == expected  # generations completed, from 1
        assert int(stats["nonfinite"]) == 0 and stats["fitness"].shape == (16,)
    assert np.isfinite(float(state.best_fitness))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(evo.mean(state)))
    assert jax.tree.structure(evo.mean(state)) == jax.tree.structure(WIDE)
    assert evo.step._cache_size() == 1  # one trace and compilation of the generation


def test_every_evosax_strategy_is_reachable_or_listed_with_a_reason():
    assert set(STRATEGIES) | set(UNSUPPORTED) == set(evosax_algorithms)
    assert not set(STRATEGIES) & set(UNSUPPORTED)
    assert len(STRATEGIES) >= 25
    for name, reason in UNSUPPORTED.items():
        with pytest.raises(ValueError) as err:
            ESConfig(strategy=name).validate()
        message = str(err.value)
        assert message.startswith("strategy:") and reason in message and "\n" not in message


@pytest.mark.parametrize("strategy", ["ARS", "CR_FM_NES", "GuidedES", "PersistentES"])
def test_odd_population_refused_where_evosax_samples_pairs(strategy):
    with pytest.raises(ValueError) as err:
        ESConfig(strategy=strategy, popsize=7).validate()
    assert str(err.value).startswith("popsize: 7 is odd")


@pytest.mark.timeout(300)
def test_custom_strategy_by_target_gets_the_driver_settings_and_its_arguments():
    config = ESConfig(target="plugins.DampedOpenES", args={"damping": 0.5}, **TOY).validate()
    evo = Evolution(config, TEMPLATE, toy_fitness, num_seeds=1)
    assert type(evo.es).__name__ == "DampedOpenES" and evo.es.damping == 0.5
    assert evo.es.population_size == 16  # the driver's popsize and template reach the constructor
    state = evo.init(jax.random.key(0))
    for _ in range(2):
        state, stats = evo.step(state)
    assert int(stats["generation"]) == 2 and np.all(np.isfinite(stats["fitness"]))


@pytest.mark.parametrize("kwargs, field", [
    (dict(target="no_such_module.ES"), "_target_"),
    (dict(target="plugins.NoSuchES"), "_target_"),
    (dict(target="plugins.DampedOpenES", args={"dampening": 1.0}), "args.dampening"),
    (dict(target="plugins.DampedOpenES", args={"optimizer": "adam"}), "args.optimizer"),
    (dict(args={"damping": 1.0}), "args"),
])
def test_bad_custom_strategy_names_the_field(kwargs, field):
    with pytest.raises(ValueError) as err:
        ESConfig(**kwargs).validate()
    assert str(err.value).startswith(field + ":"), str(err.value)
    assert "\n" not in str(err.value)


def test_std_and_lr_decay_per_generation_as_open():
    """es.std_decay and es.lr_decay multiply Open_ES's search width and step once per generation; 1 keeps them."""
    from metarl.outer_loops.es_config import make_strategy

    template = {"x": jnp.zeros((3,), jnp.float32)}
    stds = {}
    for decay in (1.0, 0.5):
        es, params = make_strategy(ESConfig(popsize=4, std_init=0.1, lr=0.1, std_decay=decay, lr_decay=decay), template)
        state = es.init(jax.random.key(0), template, params)
        seen = []
        for gen in range(3):
            pop, state = es.ask(jax.random.key(gen), state, params)
            state, _ = es.tell(jax.random.key(gen), pop, jnp.arange(4.0), state, params)
            seen.append(float(state.std))
        stds[decay] = seen
    np.testing.assert_allclose(stds[1.0], [0.1] * 3, rtol=1e-6)
    np.testing.assert_allclose(stds[0.5], [0.1, 0.05, 0.025], rtol=1e-6)  # evosax: schedule(generations told - 1)
    with pytest.raises(ValueError, match=r"^std_decay: 0; allowed: > 0 and <= 1"):
        make_strategy(ESConfig(std_decay=0), template)
