"""One run, from its checked config to its end (``metarl.evolve`` and each job of a sweep): the checks
of its settings and run directory (reading only, ``check``), the directory's lock, the reference returns a
normalised fitness scores against (measured once, stored in ``reference.json``, so a resumed run scores
exactly as before), and the generation loop: evolve, report, checkpoint, resume, and stop cleanly on
SIGINT/SIGTERM/SIGHUP (``run_generations``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from metarl import checkpoints, compilation, devices, runlock
from metarl import config as config_lib
from metarl.checkpoints import CheckpointError, atomic_write
from metarl.cli import check_existing, fail, stop_signals_to
from metarl.config import CONFIG_FILE, TUNED_FILE, ConfigError, RunConfig
from metarl.logger import Logger, check_mlflow, say, truncate_metrics
from metarl.progress import progress
from metarl.stats import t_interval
from metarl.tasks import Task, build_task, check_memory, task_specs
from metarl.inner_loops.envs import random_policy_return
from metarl.outer_loops.evolution import NOISE_GENERATIONS, SIGNAL_FIELDS, Evolution, noise_warning
from metarl.outer_loops.fitness import degenerate, make_aggregate, spans, task_key


# --- the reference returns and the evolution driver ---------------------------------------------

REFERENCE_FILE, VALIDATION_FILE, TUNE_DIR = "reference.json", "validation.json", "tune"
# Streams of the run's seed for the reference measurements and the final pick; evolution splits
# key(seed) itself, so folding in a constant gives keys it never uses.
_BASE_STREAM, _LOW_STREAM, _VALIDATION_STREAM = 0x5EED_BA5E, 0x5EED_0001, 0x5EED_0002
# The tuning search's seed: the run's, with these bits flipped (never the run's own).
_TUNING_SEED_BITS = 0x7E57_5EED


def build_evolution(cfg, task=None, mesh: Any = "auto", reference: Optional[dict] = None):
    """The task and the evolution driver; ``reference`` holds the per-task baseline and random returns
    that ``fitness.normalize=baseline`` scores against (None: raw returns)."""
    task = task or build_task(cfg)
    if mesh == "auto":
        mesh = devices.run_mesh(cfg)
    evo = Evolution(cfg.es, task.template, task.fitness_fn, num_seeds=cfg.fitness.num_seeds,
                    init_mean=task.init_mean, nonfinite_floor=cfg.fitness.nonfinite_floor, mesh=mesh,
                    describe_search=task.describe_search,
                    aggregate=make_aggregate(reference, cfg.fitness.aggregate),
                    control_fn=task.control_fn if cfg.fitness.control != "none" else None,
                    paired=cfg.fitness.control == "paired", keep_top=max(1, cfg.fitness.validation_top))
    return task, evo


def normalization(cfg, num_tasks: int) -> str:
    """The run's normalisation: as configured, else ``baseline`` with several tasks, ``none`` with one."""
    if cfg.fitness.normalize is not None:
        return cfg.fitness.normalize
    return "baseline" if num_tasks > 1 else "none"


def run_reference(cfg, task, run_dir: Path, write: bool, message: Callable[[str], None],
                  shown: bool = False, tuned: Optional[dict] = None) -> Optional[dict]:
    """The reference a run normalises against (None without ``normalize=baseline``): the one stored in
    its directory, or measured now (and stored, with ``write``; ``shown``: with a progress bar), then
    described through ``message``. ``tuned``: the tuned baseline's hyperparameters, which ``task``'s
    baseline trains with."""
    if normalization(cfg, len(task.specs)) != "baseline":
        return None
    reference = load_reference(run_dir, task.names)
    if reference is not None and reference.get("tuned") != tuned:
        reference = None
    if reference is None:
        t = time.perf_counter()
        with progress("measuring the reference returns", total=2 * len(task.specs), enabled=shown) as bar:
            reference = measure_reference(task, cfg.seed, cfg.fitness.reference_seeds, bar.update)
        reference["tuned"] = tuned
        if write:
            save_reference(run_dir, reference)
        message(f"measured the reference returns in {time.perf_counter() - t:.1f} s")
    message(f"normalised fitness = (R - random) / ({'tuned ' if tuned else ''}baseline - random), with 95% intervals: "
            + describe(reference))
    bad = degenerate(reference)
    if bad:
        message(f"warning: the baseline does not beat random play on {', '.join(bad)} at this budget, so its "
                "normalised score has no scale there (the gap's size is used)")
    return reference


