"""Matrix-product FLOPs of a compiled program, and this machine's f32 matrix-product rate at PPO's shapes.

``matmul_fraction = (dot FLOPs per frame x frames/s) / matmul_rate``: how much of what XLA's CPU
matrix products reach on PPO's own shapes a training run uses.

- ``hlo_dot_flops(compiled)``: the FLOPs of every ``dot`` in the optimised HLO of a compiled program
  (2 x output elements x contracted length), each multiplied by the trip counts of the loops around it
  (the ``known_trip_count`` XLA writes on each ``while``). ``compiled.cost_analysis()["flops"]`` is not
  used: XLA's cost analysis counts a loop's body once, whatever its trip count (a PPO training of 1 and
  of 16 updates report the same figure), so it undercounts a scanned training by orders of magnitude.
  Products that metarl writes as matrix-vector products or broadcast multiplies (its narrow actor head)
  are not ``dot``s after XLA's simplification and are not counted; ``ppo_analytic_flops_per_frame``
  counts every layer and is the cross-check.
- ``matmul_rate(batch, rows)``: FLOP/s of a jitted loop of ``batch`` independent
  ``(rows x 64) @ (64 x 64)`` products (``rows=128`` is PPO's minibatch, ``batch`` the vmapped agents).
"""
from __future__ import annotations

import os
import re
import statistics
import time
from collections import Counter

import jax
import jax.numpy as jnp
import jaxlib

_COMP = re.compile(r"^(ENTRY )?%?([\w.\-]+) \((.*)\) -> .* \{$")
_PARAM = re.compile(r"([\w.\-]+): ((?:\w+)\[[\d,]*\])")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?)\s([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"^\w+\[([\d,]*)\]")
_CALLS = re.compile(r"\b(?:calls|body|condition|to_apply|branch_computations)=(?:\{([^}]*)\}|%?([\w.\-]+))")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


_TRIVIAL = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}  # no work at run time


def _hlo_totals(compiled) -> tuple[float, Counter]:
    """(dot FLOPs, executed instructions by opcode) of ``compiled``, loops unrolled by their trip counts."""
    shapes: dict[str, list[int]] = {}
    comps: dict[str, dict] = {}
    entry = None
    current = None
    for line in compiled.as_text().splitlines():
        m = _COMP.match(line)
        if m:
            current = {"dots": 0.0, "ops": Counter(), "calls": []}
            comps[m.group(2)] = current
            if m.group(1):
                entry = m.group(2)
            for name, shape in _PARAM.findall(m.group(3)):
                shapes[name] = _dims(shape[shape.index("[") + 1:-1])
            continue
        m = _INSTR.match(line)
        if not m or current is None:
            continue
        name, shape, op, rest = m.groups()
        array = _ARRAY.match(shape)
        if array:
            shapes[name] = _dims(array.group(1))
        if op not in _TRIVIAL:
            current["ops"][op] += 1
        if op == "dot":
            lhs = re.match(r"\s*%?([\w.\-]+)", rest).group(1)
            contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            k = 1
            for d in _dims(contract.group(1)) if contract else []:
                k *= shapes[lhs][d]
            out = 1
            for d in shapes[name]:
                out *= d
            current["dots"] += 2.0 * out * k
        trip = _TRIP.search(rest)
        times = int(trip.group(1)) if (op == "while" and trip) else 1
        for listed, single in _CALLS.findall(rest):
            for callee in (listed or single).split(","):
                callee = callee.strip().lstrip("%")
                if callee:
                    current["calls"].append((callee, times, op))

    def total(name: str, seen=()) -> tuple[float, Counter]:
        comp = comps.get(name)
        if comp is None or name in seen:
            return 0.0, Counter()
        flops, ops = comp["dots"], Counter(comp["ops"])
        for callee, times, op in comp["calls"]:
            sub_flops, sub_ops = total(callee, seen + (name,))
            flops += times * sub_flops
            if op in ("while", "call", "conditional"):  # a fusion's body runs as one operation
                for k, v in sub_ops.items():
                    ops[k] += times * v
        return flops, ops

    return total(entry)


