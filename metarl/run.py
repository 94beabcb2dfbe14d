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

from metarl import checkpoints, compilation, devices, figures, runlock
from metarl import config as config_lib
from metarl.checkpoints import CheckpointError, atomic_write
from metarl.cli import check_existing, fail, stop_signals_to
from metarl.config import CONFIG_FILE, ConfigError, RunConfig
from metarl.logger import Logger, check_mlflow, say, truncate_metrics
from metarl.progress import progress
from metarl.stats import t_interval
from metarl.tasks import Task, build_task, check_memory
from metarl.inner_loops.envs import random_policy_return
from metarl.outer_loops.evolution import NOISE_GENERATIONS, SIGNAL_FIELDS, Evolution, noise_warning
from metarl.outer_loops.fitness import degenerate, make_aggregate, spans, task_key


# --- the reference returns and the evolution driver ---------------------------------------------

REFERENCE_FILE = "reference.json"
# Streams of the run's seed for the reference measurements; evolution splits key(seed) itself, so
# folding in a constant gives keys it never uses.
_BASE_STREAM, _LOW_STREAM = 0x5EED_BA5E, 0x5EED_0001


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
                    paired=cfg.fitness.control == "paired")
    return task, evo


def normalization(cfg, num_tasks: int) -> str:
    """The run's normalisation: as configured, else ``baseline`` with several tasks, ``none`` with one."""
    if cfg.fitness.normalize is not None:
        return cfg.fitness.normalize
    return "baseline" if num_tasks > 1 else "none"


def run_reference(cfg, task, run_dir: Path, write: bool, message: Callable[[str], None],
                  shown: bool = False) -> Optional[dict]:
    """The reference a run normalises against (None without ``normalize=baseline``): the one stored in
    its directory, or measured now (and stored, with ``write``; ``shown``: with a progress bar), then
    described through ``message``."""
    if normalization(cfg, len(task.specs)) != "baseline":
        return None
    reference = load_reference(run_dir, task.names)
    if reference is None:
        t = time.perf_counter()
        with progress("measuring the reference returns", total=2 * len(task.specs), enabled=shown) as bar:
            reference = measure_reference(task, cfg.seed, cfg.fitness.reference_seeds, bar.update)
        if write:
            save_reference(run_dir, reference)
        message(f"measured the reference returns in {time.perf_counter() - t:.1f} s")
    message("normalised fitness = (R - random) / (baseline - random), with 95% intervals: " + describe(reference))
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
    config_dict = cfg.to_dict()
    logger = Logger(run_dir, config_dict, cfg.es.generations, progress=cfg.logger.progress,
                    wandb_cfg=dataclasses.asdict(cfg.logger.wandb), write=is_main, task_names=task.names,
                    mlflow_cfg=cfg.logger.mlflow, verbose=cfg.logger.verbose)
    logger.catch_up(history)
    reference = run_reference(cfg, task, run_dir, write=is_main, message=logger.message,
                                     shown=cfg.logger.progress and is_main)
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

    shown = cfg.logger.progress and is_main  # progress bars on a terminal (metarl.progress)
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
            warning = noise_warning(history, min(NOISE_GENERATIONS, cfg.es.generations))
            if warning:
                logger.message(warning)
            if record["best_so_far"] > best_so_far and is_main:
                best_so_far = record["best_so_far"]
                checkpoints.export_best(run_dir, state.best_params, {
                    "experiment": cfg.experiment, "kind": task.kind.name, "algo": task.algo, "env": cfg.env,
                    "tasks": task.names, "component": cfg.component, "inner": cfg.inner,
                    "generation": record["generation"], "fitness": best_so_far, "seed": cfg.seed})
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
    devices.barrier("finished")
    summary = {"generations": len(history), "compile_seconds": compile_s,
               "first_mean": history[0]["mean"] if history else None,
               "last_mean": history[-1]["mean"] if history else None,
               "best_so_far": best_so_far,
               "median_fps": float(np.median([r["fps"] for r in history[start:]])) if history[start:] else None}
    if is_main and logger.tracking:
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
    cfg.es.validate()
    task = task or build_task(cfg)
    if not jax.tree.leaves(task.template):
        raise ConfigError(f"component._target_: {type(task.component).__name__} has no meta-parameters (its init "
                          "returns an empty pytree), so there is nothing to evolve; allowed: a component with "
                          "meta-parameters (a fixed one, such as a distilled formula, trains through "
                          "`python -m metarl.evaluate RUN_DIR distilled=K` or in code)")
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
