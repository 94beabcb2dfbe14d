"""A run directory's files, their names and formats, in one place: the rest of metarl asks a ``RunDir`` for a
path or a file's contents and never spells a file name (a test checks). Besides the files named below it holds
``evaluation[SUFFIX].json`` (``metarl.evaluate``'s report, a suffix per setting) and wandb's own ``wandb/``."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from filelock import FileLock, Timeout

from metarl.errors import ConfigError

RUNS = Path("checkpoints")            # where a run goes unless run_dir names its directory
CONFIG = "config.yaml"                # the resolved config; ``resume=RUN_DIR`` continues from it
METRICS = "metrics.jsonl"             # one strict-JSON record per generation
REFERENCE = "reference.json"          # the reference returns a normalised fitness scores against
TUNED, TUNE = "tuned.json", "tune"    # the tuned baseline (``baseline.tune``); its searches in tune/, tune-2/, ...
VALIDATION = "validation.json"        # the final pick on fresh seeds
# the exported meta-parameters (flax msgpack) and what they are
BEST_PARAMS, BEST_INFO = "best_meta_params.msgpack", "best_meta_params.json"
CKPT = "ckpt"                         # Orbax checkpoints of the outer state
DAMAGED = ".damaged"                  # ckpt/6.damaged: a checkpoint set aside unreadable; Orbax lists only ckpt/6
CKPT_ERRORS = "checkpoint_errors.log"  # why each skipped checkpoint could not be read: the full exceptions
STACKS = "stacks.txt"                 # every thread's stack when the watchdog ended a stalled run
FIGURES = "figures"                   # inspect's, evaluate's and distill's figures
DISTILL = "distill.json"              # ``metarl.distill``'s front of formulas
PER_TASK = "per_task_tuning.json"     # ``metarl.evaluate per_task=...``'s finished tunings, reused when it runs again
MLFLOW_RUN = "mlflow_run.json"        # the MLflow run the directory logs to (a run's, or a sweep's)
# filelock's lock (``fcntl.flock``, not a PID file): the kernel drops it when its holder's descriptor closes, even
# on SIGKILL; the PID and host in it only name the holder to a refused process
LOCK = ".lock"


class CheckpointError(RuntimeError):
    """A checkpoint or an exported file that cannot be read; the message names it."""


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: a file of this process beside it, renamed over it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def to_json_line(record: dict) -> str:
    """``record`` as one line of strict JSON, NaN and infinities as null (Python's json writes ``NaN``)."""
    return json.dumps(json.loads(json.dumps(record), parse_constant=lambda constant: None)) + "\n"


@dataclasses.dataclass
class JsonFile:
    """One JSON file of a run directory, written whole or not at all."""
    path: Path
    indent: Optional[int] = 2

    def read(self) -> Optional[dict]:
        """Its contents; None if it does not exist (or a kill left it unreadable)."""
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def write(self, data: Any) -> Path:
        atomic_write(self.path, json.dumps(data, indent=self.indent, default=float) + "\n")
        return self.path


class RunDir(os.PathLike):
    """The directory at ``path`` (a ``PathLike``: ``Path(run_dir)`` is its path)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.ckpt, self.figures, self.lock = self.path / CKPT, self.path / FIGURES, self.path / LOCK
        self.ckpt_errors, self.stacks = self.path / CKPT_ERRORS, self.path / STACKS
        self.reference, self.tuned, self.validation, self.distill = (
            JsonFile(self.path / name) for name in (REFERENCE, TUNED, VALIDATION, DISTILL))
        self.per_task = JsonFile(self.path / PER_TASK, indent=None)   # thousands of numbers: one line
        self.mlflow_run = JsonFile(self.path / MLFLOW_RUN, indent=1)

    def __fspath__(self) -> str:
        return str(self.path)

    __str__ = __fspath__

    def tuning(self, i: int = 0) -> "RunDir":
        return RunDir(self.path / (TUNE if i == 0 else f"{TUNE}-{i + 1}"))

    def evaluation(self, suffix: str = "") -> JsonFile:
        return JsonFile(self.path / f"evaluation{suffix}.json")

    @property
    def best_files(self) -> list[Path]:
        """The exported meta-parameters' files, where both exist (else none)."""
        files = [self.path / BEST_PARAMS, self.path / BEST_INFO]
        return files if all(f.exists() for f in files) else []

    def has_config(self) -> bool:
        return (self.path / CONFIG).is_file()

    def require_run(self, field: str = "run_dir") -> None:
        """``ConfigError`` naming ``field`` unless this is a run's directory, and the latest runs in or beside it."""
        if not self.has_config():
            near = [f for f in (self.path if self.path.is_dir() else self.path.parent, RUNS) if f.is_dir()]
            runs = next((found for f in near if (found := [p for p in f.iterdir() if RunDir(p).has_config()])), [])
            latest = ", ".join(map(str, sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)[:3]))
            what = f"not a metarl run directory (no {CONFIG})" if self.path.is_dir() else "no such directory"
            raise ConfigError(f"{field}: {self.path}: {what}; allowed: a run's directory"
                              + (f", such as the latest: {latest}" if latest else f" (it holds {CONFIG})"))

    def started(self) -> bool:
        """Whether it holds more than what precedes a run: the lock and Hydra's ``.hydra/`` and ``.log``."""
        return self.path.is_dir() and any(not (p.name.startswith(".") or p.name.endswith(".log"))
                                          for p in self.path.iterdir())

    def fingerprint(self) -> tuple:
        """What another run could have changed between our read-only checks and taking the lock."""
        stamps = [p.stat().st_mtime_ns if p.exists() else None for p in (self.path / CONFIG, self.path / METRICS)]
        steps = sorted(p.name for p in self.ckpt.iterdir()) if self.ckpt.is_dir() else []
        return *stamps, steps

    def write_config(self, data: dict) -> None:
        from omegaconf import OmegaConf
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / CONFIG, OmegaConf.to_yaml(OmegaConf.create(data)))

    def read_config(self, field: Optional[str] = None) -> dict:
        """``config.yaml`` as plain data, unchecked; ``ConfigError``, naming ``field``, if missing or no mapping."""
        from omegaconf import OmegaConf
        self.require_run(field or "run_dir")
        path = self.path / CONFIG
        where = f"{field}: {path}" if field else path
        try:
            data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as err:  # YAML or OmegaConf: anything unreadable is the same error here
            raise ConfigError(f"{where}: unreadable ({type(err).__name__}); allowed: the {CONFIG} a run "
                              "wrote") from None
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"{where}: {'empty' if not data else 'not a mapping'}; allowed: the {CONFIG} a "
                              "run wrote")
        return data

    def metrics(self) -> list[dict]:
        """The records, up to a line cut by a kill mid-write."""
        path = self.path / METRICS
        records = []
        for line in filter(str.strip, path.read_text().splitlines() if path.exists() else []):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return records

    def append_metrics(self, record: dict) -> None:
        with open(self.path / METRICS, "a") as f:
            f.write(to_json_line(record))

    def truncate_metrics(self, generations_done: int) -> None:
        """Keep the first ``generations_done`` generations' records: a resumed run recomputes the rest."""
        if (self.path / METRICS).exists():
            kept = [r for r in self.metrics() if r.get("generation", 0) <= generations_done]
            atomic_write(self.path / METRICS, "".join(to_json_line(r) for r in kept))

    def write_best(self, meta_params: Any, info: dict) -> None:
        """The meta-parameters (flax msgpack) and what using them needs (JSON): the best so far, or the pick."""
        import jax
        import numpy as np
        from flax import serialization
        atomic_write(self.path / BEST_PARAMS, serialization.msgpack_serialize(
            jax.tree.map(np.asarray, jax.device_get(meta_params))))
        atomic_write(self.path / BEST_INFO, json.dumps(info, indent=2, default=float))

    def read_best(self, template: Any = None) -> tuple[Any, dict]:
        """``(meta_params, info)``, shaped as ``template`` or else nested numpy dicts; ``CheckpointError`` if none."""
        from flax import serialization
        if not (self.path / BEST_PARAMS).exists():
            raise CheckpointError(f"{self.path / BEST_PARAMS}: no exported meta-parameters")
        try:
            params = serialization.msgpack_restore((self.path / BEST_PARAMS).read_bytes())
            info = json.loads((self.path / BEST_INFO).read_text())
        except Exception as err:  # msgpack and json raise many types for damaged bytes
            raise CheckpointError(f"{self.path / BEST_PARAMS}: unreadable ({type(err).__name__}); allowed: "
                                  "the files a run exported (restore them from a copy)") from None
        return (params if template is None else serialization.from_state_dict(template, params)), info


