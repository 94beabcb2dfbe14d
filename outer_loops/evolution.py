"""An evolution driver around evosax 0.3 that maximises a pure fitness function.

It knows nothing of RL. It is handed a parameter template (any pytree) and
``fitness(meta_params, key) -> scalar`` (higher is better), and runs generations of
ask -> evaluate (members x seeds, vmapped, sharded over a device mesh) -> tell, each one jitted call:

    evo = Evolution(ESConfig(strategy="Open_ES", popsize=16), template, fitness, num_seeds=2)
    state = evo.init(jax.random.key(0))
    for _ in range(100):
        state, stats = evo.step(state)      # stats["best"], stats["mean"], ...

Generations are numbered from 1: ``stats["generation"]`` and ``state.generation`` count the
generations completed, as the console, ``metrics.jsonl`` and the checkpoint steps do.

evosax minimises; the driver negates, so everything user-facing is higher-is-better. Every member is
scored on the same ``num_seeds`` keys in a generation (common random numbers make the ranking fairer).
A member whose fitness is NaN or infinite gets the generation's worst finite fitness (or
``nonfinite_floor``) and is counted in ``stats["nonfinite"]``.

Every generation also measures how much of the fitness spread is signal (``signal_stats``,
``update_signal``; docs/signal.md), and, given ``control_fn``, scores a control (the hand-designed
baseline) on the generation's seeds beside the members: ``stats["control"]``; with ``paired`` the
fitness the strategy ranks is each member's minus the control's, seed by seed.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from flax import struct

# evosax's algorithms start JAX's backends when they are imported, so they are imported when a
# strategy is built (es_config.make_strategy), not with this module: a run sets its devices first.
from metarl.outer_loops.es_config import OPTIMIZERS, ESConfig, make_strategy, strategy_tables  # noqa: F401 (part of this module's API)
from metarl.inner_loops.errors import SettingError

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
# The per-generation signal statistics, by their names in stats, metrics.jsonl, wandb, MLflow and the
# inspect figure (docs/signal.md).
SIGNAL_FIELDS = ("signal_between", "signal_within", "seed_noise", "signal", "update_signal")
# The control's, with a control: its fitness and the members' margins over it.
CONTROL_FIELDS = ("control", "best_vs_control", "mean_vs_control")
@struct.dataclass
class EvoState:
    es_state: Any
    key: jax.Array
    generation: jax.Array
    # The ``keep_top`` best members seen so far, best first, each by the fitness of its own generation
    # (on that generation's seeds): the candidates a final pick on fresh seeds chooses from.
    top_fitness: jax.Array     # (keep_top,); -inf where fewer members have been seen
    top_params: Any            # the template's leaves with a leading keep_top axis
    top_generation: jax.Array  # (keep_top,): the generation each was found in

    @property
    def best_fitness(self) -> jax.Array:
        return self.top_fitness[0]

    @property
    def best_params(self) -> Any:
        return jax.tree.map(lambda x: x[0], self.top_params)


def _strong(x):
    return x if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jnp.asarray(x, dtype=x.dtype)


def search_std(es_state, shape):
    """The per-dimension search width: ``std`` (a scalar or per dimension), times sqrt(diag C) where
    the strategy adapts a covariance (Sep-CMA-ES keeps its diagonal, CMA-ES the full matrix)."""
    std = jnp.broadcast_to(jnp.asarray(getattr(es_state, "std", 0.0), jnp.float32), shape)
    c = getattr(es_state, "C", None)
    if c is not None:
        std = std * jnp.sqrt(jnp.diag(c) if c.ndim == 2 else c)
    return std


def replace_nonfinite(fitness, floor=None):
    """``(fitness with NaN/inf replaced, how many were)``: the generation's worst finite value, or
    ``floor`` when given (also when no member is finite)."""
    finite = jnp.isfinite(fitness)
    worst = jnp.min(jnp.where(finite, fitness, jnp.inf))
    fallback = jnp.float32(-1e9 if floor is None else floor)
    if floor is None:
        fallback = jnp.where(jnp.isfinite(worst), worst, fallback)
    return jnp.where(finite, fitness, fallback), jnp.sum(~finite)


def signal_stats(seed_fitness):
    """How much of the spread of the members' fitness is signal rather than seed noise.

    ``seed_fitness`` is F[m, s], member m's fitness on seed s (shape (popsize, num_seeds)), the number
    the strategy ranks but per seed. Members with a non-finite F on any seed are left out. Returns

    - ``signal_between`` V_b = var_m(mean_s F[m, s]) (ddof=1): the spread of the members' mean fitness;
    - ``signal_within`` V_w = sum_{m,s} (F[m, s] - F[m, .] - F[., s] + F[., .])^2 / ((M - 1)(S - 1)),
      the member-by-seed interaction of a two-way analysis of variance: the seed noise of one inner
      run that can reorder the members. What a seed does to every member alike (a lucky seed, or the
      control's C[s] that ``paired`` subtracts) moves every member's mean together, cannot reorder
      them, and is not counted;
    - ``seed_noise`` V_w / num_seeds: the seed noise in a member's mean fitness, the part of V_b
      that is expected even if every member were equally good;
    - ``signal`` max(0, V_b - V_w / num_seeds) / V_b: the fraction of V_b that is not seed noise
      (0: the ranking is noise; 1: no noise).

    With one seed V_w cannot be measured and everything but V_b is NaN (``null`` in metrics.jsonl);
    ``signal`` is NaN also when V_b is 0 or fewer than two members are finite."""
    members, seeds = seed_fitness.shape
    finite = jnp.all(jnp.isfinite(seed_fitness), axis=1)
    n = jnp.sum(finite)
    f = jnp.where(finite[:, None], seed_fitness, 0.0)
    member_mean = jnp.mean(f, axis=1)
    grand = jnp.sum(member_mean) / n
    between = jnp.sum(jnp.where(finite, (member_mean - grand) ** 2, 0.0)) / (n - 1)
    between = jnp.where(n > 1, between, jnp.nan)
    if seeds < 2:
        nan = jnp.float32(jnp.nan)
        return {"signal_between": between, "signal_within": nan, "seed_noise": nan, "signal": nan}
    seed_mean = jnp.sum(f, axis=0) / n  # over the finite members (the others are 0 in f)
    residual = f - member_mean[:, None] - seed_mean[None, :] + grand
    within = jnp.sum(jnp.where(finite[:, None], residual ** 2, 0.0)) / ((n - 1) * (seeds - 1))
    noise = within / seeds
    signal = jnp.where(between > 0, jnp.maximum(0.0, between - noise) / between, jnp.nan)
    return {"signal_between": between, "signal_within": within, "seed_noise": noise, "signal": signal}


def update_signal(seed_fitness, directions, shape=None):
    """The signal-to-noise of the ES update, as the fraction of its power that is signal, estimated
    by splitting the seeds in two halves.

    ``directions`` (popsize, dims) are the members' perturbations (member - mean, per unit of search
    width); ``shape(fitness) -> weights`` the strategy's fitness shaping (None: the fitness itself).
    From each half of the seeds (the first and the second ``num_seeds // 2``; an odd last seed is left
    out) the update direction is estimated as the strategy's tell forms it, g = sum_m w_m d_m with w
    the shaped, centred fitness of the half. The two halves share the members and differ only in
    their seeds, so S = max(0, g_A . g_B) estimates |g|^2 of the update that infinitely many seeds
    would give, and N = |g_A - g_B|^2 / 4 the noise power of the update from all the seeds. Returns
    S / (S + N) in [0, 1] (the signal-to-noise ratio S / N is u / (1 - u)): above 0.5 the update
    mostly follows the members' differences, below it mostly the seed noise; 1 when both halves rank
    the members alike under rank shaping. NaN with one seed; members not finite on every seed get
    weight 0."""
    members, seeds = seed_fitness.shape
    if seeds < 2:
        return jnp.float32(jnp.nan)
    half = seeds // 2
    finite = jnp.all(jnp.isfinite(seed_fitness), axis=1)

    def direction(part):
        f = jnp.mean(part, axis=1)
        f = jnp.where(finite, f, jnp.min(jnp.where(finite, f, jnp.inf)))
        w = f if shape is None else shape(f)
        w = jnp.where(finite, w - jnp.mean(w), 0.0)
        return w @ directions

    g_a, g_b = direction(seed_fitness[:, :half]), direction(seed_fitness[:, half:2 * half])
    signal = jnp.maximum(0.0, jnp.dot(g_a, g_b))
    noise = jnp.sum((g_a - g_b) ** 2) / 4
    return signal / (signal + noise)


class Evolution:
    """Ask, evaluate, tell: one jitted generation; see the module docstring."""

    def __init__(self, config: ESConfig, template: Any,
                 fitness_fn: Callable[[Any, jax.Array], jax.Array], num_seeds: int = 1,
                 init_mean: Any = None, nonfinite_floor: Optional[float] = None, mesh=None,
                 describe_search: Optional[Callable[[Any, Any], dict]] = None,
                 aggregate: Optional[Callable[[jax.Array], tuple[jax.Array, jax.Array]]] = None,
                 control_fn: Optional[Callable[[jax.Array], jax.Array]] = None, paired: bool = False,
                 keep_top: int = 1):
        if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 1:
            raise SettingError("num_seeds", repr(num_seeds), "a positive integer")
        self.config = config
        self.es, self.es_params = make_strategy(config, template)  # checks the settings first
        self.template = template
        self.fitness_fn = fitness_fn
        self.num_seeds = num_seeds
        self.init_mean = template if init_mean is None else init_mean
        self.nonfinite_floor = nonfinite_floor
        self.mesh = mesh
        # describe_search(mean, std) -> dict of scalars, logged every generation (pytrees shaped
        # like the template; std is the per-dimension search width).
        self.describe_search = describe_search
        # With several tasks fitness_fn returns one raw score per task, shape (tasks,), and
        # aggregate(raw (popsize, tasks)) -> (fitness (popsize,), per-task scores (popsize, tasks))
        # turns them into the one number the strategy ranks (e.g. normalised, then averaged).
        self.aggregate = aggregate
        # control_fn(key) -> raw score(s) like fitness_fn's, of a fixed control (the hand-designed
        # baseline), trained on the same seed keys as the members in every generation; paired: the
        # strategy ranks each member's fitness minus the control's on the same seeds.
        if paired and control_fn is None:
            raise SettingError("paired", "True needs a control_fn to pair with", "False without one")
        self.control_fn = control_fn
        self.paired = paired
        self.keep_top = keep_top
        if mesh is not None:
            check_divides(config.popsize, mesh.size)
        # With a mesh the state stays one fully replicated global array (every process holds the same
        # copy, also in a multi-process run): only the members' evaluation is split over the devices.
        replicated = None
        if mesh is not None and mesh.size > 1:
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self._replicated = replicated
        self.step = jax.jit(self._step, out_shardings=replicated)
        self.init = jax.jit(self._init)

    # -- evaluation ------------------------------------------------------------------------------
    def _evaluate_members(self, population, seed_keys):
        """(members, seeds) fitness for a block of members; the unit that is sharded."""
        per_member = lambda params: jax.vmap(lambda k: self.fitness_fn(params, k))(seed_keys)
        return jax.vmap(per_member)(population)

    def evaluate(self, population, seed_keys):
        """The members split over the mesh by XLA's partitioner (sharding constraints on the member
        axis); shard_map of the same program crashed XLA's compiler on SpaceInvaders-MinAtar with jax
        0.11.2 (a segmentation fault), and both give the same numbers bit for bit."""
        if self.mesh is None or self.mesh.size == 1:
            return self._evaluate_members(population, seed_keys)
        split = jax.sharding.NamedSharding(self.mesh, P("pop"))
        population = jax.lax.with_sharding_constraint(population, split)
        return jax.lax.with_sharding_constraint(self._evaluate_members(population, seed_keys), split)

    def _replicate(self, tree):
        """Pin ``tree`` whole to every device. Only the members' evaluation is split; the population
        and its fitness are pinned so that the ask and the tell run replicated, on the same numbers in
        the same order as on one device. Left to itself, XLA splits the tell's sums over members into
        per-device partial sums, rounded differently, and the run drifts from the one-device run."""
        if self._replicated is None:
            return tree
        return jax.lax.with_sharding_constraint(tree, self._replicated)

    # -- the loop --------------------------------------------------------------------------------
    def _init(self, key):
        k_es, k_run = jax.random.split(key)
        # evosax leaves some fields weakly typed; after one tell they are strong, and the changed
        # signature would compile the generation a second time.
        es_state = jax.tree.map(_strong, self.es.init(k_es, self.init_mean, self.es_params))
        top_params = jax.tree.map(lambda x: jnp.repeat(_strong(jnp.asarray(x))[None], self.keep_top, axis=0),
                                  self.init_mean)
        return EvoState(es_state=es_state, key=k_run, generation=jnp.int32(0),
                        top_fitness=jnp.full((self.keep_top,), -jnp.inf, jnp.float32), top_params=top_params,
                        top_generation=jnp.zeros((self.keep_top,), jnp.int32))

    def generation_keys(self, key):
        """``(next key, ask key, seed keys (num_seeds,), tell key)`` of the generation run from ``key``
        (``state.key``): every member and the control train on the same seed keys."""
        key, k_ask, k_eval, k_tell = jax.random.split(key, 4)
        return key, k_ask, jax.random.split(k_eval, self.num_seeds), k_tell

    def _fitness_per_seed(self, per_seed):
        """Raw scores (..., num_seeds[, tasks]) -> (fitness of the seed mean (...), F per seed (..., num_seeds),
        per-task means and scores or None): the fitness as the strategy ranks it, and seed by seed."""
        raw = jnp.mean(per_seed, axis=-2 if self.aggregate is not None else -1)
        if self.aggregate is None:
            return raw, per_seed, None
        fitness, scores = self.aggregate(raw.reshape(-1, raw.shape[-1]))
        by_seed, _ = self.aggregate(per_seed.reshape(-1, per_seed.shape[-1]))
        return (fitness.reshape(raw.shape[:-1]), by_seed.reshape(per_seed.shape[:-1]),
                (raw, scores.reshape(raw.shape)))

    def _step(self, state: EvoState):
        key, k_ask, seed_keys, k_tell = self.generation_keys(state.key)
        population, es_state = self.es.ask(k_ask, state.es_state, self.es_params)
        population = self._replicate(population)
        per_seed = self._replicate(self.evaluate(population, seed_keys))  # (popsize, num_seeds[, tasks])
        raw, seed_fitness, per_task = self._fitness_per_seed(per_seed)
        stats_control = {}
        if self.control_fn is not None:
            control_per_seed = self._replicate(jax.vmap(self.control_fn)(seed_keys))  # (num_seeds[, tasks])
            control, control_seed_fitness, _ = self._fitness_per_seed(control_per_seed)
            stats_control["control"] = control
            if self.paired:
                raw = raw - control
                seed_fitness = seed_fitness - control_seed_fitness
        fitness, nonfinite = replace_nonfinite(raw, self.nonfinite_floor)
        update = self._update_signal(seed_fitness, population, es_state)
        es_state, _ = self.es.tell(k_tell, population, -fitness, es_state, self.es_params)
        es_state = jax.tree.map(_strong, es_state)

        i_best = jnp.argmax(fitness)
        gen_best = fitness[i_best]
        # The kept members first, so that a tie keeps the older one (as the best so far always has).
        top_fitness, i_top = jax.lax.top_k(jnp.concatenate([state.top_fitness, fitness]), self.keep_top)
        top_params = jax.tree.map(lambda old, new: jnp.concatenate([old, new])[i_top], state.top_params, population)
        generation = state.generation + 1
        top_generation = jnp.concatenate([state.top_generation, jnp.full(fitness.shape, generation)])[i_top]
        new_state = EvoState(es_state=es_state, key=key, generation=generation, top_fitness=top_fitness,
                             top_params=top_params, top_generation=top_generation)
        if self.describe_search is not None:
            mean = self.es.get_mean(es_state)
            flat_mean, unravel = jax.flatten_util.ravel_pytree(mean)
            stats_search = self.describe_search(mean, unravel(search_std(es_state, flat_mean.shape)))
        quantiles = jnp.quantile(fitness, jnp.array(QUANTILES))
        stats = {"generation": new_state.generation, "best": gen_best, "mean": jnp.mean(fitness),
                 "std": jnp.std(fitness), "worst": jnp.min(fitness), "best_so_far": new_state.best_fitness,
                 "nonfinite": nonfinite, "fitness": fitness,
                 **{f"q{int(q * 100):02d}": v for q, v in zip(QUANTILES, quantiles)}}
        stats.update(signal_stats(seed_fitness))
        stats["update_signal"] = update
        if self.control_fn is not None:  # the members' margin over the control (the fitness itself if paired)
            margin = fitness if self.paired else fitness - stats_control["control"]
            stats.update(stats_control, best_vs_control=jnp.max(margin), mean_vs_control=jnp.mean(margin))
        if self.describe_search is not None:
            stats["search"] = stats_search
        if per_task is not None:  # per task: the population's mean and the generation's best member
            per_task, scores = per_task
            stats["tasks"] = {"raw_mean": jnp.nanmean(per_task, axis=0), "score_mean": jnp.nanmean(scores, axis=0),
                              "raw_best": per_task[i_best], "score_best": scores[i_best]}
        return new_state, stats

    def _update_signal(self, seed_fitness, population, es_state):
        """``update_signal`` of this generation's update (``es_state``: the state the population was asked
        from): the members' perturbations in units of the search width, weighted by the strategy's
        own fitness shaping (of the negated fitness: evosax minimises)."""
        flat_pop = jax.vmap(lambda p: jax.flatten_util.ravel_pytree(p)[0])(population)
        flat_mean = jax.flatten_util.ravel_pytree(self.es.get_mean(es_state))[0]
        width = search_std(es_state, flat_mean.shape)
        directions = (flat_pop - flat_mean) / jnp.where(width > 0, width, 1.0)
        shaping = getattr(self.es, "fitness_shaping_fn", None)
        shape = None if shaping is None else (lambda f: shaping(flat_pop, -f, es_state, self.es_params))
        return update_signal(seed_fitness, directions, shape)

    def rescore(self, candidates, seed_keys):
        """``(fitness (n,), per seed (n, len(seed_keys)))`` of ``n`` candidates (the template's leaves with a
        leading axis) on ``seed_keys``, as a generation scores its members: aggregated over tasks and,
        with a paired control, minus the control's on the same seeds. Non-finite values stay as they
        are. For a final pick on seeds the search never used (the best member is the luckiest)."""
        per_seed = self._evaluate_members(candidates, seed_keys)
        fitness, seed_fitness, _ = self._fitness_per_seed(per_seed)
        if self.paired:
            control, control_seed_fitness, _ = self._fitness_per_seed(jax.vmap(self.control_fn)(seed_keys))
            fitness, seed_fitness = fitness - control, seed_fitness - control_seed_fitness
        return fitness, seed_fitness

    def mean(self, state: EvoState):
        """The search distribution's mean as a pytree shaped like the template."""
        return self.es.get_mean(state.es_state)

    def candidates(self, state: EvoState, k: int) -> tuple:
        """``(kept, params)``: which of the ``k`` best members kept have a finite fitness, and their parameters with
        the search's mean last, host arrays with a leading axis (``rescore``'s candidates)."""
        kept = np.flatnonzero(np.isfinite(np.asarray(jax.device_get(state.top_fitness))[:k]))
        top = jax.tree.map(lambda x: np.asarray(jax.device_get(x))[kept], state.top_params)
        return kept, jax.tree.map(lambda t, m: np.concatenate([t, np.asarray(m)[None]]), top, self.mean(state))


