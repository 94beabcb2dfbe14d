"""Train PPO with a value loss of your own, using only the inner loop (no evolution).

    python examples/custom_value_loss.py

A component is any object with ``init(key)`` (its meta-parameters) and ``apply(meta_params, ...)``.
Here: a Huber value loss whose width ``delta`` is a meta-parameter, compared with PPO's default.
"""
import jax
import jax.numpy as jnp

from metarl.inner_loops.ppo import PPOConfig, make_train


class HuberValueLoss:
    def init(self, key):
        return {"delta": jnp.float32(1.0)}

    def apply(self, meta_params, value, old_value, target, config):
        error = jnp.abs(value - target)
        delta = meta_params["delta"]
        return jnp.where(error < delta, 0.5 * error**2, delta * (error - 0.5 * delta))


def main():
    config = PPOConfig(env="CartPole-v1", total_timesteps=100_000)
    keys = jax.random.split(jax.random.key(0), 4)

    huber = HuberValueLoss()
    train_huber = jax.jit(jax.vmap(make_train(config, value_loss=huber), in_axes=(0, None)))
    _, metrics = train_huber(keys, {"value_loss": huber.init(None)})
    print(f"Huber value loss: final return {metrics['episode_return'][:, -10:].mean():.1f} (4 seeds)")

    _, metrics = jax.jit(jax.vmap(make_train(config)))(keys)
    print(f"PPO's clipped L2: final return {metrics['episode_return'][:, -10:].mean():.1f} (4 seeds)")


if __name__ == "__main__":
    main()
