"""The named random streams of a run's seed: every key a run, its tuning and its evaluation draw comes from one
function here (docs/results.md#random-streams lists them). The derivations are fixed: stored records' seeds and
resumed runs depend on each one staying bit for bit what it is.

Evolution takes ``key(seed)`` itself and splits it; every other stream folds a constant of its own into
``key(seed)`` (a key evolution's splits never give), or, for evaluation, starts from a root evolution never uses.
"""
from __future__ import annotations

import jax
import numpy as np

# The constant each stream folds into key(seed): the records store them (validation.json's "stream").
STREAMS = {"reference_baseline": 0x5EED_BA5E, "reference_random": 0x5EED_0001, "validation": 0x5EED_0002,
           "tunings": 0x5EED_0003, "per_task_tuning": 0x5EED_0004, "slice": 0x5EED_0051}
# A tuning search's seed: the run's with these bits flipped, plus the tuning's index (never the run's own).
TUNING_SEED_BITS = 0x7E57_5EED
# Evaluation agent i trains from fold_in(key(EVAL_ROOT), i); a run of seed EVAL_ROOT evaluates from EVAL_ROOT + 1.
EVAL_ROOT = 10_000


def evolution(seed: int) -> jax.Array:
    """The search's key: its state's (``Evolution.init`` splits it) and the component's initial meta-parameters."""
    return jax.random.key(seed)


def stream(seed: int, name: str, n: int) -> jax.Array:
    """``n`` keys of the stream ``name`` (a key of ``STREAMS``) of ``seed``."""
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), STREAMS[name]), n)


def tuning_seed(seed: int, i: int) -> int:
    """The seed of the run's tuning search ``i`` (``baseline.tune``)."""
    return seed ^ (TUNING_SEED_BITS + i)


def per_task_tuning(seed: int, tuning: int) -> jax.Array:
    """Per-task tuning ``tuning``'s key (its draws and seeds), the same on every task (common random numbers)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), STREAMS["per_task_tuning"]),
                                                 0), tuning)


def evaluation(seed: int, n: int) -> tuple[int, jax.Array]:
    """``(root, keys)``: evaluation agent i of every side trains from ``fold_in(key(root), i)`` (paired sides)."""
    root = EVAL_ROOT if seed != EVAL_ROOT else EVAL_ROOT + 1
    return root, jax.vmap(lambda i: jax.random.fold_in(jax.random.key(root), i))(np.arange(n, dtype=np.uint32))


def recording(seed: int, i: int) -> jax.Array:
    """The key of task ``i``'s training whose inputs ``metarl.distill`` records (its own ``seed=``, not a run's)."""
    return jax.random.fold_in(jax.random.key(seed), i)