def check_divides(popsize: int, devices: int) -> None:
    """``SettingError`` naming ``popsize`` unless the population splits evenly over ``devices`` (padding members
    would cost compute for nothing)."""
    if popsize % devices:
        lower = popsize - popsize % devices
        near = " or ".join(str(m) for m in (lower, lower + devices) if m)
        raise SettingError("popsize", f"{popsize} does not divide over {devices} devices",
                           f"a multiple of {devices} (such as {near})")


def record(stats: dict, task_names: list[str]) -> dict:
    """A generation's ``stats`` (as fetched from the device) as plain numbers: per task ``{name: {stat: value}}``,
    the search distribution's dict of floats, a statistic not measured (one seed) None rather than NaN."""
    out = {}
    for k, v in stats.items():
        if k == "tasks":  # per task: {name: {raw_mean, score_mean, raw_best, score_best}}
            out[k] = {name: {stat: float(np.asarray(values)[i]) for stat, values in v.items()}
                      for i, name in enumerate(task_names)}
        elif isinstance(v, dict):  # the decoded search distribution, e.g. {"mean": {"lr": ...}, ...}
            out[k] = jax.tree.map(float, v)
        else:
            v = np.asarray(v)
            out[k] = v.tolist() if v.ndim else (int(v) if np.issubdtype(v.dtype, np.integer) else float(v))
            if k in SIGNAL_FIELDS and not np.isfinite(out[k]):
                out[k] = None
    return out


