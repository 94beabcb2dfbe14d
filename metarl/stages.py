"""The stages besides the generation loop: ``tune``, ``reference`` and ``pick``, each writing its own file."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from metarl import compilation, config as config_lib, devices
from metarl.config import RunConfig
from metarl.errors import ConfigError, LayerError
from metarl.logger import Logger, say
from metarl.progress import progress
from metarl.rundir import CheckpointError, RunDir
from metarl.search import Run, Searched, best_info, build_evolution, search, trainings
from metarl.stats import best_finite, bracket, t_bounds
from metarl.tasks import TaskSet, build_task, task_specs
from metarl.outer_loops.evolution import Evolution, search_warnings
from metarl.outer_loops import streams
from metarl.outer_loops.fitness import degenerate, spans, task_key


def search_and_pick(run: Run, task: TaskSet, logger: Logger,
                    tuned: Optional[dict] = None) -> tuple[Searched, Optional[dict], Evolution]:
    """The reference, the search scoring against it and the pick (validation.json's report, None without
    ``fitness.validation_top``), in a run's (or its tuning's) directory; the search's evolution, built once here."""
    reference_returns = reference(run, task, logger.message, tuned and tuned["hyperparameters"])
    _, evo = build_evolution(run.cfg, task, run.mesh, reference_returns)
    searched = search(run, task, evo, logger)
    picked = pick(run, task, evo, searched.state, logger.message) if run.cfg.fitness.validation_top else None
    devices.barrier("finished")
    return searched, picked, evo


def reference(run: Run, task: TaskSet, message: Callable[[str], None], tuned: Optional[dict] = None) -> Optional[dict]:
    """reference.json (None without ``normalize=baseline``), measured once so that a resumed run scores as before."""
    cfg, run_dir = run.cfg, run.run_dir
    # fitness.normalize: null normalises with several tasks, not with one
    if (cfg.fitness.normalize or ("baseline" if len(task.specs) > 1 else "none")) != "baseline":
        return None
    stored = run_dir.reference.read()
    if stored is None or stored.get("tasks") != list(task.names) or stored.get("tuned") != tuned:
        t = time.perf_counter()
        with progress("measuring the reference returns", total=2 * len(task.specs), enabled=run.shown) as bar:
            stored = measure_reference(task, cfg.seed, cfg.fitness.reference_seeds, bar.update)
        stored["tuned"] = tuned
        if run.writes:
            run_dir.reference.write(stored)
        message(f"measured the reference returns in {time.perf_counter() - t:.1f} s")
    message(f"normalised fitness = (R - random) / ({'tuned ' if tuned else ''}baseline - random), with 95% intervals: "
            + describe(stored))
    if bad := degenerate(stored):
        message(f"warning: the baseline does not clear random play beyond noise on {', '.join(bad)} at this "
                "budget, so its normalised score has no scale there (the gap's size is used)")
    return stored


def measure_reference(task, seed: int, num_seeds: int, measured: Callable[[], Any] = lambda: None) -> dict:
    """``R_base`` and ``R_low`` per task over ``num_seeds`` seeds, with 95% t-intervals; ``measured()`` after each."""
    base_keys, low_keys = (streams.stream(seed, name, num_seeds) for name in ("reference_baseline", "reference_random"))
    stored = {"tasks": task.names, "base": [], "low": [], "base_ci": [], "low_ci": [], "num_seeds": num_seeds,
              "seed": seed}
    for i, (spec, train) in enumerate(zip(task.specs, task.baselines)):  # keys as a member's: task_key(k, i)
        baseline = devices.over_agents(lambda k, train=train, i=i: train(task_key(k, i))[1]["episode_return"])
        random_play = devices.over_agents(lambda k, spec=spec, i=i: spec.random_return(task_key(k, i)))
        for name, program, keys in (("base", baseline, base_keys), ("low", random_play, low_keys)):
            values = np.asarray(compilation.compile_program(program, keys)(keys), np.float64)
            values = np.asarray(task.statistic(values)) if name == "base" else values
            stored[name].append(float(values.mean()))
            stored[name + "_ci"].append(t_bounds(values))
            measured()
    return stored


def describe(reference: dict) -> str:
    """The reference in one line, with each baseline's 95% interval where it has one (older runs' have none)."""
    ci = reference.get("base_ci")
    return "; ".join(
        f"{name} baseline {base:.2f}" + (f" {bracket(ci[i], '.2f')} (+-{50 * (ci[i][1] - ci[i][0]) / gap:.1f}%"
                                         " of the gap)" if ci else "") + f", random {low:.2f}"
        for i, (name, base, low, gap) in enumerate(zip(reference["tasks"], reference["base"], reference["low"],
                                                       spans(reference)))) + f" (over {reference['num_seeds']} seeds)"


