"""A plain PureJaxRL-style PPO, kept only as a speed yardstick for ``benchmarks/ppo_throughput.py``.

Written in the style of PureJaxRL's PPO (separate 64x64 tanh actor and critic towers with
orthogonal init, LogWrapper episode tracking, one ``jax.random.split`` per rollout step, GAE by a
reverse scan, epochs of shuffled minibatches drawn with ``jax.random.permutation``, clip-by-global-norm
+ Adam with linear annealing). It deliberately does nothing clever, so it measures what "the obvious
implementation" costs on this machine and jax version. Not used for training anywhere.

    train = make_train(num_envs=4, num_steps=128, total_timesteps=5e5)
    runner_state, metrics = jax.jit(train)(jax.random.key(0))
"""
from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState

import gymnax
from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper


class ActorCritic(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
        a = nn.tanh(nn.Dense(64, kernel_init=orthogonal(math.sqrt(2)), bias_init=constant(0.0))(x))
        a = nn.tanh(nn.Dense(64, kernel_init=orthogonal(math.sqrt(2)), bias_init=constant(0.0))(a))
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(a)
        c = nn.tanh(nn.Dense(64, kernel_init=orthogonal(math.sqrt(2)), bias_init=constant(0.0))(x))
        c = nn.tanh(nn.Dense(64, kernel_init=orthogonal(math.sqrt(2)), bias_init=constant(0.0))(c))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(c)
        return logits, jnp.squeeze(value, axis=-1)


# A tiny categorical distribution over logits (distrax is not installed).
def cat_sample(key, logits):
    return jax.random.categorical(key, logits)


def cat_log_prob(logits, action):
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, action[..., None], axis=-1).squeeze(-1)


def cat_entropy(logits):
    logp = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


class Transition(NamedTuple):
    done: jnp.ndarray
    action: jnp.ndarray
    value: jnp.ndarray
    reward: jnp.ndarray
    log_prob: jnp.ndarray
    obs: jnp.ndarray
    info: dict


def make_train(num_envs=4, num_steps=128, total_timesteps=5e5, update_epochs=4, num_minibatches=4,
               lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
               max_grad_norm=0.5, anneal_lr=True, env_name="CartPole-v1"):
    num_updates = int(total_timesteps) // num_steps // num_envs
    minibatch_size = num_envs * num_steps // num_minibatches
    env, env_params = gymnax.make(env_name)
    env = LogWrapper(FlattenObservationWrapper(env))

    def linear_schedule(count):
        frac = 1.0 - (count // (num_minibatches * update_epochs)) / num_updates
        return lr * frac

    def train(rng):
        network = ActorCritic(env.action_space(env_params).n)
        rng, _rng = jax.random.split(rng)
        init_x = jnp.zeros(env.observation_space(env_params).shape)
        network_params = network.init(_rng, init_x)
        if anneal_lr:
            tx = optax.chain(optax.clip_by_global_norm(max_grad_norm),
                             optax.adam(learning_rate=linear_schedule, eps=1e-5))
        else:
            tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr, eps=1e-5))
        train_state = TrainState.create(apply_fn=network.apply, params=network_params, tx=tx)

        rng, _rng = jax.random.split(rng)
        reset_rng = jax.random.split(_rng, num_envs)
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_rng, env_params)

        def _update_step(runner_state, unused):
            # --- collect a rollout ---
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state
                rng, _rng = jax.random.split(rng)
                logits, value = network.apply(train_state.params, last_obs)
                action = cat_sample(_rng, logits)
                log_prob = cat_log_prob(logits, action)
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, num_envs)
                obsv, env_state, reward, terminated, truncated, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(rng_step, env_state, action, env_params)
                done = jnp.logical_or(terminated, truncated)
                info = {k: info[k] for k in ("returned_episode_returns", "returned_episode")}
                transition = Transition(done, action, value, reward, log_prob, last_obs, info)
                return (train_state, env_state, obsv, rng), transition

            runner_state, traj_batch = jax.lax.scan(_env_step, runner_state, None, num_steps)

            # --- advantages ---
            train_state, env_state, last_obs, rng = runner_state
            _, last_val = network.apply(train_state.params, last_obs)

            def _calculate_gae(traj_batch, last_val):
                def _get_advantages(gae_and_next_value, transition):
                    gae, next_value = gae_and_next_value
                    done, value, reward = transition.done, transition.value, transition.reward
                    delta = reward + gamma * next_value * (1 - done) - value
                    gae = delta + gamma * gae_lambda * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                                             traj_batch, reverse=True, unroll=16)
                return advantages, advantages + traj_batch.value

            advantages, targets = _calculate_gae(traj_batch, last_val)

            # --- update the network ---
            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj_batch, advantages, targets = batch_info

                    def _loss_fn(params, traj_batch, gae, targets):
                        logits, value = network.apply(params, traj_batch.obs)
                        log_prob = cat_log_prob(logits, traj_batch.action)
                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -clip_eps, clip_eps)
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()
                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor1 = ratio * gae
                        loss_actor2 = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * gae
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2).mean()
                        entropy = cat_entropy(logits).mean()
                        total_loss = loss_actor + vf_coef * value_loss - ent_coef * entropy
                        return total_loss, (value_loss, loss_actor, entropy)

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    train_state = train_state.apply_gradients(grads=grads)
                    return train_state, total_loss

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = minibatch_size * num_minibatches
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled_batch = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree.map(
                    lambda x: jnp.reshape(x, [num_minibatches, -1] + list(x.shape[1:])), shuffled_batch)
                train_state, total_loss = jax.lax.scan(_update_minbatch, train_state, minibatches)
                update_state = (train_state, traj_batch, advantages, targets, rng)
                return update_state, total_loss

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, loss_info = jax.lax.scan(_update_epoch, update_state, None, update_epochs)
            train_state = update_state[0]
            metric = traj_batch.info
            rng = update_state[-1]
            runner_state = (train_state, env_state, last_obs, rng)
            return runner_state, metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None, num_updates)
        return {"runner_state": runner_state, "metrics": metric}

    return train


def frames_per_run(num_envs=4, num_steps=128, total_timesteps=5e5) -> int:
    """Environment frames one ``train`` call steps (whole updates only)."""
    return (int(total_timesteps) // num_steps // num_envs) * num_steps * num_envs


if __name__ == "__main__":  # quick sanity check: CartPole should learn
    out = jax.jit(make_train())(jax.random.key(0))
    m = out["metrics"]
    r = np.asarray(m["returned_episode_returns"]).mean(axis=(1, 2))
    print("mean return, first/last update:", r[0], r[-1])
