"""The figures of a run (``python -m metarl.inspect`` lists them), written to RUN_DIR/figures/ by
that command and by the run itself when it logs to a tracker."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from metarl import plots, results, tasks
from metarl.rundir import CheckpointError, RunDir
from metarl.inner_loops.components import CLIPPED_SURROGATE, TEMPORAL_INPUTS, Progress, apply_component
from metarl.inner_loops.trainer import num_updates
from metarl.outer_loops.evolution import NOISE_THRESHOLD

PROGRESS_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


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
    comp, progress_of = task.component, _progress_at(task)
    temporal = getattr(comp, "temporal", False)
    fixed = (f"best meta-parameters of generation {info.get('generation')} "
             f"(fitness {info.get('fitness', float('nan')):.4g})")
    # The shipped MLP value loss names its extra inputs; a component of your own is drawn over the error.
    extra = [i for i in getattr(comp, "inputs", ("error",)) if i not in ("error", *TEMPORAL_INPUTS)]
    fixed_at_zero = lambda inputs: f"; {', '.join(inputs)} fixed at 0" if inputs else ""

    def curves(fraction, errors, **others):
        """The loss and its gradient w.r.t. the prediction (the target and old prediction are data)."""
        def loss(error, old_error=0.0, target=0.0):
            return apply_component(comp, progress_of(fraction), meta, target + error, target + old_error, target,
                                   task.inner_config)

        return np.asarray(jax.vmap(loss)(errors, **others)), np.asarray(jax.vmap(jax.grad(loss))(errors, **others))

    errors = np.linspace(-error_range, error_range, 401, dtype=np.float32)
    note = fixed + fixed_at_zero(extra) + ("; at the start of training" if temporal else "")
    paths = [plots.save(plots.value_loss_figure(errors, *curves(0.0, errors), note), out / "value_loss.png")]
    if temporal:
        fig = plots.value_loss_progress_figure(errors, {f: curves(f, errors) for f in PROGRESS_POINTS},
                                               fixed + progress_of.note)
        paths.append(plots.save(fig, out / "value_loss_progress.png"))

    errors = np.linspace(-error_range, error_range, 121, dtype=np.float32)
    for name in extra:
        span = 4 * error_range if name == "target" else error_range
        other = np.linspace(-span, span, 81, dtype=np.float32)
        e, o = (x.ravel() for x in np.meshgrid(errors, other))
        z, g = (c.reshape(len(other), len(errors)) for c in curves(0.0, e, **{name: o}))
        fig = plots.value_loss_heatmap_figure(errors, other, z, g, name,
                                              fixed + fixed_at_zero([i for i in extra if i != name]))
        paths.append(plots.save(fig, out / f"value_loss_{name}.png"))
    return paths


def policy_objective_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The learned drift and objective beside PPO's (at several points of training where it is temporal)."""
    config, progress_of = task.inner_config, _progress_at(task)
    temporal = getattr(task.component, "temporal", False)
    ratios, advantages = jnp.linspace(0.5, 1.5, 101), jnp.linspace(-2.0, 2.0, 81)
    r, a = jnp.meshgrid(ratios, advantages)
    ppo_drift = np.asarray(r * a - CLIPPED_SURROGATE.apply({}, r, a, config))
    paths = []
    for fraction in (PROGRESS_POINTS if temporal else (0.0,)):
        # Any objective read as a drift from r A (for LPO exactly its drift), so a component of your own plots too.
        drift = np.asarray(r * a - apply_component(task.component, progress_of(fraction), meta, r, a, config))
        note = f"training progress {fraction:.0%}{progress_of.note}" if temporal else ""
        fig = plots.policy_objective_figure(np.asarray(ratios), np.asarray(advantages), drift, ppo_drift,
                                            float(config.clip_eps), note)
        name = f"policy_objective_progress{int(round(fraction * 100)):03d}.png" if temporal else "policy_objective.png"
        paths.append(plots.save(fig, out / name))
    return paths


def _progress_at(task):
    """``fraction -> Progress`` on the first task's horizon (its number of updates), with a note."""
    updates = num_updates(task.inner_config)
    progress_of = lambda fraction: Progress(jnp.float32(fraction), jnp.float32(np.log(updates)))
    progress_of.note = f"; horizon {updates} updates ({task.specs[0].name})"
    return progress_of


def hyperparams_plots(run_dir: Path, cfg, task, best, info, out: Path, error_range: float) -> list[Path]:
    """The search mean and mean -+ std that the run logs every generation, and the exported best."""
    comp = task.component
    bounds, log = dict(zip(comp.names, zip(comp.low, comp.high))), dict(zip(comp.names, comp.log))
    best_values = {k: float(v) for k, v in comp.decode(best).items()} if best is not None else None
    best_gen = info.get("generation") if info else None
    records = [r for r in results.history(run_dir) if "search" in r]
    if records:
        stack = lambda part: {n: np.array([float(r["search"][part][n]) for r in records]) for n in comp.names}
        gens, means, lows, highs = [r["generation"] for r in records], stack("mean"), stack("low"), stack("high")
        note = "search mean and mean -+ std per generation; star: exported best"
    elif best_values is not None:
        gens, means, lows, highs = [best_gen or 0], {k: [v] for k, v in best_values.items()}, None, None
        note = "no search logged: exported best only"
    else:
        print(f"note: {run_dir} has no finished generation yet; no hyperparameter plot", file=sys.stderr)
        return []
    fig = plots.hyperparams_figure(gens, means, lows, highs, bounds, log, best_values, best_gen, note)
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
    inner, progress_of = task.inner_config, _progress_at(task)
    t = np.linspace(0.0, 1.0, 101)
    scales = jax.vmap(lambda f: task.component.apply(meta, progress_of(f)))(jnp.asarray(t, jnp.float32))
    anneal = (1.0 - t) if getattr(inner, "anneal_lr", False) else 1.0
    curves = {}
    for field, scale in scales.items():
        own = np.full_like(t, float(getattr(inner, field))) * (anneal if field == "lr" else 1.0)
        curves[field] = (own * np.asarray(scale), own)
    return [plots.save(plots.schedule_figure(t, curves, task.kind.baseline(inner)), out / "schedule.png")]


def component_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    """The line panels a component describes, ``figures(meta, config) -> {file: (x, rows, xlabel, note)}``."""
    specs = task.component.figures(meta, task.inner_config)
    return [plots.save(plots.formula_figure(*spec), out / name) for name, spec in specs.items()]
