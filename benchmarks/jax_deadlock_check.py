"""Does a jax release deadlock on this CPU? A PPO training run N times, each in a fresh process under a timeout.

Each run is a child process that compiles ``jax.jit(jax.vmap(train))`` over ``--seeds`` keys, with a
``--total-timesteps`` budget on CartPole-v1 (4 envs x 128 steps, 4 epochs x 4 minibatches, 64x64), or with
``--settings minatar`` on ``--env`` (default Breakout-MinAtar) with PureJaxRL's MinAtar settings (64 envs x
128 steps, 4 epochs x 8 minibatches, relu 64x64, lr 5e-3), and runs it once. ``train`` is ``metarl.inner_loops.ppo``'s, or with ``--impl reference`` the
PureJaxRL-style PPO in ``benchmarks/reference_ppo.py``. A child still compiling after
``--compile-timeout`` s, or still running after ``--timeout`` s more, is killed and counted as a hang;
its CPU seconds tell a deadlock (all threads waiting) from a slow run. Every child compiles from
scratch (no persistent compilation cache) with default XLA flags (``XLA_FLAGS`` is removed from its
environment) unless ``--xla-flags`` gives some, and runs under ``--python`` (default: this
interpreter), so one invocation checks another virtual environment's jax (a child runs as
``python -m benchmarks.jax_deadlock_check`` from the repository's root, so it imports this checkout's
metarl with that interpreter's jax). Prints ONE JSON object:
the children's jax and jaxlib, runs, hangs, errors, the medians of frames/s and compile seconds over
the runs that finished, the settings, the load average before and after (the machine may be shared)
and every run's record; progress goes to stderr.

Usage::

    python -m benchmarks.jax_deadlock_check --runs 6                  # about 3-5 minutes on 2 cores
    python -m benchmarks.jax_deadlock_check --runs 6 --impl reference --python /tmp/jax0102/bin/python
    python -m benchmarks.jax_deadlock_check --runs 1 --settings minatar --seeds 16 --total-timesteps 1e6 \\
        --timeout 840 --python /tmp/py311/bin/python        # the shape a 3.11 user saw hang
    python -m benchmarks.jax_deadlock_check --runs 6 --seeds 8 \\
        --xla-flags=--xla_cpu_enable_concurrency_optimized_scheduler=false
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# PureJaxRL's MinAtar PPO (as experiments/experiment/lpo_minatar_gpu.yaml)
MINATAR = {"num_envs": 64, "num_steps": 128, "num_minibatches": 8, "activation": "relu", "lr": 5e-3}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # children run `-m benchmarks...` from here


def child(args) -> None:
    """One training; one JSON line per phase, so the parent sees how far a hung run got."""
    import jax

    from metarl.compilation import compile_program
    from metarl.inner_loops.ppo import PPOConfig, make_train

    print(json.dumps({"jax": jax.__version__, "jaxlib": __import__("jaxlib").__version__}), flush=True)
    total = int(args.total_timesteps)
    env = args.env or ("Breakout-MinAtar" if args.settings == "minatar" else "CartPole-v1")
    settings = MINATAR if args.settings == "minatar" else {}
    if args.impl == "metarl":
        config = PPOConfig(env=env, total_timesteps=total, **settings)
        one, frames = make_train(config), config.frames_per_run
    else:
        from benchmarks import reference_ppo
        if settings:
            raise SystemExit("error: --settings minatar: only with --impl metarl")
        one = reference_ppo.make_train(total_timesteps=total, env_name=env)
        frames = reference_ppo.frames_per_run(total_timesteps=total)
    train = jax.jit(jax.vmap(one))
    keys = jax.random.split(jax.random.key(0), args.seeds)
    start = time.perf_counter()
    compiled = compile_program(train, keys) if args.compile == "metarl" else train.lower(keys).compile()
    print(json.dumps({"compile_s": round(time.perf_counter() - start, 2)}), flush=True)
    start = time.perf_counter()
    jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - start
    print(json.dumps({"run_s": round(run_s, 4), "frames_per_s": round(frames * args.seeds / run_s)}),
          flush=True)


def one_run(args) -> dict:
    """A fresh child process: its phases' JSON, status, wall and CPU seconds. It is killed as hung when
    compiling takes over ``--compile-timeout`` s or running the compiled program over ``--timeout`` s."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
    if args.xla_flags:
        env["XLA_FLAGS"] = args.xla_flags
    cmd = [args.python, "-m", "benchmarks.jax_deadlock_check", "--child", "--seeds", str(args.seeds),
           "--total-timesteps", str(args.total_timesteps), "--settings", args.settings, "--env", args.env,
           "--compile", args.compile, "--impl", args.impl]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
        reader.start()
        status, compiled_at = None, None
        while proc.poll() is None and status is None:
            if compiled_at is None and any('"compile_s"' in line for line in lines):
                compiled_at = time.perf_counter()
            if compiled_at is None and time.perf_counter() - start > args.compile_timeout:
                status = "hang in compile"
            elif compiled_at is not None and time.perf_counter() - compiled_at > args.timeout:
                status = "hang"
            if status:
                proc.kill()
            time.sleep(0.1)
        proc.wait()
        reader.join()
        stderr.seek(0)
        status = status or ("ok" if proc.returncode == 0 else f"exit {proc.returncode}")
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        record = {"status": status, "wall_s": round(time.perf_counter() - start, 1),
                  "cpu_s": round(cpu.ru_utime + cpu.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime, 1)}
        for line in lines:
            record.update(json.loads(line))
        if status.startswith("exit"):
            record["stderr"] = stderr.read().strip().splitlines()[-1:]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the compiled program may run before the run counts as a hang")
    parser.add_argument("--compile-timeout", type=float, default=300.0,
                        help="seconds the child may take to start and compile before it counts as a hang")
    parser.add_argument("--seeds", type=int, default=4, help="vmapped trainings in one program")
    parser.add_argument("--total-timesteps", type=float, default=1e4, help="frames per training")
    parser.add_argument("--settings", choices=("cartpole", "minatar"), default="cartpole",
                        help="CartPole's PPO settings, or PureJaxRL's MinAtar ones")
    parser.add_argument("--env", default="", help="environment (default: CartPole-v1, or Breakout-MinAtar)")
    parser.add_argument("--xla-flags", default="", help="XLA_FLAGS for the children (default: none)")
    parser.add_argument("--compile", choices=("default", "metarl"), default="default",
                        help="jax's default compiler options, or metarl's own (metarl.compilation.compiler_options)")
    parser.add_argument("--impl", choices=("metarl", "reference"), default="metarl",
                        help="metarl's PPO, or the PureJaxRL-style one in benchmarks/reference_ppo.py")
    parser.add_argument("--python", default=sys.executable, help="interpreter (and so jax) the children use")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    load_before = os.getloadavg()
    records = []
    for i in range(args.runs):
        records.append(one_run(args))
        print(f"run {i + 1}/{args.runs}: {json.dumps(records[-1])}", file=sys.stderr, flush=True)
    done = [r for r in records if r["status"] == "ok"]
    median = lambda key: statistics.median(r[key] for r in done) if done else None  # noqa: E731
    versions = next((r for r in records if "jax" in r), {})
    print(json.dumps({
        "jax": versions.get("jax"), "jaxlib": versions.get("jaxlib"), "python": args.python,
        "runs": len(records), "hangs": sum(r["status"].startswith("hang") for r in records),
        "errors": sum(r["status"].startswith("exit") for r in records),
        "frames_per_s_median": median("frames_per_s"), "compile_s_median": median("compile_s"),
        "impl": args.impl, "xla_flags": args.xla_flags, "compile": args.compile, "seeds": args.seeds,
        "settings": args.settings, "env": args.env, "total_timesteps": int(args.total_timesteps), "timeout_s": args.timeout,
        "compile_timeout_s": args.compile_timeout,
        "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "per_run": records,
    }))


if __name__ == "__main__":
    main()
