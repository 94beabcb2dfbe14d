"""DQN for gymnax environments with discrete actions, fully inside one jitted ``lax.scan``.

A uniform replay buffer lives in fixed-size arrays in the loop carry; a target network is refreshed
every ``target_update_period`` steps by Polyak averaging with ``tau`` (``tau=1`` is the classic hard
copy); epsilon follows a linear decay or the inverse ``start / (1 + rate * t)`` schedule;
``double_dqn`` switches the bootstrap to the Double DQN target. Observations are flattened to float32,
so image-like grids such as Doors work with the MLP.

Speed notes (one small update per environment step, so operations per step and matrix-product
layout set the speed on CPU): the network is ``metarl.inner_loops.flat_mlp.FlatMLP``, a flat parameter
vector with a hand-written backward pass and a fused Adam (see that module); the replay buffer is
one array, written at the start of the next step so it is read only after its last write and
updated in place; the random numbers and every reset state of a log interval are drawn in one call
each; the rows that pick the next action ride along in the loss's forward pass, so each step
runs one online forward, one target forward and one backward pass; and a ``lax.cond`` skips the
update before ``learning_starts``, and the target copy between refreshes, rather than computing them
and throwing them away. The step count is the same for every agent of a vmapped population, so the
branch stays a branch under ``vmap``.

Usage::

    import jax
    from metarl.inner_loops.dqn import DQNConfig, make_train

    config = DQNConfig(env="CartPole-v1", total_timesteps=50_000)
    params, metrics = jax.jit(make_train(config))(jax.random.key(0))
    metrics["episode_return"]          # (num_logs,) mean return of episodes ended in each interval
    # vmap over seeds and learning rates; float hyperparameters are pytree leaves: one compilation
    lrs = jax.numpy.array([3e-4, 1e-3])
    run = lambda lr, k: make_train(config.replace(lr=lr))(k)
    params, metrics = jax.jit(jax.vmap(run))(lrs, jax.random.split(jax.random.key(0), 2))
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct
from pydantic import Field

from metarl.inner_loops import draws, envs, trainer
from metarl.inner_loops.flat_mlp import Adam, FlatMLP, adam_init, adam_step
from metarl.inner_loops.config_checks import AsPython, Choice, Count, Flag, Fraction, Items, NonNegative
from metarl.inner_loops.config_checks import check_fields
from metarl.inner_loops.config_checks import with_overrides
from metarl.inner_loops.config_checks import static as _static
from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.schema import INT32_MAX, Problem, ok

EPSILON_SCHEDULES = ("linear", "inverse")
LOSSES = ("mse", "huber")
# Float hyperparameters: pytree leaves that evolution (or vmap) may vary without recompiling.
FLOAT_FIELDS = (
    "lr",
    "gamma",
    "tau",
    "epsilon_start",
    "epsilon_end",
    "epsilon_fraction",
    "epsilon_decay_rate",
    "adam_eps",
)


@struct.dataclass
class DQNConfig:
    # Static: they set shapes, loop lengths or code paths. Each annotation says what the field allows.
    env: str = _static("CartPole-v1")
    env_kwargs: Items = _static(())  # ((name, value), ...), passed to envs.make; hashable on purpose
    total_timesteps: Count = _static(100_000)  # environment steps, summed over the parallel envs
    num_envs: Count = _static(1)
    buffer_size: Count = _static(10_000)
    batch_size: Count = _static(64)
    hidden: Annotated[tuple, Field(min_length=1, description="e.g. (64, 64)"),
                      ok(lambda sizes: all(isinstance(h, int) and h >= 1 for h in sizes)),
                      Problem("{!r} must be a non-empty tuple of positive ints"), AsPython] = _static((64, 64))
    learning_starts: Annotated[int, Field(ge=0, le=INT32_MAX, description=f"an integer from 0 to {INT32_MAX}"),
                               AsPython] = _static(1_000)  # environment steps before the first update
    target_update_period: Count = _static(100)  # loop iterations (each steps every env once)
    epsilon_schedule: Annotated[Literal[EPSILON_SCHEDULES], Choice("unknown {!r}")] = _static("linear")
    loss: Annotated[Literal[LOSSES], Choice("unknown {!r}")] = _static("mse")
    double_dqn: Flag = _static(False)
    log_interval: Count = _static(5_000)  # environment steps per metrics row
    # Unrolling the step loop trades compile time for fewer loop iterations; 2 compiles faster than 4
    # and runs as fast or faster (docs/studies/speed.md has the figures).
    unroll: Count = _static(2)
    # Leaves.
    lr: NonNegative = 5e-4
    gamma: Fraction = 0.99
    tau: Fraction = 1.0
    epsilon_start: Fraction = 1.0
    epsilon_end: Fraction = 0.05
    epsilon_fraction: Fraction = 0.2  # linear: share of total_timesteps over which epsilon decays
    epsilon_decay_rate: NonNegative = 1e-3  # inverse: epsilon_start / (1 + rate * env_steps)
    adam_eps: NonNegative = 1e-8

    @property
    def iterations_per_log(self) -> int:
        return self.log_interval // self.num_envs

    @property
    def num_logs(self) -> int:
        return self.total_timesteps // self.log_interval

    @property
    def frames_per_run(self) -> int:
        return self.total_timesteps

    MEMORY_FIELD = "buffer_size"

    def memory_floats(self) -> int:
        """The replay buffer (observation, next observation, action, reward, done), a minibatch's inputs
        and widest activations, the Q-network x5 (parameters, gradients, Adam's two moments, the
        target network) and the metrics."""
        env, env_params = envs.make(self.env, **dict(self.env_kwargs))
        obs, actions = trainer.env_sizes(env, env_params)
        net = trainer.mlp_floats([obs, *self.hidden, actions])
        replay = self.buffer_size * (2 * obs + 3)
        return replay + self.batch_size * (2 * obs + max(self.hidden)) + 5 * net + 8 * self.num_logs

    def validate(self) -> "DQNConfig":
        check_fields(self)
        envs.check_discrete_actions(self.env, dict(self.env_kwargs), "DQN")
        if self.log_interval % self.num_envs:
            raise SettingError("log_interval", f"{self.log_interval} is not a multiple of num_envs={self.num_envs}",
                               "k * num_envs")
        if self.total_timesteps % self.log_interval:
            raise SettingError("total_timesteps", f"{self.total_timesteps} is not a multiple of "
                               f"log_interval={self.log_interval}", "k * log_interval")
        if self.buffer_size % self.num_envs:
            raise SettingError("buffer_size", f"{self.buffer_size} is not a multiple of num_envs={self.num_envs}",
                               "k * num_envs")
        return self


class QNetwork(nn.Module):
    """MLP from a flat observation to one value per action."""

    hidden: Sequence[int]
    num_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


class Carry(NamedTuple):
    params: jax.Array  # online network, flat (see metarl.inner_loops.flat_mlp)
    target: jax.Array  # target network, flat
    opt_state: Adam
    env_state: Any
    obs: jax.Array  # (num_envs, obs_dim)
    buffer: jax.Array  # (buffer_size, width) rows of obs | next_obs | action | reward | terminated
    pending: jax.Array  # (num_envs, width) the last step's transitions, written at the next step
    iteration: jax.Array  # int32, loop iterations done
    episode_return: jax.Array  # (num_envs,) running return of the current episodes
    return_sum: jax.Array  # sum of returns of episodes ended in this interval
    episodes: jax.Array  # int32, episodes ended in this interval
    loss_sum: jax.Array


def epsilon_at(config: DQNConfig, env_steps: jax.Array) -> jax.Array:
    env_steps = env_steps.astype(jnp.float32)
    if config.epsilon_schedule == "linear":
        horizon = jnp.maximum(config.epsilon_fraction * config.total_timesteps, 1.0)
        frac = jnp.clip(env_steps / horizon, 0.0, 1.0)
        return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * frac
    return jnp.maximum(config.epsilon_end, config.epsilon_start / (1.0 + config.epsilon_decay_rate * env_steps))


def make_train(config: DQNConfig):
    """Return ``train(key, meta_params=None) -> (params, metrics)``; pure, jit/vmap-able.

    ``params`` are the online network's flax parameters (for ``QNetwork.apply``). ``meta_params``
    may be a dict of float hyperparameters (names in ``FLOAT_FIELDS``) that replace the config's
    values, so an outer loop can evolve them directly.
    """
    config.validate()
    env, env_params = envs.make(config.env, **dict(config.env_kwargs))
    num_actions = env.action_space(env_params).n
    obs_shape = env.observation_space(env_params).shape
    obs_dim = 1
    for d in obs_shape:
        obs_dim *= d
    network = QNetwork(hidden=tuple(config.hidden), num_actions=num_actions)  # for its initialisation
    mlp = FlatMLP((obs_dim, *config.hidden, num_actions))
    num_envs, batch_size, buffer_size = config.num_envs, config.batch_size, config.buffer_size
    iterations = config.iterations_per_log
    width = 2 * obs_dim + 3
    col_action, col_reward, col_term = 2 * obs_dim, 2 * obs_dim + 1, 2 * obs_dim + 2
    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_reset_block = jax.vmap(jax.vmap(env.reset_env, in_axes=(0, None)), in_axes=(0, None))
    v_step = jax.vmap(envs.step_auto_reset(env), in_axes=(0, 0, 0, 0, 0, None))
    action_ids = jnp.arange(num_actions)

    def flatten(obs: jax.Array) -> jax.Array:
        return obs.reshape(obs.shape[0], obs_dim).astype(jnp.float32)

    def train(key: jax.Array, meta_params: dict[str, Any] | None = None):
        cfg = with_overrides(config, meta_params, FLOAT_FIELDS)
        gamma = jnp.asarray(cfg.gamma, jnp.float32)
        tau = jnp.asarray(cfg.tau, jnp.float32)
        lr = jnp.asarray(cfg.lr, jnp.float32)
        adam_eps = jnp.asarray(cfg.adam_eps, jnp.float32)

        key, k_init, k_reset, k_run = jax.random.split(key, 4)
        params = mlp.from_flax(network.init(k_init, jnp.zeros((1, obs_dim), jnp.float32)))
        obs, env_state = vmap_reset(jax.random.split(k_reset, num_envs), env_params)

        def step(carry: Carry, noise: tuple[Any, ...]) -> tuple[Carry, None]:
            explore_u, random_action, sample_u, env_keys, (reset_obs, reset_state) = noise
            env_steps = carry.iteration * num_envs
            # Write the previous step's transitions first, so the buffer is only read after its
            # last write and is updated in place (at iteration 0 the rows are never sampled).
            last_slot = jnp.remainder(env_steps - num_envs, buffer_size).astype(jnp.int32)
            buffer = jax.lax.dynamic_update_slice_in_dim(carry.buffer, carry.pending, last_slot, axis=0)
            filled = jnp.minimum(env_steps, buffer_size)
            learn = (env_steps >= config.learning_starts) & (filled > 0)

            def update(_):
                """One gradient step on a sampled batch; the online forward pass also gives the Q-values
                of the rows to act on (and, for Double DQN, of the next observations)."""
                idx = jnp.minimum((sample_u * filled).astype(jnp.int32), filled - 1)  # filled >= 1 here
                rows = buffer[idx]
                b_obs, b_next = rows[:, :obs_dim], rows[:, obs_dim:2 * obs_dim]
                b_action, b_reward, b_term = rows[:, col_action], rows[:, col_reward], rows[:, col_term]
                q_next_target, _ = mlp.forward(carry.target, b_next)
                x = jnp.concatenate([b_obs, carry.obs] + ([b_next] if config.double_dqn else []), axis=0)
                q, inputs = mlp.forward(carry.params, x)
                q_batch, q_act = q[:batch_size], q[batch_size:batch_size + num_envs]
                if config.double_dqn:
                    online_next = q[batch_size + num_envs:]
                    best = online_next == jnp.max(online_next, axis=-1, keepdims=True)
                    first = best & (jnp.cumsum(best, axis=-1) == 1)  # argmax's first maximum, as a mask
                    bootstrap = jnp.sum(jnp.where(first, q_next_target, 0.0), axis=-1)
                else:
                    bootstrap = q_next_target.max(axis=-1)
                target = b_reward + gamma * (1.0 - b_term) * bootstrap
                taken = b_action[:, None] == action_ids
                error = jnp.sum(jnp.where(taken, q_batch, 0.0), axis=-1) - target
                if config.loss == "huber":
                    loss = jnp.mean(optax.huber_loss(error))
                    d_error = jnp.clip(error, -1.0, 1.0)
                else:
                    loss = 0.5 * jnp.mean(error**2)
                    d_error = error
                grad = mlp.backward(carry.params, inputs, jnp.where(taken, d_error[:, None] / batch_size, 0.0))
                params, opt_state = adam_step(carry.params, grad, carry.opt_state, lr, adam_eps)
                return params, opt_state, loss, q_act

            def act_only(_):
                """Before learning starts: the Q-values of the rows to act on, nothing else."""
                q, _ = mlp.forward(carry.params, carry.obs)
                return carry.params, carry.opt_state, jnp.float32(0.0), q

            # A real branch, not a select: the step count is the same for every agent of a vmapped
            # population, so the updates before learning_starts are not computed at all.
            params, opt_state, loss, q_act = jax.lax.cond(learn, update, act_only, None)

            # Act with the parameters the batch was evaluated with (before this update).
            epsilon = epsilon_at(cfg, env_steps)
            action = jnp.where(explore_u < epsilon, random_action, jnp.argmax(q_act, axis=-1).astype(jnp.int32))
            next_obs, env_state, reward, terminated, truncated, final_obs = v_step(
                env_keys, carry.env_state, action, reset_obs, reset_state, env_params)
            next_obs = flatten(next_obs)
            reward = reward.astype(jnp.float32)
            pending = jnp.concatenate(
                [carry.obs, flatten(final_obs), action[:, None].astype(jnp.float32), reward[:, None],
                 terminated[:, None].astype(jnp.float32)], axis=1)

            iteration = carry.iteration + 1
            refresh = iteration % config.target_update_period == 0
            target = jax.lax.cond(refresh, lambda: tau * params + (1.0 - tau) * carry.target, lambda: carry.target)

            done = terminated | truncated
            episode_return = carry.episode_return + reward
            carry = Carry(
                params=params,
                target=target,
                opt_state=opt_state,
                env_state=env_state,
                obs=next_obs,
                buffer=buffer,
                pending=pending,
                iteration=iteration,
                episode_return=jnp.where(done, 0.0, episode_return),
                return_sum=carry.return_sum + jnp.sum(jnp.where(done, episode_return, 0.0)),
                episodes=carry.episodes + jnp.sum(done, dtype=jnp.int32),
                loss_sum=carry.loss_sum + loss,
            )
            return carry, None

        def interval(outer: tuple[Carry, jax.Array], key: jax.Array):
            carry, last_return = outer
            # Every random number of the interval in one draw (draws.draw), from threefry keys as every
            # other draw: under vmap, JAX draws an RngBitGenerator key's (unsafe_rbg's) bits for the whole
            # batch from its first key, so an agent's environment would depend on the agents beside it.
            drawn = draws.draw(key, {"explore": ((iterations, num_envs), "uniform"),
                                     "action": ((iterations, num_envs), "bits"),
                                     "sample": ((iterations, batch_size), "uniform"),
                                     "steps": ((iterations, num_envs), "keys"),
                                     "resets": ((iterations, num_envs), "keys")})
            noise = (
                drawn["explore"],
                # uniform over the actions but for a bias below num_actions / 2**32
                (drawn["action"] % num_actions).astype(jnp.int32),
                drawn["sample"],
                drawn["steps"],
                # Every reset state of the interval in one batched call; a step selects its own
                # where an episode ended (gymnax's auto-reset semantics, without its per-step draw).
                v_reset_block(drawn["resets"], env_params),
            )
            carry = carry._replace(return_sum=jnp.float32(0.0), episodes=jnp.int32(0), loss_sum=jnp.float32(0.0))
            carry, _ = jax.lax.scan(step, carry, noise, unroll=config.unroll)
            mean_return = jnp.where(
                carry.episodes > 0, carry.return_sum / jnp.maximum(carry.episodes, 1), last_return
            )
            metrics = {
                "episode_return": mean_return,
                "episodes": carry.episodes,
                "loss": carry.loss_sum / iterations,
                "epsilon": epsilon_at(cfg, carry.iteration * num_envs),
            }
            return (carry, mean_return), metrics

        carry = Carry(
            params=params,
            target=params,
            opt_state=adam_init(params),
            env_state=env_state,
            obs=flatten(obs),
            buffer=jnp.zeros((buffer_size, width), jnp.float32),
            pending=jnp.zeros((num_envs, width), jnp.float32),
            iteration=jnp.int32(0),
            episode_return=jnp.zeros((num_envs,), jnp.float32),
            return_sum=jnp.float32(0.0),
            episodes=jnp.int32(0),
            loss_sum=jnp.float32(0.0),
        )
        (carry, _), metrics = jax.lax.scan(interval, (carry, jnp.float32(0.0)), jax.random.split(k_run, config.num_logs))
        return mlp.to_flax(carry.params), metrics

    return train


def greedy_action(config: DQNConfig, params: Any, obs: jax.Array) -> jax.Array:
    """Greedy actions of trained ``params`` for a batch of raw observations (any shape per obs)."""
    env, env_params = envs.make(config.env, **dict(config.env_kwargs))
    network = QNetwork(hidden=tuple(config.hidden), num_actions=env.action_space(env_params).n)
    flat = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    return jnp.argmax(network.apply(params, flat), axis=-1)
