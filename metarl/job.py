"""One run of ``metarl.evolve`` or of a sweep's job, from its checked config to its end: the checks
of its run directory and settings (reading only), the directory's lock, then the run itself."""
from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import jax

from metarl import config as config_lib
from metarl import devices, runlock
from metarl.checkpoints import CheckpointError
from metarl.cli import check_existing, fail
from metarl.config import CONFIG_FILE, ConfigError
from metarl.logger import check_mlflow, say
from metarl.tasks import build_task, check_memory


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


def check_run(cfg, setup_devices: bool = True, task: Any = None) -> Any:
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
        task = check_run(cfg, task=task)
        # evosax, which the runner imports, starts JAX's backends: only after check_run's devices.setup.
        from metarl import runner

        before = _fingerprint(run_dir)
        prepared = runner.prepare(cfg, run_dir, task=task)
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
                    prepared = runner.prepare(cfg, run_dir, task=task)
                except CheckpointError as err:
                    fail(str(err).splitlines()[0])

        if jax.process_index() == 0:
            config_lib.save(cfg, run_dir)
            say(f"run directory: {run_dir}")
        try:
            summary = runner.run(cfg, run_dir, prepared=prepared)
        except runner.Interrupted as stop:
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