def measure_reference(task, seed: int, num_seeds: int, measured: Callable[[], Any] = lambda: None) -> dict:
    """``R_base`` and ``R_low`` per task (host floats), each the mean over ``num_seeds`` seeds, with its
    95% t-interval (``base_ci``, ``low_ci``: ``[low, high]`` per task). Task i trains from
    ``fitness.task_key(key, i)`` of each seed key, as a member and the control do. ``measured`` is
    called after each of the ``2 * tasks`` measurements."""
    root = jax.random.key(seed)
    base_keys = jax.random.split(jax.random.fold_in(root, _BASE_STREAM), num_seeds)
    low_keys = jax.random.split(jax.random.fold_in(root, _LOW_STREAM), num_seeds)
    reference = {"tasks": task.names, "base": [], "low": [], "base_ci": [], "low_ci": [], "num_seeds": num_seeds,
                 "seed": seed}
    for i, (spec, train) in enumerate(zip(task.specs, task.baselines)):
        baseline = jax.jit(jax.vmap(lambda k, train=train, i=i: train(task_key(k, i))[1]["episode_return"]))
        random_play = jax.jit(jax.vmap(lambda k, spec=spec, i=i: random_policy_return(spec.env, task_key(k, i),
                                                                                   spec.env_args or ())))
        for name, program, keys in (("base", baseline, base_keys), ("low", random_play, low_keys)):
            values = np.asarray(compilation.compile_program(program, keys)(keys), np.float64)
            values = np.asarray(task.statistic(values)) if name == "base" else values
            reference[name].append(float(values.mean()))
            reference[name + "_ci"].append([float(b) for b in t_interval(values)])
            measured()
    return reference


def describe(reference: dict) -> str:
    """The reference returns in one line: each baseline's with its 95% interval and the interval's half-width
    in percent of the task's baseline-random gap, where the reference has intervals (older runs' have none)."""
    ci = reference.get("base_ci")
    return "; ".join(
        f"{name} baseline {base:.2f}" + (f" [{ci[i][0]:.2f}, {ci[i][1]:.2f}] (+-{50 * (ci[i][1] - ci[i][0]) / gap:.1f}%"
                                         " of the gap)" if ci else "") + f", random {low:.2f}"
        for i, (name, base, low, gap) in enumerate(zip(reference["tasks"], reference["base"], reference["low"],
                                                       spans(reference)))) + f" (over {reference['num_seeds']} seeds)"


def save_reference(run_dir: Path, reference: dict) -> None:
    path = Path(run_dir) / REFERENCE_FILE
    atomic_write(path, json.dumps(reference, indent=2))


def load_reference(run_dir: Path, names: list[str]) -> Optional[dict]:
    """The stored reference if it exists and belongs to these tasks, else None."""
    path = Path(run_dir) / REFERENCE_FILE
    try:
        reference = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return reference if reference.get("tasks") == list(names) else None


# --- the tuned baseline ------------------------------------------------------------------------------

