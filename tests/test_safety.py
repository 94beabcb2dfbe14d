"""A run directory belongs to one run at a time, and metrics.jsonl is strict JSON.

Nothing here compiles a generation: the lock is held by small helper processes or by the test
itself, and the CLI is refused before it would compile.
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import TINY, env_vars, evolve, snapshot
from metarl import rundir
from metarl.config import LoggerSection
from metarl.errors import ConfigError
from metarl.logger import Logger
from metarl.rundir import RunDir

HOLD = ("import sys, time\n"
        "from metarl import rundir\n"
        "lock = rundir.acquire(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")


def hold_in_child(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=env_vars(), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.timeout(120)
def test_lock_names_its_holder_and_is_released_by_sigkill(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_in_child(run_dir)
    try:
        with pytest.raises(rundir.RunDirLocked, match=f"in use by process {holder.pid} on host "):
            rundir.acquire(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the lock with the killed process: no stale lock to clean up.
    lock = rundir.acquire(run_dir)
    try:
        assert f"pid {os.getpid()} " in RunDir(run_dir).lock.read_text()
    finally:
        lock.release()


@pytest.mark.timeout(180)
def test_cli_is_refused_while_another_process_holds_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    lock = rundir.acquire(run_dir)
    try:
        before = snapshot(tmp_path)
        proc = evolve(["experiment=value_loss", *TINY, f"run_dir={run_dir}"],
                      cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"error: run_dir: {run_dir} is in use by process {os.getpid()} on host "), proc.stderr
        assert snapshot(tmp_path) == before
    finally:
        lock.release()


def _strict(text):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_metrics_jsonl_holds_no_nan_or_infinity(tmp_path):
    logger = Logger(tmp_path, {}, 2, LoggerSection(progress=False))
    nan, inf = float("nan"), float("inf")
    logger.log({"generation": 1, "best": nan, "mean": -inf, "fitness": [1.0, nan, inf],
                "search": {"mean": {"lr": inf}}, "seconds": 0.0, "fps": nan})
    logger.log({"generation": 2, "best": 2.0, "mean": 1.5, "fitness": [1.0, 2.0], "seconds": 1.0, "fps": 3.0})
    rows = _strict((tmp_path / "metrics.jsonl").read_text())
    assert rows[0]["best"] is None and rows[0]["mean"] is None and rows[0]["fps"] is None
    assert rows[0]["fitness"] == [1.0, None, None] and rows[0]["search"]["mean"]["lr"] is None
    assert rows[1]["best"] == 2.0
    RunDir(tmp_path).truncate_metrics(1)  # the rewrite on resume is strict JSON as well
    assert _strict((tmp_path / "metrics.jsonl").read_text()) == rows[:1] == RunDir(tmp_path).metrics()
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in rows[0].values())


@pytest.mark.parametrize("override, message", [
    ("devices.num_processes=10000000000000", "devices.num_processes: 10000000000000; allowed: an integer of at most"),
    ("fitness.nonfinite_floor=-inf", "fitness.nonfinite_floor: -inf; allowed: a finite number"),
    ("fitness.window=nan", "fitness.window: nan; allowed: a finite number"),
])
def test_config_ranges_in_process(override, message):
    # The same checks the CLI runs, without a subprocess: a value of the right type, out of range.
    from metarl import config

    with pytest.raises(ConfigError) as err:
        config.load("value_loss", [override])
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).parents[1] / "experiments" / "experiment").glob("*.yaml")))
def test_every_shipped_experiment_builds_its_tasks_held_out_tasks_and_tuning(name):
    # Composing, checking and building everything up to compilation: a shipped file that a refactor
    # broke fails here in seconds, not after a GPU run has started.
    from metarl import config, stages, tasks

    cfg = config.load(name)
    task = tasks.build_task(cfg)
    assert task.template is not None
    if cfg.eval_tasks:
        tasks.build_task(cfg, tasks.task_specs(cfg, "eval_tasks"))
    stages.check_tuning(cfg)   # builds the tuning search and checks its budget
