"""One place to build environments. An environment is named by a registered name (metarl's own,
gymnax's, or one a module of yours registers with ``register``), ``module:NAME`` (imports ``module``,
whose import registers ``NAME``), or the dotted path of a class or factory of your own, built with
its arguments:

    env: GridWorld                                      # a registered name (or a gymnax id)
    env: {_target_: GridWorld, size: 5}                 # the same, with arguments
    env: {_target_: my_envs.Corridor, length: 6}        # your class, my_envs.py importable

``make(name, **kwargs)`` returns ``(env, env_params)`` with the gymnax 1.0 interface (six-value
``step``; the trainers use ``reset_env``, ``step_env``, ``is_truncated``, ``observation_space``,
``action_space``): a factory returns that pair, or an environment whose ``default_params`` are used.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import jax

from metarl.inner_loops import plugins
from metarl.inner_loops.errors import SettingError

_REGISTRY: dict[str, str | Callable[..., Any]] = {}
_BUILT: dict = {}
INTERFACE = ("reset_env", "step_env", "is_truncated", "observation_space", "action_space")


def register(name: str, factory: str | Callable[..., Any]) -> None:
    """Register ``factory`` (a callable, or the dotted path of one, imported on first use) under
    ``name``; ``factory(**kwargs)`` returns ``(env, env_params)`` or an environment."""
    _REGISTRY[name] = factory
    _BUILT.clear()


def available() -> list[str]:
    """Every environment name ``make`` accepts (besides dotted paths)."""
    return sorted(set(_REGISTRY) | set(_gymnax().registered_envs))


def _gymnax():
    # Imported on use: importing gymnax starts JAX's backends (gymnax's FrozenLake builds arrays at import),
    # and a run sets its CPU device count first (metarl.devices.use_cpu_cores).
    # gymnax 1.0 imports `six` without declaring it; the project depends on it (see pyproject).
    import gymnax

    return gymnax


def from_config(value: Any, field: str) -> tuple[str, tuple | None]:
    """``(name, args)`` of an environment as a config writes it: a name (``args`` None), or
    ``{_target_: name or dotted path, **arguments}`` (``args``: sorted pairs, lists as tuples, so a
    trainer's static ``env_kwargs`` can hold them)."""
    args = None
    if isinstance(value, dict):
        args = tuple(sorted((k, _frozen(v)) for k, v in value.items() if k != plugins.TARGET))
        value, field = value.get(plugins.TARGET), f"{field}.{plugins.TARGET}"
    if not isinstance(value, str) or not value:
        raise SettingError(field, repr(value),
                           "an environment name (gymnax id, GridWorld, Doors, "
                           "module:NAME) or {_target_: NAME or dotted.path.Class, ...its arguments}")
    return value, args


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def label(name: str, args: tuple | None) -> str:
    """``CartPole-v1``; ``Corridor(length=6)`` for a target's last name and its arguments."""
    if args is None:
        return name
    return name.rsplit(".", 1)[-1] + ("(" + ",".join(f"{k}={v}" for k, v in args) + ")" if args else "")


def make(name: str, kwargs: Any = (), field: str = "env", /, **env_kwargs) -> tuple[Any, Any]:
    """``(env, env_params)`` of environment ``name`` with arguments ``kwargs`` (a mapping or pairs) and
    ``env_kwargs`` (gymnax's ``make(name, **kwargs)``), built once per process; a one-line ValueError names
    ``field`` (where ``name`` was set) or, for an argument, ``env.ARG`` (``tasks[1].env.ARG``)."""
    kwargs = {**dict(kwargs), **env_kwargs}
    try:
        key = (name, tuple(sorted(kwargs.items())))
        if key in _BUILT:
            return _BUILT[key]
    except TypeError:  # an unhashable argument: built every time
        key = None
    full = name
    if ":" in name and name not in _REGISTRY:
        module, name = name.split(":", 1)
        try:  # its import registers `name`
            importlib.import_module(module)
        except Exception as err:
            raise SettingError(field, f"{full!r} cannot be imported ({type(err).__name__}: {err})",
                               "module:NAME, the module importable (on the module path) and registering NAME") from None
    target = _REGISTRY.get(name) or (name if "." in name else None)
    if target is None and name in _gymnax().registered_envs:
        target = functools.partial(_gymnax().make, name)
    if target is None:
        raise SettingError(field, f"unknown environment {full!r}",
                           f"{', '.join(available())}, "
                           "or the dotted path of a gymnax environment class of your own")
    # Built eagerly even when called under a transformation (make_train inside jit or vmap), so that
    # the cached parameters are arrays, never a trace's tracers.
    with jax.ensure_compile_time_eval():
        if isinstance(target, str):
            built = plugins.instantiate(target, kwargs, field, f"{field.removesuffix('._target_')}.")
        else:
            try:
                built = target(**kwargs)
            except SettingError as err:  # an argument of the environment's, named as plugins name one
                raise err.at(f"{field.removesuffix('._target_')}.{err.field}") from None
            except (TypeError, ValueError) as err:
                raise SettingError(field, f"{full} failed to build ({type(err).__name__}: {err})") from None
    env, params = built if isinstance(built, tuple) else (built, getattr(built, "default_params", None))
    missing = [m for m in INTERFACE if not callable(getattr(env, m, None))] + ["default_params"] * (params is None)
    if missing:
        raise SettingError(field, f"{name} builds a {type(env).__name__} without {', '.join(missing)}",
                           "a gymnax Environment (reset_env, step_env, is_truncated, observation_space, "
                           "action_space, default_params)")
    if key is not None:
        _BUILT[key] = env, params
    return env, params


def check_discrete_actions(name: str, kwargs: dict, trainer: str) -> None:
    """Raise a one-line ValueError (field ``env``) unless ``name`` has a finite set of actions, which
    a trainer that scores every action (DQN, Q-learning) needs."""
    from gymnax.environments import spaces

    env, params = make(name, kwargs)
    space = env.action_space(params)
    if not isinstance(space, spaces.Discrete):
        raise SettingError("env", f"{name!r} has continuous actions ({type(space).__name__}) but {trainer} needs "
                           "a finite set", "an environment with discrete actions, such as CartPole-v1, Acrobot-v1, "
                           "GridWorld or Doors")


def check_tabular(name: str, kwargs: dict, trainer: str) -> None:
    """Raise a one-line ValueError (field ``env``) unless ``name`` enumerates its states, as a table
    of values needs."""
    check_discrete_actions(name, kwargs, trainer)
    env, _ = make(name, kwargs)
    if not hasattr(env, "num_states") or not hasattr(env, "state_from_index"):
        raise SettingError("env", f"{name!r} has no tabular interface (numbered states) but {trainer} keeps a "
                           "table of them", "GridWorld, Doors")


def step_auto_reset(env: Any) -> Callable:
    """``step(key, state, action, reset_obs, reset_state, params)`` for one environment: gymnax's
    ``env.step`` with the reset state given instead of drawn.

    ``env.step`` draws two random streams per call (a split, then a reset); a trainer that draws
    every reset state of a rollout in one batched call before its scan passes them in here, and
    the step only selects one where the episode ended. Returns ``(obs, state, reward, terminated,
    truncated, final_obs)``, where ``final_obs`` is the observation before any reset.
    """

    def step(key, state, action, reset_obs, reset_state, params):
        obs_st, state_st, reward, term, _ = env.step_env(key, state, action, params)
        trunc = env.is_truncated(state_st, params)
        done = jax.numpy.logical_or(term, trunc)
        state = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), reset_state, state_st)
        obs = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), reset_obs, obs_st)
        return obs, state, reward, term, trunc, obs_st

    return step


