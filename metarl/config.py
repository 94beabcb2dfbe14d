"""Run configuration: composed by Hydra from ``experiments/*.yaml`` and ``key=value`` overrides, then checked once,
here, into typed dataclasses before anything compiles; each error is one line naming the field and what is allowed."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import TypeAdapter
from pydantic_core import SchemaValidator, ValidationError

from metarl import experiments
from metarl.errors import ConfigError, one_line, suggest
from metarl.outer_loops.es_config import ESConfig
from metarl.inner_loops.config_checks import INT32_MAX

SEED_MAX = 2**63 - 1   # jax.random.key takes a C long
# Settings that do not change what the search computes; a resumed run may change these.
RESUMABLE_FIELDS = ("run_dir", "eval_tasks", "es.generations", "fitness.validation_seeds", "checkpoint", "logger",
                    "devices", "watchdog")


def _checked(allowed: str, ok, **default):
    """A setting whose values ``ok`` accepts; ``build`` refuses any other, saying what is ``allowed``."""
    return dataclasses.field(**default, metadata={"ok": ok, "allowed": allowed})


def _choice(*allowed: str):
    return _checked(", ".join(allowed), allowed.__contains__, default=allowed[0])


def _positive(default: int):
    return _checked("> 0", lambda value: value > 0, default=default)


def _auto_or_positive(auto: str):
    return _checked(f"auto ({auto}) or a positive integer", lambda n: n == "auto" or (isinstance(n, int) and n > 0),
                    default="auto")


@dataclasses.dataclass(frozen=True)
class ESSection(ESConfig):
    """The driver's settings (``ESConfig``) as they are, plus generations and the start (the component's ``init``)."""
    generations: int = _positive(30)
    init_mean: str = _choice("zeros", "init")


@dataclasses.dataclass(frozen=True)
class FitnessSection:
    num_seeds: int = _positive(2)
    statistic: str = _choice("final", "auc")
    window: float = _checked("a fraction in (0, 1]", lambda window: 0.0 < window <= 1.0, default=0.2)
    nonfinite_floor: float | None = None
    normalize: str | None = _checked("baseline, none or null (baseline with several tasks, none with one)",
                                     (None, "baseline", "none").__contains__, default=None)
    aggregate: str = _choice("mean", "median", "min")   # over tasks
    control: str = _choice("none", "baseline", "paired")   # docs/signal.md
    reference_seeds: int = _checked("an integer >= 2", lambda seeds: seeds >= 2, default=32)
    validation_top: int = _checked("an integer >= 0", lambda top: top >= 0, default=0)
    validation_seeds: int = _checked("an integer >= 2", lambda seeds: seeds >= 2, default=16)


@dataclasses.dataclass(frozen=True)
class BaselineSection:
    """The baseline a search is measured against: as configured, or tuned first (``tune``; docs/results.md)."""
    tune: dict = _checked("a mapping such as {lr: {low: 1e-4, high: 1e-2, log: true}}",
                          lambda space: all(isinstance(v, dict) and set(v) <= {"low", "high", "log"}
                                            for v in space.values()), default_factory=dict)
    generations: int | None = _checked("a positive integer, or null (es.generations)",
                                       lambda n: n is None or n > 0, default=None)
    tunings: int = _positive(1)
    matched: bool = False
    es: dict = dataclasses.field(default_factory=dict)
    tuned_from: str | None = _checked("a run directory whose tuned.json this run uses, or null (tune here)",
                                      lambda path: path is None or path.strip(), default=None)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = _positive(5)
    keep: int = _positive(3)


@dataclasses.dataclass(frozen=True)
class WatchdogSection:   # docs/resume.md: a generation over factor x the longest before it (min_seconds) ends it
    factor: float = _checked("0 (off) or a number >= 2", lambda f: f == 0 or f >= 2, default=10.0)
    min_seconds: float = _checked("> 0", lambda s: s > 0, default=60.0)


@dataclasses.dataclass(frozen=True)
class WandbSection:
    mode: str = _choice("disabled", "offline", "online")
    project: str = "metarl"
    entity: str | None = None
    group: str | None = None   # runs of one sweep share a group; null: the run stands alone
    tags: list = _checked("a list of non-empty strings", lambda tags: all(isinstance(t, str) and t for t in tags),
                          default_factory=list)


@dataclasses.dataclass(frozen=True)
class MlflowSection:
    mode: str = _choice("disabled", "enabled")
    tracking_uri: str = _checked("a folder for a local store (mlruns), or an MLflow tracking URI such as "
                                 "http://HOST:PORT", lambda uri: uri.strip(), default="mlruns")
    experiment: str | None = _checked("a name, or null (the run's experiment)",
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
class DevicesSection:   # docs/devices.md
    num_cpu_devices: int | str = _auto_or_positive("one per usable CPU core, or JAX_NUM_CPU_DEVICES")
    num_processes: int | str = _auto_or_positive("from METARL_NUM_PROCESSES or SLURM, else 1")
    coordinator_address: str | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    experiment: str = _checked("the name of an experiment", bool, default="")
    seed: int = _checked(f"an integer from 0 to {SEED_MAX}", lambda seed: 0 <= seed <= SEED_MAX, default=0)
    env: str | dict = "CartPole-v1"   # a name, or {_target_: NAME or dotted.path, ...arguments}
    tasks: list | None = None   # empty: the one task `env` (docs/experiments.md)
    eval_tasks: list | None = None   # held out: never used for fitness
    run_dir: str | None = None
    component: dict = dataclasses.field(default_factory=dict)
    inner: dict = dataclasses.field(default_factory=lambda: {"algo": "ppo"})
    es: ESSection = ESSection()
    fitness: FitnessSection = FitnessSection()
    baseline: BaselineSection = BaselineSection()
    checkpoint: CheckpointSection = CheckpointSection()
    watchdog: WatchdogSection = WatchdogSection()
    logger: LoggerSection = LoggerSection()
    devices: DevicesSection = DevicesSection()

    def to_dict(self) -> dict:   # as ``config.yaml`` stores it
        return to_dict(self)


# pydantic's errors as what is allowed: strict types (no "3" for 3, no 1 for true, no tuple for a list), finite numbers
_ALLOWED = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "true or false",
            "dict_type": "a mapping", "list_type": "a list", "finite_number": "a finite number"}
_STRICT = {"strict": True, "allow_inf_nan": False, "extra_fields_behavior": "forbid"}


def _adapted(node):
    """pydantic's schema, ``_STRICT`` but taking each dataclass as a mapping (strict alone takes only
    instances), a Union's error that of its last type (the last one tried)."""
    if isinstance(node, dict) and node.get("type") == "dataclass":
        node.update(strict=False, config=_STRICT)
    if isinstance(node, dict) and node.get("type") == "union":
        node["custom_error_type"] = {"str": "string"}.get(last := node["choices"][-1]["type"], last) + "_type"
    for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
        _adapted(child)
    return node


