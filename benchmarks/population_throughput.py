"""Frames per second of the whole population evaluation: one CPU device vs ``auto`` (one per usable core).

The value_loss experiment's inner PPO (CartPole, 4 envs x 64 steps) with a short budget, through the
real CLI, at popsize 8 and 32. Each mode is a fresh run without the compilation cache, so the compile
seconds are real; a run's rate is the median over the generations after the first (a generation is one
jitted call: ask, evaluate every member on every seed, tell), and a mode's is the median over its runs,
which alternate with the other modes'. Prints one JSON object.

    python -m benchmarks.population_throughput                 # about 8-10 minutes on 2 cores
    python -m benchmarks.population_throughput --popsizes 8 --generations 3
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_mode(mode: str, popsize: int, args, workdir: Path) -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", METARL_COMPILATION_CACHE="0", PYTHONUNBUFFERED="1")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    extra = [f"devices.num_cpu_devices={1 if mode == 'one_device' else 'auto'}"]
    run_dir = workdir / f"{mode}-{popsize}"
    cmd = [sys.executable, "-m", "metarl.evolve", "experiment=value_loss", f"es.popsize={popsize}",
           f"fitness.num_seeds={args.num_seeds}", f"inner.total_timesteps={args.timesteps}",
           f"es.generations={args.generations}", "checkpoint.every=1000", "logger.progress=false",
           f"run_dir={run_dir}", *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {args.timeout} s (hang?)"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"status": f"exit {proc.returncode}", "stderr": proc.stderr.strip().splitlines()[-3:]}
    compiled = re.search(r"compiled the generation in ([\d.]+) s", proc.stdout + proc.stderr)
    devices = re.search(r"on (\d+) device\(s\)", proc.stdout + proc.stderr)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fps = [r["fps"] for r in records[1:]] or [r["fps"] for r in records]
    return {"status": "ok", "fps_median": round(statistics.median(fps)), "fps_all": [round(f) for f in fps],
            "frames_per_generation": popsize * args.num_seeds * args.timesteps,
            "compile_seconds": float(compiled.group(1)) if compiled else None, "wall_seconds": round(wall, 1),
            "devices": int(devices.group(1)) if devices else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popsizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--modes", nargs="+", default=["one_device", "auto"], choices=["one_device", "auto"])
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating; medians reported")
    parser.add_argument("--num-seeds", type=int, default=2)
    parser.add_argument("--timesteps", type=int, default=8192, help="PPO frames per member and seed")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per run before calling it a hang")
    args = parser.parse_args()

    import jax

    out = {"jax": jax.__version__, "cores": len(os.sched_getaffinity(0)),
           "inner": "value_loss PPO, CartPole, 4 envs x 64 steps", "timesteps_per_member_seed": args.timesteps,
           "num_seeds": args.num_seeds, "generations": args.generations, "repeats": args.repeats, "results": {}}
    with tempfile.TemporaryDirectory(prefix="metarl-bench-") as tmp:
        for popsize in args.popsizes:
            runs = {mode: [] for mode in args.modes}
            for i in range(args.repeats):  # alternating (A B C, C B A, ...), so drift hits every mode alike
                for mode in (args.modes if i % 2 == 0 else args.modes[::-1]):
                    r = run_mode(mode, popsize, args, Path(tmp) / str(i))
                    print(f"popsize {popsize} {mode}: {r}", file=sys.stderr, flush=True)
                    runs[mode].append(r)
            row = {}
            for mode, rs in runs.items():
                fps = [r["fps_median"] for r in rs if r.get("status") == "ok"]
                row[mode] = {"fps_median": round(statistics.median(fps)) if fps else None, "runs": rs}
            base = row.get("one_device", {}).get("fps_median")
            for mode, r in row.items():
                if base and r["fps_median"] and mode != "one_device":
                    r["speedup_vs_one_device"] = round(r["fps_median"] / base, 2)
            out["results"][f"popsize_{popsize}"] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
