"""Compiling metarl's programs: the compiler options and JAX's persistent cache."""
from __future__ import annotations

import os

import jax


def enable_compilation_cache() -> None:
    """Keep compiled programs on disk for a resumed or repeated run (off with ``METARL_COMPILATION_CACHE=0``)."""
    if os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/metarl/jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# XLA's CPU backend at LLVM optimisation level 1: it compiles faster and the programs run as fast (figures in
# docs/studies/speed.md); rounding differs, so a run, its resumption and its processes all use it.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
# On a GPU, XLA's autotuning keeps the kernels timed fastest at compile time, so another process may pick others
# and give other returns. Without it, a resumed run equals the straight one.
GPU_COMPILER_OPTIONS = {"xla_gpu_autotune_level": 0}
# One agent (or a few) on a multi-core CPU: XLA splits a costly-looking elementwise loop (random-number hash rounds,
# a rollout's critic activations) into one task per core; at this size the hand-off costs more than the work (nor is
# a product split). Same results bit for bit. Populations gain, so metarl's own runs skip these (docs/studies/speed.md).
SINGLE_AGENT_CPU_OPTIONS = {"xla_disable_hlo_passes": "cpu-parallel-task-assigner",
                            "xla_cpu_multi_thread_eigen": False}


def compiler_options() -> dict:
    """The options metarl compiles its programs with, each unless ``XLA_FLAGS`` sets that option itself."""
    options = {"cpu": CPU_COMPILER_OPTIONS, "gpu": GPU_COMPILER_OPTIONS}.get(jax.default_backend(), {})
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in options.items() if k not in flags}


def compile_program(jitted, *args):
    return jitted.lower(*args).compile(compiler_options())
