"""jax releases side by side: PPO throughput and the README's main line under each of several interpreters
(each a virtual environment with metarl installed and its own jax).

For each ``--python``, in turn (the order reversed every other round, so machine drift hits all alike):
``benchmarks/ppo_throughput.py`` (metarl's PPO against the PureJaxRL-style reference in the same process;
run as ``-m benchmarks.ppo_throughput`` from the repository's root, so it imports this checkout's metarl)
and ``python -m metarl.evolve experiment=value_loss`` as the README runs it (one process per core, an
empty compilation cache), timed as ``benchmarks/main_line_wall.py`` times it. Prints ONE JSON object:
per interpreter its Python, jax and jaxlib, the throughput JSON of each round, the main line's wall,
compile and median generation seconds and its fitness history; then whether the histories agree, and
the largest difference between releases in any generation's best and mean fitness. Progress goes to
stderr.

    python -m benchmarks.jax_releases --python /tmp/jax092/bin/python --python /tmp/jax0122/bin/python
    python -m benchmarks.jax_releases --python A --python B --rounds 2 es.generations=5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import main_line_wall

ROOT = Path(__file__).resolve().parent.parent


def versions(python: str) -> dict:
    code = "import json, platform, jax, jaxlib; print(json.dumps({'python_version': platform.python_version(), " \
           "'jax': jax.__version__, 'jaxlib': jaxlib.__version__}))"
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def throughput(python: str, args) -> dict:
    cmd = [python, "-m", "benchmarks.ppo_throughput", "--agents", *map(str, args.agents), "--repeats",
           str(args.repeats), "--total-timesteps", str(args.total_timesteps)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=True,
                         cwd=ROOT).stdout
    result = json.loads(out)
    return {"ratio_metarl_over_reference": result["ratio_metarl_over_reference"],
            **{impl: {n: {k: r[k] for k in ("compile_s", "frames_per_s")} for n, r in per.items()}
               for impl, per in result["results"].items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="an interpreter; repeat for each")
    parser.add_argument("--rounds", type=int, default=1, help="times each interpreter runs both benchmarks")
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3, help="ppo_throughput.py's timed runs per agent count")
    parser.add_argument("--total-timesteps", type=float, default=5e4, help="ppo_throughput.py's frames per agent")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per benchmark before calling it a hang")
    args, overrides = parser.parse_known_args()

    results = {python: {**versions(python), "ppo_throughput": [], "main_line": []} for python in args.python}
    with tempfile.TemporaryDirectory(prefix="metarl-releases-") as tmp:
        for round_ in range(args.rounds):
            for i, python in enumerate(args.python if round_ % 2 == 0 else args.python[::-1]):
                jax_version = results[python]["jax"]
                print(f"round {round_ + 1}: jax {jax_version}: ppo_throughput", file=sys.stderr, flush=True)
                results[python]["ppo_throughput"].append(throughput(python, args))
                print(f"round {round_ + 1}: jax {jax_version}: the main line", file=sys.stderr, flush=True)
                run_dir = Path(tmp) / f"run-{round_}-{i}"
                run = main_line_wall.run([], overrides, run_dir, Path(tmp) / f"cache-{round_}-{i}",
                                         args.timeout, python)
                print(f"  {run['wall_s']} s wall, {run['generation_s']} s per generation",
                      file=sys.stderr, flush=True)
                results[python]["main_line"].append(run)
    for r in results.values():
        r["main_line_median_wall_s"] = statistics.median(run["wall_s"] for run in r["main_line"])
    histories = [run["history"] for r in results.values() for run in r["main_line"]]
    stats = {"best": max, "mean": statistics.fmean}  # of a generation's finite member fitness (null: diverged)
    at = lambda fn, fitness: fn([f for f in fitness if f is not None])  # noqa: E731
    diff = {name: round(max(abs(at(fn, a[1]) - at(fn, b[1])) for h in histories for a, b in zip(h, histories[0])), 4)
            for name, fn in stats.items()}
    print(json.dumps({
        "command": "python -m metarl.evolve experiment=value_loss " + " ".join(overrides),
        "cores": len(os.sched_getaffinity(0)), "releases": list(results.values()),
        "same_fitness_history": all(h == histories[0] for h in histories),
        "largest_fitness_difference": diff}, indent=1))


if __name__ == "__main__":
    main()
