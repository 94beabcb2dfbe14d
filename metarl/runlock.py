"""One run per run directory (docs/resume.md): ``fcntl.flock`` on ``RUN_DIR/.lock``, not a PID file: the
kernel drops it when the last descriptor of the open file closes (SIGKILL included), so no stale lock is
left; the PID and host written in the file only name the holder to a refused process. A local launch hands
the parent's descriptor to its children (``METARL_RUN_LOCK_FD``): the lock holds while any of them lives.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _holder(fd: int) -> str:
    """Who holds the lock, from what the holders wrote: ``pid P host H`` (the process that took it),
    then ``child C`` for each process of its launch that shares it."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        text = ""
    holder = re.match(r"pid (\d+) host (\S+)\n", text)
    if holder is None:
        return "another process"
    pid, host = int(holder[1]), holder[2]
    if host != socket.gethostname() or _alive(pid):  # another host's processes cannot be looked at
        return f"process {pid} on host {host}"
    alive = [child for child in map(int, re.findall(r"^child (\d+)$", text, re.M)) if _alive(child)]
    if alive:
        return (f"process {alive[0]} on host {host} (started by process {pid}, which has ended; "
                f"stop it with: kill {' '.join(map(str, alive))})")
    return f"a process of a run started by process {pid} on host {host}, which has ended"


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


def name_children(lock: RunLock, pids: list[int]) -> None:
    """Add the processes a launch started, which share the lock, to what the holder wrote."""
    os.pwrite(lock.fd, "".join(f"child {pid}\n" for pid in pids).encode(), os.fstat(lock.fd).st_size)


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
