"""Shared pieces of the trainers' configs: static fields, and checks that skip traced values.

Every trainer config is a ``flax.struct.dataclass``: fields made with ``static`` set shapes or the
program (changing them recompiles); plain float fields are pytree leaves that may be traced arrays,
so ``jax.vmap`` over a population of hyperparameters compiles once. Checks see a traced value only
as a tracer and leave it alone; they run on concrete values at the edge.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
from flax import struct


def static(default: Any) -> Any:
    return struct.field(pytree_node=False, default=default)


def concrete(x: Any) -> Optional[float]:
    """The Python float of a scalar ``x``, or None when ``x`` is traced or not a scalar."""
    if isinstance(x, jax.core.Tracer):
        return None
    arr = np.asarray(x)
    return float(arr) if arr.ndim == 0 else None


def check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: {value!r}; allowed: an integer >= {minimum}")


def check_range(name: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
                low_open: bool = False) -> None:
    """One-line ValueError naming ``name`` unless ``value`` (when concrete) lies in the range."""
    v = concrete(value)
    if v is None:
        return
    too_low = low is not None and (v <= low if low_open else v < low)
    too_high = high is not None and v > high
    if too_low or too_high or not np.isfinite(v):
        lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        raise ValueError(f"{name}: {v!r}; allowed: {' and '.join(s for s in (lo, hi) if s)}")


def with_overrides(config: Any, meta_params: Optional[dict], allowed: tuple) -> Any:
    """``config`` with the float hyperparameters named in ``meta_params`` replaced: the seam through
    which an outer loop hands a trainer its hyperparameters as (possibly traced) arrays."""
    if meta_params is None:
        return config
    unknown = set(meta_params) - set(allowed)
    if unknown:
        raise ValueError(f"meta_params: unknown keys {sorted(unknown)}; allowed: {', '.join(allowed)}")
    return config.replace(**meta_params)