_adapter = functools.cache(TypeAdapter)
_validator = functools.cache(lambda tp: SchemaValidator(_adapted(TypeAdapter(tp).core_schema), _STRICT))


def _keys(cls, loc: tuple) -> str:   # of the dataclass at ``loc`` in dataclass ``cls``
    return ", ".join(functools.reduce(dict.get, loc, to_dict(cls())))


def _in_range(value, path: str):
    # Sizes, counts and budgets become int32 inside JAX; the seed has its own, wider range.
    if type(value) is int and path != "seed" and not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise ConfigError(f"{path}: {value}; allowed: an integer of at most {INT32_MAX}")
    return value


def coerce(value, tp, path):
    """``value`` as type ``tp`` (pydantic) within JAX's range, else a ``ConfigError`` naming ``path``."""
    try:
        return _in_range(_validator(tp).validate_python(value), path)
    except ValidationError as err:
        error = err.errors()[0]
    where, loc, kind = path + ".".join(map(str, error["loc"])), error["loc"], error["type"]
    if kind in ("unexpected_keyword_argument", "invalid_key"):
        raise ConfigError(f"{where}: unknown setting; allowed: {_keys(tp, loc[:-1])}"
                          + suggest(str(loc[-1]), _keys(tp, loc[:-1]).split(", ")))
    allowed = f"a mapping of {_keys(tp, loc)}" if kind == "dataclass_type" else _ALLOWED.get(kind, error["msg"])
    raise ConfigError(f"{where}: {error['input']!r}; allowed: {allowed}")


def build(cls, data: dict, prefix: str = ""):
    """Dataclass ``cls`` from a plain dict (``coerce``), refusing also what a field's ``ok`` (``_checked``) refuses."""
    return _check(coerce(data, cls, prefix), prefix)


def _check(built, prefix: str):
    # the keys as in the config files: a field's alias (es._target_ for ESConfig.target) or its name
    for field, key in zip(dataclasses.fields(built), to_dict(built)):
        path, value = prefix + key, _in_range(getattr(built, field.name), prefix + key)
        if dataclasses.is_dataclass(value):
            _check(value, path + ".")
        elif "ok" in field.metadata and not field.metadata["ok"](value):
            shown = "empty" if isinstance(value, str) and not value.strip() else repr(value)
            raise ConfigError(f"{path}: {shown}; allowed: {field.metadata['allowed']}")
    return built


def to_dict(value):
    """The inverse of ``build``: nested plain dicts and lists, keyed as in the config files."""
    return _adapter(type(value)).dump_python(value, by_alias=True, warnings=False)


