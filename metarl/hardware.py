"""The host: the cores this process may use (affinity, cgroup quota), pinning, the memory a device holds."""
from __future__ import annotations

import os
from typing import Optional

import jax


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers, SLURM)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    return cores if quota is None else min(cores, max(1, int(quota)))


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
    """Whether JAX's default backend is a GPU or TPU (which starts JAX's backends in this process)."""
    return jax.default_backend() != "cpu"


def pin_cpus() -> None:
    """Keep this process on the cores ``METARL_CPUS`` names (``"0"``, ``"2,3"``), before XLA starts its
    thread pools, which size themselves by the cores the process may use: a process pinned after
    they started runs each generation about 1.4x slower (docs/devices.md)."""
    cpus = os.environ.get("METARL_CPUS", "").strip()
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def memory_per_device() -> Optional[int]:
    """Bytes one device can hold: the accelerator's own limit, or on CPU the machine's physical
    memory (CPU devices share it); None when unknown."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        return (device.memory_stats() or {}).get("bytes_limit")
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
