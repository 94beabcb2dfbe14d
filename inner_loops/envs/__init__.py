"""One place to build environments by name: metarl's own JAX environments, then gymnax's.

``make(name)`` returns ``(env, env_params)`` with the gymnax 1.0 interface (six-value ``step``).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

# gymnax 1.0 imports `six` without declaring it; the project depends on it (see pyproject).
import gymnax

_REGISTRY: dict[str, Callable[..., tuple[Any, Any]]] = {}


def register(name: str, factory: Callable[..., tuple[Any, Any]]) -> None:
    """Register ``factory(**kwargs) -> (env, env_params)`` under ``name``."""
    _REGISTRY[name] = factory


def available() -> list[str]:
    """Every environment name ``make`` accepts."""
    return sorted(set(_REGISTRY) | set(gymnax.registered_envs))


def make(name: str, **kwargs) -> tuple[Any, Any]:
    if name in _REGISTRY:
        return _REGISTRY[name](**kwargs)
    if name in gymnax.registered_envs:
        return gymnax.make(name, **kwargs)
    raise ValueError(f"env: unknown environment {name!r}; allowed: {', '.join(available())}")


def check_name(name: str, field: str = "env") -> None:
    """Raise a one-line ValueError naming ``field`` if ``name`` is not a known environment."""
    if name not in _REGISTRY and name not in gymnax.registered_envs:
        raise ValueError(f"{field}: unknown environment {name!r}; allowed: {', '.join(available())}")


def _action_space(name: str, kwargs: dict):
    env, params = make(name, **kwargs)
    return env, env.action_space(params)


def check_discrete_actions(name: str, kwargs: dict, trainer: str) -> None:
    """Raise a one-line ValueError (field ``env``) unless ``name`` has a finite set of actions, which
    a trainer that scores every action (DQN, Q-learning) needs."""
    from gymnax.environments import spaces

    _, space = _action_space(name, kwargs)
    if not isinstance(space, spaces.Discrete):
        raise ValueError(f"env: {name!r} has continuous actions ({type(space).__name__}) but {trainer} needs "
                         "a finite set; allowed: an environment with discrete actions, such as "
                         "CartPole-v1, Acrobot-v1, GridWorld or Doors")


def check_tabular(name: str, kwargs: dict, trainer: str) -> None:
    """Raise a one-line ValueError (field ``env``) unless ``name`` enumerates its states, as a table
    of values needs."""
    check_discrete_actions(name, kwargs, trainer)
    env, _ = _action_space(name, kwargs)
    if not hasattr(env, "num_states") or not hasattr(env, "state_from_index"):
        raise ValueError(f"env: {name!r} has no tabular interface (numbered states) but {trainer} keeps a "
                         "table of them; allowed: GridWorld, Doors")


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


def _register_builtin() -> None:
    # Imported here, after `register` exists, because each module registers itself on import.
    from metarl.inner_loops.envs import doors, gridworld  # noqa: F401


_register_builtin()
