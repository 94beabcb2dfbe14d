"""Wall time of the README's main line, ``python -m metarl.evolve experiment=value_loss``, in two
modes, and whether both give the same fitness history. The modes: one CPU device
(``devices.num_cpu_devices=1``) against the default ``auto`` (one per usable core); or, with
``--before PYTHON``, an interpreter whose metarl is an earlier version ("before") against this one
("after"), each with its own defaults.

Runs alternate (A, B, B, A, ...) so machine drift hits both alike. Each run starts with an empty
compilation cache of its own, as a first run on a new machine does (``--warm`` keeps one cache per
mode, filled by an untimed run first). Extra ``key=value`` arguments go to every run. Prints one
JSON object: per mode every run's wall seconds, compile seconds and median generation seconds, the
medians, ``ratio`` (the second mode's median wall over the first's), and ``same_fitness_history``.

    python -m benchmarks.main_line_wall                        # about 10 minutes per pair on 2 cores
    python -m benchmarks.main_line_wall --pairs 2 es.generations=5
    python -m benchmarks.main_line_wall --pairs 2 --before /tmp/old-venv/bin/python
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



def run(extra: list[str], overrides: list[str], run_dir: Path, cache: Path, timeout: int,
        python: str = sys.executable) -> dict:
    """One run of the main line under ``python`` with ``extra`` and ``overrides``: its figures."""
    env = dict(os.environ, WANDB_MODE="disabled", JAX_COMPILATION_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    for name in ("METARL_NUM_PROCESSES", "JAX_NUM_CPU_DEVICES"):  # each mode as a user who set nothing
        env.pop(name, None)
    cmd = [python, "-m", "metarl.evolve", "experiment=value_loss", *overrides, *extra, f"run_dir={run_dir}"]
    t0 = time.perf_counter()
    # Started outside the checkout: from its root, `-m metarl.evolve` would import the checkout's metarl
    # whatever the interpreter, and --before would time this metarl twice.
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True,
                          cwd=run_dir.parent)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{python} {' '.join(extra)}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    out = proc.stdout + proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": round(wall, 1),
            "compile_s": float(re.search(r"compiled the generation in ([\d.]+) s", out).group(1)),
            "devices": int(re.search(r"on (\d+) device\(s\)", out).group(1)),
            "generation_s": round(statistics.median(r["seconds"] for r in records), 2),
            "history": [(r["generation"], r["fitness"]) for r in records]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1, help="runs per mode, alternating")
    parser.add_argument("--warm", action="store_true", help="a filled compilation cache per mode")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run before calling it a hang")
    parser.add_argument("--before", help="an interpreter with an earlier metarl: compare it with this one")
    args, overrides = parser.parse_known_args()

    import jax

    modes = ({"before": (args.before, []), "after": (sys.executable, [])} if args.before else
             {"one": (sys.executable, ["devices.num_cpu_devices=1"]), "auto": (sys.executable, [])})
    first, second = modes
    results = {mode: [] for mode in modes}
    order = [m for i in range(args.pairs) for m in ((first, second) if i % 2 == 0 else (second, first))]
    with tempfile.TemporaryDirectory(prefix="metarl-wall-") as tmp:
        tmp = Path(tmp)
        if args.warm:
            for mode, (python, extra) in modes.items():
                run(extra, [*overrides, "es.generations=1"], tmp / f"warmup-{mode}", tmp / f"cache-{mode}",
                    args.timeout, python)
        for i, mode in enumerate(order):
            cache = tmp / (f"cache-{mode}" if args.warm else f"cache-{i}")
            python, extra = modes[mode]
            r = run(extra, overrides, tmp / f"run-{i}-{mode}", cache, args.timeout, python)
            print(f"{mode}: {r['wall_s']} s wall, compile {r['compile_s']} s, {r['generation_s']} s per "
                  f"generation on {r['devices']} device(s)", file=sys.stderr, flush=True)
            results[mode].append(r)
    histories = [r.pop("history") for rs in results.values() for r in rs]
    median = {mode: statistics.median(r["wall_s"] for r in rs) for mode, rs in results.items()}
    print(json.dumps({
        "command": "python -m metarl.evolve experiment=value_loss " + " ".join(overrides),
        "jax": jax.__version__, "cores": len(os.sched_getaffinity(0)), "cache": "warm" if args.warm else "cold",
        "modes": {mode: {"python": python, "args": extra} for mode, (python, extra) in modes.items()},
        "runs": results, "median_wall_s": median, "ratio": f"{second} / {first}",
        "ratio_of_median_walls": round(median[second] / median[first], 3),
        "same_fitness_history": all(h == histories[0] for h in histories)}, indent=1))


if __name__ == "__main__":
    main()
