"""Errors cross the layers as data: a lower layer's SettingError is re-named by its field, never by reading its text,
and the config's checks and the trainers' (pydantic's constraints) become one line from pydantic's errors as data."""
import ast
import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Literal

import pytest
from flax import struct
from pydantic.fields import FieldInfo

from metarl import config as config_lib
from metarl.errors import ConfigError, LayerError, layer_errors
from metarl.inner_loops import schema
from metarl.inner_loops.dqn import DQNConfig
from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.ppo import PPOConfig
from metarl.inner_loops.q_learning import QLearningConfig
from metarl.tasks import inner_config, task_specs

METARL = Path(config_lib.__file__).parent

# The only regular expressions the harness may run, none of them on an error of metarl's own:
# (module, enclosing function) -> what the expression reads.
ALLOWED_RE_SITES = {
    ("errors", "one_line"): "Hydra's and OmegaConf's messages (their text, not ours)",
    ("rundir", "acquire"): "the lock file's 'pid P host H'",
    ("logger", "log_results"): "a W&B artifact's name",
    ("logger", "mlflow_store"): "an MLflow tracking URI's scheme",
    ("logger", "log_metrics"): "MLflow's metric names",
}


def _re_calls(path: Path):
    """``(innermost enclosing function or <module>, line)`` of every ``re.NAME(...)`` call in the module at ``path``."""
    tree = ast.parse(path.read_text())
    assert not any(isinstance(node, ast.ImportFrom) and node.module == "re" for node in ast.walk(tree)), path
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and getattr(node.func.value, "id", None) == "re"):
            scope = node
            while scope in parents and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents[scope]
            yield getattr(scope, "name", "<module>"), node.lineno


def test_no_regular_expression_reads_an_error_of_metarls_own():
    found = {(path.stem, func): line for path in sorted(METARL.glob("*.py")) for func, line in _re_calls(path)}
    unknown = {f"metarl/{module}.py:{line} in {func}" for (module, func), line in found.items()
               if (module, func) not in ALLOWED_RE_SITES}
    assert not unknown, f"a regular expression outside the known non-error uses: {sorted(unknown)}"
    assert set(found) == set(ALLOWED_RE_SITES), "a listed site no longer uses re: drop it from the list"


def test_layer_errors_prefix_comes_from_the_field_not_the_text():
    # Text that a parser splitting on ':' would misread: the field is the data, whatever the text says.
    misleading = SettingError("popsize", "es.lr: 3 looks like another field: here", "an even number such as 8")
    with pytest.raises(ConfigError) as err, layer_errors("evolution"):
        raise misleading
    assert str(err.value) == "es.popsize: es.lr: 3 looks like another field: here; allowed: an even number such as 8"
    assert isinstance(err.value, LayerError) and err.value.field == "es.popsize"
    assert (err.value.problem, err.value.allowed) == (misleading.problem, misleading.allowed)
    with pytest.raises(ConfigError) as err, layer_errors("evolution"):   # LAYER_PATHS' own mapping of num_seeds
        raise SettingError("num_seeds", "0", "a positive integer")
    assert str(err.value) == "fitness.num_seeds: 0; allowed: a positive integer"
    with pytest.raises(ConfigError) as err, layer_errors("component"):   # a field with spaces is still a field
        raise SettingError("search.lr low", "1", None)
    assert str(err.value) == "component.search.lr low: 1"


def test_only_a_user_class_plain_value_error_is_read_and_only_in_setting_error_of():
    # A class of the user's own may name its argument in a plain ValueError (docs/extending.md).
    with pytest.raises(ConfigError) as err, layer_errors("component"):
        raise ValueError("delta: 0; allowed: > 0")
    assert str(err.value) == "component.delta: 0; allowed: > 0" and err.value.field == "component.delta"
    with pytest.raises(ConfigError) as err, layer_errors("es"):   # one that names no argument names the part
        raise ValueError("the strategy diverged: nan")
    assert str(err.value) == "es: the strategy diverged: nan" and err.value.field == "es"
    rooms = [METARL.parent / room for room in ("metarl", "inner_loops", "outer_loops")]
    readers = [path for room in rooms for path in room.rglob("*.py") if '.partition(":")' in path.read_text()]
    assert readers == [METARL.parent / "inner_loops" / "errors.py"], readers


def test_a_config_error_passes_through_unchanged():
    with pytest.raises(ConfigError) as err, layer_errors("es"):
        raise ConfigError("fitness.window: 2; allowed: a fraction in (0, 1]")
    assert str(err.value) == "fitness.window: 2; allowed: a fraction in (0, 1]"


def _with(section: str, key: str, value) -> dict:
    data = config_lib.to_dict(config_lib.RunConfig(experiment="x"))
    node = data
    for part in filter(None, section.split(".")):
        node = node[part]
    node[key] = value
    return data