def random_policy_return(name: str, key: jax.Array, env_kwargs: Any = (), num_envs: int = 16,
                         num_steps: int = 1000) -> jax.Array:
    """Mean return of the episodes a uniformly random policy finishes in ``num_envs`` x ``num_steps``
    steps of environment ``name`` with ``env_kwargs`` (the partial returns if none finishes): the floor
    a learned score is measured from. Jittable; every random number comes from ``key``."""
    env, params = make(name, env_kwargs)
    space = env.action_space(params)
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, num_envs), params)

    def step(carry, key):
        state, ep_return, total, count = carry
        k_act, k_step = jax.random.split(key)
        action = jax.vmap(space.sample)(jax.random.split(k_act, num_envs))
        _, state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, num_envs), state, action, params)
        done = jax.numpy.logical_or(term, trunc)
        ep_return = ep_return + reward.astype(jax.numpy.float32)
        total = total + jax.numpy.sum(jax.numpy.where(done, ep_return, 0.0))
        count = count + jax.numpy.sum(done)
        return (state, jax.numpy.where(done, 0.0, ep_return), total, count), None

    zeros = jax.numpy.zeros(num_envs, jax.numpy.float32)
    (_, partial, total, count), _ = jax.lax.scan(step, (state, zeros, jax.numpy.float32(0.0), 0),
                                                 jax.random.split(k_run, num_steps))
    return jax.numpy.where(count > 0, total / jax.numpy.maximum(count, 1), jax.numpy.mean(partial))


# metarl's own environments, registered as a module of yours registers its own.
register("GridWorld", "metarl.inner_loops.envs.gridworld.make_gridworld")
register("Doors", "metarl.inner_loops.envs.doors.make_doors")
register("Brax", "metarl.inner_loops.envs.brax_envs.Brax")               # extra: metarl[brax]
register("XMiniGrid", "metarl.inner_loops.envs.xminigrid_envs.XMiniGrid")  # extra: metarl[xminigrid]
