"""From a run config to what the outer loop needs: a parameter template and a pure fitness function."""
from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable

import jax
import numpy as np

from metarl import kinds
from metarl.config import RunConfig
from metarl.errors import ConfigError, layer_errors, layer_path
from metarl.inner_loops import envs as envs_lib, plugins, trainer as trainer_protocol
from metarl.outer_loops.fitness import statistic_fn, task_scores

# inner.algo -> config class (its module has make_train); imported on use, so only its runs pay the import.
TRAINERS = {"ppo": "metarl.inner_loops.ppo.PPOConfig", "dqn": "metarl.inner_loops.dqn.DQNConfig",
            "q_learning": "metarl.inner_loops.q_learning.QLearningConfig"}


def inner_config(cfg: RunConfig, spec: TaskSpec):
    """``(name, module, config)`` for one task: ``cfg.inner`` under the task's ``inner``, validated (errors name
    ``inner.X`` or ``tasks[i].inner.X``). ``inner._target_`` (your config class) wins over ``inner.algo``."""
    inner = dict(cfg.inner)
    algo, target = inner.pop("algo", "ppo"), inner.pop(plugins.TARGET, None)
    if target is None and algo not in TRAINERS:
        raise ConfigError(f"inner.algo: unknown trainer {algo!r}; allowed: {', '.join(TRAINERS)} "
                          "(or inner._target_: a config class of your own)")
    field = "inner.algo" if target is None else "inner._target_"
    algo, target = (algo, TRAINERS[algo]) if target is None else (target, target)
    for key in {"env", "env_kwargs"} & set(inner):
        raise ConfigError(f"inner.{key}: set the environment with the top-level `env` (or `tasks`)")
    for key in [k for k in spec.inner if k in ("algo", plugins.TARGET, "env", "env_kwargs")]:
        raise ConfigError(f"{spec.path}.inner.{key}: set for the whole run; allowed: the trainer's own "
                          "settings (total_timesteps, num_envs, num_steps, hidden, ...)")
    inner.update(spec.inner)
    env_field = "env" if spec.path == "env" else f"{spec.path}.env"

    def field_of(key: str) -> str:  # the trainer's class, the task's env (env.ARG), its own inner or the run's
        if key == plugins.TARGET:
            return field
        if key.split(".")[0] == "env":
            return env_field + key[3:]
        return f"{spec.path}.inner.{key}" if key.split(".")[0] in spec.inner else layer_path("inner", key)

    with layer_errors(field_of):  # the trainer, its environment and its config name their own settings
        config_cls = plugins.locate(target)
        module = importlib.import_module(config_cls.__module__)
        if not callable(getattr(module, "make_train", None)):
            raise ConfigError(f"inner._target_: {config_cls.__module__} has no make_train(config); allowed: a "
                              "config class whose module defines make_train(config) -> train(key, meta_params=None)")
        envs_lib.make(spec.env, spec.env_args or (), "env" if spec.env_args is None else "env._target_")
        env = {"env": spec.env, "env_kwargs": spec.env_args or ()}  # for a config class that takes them
        env = {k: v for k, v in env.items() if k in plugins.constructor_arguments(config_cls)[0]}
        config = plugins.instantiate(target, inner, injected=env)
        if callable(getattr(config, "validate", None)):
            config.validate()
    # A budget must be the frames really trained (whole updates), so budgets compared across tasks mean what they say.
    total, trained = getattr(config, "total_timesteps", None), trainer_protocol.frames_per_run(config)
    if spec.path != "env" and total is not None and trained and total != trained:
        step = trained // max(1, trainer_protocol.num_updates(config)) or total
        raise ConfigError(f"{spec.path}.inner.total_timesteps: {total} is not a whole number of updates of "
                          f"{step} frames; allowed: a multiple of {step} such as {trained} or {trained + step}")
    return algo, module, config


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: an environment and the trainer settings that differ from the run's ``inner``."""
    name: str          # unique within its list; how logs, metrics and tables name it
    env: str           # a registered name or a dotted path (``metarl.inner_loops.envs``)
    inner: dict        # overrides of ``cfg.inner`` for this task
    path: str          # where it came from in the config, for error messages ("tasks[1]", or "env")
    env_args: tuple | None = None  # ((argument, value), ...) of the {_target_: ...} form; None: a plain name

    def random_return(self, key):
        """Random play's return on this task from ``key``: the floor a normalised score starts from."""
        return envs_lib.random_policy_return(self.env, key, self.env_args or ())


def task_specs(cfg: RunConfig, field: str = "tasks") -> list[TaskSpec]:
    """``cfg.tasks`` (or ``cfg.eval_tasks``) as TaskSpecs; no ``tasks``: the one task ``env``."""
    items = getattr(cfg, field)
    if items is None:
        return [_spec({"env": cfg.env}, "env", "env")] if field == "tasks" else []
    if field == "tasks" and not items:
        raise ConfigError("tasks: an empty list; allowed: a list of env ids or {env, inner, name} "
                          "mappings, or leave it unset and give `env=ID`")
    specs = [_spec(item, f"{field}[{i}]", f"{field}[{i}].env") for i, item in enumerate(items)]
    for i, spec in enumerate(specs):
        if spec.name in [s.name for s in specs[:i]]:
            raise ConfigError(f"{spec.path}.name: {spec.name!r} names two tasks; allowed: a unique `name` for each")
    return specs


