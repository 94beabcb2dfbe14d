"""Compiling metarl's programs: the compiler options and JAX's persistent cache."""
from __future__ import annotations

import os

import jax


def enable_compilation_cache() -> None:
    """Keep compiled generations on disk (``JAX_COMPILATION_CACHE_DIR``, default ``~/.cache/metarl/jax``;
    ``METARL_COMPILATION_CACHE=0`` turns it off), so that a resumed or repeated run skips compilation."""
    if os.environ.get("METARL_COMPILATION_CACHE", "1") == "0":
        return
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.expanduser("~/.cache/metarl/jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# XLA's CPU backend at LLVM optimisation level 1: about half the default level's compile time, programs as
# fast or faster (docs/experiments.md); rounding differs, so a run, its resumption and its processes all use it.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compiler_options() -> dict:
    """The options metarl compiles its programs with: ``CPU_COMPILER_OPTIONS`` on CPU, unless
    ``XLA_FLAGS`` sets the optimisation level itself; none on an accelerator."""
    if jax.default_backend() != "cpu" or "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    return dict(CPU_COMPILER_OPTIONS)


def compile_program(jitted, *args):
    return jitted.lower(*args).compile(compiler_options())