# The search is called noise-dominated when the signal fraction stays below NOISE_THRESHOLD in each of
# its first NOISE_GENERATIONS generations (docs/signal.md).
NOISE_THRESHOLD, NOISE_GENERATIONS = 0.2, 3


def noise_warning(history: list[dict], generations: int = NOISE_GENERATIONS,
                  name: Callable[[str], str] = str) -> Optional[str]:
    """The warning, once: when the last record of ``history`` completes generation ``generations`` and
    the signal fraction was below ``NOISE_THRESHOLD`` in every generation so far (None where not
    measured). Otherwise None. ``name`` says how the caller names the levers (``num_seeds``,
    ``std_init``, ``popsize``)."""
    if not history or history[-1]["generation"] != generations:
        return None
    signals = [r.get("signal") for r in history if r["generation"] <= generations]
    if not signals or any(s is None or not s < NOISE_THRESHOLD for s in signals):
        return None
    shown = ", ".join(f"{s:.2f}" for s in signals)
    return (f"warning: the search is noise-dominated: the signal fraction stayed below {NOISE_THRESHOLD} in the "
            f"first {generations} generation(s) ({shown}), so the members' fitness differences are mostly seed "
            f"noise and the best member is mostly luck. Levers: more {name('num_seeds')} (divides the seed noise), "
            f"a larger {name('std_init')} (members further apart differ more), a larger {name('popsize')} (more "
            "members per update); docs/signal.md")


