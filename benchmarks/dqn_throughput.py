"""DQN throughput on CartPole-v1 in the jym notebook's setting.

MLP 64x64x64 relu, batch 32, one update per environment step, buffer 512, target copied every 10
steps, Adam 1e-3, gamma 0.9, epsilon 0.3 / (1 + 0.001 t), one environment, 20,000 steps. The
published hand-written figure is 15.8k steps/s. Prints one JSON object: the median of several
timed runs after compilation, with compile seconds reported separately.

Usage::

    python benchmarks/dqn_throughput.py [--steps 20000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

from inner_loops.dqn import DQNConfig, make_train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--unroll", type=int, default=DQNConfig.unroll)
    parser.add_argument("--compiler-options", default="", help="JSON dict of XLA options for jit")
    args = parser.parse_args()

    config = DQNConfig(
        env="CartPole-v1", total_timesteps=args.steps, num_envs=1, buffer_size=512, batch_size=32,
        hidden=(64, 64, 64), learning_starts=0, target_update_period=10, tau=1.0,
        epsilon_schedule="inverse", epsilon_start=0.3, epsilon_end=0.0, epsilon_decay_rate=1e-3,
        learning_rate=1e-3, gamma=0.9, loss="mse", log_interval=args.steps // 10, unroll=args.unroll,
    )
    options = json.loads(args.compiler_options) if args.compiler_options else None
    train = jax.jit(make_train(config), compiler_options=options)
    key = jax.random.key(0)
    start = time.perf_counter()
    compiled = train.lower(key).compile()
    compile_s = time.perf_counter() - start
    _, metrics = jax.block_until_ready(compiled(key))
    runs = []
    for i in range(args.repeats):
        k = jax.random.fold_in(key, i + 1)
        start = time.perf_counter()
        jax.block_until_ready(compiled(k))
        runs.append(time.perf_counter() - start)
    run_s = statistics.median(runs)
    print(json.dumps({
        "benchmark": "dqn_cartpole_jym_setting",
        "jax": jax.__version__,
        "steps": args.steps,
        "unroll": args.unroll,
        "steps_per_s": round(args.steps / run_s),
        "run_s": round(run_s, 4),
        "compile_s": round(compile_s, 2),
        "published_steps_per_s": 15_800,
        "speedup_vs_published": round(args.steps / run_s / 15_800, 2),
        "final_interval_return": round(float(metrics["episode_return"][-1]), 1),
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
