"""Shared pieces of the trainers' configs: static fields, and checks that skip traced values.

Every trainer config is a ``flax.struct.dataclass``: fields made with ``static`` set shapes or the
program (changing them recompiles); plain float fields are pytree leaves that may be traced arrays,
so ``jax.vmap`` over a population of hyperparameters compiles once. Checks see a traced value only
as a tracer and leave it alone; they run on concrete values at the edge.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import numpy as np
from flax import struct

from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.schema import INT32_MAX


def static(default: Any) -> Any:
    return struct.field(pytree_node=False, default=default)


def concrete(x: Any) -> Optional[float]:
    """The Python float of a scalar ``x``, or None when ``x`` is traced or not a scalar."""
    if isinstance(x, jax.core.Tracer):
        return None
    arr = np.asarray(x)
    return float(arr) if arr.ndim == 0 else None




def check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not minimum <= value <= INT32_MAX):
        raise SettingError(name, repr(value), f"an integer from {minimum} to {INT32_MAX}")


_ALLOWED = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "tuple": "a list such as [64, 64]"}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "float":  # a Python number, or an array/tracer when vmapped over hyperparameters
        return not isinstance(value, (bool, str)) and (isinstance(value, (int, float, np.number))
                                                       or hasattr(value, "dtype"))
    if kind == "int":
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    return isinstance(value, {"str": str, "tuple": (tuple, list)}[kind])


def check_types(config: Any) -> None:
    """One-line ValueError naming the first field whose value has the wrong type for its annotation
    (e.g. a string where a learning rate goes), before any check does arithmetic on it."""
    for field in dataclasses.fields(config):
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
        value = getattr(config, field.name)
        if kind in _ALLOWED and not _type_ok(kind, value):
            raise SettingError(field.name, repr(value), _ALLOWED[kind])


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
        raise SettingError(name, repr(v), " and ".join(s for s in (lo, hi) if s) or "a finite number")


def with_overrides(config: Any, meta_params: Optional[dict], allowed: tuple) -> Any:
    """``config`` with the float hyperparameters named in ``meta_params`` replaced: the seam through
    which an outer loop hands a trainer its hyperparameters as (possibly traced) arrays."""
    if meta_params is None:
        return config
    unknown = set(meta_params) - set(allowed)
    if unknown:
        raise SettingError("meta_params", f"unknown keys {sorted(unknown)}", ", ".join(allowed))
    return config.replace(**meta_params)
