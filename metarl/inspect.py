"""``python -m metarl.inspect RUN_DIR [error_range=5]``: figures of a run, written to RUN_DIR/figures/.

    fitness.png             best, mean and population quantiles per generation (every experiment)
    signal.png              the members' fitness spread against seed noise, and the fraction that is signal
                            (docs/signal.md); with fitness.control, the margin over the baseline (every experiment)
    fitness_tasks.png       per task: the population's mean return and the best member's (several tasks)
    value_loss.png          the learned value loss and its gradient beside L2 (value_loss)
    value_loss_<input>.png  heatmap over the error and each further input, the rest fixed at 0 (value_loss)
    value_loss_progress.png the loss and its gradient at several points of training (a temporal value loss)
    policy_objective.png    the learned drift and objective beside PPO's clipping over (r, A) (policy_objective);
                            a temporal drift: policy_objective_progressPPP.png at PPP% of training
    hyperparams.png         the search mean and spread of each hyperparameter per generation (hyperparams)

Works on a finished run, a run still going (the metrics and checkpoints so far) and a run directory
copied from elsewhere: everything is read relative to RUN_DIR. Bad input: one ``error:`` line, exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from metarl.cli import EXIT_BAD_INPUT, FIGURES, fail  # noqa: F401 (FIGURES: part of this module's API)
from metarl.config import CONFIG_FILE, ConfigError


def parse_args(argv: list[str], allowed: dict, usage: str) -> tuple[Path, dict]:
    """``RUN_DIR key=value ...`` with ``allowed`` mapping each key to (type, default); ``usage``: the
    calling command's module docstring, printed for ``--help`` or no arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        raise SystemExit(0 if argv else EXIT_BAD_INPUT)
    run_dir, options = Path(argv[0]), {k: default for k, (_, default) in allowed.items()}
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in allowed:
            fail(f"argument {arg!r}: expected one of {', '.join(f'{k}=' for k in allowed)}")
        try:
            options[key] = allowed[key][0](value)
        except ValueError:
            expected = getattr(allowed[key][0], "expected", allowed[key][0].__name__)
            fail(f"{key}: {value!r} is not a valid {expected}")
    try:
        check_run_dir(run_dir)
    except ConfigError as err:
        fail(str(err))
    return run_dir, options


def check_run_dir(run_dir: str | Path) -> None:
    """A run directory to read: ``ConfigError`` if it is none."""
    if not Path(run_dir).is_dir():
        raise ConfigError(f"{run_dir}: no such directory")
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir}: not a metarl run directory (no {CONFIG_FILE})")


def at_least(least: int, expected: str, word: str | None = None):
    """A ``parse_args`` type: an integer >= ``least``, or ``word`` as it is."""
    def parse(value: str):
        if value == word:
            return value
        if int(value) < least:
            raise ValueError(value)
        return int(value)

    parse.expected = expected
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir, options = parse_args(argv, {"error_range": (float, 5.0)}, __doc__)
    if not options["error_range"] > 0:
        fail(f"error_range: {options['error_range']}; allowed: > 0")
    # Loads JAX and matplotlib: --help and bad arguments are answered without them.
    from metarl.checkpoints import CheckpointError
    from metarl.figures import write_figures

    try:
        paths = write_figures(run_dir, options["error_range"])
    except (CheckpointError, ConfigError) as err:
        fail(str(err))
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
