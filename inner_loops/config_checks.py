"""Shared pieces of the trainers' configs: static fields, the constraints their fields declare, and their check.

Every trainer config is a ``flax.struct.dataclass``: fields made with ``static`` set shapes or the
program (changing them recompiles); plain float fields are pytree leaves that may be traced arrays,
so ``jax.vmap`` over a population of hyperparameters compiles once. Each field declares what it allows
with pydantic's vocabulary (``Field(gt=0)``, ``Literal``), and ``check_fields`` checks the concrete values
by ``schema.validate``, the run config's path; a traced value is left alone.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Optional

import jax
import numpy as np
from flax import struct
from pydantic import Field, WrapValidator
from pydantic_core import ValidationError, core_schema

from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.schema import INT32_MAX, Problem, validate


def _as_python(value: Any, handler: Any) -> Any:
    """NumPy's integers and booleans and a list as Python's int, bool and tuple, which pydantic's strict types take;
    a refusal shows the value as given."""
    try:
        return handler(value.item() if isinstance(value, (np.integer, np.bool_))
                       else tuple(value) if isinstance(value, list) else value)
    except ValidationError as err:
        raise ValidationError.from_exception_data(err.title, [
            {"type": e["type"], "loc": e["loc"], "input": value, **({"ctx": e["ctx"]} if "ctx" in e else {})}
            for e in err.errors()]) from None


AsPython = WrapValidator(_as_python)   # last in an ``Annotated``: around the constraints
Flag = Annotated[bool, AsPython]
Items = Annotated[tuple, AsPython]   # a tuple or a list
Count = Annotated[int, Field(ge=1, le=INT32_MAX, description=f"an integer from 1 to {INT32_MAX}"), AsPython]
# A float hyperparameter's range refuses inf and nan by its own description (pydantic's ``allow_inf_nan=False``
# would say "a finite number"): ``lt=inf`` closes a range open above.
Positive = Annotated[float, Field(gt=0, lt=math.inf, allow_inf_nan=True, description="> 0.0")]
NonNegative = Annotated[float, Field(ge=0, lt=math.inf, allow_inf_nan=True, description=">= 0.0")]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=True, description=">= 0.0 and <= 1.0")]


class Choice(Problem):
    """``Annotated[Literal[...], Choice()]``: a string first (5 is refused as "a string"), then one of the
    ``Literal``'s values; a refusal reads as ``text`` says (``Problem``), the value as given by default."""

    def __get_pydantic_core_schema__(self, source, handler):
        return core_schema.chain_schema([core_schema.str_schema(), handler(source)])


def static(default: Any) -> Any:
    return struct.field(pytree_node=False, default=default)


def check_fields(config: Any) -> None:
    """A ``SettingError`` naming the first field (in order) whose value its annotation refuses, by ``schema.validate``.
    A float hyperparameter is checked as a Python float, and not at all while traced (vmapped) or an array."""
    values = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.metadata.get("pytree_node", True) and not isinstance(value, (str, bool)) and (
                isinstance(value, (int, float)) or hasattr(value, "dtype")):
            if isinstance(value, jax.core.Tracer) or np.ndim(value):
                continue
            value = float(value)
        values[field.name] = value
    validate(type(config), values)


def with_overrides(config: Any, meta_params: Optional[dict], allowed: tuple) -> Any:
    """``config`` with the float hyperparameters named in ``meta_params`` replaced: the seam through
    which an outer loop hands a trainer its hyperparameters as (possibly traced) arrays."""
    if meta_params is None:
        return config
    unknown = set(meta_params) - set(allowed)
    if unknown:
        raise SettingError("meta_params", f"unknown keys {sorted(unknown)}", ", ".join(allowed))
    return config.replace(**meta_params)
