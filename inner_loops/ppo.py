"""PPO for any gymnax environment, end to end in one jitted function, with seams for learned parts.

    import jax
    from metarl.inner_loops.ppo import PPOConfig, make_train

    config = PPOConfig(env="CartPole-v1", total_timesteps=100_000)
    params, metrics = jax.jit(make_train(config))(jax.random.key(0))
    metrics["episode_return"]            # one scalar per update

The config splits in two. Fields that set shapes or the program (env, num_envs, num_steps, budgets,
epochs, minibatches, network sizes) are static: changing them recompiles. The float hyperparameters
(lr, gamma, gae_lambda, clip_eps, ent_coef, vf_coef, max_grad_norm) are pytree leaves, so a population
of them vmaps through one compilation:

    lrs = jnp.array([1e-4, 3e-4, 1e-3])
    jax.vmap(lambda lr, k: make_train(config.replace(lr=lr))(k))(lrs, keys)

Four seams take meta-learned components (see ``metarl.inner_loops.components``): ``value_loss`` (per-sample
loss from prediction, old prediction and target), ``policy_objective`` (per-sample objective from
probability ratio and advantage), ``schedule`` (multipliers of lr, ent_coef and clip_eps from the
training progress, once per update) and ``optimiser`` (the optax transformation that turns each
minibatch's gradient into the parameters' change; ``metarl.inner_loops.optimisers``). Their defaults are
PPO's clipped value loss, clipped surrogate, constant hyperparameters and clipped, annealed Adam.
``train(key, meta_params)`` takes the layout every trainer here takes, a dict keyed by what each entry
replaces: ``meta_params[SEAM]`` goes to that seam, and a float hyperparameter (names in ``FLOAT_FIELDS``)
replaces the config's value.
"""
from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from gymnax.environments import spaces
from pydantic import Field

from metarl.inner_loops import draws
from metarl.inner_loops import envs as envs_lib
from metarl.inner_loops import trainer
from metarl.inner_loops.config_checks import AsPython, Choice, Count, Flag, Fraction, Items, NonNegative, Positive
from metarl.inner_loops.config_checks import check_fields
from metarl.inner_loops.config_checks import static as _static
from metarl.inner_loops.config_checks import with_overrides
from metarl.inner_loops.components import (
    CLIPPED_SURROGATE,
    CONSTANT_SCHEDULE,
    L2_VALUE_LOSS,
    OPTIONAL_OBSERVED,
    Component,
    Observed,
    Progress,
    apply_component,
    training_progress,
)
from metarl.inner_loops.optimisers import ADAM, dormancy
from metarl.inner_loops.networks import (
    ACTIVATIONS,
    ActorCritic,
    categorical_entropy,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_log_prob,
)
from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.schema import ok


