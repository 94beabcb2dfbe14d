"""Devices (docs/devices.md): a mesh over every device for the population axis, multi-process start-up,
and the processes' agreement. The evolution state is one global, fully replicated array: each process
runs the same ask/tell on it, and the population's members are split over the devices.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from metarl import checkpoints, compilation, hardware, jax_private


def population_mesh(popsize: int):
    """A 1-D mesh named ``pop`` over every device (of every process), or None with a single device.
    The population must divide over the devices: padding members would cost compute for nothing."""
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


def replicate(tree: Any, mesh: Optional[Any]) -> Any:
    """Place a host pytree on every device of ``mesh`` as global, fully replicated arrays, as a jitted
    call over a multi-process mesh needs: each process builds its own shards from its (identical) host
    copy, so nothing crosses processes. Without a mesh the tree is left to jit."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())

    def place(x):
        value = checkpoints.to_host(x)
        return checkpoints.from_host(jax.make_array_from_callback(value.shape, sharding, lambda index: value[index]), x)

    return jax.tree.map(place, tree)


def _env_int(*names: str) -> Optional[int]:
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return None


def auto_processes(popsize: int) -> int:
    """``devices.num_processes=auto``: one process with an accelerator (it drives every local device);
    on a CPU host, one per usable core, reduced to the largest count over whose devices (this process's
    CPU devices each) the population divides; one if none, whose start-up then says why."""
    if hardware.has_accelerator():
        return 1
    per_process = jax.local_device_count()
    return max(n for n in range(1, hardware.usable_cores() + 1) if n == 1 or popsize % (n * per_process) == 0)


def distributed_settings(devices_cfg, popsize: int) -> tuple[int, Optional[str], Optional[int]]:
    """``(num_processes, coordinator_address, process_id)`` from the config, else ``METARL_*`` (set by
    ``metarl.launch`` or by hand on each host), else SLURM's; with none, ``auto`` counts this machine's cores."""
    num = devices_cfg.num_processes if devices_cfg.num_processes != "auto" else None
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


def setup(devices_cfg, popsize: int) -> None:
    """Join a multi-process run when one is configured; a single process needs nothing."""
    hardware.pin_cpus()
    compilation.enable_compilation_cache()
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
def barrier(name: str, timeout_s: float = 3600.0) -> None:
    """Wait until every process gets here (e.g. all have compiled) before the first collective."""
    if jax.process_count() > 1:
        jax_private.coordination_client().wait_at_barrier(f"metarl/{name}", int(timeout_s * 1000))


def agree(flag: int, name: str, timeout_s: float = 3600.0) -> int:
    """The largest ``flag`` over all processes (e.g. a stop signal one of them received); ``name``
    must be new for each call (e.g. the generation)."""
    if jax.process_count() == 1:
        return flag
    client = jax_private.coordination_client()
    client.key_value_set(f"metarl/{name}/{jax.process_index()}", str(int(flag)))
    return max(int(client.blocking_key_value_get(f"metarl/{name}/{i}", int(timeout_s * 1000)))
               for i in range(jax.process_count()))


def assert_same_everywhere(tree: Any) -> None:
    if jax.process_count() > 1:
        multihost_utils.assert_equal(jax.tree.map(checkpoints.to_host, tree),
                                     "the evolution state differs between processes")
