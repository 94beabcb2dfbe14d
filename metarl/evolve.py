"""``python -m metarl.evolve experiment=NAME [key=value ...]``: evolve a part of an RL algorithm.

A Hydra application (docs/sweeps.md): the config is composed from ``experiments/NAME.yaml``; ``-m``
runs a sweep (``metarl.sweep``); ``--cfg job|hydra|all`` prints the composed config. Three keys are
read before Hydra: ``experiment=NAME``, ``resume=RUN_DIR`` and ``experiments_dir=PATH``. Bad settings
exit with code 2 and one line naming the field, before anything is compiled or written.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

from metarl import config as config_lib
from metarl.cli import _refuse_search_change, check_existing, fail, refuse_chdir
from metarl.config import CONFIG_FILE, ConfigError
from metarl.inner_loops import plugins
from metarl.runlock import unique_dir

SPECIAL_KEYS = ("experiment", "resume", "experiments_dir")
CFG_TYPES = ("job", "hydra", "all")
OPTIONS = "-m/--multirun, --cfg job|hydra|all, --package KEY, --resolve, --help, and KEY=VALUE"
_FLAGS = {"-m": "multirun", "--multirun": "multirun", "-h": "help", "--help": "help", "--resolve": "resolve"}
_VALUED = {"-c": "cfg", "--cfg": "cfg", "-p": "package", "--package": "package"}   # options with a value
# Hydra's other command-line options, and what takes their place here.
_INSTEAD = {"--config-name": "experiment=NAME", "-cn": "experiment=NAME", "--config-path": "experiments_dir=PATH",
            "-cp": "experiments_dir=PATH", "--config-dir": "experiments_dir=PATH", "-cd": "experiments_dir=PATH"}


@dataclasses.dataclass
class CommandLine:
    """The command line, read before Hydra sees it: options, metarl's own keys, and overrides."""

    argv: list            # the command line as given
    special: dict         # experiment, resume, experiments_dir
    overrides: list       # the rest: the run's settings and Hydra's (hydra.*, hydra/...)
    experiments_dir: Optional[str] = None   # special["experiments_dir"], checked and absolute
    multirun: bool = False
    cfg: Optional[str] = None
    package: Optional[str] = None
    resolve: bool = False
    help: bool = False


def parse_command_line(argv: list[str]) -> CommandLine:
    cli = CommandLine(argv=list(argv), special={}, overrides=[])
    rest = iter(argv)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if arg.startswith("-"):
            option = _VALUED.get(name)
            if name in _FLAGS and not eq:
                setattr(cli, _FLAGS[name], True)
            elif option:
                value = value if eq else next(rest, None)
                if value is None:
                    fail(f"argument {name}: expected a value; allowed: --{option} "
                         + ("job|hydra|all" if option == "cfg" else "KEY"))
                if option == "cfg" and value not in CFG_TYPES:
                    fail(f"argument --cfg: {value!r}; allowed: {', '.join(CFG_TYPES)}")
                setattr(cli, option, value)
            elif name in _INSTEAD:
                fail(f"argument {name}: not an option of metarl.evolve; allowed: {_INSTEAD[name]}")
            else:
                fail(f"argument {arg!r}: not an option of metarl.evolve; allowed: {OPTIONS}")
        elif not eq or not name.lstrip("+~"):
            fail(f"argument {arg!r}: expected key=value with a key such as es.popsize=8 "
                 "(see `python -m metarl.evolve --help`)")
        elif name == "hydra.mode":  # Hydra's other spelling of -m
            if value not in ("RUN", "MULTIRUN"):
                fail(f"hydra.mode: {value!r}; allowed: RUN, MULTIRUN (the same as -m)")
            cli.multirun = cli.multirun or value == "MULTIRUN"
        elif name in SPECIAL_KEYS:
            cli.special[name] = value
        else:
            cli.overrides.append(arg)
    cli.experiments_dir = config_lib.check_experiments_dir(cli.special.get("experiments_dir"))
    return cli


def _compose(cli: CommandLine):
    """Hydra's composition of the command line's experiment and overrides, Hydra's section included."""
    with config_lib.hydra_context(cli.experiments_dir):
        return config_lib.compose(cli.special["experiment"], cli.overrides, cli.experiments_dir)


