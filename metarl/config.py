"""Run configuration: composed by Hydra from ``experiments/*.yaml`` plus ``key=value`` overrides,
then checked once, here, into typed dataclasses. Every error is one line that names the field and
says what is allowed (``ConfigError``); nothing is compiled before the config is valid.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import typing
from pathlib import Path
from typing import Optional

from metarl import experiments as _experiments_pkg
from metarl.outer_loops.es_config import ESConfig
from metarl.inner_loops.config_checks import INT32_MAX
from metarl.inner_loops.plugins import ConfigError

EXPERIMENTS_DIR = Path(_experiments_pkg.__file__).parent
CONFIG_FILE = "config.yaml"   # a run directory's resolved config: what resume, inspect and evaluate read
SEED_MAX = 2**63 - 1   # jax.random.key takes a C long
# Settings that do not change what the search computes; a resumed run may change these.
RESUMABLE_FIELDS = ("run_dir", "experiments_dir", "eval_tasks", "es.generations", "checkpoint", "logger", "devices")


def available_experiments(experiments_dir: Optional[str] = None) -> list[str]:
    """Shipped experiments, plus the YAML files of a user's own ``experiments_dir``."""
    dirs = [EXPERIMENTS_DIR] + ([Path(experiments_dir)] if experiments_dir else [])
    return sorted({p.stem for d in dirs for p in d.glob("*.yaml") if p.stem != "base"})


def check_experiments_dir(experiments_dir: Optional[str]) -> Optional[str]:
    """The user's experiment folder as an absolute path, or None; refused unless it is a directory."""
    if experiments_dir is None:
        return None
    path = Path(experiments_dir).expanduser()
    if not path.is_dir():
        raise ConfigError(f"experiments_dir: {experiments_dir!r} is not a directory; allowed: a folder of "
                          "experiment YAML files (they may list `base` in their defaults)")
    return str(path.resolve())


# --- the schema ----------------------------------------------------------------------------------

def _checked(allowed: str, ok, **default):
    """A setting whose values ``ok`` accepts; ``build`` refuses any other, saying what is ``allowed``."""
    return dataclasses.field(**default, metadata={"ok": ok, "allowed": allowed})


def _choice(*allowed: str):
    """A setting with a fixed set of values, the first its default."""
    return _checked(", ".join(allowed), allowed.__contains__, default=allowed[0])


def _positive(default: int):
    return _checked("> 0", lambda value: value > 0, default=default)


@dataclasses.dataclass(frozen=True)
class ESSection(ESConfig):
    """The ``es`` section: the evolution driver's own settings (``ESConfig``), handed to it as they
    are, plus how many generations to run and where the search starts (the component's ``init``)."""

    generations: int = _positive(30)
    init_mean: str = _choice("zeros", "init")


@dataclasses.dataclass(frozen=True)
class FitnessSection:
    num_seeds: int = _positive(2)
    statistic: str = _choice("final", "auc")
    window: float = _checked("a fraction in (0, 1]", lambda window: 0.0 < window <= 1.0, default=0.2)
    nonfinite_floor: Optional[float] = None
    # How each task's return becomes a score (docs/experiments.md); null: baseline with several
    # tasks, none with one.
    normalize: Optional[str] = _checked("baseline, none or null (baseline with several tasks, none with one)",
                                        (None, "baseline", "none").__contains__, default=None)
    aggregate: str = _choice("mean", "median", "min")   # over tasks
    control: str = _choice("none", "baseline", "paired")   # docs/signal.md
    # seeds of the reference returns normalize=baseline scores against
    reference_seeds: int = _checked("an integer >= 2", lambda seeds: seeds >= 2, default=32)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = _positive(5)
    keep: int = _positive(3)


@dataclasses.dataclass(frozen=True)
class WandbSection:
    mode: str = _choice("disabled", "offline", "online")
    project: str = "metarl"
    entity: Optional[str] = None
    group: Optional[str] = None   # runs of one sweep share a group; null: the run stands alone
    tags: list = _checked("a list of non-empty strings", lambda tags: all(isinstance(t, str) and t for t in tags),
                          default_factory=list)


