"""Does a trainer still learn the same after a change that alters its rounding or its random numbers?
metarl's PPO (or DQN, ``--trainer dqn``) as it is now against ``inner_loops/ppo.py`` (``dqn.py``) as it
was at a git revision, on the same seeds.

A change that reorders floating-point operations (a fusion, a flattened optimizer) or draws its random
numbers otherwise gives other bits, and RL training is chaotic: after a few updates the two runs of one seed are different samples of the
same distribution. So the check is statistical: for each environment, ``--seeds`` agents per side
(the same keys), PureJaxRL's config (``PPOConfig`` or ``DQNConfig`` defaults) at ``--total-timesteps``;
per side the final return (mean episode return over the last 10% of updates or logging intervals) and the area under the learning
curve (the mean over all updates) with 95% intervals and Welch's p between the sides, and the largest
gap along the curve between the sides' mean returns in units of its standard error, with its
permutation p (the share of 1,000 random splits of the pooled agents into two sides whose largest gap
is at least as large). Prints ONE JSON object to stdout; progress goes to stderr.

    timeout 1800 python -m benchmarks.numerics_check --against REV [--trainer ppo|dqn]
        [--envs CartPole-v1 Acrobot-v1] [--seeds 32] [--total-timesteps 500000]

REV is any git revision whose trainer module imports against today's package (run from the
repository's root).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from metarl.evaluate import compare
from metarl.stats import t_interval

CONFIGS = {"ppo": "PPOConfig", "dqn": "DQNConfig"}


def module_at(rev: str, trainer: str):
    """``inner_loops/<trainer>.py`` at git revision ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:inner_loops/{trainer}.py"], check=True, capture_output=True,
                            text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"{trainer}_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{trainer}_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def curves(module, trainer: str, env: str, total: float, keys) -> np.ndarray:
    """Learning curves ``(seeds, updates)``: the mean return of the episodes ended in each update."""
    train = module.make_train(getattr(module, CONFIGS[trainer])(env=env, total_timesteps=int(total)))
    return np.asarray(jax.jit(jax.vmap(lambda k: train(k)[1]["episode_return"]))(keys), dtype=float)


def largest_gap(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between two sides' mean curves, in units of its standard error (updates
    where both sides have no spread, as at a ceiling, count as no gap)."""
    se = np.sqrt(a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b))
    return float((np.abs(a.mean(axis=0) - b.mean(axis=0)) / np.where(se > 0, se, np.inf)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--trainer", choices=list(CONFIGS), default="ppo")
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1"])
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--total-timesteps", type=float, default=5e5)
    args = parser.parse_args()
    now = importlib.import_module(f"metarl.inner_loops.{args.trainer}")
    sides = {"now": now, args.against: module_at(args.against, args.trainer)}
    keys = jax.random.split(jax.random.key(0), args.seeds)
    report = {"benchmark": "numerics_check", "trainer": args.trainer, "against": args.against, "seeds": args.seeds,
              "total_timesteps": int(args.total_timesteps), "jax": jax.__version__, "envs": {}}
    for env in args.envs:
        t = time.perf_counter()
        c = {name: curves(module, args.trainer, env, args.total_timesteps, keys) for name, module in sides.items()}
        a, b = c.values()
        tail = max(1, a.shape[1] // 10)
        final = {name: x[:, -tail:].mean(axis=1) for name, x in c.items()}
        area = {name: x.mean(axis=1) for name, x in c.items()}
        pooled, rng = np.concatenate([a, b]), np.random.default_rng(0)
        null = [largest_gap(*np.split(pooled[rng.permutation(len(pooled))], 2)) for _ in range(1000)]
        gap = largest_gap(a, b)
        report["envs"][env] = {
            **{name: {"final_mean": float(final[name].mean()), "final_ci95": [float(b) for b in t_interval(final[name])],
                      "area_mean": float(area[name].mean()), "area_ci95": [float(b) for b in t_interval(area[name])]} for name in c},
            "final_welch_p": compare(*final.values())["welch_p"],
            "area_welch_p": compare(*area.values())["welch_p"],
            "largest_curve_gap_in_se": gap, "largest_curve_gap_permutation_p": float(np.mean(np.array(null) >= gap)),
            "bit_identical": bool(np.array_equal(a, b)),
            "updates": int(a.shape[1]), "seconds": round(time.perf_counter() - t, 1)}
        print(f"{env}: {json.dumps(report['envs'][env])}", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
