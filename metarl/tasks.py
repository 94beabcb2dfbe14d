"""From a run config to what the outer loop needs: a parameter template and a pure fitness function.

Three kinds of meta-learned part (``component.kind``):

- ``value_loss``: a component replaces PPO's value loss (by default the MLP of
  ``metarl.inner_loops.components.MLPValueLoss``);
- ``policy_objective``: a component replaces PPO's clipped objective (by default the LPO drift, ``LPODrift``);
- ``hyperparams``: the inner trainer's float hyperparameters, searched in a bounded space.

``component._target_`` names the component class (a class of your own with ``init(key)`` and
``apply(meta_params, ...)``; the other keys are its constructor arguments) and ``inner._target_`` the
trainer's config class, whose module provides ``make_train`` (see ``metarl.plugins``).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metarl import plugins
from metarl.config import ConfigError, RunConfig

# The shipped trainers by name (inner.algo): their config classes, each in a module with make_train.
# Imported on use so a trainer's import cost is paid only by its runs.
TRAINERS = {
    "ppo": "metarl.inner_loops.ppo.PPOConfig",
    "dqn": "metarl.inner_loops.dqn.DQNConfig",
    "q_learning": "metarl.inner_loops.q_learning.QLearningConfig",
}
KINDS = ("value_loss", "policy_objective", "hyperparams")
# The shipped component of each learned kind, used where `component._target_` is not given.
COMPONENTS = {
    "value_loss": "metarl.inner_loops.components.MLPValueLoss",
    "policy_objective": "metarl.inner_loops.components.LPODrift",
}


def trainer_module(config_cls):
    """The module holding a trainer config class; it must provide ``make_train(config, ...)``."""
    module = importlib.import_module(config_cls.__module__)
    if not callable(getattr(module, "make_train", None)):
        raise ConfigError(f"inner._target_: {config_cls.__module__} has no make_train(config); allowed: a "
                          "config class whose module defines make_train(config) -> train(key, meta_params=None)")
    return module


def inner_config(cfg: RunConfig):
    """The trainer's own config from ``cfg.inner`` and ``cfg.env``, validated (errors name ``inner.X``).

    Returns ``(name, module, config)``: ``inner.algo`` names a shipped trainer, ``inner._target_``
    (which wins) the config class of one of your own."""
    inner = dict(cfg.inner)
    algo = inner.pop("algo", "ppo")
    target = inner.pop(plugins.TARGET, None)
    if target is None:
        if algo not in TRAINERS:
            raise ConfigError(f"inner.algo: unknown trainer {algo!r}; allowed: {', '.join(TRAINERS)} "
                              "(or inner._target_: a config class of your own)")
        target, field = TRAINERS[algo], "inner.algo"
    else:
        algo, field = target, "inner._target_"
    if "env" in inner:
        raise ConfigError("inner.env: set the environment with the top-level `env=ID`")
    config_cls = plugins.locate(target, field)
    module = trainer_module(config_cls)
    try:
        takes_env = "env" in plugins.constructor_arguments(config_cls)[0]
        config = plugins.instantiate(target, inner, field, "inner.", injected={"env": cfg.env} if takes_env else {})
        if callable(getattr(config, "validate", None)):
            config.validate()
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message.replace("inner.env:", "env:", 1) if message.startswith("inner.env:")
                          else message) from None
    except ValueError as err:
        message = str(err)
        raise ConfigError(message if message.startswith("env:") else f"inner.{message}") from None
    return algo, module, config


# --- hyperparameter search space -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HyperparamSpace:
    """Each hyperparameter is ``low + (high - low) * sigmoid(z)``, in log space where ``log``; the
    search runs over unbounded ``z``, so every member is a valid setting."""

    names: tuple
    low: tuple
    high: tuple
    log: tuple

    @classmethod
    def from_config(cls, search: dict, trainer_fields: list[str]):
        if not search:
            raise ConfigError("component.search: empty; allowed: a mapping of hyperparameter -> {low, high, log}")
        names, lows, highs, logs = [], [], [], []
        for name, spec in search.items():
            path = f"component.search.{name}"
            if name not in trainer_fields:
                raise ConfigError(f"{path}: not a hyperparameter of the trainer; allowed: {', '.join(trainer_fields)}")
            if not isinstance(spec, dict) or "low" not in spec or "high" not in spec:
                raise ConfigError(f"{path}: {spec!r}; allowed: {{low: number, high: number, log: bool}}")
            extra = set(spec) - {"low", "high", "log"}
            if extra:
                raise ConfigError(f"{path}.{sorted(extra)[0]}: unknown setting; allowed: low, high, log")
            low, high, log = float(spec["low"]), float(spec["high"]), bool(spec.get("log", False))
            if not low < high:
                raise ConfigError(f"{path}: low {low} must be below high {high}")
            if log and low <= 0:
                raise ConfigError(f"{path}.low: {low}; allowed: > 0 on a log scale")
            names.append(name), lows.append(low), highs.append(high), logs.append(log)
        return cls(tuple(names), tuple(lows), tuple(highs), tuple(logs))

    def _bounds(self, i):
        if self.log[i]:
            return math.log(self.low[i]), math.log(self.high[i])
        return self.low[i], self.high[i]

    def decode(self, z: dict) -> dict:
        out = {}
        for i, name in enumerate(self.names):
            lo, hi = self._bounds(i)
            u = lo + (hi - lo) * jax.nn.sigmoid(z[name])
            out[name] = jnp.exp(u) if self.log[i] else u
        return out

    def encode(self, values: dict) -> dict:
        out = {}
        for i, name in enumerate(self.names):
            lo, hi = self._bounds(i)
            v = float(values[name])
            u = math.log(v) if self.log[i] else v
            if not lo < u < hi:
                raise ConfigError(f"component.search.{name}: the starting value {v} lies outside "
                                  f"({self.low[i]}, {self.high[i]}); allowed: a range that contains it")
            p = (u - lo) / (hi - lo)
            out[name] = jnp.float32(math.log(p / (1 - p)))
        return out

    def template(self) -> dict:
        return {name: jnp.zeros((), jnp.float32) for name in self.names}


# --- the task --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Task:
    kind: str
    algo: str
    component: Any                 # the component (MLPValueLoss, LPODrift, yours) or HyperparamSpace
    inner_config: Any
    trainer: Any                   # the trainer's module: make_train(inner_config, **seams)
    template: Any                  # the meta-parameters' pytree shape
    init_mean: Any                 # where the search starts
    fitness_fn: Callable           # (meta_params, key) -> scalar, higher is better
    frames_per_eval: int           # environment frames in one inner run
    make_train: Callable           # meta_params-aware: (meta_params) -> train(key) -> (params, metrics)
    describe_search: Callable | None = None  # (mean, std) -> dict logged every generation


def statistic_fn(name: str, window: float) -> Callable[[jax.Array], jax.Array]:
    def final(curve):
        n = max(1, math.ceil(window * curve.shape[-1]))
        return jnp.mean(curve[..., -n:], axis=-1)

    def auc(curve):
        return jnp.mean(curve, axis=-1)

    return {"final": final, "auc": auc}[name]


def _component_from_config(kind: str, spec: dict, trainer_fields: list[str]):
    spec = dict(spec)
    spec.pop("kind", None)
    if kind == "hyperparams":
        if plugins.TARGET in spec:
            raise ConfigError(f"component._target_: {spec[plugins.TARGET]!r} with kind hyperparams; allowed: "
                              f"a component class for kinds {', '.join(COMPONENTS)}")
        for key in spec:
            if key != "search":
                raise ConfigError(f"component.{key}: unknown setting; allowed: kind, search")
        return HyperparamSpace.from_config(spec.get("search", {}), trainer_fields)
    target = spec.pop(plugins.TARGET, None) or COMPONENTS[kind]
    component = plugins.instantiate(target, spec, "component._target_", "component.")
    if not (callable(getattr(component, "init", None)) and callable(getattr(component, "apply", None))):
        raise ConfigError(f"component._target_: {target} has no init(key) and apply(meta_params, ...); "
                          "allowed: a component class with both (see metarl.inner_loops.components)")
    return component


def component_from_config(cfg: RunConfig):
    kind = cfg.component.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"component.kind: {kind!r}; allowed: {', '.join(KINDS)}")
    algo, _, inner = inner_config(cfg)
    # A trainer's searchable hyperparameters are its config's pytree fields (all fields of a plain
    # dataclass); a config that is no dataclass offers none.
    fields = dataclasses.fields(inner) if dataclasses.is_dataclass(inner) else ()
    floats = [f.name for f in fields if f.metadata.get("pytree_node", True)]
    return kind, algo, inner, _component_from_config(kind, cfg.component, floats)


def build_task(cfg: RunConfig) -> Task:
    """Everything checked and built before any compilation; raises ConfigError on bad settings."""
    kind, algo, inner, component = component_from_config(cfg)
    module = trainer_module(type(inner))
    if kind in COMPONENTS and kind not in plugins.constructor_arguments(module.make_train)[0]:
        raise ConfigError(f"inner.algo: {algo!r} has no {kind} seam (make_train takes no {kind}=); allowed: "
                          "ppo, or a trainer whose make_train takes it")
    stat = statistic_fn(cfg.fitness.statistic, cfg.fitness.window)

    if kind == "hyperparams":
        template = component.template()
        start = {name: getattr(inner, name) for name in component.names}
        init_mean = component.encode(start) if cfg.es.init_mean == "init" else template

        def make_train(meta):
            train = module.make_train(inner.replace(**component.decode(meta)))
            return lambda key: train(key)

        def describe_search(mean, std):
            # The search runs over z; report it in the hyperparameters' own units, with the band
            # decode(z -+ std), so a plot can show where the search stands every generation.
            low = jax.tree.map(lambda m, s: m - s, mean, std)
            high = jax.tree.map(lambda m, s: m + s, mean, std)
            return {"mean": component.decode(mean), "low": component.decode(low), "high": component.decode(high)}
    else:
        describe_search = None
        template = component.init(jax.random.key(cfg.seed))
        init_mean = (jax.tree.map(jnp.zeros_like, template) if cfg.es.init_mean == "zeros" else template)
        seam = {kind: component}
        train_with_seam = module.make_train(inner, **seam)

        def make_train(meta):
            return lambda key: train_with_seam(key, {kind: meta})

    def fitness_fn(meta, key):
        _, metrics = make_train(meta)(key)
        return stat(metrics["episode_return"])

    return Task(kind=kind, algo=algo, component=component, inner_config=inner, trainer=module, template=template,
                init_mean=init_mean, fitness_fn=fitness_fn, frames_per_eval=_frames(inner),
                make_train=make_train, describe_search=describe_search)


def _frames(inner) -> int:
    for attr in ("frames_per_run", "total_timesteps", "total_steps"):
        if hasattr(inner, attr):
            return int(getattr(inner, attr))
    return 0

