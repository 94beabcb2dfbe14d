"""Parts of a user's own, named by `_target_` in tests (this folder is put on the subprocesses' path)."""
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import optax
from evosax.algorithms import Open_ES


@dataclasses.dataclass(frozen=True)
class HuberValueLoss:
    """A Huber value loss whose width is learned: delta = delta_init * exp(meta_params["log_delta"])."""

    delta_init: float = 1.0

    def __post_init__(self):
        if not self.delta_init > 0:
            raise ValueError(f"delta_init: {self.delta_init!r}; allowed: > 0")

    def init(self, key):
        return {"log_delta": jnp.zeros((), jnp.float32)}

    def apply(self, meta_params, value, old_value, target, config):
        delta = self.delta_init * jnp.exp(meta_params["log_delta"])
        error = jnp.abs(value - target)
        return jnp.where(error < delta, 0.5 * error**2, delta * (error - 0.5 * delta))


class DampedOpenES(Open_ES):
    """Open_ES whose search width is the driver's times ``damping``, an argument from the config."""

    def __init__(self, population_size, solution, damping=1.0, std_schedule=optax.constant_schedule(1.0),
                 **kwargs):
        self.damping = damping
        super().__init__(population_size, solution, std_schedule=lambda n: damping * std_schedule(n), **kwargs)


class NotAComponent:
    """Takes the Huber example's argument but has no init/apply: refused as a component."""

    def __init__(self, delta_init=1.0):
        self.delta_init = delta_init


class StallingHuberValueLoss(HuberValueLoss):
    """The Huber loss, whose training hangs (a callback sleeps) once the file named by METARL_TEST_STALL as
    PATH:LINES holds LINES lines: a generation that stalls, for the watchdog's test."""

    def apply(self, meta_params, value, old_value, target, config):
        jax.debug.callback(_stall_when_due)
        return super().apply(meta_params, value, old_value, target, config)


def _stall_when_due():
    path, _, lines = os.environ.get("METARL_TEST_STALL", "").partition(":")
    if path and os.path.exists(path) and len(open(path).read().splitlines()) >= int(lines):
        time.sleep(600)