def check_run_dir(run_dir: str, field: str = "run_dir") -> None:
    """Refuse a path that cannot become a directory; create nothing. Checked where a run starts, not in
    ``build``: a saved config read on another machine (inspect, evaluate) names a path of that one."""
    path = Path(run_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{field}: {run_dir} is a file; allowed: a new or existing directory")
    parent = next(p for p in (path, *path.parents) if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"{field}: {run_dir} lies under the file {parent}; allowed: a path under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: {run_dir} cannot be written ({parent} is not writable); allowed: a "
                          "directory you can write to")


# Every key with its default, as Hydra's ``metarl_schema`` (first in the defaults list): a misspelt key is refused
# at composition, ``build`` checks values; resume=RUN_DIR is no run setting. ``inner``, ``component`` and the
# mappings below take any key, checked by what they configure.
_schema = OmegaConf.create({**to_dict(RunConfig(experiment=MISSING)), "resume": None})
for _key in ("inner", "component", "es.args", "logger.mlflow.tags", "baseline.tune", "baseline.es"):
    OmegaConf.set_struct(OmegaConf.select(_schema, _key), False)
ConfigStore.instance().store(name="metarl_schema", node=_schema)
# A sweep's directory: ``run_dir``, else ``checkpoints/NAME-DATE-sweep`` (Hydra's ``now``, carried to every job).
OmegaConf.register_new_resolver("metarl_sweep_dir", lambda run_dir, experiment, date: run_dir or
                                f"checkpoints/{experiment or 'sweep'}-{date}-sweep", replace=True)


def experiment_names() -> list[str]:
    return sorted(p.stem for p in Path(experiments.__file__).with_name("experiment").glob("*.yaml"))


def from_composed(composed) -> RunConfig:
    """The checked config of a composition (a run's or a sweep job's), without Hydra's section."""
    if composed.get("experiment", None) is None:
        raise ConfigError(f"experiment: missing; allowed: experiment={'|'.join(experiment_names())} "
                          "(or resume=RUN_DIR)")
    keys = [k for k in composed if k not in ("hydra", "resume")]   # resume=RUN_DIR is no run setting
    try:
        data = OmegaConf.to_container(OmegaConf.masked_copy(composed, keys), resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{getattr(err, 'full_key', None) or 'config'}: {str(err).splitlines()[0]}; allowed: "
                          "a value, or an interpolation that resolves") from None
    return from_dict(data)


def load(experiment: str, overrides: list[str] = (), config_dir: str | None = None) -> RunConfig:
    """The checked config of ``experiment`` with ``overrides``, as ``python -m metarl.evolve`` would
    compose it (Hydra's compose API); ``config_dir``: a folder with your own ``experiment/NAME.yaml``."""
    search = [f"hydra.searchpath=[{Path(config_dir).resolve().as_uri()}]"] if config_dir else []
    try:
        with initialize_config_module("metarl.experiments", version_base="1.3"):
            composed = compose("config", [f"experiment={experiment}", *overrides, *search], return_hydra_config=True)
            HydraConfig.instance().set_config(composed)  # for ${hydra:...}
            return from_composed(composed)
    except (HydraException, OmegaConfBaseException) as err:
        raise one_line(err, keys()) from None


def with_tuned(cfg: RunConfig, tuned: dict | None) -> RunConfig:
    """``cfg`` with the tuned baseline's hyperparameters (``RunDir.tuned``) in place of the configured ones."""
    return cfg if tuned is None else dataclasses.replace(cfg, inner={**cfg.inner, **tuned["hyperparameters"]})


def from_dict(data: dict) -> RunConfig:
    # Runs saved before user experiments came through --config-dir recorded the folder as a setting.
    return build(RunConfig, {k: v for k, v in data.items() if k != "experiments_dir"})


def keys() -> list[str]:
    """Every key of the config at every level (``es``, ``es.popsize``, ...): what a misspelt key is compared with."""
    return sorted({key.rsplit(".", n)[0] for key in flatten(to_dict(RunConfig(experiment="")))
                   for n in range(key.count(".") + 1)})


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def show_value(value) -> str:
    """A setting's value as it is written on the command line: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def search_differences(saved: dict, new: dict) -> list[str]:
    """Settings that differ between two configs and change the search (``RESUMABLE_FIELDS`` excluded)."""
    a, b = flatten(saved), flatten(new)
    defaults = flatten(to_dict(RunConfig(experiment="")))
    resumable = tuple(f + "." for f in RESUMABLE_FIELDS)
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "<unset>"), b.get(key, "<unset>")
        # A setting added to the schema after a run was saved is absent from its config.yaml; at its
        # empty default (null, {}, []) or at the schema's default (fitness.control: none) it changes nothing.
        added = "<unset>" in (va, vb) and any(v in (None, {}, [], defaults.get(key)) for v in (va, vb))
        if va != vb and not added and not (key + ".").startswith(resumable):
            diffs.append(f"{key}: {va!r} -> {vb!r}")
    return diffs
