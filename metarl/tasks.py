"""From a run config to what the outer loop needs: a parameter template and a pure fitness function.

Three kinds of meta-learned part (``component.kind``):

- ``value_loss``: an MLP replaces PPO's value loss (``metarl.inner_loops.components.MLPValueLoss``);
- ``policy_objective``: a learned LPO drift replaces PPO's clipping (``LPODrift``);
- ``hyperparams``: the inner trainer's float hyperparameters, searched in a bounded space.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metarl.inner_loops.components import VALUE_LOSS_INPUTS, LPODrift, MLPValueLoss
from metarl.config import ConfigError, RunConfig

# algo name -> (module, config class); imported on use so a trainer's import cost is paid only by its runs.
TRAINERS = {
    "ppo": ("metarl.inner_loops.ppo", "PPOConfig"),
    "dqn": ("metarl.inner_loops.dqn", "DQNConfig"),
    "q_learning": ("metarl.inner_loops.q_learning", "QLearningConfig"),
}
KINDS = ("value_loss", "policy_objective", "hyperparams")
# Seams a kind plugs into, per trainer.
_SEAMS = {"value_loss": "ppo", "policy_objective": "ppo"}


def trainer_module(algo: str):
    if algo not in TRAINERS:
        raise ConfigError(f"inner.algo: unknown trainer {algo!r}; allowed: {', '.join(TRAINERS)}")
    module_name, config_name = TRAINERS[algo]
    module = importlib.import_module(module_name)
    return module, getattr(module, config_name)


def inner_config(cfg: RunConfig):
    """The trainer's own config from ``cfg.inner`` and ``cfg.env``, validated (errors name ``inner.X``)."""
    inner = dict(cfg.inner)
    algo = inner.pop("algo", "ppo")
    module, config_cls = trainer_module(algo)
    fields = [f.name for f in dataclasses.fields(config_cls)]
    if "env" in inner:
        raise ConfigError("inner.env: set the environment with the top-level `env=ID`")
    for key in inner:
        if key not in fields:
            raise ConfigError(f"inner.{key}: unknown setting for {algo}; allowed: "
                              f"{', '.join(f for f in fields if f != 'env')}")
    inner = {k: tuple(v) if isinstance(v, list) else v for k, v in inner.items()}
    try:
        config = config_cls(env=cfg.env, **inner)
        config.validate()
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
    component: Any                 # MLPValueLoss, LPODrift or HyperparamSpace
    inner_config: Any
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
    if kind == "value_loss":
        allowed = ("hidden", "inputs", "residual")
        _refuse_unknown(spec, allowed)
        hidden = tuple(spec.get("hidden", (64, 64)))
        inputs = tuple(spec.get("inputs", ("error",)))
        bad = [i for i in inputs if i not in VALUE_LOSS_INPUTS]
        if bad or not inputs:
            raise ConfigError(f"component.inputs: {list(inputs)!r}; allowed: a non-empty subset of "
                              f"{', '.join(VALUE_LOSS_INPUTS)}")
        _check_hidden(hidden)
        return MLPValueLoss(hidden=hidden, inputs=inputs, residual=bool(spec.get("residual", False)))
    if kind == "policy_objective":
        _refuse_unknown(spec, ("hidden", "ppo_init"))
        hidden = tuple(spec.get("hidden", (128,)))
        _check_hidden(hidden)
        return LPODrift(hidden=hidden, ppo_init=bool(spec.get("ppo_init", True)))
    _refuse_unknown(spec, ("search",))
    return HyperparamSpace.from_config(spec.get("search", {}), trainer_fields)


def _refuse_unknown(spec, allowed):
    for key in spec:
        if key not in allowed:
            raise ConfigError(f"component.{key}: unknown setting; allowed: kind, {', '.join(allowed)}")


def _check_hidden(hidden):
    if not hidden or any(not isinstance(h, int) or isinstance(h, bool) or h <= 0 for h in hidden):
        raise ConfigError(f"component.hidden: {list(hidden)!r}; allowed: a non-empty list of positive integers")


def component_from_config(cfg: RunConfig):
    kind = cfg.component.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"component.kind: {kind!r}; allowed: {', '.join(KINDS)}")
    algo, _, inner = inner_config(cfg)
    floats = [f.name for f in dataclasses.fields(inner) if f.metadata.get("pytree_node", True)]
    return kind, algo, inner, _component_from_config(kind, cfg.component, floats)


def build_task(cfg: RunConfig) -> Task:
    """Everything checked and built before any compilation; raises ConfigError on bad settings."""
    kind, algo, inner, component = component_from_config(cfg)
    module, _ = trainer_module(algo)
    if kind in _SEAMS and algo != _SEAMS[kind]:
        raise ConfigError(f"inner.algo: {algo!r} has no {kind} seam; allowed: {_SEAMS[kind]}")
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

    return Task(kind=kind, algo=algo, component=component, inner_config=inner, template=template,
                init_mean=init_mean, fitness_fn=fitness_fn, frames_per_eval=_frames(inner),
                make_train=make_train, describe_search=describe_search)


def _frames(inner) -> int:
    for attr in ("frames_per_run", "total_timesteps", "total_steps"):
        if hasattr(inner, attr):
            return int(getattr(inner, attr))
    return 0

