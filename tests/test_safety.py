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
import time

import pytest

from clihelp import TINY, env_vars, evolve, snapshot
from metarl import runlock
from metarl.logger import Logger, read_metrics, truncate_metrics

HOLD = ("import sys, time\n"
        "from metarl import runlock\n"
        "runlock.acquire(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")


def hold_in_child(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=env_vars(), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(runlock.ENV_FD, raising=False)


@pytest.mark.timeout(120)
def test_lock_names_its_holder_and_is_released_by_sigkill(tmp_path, clean_env):
    run_dir = tmp_path / "run"
    holder = hold_in_child(run_dir)
    try:
        with pytest.raises(runlock.RunDirLocked, match=f"in use by process {holder.pid} on host "):
            runlock.acquire(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the lock with the killed process: no stale lock to clean up.
    lock = runlock.acquire(run_dir)
    try:
        assert f"pid {os.getpid()} " in (run_dir / runlock.LOCK_FILE).read_text()
    finally:
        lock.release()


# A launcher that takes the lock, starts a child sharing it (as metarl.launch does), names the
# child in the lock file or not (argv[2]), and waits to be killed.
LAUNCH = ("import os, subprocess, sys, time\n"
          "from metarl import runlock\n"
          "lock = runlock.acquire(sys.argv[1])\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], pass_fds=(lock.fd,))\n"
          "if sys.argv[2] == 'named':\n"
          "    runlock.name_children(lock, [child.pid])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(120)\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("named", ["named", "unnamed"])
def test_lock_names_a_live_child_when_its_launcher_is_gone(tmp_path, clean_env, named):
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCH, str(run_dir), named], env=env_vars(),
                                stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        with pytest.raises(runlock.RunDirLocked) as refused:
            runlock.acquire(run_dir)
        message = str(refused.value)
        assert len(message.splitlines()) == 1
        if named == "named":  # the live holder, and that the process which took the lock has ended
            assert f"in use by process {child} on host " in message
            assert f"started by process {launcher.pid}, which has ended; stop it with: kill {child})" in message
        else:
            assert f"in use by a process of a run started by process {launcher.pid} on host " in message
            assert message.split(";")[0].endswith("which has ended")
    finally:
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:  # the child's end frees the directory
        try:
            runlock.acquire(run_dir).release()
            break
        except runlock.RunDirLocked:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.mark.timeout(120)
def test_an_inherited_descriptor_counts_only_if_it_is_the_holders(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    holder = hold_in_child(run_dir)
    try:
        # A descriptor of the lock file that does not share the holder's open file is no pass.
        fd = os.open(run_dir / runlock.LOCK_FILE, os.O_RDONLY)
        monkeypatch.setenv(runlock.ENV_FD, str(fd))
        with pytest.raises(runlock.RunDirLocked):
            runlock.acquire(run_dir)
        os.close(fd)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("processes", [1, 2])
def test_cli_is_refused_while_another_process_holds_the_run_dir(tmp_path, clean_env, processes):
    # With devices.num_processes=2 the launching parent takes the lock before starting any child.
    run_dir = tmp_path / "run"
    lock = runlock.acquire(run_dir)
    try:
        before = snapshot(tmp_path)
        proc = evolve(["experiment=value_loss", *TINY, f"devices.num_processes={processes}", f"run_dir={run_dir}"],
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
    logger = Logger(tmp_path, {}, total_generations=2, progress=False)
    nan, inf = float("nan"), float("inf")
    logger.log({"generation": 1, "best": nan, "mean": -inf, "fitness": [1.0, nan, inf],
                "search": {"mean": {"lr": inf}}, "seconds": 0.0, "fps": nan})
    logger.log({"generation": 2, "best": 2.0, "mean": 1.5, "fitness": [1.0, 2.0], "seconds": 1.0, "fps": 3.0})
    rows = _strict((tmp_path / "metrics.jsonl").read_text())
    assert rows[0]["best"] is None and rows[0]["mean"] is None and rows[0]["fps"] is None
    assert rows[0]["fitness"] == [1.0, None, None] and rows[0]["search"]["mean"]["lr"] is None
    assert rows[1]["best"] == 2.0
    truncate_metrics(tmp_path, 1)  # the rewrite on resume is strict JSON as well
    assert _strict((tmp_path / "metrics.jsonl").read_text()) == rows[:1] == read_metrics(tmp_path)
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in rows[0].values())


@pytest.mark.parametrize("override, message", [
    ("devices.num_processes=10000000000000", "devices.num_processes: 10000000000000; allowed: an integer of at most"),
    ("fitness.nonfinite_floor=-inf", "fitness.nonfinite_floor: -inf; allowed: a finite number"),
    ("fitness.window=nan", "fitness.window: nan; allowed: a finite number"),
])
def test_config_ranges_in_process(override, message):
    # The same checks the CLI runs, without a subprocess: a value of the right type, out of range.
    from metarl import config

    with pytest.raises(config.ConfigError) as err:
        config.load("value_loss", [override])
    assert str(err.value).startswith(message)
