"""Every use of JAX's private modules (``jax._src``) in metarl, each behind one function, for want
of a public API."""
from __future__ import annotations

from jax._src import distributed


def coordination_client():
    """The coordination service's client of a multi-process run, for its key-value store (barriers go
    through Orbax's public ``multihost.get_barrier_sync_fn``). Neither JAX nor Orbax exposes the store
    (``jax.distributed`` has only initialize/shutdown)."""
    return distributed.global_state.client

