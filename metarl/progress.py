"""Progress on the terminal for long waits (rich, on stderr); off when stderr is not one, so logs stay as they are."""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


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
