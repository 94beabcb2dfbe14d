"""PPO's compile time and speed with JAX's threefry hash lowered two ways on a CPU, in ONE process.

Every ``jax.random`` draw from JAX's default keys is the Threefry-2x32 hash (20 rounds), the primitive
``threefry2x32``. JAX lowers it on a CPU as a rolled loop of five 4-round blocks (``rolled``, JAX's
own rule) and elsewhere as 20 straight rounds. ``straight`` is JAX's straight form (its
``use_rolled_loops=False``) with an optimization barrier on its output: without one, jaxlib 0.11.2's
CPU compiler did not finish compiling ``jax.vmap(lambda k: jax.random.uniform(k,
(3,)))(jax.random.split(key, 3))`` (the split's and the draw's hashes fused into one kernel; 2 or 4
keys compiled in 0.3 s). Both rules compute the same hash, so the programs give the same bits (checked
here on metarl's trainer).

For each agent count, metarl's PPO and PureJaxRL's (``ppo_side_by_side.make_one``: CartPole-v1,
PureJaxRL's config; ``--algo dqn``: the DQNs of ``dqn_side_by_side.py``; PureJaxRL's from the checkout
that ``--purejaxrl DIR`` or ``$METARL_PUREJAXRL`` names, ``benchmarks/peers.py``) are compiled under each rule
(the rule is registered before each lowering; ``--compile-repeats`` compilations from empty caches,
alternating), then run alternating (``--repeats``). JSON to stdout: median compile seconds and
frames/s per implementation and rule; with ``--small-programs``, also the compile time of 144 small
random programs under each rule. Both rules are read from JAX's internals, so this script names
the modules of jax 0.9 and 0.11.

    timeout 1800 python -m benchmarks.threefry_lowering --purejaxrl DIR --agents 1 8 32 --repeats 5 --compile-repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

from benchmarks import dqn_side_by_side, peers
from benchmarks import ppo_side_by_side as sbs

try:  # JAX's CPU rule, and the hash it lowers with use_rolled_loops=False elsewhere
    from jax._src.random.threefry2x32 import _threefry2x32_cpu_lowering_rule as ROLLED  # jax 0.11
    from jax._src.random.threefry2x32 import _threefry2x32_lowering as jax_threefry2x32
except ImportError:
    from jax._src.prng import _threefry2x32_cpu_lowering_rule as ROLLED  # jax 0.9
    from jax._src.prng import _threefry2x32_lowering as jax_threefry2x32

def _straight(*words):
    return list(jax.lax.optimization_barrier(tuple(jax_threefry2x32(*words, use_rolled_loops=False))))


RULES = {"rolled": ROLLED, "straight": mlir.lower_fun(_straight, multiple_results=True)}


def small_programs() -> list:
    """144 small random programs: splits, fold-ins, uniform, normal and categorical draws, under vmap."""
    programs = []
    for n in (1, 2, 3, 5, 7, 16):
        for m in (1, 2, 3, 5, 9, 33):
            programs += [
                lambda k, n=n, m=m: jax.vmap(lambda kk: jax.random.uniform(kk, (m,)))(jax.random.split(k, n)),
                lambda k, n=n, m=m: jax.vmap(lambda kk: jax.random.normal(jax.random.fold_in(kk, 7), (m, 2)))(
                    jax.random.split(k, n)),
                lambda k, n=n, m=m: jax.random.bits(jax.random.split(jax.random.split(k, n)[n - 1], m)[0], (n, m)),
                lambda k, n=n, m=m: jax.vmap(lambda kk: jax.random.categorical(kk, jnp.zeros((m, 3))))(
                    jax.random.split(k, n))]
    return programs


def compile_small_programs() -> dict:
    """Seconds to compile ``small_programs()`` under each rule: total and the slowest one."""
    out = {}
    for rule in RULES:
        mlir.register_lowering(threefry2x32_p, RULES[rule], platform="cpu")
        jax.clear_caches()
        times = []
        for program in small_programs():
            start = time.perf_counter()
            jax.jit(program).lower(jax.random.key(1)).compile()
            times.append(time.perf_counter() - start)
        out[rule] = {"programs": len(times), "total_s": round(sum(times), 1), "slowest_s": round(max(times), 2)}
        sbs.log(f"small programs, {rule}: {out[rule]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile-repeats", type=int, default=2)
    parser.add_argument("--total-timesteps", type=float, default=1e5)
    parser.add_argument("--small-programs", action="store_true", help="also time compile_small_programs()")
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo",
                        help="dqn: the two DQNs of dqn_side_by_side.py (their config, metrics every 5,000 steps as there)")
    peers.add_option(parser)
    args = parser.parse_args()
    peers.require(args.purejaxrl, args.algo, parser.prog)
    total = int(args.total_timesteps)
    if args.algo == "ppo":
        build = lambda impl, n: sbs.build(impl, total, n, None)  # noqa: E731
    else:
        build = lambda impl, n: dqn_side_by_side.build(impl, total, n, 5000)  # noqa: E731
    variants = [(impl, rule) for impl in sbs.IMPLS for rule in RULES]
    results: dict = {}
    for n in args.agents:
        built, compiles = {}, {v: [] for v in variants}
        for c in range(args.compile_repeats):
            for v in (variants if c % 2 == 0 else variants[::-1]):
                jax.clear_caches()
                mlir.register_lowering(threefry2x32_p, RULES[v[1]], platform="cpu")
                built[v] = build(v[0], n)
                compiles[v].append(built[v][3])
                sbs.log(f"[{n} agents] {v[0]} {v[1]}: trace + compile {compiles[v][-1]:.2f}s")
        outputs = {v: jax.tree.leaves(jax.device_get(built[v][0](built[v][1](1)))) for v in variants}  # warm-up
        same = all(np.array_equal(a, b) for a, b in zip(outputs[("metarl", "rolled")], outputs[("metarl", "straight")]))
        runs = {v: [] for v in variants}
        for r in range(args.repeats):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                keys = jax.block_until_ready(built[v][1](r + 2))
                runs[v].append(sbs.timed(built[v][0], keys))
        for impl, rule in variants:
            frames = built[(impl, rule)][2] * n
            results.setdefault(impl, {}).setdefault(rule, {})[str(n)] = {
                "compile_s": round(statistics.median(compiles[(impl, rule)]), 2),
                "compiles_s": [round(t, 2) for t in compiles[(impl, rule)]],
                "frames_per_s": round(frames / statistics.median(runs[(impl, rule)])),
                "runs_s": [round(t, 4) for t in runs[(impl, rule)]]}
        results.setdefault("metarl_bit_identical", {})[str(n)] = same
        results.setdefault("loadavg_after", {})[str(n)] = [round(x, 2) for x in os.getloadavg()]
        sbs.log(f"[{n} agents] " + "; ".join(f"{i} {r} {results[i][r][str(n)]['compile_s']} s, "
                                            f"{results[i][r][str(n)]['frames_per_s']} frames/s" for i, r in variants))
        del built
    if args.small_programs:
        results["small_programs"] = compile_small_programs()
    print(json.dumps({"benchmark": "threefry_cpu_lowering", "jax": jax.__version__, "python": sys.version.split()[0],
                      "algo": args.algo, "total_timesteps": total, "repeats": args.repeats, "compile_repeats": args.compile_repeats,
                      "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))


if __name__ == "__main__":
    main()