@dataclasses.dataclass(frozen=True)
class MlflowSection:
    mode: str = _choice("disabled", "enabled")
    # A folder: a local store in it (mlflow.db and artifacts/); or MLflow's own URI (http://HOST:PORT, sqlite:///...).
    tracking_uri: str = _checked("a folder for a local store (mlruns), or an MLflow tracking URI such as "
                                 "http://HOST:PORT", lambda uri: uri.strip(), default="mlruns")
    experiment: Optional[str] = _checked("a name, or null (the run's experiment)",
                                         lambda name: name is None or name.strip(), default=None)
    tags: dict = _checked("a mapping of names to strings or numbers, such as {study: doors}",
                          lambda tags: all(isinstance(k, str) and k and isinstance(v, (str, int, float, bool))
                                           for k, v in tags.items()), default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LoggerSection:
    progress: bool = True
    verbose: bool = False    # third-party libraries' lines on the console too (wandb's)
    wandb: WandbSection = WandbSection()
    mlflow: MlflowSection = MlflowSection()


@dataclasses.dataclass(frozen=True)
class DevicesSection:
    # One process per machine; on a CPU it makes this many CPU devices (auto: one per usable core).
    num_cpu_devices: typing.Union[int, str] = _checked(
        "auto (one per usable CPU core, or JAX_NUM_CPU_DEVICES) or a positive integer",
        lambda n: n == "auto" or (isinstance(n, int) and n > 0), default="auto")
    # Several hosts, one process each, joined by jax.distributed (auto: METARL_NUM_PROCESSES or SLURM's, else 1).
    num_processes: typing.Union[int, str] = _checked(
        "auto (from METARL_NUM_PROCESSES or SLURM, else 1) or a positive integer",
        lambda n: n == "auto" or (isinstance(n, int) and n > 0), default="auto")
    coordinator_address: Optional[str] = None
    process_id: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    experiment: str = _checked("the name of an experiment", bool)
    seed: int = _checked(f"an integer from 0 to {SEED_MAX}", lambda seed: 0 <= seed <= SEED_MAX, default=0)
    env: typing.Union[str, dict] = "CartPole-v1"   # a name, or {_target_: NAME or dotted.path, ...arguments}
    # Meta-training tasks (each an env, or {env, inner: {...}, name}); empty: the one task `env`.
    tasks: Optional[list] = None
    eval_tasks: Optional[list] = None   # held out: never used for fitness
    run_dir: Optional[str] = None
    experiments_dir: Optional[str] = None   # a user's own experiment YAMLs, beside the shipped ones
    component: dict = dataclasses.field(default_factory=dict)
    inner: dict = dataclasses.field(default_factory=dict)
    es: ESSection = ESSection()
    fitness: FitnessSection = FitnessSection()
    checkpoint: CheckpointSection = CheckpointSection()
    logger: LoggerSection = LoggerSection()
    devices: DevicesSection = DevicesSection()

    def to_dict(self) -> dict:
        """Plain data, keyed as in the config files (the form ``config.yaml`` stores)."""
        return to_dict(self)


# --- building and checking -------------------------------------------------------------------------

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
               list: "a list"}


