"""Long waits show progress on a terminal (rich, on stderr), and nothing when stderr is not one."""
import os
import subprocess
import sys

import pytest

from clihelp import TINY, env_vars

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a pseudo-terminal")


def on_a_terminal(args, cwd) -> tuple[str, str]:
    """``python ARGS`` with stderr on a pseudo-terminal of 24 x 120: (stdout, what the terminal showed)."""
    import fcntl
    import pty
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new one has no width
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env_vars(), stdout=subprocess.PIPE,
                            stderr=child)
    os.close(child)
    shown = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: the process has closed the terminal
            break
        if not data:
            break
        shown.append(data)
    os.close(main)
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=60) == 0, b"".join(shown).decode(errors="replace")
    return out, b"".join(shown).decode(errors="replace")


@pytest.mark.timeout(400)
def test_a_run_and_its_evaluation_show_their_waits_on_a_terminal(tmp_path, tiny_value_loss_run):
    run_dir = tmp_path / "run"
    out, shown = on_a_terminal(["-m", "metarl.evolve", "experiment=value_loss", *TINY, "es.generations=2",
                                f"run_dir={run_dir}"], tmp_path)
    assert "compiling the generation" in shown and "generation 2/2" in shown, shown
    assert "gen    2/2 |" in out and "compiling" not in out  # the bars stay off stdout
    out, shown = on_a_terminal(["-m", "metarl.evaluate", f"run_dir={run_dir}", "num_seeds=2", "total_timesteps=64"],
                               tmp_path)
    assert "compiling 3 programs" in shown and "training 2 agents per task and side" in shown, shown
    assert "IQM" in out or "learned" in out
    # Not on a terminal (a pipe, a log file): no bar, stderr stays empty. The same command with its output
    # piped, started once for this test and test_cli.py's (conftest.py).
    _, proc = tiny_value_loss_run
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


WATCHED = """
import sys, time, types
from pathlib import Path
from metarl.progress import Watchdog
dog = Watchdog(types.SimpleNamespace(factor=2.0, min_seconds=0.05), Path(sys.argv[1]), "then.")
with dog.watch("cheap", 1.0, "adam"):
    time.sleep(0.05)
with dog.watch("costly", 1.0, "learned"):  # 20x the other kind's: the first of its kind, compared with nothing
    time.sleep(1.0)
print("survived", flush=True)
with dog.watch("stalled", 1.0, "adam"):  # over 2x the longest of its own kind: stopped
    time.sleep(3.0)
print("not reached")
"""


@pytest.mark.timeout(60)
def test_the_watchdog_compares_a_step_only_with_steps_of_its_kind(tmp_path):
    from metarl.progress import EXIT_STALLED
    proc = subprocess.run([sys.executable, "-c", WATCHED, str(tmp_path / "stacks.txt")], capture_output=True,
                          text=True, env=env_vars(), timeout=50)
    assert proc.returncode == EXIT_STALLED and proc.stdout == "survived\n", (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: stalled still running after"), proc.stderr
    assert (tmp_path / "stacks.txt").read_text()
