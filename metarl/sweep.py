"""``python -m metarl.evolve -m experiment=NAME KEY=A,B ...``: a sweep, run by Hydra's sweeper and
launcher (docs/sweeps.md). Each job is one run, as ``python -m metarl.evolve`` with that job's
overrides would make it, in ``SWEEP_DIR/<job number>``; with the basic sweeper every job is checked
before the first starts. Each job records itself in ``SWEEP_DIR/jobs/<number>.json`` when it starts
and ends, so the summary is the same whichever launcher ran the jobs, wherever. The task function
returns the job's best fitness, so an optimising sweeper can search over a run's settings.
"""
from __future__ import annotations

import csv
import io
import dataclasses
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from metarl import config as config_lib
from metarl import compilation, devices, runlock
from metarl.checkpoints import atomic_write
from metarl.cli import EXIT_BAD_INPUT, STOP_SIGNALS, fail, refuse_chdir
from metarl.job import check_existing, check_run, execute
from metarl.logger import PARENT_RUN_ENV, MlflowRun, read_metrics

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
JOBS_DIR = "jobs"
SUMMARY_CSV, SUMMARY_JSON = "summary.csv", "summary.json"
COLUMNS = ("job", "overrides", "exit_code", "generations", "best", "last_mean", "run_dir")
# Exit codes of a run stopped by a stop signal (checkpoint saved): the sweep stops too.
STOPPED = tuple(128 + int(sig) for sig in STOP_SIGNALS)

# Each job's (config, task) as checked before the sweep started, by the job's overrides: a job that
# runs in this process (the basic launcher) uses its task rather than building it again.
_CHECKED: dict = {}


class SweepStopped(BaseException):
    """A job was stopped by a stop signal (SIGINT, SIGTERM, SIGHUP), its exit code the argument: no
    further job starts. A BaseException, so that Hydra's launcher, which records a job's ordinary
    exceptions and goes on, lets it through."""


def job_run_dir(hydra_cfg) -> Path:
    """A job's run directory: Hydra's output directory for it (``hydra.sweep.dir/hydra.sweep.subdir``)."""
    return Path(str(hydra_cfg.sweep.dir)) / str(hydra_cfg.sweep.subdir)


@dataclasses.dataclass(frozen=True)
class SweepJob:
    """The task function Hydra's launcher calls for each job (pickled by launchers that run jobs in other
    processes: it holds plain strings only)."""

    experiments_dir: Optional[str]

    def __call__(self, composed) -> float:
        hydra_cfg = HydraConfig.get()
        num, run_dir = int(hydra_cfg.job.num), job_run_dir(hydra_cfg)
        given = [str(o) for o in hydra_cfg.overrides.task]
        overrides = [o.removeprefix("++") for o in given]  # as the user wrote them
        record = Path(str(hydra_cfg.sweep.dir)) / JOBS_DIR / f"{num}.json"
        row = {"job": num, "overrides": " ".join(overrides), "exit_code": None, "run_dir": str(run_dir)}
        _write_json(record, row)  # a job killed outright stays in the summary, without an exit code
        print(f"\nsweep job {num}: {row['overrides'] or '(no overrides)'}", flush=True)
        row["exit_code"] = self.run(composed, run_dir, given)
        _write_json(record, row)
        if row["exit_code"] in STOPPED:
            raise SweepStopped(row["exit_code"])
        best = _results(run_dir)["best"]
        return math.nan if best is None else best

    def run(self, composed, run_dir: Path, given: list[str]) -> int:
        try:
            cfg = dataclasses.replace(config_lib.from_composed(composed, self.experiments_dir), run_dir=str(run_dir))
            cached = _CHECKED.get(tuple(given))
            task = cached[1] if cached is not None and cached[0] == cfg else None
            resuming = check_existing(cfg, run_dir)
            return execute(cfg, run_dir, resuming, named=True, task=task)
        except config_lib.ConfigError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        except SystemExit as stop:  # bad input (one line already printed), as a run on its own would exit
            return stop.code if isinstance(stop.code, int) else 1
        except Exception:  # a failure of this job only: the sweep goes on to the next
            traceback.print_exc()
            return 1


