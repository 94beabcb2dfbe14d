"""DQN throughput on CartPole-v1 in a published hand-written DQN's setting: metarl against a hand-written DQN.

MLP 64x64x64 relu, batch 32, one update per environment step, buffer 512, target copied every 10
steps, Adam 1e-3, gamma 0.9, epsilon 0.3 / (1 + 0.001 t), one environment. ``metarl`` is
``metarl.inner_loops.dqn``; ``reference`` is ``benchmarks/reference_dqn.py``, the published hand-written
structure, run in the same process. Timed runs of the two alternate, so machine noise hits both.

Prints one JSON object: median steps/s of each after compilation, their ratio, compile seconds,
and the published figures for context (15.8k steps/s on its authors' machine; that code ran
at 15.9k on a 2-core CPU with jax 0.10.2, which this project cannot use, see docs/performance.md).

``--cores 1`` pins the process to one core before jax starts: a single small agent runs faster
there, because XLA's CPU runtime otherwise hands independent operations to a second thread and the
hand-off costs more than the work.

Usage::

    python -m benchmarks.dqn_throughput [--steps 20000] [--repeats 5] [--cores 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--unroll", type=int, default=None, help="metarl's scan unroll (default: DQNConfig's)")
    parser.add_argument("--cores", type=int, default=0, help="pin to this many cores (0: all)")
    parser.add_argument("--impl", nargs="+", default=["metarl", "reference"], choices=["metarl", "reference"])
    args = parser.parse_args()
    if args.cores:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))

    import jax  # after pinning: XLA sizes its thread pool from the affinity mask

    from metarl.inner_loops.dqn import DQNConfig, make_train

    from benchmarks import reference_dqn

    config = DQNConfig(
        env="CartPole-v1", total_timesteps=args.steps, num_envs=1, buffer_size=512, batch_size=32,
        hidden=(64, 64, 64), learning_starts=0, target_update_period=10, tau=1.0,
        epsilon_schedule="inverse", epsilon_start=0.3, epsilon_end=0.0, epsilon_decay_rate=1e-3,
        lr=1e-3, gamma=0.9, loss="mse", log_interval=args.steps // 10,
        unroll=args.unroll or DQNConfig.unroll,
    )
    programs = {
        "metarl": make_train(config),
        "reference": reference_dqn.make_train(total_steps=args.steps),
    }
    key = jax.random.key(0)
    compiled, compile_s = {}, {}
    for name in args.impl:
        start = time.perf_counter()
        compiled[name] = jax.jit(programs[name]).lower(key).compile()
        compile_s[name] = round(time.perf_counter() - start, 2)
        jax.block_until_ready(compiled[name](key))
    runs = {name: [] for name in args.impl}
    for i in range(args.repeats):
        for name in args.impl:
            k = jax.random.fold_in(key, i + 1)
            start = time.perf_counter()
            jax.block_until_ready(compiled[name](k))
            runs[name].append(time.perf_counter() - start)
    rate = {name: args.steps / statistics.median(r) for name, r in runs.items()}
    out = {
        "benchmark": "dqn_cartpole_reference_setting",
        "jax": jax.__version__,
        "cores": len(os.sched_getaffinity(0)),
        "steps": args.steps,
        "unroll": config.unroll,
        "repeats": args.repeats,
        **{f"{name}_steps_per_s": round(r) for name, r in rate.items()},
        **{f"{name}_compile_s": s for name, s in compile_s.items()},
        "published_steps_per_s": 15_800,
        "issue_measured_steps_per_s_jax_0_10_2": 15_900,
    }
    if len(rate) == 2:
        out["ratio_metarl_over_reference"] = round(rate["metarl"] / rate["reference"], 2)
    if "metarl" in rate:
        out["ratio_metarl_over_issue_figure"] = round(rate["metarl"] / 15_900, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
