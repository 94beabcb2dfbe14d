"""Progress on the terminal for long waits (rich, on stderr); off when stderr is not one, so logs stay as they are."""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

EXIT_STALLED = 75  # sysexits.h's EX_TEMPFAIL, "try again later": a launcher retries (docs/resume.md)


@contextlib.contextmanager
def progress(description: str, total: Optional[int] = None, enabled: bool = True) -> Iterator[types.SimpleNamespace]:
    """A line while the block runs, redrawn by rich's thread (it may be one long call); ``bar.update()`` steps."""
    try:
        shown = enabled and sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced or closed
        shown = False
    steps = [BarColumn(), MofNCompleteColumn()] if total else []
    with Progress(TextColumn("{task.description}"), *steps, TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True, refresh_per_second=2, redirect_stdout=False, redirect_stderr=False,
                  disable=not shown) as bar:
        task = bar.add_task(description, total=total)
        yield types.SimpleNamespace(update=lambda n=1: bar.advance(task, n))


class Watchdog:
    """Ends this process when a step runs over ``settings.factor`` times the longest per unit of work of its ``kind``
    before it (and ``settings.min_seconds``): every thread's stack to ``stacks``, one line ending in ``then``, exit
    ``EXIT_STALLED``. A thread (faulthandler's own timer exits 1), running while XLA releases the GIL. 0: off."""

    def __init__(self, settings, stacks: Path, then: str):
        self.factor, self.min_seconds, self.stacks, self.then = settings.factor, settings.min_seconds, stacks, then
        self.rates: dict = {}

    @contextlib.contextmanager
    def watch(self, what: str, work: float = 1.0, kind: str = ""):
        rate = self.rates.get(kind, 0.0)
        limit = max(self.factor * rate * work, self.min_seconds)
        timer = threading.Timer(limit, self._fire, (what, limit))
        timer.daemon = True
        if self.factor and rate:  # the first step of its kind has nothing to be compared with
            timer.start()
        t = time.perf_counter()
        try:
            yield
        finally:
            timer.cancel()
        self.rates[kind] = max(rate, (time.perf_counter() - t) / work)

    def _fire(self, what: str, limit: float) -> None:
        with open(self.stacks, "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        print(f"error: {what} still running after {limit:.0f} s, over {self.factor:g}x the longest before it: "
              f"stopped; every thread's stack is in {self.stacks}. {self.then}", file=sys.stderr, flush=True)
        os._exit(EXIT_STALLED)
