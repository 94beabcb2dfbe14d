"""Compiling metarl's programs: the compiler options, JAX's persistent cache, and one compilation
shared by every process of a multi-process CPU run."""
from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from pathlib import Path

import jax
import jaxlib
from jax.experimental import serialize_executable

from metarl import jax_private
from metarl.checkpoints import atomic_write


def enable_compilation_cache() -> None:
    """Keep compiled generations on disk (``JAX_COMPILATION_CACHE_DIR``, default ``~/.cache/metarl/jax``;
    ``METARL_COMPILATION_CACHE=0`` turns it off), so that a resumed or repeated run skips compilation."""
    if os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/metarl/jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# XLA's CPU backend at LLVM optimisation level 1: about half the default level's compile time, programs as
# fast or faster (docs/experiments.md); rounding differs, so a run, its resumption and its processes all use it.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compiler_options() -> dict:
    """The options metarl compiles its programs with: ``CPU_COMPILER_OPTIONS`` on CPU, unless
    ``XLA_FLAGS`` sets the optimisation level itself; none on an accelerator."""
    if jax.default_backend() != "cpu" or "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    return dict(CPU_COMPILER_OPTIONS)


def compile_program(jitted, *args):
    return jitted.lower(*args).compile(compiler_options())


def compile_once(jitted, *args, timeout_s: float = 3600.0):
    """``compile_program(jitted, *args)``, compiled once for all the processes of a run: in a
    multi-process CPU run process 0 compiles (or loads from ``_shared_cache_path``) and hands the
    executable to the others through the coordination service. JAX's persistent cache cannot do this
    on CPU: its key includes the process index and only process 0 writes entries."""
    lowered = jitted.lower(*args)
    options = compiler_options()
    if jax.process_count() == 1 or jax.devices()[0].platform != "cpu":  # JAX's cache serves accelerators
        return lowered.compile(options)

    def load(payload: bytes):
        return serialize_executable.deserialize_and_load(zlib.decompress(payload), lowered.in_tree, lowered.out_tree,
                                                         execution_devices=jax.devices())

    # The program's fingerprint travels with it: processes that traced different programs (a bug)
    # fail here instead of running another process's executable.
    digest = hashlib.sha256(lowered.as_text().encode()).digest()
    key, client = "metarl/executable/step", jax_private.coordination_client()
    if jax.process_index() != 0:
        message = _receive(client, key, timeout_s)
        if message[:len(digest)] != digest:
            raise RuntimeError(f"process {jax.process_index()} traced another program than process 0")
        return load(message[len(digest):])
    path, compiled = _shared_cache_path(digest, options), None
    if path is not None and path.is_file():
        with contextlib.suppress(Exception):  # a stale or damaged entry: compile again
            payload = path.read_bytes()
            compiled = load(payload)
            os.utime(path)  # used: the last to be evicted
    if compiled is None:
        # An executable that JAX's own cache hands back cannot be serialized again: compile anew.
        was = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)
        try:
            compiled = lowered.compile(options)
        finally:
            jax.config.update("jax_enable_compilation_cache", was)
        payload = zlib.compress(serialize_executable.serialize(compiled)[0], 1)  # a fifth of the size
        if path is not None:
            with contextlib.suppress(OSError):  # a cache that cannot be written costs a compilation next time
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, payload)
            _evict_old_shared(path.parent)
    _send(client, key, digest + payload)
    return compiled


_CHUNK = 1 << 20  # the coordination service's messages stay well under gRPC's 4 MiB default limit


def _send(client, key: str, data: bytes) -> None:
    chunks = [data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
    for i, chunk in enumerate(chunks):
        client.key_value_set_bytes(f"{key}/{i}", chunk)
    client.key_value_set(f"{key}/count", str(len(chunks)))  # last: the chunks are all there


def _receive(client, key: str, timeout_s: float) -> bytes:
    count = int(client.blocking_key_value_get(f"{key}/count", int(timeout_s * 1000)))
    return b"".join(client.blocking_key_value_get_bytes(f"{key}/{i}", 60_000) for i in range(count))


def _shared_cache_path(digest: bytes, options: dict):
    """Where process 0 keeps a multi-process executable, keyed by all that shapes it; None without a cache."""
    cache_dir = jax.config.jax_compilation_cache_dir
    if not cache_dir or os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return None
    h = hashlib.sha256(digest)
    for part in (repr(sorted(options.items())), jax.__version__, jaxlib.__version__,
                 os.environ.get("XLA_FLAGS", ""), str(jax.process_count()), str(jax.device_count())):
        h.update(part.encode() + b"\0")
    h.update(jax_private.topology(jax.devices()))
    return Path(cache_dir) / f"metarl-multiprocess-{h.hexdigest()}"


SHARED_CACHE_KEEP = 16  # multi-process executables kept (about 1-2 MB each), the most recently used


def _evict_old_shared(cache_dir) -> None:
    """Remove all but the ``SHARED_CACHE_KEEP`` most recently used multi-process executables from ``cache_dir``."""
    entries = []
    for entry in Path(cache_dir).glob("metarl-multiprocess-*"):
        if not entry.name.endswith(".tmp"):
            with contextlib.suppress(OSError):  # removed meanwhile by another run
                entries.append((entry.stat().st_mtime, entry))
    for _, entry in sorted(entries, reverse=True)[SHARED_CACHE_KEEP:]:
        entry.unlink(missing_ok=True)
