"""A bounded search space over a trainer's float hyperparameters: the search runs over unbounded
numbers that decode into the bounds, so every member of a population is a valid setting. Errors are
one-line ValueErrors naming the entry of ``search`` (``search.lr.low``)."""
from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from metarl.inner_loops.errors import SettingError


def _bound(path: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SettingError(path, repr(value), "a finite number")
    return float(value)


@dataclasses.dataclass(frozen=True)
class HyperparamSpace:
    """Each hyperparameter is ``low + (high - low) * sigmoid(z)``, in log space where ``log``; the
    search runs over unbounded ``z``, so every member is a valid setting."""

    names: tuple
    low: tuple
    high: tuple
    log: tuple

    @classmethod
    def from_config(cls, search: dict, trainer_fields: list[str]):
        if not search:
            raise SettingError("search", "empty", "a mapping of hyperparameter -> {low, high, log}")
        names, lows, highs, logs = [], [], [], []
        for name, spec in search.items():
            path = f"search.{name}"
            if name not in trainer_fields:
                raise SettingError(path, "not a hyperparameter of the trainer", ", ".join(trainer_fields))
            if not isinstance(spec, dict) or "low" not in spec or "high" not in spec:
                raise SettingError(path, repr(spec), "{low: number, high: number, log: bool}")
            extra = set(spec) - {"low", "high", "log"}
            if extra:
                raise SettingError(f"{path}.{sorted(extra)[0]}", "unknown setting", "low, high, log")
            low, high = _bound(f"{path}.low", spec["low"]), _bound(f"{path}.high", spec["high"])
            log = spec.get("log", False)
            if not isinstance(log, bool):
                raise SettingError(f"{path}.log", repr(log), "true or false")
            if not low < high:
                raise SettingError(path, f"low {low} must be below high {high}")
            if log and low <= 0:
                raise SettingError(f"{path}.low", str(low), "> 0 on a log scale")
            names.append(name), lows.append(low), highs.append(high), logs.append(log)
        return cls(tuple(names), tuple(lows), tuple(highs), tuple(logs))

    def _bounds(self, i):
        if self.log[i]:
            return math.log(self.low[i]), math.log(self.high[i])
        return self.low[i], self.high[i]

    def decode(self, z: dict) -> dict:
        out = {}
        for i, name in enumerate(self.names):
            lo, hi = self._bounds(i)
            u = lo + (hi - lo) * jax.nn.sigmoid(z[name])
            out[name] = jnp.exp(u) if self.log[i] else u
        return out

    def encode(self, values: dict) -> dict:
        out = {}
        for i, name in enumerate(self.names):
            lo, hi = self._bounds(i)
            v = float(values[name])
            u = math.log(v) if self.log[i] else v
            if not lo < u < hi:
                raise SettingError(f"search.{name}", f"the starting value {v} lies outside "
                                   f"({self.low[i]}, {self.high[i]})", "a range that contains it")
            p = (u - lo) / (hi - lo)
            out[name] = jnp.float32(math.log(p / (1 - p)))
        return out

    def describe(self, mean: dict, std: dict) -> dict:
        """Where the search over ``z`` stands, in the hyperparameters' own units: the mean and the band
        ``decode(z -+ std)``, so a plot can show it every generation."""
        low = jax.tree.map(lambda m, s: m - s, mean, std)
        high = jax.tree.map(lambda m, s: m + s, mean, std)
        return {"mean": self.decode(mean), "low": self.decode(low), "high": self.decode(high)}

    def trajectory(self, searched: list[dict]) -> tuple:
        """``(means, lows, highs)``, each ``{name: array}`` over ``describe``'s records ``searched``."""
        return tuple({n: np.array([float(s[part][n]) for s in searched]) for n in self.names}
                     for part in ("mean", "low", "high"))

    def bounds(self) -> tuple:
        """``({name: (low, high)}, {name: log})``."""
        return dict(zip(self.names, zip(self.low, self.high))), dict(zip(self.names, self.log))

    def template(self) -> dict:
        return {name: jnp.zeros((), jnp.float32) for name in self.names}

    def random_search(self, points: int, seeds: int, key, score) -> dict:
        """Random search: ``points`` settings drawn uniformly over the ranges, each trained on ``seeds`` keys and
        scored by ``score(z per training, keys) -> scores``; returns the draws (as ``z``), scores, seconds."""
        t = time.perf_counter()
        draws, train_keys = jax.random.split(key)
        # sigmoid(z) uniform on (0, 1) is a setting uniform over its range (on the log scale where log)
        u = jax.random.uniform(draws, (points, len(self.names)), minval=1e-6, maxval=1 - 1e-6)
        z = {name: jnp.log(u[:, c] / (1 - u[:, c])) for c, name in enumerate(self.names)}
        flat = {name: jnp.repeat(v, seeds) for name, v in z.items()}   # setting p on seeds p*seeds ... p*seeds+seeds-1
        scores = score(flat, jax.random.split(train_keys, points * seeds))
        return {"z": {name: [float(x) for x in v] for name, v in z.items()},
                "scores": scores.reshape(points, seeds).tolist(), "seconds": time.perf_counter() - t}
