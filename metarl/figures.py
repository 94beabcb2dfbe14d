"""The figures of a run (``python -m metarl.inspect`` lists them), written to RUN_DIR/figures/ by
that command and by the run itself when it logs to a tracker."""
from __future__ import annotations

import sys
from pathlib import Path

from metarl import plots, results, tasks
from metarl.rundir import CheckpointError, RunDir
from metarl.inner_loops.components import drift_figures, schedule_figures, value_loss_figures
from metarl.outer_loops.evolution import NOISE_THRESHOLD


def fitness_plot(run_dir: Path, cfg, out: Path) -> list[Path]:
    history = results.history(run_dir)
    if not history:
        print(f"note: {run_dir} has no finished generation yet; no fitness plot", file=sys.stderr)
        return []
    names = list(history[-1].get("tasks", {}))
    where = tasks.task_specs(cfg)[0].name if len(names) <= 1 else f"{len(names)} tasks"
    title = f"{cfg.experiment} on {where}: {len(history)}/{cfg.es.generations} generations, popsize {cfg.es.popsize}"
    fig = plots.fitness_figure(history, title, paired=cfg.fitness.control == "paired")
    paths = [plots.save(fig, out / "fitness.png")]
    if any("signal_between" in r for r in history):
        note = f"{title}; {cfg.fitness.num_seeds} seeds per member"
        paths.append(plots.save(plots.signal_figure(history, NOISE_THRESHOLD, note), out / "signal.png"))
    if len(names) > 1:
        paths.append(plots.save(plots.task_fitness_figure(history, names), out / "fitness_tasks.png"))
    return paths


def value_loss_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The loss and its gradient over the error (through training if temporal); a heatmap per other input."""
    fixed = (f"best meta-parameters of generation {info.get('generation')} "
             f"(fitness {info.get('fitness', float('nan')):.4g})")
    data = value_loss_figures(task.component, meta, task.inner_config, task.specs[0].name, error_range, fixed)
    paths = [plots.save(plots.value_loss_figure(*data["loss"]), out / "value_loss.png")]
    if "progress" in data:
        paths.append(plots.save(plots.value_loss_progress_figure(*data["progress"]), out / "value_loss_progress.png"))
    for name, spec in data["inputs"].items():
        paths.append(plots.save(plots.value_loss_heatmap_figure(*spec), out / f"value_loss_{name}.png"))
    return paths


def policy_objective_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The learned drift and objective beside PPO's (at several points of training where it is temporal)."""
    specs = drift_figures(task.component, meta, task.inner_config, task.specs[0].name)
    name = lambda f: "policy_objective.png" if f is None else f"policy_objective_progress{int(round(f * 100)):03d}.png"
    return [plots.save(plots.policy_objective_figure(*spec), out / name(f)) for f, spec in specs.items()]


def hyperparams_plots(run_dir: Path, cfg, task, best, info, out: Path, error_range: float) -> list[Path]:
    """The search mean and mean -+ std that the run logs every generation, and the exported best."""
    comp = task.component
    best_values = task.kind.values(comp, best) if best is not None else None
    best_gen = info.get("generation") if info else None
    records = [r for r in results.history(run_dir) if "search" in r]
    if records:
        gens, (means, lows, highs) = [r["generation"] for r in records], comp.trajectory([r["search"] for r in records])
        note = "search mean and mean -+ std per generation; star: exported best"
    elif best_values is not None:
        gens, means, lows, highs = [best_gen or 0], {k: [v] for k, v in best_values.items()}, None, None
        note = "no search logged: exported best only"
    else:
        print(f"note: {run_dir} has no finished generation yet; no hyperparameter plot", file=sys.stderr)
        return []
    fig = plots.hyperparams_figure(gens, means, lows, highs, *comp.bounds(), best_values, best_gen, note)
    return [plots.save(fig, out / "hyperparams.png")]


def write_figures(run_dir: str | Path, error_range: float = 5.0, loaded: tuple | None = None) -> list[Path]:
    """Writes the fitness figures, then the kind's own (``Kind.plot``), into ``run_dir/figures``; returns the paths.
    ``loaded``: the run's ``(config, task)``, else ``results.load_run`` (its ``CheckpointError``/``ConfigError``)."""
    run_dir = Path(run_dir)
    cfg, task = loaded or results.load_run(run_dir)
    out = RunDir(run_dir).figures
    paths = fitness_plot(run_dir, cfg, out)
    try:
        meta, info = RunDir(run_dir).read_best(task.template)
    except CheckpointError:
        meta, info = None, None
    if meta is None and task.kind.seam is not None:
        print(f"note: {run_dir} has exported no best meta-parameters yet; no component plot", file=sys.stderr)
    elif task.kind.plot is not None:  # a search without a seam plots its trajectory, best or not
        paths += task.kind.figures(run_dir, cfg, task, meta, info, out, error_range)
    return paths


def schedule_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The learned hyperparameters over training beside PPO's own (``schedule.png``)."""
    t, curves = schedule_figures(task.component, meta, task.inner_config, task.specs[0].name)
    fig = plots.schedule_figure(t, curves, task.kind.baseline_label(task.inner_config))
    return [plots.save(fig, out / "schedule.png")]


def component_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The line panels a component describes, ``figures(meta, config) -> {file: (x, rows, xlabel, note)}``."""
    specs = task.component.figures(meta, task.inner_config)
    return [plots.save(plots.formula_figure(*spec), out / name) for name, spec in specs.items()]