def tuning_config(cfg: RunConfig, run_dir: str | Path) -> RunConfig:
    """The search that tunes ``cfg``'s baseline (``baseline.tune``): kind hyperparams over those
    hyperparameters, starting at the configured values, with the run's tasks, fitness and search
    settings (``baseline.es`` differing, ``baseline.generations`` long), on a seed of its own, in
    RUN_DIR/tune, reporting to the console and its metrics.jsonl only."""
    b = cfg.baseline
    es = dataclasses.replace(cfg.es, generations=b.generations or cfg.es.generations, init_mean="init")
    es = config_lib.build(config_lib.ESSection, {**config_lib.to_dict(es), **b.es}, "baseline.es.")
    logger = dataclasses.replace(cfg.logger, wandb=config_lib.WandbSection(), mlflow=config_lib.MlflowSection())
    return dataclasses.replace(cfg, component={"kind": "hyperparams", "search": dict(b.tune)}, es=es, logger=logger,
                               seed=cfg.seed ^ _TUNING_SEED_BITS, run_dir=str(Path(run_dir) / TUNE_DIR),
                               baseline=config_lib.BaselineSection())


def trainings(cfg: RunConfig) -> int:
    """The agents a search trains: members and control, per seed, per generation."""
    return (cfg.es.popsize + (cfg.fitness.control != "none")) * cfg.fitness.num_seeds * cfg.es.generations


def check_tuning(cfg: RunConfig) -> None:
    """``baseline``'s settings: a tuning search that builds, is no smaller than the search, and whose
    values no task overrides (``ConfigError``)."""
    if not cfg.baseline.tune:
        return
    if cfg.component.get("kind") == "hyperparams":
        raise ConfigError("baseline.tune: set for a search of kind hyperparams, which is itself a tuning; allowed: "
                          "{} (empty) for kind hyperparams")
    for field in ("tasks", "eval_tasks"):
        for i, item in enumerate(getattr(cfg, field) or []):
            for key in set(item.get("inner", {}) if isinstance(item, dict) else ()) & set(cfg.baseline.tune):
                raise ConfigError(f"{field}[{i}].inner.{key}: set per task and tuned by baseline.tune; allowed: "
                                  "one value for every task (in inner) or no tuning of it")
    tcfg = tuning_config(cfg, ".")
    try:
        build_task(tcfg)
    except ConfigError as err:
        raise ConfigError(str(err).replace("component.search", "baseline.tune")) from None
    if cfg.baseline.tuned_from:
        tuned_elsewhere(cfg)
    elif trainings(tcfg) < trainings(cfg):
        raise ConfigError(f"baseline.generations: the tuning trains {trainings(tcfg):,} agents, fewer than the "
                          f"search's {trainings(cfg):,}; allowed: a tuning budget at least the search's (more "
                          "generations, or baseline.es.popsize)")


def _tuned_for(cfg: RunConfig, tuned: dict) -> bool:
    """Whether ``tuned`` (a tuned.json) was tuned over ``cfg``'s ``baseline.tune`` on its tasks."""
    return tuned.get("search_space") == dict(cfg.baseline.tune) and tuned.get("tasks") == [s.name for s in task_specs(cfg)]


def tuned_elsewhere(cfg: RunConfig) -> dict:
    """The tuning of ``baseline.tuned_from`` (its tuned.json, with ``from``): refused (``ConfigError``)
    unless it is finished and was tuned over this run's space, on its tasks, with its inner settings
    other than the tuned ones, and with at least the search's number of trainings."""
    where = Path(cfg.baseline.tuned_from).expanduser()
    tuned = config_lib.read_tuned(where)
    if tuned is None:
        raise ConfigError(f"baseline.tuned_from: {where} holds no {TUNED_FILE}; allowed: a run directory whose "
                          "tuning has finished")
    theirs = config_lib.read_saved(where, "baseline.tuned_from")
    fixed = lambda inner: {k: v for k, v in (inner or {}).items() if k not in cfg.baseline.tune}  # noqa: E731
    if not _tuned_for(cfg, tuned) or fixed(theirs.get("inner")) != fixed(cfg.inner):
        raise ConfigError(f"baseline.tuned_from: {where} was tuned over another space, on other tasks or with other "
                          "inner settings; allowed: a run with this run's baseline.tune, tasks and inner")
    if tuned["trainings"] < trainings(cfg):
        raise ConfigError(f"baseline.tuned_from: {where} tuned with {tuned['trainings']:,} trainings, fewer than the "
                          f"search's {trainings(cfg):,}; allowed: a tuning at least as large as the search")
    return {**tuned, "search_trainings": trainings(cfg), "from": str(where.resolve())}


