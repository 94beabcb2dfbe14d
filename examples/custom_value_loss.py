"""A value loss of your own: train PPO with it directly, or evolve it with the CLI by naming it.

    python examples/custom_value_loss.py          # the inner loop only: Huber against PPO's default, 4 seeds
    python -m metarl.evolve --config-dir examples/experiments experiment=huber_value_loss

A component is any object with ``init(key)`` (its meta-parameters) and ``apply(meta_params, ...)``.
Here: a Huber value loss whose width ``delta`` is a meta-parameter, ``delta_init * exp(log_delta)``;
``delta_init`` is a constructor argument, set from the config (``component.delta_init=2.0``).
The second command evolves ``log_delta`` (``examples/experiments/experiment/huber_value_loss.yaml`` names this
class with ``component._target_``); run it from the repository root, so ``examples`` is importable.
"""
import dataclasses

import jax
import jax.numpy as jnp

from metarl.inner_loops.ppo import PPOConfig, make_train


@dataclasses.dataclass(frozen=True)
class HuberValueLoss:
    delta_init: float = 1.0

    def init(self, key):
        return {"log_delta": jnp.zeros((), jnp.float32)}

    def apply(self, meta_params, value, old_value, target, config):
        delta = self.delta_init * jnp.exp(meta_params["log_delta"])
        error = jnp.abs(value - target)
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
