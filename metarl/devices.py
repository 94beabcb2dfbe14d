"""Devices: a mesh over every device for the population axis, and multi-process start-up.

One process drives every local device (several GPUs, or forced CPU devices); several processes
(one per CPU core, or one per host) join through ``jax.distributed`` and the mesh then spans every
device of every process. The evolution state is one global, fully replicated array: each process
runs the same ask/tell on it, and the population's members are split over the devices.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

AUTO = "auto"


def population_mesh(popsize: int):
    """A 1-D mesh named ``pop`` over every device (of every process), or None with a single device.

    The population must divide over the devices: an uneven split would need padding members whose
    results are dropped, which costs compute for nothing; we refuse it at start-up instead.
    """
    n = jax.device_count()
    if n == 1:
        return None
    check_divides(popsize, n)
    return jax.make_mesh((n,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))


def check_divides(popsize: int, n_devices: int) -> None:
    if popsize % n_devices:
        lower = popsize - popsize % n_devices
        near = " or ".join(str(m) for m in (lower, lower + n_devices) if m)
        raise ValueError(f"es.popsize: {popsize} does not divide over {n_devices} devices; allowed: a "
                         f"multiple of {n_devices} (such as {near})")


def _global_leaf(x, sharding):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        return jax.random.wrap_key_data(_global_leaf(jax.random.key_data(x), sharding), impl=impl)
    value = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def replicate(tree: Any, mesh: Optional[Any]) -> Any:
    """Place a host pytree on every device of ``mesh`` as global, fully replicated arrays.

    In a multi-process run a jitted call over the global mesh accepts only global arrays; each
    process builds its own shards from its (identical) host copy, so nothing crosses processes.
    Without a mesh the tree is left to jit.
    """
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: _global_leaf(x, sharding), tree)


def memory_per_device() -> Optional[int]:
    """Bytes one device can hold: the accelerator's own limit, or on CPU the machine's physical
    memory (CPU devices share it); None when unknown."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        return stats.get("bytes_limit")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def members_per_memory(popsize: int, num_local_processes: int = 1) -> int:
    """Members of the population that share one device's memory: a device's share on an
    accelerator; on CPU every member this host runs (its devices and local processes share RAM)."""
    if jax.local_devices()[0].platform != "cpu":
        return -(-popsize // jax.device_count())
    return -(-popsize * max(num_local_processes, jax.local_device_count()) // max(jax.device_count(),
                                                                                     num_local_processes))


def enable_compilation_cache() -> None:
    """Keep compiled generations on disk, so that a resumed or repeated run skips compilation.

    ``JAX_COMPILATION_CACHE_DIR`` chooses the directory (default ``~/.cache/metarl/jax``);
    ``METARL_COMPILATION_CACHE=0`` turns it off.
    """
    if os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/metarl/jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _env_int(*names: str) -> Optional[int]:
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return None


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers, SLURM)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return max(1, cores)


def _cgroup_cpu_quota() -> Optional[float]:
    """CPUs the cgroup may use (quota / period), or None when unlimited or unknown."""
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read())
        period = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def has_accelerator() -> bool:
    """Whether JAX's default backend is a GPU or TPU. Initialises JAX's backends in this process, which
    is harmless here: a process that finds an accelerator goes on to run alone, and one that finds only
    the CPU starts the per-core processes and then only waits for them."""
    return jax.default_backend() != "cpu"


def auto_processes(popsize: int) -> int:
    """``devices.num_processes=auto``: one process with an accelerator (it drives every local device);
    on a CPU host, one per usable core, reduced to the largest count over whose devices the population
    divides. Each process gets this process's CPU devices: one, unless ``JAX_NUM_CPU_DEVICES`` (or
    XLA's forced host device count) asks for more. A population that does not divide over one
    process's devices gets one process, whose start-up then says why."""
    if has_accelerator():
        return 1
    per_process = jax.local_device_count()
    cores = usable_cores()
    return max(n for n in range(1, cores + 1) if n == 1 or popsize % (n * per_process) == 0)


def distributed_settings(devices_cfg, popsize: int) -> tuple[int, Optional[str], Optional[int]]:
    """``(num_processes, coordinator_address, process_id)`` from the config, else the environment.

    A number in the config wins; then ``METARL_NUM_PROCESSES`` / ``METARL_COORDINATOR`` /
    ``METARL_PROCESS_ID`` (set by ``metarl.launch`` or by hand on each host), then SLURM's
    ``SLURM_NTASKS`` / ``SLURM_PROCID``; with none of them, ``auto`` counts this machine's cores.
    """
    num = devices_cfg.num_processes if devices_cfg.num_processes != AUTO else None
    num = num or _env_int("METARL_NUM_PROCESSES", "SLURM_NTASKS")
    coordinator = devices_cfg.coordinator_address or os.environ.get("METARL_COORDINATOR") or None
    process_id = devices_cfg.process_id
    if process_id is None:
        process_id = _env_int("METARL_PROCESS_ID", "SLURM_PROCID")
    if num is None:
        # Only a process that launches the others counts cores; one told its place in a larger run
        # without a count is left to fail in `setup` with the message that says what is missing.
        num = auto_processes(popsize) if coordinator is None and process_id is None else 1
    return num, coordinator, process_id


