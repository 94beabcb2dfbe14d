"""Progress on the terminal for waits longer than a few seconds (rich, on stderr): a bar over known
steps, or the time elapsed in one long call (a compilation, a generation). Off when stderr is not a
terminal, so logs, pipes and ``metrics.jsonl`` stay as they are; the bar is cleared when the wait ends."""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


@contextlib.contextmanager
def progress(description: str, total: Optional[int] = None, enabled: bool = True) -> Iterator[types.SimpleNamespace]:
    """A line named ``description`` while the block runs: a bar over ``total`` steps, each ``bar.update()`` (from any
    thread), and the time elapsed, redrawn by rich's refresh thread (the block may be one long call)."""
    steps = [BarColumn(), MofNCompleteColumn()] if total else []
    with Progress(TextColumn("{task.description}"), *steps, TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True, refresh_per_second=2, redirect_stdout=False, redirect_stderr=False,
                  disable=not (enabled and on_terminal())) as bar:
        task = bar.add_task(description, total=total)
        yield types.SimpleNamespace(update=lambda n=1: bar.advance(task, n))
