"""The generation loop, which evolves, reports, checkpoints and stops cleanly on SIGINT, SIGTERM or SIGHUP."""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from metarl import compilation, devices, errors, rundir
from metarl.commands import stop_signals_to
from metarl.config import RunConfig
from metarl.logger import Logger
from metarl.progress import Watchdog, progress
from metarl.rundir import RunDir
from metarl.tasks import TaskSet, build_task
from metarl.outer_loops import evolution, streams
from metarl.outer_loops.evolution import NOISE_GENERATIONS, Evolution, noise_warning
from metarl.outer_loops.fitness import make_aggregate


@dataclasses.dataclass
class Searched:
    """A search's state and records: where it starts (``restore``; ``start`` generations done) or the loop leaves it."""
    state: Any
    history: list
    start: int
    compile_seconds: float = 0.0
    best_so_far: float = float("nan")
    skipped: str = ""  # the damaged checkpoints skipped to restore (``Checkpointer.skipped_note``)

    def summary(self) -> dict:
        fps = [r["fps"] for r in self.history[self.start:]]
        return {"generations": len(self.history), "compile_seconds": self.compile_seconds,
                "first_mean": self.history[0]["mean"] if self.history else None,
                "last_mean": self.history[-1]["mean"] if self.history else None,
                "best_so_far": self.best_so_far, "median_fps": float(np.median(fps)) if fps else None}


class Interrupted(Exception):
    """Raised after a clean save when SIGINT, SIGTERM or SIGHUP arrived."""
    def __init__(self, signum: int, generation: int):
        self.signum, self.generation = signum, generation
        super().__init__(f"{signal.Signals(signum).name} at generation {generation}")


@dataclasses.dataclass(frozen=True)
class Run:
    """One search's context, made once where it starts and handed down (``start``; a tuning's: ``of_tuning``)."""
    cfg: RunConfig
    run_dir: RunDir
    mesh: Any
    config: dict   # the config as saved: what the trackers and each checkpoint record
    writes: bool   # whether this process writes the run's files (only process 0 of a multi-host run does)
    shown: bool    # progress bars on a terminal
    tuning: bool = False   # a search of the baseline's tuning (``baseline.tune``): trackers by ``Sink.during_tuning``

    @classmethod
    def start(cls, cfg: RunConfig, run_dir: str | Path, mesh: Any = "auto") -> "Run":
        writes = jax.process_index() == 0
        return cls(cfg, RunDir(Path(run_dir).resolve()), devices.run_mesh(cfg) if mesh == "auto" else mesh,
                   cfg.to_dict(), writes, cfg.logger.progress and writes)

    def of_tuning(self, tcfg: RunConfig) -> "Run":
        """A tuning search's: its own config and directory, on this run's mesh and processes."""
        return dataclasses.replace(self, cfg=tcfg, run_dir=RunDir(tcfg.run_dir), config=tcfg.to_dict(), tuning=True)

    def logger(self, task: TaskSet) -> Logger:
        """The search's trackers, a context manager: closed once, as stopped if the search raised."""
        return Logger(self.run_dir.path, self.config, self.cfg.es.generations, self.cfg.logger, write=self.writes,
                      task_names=task.names, tuning=self.tuning)


def trainings(cfg: RunConfig, generations: Optional[int] = None, pick: bool = False) -> int:
    """The agents a search trains: the members and the control (``fitness.control``, on the same seeds as one more)
    per seed, per generation (``generations``, else the run's); with ``pick``, its final pick's too: the kept members
    and the mean (and controls), per fresh seed."""
    f, generations = cfg.fitness, cfg.es.generations if generations is None else generations
    picked = (f.validation_top + 1) * f.validation_seeds * (1 + (f.control == "paired")) if f.validation_top else 0
    return (cfg.es.popsize + (f.control != "none")) * f.num_seeds * generations + pick * picked


def build_evolution(cfg, task: Optional[TaskSet] = None, mesh: Any = "auto", reference: Optional[dict] = None):
    """``(task, evolution)``; ``reference``: the returns normalised fitness uses (None: raw)."""
    task = task or build_task(cfg)
    if mesh == "auto":
        mesh = devices.run_mesh(cfg)
    with errors.layer_errors("evolution"):
        evo = Evolution(cfg.es, task.template, task.fitness_fn, num_seeds=cfg.fitness.num_seeds,
                        init_mean=task.init_mean, nonfinite_floor=cfg.fitness.nonfinite_floor, mesh=mesh,
                        describe_search=task.describe_search,
                        aggregate=make_aggregate(reference, cfg.fitness.aggregate),
                        control_fn=task.control_fn if cfg.fitness.control != "none" else None,
                        paired=cfg.fitness.control == "paired", keep_top=max(1, cfg.fitness.validation_top))
    return task, evo


