"""Components that plug into PPO's two seams, hand-designed and meta-learned.

A component has ``init(key) -> meta_params`` (a pytree; ``{}`` for a fixed rule) and ``apply``:

- value loss:       ``apply(meta_params, value, old_value, target, config) -> per-sample loss``
- policy objective: ``apply(meta_params, ratio, advantage, config) -> per-sample objective`` (maximised)

``config`` is the trainer's config, read for hyperparameters such as ``clip_eps``. Everything is
elementwise over the minibatch, so a learned component sees one sample at a time.

A component with ``temporal = True`` is also given the agent's training progress as the keyword
``progress`` (a ``Progress``: the fraction of updates done, and the log of the run's number of
updates), so what it learns can change over training and with the horizon (as in TA-LPO).

Write your own by subclassing nothing: any object with these two methods works. For example a Huber
value loss::

    class Huber:
        def init(self, key): return {}
        def apply(self, meta_params, value, old_value, target, config):
            return optax.huber_loss(value, target)
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.initializers import zeros


class Component(Protocol):
    def init(self, key: jax.Array) -> Any: ...

    def apply(self, meta_params: Any, *inputs: jax.Array) -> jax.Array: ...


class Progress(NamedTuple):
    """Where the agent is in its training: scalars, the same for every sample of an update."""

    fraction: jax.Array      # updates done / updates in the run, in [0, 1)
    log_updates: jax.Array   # log of the run's number of updates: how long the horizon is


def training_progress(update: jax.Array, num_updates: int) -> Progress:
    return Progress(jnp.asarray(update, jnp.float32) / num_updates, jnp.log(jnp.float32(num_updates)))


def apply_component(component, progress: Progress | None, *args):
    """``component.apply(*args)``, with ``progress=`` for a component that declares ``temporal``."""
    if getattr(component, "temporal", False):
        if progress is None:
            raise ValueError(f"{type(component).__name__} is temporal but the trainer gave no progress")
        return component.apply(*args, progress=progress)
    return component.apply(*args)


TEMPORAL_INPUTS = ("progress", "log_updates")


def _temporal_features(names, progress: Progress, like: jax.Array) -> list:
    table = {"progress": progress.fraction, "log_updates": progress.log_updates}
    return [jnp.broadcast_to(table[n], like.shape) for n in names]


# --- hand-designed defaults ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class L2ValueLoss:
    """PPO's value loss: 0.5 (v - target)^2, or its pessimistic clipped form when
    ``config.clip_value_loss`` (the prediction may move at most ``clip_eps`` from the old one)."""

    def init(self, key):
        return {}

    def apply(self, meta_params, value, old_value, target, config):
        loss = jnp.square(value - target)
        if config.clip_value_loss:
            clipped = old_value + jnp.clip(value - old_value, -config.clip_eps, config.clip_eps)
            loss = jnp.maximum(loss, jnp.square(clipped - target))
        return 0.5 * loss


@dataclasses.dataclass(frozen=True)
class ClippedSurrogate:
    """PPO's objective: min(r A, clip(r, 1 - eps, 1 + eps) A)."""

    def init(self, key):
        return {}

    def apply(self, meta_params, ratio, advantage, config):
        clipped = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
        return jnp.minimum(ratio * advantage, clipped * advantage)


L2_VALUE_LOSS = L2ValueLoss()
CLIPPED_SURROGATE = ClippedSurrogate()


# --- meta-learned ---------------------------------------------------------------------------------

class _TanhMLP(nn.Module):
    hidden: tuple
    use_bias: bool = True
    zero_init: bool = False  # a zero last layer makes the component start as an exact no-op

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width, use_bias=self.use_bias)(x))
        kernel_init = zeros if self.zero_init else nn.initializers.lecun_normal()
        return nn.Dense(1, use_bias=self.use_bias, kernel_init=kernel_init)(x)[..., 0]


VALUE_LOSS_INPUTS = ("error", "target", "old_error") + TEMPORAL_INPUTS


