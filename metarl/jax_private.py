"""Every use of JAX's private modules (``jax._src``) in metarl, each behind one function, for want
of a public API."""
from __future__ import annotations

from jax._src import distributed


def coordination_client():
    """The coordination service's client of a multi-process run (its key-value store and barriers). JAX has
    no public accessor for it (``jax.distributed`` exposes only initialize/shutdown)."""
    return distributed.global_state.client

