"""Per-generation reporting: a console line, ``metrics.jsonl`` and (optionally) Weights & Biases and
MLflow, which get the same scalars (``scalars``), and at the end of a run the figures and the best
meta-parameters; what goes where is in docs/tracking.md."""
from __future__ import annotations

import hashlib
import importlib.util
import json
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

from metarl.rundir import atomic_write
from metarl.config import ConfigError, MlflowSection, flatten, show_value

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    records = []
    for line in filter(str.strip, path.read_text().splitlines() if path.exists() else []):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill mid-write
            break
    return records


def to_json_line(record: dict) -> str:
    """``record`` as one line of JSON, every NaN or infinity as null: JSON has no token for them (Python's
    json writes ``NaN``, which strict readers refuse)."""
    return json.dumps(json.loads(json.dumps(record), parse_constant=lambda constant: None)) + "\n"


def truncate_metrics(run_dir: str | Path, generations_done: int) -> None:
    """Keep the records of the first ``generations_done`` generations: a resumed run recomputes the
    rest, so each generation appears exactly once."""
    path = Path(run_dir) / METRICS_FILE
    if path.exists():
        kept = [r for r in read_metrics(run_dir) if r.get("generation", 0) <= generations_done]
        atomic_write(path, "".join(to_json_line(r) for r in kept))


def say(text: str, error: bool = False) -> None:
    """A line on the console. A console that has gone away (a closed terminal: EIO; a closed pipe:
    EPIPE) never stops a run: the line is dropped, and ``metrics.jsonl`` stays the record."""
    try:
        print(text, file=sys.stderr if error else sys.stdout, flush=True)
    except OSError:
        pass


def scalars(record: dict) -> dict:
    """A generation's record as the scalars that wandb and MLflow log, by name: its numbers (best,
    mean, std, quantiles, frames/s, ...; the generation is the step), each task's
    (``tasks/<name>/raw_mean``, ...) and the decoded search distribution (``search/mean/lr``, ...)."""
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


