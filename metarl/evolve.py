"""``python -m metarl.evolve experiment=NAME [key=value ...]``: evolve a part of an RL algorithm.

    python -m metarl.evolve experiment=value_loss
    python -m metarl.evolve experiment=value_loss es.popsize=32 env=Acrobot-v1 seed=3
    python -m metarl.evolve experiment=hyperparams es.strategy=Sep_CMA_ES run_dir=checkpoints/hp
    python -m metarl.evolve resume=checkpoints/value_loss-20261122-101500 es.generations=50
    python -m metarl.evolve experiments_dir=my_experiments experiment=my_value_loss

``experiments_dir=PATH`` adds a folder of your own experiment YAMLs beside the shipped ones; they
may list the shipped ``base`` (or any shipped experiment) in their defaults.

Running the same command again with the same ``run_dir`` continues that run from its latest
checkpoint; ``resume=RUN_DIR`` continues a run from its saved config. Bad settings (and a checkpoint
that cannot be read) exit with code 2 and one line naming the field, before anything is written.
One run at a time holds a run directory (a lock on ``RUN_DIR/.lock``); a second is refused the same way.
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
        if "=" not in arg or arg.startswith("-") or not arg.split("=", 1)[0].lstrip("+~"):
            fail(f"argument {arg!r}: expected key=value with a key such as es.popsize=8 "
                 "(see `python -m metarl.evolve --help`)")
        key, value = arg.split("=", 1)
        if key in ("experiment", "resume", "experiments_dir"):
            special[key] = value
        else:
            overrides.append(arg)
    return special, overrides


def default_run_dir(experiment: str) -> Path:
    """A fresh name under checkpoints/; made unique for good when it is created (``runlock.acquire_new``)."""
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

    from metarl import config as config_lib

    # Hydra's reading of each value, as on a first run, so a value means the same on a resume.
    merged = OmegaConf.create(saved)
    for override in config_lib.parse_overrides(overrides):
        try:
            OmegaConf.update(merged, override.key_or_group, override.value(), merge=True)
        except OmegaConfBaseException as err:
            fail(f"{override.key_or_group}: {str(err).splitlines()[0]}")
    return OmegaConf.to_container(merged, resolve=True)


def _holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` has anything in it besides the lock file of a run that never started."""
    from metarl.runlock import LOCK_FILE

    return run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())


def resolve(argv: list[str]):
    """From the command line to ``(RunConfig, run_dir, resuming, named)``, refusing anything unsafe
    and writing nothing; ``named`` says the user chose the run directory."""
    from metarl import config as config_lib

    special, overrides = split_args(argv)
    if "resume" in special:
        config_lib.check_run_dir(special["resume"], "resume")
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
        return cfg, run_dir, True, True

    if "experiment" not in special:
        fail("experiment: missing; allowed: experiment=" + "|".join(
            config_lib.available_experiments(config_lib.check_experiments_dir(special.get("experiments_dir"))))
             + " (or resume=RUN_DIR)")
    cfg = config_lib.load(special["experiment"], overrides, special.get("experiments_dir"))
    named = bool(cfg.run_dir)
    run_dir = Path(cfg.run_dir) if named else default_run_dir(cfg.experiment)
    config_lib.check_run_dir(str(run_dir))
    import dataclasses

    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    return cfg, run_dir, check_existing(cfg, run_dir), named


