"""Train your own PPO with a learned optimiser evolved by metarl (``experiment=learned_optimiser``).

    python examples/learned_optimiser.py RUN_DIR [--env CartPole-v1] [--timesteps 65536] [--seeds 4]

Takes the optimiser (the component, with its settings) and its evolved meta-parameters from RUN_DIR, then
trains PPO on ``--env`` with it and with PPO's Adam from the same seeds, and prints each one's final return
(the mean of the last fifth of the learning curve) as JSON.
"""
from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from metarl.inner_loops.ppo import PPOConfig, make_train
from metarl.results import load_best


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--timesteps", type=int, default=65536)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args(argv)

    best = load_best(args.run_dir)                         # best.component: the LearnedOptimiser, as configured
    config = PPOConfig(env=args.env, total_timesteps=args.timesteps, num_envs=4, num_steps=64,
                       lr=best.inner_config.lr)            # the lr the run trained with (tuned, if it tuned one)
    keys = jax.random.split(jax.random.key(0), args.seeds)
    learned = make_train(config, optimiser=best.component)  # PPO with the learned optimiser in Adam's place
    adam = make_train(config)

    def final(train, meta=None):
        curves = jax.jit(jax.vmap(lambda k: train(k, meta)[1]["episode_return"]))(keys)
        return np.asarray(curves)[:, -max(1, curves.shape[1] // 5):].mean(axis=1).tolist()

    result = {"env": args.env, "optimiser": repr(best.component),
              "learned_optimiser": final(learned, {"optimiser": best.meta_params}),
              "adam": final(adam)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
