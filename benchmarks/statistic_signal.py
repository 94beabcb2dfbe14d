"""How many seeds a search needs to tell PPO variants apart, under each fitness statistic.

A search ranks members by a statistic of each training's learning curve (``fitness.statistic``:
``final``, the mean return over the last ``fitness.window`` of updates, or ``auc``, the mean over all
of them). This trains a PPO and a few variants of it (one hyperparameter multiplied, the kind of step a
search takes near a tuned point, and PPO as configured for scale) on the same seeds, in one vmapped,
jitted call per task, and reports for each statistic:

- per task and variant: the mean and per-seed standard deviation of the statistic;
- per variant, on the fitness a search sees (each task's return normalised as
  ``fitness.normalize=baseline`` does, 0 = random play and 1 = the first variant, then averaged over
  the tasks seed by seed): the difference from the first variant, Cohen's d (the difference over the
  pooled per-seed standard deviation), the correlation of the two on shared seeds, and
  ``seeds_for_2se`` = 8 / d^2, the seeds per side at which the difference is two standard errors.

The statistic with the larger d needs fewer seeds (the number falls with d squared) to rank the same
members. Prints one JSON object (progress on stderr)::

    python -m benchmarks.statistic_signal --tuned docs/runs/tuned_schedule_h100/tuned.json --seeds 32

``--tuned`` reads the hyperparameters of a run's ``tuned.json`` (and its ``configured`` ones for the
"as configured" variant); without it the first variant is PPOConfig's defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from metarl.inner_loops.envs import random_policy_return
from metarl.inner_loops.ppo import PPOConfig, make_train
from metarl.outer_loops.fitness import normalize, statistic_fn

# name: multipliers of the first variant's hyperparameters; None: PPO as configured
VARIANTS = {"tuned": {}, "lr x1.5": {"lr": 1.5}, "lr x0.67": {"lr": 1 / 1.5}, "lr x3": {"lr": 3.0},
            "lr x0.33": {"lr": 1 / 3}, "clip_eps x1.5": {"clip_eps": 1.5}, "ent_coef x10": {"ent_coef": 10.0},
            "as configured": None}
DEFAULT_VARIANTS = ("tuned", "lr x1.5", "lr x0.67", "clip_eps x1.5", "ent_coef x10", "as configured")
# fitness.statistic and fitness.window, as a search computes them
STATISTICS = {"final 0.2": statistic_fn("final", 0.2), "final 0.5": statistic_fn("final", 0.5),
              "auc": statistic_fn("auc", 1.0)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def curves(config: PPOConfig, values: list[dict], seeds: int) -> np.ndarray:
    """Learning curves (variants, seeds, updates): every variant on the same ``seeds`` keys, one call."""
    names = sorted(values[0])
    floats = {n: jnp.repeat(jnp.asarray([v[n] for v in values], jnp.float32), seeds) for n in names}
    keys = jnp.tile(jax.random.split(jax.random.key(0), seeds), len(values))
    train = make_train(config)
    program = jax.jit(jax.vmap(lambda k, f: train(k, f)[1]["episode_return"]))
    return np.asarray(program(keys, floats), np.float64).reshape(len(values), seeds, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuned", help="a run's tuned.json: its hyperparameters are the first variant")
    parser.add_argument("--tasks", nargs="+", default=["Breakout-MinAtar", "SpaceInvaders-MinAtar"])
    parser.add_argument("--total-timesteps", type=int, default=65536)
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS),
                        help="the first is what the others are compared with and normalised by")
    args = parser.parse_args()
    # tuned_schedule's inner settings (4 envs x 64 steps per update)
    base = PPOConfig(num_envs=4, num_steps=64, update_epochs=4, num_minibatches=4,
                     total_timesteps=args.total_timesteps)
    names = ("lr", "ent_coef", "clip_eps", "gae_lambda")
    first = {n: float(getattr(base, n)) for n in names}
    configured = dict(first)
    if args.tuned:
        tuned = json.load(open(args.tuned))
        first.update(tuned["hyperparameters"])
        configured.update(tuned["configured"])
    labels = list(args.variants)
    values = [configured if VARIANTS[name] is None else {n: v * VARIANTS[name].get(n, 1.0) for n, v in first.items()}
              for name in labels]

    per_task, scores = {}, {s: [] for s in STATISTICS}
    for task in args.tasks:
        t = time.perf_counter()
        c = curves(base.replace(env=task), values, args.seeds)
        random = np.asarray(jax.jit(jax.vmap(lambda k: random_policy_return(task, k)))(
            jax.random.split(jax.random.key(1), args.seeds)), np.float64).mean()
        log(f"{task}: {len(values)} variants x {args.seeds} seeds in {time.perf_counter() - t:.0f} s")
        per_task[task] = {"random": float(random)}
        for s, stat in STATISTICS.items():
            x = stat(c)  # (variants, seeds)
            per_task[task][s] = {label: {"mean": float(x[i].mean()), "sd": float(x[i].std(ddof=1))}
                                 for i, label in enumerate(labels)}
            # normalised as fitness.normalize=baseline does: 0 random play, 1 the first variant's mean
            scores[s].append(normalize(x, {"base": [x[0].mean()], "low": [random]}))

    summary = {}
    for s in STATISTICS:
        fitness = np.mean(scores[s], axis=0)  # (variants, seeds): the mean over tasks, seed by seed
        rows = {}
        for i, label in enumerate(labels[1:], start=1):
            diff = float(fitness[i].mean() - fitness[0].mean())
            pooled = float(np.sqrt((fitness[i].var(ddof=1) + fitness[0].var(ddof=1)) / 2))
            d = diff / pooled
            rows[label] = {"difference": round(diff, 4), "sd_pooled": round(pooled, 4), "cohens_d": round(d, 3),
                           "correlation": round(float(np.corrcoef(fitness[i], fitness[0])[0, 1]), 3),
                           "seeds_for_2se": round(8 / d**2, 1) if d else None}
        summary[s] = {"sd_first": round(float(fitness[0].std(ddof=1)), 4), "variants": rows}
        log(f"{s:10s} sd {summary[s]['sd_first']:.3f} | " + " | ".join(
            f"{k} d {v['cohens_d']:+.2f}" for k, v in rows.items()))
    print(json.dumps({"benchmark": "statistic_signal", "tasks": args.tasks, "total_timesteps": args.total_timesteps,
                      "seeds": args.seeds, "variants": labels, "first_variant": first, "configured": configured,
                      "summary": summary, "per_task": per_task, "jax": jax.__version__,
                      "cpu_count": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
