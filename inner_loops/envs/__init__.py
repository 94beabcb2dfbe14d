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


def random_policy_return(name: str, key: jax.Array, num_envs: int = 16, num_steps: int = 1000) -> jax.Array:
    """Mean return of the episodes a uniformly random policy finishes in ``num_envs`` x ``num_steps``
    steps of environment ``name`` (the partial returns if none finishes): the floor a learned score
    is measured from. Jittable; every random number comes from ``key``."""
    env, params = make(name)
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


def _register_builtin() -> None:
    # Imported here, after `register` exists, because each module registers itself on import.
    from metarl.inner_loops.envs import doors, gridworld  # noqa: F401


_register_builtin()