def worst_code(codes: list[int]) -> int:
    """The exit code that says the most: a failure over success, the higher over the lower. A job
    killed by a signal has a negative code; it is reported the way a shell would."""
    codes = [128 - c if c < 0 else c for c in codes]
    return max(codes, key=lambda c: (c != 0, c))


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1) + "\n")


def _results(run_dir: Path) -> dict:
    history = read_metrics(run_dir)
    last = history[-1] if history else {}
    return {"generations": len(history), "best": last.get("best_so_far"), "last_mean": last.get("mean")}


def write_summary(sweep_dir: Path) -> list[dict]:
    """``SWEEP_DIR/summary.csv`` and ``summary.json`` from the jobs' records and their runs' metrics."""
    records = sorted((sweep_dir / JOBS_DIR).glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    jobs = [json.loads(path.read_text()) for path in records]
    rows = [{k: row.get(k) for k in COLUMNS} for row in ({**job, **_results(Path(job["run_dir"]))} for job in jobs)]
    _write_json(sweep_dir / SUMMARY_JSON, rows)
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(sweep_dir / SUMMARY_CSV, table.getvalue())
    return rows


def _jobs(master) -> tuple[list[list[str]], bool]:
    """``(jobs, known)``: every job's overrides as the basic sweeper will make them (``known``); for
    another sweeper, whose jobs are known only as it runs, the one set of settings all its jobs share
    (the overrides that sweep nothing)."""
    task = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
    if master.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        parsed = OverridesParser.create().parse_overrides(task)
        return [[o.input_line for o in parsed if not o.is_sweep_override()]], False
    params = [f"{k}={v}" for k, v in (master.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*params, *task])
    return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]], True


def check_jobs(app, master, jobs: list[list[str]], known: bool, experiments_dir: Optional[str]) -> list:
    """Compose and check every job as it will run, before any starts: its config, its run directory
    (new, or an earlier run of the same config), its task, devices and memory. Exits with one line on
    the first bad one, naming the job. Not ``known``: the settings the jobs share, without a run
    directory (each job checks the rest when it starts). Returns the checked configs."""
    compilation.enable_compilation_cache()  # before this process compiles anything (its jobs use the cache)
    in_process = master.hydra.launcher.get("_target_") == BASIC_LAUNCHER
    shared = set.intersection(*(set(job) for job in jobs)) if len(jobs) > 1 else set()
    seen, checked_cfgs = {}, []
    for num, job in enumerate(jobs):
        swept = " ".join(o.removeprefix("++") for o in job if o not in shared)
        where = (f" (sweep job {num}" + (f": {swept})" if swept else ")")) if known else " (the sweep's settings)"
        try:
            job_cfg = app.config_loader.load_sweep_config(master, list(job))
            OmegaConf.update(job_cfg, "hydra.job", {"num": num, "id": num}, force_add=True)  # as Hydra's launcher
            HydraConfig.instance().set_config(job_cfg)
            run_dir = job_run_dir(job_cfg.hydra)
            if run_dir in seen:
                fail(f"hydra.sweep.subdir: jobs {seen[run_dir]} and {num} would share the run directory {run_dir}; "
                     "allowed: a subdir that differs per job, such as ${hydra.job.num}")
            seen[run_dir] = num
            cfg = dataclasses.replace(config_lib.from_composed(job_cfg, experiments_dir), run_dir=str(run_dir))
            if known:
                check_existing(cfg, run_dir)
            if in_process and devices.distributed_settings(cfg.devices)[0] > 1:
                fail("devices.num_processes: this process would join a multi-host run for each job, and a "
                     "process joins one only; allowed: 1 or auto (one process on this machine uses every "
                     "core), or a launcher that runs each job in processes of its own "
                     "(hydra/launcher=submitit_slurm)")
            devices.use_cpu_cores(cfg.devices.num_cpu_devices)  # before JAX starts; the jobs share them
            task = check_run(cfg, setup_devices=False)
            if known:
                _CHECKED[tuple(job)] = (cfg, task)
            checked_cfgs.append(cfg)
        except (config_lib.ConfigError, ValueError) as err:
            fail(str(err).splitlines()[0] + where)
        except (HydraException, OmegaConfBaseException) as err:
            fail(f"overrides: {str(err).strip().splitlines()[0]}{where}")
    return checked_cfgs