class Logger:
    def __init__(self, run_dir: Path, config: dict, total_generations: int, progress: bool = True,
                 wandb_cfg: Optional[dict] = None, write: bool = True, task_names: Optional[list] = None,
                 mlflow_cfg: Optional[MlflowSection] = None, verbose: bool = False):
        self.run_dir = Path(run_dir)
        self.total = total_generations
        self.progress = progress and write
        self.write = write
        self.durations: deque = deque(maxlen=5)   # the last generations' seconds: the time left from their median
        self.task_names = list(task_names or [])
        self.wandb_run = None
        self.last_step = 0
        if write and wandb_cfg and wandb_cfg["mode"] != "disabled":
            import wandb

            # wandb's footer (the run's history and summary, some 30 lines) repeats metrics.jsonl and the
            # last progress line; quiet keeps its lines on where the run is saved and how to sync it.
            quiet = {} if verbose or "WANDB_QUIET" in os.environ else {"settings": wandb.Settings(quiet=True)}
            # logger.wandb's fields are wandb.init's own; a sweep's runs share `group` (null: each run stands
            # alone). The id is stable per run directory, so a resumed run continues the same wandb run.
            self.wandb_run = wandb.init(**quiet, **{**wandb_cfg, "tags": list(wandb_cfg["tags"] or [])},
                                        dir=str(self.run_dir), config=config, name=self.run_dir.name, resume="allow",
                                        id=hashlib.sha1(str(self.run_dir.resolve()).encode()).hexdigest()[:16])
        self.mlflow: Optional[MlflowRun] = None
        if write and mlflow_cfg is not None and mlflow_cfg.mode == "enabled":
            self.mlflow = MlflowRun(mlflow_cfg, config.get("experiment", ""), self.run_dir, self.run_dir.name,
                                    flatten(config), {"metarl.run_dir": str(self.run_dir)}, self.message,
                                    parent_id=os.environ.get(PARENT_RUN_ENV))

    def log(self, record: dict) -> None:
        if not self.write:
            return
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(to_json_line(record))
        self.durations.append(record["seconds"])
        if self.progress:
            g = record["generation"]
            left = (self.total - g) * median_high(self.durations)
            bad = f" | diverged {record['nonfinite']}" if record.get("nonfinite") else ""
            if record.get("signal") is not None:  # the share of the fitness spread that is not seed noise
                bad += f" | signal {record['signal']:.2f}"
            if record.get("best_vs_control") is not None:  # the best member's margin over the baseline
                bad += f" | vs baseline {record['best_vs_control']:+.4g}"
            if len(self.task_names) > 1 and "tasks" in record:  # the population's mean, raw (score)
                bad += " | " + " ".join(f"{n} {t['raw_mean']:.1f} ({t['score_mean']:.2f})"
                                        for n, t in record["tasks"].items())
            say(f"gen {g:>4}/{self.total} | best {record['best']:9.2f} | mean {record['mean']:9.2f} | "
                f"best so far {record['best_so_far']:9.2f} | {record['fps']:9.3g} frames/s | "
                f"{record['seconds']:6.1f} s | left {_duration(left)}{bad}")
        data = scalars(record) if self.tracking else {}
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.log({**data, "fitness": wandb.Histogram(record["fitness"])}, step=record["generation"])
            self.last_step = record["generation"]
        if self.mlflow is not None:
            self.mlflow.log_generation(record["generation"], data)

    def catch_up(self, history: list) -> None:
        """Give MLflow the generations of ``history`` (a resumed run's, from its checkpoint) that it
        lacks: those run while its server could not be reached, or after its last step was logged."""
        if self.mlflow is not None:
            for record in history:
                self.mlflow.log_generation(record["generation"], scalars(record))

    def log_results(self, figures: list, best_files: list, best_info: Optional[dict]) -> None:
        """The end of a run: ``figures`` (PNG paths) and ``best_files`` (the exported best meta-parameters)
        to MLflow as files, and to wandb as images and an artifact (a resumed run adds a new version)."""
        if self.mlflow is not None:
            self.mlflow.log_files(figures, "figures")
            self.mlflow.log_files(best_files, "meta-params")
        if self.wandb_run is None:
            return
        import wandb

        images = {f"figures/{Path(p).stem}": wandb.Image(str(p)) for p in figures}
        if images:
            self.wandb_run.log(images, step=self.last_step)
        if best_files:
            name = re.sub(r"[^\w.-]", "-", f"{self.run_dir.name}-meta-params")
            artifact = wandb.Artifact(name, type="meta-params", metadata=best_info or {},
                                      description="best meta-parameters found (flax msgpack) and what they belong to")
            for path in best_files:
                artifact.add_file(str(path))
            self.wandb_run.log_artifact(artifact)

    @property
    def tracking(self) -> bool:
        """Whether a tracker (wandb, MLflow) takes this run's records."""
        return self.wandb_run is not None or (self.mlflow is not None and self.mlflow.active)

    def message(self, text: str) -> None:
        if self.write:
            say(text, error=text.startswith("error"))

    def finish(self, summary: Optional[dict] = None, stopped: bool = False) -> None:
        """The end of the run; ``stopped``: by a signal, to be resumed."""
        if self.mlflow is not None:
            self.mlflow.finish("KILLED" if stopped else "FINISHED")
        if self.wandb_run is not None:
            self.wandb_run.summary.update(summary or {})
            self.wandb_run.finish()


# --- MLflow ----------------------------------------------------------------------------------------

PARENT_RUN_ENV = "METARL_MLFLOW_PARENT_RUN_ID"   # set by a sweep: its jobs' runs are nested under this run
MLFLOW_RUN_FILE = "mlflow_run.json"   # in a run's (or sweep's) directory: the MLflow run it logs to
STEP_METRIC = "best"   # logged every generation: its last step is the last generation MLflow holds
# A tracking server that cannot be reached fails the first request at once (MLflow would retry for
# minutes) and within seconds (not two minutes); either variable, set beforehand, is kept.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def mlflow_store(tracking_uri: str) -> tuple[str, Optional[str]]:
    """``(MLflow tracking URI, artifact root)`` of ``logger.mlflow.tracking_uri``. A folder is a local
    store, no server needed: the SQLite database ``FOLDER/mlflow.db``, its runs' files in
    ``FOLDER/artifacts`` (both absolute, so that a run resumed from elsewhere finds the same store). A
    URI with a scheme (``http://HOST:PORT``, ``sqlite:///PATH``, ...) is MLflow's own; its server or
    MLflow's default decides where files go (None)."""
    if _SCHEME.match(tracking_uri):
        return tracking_uri, None
    folder = Path(tracking_uri).expanduser().absolute()
    return f"sqlite:///{folder / 'mlflow.db'}", str(folder / "artifacts")