def check_existing(cfg, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds an earlier run of this config (to continue); refuses one of another
    config, or a directory that is not a run's."""
    if not _holds_a_run(run_dir):
        return False
    if not (run_dir / CONFIG_FILE).exists():
        fail(f"run_dir: {run_dir} exists and is not a metarl run directory; allowed: a new or empty "
             "directory, or one of an earlier run of this config")
    _refuse_search_change(_read_saved(run_dir), cfg, run_dir)
    return True


def _refuse_search_change(saved: dict, cfg, run_dir: Path):
    from metarl import config as config_lib

    diffs = config_lib.search_differences(saved, cfg.to_dict())
    if diffs:
        fail(f"run_dir: {run_dir} holds a run whose search differs ({'; '.join(diffs)}); allowed: the same "
             "settings (es.generations, logger.*, checkpoint.* and devices.* may change), or a new run_dir")


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
    import dataclasses

    from metarl.checkpoints import CheckpointError
    from metarl.config import ConfigError

    # 1. Every check, reading only: the config, the trainer in its environment, the devices, the
    #    memory a generation needs, and the checkpoint a resume starts from. Nothing is written.
    try:
        cfg, run_dir, resuming, named = resolve(argv)
        from metarl import devices

        local_launch = devices.needs_local_launch(cfg.devices, cfg.es.popsize)
        if not local_launch:
            devices.setup(cfg.devices, cfg.es.popsize)  # before any JAX computation
        from metarl import runner
        from metarl.tasks import build_task, check_memory

        runner.es_config(cfg).validate()
        task = build_task(cfg)
        num_processes = devices.distributed_settings(cfg.devices, cfg.es.popsize)[0]
        if local_launch:
            devices.check_divides(cfg.es.popsize, num_processes)  # one CPU device per process
        else:
            devices.population_mesh(cfg.es.popsize)
        check_memory(cfg, task, devices.memory_per_device(),
                     devices.members_per_memory(cfg.es.popsize, num_processes if local_launch else 1))
        before = _fingerprint(run_dir)
        prepared = None
        if not local_launch:
            prepared = runner.prepare(cfg, run_dir, task=task)
        elif (run_dir / "ckpt").is_dir():  # the children restore it; the parent only checks it can
            runner.prepare(cfg, run_dir, mesh=None, task=task)
    except (ConfigError, ValueError, CheckpointError) as err:
        fail(str(err).splitlines()[0])

    # 2. The run directory, exclusively: a second run on it is refused here, having changed nothing.
    import jax

    from metarl import runlock

    lock, refused = None, None
    if local_launch or jax.process_index() == 0:
        try:
            lock = runlock.acquire(run_dir) if named or resuming else runlock.acquire_new(run_dir)
        except runlock.RunDirLocked as err:
            refused = str(err)
    stop = refused is not None
    if not local_launch:  # every process of a multi-host run stops, not only process 0 (the rest would wait)
        stop = bool(devices.agree(int(stop), "run_dir_lock"))
    if stop:
        fail(refused or f"run_dir: {run_dir} is in use by another run (see process 0)")
    if lock is not None:
        if lock.run_dir != run_dir:  # a default name taken by a run started in the same second
            run_dir = lock.run_dir
            cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
        elif _fingerprint(run_dir) != before:
            # Another run wrote here between the checks and the lock (and has ended): check again.
            try:
                resuming = check_existing(cfg, run_dir)
                if not local_launch:
                    prepared = runner.prepare(cfg, run_dir, task=task)
            except CheckpointError as err:
                fail(str(err).splitlines()[0])

    if local_launch:  # every process gets the same arguments and the same run directory, and the lock
        from metarl.launch import launch

        resume_arg = any(a.startswith("resume=") for a in argv)
        return launch(argv if resume_arg else [*argv, f"run_dir={run_dir}"], num_processes, lock_fd=lock.fd)

    if jax.process_index() == 0:
        write_config(cfg, run_dir)
        print(f"run directory: {run_dir}", flush=True)
    try:
        summary = runner.run(cfg, run_dir, prepared=prepared)
    except runner.Interrupted as stop:
        if jax.process_index() == 0:  # every process stops after the same generation; one says so
            print(f"stopped by {signal.Signals(stop.signum).name} after generation {stop.generation}; checkpoint "
                  f"saved. Continue with: python -m metarl.evolve resume={run_dir}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    except CheckpointError as err:
        fail(str(err))
    if jax.process_index() == 0:
        print(f"done: {summary['generations']} generations; mean fitness {summary['first_mean']:.2f} -> "
              f"{summary['last_mean']:.2f}; best {summary['best_so_far']:.2f}; results in {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
