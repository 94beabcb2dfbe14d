"""The search settings of the evolution driver (``ESConfig``) and the evosax strategies they name:
plain data, importable before JAX starts. evosax's algorithms start JAX's backends when they are
imported, and a run must read and check its config before it sets up its devices
(``jax.distributed`` has to come first), so evosax and optax are only imported when a setting is
checked or a strategy is built (``strategy_tables``, ``make_strategy``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, Literal, Optional

from pydantic import Field

from metarl.inner_loops.plugins import constructor_arguments, instantiate, locate
from metarl.inner_loops.schema import to_dict, validate
from metarl.inner_loops.errors import SettingError

OPTIMIZERS = ("adam", "sgd", "clipup")
SHAPINGS = ("centered_rank", "standardize", "normalize", "identity", "weights")   # evosax's fitness shapings


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """Search settings. ``lr``/``optimizer`` apply to strategies that take a gradient step (their
    constructor has an ``optimizer``); ``std_init`` to those with an initial search width (a
    ``std_init`` parameter or a ``std_schedule``); ``antithetic`` to those with
    ``use_antithetic_sampling``; ``fitness_shaping=None`` keeps the strategy's own default. ``std_decay`` and
    ``lr_decay`` multiply the search width and the step size once per generation (OPEN's 0.999; 1: constant).
    ``target`` names a strategy class of your own, built with ``args``; it takes the place of
    ``strategy``. A config file writes it ``_target_``, Hydra's name for a class to build (the
    field's ``alias``)."""

    strategy: str = "Open_ES"
    popsize: Annotated[int, Field(ge=2, description="an integer >= 2")] = 16
    std_init: Annotated[float, Field(gt=0, description="a finite number > 0")] = 0.03
    lr: Annotated[float, Field(gt=0, description="a finite number > 0")] = 0.05
    optimizer: Literal[OPTIMIZERS] = "adam"
    adam_b1: Annotated[float, Field(ge=0, lt=1, description=">= 0 and < 1")] = 0.9
    std_decay: Annotated[float, Field(gt=0, le=1, description="> 0 and <= 1 (1: no decay)")] = 1.0
    lr_decay: Annotated[float, Field(gt=0, le=1, description="> 0 and <= 1 (1: no decay)")] = 1.0
    fitness_shaping: Annotated[Optional[Literal[SHAPINGS]],
                               Field(description=f"{', '.join(SHAPINGS)} or null (the strategy's default)")] = None
    antithetic: bool = True
    target: Optional[str] = dataclasses.field(default=None, metadata={"alias": "_target_"})
    args: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.target or self.strategy

    def state_floats(self, num_dims: int) -> int:
        """Floats of the strategy's own state that grow faster than the population (CMA-ES's two num_dims^2
        matrices); what a memory estimate adds to the population's."""
        return 2 * num_dims ** 2 if self.strategy == "CMA_ES" and self.target is None else 0

    def strategy_class(self):
        if self.target is not None:
            return locate(self.target)
        STRATEGIES, UNSUPPORTED, _ = strategy_tables()
        if self.strategy in UNSUPPORTED:
            raise SettingError("strategy", f"{self.strategy} does not work with this driver "
                               f"({UNSUPPORTED[self.strategy]})", ", ".join(STRATEGIES))
        if self.strategy not in STRATEGIES:
            raise SettingError("strategy", f"unknown strategy {self.strategy!r}",
                               f"{', '.join(STRATEGIES)} "
                               f"(not: {', '.join(UNSUPPORTED)}, see docs/extending.md)")
        return STRATEGIES[self.strategy]

    def validate(self) -> "ESConfig":
        """Every check of the settings, the strategy's own included (evosax asserts an even population
        for antithetic sampling): it is built on a one-number template, so that they fail before
        anything is compiled."""
        import jax.numpy as jnp

        make_strategy(self, {"x": jnp.zeros((1,), jnp.float32)})
        return self

    def _check_fields(self) -> None:
        validate(type(self), to_dict(self))   # the fields' own constraints (above), as the harness checks them
        if self.args and self.target is None:
            raise SettingError("args", repr(self.args), "empty unless _target_ names a strategy class")


_POPULATION_BASED = "population-based: its init(key, population, fitness, params) starts from a scored " \
                    "population, while the driver starts a search from one mean"
_SEVERAL_MEANS = "Stein variational: keeps num_populations search distributions, while the driver " \
                 "follows one mean"


@functools.cache
def strategy_tables() -> tuple[dict, dict, dict]:
    """``(STRATEGIES, UNSUPPORTED, FITNESS_SHAPING)``: every evosax strategy the driver runs, by its
    evosax name (``strategy``); those it cannot run, each with the reason (shown in
    the strategy's error); and evosax's fitness shapings by name."""
    from evosax.algorithms import algorithms
    from evosax.algorithms.population_based.base import PopulationBasedAlgorithm
    from evosax.core import fitness_shaping as shaping

    unsupported = {
        **{name: _POPULATION_BASED for name, cls in algorithms.items() if issubclass(cls, PopulationBasedAlgorithm)},
        "RandomSearch": "needs sampling_fn, a function drawing each candidate, which a name cannot give; "
                        "name a subclass that supplies one with _target_",
        "SV_CMA_ES": _SEVERAL_MEANS,
        "SV_Open_ES": _SEVERAL_MEANS,
    }
    strategies = {name: cls for name, cls in algorithms.items() if name not in unsupported}
    shapings = {name: getattr(shaping, f"{name}_fitness_shaping_fn") for name in SHAPINGS}
    return strategies, unsupported, shapings


# Constructor arguments the driver fills from ESConfig; a custom strategy may not take them in `args`.
_DRIVER_ARGUMENTS = ("population_size", "solution", "optimizer", "std_schedule", "use_antithetic_sampling",
                     "fitness_shaping_fn")


def _driver_kwargs(config: ESConfig, cls) -> dict[str, Any]:
    """The driver's settings as constructor arguments, for those the strategy takes."""
    import optax

    takes = set(constructor_arguments(cls)[0])
    kwargs: dict[str, Any] = {}
    # Stepped once per generation (evosax counts its generations and optax its updates, one per tell).
    decayed = lambda value, decay: (value if decay == 1.0 else  # noqa: E731
                                    optax.exponential_decay(value, transition_steps=1, decay_rate=decay))
    if config.fitness_shaping is not None and "fitness_shaping_fn" in takes:
        kwargs["fitness_shaping_fn"] = strategy_tables()[2][config.fitness_shaping]
    if "optimizer" in takes:
        # ClipUp (Toklu et al. 2020), PGPE's usual optimiser: normalised gradient, momentum, clipped speed.
        kwargs["optimizer"] = {
            "adam": lambda: optax.adam(decayed(config.lr, config.lr_decay), b1=config.adam_b1),
            "sgd": lambda: optax.sgd(decayed(config.lr, config.lr_decay)),
            "clipup": lambda: optax.chain(optax.normalize_by_update_norm(scale_factor=1.0),
                                          optax.sgd(config.lr, momentum=0.9),
                                          optax.clip_by_global_norm(2.0 * config.lr)),
        }[config.optimizer]()
    if "std_schedule" in takes:
        kwargs["std_schedule"] = (optax.constant_schedule(config.std_init) if config.std_decay == 1.0
                                  else decayed(config.std_init, config.std_decay))
    if "use_antithetic_sampling" in takes:
        kwargs["use_antithetic_sampling"] = config.antithetic
    return kwargs


def make_strategy(config: ESConfig, template: Any):
    """Check the settings and build the evosax strategy and its params. Build it once per run: evosax's
    jitted methods take the strategy object as a static argument hashed by identity."""
    cls = config.strategy_class()
    config._check_fields()
    kwargs = _driver_kwargs(config, cls)
    try:
        if config.target is not None:
            es = instantiate(config.target, config.args, arg_field="args.",
                             injected={"population_size": config.popsize, "solution": template, **kwargs},
                             reserved=_DRIVER_ARGUMENTS)
        else:
            es = cls(config.popsize, template, **kwargs)
    except AssertionError as err:  # evosax checks the population size with asserts
        message = str(err)
        if "even" in message:
            raise SettingError("popsize", f"{config.popsize} is odd but {config.name} needs an even "
                               "population (antithetic pairs)",
                               f"an even number such as {config.popsize + 1}") from None
        raise SettingError("popsize", f"{config.popsize} is refused by {config.name} ({message})",
                           "a population size the strategy accepts") from None
    params = es.default_params
    if hasattr(params, "std_init"):
        params = params.replace(std_init=config.std_init)
    return es, params
