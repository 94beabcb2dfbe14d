"""From a run config to what the outer loop needs: a parameter template and a pure fitness function.

Three kinds of meta-learned part (``component.kind``):

- ``value_loss``: a component replaces PPO's value loss (by default the MLP of
  ``metarl.inner_loops.components.MLPValueLoss``);
- ``policy_objective``: a component replaces PPO's clipped objective (by default the LPO drift, ``LPODrift``);
- ``hyperparams``: the inner trainer's float hyperparameters, searched in a bounded space.

``component._target_`` names the component class (a class of your own with ``init(key)`` and
``apply(meta_params, ...)``; the other keys are its constructor arguments) and ``inner._target_`` the
trainer's config class, whose module provides ``make_train`` (see ``metarl.outer_loops.plugins``).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metarl.outer_loops import plugins
from metarl.config import INT32_MAX, ConfigError, RunConfig

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


def inner_config(cfg: RunConfig, spec: "TaskSpec | None" = None):
    """The trainer's own config for one task: ``cfg.inner`` with the task's ``inner`` on top, validated
    (errors name ``inner.X``, or ``tasks[i].inner.X`` for a task's own setting).

    Returns ``(name, module, config)``: ``inner.algo`` names a shipped trainer, ``inner._target_``
    (which wins) the config class of one of your own."""
    spec = spec or task_specs(cfg)[0]
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
        raise ConfigError("inner.env: set the environment with the top-level `env=ID` (or `tasks`)")
    for key in spec.inner:
        if key in ("algo", plugins.TARGET, "env"):
            raise ConfigError(f"{spec.path}.inner.{key}: set for the whole run; allowed: the trainer's own "
                              "settings (total_timesteps, num_envs, num_steps, hidden, ...)")
    inner.update(spec.inner)
    config_cls = plugins.locate(target, field)
    module = trainer_module(config_cls)
    try:
        takes_env = "env" in plugins.constructor_arguments(config_cls)[0]
        config = plugins.instantiate(target, inner, field, "inner.", injected={"env": spec.env} if takes_env else {})
        if callable(getattr(config, "validate", None)):
            config.validate()
    except ConfigError as err:
        raise ConfigError(_task_field(str(err), spec)) from None
    except ValueError as err:
        raise ConfigError(_task_field(f"inner.{err}", spec)) from None
    if spec.path != "env":
        _check_whole_updates(config, spec)
    return algo, module, config


def _task_field(message: str, spec) -> str:
    """A trainer's error for one task, naming where its setting came from: ``env`` or ``tasks[i].env``
    for the environment, ``tasks[i].inner.X`` for the task's own ``X``, ``inner.X`` otherwise."""
    for prefix in ("inner.env:", "env:"):
        if message.startswith(prefix):
            rest = message[len(prefix):]
            return f"env:{rest}" if spec.path == "env" else f"{spec.path}.env:{rest}"
    key = message.split(":", 1)[0].removeprefix("inner.").split(".")[0]
    if message.startswith("inner.") and key in spec.inner:
        return f"{spec.path}.{message}"
    return message


def _check_whole_updates(config, spec) -> None:
    """A task's budget must be the frames really trained (a whole number of the trainer's updates), so
    that budgets compared across tasks (say 4x longer) mean what they say."""
    total, trained = getattr(config, "total_timesteps", None), getattr(config, "frames_per_run", None)
    if total is None or trained is None or total == trained:
        return
    step = trained // max(1, getattr(config, "num_updates", 1)) or total
    raise ConfigError(f"{spec.path}.inner.total_timesteps: {total} is not a whole number of updates of {step} "
                      f"frames; allowed: a multiple of {step} such as {trained or step} or {trained + step}")


# --- tasks -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: an environment and the trainer settings that differ from the run's ``inner``."""

    name: str          # unique within its list; how logs, metrics and tables name it
    env: str
    inner: dict        # overrides of ``cfg.inner`` for this task
    path: str          # where it came from in the config, for error messages ("tasks[1]", or "env")


TASK_KEYS = ("env", "inner", "name")


def task_specs(cfg: RunConfig, field: str = "tasks") -> list[TaskSpec]:
    """``cfg.tasks`` (or ``cfg.eval_tasks``) as TaskSpecs; no ``tasks``: the one task ``env``."""
    items = getattr(cfg, field)
    if items is None:
        return [TaskSpec(cfg.env, cfg.env, {}, "env")] if field == "tasks" else []
    if field == "tasks" and not items:
        raise ConfigError("tasks: an empty list; allowed: a list of env ids or {env, inner, name} "
                          "mappings, or leave it unset and give `env=ID`")
    specs = []
    for i, item in enumerate(items):
        path = f"{field}[{i}]"
        if isinstance(item, str):
            item = {"env": item}
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: {item!r}; allowed: an env id or a mapping of {', '.join(TASK_KEYS)}")
        unknown = [k for k in item if k not in TASK_KEYS]
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}: unknown setting; allowed: {', '.join(TASK_KEYS)}")
        env, inner = item.get("env"), item.get("inner") or {}
        if not isinstance(env, str) or not env:
            raise ConfigError(f"{path}.env: {env!r}; allowed: an environment id")
        if not isinstance(inner, dict):
            raise ConfigError(f"{path}.inner: {inner!r}; allowed: a mapping of trainer settings")
        name = item.get("name") or _default_name(env, inner)
        specs.append(TaskSpec(str(name), env, dict(inner), path))
    names = [s.name for s in specs]
    for i, spec in enumerate(specs):
        if spec.name in names[:i]:
            raise ConfigError(f"{spec.path}.name: {spec.name!r} names two tasks; allowed: a unique `name` "
                              "for each")
    return specs


