"""A slice through a run's tuned PPO: one tuned hyperparameter set to several values, the others as tuned,
each scored against the tuned PPO itself, trained on the same seeds (paired), on the trained-on tasks, in units
of PPO as configured's margin over random play (the first tuning's reference, as tunings are compared), on
seeds no stage uses (the tuned point was chosen on the comparison's seeds, which flatter it). Where the tuned
value lies at an edge of its range, a slice past that edge says whether a wider range could find better.

    python examples/slice.py RUN_DIR NAME VALUES OUT_DIR [--seeds 16]
    python examples/slice.py checkpoints/adaptive_schedule_cpu gae_lambda 0,0.05,0.1,0.3,0.5,0.86 out/

Needs RUN_DIR/tuned.json. One program scores every value at once (the values as meta-parameters of kind
hyperparams over a range that holds them). OUT_DIR gets ``slice_NAME.json`` and ``slice_NAME.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path


def slice_through(run_dir: Path, name: str, values: list[float], seeds: int) -> dict:
    """The tuned point with ``name`` at each of ``values``: its gain over the tuned PPO and 95% interval."""
    import jax
    import numpy as np

    from metarl import stages
    from metarl.outer_loops import streams
    from metarl.results import load_config
    from metarl.rundir import RunDir
    from metarl.search import build_evolution
    from metarl.stats import t_bounds
    from metarl.tasks import build_task

    cfg, rd = load_config(run_dir), RunDir(run_dir)   # inner as tuned: the control is the tuned PPO
    tuned = rd.tuned.read()
    if tuned is None:
        raise ValueError(f"{run_dir}/tuned.json: missing; allowed: a run with a finished baseline.tune")
    if name not in tuned["hyperparameters"]:
        raise ValueError(f"NAME: {name!r}; allowed: {', '.join(tuned['hyperparameters'])}")
    # A range just wider than both the values and the tuned one: the sigmoid encodes open intervals only.
    space = dict(cfg.baseline.tune)
    low, high, log = space[name]["low"], space[name]["high"], space[name].get("log", False)
    lo, hi = min(values + [low]), max(values + [high])
    pad = (hi / lo) ** 0.01 if log else 0.01 * (hi - lo)
    space[name] = {"low": lo / pad if log else lo - pad, "high": hi * pad if log else hi + pad, "log": log}
    tcfg = stages.tuning_config(dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, tune=space)), rd)
    task = build_task(tcfg)
    _, evo = build_evolution(tcfg, task, "auto", RunDir(tcfg.run_dir).reference.read())
    points = [{**tuned["hyperparameters"], name: v} for v in values]
    candidates = jax.tree.map(lambda *z: np.stack(z), *[task.component.encode(p) for p in points])
    keys = streams.stream(tcfg.seed, "slice", seeds)   # a stream of the tuning seed that nothing else draws from
    fitness, per_seed = stages._rescore(evo, candidates, keys, f"{len(values)} values of {name}", True)
    decoded = [task.kind.values(task.component, jax.tree.map(lambda x, i=i: x[i], candidates))[name]
               for i in range(len(values))]
    return {"run_dir": str(run_dir), "name": name, "range": [low, high], "tuned": tuned["hyperparameters"],
            "seeds": len(keys), "stream": streams.STREAMS["slice"],
            "slice": [{name: v, "fitness": float(f), "ci95": t_bounds(np.asarray(s)),
                       "ci_best_of": t_bounds(np.asarray(s), level=1 - 0.05 / len(values))}
                      for v, f, s in zip(decoded, np.asarray(fitness), np.asarray(per_seed))]}


def table(result: dict) -> str:
    name, (low, high) = result["name"], result["range"]
    lines = [f"| {name} | gain over the tuned PPO (PPO as configured's margin = 1), {result['seeds']} seeds, "
             f"interval adjusted for the best of {len(result['slice'])} | in range |",
             "| --- | --- | --- |"]
    for row in result["slice"]:
        v, (a, b) = row[name], row["ci_best_of"]
        lines.append(f"| {v:.4g} | {row['fitness']:.3f} [{a:.3f}, {b:.3f}] | {'yes' if low <= v <= high else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("values")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seeds", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        values = [float(x) for x in args.values.split(",")]
        if args.seeds < 2:
            raise ValueError
    except ValueError:
        parser.error("VALUES: a comma-separated list of numbers; --seeds: an integer >= 2")
    from metarl import compilation, devices

    compilation.enable_compilation_cache()
    devices.use_cpu_cores("auto")   # a device per core, as evolve has
    t = time.perf_counter()
    try:
        result = slice_through(args.run_dir, args.name, values, args.seeds)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result["seconds"] = time.perf_counter() - t
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"slice_{args.name}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(result) + "\n")
    print(table(result))
    print(f"wrote {out}.json and .md in {result['seconds'] / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
