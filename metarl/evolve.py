"""``python -m metarl.evolve experiment=NAME [key=value ...]``: evolve a part of an RL algorithm.

    python -m metarl.evolve experiment=value_loss
    python -m metarl.evolve experiment=value_loss es.popsize=32 env=Acrobot-v1 seed=3
    python -m metarl.evolve experiment=hyperparams es.strategy=Sep_CMA_ES run_dir=checkpoints/hp
    python -m metarl.evolve resume=checkpoints/value_loss-20261122-101500 es.generations=50
    python -m metarl.evolve experiments_dir=my_experiments experiment=my_value_loss
    python -m metarl.evolve -m experiment=value_loss seed=0,1,2 env=CartPole-v1,Acrobot-v1
    python -m metarl.evolve experiment=value_loss --cfg job

A Hydra application: the config is composed by Hydra from ``experiments/NAME.yaml``; ``-m`` runs a
sweep through Hydra's sweeper and launcher (``metarl.sweep``); ``--cfg job|hydra|all`` prints the
composed config; ``hydra.KEY=VALUE`` and ``hydra/GROUP=OPTION`` set Hydra's own config. Three keys
are metarl's own, read before Hydra: ``experiment=NAME`` (the config to compose), ``resume=RUN_DIR``
(continue a run from its saved config) and ``experiments_dir=PATH`` (a folder of your own experiment
YAMLs beside the shipped ones; they may list the shipped ``base``, or any shipped experiment, in
their defaults).

Running the same command again with the same ``run_dir`` continues that run from its latest
checkpoint. Bad settings (and a checkpoint that cannot be read) exit with code 2 and one line naming
the field, before anything is compiled or written. One run at a time holds a run directory (a lock
on ``RUN_DIR/.lock``); a second is refused the same way.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
from pathlib import Path
from typing import Any, Optional

from metarl.config import CONFIG_FILE

EXIT_BAD_INPUT = 2
SPECIAL_KEYS = ("experiment", "resume", "experiments_dir")
CFG_TYPES = ("job", "hydra", "all")
OPTIONS = "-m/--multirun, --cfg job|hydra|all, --package KEY, --resolve, --help, and KEY=VALUE"
# Hydra's other command-line options, and what takes their place here.
_INSTEAD = {"--config-name": "experiment=NAME", "-cn": "experiment=NAME", "--config-path": "experiments_dir=PATH",
            "-cp": "experiments_dir=PATH", "--config-dir": "experiments_dir=PATH", "-cd": "experiments_dir=PATH"}


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


@dataclasses.dataclass
class CommandLine:
    """The command line, read before Hydra sees it: options, metarl's own keys, and overrides."""

    argv: list            # the command line as given
    args: list            # every KEY=VALUE as given (metarl's keys too): what a run's processes are started with
    special: dict         # experiment, resume, experiments_dir
    overrides: list       # the rest: the run's settings and Hydra's (hydra.*, hydra/...)
    multirun: bool = False
    cfg: Optional[str] = None
    package: Optional[str] = None
    resolve: bool = False
    help: bool = False


def parse_command_line(argv: list[str]) -> CommandLine:
    cli = CommandLine(argv=list(argv), args=[], special={}, overrides=[])
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if name in ("-m", "--multirun") and not eq:
                cli.multirun = True
            elif name in ("-h", "--help") and not eq:
                cli.help = True
            elif name == "--resolve" and not eq:
                cli.resolve = True
            elif name in ("-c", "--cfg", "-p", "--package"):
                if not eq:
                    if i == len(argv):
                        fail(f"argument {name}: expected a value; allowed: "
                             + ("--cfg job|hydra|all" if name in ("-c", "--cfg") else "--package KEY"))
                    value = argv[i]
                    i += 1
                if name in ("-c", "--cfg"):
                    if value not in CFG_TYPES:
                        fail(f"argument --cfg: {value!r}; allowed: {', '.join(CFG_TYPES)}")
                    cli.cfg = value
                else:
                    cli.package = value
            elif name in _INSTEAD:
                fail(f"argument {name}: not an option of metarl.evolve; allowed: {_INSTEAD[name]}")
            else:
                fail(f"argument {arg!r}: not an option of metarl.evolve; allowed: {OPTIONS}")
            continue
        if "=" not in arg or not arg.split("=", 1)[0].lstrip("+~"):
            fail(f"argument {arg!r}: expected key=value with a key such as es.popsize=8 "
                 "(see `python -m metarl.evolve --help`)")
        key, value = arg.split("=", 1)
        cli.args.append(arg)
        if key in SPECIAL_KEYS:
            cli.special[key] = value
        elif key == "hydra.mode":  # Hydra's other spelling of -m
            if value not in ("RUN", "MULTIRUN"):
                fail(f"hydra.mode: {value!r}; allowed: RUN, MULTIRUN (the same as -m)")
            cli.multirun = cli.multirun or value == "MULTIRUN"
            cli.args.pop()
        else:
            cli.overrides.append(arg)
    return cli