def digest(state: Any, meta: dict) -> str:
    """SHA-256 of a checkpoint's host leaves and JSON, leaf by leaf in sorted order: the same for a tree restored
    with or without a template (its order and containers differ), costing one pass over the bytes."""
    import jax
    import numpy as np
    leaves = sorted(hashlib.sha256(f"{x.dtype}{x.shape}".encode() + np.ascontiguousarray(x).tobytes()).hexdigest()
                    for x in map(np.asarray, jax.tree.leaves(state)))
    text = json.dumps({k: v for k, v in meta.items() if k != "digest"}, sort_keys=True)
    return hashlib.sha256("".join(leaves).encode() + text.encode()).hexdigest()


# tensorstore's reads of a failed restore finish after Orbax has closed their event loop, each one then an
# unraisable 'Event loop is closed' on stderr: dropped (the error itself is logged), the rest passed on.
_passed_on = sys.unraisablehook
sys.unraisablehook = lambda unraisable: "Event loop is closed" in str(unraisable.exc_value) or _passed_on(unraisable)


def _is_key(x) -> bool:
    import jax
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(x):
    """A host NumPy copy of one leaf, a PRNG key as its raw data (``from_host`` wraps it again)."""
    import jax
    import numpy as np
    return np.asarray(jax.device_get(jax.random.key_data(x) if _is_key(x) else x))


