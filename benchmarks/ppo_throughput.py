"""PPO throughput on CartPole-v1: metarl's ``metarl.inner_loops.ppo`` against a PureJaxRL-style reference.

Both use PureJaxRL's default CartPole config (4 envs x 128 steps, 4 epochs x 4 minibatches, 64x64 tanh
actor and critic, lr 2.5e-4 annealed, 5e5 frames). For each agent count, ``jax.jit(jax.vmap(train))``
over that many keys is compiled and timed for each implementation in the same process; timed runs
alternate between the implementations (ABBA order) so machine drift hits both alike. Prints ONE JSON
object to stdout (progress goes to stderr):

- per implementation and agent count: ``compile_s`` (tracing, lowering and compiling, timed on
  their own; JAX's persistent compilation cache is not used here), ``first_run_s``, ``run_s`` (median
  of ``--repeats`` runs after the first), ``frames_per_s`` (agents x frames per run / run_s)
  and every run's seconds;
- per implementation and agent count also ``dot_flops_per_frame`` and ``matmul_fraction``, and per agent
  count ``matmul_rate_gflops``: the matrix-product FLOPs of the compiled training per frame and the
  share of this process's measured f32 matrix-product rate at PPO's shapes that it reaches (see
  ``flop_rate.py``, shared with ``ppo_side_by_side.py``);
- per agent count: ``ratio_metarl_over_reference`` of frames/s (> 1 means metarl is faster);
- jax version, device count, ``os.cpu_count()``, the CPUs the process may use, and ``XLA_FLAGS``.

Usage (run under ``timeout``: jax 0.10 can deadlock on 2 CPU cores, see docs/performance.md, "Which jax")::

    timeout 1800 python -m benchmarks.ppo_throughput [--agents 1 8 32] [--repeats 3]
        [--total-timesteps 500000] [--impl metarl reference] [--compile default|metarl]

``--compile metarl`` compiles both implementations with the options metarl's own runs use on a CPU
(``metarl.compilation.compiler_options()``), to see what they do to compile and run time; the
comparison of the two implementations stays like for like either way.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax

from metarl.inner_loops.ppo import PPOConfig, make_train as make_metarl_train

from benchmarks import flop_rate, reference_ppo

IMPLS = ("metarl", "reference")


def build(impl: str, total_timesteps: int, n_agents: int, compiler_options: dict | None = None):
    """(fn(key) training ``n_agents`` vmapped agents, frames stepped per agent, seconds spent tracing
    and compiling it, matrix-product FLOPs per frame), compiled with ``compiler_options`` (None: JAX's
    defaults, as a plain jit)."""
    if impl == "metarl":
        config = PPOConfig(env="CartPole-v1", total_timesteps=total_timesteps)
        train = make_metarl_train(config)
        one = lambda k: train(k)  # noqa: E731
        frames = config.frames_per_run
    elif impl == "reference":
        one = reference_ppo.make_train(total_timesteps=total_timesteps)
        frames = reference_ppo.frames_per_run(total_timesteps=total_timesteps)
    else:
        raise ValueError(f"impl: {impl!r}; allowed: {', '.join(IMPLS)}")
    many = jax.jit(jax.vmap(one))
    keys = jax.random.split(jax.random.key(0), n_agents)
    start = time.perf_counter()
    compiled = many.lower(keys).compile(compiler_options or None)
    compile_s = time.perf_counter() - start
    flops = flop_rate.hlo_dot_flops(compiled) / (frames * n_agents)
    return (lambda key: compiled(jax.random.split(key, n_agents))), frames, compile_s, flops


def timed(fn, key) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(key))
    return time.perf_counter() - start


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=float, default=5e5)
    parser.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--compile", choices=("default", "metarl"), default="default",
                        help="compile both implementations with JAX's default options, or with the "
                             "options metarl compiles its own programs with (metarl.compilation.compiler_options)")
    args = parser.parse_args()
    options = None
    if args.compile == "metarl":
        from metarl import compilation
        options = compilation.compiler_options()
    total = int(args.total_timesteps)
    impls = list(dict.fromkeys(args.impl))

    results: dict = {}
    ratios: dict = {}
    rates: dict = {}
    for n in args.agents:
        key = jax.random.key(n)
        fns, first, runs = {}, {}, {impl: [] for impl in impls}
        for impl in impls:
            fns[impl] = build(impl, total, n, options)
            first[impl] = timed(fns[impl][0], key)
            log(f"[{n} agents] {impl}: trace + compile {fns[impl][2]:.2f}s, first run {first[impl]:.2f}s")
        for r in range(args.repeats):
            order = impls if r % 2 == 0 else impls[::-1]
            for impl in order:
                runs[impl].append(timed(fns[impl][0], jax.random.fold_in(key, r + 1)))
                log(f"[{n} agents] {impl}: run {r} {runs[impl][-1]:.3f}s")
        rate = flop_rate.matmul_rate(n, rows=128)
        rates[str(n)] = round(rate / 1e9, 2)
        for impl in impls:
            run_s = statistics.median(runs[impl])
            frames = fns[impl][1] * n
            results.setdefault(impl, {})[str(n)] = {
                "compile_s": round(fns[impl][2], 2),
                "first_run_s": round(first[impl], 4),
                "run_s": round(run_s, 4),
                "frames_per_s": round(frames / run_s),
                "frames_per_run": frames,
                "runs_s": [round(t, 4) for t in runs[impl]],
                "dot_flops_per_frame": round(fns[impl][3]),
                "matmul_fraction": round(frames / run_s * fns[impl][3] / rate, 3),
            }
        if "metarl" in results and "reference" in results:
            ratios[str(n)] = round(results["metarl"][str(n)]["frames_per_s"]
                                   / results["reference"][str(n)]["frames_per_s"], 3)

    print(json.dumps({
        "benchmark": "ppo_cartpole_throughput",
        **flop_rate.cartpole_run_header(total, args.repeats, args.compile, options),
        "results": results,
        "ratio_metarl_over_reference": ratios,
        "matmul_rate_gflops": rates,
        **flop_rate.MATMUL_KEYS,
        **flop_rate.machine(),
        "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
    }))


if __name__ == "__main__":
    main()
