"""Small actor-critic networks and action distributions, written out so they vmap and fuse well."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.initializers import constant, orthogonal

_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "elu": nn.elu}
ACTIVATIONS = tuple(_ACTIVATIONS)


# Layers with at most this many outputs are computed one output column at a time.
NARROW_OUTPUTS = 6


class Dense(nn.Module):
    """``nn.Dense`` (same parameters, names and initialisation) that computes a narrow layer, such as a
    policy head with a few actions, as one matrix-vector product per output column.

    XLA's CPU matrix products are slow when one side is a few columns wide: for a (128, 64) x (64, 2)
    head vmapped over 8 agents, the forward product, the weight gradient and the input gradient (a
    contraction over 2) took about 290 microseconds, and the column form, whose gradients autodiff
    writes as matrix-vector products and a broadcast multiply, about 55 (32 agents: 1080 -> 190).
    That head made PPO's update about a quarter slower on CPU. With 6 columns the column form was
    still faster (250 -> 150 at 8 agents), with 8 it was mixed and with 12 slower, hence the limit.
    """

    features: int
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(x)[-1], self.features))
        bias = self.param("bias", self.bias_init, (self.features,))
        if self.features <= NARROW_OUTPUTS:
            y = jnp.stack([x @ kernel[:, j] for j in range(self.features)], axis=-1)
        else:
            y = x @ kernel
        return y + bias


class MLP(nn.Module):
    """Hidden layers with orthogonal(sqrt 2) init, then a linear head of scale ``out_scale``."""

    hidden: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(Dense(width, kernel_init=orthogonal(math.sqrt(2)), bias_init=constant(0.0))(x))
        return Dense(self.out_dim, kernel_init=orthogonal(self.out_scale), bias_init=constant(0.0))(x)


class ActorCritic(nn.Module):
    """Separate actor and critic towers (PureJaxRL's layout).

    Discrete: the actor returns logits. Continuous: the actor returns the Gaussian mean and a
    state-independent ``log_std`` parameter. ``__call__`` returns ``(actor_out, log_std, value)``
    where ``log_std`` is ``None`` for discrete actions.
    """

    action_dim: int
    continuous: bool
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    def setup(self):
        self.actor = MLP(self.hidden, self.action_dim, self.activation, out_scale=0.01)
        self.critic = MLP(self.hidden, 1, self.activation, out_scale=1.0)
        if self.continuous:
            self.log_std = self.param("log_std", constant(0.0), (self.action_dim,))

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)

    def policy(self, obs):
        out = self.actor(obs)
        return (out, self.log_std) if self.continuous else (out, None)

    def value(self, obs):
        return self.critic(obs)[..., 0]


# --- distributions -------------------------------------------------------------------------------
# Written by hand (no distrax): a few fused expressions beat a distribution object's overhead.

def categorical_log_prob(logits, action):
    # A one-hot product, not take_along_axis: the gradient of a gather is a scatter, which XLA runs
    # as a slow loop on CPU (this alone made PPO's update 1.5x faster).
    logp_all = jax.nn.log_softmax(logits)
    return jnp.sum(logp_all * jax.nn.one_hot(action, logits.shape[-1], dtype=logp_all.dtype), axis=-1)


def categorical_entropy(logits):
    logp_all = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_prob(mean, log_std, action):
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * _LOG_2PI, axis=-1)


def gaussian_entropy(log_std, batch_shape):
    ent = jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI))
    return jnp.broadcast_to(ent, batch_shape)
