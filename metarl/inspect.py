"""``python -m metarl.inspect run_dir=RUN_DIR [error_range=5]``: figures of a run, written to RUN_DIR/figures/.

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
    optimiser_update.png    the learned change of a parameter against its gradient, beside Adam's (optimiser)
    optimiser_step_size.png the learned step size (and noise) over training, beside Adam's lr (optimiser)

Works on a finished run, a run still going (the metrics and checkpoints so far) and a run directory
copied from elsewhere: everything is read relative to RUN_DIR. Bad input: one ``error:`` line, exit 2.
"""
from __future__ import annotations

# Named like the standard library's inspect for `python -m metarl.inspect`; absolute imports still reach that one.
import sys
from pathlib import Path

from metarl.commands import run_command
from metarl.errors import ConfigError


def figures(run_dir: str | Path, error_range: float = 5.0) -> list[Path]:
    """The run's figures (``metarl.figures``); ``error_range``: the span of errors the value-loss figures show."""
    if not error_range > 0:
        raise ConfigError(f"error_range: {error_range}; allowed: > 0")
    from metarl.figures import write_figures  # matplotlib: seconds that bad arguments do without
    return write_figures(run_dir, error_range)


def main(argv: list[str] | None = None) -> int:
    return run_command(argv, figures, __doc__, lambda paths: "\n".join(map(str, paths)))


if __name__ == "__main__":
    sys.exit(main())
