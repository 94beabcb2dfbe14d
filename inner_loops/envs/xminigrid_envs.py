"""XLand-MiniGrid's grid worlds (the MiniGrid and XLand meta-RL suites) with the gymnax interface
(extra: ``pip install "metarl[xminigrid]"``).

    env: {_target_: XMiniGrid, env_id: MiniGrid-Empty-5x5}        # xminigrid.registered_environments()

The observation is the agent's egocentric view (``view_size`` x ``view_size`` x 2 tile and colour
codes) flattened to floats for an MLP; six discrete actions. An episode ends at the goal
(terminated; reward ``1 - 0.9 * steps / max_steps``) or after ``max_steps`` (truncated).
``max_steps`` and ``view_size`` replace the id's own; XLand tasks (``XLand-MiniGrid-R1-9x9``, ...)
also take ``ruleset``, the rule set of one benchmark task, which they need
(``xminigrid.load_benchmark(name).get_ruleset(i)``; in code, not from a config file).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from metarl.inner_loops.errors import SettingError

try:
    import xminigrid
except ImportError:  # a plain ImportError, so the config error says what to install
    raise ImportError('xminigrid is not installed; pip install "metarl[xminigrid]"') from None


@struct.dataclass
class EnvState(environment.EnvState):
    timestep: Any     # xminigrid.types.TimeStep
    time: jax.Array


class XMiniGrid(environment.Environment[EnvState, environment.EnvParams]):
    """One XLand-MiniGrid environment by id, with its parameters where given (None: the id's own)."""

    def __init__(self, env_id: str = "MiniGrid-Empty-5x5", max_steps: int | None = None,
                 view_size: int | None = None, ruleset: Any = None):
        super().__init__()
        if env_id not in xminigrid.registered_environments():
            raise SettingError("env_id", repr(env_id), ", ".join(xminigrid.registered_environments()))
        self.env_id = env_id
        self.env, self.params = xminigrid.make(env_id)
        given = {"max_steps": max_steps, "view_size": view_size, "ruleset": ruleset}
        self.params = self.params.replace(**{k: v for k, v in given.items() if v is not None})

    @property
    def name(self) -> str:
        return self.env_id

    @property
    def default_params(self) -> environment.EnvParams:
        return environment.EnvParams(max_steps_in_episode=int(self.params.max_steps))

    def _obs(self, timestep) -> jax.Array:
        return timestep.observation.reshape(-1).astype(jnp.float32)

    def reset_env(self, key: jax.Array, params: environment.EnvParams):
        timestep = self.env.reset(self.params, key)
        return self._obs(timestep), EnvState(timestep=timestep, time=jnp.int32(0))

    def step_env(self, key: jax.Array, state: EnvState, action: jax.Array, params: environment.EnvParams):
        timestep = self.env.step(self.params, state.timestep, action)
        terminated = timestep.last() & (timestep.discount == 0.0)
        return self._obs(timestep), EnvState(timestep=timestep, time=state.time + 1), timestep.reward, terminated, {}

    def observation_space(self, params: environment.EnvParams) -> spaces.Box:
        return spaces.Box(0.0, 255.0, (int(jnp.prod(jnp.array(self.env.observation_shape(self.params)))),), jnp.float32)

    def action_space(self, params: environment.EnvParams) -> spaces.Discrete:
        return spaces.Discrete(self.env.num_actions(self.params))
