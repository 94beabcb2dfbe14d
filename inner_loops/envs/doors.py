"""Doors: a 15 x 15 grid cut in two by a wall with three gaps (doors); reach the goal on the far side.

Layout (default): the wall is column 7 except the door rows 2, 7 and 12; the agent starts at
(13, 1), bottom-left, and the goal is (1, 13), top-right, so the shortest path is 24 moves. Actions:
0 stay, 1 right, 2 down, 3 left, 4 up. A move into a wall or off the grid leaves the agent in place.
Reaching the goal gives reward 1 and ``terminated``; gymnax truncates at ``max_steps_in_episode``.

The observation is the grid as a float32 one-hot ``(size, size, 4)`` array over the channels
empty, agent, wall, goal, ready for a network (flatten it for an MLP).

Usage::

    from metarl.inner_loops.envs import make
    env, params = make("Doors")                        # or make("Doors", max_steps_in_episode=50)
    obs, state = env.reset(key, params)                # obs: (15, 15, 4) float32
    obs, state, reward, terminated, truncated, info = env.step(key, state, 1, params)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from metarl.inner_loops.errors import SettingError


# Channels of the one-hot observation.
EMPTY, AGENT, WALL, GOAL = 0, 1, 2, 3
# Row and column offsets of stay, right, down, left, up.
_ROW_DELTA = (0, 0, 1, 0, -1)
_COL_DELTA = (0, 1, 0, -1, 0)


@struct.dataclass
class EnvState(environment.EnvState):
    row: jax.Array
    col: jax.Array
    time: jax.Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = 200


class Doors(environment.Environment[EnvState, EnvParams]):
    """Grid with a dividing wall and doors; the layout is fixed at construction."""

    def __init__(
        self,
        size: int = 15,
        wall_col: int | None = None,
        door_rows: tuple[int, ...] = (2, 7, 12),
        start: tuple[int, int] | None = None,
        goal: tuple[int, int] | None = None,
    ):
        super().__init__()
        wall_col = size // 2 if wall_col is None else wall_col
        start = (size - 2, 1) if start is None else tuple(start)
        goal = (1, size - 2) if goal is None else tuple(goal)
        walls = np.zeros((size, size), bool)
        walls[:, wall_col] = True
        for r in door_rows:
            walls[r, wall_col] = False
        if walls[start] or walls[goal] or start == goal:
            raise SettingError("start/goal", f"{start} and {goal} must be distinct free cells; wall column "
                               f"{wall_col}")
        self.size = size
        self.wall_col = wall_col
        self.door_rows = tuple(door_rows)
        self.start_cell = start
        self.goal_cell = goal
        self.walls = jnp.asarray(walls)
        # Every observation shares the walls and goal; only the agent plane moves.
        background = np.zeros((size, size, 4), np.float32)
        background[..., EMPTY] = ~walls
        background[..., WALL] = walls
        background[goal[0], goal[1], EMPTY] = 0.0
        background[goal[0], goal[1], GOAL] = 1.0
        self._background = jnp.asarray(background)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    @property
    def name(self) -> str:
        return "Doors"

    @property
    def num_actions(self) -> int:
        return 5

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(5)

    def observation_space(self, params: EnvParams) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self.size, self.size, 4), jnp.float32)

    def state_space(self, params: EnvParams) -> spaces.Dict:
        return spaces.Dict(
            {
                "row": spaces.Discrete(self.size),
                "col": spaces.Discrete(self.size),
                "time": spaces.Discrete(params.max_steps_in_episode),
            }
        )

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        state = EnvState(
            row=jnp.int32(self.start_cell[0]), col=jnp.int32(self.start_cell[1]), time=jnp.int32(0)
        )
        return self.get_obs(state, params), state

    def step_env(
        self, key: jax.Array, state: EnvState, action: int | jax.Array, params: EnvParams
    ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, Any]]:
        action = jnp.asarray(action, jnp.int32)
        row = jnp.clip(state.row + jnp.asarray(_ROW_DELTA, jnp.int32)[action], 0, self.size - 1)
        col = jnp.clip(state.col + jnp.asarray(_COL_DELTA, jnp.int32)[action], 0, self.size - 1)
        blocked = self.walls[row, col]
        row = jnp.where(blocked, state.row, row)
        col = jnp.where(blocked, state.col, col)
        state = EnvState(row=row, col=col, time=state.time + 1)
        terminated = self.is_terminated(state, params)
        reward = terminated.astype(jnp.float32)
        info = {"discount": 1.0 - reward}
        return self.get_obs(state, params), state, reward, terminated, info

    def is_terminated(self, state: EnvState, params: EnvParams) -> jax.Array:
        return (state.row == self.goal_cell[0]) & (state.col == self.goal_cell[1])

    def get_obs(self, state: EnvState, params: EnvParams | None = None, key=None) -> jax.Array:
        agent = jnp.zeros((self.size, self.size), jnp.float32).at[state.row, state.col].set(1.0)
        # The agent replaces "empty" in its cell; it never stands on a wall, and at the goal the
        # episode ends, so the goal cell keeps its goal channel too.
        return self._background.at[..., EMPTY].multiply(1.0 - agent).at[..., AGENT].set(agent)

    # Tabular interface (states are cells, numbered row-major), for Q-learning on Doors.
    def num_states(self, params: EnvParams) -> int:
        return self.size * self.size

    def state_index(self, state: EnvState, params: EnvParams) -> jax.Array:
        return state.row * self.size + state.col

    def state_from_index(self, index: jax.Array, params: EnvParams) -> EnvState:
        index = jnp.asarray(index, jnp.int32)
        return EnvState(row=index // self.size, col=index % self.size, time=jnp.zeros_like(index))


def make_doors(max_steps_in_episode: int = 200, **layout: Any) -> tuple[Doors, EnvParams]:
    """Keywords other than ``max_steps_in_episode`` set the layout (see ``Doors.__init__``)."""
    if max_steps_in_episode < 1:
        raise SettingError("max_steps_in_episode", f"{max_steps_in_episode} must be positive", ">= 1")
    return Doors(**layout), EnvParams(max_steps_in_episode=max_steps_in_episode)

