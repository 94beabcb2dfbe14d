"""One run: the read-only checks (``check``), the run holding its lock (``run_locked``), the stages (``run_stages``)."""
from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import jax

from metarl import config as config_lib, devices, errors, rundir, stages
from metarl.commands import STOP_SIGNALS, check_existing, fail
from metarl.config import RunConfig
from metarl.errors import ConfigError
from metarl.logger import say, trackers
from metarl.rundir import CheckpointError, RunDir
from metarl.search import Interrupted, Run, restore
from metarl.tasks import TaskSet, build_task, check_memory


def run_stages(cfg: RunConfig, run_dir: str | Path, task: TaskSet | None = None, mesh: Any = "auto") -> dict:
    """The stages in order on ``run_dir``; the summary. ``task``: as checked (else built here)."""
    run = Run.start(cfg, run_dir, mesh)
    tuned = stages.tune(run)                                # 1. tuned.json (its search in tune/)
    if tuned is not None:  # the learned part, the control and the reference on the tuned values
        run = dataclasses.replace(run, cfg=config_lib.with_tuned(cfg, tuned))
    task = build_task(run.cfg) if task is None or tuned is not None else task
    with run.logger(task) as logger:
        searched, picked, _ = stages.search_and_pick(run, task, logger, tuned)
        # 2. reference.json, 3. ckpt/, metrics.jsonl and the best so far, 4. validation.json and the pick
        logger.summary = {"validation_trainings": picked["trainings"] if picked else 0, **searched.summary()}
        if run.writes and logger.tracking:
            from metarl import figures  # matplotlib: seconds that a run without a tracker does without

            try:  # the figures of `python -m metarl.inspect`; none if that fails, since the run itself has succeeded
                written = figures.write_figures(run.run_dir.path, loaded=(run.cfg, task))
            except Exception as err:
                logger.message(f"note: no figures to log ({type(err).__name__}: {err})")
                written = []
            best = run.run_dir.best_files
            logger.log_results(written, best, run.run_dir.read_best()[1] if best else None)
    return logger.summary


def closing_lines(run_dir: RunDir, generations: int) -> list[str]:
    """What a finished run leaves: its best member and where it is exported, the population's mean, what next."""
    lines = [f"done: {generations} generations in {run_dir}"]
    if exported := run_dir.best_files:
        info = run_dir.read_best()[1]
        lines.append(f"best member: fitness {info.get('validation_fitness', info['fitness']):.2f}"
                     f"{' on fresh seeds' * ('picked' in info)}, found in generation {info['generation']}; "
                     f"exported to {exported[0]}")
    if means := [r for r in run_dir.metrics() if r["mean"] is not None]:
        peak = max(means, key=lambda r: r["mean"])
        lines.append(f"population mean: peak {peak['mean']:.2f} at generation {peak['generation']}, last "
                     f"{means[-1]['mean']:.2f}")
    return lines + [f"next: python -m metarl.evaluate run_dir={run_dir}  (the best member against the baseline, on "
                    "fresh seeds)", f"next: python -m metarl.inspect run_dir={run_dir}  (figures in {run_dir.figures})"]


def check(cfg, setup_devices: bool = True, task: Any = None) -> Any:
    """Every read-only check needing no run directory; the task. A run sets up its devices here, a sweep before."""
    for sink, section in trackers(cfg.logger):  # each enabled tracker's own checks of its section
        sink.check(section)
    if setup_devices:
        devices.setup(cfg.devices)
    with errors.layer_errors("es"):
        cfg.es.validate()
    task = task or build_task(cfg)
    stages.check_tuning(cfg)
    if not jax.tree.leaves(task.template):
        raise ConfigError(f"component._target_: {type(task.component).__name__} has no meta-parameters (its init "
                          "returns an empty pytree), so there is nothing to evolve; allowed: a component with "
                          "meta-parameters (a fixed one, such as a distilled formula, trains through "
                          "`python -m metarl.evaluate run_dir=RUN_DIR distilled=K` or in code)")
    devices.run_mesh(cfg)
    check_memory(cfg, task, *devices.memory_share(cfg.es.popsize))
    return task


def run_locked(cfg, run_dir: Path, resuming: bool, named: bool, task: Any = None) -> int:
    """The remaining checks, the run directory's lock, then the run; its exit code."""
    where = RunDir(run_dir)
    # 1. Every check, reading only, the checkpoint a resume starts from included.
    try:
        task = check(cfg, task=task)  # sets up the devices: JAX starts here
        before = where.fingerprint()
        restore(where, None)
    except (ConfigError, ValueError, CheckpointError) as err:
        fail(str(err).splitlines()[0])

    # 2. The run directory, exclusively: a second run on it is refused here, having changed nothing.
    lock, refused, writes = None, None, jax.process_index() == 0
    if writes:
        try:
            lock = rundir.acquire(run_dir) if named or resuming else rundir.acquire_new(run_dir)
        except rundir.RunDirLocked as err:
            refused = str(err)
    try:
        # Every process of a multi-host run stops, not only process 0 (the rest would wait).
        if devices.agree(int(refused is not None), "run_dir_lock"):
            fail(refused or f"run_dir: {run_dir} is in use by another run (see process 0)")
        if lock is not None:
            if lock.run_dir != run_dir:  # a default name taken by a run started in the same second
                run_dir, where = lock.run_dir, RunDir(lock.run_dir)
                cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
            elif where.fingerprint() != before:
                # Another run wrote here between the checks and the lock (and has ended): check again.
                try:
                    check_existing(cfg, run_dir)
                    restore(where, None)
                except CheckpointError as err:
                    fail(str(err).splitlines()[0])

        if writes:
            where.write_config(cfg.to_dict())
            say(f"run directory: {run_dir}")
            if ignored := " and ".join(s.name for s in STOP_SIGNALS[:2] if signal.getsignal(s) == signal.SIG_IGN):
                say(f"note: {ignored} ignored (inherited, as by & in a script), so it cannot stop this run; "
                    f"{' or '.join(s.name for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN)} still "
                    "stops it after the generation in flight, with a checkpoint (set -m in the script keeps SIGINT)")
        try:
            summary = run_stages(cfg, run_dir, task)
        except Interrupted as stop:
            if writes:  # every process stops after the same generation; one says so
                say(f"stopped by {signal.Signals(stop.signum).name} after generation {stop.generation}; "
                    f"checkpoint saved. Continue with: python -m metarl.evolve resume={run_dir}", error=True)
            return 128 + stop.signum
        except CheckpointError as err:
            fail(str(err))
        if writes:
            say("\n".join(closing_lines(where, summary["generations"])))
        return 0
    finally:
        if lock is not None:  # a sweep runs its next job in this process; a lone run is about to exit
            lock.release()