def needs_local_launch(devices_cfg, popsize: int) -> bool:
    """Several processes asked for, but nothing says who this one is: start them all here."""
    num, coordinator, process_id = distributed_settings(devices_cfg, popsize)
    return num > 1 and coordinator is None and process_id is None


def _cpu_set(name: str) -> Optional[set[int]]:
    cpus = os.environ.get(name, "").strip()
    return {int(c) for c in cpus.split(",")} if cpus and hasattr(os, "sched_setaffinity") else None


def pin_cpus() -> None:
    """Keep this process on the cores ``METARL_CPUS`` names (``"0"``, ``"2,3"``), before XLA starts its
    thread pools, which size themselves by the cores the process may use. Every process of a local
    launch, process 0 too, is pinned from its start: a process whose pools were sized for two cores
    and then pinned to one ran each generation of the quick start about 1.4x slower, more than it
    saved by compiling on both cores (measured on 2 cores: 13.2 s against 9.5 s per generation; the
    compile 13-14 s against 9 s)."""
    cpus = _cpu_set("METARL_CPUS")
    if cpus:
        os.sched_setaffinity(0, cpus)


# XLA's CPU backend at LLVM optimisation level 1 rather than its default. Measured on a 2-core CPU
# (jax 0.9.2, one process, each program compiled both ways and run alternately): compile time about
# halves for every trainer here (PPO CartPole 32 agents 12.2 -> 6.1 s, PPO MinAtar 14.9 -> 8.3 s,
# DQN 9.9 -> 4.6 s, Q-learning 2.9 -> 1.5 s) and the programs run as fast or faster (0.82-0.98 of
# the time). Results are not the default level's: rounding differs in the last bits and training
# compounds it, as with any change of compiler options; a run, its resumption and its processes all
# use the same options.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compiler_options() -> dict:
    """The options metarl compiles its programs with: ``CPU_COMPILER_OPTIONS`` on CPU, unless
    ``XLA_FLAGS`` sets the optimisation level itself; none on an accelerator."""
    if jax.default_backend() != "cpu" or "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    return dict(CPU_COMPILER_OPTIONS)


def compile_program(jitted, *args):
    """``jitted`` lowered for ``args`` and compiled with ``compiler_options()``."""
    return jitted.lower(*args).compile(compiler_options())


def compile_once(jitted, *args, name: str = "step", timeout_s: float = 3600.0):
    """``compile_program(jitted, *args)``, compiled once for all the processes of a run.

    In a multi-process CPU run process 0 compiles and hands the executable to the others through the
    coordination service. JAX's persistent cache cannot do this on CPU: its key includes the process
    index and only process 0 writes entries, so every other process compiled from scratch on every
    run, on its one pinned core. Process 0 keeps the shared executable in the compilation cache
    directory too (``_shared_cache_path``), so a repeated run loads it instead of compiling."""
    lowered = jitted.lower(*args)
    options = compiler_options()
    if jax.process_count() == 1 or jax.devices()[0].platform != "cpu":  # JAX's cache serves accelerators
        return lowered.compile(options)
    import hashlib
    import zlib

    from jax.experimental import serialize_executable

    # The program's fingerprint travels with it: processes that traced different programs (a bug)
    # fail here instead of running another process's executable.
    digest = hashlib.sha256(lowered.as_text().encode()).digest()
    key, client = f"metarl/executable/{name}", _client()
    if jax.process_index() == 0:
        path = _shared_cache_path(digest, options)
        payload = path.read_bytes() if path is not None and path.is_file() else None
        compiled = None
        if payload is not None:
            try:
                compiled = serialize_executable.deserialize_and_load(zlib.decompress(payload), lowered.in_tree,
                                                                     lowered.out_tree, execution_devices=jax.devices())
                _touch(path)  # used: the last to be evicted
            except Exception:  # a stale or damaged entry: compile again
                payload = None
        if payload is None:
            # An executable that JAX's own cache hands back cannot be serialized again: compile anew.
            was = jax.config.jax_enable_compilation_cache
            jax.config.update("jax_enable_compilation_cache", False)
            try:
                compiled = lowered.compile(options)
            finally:
                jax.config.update("jax_enable_compilation_cache", was)
            payload = zlib.compress(serialize_executable.serialize(compiled)[0], 1)  # a fifth of the size
            if path is not None:
                _write_atomically(path, payload)
                _evict_old_shared(path.parent)
        _send(client, key, digest + payload)
        return compiled
    message = _receive(client, key, timeout_s)
    if message[:len(digest)] != digest:
        raise RuntimeError(f"process {jax.process_index()} traced another program than process 0")
    return serialize_executable.deserialize_and_load(zlib.decompress(message[len(digest):]), lowered.in_tree,
                                                     lowered.out_tree, execution_devices=jax.devices())


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
    """Where process 0 keeps a multi-process executable: keyed by the program, the compiler options,
    the JAX version, the XLA flags, the process count and this CPU (its target and features, as XLA
    describes them)."""
    import hashlib

    cache_dir = jax.config.jax_compilation_cache_dir
    if not cache_dir or os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return None
    import jaxlib
    from jax._src.lib import xla_client

    h = hashlib.sha256(digest)
    for part in (repr(sorted(options.items())), jax.__version__, jaxlib.__version__,
                 os.environ.get("XLA_FLAGS", ""), str(jax.process_count()), str(jax.device_count())):
        h.update(part.encode() + b"\0")
    h.update(xla_client.get_topology_for_devices(jax.devices()).serialize())
    return Path(cache_dir) / f"metarl-multiprocess-{h.hexdigest()}"


