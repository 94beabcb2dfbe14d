"""PPO tuned on each evaluated task, a side of ``metarl.evaluate`` (``per_task=[16,64]``; docs/results.md): random
search over the run's ``baseline.tune`` ranges, k / ``seeds`` settings on ``seeds`` seeds each, the best by the
fitness statistic. A smaller k takes the best of the same tuning's first draws, so the largest k gives every one.
Finished tunings are kept in the run directory: a killed evaluation loses only the one it was in."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metarl import compilation, devices
from metarl.errors import ConfigError
from metarl.progress import progress
from metarl.rundir import RunDir
from metarl.stats import best_finite
from metarl.outer_loops import streams

_CHUNK = 64


@dataclasses.dataclass(frozen=True)
class PerTask:
    ks: tuple          # the budgets: trainings per tuning
    tunings: int = 3   # per task
    seeds: int = 2     # per drawn setting

    def check(self, cfg, num_seeds: int) -> None:
        """``ConfigError`` naming the argument unless this side can be built for ``cfg``'s run."""
        if not cfg.baseline.tune:
            raise ConfigError("per_task: the run tuned no baseline, so there is no range to tune in; allowed: a run "
                              "with baseline.tune")
        if self.seeds < 1:
            raise ConfigError(f"per_task_seeds: {self.seeds}; allowed: >= 1")
        if self.tunings < 1 or self.tunings > num_seeds:
            raise ConfigError(f"per_task_tunings: {self.tunings}; allowed: 1 to num_seeds ({num_seeds})")
        for k in self.ks:
            if not isinstance(k, int) or k < self.seeds or k % self.seeds:
                raise ConfigError(f"per_task: {k!r}; allowed: a list of multiples of per_task_seeds ({self.seeds}), "
                                  "such as [16,64]")
        if not self.ks:
            raise ConfigError("per_task: []; allowed: a non-empty list of trainings per tuning, such as [16,64]")


def label(k: int) -> str:
    return f"tuned per task at k={k}"


def tune(cfg, hp_task, per_task: PerTask, run_dir: RunDir) -> list[dict]:
    """Per task of ``hp_task``, ``{k: [_pick per tuning]}``; reads and extends the run directory's finished tunings."""
    space, points = json.dumps(dict(cfg.baseline.tune), sort_keys=True), max(per_task.ks) // per_task.seeds
    done, picks, total = run_dir.per_task.read() or {}, [], len(hp_task.specs) * per_task.tunings
    with progress(f"tuning per task: {points * per_task.seeds} trainings per tuning", total=total) as bar:
        for i, spec in enumerate(hp_task.specs):
            runs, score = [], None   # one program for the task's tunings, compiled only if one must run
            for j in range(per_task.tunings):
                # a tuning is known by what it searched, on what, with which seeds and statistic
                name = (f"{spec.name} | {space} | {cfg.fitness.statistic} {cfg.fitness.window} | seed {cfg.seed} | "
                        f"tuning {j} | {points} x {per_task.seeds}")
                if name not in done:
                    score = score or scorer(hp_task, i, points * per_task.seeds)
                    key = streams.per_task_tuning(cfg.seed, j)
                    done[name] = hp_task.component.random_search(points, per_task.seeds, key, score)
                    if jax.process_index() == 0:
                        run_dir.per_task.write(done)
                runs.append(done[name])
                bar.update()
            picks.append({k: [_pick(hp_task, run, k // per_task.seeds, j) for j, run in enumerate(runs)]
                          for k in per_task.ks})
    return picks


def scorer(hp_task, i: int, agents: int):
    """``score(meta, keys)``: task ``i``'s statistic of each setting on its key, ``agents`` at a time in chunks of
    at most _CHUNK (memory stays that of a search), through one program compiled on first use for every tuning."""
    chunk, make, statistic = math.gcd(agents, _CHUNK), hp_task.trainers[i], hp_task.statistic
    mesh = devices.population_mesh(chunk, fit=True)
    program = devices.over_agents(lambda meta, k: statistic(make(meta)(k)[1]["episode_return"]), mesh)
    compiled = []
    part = lambda tree, c: jax.tree.map(lambda x: x[c * chunk:(c + 1) * chunk], tree)  # noqa: E731

    def score(meta, keys) -> np.ndarray:
        if not compiled:
            compiled.append(compilation.compile_program(program, part(meta, 0), part(keys, 0)))
        return np.concatenate([np.asarray(jax.device_get(compiled[0](part(meta, c), part(keys, c))), float)
                               for c in range(agents // chunk)])
    return score


def _pick(hp_task, run: dict, n: int, tuning: int) -> dict:
    """The best of a tuning's first ``n`` draws by its mean score over seeds (a diverged draw never wins)."""
    means = np.asarray(run["scores"], float)[:n].mean(axis=1)
    best = best_finite(means)
    meta = {name: jnp.float32(v[best]) for name, v in run["z"].items()}
    return {"tuning": tuning, "z": meta, "tuning_score": float(means[best]),
            "hyperparameters": hp_task.kind.values(hp_task.component, meta)}


def per_seed(picks: list[dict], num_seeds: int) -> Any:
    """The meta-parameters each evaluation seed trains with: seed i, tuning ``i % len(picks)``'s pick."""
    return {name: np.asarray([picks[i % len(picks)]["z"][name] for i in range(num_seeds)], np.float32)
            for name in picks[0]["z"]}


def record(picks: list[dict], finals: np.ndarray) -> list[dict]:
    """Each tuning's pick for the report, with the mean final return of the evaluation seeds it trained."""
    n = len(picks)
    return [{"tuning": p["tuning"], "hyperparameters": p["hyperparameters"], "tuning_score": p["tuning_score"],
             "seeds": list(range(j, len(finals), n)), "mean": float(np.nanmean(finals[j::n]))}
            for j, p in enumerate(picks)]


def report(evaluation: dict, picks: list[dict], tunings: int, seeds: int) -> None:
    """Adds the side's settings and compute to an evaluation's report and, per task, each k's picks (``record``)."""
    ks = sorted(picks[0])
    evaluation["compute"]["per_task"] = {"per task and tuning": "k", "tunings per task": tunings}
    evaluation["per_task"] = {"ks": ks, "tunings": tunings, "seeds_per_setting": seeds,
                              "tuner": "random search over the run's baseline.tune ranges, the best of k / seeds "
                                       "settings by the fitness statistic, evaluation seed i with tuning i % tunings"}
    for row, by_k in zip(evaluation["tasks"], picks):
        row["per_task"] = {str(k): record(by_k[k], np.asarray(row["sides"][label(k)]["final_returns"])) for k in ks}
