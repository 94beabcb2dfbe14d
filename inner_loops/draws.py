"""Many kinds of random numbers from one draw of random bits.

On a CPU, JAX compiles each random-number call site (a split, a uniform, a Gumbel draw, ...) as a loop of
its own, 0.2-0.8 s of LLVM time each; a trainer that needs noise, keys and indices every update pays
for every site. ``draw`` makes all of them from one ``jax.random.bits`` call and slices the bits into
what each part needs, made from its bits as JAX makes it from a key's: floats as ``jax.random.uniform``,
Gumbel and normal noise as ``jax.random.gumbel`` and ``jax.random.normal`` (tests/test_ppo.py compares
them), and keys as ``jax.random.split`` makes keys, the key's hash of a counter.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def uniform_from_bits(bits: jax.Array, low: float = 0.0) -> jax.Array:
    """float32 in [low, 1) from uint32 bits, as ``jax.random.uniform(key, shape, minval=low)`` makes them."""
    floats = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return jnp.maximum(low, floats * (1.0 - low) + low)


def gumbel_from_bits(bits: jax.Array) -> jax.Array:
    """Standard Gumbel noise, -log(-log(u)), as ``jax.random.gumbel`` makes it."""
    return -jnp.log(-jnp.log(uniform_from_bits(bits, float(np.finfo(np.float32).tiny))))


def normal_from_bits(bits: jax.Array) -> jax.Array:
    """Standard normal noise, sqrt(2) erfinv(u) with u in (-1, 1), as ``jax.random.normal`` makes it."""
    low = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    return np.float32(math.sqrt(2.0)) * jax.lax.erf_inv(uniform_from_bits(bits, low))


def draw(key: jax.Array, parts: dict) -> dict:
    """Random bits for every part in one call: ``parts`` maps a name to ``(shape, kind)``, kind ``bits``
    (uint32), ``uniform`` (float32 in [0, 1)), ``gumbel``, ``normal`` or ``keys`` (keys of ``key``'s kind,
    one per element of ``shape``); returns ``{name: array of that shape}``."""
    words = jax.random.key_data(key).shape[-1]
    sizes = {name: math.prod(shape) * (words if kind == "keys" else 1) for name, (shape, kind) in parts.items()}
    bits = jax.random.bits(key, (sum(sizes.values()),), jnp.uint32)
    make = {"bits": lambda b: b, "uniform": uniform_from_bits, "gumbel": gumbel_from_bits,
            "normal": normal_from_bits}
    out, start = {}, 0
    for name, (shape, kind) in parts.items():
        part = bits[start:start + sizes[name]]
        start += sizes[name]
        if kind == "keys":
            out[name] = jax.random.wrap_key_data(part.reshape(*shape, words), impl=jax.random.key_impl(key))
        else:
            out[name] = make[kind](part.reshape(shape))
    return out