def tune(cfg: RunConfig, run_dir: Path, mesh: Any, shown: bool) -> Optional[dict]:
    """The tuned baseline of ``cfg`` (None without ``baseline.tune``): RUN_DIR/tuned.json's, else found
    now by the tuning search (continuing RUN_DIR/tune where a kill left it, as a run resumes) and the
    pick on fresh seeds, and stored."""
    if not cfg.baseline.tune:
        return None
    tuned = config_lib.read_tuned(run_dir)
    if tuned is not None:
        if not _tuned_for(cfg, tuned):
            raise ConfigError(f"baseline.tune: {run_dir / TUNED_FILE} was tuned over another space or other tasks; "
                              "allowed: the run's own tuning (move that file away to tune again)")
        return tuned
    if cfg.baseline.tuned_from:
        tuned = tuned_elsewhere(cfg)
        if jax.process_index() == 0:
            atomic_write(run_dir / TUNED_FILE, json.dumps(tuned, indent=2))
        say(f"tuned baseline from {tuned['from']}: " + ", ".join(f"{k} {v:.4g}" for k, v in tuned["hyperparameters"].items()))
        return tuned
    tcfg = tuning_config(cfg, run_dir)
    say(f"tuning the baseline's {', '.join(cfg.baseline.tune)} first: {tcfg.es.generations} generations of "
        f"{tcfg.es.popsize} settings x {tcfg.fitness.num_seeds} seeds ({trainings(tcfg):,} trainings; the search's "
        f"own: {trainings(cfg):,}) in {tcfg.run_dir}")
    t = time.perf_counter()
    if jax.process_index() == 0:
        Path(tcfg.run_dir).mkdir(exist_ok=True)
    prepared = prepare(tcfg, tcfg.run_dir, mesh=mesh)
    earlier = sum(r.get("seconds", 0.0) for r in prepared[4])  # before run_generations appends this session's
    summary = run_generations(tcfg, tcfg.run_dir, mesh=mesh, prepared=prepared)
    task = prepared[0]
    meta, info = checkpoints.read_best(tcfg.run_dir, task.template)
    tuned = {"hyperparameters": task.kind.values(task.component, meta),
             "configured": {name: float(getattr(task.inner_config, name)) for name in task.component.names},
             "search_space": dict(cfg.baseline.tune), "tasks": task.names, "picked": info.get("picked", "best member"),
             "fitness": info.get("validation_fitness", info.get("fitness")),
             "fitness_ci95": info.get("validation_ci95"),   # the pick's on fresh seeds (None without one)
             "trainings": trainings(tcfg) + summary.get("validation_trainings", 0),
             # this session's wall time, plus the generations an earlier session ran before a kill
             "search_trainings": trainings(cfg), "seed": tcfg.seed,
             "seconds": time.perf_counter() - t + earlier,
             "run_dir": TUNE_DIR}
    if jax.process_index() == 0:
        atomic_write(run_dir / TUNED_FILE, json.dumps(tuned, indent=2))
    say("tuned baseline: " + ", ".join(f"{k} {v:.4g} (configured {tuned['configured'][k]:.4g})"
                                       for k, v in tuned["hyperparameters"].items())
        + f"; {tuned['trainings']:,} trainings in {tuned['seconds']:.0f} s")
    return tuned


# --- the final pick on fresh seeds -------------------------------------------------------------------