def open_mlflow_parent(cfgs: list, known: bool, sweep_dir: Path, argv: list[str]) -> Optional[MlflowRun]:
    """The sweep's MLflow run, when its jobs log to MLflow: the parent of their runs, which are nested
    under it through ``PARENT_RUN_ENV`` (an environment variable, so that it reaches jobs that other
    processes run). It holds, as parameters, the settings every job shares (known jobs only: another
    sweeper's are not known in advance). A sweep continued in the same directory continues it."""
    enabled = [cfg for cfg in cfgs if cfg.logger.mlflow.mode == "enabled"]
    if not enabled:
        return None
    flat = [config_lib.flatten(cfg.to_dict()) for cfg in cfgs]
    shared = {k: v for k, v in flat[0].items() if all(k in f and f[k] == v for f in flat[1:])} if known else {}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return MlflowRun.open(enabled[0].logger.mlflow, enabled[0].experiment, sweep_dir, sweep_dir.name, shared,
                          {"metarl.sweep_dir": str(sweep_dir), "metarl.command": " ".join(argv)},
                          lambda text: print(text, flush=True), parent_id=os.environ.get(PARENT_RUN_ENV))


def log_mlflow_summary(parent: MlflowRun, sweep_dir: Path, rows: list[dict], stopped: bool) -> None:
    """The summary on the sweep's MLflow run (docs/tracking.md), which then ends."""
    scored = [r for r in rows if r["best"] is not None and math.isfinite(r["best"])]
    if scored:
        best = max(scored, key=lambda r: r["best"])
        values = {"best": best["best"], "best_job": best["job"], "best_job_last_mean": best["last_mean"]}
        parent.log_metrics({k: v for k, v in values.items() if v is not None}, step=0)
        parent.set_tags({"best_overrides": best["overrides"]})
    parent.log_files([sweep_dir / SUMMARY_CSV, sweep_dir / SUMMARY_JSON], None)
    failed = any(r["exit_code"] != 0 for r in rows)
    parent.finish("KILLED" if stopped else "FAILED" if failed else "FINISHED")


def run(cli) -> int:
    """The sweep of ``cli`` (``metarl.evolve.CommandLine``, given with ``-m``): checks, then Hydra's sweeper,
    then the summary."""
    special, experiments_dir = cli.special, cli.experiments_dir
    if "resume" in special:
        fail("resume: a sweep's jobs cannot be resumed by name; allowed: the sweep's own command again with "
             "run_dir=SWEEP_DIR (each job continues its run), or resume=RUN_DIR without -m")
    for key in ("experiment", "experiments_dir"):
        if "," in special.get(key, ""):
            fail(f"{key}: {special[key]!r} lists several; allowed: one per sweep (a sweep composes one "
                 "experiment; run one sweep for each)")
    # run_dir=PATH names the sweep's directory: Hydra's hydra.sweep.dir, set after any given (the last wins).
    run_dirs = [o.split("=", 1)[1] for o in cli.overrides if config_lib.override_key(o) == "run_dir"]
    if run_dirs and "," in run_dirs[-1]:
        fail(f"run_dir: {run_dirs[-1]!r} cannot be swept; allowed: one directory for the sweep (each job "
             "runs in a directory of its own inside it)")
    named = bool(run_dirs) or any(config_lib.override_key(o) == "hydra.sweep.dir" for o in cli.overrides)
    overrides = [o for o in cli.overrides if config_lib.override_key(o) != "run_dir"]
    with config_lib.hydra_context(experiments_dir) as app:
        return _run(cli, app, [*overrides, *(f"hydra.sweep.dir={d}" for d in run_dirs[-1:])], named)


