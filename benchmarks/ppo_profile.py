"""Where metarl's PPO spends its time: a jax.profiler trace of the compiled training, by part.

For each agent count, ``jax.jit(jax.vmap(train))`` of metarl's PPO (CartPole-v1, PureJaxRL's default
config) is compiled, run once untimed, then run ``--repeats`` times under ``jax.profiler.trace``. Every
event of XLA's CPU runtime that names an HLO instruction (its ``hlo_op`` stat) is mapped to that
instruction's ``op_name`` metadata in the compiled program's HLO, and so to the ``jax.named_scope``
it was written under in ``metarl/inner_loops/ppo.py``:

- ``env_step``: the environment's steps and reset draws;
- ``network``: actor and critic forward passes, the loss and its gradient (forward and backward);
- ``optimizer``: gradient clipping, Adam and the parameter update;
- ``sampling_shuffle``: the action noise and choice, the minibatch permutations and their gather;
- ``rest``: everything else: instructions outside those scopes (GAE, metrics, loop counters,
  copies between loop iterations, and the while loops' own bookkeeping), plus the time no
  instruction ran at all (the runtime's per-operation dispatch and thread hand-offs).

Each instruction's exclusive time (its event minus the events nested in it on the same thread) is
summed per part over all threads. XLA may run instructions on both cores at once, so the parts are
scaled to the time at least one instruction ran (the union of the events), and ``rest`` gets the
remainder of the wall time. An instruction XLA fused from several scopes counts in the scope of the
fusion's root. Prints one JSON object on stdout (progress to stderr)::

    timeout 900 python -m benchmarks.ppo_profile --agents 1 32 --total-timesteps 5e4
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

import jax
from jax.profiler import ProfileData

from metarl.inner_loops.ppo import PPOConfig, make_train

PARTS = ("env_step", "network", "optimizer", "sampling_shuffle", "rest")
SCOPES = {"env_step": "env_step", "network": "network", "optimizer": "optimizer", "sampling": "sampling_shuffle"}
_NAME = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def instruction_parts(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> part, from the innermost of ppo.py's named scopes in its op_name."""
    parts = {}
    for line in hlo_text.splitlines():
        m = _NAME.match(line)
        if not m:
            continue
        op = _OP_NAME.search(line)
        part = "rest"
        if not op and "dot" in m.group(1):
            # XLA's rewrites of a product (to a matrix-vector product, a batch-free dot) drop its
            # metadata; every product in PPO's training is a layer of the networks.
            part = "network"
        elif op:
            innermost = -1
            for scope, name in SCOPES.items():
                i = op.group(1).rfind(f"/{scope}/")
                if i > innermost:
                    innermost, part = i, name
        parts[m.group(1)] = part
    return parts


def trace_events(log_dir: str):
    """Per thread, the (start, end, hlo_op) of every event that names an HLO instruction."""
    path = sorted(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    threads = []
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            events = []
            for e in line.events:
                op = dict(e.stats).get("hlo_op")
                if op:
                    events.append((e.start_ns, e.end_ns, op))
            if events:
                threads.append(sorted(events, key=lambda ev: (ev[0], -ev[1])))
    return threads


def exclusive_times(events):
    """(hlo_op, exclusive ns) for events on one thread, sorted by start: an event's time minus the
    time of the events nested directly inside it."""
    out, stack = [], []  # stack: [start, end, op, child ns]
    for start, end, op in events:
        while stack and stack[-1][1] <= start:
            s, e, o, c = stack.pop()
            out.append((o, (e - s) - c))
        if stack:
            stack[-1][3] += end - start
        stack.append([start, end, op, 0])
    while stack:
        s, e, o, c = stack.pop()
        out.append((o, (e - s) - c))
    return out


def union_ns(threads) -> int:
    intervals = sorted((s, e) for events in threads for s, e, _ in events)
    total, cur_s, cur_e = 0, None, None
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def profile(n: int, total: int, repeats: int, host_tracer_level: int = 1) -> dict:
    config = PPOConfig(env="CartPole-v1", total_timesteps=total)
    keys = jax.random.split(jax.random.key(0), n)
    compiled = jax.jit(jax.vmap(make_train(config))).lower(keys).compile()
    parts_of = instruction_parts(compiled.as_text())
    jax.block_until_ready(compiled(keys))  # warm-up, untimed
    log_dir = tempfile.mkdtemp(prefix="metarl-ppo-profile-")
    try:
        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = host_tracer_level
        options.python_tracer_level = 0
        with jax.profiler.trace(log_dir, profiler_options=options):
            start = time.perf_counter()
            for r in range(repeats):
                jax.block_until_ready(compiled(jax.random.split(jax.random.key(r + 1), n)))
            wall_ns = (time.perf_counter() - start) * 1e9
        threads = trace_events(log_dir)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    busy = {p: 0.0 for p in PARTS}
    unknown = 0
    for events in threads:
        for op, ns in exclusive_times(events):
            part = parts_of.get(op)
            if part is None:
                unknown += ns
                part = "rest"
            busy[part] += ns
    union = union_ns(threads)
    total_busy = sum(busy.values())
    scale = union / total_busy
    shares = {p: busy[p] * scale / wall_ns for p in PARTS}
    shares["rest"] += max(0.0, wall_ns - union) / wall_ns
    return {
        "shares": {p: round(v, 3) for p, v in shares.items()},
        "rest_split": {"unscoped_instructions": round(busy["rest"] * scale / wall_ns, 3),
                       "no_instruction_running": round(max(0.0, wall_ns - union) / wall_ns, 3)},
        "busy_ms_summed_over_threads": {p: round(v / 1e6, 1) for p, v in busy.items()},
        "instruction_time_union_ms": round(union / 1e6, 1),
        "wall_ms": round(wall_ns / 1e6, 1),
        "frames_per_s": round(repeats * n * config.frames_per_run / (wall_ns / 1e9)),
        "threads_with_instructions": len(threads),
        "unmatched_event_ms": round(unknown / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--total-timesteps", type=float, default=5e4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    out = {}
    for n in args.agents:
        load = os.getloadavg()
        out[str(n)] = profile(n, int(args.total_timesteps), args.repeats)
        out[str(n)]["loadavg_before"] = [round(x, 2) for x in load]
        log(f"[{n} agents] {out[str(n)]['shares']}")
    print(json.dumps({"benchmark": "ppo_profile", "env": "CartPole-v1",
                      "total_timesteps": int(args.total_timesteps), "repeats": args.repeats,
                      "parts": out, "jax": jax.__version__, "cpu_count": os.cpu_count(),
                      "xla_flags": os.environ.get("XLA_FLAGS", "")}))


if __name__ == "__main__":
    main()