def validate(cfg: RunConfig, task: Task, evo: Evolution, state, run_dir: Path, shown: bool) -> dict:
    """Score the ``fitness.validation_top`` best members found and the search's mean again on
    ``fitness.validation_seeds`` seeds the search never used (a stream of its own of the run's seed),
    as the search scored them, and export the best of them: the best member is the one the seed noise
    flattered most. Writes RUN_DIR/validation.json; returns it."""
    top_fitness, top_generation = (np.asarray(jax.device_get(x)) for x in (state.top_fitness, state.top_generation))
    found = np.flatnonzero(np.isfinite(top_fitness[:cfg.fitness.validation_top]))
    top = jax.tree.map(lambda x: np.asarray(jax.device_get(x))[found], state.top_params)
    candidates = jax.tree.map(lambda t, m: np.concatenate([t, np.asarray(m)[None]]), top, evo.mean(state))
    keys = jax.random.split(jax.random.fold_in(jax.random.key(cfg.seed), _VALIDATION_STREAM),
                            cfg.fitness.validation_seeds)
    with progress(f"scoring {len(found) + 1} candidates on {len(keys)} fresh seeds", enabled=shown):
        fitness, per_seed = jax.device_get(compilation.compile_program(jax.jit(evo.rescore), candidates, keys)(
            candidates, keys))
    labels = [f"top {i + 1}" for i in found] + ["search mean"]
    search_fitness = [float(top_fitness[i]) for i in found] + [None]
    generation = [int(top_generation[i]) for i in found] + [int(state.generation)]
    rows = [{"candidate": label, "generation": g, "search_fitness": f, "validation_fitness": float(v),
             "validation_ci95": [float(b) for b in t_interval(np.asarray(s, np.float64))]}
            for label, g, f, v, s in zip(labels, generation, search_fitness, fitness, per_seed)]
    pick = int(np.argmax(np.where(np.isfinite(fitness), fitness, -np.inf)))
    report = {"seeds": len(keys), "stream": _VALIDATION_STREAM, "candidates": rows, "picked": labels[pick],
              "trainings": len(labels) * len(keys) * (1 + (cfg.fitness.control == "paired"))}
    if jax.process_index() == 0:
        atomic_write(run_dir / VALIDATION_FILE, json.dumps(report, indent=2))
        checkpoints.export_best(run_dir, jax.tree.map(lambda x: x[pick], candidates), {
            **_best_info(cfg, task, generation[pick], search_fitness[pick]), "picked": labels[pick],
            "validation_fitness": rows[pick]["validation_fitness"], "validation_ci95": rows[pick]["validation_ci95"]})
    return report


def _best_info(cfg: RunConfig, task: Task, generation: int, fitness: Optional[float]) -> dict:
    """What is exported beside the best meta-parameters (checkpoints.export_best)."""
    return {"experiment": cfg.experiment, "kind": task.kind.name, "algo": task.algo, "env": cfg.env,
            "tasks": task.names, "component": cfg.component, "inner": cfg.inner, "generation": generation,
            "fitness": fitness, "seed": cfg.seed}


# --- the generation loop ------------------------------------------------------------------------

class Interrupted(Exception):
    """Raised after a clean save when SIGINT, SIGTERM or SIGHUP arrived."""
    def __init__(self, signum: int, generation: int):
        self.signum, self.generation = signum, generation
        super().__init__(f"{signal.Signals(signum).name} at generation {generation}")


def prepare(cfg: RunConfig, run_dir: str | Path, mesh: Any = "auto",
            task: Optional[Task] = None) -> tuple[Task, Evolution, Any, int, list]:
    """``(task, evolution, state, start generation, history)``: the evolution built and the latest checkpoint
    restored, writing nothing: a checkpoint that cannot be read raises ``CheckpointError`` before the caller
    has touched the run directory."""
    # The state's shapes do not depend on the reference returns a several-task score needs; those
    # are measured (and stored) by `run_generations`, once the run directory is this run's.
    task, evo = build_evolution(cfg, task=task, mesh=mesh)
    state = evo.init(jax.random.key(cfg.seed))
    with contextlib.closing(checkpoints.Checkpointer(run_dir, write=False)) as reader:
        step = reader.latest_step()  # None without a checkpoint directory, which a reader does not create
        if step is None:
            return task, evo, state, 0, []
        state, meta = reader.restore(state, step)
    start = int(meta["generation"])
    return task, evo, state, start, list(meta["history"])[:start]


