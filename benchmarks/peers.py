"""PureJaxRL, the peer that metarl's PPO and DQN are measured against, loaded from a checkout the user names.

The repository holds none of PureJaxRL's code: a script that runs it takes ``--purejaxrl DIR`` (or the
environment variable ``METARL_PUREJAXRL``) naming a clone of https://github.com/luchris429/purejaxrl
(the repository's root, or its ``purejaxrl/`` folder). The figures in ``benchmarks/results/`` were
measured with ``purejaxrl/ppo.py`` and ``purejaxrl/wrappers.py`` at commit 31756b1 and
``purejaxrl/dqn.py`` at commit 19f8284. Without a checkout, or with a folder that holds none of those
files, ``require`` prints one line that says so and how to get one, and exits with code 2.

Upstream was written for gymnax 0.0.x and an older jax. ``load`` imports the peer's files from the named
folder as they are and adapts their surroundings, never their text:

- ``wrappers.py`` imports brax and navix at its top for wrappers these benchmarks do not use: where
  either is not installed, a stand-in module is in ``sys.modules`` while the file is imported (using
  anything from it raises ImportError), and is removed afterwards.
- ``ppo.py`` imports its wrappers as ``wrappers`` (older commits) or ``purejaxrl.wrappers`` (newer
  ones): both names point at the loaded ``wrappers.py`` while ``ppo.py`` is imported, and only then.
- gymnax 1.0's ``step`` returns 6 values (``terminated`` and ``truncated`` in place of ``done``), the
  peer unpacks 5. The first ``make_train`` traces the peer's training (``jax.eval_shape``, nothing is
  compiled or run); if it fails unpacking, the peer gets gymnax's own ``LegacyStepAPIWrapper`` (5
  values, ``done = terminated | truncated``, what gymnax 0.0.x returned) where it steps the
  environment: under PureJaxRL's ``FlattenObservationWrapper`` for the PPO (through the module's
  ``gymnax.make``), over gymnax's ``LogWrapper`` for the DQN. A checkout already patched for gymnax
  1.0 traces without failing and is left as it is.
- ``jax.tree_map``, which the DQN calls, is gone from jax: its module sees a ``jax`` that has it
  (``jax.tree_util.tree_map``).

PureJaxRL's own dependencies that metarl does not have (distrax for the PPO, flashbax for the DQN)
are found in ``$PUREJAXRL_EXTRA`` (default ``~/.cache/purejaxrl-extra``), appended to ``sys.path`` so
that the venv's jax, flax and optax win; install them there, not into the venv::

    python -m pip install --no-deps --target ~/.cache/purejaxrl-extra distrax==0.1.9 \\
        tfp-nightly==0.26.0.dev20261027 chex==0.1.92 toolz==1.2.0 decorator==5.3.1 gast==0.7.0 \\
        dm-tree==0.1.10 attrs==26.1.0 wrapt==2.5.2 flashbax==0.1.3
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types

UPSTREAM = "https://github.com/luchris429/purejaxrl"
ENV_VAR = "METARL_PUREJAXRL"
# The peer's files, and the upstream commit the recorded figures were measured with.
FILES = {"ppo": ("ppo.py", "wrappers.py"), "dqn": ("dqn.py",)}
COMMITS = {"ppo": "31756b1", "dqn": "19f8284"}
NEEDS = {"ppo": "distrax", "dqn": "flashbax"}  # what the peer imports that metarl does not install

EXTRA = os.environ.get("PUREJAXRL_EXTRA", os.path.expanduser("~/.cache/purejaxrl-extra"))
if os.path.isdir(EXTRA) and EXTRA not in sys.path:
    sys.path.append(EXTRA)  # distrax, flashbax; appended so that the venv's jax/flax/optax win

_chosen: dict[str, str] = {}   # algo -> the folder that holds its files, set by require()
_loaded: dict[str, types.ModuleType] = {}


def add_option(parser) -> None:
    """``--purejaxrl DIR``, defaulting to ``$METARL_PUREJAXRL``."""
    parser.add_argument("--purejaxrl", metavar="DIR", default=os.environ.get(ENV_VAR) or None,
                        help=f"a PureJaxRL checkout ({UPSTREAM}; default: ${ENV_VAR})")


def find(directory: str | None, algo: str) -> str | None:
    """The folder under ``directory`` (itself or its ``purejaxrl/``) that holds the peer's files, or None."""
    if not directory:
        return None
    for folder in (os.path.join(directory, "purejaxrl"), directory):
        if all(os.path.isfile(os.path.join(folder, name)) for name in FILES[algo]):
            return os.path.abspath(folder)
    return None


def problem(directory: str | None, algo: str) -> str:
    """One line: what is missing, the option that names it, and how to get it."""
    files = " and ".join(f"purejaxrl/{name}" for name in FILES[algo])
    what = (f"{directory} is not a PureJaxRL checkout (no {files})" if directory else
            f"PureJaxRL's {algo.upper()} needs a PureJaxRL checkout")
    return (f"{what}: pass --purejaxrl DIR or set {ENV_VAR}; get one with `git clone {UPSTREAM} DIR && "
            f"git -C DIR checkout {COMMITS[algo]}` (the commit the recorded figures were measured with)")


