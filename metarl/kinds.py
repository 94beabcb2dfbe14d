"""What a run meta-learns (``component.kind``): one registry entry per kind (docs/extending.md)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from metarl.inner_loops import plugins
from metarl.errors import ConfigError, layer_errors
from metarl.inner_loops.schema import INT32_MAX
from metarl.outer_loops import streams
from metarl.outer_loops.search_space import HyperparamSpace


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind whose learned part is a component (``init(key)``, ``apply(meta_params, ...)``) handed to
    ``make_train(config, **{seam: component})`` and its meta-parameters to ``train(key, {seam: meta})``."""
    name: str
    seam: Optional[str]                         # a make_train keyword the trainer's SEAMS lists; None: hyperparams
    component: Optional[str] = None             # component._target_ where the config names none
    baseline_label: Callable[[Any], str] = lambda inner: "the trainer's default"  # label from the trainer config
    plot: Optional[Callable | str] = None       # (run_dir, cfg, task, meta, info, out, error_range) -> paths
    formula: Optional[str] = None               # the formula component metarl.distill fits, if any

    def __str__(self) -> str:
        return self.name

    def figures(self, *args) -> list:
        with layer_errors("kind"):
            plot = plugins.locate(self.plot) if isinstance(self.plot, str) else self.plot
        return plot(*args)

    def build(self, spec: dict, trainer_fields: list[str]):
        """The component from ``component.*`` (without ``kind``)."""
        target = spec.pop(plugins.TARGET, None) or self.component
        if target is None:
            raise ConfigError(f"component._target_: not given; allowed: a component class for kind {self.name}")
        with layer_errors("component"):
            component = plugins.instantiate(target, spec)
        if not (callable(getattr(component, "init", None)) and callable(getattr(component, "apply", None))):
            raise ConfigError(f"component._target_: {target} has no init(key) and apply(meta_params, ...); "
                              "allowed: a component class with both (see metarl.inner_loops.components)")
        return component

    def trainer(self, module, inner, component) -> Callable:
        """``meta -> train(key)`` on one task."""
        train_with_seam = module.make_train(inner, **{self.seam: component})
        return lambda meta: (lambda key: train_with_seam(key, {self.seam: meta}))

    def start(self, component, inner, init_mean: str, seed: int):
        """``(template, init_mean, describe_search)``: shape, start (``es.init_mean``), per-generation log or None."""
        # The search runs over one flat vector indexed in int32: count before allocating anything.
        shapes = jax.eval_shape(component.init, streams.evolution(seed))
        num_dims = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
        if num_dims > INT32_MAX:
            field, what = (("component.hidden", f"{list(component.hidden)!r}") if hasattr(component, "hidden")
                           else ("component", type(component).__name__))
            raise ConfigError(f"{field}: {what} makes {num_dims:,} meta-parameters; "
                              f"allowed: at most {INT32_MAX:,} (smaller layers)")
        template = component.init(streams.evolution(seed))
        return template, (jax.tree.map(jnp.zeros_like, template) if init_mean == "zeros" else template), None

    def values(self, component, meta) -> Optional[dict]:
        """The meta-parameters as named numbers for reports, where they are such."""
        return None


class Hyperparams(Kind):
    """The trainer's float hyperparameters (its config's pytree fields) in a ``HyperparamSpace``."""
    def build(self, spec: dict, trainer_fields: list[str]):
        if plugins.TARGET in spec:
            raise ConfigError(f"component._target_: {spec[plugins.TARGET]!r} with kind hyperparams; allowed: "
                              f"a component class for kinds {', '.join(n for n, k in KINDS.items() if k.seam)}")
        for key in [k for k in spec if k != "search"]:
            raise ConfigError(f"component.{key}: unknown setting; allowed: kind, search")
        with layer_errors("component"):
            return HyperparamSpace.from_config(spec.get("search", {}), trainer_fields)

    def trainer(self, module, inner, component) -> Callable:
        return lambda meta: module.make_train(inner.replace(**component.decode(meta)))

    def start(self, component, inner, init_mean: str, seed: int):
        template = component.template()
        start = {name: getattr(inner, name) for name in component.names}
        with layer_errors("component"):  # a start outside the bounds
            return template, (component.encode(start) if init_mean == "init" else template), component.describe

    def values(self, component, meta) -> dict:
        return {k: float(v) for k, v in component.decode(meta).items()}


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Make ``kind`` available as ``component.kind=<kind.name>``."""
    KINDS[kind.name] = kind
    return kind


def get(name: Any) -> Kind:
    """A registered name, or the dotted path of a ``Kind`` of your own (``my_pkg.kinds.STEP_SCALE``), registered
    here so that the command line and a saved config reach it without code."""
    allowed = f"{', '.join(KINDS)}, or the dotted path of a metarl.kinds.Kind"
    if isinstance(name, str) and name not in KINDS and "." in name:
        with layer_errors("kind"):
            found = plugins.locate_instance(name, plugins.TARGET, Kind, allowed)
        return KINDS.setdefault(name, dataclasses.replace(found, name=name))
    if name not in KINDS:
        raise ConfigError(f"component.kind: {name!r}; allowed: {allowed}")
    return KINDS[name]


VALUE_LOSS = register(Kind(
    "value_loss", seam="value_loss", component="metarl.inner_loops.components.MLPValueLoss",
    baseline_label=lambda inner: "L2 value loss" + (" (clipped)" if getattr(inner, "clip_value_loss", False) else ""),
    plot="metarl.figures.value_loss_plots", formula="metarl.inner_loops.components.FormulaValueLoss"))
POLICY_OBJECTIVE = register(Kind(
    "policy_objective", seam="policy_objective", component="metarl.inner_loops.components.LPODrift",
    baseline_label=lambda inner: "PPO clipped objective", plot="metarl.figures.policy_objective_plots",
    formula="metarl.inner_loops.components.FormulaDrift"))
HYPERPARAMS = register(Hyperparams("hyperparams", seam=None, baseline_label=lambda inner: "trainer config",
                                   plot="metarl.figures.hyperparams_plots"))
SCHEDULE = register(Kind(
    "schedule", seam="schedule", component="metarl.inner_loops.components.LearnedSchedules",
    baseline_label=lambda inner: ("PPO's hyperparameters"
                                  + (" (lr annealed)" if getattr(inner, "anneal_lr", False) else "")),
    plot="metarl.figures.schedule_plots"))
OPTIMISER = register(Kind(
    "optimiser", seam="optimiser", component="metarl.inner_loops.optimisers.LearnedOptimiser",
    baseline_label=lambda inner: f"Adam, lr {inner.lr:g}" + (" annealed" if getattr(inner, "anneal_lr", False) else ""),
    plot="metarl.figures.component_plots"))
