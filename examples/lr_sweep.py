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

    from metarl import evaluate, pertask
    from metarl.outer_loops import streams
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
    _, keys = streams.evaluation(cfg.seed, seeds)   # agent i of the evaluation's sides trains from key i
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
    return {"run_dir": str(run_dir), "learned": learned, "seeds": seeds, "key_root": report["key_root"],
            "statistic": report["statistic"], "lrs": decoded, "tasks": rows, "by_lr": by_lr(rows, report, learned)}


def by_lr(rows: list[dict], report: dict, learned: str) -> list[dict]:
    """Per rate, the learned side's IQM normalised by PPO at that rate, their difference and P(learned > PPO),
    with stratified bootstrap 95% CIs over both sides' seeds and PPO's mean that normalises (unpaired: the
    learned side has all the evaluation's seeds, PPO its first ``seeds``)."""
    from metarl import stats
    from metarl.outer_loops.fitness import spans

    raw = {"learned": np.stack([t["sides"][learned]["final_returns"] for t in report["tasks"]], axis=1)}
    random, summary = np.array([row["random_return"] for row in rows]), []
    for j, lr in enumerate(row["lr"] for row in rows[0]["ppo"]):
        raw["ppo"] = np.stack([row["ppo"][j]["final_returns"] for row in rows], axis=1)
        point, draws = stats.bootstrap(lambda n: [stats.iqm(n["learned"]), stats.iqm(n["learned"]) - stats.iqm(n["ppo"]),
                                                  stats.probability_of_improvement(n["learned"], n["ppo"])],
                                       raw, random, "ppo", 2000, np.random.RandomState(0), paired=False)
        ci = stats.percentile(draws)
        per_task = (raw["learned"] - random) / np.asarray(spans({"base": np.nanmean(raw["ppo"], 0), "low": random}), float)
        summary.append({"lr": lr, "learned_iqm": point[0], "learned_iqm_ci95": ci[0], "difference": point[1],
                        "difference_ci95": ci[1], "probability_of_improvement": point[2],
                        "probability_of_improvement_ci95": ci[2],
                        "learned_per_task": [float(v) for v in np.nanmean(per_task, axis=0)]})
    return summary


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
    lines.append("| P(learned > that PPO) | | " + " | ".join(
        f"{s['probability_of_improvement']:.2f} [{s['probability_of_improvement_ci95'][0]:.2f}, "
        f"{s['probability_of_improvement_ci95'][1]:.2f}]" for s in result["by_lr"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--lrs", default="2.5e-4,1e-3,2.5e-3,5e-3,1e-2")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--restate", action="store_true", help="recompute OUT_DIR/lr_sweep.json's statistics from "
                        "its per-seed returns and RUN_DIR/evaluation.json's, without training")
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
        if args.restate:
            result = json.loads((args.out_dir / "lr_sweep.json").read_text())
            report = json.loads((args.run_dir / "evaluation.json").read_text())
            result["by_lr"] = by_lr(result["tasks"], report, result["learned"])
        else:
            result = sweep(args.run_dir, lrs, args.seeds)
            result["seconds"] = time.perf_counter() - t
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "lr_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out_dir / "lr_sweep.md").write_text(table(result) + "\n")
    print(table(result))
    print(f"wrote {args.out_dir / 'lr_sweep.json'} and lr_sweep.md in {result['seconds'] / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
