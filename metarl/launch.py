"""Every CPU core of one machine (docs/devices.md): ``devices.num_processes=N`` starts ``python -m
metarl.evolve`` N times with the same arguments, joined on loopback, each pinned to its own core; the
parent relays their output, forwards stop signals, stops the others if one fails, and returns the worst
exit code; each child dies with the parent (``die_with_launcher``).
"""
from __future__ import annotations

import contextlib
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
# A child's lines from third-party C++ libraries that carry no news for a user (``logger.verbose=true``
# keeps them): gloo, the CPU collectives jax uses between processes, prints one per process as they join.
NOISE = re.compile(rb"\[Gloo\] Rank \d+ is connected to \d+ peer ranks")
_CONSOLE = threading.Lock()  # one whole line at a time, whichever child it comes from


def relay(source: BinaryIO, sink: TextIO, verbose: bool) -> None:
    """Copy a child's output to ``sink`` line by line until it closes, leaving out ``NOISE`` unless
    ``verbose``. A console that has gone away drops the lines; the child is never blocked by it."""
    for line in iter(source.readline, b""):
        if verbose or not NOISE.match(line):
            with contextlib.suppress(OSError, ValueError), _CONSOLE:  # a closed terminal, pipe or stream
                sink.write(line.decode(errors="replace"))
                sink.flush()
    source.close()


def core_sets(n: int) -> list[Optional[set[int]]]:
    """Cores for each of ``n`` processes: an even split of the cores this process may use."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < n:  # too few, or not Linux: placement is left to the OS
        return [None] * n
    per = len(cores) // n
    return [set(cores[i * per:(i + 1) * per]) for i in range(n)]


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


def die_with_launcher() -> None:
    """In a process started by ``launch``: be killed the moment the launching parent ends, however it
    ends (on Linux by the kernel, ``PR_SET_PDEATHSIG``). SIGKILL rather than a stop after the generation
    in flight: the run directory must be free within a second or two for the same command to continue
    it, and what the run has saved survives a kill at any moment."""
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


def worst_code(codes: list[int]) -> int:
    """The exit code that says the most: a failure over success, the higher over the lower. A child
    killed by a signal has a negative code; it is reported the way a shell would."""
    codes = [128 - c if c < 0 else c for c in codes]
    return max(codes, key=lambda c: (c != 0, c))


def launch(argv: list[str], num_processes: int, lock: runlock.RunLock, verbose: bool = False) -> int:
    """Run ``python -m metarl.evolve *argv`` as ``num_processes`` processes; returns the worst exit code.
    ``lock``: the run directory's ``RunLock``, held by this parent and inherited by every child, so the
    directory stays locked while any of them lives. ``verbose``: pass on ``NOISE`` too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a free port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    children: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    for pid, cores in enumerate(core_sets(num_processes)):
        # PYTHONUNBUFFERED: each line reaches the pipe as it is written, so the console stays live.
        env = dict(os.environ, METARL_COORDINATOR=f"127.0.0.1:{port}", METARL_PROCESS_ID=str(pid),
                   METARL_NUM_PROCESSES=str(num_processes), PYTHONUNBUFFERED="1",
                   **{ENV_LAUNCHER: str(os.getpid()), runlock.ENV_FD: str(lock.fd)})
        if cores:
            env["METARL_CPUS"] = ",".join(map(str, sorted(cores)))  # devices.setup pins itself
        # Own session: a Ctrl-C in the terminal reaches the parent only, which forwards it once.
        child = subprocess.Popen([sys.executable, "-m", "metarl.evolve", *argv], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, pass_fds=(lock.fd,))
        children.append(child)
        for source, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            relays.append(threading.Thread(target=relay, args=(source, sink, verbose), daemon=True,
                                           name=f"metarl-relay-{pid}"))
            relays[-1].start()
    runlock.name_children(lock, [child.pid for child in children])

    signalled = []

    def forward(signum, frame):
        signalled.append(signum)
        for child in children:
            child.send_signal(signum)  # nothing, to a child that has ended

    try:
        with stop_signals_to(forward):
            while True:
                codes = [child.poll() for child in children]
                if all(c is not None for c in codes):
                    return worst_code(codes)
                if not signalled and any(c not in (None, 0) for c in codes):
                    # A failed process leaves the others waiting in a collective forever: stop them.
                    time.sleep(2.0)
                    for child in children:
                        child.terminate()
                    deadline = time.monotonic() + 30
                    for child in children:
                        try:
                            child.wait(max(0.1, deadline - time.monotonic()))
                        except subprocess.TimeoutExpired:
                            child.kill()
                            child.wait()
                    return worst_code([child.returncode for child in children])
                time.sleep(0.2)
    finally:
        # The children's last lines; a process a child started and left running (holding its end of
        # the pipe) delays this by a few seconds at most.
        deadline = time.monotonic() + 5
        for thread in relays:
            thread.join(max(0.0, deadline - time.monotonic()))