def search_warnings(space: dict, values: dict, history: list, edge: float = 0.05, name: str = "",
                    field: Callable[[str], str] = str) -> list[str]:
    """Signs that a search of hyperparameters (``name``) has not found its optimum: a value within ``edge`` (of its
    range in ``space``, log where it is) of an end, or a population mean rising over the last third of the
    generations by more than twice its scatter; under 8 generations, too few to judge that (the last third's trend
    needs 4 points at least). ``field`` says how the caller names the levers (``search.lr``, ``generations``)."""
    found, name = [], name and name + ": "
    for key, value in values.items():
        low, high = space[key]["low"], space[key]["high"]
        scale = np.log if space[key].get("log") else (lambda x: x)
        where = float((scale(value) - scale(low)) / (scale(high) - scale(low)))
        if min(where, 1 - where) < edge:
            end, bound = ("low", low) if where < 0.5 else ("high", high)
            found.append(f"{name}{key} {value:.4g} lies within {edge:.0%} of its range's {end} end {bound:.4g}; "
                         f"widen {field('search.' + key)}")
    means = np.array([r["mean"] for r in history if r.get("mean") is not None], float)
    last = means[-max(4, len(means) // 3):]
    if len(means) < 8:
        found.append(f"{name}{len(means)} generations are too few to judge whether the population mean still rises")
    else:
        slope, intercept = np.polyfit(np.arange(len(last)), last, 1)
        scatter = np.std(last - (slope * np.arange(len(last)) + intercept))
        if slope * (len(last) - 1) > 2 * scatter and slope > 0:
            found.append(f"{name}the population mean still rose over the last {len(last)} generations "
                         f"({last[0]:.3g} -> {last[-1]:.3g}); run longer ({field('generations')})")
    return found
