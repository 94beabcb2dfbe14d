"""Tabular Q-learning and expected SARSA for deterministic environments with numbered states.

The environment must offer the tabular interface of ``metarl.inner_loops.envs.gridworld``:
``num_states(params)``, ``state_from_index(i, params)`` and ``state_index(state, params)``, and be
deterministic (GridWorld and Doors are). Before training, the registered environment's own
``step_env`` and ``reset_env`` are evaluated once for every (state, action) pair into small lookup
tables, so the training loop follows exactly the dynamics of the environment class while paying one
table lookup per step instead of a full ``env.step`` (whose reset-every-step and pytree selects
dominate the cost of a tabular update on CPU).

Exploration is epsilon-greedy; the greedy action is drawn uniformly among all maximal actions.
Random numbers are drawn once per log interval and the step loop is unrolled, because per-operation
overhead, not arithmetic, bounds the speed of a tabular loop on the CPU.

Usage::

    import jax
    from metarl.inner_loops.q_learning import QLearningConfig, make_train

    config = QLearningConfig(total_timesteps=100_000, log_interval=10_000)
    q_table, metrics = jax.jit(make_train(config))(jax.random.key(0))    # q_table: (96, 4)
    # many agents in one call; float hyperparameters are pytree leaves, so this compiles once:
    lrs = jax.numpy.array([0.05, 0.1, 0.2])
    train_lr = lambda lr, k: make_train(config.replace(lr=lr))(k)
    q_tables, metrics = jax.jit(jax.vmap(train_lr))(lrs, jax.random.split(jax.random.key(0), 3))
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from pydantic import Field

from metarl.inner_loops import envs, trainer
from metarl.inner_loops.config_checks import Choice, Count, Fraction, Items, check_fields
from metarl.inner_loops.config_checks import with_overrides
from metarl.inner_loops.config_checks import static as _static
from metarl.inner_loops.errors import SettingError

ALGORITHMS = ("q_learning", "expected_sarsa")
# Float hyperparameters: pytree leaves that evolution (or vmap) may vary without recompiling.
FLOAT_FIELDS = ("lr", "gamma", "epsilon", "q_init")


@struct.dataclass
class QLearningConfig:
    # Static: they set shapes, loop lengths or code paths. Each annotation says what the field allows.
    env: str = _static("GridWorld")
    env_kwargs: Items = _static(())  # ((name, value), ...), passed to envs.make; hashable on purpose
    algorithm: Annotated[Literal[ALGORITHMS], Choice("unknown {!r}")] = _static("q_learning")
    total_timesteps: Count = _static(1_000_000)
    log_interval: Count = _static(10_000)  # steps per metrics row; random numbers are drawn per interval
    unroll: Count = _static(16)  # steps per compiled loop iteration
    # Leaves. lr, the step size of the tabular update (often written alpha): 0 never learns.
    lr: Annotated[float, Field(gt=0, le=1, allow_inf_nan=True, description="> 0.0 and <= 1.0")] = 0.1
    gamma: Fraction = 0.9
    epsilon: Fraction = 0.1
    q_init: float = 0.0   # any finite value

    @property
    def num_logs(self) -> int:
        return self.total_timesteps // self.log_interval

    @property
    def frames_per_run(self) -> int:
        return self.total_timesteps

    MEMORY_FIELD = "total_timesteps"

    def memory_floats(self) -> int:
        """The dynamics tables and the Q table (8 floats per state and action) and the metrics."""
        env, env_params = envs.make(self.env, **dict(self.env_kwargs))
        _, actions = trainer.env_sizes(env, env_params)
        states = env.num_states(env_params) if hasattr(env, "num_states") else 1
        return 8 * states * actions + 8 * self.num_logs

    def validate(self) -> "QLearningConfig":
        check_fields(self)
        envs.check_tabular(self.env, dict(self.env_kwargs), "Q-learning")
        if self.total_timesteps % self.log_interval:
            raise SettingError("total_timesteps", f"{self.total_timesteps} is not a multiple of "
                               f"log_interval={self.log_interval}", "k * log_interval")
        return self


class Tables(NamedTuple):
    """The environment's dynamics for every flat index ``state * num_actions + action``."""

    next_state: jax.Array  # int32, state after step_env (before any auto-reset)
    reward: jax.Array  # float32
    terminated: jax.Array  # bool: no bootstrap, auto-reset
    episode_end: jax.Array  # bool: counts an episode (the goal in continuing GridWorld)
    time_reset: jax.Array  # bool: step_env itself restarted the episode clock
    reset_state: jax.Array  # int32 scalar


def build_tables(env: Any, env_params: Any) -> Tables:
    """Evaluate ``env.step_env`` on every (state, action) pair; the env must be deterministic."""
    num_states, num_actions = env.num_states(env_params), env.num_actions
    key = jax.random.key(0)  # unused by deterministic environments

    def one(index: jax.Array, action: jax.Array):
        state = env.state_from_index(index, env_params)
        _, next_state, reward, terminated, info = env.step_env(key, state, action, env_params)
        episode_end = info.get("episode_end", terminated)
        return (
            env.state_index(next_state, env_params).astype(jnp.int32),
            jnp.asarray(reward, jnp.float32),
            jnp.asarray(terminated, bool),
            jnp.asarray(episode_end, bool) | jnp.asarray(terminated, bool),
            next_state.time == 0,
        )

    states = jnp.repeat(jnp.arange(num_states, dtype=jnp.int32), num_actions)
    actions = jnp.tile(jnp.arange(num_actions, dtype=jnp.int32), num_states)
    columns = jax.vmap(one)(states, actions)
    _, reset = env.reset_env(key, env_params)
    return Tables(*columns, reset_state=env.state_index(reset, env_params).astype(jnp.int32))