def _default_name(env: str, inner: dict) -> str:
    if not inner:
        return env
    return env + "[" + ",".join(f"{k}={v}" for k, v in sorted(inner.items())) + "]"


# --- hyperparameter search space -------------------------------------------------------------------

def _bound(path: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{path}: {value!r}; allowed: a finite number")
    return float(value)


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
            low, high = _bound(f"{path}.low", spec["low"]), _bound(f"{path}.high", spec["high"])
            log = spec.get("log", False)
            if not isinstance(log, bool):
                raise ConfigError(f"{path}.log: {log!r}; allowed: true or false")
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
    """What the outer loop evolves and how a member is scored, on one or several tasks."""

    kind: str
    algo: str
    component: Any                 # the component (MLPValueLoss, LPODrift, yours) or HyperparamSpace
    trainer: Any                   # the trainer's module: make_train(inner_config, **seams)
    specs: list                    # TaskSpec per task
    inner_configs: list            # the trainer config per task
    template: Any                  # the meta-parameters' pytree shape
    init_mean: Any                 # where the search starts
    fitness_fn: Callable           # (meta_params, key) -> raw score per task, shape (tasks,); higher is better
    statistic: Callable            # learning curve (..., updates) -> score, as in fitness_fn
    frames_per_eval: int           # environment frames in one member's inner runs, all tasks together
    trainers: list                 # per task: meta_params -> train(key) -> (params, metrics)
    baselines: list                # per task: train(key) -> (params, metrics) of the hand-designed rule
    control_fn: Callable           # key -> the baseline's raw score per task, as fitness_fn scores a member
    describe_search: Callable | None = None  # (mean, std) -> dict logged every generation

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def inner_config(self):
        """The first task's trainer config (the only one for a one-task run)."""
        return self.inner_configs[0]

    def make_train(self, meta, i: int = 0):
        """``train(key) -> (params, metrics)`` on task ``i`` with meta-parameters ``meta``."""
        return self.trainers[i](meta)


def final_window_mean(curve, window: float):
    """The mean of the last ``window`` fraction (at least one point) of ``curve``'s last axis, a NumPy or
    JAX array: a training's final return."""
    n = max(1, math.ceil(window * curve.shape[-1]))
    return curve[..., -n:].mean(axis=-1)


def statistic_fn(name: str, window: float) -> Callable[[jax.Array], jax.Array]:
    return {"final": lambda curve: final_window_mean(curve, window), "auc": lambda curve: curve.mean(axis=-1)}[name]


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


def component_from_config(cfg: RunConfig, specs: list | None = None):
    kind = cfg.component.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"component.kind: {kind!r}; allowed: {', '.join(KINDS)}")
    specs = task_specs(cfg) if specs is None else specs
    configs = [inner_config(cfg, spec) for spec in specs]
    algo = configs[0][0]
    inners = [c[2] for c in configs]
    # A trainer's searchable hyperparameters are its config's pytree fields (all fields of a plain
    # dataclass); a config that is no dataclass offers none.
    fields = dataclasses.fields(inners[0]) if dataclasses.is_dataclass(inners[0]) else ()
    floats = [f.name for f in fields if f.metadata.get("pytree_node", True)]
    return kind, algo, inners, _component_from_config(kind, cfg.component, floats)


