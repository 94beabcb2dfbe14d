"""GridWorld: a rows x cols grid, start bottom-right, goal top-left, with the gymnax 1.0 interface.

Actions 0 right, 1 down, 2 left, 3 up; a move off the grid leaves the agent where it is. Reaching the
goal gives reward ``goal_reward`` (1). Two variants, chosen by the static ``EnvParams.continuing``:

* continuing (default, as in the published tabular Q-learning set-up): on reaching the goal the agent is put back at the start
  inside ``step_env``; ``terminated`` stays False, so learners bootstrap through the reset.
* episodic: ``terminated`` is True at the goal and gymnax's auto-reset puts the agent at the start.

Both set ``info["episode_end"]`` when the goal is reached, so learners can count episodes either way.
The observation is ``(row, col)`` int32; tabular learners use ``state_index`` / ``obs_to_index``.

Usage::

    from metarl.inner_loops.envs import make
    env, params = make("GridWorld")                    # 8 x 12, continuing
    env, params = make("GridWorld", size=5, continuing=False)   # 5 x 5, episodic
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, 2, params)
    s = env.state_index(state, params)                 # int in [0, rows * cols)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from metarl.inner_loops.errors import SettingError


# Row and column offsets of the actions right, down, left, up.
_ROW_DELTA = (0, 1, 0, -1)
_COL_DELTA = (1, 0, -1, 0)
# No time limit unless asked for: the reference task is continuing.
NO_TIME_LIMIT = 2**31 - 1


@struct.dataclass
class EnvState(environment.EnvState):
    row: jax.Array
    col: jax.Array
    time: jax.Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    # Grid size and variant set array shapes and control flow, so they are static.
    rows: int = struct.field(pytree_node=False, default=8)
    cols: int = struct.field(pytree_node=False, default=12)
    continuing: bool = struct.field(pytree_node=False, default=True)
    goal_reward: float = 1.0
    max_steps_in_episode: int = NO_TIME_LIMIT


class GridWorld(environment.Environment[EnvState, EnvParams]):
    """Deterministic grid navigation to the top-left corner (see the module docstring)."""

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    @property
    def name(self) -> str:
        return "GridWorld"

    @property
    def num_actions(self) -> int:
        return 4

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(4)

    def observation_space(self, params: EnvParams) -> spaces.Box:
        return spaces.Box(0, max(params.rows, params.cols) - 1, (2,), jnp.int32)

    def state_space(self, params: EnvParams) -> spaces.Dict:
        return spaces.Dict(
            {
                "row": spaces.Discrete(params.rows),
                "col": spaces.Discrete(params.cols),
                "time": spaces.Discrete(params.max_steps_in_episode),
            }
        )

    def start(self, params: EnvParams) -> tuple[int, int]:
        return params.rows - 1, params.cols - 1

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        row, col = self.start(params)
        state = EnvState(row=jnp.int32(row), col=jnp.int32(col), time=jnp.int32(0))
        return self.get_obs(state, params), state

    def step_env(
        self, key: jax.Array, state: EnvState, action: int | jax.Array, params: EnvParams
    ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, Any]]:
        action = jnp.asarray(action, jnp.int32)
        row = jnp.clip(state.row + jnp.asarray(_ROW_DELTA, jnp.int32)[action], 0, params.rows - 1)
        col = jnp.clip(state.col + jnp.asarray(_COL_DELTA, jnp.int32)[action], 0, params.cols - 1)
        at_goal = (row == 0) & (col == 0)
        reward = jnp.where(at_goal, params.goal_reward, 0.0).astype(jnp.float32)
        time = state.time + 1
        if params.continuing:
            start_row, start_col = self.start(params)
            row = jnp.where(at_goal, start_row, row)
            col = jnp.where(at_goal, start_col, col)
            # Each trip to the goal is an episode, so a time limit counts per trip.
            time = jnp.where(at_goal, 0, time)
            terminated = jnp.zeros((), bool)
        else:
            terminated = at_goal
        state = EnvState(row=row, col=col, time=time)
        info = {"discount": 1.0 - terminated.astype(jnp.float32), "episode_end": at_goal}
        return self.get_obs(state, params), state, reward, terminated, info

    def get_obs(self, state: EnvState, params: EnvParams | None = None, key=None) -> jax.Array:
        return jnp.stack([state.row, state.col]).astype(jnp.int32)

    def is_terminated(self, state: EnvState, params: EnvParams) -> jax.Array:
        # The continuing variant never stands on the goal: it is moved to the start at once.
        return (state.row == 0) & (state.col == 0)

    # Tabular interface: states are numbered row-major.
    def num_states(self, params: EnvParams) -> int:
        return params.rows * params.cols

    def state_index(self, state: EnvState, params: EnvParams) -> jax.Array:
        return state.row * params.cols + state.col

    def obs_to_index(self, obs: jax.Array, params: EnvParams) -> jax.Array:
        return obs[..., 0] * params.cols + obs[..., 1]

    def state_from_index(self, index: jax.Array, params: EnvParams) -> EnvState:
        index = jnp.asarray(index, jnp.int32)
        return EnvState(row=index // params.cols, col=index % params.cols, time=jnp.zeros_like(index))


def make_gridworld(size: int | None = None, **param_overrides: Any) -> tuple[GridWorld, EnvParams]:
    """``size`` gives an N x N grid; other keywords are ``EnvParams`` fields (rows, cols, ...)."""
    if size is not None:
        param_overrides = {"rows": size, "cols": size, **param_overrides}
    params = EnvParams(**param_overrides)
    if params.rows < 1 or params.cols < 1 or params.rows * params.cols < 2:
        raise SettingError("rows/cols", f"grid {params.rows} x {params.cols} too small", "at least 2 cells")
    return GridWorld(), params

