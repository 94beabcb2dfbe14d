"""Read what a run left behind, for use outside the CLI: its config, history and best meta-parameters
(``load_best(RUN_DIR).train(key)``: a fresh training with them; docs/resume.md)."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from metarl import rundir
from metarl.config import RunConfig, from_dict, with_tuned
from metarl.tasks import build_task


def load_config(run_dir: str | Path, tuned: bool = True) -> RunConfig:
    """The run's saved config, checked as a new one is (``ConfigError`` names what is wrong), with its
    tuned baseline's hyperparameters in ``inner`` where it tuned one (``tuned=False``: as configured)."""
    cfg = from_dict(rundir.RunDir(run_dir).read_config())
    return with_tuned(cfg, rundir.RunDir(run_dir).tuned.read()) if tuned else cfg


def load_run(run_dir: str | Path, tasks: Callable[[RunConfig], list] | None = None):
    """``(config, task)`` from a run's saved config; ``tasks(config)``, if given: task specs instead of its own."""
    cfg = load_config(run_dir)
    return cfg, build_task(cfg, None if tasks is None else tasks(cfg))


def history(run_dir: str | Path) -> list[dict]:
    """Per-generation records: the run's metrics, or the newest good checkpoint's copy if that is longer (saying
    which it skipped); ``CheckpointError`` if none is good."""
    with contextlib.closing(rundir.Checkpointer(run_dir, write=False)) as ckpt:
        step, _, meta = ckpt.newest()
    if ckpt.skipped:
        print(f"note: {ckpt.skipped_note(step)}", file=sys.stderr)
    return max(rundir.RunDir(run_dir).metrics(), meta.get("history", []), key=len)  # the first of two as long


@dataclasses.dataclass
class Best:
    kind: str                 # component.kind
    component: Any            # the learned component (or the hyperparameter space)
    meta_params: Any
    inner_config: Any         # the trainer config the run evolved with
    info: dict
    train: Callable           # train(key) -> (params, metrics) with these meta-parameters
    values: dict | None = None  # decoded hyperparameters, for component.kind=hyperparams


def load_best(run_dir: str | Path) -> Best:
    _, task = load_run(run_dir)
    meta, info = rundir.RunDir(run_dir).read_best(task.template)
    return Best(kind=task.kind.name, component=task.component, meta_params=meta, inner_config=task.inner_config,
                info=info, train=task.trainers[0](meta), values=task.kind.values(task.component, meta))