@struct.dataclass
class PPOConfig:
    """PPO settings. Static fields recompile when changed; float fields may be traced arrays. Each field's
    annotation says what it allows (``config_checks``), checked by ``validate``."""

    env: str = _static("CartPole-v1")
    env_kwargs: Items = _static(())  # ((name, value), ...), passed to envs.make; hashable on purpose
    num_envs: Count = _static(4)
    num_steps: Count = _static(128)
    total_timesteps: Count = _static(500_000)
    update_epochs: Count = _static(4)
    num_minibatches: Count = _static(4)
    hidden: Annotated[tuple, Field(min_length=1, description="a non-empty tuple of positive ints"),
                      ok(lambda sizes: all(isinstance(h, (int, np.integer)) and h > 0 for h in sizes)),
                      AsPython] = _static((64, 64))
    activation: Annotated[Literal[ACTIVATIONS], Choice()] = _static("tanh")
    anneal_lr: Flag = _static(True)
    clip_value_loss: Flag = _static(True)
    normalize_advantages: Flag = _static(True)
    # Unrolling the rollout scan trades compile time for fewer loop iterations per update; 2 is the
    # fastest for one agent on a CPU (docs/studies/speed.md has the figures).
    unroll: Count = _static(2)

    lr: Positive = 2.5e-4
    gamma: Fraction = 0.99
    gae_lambda: Fraction = 0.95
    clip_eps: Positive = 0.2
    ent_coef: NonNegative = 0.01
    vf_coef: NonNegative = 0.5
    max_grad_norm: Positive = 0.5

    # --- derived sizes -----------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def frames_per_run(self) -> int:
        """Environment frames one training run really steps (whole updates only)."""
        return self.num_updates * self.batch_size

    MEMORY_FIELD = "num_envs"

    def memory_floats(self) -> int:
        """The rollout (observation, final observation and 8 scalars per step), actor and critic x4
        (parameters, gradients, Adam's two moments) and the per-update metrics."""
        env, env_params = envs_lib.make(self.env, self.env_kwargs)
        obs, actions = trainer.env_sizes(env, env_params)
        hidden = list(self.hidden)
        nets = trainer.mlp_floats([obs, *hidden, actions]) + trainer.mlp_floats([obs, *hidden, 1])
        return self.num_envs * self.num_steps * (2 * obs + 8) + 4 * nets + 8 * self.num_updates

    def validate(self) -> "PPOConfig":
        """Raise a one-line ValueError naming the first bad field; traced values are not checked."""
        check_fields(self)
        envs_lib.make(self.env, self.env_kwargs)
        if self.total_timesteps < self.batch_size:
            raise SettingError("total_timesteps", f"{self.total_timesteps} is less than one update of "
                               f"num_envs * num_steps = {self.batch_size}", f">= {self.batch_size}")
        if self.batch_size % self.num_minibatches:
            raise SettingError("num_minibatches", f"{self.num_minibatches} does not divide the batch of "
                               f"num_envs * num_steps = {self.batch_size}", f"a divisor of {self.batch_size}")
        return self


# Float hyperparameters: pytree leaves that evolution (or vmap) may vary without recompiling.
FLOAT_FIELDS = ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm")
SEAMS = ("value_loss", "policy_objective", "schedule", "optimiser")  # make_train's keywords for learned components


# --- transitions and the maths ------------------------------------------------------------------

class Batch(NamedTuple):
    """One update's data, flattened to (batch, ...)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array


def compute_gae(rewards, values, dones, last_value, gamma, gae_lambda, unroll: int = 16):
    """Generalised advantage estimates over time-major arrays of shape (T, ...).

    ``dones[t]`` says that the observation after step t starts a new episode, so nothing is bootstrapped
    across it. Truncation is handled by the caller folding ``gamma * V(final_obs)`` into the reward.
    Returns ``(advantages, targets)`` with ``targets = advantages + values``.
    """
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    not_done = 1.0 - dones.astype(values.dtype)
    deltas = rewards + gamma * next_values * not_done - values
    decay = gamma * gae_lambda * not_done

    def step(gae, xs):
        delta, d = xs
        gae = delta + d * gae
        return gae, gae

    _, advantages = jax.lax.scan(step, jnp.zeros_like(last_value), (deltas, decay),
                                 reverse=True, unroll=unroll)
    return advantages, advantages + values


def random_permutations(key: jax.Array, num: int, size: int) -> jax.Array:
    """``num`` independent, uniformly random permutations of ``range(size)``: int32, shape (num, size).

    Each round sorts 32-bit integers whose high bits are random and whose low bits are the element's
    current position, so the sort has one operand and the permutation is read off the low bits: XLA's
    CPU sort is much slower on ``argsort``'s two operands (docs/studies/speed.md). Equal random bits keep the
    current order, so rounds are repeated with fresh bits until the random bits of all rounds
    together number at least three times the position bits, ``jax.random.permutation``'s rule
    (two rounds for 512; ``shuffle_rounds``). Above 2**20 elements it is ``jax.random.permutation`` per row.
    """
    rounds = shuffle_rounds(size)
    if rounds is None:  # over 2**20 elements: too few random bits left; sort key-value pairs
        return jax.vmap(lambda k: jax.random.permutation(k, size))(jax.random.split(key, num))
    return permutations_from_bits(jax.random.bits(key, (rounds, num, size), jnp.uint32))


def shuffle_rounds(size: int) -> int | None:
    """The rounds of random bits ``random_permutations`` sorts by for ``size`` elements (None above 2**20)."""
    index_bits = int(size - 1).bit_length()
    random_bits = 32 - index_bits
    return None if random_bits < 12 else max(1, -(-3 * index_bits // random_bits))


def permutations_from_bits(bits: jax.Array) -> jax.Array:
    """``random_permutations``' permutations from its rounds of random bits, uint32 (rounds, num, size)."""
    size = bits.shape[-1]
    low = jnp.uint32((1 << int(size - 1).bit_length()) - 1)
    position = jnp.arange(size, dtype=jnp.uint32)
    perm = None
    for round_bits in bits:
        order = (jax.lax.sort((round_bits & ~low) | position, dimension=1) & low).astype(jnp.int32)
        perm = order if perm is None else jnp.take_along_axis(perm, order, axis=1)
    return perm


