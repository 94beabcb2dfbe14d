"""What metarl's commands share: the bad-input exit, and the checks of an experiment's command line."""
from __future__ import annotations

import sys

from metarl import config as config_lib

EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def missing_experiment(special: dict):
    try:
        experiments_dir = config_lib.check_experiments_dir(special.get("experiments_dir"))
    except config_lib.ConfigError as err:
        fail(str(err))
    fail("experiment: missing; allowed: experiment=" + "|".join(config_lib.available_experiments(experiments_dir))
         + " (or resume=RUN_DIR)")


def refuse_chdir(composed) -> None:
    if composed.hydra.job.chdir:
        fail("hydra.job.chdir: true; allowed: false (a run writes to its run_dir, from the directory it was "
             "started in)")