def unique_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists; made unique for good when it is created
    (``runlock.acquire_new``, or the sweep's exclusive mkdir)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{path}-{n}")
    return candidate


def missing_experiment(special: dict):
    from metarl import config as config_lib

    try:
        experiments_dir = config_lib.check_experiments_dir(special.get("experiments_dir"))
    except config_lib.ConfigError as err:
        fail(str(err))
    fail("experiment: missing; allowed: experiment=" + "|".join(config_lib.available_experiments(experiments_dir))
         + " (or resume=RUN_DIR)")


def _read_saved(run_dir: Path, field: str) -> dict:
    from metarl import config as config_lib

    try:
        return config_lib.read_saved(run_dir)
    except config_lib.ConfigError as err:
        fail(f"{field}: {err}")


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


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` has anything in it besides what is there before a run starts: the lock file,
    and what Hydra may write into a sweep job's directory first (``.hydra/``, the job's ``.log``)."""
    return run_dir.is_dir() and any(not (p.name.startswith(".") or p.name.endswith(".log"))
                                    for p in run_dir.iterdir())


def refuse_chdir(composed) -> None:
    if composed.hydra.job.chdir:
        fail("hydra.job.chdir: true; allowed: false (a run writes to its run_dir, from the directory it was "
             "started in)")


def resolve(cli: CommandLine):
    """From the command line to ``(RunConfig, run_dir, resuming, named)``, refusing anything unsafe
    and writing nothing; ``named`` says the user chose the run directory (``run_dir=`` or Hydra's
    ``hydra.run.dir=``; ``run_dir`` wins); otherwise it is ``hydra.run.dir``'s default, made unique."""
    from metarl import config as config_lib

    special, overrides = cli.special, cli.overrides
    try:
        if "resume" in special:
            hydra_keys = [o for o in overrides if config_lib.is_hydra_override(o)]
            if hydra_keys:
                fail(f"{config_lib.override_key(hydra_keys[0])}: not used by a resume, which continues in its "
                     "RUN_DIR with its saved config; allowed: the run's own settings")
            config_lib.check_run_dir(special["resume"], "resume")
            run_dir = Path(special["resume"])
            if not (run_dir / CONFIG_FILE).exists():
                fail(f"resume: {run_dir} holds no metarl run ({CONFIG_FILE} missing)")
            saved = _read_saved(run_dir, "resume")
            if "experiment" in special and special["experiment"] != saved.get("experiment"):
                fail(f"experiment: {special['experiment']!r} differs from the run's {saved.get('experiment')!r}")
            new = _apply_overrides(saved, overrides)
            new["run_dir"] = str(run_dir)
            cfg = config_lib.from_dict(new)
            _refuse_search_change(saved, cfg, run_dir)
            return cfg, run_dir, True, True

        if "experiment" not in special:
            missing_experiment(special)
        composed = config_lib.compose(special["experiment"], overrides, special.get("experiments_dir"))
        refuse_chdir(composed)
        cfg = config_lib.from_composed(composed, special.get("experiments_dir"))
        named = bool(cfg.run_dir) or any(config_lib.override_key(o) == "hydra.run.dir" for o in overrides)
        run_dir = Path(cfg.run_dir or str(composed.hydra.run.dir))
        if not named:
            run_dir = unique_dir(run_dir)
        config_lib.check_run_dir(str(run_dir))
    except config_lib.ConfigError as err:
        fail(str(err))
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    return cfg, run_dir, check_existing(cfg, run_dir), named


def check_existing(cfg, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds an earlier run of this config (to continue); refuses one of another
    config, or a directory that is not a run's."""
    if not holds_a_run(run_dir):
        return False
    if not (run_dir / CONFIG_FILE).exists():
        fail(f"run_dir: {run_dir} exists and is not a metarl run directory; allowed: a new or empty "
             "directory, or one of an earlier run of this config")
    _refuse_search_change(_read_saved(run_dir, "run_dir"), cfg, run_dir)
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


@dataclasses.dataclass
class Checked:
    task: Any                 # the run's task, built once (``metarl.tasks.build_task``)
    local_launch: bool        # this process starts the run's processes and waits for them
    num_processes: int


def check_run(cfg, setup_devices: bool = True, task: Any = None) -> Checked:
    """Every check of a run's settings that needs no run directory, reading only: the search settings,
    the packages a tracker needs, the trainer in its environment, how the population divides over the
    processes or devices, and the memory a generation needs. Raises ``ConfigError`` or ``ValueError``
    with a one-line message.

    ``setup_devices``: join the run's processes (``devices.setup``) first, as a run must before any
    JAX computation; a sweep checking its jobs before they start does not. ``task``: already built."""
    import jax

    from metarl import devices
    from metarl.config import ConfigError
    from metarl.logger import check_mlflow_installed
    from metarl.tasks import build_task, check_memory

    check_mlflow_installed(cfg.logger.mlflow)
    local_launch = devices.needs_local_launch(cfg.devices, cfg.es.popsize)
    if setup_devices and not local_launch:
        devices.setup(cfg.devices, cfg.es.popsize)  # before any JAX computation
    cfg.es.validate()
    task = task or build_task(cfg)
    if not jax.tree.leaves(task.template):
        raise ConfigError(f"component._target_: {type(task.component).__name__} has no meta-parameters (its init "
                          "returns an empty pytree), so there is nothing to evolve; allowed: a component with "
                          "meta-parameters (a fixed one, such as a distilled formula, trains through "
                          "`python -m metarl.evaluate RUN_DIR distilled=K` or in code)")
    num_processes = devices.distributed_settings(cfg.devices, cfg.es.popsize)[0]
    if local_launch:  # each process gets this one's CPU devices (one, unless JAX_NUM_CPU_DEVICES says more)
        devices.check_divides(cfg.es.popsize, num_processes * jax.local_device_count())
    else:
        devices.population_mesh(cfg.es.popsize)
    check_memory(cfg, task, devices.memory_per_device(),
                 devices.members_per_memory(cfg.es.popsize, num_processes if local_launch else 1))
    return Checked(task, local_launch, num_processes)


def execute(cfg, run_dir: Path, resuming: bool, named: bool, child_args: list[str], task: Any = None) -> int:
    """One run, from its checked config to its end: the remaining checks, the run directory's lock,
    then the run itself (here, or in the processes it starts with ``child_args``). Returns the exit
    code; bad input exits (``fail``) before anything is written."""
    from metarl import config as config_lib
    from metarl.checkpoints import CheckpointError
    from metarl.config import ConfigError

    # 1. Every check, reading only: the config, the trainer in its environment, the devices, the
    #    memory a generation needs, and the checkpoint a resume starts from. Nothing is written.
    try:
        checked = check_run(cfg, task=task)
        task, local_launch, num_processes = checked.task, checked.local_launch, checked.num_processes
        from metarl import runner

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

    from metarl import devices, runlock
    from metarl.logger import say

    lock, refused = None, None
    if local_launch or jax.process_index() == 0:
        try:
            lock = runlock.acquire(run_dir) if named or resuming else runlock.acquire_new(run_dir)
        except runlock.RunDirLocked as err:
            refused = str(err)
    try:
        stop = refused is not None
        if not local_launch:  # every process of a multi-host run stops, not only process 0 (the rest would wait)
            stop = bool(devices.agree(int(stop), "run_dir_lock"))
        if stop:
            fail(refused or f"run_dir: {run_dir} is in use by another run (see process 0)")
        if lock is not None:
            if lock.run_dir != run_dir:  # a default name taken by a run started in the same second
                run_dir = lock.run_dir
                cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
                child_args = [*child_args, f"run_dir={run_dir}"]
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

            return launch(child_args, num_processes, lock=lock, verbose=cfg.logger.verbose)

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


def run_one(cli: CommandLine) -> int:
    cfg, run_dir, resuming, named = resolve(cli)
    # The processes of a local launch compose the same config, in the same run directory.
    child_args = cli.args if "resume" in cli.special else [*cli.args, f"run_dir={run_dir}"]
    return execute(cfg, run_dir, resuming, named, child_args)


def show_config(cli: CommandLine) -> int:
    """``--cfg job|hydra|all``: the composed config, checked, as Hydra prints it (``--package KEY``: one
    part of it; ``--resolve``: interpolations resolved)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import Container, OmegaConf

    from metarl import config as config_lib

    if cli.multirun:
        fail("--cfg: shows one run's config; allowed: --cfg without -m, with one value per key")
    if "resume" in cli.special:
        fail("--cfg: shows a config composed from an experiment; allowed: experiment=NAME (a run's own config "
             f"is RUN_DIR/{CONFIG_FILE})")
    if "experiment" not in cli.special:
        missing_experiment(cli.special)
    experiments_dir = cli.special.get("experiments_dir")
    try:
        app = config_lib.hydra_app(config_lib.check_experiments_dir(experiments_dir))
        composed = config_lib.compose(cli.special["experiment"], cli.overrides, experiments_dir, app=app)
        config_lib.from_composed(composed, experiments_dir)  # the same checks as a run's
    except config_lib.ConfigError as err:
        fail(str(err))
    HydraConfig.instance().set_config(composed)  # for ${hydra:...} interpolations
    shown = app.get_sanitized_cfg(composed, cli.cfg)
    if cli.package not in (None, "_global_"):
        shown = OmegaConf.select(shown, cli.package)
        if shown is None:
            fail(f"--package: {cli.package!r} is not in the config; allowed: a key of it, such as es")
        print(f"# @package {cli.package}")
    if not isinstance(shown, Container):
        print(shown)
        return 0
    if cli.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))
    return 0


def help_text(cli: CommandLine) -> str:
    """``--help``: how to call it, the experiments, Hydra's launchers and sweepers, and every key with its
    default (of ``experiments/base.yaml``, or of the experiment named on the same line)."""
    from metarl import config as config_lib
    from metarl.config import ConfigError

    from hydra.types import RunMode
    from omegaconf import OmegaConf

    experiment = cli.special.get("experiment")
    try:
        experiments_dir = config_lib.check_experiments_dir(cli.special.get("experiments_dir"))
        app = config_lib.hydra_app(experiments_dir)
        if experiment:
            composed = config_lib.compose(experiment, [], experiments_dir, app=app)
        else:  # base.yaml itself, which is no experiment
            composed = app.compose_config("base", [], run_mode=RunMode.RUN, with_log_configuration=False)
    except ConfigError as err:
        fail(str(err))
    data = OmegaConf.to_container(composed, resolve=False)
    data.pop("hydra", None)
    lines = ["python -m metarl.evolve: evolve a part of an RL algorithm (a Hydra application).", "",
             "usage:",
             "  python -m metarl.evolve experiment=NAME [KEY=VALUE ...]             one run",
             "  python -m metarl.evolve -m experiment=NAME KEY=A,B [KEY=C,D ...]     a sweep: one run per combination",
             "  python -m metarl.evolve resume=RUN_DIR [KEY=VALUE ...]              continue a run",
             "  python -m metarl.evolve experiment=NAME [KEY=VALUE ...] --cfg job|hydra|all [--package KEY] [--resolve]",
             "  python -m metarl.evolve [experiment=NAME] --help",
             "",
             "run_dir=PATH names the run's directory (default: hydra.run.dir, a new one under checkpoints/); in a",
             "sweep it names the sweep's directory (hydra.sweep.dir), with each job's run in PATH/0, PATH/1, ...",
             "and summary.csv / summary.json written when the sweep ends. experiments_dir=PATH adds a folder of",
             "your own experiment YAMLs.",
             "",
             "experiments (experiment=NAME): " + ", ".join(config_lib.available_experiments(experiments_dir)),
             "launchers (with -m, hydra/launcher=NAME): " + ", ".join(
                 sorted(app.config_loader.get_group_options("hydra/launcher"))),
             "sweepers (with -m, hydra/sweeper=NAME): " + ", ".join(
                 sorted(app.config_loader.get_group_options("hydra/sweeper"))),
             "",
             f"keys, with the values of {'experiment ' + experiment if experiment else 'experiments/base.yaml'}"
             " (any of them as KEY=VALUE; hydra.KEY=VALUE for Hydra's, see --cfg hydra):"]
    lines += [f"  {key}={config_lib.show_value(value)}" for key, value in config_lib.flatten(data).items()
              if value != "???"]
    fields = _trainer_fields(data.get("inner") or {})
    if fields:
        name, defaults = fields
        lines.append(f"  inner.*: any field of the trainer's config, {name}:")
        lines += [f"    inner.{key}={config_lib.show_value(value)}" for key, value in defaults.items()
                  if key not in (data.get("inner") or {})]
    lines.append("  component.*: the learned component's arguments (component._target_ names its class)")
    return "\n".join(lines)


def _trainer_fields(inner: dict):
    """``(class name, {field: default})`` of the trainer's config class, or None if it cannot be found."""
    from metarl.outer_loops import plugins
    from metarl.tasks import TRAINERS

    target = inner.get(plugins.TARGET) or TRAINERS.get(inner.get("algo", "ppo"))
    try:
        cls = plugins.locate(target, "inner._target_")
    except Exception:
        return None
    if not dataclasses.is_dataclass(cls):
        return None
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.name == "env":
            continue
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return cls.__name__, {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}


def main(argv: list[str] | None = None) -> int:
    from metarl.launch import die_with_launcher

    die_with_launcher()  # a process of a local launch: ends with its parent, however that ends
    argv = sys.argv[1:] if argv is None else argv
    cli = parse_command_line(argv)
    if cli.help:
        print(help_text(cli))
        return 0
    if cli.resolve and not cli.cfg:
        fail("--resolve: used with --cfg only; allowed: --cfg job|hydra|all --resolve")
    if cli.package and not cli.cfg:
        fail("--package: used with --cfg only; allowed: --cfg job|hydra|all --package KEY")
    if cli.cfg:
        return show_config(cli)
    if cli.multirun:
        from metarl import sweep

        return sweep.run(cli)
    return run_one(cli)


if __name__ == "__main__":
    sys.exit(main())
