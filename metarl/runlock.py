"""One run per run directory: an exclusive lock on ``RUN_DIR/.lock`` for the life of the run.

The lock is ``fcntl.flock`` on an open file, not a PID file: the kernel drops it when the last
descriptor of that open file closes, so any exit of the holder (SIGKILL included) releases it and no
stale lock is ever left to clean up. The holder writes its PID and host into the file only so that
a refused process can name it; the file's content is never trusted as the lock.

In a multi-process launch (``devices.num_processes>1`` on one machine) the launching parent takes
the lock before it starts the children and hands them the descriptor (``METARL_RUN_LOCK_FD``). A
child checks that the descriptor really is the lock of its run directory and holds it; as long as
any process of the run lives the lock is held, so no second launch can slip in between.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Optional

LOCK_FILE = ".lock"
ENV_FD = "METARL_RUN_LOCK_FD"


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory; the message is one line naming it."""


class RunLock:
    def __init__(self, fd: int, run_dir: Path):
        self.fd, self.run_dir = fd, run_dir

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = -1


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").split()
    except OSError:
        text = []
    info = dict(zip(text[::2], text[1::2]))
    if "pid" in info:
        return f"process {info['pid']} on host {info.get('host', '?')}"
    return "another process"


def _inherited(run_dir: Path) -> Optional[RunLock]:
    """The lock a launching parent handed down, if ``METARL_RUN_LOCK_FD`` names a descriptor that is
    this run directory's lock file and whose lock this process (sharing the open file) holds."""
    value = os.environ.get(ENV_FD, "").strip()
    if not value.isdigit():
        return None
    fd = int(value)
    try:
        mine, lock = os.fstat(fd), os.stat(run_dir / LOCK_FILE)
        if (mine.st_dev, mine.st_ino) != (lock.st_dev, lock.st_ino):
            return None
        # Succeeds at once on a descriptor that shares the parent's open file (it already holds the
        # lock); fails if someone else holds it, i.e. this descriptor is not the holder's.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    return RunLock(fd, run_dir)


def acquire(run_dir: str | Path) -> RunLock:
    """Create ``run_dir`` if needed and hold its lock, or raise ``RunDirLocked`` having changed nothing
    (the lock file of a held directory already exists and is only opened)."""
    run_dir = Path(run_dir)
    inherited = _inherited(run_dir)
    if inherited is not None:
        return inherited
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirLocked(f"run_dir: {run_dir} is in use by {holder}; allowed: wait for that run to end "
                           "(or stop it), or choose another run_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
    return RunLock(fd, run_dir)


def acquire_new(candidate: str | Path) -> RunLock:
    """A default run directory: ``candidate`` or, if another run took that name in the meantime,
    ``candidate-2``, ``candidate-3``, ...; created with an exclusive mkdir so that two runs started
    in the same second never share one."""
    base = Path(candidate)
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return acquire(path)
        except FileExistsError:
            n += 1
            path = Path(f"{base}-{n}")
