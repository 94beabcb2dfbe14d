"""Where one PPO update's time goes, without a profiler: its minibatch steps and the rest, for metarl's
PPO and PureJaxRL's.

``jax.profiler`` costs time per instruction (one agent runs about three times slower under it), which
distorts a training made of small operations; this script times whole trainings instead. Each PPO
(CartPole-v1, PureJaxRL's config, ``jax.jit(jax.vmap(train))`` over N agents; built and timed by
``ppo_side_by_side.py``'s ``build`` and ``timed``) is compiled with 4 epochs (16 minibatch steps of 128
rows per update) and with 2 (8 steps), and the four programs are timed alternately in one process (A B
C D D C B A ..., ``--repeats`` each, medians). For each PPO the difference over 8 steps is one
minibatch step (loss, gradient and optimizer, with its share of an epoch's shuffle and gather); an
update less its 16 steps is the rest (the rollout, the values, GAE and the update's random draws).
Not 1 epoch: with one, PureJaxRL's epoch loop of a single iteration compiles into another program, and
4 against 1 epochs gave its step as 122 microseconds where 4 against 2 gave 154 (1 agent, one process).

Also counted, on each compiled 4-epoch program: the instructions it executes per update
(``flop_rate.hlo_op_counts``: a fusion counts one, loops unrolled by their trip counts).

One JSON object goes to stdout (progress to stderr); PureJaxRL's PPO comes from the checkout that
``--purejaxrl DIR`` or ``$METARL_PUREJAXRL`` names (``benchmarks/peers.py``)::

    timeout 1800 python -m benchmarks.ppo_update_parts --purejaxrl DIR --agents 1 8 32 --repeats 8

``--compile single-agent`` compiles all with ``metarl.compilation.SINGLE_AGENT_CPU_OPTIONS``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import jax

from benchmarks import flop_rate, peers
from benchmarks import ppo_side_by_side as side_by_side

from metarl import compilation

EPOCHS = (4, 2)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--total-timesteps", type=float, default=65536)
    parser.add_argument("--impl", nargs="+", choices=side_by_side.IMPLS, default=list(side_by_side.IMPLS))
    parser.add_argument("--compile", choices=("default", "single-agent"), default="default")
    peers.add_option(parser)
    args = parser.parse_args()
    if "purejaxrl" in args.impl:
        peers.require(args.purejaxrl, "ppo", parser.prog)
    options = compilation.SINGLE_AGENT_CPU_OPTIONS if args.compile == "single-agent" else None
    total = int(args.total_timesteps)
    args.impl = list(dict.fromkeys(args.impl))

    batch = side_by_side.PJR_CONFIG["NUM_ENVS"] * side_by_side.PJR_CONFIG["NUM_STEPS"]
    minibatches = side_by_side.PJR_CONFIG["NUM_MINIBATCHES"]
    steps = EPOCHS[0] * minibatches
    results: dict = {}
    for n in args.agents:
        built = {}
        for impl in args.impl:
            for epochs in EPOCHS:
                fn, keys, frames, compile_s, _, ops = side_by_side.build(impl, total, n, options, epochs)
                log(f"[{n} agents] {impl}, {epochs} epochs: trace + compile {compile_s:.1f}s")
                jax.block_until_ready(fn(keys(1)))  # warm-up, untimed
                built[impl, epochs] = (fn, keys, frames // batch, ops)
        runs = {key: [] for key in built}
        order = list(built)
        for r in range(args.repeats):
            for key in (order if r % 2 == 0 else order[::-1]):
                fn, keys, updates, _ = built[key]
                runs[key].append(side_by_side.timed(fn, jax.block_until_ready(keys(r + 2))) / updates * 1e6)
        for impl in args.impl:
            full, fewer = (statistics.median(runs[impl, e]) for e in EPOCHS)
            step = (full - fewer) / ((EPOCHS[0] - EPOCHS[1]) * minibatches)
            ops = built[impl, EPOCHS[0]][3]
            results.setdefault(impl, {})[str(n)] = {
                "us_per_update": round(full, 1),
                f"us_per_update_{EPOCHS[1]}_epochs": round(fewer, 1),
                "us_per_minibatch_step": round(step, 1),
                "us_rest": round(full - steps * step, 1),
                "minibatch_share": round(steps * step / full, 3),
                "frames_per_s": round(n * batch / full * 1e6),
                "runs_us_per_update": {str(e): [round(t, 1) for t in runs[impl, e]] for e in EPOCHS},
                "operations_per_update": sum(ops.values()),
                "operations_per_update_by_kind": ops,
            }
            log(f"[{n} agents] {impl}: update {full:.0f} us = {steps} minibatch steps of {step:.1f} us "
                f"+ rest {full - steps * step:.0f} us")
        del built

    print(json.dumps({
        "benchmark": "ppo_update_parts",
        **flop_rate.cartpole_run_header(total, args.repeats, args.compile, options),
        "results": results,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **flop_rate.machine(),
    }))


if __name__ == "__main__":
    main()
