"""Components for three of PPO's four seams, hand-designed and meta-learned (the optimiser's: ``optimisers.py``).

A component has ``init(key) -> meta_params`` (a pytree; ``{}`` for a fixed rule) and ``apply``:

- value loss:       ``apply(meta_params, value, old_value, target, config) -> per-sample loss``
- policy objective: ``apply(meta_params, ratio, advantage, config) -> per-sample objective`` (maximised)
- schedule:         ``apply(meta_params, progress) -> {field: multiplier}`` (a controller: also ``observed``)

``config`` is the trainer's config, read for hyperparameters such as ``clip_eps``. Everything is
elementwise over the minibatch, so a learned component sees one sample at a time.

A component with ``temporal = True`` is also given the agent's training progress as the keyword
``progress`` (a ``Progress``: the fraction of updates done, and the log of the run's number of
updates), so what it learns can change over training and with the horizon (as in TA-LPO).

``FormulaValueLoss`` and ``FormulaDrift`` are closed forms (no meta-parameters), written by
``python -m metarl.distill`` from a learned one.

Write your own by subclassing nothing: any object with these two methods works. For example a Huber
value loss::

    class Huber:
        def init(self, key): return {}
        def apply(self, meta_params, value, old_value, target, config):
            return optax.huber_loss(value, target)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import zeros

from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.trainer import num_updates


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


def component_at(component, meta_params, inputs: dict, config, value_loss: bool, learned_part: bool = False):
    """A component at named ``inputs`` (``VALUE_LOSS_INPUTS`` or ``DRIFT_INPUTS``, and ``TEMPORAL_INPUTS`` where it
    is temporal): a value loss at errors (prediction - target), else the drift r A - objective (``learned_part``:
    LPO's learned part, where it has one)."""
    temporal = getattr(component, "temporal", False)
    progress = Progress(inputs["progress"], inputs["log_updates"]) if temporal else None
    if value_loss:  # the value and the old one from their errors
        t = inputs["target"]
        return apply_component(component, progress, meta_params, t + inputs["error"], t + inputs["old_error"], t,
                               config)
    r, a = inputs["ratio"], inputs["advantage"]
    if learned_part and hasattr(component, "learned_part"):
        return component.learned_part(meta_params, r, a, progress)
    return r * a - apply_component(component, progress, meta_params, r, a, config)


class Recording:
    """A component unchanged, keeping (on the host) the arrays it is applied to and the progress in ``rows``: what
    training feeds it, as ``metarl.distill`` fits formulas over."""

    def __init__(self, inner):
        self.inner, self.init, self.rows = inner, inner.init, []
        self.temporal = getattr(inner, "temporal", False)

    def apply(self, meta_params, *args, progress=None):
        arrays = [a for a in args if isinstance(a, jax.Array)]  # the config is no array
        extra = [progress.fraction, progress.log_updates] if progress is not None else []
        jax.debug.callback(self.record, *arrays, *extra)
        return apply_component(self.inner, progress, meta_params, *args)

    def record(self, *xs):
        xs = [np.asarray(x, np.float64) for x in xs]
        n = xs[0].size
        idx = np.arange(0, n, max(1, n // 256))  # about 256 per minibatch (evenly strided), to bound memory
        cols = [x.ravel()[idx] if x.size == n else np.full(len(idx), float(x)) for x in xs]
        self.rows.append(np.stack(cols, axis=1))

    def inputs(self, value_loss: bool) -> dict:
        """{input: 1-d array} of the rows by ``VALUE_LOSS_INPUTS`` (errors: prediction - target) or ``DRIFT_INPUTS``."""
        columns = np.concatenate(self.rows).T
        if not value_loss:
            return dict(zip(DRIFT_INPUTS, columns))
        value, old_value, target, *temporal = columns
        return {**value_loss_inputs(value, old_value, target), **dict(zip(TEMPORAL_INPUTS, temporal))}


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


def value_loss_inputs(value, old_value, target, progress: Progress | None = None) -> dict:
    """A value loss's inputs by name (``VALUE_LOSS_INPUTS``); the temporal ones only with ``progress``."""
    table = {"error": value - target, "target": target, "old_error": old_value - target}
    if progress is not None:
        table.update(zip(TEMPORAL_INPUTS, _temporal_features(TEMPORAL_INPUTS, progress, value)))
    return table


def _check_hidden(hidden) -> tuple:
    hidden = tuple(hidden) if isinstance(hidden, (list, tuple)) else hidden
    if (not isinstance(hidden, tuple) or not hidden
            or any(not isinstance(h, int) or isinstance(h, bool) or h <= 0 for h in hidden)):
        raise SettingError("hidden", repr(hidden), "a non-empty list of positive integers")
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
            raise SettingError("inputs", repr(list(self.inputs)),
                               f"a non-empty subset of {', '.join(VALUE_LOSS_INPUTS)}")

    @property
    def net(self):
        return _TanhMLP(tuple(self.hidden))

    def init(self, key):
        return self.net.init(key, jnp.zeros((len(self.inputs),)))

    @property
    def temporal(self) -> bool:
        return any(name in TEMPORAL_INPUTS for name in self.inputs)

    def features(self, value, old_value, target, progress: Progress | None = None):
        table = value_loss_inputs(value, old_value, target, progress if self.temporal else None)
        return jnp.stack([table[name] for name in self.inputs], axis=-1)

    def apply(self, meta_params, value, old_value, target, config=None, progress: Progress | None = None):
        loss = self.net.apply(meta_params, self.features(value, old_value, target, progress))
        if self.residual:
            loss = loss + 0.5 * jnp.square(value - target)
        return loss


def drift_from(learned, ratio, advantage, config, ppo_init: bool):
    """LPO's drift from its learned part: relu(learned [+ PPO's drift (r - clip(r)) A])."""
    if ppo_init:
        clipped = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
        learned = learned + (ratio - clipped) * advantage
    return jax.nn.relu(learned)


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
            raise SettingError("inputs", repr(list(self.inputs)), f"a subset of {', '.join(TEMPORAL_INPUTS)}")

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

    def learned_part(self, meta_params, ratio, advantage, progress: Progress | None = None):
        """What the network adds inside the relu: the drift before PPO's term and the relu."""
        return self.net.apply(meta_params, self.features(ratio, advantage, progress)) - 1e-4

    def drift(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return drift_from(self.learned_part(meta_params, ratio, advantage, progress), ratio, advantage, config,
                          self.ppo_init)

    def apply(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return ratio * advantage - self.drift(meta_params, ratio, advantage, config, progress)


# --- closed forms (what `python -m metarl.distill` reads off a learned component) -----------------

def parse_formula(expression, allowed: tuple, field: str = "expression"):
    """``expression`` as a sympy expression of the variables ``allowed``; a ValueError names ``field``.

    sympy is imported here, not with this module: only formula components need it (the ``distill`` extra)."""
    try:
        import sympy
        from sympy.core.function import AppliedUndef
        from sympy.parsing.sympy_parser import parse_expr
    except ImportError:
        raise SettingError(field, "a formula needs sympy", "after `pip install metarl[distill]`") from None
    if not isinstance(expression, str) or not expression.strip():
        raise SettingError(field, repr(expression), f"a formula of {', '.join(allowed)} as text")
    symbols = {name: sympy.Symbol(name, real=True) for name in allowed}
    try:
        expr = sympy.sympify(parse_expr(expression, local_dict=symbols))
    except Exception as err:  # sympy's parser raises many types for text that is no formula
        raise SettingError(field, f"{expression!r} is not a formula ({type(err).__name__})",
                           f"a formula of {', '.join(allowed)} such as 0.5*error**2") from None
    unknown = sorted({str(s) for s in expr.free_symbols} - set(allowed))
    undefined = sorted({type(f).__name__ for f in expr.atoms(AppliedUndef)})
    if unknown or undefined or not isinstance(expr, sympy.Expr):
        what = f"unknown variable {unknown[0]}" if unknown else (
            f"unknown function {undefined[0]}" if undefined else "not a number-valued formula")
        raise SettingError(field, f"{expression!r} has {what}",
                           f"a formula of {', '.join(allowed)} "
                           "with sympy's functions (exp, log, tanh, Abs, sqrt, Max, Min, ...)")
    return expr


def formula_function(expr) -> tuple[tuple, Any]:
    """``(names, fn)``: ``fn(*inputs named by names)`` evaluates the sympy ``expr`` with jax.numpy, so it
    can be jitted, vmapped and differentiated."""
    import sympy

    names = tuple(sorted(str(s) for s in expr.free_symbols))
    fn = sympy.lambdify([sympy.Symbol(n, real=True) for n in names], expr, modules="jax")
    return names, fn


def _evaluate_formula(names, fn, table: dict, like: jax.Array) -> jax.Array:
    # Added to zeros like the input: a formula that leaves an input out still gives one value per sample.
    return jnp.zeros_like(like) + fn(*(table[n] for n in names))


class _Formula:
    """What a formula component shares: its ``expression`` over the names in ``INPUTS``, parsed once."""

    INPUTS: tuple = ()
    expression: str

    def __post_init__(self):
        self._function  # parsed and checked when built, so a bad formula fails with the config

    @functools.cached_property
    def _function(self):
        return formula_function(parse_formula(self.expression, self.INPUTS))

    @property
    def temporal(self) -> bool:
        return any(name in TEMPORAL_INPUTS for name in self._function[0])

    def init(self, key):
        return {}


@dataclasses.dataclass(frozen=True)
class FormulaValueLoss(_Formula):
    """A value loss written as a formula of ``VALUE_LOSS_INPUTS`` (``error`` = value - target,
    ``target``, ``old_error`` = old_value - target, and the temporal ``progress`` and
    ``log_updates``), e.g. ``0.35*error**2 + 0.1*Abs(error)``; no meta-parameters.

    A formula that uses a temporal input is temporal. ``python -m metarl.distill`` writes these."""

    INPUTS = VALUE_LOSS_INPUTS
    expression: str = "0.5*error**2"

    def apply(self, meta_params, value, old_value, target, config=None, progress: Progress | None = None):
        names, fn = self._function
        return _evaluate_formula(names, fn, value_loss_inputs(value, old_value, target, progress), value)


DRIFT_INPUTS = ("ratio", "advantage") + TEMPORAL_INPUTS


@dataclasses.dataclass(frozen=True)
class FormulaDrift(_Formula):
    """A policy objective r A - drift with LPO's drift, relu(f [+ PPO's drift (r - clip(r)) A]), whose
    learned part f is a formula of ``DRIFT_INPUTS`` (``ratio``, ``advantage`` and the temporal
    ``progress`` and ``log_updates``) in place of LPO's network; no meta-parameters.

    ``ppo_init`` as in ``LPODrift``. ``python -m metarl.distill`` writes these."""

    INPUTS = DRIFT_INPUTS
    expression: str = "0"
    ppo_init: bool = True

    def learned_part(self, meta_params, ratio, advantage, progress: Progress | None = None):
        table = {"ratio": ratio, "advantage": advantage}
        if progress is not None:
            table.update(zip(TEMPORAL_INPUTS, _temporal_features(TEMPORAL_INPUTS, progress, ratio)))
        names, fn = self._function
        return _evaluate_formula(names, fn, table, ratio)

    def drift(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return drift_from(self.learned_part(meta_params, ratio, advantage, progress), ratio, advantage, config,
                          self.ppo_init)

    def apply(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return ratio * advantage - self.drift(meta_params, ratio, advantage, config, progress)


# --- small families: a few to a few dozen meta-parameters, the hand-designed rules as points -------
# Every meta-parameter is an offset from the family's baseline, so zero meta-parameters (es.init_mean:
# zeros) are the hand-designed rule exactly, in loss and in gradient.

def formula_problem(component, value_loss: bool) -> tuple:
    """``(inputs, variables, fitted, arguments)`` of reading ``component`` as a formula (``metarl.distill``): every
    input the formula component takes, those it is fitted over, what is fitted in words, the formula's arguments."""
    temporal = getattr(component, "temporal", False)
    if value_loss:
        # The shipped MLP names its inputs; a component of your own is read over the error (as inspect draws it).
        own = tuple(getattr(component, "inputs", ("error",)))
        variables = tuple(n for n in VALUE_LOSS_INPUTS if n in own or (temporal and n in TEMPORAL_INPUTS))
        return VALUE_LOSS_INPUTS, variables, "the value loss", {}
    ppo_init = hasattr(component, "learned_part") and bool(component.ppo_init)
    fitted = ("the drift's learned part f in relu(f" + (" + PPO's drift)" if ppo_init else ")")
              if hasattr(component, "learned_part") else "the drift r A - objective")
    return DRIFT_INPUTS, ("ratio", "advantage") + (TEMPORAL_INPUTS if temporal else ()), fitted, {"ppo_init": ppo_init}


def value_and_gradient(component, meta_params, inputs: dict, config, value_loss: bool) -> tuple:
    """``component_at`` and, for a value loss, the per-sample gradient w.r.t. the prediction (moving with the error;
    else None)."""
    grad = jax.grad(lambda e: component_at(component, meta_params, {**inputs, "error": e}, config, value_loss).sum())
    value = component_at(component, meta_params, inputs, config, value_loss)
    return value, grad(inputs["error"]) if value_loss else None


def dpo_drift(ratio, advantage, alpha=2.0, beta=0.6):
    """Discovered Policy Optimisation's drift (Lu et al. 2022, "Discovered Policy Optimisation", the
    closed form read off LPO): relu((r - 1) A - alpha tanh((r - 1) A / alpha)) where A >= 0, and
    relu(log(r) A - beta tanh(log(r) A / beta)) where A < 0; published with alpha = 2, beta = 0.6.
    DPO's objective is r A - drift."""
    up = (ratio - 1.0) * advantage
    down = jnp.log(ratio) * advantage
    return jnp.where(advantage >= 0, jax.nn.relu(up - alpha * jnp.tanh(up / alpha)),
                     jax.nn.relu(down - beta * jnp.tanh(down / beta)))


def clip_schedule(coefficients, clip_eps, progress: Progress | None):
    """A clip range over training: clip_eps exp(c1 t + c2 t^2) with t the fraction of training done,
    so zero coefficients are the constant clip_eps."""
    if progress is None:
        return clip_eps
    t = progress.fraction
    return clip_eps * jnp.exp(coefficients[0] * t + coefficients[1] * t * t)


DRIFT_BASIS = ("ppo", "dpo", "quadratic", "log_quadratic", "kl")
DRIFT_BASELINES = ("ppo", "dpo")


@dataclasses.dataclass(frozen=True)
class DriftFamily:
    """A policy objective r A - drift whose drift is relu of a weighted sum of five non-negative drifts,
    each zero (with zero slope) at r = 1, weighted separately for A >= 0 and A < 0:

    - ``ppo``: PPO's drift relu((r - clip(r, 1 - eps, 1 + eps)) A), with eps on a learned schedule;
    - ``dpo``: DPO's drift (``dpo_drift``), with learned alpha = 2 e^a and beta = 0.6 e^b;
    - ``quadratic`` |A| (r - 1)^2, ``log_quadratic`` |A| (log r)^2, and ``kl`` (r - 1) - log r.

    Meta-parameters (14): ``weights`` (2 x 5, rows A >= 0 and A < 0) added to the baseline's one-hot
    weights, ``log_alpha`` and ``log_beta`` (DPO's constants), and ``clip_schedule`` (2, see
    ``clip_schedule``; used with ``schedule``). Zero is ``baseline`` exactly: PPO's clipped surrogate
    (``ppo``) or DPO's objective (``dpo``).
    """

    baseline: str = "ppo"
    schedule: bool = True   # learn the clip range over training (a temporal component)

    def __post_init__(self):
        if self.baseline not in DRIFT_BASELINES:
            raise SettingError("baseline", repr(self.baseline), ", ".join(DRIFT_BASELINES))

    @property
    def temporal(self) -> bool:
        return self.schedule

    def init(self, key):
        return {"weights": jnp.zeros((2, len(DRIFT_BASIS))), "log_alpha": jnp.zeros(()),
                "log_beta": jnp.zeros(()), "clip_schedule": jnp.zeros((2,))}

    def basis(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        """The five drifts, stacked on the last axis in the order of ``DRIFT_BASIS``."""
        eps = clip_schedule(meta_params["clip_schedule"], config.clip_eps, progress if self.schedule else None)
        ppo = jax.nn.relu((ratio - jnp.clip(ratio, 1.0 - eps, 1.0 + eps)) * advantage)
        dpo = dpo_drift(ratio, advantage, 2.0 * jnp.exp(meta_params["log_alpha"]),
                        0.6 * jnp.exp(meta_params["log_beta"]))
        log_r = jnp.log(ratio)
        size = jnp.abs(advantage)
        return jnp.stack([ppo, dpo, size * jnp.square(ratio - 1.0), size * jnp.square(log_r),
                          (ratio - 1.0) - log_r], axis=-1)

    def drift(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        start = jnp.zeros(len(DRIFT_BASIS)).at[DRIFT_BASIS.index(self.baseline)].set(1.0)
        weights = start + meta_params["weights"]
        per_sample = jnp.where((advantage >= 0)[..., None], weights[0], weights[1])
        return jax.nn.relu(jnp.sum(per_sample * self.basis(meta_params, ratio, advantage, config, progress), -1))

    def apply(self, meta_params, ratio, advantage, config, progress: Progress | None = None):
        return ratio * advantage - self.drift(meta_params, ratio, advantage, config, progress)


@dataclasses.dataclass(frozen=True)
class ValueLossFamily:
    """A value loss of four meta-parameters around PPO's (``L2ValueLoss``, clipped or not as
    ``config.clip_value_loss`` says), with e = value - target:

        e^s (L2 + c (clipped - unclipped) / 2) + o relu(e)^2 / 2 + h huber(e)

    ``log_scale`` s weighs the loss (a learned vf_coef), ``clip_mix`` c moves between PPO's unclipped
    (c = -1 from a clipped baseline) and clipped (c = 1 from an unclipped one) losses, ``over`` o
    penalises over-estimates more than under-estimates, and ``huber`` h adds a Huber term (delta 1).
    Zero is PPO's loss exactly.
    """

    def init(self, key):
        return {name: jnp.zeros(()) for name in ("log_scale", "clip_mix", "over", "huber")}

    def apply(self, meta_params, value, old_value, target, config):
        error = value - target
        clipped = old_value + jnp.clip(value - old_value, -config.clip_eps, config.clip_eps)
        towards_clipped = 0.5 * (jnp.maximum(jnp.square(error), jnp.square(clipped - target)) - jnp.square(error))
        base = L2_VALUE_LOSS.apply({}, value, old_value, target, config) + meta_params["clip_mix"] * towards_clipped
        return (jnp.exp(meta_params["log_scale"]) * base + meta_params["over"] * 0.5 * jnp.square(jax.nn.relu(error))
                + meta_params["huber"] * optax.huber_loss(value, target))


# --- schedules: PPO's hyperparameters over training ---------------------------------------------
# A schedule component has ``init(key)`` and ``apply(meta_params, progress) -> {field: multiplier}``,
# the multipliers of float hyperparameters at this point of training (PPO's ``schedule`` seam: the
# learning rate scales each update's step, the others scale the config's value for the update).
# One that declares ``adaptive = True`` is also given ``observed=``, what the previous update saw; one
# that also names fields of ``OPTIONAL_OBSERVED`` in ``observes`` (a static tuple) gets those too, the
# others staying NaN, so that a trainer computes and carries only what some schedule reads.

_NAN = float("nan")  # a Python float, not an array: importing this module must not start a backend


class Observed(NamedTuple):
    """What the agent's previous update saw (NaN before the first update): scalars, the means over
    that update's minibatches. The inputs of an adaptive schedule. The last three are NaN throughout
    unless the schedule names them in ``observes``; each is dimensionless, as a schedule sees neither
    the config nor the environment's reward scale."""

    approx_kl: jax.Array       # KL(old policy || new policy), estimated as mean((r - 1) - log r)
    clip_fraction: jax.Array   # the fraction of samples whose ratio r was outside [1 - clip_eps, 1 + clip_eps]
    # The value loss over half the variance of the update's value targets: 1 - explained variance for
    # PPO's unclipped L2 loss, so 1 for a critic that predicts only the mean return, 0 for a perfect one.
    relative_value_loss: jax.Array = _NAN
    # The gradient's global norm before optax's clipping, over max_grad_norm: above 1 the step was clipped.
    relative_grad_norm: jax.Array = _NAN
    # The change of the mean episode return (the ``episode_return`` metric) over the update, relative to
    # its size: (R - R_prev) / (|R| + |R_prev|), in [-1, 1]; NaN until an episode has ended.
    return_trend: jax.Array = _NAN


OPTIONAL_OBSERVED = ("relative_value_loss", "relative_grad_norm", "return_trend")


SCHEDULED_FIELDS = ("lr", "ent_coef", "clip_eps")


@dataclasses.dataclass(frozen=True)
class ConstantSchedule:
    """PPO's own schedule: no multipliers (the config's values, and its learning-rate annealing)."""

    def init(self, key):
        return {}

    def apply(self, meta_params, progress: Progress):
        return {}


@dataclasses.dataclass(frozen=True)
class LearnedSchedules:
    """Multipliers exp(c0 + c1 t + c2 t^2) of ``fields`` over training, t the fraction of training
    done: a learned scale and shape of the learning rate (on top of ``anneal_lr``), the entropy bonus
    and the clip range (TA-LPO's dynamic clipping, update and entropy annealing). Meta-parameters:
    ``degree + 1`` coefficients per field; zero is the config's own values exactly."""

    fields: tuple = SCHEDULED_FIELDS
    degree: int = 2

    def __post_init__(self):
        unknown = [f for f in self.fields if f not in SCHEDULED_FIELDS]
        if unknown or not self.fields:
            raise SettingError("fields", repr(list(self.fields)), f"one or more of {', '.join(SCHEDULED_FIELDS)}")
        if not (isinstance(self.degree, int) and 0 <= self.degree <= 4):
            raise SettingError("degree", repr(self.degree), "an integer from 0 to 4")

    def init(self, key):
        return {field: jnp.zeros((self.degree + 1,)) for field in self.fields}

    def apply(self, meta_params, progress: Progress):
        powers = progress.fraction ** jnp.arange(self.degree + 1)
        return {field: jnp.exp(jnp.dot(meta_params[field], powers)) for field in self.fields}


CONSTANT_SCHEDULE = ConstantSchedule()


@dataclasses.dataclass(frozen=True)
class AdaptiveSchedules:
    """Multipliers exp(w . x) of ``fields`` that react to what training shows, as a learned controller:
    x = (1, t, k, c), t the fraction of training done, k = clip(log(KL / kl_ref), -3, 3) and
    c = clip_fraction / 0.2 - 0.5, both from the previous update (0 before the first). A hand-tuned
    constant cannot do this: slow the step when the policy moved too far, speed it up when it barely
    moved (PPO's adaptive-KL rule and OPEN's learned optimiser react to the same signals).
    Meta-parameters: 4 per field; zero is the config's own values exactly. Without ``observed`` (a
    figure of the learned part) k = c = 0: KL at kl_ref, a clip fraction of 0.1."""

    fields: tuple = SCHEDULED_FIELDS
    kl_ref: float = 0.01
    adaptive = True

    def __post_init__(self):
        unknown = [f for f in self.fields if f not in SCHEDULED_FIELDS]
        if unknown or not self.fields:
            raise SettingError("fields", repr(list(self.fields)), f"one or more of {', '.join(SCHEDULED_FIELDS)}")
        if not self.kl_ref > 0:
            raise SettingError("kl_ref", repr(self.kl_ref), "a number > 0")

    def init(self, key):
        return {field: jnp.zeros((4,)) for field in self.fields}

    def features(self, progress: Progress, observed: Observed | None = None) -> jax.Array:
        t = progress.fraction
        if observed is None:
            kl = clip = jnp.zeros_like(t)
        else:
            seen = ~jnp.isnan(observed.approx_kl)
            log_kl = jnp.log(jnp.maximum(observed.approx_kl, 1e-12) / self.kl_ref)
            kl = jnp.where(seen, jnp.clip(log_kl, -3.0, 3.0), 0.0)
            clip = jnp.where(seen, observed.clip_fraction / 0.2 - 0.5, 0.0)
        return jnp.stack([jnp.ones_like(t), t, kl, clip])

    def apply(self, meta_params, progress: Progress, observed: Observed | None = None):
        x = self.features(progress, observed)
        return {field: jnp.exp(jnp.dot(meta_params[field], x)) for field in self.fields}


@dataclasses.dataclass(frozen=True)
class HorizonController:
    """Multipliers exp(w . x) of ``fields``, a learned controller that knows its budget as well as
    what training shows: ``AdaptiveSchedules``' inputs plus the run's horizon and three more
    statistics of the previous update. x = (1, t, h, k, c, v, g, r):

    - t: the fraction of training done;
    - h = clip((log U - log ref_updates) / log 4, -3, 3), U the run's number of updates: the budget,
      0 at ``ref_updates``, one unit per factor of 4 (a long run may keep a large step, a short one
      must converge sooner: one controller for any horizon, as in TA-LPO);
    - k = clip(log(KL / kl_ref), -3, 3) and c = clip_fraction / 0.2 - 0.5, as ``AdaptiveSchedules``;
    - v = clip(log relative_value_loss, -3, 3): 0 when the critic explains nothing of the returns'
      variance, -2.3 when it explains 90% (``Observed``; a log ratio, clipped, so finite for any env);
    - g = clip(log relative_grad_norm, -3, 3): 0 at optax's clipping threshold ``max_grad_norm``,
      above 0 when the step was clipped;
    - r = clip(10 return_trend, -3, 3): the mean return's relative change over the update, about 1
      for a 20% gain (``return_trend`` is in [-1, 1] and 0.1 is a large step for one update).

    The statistics k, c, v, g and r are 0 before the first update (``Observed`` NaN) and r also until
    an episode has ended. Meta-parameters: 8 per field; zero is the config's own values exactly
    (every multiplier exp(0) = 1). Without ``observed`` (a figure of the learned part) k = c = v =
    g = r = 0."""

    fields: tuple = SCHEDULED_FIELDS
    ref_updates: int = 256
    kl_ref: float = 0.01
    adaptive = True
    observes = OPTIONAL_OBSERVED
    FEATURES = ("1", "t", "h", "k", "c", "v", "g", "r")

    def __post_init__(self):
        unknown = [f for f in self.fields if f not in SCHEDULED_FIELDS]
        if isinstance(self.fields, str) or unknown or not self.fields:
            raise SettingError("fields", repr(list(self.fields)), f"one or more of {', '.join(SCHEDULED_FIELDS)}")
        if isinstance(self.ref_updates, bool) or not isinstance(self.ref_updates, int) or self.ref_updates < 1:
            raise SettingError("ref_updates", repr(self.ref_updates), "an integer >= 1")
        if isinstance(self.kl_ref, bool) or not isinstance(self.kl_ref, (int, float)) or not self.kl_ref > 0:
            raise SettingError("kl_ref", repr(self.kl_ref), "a number > 0")

    def init(self, key):
        return {field: jnp.zeros((len(self.FEATURES),)) for field in self.fields}

    def features(self, progress: Progress, observed: Observed | None = None) -> jax.Array:
        t = progress.fraction
        horizon = (progress.log_updates - jnp.log(jnp.float32(self.ref_updates))) / jnp.log(jnp.float32(4.0))
        h = jnp.broadcast_to(jnp.clip(horizon, -3.0, 3.0), jnp.shape(t))
        if observed is None:
            stats = [jnp.zeros_like(t)] * 5
        else:
            def log_ratio(x, ref=1.0):  # clipped, so finite whatever the env's scale; 0 when not seen
                x = jnp.asarray(x, jnp.float32)
                return jnp.where(jnp.isnan(x), 0.0, jnp.clip(jnp.log(jnp.maximum(x, 1e-12) / ref), -3.0, 3.0))

            def seen(x, value):
                return jnp.where(jnp.isnan(jnp.asarray(x, jnp.float32)), 0.0, value)
            stats = [log_ratio(observed.approx_kl, self.kl_ref),
                     seen(observed.clip_fraction, observed.clip_fraction / 0.2 - 0.5),
                     log_ratio(observed.relative_value_loss),
                     log_ratio(observed.relative_grad_norm),
                     seen(observed.return_trend, jnp.clip(10.0 * jnp.asarray(observed.return_trend, jnp.float32),
                                                          -3.0, 3.0))]
            stats = [jnp.broadcast_to(s, jnp.shape(t)) for s in stats]
        return jnp.stack([jnp.ones_like(t), t, h, *stats])

    def apply(self, meta_params, progress: Progress, observed: Observed | None = None):
        x = self.features(progress, observed)
        return {field: jnp.exp(jnp.dot(meta_params[field], x)) for field in self.fields}


# --- what a component learned, for `metarl.inspect` (metarl.figures draws these) -----------------------------------
PROGRESS_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def progress_at(config, task_name: str):
    """``fraction -> Progress`` on the horizon of ``config`` (its number of updates), with a note."""
    updates = num_updates(config)
    progress_of = lambda fraction: Progress(jnp.float32(fraction), jnp.float32(np.log(updates)))
    progress_of.note = f"; horizon {updates} updates ({task_name})"
    return progress_of


def value_loss_figures(component, meta_params, config, task_name: str, error_range: float, note: str) -> dict:
    """The loss and its gradient over the error (``loss``; through training if temporal: ``progress``) and a
    heatmap per other input (``inputs``), as the arguments of metarl.plots' value-loss figures."""
    progress_of = progress_at(config, task_name)
    temporal = getattr(component, "temporal", False)
    # The shipped MLP value loss names its extra inputs; a component of your own is drawn over the error.
    extra = [i for i in getattr(component, "inputs", ("error",)) if i not in ("error", *TEMPORAL_INPUTS)]
    fixed_at_zero = lambda inputs: f"; {', '.join(inputs)} fixed at 0" if inputs else ""

    def curves(fraction, errors, **others):
        """The loss and its gradient w.r.t. the prediction (the target and old prediction are data)."""
        def loss(error, old_error=0.0, target=0.0):
            return apply_component(component, progress_of(fraction), meta_params, target + error, target + old_error,
                                   target, config)

        return np.asarray(jax.vmap(loss)(errors, **others)), np.asarray(jax.vmap(jax.grad(loss))(errors, **others))

    errors = np.linspace(-error_range, error_range, 401, dtype=np.float32)
    start = "; at the start of training" if temporal else ""
    figures = {"loss": (errors, *curves(0.0, errors), note + fixed_at_zero(extra) + start), "inputs": {}}
    if temporal:
        figures["progress"] = (errors, {f: curves(f, errors) for f in PROGRESS_POINTS}, note + progress_of.note)
    errors = np.linspace(-error_range, error_range, 121, dtype=np.float32)
    for name in extra:
        span = 4 * error_range if name == "target" else error_range
        other = np.linspace(-span, span, 81, dtype=np.float32)
        e, o = (x.ravel() for x in np.meshgrid(errors, other))
        z, g = (c.reshape(len(other), len(errors)) for c in curves(0.0, e, **{name: o}))
        figures["inputs"][name] = (errors, other, z, g, name, note + fixed_at_zero([i for i in extra if i != name]))
    return figures


def drift_figures(component, meta_params, config, task_name: str) -> dict:
    """``{training fraction: (ratios, advantages, drift, PPO's drift, clip_eps, note)}``: the learned drift beside
    PPO's, at several points of training where it is temporal (else one, at 0, keyed None)."""
    progress_of = progress_at(config, task_name)
    temporal = getattr(component, "temporal", False)
    ratios, advantages = jnp.linspace(0.5, 1.5, 101), jnp.linspace(-2.0, 2.0, 81)
    r, a = jnp.meshgrid(ratios, advantages)
    ppo_drift = np.asarray(r * a - CLIPPED_SURROGATE.apply({}, r, a, config))
    figures = {}
    for fraction in (PROGRESS_POINTS if temporal else (0.0,)):
        # Any objective read as a drift from r A (for LPO exactly its drift), so a component of your own plots too.
        drift = np.asarray(r * a - apply_component(component, progress_of(fraction), meta_params, r, a, config))
        note = f"training progress {fraction:.0%}{progress_of.note}" if temporal else ""
        figures[fraction if temporal else None] = (np.asarray(ratios), np.asarray(advantages), drift, ppo_drift,
                                                   float(config.clip_eps), note)
    return figures


def schedule_figures(component, meta_params, config, task_name: str) -> tuple:
    """``(t, {field: (learned value, PPO's value)})`` over the fraction ``t`` of training done."""
    progress_of = progress_at(config, task_name)
    t = np.linspace(0.0, 1.0, 101)
    scales = jax.vmap(lambda f: component.apply(meta_params, progress_of(f)))(jnp.asarray(t, jnp.float32))
    anneal = (1.0 - t) if getattr(config, "anneal_lr", False) else 1.0
    curves = {}
    for field, scale in scales.items():
        own = np.full_like(t, float(getattr(config, field))) * (anneal if field == "lr" else 1.0)
        curves[field] = (own * np.asarray(scale), own)
    return t, curves
