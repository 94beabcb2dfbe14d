"""Probe environments with known value functions, registered with metarl's env registry.

Each isolates one piece of the value-learning maths (as in Andy Jones' "debugging RL" probes).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from metarl.inner_loops import envs


@struct.dataclass
class State(environment.EnvState):
    phase: jax.Array


@struct.dataclass
class Params(environment.EnvParams):
    max_steps_in_episode: int = 1000


class _Probe(environment.Environment):
    def __init__(self, kind: str, max_steps: int = 1000):
        super().__init__()
        self.kind = kind
        self.max_steps = max_steps

    @property
    def default_params(self):
        return Params(max_steps_in_episode=self.max_steps)

    def get_obs(self, state, params=None, key=None):
        return jnp.array([state.phase], jnp.float32)

    def reset_env(self, key, params):
        if self.kind == "one_step_obs":  # observation +-1 at random
            phase = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
        else:
            phase = jnp.float32(0.0)
        state = State(time=0, phase=phase)
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        t = state.time + 1
        if self.kind == "constant":        # one step, reward 1: V = 1
            reward, term, phase = 1.0, True, state.phase
        elif self.kind == "one_step_obs":  # one step, reward = observation: V(o) = o
            reward, term, phase = state.phase, True, state.phase
        elif self.kind == "two_step":      # obs 0 then 1, reward 1 at the end: V(0) = gamma, V(1) = 1
            reward = jnp.where(state.phase > 0.5, 1.0, 0.0)
            term = state.phase > 0.5
            phase = jnp.float32(1.0)
        elif self.kind == "time_limit":    # reward 1 forever, cut only by the time limit
            reward, term, phase = 1.0, False, state.phase
        else:
            raise ValueError(self.kind)
        new_state = State(time=t, phase=phase)
        return (self.get_obs(new_state), new_state, jnp.float32(reward), jnp.asarray(term),
                {"discount": 1.0 - jnp.float32(term)})

    @property
    def num_actions(self):
        return 2

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(-1.0, 1.0, (1,), jnp.float32)


for _kind in ("constant", "one_step_obs", "two_step"):
    envs.register(f"Probe-{_kind}", lambda k=_kind: (_Probe(k), _Probe(k).default_params))
envs.register("Probe-time_limit", lambda: (_Probe("time_limit", 5), _Probe("time_limit", 5).default_params))
