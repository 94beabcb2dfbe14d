"""Read what a run left behind: its config, history and best meta-parameters, for use outside the CLI.

    from metarl.results import load_best
    best = load_best("checkpoints/value_loss-20261122-101500")
    params, metrics = best.train(jax.random.key(0))     # a fresh PPO run with the learned loss
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from flax import serialization

from metarl import checkpoints
from metarl.config import RunConfig, from_dict
from metarl.logger import read_metrics

CONFIG_FILE = "config.yaml"


def load_config(run_dir: str | Path) -> RunConfig:
    from omegaconf import OmegaConf

    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise checkpoints.CheckpointError(f"{path}: missing; {run_dir} is not a metarl run directory")
    return from_dict(OmegaConf.to_container(OmegaConf.load(path), resolve=True))


def history(run_dir: str | Path) -> list[dict]:
    """Per-generation records: ``metrics.jsonl``, or the latest checkpoint's copy if that is longer."""
    records = read_metrics(run_dir)
    try:
        ckpt = checkpoints.Checkpointer(run_dir, write=False)
        if ckpt.latest_step() is not None:
            saved = ckpt.read_meta()["history"]
            if len(saved) > len(records):
                records = saved
        ckpt.close()
    except checkpoints.CheckpointError:
        pass
    return records


@dataclasses.dataclass
class Best:
    kind: str
    component: Any            # the learned component (or the hyperparameter space)
    meta_params: Any
    inner_config: Any         # the trainer config the run evolved with
    info: dict
    train: Callable           # train(key) -> (params, metrics) with these meta-parameters
    values: dict | None = None  # decoded hyperparameters, for kind == "hyperparams"


def load_best(run_dir: str | Path) -> Best:
    from metarl.tasks import build_task

    cfg = load_config(run_dir)
    task = build_task(cfg)
    raw, info = checkpoints.read_best(run_dir)
    meta = serialization.from_state_dict(task.template, raw)
    values = None
    if task.kind == "hyperparams":
        values = {k: float(v) for k, v in task.component.decode(meta).items()}
    return Best(kind=task.kind, component=task.component, meta_params=meta, inner_config=task.inner_config,
                info=info, train=task.make_train(meta), values=values)
