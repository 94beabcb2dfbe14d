"""The generation loop: evolve, report, checkpoint, resume, and stop cleanly on SIGINT/SIGTERM/SIGHUP."""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from metarl import checkpoints, compilation, devices, figures, scores
from metarl.config import RunConfig
from metarl.cli import stop_signals_to
from metarl.logger import Logger, truncate_metrics
from metarl.progress import progress
from metarl.tasks import Task
from metarl.outer_loops.evolution import NOISE_GENERATIONS, SIGNAL_FIELDS, Evolution, noise_warning


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
    # are measured (and stored) by `run`, once the run directory is this run's.
    task, evo = scores.build_evolution(cfg, task=task, mesh=mesh)
    state = evo.init(jax.random.key(cfg.seed))
    with contextlib.closing(checkpoints.Checkpointer(run_dir, write=False)) as reader:
        step = reader.latest_step()  # None without a checkpoint directory, which a reader does not create
        if step is None:
            return task, evo, state, 0, []
        state, meta = reader.restore(state, step)
    start = int(meta["generation"])
    return task, evo, state, start, list(meta["history"])[:start]


def run(cfg: RunConfig, run_dir: str | Path, mesh: Any = "auto", prepared: Optional[tuple] = None) -> dict:
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
    reference = scores.run_reference(cfg, task, run_dir, write=is_main, message=logger.message,
                                     shown=cfg.logger.progress and is_main)
    if reference is not None:  # the same state, scored against the reference
        task, evo = scores.build_evolution(cfg, task, mesh=evo.mesh, reference=reference)

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