def from_host(value, template):
    import jax
    return jax.random.wrap_key_data(value, impl=jax.random.key_impl(template)) if _is_key(template) else value


class Checkpointer:
    """The Orbax checkpoints: at generation G, the state after G generations and, as JSON, their history, the
    config and both's ``digest`` (Orbax checks no data file's contents; docs/resume.md). Orbax is imported on first
    use: it takes seconds, and the CLI imports this module (CheckpointError) to check input."""

    def __init__(self, run_dir: str | Path, keep: int = 3, write: bool = True):
        import jax
        import orbax.checkpoint as ocp
        self.write = write  # only process 0 writes in a multi-process run
        self.dir = ckpt_dir = RunDir(run_dir).ckpt
        self.removed_incomplete = []  # step directories a kill left half-written (Orbax never reads them)
        self.skipped, self.errors = [], RunDir(run_dir).ckpt_errors  # (step, cause) of each unreadable one
        if write:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            for child in ckpt_dir.iterdir():
                if child.is_dir() and "orbax-checkpoint-tmp" in child.name:
                    shutil.rmtree(child, ignore_errors=True)
                    self.removed_incomplete.append(child.name)
        # A manager per process over host copies of the replicated state: only process 0 saves, and
        # Orbax's cross-process barriers would wait forever for processes that never save.
        me = jax.process_index()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=write, enable_async_checkpointing=False, create=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}))
        self.manager = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options)

    def save(self, generation: int, state: Any, history: list[dict], config: dict) -> None:
        if not self.write or generation in self.manager.all_steps():  # a resumed run reaching a saved step again
            return
        # Host NumPy, keys as raw data: multi-process Orbax refuses host-local jax.Arrays and expects every
        # process to write a global one.
        import jax
        import orbax.checkpoint as ocp
        host = jax.tree.map(to_host, state)
        meta = {"generation": generation, "history": history, "config": config}
        meta["digest"] = digest(host, meta)
        self.manager.save(generation, args=ocp.args.Composite(
            state=ocp.args.StandardSave(host), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, template_state: Any, step: int) -> tuple[Any, dict]:
        """Checkpoint ``step``'s state (shaped as ``template_state``; None: host arrays as saved) and JSON;
        ``CheckpointError`` with a cause in a few words if it cannot be read or differs from its digest."""
        import jax
        import numpy as np
        import orbax.checkpoint as ocp
        host = None if template_state is None else jax.tree.map(lambda x: np.zeros_like(to_host(x)), template_state)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore(), state=ocp.args.StandardRestore(host)))
            saved = restored["meta"].get("digest")
            if saved is not None and saved != digest(restored["state"], restored["meta"]):  # None: saved unhashed
                raise ValueError("DIGEST: the restored state or history differs from the digest saved with it")
        except Exception as err:  # Orbax raises many types for unreadable data; the whole one goes to a log
            with open(self.errors, "a") as log:
                log.write(f"{self.dir / str(step)}:\n{''.join(traceback.format_exception(err))}\n")
            causes = {"OUT_OF_RANGE": "truncated file", "DATA_LOSS": "corrupt file", "NOT_FOUND": "missing file",
                      "DIGEST": "digest mismatch"}  # tensorstore's status codes (and ours) in a few words
            cause = next((words for code, words in causes.items() if code in str(err)), type(err).__name__)
            raise CheckpointError(f"{self.dir / str(step)}: checkpoint unreadable ({cause}; the full error is in "
                                  f"{self.errors})", cause) from None
        state, meta = restored["state"], restored["meta"]
        return (state if template_state is None else jax.tree.map(from_host, state, template_state)), meta

    def newest(self, template_state: Any = None) -> tuple[Optional[int], Any, dict]:
        """``(step, state, meta)`` of the newest checkpoint that reads back as saved, the newer ones in ``skipped``;
        ``(None, None, {})`` without any; ``CheckpointError``, one line saying what to do, if none reads."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        for step in steps:
            try:
                return step, *self.restore(template_state, step)
            except CheckpointError as err:
                self.skipped.append((step, err.args[1]))
        if steps:
            first = f"{steps[0]}: {self.skipped[0][1]}"
            raise CheckpointError(f"{self.dir}: none of {len(steps)} checkpoints readable ({first}); start afresh "
                                  "with another run_dir= or restore a copy")
        return None, None, {}

    def skipped_note(self, generation: int) -> str:
        """One line: the checkpoints skipped and the generation used instead."""
        return (f"skipped damaged checkpoint(s) {', '.join(f'{self.dir / str(s)} ({c})' for s, c in self.skipped)}"
                f"; from generation {generation}")

    def set_aside(self, after: int) -> list[str]:
        """Rename the checkpoints newer than ``after`` (a resume fell back past them) out of Orbax's sight, kept."""
        moved = [unique_dir(self.dir / f"{step}{DAMAGED}") for step in self.manager.all_steps() if step > after]
        for path in moved:
            os.rename(self.dir / path.name.split(".")[0], path)
        self.manager.reload()
        return [path.name for path in moved]

    def close(self):
        self.manager.close()


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory; the message is one line naming it."""


@dataclasses.dataclass
class RunLock:
    """A held run directory; the lock is released by ``release`` or when this process ends."""
    lock: FileLock
    run_dir: Path

    def release(self) -> None:
        self.lock.release(force=True)


def acquire(run_dir: str | Path) -> RunLock:
    """Create ``run_dir`` if needed and hold its lock, or raise ``RunDirLocked`` having changed nothing (a held
    lock file is only opened). Keep the returned lock: garbage collection releases it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = RunDir(run_dir).lock
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        holder = "another process"
        with contextlib.suppress(OSError):  # who holds it, from what the holder wrote: pid P host H
            if found := re.match(r"pid (\d+) host (\S+)\n", path.read_text(errors="replace")):
                holder = f"process {found[1]} on host {found[2]}"
        raise RunDirLocked(f"run_dir: {run_dir} is in use by {holder}; allowed: wait for that run to end "
                           "(or stop it), or choose another run_dir") from None
    path.write_text(f"pid {os.getpid()} host {socket.gethostname()}\n")
    return RunLock(lock, run_dir)


def acquire_new(candidate: str | Path) -> RunLock:
    """``candidate``, or ``candidate-2``, ... if taken meanwhile; an exclusive mkdir keeps same-second runs apart."""
    while True:
        path = unique_dir(Path(candidate))
        with contextlib.suppress(FileExistsError):
            path.mkdir(parents=True)
            return acquire(path)


def unique_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists (``acquire_new`` claims it)."""
    n = 1
    while (candidate := path if n == 1 else Path(f"{path}-{n}")).exists():
        n += 1
    return candidate
