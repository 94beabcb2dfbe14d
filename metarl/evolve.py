"""``python -m metarl.evolve experiment=NAME [key=value ...]``: evolve a part of an RL algorithm.

    python -m metarl.evolve experiment=value_loss
    python -m metarl.evolve experiment=value_loss es.popsize=32 env=Acrobot-v1 seed=3
    python -m metarl.evolve experiment=hyperparams es.strategy=Sep_CMA_ES run_dir=checkpoints/hp
    python -m metarl.evolve resume=checkpoints/value_loss-20261122-101500 es.generations=50
    python -m metarl.evolve experiments_dir=my_experiments experiment=my_value_loss

``experiments_dir=PATH`` adds a folder of your own experiment YAMLs beside the shipped ones; they
may list the shipped ``base`` (or any shipped experiment) in their defaults.

Running the same command again with the same ``run_dir`` continues that run from its latest
checkpoint; ``resume=RUN_DIR`` continues a run from its saved config. Bad settings exit with code 2
and one line naming the field, before anything is compiled or written.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
from pathlib import Path

USAGE = __doc__
CONFIG_FILE = "config.yaml"
EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def split_args(argv: list[str]) -> tuple[dict, list[str]]:
    special, overrides = {}, []
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            fail(f"argument {arg!r}: expected key=value (see `python -m metarl.evolve --help`)")
        key, value = arg.split("=", 1)
        if key in ("experiment", "resume", "experiments_dir"):
            special[key] = value
        else:
            overrides.append(arg)
    return special, overrides


def default_run_dir(experiment: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("checkpoints") / f"{experiment}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    return path


def _read_saved(run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(run_dir / CONFIG_FILE), resolve=True)
    except Exception as err:
        fail(f"resume: {run_dir / CONFIG_FILE} is unreadable ({type(err).__name__})")


def _apply_overrides(saved: dict, overrides: list[str]) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.create(saved), OmegaConf.from_dotlist(overrides))
    except OmegaConfBaseException as err:
        fail(f"overrides: {str(err).splitlines()[0]}")
    return OmegaConf.to_container(merged, resolve=True)


def resolve(argv: list[str]):
    """From the command line to ``(RunConfig, run_dir, resuming)``, refusing anything unsafe."""
    from metarl import config as config_lib

    special, overrides = split_args(argv)
    if "resume" in special:
        run_dir = Path(special["resume"])
        if not (run_dir / CONFIG_FILE).exists():
            fail(f"resume: {run_dir} holds no metarl run ({CONFIG_FILE} missing)")
        saved = _read_saved(run_dir)
        if "experiment" in special and special["experiment"] != saved.get("experiment"):
            fail(f"experiment: {special['experiment']!r} differs from the run's {saved.get('experiment')!r}")
        new = _apply_overrides(saved, overrides)
        new["run_dir"] = str(run_dir)
        cfg = config_lib.from_dict(new)
        _refuse_search_change(saved, cfg, run_dir)
        return cfg, run_dir, True

    if "experiment" not in special:
        fail("experiment: missing; allowed: experiment=" + "|".join(
            config_lib.available_experiments(config_lib.check_experiments_dir(special.get("experiments_dir"))))
             + " (or resume=RUN_DIR)")
    cfg = config_lib.load(special["experiment"], overrides, special.get("experiments_dir"))
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.experiment)
    resuming = False
    if run_dir.exists() and any(run_dir.iterdir()):
        if not (run_dir / CONFIG_FILE).exists():
            fail(f"run_dir: {run_dir} exists and is not a metarl run directory; allowed: a new or empty "
                 "directory, or one of an earlier run of this config")
        _refuse_search_change(_read_saved(run_dir), cfg, run_dir)
        resuming = True
    import dataclasses

    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    return cfg, run_dir, resuming


def _refuse_search_change(saved: dict, cfg, run_dir: Path):
    from metarl import config as config_lib

    diffs = config_lib.search_differences(saved, cfg.to_dict())
    if diffs:
        fail(f"run_dir: {run_dir} holds a run whose search differs ({'; '.join(diffs)}); allowed: the same "
             "settings (es.generations, logger.*, checkpoint.* and devices.* may change), or a new run_dir")


def write_config(cfg, run_dir: Path) -> None:
    from omegaconf import OmegaConf

    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (CONFIG_FILE + ".tmp")
    OmegaConf.save(OmegaConf.create(cfg.to_dict()), tmp)
    os.replace(tmp, run_dir / CONFIG_FILE)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    from metarl.checkpoints import CheckpointError
    from metarl.config import ConfigError

    try:
        cfg, run_dir, resuming = resolve(argv)
        from metarl import devices

        local_launch = devices.needs_local_launch(cfg.devices, cfg.es.popsize)
        if not local_launch:
            devices.setup(cfg.devices, cfg.es.popsize)  # before any JAX computation
        from metarl.runner import Interrupted, es_config, run
        from metarl.tasks import build_task

        # Every remaining check, before compiling or writing anything.
        es_config(cfg).validate()
        build_task(cfg)
        if local_launch:
            num_processes = devices.distributed_settings(cfg.devices, cfg.es.popsize)[0]
            devices.check_divides(cfg.es.popsize, num_processes)  # one CPU device per process
        else:
            devices.population_mesh(cfg.es.popsize)
    except (ConfigError, ValueError) as err:
        fail(str(err).splitlines()[0])
    if local_launch:  # every process gets the same arguments and the same run directory
        from metarl.launch import launch

        resume_arg = any(a.startswith("resume=") for a in argv)
        return launch(argv if resume_arg else [*argv, f"run_dir={run_dir}"], num_processes)

    import jax

    if jax.process_index() == 0:
        write_config(cfg, run_dir)
        print(f"run directory: {run_dir}", flush=True)
    try:
        summary = run(cfg, run_dir)
    except Interrupted as stop:
        if jax.process_index() == 0:  # every process stops after the same generation; one says so
            print(f"stopped by {signal.Signals(stop.signum).name} after generation {stop.generation}; checkpoint "
                  f"saved. Continue with: python -m metarl.evolve resume={run_dir}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    except CheckpointError as err:
        fail(str(err), code=1)
    if jax.process_index() == 0:
        print(f"done: {summary['generations']} generations; mean fitness {summary['first_mean']:.2f} -> "
              f"{summary['last_mean']:.2f}; best {summary['best_so_far']:.2f}; results in {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
