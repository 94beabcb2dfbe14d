"""Frames/s of one generation against the population size, on whatever device JAX sees (a GPU).

Each population size runs in a fresh process (so the compile seconds and the peak memory are that
size's alone), built through metarl's own code: ``metarl.config.load("value_loss", ...)`` and
``metarl.search.build_evolution``, then one compiled generation timed ``--generations`` times. The
inner PPO is the value_loss GPU preset (CartPole, 4 envs x 64 steps, 2 seeds per member) with
``--timesteps`` frames per run: frames/s per generation hardly depends on the run's length once a run
has a few hundred updates, so a shorter run measures the same rate in less device time. Prints one
JSON object (and one line per size on stderr as it goes).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python -m benchmarks.gpu_population_sweep
    python -m benchmarks.gpu_population_sweep --popsizes 64 256 1024 --timesteps 65536 --generations 3

Memory is JAX's own count (``peak_bytes_in_use`` of the device), which is exact when JAX does not
preallocate (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, set for the child processes unless already set).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def one(popsize: int, args) -> dict:
    """Build, compile and time one population size in this process."""
    import jax

    from metarl import config as config_lib
    from metarl import devices, search

    overrides = [f"es.popsize={popsize}", f"fitness.num_seeds={args.num_seeds}", "inner.num_steps=64",
                 f"inner.num_envs={args.num_envs}", f"inner.total_timesteps={args.timesteps}",
                 "es.lr=0.05", "es.adam_b1=0.99", f"es.generations={args.generations}"]
    cfg = config_lib.load("value_loss", overrides)
    task, evo = search.build_evolution(cfg)
    state = devices.replicate(evo.init(jax.random.key(cfg.seed)), evo.mesh)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    step = evo.step.lower(state).compile()
    compile_s = time.perf_counter() - t0
    frames = popsize * args.num_seeds * task.frames_per_eval
    seconds = []
    for _ in range(args.generations):
        t = time.perf_counter()
        state, stats = step(state)
        stats = jax.device_get(stats)
        seconds.append(time.perf_counter() - t)
    timed = seconds[1:] or seconds  # the first call after compiling may still pay one-off costs
    out = {"popsize": popsize, "frames_per_generation": frames, "compile_seconds": round(compile_s, 2),
           "seconds": [round(s, 3) for s in seconds], "fps_median": round(frames / statistics.median(timed)),
           "mean_fitness_last": float(stats["mean"])}
    mem = jax.devices()[0].memory_stats() or {}
    if mem:
        out["peak_gib"] = round(mem.get("peak_bytes_in_use", 0) / 2**30, 3)
        out["device_limit_gib"] = round(mem.get("bytes_limit", 0) / 2**30, 2)
    try:
        temp = step.memory_analysis().temp_size_in_bytes
        out["xla_temp_gib"] = round(temp / 2**30, 3)
    except Exception:  # not every backend reports it
        pass
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popsizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--generations", type=int, default=3, help="timed generations per size (median of all but the first)")
    parser.add_argument("--num-seeds", type=int, default=2)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--timesteps", type=int, default=65536, help="PPO frames per member and seed")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per size before giving up on it")
    parser.add_argument("--budget", type=float, default=float("inf"),
                        help="seconds for the whole sweep; sizes left when it is spent are skipped")
    parser.add_argument("--out", default=None, help="also write the JSON here after every size")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one is not None:
        print("RESULT " + json.dumps(one(args.one, args)), flush=True)
        return

    import jax

    dev = jax.devices()[0]
    out = {"jax": jax.__version__, "device": f"{dev.platform}: {getattr(dev, 'device_kind', '')}",
           "device_count": jax.device_count(),
           "inner": f"value_loss PPO, CartPole, {args.num_envs} envs x 64 steps",
           "timesteps_per_member_seed": args.timesteps, "num_seeds": args.num_seeds,
           "generations": args.generations, "results": []}
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    start = time.perf_counter()
    child = [a for a in sys.argv[1:]]
    for popsize in args.popsizes:
        if time.perf_counter() - start > args.budget:
            out["results"].append({"popsize": popsize, "status": "skipped: budget spent"})
            continue
        cmd = [sys.executable, "-m", "benchmarks.gpu_population_sweep", *child, "--one", str(popsize)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode == 0 and lines:
                row = {"status": "ok", **json.loads(lines[-1][len("RESULT "):])}
            else:
                row = {"popsize": popsize, "status": f"exit {proc.returncode}",
                       "stderr": proc.stderr.strip().splitlines()[-5:]}
        except subprocess.TimeoutExpired:
            row = {"popsize": popsize, "status": f"timed out after {args.timeout} s"}
        row["wall_seconds"] = round(time.perf_counter() - t0, 1)
        out["results"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