def tuning_config(cfg: RunConfig, run_dir: RunDir, i: int = 0) -> RunConfig:
    """The search that tunes the baseline (kind hyperparams over ``baseline.tune``), on its own seed and directory."""
    b = cfg.baseline
    es = dataclasses.replace(cfg.es, generations=b.generations or cfg.es.generations, init_mean="init")
    es = config_lib.build(config_lib.ESSection, {**config_lib.to_dict(es), **b.es}, "baseline.es.")
    return dataclasses.replace(cfg, component={"kind": "hyperparams", "search": dict(b.tune)}, es=es,
                               seed=streams.tuning_seed(cfg.seed, i), run_dir=str(RunDir(run_dir).tuning(i)),
                               baseline=config_lib.BaselineSection())


def check_tuning(cfg: RunConfig) -> None:
    """``ConfigError`` unless the tuning builds, is no smaller than the search and tunes nothing a task sets."""
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
    except LayerError as err:  # the tuning's component.search is this run's baseline.tune
        if not err.field.startswith("component.search"):
            raise
        raise err.at("baseline.tune" + err.field.removeprefix("component.search")) from None
    if cfg.baseline.tuned_from:
        tuned_elsewhere(cfg)
    elif trainings(tcfg) < trainings(cfg):
        raise ConfigError(f"baseline.generations: the tuning trains {trainings(tcfg):,} agents, fewer than the "
                          f"search's {trainings(cfg):,}; allowed: a tuning budget at least the search's (more "
                          "generations, or baseline.es.popsize)")


def _tuned_for(cfg: RunConfig, tuned: dict) -> bool:
    return (tuned.get("search_space") == dict(cfg.baseline.tune)
            and tuned.get("tasks") == [s.name for s in task_specs(cfg)])


def tuned_elsewhere(cfg: RunConfig) -> dict:
    """``baseline.tuned_from``'s tuned.json (with ``from``); ``ConfigError`` unless it was tuned as this run would."""
    where = RunDir(Path(cfg.baseline.tuned_from).expanduser())
    tuned = where.tuned.read()
    if tuned is None:
        raise ConfigError(f"baseline.tuned_from: {where} holds no tuned baseline; allowed: a run directory whose "
                          "tuning has finished")
    theirs = where.read_config("baseline.tuned_from")
    fixed = lambda inner: {k: v for k, v in (inner or {}).items() if k not in cfg.baseline.tune}  # noqa: E731
    if not _tuned_for(cfg, tuned) or fixed(theirs.get("inner")) != fixed(cfg.inner):
        raise ConfigError(f"baseline.tuned_from: {where} was tuned over another space, on other tasks or with other "
                          "inner settings; allowed: a run with this run's baseline.tune, tasks and inner")
    if cfg.baseline.matched and "matched" not in tuned:
        raise ConfigError(f"baseline.matched: true, but {where} tuned no matched baseline; allowed: false, or a run "
                          "tuned with baseline.matched: true")
    needed = trainings(cfg, pick=True)
    if tuned["trainings"] < needed:
        raise ConfigError(f"baseline.tuned_from: {where} tuned with {tuned['trainings']:,} trainings, fewer than the "
                          f"search's {needed:,}; allowed: a tuning at least as large as the search")
    return {**tuned, "search_trainings": needed, "from": str(where.path.resolve())}