def run_generations(cfg: RunConfig, run_dir: str | Path, mesh: Any = "auto", prepared: Optional[tuple] = None) -> dict:
    """Run (or continue) the evolution described by ``cfg`` in ``run_dir``; returns a summary.
    ``prepared`` (from ``prepare``) skips building and restoring again."""
    run_dir = Path(run_dir).resolve()
    is_main = jax.process_index() == 0
    task, evo, state, start, history = prepared or prepare(cfg, run_dir, mesh=mesh)
    shown = cfg.logger.progress and is_main  # progress bars on a terminal (metarl.progress)
    config_dict = cfg.to_dict()
    tuned = tune(cfg, run_dir, evo.mesh, shown)
    if tuned is not None:  # the same state; the learned part, the control and the reference on the tuned values
        cfg = config_lib.with_tuned(cfg, tuned)
        task, evo = build_evolution(cfg, mesh=evo.mesh)
    logger = Logger(run_dir, config_dict, cfg.es.generations, progress=cfg.logger.progress,
                    wandb_cfg=dataclasses.asdict(cfg.logger.wandb), write=is_main, task_names=task.names,
                    mlflow_cfg=cfg.logger.mlflow, verbose=cfg.logger.verbose)
    logger.catch_up(history)
    reference = run_reference(cfg, task, run_dir, write=is_main, message=logger.message, shown=shown,
                              tuned=tuned and tuned["hyperparameters"])
    if reference is not None:  # the same state, scored against the reference
        task, evo = build_evolution(cfg, task, mesh=evo.mesh, reference=reference)

    ckpt = checkpoints.Checkpointer(run_dir, keep=cfg.checkpoint.keep, write=is_main)
    # A global, fully replicated state on the mesh: what the compiled generation takes and returns.
    state = devices.replicate(state, evo.mesh)
    if is_main:
        truncate_metrics(run_dir, start)

    # The control (fitness.control) trains on the same seeds as one more member.
    frames_per_gen = (cfg.es.popsize + (cfg.fitness.control != "none")) * cfg.fitness.num_seeds * task.frames_per_eval
    if start:
        logger.message(f"resuming {run_dir} at generation {start} of {cfg.es.generations}")
    if ckpt.removed_incomplete:
        logger.message(f"removed incomplete checkpoint(s) left by a kill: {', '.join(ckpt.removed_incomplete)}")

    t0 = time.perf_counter()
    with progress("compiling the generation", enabled=shown):
        step = compilation.compile_program(evo.step, state)  # one compilation per run, timed on its own
    compile_s = time.perf_counter() - t0
    devices.barrier("compiled")  # processes compile at different speeds; the first collective waits 30 s
    logger.message(f"compiled the generation in {compile_s:.1f} s; {frames_per_gen:,} frames per generation "
                   f"on {evo.mesh.size if evo.mesh else 1} device(s)")

    best_so_far = float(state.best_fitness)
    if cfg.fitness.num_seeds == 1:
        logger.message("note: fitness.num_seeds=1 measures no seed noise: signal_within, seed_noise, signal and "
                       "update_signal are recorded as null (docs/signal.md); fitness.num_seeds >= 2 measures them")
    received = []  # the stop signals this process got, read between generations (a generation is one XLA call)

    def on_stop(signum, frame):
        if received:  # a second signal: stop now
            raise KeyboardInterrupt
        received.append(signum)

    with stop_signals_to(on_stop):
        for done in range(start + 1, cfg.es.generations + 1):
            t = time.perf_counter()
            with progress(f"generation {done}/{cfg.es.generations}", enabled=shown):
                state, stats = step(state)
                stats = jax.device_get(stats)
            record = _record(stats, time.perf_counter() - t, frames_per_gen, task.names)
            history.append(record)
            logger.log(record)
            warning = noise_warning(history, min(NOISE_GENERATIONS, cfg.es.generations),
                                    lambda name: config_lib.layer_path("evolution", name))
            if warning:
                logger.message(warning)
            if record["best_so_far"] > best_so_far and is_main:
                best_so_far = record["best_so_far"]
                checkpoints.export_best(run_dir, state.best_params,
                                        _best_info(cfg, task, record["generation"], best_so_far))
            # Processes receive a signal at different moments; all stop after the same generation. The
            # agreed signal is kept apart from the one received here, which may come after the agreement
            # and must not count as a second signal.
            signum = devices.agree(received[0] if received else 0, f"stop/{done}")
            if done % cfg.checkpoint.every == 0 or done == cfg.es.generations or signum:
                devices.assert_same_everywhere(state)
                ckpt.save(done, state, history, config_dict)
            if signum:
                ckpt.close()
                logger.finish(stopped=True)
                raise Interrupted(signum, done)
    ckpt.close()
    validation = validate(cfg, task, evo, state, run_dir, shown) if cfg.fitness.validation_top else None
    if validation:
        picked = next(r for r in validation["candidates"] if r["candidate"] == validation["picked"])
        logger.message(f"picked on {validation['seeds']} fresh seeds: {validation['picked']}, fitness "
                       f"{picked['validation_fitness']:.3f} [{picked['validation_ci95'][0]:.3f}, "
                       f"{picked['validation_ci95'][1]:.3f}] (" + "; ".join(
                           f"{r['candidate']} {r['validation_fitness']:.3f}" for r in validation["candidates"])
                       + f"); exported, {VALIDATION_FILE} has each")
    devices.barrier("finished")
    summary = {"validation_trainings": validation["trainings"] if validation else 0,"generations": len(history), "compile_seconds": compile_s,
               "first_mean": history[0]["mean"] if history else None,
               "last_mean": history[-1]["mean"] if history else None,
               "best_so_far": best_so_far,
               "median_fps": float(np.median([r["fps"] for r in history[start:]])) if history[start:] else None}
    if is_main and logger.tracking:
        from metarl import figures  # matplotlib: seconds that a run without a tracker does without

        try:  # the figures of `python -m metarl.inspect`; none if that fails, since the run itself has succeeded
            written = figures.write_figures(run_dir, loaded=(cfg, task))
        except Exception as err:
            logger.message(f"note: no figures to log ({type(err).__name__}: {err})")
            written = []
        best = [run_dir / checkpoints.BEST_PARAMS, run_dir / checkpoints.BEST_INFO]
        exported = all(f.exists() for f in best)
        logger.log_results(written, best if exported else [], checkpoints.read_best(run_dir)[1] if exported else None)
    logger.finish(summary)
    return summary


