"""Parts of a user's own named by `_target_`, built in-process (the CLI runs are in test_cli.py)."""
import jax
import numpy as np
import pytest

from metarl import config as config_lib
from metarl.errors import ConfigError
from metarl.search import build_evolution
from metarl.tasks import build_task

TOY_TRAINER = {
    "experiment": "toy",
    "inner": {"_target_": "plugin_trainer.ToyConfig", "steps": 4, "lr": 0.05},
    "component": {"kind": "hyperparams", "search": {"lr": {"low": 0.01, "high": 0.45}}},
    "es": {"strategy": "SNES", "popsize": 4, "std_init": 0.5, "lr": 1.0, "optimizer": "sgd", "init_mean": "init"},
    "fitness": {"num_seeds": 1, "statistic": "auc"},
}


@pytest.mark.timeout(300)
def test_trainer_of_your_own_by_target_evolves_its_hyperparameters():
    cfg = config_lib.from_dict(TOY_TRAINER)
    task, evo = build_evolution(cfg, mesh=None)
    assert type(task.inner_config).__name__ == "ToyConfig" and task.inner_config.steps == 4
    assert task.trainer.__name__ == "plugin_trainer"
    state = evo.init(jax.random.key(0))
    for _ in range(2):
        state, stats = evo.step(state)
    assert int(stats["generation"]) == 2 and np.all(np.isfinite(stats["fitness"]))
    # The fitness is the toy's curve: a larger step size climbs faster, so it must beat the start.
    start = task.fitness_fn(task.init_mean, jax.random.key(0))
    better = task.fitness_fn(task.component.encode({"lr": 0.4}), jax.random.key(0))
    assert float(better[0]) > float(start[0])  # fitness_fn scores each task: one here


@pytest.mark.parametrize("change, field", [
    ({"inner": {"_target_": "plugin_trainer.ToyConfig", "stepz": 4}}, "inner.stepz"),
    ({"inner": {"_target_": "plugin_trainer.ToyConfig", "steps": 0}}, "inner.steps"),
    ({"inner": {"_target_": "plugins.HuberValueLoss"}}, "inner._target_"),  # its module has no make_train
    ({"component": {"kind": "value_loss"}}, "inner.algo"),  # the toy trainer has no value_loss seam
    ({"component": {"kind": "hyperparams", "_target_": "plugins.HuberValueLoss"}}, "component._target_"),
])
def test_bad_plugins_name_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        build_task(config_lib.from_dict({**TOY_TRAINER, **change}))
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_the_readme_plugin_experiment_builds_its_component(monkeypatch):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(repo))  # as `python -m` from the repository root does
    cfg = config_lib.load("huber_value_loss", ["component.delta_init=3.0"], str(repo / "examples" / "experiments"))
    task = build_task(cfg)
    assert type(task.component).__module__ == "examples.custom_value_loss"
    assert task.component.delta_init == 3.0 and set(task.template) == {"log_delta"}
