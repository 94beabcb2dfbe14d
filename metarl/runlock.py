"""One run per run directory (docs/resume.md): filelock's lock on ``RUN_DIR/.lock`` (``fcntl.flock``
underneath, not a PID file): the kernel drops it when the holder's descriptor closes, SIGKILL included,
so no stale lock is left. The PID and host written in the file only name the holder to a refused
process (filelock opens the file without truncating it).
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path

from filelock import FileLock, Timeout

from metarl.rundir import RunDir


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory; the message is one line naming it."""


class RunLock:
    """A held run directory; the lock is released by ``release`` or when this process ends."""

    def __init__(self, lock: FileLock, run_dir: Path):
        self.lock, self.run_dir = lock, run_dir

    def release(self) -> None:
        self.lock.release(force=True)


def _holder(path: Path) -> str:
    """Who holds the lock, from what the holder wrote: ``pid P host H``."""
    with contextlib.suppress(OSError):
        holder = re.match(r"pid (\d+) host (\S+)\n", path.read_text(errors="replace"))
        if holder:
            return f"process {holder[1]} on host {holder[2]}"
    return "another process"


def acquire(run_dir: str | Path) -> RunLock:
    """Create ``run_dir`` if needed and hold its lock, or raise ``RunDirLocked`` having changed nothing
    (the lock file of a held directory already exists and is only opened). Keep the returned lock: it is
    released when it is garbage-collected."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = RunDir(run_dir).lock
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirLocked(f"run_dir: {run_dir} is in use by {_holder(path)}; allowed: wait for that run to end "
                           "(or stop it), or choose another run_dir") from None
    path.write_text(f"pid {os.getpid()} host {socket.gethostname()}\n")
    return RunLock(lock, run_dir)


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
    (``acquire_new``)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{path}-{n}")
    return candidate
