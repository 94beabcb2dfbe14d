"""A run is one process: killed outright at any moment, it leaves nothing behind, and the same
command continues it at once.

The run (two CPU devices) is killed with SIGKILL at start-up, while compiling, inside a generation
and while a checkpoint is written: each time no process of it is left, the run directory is free
at once, and the same command then finishes the run exactly as an uninterrupted one. SIGHUP (a
closed terminal) stops it like SIGTERM: after the generation in flight, with a checkpoint, exit code
129 and the command that continues it.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from clihelp import TINY, alive, children_of, env_vars, final_state, records
from metarl import rundir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
PR_SET_CHILD_SUBREAPER = 36  # Linux prctl: orphaned descendants are re-parented to this process


@pytest.fixture(scope="module", autouse=True)
def subreaper():
    """This process adopts whatever the runs it starts leave behind, so that after a run has ended its
    leftovers are this process's children: nothing need be watched while it runs."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

GENS = 6
# A little more work per generation than TINY, so that a kill can land inside one.
ARGS = ["experiment=value_loss", *[a for a in TINY if not a.startswith("inner.total_timesteps")],
        "inner.total_timesteps=2048", f"es.generations={GENS}", "devices.num_cpu_devices=2"]


class Run:
    """The command a user runs, started in the background; its output goes to a file."""

    def __init__(self, run_dir: Path, log: Path):
        self.run_dir, self.log = run_dir, log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, f"run_dir={run_dir}"],
                                         cwd=run_dir.parent, env=env_vars(), stdout=out, stderr=subprocess.STDOUT)

    def watch(self, ready, timeout: float = 300) -> bool:
        """Poll until ``ready()``; False if the run ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if ready():
                return True
            time.sleep(0.001)
        return False

    def output(self) -> str:
        return self.log.read_text()


def metrics_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def writing_checkpoint(run_dir: Path) -> bool:
    ckpt = run_dir / "ckpt"
    try:
        return any("orbax-checkpoint-tmp" in p.name for p in ckpt.iterdir())
    except OSError:
        return False


def assert_nothing_left(run: Run):
    """No process of the run is alive and the run directory is free, as soon as the run has ended
    (anything it started and left is now a child of this process, the subreaper)."""
    left = [pid for pid in children_of(os.getpid()) if alive(pid)]
    assert not left, f"processes the run started outlive it: {left}"
    lock = rundir.acquire(run.run_dir)  # raises RunDirLocked, naming the holder, if one is left
    lock.release()


def assert_same_run(a: Path, b: Path):
    """Every generation's record once and equal, and the final state (search distribution, optimiser,
    key) bit for bit."""
    ra, rb = records(a), records(b)
    assert [r["generation"] for r in ra] == list(range(1, GENS + 1))
    assert ra == rb
    (sa, ma), (sb, mb) = final_state(a), final_state(b)
    assert ma["generation"] == mb["generation"] == GENS
    np.testing.assert_array_equal(jax.random.key_data(sa.key), jax.random.key_data(sb.key))
    for x, y in zip(jax.tree.leaves(sa.es_state), jax.tree.leaves(sb.es_state), strict=True):
        np.testing.assert_array_equal(x, y)


def finish(run_dir: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "metarl.evolve", *ARGS, f"run_dir={run_dir}"], cwd=run_dir.parent,
                          env=env_vars(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    finish(run_dir)
    return run_dir


@pytest.mark.timeout(600)
def test_sigkill_at_any_moment_leaves_nothing_running_and_the_run_continues(tmp_path, straight):
    run_dir = tmp_path / "run"
    moments = {  # when to kill the run; the run directory is the same throughout
        "start-up": lambda: True,
        # The run has taken the run directory and restores, compiles or runs its first generation.
        "compile": lambda: "run directory:" in run.output() and metrics_lines(run_dir) == 0,
        "mid generation": lambda: metrics_lines(run_dir) >= 2,
        # After the run has compiled, and so has removed what an earlier kill left half-written.
        "checkpoint write": lambda: "compiled the generation" in run.output() and writing_checkpoint(run_dir),
    }
    caught = []
    for moment, ready in moments.items():
        run = Run(run_dir, tmp_path / f"{moment}.log")
        if run.watch(ready):
            run.proc.send_signal(signal.SIGKILL)
            caught.append(moment)
        run.proc.wait(timeout=300)
        assert_nothing_left(run)
        if metrics_lines(run_dir) >= GENS:
            break
    assert caught[:3] == ["start-up", "compile", "mid generation"], caught
    out = finish(run_dir)
    assert_same_run(run_dir, straight)
    assert not writing_checkpoint(run_dir)
    print(f"killed at: {caught}\n{out}")


@pytest.mark.timeout(600)
def test_sighup_stops_a_run_like_sigterm(tmp_path, straight):
    run_dir = tmp_path / "run"
    run = Run(run_dir, tmp_path / "hup.log")
    assert run.watch(lambda: metrics_lines(run_dir) >= 1), run.output()
    run.proc.send_signal(signal.SIGHUP)
    assert run.proc.wait(timeout=300) == 128 + signal.SIGHUP, run.output()
    assert_nothing_left(run)
    out = run.output()
    assert "stopped by SIGHUP after generation " in out and f"resume={run_dir}" in out, out
    _, meta = final_state(run_dir)
    assert meta["generation"] == metrics_lines(run_dir) < GENS  # saved where it stopped, nothing lost
    finish(run_dir)
    assert_same_run(run_dir, straight)