def tune(run: Run) -> Optional[dict]:
    """tuned.json (None without ``baseline.tune``): the directory's, else ``baseline.tuned_from``'s, else tuned now."""
    cfg, run_dir = run.cfg, run.run_dir
    if not cfg.baseline.tune:
        return None
    tuned = run_dir.tuned.read()
    if tuned is not None:
        if not _tuned_for(cfg, tuned):
            raise ConfigError(f"baseline.tune: {run_dir} holds a tuning over another space or other tasks; "
                              "allowed: the run's own tuning (or a new run_dir to tune again)")
        return tuned
    if cfg.baseline.tuned_from:
        tuned = tuned_elsewhere(cfg)
        if run.writes:
            run_dir.tuned.write(tuned)
        say(f"tuned baseline from {tuned['from']}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in tuned["hyperparameters"].items()))
        return tuned
    n = cfg.baseline.tunings
    tcfgs = [tuning_config(cfg, run_dir, i) for i in range(n + cfg.baseline.matched)]
    tcfg = tcfgs[0]
    say(f"tuning the baseline's {', '.join(cfg.baseline.tune)} first: {len(tcfgs)} x {tcfg.es.generations} generations "
        f"of {tcfg.es.popsize} settings x {tcfg.fitness.num_seeds} seeds ({trainings(tcfg):,} trainings each; the "
        f"search's own: {trainings(cfg):,}) in {', '.join(c.run_dir for c in tcfgs)}"
        + ("; the last for the evaluation's baseline alone (matched compute)" if cfg.baseline.matched else ""))
    runs = [_tuning_search(run.of_tuning(c)) for c in tcfgs]
    chosen, spread, rescore = _choose(cfg, tcfg, runs, run.shown) if len(runs) > 1 else (0, {}, 0)
    best = runs[chosen]
    tuned = {"hyperparameters": best["hyperparameters"], "configured": best["configured"],
             "search_space": dict(cfg.baseline.tune), "tasks": best["tasks"], "picked": best["picked"],
             "fitness": best["fitness"], "fitness_ci95": best["fitness_ci95"],   # the pick's on fresh seeds
             "fitness_ci95_best_of": best["fitness_ci95_best_of"],
             "trainings": sum(r["trainings"] for r in runs[:n]) + rescore * n * (len(runs) > 1),
             "search_trainings": trainings(cfg, pick=True), "seed": best["seed"],
             "seconds": sum(r["seconds"] for r in runs), "run_dir": best["run_dir"],
             **spread}
    # every tuning a side uses: the search's start and the evaluation's baseline (matched compute)
    used = sorted({chosen, spread.get("matched", {}).get("chosen", chosen)})
    tuned["warnings"] = [w for i in used for w in search_warnings(cfg.baseline.tune, runs[i]["hyperparameters"],
                                                                  runs[i]["history"], name=runs[i]["run_dir"],
                                                                  field=tuning_field)]
    if run.writes:
        run_dir.tuned.write(tuned)
    say("tuned baseline: " + ", ".join(f"{k} {v:.4g} (configured {tuned['configured'][k]:.4g})"
                                       for k, v in tuned["hyperparameters"].items())
        + f"; {tuned['trainings']:,} trainings in {tuned['seconds']:.0f} s")
    if spread:
        matched = runs[spread["matched"]["chosen"]]["run_dir"] if "matched" in spread else None
        say(f"tuned baseline: {spread['chosen_by']}: "
            + "; ".join(f"{r['run_dir']} {r['fresh_fitness']:.3f} {bracket(r['fresh_ci95_best_of'])}"
                        for r in runs)
            + f" (adjusted for the best of {n}); {best['run_dir']} chosen"
            + (f", {matched} the evaluation's (matched compute)" if matched else ""))
    for warning in tuned["warnings"]:
        say(f"warning: tuned baseline: {warning}")
    return tuned


def _tuning_search(run: Run) -> dict:
    """One tuning search in its own directory (continued after a kill), with its reference and pick."""
    tcfg, tdir, t = run.cfg, run.run_dir, time.perf_counter()
    if run.writes:
        tdir.path.mkdir(exist_ok=True)
    task = build_task(tcfg)
    with run.logger(task) as logger:
        searched, picked, evo = search_and_pick(run, task, logger)
        logger.summary = searched.summary()
    earlier = sum(r.get("seconds", 0.0) for r in searched.history[:searched.start])  # generations a killed session ran
    meta, info = tdir.read_best(task.template)
    return {"hyperparameters": task.kind.values(task.component, meta), "run_dir": tdir.path.name, "seed": tcfg.seed,
            "configured": {name: float(getattr(task.inner_config, name)) for name in task.component.names},
            "tasks": task.names, "picked": info.get("picked", "best member"),
            "fitness": info.get("validation_fitness", info.get("fitness")),
            "fitness_ci95": info.get("validation_ci95"), "fitness_ci95_best_of": info.get("validation_ci95_best_of"),
            "trainings": trainings(tcfg) + (picked["trainings"] if picked else 0),
            "seconds": time.perf_counter() - t + earlier, "history": searched.history, "meta": meta, "evo": evo}


def _choose(cfg: RunConfig, tcfg: RunConfig, runs: list, shown: bool) -> tuple[int, dict, int]:
    """``(chosen, spread, rescore)``: the best of the first ``baseline.tunings`` points, rescored on fresh seeds by
    the first tuning's evolution (the searches differ only in their seeds and directories)."""
    n, seeds, evo = cfg.baseline.tunings, tcfg.fitness.validation_seeds, runs[0]["evo"]
    candidates = jax.tree.map(lambda *leaves: np.stack(leaves), *[r["meta"] for r in runs])
    fitness, per_seed = _rescore(evo, candidates, streams.stream(tcfg.seed, "tunings", seeds),
                                 f"{len(runs)} tuned points", shown)
    rescore, chosen = seeds * (1 + evo.paired), best_finite(fitness[:n])
    # the chosen tuning is the best of n: intervals at 1 - 0.05/n (Bonferroni) still cover it after the choice
    for r, f, scores in zip(runs, fitness, per_seed):
        r.update(fresh_fitness=float(f), fresh_ci95=t_bounds(scores),
                 fresh_ci95_best_of=t_bounds(scores, level=1 - 0.05 / n))
    spread = {"chosen": chosen, "chosen_by": f"the best of {n} tunings on {cfg.fitness.validation_seeds} "
              "fresh seeds", "spread": {key: [min(values), max(values)] for key, values in (
                  ("fresh_fitness", [r["fresh_fitness"] for r in runs]),
                  *((name, [r["hyperparameters"][name] for r in runs]) for name in cfg.baseline.tune))},
              "tunings": [{k: v for k, v in r.items() if k not in ("meta", "history", "evo")} for r in runs]}
    if cfg.baseline.matched:   # the evaluation's baseline: tuned with the search's trainings on top
        spread["matched"] = {"chosen": best_finite(fitness), "hyperparameters": runs[best_finite(fitness)][
            "hyperparameters"], "trainings": sum(r["trainings"] for r in runs) + rescore * len(runs)}
    return chosen, spread, rescore


def _rescore(evo: Evolution, candidates, keys, what: str, shown: bool) -> tuple:
    with progress(f"scoring {what} on {len(keys)} fresh seeds", enabled=shown):
        return jax.device_get(compilation.compile_program(jax.jit(evo.rescore), candidates, keys)(candidates, keys))


def tuning_field(name: str) -> str:
    """A tuning search's setting as the run's config names it: ``search.lr`` is ``baseline.tune.lr``."""
    return "baseline." + name.replace("search.", "tune.")


def pick(run: Run, task: TaskSet, evo: Evolution, state, message: Callable[[str], None]) -> dict:
    """Score the best members and the mean again on unused seeds (noise flattered the best most); export the best."""
    cfg, run_dir = run.cfg, run.run_dir
    report = _picked_earlier(run_dir, int(state.generation), cfg.fitness.validation_seeds)
    if report is not None:
        _say_pick(report, message, "picked earlier")
        return report
    top_fitness, top_generation = (np.asarray(jax.device_get(x)) for x in (state.top_fitness, state.top_generation))
    found, candidates = evo.candidates(state, cfg.fitness.validation_top)
    keys = streams.stream(cfg.seed, "validation", cfg.fitness.validation_seeds)
    fitness, per_seed = _rescore(evo, candidates, keys, f"{len(found) + 1} candidates", run.shown)
    labels = [f"top {i + 1}" for i in found] + ["search mean"]
    search_fitness = [float(top_fitness[i]) for i in found] + [None]
    generation = [int(top_generation[i]) for i in found] + [int(state.generation)]
    # The picked candidate is the best of k on these seeds: its interval at 1 - 0.05/k (Bonferroni) holds
    # for all k at once, so it still covers the pick's true fitness after the choice.
    rows = [{"candidate": label, "generation": g, "search_fitness": f, "validation_fitness": float(v),
             "validation_ci95": t_bounds(s), "validation_ci95_best_of": t_bounds(s, level=1 - 0.05 / len(labels))}
            for label, g, f, v, s in zip(labels, generation, search_fitness, fitness, per_seed)]
    best = best_finite(fitness)
    report = {"seeds": len(keys), "stream": streams.STREAMS["validation"], "candidates": rows, "picked": labels[best],
              "trainings": len(labels) * len(keys) * (1 + (cfg.fitness.control == "paired"))}
    if run.writes:
        run_dir.write_best(jax.tree.map(lambda x: x[best], candidates), {
            **best_info(cfg, task, generation[best], search_fitness[best]), "picked": labels[best],
            **{key: rows[best][key] for key in ("validation_fitness", "validation_ci95", "validation_ci95_best_of")}})
        run_dir.validation.write(report)
    _say_pick(report, message, "picked")
    return report


def _picked_earlier(run_dir: RunDir, generation: int, seeds: int) -> Optional[dict]:
    """validation.json's pick if made at ``generation`` (its last candidate's, the mean's) on ``seeds`` seeds (a
    resume may change fitness.validation_seeds to pick again) and exported; else None."""
    report = run_dir.validation.read()
    if report is None or report["candidates"][-1]["generation"] != generation or report["seeds"] != seeds:
        return None
    try:
        _, info = run_dir.read_best()
    except CheckpointError:
        return None
    return report if info.get("picked") == report["picked"] else None


def _say_pick(report: dict, message: Callable[[str], None], verb: str) -> None:
    rows = report["candidates"]
    chosen = next(r for r in rows if r["candidate"] == report["picked"])
    # the interval adjusted for the choice (Bonferroni over the candidates): the unadjusted one flatters the best
    message(f"{verb} on {report['seeds']} fresh seeds: {report['picked']}, fitness {chosen['validation_fitness']:.3f} "
            f"{bracket(chosen['validation_ci95_best_of'])} (adjusted for the best of {len(rows)}; "
            + "; ".join(f"{r['candidate']} {r['validation_fitness']:.3f}" for r in rows)
            + "); exported, validation.json has each")