def _record(stats: dict, seconds: float, frames_per_gen: int, task_names: list[str]) -> dict:
    record = {}
    for k, v in stats.items():
        if k == "tasks":  # per task: {name: {raw_mean, score_mean, raw_best, score_best}}
            record[k] = {name: {stat: float(np.asarray(values)[i]) for stat, values in v.items()}
                         for i, name in enumerate(task_names)}
        elif isinstance(v, dict):  # the decoded search distribution, e.g. {"mean": {"lr": ...}, ...}
            record[k] = jax.tree.map(float, v)
        else:
            v = np.asarray(v)
            record[k] = v.tolist() if v.ndim else (int(v) if np.issubdtype(v.dtype, np.integer) else float(v))
            if k in SIGNAL_FIELDS and not np.isfinite(record[k]):  # not measured (one seed): null, not NaN
                record[k] = None
    record["seconds"] = seconds
    record["fps"] = frames_per_gen / seconds if seconds > 0 else float("nan")
    return record


# --- checks, the lock, then the loop ---------------------------------------------------------------

def _fingerprint(run_dir: Path):
    """What another run could have changed between our read-only checks and taking the lock."""
    def stamp(path):
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return None

    ckpt = run_dir / "ckpt"
    steps = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    return stamp(run_dir / CONFIG_FILE), stamp(run_dir / "metrics.jsonl"), steps


