"""Run configuration: composed by Hydra from ``experiments/*.yaml`` and ``key=value`` overrides, then checked once,
here, into typed dataclasses before anything compiles; each error is one line naming the field and what is allowed."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Literal

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import Field

from metarl import experiments
from metarl.errors import ConfigError, layer_errors, one_line
from metarl.outer_loops.es_config import ESConfig
from metarl.inner_loops.schema import ok, to_dict, validate

SEED_MAX = 2**63 - 1   # jax.random.key takes a C long
# Settings that do not change what the search computes; a resumed run may change these.
RESUMABLE_FIELDS = ("run_dir", "eval_tasks", "es.generations", "fitness.validation_seeds", "checkpoint", "logger",
                    "devices", "watchdog")


Positive = Annotated[int, Field(gt=0, description="> 0")]
AtLeastTwo = Annotated[int, Field(ge=2, description="an integer >= 2")]


def _auto_or_positive(auto: str):
    return Annotated[int | str, Field(description=f"auto ({auto}) or a positive integer"),
                     ok(lambda n: n == "auto" or (isinstance(n, int) and n > 0))]


@dataclasses.dataclass(frozen=True)
class ESSection(ESConfig):
    """The driver's settings (``ESConfig``) as they are, plus generations and the start (the component's ``init``)."""
    generations: Positive = 30
    init_mean: Literal["zeros", "init"] = "zeros"


@dataclasses.dataclass(frozen=True)
class FitnessSection:
    num_seeds: Positive = 2
    statistic: Literal["final", "auc"] = "final"
    window: Annotated[float, Field(gt=0, le=1, description="a fraction in (0, 1]")] = 0.2
    nonfinite_floor: float | None = None
    normalize: Annotated[Literal["baseline", "none"] | None, Field(
        description="baseline, none or null (baseline with several tasks, none with one)")] = None
    aggregate: Literal["mean", "median", "min"] = "mean"   # over tasks
    control: Literal["none", "baseline", "paired"] = "none"   # docs/signal.md
    reference_seeds: AtLeastTwo = 32
    validation_top: Annotated[int, Field(ge=0, description="an integer >= 0")] = 0
    validation_seeds: AtLeastTwo = 16


@dataclasses.dataclass(frozen=True)
class BaselineSection:
    """The baseline a search is measured against: as configured, or tuned first (``tune``; docs/results.md)."""
    tune: Annotated[dict, Field(description="a mapping such as {lr: {low: 1e-4, high: 1e-2, log: true}}"),
                    ok(lambda space: all(isinstance(v, dict) and set(v) <= {"low", "high", "log"}
                                         for v in space.values()))] = dataclasses.field(default_factory=dict)
    generations: Annotated[int, Field(gt=0, description="a positive integer, or null (es.generations)")] | None = None
    tunings: Positive = 1
    matched: bool = False
    es: dict = dataclasses.field(default_factory=dict)
    tuned_from: Annotated[str, Field(description="a run directory whose tuned.json this run uses, or null (tune here)"),
                          ok(str.strip)] | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: Positive = 5
    keep: Positive = 3


@dataclasses.dataclass(frozen=True)
class WatchdogSection:   # docs/resume.md: a generation over factor x the longest before it (min_seconds) ends it
    factor: Annotated[float, Field(description="0 (off) or a number >= 2"), ok(lambda f: f == 0 or f >= 2)] = 10.0
    min_seconds: Annotated[float, Field(gt=0, description="> 0")] = 60.0


@dataclasses.dataclass(frozen=True)
class WandbSection:
    mode: Literal["disabled", "offline", "online"] = "disabled"
    project: str = "metarl"
    entity: str | None = None
    group: str | None = None   # runs of one sweep share a group; null: the run stands alone
    tags: Annotated[list, ok(lambda tags: all(isinstance(t, str) and t for t in tags)),
                    Field(description="a list of non-empty strings")] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class MlflowSection:
    mode: Literal["disabled", "enabled"] = "disabled"
    tracking_uri: Annotated[str, ok(str.strip), Field(description="a folder for a local store (mlruns), or an MLflow "
                                                                  "tracking URI such as http://HOST:PORT")] = "mlruns"
    experiment: Annotated[str, Field(description="a name, or null (the run's experiment)"), ok(str.strip)] | None = None
    tags: Annotated[dict, Field(description="a mapping of names to strings or numbers, such as {study: doors}"),
                    ok(lambda tags: all(isinstance(k, str) and k and isinstance(v, (str, int, float, bool))
                                        for k, v in tags.items()))] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LoggerSection:
    progress: bool = True
    verbose: bool = False    # third-party libraries' lines on the console too (wandb's)
    wandb: WandbSection = WandbSection()
    mlflow: MlflowSection = MlflowSection()
    trackers: list[str] = dataclasses.field(default_factory=list)   # dotted paths of Sink subclasses of one's own


@dataclasses.dataclass(frozen=True)
class DevicesSection:   # docs/devices.md
    num_cpu_devices: _auto_or_positive("one per usable CPU core, or JAX_NUM_CPU_DEVICES") = "auto"
    num_processes: _auto_or_positive("from METARL_NUM_PROCESSES or SLURM, else 1") = "auto"
    coordinator_address: str | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    experiment: Annotated[str, Field(description="the name of an experiment"), ok(bool)] = ""
    seed: Annotated[int, Field(ge=0, le=SEED_MAX, description=f"an integer from 0 to {SEED_MAX}")] = 0
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


def build(tp, data, prefix: str = ""):
    """``data`` as type ``tp``, each field checked, else a ``ConfigError`` naming the field after ``prefix``."""
    with layer_errors(lambda key: prefix + key):
        return validate(tp, data)


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