def resolve(cli: CommandLine):
    """From the command line to ``(RunConfig, run_dir, resuming, named)``, refusing anything unsafe
    and writing nothing; ``named`` says the user chose the run directory (``run_dir=`` or Hydra's
    ``hydra.run.dir=``; ``run_dir`` wins); otherwise it is ``hydra.run.dir``'s default, made unique."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    special, overrides = cli.special, cli.overrides
    if "resume" in special:
        hydra_keys = [o for o in overrides if config_lib.is_hydra_override(o)]
        if hydra_keys:
            fail(f"{config_lib.override_key(hydra_keys[0])}: not used by a resume, which continues in its "
                 "RUN_DIR with its saved config; allowed: the run's own settings")
        config_lib.check_run_dir(special["resume"], "resume")
        run_dir = Path(special["resume"])
        saved = config_lib.read_saved(run_dir, "resume")
        if "experiment" in special and special["experiment"] != saved.get("experiment"):
            fail(f"experiment: {special['experiment']!r} differs from the run's {saved.get('experiment')!r}")
        # Hydra's reading of each value, as on a first run, so a value means the same on a resume.
        merged = OmegaConf.create(saved)
        for override in config_lib.parse_overrides(overrides):
            try:
                OmegaConf.update(merged, override.key_or_group, override.value(), merge=True)
            except OmegaConfBaseException as err:
                fail(f"{override.key_or_group}: {str(err).splitlines()[0]}")
        cfg = config_lib.from_dict({**OmegaConf.to_container(merged, resolve=True), "run_dir": str(run_dir)})
        _refuse_search_change(saved, cfg, run_dir)
        return cfg, run_dir, True, True

    composed = _compose(cli)
    refuse_chdir(composed)
    cfg = config_lib.from_composed(composed, cli.experiments_dir)
    named = bool(cfg.run_dir) or any(config_lib.override_key(o) == "hydra.run.dir" for o in overrides)
    run_dir = Path(cfg.run_dir or str(composed.hydra.run.dir))
    if not named:
        run_dir = unique_dir(run_dir)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    return cfg, run_dir, check_existing(cfg, run_dir), named


def show_config(cli: CommandLine) -> int:
    """``--cfg job|hydra|all``: the composed config, checked, as Hydra prints it (``--package KEY``: one
    part of it; ``--resolve``: interpolations resolved)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import Container, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if cli.multirun:
        fail("--cfg: shows one run's config; allowed: --cfg without -m, with one value per key")
    if "resume" in cli.special:
        fail("--cfg: shows a config composed from an experiment; allowed: experiment=NAME (a run's own config "
             f"is RUN_DIR/{CONFIG_FILE})")
    composed = _compose(cli)
    config_lib.from_composed(composed, cli.experiments_dir)  # the same checks as a run's
    HydraConfig.instance().set_config(composed)  # for ${hydra:...} interpolations
    shown = {"all": composed, "job": OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"]),
             "hydra": OmegaConf.create({"hydra": OmegaConf.masked_copy(  # without its help texts, as Hydra shows it
                 composed.hydra, [k for k in composed.hydra if k not in ("help", "hydra_help")])})}[cli.cfg]
    if cli.resolve:
        try:
            shown = OmegaConf.create(OmegaConf.to_container(
                shown if cli.cfg == "job" else composed, resolve=True))  # Hydra's keys refer to the job's
            if cli.cfg == "hydra":
                shown = OmegaConf.masked_copy(shown, ["hydra"])
        except OmegaConfBaseException as err:  # Hydra's keys set only inside a run or a sweep's job
            fail(f"--resolve: {getattr(err, 'full_key', None) or 'config'} cannot be resolved outside a run "
                 f"({str(err).splitlines()[0]}); allowed: --cfg job --resolve")
    if cli.package not in (None, "_global_"):
        shown = OmegaConf.select(shown, cli.package)
        if shown is None:
            fail(f"--package: {cli.package!r} is not in the config; allowed: a key of it, such as es")
        print(f"# @package {cli.package}")
    sys.stdout.write(OmegaConf.to_yaml(shown) if isinstance(shown, Container) else f"{shown}\n")
    return 0


def help_text(cli: CommandLine) -> str:
    """``--help``: how to call it, the experiments, Hydra's launchers and sweepers, and every key with its
    default (of ``experiments/base.yaml``, or of the experiment named on the same line)."""
    from hydra import compose
    from omegaconf import OmegaConf

    experiment, experiments_dir = cli.special.get("experiment"), cli.experiments_dir
    # An experiment, or the shipped base.yaml itself (which is no experiment).
    with config_lib.hydra_context(experiments_dir if experiment else None) as app:
        composed = config_lib.compose(experiment, [], experiments_dir) if experiment else compose("base")
        options = {group: ", ".join(sorted(app.config_loader.get_group_options(f"hydra/{group}")))
                   for group in ("launcher", "sweeper")}
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
             "launchers (with -m, hydra/launcher=NAME): " + options["launcher"],
             "sweepers (with -m, hydra/sweeper=NAME): " + options["sweeper"],
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
    from metarl.tasks import TRAINERS  # loads JAX: only --help needs it

    target = inner.get(plugins.TARGET) or TRAINERS.get(inner.get("algo", "ppo"))
    try:
        cls = plugins.locate(target, "inner._target_")
        fields = dataclasses.fields(cls)
    except Exception:  # no such class, or no dataclass
        return None
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in fields if f.name != "env"}
    return cls.__name__, {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()
                          if v is not dataclasses.MISSING}


def main(argv: list[str] | None = None) -> int:
    try:
        cli = parse_command_line(sys.argv[1:] if argv is None else argv)
        if cli.help:
            print(help_text(cli))
            return 0
        for option, usage in (("resolve", "--resolve"), ("package", "--package KEY")):
            if getattr(cli, option) and not cli.cfg:
                fail(f"--{option}: used with --cfg only; allowed: --cfg job|hydra|all {usage}")
        if "experiment" not in cli.special and "resume" not in cli.special:
            fail("experiment: missing; allowed: experiment="
                 + "|".join(config_lib.available_experiments(cli.experiments_dir)) + " (or resume=RUN_DIR)")
        if cli.cfg:
            return show_config(cli)
        if cli.multirun:
            from metarl import sweep  # loads JAX: bad input above is answered without it

            return sweep.run(cli)
        cfg, run_dir, resuming, named = resolve(cli)
        from metarl.job import execute  # loads JAX: bad input above is answered without it

        return execute(cfg, run_dir, resuming, named)
    except ConfigError as err:  # bad input: one line, exit code 2
        fail(str(err))


if __name__ == "__main__":
    sys.exit(main())