class Carry(NamedTuple):
    q: jax.Array  # (num_states * num_actions,) flat, so one index addresses an entry
    state: jax.Array  # int32
    time: jax.Array  # int32, only advanced when the env has a time limit
    episode_return: jax.Array  # running return of the current episode
    return_sum: jax.Array  # sum of returns of episodes finished in this interval
    episodes: jax.Array  # int32, episodes finished in this interval


def make_train(config: QLearningConfig):
    """Return ``train(key, meta_params=None) -> (q_table (S, A), metrics)``; pure, jit/vmap-able.

    ``meta_params`` may be a dict of float hyperparameters (names in ``FLOAT_FIELDS``) that
    replace the config's values, so an outer loop can evolve them directly.
    """
    config.validate()
    env, env_params = envs.make(config.env, **dict(config.env_kwargs))
    num_states, num_actions = env.num_states(env_params), env.num_actions
    max_steps = int(env_params.max_steps_in_episode)
    # Paying for an episode clock only when the env has a time limit keeps the reference task lean.
    track_time = max_steps < 2**31 - 1
    expected = config.algorithm == "expected_sarsa"

    def train(key: jax.Array, meta_params: dict[str, Any] | None = None):
        cfg = with_overrides(config, meta_params, FLOAT_FIELDS)
        lr = jnp.asarray(cfg.lr, jnp.float32)
        gamma = jnp.asarray(cfg.gamma, jnp.float32)
        epsilon = jnp.asarray(cfg.epsilon, jnp.float32)
        tables = build_tables(env, env_params)
        packed = (
            tables.next_state * 8
            + tables.terminated.astype(jnp.int32) * 4
            + tables.episode_end.astype(jnp.int32) * 2
            + tables.time_reset.astype(jnp.int32)
        )

        def step(carry: Carry, noise: jax.Array) -> tuple[Carry, None]:
            q = carry.q
            base = carry.state * num_actions
            q_s = jax.lax.dynamic_slice(q, (base,), (num_actions,))
            # One draw serves both branches: with probability epsilon every action is eligible,
            # otherwise only maximal ones, and the largest uniform among the eligible wins.
            eligible = (q_s == q_s.max()) | (noise[0] < epsilon)
            action = jnp.argmax(jnp.where(eligible, noise[1:], -1.0)).astype(jnp.int32)
            index = base + action
            # One lookup for the integer outcomes: next state and two flags packed in an int32.
            code = packed[index]
            next_state = code >> 3
            terminated = (code & 4) > 0
            episode_end = (code & 2) > 0
            reward = tables.reward[index]
            q_next = jax.lax.dynamic_slice(q, (next_state * num_actions,), (num_actions,))
            if expected:
                # Under epsilon-greedy with uniform tie-breaking all maximal actions share max q.
                bootstrap = (1.0 - epsilon) * q_next.max() + epsilon * q_next.mean()
            else:
                bootstrap = q_next.max()
            target = reward + jnp.where(terminated, 0.0, gamma * bootstrap)
            q = q.at[index].add(lr * (target - q[index]))
            time = carry.time
            done = terminated
            if track_time:
                time = jnp.where((code & 1) > 0, 0, time + 1)
                truncated = time >= max_steps
                episode_end = episode_end | truncated
                done = done | truncated
                time = jnp.where(done, 0, time)
            episode_return = carry.episode_return + reward
            carry = Carry(
                q=q,
                state=jnp.where(done, tables.reset_state, next_state),
                time=time,
                episode_return=jnp.where(episode_end, 0.0, episode_return),
                return_sum=carry.return_sum + jnp.where(episode_end, episode_return, 0.0),
                episodes=carry.episodes + episode_end.astype(jnp.int32),
            )
            return carry, None

        def interval(outer: tuple[Carry, jax.Array], key: jax.Array):
            carry, last_return = outer
            noise = jax.random.uniform(key, (config.log_interval, num_actions + 1))
            carry = carry._replace(return_sum=jnp.float32(0.0), episodes=jnp.int32(0))
            carry, _ = jax.lax.scan(step, carry, noise, unroll=config.unroll)
            mean_return = jnp.where(
                carry.episodes > 0, carry.return_sum / jnp.maximum(carry.episodes, 1), last_return
            )
            return (carry, mean_return), {"episode_return": mean_return, "episodes": carry.episodes}

        carry = Carry(
            q=jnp.full((num_states * num_actions,), cfg.q_init, jnp.float32),
            state=tables.reset_state,
            time=jnp.int32(0),
            episode_return=jnp.float32(0.0),
            return_sum=jnp.float32(0.0),
            episodes=jnp.int32(0),
        )
        keys = jax.random.split(key, config.num_logs)
        (carry, _), metrics = jax.lax.scan(interval, (carry, jnp.float32(0.0)), keys)
        return carry.q.reshape(num_states, num_actions), metrics

    return train


def greedy_path(config: QLearningConfig, q_table: jax.Array, max_len: int = 1000) -> list[int]:
    """State indices visited by the greedy policy from the reset state until an episode ends.

    Ties go to the lowest action; meant for inspection and tests, not for jit.
    """
    env, env_params = envs.make(config.env, **dict(config.env_kwargs))
    tables = build_tables(env, env_params)
    num_actions = env.num_actions
    state, path = int(tables.reset_state), []
    for _ in range(max_len):
        path.append(state)
        index = state * num_actions + int(jnp.argmax(q_table[state]))
        if bool(tables.episode_end[index]):
            return path
        state = int(tables.next_state[index])
    return path
