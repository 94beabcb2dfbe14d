"""The search settings of the evolution driver (``ESConfig``): plain data, importable before JAX
starts. evosax's algorithms start JAX's backends when they are imported, and a run must read and
check its config before it sets up its devices (``jax.distributed`` has to come first), so the
strategy table and evosax are only imported when a setting is checked or a strategy is built
(``metarl.outer_loops.evolution``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

OPTIMIZERS = ("adam", "sgd", "clipup")


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """Search settings. ``lr``/``optimizer`` apply to strategies that take a gradient step (their
    constructor has an ``optimizer``); ``std_init`` to those with an initial search width (a
    ``std_init`` parameter or a ``std_schedule``); ``antithetic`` to those with
    ``use_antithetic_sampling``; ``fitness_shaping=None`` keeps the strategy's own default.
    ``target`` names a strategy class of your own, built with ``args``; it takes the place of
    ``strategy``. A config file writes it ``_target_``, Hydra's name for a class to build (the
    field's ``key``)."""

    strategy: str = "Open_ES"
    popsize: int = 16
    std_init: float = 0.03
    lr: float = 0.05
    optimizer: str = "adam"
    adam_b1: float = 0.9
    fitness_shaping: Optional[str] = None
    antithetic: bool = True
    target: Optional[str] = dataclasses.field(default=None, metadata={"key": "_target_"})
    args: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.target or self.strategy

    def strategy_class(self):
        if self.target is not None:
            from metarl.plugins import locate

            return locate(self.target, "es._target_")
        from metarl.outer_loops.evolution import STRATEGIES, UNSUPPORTED

        if self.strategy in UNSUPPORTED:
            raise ValueError(f"es.strategy: {self.strategy} does not work with this driver "
                             f"({UNSUPPORTED[self.strategy]}); allowed: {', '.join(STRATEGIES)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"es.strategy: unknown strategy {self.strategy!r}; allowed: {', '.join(STRATEGIES)} "
                             f"(not: {', '.join(UNSUPPORTED)}, see docs/extending.md)")
        return STRATEGIES[self.strategy]

    def validate(self) -> "ESConfig":
        import jax.numpy as jnp

        from metarl.outer_loops.evolution import FITNESS_SHAPING, make_strategy

        cls = self.strategy_class()
        if isinstance(self.popsize, bool) or not isinstance(self.popsize, int) or self.popsize < 2:
            raise ValueError(f"es.popsize: {self.popsize!r}; allowed: an integer >= 2")
        if not 0 < self.std_init < float("inf"):
            raise ValueError(f"es.std_init: {self.std_init!r}; allowed: a finite number > 0")
        if not 0 < self.lr < float("inf"):
            raise ValueError(f"es.lr: {self.lr!r}; allowed: a finite number > 0")
        if not 0 <= self.adam_b1 < 1:
            raise ValueError(f"es.adam_b1: {self.adam_b1!r}; allowed: >= 0 and < 1")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"es.optimizer: {self.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
        if self.fitness_shaping is not None and self.fitness_shaping not in FITNESS_SHAPING:
            raise ValueError(f"es.fitness_shaping: {self.fitness_shaping!r}; allowed: "
                             f"{', '.join(FITNESS_SHAPING)} or null (the strategy's default)")
        if self.args and self.target is None:
            raise ValueError(f"es.args: {self.args!r}; allowed: empty unless es._target_ names a strategy class")
        # The strategy's own checks (evosax asserts an even population for antithetic sampling),
        # run on a one-number template so they fail here, before anything is compiled.
        make_strategy(self, {"x": jnp.zeros((1,), jnp.float32)}, cls)
        return self