def check(cfg, setup_devices: bool = True, task: Any = None) -> Any:
    """Every check of a run's settings that needs no run directory, reading only (``ConfigError`` or
    ``ValueError``, one line). Returns the run's task, built once.

    ``setup_devices``: this process's devices (``devices.setup``) first, as a run must before any
    JAX computation; a sweep checking its jobs before they start has set them up already. ``task``:
    already built."""
    check_mlflow(cfg.logger.mlflow)
    if setup_devices:
        devices.setup(cfg.devices)  # before any JAX computation
    with config_lib.layer_errors("es"):
        cfg.es.validate()
    task = task or build_task(cfg)
    check_tuning(cfg)
    if not jax.tree.leaves(task.template):
        raise ConfigError(f"component._target_: {type(task.component).__name__} has no meta-parameters (its init "
                          "returns an empty pytree), so there is nothing to evolve; allowed: a component with "
                          "meta-parameters (a fixed one, such as a distilled formula, trains through "
                          "`python -m metarl.evaluate run_dir=RUN_DIR distilled=K` or in code)")
    devices.run_mesh(cfg)
    check_memory(cfg, task, devices.memory_per_device(), devices.members_per_memory(cfg.es.popsize))
    return task


def execute(cfg, run_dir: Path, resuming: bool, named: bool, task: Any = None) -> int:
    """One run, from its checked config to its end: the remaining checks, the run directory's lock,
    then the run itself; its exit code."""
    # 1. Every check, reading only, the checkpoint a resume starts from included.
    try:
        task = check(cfg, task=task)
        before = _fingerprint(run_dir)
        prepared = prepare(cfg, run_dir, task=task)
    except (ConfigError, ValueError, CheckpointError) as err:
        fail(str(err).splitlines()[0])

    # 2. The run directory, exclusively: a second run on it is refused here, having changed nothing.
    lock, refused = None, None
    if jax.process_index() == 0:
        try:
            lock = runlock.acquire(run_dir) if named or resuming else runlock.acquire_new(run_dir)
        except runlock.RunDirLocked as err:
            refused = str(err)
    try:
        # Every process of a multi-host run stops, not only process 0 (the rest would wait).
        if devices.agree(int(refused is not None), "run_dir_lock"):
            fail(refused or f"run_dir: {run_dir} is in use by another run (see process 0)")
        if lock is not None:
            if lock.run_dir != run_dir:  # a default name taken by a run started in the same second
                run_dir = lock.run_dir
                cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
            elif _fingerprint(run_dir) != before:
                # Another run wrote here between the checks and the lock (and has ended): check again.
                try:
                    check_existing(cfg, run_dir)
                    prepared = prepare(cfg, run_dir, task=task)
                except CheckpointError as err:
                    fail(str(err).splitlines()[0])

        if jax.process_index() == 0:
            config_lib.save(cfg, run_dir)
            say(f"run directory: {run_dir}")
        try:
            summary = run_generations(cfg, run_dir, prepared=prepared)
        except Interrupted as stop:
            if jax.process_index() == 0:  # every process stops after the same generation; one says so
                say(f"stopped by {signal.Signals(stop.signum).name} after generation {stop.generation}; "
                    f"checkpoint saved. Continue with: python -m metarl.evolve resume={run_dir}", error=True)
            return 128 + stop.signum
        except CheckpointError as err:
            fail(str(err))
        if jax.process_index() == 0:
            say(f"done: {summary['generations']} generations; mean fitness {summary['first_mean']:.2f} -> "
                f"{summary['last_mean']:.2f}; best {summary['best_so_far']:.2f}; results in {run_dir}")
        return 0
    finally:
        if lock is not None:  # a sweep runs its next job in this process; a lone run is about to exit
            lock.release()
