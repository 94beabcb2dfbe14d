"""Where XLA's CPU compile time goes in a PPO training: LLVM's time per compiled module, attributed to the
part of the program its first kernel comes from, for metarl's PPO or PureJaxRL's (CartPole, PureJaxRL's
config, N agents vmapped, JAX's default compiler options).

XLA logs each LLVM module it compiles with its time (``TF_CPP_VMODULE=ir_compiler=2``, set here before
jax loads; the log goes to this process's stderr, which is read back from a file). A module is named
after its first kernel, a fusion of the optimised HLO, whose ``op_name`` says where in the program it
was written: inside ``jax.named_scope`` ``env_step``, ``network``, ``optimizer`` or ``sampling``
(metarl's PPO), or elsewhere (``rest``), and whether it is random-number generation (threefry, uniform,
normal or Gumbel draws: ``+rng``). Modules compile on several threads, so their seconds add up to more
than the wall time. One JSON object on stdout; PureJaxRL's PPO comes from the checkout that
``--purejaxrl DIR`` or ``$METARL_PUREJAXRL`` names (``benchmarks/peers.py``)::

    python -m benchmarks.compile_profile --impl metarl --agents 8
    python -m benchmarks.compile_profile --impl purejaxrl --purejaxrl DIR --agents 8
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time

from benchmarks import peers  # imports no jax: the settings below still reach XLA

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
os.environ["TF_CPP_VMODULE"] = "ir_compiler=2,compiler_functor=2"

SCOPES = ("env_step", "network", "optimizer", "sampling")
RNG = ("threefry", "_uniform", "_normal", "_gumbel", "random_bits")
MODULE = re.compile(r"Compiled LLVM module: __compute_module_([\w.-]+?)_kernel_module time: .*?\((\d+) us\)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("metarl", "purejaxrl"), default="metarl")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--total-timesteps", type=float, default=1e5)
    peers.add_option(parser)
    args = parser.parse_args()
    if args.impl == "purejaxrl":
        peers.require(args.purejaxrl, "ppo", parser.prog)

    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # XLA's C++ log, and anything else on stderr, into the file
    try:
        import jax
        from benchmarks.ppo_side_by_side import make_one

        one, keys, _ = make_one(args.impl, int(args.total_timesteps))
        start = time.perf_counter()
        lowered = jax.jit(jax.vmap(one)).lower(keys(0, args.agents))
        traced = time.perf_counter()
        hlo = lowered.compile().as_text()
        compiled = time.perf_counter()
    finally:
        os.dup2(saved, 2)
    log.seek(0)
    text = log.read().decode(errors="replace")

    where = dict(re.findall(r"%([\w.-]+) = [^\n]*?metadata=\{op_name=\"([^\"]*)\"", hlo))
    seconds, modules = collections.Counter(), collections.Counter()
    slowest = []
    for name, us in MODULE.findall(text):
        op = where.get(name, "")
        part = next((s for s in SCOPES if f"/{s}/" in op), "rest") + ("+rng" if any(r in op for r in RNG) else "")
        seconds[part] += int(us) / 1e6
        modules[part] += 1
        slowest.append((int(us) / 1e6, name, op[-120:]))
    print(json.dumps({
        "impl": args.impl, "agents": args.agents, "trace_and_lower_s": round(traced - start, 2),
        "compile_s": round(compiled - traced, 2), "llvm_modules": sum(modules.values()),
        "llvm_module_seconds": round(sum(seconds.values()), 2),
        "llvm_rng_seconds": round(sum(v for k, v in seconds.items() if k.endswith("+rng")), 2),
        "by_part": {k: {"seconds": round(v, 2), "modules": modules[k]} for k, v in seconds.most_common()},
        "slowest": [{"seconds": round(s, 3), "kernel": n, "op_name": o} for s, n, o in sorted(slowest, reverse=True)[:10]],
        "jax": jax.__version__,
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