def update_draws(key: jax.Array, n_steps: int, n_envs: int, action_dim: int, continuous: bool,
                 n_epochs: int, batch_size: int):
    """Every random number of one PPO update from one draw of bits (``draws.draw``): ``(noise,
    step_keys, reset_keys, perms)``, the action noise (n_steps, n_envs, action_dim) (standard normal if
    ``continuous``, else standard Gumbel), each step's and each reset's key (n_steps, n_envs), and the
    shuffles of the ``n_epochs`` epochs (``random_permutations``). One call site, because each
    threefry call site compiles to a loop of its own on a CPU (docs/studies/speed.md)."""
    rounds = shuffle_rounds(batch_size)
    parts = {"noise": ((n_steps, n_envs, action_dim), "normal" if continuous else "gumbel"),
             "steps": ((n_steps, n_envs), "keys"), "resets": ((n_steps, n_envs), "keys")}
    if rounds is not None:
        parts["shuffle"] = ((rounds, n_epochs, batch_size), "bits")
    drawn = draws.draw(key, parts)
    if rounds is None:
        perms = random_permutations(jax.random.fold_in(key, 1), n_epochs, batch_size)
    else:
        perms = permutations_from_bits(drawn["shuffle"])
    return drawn["noise"], drawn["steps"], drawn["resets"], perms


def ppo_loss(params, apply_fn, batch: Batch, config: PPOConfig, meta_params,
             value_loss: Component, policy_objective: Component, continuous: bool,
             progress: Progress | None = None):
    """PPO's loss on a minibatch; returns ``(loss, (value_loss, policy_loss, entropy, approx_kl,
    clip_fraction))``.

    ``progress`` (the agent's training progress) reaches components that declare ``temporal = True``."""
    (pi_out, log_std), value = apply_fn(params, batch.obs)
    if continuous:
        log_prob = gaussian_log_prob(pi_out, log_std, batch.action)
        entropy = gaussian_entropy(log_std, log_prob.shape)
    else:
        log_prob = categorical_log_prob(pi_out, batch.action)
        entropy = categorical_entropy(pi_out)

    v_loss = apply_component(value_loss, progress, _meta(meta_params, "value_loss"), value, batch.value,
                             batch.target, config).mean()

    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    adv = batch.advantage
    if config.normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    objective = apply_component(policy_objective, progress, _meta(meta_params, "policy_objective"), ratio, adv,
                                config)
    pg_loss = -objective.mean()
    ent = entropy.mean()
    total = pg_loss + config.vf_coef * v_loss - config.ent_coef * ent
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    clip_fraction = (jnp.abs(ratio - 1.0) > config.clip_eps).mean()
    return total, (v_loss, pg_loss, ent, approx_kl, clip_fraction)


def _meta(meta_params, name):
    if meta_params is None:
        return None
    if isinstance(meta_params, dict):
        return meta_params.get(name)
    raise TypeError("meta_params must be None or a dict keyed by seam name "
                    "('value_loss', 'policy_objective') or float hyperparameter")


# --- training -----------------------------------------------------------------------------------