SHARED_CACHE_KEEP = 16  # multi-process executables kept (about 1-2 MB each), the most recently used


def _touch(path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _evict_old_shared(cache_dir, keep: int = SHARED_CACHE_KEEP) -> None:
    """Remove all but the ``keep`` most recently used multi-process executables from ``cache_dir``."""
    entries = []
    for entry in Path(cache_dir).glob("metarl-multiprocess-*"):
        try:
            if not entry.name.endswith(".tmp"):
                entries.append((entry.stat().st_mtime, entry))
        except OSError:  # removed meanwhile by another run
            pass
    for _, entry in sorted(entries, reverse=True)[keep:]:
        entry.unlink(missing_ok=True)


def _write_atomically(path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written costs a compilation next time, nothing else
        tmp.unlink(missing_ok=True)


def setup(devices_cfg, popsize: int) -> None:
    """Join a multi-process run when one is configured; a single process needs nothing."""
    pin_cpus()
    enable_compilation_cache()
    num, coordinator, process_id = distributed_settings(devices_cfg, popsize)
    if num <= 1:
        return
    if coordinator is None and "SLURM_JOB_ID" in os.environ:
        jax.distributed.initialize()  # JAX reads the node list and task ids SLURM sets
        return
    if coordinator is None or process_id is None:
        raise ValueError("devices.coordinator_address: a multi-process run needs the coordinator's host:port "
                         "and this process's id (devices.process_id, or METARL_COORDINATOR and "
                         "METARL_PROCESS_ID); allowed: both set, or neither to launch every process here")
    if not 0 <= process_id < num:
        raise ValueError(f"devices.process_id: {process_id}; allowed: 0 to {num - 1}")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=process_id,
                               initialization_timeout=int(os.environ.get("METARL_INIT_TIMEOUT", "300")))


# Cross-process agreement goes through the coordination service (no time limit we cannot set),
# not through gloo collectives: gloo gives up after 30 s, shorter than a compilation on a busy core.
def _client():
    from jax._src import distributed

    return distributed.global_state.client


def barrier(name: str, timeout_s: float = 3600.0) -> None:
    """Wait until every process gets here (e.g. all have compiled) before the first collective."""
    if jax.process_count() > 1:
        _client().wait_at_barrier(f"metarl/{name}", int(timeout_s * 1000))


def agree(flag: int, name: str, timeout_s: float = 3600.0) -> int:
    """The largest ``flag`` over all processes (e.g. a stop signal one of them received); ``name``
    must be new for each call (e.g. the generation)."""
    if jax.process_count() == 1:
        return flag
    client = _client()
    client.key_value_set(f"metarl/{name}/{jax.process_index()}", str(int(flag)))
    return max(int(client.blocking_key_value_get(f"metarl/{name}/{i}", int(timeout_s * 1000)))
               for i in range(jax.process_count()))


def assert_same_everywhere(tree: Any) -> None:
    """Fail loudly if the processes' copies of a replicated state differ."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    def host(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x))

    multihost_utils.assert_equal(jax.tree.map(host, tree), "the evolution state differs between processes")