def _check_hidden(hidden) -> tuple:
    hidden = tuple(hidden) if isinstance(hidden, (list, tuple)) else hidden
    if (not isinstance(hidden, tuple) or not hidden
            or any(not isinstance(h, int) or isinstance(h, bool) or h <= 0 for h in hidden)):
        raise ValueError(f"hidden: {hidden!r}; allowed: a non-empty list of positive integers")
    return hidden


@dataclasses.dataclass(frozen=True)
class MLPValueLoss:
    """A value loss learned as an MLP of the prediction error (PureJaxRL's meta-learned value loss).

    ``inputs`` chooses the MLP's features: ``error`` = value - target (the published set-up),
    ``target``, ``old_error`` = old_value - target, and the temporal ``progress`` (fraction of
    training done) and ``log_updates`` (log of the run's number of updates). With ``residual`` the
    MLP is added to L2, so a zero network is exactly PPO's unclipped loss and evolution starts from
    the hand-designed rule.
    """

    hidden: tuple = (64, 64)
    inputs: tuple = ("error",)
    residual: bool = False

    def __post_init__(self):
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        bad = [i for i in self.inputs if i not in VALUE_LOSS_INPUTS]
        if bad or not self.inputs:
            raise ValueError(f"inputs: {list(self.inputs)!r}; allowed: a non-empty subset of "
                             f"{', '.join(VALUE_LOSS_INPUTS)}")

    @property
    def net(self):
        return _TanhMLP(tuple(self.hidden))

    def init(self, key):
        return self.net.init(key, jnp.zeros((len(self.inputs),)))

    @property
    def temporal(self) -> bool:
        return any(name in TEMPORAL_INPUTS for name in self.inputs)

    def features(self, value, old_value, target, progress: Progress | None = None):
        table = {"error": value - target, "target": target, "old_error": old_value - target}
        if self.temporal:
            table.update(zip(TEMPORAL_INPUTS, _temporal_features(TEMPORAL_INPUTS, progress, value)))
        return jnp.stack([table[name] for name in self.inputs], axis=-1)

    def apply(self, meta_params, value, old_value, target, config=None, progress: Progress | None = None):
        loss = self.net.apply(meta_params, self.features(value, old_value, target, progress))
        if self.residual:
            loss = loss + 0.5 * jnp.square(value - target)
        return loss


@dataclasses.dataclass(frozen=True)
class LPODrift:
    """Learned Policy Optimisation (Lu et al. 2022): objective = r A - drift(r, A).

    The drift is an MLP without biases over (1 - r), (1 - r)^2, log r, (log r)^2 and each of these
    times A, made non-negative by relu(net - 1e-4). With ``ppo_init`` PPO's own drift,
    relu((r - clip(r)) A), is added inside the relu, so a zero network is PPO's clipped objective.
    ``inputs`` may add the temporal ``progress`` and ``log_updates`` (TA-LPO's training-progress
    inputs) as further features.
    """

    hidden: tuple = (128,)
    ppo_init: bool = True
    inputs: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        bad = [i for i in self.inputs if i not in TEMPORAL_INPUTS]
        if bad:
            raise ValueError(f"inputs: {list(self.inputs)!r}; allowed: a subset of {', '.join(TEMPORAL_INPUTS)}")

    @property
    def temporal(self) -> bool:
        return bool(self.inputs)

    @property
    def net(self):
        return _TanhMLP(tuple(self.hidden), use_bias=False)

    def init(self, key):
        return self.net.init(key, jnp.zeros((8 + len(self.inputs),)))

    def features(self, ratio, advantage, progress: Progress | None = None):
        one_minus = 1.0 - ratio
        log_r = jnp.log(ratio)
        base = jnp.stack([one_minus, one_minus**2, log_r, log_r**2], axis=-1)
        extra = [f[..., None] for f in _temporal_features(self.inputs, progress, ratio)] if self.inputs else []
        return jnp.concatenate([base, base * advantage[..., None], *extra], axis=-1)

    def drift(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        raw = self.net.apply(meta_params, self.features(ratio, advantage, progress)) - 1e-4
        if self.ppo_init:
            clipped = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
            raw = raw + (ratio - clipped) * advantage
        return jax.nn.relu(raw)

    def apply(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return ratio * advantage - self.drift(meta_params, ratio, advantage, config, progress)
