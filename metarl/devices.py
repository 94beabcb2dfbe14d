"""Devices: a mesh over every device for the population axis, and multi-process start-up."""
from __future__ import annotations

from typing import Any, Optional

import jax
from jax.sharding import NamedSharding, PartitionSpec as P


def population_mesh(popsize: int):
    """A 1-D mesh named ``pop`` over every device, or None with a single device.

    The population must divide over the devices: an uneven split would need padding members whose
    results are dropped, which costs compute for nothing; we refuse it at start-up instead.
    """
    n = jax.device_count()
    if n == 1:
        return None
    if popsize % n:
        raise ValueError(f"es.popsize: {popsize} does not divide over {n} devices; "
                         f"allowed: a multiple of {n}")
    return jax.make_mesh((n,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))


def replicate(tree: Any, mesh: Optional[Any]) -> Any:
    """Place a host pytree on every device of ``mesh`` (fully replicated), or leave it to jit."""
    if mesh is None:
        return tree
    return jax.device_put(tree, NamedSharding(mesh, P()))


def enable_compilation_cache() -> None:
    """Keep compiled generations on disk, so that a resumed or repeated run skips compilation.

    ``JAX_COMPILATION_CACHE_DIR`` chooses the directory (default ``~/.cache/metarl/jax``);
    ``METARL_COMPILATION_CACHE=0`` turns it off.
    """
    import os

    if os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/metarl/jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def setup(devices_cfg) -> None:
    """Join a multi-process run when one is configured; a single process needs nothing."""
    import os

    enable_compilation_cache()

    coordinator = devices_cfg.coordinator_address or os.environ.get("METARL_COORDINATOR")
    if devices_cfg.num_processes > 1 and coordinator:
        process_id = devices_cfg.process_id
        if process_id is None:
            process_id = int(os.environ.get("METARL_PROCESS_ID", "0"))
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=devices_cfg.num_processes,
                                   process_id=process_id)
