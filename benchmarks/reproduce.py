"""Reproductions: metarl against a peer's real code, or a paper's claim, with a test fixed before the run.

    python -m benchmarks.reproduce TASK --seeds N --out JSON [--purejaxrl DIR] [--total-timesteps F]
    python -m benchmarks.reproduce table RECORD.json ...      # the page's tables, from the records
    python -m benchmarks.reproduce page docs/studies/reproductions.md   # its tables rewritten from them

Tasks (``TASKS``): ``ppo-cartpole`` and ``ppo-breakout`` (metarl's PPO against PureJaxRL's
``purejaxrl/ppo.py`` with PureJaxRL's own settings: its ``ppo.py`` config for CartPole-v1, its MinAtar
notebook's for Breakout-MinAtar), ``dqn-cartpole`` (metarl's DQN against PureJaxRL's ``dqn.py``, its
default config), ``dpo-minatar`` (metarl's PPO with DPO's closed-form drift against the same PPO with
PPO's clipping, Lu et al. 2022, on four MinAtar games with PureJaxRL's MinAtar settings). ``--purejaxrl
DIR`` (or ``--peer DIR``, or ``$METARL_PUREJAXRL``) is a PureJaxRL checkout (``benchmarks/peers.py``:
what it needs and how it is adapted to gymnax 1.0).
``--ablation time-limit-terminal`` runs metarl's side with a time-limit cut reported as a termination
(what PureJaxRL's wrappers do), so metarl does not bootstrap through it.

The final return of a seed, the same for both sides of a row:

- PPO and DPO: the mean return of the episodes that ended during the last 10% of updates (metarl's
  per-update ``episode_return`` weighted by ``episodes``; PureJaxRL's per-step ``returned_episode_returns``
  where ``returned_episode``); where none ended there (Freeway's episodes are 2,500 steps), metarl's
  latest ended episodes' mean (it only arises in ``dpo-minatar``, where both sides are metarl's);
- DQN: the greedy policy of the final parameters, mean return over 32 fresh episodes (PureJaxRL's DQN
  records only each env's last episode return, so no training statistic is defined alike for both).

The verdict is ``decide``'s, fixed before any run: equivalence (two one-sided tests at 5%) holds when the
90% bootstrap interval of metarl's mean over the peer's (both sides' seeds resampled) lies inside
``[1 - margin, 1 + margin]``; ``different`` when it lies wholly outside; ``inconclusive`` otherwise. For a
claim of direction (``dpo-minatar``: DPO beats PPO) the 95% interval of the mean over games of DPO's mean
over PPO's (stratified by game): ``reproduced`` above 1, ``contradicted`` below, ``inconclusive`` across.

The record (``--out``, refused if it exists) is written after every batch of seeds, so a run cut short
leaves what it finished. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time

import numpy as np

from benchmarks import peers, ppo_side_by_side

PPO_CARTPOLE = ppo_side_by_side.PJR_CONFIG  # PureJaxRL's purejaxrl/ppo.py config for CartPole-v1
# PureJaxRL's examples/brax_minatar.ipynb config for MinAtar ("briefly tuned to do well on Gymnax's
# MinAtar environments"), verbatim but for the game.
PPO_MINATAR = dict(PPO_CARTPOLE, LR=5e-3, NUM_ENVS=64, NUM_STEPS=128, TOTAL_TIMESTEPS=1e7, NUM_MINIBATCHES=8,
                   ACTIVATION="relu", ENV_NAME="Breakout-MinAtar")
DPO_GAMES = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar")
TASKS = {
    "ppo-cartpole": {"algo": "ppo", "config": PPO_CARTPOLE, "margin": 0.05,
                     "claim": "PureJaxRL's PPO matches CleanRL's on CartPole-v1 (Lu, PureJaxRL blog post, 2023)"},
    "ppo-breakout": {"algo": "ppo", "config": PPO_MINATAR, "margin": 0.10,
                     "claim": "PureJaxRL's PPO matches CleanRL's on MinAtar-Breakout (Lu, PureJaxRL blog post, 2023)"},
    "dqn-cartpole": {"algo": "dqn", "config": None, "margin": 0.05,
                     "claim": "PureJaxRL's DQN learns CartPole-v1 with its default config (purejaxrl/dqn.py)"},
    "dpo-minatar": {"algo": "dpo", "config": PPO_MINATAR, "games": DPO_GAMES, "tune": "tuned-ppo",
                    "claim": "DPO beats PPO on MinAtar (Lu et al. 2022, Discovered Policy Optimisation, NeurIPS)"},
}
# The tuned PPO's search, per game: PureJaxRL's lr (5e-3) and two factors of 2 either side, each on its own
# seeds (never the evaluation's), the best mean chosen; a choice at the grid's edge is flagged, since the
# optimum may lie outside it.
TUNE = {"field": "lr", "grid": (1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2), "seeds": 4, "first_seed": 1000}
ABLATIONS = ("none", "time-limit-terminal")
WINDOW = 0.1  # the last 10% of updates
EVAL_EPISODES = 32
REPS = 10_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the test, fixed before the runs ----------------------------------------------------------------

def ratio_interval(a, b, level: float, seed: int = 0) -> tuple[float, list[float]]:
    """mean(a) / mean(b) per column, averaged over columns, with a percentile bootstrap interval that
    resamples both sides' seeds within each column (a, b: seeds x tasks; rliable's stratified draws)."""
    a, b = np.asarray(a, float).reshape(len(a), -1), np.asarray(b, float).reshape(len(b), -1)
    rng = np.random.RandomState(seed)

    def ratio(x, y):
        return float(np.mean(x.mean(0) / y.mean(0)))

    def draw(s):
        return s[rng.choice(s.shape[0], s.shape, replace=True), np.arange(s.shape[1])]
    draws = [ratio(draw(a), draw(b)) for _ in range(REPS)]
    low, high = np.nanpercentile(draws, [50 * (1 - level), 50 * (1 + level)])
    return ratio(a, b), [float(low), float(high)]


def decide(a, b, margin: float | None) -> dict:
    """Equivalence within ``margin`` of ``b``'s mean (a 90% interval of the ratio, TOST at 5%), or with
    ``margin`` None, whether ``a`` beats ``b`` (a 95% interval of the ratio); columns are tasks."""
    if margin is None:
        ratio, (low, high) = ratio_interval(a, b, 0.95)
        verdict = "reproduced" if low > 1 else "contradicted" if high < 1 else "inconclusive"
        return {"test": "direction", "level": 0.95, "ratio": ratio, "interval": [low, high], "verdict": verdict}
    ratio, (low, high) = ratio_interval(a, b, 0.90)
    inside = 1 - margin <= low and high <= 1 + margin
    outside = high < 1 - margin or low > 1 + margin
    verdict = "equivalent" if inside else "different" if outside else "inconclusive"
    return {"test": "equivalence (TOST)", "level": 0.90, "margin": margin, "ratio": ratio,
            "interval": [low, high], "verdict": verdict}


# --- the sides --------------------------------------------------------------------------------------

def last_updates(num_updates: int) -> int:
    return max(1, int(round(WINDOW * num_updates)))


def episodes_mean(returns, weights, axis) -> np.ndarray:
    """Mean return of the ended episodes (``weights`` of them at each position), NaN where none ended."""
    total = np.sum(np.asarray(returns, float) * weights, axis=axis)
    count = np.sum(weights, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


class _TimeLimitTerminal:
    """A gymnax environment whose time-limit cut is reported as a termination (gymnax 0.0.x's done,
    what PureJaxRL's wrappers pass on), so a trainer never bootstraps through it."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step_env(self, key, state, action, params):
        obs, state, reward, terminated, info = self._env.step_env(key, state, action, params)
        return obs, state, reward, terminated | self._env.is_truncated(state, params), info

    def is_truncated(self, state, params):
        import jax.numpy as jnp
        return jnp.zeros((), bool)


class _SlimInfo:
    """The peer's environment without gymnax 1.0's ``final_observation`` in ``info``: PureJaxRL keeps
    every info field of every step, and MinAtar's 400 floats a frame would not fit in memory."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, *args, **kwargs):
        *out, info = self._env.step(*args, **kwargs)
        return (*out, {k: v for k, v in info.items() if k != "final_observation"})


def metarl_ppo_config(pjr: dict, env: str, total: int, ablation: str = "none"):
    from metarl.inner_loops import envs
    from metarl.inner_loops.ppo import PPOConfig
    if ablation == "time-limit-terminal":
        base, env = env, f"{env}/time-limit-terminal"
        envs.register(env, lambda **kw: (lambda e, p: (_TimeLimitTerminal(e), p))(*envs.make(base, **kw)))
    return PPOConfig(env=env, num_envs=pjr["NUM_ENVS"], num_steps=pjr["NUM_STEPS"], total_timesteps=total,
                     update_epochs=pjr["UPDATE_EPOCHS"], num_minibatches=pjr["NUM_MINIBATCHES"],
                     activation=pjr["ACTIVATION"], anneal_lr=pjr["ANNEAL_LR"], lr=pjr["LR"], gamma=pjr["GAMMA"],
                     gae_lambda=pjr["GAE_LAMBDA"], clip_eps=pjr["CLIP_EPS"], ent_coef=pjr["ENT_COEF"],
                     vf_coef=pjr["VF_COEF"], max_grad_norm=pjr["MAX_GRAD_NORM"])


def ppo_side(side: str, pjr: dict, env: str, total: int, ablation: str):
    """(train(seeds) -> per-seed final returns, settings): ``side`` is metarl, purejaxrl or dpo."""
    import jax
    if side == "purejaxrl":
        module = peers.load("ppo")
        config = dict(pjr, ENV_NAME=env, TOTAL_TIMESTEPS=float(total))
        module.make_train(dict(config))  # decides the gymnax 1.0 adaptation first
        real = module.gymnax
        module.gymnax = peers._with(real, make=lambda *a, **k: (lambda e, p: (_SlimInfo(e), p))(*real.make(*a, **k)))
        train = module.make_train(config)
        window = last_updates(int(config["NUM_UPDATES"]))

        def final(seeds):
            info = jax.jit(jax.vmap(train))(jax.vmap(jax.random.PRNGKey)(seeds))["metrics"]
            return episodes_mean(info["returned_episode_returns"][:, -window:],
                                 info["returned_episode"][:, -window:], axis=(1, 2, 3))
        return final, config
    from metarl.inner_loops.components import DriftFamily
    from metarl.inner_loops.ppo import make_train
    config = metarl_ppo_config(pjr, env, total, ablation)
    window = last_updates(config.num_updates)
    if side == "dpo":
        family = DriftFamily(baseline="dpo", schedule=False)
        one, meta = make_train(config, policy_objective=family), {"policy_objective": family.init(None)}
    else:
        one, meta = make_train(config), {}

    def final(seeds, lrs=None):
        """Per-seed final returns; with ``lrs`` (one per seed), each training at its own lr, in one program."""
        lrs = jax.numpy.full(len(seeds), config.lr) if lrs is None else jax.numpy.asarray(lrs, jax.numpy.float32)
        train = jax.vmap(lambda k, lr: one(k, {**meta, "lr": lr}))
        _, m = jax.jit(train)(jax.vmap(jax.random.key)(jax.numpy.asarray(seeds)), lrs)
        ended = episodes_mean(m["episode_return"][:, -window:], m["episodes"][:, -window:], axis=1)
        # Where no episode ended in the window (Freeway's run 2,500 steps), the latest that did:
        # metarl's episode_return carries it over.
        return np.where(np.isnan(ended), m["episode_return"][:, -1], ended)
    return final, {f: getattr(config, f) for f in config.__dataclass_fields__}


def tune(final, spec: dict = TUNE) -> dict:
    """``spec``'s grid of lrs, each trained on ``spec``'s seeds (one program for all), the best mean chosen."""
    grid, seeds = np.asarray(spec["grid"]), spec["first_seed"] + np.arange(spec["seeds"])
    t0 = time.perf_counter()
    values = np.asarray(final(np.tile(seeds, len(grid)), np.repeat(grid, len(seeds))), float).reshape(len(grid), -1)
    means = np.nanmean(values, axis=1)
    best = int(np.nanargmax(means))
    return {"field": spec["field"], "grid": grid.tolist(), "seeds": seeds.tolist(),
            "per_seed": np.round(values, 3).tolist(), "means": np.round(means, 3).tolist(),
            "chosen": float(grid[best]), "at_edge": best in (0, len(grid) - 1), "trainings": int(values.size),
            "seconds": round(time.perf_counter() - t0, 1)}


def greedy_returns(params, env_name: str, keys, episodes: int = EVAL_EPISODES):
    """Per seed, the mean return of ``episodes`` episodes of the greedy policy of a relu MLP Q-network
    (``params``: flax's ``{"params": {"Dense_i": {kernel, bias}}}``, a leading seed axis)."""
    import gymnax
    import jax
    import jax.numpy as jnp
    env, env_params = gymnax.make(env_name)
    layers = sorted(params["params"], key=lambda name: int(name.split("_")[1]))

    def q(p, obs):
        x = obs.reshape(-1).astype(jnp.float32)
        for i, name in enumerate(layers):
            x = x @ p[name]["kernel"] + p[name]["bias"]
            x = jax.nn.relu(x) if i < len(layers) - 1 else x
        return x

    def episode(p, key):
        obs, state = env.reset(key, env_params)

        def step(carry, k):
            obs, state, total, alive = carry
            obs, state, reward, term, trunc, _ = env.step(k, state, jnp.argmax(q(p, obs)), env_params)
            return (obs, state, total + alive * reward, alive & ~(term | trunc)), None
        steps = jax.random.split(key, env_params.max_steps_in_episode)
        (_, _, total, _), _ = jax.lax.scan(step, (obs, state, 0.0, jnp.bool_(True)), steps)
        return total

    def per_seed(p, key):
        return jax.vmap(episode, in_axes=(None, 0))(p["params"], jax.random.split(key, episodes)).mean()
    return jax.jit(jax.vmap(per_seed))(params, keys)


def dqn_side(side: str, total: int):
    import jax
    from benchmarks import dqn_side_by_side
    eval_keys = lambda seeds: jax.vmap(lambda s: jax.random.fold_in(jax.random.key(10_000), s))(seeds)  # noqa: E731
    if side == "purejaxrl":
        config = dqn_side_by_side.pjr_config(total)
        train = peers.load("dqn").make_train(config)

        def final(seeds):
            out = jax.jit(jax.vmap(train))(jax.vmap(jax.random.PRNGKey)(seeds))
            return greedy_returns(out["runner_state"][0].params, config["ENV_NAME"], eval_keys(seeds))
        return final, config
    from metarl.inner_loops.dqn import make_train
    config, _, differences = dqn_side_by_side.metarl_config(total, dqn_side_by_side.PJR_CONFIG["NUM_ENVS"] * 500)
    one = make_train(config)

    def final(seeds):
        params, _ = jax.jit(jax.vmap(one))(jax.vmap(jax.random.key)(seeds))
        return greedy_returns(params, config.env, eval_keys(seeds))
    return final, {"config": {f: getattr(config, f) for f in config.__dataclass_fields__}, "differences": differences}


# --- the command ------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage and line
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def fail(parser, field: str, message: str, allowed: str):
    parser.error(f"{field}: {message}; allowed: {allowed}")


def write(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def without_checkout(argv: list[str]) -> list[str]:
    """``argv`` with the peer's checkout written as DIR: a record names no folder of the machine it ran on."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg.split("=")[0] in ("--purejaxrl", "--peer"):
            out[i] = arg.split("=")[0] + "=DIR" if "=" in arg else arg
            if "=" not in arg and i + 1 < len(out):
                out[i + 1] = "DIR"
    return out


def run(args, parser) -> None:
    task = TASKS[args.task]
    algo = task["algo"]
    total = int(args.total_timesteps or (5e5 if algo == "dqn" else task["config"]["TOTAL_TIMESTEPS"]))
    if algo != "dpo":
        peers.require(args.purejaxrl, "dqn" if algo == "dqn" else "ppo", parser.prog)
    import jax
    games = task.get("games") or [None]
    sides = ("dpo", "ppo", task["tune"]) if algo == "dpo" else ("metarl", "purejaxrl")
    record = {
        "task": args.task, "claim": task["claim"],
        "command": "python -m benchmarks.reproduce " + " ".join(without_checkout(sys.argv[1:])),
        "total_timesteps": total, "seeds": args.seeds, "ablation": args.ablation,
        "final_return": (f"greedy policy of the final parameters, mean return over {EVAL_EPISODES} fresh episodes"
                         if algo == "dqn" else "mean return of the episodes that ended in the last 10% of updates"
                         + (" (where none ended there, the latest that did)" if algo == "dpo" else "")),
        "test": ({"test": "direction", "level": 0.95, "against": list(sides[1:])} if algo == "dpo" else
                 {"test": "equivalence (TOST)", "level": 0.90, "margin": task["margin"]}),
        "jax": jax.__version__, "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "sides": {}, "verdict": None,
    }
    write(args.out, record)
    seeds = np.arange(args.seeds)
    for game in games:
        env = game or (task["config"] or {"ENV_NAME": "CartPole-v1"})["ENV_NAME"]
        for side in sides:
            name = f"{side}/{env}" if game else side
            build = (lambda: dqn_side(side, total)) if algo == "dqn" else \
                (lambda: ppo_side(side, task["config"], env, total, args.ablation if side != "purejaxrl" else "none"))
            final, settings = build()
            entry = record["sides"][name] = {"env": env, "settings": settings, "per_seed": [], "seconds": []}
            lr = None
            if side == task.get("tune"):
                log(f"{name}: tuning {TUNE['field']} over {TUNE['grid']} on seeds {TUNE['first_seed']}+")
                entry["tuning"] = tuning = tune(final)
                lr, settings["lr"] = tuning["chosen"], tuning["chosen"]
                log(f"{name}: chose {TUNE['field']} {lr:g} (means {tuning['means']}, {tuning['seconds']:.0f} s)"
                    + (": at the grid's edge, the optimum may lie beyond it" if tuning["at_edge"] else ""))
                write(args.out, record)
            for start in range(0, args.seeds, args.batch):
                chunk = seeds[start:start + args.batch]
                t0 = time.perf_counter()
                values = np.asarray(jax.device_get(final(chunk, None if lr is None else np.full(len(chunk), lr))),
                                    float)
                entry["per_seed"] += [round(float(v), 3) for v in values]
                entry["seconds"].append(round(time.perf_counter() - t0, 1))
                log(f"{name}: seeds {chunk[0]}-{chunk[-1]}: mean {np.nanmean(values):.2f} "
                    f"({entry['seconds'][-1]:.0f} s)")
                write(args.out, record)
    record["machine"]["loadavg_end"] = os.getloadavg()
    record["verdict"] = verdict_of(record)
    if task.get("tune"):
        record["verdict_tuned"] = verdict_of(record, task["tune"])
    write(args.out, record)
    for key in ("verdict", "verdict_tuned")[:1 + bool(task.get("tune"))]:
        v = record[key]
        log(f"{key}: {v['verdict']} (ratio {v['ratio']:.3f}, interval [{v['interval'][0]:.3f}, {v['interval'][1]:.3f}])")


def verdict_of(record: dict, against: str | None = None) -> dict:
    """``decide`` on a record's per-seed returns: the first side over the second (or over ``against``), per game."""
    sides = record["sides"]
    names = list(sides)
    first, second = sorted({n.split("/")[0] for n in names}, key=[n.split("/")[0] for n in names].index)[:2]
    second = against or second
    envs = list(dict.fromkeys(s["env"] for s in sides.values()))
    key = (lambda side, env: f"{side}/{env}") if "/" in names[0] else (lambda side, env: side)
    a = np.array([sides[key(first, e)]["per_seed"] for e in envs]).T
    b = np.array([sides[key(second, e)]["per_seed"] for e in envs]).T
    return decide(a, b, record["test"].get("margin"))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["table"]:
        return table(argv[1:])
    if argv[:1] == ["page"]:
        return page(*argv[1:])
    parser = _Parser(prog="reproduce", description=__doc__.splitlines()[0])
    parser.add_argument("task", help=f"one of {', '.join(TASKS)}")
    parser.add_argument("--purejaxrl", "--peer", metavar="DIR", default=os.environ.get(peers.ENV_VAR) or None,
                        help=f"a PureJaxRL checkout ({peers.UPSTREAM}; default: ${peers.ENV_VAR})")
    parser.add_argument("--seeds", type=int, default=16, help="per side (and game)")
    parser.add_argument("--batch", type=int, default=0, help="seeds per compiled call (default: all)")
    parser.add_argument("--total-timesteps", type=float, default=None, help="frames per seed (default: the task's)")
    parser.add_argument("--ablation", default="none", help=f"one of {', '.join(ABLATIONS)}")
    parser.add_argument("--out", required=True, help="the record (JSON); refused if it exists")
    args = parser.parse_args(argv)
    if args.task not in TASKS:
        fail(parser, "task", repr(args.task), ", ".join(TASKS))
    if args.seeds < 2:
        fail(parser, "--seeds", str(args.seeds), "an integer >= 2 (a bootstrap needs two seeds a side)")
    args.batch = args.batch or args.seeds
    if args.batch < 1:
        fail(parser, "--batch", str(args.batch), "an integer >= 1")
    if args.total_timesteps is not None and args.total_timesteps < 1:
        fail(parser, "--total-timesteps", f"{args.total_timesteps:g}", "a positive number of frames")
    if args.ablation not in ABLATIONS:
        fail(parser, "--ablation", repr(args.ablation), ", ".join(ABLATIONS))
    if args.ablation != "none" and TASKS[args.task]["algo"] != "ppo":
        fail(parser, "--ablation", f"{args.ablation!r} with {args.task}", "none (the ablation is PPO's)")
    if os.path.exists(args.out):
        fail(parser, "--out", f"{args.out} exists (nothing is overwritten)", "a new file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        fail(parser, "--out", f"{os.path.dirname(args.out)} is not a folder", "a file in an existing folder")
    run(args, parser)


# --- the page's tables --------------------------------------------------------------------------------

def row(record: dict) -> dict:
    """What the page prints of a record: each side's mean (and its 95% t interval) and the verdict."""
    from metarl import stats
    out = {"task": record["task"], "frames": record["total_timesteps"], "seeds": record["seeds"], "sides": {}}
    for name, side in record["sides"].items():
        values = np.asarray(side["per_seed"], float)
        out["sides"][name] = {"mean": float(values.mean()), "interval": stats.t_bounds(values),
                              "n": len(values), "minutes": sum(side["seconds"]) / 60}
    out["verdict"] = verdict_of(record) if record.get("verdict") else None
    if record.get("verdict_tuned"):
        out["verdict_tuned"] = verdict_of(record, record["test"]["against"][-1])
    return out


def load(path: str) -> dict:
    """A record of this script, or a ``metarl.evaluate`` report of one task read as one: its first side
    (the learned one) against its second (the baseline), by the direction test."""
    with open(path) as f:
        record = json.load(f)
    if "task" in record:
        return record
    if len(record.get("tasks", ())) != 1:
        raise ValueError(f"{path}: neither a reproduction record nor a metarl.evaluate report of one task")
    task, = record["tasks"]
    (first, a), (second, b) = list(task["sides"].items())[:2]
    sides = {name: {"env": task["env"], "per_seed": side["final_returns"], "seconds": [side["seconds"]]}
             for name, side in ((first, a), (second, b))}
    return {"task": f"{record['kind']} on {task['env']}", "total_timesteps": task["total_timesteps"],
            "seeds": record["num_seeds"], "test": {"test": "direction", "level": 0.95}, "sides": sides,
            "verdict": True, "final_return": record["statistic"]}


def table(paths) -> None:
    """Print, for each record, a line per side and the verdict by the record's own test."""
    for path in paths:
        record = load(path)
        r = row(record)
        test = record["test"]
        print(f"`{os.path.basename(path)}` ({r['task']}, {r['frames']:,} frames, {r['seeds']} seeds a side"
              + (f", ablation {record['ablation']}" if record.get("ablation", "none") != "none" else "") + "):")
        print()
        print("| side | mean final return [95% t interval] | seeds | minutes |")
        print("| --- | --- | --- | --- |")
        for name, s in r["sides"].items():
            print(f"| {name} | {s['mean']:.2f} [{s['interval'][0]:.2f}, {s['interval'][1]:.2f}] | {s['n']} | "
                  f"{s['minutes']:.1f} |")
        v = r["verdict"]
        print()
        if v is None:
            print("verdict: none (the run did not finish)")
        else:
            margin = f", margin {test['margin']:.0%}" if "margin" in test else ""
            print(f"verdict: **{v['verdict']}** ({v['test']}{margin}): ratio {v['ratio']:.3f}, "
                  f"{v['level']:.0%} interval [{v['interval'][0]:.3f}, {v['interval'][1]:.3f}]")
        if "verdict_tuned" in r:
            v, against = r["verdict_tuned"], record["test"]["against"][-1]
            print()
            print(f"against {against}: **{v['verdict']}** ({v['test']}): ratio {v['ratio']:.3f}, "
                  f"{v['level']:.0%} interval [{v['interval'][0]:.3f}, {v['interval'][1]:.3f}]")
            tunings = {s["env"]: s["tuning"] for s in record["sides"].values() if "tuning" in s}
            first = next(iter(tunings.values()))
            print()
            print(f"{against}'s {first['field']}, per game the best mean over "
                  + ", ".join(f"{g:g}" for g in first["grid"]) + f" on {len(first['seeds'])} seeds of its own: "
                  + "; ".join(f"{env} {t['chosen']:g}" + (" (the grid's edge)" if t["at_edge"] else "")
                              for env, t in tunings.items())
                  + f" ({sum(t['trainings'] for t in tunings.values())} trainings, "
                  + f"{sum(t['seconds'] for t in tunings.values()) / 60:.1f} minutes)")
        print()


BLOCK = re.compile(r"(<!-- table: (.+?) -->\n)(.*?)(<!-- end -->)", flags=re.S)


def rendered(paths) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table(paths)
    return out.getvalue().strip() + "\n"


def page(path: str) -> None:
    """Rewrite each ``<!-- table: RECORD ... -->`` block of the page (paths from the repository's root)
    with ``table``'s output for those records."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(path) as f:
        text = f.read()
    text = BLOCK.sub(lambda m: m[1] + rendered([os.path.join(root, p) for p in m[2].split()]) + m[4], text)
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
