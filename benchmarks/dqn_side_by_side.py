"""metarl's DQN against the real PureJaxRL DQN (from a checkout: ``--purejaxrl DIR``), in ONE process.

Both train CartPole-v1 with PureJaxRL's DQN default config (its ``dqn.py`` ``main()``: 10 envs, buffer
10,000, batch 128, 120x84 relu MLP, learning starts after 10,000 steps, one update per 10 env steps,
hard target copy every 500 steps, epsilon 1.0 -> 0.05 linearly over 250,000 steps, Adam 2.5e-4,
gamma 0.99, 5e5 steps), ``jax.jit(jax.vmap(train))`` over N seeds. metarl's ``DQNConfig`` is set to
match field by field (``config_mapping``; what its fields cannot express is listed under
``differences`` in the JSON). For each agent count every implementation is compiled ahead of time
(``.lower().compile()``, timed: that is ``compile_s``), run once untimed (warm-up), then the timed
runs alternate A B A B ... (``--repeats`` each); frames/s = agents x frames per run / seconds of one
call (block_until_ready). Median, min and max are printed.

Modes (default: throughput):
  --returns    final-return check: per seed, the mean return over the last ``--log-interval``
               environment steps, for each implementation (see ``final_returns``)

PureJaxRL's DQN is loaded from a PureJaxRL checkout named by ``--purejaxrl DIR`` or ``$METARL_PUREJAXRL``
(``benchmarks/peers.py``: how to get one, the flashbax it needs beside the venv, and what is adapted for
gymnax 1.0). Usage, from the repository's root::

    python -m benchmarks.dqn_side_by_side --purejaxrl DIR --returns --agents 2 --total-timesteps 5e5
    python -m benchmarks.dqn_side_by_side --purejaxrl DIR --agents 1 8 32 --repeats 3 --total-timesteps 5e4 \\
        --json benchmarks/results/dqn_side_by_side_2core.json

The LAST stdout line is the metarl/PureJaxRL frames/s ratio for the largest agent count run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import numpy as np

from benchmarks import peers

# PureJaxRL's purejaxrl/dqn.py main() config, verbatim (SEED/NUM_SEEDS/WANDB/ENTITY/PROJECT only
# drive its main(); make_train ignores them).
PJR_CONFIG = {
    "NUM_ENVS": 10, "BUFFER_SIZE": 10000, "BUFFER_BATCH_SIZE": 128, "TOTAL_TIMESTEPS": 5e5,
    "EPSILON_START": 1.0, "EPSILON_FINISH": 0.05, "EPSILON_ANNEAL_TIME": 25e4,
    "TARGET_UPDATE_INTERVAL": 500, "LR": 2.5e-4, "LEARNING_STARTS": 10000, "TRAINING_INTERVAL": 10,
    "LR_LINEAR_DECAY": False, "GAMMA": 0.99, "TAU": 1.0, "ENV_NAME": "CartPole-v1",
    "SEED": 0, "NUM_SEEDS": 1, "WANDB_MODE": "disabled", "ENTITY": "", "PROJECT": "",
}
PJR_HIDDEN = (120, 84)  # PureJaxRL's QNetwork: Dense(120) relu Dense(84) relu Dense(actions)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pjr_config(total):
    return dict(PJR_CONFIG, TOTAL_TIMESTEPS=float(total))


def metarl_config(total, log_interval):
    """metarl's DQNConfig matched to PureJaxRL's config, and the mapping, as (config, mapping, differences)."""
    from metarl.inner_loops.dqn import DQNConfig
    c = pjr_config(total)
    n = c["NUM_ENVS"]
    # One metarl loop iteration steps every env once and makes one update; PureJaxRL makes one
    # update when its step count is a multiple of TRAINING_INTERVAL, i.e. every iteration here.
    assert c["TRAINING_INTERVAL"] == n, "metarl updates once per iteration; only matches TRAINING_INTERVAL == NUM_ENVS"
    assert c["TARGET_UPDATE_INTERVAL"] % n == 0
    # Epsilon: PureJaxRL anneals over an absolute step count, metarl over a share of the run. Over
    # the run's own steps both schedules are the same line: when the run is shorter than the anneal
    # time, metarl's end point is where PureJaxRL's line is at the run's end.
    anneal, start, finish = c["EPSILON_ANNEAL_TIME"], c["EPSILON_START"], c["EPSILON_FINISH"]
    if total >= anneal:
        eps_fraction, eps_end = anneal / total, finish
    else:
        eps_fraction, eps_end = 1.0, start + (finish - start) * total / anneal
    cfg = DQNConfig(
        env=c["ENV_NAME"], total_timesteps=int(total), num_envs=n, buffer_size=c["BUFFER_SIZE"],
        batch_size=c["BUFFER_BATCH_SIZE"], hidden=PJR_HIDDEN, learning_starts=c["LEARNING_STARTS"],
        target_update_period=c["TARGET_UPDATE_INTERVAL"] // n, tau=c["TAU"],
        epsilon_schedule="linear", epsilon_start=start, epsilon_end=eps_end, epsilon_fraction=eps_fraction,
        lr=c["LR"], gamma=c["GAMMA"], loss="mse", double_dqn=False, log_interval=log_interval,
    )
    mapping = {
        "ENV_NAME": f"env={cfg.env!r}",
        "TOTAL_TIMESTEPS": f"total_timesteps={cfg.total_timesteps}",
        "NUM_ENVS": f"num_envs={cfg.num_envs}",
        "BUFFER_SIZE": f"buffer_size={cfg.buffer_size} (flashbax: {c['BUFFER_SIZE'] // n} per env x {n} envs; metarl: one ring of {cfg.buffer_size})",
        "BUFFER_BATCH_SIZE": f"batch_size={cfg.batch_size}",
        "QNetwork 120-84 relu": f"hidden={cfg.hidden} (relu, flax Dense default init in both)",
        "LEARNING_STARTS": f"learning_starts={cfg.learning_starts} (both: first update at the iteration that starts at env step {cfg.learning_starts})",
        "TRAINING_INTERVAL": f"{c['TRAINING_INTERVAL']} = NUM_ENVS: one update per iteration, which is metarl's fixed rate",
        "TARGET_UPDATE_INTERVAL": f"target_update_period={cfg.target_update_period} iterations (= {c['TARGET_UPDATE_INTERVAL']} env steps / {n} envs)",
        "TAU": f"tau={cfg.tau}",
        "EPSILON_START/FINISH/ANNEAL_TIME": (
            f"epsilon_schedule='linear', epsilon_start={start}, epsilon_end={eps_end:.6g}, "
            f"epsilon_fraction={eps_fraction:.6g} (same line over the run's steps)"),
        "LR": f"lr={cfg.lr}",
        "LR_LINEAR_DECAY=False": "constant lr (metarl has no decay)",
        "GAMMA": f"gamma={cfg.gamma}",
        "optax.adam defaults": f"metarl's fused Adam, b1 0.9, b2 0.999, adam_eps={cfg.adam_eps}",
        "loss mean((q - target)**2)": "loss='mse'",
        "(no field)": f"log_interval={cfg.log_interval}, unroll={cfg.unroll} (metarl's defaults: metrics rows and scan unroll)",
    }
    differences = [
        "loss scale: PureJaxRL minimises mean(err**2), metarl 0.5*mean(err**2): gradients differ by a "
        "factor 2, which Adam cancels (up to adam_eps=1e-8)",
        "truncation: PureJaxRL stores done = terminated | truncated (gymnax 0.0.x's done) and does not "
        "bootstrap at CartPole's 500-step time limit; metarl stores terminated only and bootstraps from "
        "the pre-reset final observation",
        "order within an iteration: PureJaxRL acts, steps, adds the transitions, then updates (the batch "
        "may contain this iteration's transitions); metarl updates from the buffer as of the previous "
        "iteration, then acts and steps. Both act with the parameters of the previous update",
        "buffer: flashbax's flat buffer samples (obs_t, obs_t+1) pairs from per-env time rows (the next "
        "observation after a reset is the reset observation, masked by done); metarl stores (obs, "
        "final_obs, action, reward, terminated) rows. Both sample uniformly with replacement; flashbax "
        "cannot yet sample each env's newest observation as a pair's first (it has no successor)",
        "sampling gate: PureJaxRL also requires flashbax's can_sample (> 128 // 10 steps per env), always "
        "true at step 10,000",
        "metrics: PureJaxRL records 4 scalars every iteration (timesteps, updates, loss, mean of each "
        "env's last returned episode return); metarl records 4 scalars every log_interval steps",
        "random streams: PureJaxRL splits threefry keys every step and draws env resets inside env.step; "
        "metarl pre-draws a log interval's noise, environment keys and resets",
    ]
    if total < anneal:
        differences.append(
            f"epsilon: none over the run, but metarl's line is written as 1.0 -> {eps_end:.4g} over the run "
            f"because its epsilon_fraction is capped at 1 (PureJaxRL anneals over {anneal:g} steps, longer than "
            f"this run of {total:g})")
    return cfg, mapping, differences


def build(impl, total, n, log_interval):
    """(compiled fn(keys), keys maker(seed), frames per agent per call, compile seconds)."""
    if impl == "metarl":
        from metarl.inner_loops.dqn import make_train
        cfg, _, _ = metarl_config(total, log_interval)
        one = make_train(cfg)
        keys = lambda s: jax.random.split(jax.random.key(s), n)  # noqa: E731
        frames = cfg.frames_per_run
    elif impl == "purejaxrl":
        pjr = peers.load("dqn")
        config = pjr_config(total)
        one = pjr.make_train(config)
        keys = lambda s: jax.random.split(jax.random.PRNGKey(s), n)  # noqa: E731
        frames = int(config["NUM_UPDATES"]) * config["NUM_ENVS"]
    else:
        raise ValueError(impl)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(one)).lower(keys(0)).compile()
    return compiled, keys, frames, time.perf_counter() - t0


def throughput(args):
    out = {}
    for n in args.agents:
        built = {impl: build(impl, args.total_timesteps, n, args.log_interval) for impl in args.impl}
        runs = {impl: [] for impl in args.impl}
        for impl, (fn, keys, _, comp) in built.items():
            k = jax.block_until_ready(keys(1))
            jax.block_until_ready(fn(k))  # warm-up, untimed
            log(f"[{n} agents] {impl}: compile {comp:.1f}s")
        for r in range(args.repeats):
            for impl in args.impl:  # A B A B ...
                fn, keys, frames, _ = built[impl]
                k = jax.block_until_ready(keys(r + 2))
                t0 = time.perf_counter()
                jax.block_until_ready(fn(k))
                dt = time.perf_counter() - t0
                runs[impl].append(frames * n / dt)
                log(f"[{n} agents] {impl}: run {r} {dt:.3f}s {frames * n / dt:.3g} frames/s")
        out[n] = {impl: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v,
                         "compile_s": built[impl][3], "frames_per_agent": built[impl][2]}
                  for impl, v in runs.items()}
        del built
    return out


def final_returns(args):
    """Per seed, the mean return over the last ``log_interval`` env steps.

    metarl: its last metrics row (mean return of the episodes that ended in the last log interval).
    PureJaxRL: the mean, over the last ``log_interval / NUM_ENVS`` iterations, of its per-iteration
    ``returns`` metric (the mean over envs of each env's last finished episode's return)."""
    n = max(args.agents)
    res = {}
    for impl in args.impl:
        fn, keys, frames, comp = build(impl, args.total_timesteps, n, args.log_interval)
        t0 = time.perf_counter()
        out = jax.device_get(fn(keys(0)))
        dt = time.perf_counter() - t0
        if impl == "metarl":
            _, m = out
            per_seed = np.asarray(m["episode_return"])[:, -1]
        else:
            last = args.log_interval // PJR_CONFIG["NUM_ENVS"]
            per_seed = np.asarray(out["metrics"]["returns"])[:, -last:].mean(1)
        res[impl] = {"mean": float(per_seed.mean()), "per_seed": [round(float(x), 1) for x in per_seed],
                     "frames_per_agent": frames, "compile_s": round(comp, 2), "run_s": round(dt, 2)}
        log(f"{impl}: final return {per_seed.mean():.1f} per seed {np.round(per_seed, 1).tolist()} "
            f"(compile {comp:.1f}s, run {dt:.1f}s)")
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--total-timesteps", type=float, default=1e5,
                   help="per agent; PureJaxRL's default is 5e5 (use it with --returns)")
    p.add_argument("--log-interval", type=int, default=5000,
                   help="metarl's metrics row (env steps; divides --total-timesteps); also the --returns window")
    p.add_argument("--impl", nargs="+", default=["metarl", "purejaxrl"], choices=["metarl", "purejaxrl"])
    p.add_argument("--returns", action="store_true")
    p.add_argument("--json", default="", help="also write the results here")
    peers.add_option(p)
    args = p.parse_args()
    if "purejaxrl" in args.impl:
        peers.require(args.purejaxrl, "dqn", p.prog)
    args.total_timesteps = int(args.total_timesteps)
    if args.total_timesteps % args.log_interval or args.log_interval % PJR_CONFIG["NUM_ENVS"]:
        p.error(f"--log-interval {args.log_interval} must divide --total-timesteps {args.total_timesteps} "
                f"and be a multiple of NUM_ENVS={PJR_CONFIG['NUM_ENVS']}")
    cfg, mapping, differences = metarl_config(args.total_timesteps, args.log_interval)
    from importlib.metadata import version
    meta = {"jax": jax.__version__, "flashbax": version("flashbax") if "purejaxrl" in args.impl else None, "gymnax": version("gymnax"),
            "affinity": sorted(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg(),
            "total_timesteps": args.total_timesteps,
            "repeats": args.repeats, "agents": args.agents, "argv": sys.argv[1:],
            "purejaxrl_config": pjr_config(args.total_timesteps),
            "metarl_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "config_mapping": mapping, "differences": differences}
    for k, v in mapping.items():
        log(f"  {k:<34} -> {v}")
    if args.returns:
        res = {"final_returns": final_returns(args)}
    else:
        res = {"throughput": throughput(args)}
    meta["loadavg_end"] = os.getloadavg()  # another process on the machine shows here
    res["meta"] = meta
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if "throughput" in res:
        tp = res["throughput"]
        for n, row in tp.items():
            for impl, s in row.items():
                print(f"{n:>3} agents {impl:>9}: {s['median']:.3g} frames/s (min {s['min']:.3g}, "
                      f"max {s['max']:.3g}), compile {s['compile_s']:.1f}s")
        if "metarl" in args.impl and "purejaxrl" in args.impl:
            for n in sorted(tp):  # the largest agent count last
                m, q = tp[n]["metarl"]["median"], tp[n]["purejaxrl"]["median"]
                print(f"metarl/PureJaxRL frames/s {n} agents: {m / q:.2f}x (metarl {m:.3g}, PureJaxRL {q:.3g})")
    else:
        print(json.dumps(res["final_returns"], default=str))


if __name__ == "__main__":
    main()
