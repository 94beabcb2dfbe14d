"""What a trainer declares about itself; the harness reads a trainer through these and nothing else.

A trainer is a config class whose module defines ``make_train(config, **seams) -> train(key,
meta_params=None) -> (params, metrics)``. PPO, DQN and Q-learning declare all of the following; a
trainer of your own (``inner._target_``) declares what applies to it:

- module ``SEAMS``: the keywords of ``make_train`` that take a learned component (none if absent);
- config ``frames_per_run``: environment frames one training really steps (0 if absent);
- config ``num_updates``: updates in one training, the horizon a temporal component sees (1 if absent);
- config ``memory_floats()``: float32 values one training holds at once (its rollout or replay
  storage, networks with gradients and optimiser state, tables, metrics), and ``MEMORY_FIELD``: the
  setting that count grows with, named when a generation does not fit. Without ``memory_floats``
  no memory estimate is made for the training.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np


def seams(module: Any) -> tuple:
    return tuple(getattr(module, "SEAMS", ()))


def frames_per_run(config: Any) -> int:
    return int(getattr(config, "frames_per_run", 0))


def num_updates(config: Any) -> int:
    return int(getattr(config, "num_updates", 1))


def memory_floats(config: Any) -> Optional[int]:
    """Floats one training holds, or None when the trainer declares no ``memory_floats``."""
    method = getattr(config, "memory_floats", None)
    return int(method()) if callable(method) else None


def memory_field(config: Any) -> str:
    """The config field a training's memory grows with ("" where the trainer declares none)."""
    return getattr(config, "MEMORY_FIELD", "")


# --- helpers for the shipped trainers' estimates ---------------------------------------------------------

def mlp_floats(sizes) -> int:
    """Weights and biases of an MLP with layer ``sizes``."""
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def env_sizes(env: Any, env_params: Any) -> tuple[int, int]:
    """``(observation size, number of actions or action dimensions)`` of an environment."""
    obs = int(np.prod(env.observation_space(env_params).shape))
    space = env.action_space(env_params)
    return obs, int(getattr(space, "n", 0) or np.prod(getattr(space, "shape", (1,))))
