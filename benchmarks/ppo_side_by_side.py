"""metarl's PPO against the real PureJaxRL PPO (from a checkout: ``--purejaxrl DIR``), in ONE process.

Both train CartPole-v1 with PureJaxRL's default PPO config (4 envs x 128 steps, 4 epochs x 4
minibatches, 64x64 tanh actor and critic, Adam 2.5e-4 annealed, gamma 0.99, GAE 0.95, clip 0.2),
``jax.jit(jax.vmap(train))`` over N seeds. For each agent count every implementation is compiled ahead
of time (``.lower().compile()``, timed on its own: ``compile_s``, the median of ``--compile-repeats``
compilations from empty caches in alternating order, so that neither pays the process's first compilation
alone), run once untimed, then the timed runs
alternate A B B A ... (``--repeats`` each); frames/s = agents x frames per run / seconds of one call
(``block_until_ready``), median of the repeats.

Beside frames/s, for each implementation and agent count:

- ``dot_flops_per_frame``: the matrix-product FLOPs of the compiled training per frame, counted on its
  optimised HLO with every loop's trip count (``flop_rate.hlo_dot_flops``; XLA's
  ``cost_analysis()`` counts a loop's body once and so is not used); ``analytic_flops_per_frame``
  counts PPO's dense layers by hand as a cross-check;
- ``matmul_rate_gflops``: this process's measured f32 rate of a jitted loop of N independent
  (128 x 64) @ (64 x 64) products (PPO's minibatch shape, one per agent), measured after the timed runs;
- ``matmul_fraction``: dot FLOPs per frame x frames/s / that rate;
- ``operations_per_update``: the instructions the compiled program executes per PPO update, for all
  its agents together (a fusion counts one; ``flop_rate.hlo_op_counts``), and the same by opcode.

One JSON object goes to stdout (progress to stderr), with ``ratio_metarl_over_purejaxrl`` of frames/s
(> 1: metarl is faster) and of compile seconds (< 1: metarl compiles faster), and the load average
before and after each agent count.

PureJaxRL's PPO is loaded from a PureJaxRL checkout named by ``--purejaxrl DIR`` or ``$METARL_PUREJAXRL``
(``benchmarks/peers.py``: how to get one, the distrax it needs beside the venv, and what is adapted for
gymnax 1.0). Usage, from the repository's root (under ``timeout``: jax can hang on a 2-core CPU, see
docs/performance.md, "Which jax")::

    timeout 1800 python -m benchmarks.ppo_side_by_side --purejaxrl DIR --agents 1 8 32 --repeats 3 \\
        --total-timesteps 1e5 > benchmarks/results/ppo_side_by_side_2core.json

``--compile metarl`` compiles both with the options metarl's own runs use on a CPU
(``metarl.compilation.compiler_options()``), ``--compile single-agent`` both with those it suggests
for one agent (``metarl.compilation.SINGLE_AGENT_CPU_OPTIONS``); the default is JAX's defaults for both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax

from benchmarks import flop_rate, peers

IMPLS = ("metarl", "purejaxrl")
# PureJaxRL's purejaxrl/ppo.py __main__ config for CartPole-v1, verbatim.
PJR_CONFIG = {
    "LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5, "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
    "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True, "DEBUG": False,
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_one(impl: str, total: int, update_epochs: int = PJR_CONFIG["UPDATE_EPOCHS"]):
    """(train(key) for one agent, key maker(seed, n), frames per agent per call)."""
    if impl == "metarl":
        from metarl.inner_loops.ppo import PPOConfig, make_train
        config = PPOConfig(env="CartPole-v1", total_timesteps=total, update_epochs=update_epochs)
        train = make_train(config)
        return (lambda k: train(k)), (lambda s, n: jax.random.split(jax.random.key(s), n)), config.frames_per_run
    if impl == "purejaxrl":
        config = dict(PJR_CONFIG, TOTAL_TIMESTEPS=float(total), UPDATE_EPOCHS=update_epochs)
        train = peers.load("ppo").make_train(config)  # sets config["NUM_UPDATES"]
        frames = int(config["NUM_UPDATES"]) * config["NUM_STEPS"] * config["NUM_ENVS"]
        return train, (lambda s, n: jax.random.split(jax.random.PRNGKey(s), n)), frames
    raise ValueError(f"impl: {impl!r}; allowed: {', '.join(IMPLS)}")


def build(impl: str, total: int, n: int, options: dict | None,
          update_epochs: int = PJR_CONFIG["UPDATE_EPOCHS"]):
    """(compiled fn(keys), key maker(seed), frames per agent per call, compile seconds, dot FLOPs per
    frame, operations the program executes per update, by opcode)."""
    one, keys, frames = make_one(impl, total, update_epochs)
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(one)).lower(keys(0, n)).compile(options or None)
    compile_s = time.perf_counter() - start
    flops = flop_rate.hlo_dot_flops(compiled) / (frames * n)
    updates = frames // (PJR_CONFIG["NUM_ENVS"] * PJR_CONFIG["NUM_STEPS"])
    ops = {op: round(count / updates) for op, count in flop_rate.hlo_op_counts(compiled).most_common()}
    return compiled, (lambda s: keys(s, n)), frames, compile_s, flops, ops


def timed(fn, keys) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(keys))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=float, default=1e5)
    parser.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--compile", choices=("default", "metarl", "single-agent"), default="default")
    parser.add_argument("--compile-repeats", type=int, default=3)
    peers.add_option(parser)
    args = parser.parse_args()
    if "purejaxrl" in args.impl:
        peers.require(args.purejaxrl, "ppo", parser.prog)
    options = None
    if args.compile != "default":
        from metarl import compilation
        options = (compilation.compiler_options() if args.compile == "metarl"
                   else compilation.SINGLE_AGENT_CPU_OPTIONS)
    total = int(args.total_timesteps)
    impls = list(dict.fromkeys(args.impl))
    analytic = flop_rate.ppo_analytic_flops_per_frame()

    results: dict = {}
    ratios: dict = {}
    compile_ratios: dict = {}
    rates: dict = {}
    loads: dict = {}
    for n in args.agents:
        load_before = os.getloadavg()
        built, compiles = {}, {impl: [] for impl in impls}
        for c in range(args.compile_repeats):
            for impl in (impls if c % 2 == 0 else impls[::-1]):  # A B B A ...
                jax.clear_caches()  # trace, lower and compile from nothing each time
                built[impl] = build(impl, total, n, options)
                compiles[impl].append(built[impl][3])
                log(f"[{n} agents] {impl}: trace + compile {compiles[impl][-1]:.2f}s")
        for impl in impls:
            fn, keys, frames, _, flops, ops = built[impl]
            built[impl] = (fn, keys, frames, statistics.median(compiles[impl]), flops, ops)
            jax.block_until_ready(fn(jax.block_until_ready(keys(1))))  # warm-up, untimed
            log(f"[{n} agents] {impl}: {flops:.4g} dot FLOP/frame")
        runs = {impl: [] for impl in impls}
        for r in range(args.repeats):
            for impl in (impls if r % 2 == 0 else impls[::-1]):  # A B B A ...
                fn, keys = built[impl][:2]
                k = jax.block_until_ready(keys(r + 2))
                runs[impl].append(timed(fn, k))
                log(f"[{n} agents] {impl}: run {r} {runs[impl][-1]:.3f}s")
        rate = flop_rate.matmul_rate(n, rows=128)
        rates[str(n)] = round(rate / 1e9, 2)
        log(f"[{n} agents] matmul {n} x (128x64 @ 64x64): {rate / 1e9:.1f} GFLOP/s")
        for impl in impls:
            _, _, frames, compile_s, flops, ops = built[impl]
            run_s = statistics.median(runs[impl])
            fps = frames * n / run_s
            results.setdefault(impl, {})[str(n)] = {
                "compile_s": round(compile_s, 2),
                "compiles_s": [round(t, 2) for t in compiles[impl]],
                "run_s": round(run_s, 4),
                "frames_per_s": round(fps),
                "frames_per_run": frames * n,
                "runs_s": [round(t, 4) for t in runs[impl]],
                "dot_flops_per_frame": round(flops),
                "achieved_gflops": round(fps * flops / 1e9, 2),
                "matmul_fraction": round(fps * flops / rate, 3),
                "operations_per_update": sum(ops.values()),
                "operations_per_update_by_kind": ops,
            }
        if "metarl" in results and "purejaxrl" in results:
            m, p = results["metarl"][str(n)], results["purejaxrl"][str(n)]
            ratios[str(n)] = round(m["frames_per_s"] / p["frames_per_s"], 3)
            compile_ratios[str(n)] = round(m["compile_s"] / p["compile_s"], 3)
        loads[str(n)] = {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]}
        del built

    print(json.dumps({
        "benchmark": "ppo_cartpole_side_by_side_purejaxrl",
        **flop_rate.cartpole_run_header(total, args.repeats, args.compile, options),
        "compile_repeats": args.compile_repeats,
        "results": results,
        "ratio_metarl_over_purejaxrl": ratios,
        "compile_ratio_metarl_over_purejaxrl": compile_ratios,
        "matmul_rate_gflops": rates,
        "analytic_flops_per_frame": analytic,
        "loadavg": loads,
        **flop_rate.MATMUL_KEYS,
        **flop_rate.machine(),
    }))


if __name__ == "__main__":
    main()
