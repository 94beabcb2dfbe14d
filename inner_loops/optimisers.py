"""PPO's optimiser seam: optax's Adam as PPO has always used it, and OPEN's learned optimiser.

An optimiser component has ``init(key) -> meta_params`` and ``apply(meta_params, config) -> an optax
GradientTransformation``, built once per training from the trainer's config (its lr, max_grad_norm,
anneal_lr and sizes). The trainer applies the transformation's updates to its parameters after every
minibatch. One that declares ``context = True`` is a ``GradientTransformationExtraArgs`` whose
``update(grads, state, params, **context)`` also gets what OPEN's optimiser reads beyond the gradient:
``progress`` (a ``Progress``), ``epoch_fraction`` (the proportion of the current batch's epochs done,
0 to 1), ``dormancy`` (a tree like the parameters: each weight's output neuron's mean activation over
the layer's mean, ``dormancy``) and ``key`` (for a stochastic update).

    class SGD:
        def init(self, key): return {"log_lr": jnp.zeros(())}
        def apply(self, meta_params, config): return optax.sgd(1e-3 * jnp.exp(meta_params["log_lr"]))
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from metarl.inner_loops.components import Progress, _check_hidden
from metarl.inner_loops.networks import _ACTIVATIONS, Dense


def adam(config, eps: float = 1e-5) -> optax.GradientTransformation:
    """PPO's optimiser: the gradient clipped to a global norm of ``max_grad_norm``, then Adam with ``lr``,
    annealed linearly to 0 over training where ``anneal_lr``."""
    if config.anneal_lr:
        steps_per_update, n_updates = config.update_epochs * config.num_minibatches, config.num_updates

        def lr_schedule(count):
            return config.lr * (1.0 - (count // steps_per_update) / n_updates)
    else:
        lr_schedule = config.lr
    # On one flat vector (optax.flatten): the clipping's norm and Adam are a few operations
    # rather than a few per parameter array: 7-15% less compile time at 1 and 8 agents.
    return optax.flatten(optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                     optax.adam(lr_schedule, eps=eps)))


@dataclasses.dataclass(frozen=True)
class Adam:
    """PPO's own optimiser (``adam``): no meta-parameters."""

    eps: float = 1e-5

    def init(self, key):
        return {}

    def apply(self, meta_params, config):
        return adam(config, self.eps)


ADAM = Adam()


# --- OPEN (Goldie et al. 2024) -------------------------------------------------------------------

DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)   # OPEN's momentum timescales
# The inputs OPEN normalises per parameter tensor (each divided by its root mean square over the tensor),
# then those it gives as they are: the same for a whole tensor, or per neuron.
NORMALISED = ("parameter", "sign(g)", "log|g|") + tuple(f"{s}(m{d:g})" for d in DECAYS for s in ("sign", "log|m|"))
AS_IS = ("training proportion", "epoch proportion", "layer proportion", "dormancy")


def _rms_normalise(x: jax.Array, tensors: jax.Array, sizes: jax.Array) -> jax.Array:
    """Each feature of ``x`` (parameters, features) over its root mean square on the parameter's tensor
    (``tensors``: each parameter's tensor index; ``sizes``: each tensor's number of parameters)."""
    mean_square = jax.ops.segment_sum(jnp.square(x), tensors, len(sizes)) / sizes[:, None]
    return x * jax.lax.rsqrt(1e-5 + mean_square)[tensors]


def _sign_log(x: jax.Array) -> list:
    """Gradient conditioning (Optim4RL, as OPEN): the sign and the log of the magnitude."""
    return [jnp.sign(x), jnp.log(jnp.abs(x) + 1e-13)]


class _UpdateNet(nn.Module):
    """OPEN's per-parameter network without its GRU: dense layers with layer norm and relu."""
    hidden: tuple
    outputs: int

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.relu(nn.LayerNorm(use_bias=False, use_scale=False)(nn.Dense(width)(x)))
        return nn.Dense(self.outputs)(x)


def layer_positions(params) -> Any:
    """A float per parameter array: its layer's position in its tower, 0 (first) to 1 (last), as OPEN's
    layer proportion. PPO's parameters are ``{"params": {tower: {layer: {kernel, bias}}, "log_std"}}``; an array
    outside a tower of layers (``log_std``) counts as a last layer."""
    def position(path, leaf):
        keys = [getattr(k, "key", None) for k in path]
        if len(keys) == 4 and keys[0] == "params":
            layers = sorted(params["params"][keys[1]], key=lambda n: (len(n), n))   # Dense_2 before Dense_10
            return layers.index(keys[2]) / max(len(layers) - 1, 1)
        return 1.0
    return jax.tree_util.tree_map_with_path(position, params)