def hlo_dot_flops(compiled) -> float:
    """FLOPs of the ``dot`` instructions of ``compiled`` (a ``jax.stages.Compiled``), loops unrolled."""
    return _hlo_totals(compiled)[0]


def hlo_op_counts(compiled) -> Counter:
    """Instructions ``compiled`` executes, by opcode (a fusion is one), loops unrolled by their trip
    counts; instructions that do no work at run time (parameters, constants, tuples, bitcasts) are left out.
    A conditional's branches are all counted. Newer jax runs small products as library fusions
    (YNNPACK, ``kind=kCustom``), which count as fusions here, not as ``dot``s."""
    return _hlo_totals(compiled)[1]


def ppo_analytic_flops_per_frame(obs: int = 4, hidden: tuple = (64, 64), actions: int = 2,
                                 num_envs: int = 4, num_steps: int = 128, update_epochs: int = 4) -> float:
    """Multiply-add FLOPs (2 per multiply-add) of PPO's dense layers per environment frame: the policy
    forward in the rollout, the value forward on the rollout, the final observations and the last
    observation (metarl's layout; PureJaxRL computes the value inside the rollout, about the same), and
    per epoch a forward and backward pass of actor and critic (the backward pass without the input
    gradient of the first layer)."""
    def layers(out):
        sizes = [obs, *hidden, out]
        return list(zip(sizes[:-1], sizes[1:]))
    fwd = lambda out: sum(2 * a * b for a, b in layers(out))  # noqa: E731
    bwd = lambda out: sum(2 * a * b * (1 if i == 0 else 2) for i, (a, b) in enumerate(layers(out)))  # noqa: E731
    batch = num_envs * num_steps
    rollout = fwd(actions) + fwd(1) * (2 * batch + num_envs) / batch
    update = update_epochs * (fwd(actions) + fwd(1) + bwd(actions) + bwd(1))
    return rollout + update


def matmul_rate(batch: int, rows: int = 128, repeats: int = 5, target_flops: float = 4e9) -> float:
    """Median FLOP/s of a jitted loop of ``batch`` independent (rows x 64) @ (64 x 64) f32 products."""
    per_iter = 2.0 * batch * rows * 64 * 64
    iters = max(100, int(target_flops / per_iter))
    w = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (64, 64)))[0]  # orthogonal: no blow-up
    ws = jnp.broadcast_to(w, (batch, 64, 64))
    x = jax.random.normal(jax.random.key(1), (batch, rows, 64))

    @jax.jit
    def loop(x, ws):
        return jax.lax.fori_loop(0, iters, lambda i, x: jnp.einsum("brk,bkn->brn", x, ws), x)

    jax.block_until_ready(loop(x, ws))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(loop(x, ws))
        times.append(time.perf_counter() - start)
    return per_iter * iters / statistics.median(times)


def cartpole_run_header(total: int, repeats: int, compile_mode: str, options) -> dict:
    """The first keys of a PPO benchmark's JSON: the PureJaxRL CartPole config it ran and how."""
    return {"config": {"env": "CartPole-v1", "num_envs": 4, "num_steps": 128, "update_epochs": 4,
                       "num_minibatches": 4, "hidden": [64, 64], "total_timesteps": total},
            "repeats": repeats, "compile": compile_mode, "compiler_options": options or {}}


MATMUL_KEYS = {
    "matmul_shape": "agents x (128x64 @ 64x64), f32, jitted fori_loop",
    "flops_counted": "dot FLOPs of the optimised HLO x loop trip counts (flop_rate.hlo_dot_flops)",
}


def machine() -> dict:
    """The last keys of a benchmark's JSON: the jax it ran on and the CPUs and flags it had."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = None
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
            "device_count": jax.device_count(), "cpu_count": os.cpu_count(), "cpu_affinity": affinity,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}
