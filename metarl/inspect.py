"""``python -m metarl.inspect RUN_DIR [error_range=5]``: figures of a run, written to RUN_DIR/figures/.

    fitness.png             best, mean and population quantiles per generation (every experiment)
    signal.png              the members' fitness spread against seed noise, and the fraction that is signal
                            (docs/signal.md); with fitness.control, the margin over the baseline (every experiment)
    fitness_tasks.png       per task: the population's mean return and the best member's (several tasks)
    value_loss.png          the learned value loss and its gradient beside L2 (value_loss)
    value_loss_<input>.png  heatmap over the error and each further input, the rest fixed at 0 (value_loss)
    value_loss_progress.png the loss and its gradient at several points of training (a temporal value loss)
    policy_objective.png    the learned drift and objective beside PPO's clipping over (r, A) (policy_objective);
                            a temporal drift: policy_objective_progressPPP.png at PPP% of training
    hyperparams.png         the search mean and spread of each hyperparameter per checkpoint (hyperparams)

Works on a finished run, a run still going (the metrics and checkpoints so far) and a run directory
copied from elsewhere: everything is read relative to RUN_DIR. Bad input: one ``error:`` line, exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
FIGURES = "figures"


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def parse_args(argv: list[str], allowed: dict, usage: str | None = None) -> tuple[Path, dict]:
    """``RUN_DIR key=value ...`` with ``allowed`` mapping each key to (type, default); ``usage``: the
    calling command's module docstring, printed for ``--help`` or no arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage or __doc__)
        raise SystemExit(0 if argv else EXIT_BAD_INPUT)
    run_dir, options = Path(argv[0]), {k: default for k, (_, default) in allowed.items()}
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in allowed:
            fail(f"argument {arg!r}: expected one of {', '.join(f'{k}=' for k in allowed)}")
        try:
            options[key] = allowed[key][0](value)
        except ValueError:
            expected = getattr(allowed[key][0], "expected", allowed[key][0].__name__)
            fail(f"{key}: {value!r} is not a valid {expected}")
    if not run_dir.is_dir():
        fail(f"{run_dir}: no such directory")
    if not (run_dir / "config.yaml").is_file():
        fail(f"{run_dir}: not a metarl run directory (no config.yaml)")
    return run_dir, options


def fitness_plot(run_dir: Path, cfg, out: Path) -> list[Path]:
    from metarl import plots, results, tasks

    history = results.history(run_dir)
    if not history:
        print(f"note: {run_dir} has no finished generation yet; no fitness plot", file=sys.stderr)
        return []
    names = list(history[-1].get("tasks", {}))
    where = tasks.task_specs(cfg)[0].name if len(names) <= 1 else f"{len(names)} tasks"
    title = f"{cfg.experiment} on {where}: {len(history)}/{cfg.es.generations} generations, popsize {cfg.es.popsize}"
    paths = [plots.save(plots.fitness_figure(history, title, paired=cfg.fitness.control == "paired"), out / "fitness.png")]
    if any("signal_between" in r for r in history):
        from metarl.runner import NOISE_THRESHOLD

        note = f"{title}; {cfg.fitness.num_seeds} seeds per member"
        paths.append(plots.save(plots.signal_figure(history, NOISE_THRESHOLD, note), out / "signal.png"))
    if len(names) > 1:
        paths.append(plots.save(plots.task_fitness_figure(history, names), out / "fitness_tasks.png"))
    return paths


def _best_or_none(run_dir: Path, task):
    from flax import serialization

    from metarl import checkpoints

    try:
        raw, info = checkpoints.read_best(run_dir)
    except checkpoints.CheckpointError:
        return None, None
    return serialization.from_state_dict(task.template, raw), info


