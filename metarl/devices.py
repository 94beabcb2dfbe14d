"""Devices (docs/devices.md): a CPU device per core (or every local GPU); a ``pop`` mesh over all processes'."""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jaxlib
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from orbax.checkpoint import multihost as ocp_multihost

from metarl import compilation, errors, rundir
from metarl.outer_loops.evolution import check_divides

# XLA ends the process (SIGABRT) when a CPU device has waited too long for another at a cross-device collective, as
# one device of a long CPU generation on a busy machine can. XLA reads the flag from XLA_FLAGS when its backend
# starts; jaxlib before 0.9 lacks it, and an unknown flag would end the process too.
COLLECTIVE_TIMEOUT_FLAG = "xla_cpu_collective_call_terminate_timeout_seconds"


def patient_cpu_collectives() -> None:
    """Set ``COLLECTIVE_TIMEOUT_FLAG`` to a day unless ``XLA_FLAGS`` sets it; effective only before JAX starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    if COLLECTIVE_TIMEOUT_FLAG not in flags and tuple(int(x) for x in jaxlib.__version__.split(".")[:2]) >= (0, 9):
        os.environ["XLA_FLAGS"] = f"{flags} --{COLLECTIVE_TIMEOUT_FLAG}={24 * 3600}".strip()


def usable_cores() -> int:
    """The cores this process may run on (loky's count): its affinity, a cgroup CPU quota, LOKY_MAX_CPU_COUNT."""
    import joblib

    return joblib.cpu_count(only_physical_cores=False)


def use_cpu_cores(num_cpu_devices: int | str = "auto") -> None:
    """This process's CPU devices (idle with an accelerator), set before JAX starts: ``num_cpu_devices``, or with
    ``auto`` one per usable core unless JAX's own settings say how many. Later, another count is a ValueError."""
    patient_cpu_collectives()
    auto = num_cpu_devices == "auto"
    if auto and any(setting in os.environ.get("XLA_FLAGS", "") or os.environ.get(setting, "").strip()
                    for setting in ("JAX_NUM_CPU_DEVICES", "xla_force_host_platform_device_count")):
        return
    count = usable_cores() if auto else int(num_cpu_devices)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX has started its backends: the devices it has stay
        if not auto and len(jax.local_devices(backend="cpu")) != count:
            raise ValueError(f"devices.num_cpu_devices: {count}, but JAX has started in this process with "
                             f"{len(jax.local_devices(backend='cpu'))} CPU devices; allowed: auto, or a count "
                             "set before JAX starts") from None


def population_mesh(popsize: int, fit: bool = False):
    """A 1-D mesh ``pop`` over every device of every process (None for one): padding members would cost compute for
    nothing, so the population must divide over them, or with ``fit`` (one process) over the most it divides over."""
    n = jax.device_count()
    if fit and jax.process_count() == 1:
        n = max(d for d in range(1, n + 1) if popsize % d == 0)
    if n == 1:
        return None
    with errors.layer_errors("es"):
        check_divides(popsize, n)
    return jax.make_mesh((n,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


def run_mesh(cfg):
    return population_mesh(cfg.es.popsize, fit=cfg.devices.num_cpu_devices == "auto")


def over_agents(fn, mesh=None):
    """``jit(vmap(fn))``, its agents (the leading axis of every input and output) split over ``mesh``'s ``pop``
    axis by jit's shardings: shard_map and pmap of SpaceInvaders-MinAtar's training segfaulted XLA (jax 0.11.2)."""
    split = {} if mesh is None else dict.fromkeys(("in_shardings", "out_shardings"), NamedSharding(mesh, P("pop")))
    return jax.jit(jax.vmap(fn), **split)


def replicate(tree: Any, mesh: Optional[Any]) -> Any:
    """A host pytree as global arrays replicated over ``mesh`` (without one: left to jit), as a multi-process jitted
    call needs: each process builds its shards from its own (identical) host copy, so nothing crosses processes."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())

    def place(x):
        value = rundir.to_host(x)
        return rundir.from_host(jax.make_array_from_callback(value.shape, sharding, lambda index: value[index]), x)

    return jax.tree.map(place, tree)


def memory_share(popsize: int) -> tuple[Optional[int], int]:
    """``(bytes, members)``: the bytes one device can hold (the accelerator's limit; on CPU the machine's RAM, which
    CPU devices share) and the members sharing them (a device's share; on CPU all that this host runs)."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        return (device.memory_stats() or {}).get("bytes_limit"), -(-popsize // jax.device_count())
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = None
    return ram, -(-popsize // jax.process_count())


def _env_int(*names: str) -> Optional[int]:
    return next((int(os.environ[name]) for name in names if os.environ.get(name, "").strip()), None)


def distributed_settings(devices_cfg) -> tuple[int, Optional[str], Optional[int]]:
    """``(num_processes, coordinator_address, process_id)``: the config's, else METARL_* (set by hand), else SLURM's."""
    num = devices_cfg.num_processes if devices_cfg.num_processes != "auto" else None
    num = num or _env_int("METARL_NUM_PROCESSES", "SLURM_NTASKS") or 1
    coordinator = devices_cfg.coordinator_address or os.environ.get("METARL_COORDINATOR") or None
    process_id = devices_cfg.process_id
    return num, coordinator, _env_int("METARL_PROCESS_ID", "SLURM_PROCID") if process_id is None else process_id


def setup(devices_cfg) -> None:
    """This process's devices, before any JAX computation: its CPU devices, then joining the other processes."""
    compilation.enable_compilation_cache()
    use_cpu_cores(devices_cfg.num_cpu_devices)
    num, coordinator, process_id = distributed_settings(devices_cfg)
    if num <= 1 or jax.distributed.is_initialized():
        return
    if coordinator is None and "SLURM_JOB_ID" in os.environ:
        jax.distributed.initialize()  # JAX reads the node list and task ids SLURM sets
        return
    if coordinator is None or process_id is None:
        raise ValueError(f"devices.num_processes: {num} processes need the coordinator's host:port and this "
                         "process's id (devices.coordinator_address and devices.process_id, or METARL_COORDINATOR "
                         "and METARL_PROCESS_ID, or SLURM's); allowed: 1 or auto on one machine, whose one process "
                         "uses every core, or both set on each host")
    if not 0 <= process_id < num:
        raise ValueError(f"devices.process_id: {process_id}; allowed: 0 to {num - 1}")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=process_id,
                               initialization_timeout=int(os.environ.get("METARL_INIT_TIMEOUT", "300")))


# Processes wait for each other at the coordination service's barrier (Orbax's public handle on it, with a
# time limit we set), not at a collective: gloo gives up sooner than a compilation on a busy core may take.
def barrier(name: str, timeout_s: float = 3600.0) -> None:
    """Wait until every process gets here (e.g. all have compiled) before the first collective."""
    if jax.process_count() > 1:
        ocp_multihost.get_barrier_sync_fn()(key=f"metarl/{name}", timeout_ms=int(timeout_s * 1000))


def agree(flag: int, name: str, timeout_s: float = 3600.0) -> int:
    """The largest ``flag`` over all processes (e.g. a stop signal one of them received); ``name`` must be new for
    each call (e.g. the generation). Every process first reaches the barrier, so the gather after it waits for none."""
    if jax.process_count() == 1:
        return flag
    barrier(name, timeout_s)
    return int(np.max(multihost_utils.process_allgather(np.int32(flag))))


def assert_same_everywhere(tree: Any) -> None:
    if jax.process_count() > 1:
        multihost_utils.assert_equal(jax.tree.map(rundir.to_host, tree),
                                     "the evolution state differs between processes")
