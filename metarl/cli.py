"""What metarl's commands share: the bad-input exit, the signals that stop a run, and the checks of an
experiment's command line and of the run directory it names (reading only)."""
from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

from metarl import config as config_lib
from metarl.config import CONFIG_FILE

EXIT_BAD_INPUT = 2
FIGURES = "figures"  # RUN_DIR/figures: where inspect, evaluate, distill and a logged run write figures
# Signals that stop a run after the generation in flight, with a checkpoint (``metarl.runner``).
# SIGHUP is what a closed terminal sends.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


@contextlib.contextmanager
def stop_signals_to(handler):
    """``handler`` receives the stop signals inside the block. A signal this process was started with
    ignored (``nohup`` ignores SIGHUP) stays ignored rather than stopping the run; outside the main
    thread, where Python cannot set handlers, nothing changes."""
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
    """Whether ``run_dir`` holds an earlier run of this config (to continue); refuses one of another
    config, or a directory that is not a run's (``ConfigError``: a path that cannot become one)."""
    config_lib.check_run_dir(str(run_dir))
    # Anything besides what is there before a run starts: the lock file, and what Hydra may write into
    # a sweep job's directory first (``.hydra/``, the job's ``.log``).
    if not run_dir.is_dir() or all(p.name.startswith(".") or p.name.endswith(".log") for p in run_dir.iterdir()):
        return False
    if not (run_dir / CONFIG_FILE).exists():
        fail(f"run_dir: {run_dir} exists and is not a metarl run directory; allowed: a new or empty "
             "directory, or one of an earlier run of this config")
    _refuse_search_change(config_lib.read_saved(run_dir, "run_dir"), cfg, run_dir)
    return True


def _refuse_search_change(saved: dict, cfg, run_dir: Path):
    diffs = config_lib.search_differences(saved, cfg.to_dict())
    if diffs:
        fail(f"run_dir: {run_dir} holds a run whose search differs ({'; '.join(diffs)}); allowed: the same "
             "settings (es.generations, logger.*, checkpoint.* and devices.* may change), or a new run_dir")