def value_loss_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from metarl import plots

    from metarl.inner_loops.components import TEMPORAL_INPUTS, apply_component

    comp = task.component
    fixed = f"best meta-parameters of generation {info.get('generation')} (fitness {info.get('fitness', float('nan')):.4g})"
    # The shipped MLP value loss names its extra inputs; a component of your own is drawn over the error.
    extra = [i for i in getattr(comp, "inputs", ("error",)) if i not in ("error", *TEMPORAL_INPUTS)]
    progress_of = _progress_at(task)

    def loss_at(value, old_error, target, fraction=0.0):
        return apply_component(comp, progress_of(fraction), meta, value, target + old_error, target,
                               task.inner_config)

    # Gradient w.r.t. the prediction only: target and the old prediction are data.
    grad_fn = jax.vmap(jax.grad(loss_at))
    errors = jnp.linspace(-error_range, error_range, 401)
    zeros = jnp.zeros_like(errors)
    loss = np.asarray(jax.vmap(loss_at)(errors, zeros, zeros))
    grad = np.asarray(grad_fn(errors, zeros, zeros))
    note = fixed + (f"; {', '.join(extra)} fixed at 0" if extra else "") + (
        "; at the start of training" if getattr(comp, "temporal", False) else "")
    paths = [plots.save(plots.value_loss_figure(np.asarray(errors), loss, grad, note), out / "value_loss.png")]
    if getattr(comp, "temporal", False):
        losses = {f: np.asarray(jax.vmap(lambda e, f=f: loss_at(e, 0.0, 0.0, f))(errors)) for f in PROGRESS_POINTS}
        grads = {f: np.asarray(jax.vmap(jax.grad(lambda e, f=f: loss_at(e, 0.0, 0.0, f)))(errors))
                 for f in PROGRESS_POINTS}
        fig = plots.value_loss_progress_figure(np.asarray(errors), losses, grads, fixed + progress_of.note)
        paths.append(plots.save(fig, out / "value_loss_progress.png"))

    errors = jnp.linspace(-error_range, error_range, 121)
    for name in extra:
        span = 4 * error_range if name == "target" else error_range
        other = jnp.linspace(-span, span, 81)
        e, o = (x.ravel() for x in jnp.meshgrid(errors, other))
        zeros = jnp.zeros_like(e)
        # (value, old_error, target) with value = target + error
        args = (o + e, zeros, o) if name == "target" else (e, o, zeros)
        z = np.asarray(jax.vmap(loss_at)(*args)).reshape(len(other), len(errors))
        g = np.asarray(grad_fn(*args)).reshape(len(other), len(errors))
        rest = [i for i in extra if i != name]
        note_h = fixed + (f"; {', '.join(rest)} fixed at 0" if rest else "")
        fig = plots.value_loss_heatmap_figure(np.asarray(errors), np.asarray(other), z, g, name, note_h)
        paths.append(plots.save(fig, out / f"value_loss_{name}.png"))
    return paths


def policy_objective_plots(run_dir: Path, cfg, task, meta, info, out: Path, error_range: float) -> list[Path]:
    import jax.numpy as jnp
    import numpy as np

    from metarl import plots
    from metarl.inner_loops.components import CLIPPED_SURROGATE, apply_component

    config = task.inner_config
    ratios = jnp.linspace(0.5, 1.5, 101)
    advantages = jnp.linspace(-2.0, 2.0, 81)
    r, a = jnp.meshgrid(ratios, advantages)
    ppo_drift = np.asarray(r * a - CLIPPED_SURROGATE.apply({}, r, a, config))
    progress_of = _progress_at(task)
    temporal = getattr(task.component, "temporal", False)
    paths = []
    # A temporal drift is drawn at several points of training; a plain one once.
    for fraction in (PROGRESS_POINTS if temporal else (0.0,)):
        progress = progress_of(fraction) if temporal else None
        # Any objective read as a drift from r A (for LPO exactly its drift), so a component of your own plots too.
        drift = np.asarray(r * a - apply_component(task.component, progress, meta, r, a, config))
        fig = plots.policy_objective_figure(np.asarray(ratios), np.asarray(advantages), drift, ppo_drift,
                                            float(config.clip_eps))
        if temporal:
            fig.suptitle(f"training progress {fraction:.0%}" + progress_of.note, fontsize=9)
        name = f"policy_objective_progress{int(round(fraction * 100)):03d}.png" if temporal else "policy_objective.png"
        paths.append(plots.save(fig, out / name))
    return paths


PROGRESS_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _progress_at(task):
    """``fraction -> Progress`` on the first task's horizon (its number of updates), with a note."""
    import jax.numpy as jnp
    import numpy as np

    from metarl.inner_loops.components import Progress
    from metarl.inner_loops.trainer import num_updates

    updates = num_updates(task.inner_config)

    def progress_of(fraction):
        return Progress(jnp.float32(fraction), jnp.float32(np.log(updates)))

    progress_of.note = f"; horizon {updates} updates ({task.specs[0].name})"
    return progress_of


