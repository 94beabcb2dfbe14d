"""``python -m metarl.evaluate run_dir=RUN_DIR [num_seeds=32] [tasks=[...]] [env=ID] [total_timesteps=N]
[num_cpu_devices=auto] [distilled=K] [per_task=[16,64]] [split=held-out] [sides=[my_pkg.sides.KIND]]``: the learned
component against the baseline on fresh seeds, on the tasks the run trained on and its held-out ``eval_tasks`` (or
``tasks=[...]``, or one ``env``/``total_timesteps``); ``distilled=K`` adds formula K of the run's ``metarl.distill``
front as a side, ``sides=[...]`` side kinds of your own (``metarl.sides``). Per task, ``num_seeds`` agents per side
(one vmapped, jitted call each, split over the devices) and a random policy. Prints the final returns with 95% CIs,
the normalised score (R - random) / (baseline - random), Welch's p and, per split, the IQM of the normalised scores
with stratified-bootstrap CIs and the probability of improvement (``metarl.stats``). Writes the report and its
figures into the run directory, a suffix per setting so that other settings never overwrite them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from metarl import payoff, results, stats
from metarl.commands import run_command
from metarl.errors import ConfigError
from metarl.inner_loops.trainer import frames_per_run
from metarl.outer_loops import streams
from metarl.outer_loops.fitness import statistic_words
from metarl.progress import Watchdog, progress
from metarl.report import format_report
from metarl.rundir import CheckpointError, RunDir
from metarl.sides import DEFAULT, Side, colours, compared, comparisons, get
from metarl.tasks import TaskSpec, build_task, default_name, task_specs

ALPHA = 0.05
AGGREGATES = ("iqm_learned", "iqm_baseline", "iqm_difference", "probability_of_improvement")


def summarise(final: np.ndarray) -> dict:
    finite = final[np.isfinite(final)]
    return {"mean": float(np.mean(finite)) if finite.size else float("nan"), "ci95": stats.t_bounds(finite),
            "std": float(np.std(finite, ddof=1)) if finite.size > 1 else float("nan"), "n": int(finite.size),
            "nonfinite": int(final.size - finite.size), "final_returns": [float(v) for v in final]}


def compare(learned: np.ndarray, baseline: np.ndarray) -> dict:
    """Two sides' final returns on one task: Welch's and Mann-Whitney's (unpaired) tests and, the test reported, a
    paired t-test over the seeds finite on both (seed i of every side trains from one key: ``streams.evaluation``)."""
    import scipy.stats
    a, b, both = learned[np.isfinite(learned)], baseline[np.isfinite(baseline)], np.isfinite(learned + baseline)
    t, mwu = stats.t_test(a, b), scipy.stats.mannwhitneyu(a, b, alternative="two-sided")
    a_, b_ = learned[both], baseline[both]   # every difference equal (say, none before an update): no t; p 1 or 0
    p = float(stats.t_test(a_, b_, paired=True).pvalue) if np.unique(a_ - b_).size != 1 else float((a_ == b_).all())
    diff = float(np.mean(a) - np.mean(b))
    return {"difference": diff, "welch_t": float(t.statistic), "welch_df": float(t.df), "welch_p": float(t.pvalue),
            "mannwhitney_u": float(mwu.statistic), "mannwhitney_p": float(mwu.pvalue), "paired_p": p, "alpha": ALPHA,
            "winner": "learned" if diff > 0 else "baseline" if diff < 0 else "tie", "significant": bool(p < ALPHA)}


@dataclasses.dataclass
class Loaded:
    run_dir: Path
    cfg: Any
    task: Any
    on_train: list   # per task: whether the run trained on it
    meta: Any
    info: dict
    tuned: Optional[dict]
    sides: list = dataclasses.field(default_factory=list)


def _load(run_dir: Path, env: str | None, total_timesteps: int | None, tasks: list | None = None,
          split: str = "all") -> Loaded:
    """The run, its export and its tuning (``metarl.sides`` builds the sides). Tasks: ``tasks``, else
    ``env``/``total_timesteps`` as one, else the run's then ``eval_tasks``."""
    def evaluated(cfg):
        if tasks is not None:
            return task_specs(dataclasses.replace(cfg, tasks=tasks))
        if env is None and total_timesteps is None:
            return task_specs(cfg) * (split != "held-out") + task_specs(cfg, "eval_tasks") * (split != "trained-on")
        base = task_specs(cfg)[0]
        timesteps = {} if total_timesteps is None else {"total_timesteps": total_timesteps}
        env_args = None if env else base.env_args
        return [TaskSpec(default_name(env or base.env, env_args, timesteps), env or base.env,
                         {**base.inner, **timesteps}, "env", env_args)]

    def key(spec) -> tuple:
        return spec.env, spec.env_args, tuple(sorted((k, str(v)) for k, v in spec.inner.items()))

    cfg, task = results.load_run(run_dir, evaluated)
    trained_keys = {key(s) for s in task_specs(cfg)}
    tuned = RunDir(run_dir).tuned.read()
    try:
        meta, info = RunDir(run_dir).read_best(task.template)
    except CheckpointError:
        if not tuned:
            raise
        meta, info = None, {}   # a run's tuning without its export (records keep the JSON): the baselines alone
    return Loaded(run_dir, cfg, task, [key(s) in trained_keys for s in task.specs], meta, info, tuned)


