"""Per-generation reporting through one sink per tracker (``Logger``): the console, ``metrics.jsonl``, Weights &
Biases and MLflow; what goes where is in docs/tracking.md."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import logging
import math
import os
import re
import sys
import time
from collections import deque
from pathlib import Path
from statistics import median_high
from typing import Callable, Optional

from metarl.rundir import FIGURES, METRICS, RunDir
from metarl.config import LoggerSection, MlflowSection, WandbSection, flatten, show_value
from metarl.errors import ConfigError, layer_errors
from metarl.inner_loops import plugins


def say(text: str, error: bool = False) -> None:
    """A line on the console. A console that has gone away (a closed terminal: EIO; a closed pipe:
    EPIPE) never stops a run: the line is dropped, and ``metrics.jsonl`` stays the record."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr if error else sys.stdout, flush=True)


def scalars(record: dict) -> dict:
    """The scalars wandb and MLflow log at step = generation (their names: docs/tracking.md)."""
    data = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "generation"}
    for name, values in record.get("tasks", {}).items():
        data.update({f"tasks/{name}/{stat}": v for stat, v in values.items()})
    for part, values in record.get("search", {}).items():  # mean, low, high -> {name: value}
        data.update({f"search/{part}/{name}": v for name, v in values.items()})
    return data


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Sink:
    """One tracker of a run; the ``Logger`` calls each method of each sink (what a sink lacks does nothing)."""
    tracking = False   # whether it takes the run's scalars (the figures are made only for one that does)
    during_tuning = True   # whether it also runs for a tuning's searches (``baseline.tune``), or only for the run
    # ``ConfigError``, before the run writes anything, if its section of ``logger`` (a user's: None) cannot work
    check = staticmethod(lambda section: None)

    def log(self, record: dict) -> None: pass
    def message(self, text: str) -> None: pass
    def catch_up(self, history: list) -> None: pass   # a resumed run's earlier records (from its checkpoint)
    def log_results(self, figures: list, best_files: list, best_info: Optional[dict]) -> None: pass
    def finish(self, summary: Optional[dict] = None, stopped: bool = False) -> None: pass  # stopped: by a signal


class ConsoleSink(Sink):
    """The messages, and with ``logger.progress`` a line per generation (docs/console.md)."""

    def __init__(self, total: int, task_names: list, lines: bool):
        self.total, self.task_names, self.lines = total, task_names, lines
        self.durations: deque = deque(maxlen=5)   # the last generations' seconds: the time left from their median

    def message(self, text: str) -> None:
        say(text, error=text.startswith("error"))

    def log(self, r: dict) -> None:
        self.durations.append(r["seconds"])
        if not self.lines:
            return
        left = _duration((self.total - r["generation"]) * median_high(self.durations))
        bad = f" | diverged {r['nonfinite']}" if r.get("nonfinite") else ""
        if r.get("signal") is not None:  # the share of the fitness spread that is not seed noise
            bad += f" | signal {r['signal']:.2f}"
        if r.get("best_vs_control") is not None:  # the best member's margin over the baseline
            bad += f" | vs baseline {r['best_vs_control']:+.4g}"
        if len(self.task_names) > 1 and "tasks" in r:  # the population's mean, raw (score)
            bad += " | " + " ".join(f"{n} {t['raw_mean']:.1f} ({t['score_mean']:.2f})" for n, t in r["tasks"].items())
        say(f"gen {r['generation']:>4}/{self.total} | best {r['best']:9.2f} | mean {r['mean']:9.2f} | best so far "
            f"{r['best_so_far']:9.2f} | {r['fps']:9.3g} frames/s | {r['seconds']:6.1f} s | left {left}{bad}")


@dataclasses.dataclass
class JsonlSink(Sink):
    run_dir: Path

    def log(self, record: dict) -> None:
        RunDir(self.run_dir).append_metrics(record)


class WandbSink(Sink):
    """Weights & Biases (``logger.wandb``: ``wandb.init``'s fields); an id from the run directory: resumes go on."""
    tracking, during_tuning = True, False

    def __init__(self, section: WandbSection, logger: Logger):
        import wandb

        # quiet: wandb's footer (the run's history and summary, some 30 lines) would repeat metrics.jsonl
        quiet = {} if logger.verbose or "WANDB_QUIET" in os.environ else {"settings": wandb.Settings(quiet=True)}
        self.wandb, self.name, self.step = wandb, logger.run_dir.name, 0
        self.run = wandb.init(**quiet, **{**dataclasses.asdict(section), "tags": list(section.tags)},
                              dir=str(logger.run_dir), config=logger.config, name=self.name, resume="allow",
                              id=hashlib.sha1(str(logger.run_dir.resolve()).encode()).hexdigest()[:16])

    def log(self, record: dict) -> None:
        self.run.log({**scalars(record), "fitness": self.wandb.Histogram(record["fitness"])}, step=record["generation"])
        self.step = record["generation"]

    def log_results(self, figures: list, best_files: list, best_info: Optional[dict]) -> None:
        if figures:
            self.run.log({f"figures/{Path(p).stem}": self.wandb.Image(str(p)) for p in figures}, step=self.step)
        if best_files:
            artifact = self.wandb.Artifact(re.sub(r"[^\w.-]", "-", f"{self.name}-meta-params"), type="meta-params",
                                           metadata=best_info or {}, description="best meta-parameters found "
                                           "(flax msgpack) and what they belong to")
            for path in best_files:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)

    def finish(self, summary: Optional[dict] = None, stopped: bool = False) -> None:
        self.run.summary.update(summary or {})
        self.run.finish()


