"""PPO's actor and critic as one fused network on a flat parameter vector, with a hand-written backward pass.

Why it exists: on CPU a PPO update's speed is set by the number of operations and by the layout of
the matrix products, not by arithmetic (the networks are 64 wide). Here

- the actor and critic towers run side by side as one network twice as wide: the first layer is
  ``[W_actor | W_critic]`` and every later layer is block-diagonal, so a forward pass is one matrix
  product per layer instead of two; the zero off-diagonal blocks are kept at zero by masking their
  gradients (Adam then never moves them: zero moments give a zero step);
- each layer's bias is the last row of its weight matrix (inputs carry a column of ones), so a layer
  is one product forward and one backward, with no separate bias reductions;
- the backward pass multiplies by explicitly transposed operands (see ``flat_mlp``: XLA's CPU matrix
  products with a transposed operand, which autodiff emits, are up to 2x slower than a transpose
  copy plus a plain product), and the gradient of the observations is not computed;
- parameters, gradients and Adam moments are one flat vector, so gradient clipping and Adam are a
  few fused elementwise passes instead of a few per parameter array.

The output has ``action_dim + 1`` columns: the actor's logits (or Gaussian mean), then the value.
A continuous actor's state-independent ``log_std`` sits at the end of the flat vector. The loss on
top of the outputs is differentiated by ``jax.grad`` (see ``ppo.py``); only the network is done by
hand. ``tests/test_ppo.py`` checks the gradients against ``jax.grad`` of the flax ``ActorCritic``,
and ``from_flax`` / ``to_flax`` convert the parameters both ways.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from metarl.inner_loops.flat_mlp import _transposed, _with_ones


class FlatActorCritic(NamedTuple):
    obs_dim: int
    hidden: tuple  # one tower's widths; the fused layers are twice as wide
    action_dim: int
    continuous: bool
    activation: Callable

    @property
    def shapes(self) -> tuple:
        """The fused (in + 1, out) weight matrices, bias in the last row."""
        widths = [self.obs_dim] + [2 * h for h in self.hidden] + [self.action_dim + 1]
        return tuple((i + 1, o) for i, o in zip(widths[:-1], widths[1:]))

    @property
    def size(self) -> int:
        return sum(r * c for r, c in self.shapes) + (self.action_dim if self.continuous else 0)

    def _blocks(self, i: int) -> tuple:
        """Layer i's (actor rows, actor cols, critic rows, critic cols) as slices; bias row excluded."""
        h_in = self.hidden[i - 1]
        h_out = self.hidden[i] if i < len(self.hidden) else self.action_dim
        cols_c = slice(h_out, 2 * h_out) if i < len(self.hidden) else slice(self.action_dim, self.action_dim + 1)
        return slice(0, h_in), slice(0, h_out), slice(h_in, 2 * h_in), cols_c

    def masks(self) -> list:
        """Per layer, 1.0 where a weight is a real parameter and 0.0 in the off-diagonal blocks
        (``None`` for the first layer, which is dense)."""
        out = [None]
        for i, (r, c) in enumerate(self.shapes[1:], start=1):
            m = np.zeros((r, c), np.float32)
            ra, ca, rc, cc = self._blocks(i)
            m[ra, ca] = 1.0
            m[rc, cc] = 1.0
            m[-1, :] = 1.0  # biases
            out.append(m)
        return out

    def weights(self, flat: jax.Array) -> list:
        out, start = [], 0
        for r, c in self.shapes:
            out.append(flat[start:start + r * c].reshape(r, c))
            start += r * c
        return out

    def log_std(self, flat: jax.Array):
        return flat[-self.action_dim:] if self.continuous else None

    def forward(self, flat: jax.Array, x1: jax.Array, keep: bool = False):
        """Outputs ``(B, action_dim + 1)`` for inputs ``x1`` (B, obs_dim + 1) whose last column is ones.

        With ``keep`` also returns what ``backward`` needs: each layer's input and the activations'
        vector-Jacobian products.
        """
        ws = self.weights(flat)
        a, inputs, act_vjps = x1, [], []
        for i, w in enumerate(ws):
            inputs.append(a)
            z = a @ w
            if i < len(ws) - 1:
                h, vjp = jax.vjp(self.activation, z)
                act_vjps.append(vjp)
                a = _with_ones(h)
        return (z, inputs, act_vjps) if keep else z

    def backward(self, flat: jax.Array, inputs, act_vjps, d_out: jax.Array, d_log_std=None) -> jax.Array:
        """The flat gradient of ``sum(d_out * forward(flat, x1))`` (plus ``d_log_std`` for log_std)."""
        ws = self.weights(flat)
        masks = self.masks()
        grads = [None] * len(ws)
        dz = d_out
        for i in reversed(range(len(ws))):
            g = _transposed(inputs[i]) @ dz
            grads[i] = g if masks[i] is None else g * masks[i]
            if i > 0:
                dh = dz @ _transposed(ws[i][:-1])
                (dz,) = act_vjps[i - 1](dh)
        parts = [g.reshape(-1) for g in grads]
        if self.continuous:
            parts.append(d_log_std)
        return jnp.concatenate(parts)

    # --- flax ActorCritic parameters -------------------------------------------------------------

    def from_flax(self, params: dict) -> jax.Array:
        p = params["params"]
        parts = []
        for i, (r, c) in enumerate(self.shapes):
            a, cr = p["actor"][f"Dense_{i}"], p["critic"][f"Dense_{i}"]
            w = jnp.zeros((r, c), jnp.float32)
            if i == 0:
                h = self.hidden[0]
                w = w.at[:-1, :h].set(a["kernel"]).at[:-1, h:].set(cr["kernel"])
                w = w.at[-1, :h].set(a["bias"]).at[-1, h:].set(cr["bias"])
            else:
                ra, ca, rc, cc = self._blocks(i)
                w = w.at[ra, ca].set(a["kernel"]).at[rc, cc].set(cr["kernel"])
                w = w.at[-1, ca].set(a["bias"]).at[-1, cc].set(cr["bias"])
            parts.append(w.reshape(-1))
        if self.continuous:
            parts.append(jnp.asarray(p["log_std"], jnp.float32))
        return jnp.concatenate(parts)

    def to_flax(self, flat: jax.Array) -> dict:
        actor, critic = {}, {}
        for i, w in enumerate(self.weights(flat)):
            if i == 0:
                h = self.hidden[0]
                ra, ca, rc, cc = slice(None), slice(0, h), slice(None), slice(h, 2 * h)
            else:
                ra, ca, rc, cc = self._blocks(i)
            actor[f"Dense_{i}"] = {"bias": w[-1, ca], "kernel": w[:-1][ra, ca]}
            critic[f"Dense_{i}"] = {"bias": w[-1, cc], "kernel": w[:-1][rc, cc]}
        p = {"actor": actor, "critic": critic}
        if self.continuous:
            p["log_std"] = self.log_std(flat)
        return {"params": p}