@pytest.mark.parametrize("section, key, value, line", [
    ("fitness", "window", 1.5, "fitness.window: 1.5; allowed: a fraction in (0, 1]"),
    ("fitness", "window", 0, "fitness.window: 0; allowed: a fraction in (0, 1]"),   # the value as given
    ("fitness", "window", float("inf"), "fitness.window: inf; allowed: a finite number"),
    ("fitness", "statistic", "x", "fitness.statistic: 'x'; allowed: final, auc"),
    ("fitness", "reference_seeds", 1, "fitness.reference_seeds: 1; allowed: an integer >= 2"),
    ("fitness", "num_seeds", 2**40, "fitness.num_seeds: 1099511627776; allowed: an integer of at most 2147483647"),
    ("fitness", "num_seeds", True, "fitness.num_seeds: True; allowed: an integer"),
    ("fitness", "num_seed", 1, "fitness.num_seed: unknown setting; allowed: num_seeds, statistic, window, "
     "nonfinite_floor, normalize, aggregate, control, reference_seeds, validation_top, validation_seeds "
     "(did you mean num_seeds?)"),
    ("es", "popsize", 1, "es.popsize: 1; allowed: an integer >= 2"),
    ("es", "std_decay", 0, "es.std_decay: 0; allowed: > 0 and <= 1 (1: no decay)"),
    ("es", "optimizer", "x", "es.optimizer: 'x'; allowed: adam, sgd, clipup"),
    ("baseline", "tuned_from", " ", "baseline.tuned_from: empty; allowed: a run directory whose tuned.json this run "
     "uses, or null (tune here)"),
    ("watchdog", "factor", 1, "watchdog.factor: 1; allowed: 0 (off) or a number >= 2"),
    ("devices", "num_cpu_devices", 0, "devices.num_cpu_devices: 0; allowed: auto (one per usable CPU core, or "
     "JAX_NUM_CPU_DEVICES) or a positive integer"),
    ("", "seed", -1, "seed: -1; allowed: an integer from 0 to 9223372036854775807"),
    ("", "es", 3, "es: 3; allowed: a mapping of strategy, popsize, std_init, lr, optimizer, adam_b1, std_decay, "
     "lr_decay, fitness_shaping, antithetic, _target_, args, generations, init_mean"),
])
def test_pydantic_errors_become_one_line_naming_the_field(section, key, value, line):
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(_with(section, key, value))
    assert str(err.value) == line


@pytest.mark.parametrize("config_cls, key, value, line", [
    (PPOConfig, "lr", 0.0, "lr: 0.0; allowed: > 0.0"),
    (PPOConfig, "num_envs", 2**31, "num_envs: 2147483648; allowed: an integer from 1 to 2147483647"),
    (DQNConfig, "gamma", float("nan"), "gamma: nan; allowed: >= 0.0 and <= 1.0"),
    (DQNConfig, "learning_starts", -1, "learning_starts: -1; allowed: an integer from 0 to 2147483647"),
    (QLearningConfig, "lr", 2.0, "lr: 2.0; allowed: > 0.0 and <= 1.0"),
])
def test_a_trainer_and_the_run_config_refuse_by_the_fields_declared_constraint(config_cls, key, value, line):
    """One path: the field's annotation says what is allowed (pydantic's constraint and description), and the
    trainer's ``validate()``, ``schema.validate`` and the run config's ``inner.KEY`` refuse through it, in its words."""
    declared = FieldInfo.from_annotation(typing.get_type_hints(config_cls, include_extras=True)[key])
    assert declared.metadata and line.endswith(f"; allowed: {declared.description}")
    for refuse in (config_cls(**{key: value}).validate, lambda: schema.validate(config_cls, {key: value})):
        with pytest.raises(SettingError) as err:
            refuse()
        assert str(err.value) == line
    algo = {PPOConfig: "ppo", DQNConfig: "dqn", QLearningConfig: "q_learning"}[config_cls]
    cfg = config_lib.from_dict({"experiment": "x", "env": "GridWorld", "inner": {"algo": algo, key: value}})
    with pytest.raises(ConfigError) as err:
        inner_config(cfg, task_specs(cfg)[0])
    assert str(err.value) == f"inner.{line}"


def _loosened(config_cls, names):
    """``config_cls`` with the fields ``names`` annotated by their bare types (a ``Literal``'s by ``str``)."""
    bare = typing.get_type_hints(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    namespace = {"__annotations__": {n: str if typing.get_origin(bare[n]) is Literal else bare[n] for n in names}}
    namespace.update({n: fields[n].default if fields[n].metadata.get("pytree_node", True)
                      else struct.field(pytree_node=False, default=fields[n].default) for n in names})
    return struct.dataclass(type(f"Loose{config_cls.__name__}", (config_cls,), namespace))


@pytest.mark.parametrize("config_cls", [PPOConfig, DQNConfig, QLearningConfig])
def test_a_trainer_config_checks_no_constraint_beside_its_fields_annotations(config_cls):
    """Loosen the float hyperparameters, the choices and the layer sizes to their bare types in a subclass, and
    ``validate()`` takes the values their annotations refuse: no hand-made check stands beside the declarations."""
    hints, bare = typing.get_type_hints(config_cls, include_extras=True), typing.get_type_hints(config_cls)
    outside = {float: -1.0, tuple: (0,), Literal: "x"}
    values = {name: outside[typing.get_origin(bare[name]) or bare[name]] for name in hints
              if typing.get_origin(hints[name]) is Annotated and name != "env_kwargs"
              and (typing.get_origin(bare[name]) or bare[name]) in outside}
    assert len(values) >= 4   # Q-learning: algorithm, lr, gamma, epsilon
    for name, value in values.items():
        with pytest.raises(SettingError, match=f"^{name}: "):
            config_cls(**{name: value}).validate()
    _loosened(config_cls, list(values))(**values).validate()