def require(directory: str | None, algo: str, prog: str | None = None) -> str:
    """The folder of the peer's files; without one (or without its extra dependency), one line on
    stderr and exit code 2."""
    folder = find(directory, algo)
    message = problem(directory, algo) if folder is None else None
    if folder is not None and importlib.util.find_spec(NEEDS[algo]) is None:
        message = (f"PureJaxRL's {algo.upper()} needs {NEEDS[algo]}, not installed: install it beside the venv "
                   f"as benchmarks/peers.py says (pip install --no-deps --target {EXTRA} ...)")
    if message:
        print(f"{prog or os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    _chosen[algo] = folder
    return folder


def load(algo: str) -> types.ModuleType:
    """The peer's ``ppo`` or ``dqn`` module, from the folder ``require`` found (or ``$METARL_PUREJAXRL``),
    imported once per process; its ``make_train`` adapts it to gymnax 1.0 where it needs it."""
    if algo in _loaded:
        return _loaded[algo]
    folder = _chosen.get(algo) or find(os.environ.get(ENV_VAR), algo)
    if folder is None:
        raise RuntimeError(problem(os.environ.get(ENV_VAR), algo))
    if algo == "ppo":
        wrappers = _import("purejaxrl_wrappers", os.path.join(folder, "wrappers.py"), _stand_ins())
        package = types.ModuleType("purejaxrl")
        package.__path__ = []
        package.wrappers = wrappers
        module = _import("purejaxrl_ppo", os.path.join(folder, "ppo.py"),
                         {"wrappers": wrappers, "purejaxrl": package, "purejaxrl.wrappers": wrappers})
    else:
        module = _import("purejaxrl_dqn", os.path.join(folder, "dqn.py"), {})
        import jax
        if not hasattr(jax, "tree_map"):
            module.jax = _with(jax, tree_map=jax.tree_util.tree_map)
    module.make_train = _adapting(module, algo)
    _loaded[algo] = module
    return module


# --- the shim ------------------------------------------------------------------------------------


def _import(name: str, path: str, modules: dict) -> types.ModuleType:
    """``path`` imported as module ``name``, with ``modules`` in ``sys.modules`` (where a name is not
    there already) while it runs, and its prints on stderr (stdout is the benchmarks' JSON)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    added = [key for key in modules if key not in sys.modules]
    sys.modules.update({key: modules[key] for key in added})
    sys.modules[name] = module  # flax dataclasses look their module up there
    try:
        with contextlib.redirect_stdout(sys.stderr):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        for key in added:
            sys.modules.pop(key, None)
    return module


class _Missing(types.ModuleType):
    """A module that is not installed: its submodules are stand-ins too, anything else raises on use."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = sys.modules.get(f"{self.__name__}.{attr}")
        if sub is not None:
            return sub
        name = f"{self.__name__}.{attr}"

        def missing(*args, **kwargs):
            raise ImportError(f"{name}: {self.__name__.split('.')[0]} is not installed")
        return missing


def _stand_ins() -> dict:
    """Stand-ins for the modules PureJaxRL's wrappers.py imports at its top that are not installed."""
    groups = {"brax": ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training"),
              "navix": ("navix",)}
    return {name: _Missing(name) for top, names in groups.items() if importlib.util.find_spec(top) is None
            for name in names}


def _with(base, **extra):
    """A module-like object: ``base``'s attributes, and ``extra``."""
    proxy = types.ModuleType(base.__name__)
    proxy.__getattr__ = lambda attr: getattr(base, attr)
    proxy.__dict__.update(extra)
    return proxy


def _legacy_steps(module: types.ModuleType, algo: str) -> None:
    """Put gymnax's LegacyStepAPIWrapper where the peer steps its environment."""
    import gymnax
    from gymnax.wrappers import LegacyStepAPIWrapper

    if algo == "ppo":  # under PureJaxRL's FlattenObservationWrapper, which unpacks 5 values
        def make(*args, **kwargs):
            env, params = gymnax.make(*args, **kwargs)
            return LegacyStepAPIWrapper(env), params
        module.gymnax = _with(gymnax, make=make)
    else:  # over gymnax's own LogWrapper (6 values), which dqn.py unpacks as 5
        log_wrapper = module.LogWrapper
        module.LogWrapper = lambda env: LegacyStepAPIWrapper(log_wrapper(env))


def _adapting(module: types.ModuleType, algo: str):
    """``module.make_train`` that, the first time, traces the training abstractly and adds the
    legacy step API if the peer fails unpacking gymnax 1.0's step."""
    make_train = module.make_train
    decided = []

    def adapted(config):
        if not decided:
            import jax
            import jax.numpy as jnp

            key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a jax.random.PRNGKey
            try:
                jax.eval_shape(make_train(dict(config)), key)
            except ValueError as error:
                if "values to unpack" not in str(error):
                    raise
                _legacy_steps(module, algo)
                jax.eval_shape(make_train(dict(config)), key)
            decided.append(True)
            jax.clear_caches()  # the timed compilations start from nothing, as without this trace
        return make_train(config)

    return adapted