def _train_sides(task, sides: list[Side], keys, mesh, watchdog):
    """Each side per task on ``keys`` (a vmapped, jitted call each, agents split over ``mesh``, agent i on key i),
    random play last: ``watchdog`` (``progress.Watchdog``) times each training per frame against the slowest.
    Returns ({task: {label: (seeds, updates), "random": (seeds,)}}, {task: {label: run seconds}}, compile seconds)."""
    from metarl import compilation, devices
    # Task by task, one task's executables held at a time, compiled in threads (XLA compiles outside the GIL), one
    # per two cores: each compilation holds memory of its own, and on 2 cores a second thread gains no time.
    options, workers = compilation.compiler_options(), max(1, min(4, devices.usable_cores() // 2))
    curves, seconds, compile_s = {s.name: {} for s in task.specs}, {s.name: {} for s in task.specs}, 0.0
    for i, spec in enumerate(task.specs):
        # per side: (returns(key, input), the input per seed)
        programs = {"random": (lambda k, x, spec=spec: spec.random_return(k), None)}
        for side in sides:
            inputs = None if side.inputs is None else side.inputs[i]
            programs[side.label] = (lambda k, x, train=side.trainers[i], per_seed=inputs is not None:
                                    (train(x) if per_seed else train)(k)[1]["episode_return"], inputs)
        where = f"task {i + 1}/{len(task.specs)}: " if len(task.specs) > 1 else ""
        t = time.perf_counter()
        lowered = {side: devices.over_agents(fn, mesh).lower(keys, x) for side, (fn, x) in programs.items()}
        with progress(f"{where}compiling {len(lowered)} programs", total=len(lowered)) as bar, \
                ThreadPoolExecutor(min(workers, len(lowered))) as pool:
            def compile_one(low):
                program = low.compile(options)
                bar.update()
                return program

            compiled = dict(zip(lowered, pool.map(compile_one, lowered.values())))
        compile_s += time.perf_counter() - t
        with progress(f"{where}training {keys.shape[0]} agents per task and side", total=len(compiled)) as bar:
            for side, run in sorted(compiled.items(), key=lambda item: item[0] == "random"):
                t = time.perf_counter()
                with watchdog.watch(f"{where}{side}'s training", frames_per_run(task.inner_configs[i]),
                                   side + spec.env):   # per frame alike only on one env's network
                    curves[spec.name][side] = np.asarray(jax.device_get(run(keys, programs[side][1])), float)
                seconds[spec.name][side] = time.perf_counter() - t
                bar.update()
        del lowered, compiled
    return curves, seconds, compile_s


def iqm_comparisons(rows: list[dict], roles: dict, reps: int = 2000) -> dict:
    """Per comparison (``sides.comparisons``), both sides' IQMs of normalised scores, their difference and
    P(a > b), with stratified bootstrap 95% CIs over every side's seeds (paired) and the normalising baseline mean;
    flagged rows (a baseline that does not clear random play) left out, the aggregate with them beside."""
    pairs = comparisons(roles)

    def over(rows: list[dict]) -> dict:
        raw = {label: np.stack([r["sides"][label]["final_returns"] for r in rows], axis=1) for label in roles.values()}
        statistic = lambda n: [v for c in pairs for v in (  # noqa: E731
            stats.iqm(n[roles[c.a]]), stats.iqm(n[roles[c.b]]), stats.iqm(n[roles[c.a]]) - stats.iqm(n[roles[c.b]]),
            stats.probability_of_improvement(n[roles[c.a]], n[roles[c.b]]))]
        point, draws = stats.bootstrap(statistic, raw, np.array([r["random_return"] for r in rows]),
                                       roles["baseline"], reps, np.random.RandomState(0))
        ci, found = stats.percentile(draws), {}
        for i, c in enumerate(pairs):   # the challenger's IQM as "learned", the reference's as "baseline"
            found[c.part] = {**dict(zip(AGGREGATES, point[4 * i:].tolist())),
                          **dict(zip([n + "_ci95" for n in AGGREGATES], ci[4 * i:]))}
        return {"tasks": len(rows), **found.pop(None, {}), **found}
    kept = [r for r in rows if not r["degenerate"]]
    if len(kept) in (0, len(rows)):
        return {**over(rows), "left_out": []}
    return {**over(kept), "left_out": [r["task"] for r in rows if r["degenerate"]], "with_left_out": over(rows)}


def restate(report: dict, frames_per_training: Optional[int] = None) -> dict:
    """The report's statistics from its per-seed final returns (``evaluate``'s, and a stored record's again): per
    task the normalised scores, the tests and whether the baseline clears random play beyond noise (one-sided
    Welch against random play's seeds); the aggregates per split; the payoff."""
    roles = {side["role"]: side["label"] for side in report["sides"]}
    report["paired"] = "seed i of every side trains from one key: paired t-tests, seeds resampled jointly"
    for row in report["tasks"]:
        finals = {label: np.asarray(side["final_returns"], float) for label, side in row["sides"].items()}
        base = finals[roles["baseline"]]
        random = np.asarray(row.get("random_returns", [row["random_return"]] * 2))   # older records: the mean alone
        clears = stats.t_test(base[np.isfinite(base)], random, alternative="greater").pvalue
        norm = payoff.normalised(row, finals, roles["baseline"])
        row.update(normalized={label: float(np.mean(v)) for label, v in norm.items()},
                   normalized_ci95={label: stats.t_bounds(v) for label, v in norm.items()},
                   baseline_clears_random_p=float(clears), degenerate=not clears < ALPHA,
                   **{c.test: compare(finals[roles[c.a]], finals[roles[c.b]]) for c in comparisons(roles)})
    report["aggregate"] = {split: iqm_comparisons(rows, roles) for split in ("held-out", "trained-on")
                           if (rows := [r for r in report["tasks"] if r["split"] == split])}
    if "per_task" in report and "learned" in roles:
        report["payoff"] = payoff.payoff(report, frames_per_training or report["payoff"]["frames_per_training"])
    return report


def evaluate(run_dir: str | Path, env: str | None = None, num_seeds: int = 32,
             total_timesteps: int | None = None, num_cpu_devices: int | str = "auto",
             tasks: list | None = None, distilled: int | None = None, per_task: list | None = None,
             per_task_tunings: int = 3, per_task_seeds: int = 2, split: str = "all",
             sides: list | None = None) -> dict:
    """The report (also in RUN_DIR/evaluation[SUFFIX].json). ``per_task=[k, ...]``: a side of PPO tuned on each task
    with k trainings (``metarl.pertask``) and, with a learned side and held-out tasks, ``metarl.payoff``'s summary;
    ``split``: the run's tasks of that split alone; ``num_cpu_devices``: as a run's, before JAX starts (after, the
    devices JAX has); ``sides``: side kinds beyond ``metarl.sides.DEFAULT``, by name or dotted path. Bad input or an
    unreadable run: ``ConfigError`` naming the argument, or ``CheckpointError``."""
    args = dict(locals())   # what the side kinds' build and finish read
    from metarl import compilation, devices
    if tasks is not None and (env or total_timesteps):
        raise ConfigError("tasks: given with env= or total_timesteps=; allowed: one of the two forms")
    if split not in ("all", "held-out", "trained-on"):
        raise ConfigError(f"split: {split!r}; allowed: all, held-out or trained-on")
    if split != "all" and (tasks is not None or env or total_timesteps):
        raise ConfigError("split: given with tasks=, env= or total_timesteps=; allowed: one of the two forms")
    if tasks is not None and not tasks:
        raise ConfigError("tasks: []; allowed: a non-empty list such as [CartPole-v1,Acrobot-v1]")
    if num_cpu_devices != "auto" and (isinstance(num_cpu_devices, str) or num_cpu_devices < 1):
        raise ConfigError(f"num_cpu_devices: {num_cpu_devices!r}; allowed: auto or a positive integer")
    if num_seeds < 2:
        raise ConfigError(f"num_seeds: {num_seeds}; allowed: >= 2 (a confidence interval needs two)")
    if total_timesteps is not None and total_timesteps <= 0:
        raise ConfigError(f"total_timesteps: {total_timesteps}; allowed: > 0")
    RunDir(run_dir).require_run()
    extra = [kind for kind in map(get, sides or []) if kind not in DEFAULT]
    compilation.enable_compilation_cache()
    devices.use_cpu_cores(num_cpu_devices)
    run_dir = Path(run_dir)
    loaded = _load(run_dir, env, total_timesteps, tasks, split)
    task, built = loaded.task, [(kind, kind.build(loaded, args)) for kind in (*DEFAULT, *extra)]
    loaded.sides = [side for _, group in built for side in group]
    root, keys = streams.evaluation(loaded.cfg.seed, num_seeds)
    mesh = devices.population_mesh(num_seeds, fit=True)
    watchdog = Watchdog(loaded.cfg.watchdog, RunDir(run_dir).stacks, "Run the same command again.")
    curves, seconds, compile_s = _train_sides(task, loaded.sides, keys, mesh, watchdog)
    report = {
        "run_dir": str(run_dir), "kind": task.kind.name,
        "trained_tasks": [s.name for s, t in zip(task.specs, loaded.on_train) if t],
        "num_seeds": num_seeds, "devices": 1 if mesh is None else mesh.size, "key_root": root,
        "best_generation": loaded.info.get("generation"), "best_fitness": loaded.info.get("fitness"),
        "picked": loaded.info.get("picked"),   # the pick on fresh seeds ("top 2", "search mean"); None without one
        "statistic": f"{statistic_words(loaded.cfg.fitness.statistic, loaded.cfg.fitness.window)} (the search's "
                     "fitness statistic)",
        "normalized": f"(R - random policy) / ({'tuned ' * bool(loaded.tuned)}baseline mean - random policy), per task",
        "tuned": loaded.tuned, "sides": [{"label": side.label, "role": side.role} for side in loaded.sides],
        "tasks": _rows(loaded, curves, seconds), "compile_seconds": compile_s,
        # each side's tuning compute in trainings on the trained-on tasks (one training on all of them counts once)
        "compute": {kind.name: kind.compute(loaded, args) for kind, group in built if group and kind.compute},
    }
    # what a kind records beside its sides, and a suffix per setting, so that none overwrites another's files
    finished = "".join(kind.finish(report, group, args) for kind, group in built if group and kind.finish)
    restate(report, build_task(loaded.cfg).frames_per_eval)
    values = None if loaded.meta is None else task.kind.values(task.component, loaded.meta)  # where it learns such
    if values is not None:
        report["learned_values"] = values
        report["baseline_values"] = {n: float(getattr(task.inner_config, n)) for n in values}
    suffix = ("_tasks-" + hashlib.sha1("|".join(task.names).encode()).hexdigest()[:8] if tasks is not None else
              (f"_{env}" if env else "") + (f"_{int(task.frames_per_eval)}" if total_timesteps is not None else ""))
    suffix += (f"_{split}" if split != "all" else "") + finished + "".join(f"_{kind.name}" for kind in extra)
    _figures(RunDir(run_dir), loaded, curves, report, suffix)
    report["json"] = str(RunDir(run_dir).evaluation(suffix).write(report))
    return report


def _rows(loaded: Loaded, curves: dict, seconds: dict) -> list[dict]:
    """Per task, each side's final returns (the search's own statistic: fitness.statistic, fitness.window) and
    random play's; ``restate`` adds the statistics."""
    rows = []
    for spec, inner, trained in zip(loaded.task.specs, loaded.task.inner_configs, loaded.on_train):
        c = curves[spec.name]
        finals = {side.label: np.asarray(loaded.task.statistic(c[side.label]), float) for side in loaded.sides}
        rows.append({"task": spec.name, "env": spec.env, "split": "trained-on" if trained else "held-out",
                     "total_timesteps": int(getattr(inner, "total_timesteps", 0)),
                     "sides": {label: {**summarise(f), "seconds": seconds[spec.name][label]}
                               for label, f in finals.items()},
                     "random_return": float(np.mean(c["random"])), "random_returns": c["random"].tolist()})
    return rows


def _figures(run_dir: RunDir, loaded: Loaded, curves: dict, report: dict, suffix: str) -> None:
    """Each task's learning curves and, with several tasks, the normalised scores; paths in ``report``."""
    from metarl import plots
    rows, colour = report["tasks"], colours(report["sides"])
    for i, (spec, row) in enumerate(zip(loaded.task.specs, rows)):
        shown = [(side.label, colour[side.label], curves[spec.name][side.label]) for side in loaded.sides]
        n_updates = shown[0][2].shape[1]
        frames = np.arange(1, n_updates + 1) * (row["total_timesteps"] / n_updates)
        fig = plots.learning_curves_figure(frames, shown, f"{loaded.task.kind} on {spec.name} ({row['split']}): "
                                                          f"mean and 95% CI over {report['num_seeds']} fresh seeds")
        name = f"evaluation{suffix}.png" if len(rows) == 1 else f"evaluation{suffix}_task{i}.png"
        row["figure"] = str(plots.save(fig, run_dir.figures / name))
    scored = [(label, hue, c.part, key) for label, hue, c, key in compared(report["sides"])]
    if len(rows) > 1 and any(part is None for _, _, part, _ in scored):   # the split's own comparison: learned's
        fig = plots.task_scores_figure(rows, report["aggregate"], scored)
        report["figure"] = str(plots.save(fig, run_dir.figures / f"evaluation{suffix}.png"))
    else:
        report["figure"] = rows[0]["figure"]
    if "per_task" in report:
        per_task = [(s["label"], colour[s["label"]]) for s in report["sides"] if s["role"] == "per_task"]
        others = [(s["label"], colour[s["label"]]) for s in report["sides"] if s["role"] != "per_task"]
        fig = plots.per_task_figure(rows, report["per_task"]["ks"], per_task, others)
        report["per_task"]["figure"] = str(plots.save(fig, run_dir.figures / f"evaluation{suffix}_per_task.png"))
    if report.get("payoff"):
        report["payoff"]["figure"] = str(plots.save(payoff.figure(report["payoff"]),
                                                    run_dir.figures / f"evaluation{suffix}_break_even.png"))


def main(argv: list[str] | None = None) -> int:
    return run_command(argv, evaluate, __doc__, format_report)


if __name__ == "__main__":
    sys.exit(main())