def _coerce(value, tp, path):
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X], or one of several types
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for arg in args:
            try:
                return _coerce(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        # A value of the right type but out of range (an int past int32) says so, not "a string".
        raise next((err for arg, err in zip(args, errors) if isinstance(value, arg) and not isinstance(value, bool)),
                   errors[-1])
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {value!r}; allowed: a mapping of {', '.join(_key(f) for f in dataclasses.fields(tp))}")
        return build(tp, value, path + ".")
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        # nan or inf would reach the search as a number and come out as non-JSON metrics.
        if not math.isfinite(value):
            raise ConfigError(f"{path}: {value!r}; allowed: a finite number")
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        # Sizes, counts and budgets become int32 inside JAX; the seed has its own, wider range.
        if path != "seed" and not -INT32_MAX - 1 <= value <= INT32_MAX:
            raise ConfigError(f"{path}: {value}; allowed: an integer of at most {INT32_MAX}")
        return value
    if tp in (str, bool, dict, list) and isinstance(value, tp):
        return value
    raise ConfigError(f"{path}: {value!r}; allowed: {_TYPE_NAMES.get(tp, getattr(tp, '__name__', str(tp)))}")


def _key(field: dataclasses.Field) -> str:
    """A field's name in the config files: its ``key`` metadata (``_target_`` for ``ESConfig.target``)
    or its own name."""
    return field.metadata.get("key", field.name)


def build(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a plain dict, refusing unknown keys, wrong types and values that a
    field's ``ok`` (``_checked``) refuses."""
    hints = typing.get_type_hints(cls)
    fields = {_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown setting; allowed: {', '.join(fields)}")
    kwargs = {}
    for key, value in data.items():
        field = fields[key]
        kwargs[field.name] = value = _coerce(value, hints[field.name], prefix + key)
        if "ok" in field.metadata and not field.metadata["ok"](value):
            shown = "empty" if isinstance(value, str) and not value.strip() else repr(value)
            raise ConfigError(f"{prefix}{key}: {shown}; allowed: {field.metadata['allowed']}")
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {err}") from None


def to_dict(value):
    """The inverse of ``build``: nested plain dicts and lists, keyed as in the config files."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {_key(f): to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_dict(v) for v in value)
    return value


def check_run_dir(run_dir: str, field: str = "run_dir") -> None:
    """Refuse a path that cannot become a directory: an existing file, a path under a file, or a
    place this user may not create it in. Nothing is created here. Checked where a run starts, not in
    ``build``: a saved config read on another machine (inspect, evaluate) names a path of that one."""
    path = Path(run_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{field}: {run_dir} is a file; allowed: a new or existing directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{field}: {run_dir} lies under the file {parent}; allowed: a path under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: {run_dir} cannot be written ({parent} is not writable); allowed: a "
                          "directory you can write to")


# --- Hydra ---------------------------------------------------------------------------------------

def override_key(override: str) -> str:
    """The key (or config group) an override sets: ``es.popsize`` for ``++es.popsize=8``."""
    return override.split("=", 1)[0].lstrip("+~")


def is_hydra_override(override: str) -> bool:
    """An override of Hydra's own config (``hydra.run.dir=...``) or of one of its groups
    (``hydra/launcher=joblib``), rather than of the run's."""
    key = override_key(override)
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def parse_overrides(overrides: list[str]) -> list:
    """Hydra's reading of each ``key=value``, one at a time, so that a malformed one is named in a
    one-line error with what was expected (Hydra's own message names neither)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for override in overrides:
        try:
            parsed.append(parser.parse_overrides([override])[0])
        except HydraException as err:
            reason = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise ConfigError(f"{override_key(override) or override}: cannot read the override {override!r} "
                              f"({reason}); allowed: KEY=VALUE with VALUE a number, a word, true/false, null "
                              "or a list such as [64,64] (quoted in the shell)") from None
    return parsed


@contextlib.contextmanager
def hydra_context(experiments_dir: Optional[str] = None):
    """Hydra initialised over the experiment folders (its public compose API), yielding Hydra's
    application object: compose inside it. The user's ``experiments_dir`` (checked) is the primary
    folder, so its files are found by name and can list the shipped ``base``, or any shipped
    experiment, in their defaults; the shipped folder comes next (``hydra_args``)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(experiments_dir or EXPERIMENTS_DIR), version_base="1.3"):
        yield GlobalHydra.instance().hydra


def compose(experiment: str, overrides: list[str], experiments_dir: Optional[str] = None, multirun: bool = False):
    """Hydra's composition of ``<experiment>.yaml`` with ``overrides`` (the run's and Hydra's own), its
    section included; ``multirun``: a sweep's, where ``key=a,b`` lists values to sweep. Call inside
    ``hydra_context``; ``experiments_dir`` is the checked folder it was made with.

    Every override is read and checked on its own first, so a bad one is named from the start:
    malformed, several values without ``-m``, or a config group option that does not exist."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    if experiment not in available_experiments(experiments_dir):
        raise ConfigError(f"experiment: unknown experiment {experiment!r}; allowed: "
                          f"{', '.join(available_experiments(experiments_dir))}")
    app = GlobalHydra.instance().hydra
    for override in parse_overrides(overrides):
        key = override.key_or_group
        if override.is_sweep_override() and not multirun:
            raise ConfigError(f"{key}: {override.input_line!r} lists several values; allowed: one value, a list "
                              "written [a,b], or -m to sweep over the values (one run each)")
        if "/" in key and not override.is_sweep_override() and not override.is_delete():
            options = app.config_loader.get_group_options(key)
            if override.value() not in options:
                raise ConfigError(f"{key}: unknown option {override.value()!r}; allowed: {', '.join(sorted(options))}")
    args = hydra_args(overrides, experiments_dir)
    try:
        if multirun:  # Hydra's public compose API composes a single run's config only
            return app.compose_config(experiment, args, run_mode=RunMode.MULTIRUN, with_log_configuration=False)
        return hydra_compose(experiment, args, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:  # one line naming the setting (OmegaConf's key)
        first = (str(err).strip() or type(err).__name__).splitlines()[0].replace("++", "").rstrip(".")
        key = getattr(err.__cause__, "full_key", None) or getattr(err, "full_key", None) or "overrides"
        allowed = ("a key of Hydra's config (`python -m metarl.evolve experiment=NAME --cfg hydra` shows them)"
                   if str(key).startswith("hydra") else "a value of the setting's type (see experiments/base.yaml), "
                   "as key=value")
        raise ConfigError(f"{key}: {first}; allowed: {allowed}") from None


def hydra_args(overrides: list[str], experiments_dir: Optional[str]) -> list[str]:
    """What Hydra is given: the run's keys as ``++key=value`` (add or override), so that any trainer field
    can be set (``build`` refuses unknown keys afterwards); Hydra's own, and overrides with their own
    prefix, as given; then the shipped experiments after a user's folder (``hydra.searchpath``)."""
    return [*(o if o.startswith(("+", "~")) or is_hydra_override(o) else "++" + o for o in overrides),
            *([f"hydra.searchpath=[{EXPERIMENTS_DIR.as_uri()}]"] if experiments_dir else [])]


def from_composed(composed, experiments_dir: Optional[str] = None) -> RunConfig:
    """The checked config of a composition (``compose``, or a sweep's job), without Hydra's section;
    ``experiments_dir``: the checked folder it was composed with."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = OmegaConf.to_container(OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"]),
                                      resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(err).splitlines()[0]}; allowed: a value, or an interpolation that "
                          "resolves") from None
    data["experiments_dir"] = experiments_dir
    return from_dict(data)


def load(experiment: str, overrides: list[str], experiments_dir: Optional[str] = None) -> RunConfig:
    """The checked config of ``experiment`` with ``overrides``, as a run would get it."""
    experiments_dir = check_experiments_dir(experiments_dir)
    with hydra_context(experiments_dir):
        return from_composed(compose(experiment, overrides, experiments_dir), experiments_dir)


def from_dict(data: dict) -> RunConfig:
    return build(RunConfig, data)


# --- a run directory's config.yaml --------------------------------------------------------------

def save(cfg: RunConfig, run_dir: Path) -> None:
    """Write ``RUN_DIR/config.yaml`` whole or not at all (a rename over the old one)."""
    from omegaconf import OmegaConf

    from metarl.checkpoints import atomic_write  # with JAX: only a run, which has loaded it, saves its config

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(cfg.to_dict())))


def read_saved(run_dir, field: Optional[str] = None) -> dict:
    """A run directory's ``config.yaml`` as plain data, unchecked; ``ConfigError`` if it is missing or
    is no YAML mapping, naming first the ``field`` (if any) that gave the directory."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / CONFIG_FILE
    where = f"{field}: {path}" if field else path
    if not path.is_file():
        raise ConfigError(f"{where}: missing; allowed: a metarl run directory (it holds {CONFIG_FILE})")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # YAML or OmegaConf: anything unreadable is the same error here
        raise ConfigError(f"{where}: unreadable ({type(err).__name__}); allowed: the {CONFIG_FILE} a run "
                          "wrote") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a mapping; allowed: the {CONFIG_FILE} a run wrote")
    return data


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def show_value(value) -> str:
    """A setting's value as it is written on the command line: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def search_differences(saved: dict, new: dict) -> list[str]:
    """Settings that differ between two configs and change the search (``RESUMABLE_FIELDS`` excluded)."""
    a, b = flatten(saved), flatten(new)
    defaults = flatten(to_dict(RunConfig(experiment="")))
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == f or key.startswith(f + ".") for f in RESUMABLE_FIELDS):
            continue
        va, vb = a.get(key, "<unset>"), b.get(key, "<unset>")
        # A setting added to the schema after a run was saved is absent from its config.yaml; at its
        # empty default (null, {}, []) or at the schema's default (fitness.control: none) it changes nothing.
        if "<unset>" in (va, vb) and any(v is None or v == {} or v == [] or (key in defaults and v == defaults[key])
                                         for v in (va, vb)):
            continue
        if va != vb:
            diffs.append(f"{key}: {va!r} -> {vb!r}")
    return diffs
