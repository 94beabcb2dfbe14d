"""What metarl's commands share: the bad-input exit, the stop signals, reading a run's command line, run checks."""
from __future__ import annotations

import contextlib
import inspect
import signal
import sys
import typing
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from metarl import config as config_lib, errors
from metarl.errors import ConfigError
from metarl.rundir import CheckpointError, RunDir

EXIT_BAD_INPUT = 2
# Signals stopping a run after the generation in flight, with a checkpoint (``metarl.run``); SIGHUP: closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def run_command(argv: list[str] | None, function, usage: str, show) -> int:
    """``function(RUN_DIR, **options)``, options read as ``metarl.evolve`` reads its own, printed by ``show``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage.replace("``", ""))  # the module's docstring, without reStructuredText's literal quotes
        raise SystemExit(0 if argv else EXIT_BAD_INPUT)
    keys = list(inspect.signature(function).parameters)
    hints = typing.get_type_hints(function)
    options = {}
    try:
        for arg in argv:
            if "=" not in arg:
                raise ConfigError(f"argument {arg!r}: not KEY=VALUE; the run directory is given as run_dir={arg}")
            try:
                override = OverridesParser.create().parse_overrides([arg])[0]
            except HydraException as err:
                raise errors.one_line(err) from None
            key = override.key_or_group
            if key not in keys or override.is_sweep_override() or override.is_delete():
                raise ConfigError(f"argument {arg!r}: not a setting of this command; allowed: "
                                  f"{', '.join(f'{k}=' for k in keys)}{errors.suggest(key, keys)}")
            value = override.value()
            if key == "run_dir":  # a path as written (``run_dir=1e3`` names the directory 1e3, not 1000.0)
                options[key] = value if isinstance(value, str) else arg.split("=", 1)[1]
            else:
                options[key] = config_lib.build(hints[key], value, key)
        if "run_dir" not in options:
            raise ConfigError("run_dir: not given; allowed: run_dir=PATH, the directory of a run")
        RunDir(options["run_dir"]).require_run()
    except ConfigError as err:
        fail(str(err))
    try:
        result = function(Path(options.pop("run_dir")), **options)
    except (ConfigError, CheckpointError) as err:
        fail(str(err).splitlines()[0])
    if text := show(result):
        print(text)
    return 0


@contextlib.contextmanager
def stop_signals_to(handler):
    """``handler`` gets the stop signals in the block, save one ignored at start (``nohup``) or off the main thread."""
    try:
        old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    except ValueError:  # not the main thread
        old = {}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def check_existing(cfg, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds an earlier run of this config (to continue); refuses any other started directory."""
    config_lib.check_run_dir(str(run_dir))
    if not (where := RunDir(run_dir)).started():
        return False
    if not where.has_config():
        fail(f"run_dir: {run_dir} exists and is not a metarl run directory; allowed: a new or empty "
             "directory, or one of an earlier run of this config")
    _refuse_search_change(where.read_config("run_dir"), cfg, run_dir)
    return True


def _refuse_search_change(saved: dict, cfg, run_dir: Path):
    if diffs := config_lib.search_differences(saved, cfg.to_dict()):
        fail(f"run_dir: {run_dir} holds a run whose search differs ({'; '.join(diffs)}); allowed: the same "
             "settings (es.generations, logger.*, checkpoint.* and devices.* may change), or a new run_dir")