def actor_mask(params) -> Any:
    """1 for the actor's parameters (and ``log_std``), 0 for the critic's: where OPEN adds its noise."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: float(getattr(path[1], "key", "") != "critic") if len(path) > 1 else 1.0, params)


def dormancy(network, params, obs, activation: str) -> Any:
    """Per parameter, its output neuron's mean |activation| on ``obs`` over the mean of its layer's
    (OPEN's dormancy, 1 for a neuron as active as its layer's average, 0 for a dead one): a tree like
    ``params``, a kernel's value repeated along its inputs. Hidden layers are read after the activation,
    the heads before; arrays outside a layer (``log_std``) get 1."""
    _, state = network.apply(params, obs, capture_intermediates=lambda mdl, _: isinstance(mdl, Dense),
                             mutable=["intermediates"])
    seen = state["intermediates"]

    def of(path, leaf):
        keys = [getattr(k, "key", None) for k in path]
        if len(keys) != 4 or keys[0] != "params":
            return jnp.ones_like(leaf)
        tower = params["params"][keys[1]]
        y = seen[keys[1]][keys[2]]["__call__"][0]
        last = sorted(tower, key=lambda n: (len(n), n))[-1]
        a = jnp.abs(y if keys[2] == last else _ACTIVATIONS[activation](y)).reshape(-1, y.shape[-1]).mean(0)
        return jnp.broadcast_to(a / (a.mean() + 1e-11), leaf.shape)
    return jax.tree_util.tree_map_with_path(of, params)


class OpenState(NamedTuple):
    momenta: jax.Array   # (len(DECAYS), parameters): the momenta of the flat parameter vector
    base: Any            # Adam's state, with ``residual``


def _layout(params) -> tuple:
    """Constants over the flat parameter vector (``ravel_pytree``'s order): each parameter's tensor index,
    each tensor's size, each parameter's layer position and actor mask."""
    leaves = jax.tree.leaves(params)
    sizes = np.array([np.size(x) for x in leaves])
    spread = lambda tree: np.concatenate([np.full(n, v, np.float32)  # noqa: E731
                                          for n, v in zip(sizes, jax.tree.leaves(tree))])
    return (np.repeat(np.arange(len(leaves)), sizes).astype(np.int32), sizes.astype(np.float32),
            spread(layer_positions(params)), spread(actor_mask(params)))


@dataclasses.dataclass(frozen=True)
class LearnedOptimiser:
    """OPEN's learned optimiser (Goldie et al., "Can Learned Optimization Make Reinforcement Learning Less
    Difficult?", 2024) for PPO, with a per-parameter MLP in place of OPEN's GRU.

    Per parameter, after PPO's clipping of the gradient g to a global norm of ``max_grad_norm``, the network
    reads the 19 inputs of OPEN: the parameter, sign(g) and log|g|, and the sign and log magnitude of six
    momenta m <- b m + (1 - b) g at the timescales b of ``DECAYS`` (these 15 each divided by their root mean
    square over the parameter's tensor), then the proportion of training done, the proportion of the
    current batch's epochs done, the layer's position in its tower (``layer_positions``) and the neuron's
    dormancy (``dormancy``). Its outputs (o1, o2, o3) give the step u = 0.001 o1 exp(0.001 o2), plus, with
    ``stochastic``, the actor's noise 0.001 o3 N(0, 1) (OPEN's learned stochasticity); the parameters move by
    -(u - mean u), the mean over all parameters taken out as OPEN does. With ``residual`` the step is added
    to Adam's as PPO configures it (``adam``), so zero meta-parameters are Adam (to float rounding) and
    evolution starts from it; without, the step is the network's alone, as in OPEN.
    """

    hidden: tuple = (16,)
    stochastic: bool = True
    residual: bool = False
    step_mult: float = 1e-3
    exp_mult: float = 1e-3
    context = True

    def __post_init__(self):
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))

    @property
    def net(self):
        return _UpdateNet(self.hidden, 3 if self.stochastic else 2)

    def init(self, key):
        return self.net.init(key, jnp.zeros((len(NORMALISED) + len(AS_IS),)))

    def step(self, meta_params, param, grad, momenta, progress, epoch_fraction, layer, dorm, tensors=None,
             sizes=None):
        """``(u, noise scale)`` for flat arrays of parameters (``momenta``: (len(DECAYS), n)): the step before the
        noise and the mean subtraction, and the standard deviation of the noise before the actor mask. The
        normalised inputs are normalised per tensor (``tensors``, ``sizes`` as ``_layout``; None: one tensor)."""
        n = jnp.shape(param)[0]
        if tensors is None:
            tensors, sizes = jnp.zeros((n,), jnp.int32), jnp.full((1,), n, jnp.float32)
        normalised = jnp.stack([param, *_sign_log(grad), *(f for m in momenta for f in _sign_log(m))], -1)
        as_is = [jnp.broadcast_to(jnp.asarray(v, jnp.float32), (n,))
                 for v in (progress.fraction, epoch_fraction, layer, dorm)]
        out = self.net.apply(meta_params, jnp.concatenate([_rms_normalise(normalised, tensors, sizes),
                                                           jnp.stack(as_is, -1)], -1))
        u = self.step_mult * out[..., 0] * jnp.exp(self.exp_mult * out[..., 1])
        return u, (self.step_mult * out[..., 2] if self.stochastic else jnp.zeros((n,)))

    def apply(self, meta_params, config):
        base = adam(config) if self.residual else None
        clip = optax.clip_by_global_norm(config.max_grad_norm)

        def init(params):
            size = ravel_pytree(params)[0].shape[0]
            return OpenState(jnp.zeros((len(DECAYS), size), jnp.float32), base.init(params) if base else None)

        # On one flat vector, as optax.flatten does for Adam: a few large operations, not a few per array.
        def update(grads, state, params, *, progress: Progress, epoch_fraction, dormancy, key):
            tensors, sizes, layers, mask = _layout(params)
            flat_params, unravel = ravel_pytree(params)
            g = ravel_pytree(clip.update(grads, None)[0])[0]
            decays = jnp.asarray(DECAYS, jnp.float32)[:, None]
            momenta = decays * state.momenta + (1.0 - decays) * g
            u, noise = self.step(meta_params, flat_params, g, momenta, progress, epoch_fraction, layers,
                                 ravel_pytree(dormancy)[0], tensors, sizes)
            u = u + mask * noise * jax.random.normal(key, u.shape)
            updates, base_state = unravel(-(u - u.mean())), state.base
            if base:
                adam_updates, base_state = base.update(grads, base_state, params)  # Adam clips for itself
                updates = jax.tree.map(jnp.add, adam_updates, updates)
            return updates, OpenState(momenta, base_state)

        return optax.GradientTransformationExtraArgs(init, update)

    # --- what it learned, for `metarl.inspect` (metarl.figures.component_plots draws these) --------------
    def figures(self, meta_params, config, span: float = 0.02) -> dict:
        """``{file: (x, rows, xlabel, note)}``: line panels (``rows`` of ``{title, ylabel, curves}``) of the
        learned change of a parameter against Adam's, each over one tensor of 201 parameters whose gradients (or
        momenta) are the x axis. Adam is drawn at its steady state, -lr sign(g) (lr annealed where configured);
        a residual optimiser's curves are the sum of that and the network's."""
        x = jnp.linspace(-span, span, 201)
        zero = jnp.zeros_like(x)
        lr = lambda t: float(config.lr) * ((1.0 - t) if config.anneal_lr else 1.0)  # noqa: E731
        adam_change = lambda t, along: -lr(t) * np.sign(np.asarray(along))  # noqa: E731

        def change(grad, momentum, t, layer=0.5, noise=False):
            """The parameter's change (or, with ``noise``, its noise's std) at training fraction ``t``."""
            steps, scale = self.step(meta_params, zero, grad, jnp.stack([momentum] * len(DECAYS)),
                                     Progress(jnp.float32(t), jnp.float32(0.0)), 0.0, layer, jnp.ones_like(x))
            if noise:
                return np.abs(np.asarray(scale))
            return -np.asarray(steps) + (adam_change(t, momentum if not np.any(grad) else grad) if self.residual
                                         else 0.0)

        fractions = (0.0, 1 / 3, 2 / 3, 1.0)   # as many as plots.formula_figure has colours
        at = lambda f: [(f"learned, {t:.0%} of training done", f(t), "formula") for t in fractions]  # noqa: E731
        adam = (f"Adam at the start, -lr sign (lr {float(config.lr):g})", adam_change(0.0, x), "baseline")
        rows = [[{"title": "steady gradient: g and every momentum equal", "ylabel": "change of the parameter",
                  "curves": [adam, *at(lambda t: change(x, x, t))]},
                 {"title": "fresh gradient g, every momentum 0", "ylabel": "change of the parameter",
                  "curves": [adam, *at(lambda t: change(x, zero, t))]},
                 {"title": "momentum alone: g = 0, every momentum = x", "ylabel": "change of the parameter",
                  "curves": [adam, *at(lambda t: change(zero, x, t))]}]]
        residual = "; residual: Adam's change plus the network's" if self.residual else ""
        note = ("one minibatch's change of a parameter against its gradient g, for a tensor of 201 parameters "
                "(values 0, middle layer, dormancy 1, first epoch of a batch), before the mean change over all "
                "parameters is taken out" + residual)
        t = np.linspace(0.0, 1.0, 51)
        layers = (0.0, 0.5, 1.0)
        mean_of = lambda layer, noise=False: np.array(  # noqa: E731
            [np.mean(np.abs(change(x, x, f, layer, noise))) for f in t])
        step_rows = [[{"title": "mean step size over training (steady gradients)", "ylabel": "mean |change|",
                       "curves": [(f"Adam, lr {float(config.lr):g}" + (" annealed" if config.anneal_lr else ""),
                                   np.array([lr(f) for f in t]), "baseline"),
                                  *[(f"learned, layer position {p:g}", mean_of(p), "formula") for p in layers]]}]]
        if self.stochastic:
            step_rows[0].append({"title": "learned noise added to the actor's parameters", "ylabel": "noise std",
                                 "curves": [(f"learned, layer position {p:g}", mean_of(p, True), "formula")
                                            for p in layers]})
        step_note = (f"mean over steady gradients in [-{span:g}, {span:g}]; layer position 0: a tower's first layer, "
                     "1: its output" + residual)
        return {"optimiser_update.png": (np.asarray(x), rows, "gradient g (after clipping), or momentum", note),
                "optimiser_step_size.png": (t, step_rows, "fraction of training done", step_note)}