def build_task(cfg: RunConfig, specs: list | None = None) -> Task:
    """Everything checked and built before any compilation; raises ConfigError on bad settings.

    ``specs`` replaces the run's own tasks (e.g. its held-out ``eval_tasks``)."""
    specs = task_specs(cfg) if specs is None else specs
    kind, algo, inners, component = component_from_config(cfg, specs)
    module = trainer_module(type(inners[0]))
    if kind in COMPONENTS and kind not in plugins.constructor_arguments(module.make_train)[0]:
        raise ConfigError(f"inner.algo: {algo!r} has no {kind} seam (make_train takes no {kind}=); allowed: "
                          "ppo, or a trainer whose make_train takes it")
    stat = statistic_fn(cfg.fitness.statistic, cfg.fitness.window)

    def trainer(inner):
        if kind == "hyperparams":
            return lambda meta: module.make_train(inner.replace(**component.decode(meta)))
        train_with_seam = module.make_train(inner, **{kind: component})
        return lambda meta: (lambda key: train_with_seam(key, {kind: meta}))

    if kind == "hyperparams":
        template = component.template()
        start = {name: getattr(inners[0], name) for name in component.names}
        init_mean = component.encode(start) if cfg.es.init_mean == "init" else template

        def describe_search(mean, std):
            # The search runs over z; report it in the hyperparameters' own units, with the band
            # decode(z -+ std), so a plot can show where the search stands every generation.
            low = jax.tree.map(lambda m, s: m - s, mean, std)
            high = jax.tree.map(lambda m, s: m + s, mean, std)
            return {"mean": component.decode(mean), "low": component.decode(low), "high": component.decode(high)}
    else:
        describe_search = None
        # The search runs over one flat vector indexed in int32: count before allocating anything.
        shapes = jax.eval_shape(component.init, jax.random.key(cfg.seed))
        num_dims = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
        if num_dims > INT32_MAX:
            field, what = (("component.hidden", f"{list(component.hidden)!r}") if hasattr(component, "hidden")
                           else ("component", type(component).__name__))
            raise ConfigError(f"{field}: {what} makes {num_dims:,} meta-parameters; "
                              f"allowed: at most {INT32_MAX:,} (smaller layers)")
        template = component.init(jax.random.key(cfg.seed))
        init_mean = (jax.tree.map(jnp.zeros_like, template) if cfg.es.init_mean == "zeros" else template)

    trainers = [trainer(inner) for inner in inners]
    baselines = [module.make_train(inner) for inner in inners]

    def score(trains, key):
        # Every task in one program; task i trains from its own stream of the seed key.
        return jnp.stack([stat(train(jax.random.fold_in(key, i) if i else key)[1]["episode_return"])
                          for i, train in enumerate(trains)])

    def fitness_fn(meta, key):
        return score([make(meta) for make in trainers], key)

    def control_fn(key):  # the hand-designed baseline, scored on a seed key as a member is
        return score(baselines, key)

    return Task(kind=kind, algo=algo, component=component, trainer=module, specs=specs, inner_configs=inners,
                template=template, init_mean=init_mean, fitness_fn=fitness_fn, statistic=stat,
                frames_per_eval=sum(_frames(inner) for inner in inners), trainers=trainers,
                baselines=baselines, control_fn=control_fn, describe_search=describe_search)


# --- memory -------------------------------------------------------------------------------------------