def restore(run_dir: RunDir, fresh: Any) -> Searched:
    """The newest good checkpoint's state, shaped as ``fresh`` (None: host arrays as saved, a read-only check), or
    ``fresh`` itself; writes nothing but the errors' log (``CheckpointError`` if none reads). A state's shapes ignore
    tuned values and reference returns, so the search's own evolution restores what any of the run wrote."""
    with contextlib.closing(rundir.Checkpointer(run_dir, write=False)) as reader:
        step, restored, meta = reader.newest(fresh)
    if step is None:
        return Searched(fresh, [], 0)
    start = int(meta["generation"])
    skipped = reader.skipped_note(start) if reader.skipped else ""
    return Searched(restored, list(meta["history"])[:start], start, skipped=skipped)


def best_info(cfg: RunConfig, task: TaskSet, generation: int, fitness: Optional[float]) -> dict:
    """What is exported beside the meta-parameters (``RunDir.write_best``)."""
    return {"experiment": cfg.experiment, "kind": task.kind.name, "algo": task.algo, "env": cfg.env,
            "tasks": task.names, "component": cfg.component, "inner": cfg.inner, "generation": generation,
            "fitness": fitness, "seed": cfg.seed}


def search(run: Run, task: TaskSet, evo: Evolution, logger: Logger) -> Searched:
    """Run (or continue) the generations; a stop signal ends it after the one in flight (``Interrupted``)."""
    cfg, run_dir, is_main = run.cfg, run.run_dir, run.writes
    restored = restore(run_dir, evo.init(streams.evolution(cfg.seed)))
    logger.catch_up(restored.history)
    history, start = list(restored.history), restored.start
    ckpt = rundir.Checkpointer(run_dir, keep=cfg.checkpoint.keep, write=is_main)
    # A global, fully replicated state on the mesh: what the compiled generation takes and returns.
    state = devices.replicate(restored.state, evo.mesh)
    if is_main:
        run_dir.truncate_metrics(start)
    frames_per_gen = trainings(cfg, generations=1) * task.frames_per_eval
    if start:
        logger.message(f"resuming {run_dir} at generation {start} of {cfg.es.generations}")
    if ckpt.removed_incomplete:
        logger.message(f"removed incomplete checkpoint(s) left by a kill: {', '.join(ckpt.removed_incomplete)}")
    if restored.skipped and is_main:
        logger.message(f"{restored.skipped}; set aside as {', '.join(ckpt.set_aside(start))}")
    if start >= cfg.es.generations:  # a finished search resumed for what follows it: nothing to compile
        ckpt.close()
        return Searched(state, history, start, 0.0, float(state.best_fitness))
    t0 = time.perf_counter()
    with progress("compiling the generation", enabled=run.shown):
        step = compilation.compile_program(evo.step, state)  # one compilation per run, timed on its own
    compile_s = time.perf_counter() - t0
    devices.barrier("compiled")  # processes compile at different speeds; the first collective waits 30 s
    logger.message(f"compiled the generation in {compile_s:.1f} s; {frames_per_gen:,} frames per generation "
                   f"on {evo.mesh.size if evo.mesh else 1} device(s)")
    best_so_far = float(state.best_fitness)
    if cfg.fitness.num_seeds == 1:
        logger.message("note: fitness.num_seeds=1 measures no seed noise: signal_within, seed_noise, signal and "
                       "update_signal are recorded as null (docs/signal.md); fitness.num_seeds >= 2 measures them")
    top = run_dir.path.parent if run_dir.path.name.startswith(rundir.TUNE) else run_dir  # a tuning's: the run's
    watchdog = Watchdog(cfg.watchdog, run_dir.stacks, f"Continue with: python -m metarl.evolve resume={top}")
    received = []  # the stop signals this process got, read between generations (a generation is one XLA call)

    def on_stop(signum, frame):
        if received:  # a second signal: stop now
            raise KeyboardInterrupt
        received.append(signum)

    with stop_signals_to(on_stop):
        for done in range(start + 1, cfg.es.generations + 1):
            t = time.perf_counter()
            with progress(f"generation {done}/{cfg.es.generations}", enabled=run.shown), \
                    watchdog.watch(f"generation {done}"):
                state, stats = step(state)
                stats = jax.device_get(stats)
            seconds = time.perf_counter() - t
            record = {**evolution.record(stats, task.names), "seconds": seconds,
                      "fps": frames_per_gen / seconds if seconds > 0 else float("nan")}
            history.append(record)
            logger.log(record)
            if warning := noise_warning(history, min(NOISE_GENERATIONS, cfg.es.generations),
                                        lambda name: errors.layer_path("evolution", name)):
                logger.message(warning)
            if record["best_so_far"] > best_so_far and is_main:
                best_so_far = record["best_so_far"]
                run_dir.write_best(state.best_params, best_info(cfg, task, record["generation"], best_so_far))
            # Processes get a signal at different moments; all stop after the same generation. The agreed
            # signal is kept apart from ``received``: one arriving after the agreement is no second signal.
            signum = devices.agree(received[0] if received else 0, f"stop/{done}")
            if done % cfg.checkpoint.every == 0 or done == cfg.es.generations or signum:
                devices.assert_same_everywhere(state)
                ckpt.save(done, state, history, run.config)
            if signum:
                ckpt.close()
                raise Interrupted(signum, done)  # the logger finishes as stopped where it was opened
    ckpt.close()
    return Searched(state, history, start, compile_s, best_so_far)