def make_train(config: PPOConfig, value_loss: Component = L2_VALUE_LOSS,
               policy_objective: Component = CLIPPED_SURROGATE, schedule: Component = CONSTANT_SCHEDULE,
               optimiser: Component = ADAM) -> Callable[[jax.Array, Any], tuple[Any, dict[str, jax.Array]]]:
    """Validate ``config`` and return ``train(key, meta_params=None) -> (params, metrics)``.

    ``metrics`` maps names to arrays of shape (num_updates,): ``episode_return`` (mean return of the
    episodes that ended during the update; carried over from the previous update when none ended, 0
    before the first), ``episodes`` (how many ended), ``value_loss``, ``policy_loss``, ``entropy``,
    ``approx_kl`` and ``clip_fraction`` (means over the update's minibatches). With an optimiser other than
    Adam, ``episode_return`` is NaN from the update whose step left a parameter NaN or infinite: a
    diverged training, which the harness scores as it scores any non-finite fitness.
    """
    config.validate()
    env, env_params, network = make_agent(config)
    continuous = network.continuous
    adaptive = getattr(schedule, "adaptive", False)
    # An optimiser given the context (OPEN's inputs) gets a key per minibatch: drawn only for it, so PPO with
    # Adam is the same program as before the seam existed.
    context, guarded = getattr(optimiser, "context", False), optimiser is not ADAM
    # The statistics beyond KL and clip fraction that the schedule reads: only these are computed and
    # carried, so PPO without such a schedule is the same program as before they existed.
    observes = tuple(getattr(schedule, "observes", ())) if adaptive else ()
    if any(name not in OPTIONAL_OBSERVED for name in observes):
        raise SettingError("schedule.observes", repr(list(observes)), f"some of {', '.join(OPTIONAL_OBSERVED)}")
    if continuous:
        action_space = env.action_space(env_params)
        low = jnp.broadcast_to(jnp.asarray(action_space.low, jnp.float32), (network.action_dim,))
        high = jnp.broadcast_to(jnp.asarray(action_space.high, jnp.float32), (network.action_dim,))
    action_dim = network.action_dim
    n_envs, n_steps = config.num_envs, config.num_steps
    n_updates, n_mb, n_epochs = config.num_updates, config.num_minibatches, config.update_epochs
    mb_size, batch_size = config.minibatch_size, config.batch_size

    def flat(obs):
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)

    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    # Every reset state of a rollout is drawn before the scan in one batched call; the step selects
    # one where an episode ended (gymnax's auto-reset semantics without its per-step draws).
    v_reset_block = jax.vmap(jax.vmap(env.reset_env, in_axes=(0, None)), in_axes=(0, None))
    v_step = jax.vmap(envs_lib.step_auto_reset(env), in_axes=(0, 0, 0, 0, 0, None))

    def train(key, meta_params=None):
        if not isinstance(meta_params, dict):
            return train_with(config, key, meta_params)
        floats = {k: v for k, v in meta_params.items() if k not in SEAMS}
        seams = {k: v for k, v in meta_params.items() if k in SEAMS}
        return train_with(with_overrides(config, floats, FLOAT_FIELDS), key, seams)

    # `config` here is make_train's with the float hyperparameters of meta_params in place; the
    # static fields, which set every shape above, are the same.
    def train_with(config, key, meta_params):
        k_init, k_reset, k_run = jax.random.split(key, 3)
        obs, env_state = v_reset(jax.random.split(k_reset, n_envs), env_params)
        params = network.init(k_init, flat(obs))

        tx = optimiser.apply(_meta(meta_params, "optimiser"), config)
        opt_state = tx.init(params)

        def loss_fn(p, mb, progress, config):
            return ppo_loss(p, network.apply, mb, config, meta_params, value_loss, policy_objective,
                            continuous, progress)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def update(carry, xs):
            key, i_update = xs
            params, opt_state, env_state, obs, ep_return, last_mean, (kl_prev, clip_prev, *extra) = carry
            progress = training_progress(i_update, n_updates)
            # What the previous update saw; the statistics nobody reads stay NaN constants.
            observed = Observed(kl_prev, clip_prev, **(extra[0] if observes else {}))
            seen = {"observed": observed} if adaptive else {}
            scales = schedule.apply(_meta(meta_params, "schedule"), progress, **seen)
            step_scale = scales.get("lr")
            update_config = config.replace(**{k: getattr(config, k) * m for k, m in scales.items() if k != "lr"})
            # Every random number of the update in one draw (update_draws).
            # (The named scopes only label the program's parts for profiles: benchmarks/ppo_profile.py.)
            with jax.named_scope("sampling"):
                noise, env_keys, reset_keys, perms = update_draws(key, n_steps, n_envs, action_dim, continuous,
                                                                  n_epochs, batch_size)
            with jax.named_scope("env_step"):
                resets = v_reset_block(reset_keys, env_params)

            def env_step(c, xs):
                env_state, obs, ep_return = c
                eps, keys, (reset_obs, reset_state) = xs
                fobs = flat(obs)
                # Only what choosing the action needs happens step by step: the policy's output.
                # Its log-probabilities and the values are computed after the rollout, for all
                # steps at once (about 10% faster at 8 and 32 agents on a 2-core CPU).
                with jax.named_scope("network"):
                    pi_out, log_std = network.apply(params, fobs, method=ActorCritic.policy)
                with jax.named_scope("sampling"):
                    if continuous:
                        action = pi_out + jnp.exp(log_std) * eps
                        env_action = jnp.clip(action, low, high)
                    else:
                        action = jnp.argmax(pi_out + eps, axis=-1)
                        env_action = action
                with jax.named_scope("env_step"):
                    next_obs, env_state, reward, term, trunc, final_obs = v_step(
                        keys, env_state, env_action, reset_obs, reset_state, env_params)
                reward = reward.astype(jnp.float32)
                done = jnp.logical_or(term, trunc)
                ep_return = ep_return + reward
                finished = jnp.where(done, ep_return, 0.0)
                ep_return = jnp.where(done, 0.0, ep_return)
                out = (fobs, action, pi_out, reward, done, trunc & ~term, flat(final_obs), finished)
                return (env_state, next_obs, ep_return), out

            (env_state, obs, ep_return), traj = jax.lax.scan(
                env_step, (env_state, obs, ep_return), (noise, env_keys, resets), unroll=config.unroll)
            t_obs, t_action, t_pi, t_reward, t_done, t_trunc, t_final, t_finished = traj
            with jax.named_scope("network"):
                if continuous:
                    t_logp = gaussian_log_prob(t_pi, params["params"]["log_std"], t_action)  # state-independent
                else:
                    t_logp = categorical_log_prob(t_pi, t_action)
                # Every value of the update in one call: the observations acted on, the real last
                # observations of episodes cut by a time limit (gymnax's auto-reset already replaced
                # them in `obs`), and the observation after the rollout.
                values = network.apply(params, jnp.concatenate([
                    t_obs.reshape(batch_size, -1), t_final.reshape(batch_size, -1), flat(obs)]),
                    method=ActorCritic.value)
            t_value = values[:batch_size].reshape(n_steps, n_envs)
            v_final = values[batch_size:2 * batch_size].reshape(n_steps, n_envs)
            last_value = values[2 * batch_size:]
            # On a time-limit cut the episode goes on in principle: bootstrap from the value of the
            # real last observation.
            t_reward = t_reward + config.gamma * t_trunc * v_final
            adv, target = compute_gae(t_reward, t_value, t_done, last_value, config.gamma,
                                      config.gae_lambda)

            data = Batch(t_obs, t_action, t_logp, t_value, adv, target)
            data = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), data)
            # One draw and one gather per field for every epoch's shuffle, and one loop over all
            # epochs' minibatches: nested per-epoch loops with a gather each were slower on CPU.
            with jax.named_scope("sampling"):
                minibatches = jax.tree.map(
                    lambda x: x[perms].reshape((n_epochs * n_mb, mb_size) + x.shape[1:]), data)

            def minibatch(c, xs):
                params, opt_state = c
                mb, *step = xs if context else (xs,)
                with jax.named_scope("network"):
                    (_, aux), grads = grad_fn(params, mb, progress, update_config)
                if "relative_grad_norm" in observes:  # before the clipping in tx
                    aux = (*aux, optax.global_norm(grads))
                with jax.named_scope("optimizer"):
                    if context:
                        ctx = {"progress": progress, "epoch_fraction": (step[0] // n_mb) / max(n_epochs - 1, 1),
                               "dormancy": dormancy(network, params, mb.obs, config.activation), "key": step[1]}
                        updates, opt_state = tx.update(grads, opt_state, params, **ctx)
                    else:
                        updates, opt_state = tx.update(grads, opt_state, params)
                    if step_scale is not None:  # Adam's step is proportional to its learning rate
                        updates = jax.tree.map(lambda u: u * step_scale, updates)
                    params = optax.apply_updates(params, updates)
                return (params, opt_state), aux

            if context:
                n_steps_opt = n_epochs * n_mb
                minibatches = (minibatches, jnp.arange(n_steps_opt),
                               jax.random.split(jax.random.fold_in(key, 2), n_steps_opt))
            (params, opt_state), aux = jax.lax.scan(minibatch, (params, opt_state), minibatches)
            v_loss, pg_loss, ent, kl, clip_fraction, *grad_norm = (a.mean() for a in aux)

            n_done = t_done.sum()
            mean_return = jnp.where(n_done > 0, t_finished.sum() / jnp.maximum(n_done, 1), last_mean)
            if guarded:
                finite = jnp.all(jnp.stack([jnp.isfinite(p).all() for p in jax.tree.leaves(params)]))
                mean_return = jnp.where(finite, mean_return, jnp.nan)
            metrics = {"episode_return": mean_return, "episodes": n_done, "value_loss": v_loss,
                       "policy_loss": pg_loss, "entropy": ent, "approx_kl": kl, "clip_fraction": clip_fraction}
            seen = (kl, clip_fraction)
            if observes:
                stats, return_ref = {}, extra[1]  # return_ref: the mean episode return, NaN until one ended
                if "relative_value_loss" in observes:
                    stats["relative_value_loss"] = v_loss / (0.5 * data.target.var() + 1e-8)
                if "relative_grad_norm" in observes:
                    stats["relative_grad_norm"] = grad_norm[0] / config.max_grad_norm
                if "return_trend" in observes:
                    stats["return_trend"] = ((mean_return - return_ref)
                                             / (jnp.abs(mean_return) + jnp.abs(return_ref) + 1e-8))
                return_ref = jnp.where(n_done > 0, mean_return, return_ref)
                seen = (*seen, stats, return_ref)
            carry = (params, opt_state, env_state, obs, ep_return, mean_return, seen)
            return carry, metrics

        nan = jnp.float32(jnp.nan)  # nothing seen before the first update
        seen = (nan, nan) + (({name: nan for name in observes}, nan) if observes else ())
        carry = (params, opt_state, env_state, obs, jnp.zeros(n_envs), jnp.zeros(()), seen)
        carry, metrics = jax.lax.scan(update, carry, (jax.random.split(k_run, n_updates),
                                                      jnp.arange(n_updates, dtype=jnp.int32)))
        return carry[0], metrics

    return train


def make_agent(config: PPOConfig):
    """``(env, env_params, network)`` for ``config``: the environment and the actor-critic that fits it."""
    env, env_params = envs_lib.make(config.env, config.env_kwargs)
    action_space = env.action_space(env_params)
    if isinstance(action_space, spaces.Box):
        continuous, action_dim = True, int(np.prod(action_space.shape))
    elif isinstance(action_space, spaces.Discrete):
        continuous, action_dim = False, int(action_space.n)
    else:
        raise SettingError("env", f"{config.env!r} has a {type(action_space).__name__} action space",
                           "Discrete or Box")
    network = ActorCritic(action_dim, continuous, tuple(config.hidden), config.activation)
    return env, env_params, network

