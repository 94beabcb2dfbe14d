"""A plain hand-written JAX DQN, kept only as a speed yardstick for ``benchmarks/dqn_throughput.py``.

Written with the structure of a published hand-written JAX DQN for CartPole (a haiku agent driven
by a ``deep_rl_rollout`` loop), with flax in place of haiku and gymnax's CartPole in place of that
code's own: one ``fori_loop`` step per environment step that splits its keys, picks the action under
``lax.cond`` (random or greedy), steps the env (auto-reset inside ``env.step``), writes the
transition into a dict-of-arrays buffer with ``.at[i].set``, samples a batch with
``jax.random.randint``, computes a vmapped per-sample TD loss with integer indexing, applies optax
Adam, copies the target network under ``lax.cond`` every ``target_period`` steps, and records
per-step actions, observations, rewards, dones and losses as that code does. It deliberately does
nothing clever, so it measures what "the obvious implementation" costs on this machine and jax
version. Not used for training.

    train = make_train(total_steps=20_000)
    params, last_return, history = jax.jit(train)(jax.random.key(0))
"""
from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import optax


class MLP(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(self.num_actions)(x)


def make_train(total_steps: int = 20_000, buffer_size: int = 512, batch_size: int = 32, target_period: int = 10,
               lr: float = 1e-3, gamma: float = 0.9, eps_start: float = 0.3, eps_decay: float = 1e-3):
    env, env_params = gymnax.make("CartPole-v1")
    num_actions = env.action_space(env_params).n
    obs_dim = env.observation_space(env_params).shape[0]
    model = MLP(num_actions)
    optimizer = optax.adam(lr)

    def loss_fn(params, target_params, batch):
        def td(obs, action, reward, next_obs, done):
            q = model.apply(params, obs)[action]
            bootstrap = jnp.max(model.apply(target_params, next_obs))
            target = reward + gamma * (1.0 - done) * jax.lax.stop_gradient(bootstrap)
            return (q - target) ** 2

        return 0.5 * jnp.mean(jax.vmap(td)(*batch))

    def act(key, params, obs, epsilon):
        explore = jax.random.uniform(key) < epsilon
        key, sub = jax.random.split(key)
        return jax.lax.cond(explore, lambda k: jax.random.randint(k, (), 0, num_actions),
                            lambda _: jnp.argmax(model.apply(params, obs)).astype(jnp.int32), sub)

    def train(key):
        key, k_init, k_reset = jax.random.split(key, 3)
        params = model.init(k_init, jnp.zeros((obs_dim,)))
        obs, env_state = env.reset(k_reset, env_params)
        buffer = {
            "obs": jnp.zeros((buffer_size, obs_dim)),
            "action": jnp.zeros((buffer_size,), jnp.int32),
            "reward": jnp.zeros((buffer_size,)),
            "next_obs": jnp.zeros((buffer_size, obs_dim)),
            "done": jnp.zeros((buffer_size,)),
        }

        history = {
            "action": jnp.zeros((total_steps,), jnp.int32),
            "obs": jnp.zeros((total_steps, obs_dim)),
            "reward": jnp.zeros((total_steps,)),
            "done": jnp.zeros((total_steps,), bool),
            "loss": jnp.zeros((total_steps,)),
        }

        def step(t, state):
            params, target_params, opt_state, buffer, env_state, obs, key, ep_ret, last_ret, history = state
            key, k_act, k_step, k_sample = jax.random.split(key, 4)
            epsilon = eps_start / (1.0 + eps_decay * t)
            action = act(k_act, params, obs, epsilon)
            next_obs, env_state, reward, terminated, truncated, info = env.step(k_step, env_state, action, env_params)
            i = t % buffer_size
            buffer = {
                "obs": buffer["obs"].at[i].set(obs),
                "action": buffer["action"].at[i].set(action),
                "reward": buffer["reward"].at[i].set(reward),
                "next_obs": buffer["next_obs"].at[i].set(info["final_observation"]),
                "done": buffer["done"].at[i].set(terminated.astype(jnp.float32)),
            }
            idx = jax.random.randint(k_sample, (batch_size,), 0, jnp.minimum(t + 1, buffer_size))
            batch = (buffer["obs"][idx], buffer["action"][idx], buffer["reward"][idx], buffer["next_obs"][idx],
                     buffer["done"][idx])
            loss, grads = jax.value_and_grad(loss_fn)(params, target_params, batch)
            updates, opt_state = optimizer.update(grads, opt_state)
            params = optax.apply_updates(params, updates)
            target_params = jax.lax.cond(t % target_period == 0, lambda: params, lambda: target_params)
            done = terminated | truncated
            ep_ret = ep_ret + reward
            last_ret = jnp.where(done, ep_ret, last_ret)
            ep_ret = jnp.where(done, 0.0, ep_ret)
            history = {
                "action": history["action"].at[t].set(action),
                "obs": history["obs"].at[t].set(next_obs),
                "reward": history["reward"].at[t].set(reward),
                "done": history["done"].at[t].set(done),
                "loss": history["loss"].at[t].set(loss),
            }
            return params, target_params, opt_state, buffer, env_state, next_obs, key, ep_ret, last_ret, history

        state = (params, params, optimizer.init(params), buffer, env_state, obs, key, jnp.float32(0.0), jnp.float32(0.0),
                 history)
        state = jax.lax.fori_loop(0, total_steps, step, state)
        # The measured structure returns its per-step records; returning them keeps XLA from dropping their writes.
        return state[0], state[8], state[9]

    return train
