"""An environment of your own, with the gymnax interface, trained and evolved by name.

    cd examples/custom_env
    python -m metarl.evolve experiment=value_loss 'env={_target_:corridor.Corridor,length:6}' es.generations=3
    python -m metarl.evaluate run_dir=RUN_DIR num_seeds=4          # the run directory the first command prints

``python -m`` puts the current directory on the module path, so ``corridor`` imports from here (and
in every process a run starts). The environment is a gymnax ``Environment``: ``reset_env`` and
``step_env`` (gymnax's ``reset`` and six-value ``step`` come with the base class, auto-reset included),
``observation_space``, ``action_space`` and ``default_params``; the constructor's arguments are the
config's (``length`` above). Registering a name works too: the ``register`` call below lets
``env=corridor:Corridor`` name it (``module:NAME`` imports the module, whose import registers it).
"""
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from metarl.inner_loops.envs import register


@struct.dataclass
class EnvState(environment.EnvState):
    pos: jax.Array
    time: jax.Array


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = 50


class Corridor(environment.Environment[EnvState, EnvParams]):
    """Walk right along ``length`` cells to the goal: reward 1 there, -0.01 per other step."""

    def __init__(self, length: int = 8):
        super().__init__()
        if length < 2:
            raise ValueError(f"length: {length}; allowed: >= 2")
        self.length = length

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=4 * self.length)

    def reset_env(self, key, params):
        state = EnvState(pos=jnp.int32(0), time=jnp.int32(0))
        return self._obs(state), state

    def step_env(self, key, state, action, params):
        pos = jnp.clip(state.pos + 2 * action - 1, 0, self.length - 1)  # action 0: left, 1: right
        done = pos == self.length - 1
        state = EnvState(pos=pos, time=state.time + 1)
        return self._obs(state), state, jnp.where(done, 1.0, -0.01), done, {}

    def _obs(self, state):
        return jax.nn.one_hot(state.pos, self.length)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (self.length,), jnp.float32)

    def action_space(self, params):
        return spaces.Discrete(2)


register("Corridor", Corridor)
