"""Tabular Q-learning throughput on the 8 x 12 GridWorld (lr 0.1, gamma 0.9, epsilon 0.1).

Prints one JSON object: steps/s for one agent and agent-steps/s for 30 vmapped agents, each the
median of several timed runs after compilation, with compile seconds reported separately.

Usage::

    python -m benchmarks.q_learning_throughput [--steps 1000000] [--agents 30] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

from metarl.inner_loops.q_learning import QLearningConfig, make_train


def measure(fn, key: jax.Array, repeats: int) -> tuple[float, float]:
    """(compile seconds, median run seconds) of a jitted ``fn(key)``."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(key).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(key))  # warm caches once
    runs = []
    for i in range(repeats):
        k = jax.random.fold_in(key, i)
        start = time.perf_counter()
        jax.block_until_ready(compiled(k))
        runs.append(time.perf_counter() - start)
    return compile_s, statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log-interval", type=int, default=10_000)
    parser.add_argument("--unroll", type=int, default=QLearningConfig.unroll)
    args = parser.parse_args()

    config = QLearningConfig(
        total_timesteps=args.steps, log_interval=args.log_interval, unroll=args.unroll,
        lr=0.1, gamma=0.9, epsilon=0.1,
    )
    train = make_train(config)
    key = jax.random.key(0)
    c1, t1 = measure(lambda k: train(k), key, args.repeats)
    many = jax.vmap(train)
    cn, tn = measure(lambda k: many(jax.random.split(k, args.agents)), key, args.repeats)
    print(json.dumps({
        "benchmark": "q_learning_gridworld_8x12",
        "jax": jax.__version__,
        "steps": args.steps,
        "unroll": args.unroll,
        "one_agent_steps_per_s": round(args.steps / t1),
        "one_agent_run_s": round(t1, 4),
        "one_agent_compile_s": round(c1, 2),
        "agents": args.agents,
        "many_agents_agent_steps_per_s": round(args.agents * args.steps / tn),
        "many_agents_run_s": round(tn, 4),
        "many_agents_compile_s": round(cn, 2),
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
