"""One run per run directory (docs/resume.md): ``fcntl.flock`` on ``RUN_DIR/.lock``, not a PID file: the
kernel drops it when the last descriptor of the open file closes (SIGKILL included), so no stale lock is
left; the PID and host written in the file only name the holder to a refused process.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
from pathlib import Path

LOCK_FILE = ".lock"


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
    """Who holds the lock, from what the holder wrote: ``pid P host H``."""
    try:
        holder = re.match(r"pid (\d+) host (\S+)\n", os.pread(fd, 4096, 0).decode(errors="replace"))
    except OSError:
        holder = None
    return "another process" if holder is None else f"process {holder[1]} on host {holder[2]}"


def acquire(run_dir: str | Path) -> RunLock:
    """Create ``run_dir`` if needed and hold its lock, or raise ``RunDirLocked`` having changed nothing
    (the lock file of a held directory already exists and is only opened)."""
    run_dir = Path(run_dir)
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
    while True:
        path = unique_dir(Path(candidate))
        with contextlib.suppress(FileExistsError):
            path.mkdir(parents=True)
            return acquire(path)


def unique_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists; made unique for good when it is created
    (``runlock.acquire_new``, or the sweep's exclusive mkdir)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{path}-{n}")
    return candidate
