"""A learning-rate sweep beside a run's learned part: PPO with the run's inner settings at several constant
learning rates (annealed as the run's PPO is), on the tasks of the run's evaluation and from that evaluation's
first seeds, and the learned part normalised by each (that PPO = 1, random play = 0). Was the learned part worth
more than finding PPO's learning rate?

    python examples/lr_sweep.py RUN_DIR OUT_DIR [--lrs 2.5e-4,1e-3,2.5e-3,5e-3,1e-2] [--seeds 16]

Needs RUN_DIR/evaluation.json (``python -m metarl.evaluate run_dir=RUN_DIR``): its tasks, key root, the learned
side's final returns and random play's. Per task, one program trains every learning rate and seed at once (the
rates as meta-parameters of kind hyperparams). OUT_DIR gets ``lr_sweep.json`` and ``lr_sweep.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np


def sweep(run_dir: Path, lrs: list[float], seeds: int) -> dict:
    """Per task, PPO's final returns at each rate; per rate, the learned side's IQM normalised by that PPO."""
    import jax.numpy as jnp

    from metarl import evaluate, pertask, stats
    from metarl.outer_loops.fitness import spans
    from metarl.progress import progress
    from metarl.results import load_config
    from metarl.tasks import build_task, task_specs

    report = json.loads((run_dir / "evaluation.json").read_text())
    learned = next((s["label"] for s in report["sides"] if s["role"] == "learned"), None)
    cfg = load_config(run_dir)
    specs = task_specs(cfg) + task_specs(cfg, "eval_tasks")
    if learned is None or [s.name for s in specs] != [row["task"] for row in report["tasks"]]:
        raise ValueError(f"{run_dir}/evaluation.json: not an evaluation of the run's learned part on its own tasks; "
                         f"allowed: after python -m metarl.evaluate run_dir={run_dir}")
    # The rates as z of a log range around them: one compiled program per task trains them all.
    space = {"lr": {"low": min(lrs) / 2, "high": max(lrs) * 2, "log": True}}
    hp = build_task(dataclasses.replace(cfg, component={"kind": "hyperparams", "search": space}), specs)
    z = jnp.stack([hp.component.encode({"lr": lr})["lr"] for lr in lrs])
    decoded = [hp.kind.values(hp.component, {"lr": v})["lr"] for v in z]
    _, keys = evaluate.eval_keys(cfg.seed, seeds)   # agent i of the evaluation's sides trains from key i
    meta = {"lr": jnp.repeat(z, seeds)}
    all_keys = jnp.concatenate([keys] * len(lrs))
    rows = []
    with progress(f"training PPO at {len(lrs)} learning rates x {seeds} seeds", total=len(specs)) as bar:
        for i, (spec, row) in enumerate(zip(specs, report["tasks"])):
            t = time.perf_counter()   # per-task tuning's scorer: split over the devices, memory bounded
            finals = pertask.scorer(hp, i, len(lrs) * seeds)(meta, all_keys).reshape(len(lrs), seeds)
            ppo = [{"lr": lr, **evaluate.summarise(f)} for lr, f in zip(decoded, finals)]
            rows.append({"task": spec.name, "split": row["split"], "random_return": row["random_return"],
                         "learned": row["sides"][learned]["mean"], "ppo": ppo, "seconds": time.perf_counter() - t})
            bar.update()
    rng = np.random.RandomState(0)
    summary = []
    for j, lr in enumerate(decoded):
        scores = []   # per task: the learned side's seeds, normalised by PPO at this rate
        for row, task_row in zip(rows, report["tasks"]):
            span = float(spans({"base": [row["ppo"][j]["mean"]], "low": [row["random_return"]]})[0])
            scores.append((np.asarray(task_row["sides"][learned]["final_returns"], float) - row["random_return"])
                          / span)
        iqm, ci = stats.interval(stats.iqm, (np.stack(scores, axis=1),), 2000, rng)
        summary.append({"lr": lr, "learned_iqm": iqm, "learned_iqm_ci95": ci,
                        "learned_per_task": [float(np.nanmean(s)) for s in scores]})
    return {"run_dir": str(run_dir), "learned": learned, "seeds": seeds, "key_root": report["key_root"],
            "statistic": report["statistic"], "lrs": decoded, "tasks": rows, "by_lr": summary}


def table(result: dict) -> str:
    """PPO's mean final return per task and rate, and the learned part normalised by each rate's PPO."""
    lrs = result["lrs"]
    lines = ["| task | learned | " + " | ".join(f"PPO lr {lr:.3g}" for lr in lrs) + " |",
             "| --- " * (2 + len(lrs)) + "|"]
    for row in result["tasks"]:
        best = int(np.nanargmax([p["mean"] for p in row["ppo"]]))
        cells = [(f"**{p['mean']:.4g}**" if j == best else f"{p['mean']:.4g}") for j, p in enumerate(row["ppo"])]
        lines.append(f"| {row['task']} ({row['split']}) | {row['learned']:.4g} | " + " | ".join(cells) + " |")
    lines.append("| learned, IQM normalised by that PPO | | " + " | ".join(
        f"{s['learned_iqm']:.2f} [{s['learned_iqm_ci95'][0]:.2f}, {s['learned_iqm_ci95'][1]:.2f}]"
        for s in result["by_lr"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--lrs", default="2.5e-4,1e-3,2.5e-3,5e-3,1e-2")
    parser.add_argument("--seeds", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        lrs = [float(x) for x in args.lrs.split(",")]
        if not lrs or min(lrs) <= 0 or args.seeds < 2:
            raise ValueError
    except ValueError:
        parser.error("--lrs: a comma-separated list of positive numbers; --seeds: an integer >= 2")
    from metarl import compilation, devices

    compilation.enable_compilation_cache()
    devices.use_cpu_cores("auto")   # a device per core, as evaluate has
    t = time.perf_counter()
    try:
        result = sweep(args.run_dir, lrs, args.seeds)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result["seconds"] = time.perf_counter() - t
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "lr_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out_dir / "lr_sweep.md").write_text(table(result) + "\n")
    print(table(result))
    print(f"wrote {args.out_dir / 'lr_sweep.json'} and lr_sweep.md in {result['seconds'] / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
