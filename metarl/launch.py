"""Every CPU core of one machine: ``devices.num_processes=N`` starts N processes joined on loopback.

On CPU one process uses further cores only in part (XLA hands independent operations to other
threads: on 2 cores 1.4-1.8x one core's rate for the quick start's population), while N processes,
each pinned to its own core from its start and driving one CPU device, scale almost linearly.
The parent resolves the run directory once, starts ``python -m metarl.evolve`` N times with the same
arguments plus ``METARL_COORDINATOR`` / ``METARL_PROCESS_ID``, forwards SIGINT/SIGTERM, stops the
others if one fails, and returns the worst exit code.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional


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


def _worst(codes: list[int]) -> int:
    # A child killed by a signal has a negative code; report it the way a shell would.
    codes = [128 - c if c < 0 else c for c in codes]
    return max(codes, key=lambda c: (c != 0, c))


def launch(argv: list[str], num_processes: int, poll_s: float = 0.2, lock_fd: Optional[int] = None) -> int:
    """Run ``python -m metarl.evolve *argv`` as ``num_processes`` processes; returns the worst exit code.

    ``lock_fd``: the run directory's lock (``metarl.runlock``), held by this parent and inherited by
    every child, so the directory stays locked while any of them lives, even if the parent is killed.
    """
    from metarl.runlock import ENV_FD

    port = free_port()
    children: list[subprocess.Popen] = []
    sets = core_sets(num_processes)
    for pid, cores in enumerate(sets):
        env = dict(os.environ, METARL_COORDINATOR=f"127.0.0.1:{port}", METARL_PROCESS_ID=str(pid),
                   METARL_NUM_PROCESSES=str(num_processes))
        if lock_fd is not None:
            env[ENV_FD] = str(lock_fd)
        if cores:
            env["METARL_CPUS"] = ",".join(map(str, sorted(cores)))  # devices.setup pins itself
        # Own session: a Ctrl-C in the terminal reaches the parent only, which forwards it once.
        children.append(subprocess.Popen([sys.executable, "-m", "metarl.evolve", *argv], env=env,
                                         start_new_session=True, pass_fds=() if lock_fd is None else (lock_fd,)))

    signalled = []

    def forward(signum, frame):
        signalled.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
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
