"""A run's fitness over its tasks: the evolution driver built with ``outer_loops.fitness``'s aggregate,
and the reference returns ``fitness.normalize=baseline`` scores against (the baseline's and a random
policy's per task). Both are measured once, at the start of a run, and stored in ``reference.json``,
so a resumed run scores exactly as before and measures nothing again.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from metarl import compilation, devices
from metarl.checkpoints import atomic_write
from metarl.progress import progress
from metarl.inner_loops.envs import random_policy_return
from metarl.outer_loops.evolution import Evolution
from metarl.outer_loops.fitness import degenerate, make_aggregate, spans, task_key
from metarl.stats import t_interval
from metarl.tasks import build_task

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
