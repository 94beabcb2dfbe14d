"""Every CPU core of one machine: ``devices.num_processes=N`` starts N processes joined on loopback.

On CPU one process uses further cores only in part (XLA hands independent operations to other
threads: on 2 cores 1.4-1.8x one core's rate for the quick start's population), while N processes,
each pinned to its own core from its start and driving one CPU device, scale almost linearly.
The parent resolves the run directory once, starts ``python -m metarl.evolve`` N times with the same
arguments plus ``METARL_COORDINATOR`` / ``METARL_PROCESS_ID``, forwards SIGINT/SIGTERM/SIGHUP, stops
the others if one fails, and returns the worst exit code. The run stops as one whatever stops it:
each child dies with the parent (``die_with_launcher``), so a parent killed outright (SIGKILL, the
out-of-memory killer) leaves no process running and the run directory free for the same command.

The children's stdout and stderr reach the console through the parent, line by line and in each
process's order, less the lines of third-party libraries that say nothing a user acts on (``NOISE``:
the collective library's ``[Gloo] Rank 1 is connected to 1 peer ranks`` as the processes join);
``logger.verbose=true`` keeps them.
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Optional, TextIO

from metarl import runlock

# Signals that stop a run after the generation in flight, with a checkpoint (``metarl.runner``); the
# parent of a launch passes them on to its children. SIGHUP is what a closed terminal sends.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ENV_LAUNCHER = "METARL_LAUNCHER_PID"


# Lines a child writes that come from third-party C++ libraries and carry no news for a user: gloo
# (the CPU collectives jax uses between processes) prints one to stdout per process when they connect.
NOISE = re.compile(rb"\[Gloo\] Rank \d+ is connected to \d+ peer ranks")


_CONSOLE = threading.Lock()  # one whole line at a time, whichever child it comes from


def relay(source: BinaryIO, sink: TextIO, verbose: bool) -> None:
    """Copy a child's output to ``sink`` line by line until it closes, leaving out ``NOISE`` unless
    ``verbose``. A console that has gone away drops the lines; the child is never blocked by it."""
    for line in iter(source.readline, b""):
        if verbose or not NOISE.match(line):
            try:
                with _CONSOLE:
                    sink.write(line.decode(errors="replace"))
                    sink.flush()
            except (OSError, ValueError):  # a closed terminal or pipe; a closed stream
                pass
    source.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def core_sets(n: int) -> list[Optional[set[int]]]:
    """Cores for each of ``n`` processes: an even split of the cores this process may use."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: leave placement to the OS
        return [None] * n
    if len(cores) < n:
        return [None] * n
    per = len(cores) // n
    return [set(cores[i * per:(i + 1) * per]) for i in range(n)]


def ignored(sig: signal.Signals) -> bool:
    """Whether this process was started with ``sig`` ignored (``nohup`` ignores SIGHUP): a run leaves
    such a signal ignored rather than stopping on it."""
    return signal.getsignal(sig) == signal.SIG_IGN


def die_with_launcher() -> None:
    """In a process started by ``launch``: be killed the moment the launching parent ends, however it
    ends. Called first thing, before JAX starts. On Linux the kernel does it (``PR_SET_PDEATHSIG``);
    elsewhere a thread watches the parent. SIGKILL rather than a stop after the generation in flight:
    the run directory must be free within a second or two for the same command to continue it, and
    what the run has saved (checkpoints, ``metrics.jsonl``) survives a kill at any moment."""
    value = os.environ.pop(ENV_LAUNCHER, "")  # not for this process's own children
    if not value.isdigit():
        return
    parent = int(value)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="metarl-launcher-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _worst(codes: list[int]) -> int:
    # A child killed by a signal has a negative code; report it the way a shell would.
    codes = [128 - c if c < 0 else c for c in codes]
    return max(codes, key=lambda c: (c != 0, c))


def launch(argv: list[str], num_processes: int, poll_s: float = 0.2, lock=None, verbose: bool = False) -> int:
    """Run ``python -m metarl.evolve *argv`` as ``num_processes`` processes; returns the worst exit code.

    ``lock``: the run directory's lock (a ``metarl.runlock.RunLock``), held by this parent and inherited
    by every child, so the directory stays locked while any of them lives; the children are named in it.
    ``verbose``: pass on the third-party lines (``NOISE``) too.
    """
    port = free_port()
    children: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    sets = core_sets(num_processes)
    for pid, cores in enumerate(sets):
        # PYTHONUNBUFFERED: each line reaches the pipe as it is written, so the console stays live.
        env = dict(os.environ, METARL_COORDINATOR=f"127.0.0.1:{port}", METARL_PROCESS_ID=str(pid),
                   METARL_NUM_PROCESSES=str(num_processes), PYTHONUNBUFFERED="1",
                   **{ENV_LAUNCHER: str(os.getpid())})
        if lock is not None:
            env[runlock.ENV_FD] = str(lock.fd)
        if cores:
            env["METARL_CPUS"] = ",".join(map(str, sorted(cores)))  # devices.setup pins itself
        # Own session: a Ctrl-C in the terminal reaches the parent only, which forwards it once.
        child = subprocess.Popen([sys.executable, "-m", "metarl.evolve", *argv], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, pass_fds=() if lock is None else (lock.fd,))
        children.append(child)
        for source, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            relays.append(threading.Thread(target=relay, args=(source, sink, verbose), daemon=True,
                                           name=f"metarl-relay-{pid}"))
            relays[-1].start()
    if lock is not None:
        runlock.name_children(lock, [child.pid for child in children])

    signalled = []

    def forward(signum, frame):
        signalled.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS if not ignored(sig)}
    try:
        while True:
            codes = [child.poll() for child in children]
            if all(c is not None for c in codes):
                return _worst(codes)
            if not signalled and any(c not in (None, 0) for c in codes):
                # A failed process leaves the others waiting in a collective forever: stop them.
                time.sleep(2.0)
                for child in children:
                    if child.poll() is None:
                        child.terminate()
                deadline = time.monotonic() + 30
                for child in children:
                    try:
                        child.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
                return _worst([child.returncode for child in children])
            time.sleep(poll_s)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        # The children's last lines; a process a child started and left running (holding its end of
        # the pipe) delays this by a few seconds at most.
        deadline = time.monotonic() + 5
        for thread in relays:
            thread.join(max(0.0, deadline - time.monotonic()))
