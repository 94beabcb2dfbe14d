"""A ReLU MLP on one flat parameter vector, with a hand-written backward pass and a fused Adam.

Why it exists: DQN runs one small gradient step per environment step, so on CPU its speed is set by
the number of operations per step and by how the matrix products are laid out, not by arithmetic.
Here

- each layer's bias is the last row of its weight matrix (inputs get a column of ones), so a layer is
  one matrix product forward and one backward, with no separate bias reductions;
- the backward pass multiplies by explicitly transposed operands: XLA's CPU matrix products with a
  transposed operand (what autodiff emits for ``x^T dz`` and ``dz W^T``) are up to 2x slower than a
  plain product plus a transpose copy, and the gradient of the first layer's input is not computed;
- the parameters, Adam moments and target network are flat vectors, so the optimizer step and the
  target update are a few fused elementwise passes instead of a few per layer.

``tests/test_dqn.py`` checks the gradients against ``jax.grad`` of the same forward pass, and the
parameters convert to and from flax ``QNetwork`` parameters (``Dense_i/kernel``, ``Dense_i/bias``).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp


def _transposed(x: jax.Array) -> jax.Array:
    # The barrier keeps XLA from folding the transpose back into the matrix product.
    return jax.lax.optimization_barrier(x.T)


def _with_ones(x: jax.Array) -> jax.Array:
    return jnp.concatenate([x, jnp.ones((x.shape[0], 1), x.dtype)], axis=1)


class FlatMLP(NamedTuple):
    sizes: tuple  # (in, hidden..., out)

    @property
    def shapes(self) -> tuple:
        return tuple((i + 1, o) for i, o in zip(self.sizes[:-1], self.sizes[1:]))

    @property
    def size(self) -> int:
        return sum(r * c for r, c in self.shapes)

    def weights(self, flat: jax.Array) -> list[jax.Array]:
        """The (in + 1, out) weight matrices, bias in the last row."""
        out, start = [], 0
        for r, c in self.shapes:
            out.append(flat[start:start + r * c].reshape(r, c))
            start += r * c
        return out

    def forward(self, flat: jax.Array, x: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
        """Outputs for a batch ``x`` (B, in), and each layer's input with its ones column."""
        inputs = []
        h = x
        ws = self.weights(flat)
        for i, w in enumerate(ws):
            a = _with_ones(h)
            inputs.append(a)
            z = a @ w
            h = jax.nn.relu(z) if i < len(ws) - 1 else z
        return h, inputs

    def backward(self, flat: jax.Array, inputs: Sequence[jax.Array], d_out: jax.Array) -> jax.Array:
        """The flat gradient of ``sum(d_out * forward(flat, x))`` given ``forward``'s ``inputs``.

        ``inputs`` may hold more rows than ``d_out`` (e.g. rows only used for acting); the first
        ``d_out.shape[0]`` are the ones that count.
        """
        rows = d_out.shape[0]
        ws = self.weights(flat)
        grads = [None] * len(ws)
        dz = d_out
        for i in reversed(range(len(ws))):
            a = inputs[i][:rows]
            grads[i] = _transposed(a) @ dz
            if i > 0:
                dh = dz @ _transposed(ws[i][:-1])
                dz = jnp.where(a[:, :-1] > 0, dh, 0.0)  # a = relu(z) > 0 exactly where z > 0
        return jnp.concatenate([g.reshape(-1) for g in grads])

    def from_flax(self, params: dict) -> jax.Array:
        layers = params["params"]
        return jnp.concatenate([
            jnp.concatenate([layers[f"Dense_{i}"]["kernel"], layers[f"Dense_{i}"]["bias"][None]], axis=0).reshape(-1)
            for i in range(len(self.shapes))
        ])

    def to_flax(self, flat: jax.Array) -> dict:
        return {"params": {f"Dense_{i}": {"kernel": w[:-1], "bias": w[-1]} for i, w in enumerate(self.weights(flat))}}


class Adam(NamedTuple):
    moments: jax.Array  # (2, n): first and second moment
    count: jax.Array  # int32, updates applied


def adam_init(flat: jax.Array) -> Adam:
    return Adam(jnp.zeros((2,) + flat.shape, flat.dtype), jnp.int32(0))


def adam_step(flat: jax.Array, grad: jax.Array, state: Adam, lr, eps,
              b1: float = 0.9, b2: float = 0.999) -> tuple[jax.Array, Adam]:
    """optax.adam's update (bias-corrected, eps outside the square root)."""
    count = state.count + 1
    # Scalars first, so each element costs one square root and one division.
    step_size = lr / (1.0 - b1 ** count.astype(jnp.float32))
    inv_c2 = 1.0 / (1.0 - b2 ** count.astype(jnp.float32))
    moments = jnp.stack([b1 * state.moments[0] + (1.0 - b1) * grad,
                         b2 * state.moments[1] + (1.0 - b2) * grad * grad])
    return flat - step_size * moments[0] / (jnp.sqrt(moments[1] * inv_c2) + eps), Adam(moments, count)