def check_mlflow(section: MlflowSection) -> None:
    """``ConfigError`` if ``logger.mlflow.mode=enabled`` and MLflow cannot be imported (or, for a local
    store, the SQL packages it needs), or refuses a ``file:`` store (MLflow 3 retired the file store):
    checked with the run's settings, before anything is written."""
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


class MlflowRun:
    """The MLflow run that a metarl run, or a sweep (the parent of its jobs' runs), logs to through
    ``mlflow.MlflowClient``. The first call that fails (a tracking server that cannot be reached, a
    store that refuses) is reported once, and MLflow is not called again in this process: the run
    goes on, ``metrics.jsonl`` its record."""

    def __init__(self, section: MlflowSection, experiment: str, record_dir: Path, name: str, params: dict,
                 tags: dict, message: Callable[[str], None], parent_id: Optional[str] = None):
        """The run recorded in ``record_dir/mlflow_run.json`` continued, if it is in the same store, or a
        new one in experiment ``section.experiment`` (default ``experiment``), made if missing. The
        config's ``params`` are logged (those the run lacks, when continued: MLflow keeps a parameter's
        first value), and ``tags``, ``section.tags`` and, with ``parent_id``, the parent run's."""
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
        record_path = record_dir / MLFLOW_RUN_FILE
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
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
            atomic_write(record_path, json.dumps({"tracking_uri": uri, "run_id": run.info.run_id}, indent=1) + "\n")
            logged, verb = {}, "new"
        all_tags = {**tags, **section.tags, **({"mlflow.parentRunId": parent_id} if parent_id else {})}
        client.log_batch(run.info.run_id,
                         params=[Param(k, show_value(v)) for k, v in params.items() if k not in logged],
                         tags=[RunTag(k, show_value(v)) for k, v in all_tags.items()])
        self.client, self.run_id = client, run.info.run_id
        self.message(f"MLflow: {verb} run {self.run_id} in {uri}")

    def _failed(self, what: str, err: Exception) -> None:
        self.client = None
        text = (str(err).strip().splitlines() or [""])[0]
        text = text if len(text) <= 200 else text[:200] + " ..."
        self.message(f"warning: MLflow: {what} failed ({type(err).__name__}: {text}); no more is sent to "
                     f"MLflow in this process, and {METRICS_FILE} keeps every generation")

    def send(self, what: str, method: str, *args) -> bool:
        """``MlflowClient.<method>(run_id, *args)`` (``what`` names it in the warning if it fails); False,
        sending nothing, once a call has failed."""
        if self.client is None:
            return False
        try:
            getattr(self.client, method)(self.run_id, *args)
            return True
        except Exception as err:
            self._failed(what, err)
            return False

    @property
    def active(self) -> bool:
        return self.client is not None

    def log_metrics(self, values: dict, step: int) -> bool:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^/\w.\- :]", "_", k), float(v), now, step)  # the characters MLflow allows
                   for k, v in values.items()]
        return self.send(f"logging step {step}", "log_batch", metrics)

    def log_generation(self, generation: int, values: dict) -> None:
        """One generation's scalars at step = generation, unless MLflow holds that step already (a
        resumed run computes again the generations after its last checkpoint)."""
        if generation > self.last_step and self.log_metrics(values, generation):
            self.last_step = generation

    def log_files(self, paths: list, folder: Optional[str]) -> None:
        """Files, into the run's ``folder`` of artifacts (None: at their top; a resumed run's replace the
        earlier ones)."""
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
