"""GridWorld and Doors: gymnax API conformance and cell-by-cell dynamics, with real jax/gymnax."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl.inner_loops.envs import make
from metarl.inner_loops.envs.doors import AGENT, EMPTY, GOAL, WALL
from metarl.inner_loops.envs.gridworld import EnvState as GridState

RIGHT, DOWN, LEFT, UP = 0, 1, 2, 3
D_STAY, D_RIGHT, D_DOWN, D_LEFT, D_UP = 0, 1, 2, 3, 4


def _check_api(env, params):
    key = jax.random.key(0)
    obs, state = env.reset(key, params)
    obs_space = env.observation_space(params)
    assert obs.shape == obs_space.shape and obs.dtype == obs_space.dtype
    assert bool(obs_space.contains(obs))
    action = env.action_space(params).sample(key)
    assert env.action_space(params).n == env.num_actions
    out = jax.jit(env.step)(key, state, action, params)
    obs2, _, reward, terminated, truncated, info = out
    assert obs2.shape == obs_space.shape and obs2.dtype == obs_space.dtype
    assert reward.shape == () and terminated.dtype == bool and truncated.dtype == bool
    assert info["final_observation"].shape == obs_space.shape
    # vmap over a batch of envs and actions
    keys = jax.random.split(key, 5)
    obs_b, state_b = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    actions = jnp.arange(5) % env.num_actions
    obs_b2, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state_b, actions, params)
    assert obs_b.shape == obs_b2.shape == (5, *obs_space.shape)
    assert isinstance(env.name, str)


@pytest.mark.parametrize("name, kwargs", [("GridWorld", {}), ("GridWorld", {"size": 4, "continuing": False}), ("Doors", {})])
def test_api(name, kwargs):
    env, params = make(name, **kwargs)
    _check_api(env, params)


def _grid_step(env, params, row, col, action):
    state = GridState(row=jnp.int32(row), col=jnp.int32(col), time=jnp.int32(0))
    obs, state, reward, terminated, truncated, info = env.step(jax.random.key(0), state, action, params)
    return tuple(int(v) for v in obs), float(reward), bool(terminated), info


def test_gridworld_moves_and_border_clipping():
    env, params = make("GridWorld")
    assert params.rows == 8 and params.cols == 12
    obs, state = env.reset(jax.random.key(0), params)
    assert tuple(np.asarray(obs)) == (7, 11)
    assert _grid_step(env, params, 3, 4, RIGHT)[0] == (3, 5)
    assert _grid_step(env, params, 3, 4, DOWN)[0] == (4, 4)
    assert _grid_step(env, params, 3, 4, LEFT)[0] == (3, 3)
    assert _grid_step(env, params, 3, 4, UP)[0] == (2, 4)
    # clipped at each border
    assert _grid_step(env, params, 7, 11, RIGHT)[0] == (7, 11)
    assert _grid_step(env, params, 7, 11, DOWN)[0] == (7, 11)
    assert _grid_step(env, params, 2, 0, LEFT)[0] == (2, 0)
    assert _grid_step(env, params, 0, 5, UP)[0] == (0, 5)


def test_gridworld_goal_continuing_and_episodic():
    env, params = make("GridWorld")
    obs, reward, terminated, info = _grid_step(env, params, 0, 1, LEFT)
    # continuing: reward, back to the start, no termination, but an episode is counted
    assert obs == (7, 11) and reward == 1.0 and not terminated and bool(info["episode_end"])
    assert _grid_step(env, params, 1, 1, LEFT)[1] == 0.0

    env, params = make("GridWorld", continuing=False)
    obs, reward, terminated, info = _grid_step(env, params, 1, 0, UP)
    # episodic: terminated at the goal, auto-reset to the start, the goal is the final obs
    assert obs == (7, 11) and reward == 1.0 and terminated
    assert tuple(np.asarray(info["final_observation"])) == (0, 0)


def test_gridworld_square_grid_and_state_index():
    env, params = make("GridWorld", size=5)
    assert (params.rows, params.cols) == (5, 5) and env.num_states(params) == 25
    obs, state = env.reset(jax.random.key(0), params)
    assert tuple(np.asarray(obs)) == (4, 4)
    assert int(env.state_index(state, params)) == 24 == int(env.obs_to_index(obs, params))
    back = env.state_from_index(jnp.int32(7), params)
    assert (int(back.row), int(back.col)) == (1, 2)


def test_gridworld_time_limit_truncates():
    env, params = make("GridWorld", max_steps_in_episode=3)
    key = jax.random.key(0)
    _, state = env.reset(key, params)
    for t in range(3):
        _, state, _, terminated, truncated, _ = env.step(key, state, RIGHT, params)
        assert bool(truncated) == (t == 2) and not bool(terminated)


# --- Doors ---------------------------------------------------------------------------------------


def _doors_state(row, col, time=0):
    from metarl.inner_loops.envs.doors import EnvState

    return EnvState(row=jnp.int32(row), col=jnp.int32(col), time=jnp.int32(time))


def _doors_step(env, params, row, col, action, time=0):
    obs, state, reward, terminated, truncated, info = env.step(
        jax.random.key(0), _doors_state(row, col, time), action, params
    )
    final = np.asarray(info["final_observation"])
    cell = tuple(int(v) for v in np.argwhere(final[..., AGENT] == 1.0)[0])
    return cell, float(reward), bool(terminated), bool(truncated), state


def test_doors_layout_and_observation():
    env, params = make("Doors")
    obs, state = env.reset(jax.random.key(0), params)
    obs = np.asarray(obs)
    assert obs.shape == (15, 15, 4) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs.sum(-1), 1.0)  # exactly one channel per cell
    walls = np.argwhere(obs[..., WALL] == 1.0)
    assert set(map(tuple, walls)) == {(r, 7) for r in range(15) if r not in (2, 7, 12)}
    assert tuple(np.argwhere(obs[..., AGENT] == 1.0)[0]) == (13, 1)
    assert tuple(np.argwhere(obs[..., GOAL] == 1.0)[0]) == (1, 13)
    assert obs[13, 1, EMPTY] == 0.0


def test_doors_dynamics_cell_by_cell():
    env, params = make("Doors")
    # free moves and stay
    assert _doors_step(env, params, 5, 3, D_RIGHT)[0] == (5, 4)
    assert _doors_step(env, params, 5, 3, D_DOWN)[0] == (6, 3)
    assert _doors_step(env, params, 5, 3, D_LEFT)[0] == (5, 2)
    assert _doors_step(env, params, 5, 3, D_UP)[0] == (4, 3)
    assert _doors_step(env, params, 5, 3, D_STAY)[0] == (5, 3)
    # the wall blocks from both sides, on every non-door row
    for row in (0, 1, 3, 6, 8, 11, 13, 14):
        assert _doors_step(env, params, row, 6, D_RIGHT)[0] == (row, 6)
        assert _doors_step(env, params, row, 8, D_LEFT)[0] == (row, 8)
    # moving along the wall from a door into the wall is blocked too
    assert _doors_step(env, params, 7, 7, D_UP)[0] == (7, 7)
    # each door lets the agent through, both ways
    for row in (2, 7, 12):
        assert _doors_step(env, params, row, 6, D_RIGHT)[0] == (row, 7)
        assert _doors_step(env, params, row, 7, D_RIGHT)[0] == (row, 8)
        assert _doors_step(env, params, row, 8, D_LEFT)[0] == (row, 7)
    # the outer border clips
    assert _doors_step(env, params, 0, 0, D_UP)[0] == (0, 0)
    assert _doors_step(env, params, 14, 14, D_RIGHT)[0] == (14, 14)


def test_doors_goal_terminates_and_time_limit_truncates():
    env, params = make("Doors", max_steps_in_episode=10)
    cell, reward, terminated, truncated, state = _doors_step(env, params, 1, 12, D_RIGHT)
    assert cell == (1, 13) and reward == 1.0 and terminated and not truncated
    assert (int(state.row), int(state.col), int(state.time)) == (13, 1, 0)  # auto-reset
    assert _doors_step(env, params, 2, 13, D_LEFT)[1] == 0.0
    # truncation at the limit, not before
    _, reward, terminated, truncated, _ = _doors_step(env, params, 5, 3, D_STAY, time=8)
    assert not truncated
    _, reward, terminated, truncated, state = _doors_step(env, params, 5, 3, D_STAY, time=9)
    assert truncated and not terminated and reward == 0.0 and int(state.time) == 0