class MlflowSink(Sink):
    """MLflow (``logger.mlflow``): each generation's scalars it lacks (a resumed run's too), files at the end."""
    during_tuning = False

    def __init__(self, section: MlflowSection, logger: Logger):
        self.run = MlflowRun(section, logger.config.get("experiment", ""), logger.run_dir, logger.run_dir.name,
                             flatten(logger.config), {"metarl.run_dir": str(logger.run_dir)}, logger.message,
                             parent_id=os.environ.get(PARENT_RUN_ENV))

    tracking = property(lambda self: self.run.active)

    def log(self, record: dict) -> None:
        """At step = generation unless MLflow holds it (a resumed run redoes those after its last checkpoint)."""
        if record["generation"] > self.run.last_step and self.run.log_metrics(scalars(record), record["generation"]):
            self.run.last_step = record["generation"]

    def catch_up(self, history: list) -> None:
        for record in history:
            self.log(record)

    def log_results(self, figures: list, best_files: list, best_info: Optional[dict]) -> None:
        self.run.log_files(figures, FIGURES)
        self.run.log_files(best_files, "meta-params")

    def finish(self, summary: Optional[dict] = None, stopped: bool = False) -> None:
        self.run.finish("KILLED" if stopped else "FINISHED")

    @staticmethod
    def check(section: MlflowSection) -> None:
        """``ConfigError`` if MLflow (or a local store's SQL packages) cannot be imported, or refuses a file store."""
        if section.mode != "enabled":
            return
        uri = mlflow_store(section.tracking_uri)[0]
        needed = ["mlflow"] + (["sqlalchemy", "alembic"] if uri.startswith("sqlite:") else [])
        missing = [name for name in needed if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(f"logger.mlflow.mode: enabled, but {', '.join(missing)} cannot be imported; allowed: "
                              "disabled, or enabled after pip install \"metarl[mlflow]\"")
        if uri.startswith("file:"):  # opening a file store writes nothing; MLflow 3 refuses it unless told otherwise
            import mlflow

            try:
                mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            except Exception as err:
                raise ConfigError(f"logger.mlflow.tracking_uri: {section.tracking_uri} is a store MLflow refuses "
                                  f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); allowed: a folder (a "
                                  "local store metarl keeps in it), sqlite:///PATH or http://HOST:PORT") from None


TRACKERS = {"wandb": WandbSink, "mlflow": MlflowSink}   # by their section of the config's ``logger``


def trackers(settings: LoggerSection) -> list[tuple[type[Sink], object]]:
    """Each enabled tracker and its section of ``logger``; a user's own (``logger.trackers``) has none."""
    with layer_errors(lambda key: key):   # plugins names the setting: logger.trackers
        own = [plugins.locate_class(path, "logger.trackers", Sink, "dotted paths of metarl.logger.Sink subclasses, "
                                    "such as [my_pkg.trackers.MyTracker]") for path in settings.trackers]
    return [(sink, getattr(settings, name)) for name, sink in TRACKERS.items()
            if getattr(settings, name).mode != "disabled"] + [(sink, None) for sink in own]


def _each(method: str, reverse: bool = False) -> Callable:  # a Logger method: each sink's in turn
    def call(self, *args, **kwargs):
        for sink in reversed(self.sinks) if reverse else self.sinks:
            getattr(sink, method)(*args, **kwargs)
    return call


class Logger(contextlib.AbstractContextManager):
    """A run's sinks: the console, ``metrics.jsonl`` and the enabled ``TRACKERS`` (while ``tuning``, those that run
    then); none if not ``write`` (all but the first process). Each ends in reverse order as the ``with`` block does."""

    def __init__(self, run_dir: Path, config: dict, total_generations: int, settings: LoggerSection,
                 write: bool = True, task_names: Optional[list] = None, tuning: bool = False):
        self.run_dir, self.config, self.verbose = Path(run_dir), config, settings.verbose
        self.sinks: list[Sink] = []
        if write:  # built in turn: a tracker may send messages while it starts
            self.sinks += [JsonlSink(self.run_dir), ConsoleSink(total_generations, task_names or [], settings.progress)]
            self.sinks += [sink(section, self) for sink, section in trackers(settings)
                           if sink.during_tuning or not tuning]

    tracking = property(lambda self: any(sink.tracking for sink in self.sinks))  # wandb's, or MLflow's if reached
    log, message, catch_up = _each("log"), _each("message"), _each("catch_up")
    log_results, finish = _each("log_results", reverse=True), _each("finish", reverse=True)
    summary: Optional[dict] = None   # what the run leaves, set in the block: the trackers' summary at the end

    def __exit__(self, kind, err, traceback) -> None:  # the one place a run's trackers finish
        if not isinstance(err, KeyboardInterrupt):  # a second stop signal: stop now, finishing nothing
            self.finish(self.summary, stopped=err is not None)


PARENT_RUN_ENV = "METARL_MLFLOW_PARENT_RUN_ID"   # set by a sweep: its jobs' runs are nested under this run
STEP_METRIC = "best"   # logged every generation: its last step is the last generation MLflow holds
# A server that cannot be reached costs seconds, not MLflow's minutes of retries; a variable set beforehand is kept.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def mlflow_store(tracking_uri: str) -> tuple[str, Optional[str]]:
    """``(tracking URI, artifact root)``: a URI with a scheme as it is (None: its server decides), a folder as a
    local store (absolute, so that a run resumed from elsewhere finds the same store)."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", tracking_uri):
        return tracking_uri, None
    folder = Path(tracking_uri).expanduser().absolute()
    return f"sqlite:///{folder / 'mlflow.db'}", str(folder / "artifacts")


class MlflowRun:
    """The MLflow run of a metarl run, or of a sweep (its jobs' parent), continued on resume (docs/tracking.md). The
    first call that fails is reported once, and MLflow is not called again in this process: the run goes on."""

    def __init__(self, section: MlflowSection, experiment: str, record_dir: Path, name: str, params: dict,
                 tags: dict, message: Callable[[str], None], parent_id: Optional[str] = None):
        self.message, self.client, self.run_id = message, None, None
        self.last_step = 0   # the last generation MLflow holds
        try:
            self._open(section, experiment, Path(record_dir), name, params, tags, parent_id)
        except Exception as err:
            self._failed("starting its run", err)

    def _open(self, section, experiment, record_dir, name, params, tags, parent_id):
        for key, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        import mlflow
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException

        if "MLFLOW_LOGGING_LEVEL" not in os.environ:  # its INFO lines (creating a store's tables)
            logging.getLogger("mlflow").setLevel(logging.WARNING)
        uri, artifacts = mlflow_store(section.tracking_uri)
        client = mlflow.MlflowClient(tracking_uri=uri)
        record = RunDir(record_dir).mlflow_run.read() or {}
        run = None
        if record.get("tracking_uri") == uri:  # a resumed run: its MLflow run goes on, unless deleted
            try:
                run = client.get_run(record["run_id"])
            except MlflowException as err:
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
        if run is not None and run.info.lifecycle_stage == "active":
            client.update_run(run.info.run_id, status="RUNNING")
            self.last_step = max((m.step for m in client.get_metric_history(run.info.run_id, STEP_METRIC)),
                                 default=0)
            logged, verb = run.data.params, "continuing"
        else:
            run = client.create_run(_experiment_id(client, section.experiment or experiment, artifacts), run_name=name)
            RunDir(record_dir).mlflow_run.write({"tracking_uri": uri, "run_id": run.info.run_id})
            logged, verb = {}, "new"
        all_tags = {**tags, **section.tags, **({"mlflow.parentRunId": parent_id} if parent_id else {})}
        client.log_batch(run.info.run_id,  # a continued run's params only if new: MLflow keeps a param's first value
                         params=[Param(k, show_value(v)) for k, v in params.items() if k not in logged],
                         tags=[RunTag(k, show_value(v)) for k, v in all_tags.items()])
        self.client, self.run_id = client, run.info.run_id
        self.message(f"MLflow: {verb} run {self.run_id} in {uri}")

    def _failed(self, what: str, err: Exception) -> None:
        self.client = None
        text = (str(err).strip().splitlines() or [""])[0]
        text = text if len(text) <= 200 else text[:200] + " ..."
        self.message(f"warning: MLflow: {what} failed ({type(err).__name__}: {text}); no more is sent to "
                     f"MLflow in this process, and {METRICS} keeps every generation")

    def send(self, what: str, method: str, *args) -> bool:
        """``MlflowClient.<method>(run_id, *args)``, ``what`` named in the warning if it fails; False once one has."""
        if self.client is None:
            return False
        try:
            getattr(self.client, method)(self.run_id, *args)
        except Exception as err:
            self._failed(what, err)
        return self.client is not None

    active = property(lambda self: self.client is not None)

    def log_metrics(self, values: dict, step: int) -> bool:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^/\w.\- :]", "_", k), float(v), now, step)  # the characters MLflow allows
                   for k, v in values.items()]
        return self.send(f"logging step {step}", "log_batch", metrics)

    def log_files(self, paths: list, folder: Optional[str]) -> None:
        """Into the run's ``folder`` of artifacts (None: at their top); a resumed run's replace the earlier ones."""
        for path in paths:
            self.send(f"uploading {Path(path).name}", "log_artifact", str(path), folder)

    def finish(self, status: str = "FINISHED") -> None:
        self.send("ending the run", "set_terminated", status)


def _experiment_id(client, name: str, artifacts: Optional[str]) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:  # made at the same moment by another run (a job of the same sweep)
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    return found.experiment_id