def search_trajectory(run_dir: Path, cfg, task):
    """Decoded search mean and mean -+ std per kept checkpoint, generation 0 from the config's start.

    Returns (generations, means, lows, highs); lows/highs are None when the strategy keeps no
    per-dimension std. Only kept checkpoints are seen (``checkpoint.keep``), so the curve is sparse.
    """
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    from metarl.checkpoints import Checkpointer
    from metarl.results import history
    from metarl.runner import build_evolution
    from metarl.outer_loops.evolution import search_std

    stack = lambda seq: {n: np.array([float(d[n]) for d in seq]) for n in task.component.names}
    records = [r for r in history(run_dir) if "search" in r]
    if records:  # runs log the decoded search distribution every generation
        gens = [r["generation"] for r in records]
        return (gens, stack([r["search"]["mean"] for r in records]), stack([r["search"]["low"] for r in records]),
                stack([r["search"]["high"] for r in records]))

    _, evo = build_evolution(cfg, task=task, mesh=None)
    init_state = evo.init(jax.random.key(cfg.seed))
    _, unravel = ravel_pytree(task.template)
    ckpt = Checkpointer(run_dir, write=False)
    try:
        steps = sorted(ckpt.manager.all_steps())
        states = [(0, init_state)] + [(s, ckpt.restore(init_state, s)[0]) for s in steps]
    finally:
        ckpt.close()
    gens, means, lows, highs = [], [], [], []
    with_std = True
    for step, state in states:
        es_state = state.es_state
        flat_mean, _ = ravel_pytree(evo.es.get_mean(es_state))
        std = search_std(es_state, flat_mean.shape) if hasattr(es_state, "std") else None
        gens.append(step)
        means.append(task.component.decode(unravel(flat_mean)))
        if std is None:
            with_std = False
        else:
            lows.append(task.component.decode(unravel(flat_mean - std)))
            highs.append(task.component.decode(unravel(flat_mean + std)))
    return gens, stack(means), (stack(lows) if with_std else None), (stack(highs) if with_std else None)


def hyperparams_plots(run_dir: Path, cfg, task, best, info, out: Path, error_range: float) -> list[Path]:
    from metarl import plots
    from metarl.checkpoints import CheckpointError

    comp = task.component
    bounds = {n: (comp.low[i], comp.high[i]) for i, n in enumerate(comp.names)}
    log = {n: comp.log[i] for i, n in enumerate(comp.names)}
    best_values = {k: float(v) for k, v in comp.decode(best).items()} if best is not None else None
    best_gen = info.get("generation") if info else None
    try:
        gens, means, lows, highs = search_trajectory(run_dir, cfg, task)
        note = "search mean and mean -+ std (per generation; per kept checkpoint for older runs); star: exported best"
    except (CheckpointError, ValueError, KeyError, TypeError) as err:
        if best_values is None:
            print(f"note: no readable checkpoint and no exported best in {run_dir}; no hyperparameter plot "
                  f"({type(err).__name__})", file=sys.stderr)
            return []
        print(f"note: checkpoints unreadable ({err}); plotting the exported best only", file=sys.stderr)
        gens, means, lows, highs = [best_gen or 0], {k: [v] for k, v in best_values.items()}, None, None
        note = "checkpoints unreadable: exported best only"
    fig = plots.hyperparams_figure(gens, means, lows, highs, bounds, log, best_values,
                                   best_gen, note)
    return [plots.save(fig, out / "hyperparams.png")]


def inspect_run(run_dir: str | Path, error_range: float = 5.0, loaded: tuple | None = None) -> list[Path]:
    """Write every figure that applies to ``run_dir`` into ``run_dir/figures``; returns their paths.
    ``loaded``: the run's ``(config, task)`` when the caller has them (``results.load_run``)."""
    from metarl import results
    from metarl.checkpoints import CheckpointError
    from metarl.config import ConfigError

    run_dir = Path(run_dir)
    try:
        cfg, task = loaded or results.load_run(run_dir)
    except (CheckpointError, ConfigError) as err:
        fail(str(err))
    out = run_dir / FIGURES
    paths = fitness_plot(run_dir, cfg, out)
    meta, info = _best_or_none(run_dir, task)
    if meta is None and task.kind.seam is not None:
        print(f"note: {run_dir} has exported no best meta-parameters yet; no component plot", file=sys.stderr)
    elif task.kind.plot is not None:  # a search without a seam plots its trajectory, best or not
        paths += task.kind.plot(run_dir, cfg, task, meta, info, out, error_range)
    return paths


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir, options = parse_args(argv, {"error_range": (float, 5.0)}, __doc__)
    if not options["error_range"] > 0:
        fail(f"error_range: {options['error_range']}; allowed: > 0")
    for path in inspect_run(run_dir, options["error_range"]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