def _mlp_floats(sizes) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def _run_floats(algo: str, inner) -> int:
    """Floats one inner training holds at once, roughly: its rollout or replay storage, its networks
    (x4: parameters, gradients and Adam's two moments; DQN x5 with the target network), its table,
    and its per-update metrics."""
    from metarl.inner_loops import envs as envs_lib

    env, params = envs_lib.make(inner.env, **dict(getattr(inner, "env_kwargs", ())))
    obs = int(np.prod(env.observation_space(params).shape))
    space = env.action_space(params)
    actions = int(getattr(space, "n", 0) or np.prod(getattr(space, "shape", (1,))))
    if algo == "ppo":
        hidden = list(inner.hidden)
        nets = _mlp_floats([obs, *hidden, actions]) + _mlp_floats([obs, *hidden, 1])
        rollout = inner.num_envs * inner.num_steps * (2 * obs + 8)  # obs, final obs, 8 scalars per step
        return rollout + 4 * nets + 8 * inner.num_updates
    if algo == "dqn":
        net = _mlp_floats([obs, *inner.hidden, actions])
        replay = inner.buffer_size * (2 * obs + 3)  # obs, next obs, action, reward, done
        return replay + inner.batch_size * (2 * obs + max(inner.hidden)) + 5 * net + 8 * inner.num_logs
    if algo == "q_learning":
        states = env.num_states(params) if hasattr(env, "num_states") else 1
        return 8 * states * actions + 8 * inner.num_logs  # dynamics tables and the Q table
    return 0  # a trainer of your own: no estimate


# What each algorithm's storage grows with, to name in the advice when memory runs short.
_SIZE_FIELDS = {"ppo": "inner.num_envs", "dqn": "inner.buffer_size", "q_learning": "inner.total_timesteps"}
# XLA keeps temporaries (minibatches, activations, scan carries) beside the storage; a rough factor,
# set so the estimate sits just above the peak measured on an H100 in benchmarks/h100_sweep.json
# (value_loss, 4 envs x 64 steps, 2 seeds: 4.2 GiB measured at popsize 8192, 5.3 GiB estimated).
_XLA_OVERHEAD = 2


def check_memory(cfg: RunConfig, task: Task, available_bytes: Optional[int], members_here: int) -> int:
    """Refuse a generation that cannot fit; returns the estimate in bytes.

    One generation trains ``members_here`` (this device's share of es.popsize) x fitness.num_seeds
    agents at once, vmapped, and with ``fitness.control`` one control per seed beside them on every
    device, so, in float32 bytes:
        4 * (members_here + control) * num_seeds * run_floats * 2 (XLA's temporaries, _XLA_OVERHEAD)
        + 4 * es.popsize * num_dims * 3 (population, noise, shaped fitness) [+ 4 * num_dims^2 * 2 for CMA_ES]
    where run_floats is one member's training storage, all its tasks together (``_run_floats``).
    Rough on purpose: it is meant to catch a setting that is off by orders of magnitude before it
    compiles, not to budget a run.
    """
    run_floats = sum(_run_floats(task.algo, inner) for inner in task.inner_configs)  # every task at once
    num_dims = sum(int(np.size(x)) for x in jax.tree.leaves(task.template))
    es_floats = 3 * cfg.es.popsize * num_dims + (2 * num_dims ** 2 if cfg.es.strategy == "CMA_ES" else 0)
    runs = (members_here + (cfg.fitness.control != "none")) * cfg.fitness.num_seeds
    need = 4 * (runs * run_floats * _XLA_OVERHEAD + es_floats)
    if available_bytes and need > available_bytes:
        # Name the setting furthest above its default as the one to shrink first.
        excess = {"es.popsize": cfg.es.popsize / 16, "fitness.num_seeds": cfg.fitness.num_seeds / 2,
                  _SIZE_FIELDS.get(task.algo, "inner"): run_floats / 2**18}
        field = max(excess, key=excess.get)
        raise ConfigError(
            f"{field}: one generation needs about {_gib(need)} ({members_here} members x "
            f"{cfg.fitness.num_seeds} seeds x {_gib(4 * run_floats * _XLA_OVERHEAD)} per member and seed) but "
            f"{_gib(available_bytes)} is available; allowed: a smaller es.popsize, fitness.num_seeds or "
            f"{_SIZE_FIELDS.get(task.algo, 'the trainer sizes')} (or more devices)")
    return need


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _frames(inner) -> int:
    for attr in ("frames_per_run", "total_timesteps", "total_steps"):
        if hasattr(inner, attr):
            return int(getattr(inner, attr))
    return 0
