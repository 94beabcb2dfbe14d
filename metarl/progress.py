"""Progress on the terminal for waits longer than a few seconds (tqdm, on stderr): a bar over known
steps, or the time elapsed in one long call (a compilation, a generation). Off when stderr is not a
terminal, so logs, pipes and ``metrics.jsonl`` stay as they are; the bar is cleared when the wait ends."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, Optional

from tqdm import tqdm


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


@contextlib.contextmanager
def progress(description: str, total: Optional[int] = None, enabled: bool = True) -> Iterator[tqdm]:
    """A bar named ``description`` while the block runs: ``total`` steps, each ``bar.update()``; without
    ``total`` the seconds elapsed, redrawn every second from a thread of its own, since the block may
    be one call that returns only at its end."""
    bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=not (enabled and on_terminal()),
               bar_format=None if total else "{desc} {elapsed}")
    stop = threading.Event()

    def tick():
        while not stop.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="metarl-progress", daemon=True)
    if not bar.disable:
        ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
        bar.close()