def _run(cli, app, overrides: list[str], named: bool) -> int:
    experiment, experiments_dir = cli.special["experiment"], cli.experiments_dir
    master = config_lib.compose(experiment, overrides, experiments_dir, multirun=True)
    refuse_chdir(master)
    sweep_dir = Path(str(master.hydra.sweep.dir))
    if not named:  # the default name, made unique (two sweeps started in the same second)
        sweep_dir = runlock.unique_dir(sweep_dir)
    # Set explicitly, so that every later composition (Hydra's own, a job's) names the same one.
    overrides = [o for o in overrides if config_lib.override_key(o) != "hydra.sweep.dir"]
    overrides.append(f"hydra.sweep.dir={sweep_dir}")
    master = config_lib.compose(experiment, overrides, experiments_dir, multirun=True)
    config_lib.check_run_dir(str(sweep_dir), "run_dir")
    if (sweep_dir / config_lib.CONFIG_FILE).exists():
        fail(f"run_dir: {sweep_dir} holds a run, not a sweep; allowed: a new directory, or an earlier sweep's")
    jobs, known = _jobs(master)
    cfgs = check_jobs(app, master, jobs, known, experiments_dir)

    # Everything is checked: the sweep's directory is made, then Hydra's sweeper runs the jobs.
    if not named:
        try:
            sweep_dir.mkdir(parents=True)
        except FileExistsError:
            fail(f"run_dir: {sweep_dir} was made by another sweep started at the same moment; allowed: the same "
                 "command again, or run_dir=PATH", code=1)
    count = f"{len(jobs)} job" + ("s" if len(jobs) != 1 else "") if known else "jobs"
    print(f"sweep: {count} in {sweep_dir}", flush=True)
    stopped = None
    outer_parent = os.environ.get(PARENT_RUN_ENV)
    parent = open_mlflow_parent(cfgs, known, sweep_dir, cli.argv)
    if parent is not None and parent.active:
        os.environ[PARENT_RUN_ENV] = parent.run_id
    try:
        app.multirun(config_name=experiment, task_function=SweepJob(experiments_dir),
                     overrides=config_lib.hydra_args(overrides, experiments_dir),
                     with_log_configuration=False)
    except SweepStopped as stop:
        stopped = stop.args[0]
    except KeyboardInterrupt:
        stopped = STOPPED[0]
    except Exception as err:  # the launcher or sweeper itself failed (a job's own failure is its exit code)
        message = (str(err).strip().splitlines() or [""])[0]
        print(f"error: hydra/launcher: {type(err).__name__}: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        rows = write_summary(sweep_dir) if sweep_dir.is_dir() else []
        if parent is not None:
            log_mlflow_summary(parent, sweep_dir, rows, stopped is not None)
            os.environ.pop(PARENT_RUN_ENV, None)
            if outer_parent is not None:
                os.environ[PARENT_RUN_ENV] = outer_parent
    failed = sum(r["exit_code"] != 0 for r in rows)
    print(f"\nsweep {'stopped' if stopped else 'done'}: {len(rows)} job(s), {failed} failed or unfinished; "
          f"summary in {sweep_dir / SUMMARY_CSV}", flush=True)
    if stopped:
        again = [a for a in cli.argv if config_lib.override_key(a) not in ("run_dir", "hydra.sweep.dir")]
        print(f"continue with: python -m metarl.evolve {' '.join(again)} run_dir={sweep_dir}", file=sys.stderr,
              flush=True)
        return stopped
    return worst_code([r["exit_code"] if isinstance(r["exit_code"], int) else 1 for r in rows] or [0])
