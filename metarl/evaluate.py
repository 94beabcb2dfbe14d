"""``python -m metarl.evaluate RUN_DIR [env=ID] [num_seeds=32] [total_timesteps=N]``: the learned
component against the hand-designed baseline on fresh seeds.

Trains ``num_seeds`` agents with the run's best exported meta-parameters and as many with the baseline
(L2 value loss / PPO's clipped objective / the trainer's config unchanged for a hyperparameter search),
each side in one vmapped, jitted call, on the run's environment or on ``env`` (the learned component
or hyperparameters applied there as they are). Prints mean and 95% t-interval of the final return (mean
episode return over the last 10% of updates) per side, Welch's t-test and a Mann-Whitney U test of the
difference; writes RUN_DIR/evaluation[_ENV][_FRAMES].json and RUN_DIR/figures/evaluation[_ENV][_FRAMES].png
(the suffixes appear when env or total_timesteps is given).

Seeds: agent i trains from ``fold_in(key(10_000), i)``. Evolution draws every key by ``split`` from
``key(cfg.seed)``; a different root key gives an unrelated threefry stream, so these seeds were never
seen in evolution (for a run with seed 10000 the root moves to 10001). Both sides use the same keys
(same initial weights and environment resets), which the unpaired tests ignore, so they are conservative.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from metarl.inspect import FIGURES, fail, parse_args

EVAL_ROOT = 10_000
FINAL_WINDOW = 0.1
ALPHA = 0.05


def eval_keys(run_seed: int, num_seeds: int):
    import jax

    root = EVAL_ROOT if run_seed != EVAL_ROOT else EVAL_ROOT + 1
    base = jax.random.key(root)
    return root, jax.vmap(lambda i: jax.random.fold_in(base, i))(np.arange(num_seeds, dtype=np.uint32))


def final_return(curves: np.ndarray, window: float = FINAL_WINDOW) -> np.ndarray:
    n = max(1, math.ceil(window * curves.shape[-1]))
    return curves[..., -n:].mean(axis=-1)


def t_interval(x: np.ndarray, axis: int = 0, level: float = 0.95):
    """Mean's t-based confidence interval over ``axis`` (NaN where fewer than 2 values)."""
    from scipy import stats

    x = np.asarray(x, dtype=float)
    n = np.sum(np.isfinite(x), axis=axis)
    mean = np.nanmean(x, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        sem = np.nanstd(x, axis=axis, ddof=1) / np.sqrt(n)
        half = stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * sem
    half = np.where(n >= 2, half, np.nan)
    return mean - half, mean + half


def summarise(final: np.ndarray) -> dict:
    finite = final[np.isfinite(final)]
    low, high = t_interval(finite)
    return {"mean": float(np.mean(finite)) if finite.size else float("nan"),
            "ci95": [float(low), float(high)],
            "std": float(np.std(finite, ddof=1)) if finite.size > 1 else float("nan"),
            "n": int(finite.size), "nonfinite": int(final.size - finite.size),
            "final_returns": [float(v) for v in final]}


def compare(learned: np.ndarray, baseline: np.ndarray) -> dict:
    from scipy import stats

    a, b = learned[np.isfinite(learned)], baseline[np.isfinite(baseline)]
    welch = stats.ttest_ind(a, b, equal_var=False)
    mwu = stats.mannwhitneyu(a, b, alternative="two-sided")
    diff = float(np.mean(a) - np.mean(b))
    significant = bool(welch.pvalue < ALPHA)
    winner = "learned" if diff > 0 else "baseline" if diff < 0 else "tie"
    return {"difference": diff, "welch_t": float(welch.statistic), "welch_df": float(welch.df),
            "welch_p": float(welch.pvalue), "mannwhitney_u": float(mwu.statistic),
            "mannwhitney_p": float(mwu.pvalue), "alpha": ALPHA, "winner": winner,
            "significant": significant}


def baseline_label(task) -> str:
    if task.kind == "value_loss":
        return "baseline: L2 value loss" + (" (clipped)" if getattr(task.inner_config, "clip_value_loss", False) else "")
    if task.kind == "policy_objective":
        return "baseline: PPO clipped objective"
    return "baseline: trainer config"


def evaluate(run_dir: str | Path, env: str | None = None, num_seeds: int = 32,
             total_timesteps: int | None = None) -> dict:
    import jax
    from flax import serialization

    from metarl import checkpoints, plots, results
    from metarl.config import ConfigError
    from metarl.tasks import build_task

    run_dir = Path(run_dir)
    try:
        cfg = results.load_config(run_dir)
        run_env = cfg.env
        inner = dict(cfg.inner)
        if total_timesteps is not None:
            inner["total_timesteps"] = total_timesteps
        cfg = dataclasses.replace(cfg, env=env or cfg.env, inner=inner)
        task = build_task(cfg)
        raw, info = checkpoints.read_best(run_dir)
        meta = serialization.from_state_dict(task.template, raw)
    except (ConfigError, checkpoints.CheckpointError) as err:
        fail(str(err))
    sides = {f"learned {task.kind}": task.make_train(meta),
             baseline_label(task): task.trainer.make_train(task.inner_config)}
    root, keys = eval_keys(cfg.seed, num_seeds)

    # Trace both sides, then compile them side by side (XLA compiles outside the GIL) and run them.
    t = time.perf_counter()
    lowered = {label: jax.jit(jax.vmap(lambda k, train=train: train(k)[1]["episode_return"])).lower(keys)
               for label, train in sides.items()}
    with ThreadPoolExecutor(len(lowered)) as pool:
        compiled = dict(zip(lowered, pool.map(lambda low: low.compile(), lowered.values())))
    compile_s = time.perf_counter() - t
    curves, seconds = {}, {}
    for label, run in compiled.items():
        t = time.perf_counter()
        curves[label] = np.asarray(jax.device_get(run(keys)), dtype=float)   # (seeds, updates)
        seconds[label] = time.perf_counter() - t

    learned_label, baseline_lbl = list(sides)
    finals = {label: final_return(c) for label, c in curves.items()}
    report = {
        "run_dir": str(run_dir), "kind": task.kind, "env": cfg.env, "trained_env": run_env,
        "num_seeds": num_seeds, "total_timesteps": int(task.frames_per_eval), "key_root": root,
        "best_generation": info.get("generation"), "best_fitness": info.get("fitness"),
        "statistic": f"mean episode return over the last {FINAL_WINDOW:.0%} of updates",
        "sides": {label: {**summarise(f), "seconds": seconds[label]} for label, f in finals.items()},
        "compile_seconds": compile_s,
        "test": compare(finals[learned_label], finals[baseline_lbl]),
    }
    if task.kind == "hyperparams":
        report["learned_values"] = {k: float(v) for k, v in task.component.decode(meta).items()}
        report["baseline_values"] = {n: float(getattr(task.inner_config, n)) for n in task.component.names}

    # One file per (env, budget), so evaluations at other settings never overwrite each other.
    suffix = "" if cfg.env == run_env else f"_{cfg.env}"
    if total_timesteps is not None:
        suffix += f"_{int(task.frames_per_eval)}"
    n_updates = next(iter(curves.values())).shape[1]
    frames = np.arange(1, n_updates + 1) * (task.frames_per_eval / n_updates)
    fig = plots.learning_curves_figure(
        frames, curves, lambda c: t_interval(c, axis=0),
        f"{task.kind} on {cfg.env}: mean and 95% CI over {num_seeds} fresh seeds")
    report["figure"] = str(plots.save(fig, run_dir / FIGURES / f"evaluation{suffix}.png"))
    path = run_dir / f"evaluation{suffix}.json"
    path.write_text(json.dumps(report, indent=2))
    report["json"] = str(path)
    return report


def format_report(report: dict) -> str:
    lines = [f"{report['kind']} from {report['run_dir']} (best of generation {report['best_generation']}) "
             f"on {report['env']}: {report['num_seeds']} fresh seeds (fold_in(key({report['key_root']}), i)), "
             f"{report['total_timesteps']:,} frames each",
             f"final return = {report['statistic']}", ""]
    width = max(len(label) for label in report["sides"]) + 2
    lines.append(f"{'side':<{width}}{'mean':>10}  {'95% CI':<22}{'std':>9}{'n':>5}")
    for label, s in report["sides"].items():
        ci = f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"
        extra = f"  ({s['nonfinite']} diverged, left out)" if s["nonfinite"] else ""
        lines.append(f"{label:<{width}}{s['mean']:>10.2f}  {ci:<22}{s['std']:>9.2f}{s['n']:>5}{extra}")
    t = report["test"]
    lines += ["", f"difference learned - baseline: {t['difference']:+.2f}",
              f"Welch's t = {t['welch_t']:.3f} (df {t['welch_df']:.1f}), p = {t['welch_p']:.3g}",
              f"Mann-Whitney U = {t['mannwhitney_u']:.1f}, p = {t['mannwhitney_p']:.3g}"]
    if not math.isfinite(t["welch_p"]):
        verdict = "Welch's test undefined (no variance on either side)"
    elif t["winner"] == "tie":
        verdict = "no difference in means"
    else:
        verdict = (f"{t['winner']} wins; " + ("significant" if t["significant"] else "not significant")
                   + f" at {t['alpha']} (Welch)")
    lines.append(verdict)
    if "learned_values" in report:
        lines.append("hyperparameters (learned | baseline): " + ", ".join(
            f"{k} {v:.4g} | {report['baseline_values'][k]:.4g}" for k, v in report["learned_values"].items()))
    lines += [f"wrote {report['json']}", f"wrote {report['figure']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir, opts = parse_args(argv, {"env": (str, None), "num_seeds": (int, 32), "total_timesteps": (int, None)})
    if opts["num_seeds"] < 2:
        fail(f"num_seeds: {opts['num_seeds']}; allowed: >= 2 (a confidence interval needs two)")
    if opts["total_timesteps"] is not None and opts["total_timesteps"] <= 0:
        fail(f"total_timesteps: {opts['total_timesteps']}; allowed: > 0")
    report = evaluate(run_dir, opts["env"], opts["num_seeds"], opts["total_timesteps"])
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
