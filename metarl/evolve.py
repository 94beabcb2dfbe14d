"""``python -m metarl.evolve experiment=NAME [key=value ...]``: evolve a part of an RL algorithm (docs/sweeps.md)."""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from metarl import config as config_lib, errors
from metarl.commands import _refuse_search_change, check_existing, fail
from metarl.errors import ConfigError
from metarl.rundir import RUNS, RunDir, unique_dir


def _resume(resume: str, hydra_cfg) -> tuple:
    """``resume=RUN_DIR``: the saved config with the command line's settings, read by Hydra's parser as at first."""
    given = [str(o) for o in hydra_cfg.overrides.task if str(o).split("=", 1)[0].lstrip("+~") != "resume"]
    config_lib.check_run_dir(resume, "resume")
    run_dir = Path(resume)
    saved = RunDir(run_dir).read_config("resume")
    merged = OmegaConf.create(saved)
    for override in OverridesParser.create().parse_overrides(given):
        key = override.key_or_group
        if key == "experiment" and override.value() != saved.get("experiment"):
            fail(f"experiment: {override.value()!r} differs from the run's {saved.get('experiment')!r}")
        try:
            OmegaConf.update(merged, key, override.value(), merge=True)
        except OmegaConfBaseException as err:
            fail(f"{key}: {str(err).splitlines()[0]}")
    cfg = config_lib.from_dict({**OmegaConf.to_container(merged, resolve=True), "run_dir": str(run_dir)})
    _refuse_search_change(saved, cfg, run_dir)
    return cfg, run_dir, True, True


@hydra.main(version_base="1.3", config_path="pkg://metarl.experiments", config_name="config")
def app(composed) -> float | None:
    """Hydra's task: one run, or one job of a sweep (returning its best fitness, for an optimising sweeper)."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return _sweep().run_job(composed, hydra_cfg)
    try:  # anything unsafe refused, nothing written; an exception would reach Hydra, which prints its own line
        if composed.resume:
            cfg, run_dir, resuming, named = _resume(composed.resume, hydra_cfg)
        else:  # named: the user chose the run directory; otherwise a new one under checkpoints/
            cfg = config_lib.from_composed(composed)
            named = bool(cfg.run_dir)
            run_dir = Path(cfg.run_dir) if named else unique_dir(
                RUNS / f"{cfg.experiment}-{time.strftime('%Y%m%d-%H%M%S')}")
            cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
            resuming = check_existing(cfg, run_dir)
    except ConfigError as err:
        fail(str(err))
    from metarl.run import run_locked  # JAX, orbax, evosax: seconds that --help, --cfg and bad input do without
    if code := run_locked(cfg, run_dir, resuming, named):
        raise SystemExit(code)


class RunHooks(Callback):
    """Hydra's settings checked; with ``-m`` the sweep's checks, MLflow run and summary (``metarl.sweep``). Hydra
    makes a callback's exception a warning and goes on, so failures here exit."""
    parent = None  # the sweep's MLflow run, in the process that runs the sweep (``sweep.start``)

    def __getstate__(self) -> dict:
        return {}  # a launcher's worker process gets the hooks without the sweep's MLflow run

    def on_run_start(self, config, **kwargs) -> None:
        # Before Hydra makes its output directory and changes into it: a run (a sweep's job) has its own.
        if config.hydra.job.chdir:
            fail("hydra.job.chdir: true; allowed: false (a run writes to its run_dir, from the directory it "
                 "was started in)")
        if str(config.hydra.run.dir) != ".":
            fail(f"hydra.run.dir: {config.hydra.run.dir}; allowed: run_dir=PATH, which names the run's directory")

    def on_multirun_start(self, config, **kwargs) -> None:
        self.on_run_start(config)
        HydraConfig.instance().set_config(config)  # for ${hydra:...} in the sweep's settings
        self.parent = _exit_on_error(lambda: _sweep().start(config))

    def on_job_end(self, config, job_return, **kwargs) -> None:
        stopped = getattr(job_return, "_return_value", None)  # a failed job's exception
        if config.hydra.mode == RunMode.MULTIRUN and isinstance(stopped, _sweep().Stopped):
            raise SystemExit(_sweep().finish(config, self.parent, stopped.args[0]))

    def on_multirun_end(self, config, **kwargs) -> None:
        if code := _exit_on_error(lambda: _sweep().finish(config, self.parent)):
            raise SystemExit(code)


def _sweep():
    from metarl import sweep  # JAX, orbax, evosax: seconds that --help, --cfg and bad input do without
    return sweep


def _exit_on_error(step):
    try:
        return step()
    except ConfigError as err:
        fail(str(err))
    except Exception:
        traceback.print_exc()
        raise SystemExit(1)


# Hydra's own flags (``--hydra-help`` lists them); those that take a value.
HYDRA_FLAGS = "-h --help --hydra-help --version --resolve -r --run -m --multirun -sc --shell-completion -i --info"
HYDRA_VALUE_FLAGS = "-c --cfg -p --package -cp --config-path -cn --config-name -cd --config-dir --experimental-rerun"


def check_arguments(argv: list[str]) -> None:
    """Refuse in one line an argument Hydra would answer with its usage or an unnamed error (``--popsize=4``, =4)."""
    args = iter(argv)
    for arg in args:
        key, _, value = arg.partition("=")
        if arg.startswith("-") and len(arg) > 1:
            flags = [f for f in f"{HYDRA_FLAGS} {HYDRA_VALUE_FLAGS}".split()
                     if f == key or key.startswith("--") and f.startswith(key)]
            if not flags:
                name = key.lstrip("-")
                known = [k for k in config_lib.keys() if k == name or k.endswith(f".{name}")]
                fail(f"argument {arg!r}: not a flag of metarl.evolve; allowed: overrides KEY=VALUE without dashes, "
                     f"such as {(known or [name])[0]}={value or 'VALUE'}, and Hydra's flags --help, --cfg, -m, "
                     "--config-dir, --config-name, ... (--hydra-help lists them)")
            if flags[0] in HYDRA_VALUE_FLAGS.split() and "=" not in arg:
                next(args, None)  # its value
        elif not key.lstrip("+~"):
            fail(f"argument {arg!r}: {'empty' if not arg else 'no key'}; allowed: an override KEY=VALUE, such "
                 "as es.popsize=4")
        elif key.lstrip("+~") == "experiment":  # experiment=4
            try:
                name = OverridesParser.create().parse_overrides([arg])[0].value()
            except HydraException:  # Hydra's own error names it
                continue
            if not isinstance(name, str | None):
                fail(f"argument {arg!r}: not the name of an experiment; allowed: experiment=NAME with NAME one of "
                     f"{', '.join(config_lib.experiment_names())} (or --config-dir DIR for your own)")


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    check_arguments(sys.argv[1:])
    if {"-h", "--help"} & set(sys.argv):  # the config as a run gets it, not its ${...} interpolations
        sys.argv.append("--resolve")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors, so that they become one line here
    try:
        app()  # a sweep ends with its exit code (RunHooks.on_multirun_end)
    except (ConfigError, HydraException, OmegaConfBaseException) as err:  # bad input: one line, exit code 2
        fail(str(err) if isinstance(err, ConfigError) else str(errors.one_line(err, config_lib.keys())))
    except ValueError as err:  # Hydra's reading of the command line; the task's own (a frame of app): a traceback
        if any(frame.f_code is app.__wrapped__.__code__ for frame, _ in traceback.walk_tb(err.__traceback__)):
            raise
        fail(str(errors.one_line(err, config_lib.keys())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