def _spec(item: str | dict, path: str, env_field: str) -> TaskSpec:
    keys = ("env", "inner", "name")
    if not isinstance(item, (str, dict)):
        raise ConfigError(f"{path}: {item!r}; allowed: an env id or a mapping of {', '.join(keys)}")
    item = {"env": item} if isinstance(item, str) else item
    unknown = [k for k in item if k not in keys]
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown setting; allowed: {', '.join(keys)}")
    with layer_errors(str):  # named as given
        (env, args), inner = envs_lib.from_config(item.get("env"), env_field), item.get("inner") or {}
    if not isinstance(inner, dict):
        raise ConfigError(f"{path}.inner: {inner!r}; allowed: a mapping of trainer settings")
    return TaskSpec(str(item.get("name") or default_name(env, args, inner)), env, dict(inner), path, args)


def default_name(env: str, args: tuple | None, inner: dict) -> str:
    """The env's label (``envs.label``) and the task's own trainer settings: ``CartPole-v1[num_envs=8]``."""
    settings = ",".join(f"{k}={v}" for k, v in sorted(inner.items()))
    return envs_lib.label(env, args) + (f"[{settings}]" if inner else "")


@dataclasses.dataclass
class TaskSet:
    """What the outer loop evolves and how a member is scored, on one or several tasks."""
    kind: kinds.Kind
    algo: str
    component: Any                 # the component (MLPValueLoss, LPODrift, yours) or a HyperparamSpace
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

    names = property(lambda self: [s.name for s in self.specs])
    inner_config = property(lambda self: self.inner_configs[0])   # the first task's (a one-task run's only one)


def build_task(cfg: RunConfig, specs: list | None = None) -> TaskSet:
    """Check and build all before compiling (ConfigError on bad settings); ``specs`` replaces the run's tasks."""
    specs = task_specs(cfg) if specs is None else specs
    kind = kinds.get(cfg.component.get("kind"))
    configs = [inner_config(cfg, spec) for spec in specs]
    algo, module, _ = configs[0]
    inners = [c[2] for c in configs]
    # Searchable hyperparameters: the config's pytree fields (all of a plain dataclass; none if no dataclass).
    fields = dataclasses.fields(inners[0]) if dataclasses.is_dataclass(inners[0]) else ()
    component = kind.build({k: v for k, v in cfg.component.items() if k != "kind"},
                           [f.name for f in fields if f.metadata.get("pytree_node", True)])
    if kind.seam is not None and kind.seam not in trainer_protocol.seams(module):
        raise ConfigError(f"inner.algo: {algo!r} has no {kind.seam} seam (its module's SEAMS does not list it); "
                          "allowed: ppo, or a trainer whose make_train takes it and whose SEAMS lists it")
    stat = statistic_fn(cfg.fitness.statistic, cfg.fitness.window)
    template, init_mean, describe_search = kind.start(component, inners[0], cfg.es.init_mean, cfg.seed)
    trainers = [kind.trainer(module, inner, component) for inner in inners]
    baselines = [module.make_train(inner) for inner in inners]
    return TaskSet(kind=kind, algo=algo, component=component, trainer=module, specs=specs, inner_configs=inners,
                   template=template, init_mean=init_mean, statistic=stat, trainers=trainers, baselines=baselines,
                   fitness_fn=lambda meta, key: task_scores([make(meta) for make in trainers], stat, key),
                   control_fn=lambda key: task_scores(baselines, stat, key), describe_search=describe_search,
                   frames_per_eval=sum(trainer_protocol.frames_per_run(inner) for inner in inners))


# XLA keeps temporaries (minibatches, activations, scan carries) beside the storage; a rough factor, set so
# that the estimate sits just above the peak memory measured on a GPU (docs/studies/speed.md, "On a GPU").
_XLA_OVERHEAD = 2


def check_memory(cfg: RunConfig, task: TaskSet, available_bytes: int | None, members_here: int) -> int:
    """Refuse a generation that cannot fit; returns the estimate in bytes. Rough on purpose: it catches a setting
    off by orders of magnitude before compiling. ``members_here``: this device's share of es.popsize."""
    floats = [trainer_protocol.memory_floats(inner) for inner in task.inner_configs]
    if None in floats and available_bytes:  # a check would run: say what it leaves out
        print(f"warning: inner._target_: {task.algo} declares no memory_floats(), so the memory check counts "
              "the search only, not the trainings; add memory_floats() -> int (floats one training holds) "
              "to its config class", file=sys.stderr)
    run_floats = sum(f or 0 for f in floats)  # every task at once
    num_dims = sum(int(np.size(x)) for x in jax.tree.leaves(task.template))
    # the population, its noise and its shaped fitness, and the strategy's own state
    es_floats = 3 * cfg.es.popsize * num_dims + cfg.es.state_floats(num_dims)
    runs = (members_here + (cfg.fitness.control != "none")) * cfg.fitness.num_seeds
    need = 4 * (runs * run_floats * _XLA_OVERHEAD + es_floats)
    if available_bytes and need > available_bytes:
        # Name the setting furthest above its default as the one to shrink first.
        size_field = layer_path("inner", trainer_protocol.memory_field(task.inner_config))
        excess = {"es.popsize": cfg.es.popsize / 16, "fitness.num_seeds": cfg.fitness.num_seeds / 2,
                  size_field: run_floats / 2**18}
        field = max(excess, key=excess.get)
        raise ConfigError(
            f"{field}: one generation needs about {_gib(need)} ({members_here} members x "
            f"{cfg.fitness.num_seeds} seeds x {_gib(4 * run_floats * _XLA_OVERHEAD)} per member and seed) but "
            f"{_gib(available_bytes)} is available; allowed: a smaller es.popsize, fitness.num_seeds or "
            f"{size_field} (or more devices)")
    return need


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"

