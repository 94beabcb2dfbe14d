"""Orbax checkpoints of the whole outer state (docs/resume.md).

A checkpoint at generation G holds the evolution state after G generations and, as JSON, the history of
the G generations and the resolved config. Orbax writes each step to a temporary directory and renames
it when complete, so a kill mid-write leaves the previous checkpoint intact; the leftover is removed.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from metarl.rundir import CheckpointError, RunDir

__all__ = ["CheckpointError", "Checkpointer", "to_host", "from_host"]


def _ocp():
    # Imported when a checkpoint is first read or written, not with this module: it takes seconds,
    # and the CLI checks its input (naming CheckpointError) before touching any checkpoint.
    import orbax.checkpoint as ocp

    return ocp


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(x) -> np.ndarray:
    """A host NumPy copy of one leaf, a PRNG key as its raw data (``from_host`` wraps it again)."""
    return np.asarray(jax.device_get(jax.random.key_data(x) if _is_key(x) else x))


def from_host(value, template):
    if _is_key(template):
        return jax.random.wrap_key_data(value, impl=jax.random.key_impl(template))
    return value


class Checkpointer:
    def __init__(self, run_dir: str | Path, keep: int = 3, write: bool = True):
        ocp = _ocp()
        self.write = write  # only process 0 writes in a multi-process run
        self.dir = ckpt_dir = RunDir(run_dir).ckpt
        self.removed_incomplete = []  # step directories a kill left half-written (Orbax never reads them)
        if write:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            for child in ckpt_dir.iterdir():
                if child.is_dir() and "orbax-checkpoint-tmp" in child.name:
                    shutil.rmtree(child, ignore_errors=True)
                    self.removed_incomplete.append(child.name)
        # Each process runs its own manager over host copies of the (replicated) state: only process 0
        # saves, and Orbax's cross-process barriers would wait forever for processes that never save.
        me = jax.process_index()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=write, enable_async_checkpointing=False, create=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}))
        self.manager = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options)

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, generation: int, state: Any, history: list[dict], config: dict) -> None:
        if not self.write or generation in self.manager.all_steps():  # a resumed run reaching a saved step again
            return
        # Host NumPy only, PRNG keys as their raw data: in a multi-process run Orbax refuses host-local
        # jax.Arrays, and a global one makes it expect every process to write.
        meta = {"generation": generation, "history": history, "config": config}
        ocp = _ocp()
        self.manager.save(generation, args=ocp.args.Composite(
            state=ocp.args.StandardSave(jax.tree.map(to_host, state)), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, template_state: Any, step: Optional[int] = None) -> tuple[Any, dict]:
        restored = self._read(step, state=jax.tree.map(lambda x: np.zeros_like(to_host(x)), template_state))
        return jax.tree.map(from_host, restored["state"], template_state), restored["meta"]

    def read_meta(self, step: Optional[int] = None) -> dict:
        """The JSON part only (history and config): enough for plots, no template needed."""
        return self._read(step)["meta"]

    def _read(self, step: Optional[int], **abstract) -> dict:
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self.dir}: no checkpoint to restore")
        ocp = _ocp()
        parts = {name: ocp.args.StandardRestore(tree) for name, tree in abstract.items()}
        try:
            return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), **parts))
        except Exception as err:  # Orbax raises many types for unreadable data
            raise CheckpointError(f"{self.dir / str(step)}: checkpoint unreadable "
                                  f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None

    def close(self):
        self.manager.close()
