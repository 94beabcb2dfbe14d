"""``python -m metarl.evolve -m KEY=A,B ...``, a sweep (docs/sweeps.md): jobs checked first (``start``), each
recorded in ``SWEEP_DIR/jobs/<number>.json`` so that the summary (``finish``) is the same whatever launcher ran them."""
from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import shlex
import sys
import traceback
from pathlib import Path

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from metarl import compilation, config as config_lib, devices, errors
from metarl.commands import EXIT_BAD_INPUT, STOP_SIGNALS, check_existing, fail
from metarl.errors import ConfigError
from metarl.logger import PARENT_RUN_ENV, MlflowRun
from metarl.run import check, run_locked
from metarl.rundir import JsonFile, RunDir, atomic_write

JOBS_DIR = "jobs"
SUMMARY_CSV, SUMMARY_JSON = "summary.csv", "summary.json"
COLUMNS = ("job", "overrides", "exit_code", "generations", "best", "last_mean", "run_dir")
# Exit codes of a run stopped by a stop signal (checkpoint saved): the sweep stops too.
STOPPED = tuple(128 + int(sig) for sig in STOP_SIGNALS)
# The sweep's command line (``command``), set when it starts: it reaches the jobs wherever they run.
COMMAND_ENV = "METARL_SWEEP_COMMAND"


def command(master) -> list[str]:
    """The sweep's arguments to ``python -m metarl.evolve``, from Hydra's record of them."""
    dirs = [f"--config-dir={str(s.path).removeprefix('file://')}" for s in master.hydra.runtime.config_sources
            if s.provider == "command-line"]
    name = [] if master.hydra.job.config_name == "config" else [f"--config-name={master.hydra.job.config_name}"]
    return ["-m", *dirs, *name, *_hydra_overrides(master), *master.hydra.overrides.task]


def _hydra_overrides(master) -> list[str]:
    """The sweep's overrides of Hydra's own settings, without the mode that ``-m`` sets."""
    return [o for o in OmegaConf.to_container(master.hydra.overrides.hydra) if not o.startswith("hydra.mode")]


def run_job(composed, hydra_cfg) -> float:
    """One job, from Hydra's launcher; a stop signal raises ``Stopped`` (the Hydra callback hands it to ``finish``)."""
    sweep_dir = Path(str(hydra_cfg.sweep.dir))
    num, run_dir = int(hydra_cfg.job.num), sweep_dir / str(hydra_cfg.sweep.subdir)
    record = JsonFile(sweep_dir / JOBS_DIR / f"{num}.json", indent=1)
    overrides = " ".join(str(o) for o in hydra_cfg.overrides.task)
    row = {"job": num, "overrides": overrides, "exit_code": None, "run_dir": str(run_dir)}
    record.path.parent.mkdir(parents=True, exist_ok=True)
    record.write(row)  # a job killed outright stays in the summary, without an exit code
    print(f"\nsweep job {num}: {overrides or '(no overrides)'}", flush=True)
    try:
        cfg = dataclasses.replace(config_lib.from_composed(composed), run_dir=str(run_dir))
        row["exit_code"] = run_locked(cfg, run_dir, check_existing(cfg, run_dir), named=True)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        row["exit_code"] = EXIT_BAD_INPUT
    except SystemExit as stop:  # bad input (one line already printed), as a run on its own would exit
        row["exit_code"] = stop.code if isinstance(stop.code, int) else 1
    except Exception:  # a failure of this job only: the sweep goes on to the next
        traceback.print_exc()
        row["exit_code"] = 1
    record.write(row)
    if row["exit_code"] in STOPPED:
        raise Stopped(row["exit_code"])
    best = _results(run_dir)["best"]
    return math.nan if best is None else best


class Stopped(Exception):
    """``Stopped(exit code)``: a job stopped by a stop signal; the sweep stops too (``finish``)."""


def _results(run_dir: Path) -> dict:
    history = RunDir(run_dir).metrics()
    last = history[-1] if history else {}
    return {"generations": len(history), "best": last.get("best_so_far"), "last_mean": last.get("mean")}


def write_summary(sweep_dir: Path) -> list[dict]:
    records = sorted((sweep_dir / JOBS_DIR).glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    jobs = [json.loads(path.read_text()) for path in records]
    rows = [{k: row.get(k) for k in COLUMNS} for row in ({**job, **_results(Path(job["run_dir"]))} for job in jobs)]
    JsonFile(sweep_dir / SUMMARY_JSON, indent=1).write(rows)
    table = io.StringIO(newline="")
    csv.writer(table).writerows([COLUMNS, *(row.values() for row in rows)])  # rows: COLUMNS in order
    atomic_write(sweep_dir / SUMMARY_CSV, table.getvalue())
    return rows


def _jobs(master) -> tuple[list[list[str]], bool]:
    """``(jobs, known)``: each job's overrides as the basic sweeper makes them (the product of each key's
    values, ``params`` first, a later value replacing an earlier); another sweeper's: the settings all share."""
    task = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().hydra.config_loader)
    if master.hydra.runtime.choices.get("hydra/sweeper") != "basic":
        return [[o.input_line for o in parser.parse_overrides(task) if not o.is_sweep_override()]], False
    params = [f"{k}={v}" for k, v in (master.hydra.sweeper.get("params") or {}).items()]
    values: dict = {}
    for override in parser.parse_overrides([*params, *task]):
        key = override.get_key_element()
        if override.is_sweep_override() and not override.is_discrete_sweep():  # interval(): sampled, not listed
            raise ConfigError(f"{key}: {override.input_line.partition('=')[2]} is an interval, which the basic "
                              "sweeper cannot list; allowed: values a,b, choice(a,b) or range(start,stop,step), or a "
                              "sweeper that samples intervals, such as hydra/sweeper=optuna")
        values[key] = ([f"{key}={v}" for v in override.sweep_string_iterator()] if override.is_sweep_override()
                       else [f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*values.values())], True


def start(master):
    """Before the first job: every job (for another sweeper, the settings they share) composed and checked
    as it will run, exiting with one line naming the first bad job. Returns ``open_mlflow_parent``'s."""
    if master.get("resume"):
        fail("resume: a sweep's jobs cannot be resumed by name; allowed: the sweep's own command again with "
             "run_dir=SWEEP_DIR (each job continues its run), or resume=RUN_DIR without -m")
    sweep_dir = Path(str(master.hydra.sweep.dir))
    config_lib.check_run_dir(str(sweep_dir))
    if RunDir(sweep_dir).has_config():
        fail(f"run_dir: {sweep_dir} holds a run, not a sweep; allowed: a new directory, or an earlier sweep's")
    compilation.enable_compilation_cache()  # before this process compiles anything (its jobs use the cache)
    in_process = master.hydra.runtime.choices.get("hydra/launcher") == "basic"
    jobs, known = _jobs(master)
    if len({o for job in jobs for o in job if o.split("=", 1)[0] == "run_dir"}) > 1:
        fail("run_dir: cannot be swept; allowed: one directory for the sweep (each job runs in a directory "
             "of its own inside it)")
    shared = set.intersection(*(set(job) for job in jobs)) if len(jobs) > 1 else set()
    seen, cfgs = {}, []
    for num, job in enumerate(jobs):
        swept = " ".join(o for o in job if o not in shared)
        where = (f" (sweep job {num}" + (f": {swept})" if swept else ")")) if known else " (the sweep's settings)"
        try:
            job_cfg = compose("config", [*_hydra_overrides(master), *job], return_hydra_config=True)
            with open_dict(job_cfg):
                job_cfg.hydra.job.num = num
                job_cfg.hydra.sweep.dir = str(sweep_dir)
            run_dir = sweep_dir / str(job_cfg.hydra.sweep.subdir)
            if run_dir in seen:
                fail(f"hydra.sweep.subdir: jobs {seen[run_dir]} and {num} would share the run directory {run_dir}; "
                     "allowed: a subdir that differs per job, such as ${hydra.job.num}")
            seen[run_dir] = num
            cfg = dataclasses.replace(config_lib.from_composed(job_cfg), run_dir=str(run_dir))
            if known:
                check_existing(cfg, run_dir)
            if in_process and devices.distributed_settings(cfg.devices)[0] > 1:
                fail("devices.num_processes: this process would join a multi-host run for each job, and a process "
                     "joins one only; allowed: 1 or auto (one process on this machine uses every core), or a "
                     "launcher that runs each job in processes of its own (hydra/launcher=submitit_slurm)")
            devices.use_cpu_cores(cfg.devices.num_cpu_devices)  # before JAX starts; the jobs share them
            check(cfg, setup_devices=False)
            cfgs.append(cfg)
        except ValueError as err:  # ConfigError among them
            fail(str(err).splitlines()[0] + where)
        except (HydraException, OmegaConfBaseException) as err:
            fail(str(errors.one_line(err, config_lib.keys())) + where)
    count = f"{len(jobs)} job" + ("s" if len(jobs) != 1 else "") if known else "jobs"
    print(f"sweep: {count} in {sweep_dir}", flush=True)
    os.environ[COMMAND_ENV] = shlex.join(command(master))
    return open_mlflow_parent(cfgs, known, sweep_dir, os.environ[COMMAND_ENV])


def open_mlflow_parent(cfgs: list, known: bool, sweep_dir: Path, command_line: str):
    """``(run, old PARENT_RUN_ENV)`` or None: the sweep's MLflow run if jobs log there, their runs' parent via
    ``PARENT_RUN_ENV`` (reaching other processes), the jobs' shared settings as parameters; continued with the sweep."""
    enabled = [cfg for cfg in cfgs if cfg.logger.mlflow.mode == "enabled"]
    if not enabled:
        return None
    flat = [config_lib.flatten(cfg.to_dict()) for cfg in cfgs]
    shared = {k: v for k, v in flat[0].items() if all(k in f and f[k] == v for f in flat[1:])} if known else {}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    outer = os.environ.get(PARENT_RUN_ENV)
    parent = MlflowRun(enabled[0].logger.mlflow, enabled[0].experiment, sweep_dir, sweep_dir.name, shared,
                       {"metarl.sweep_dir": str(sweep_dir), "metarl.command": command_line},
                       lambda text: print(text, flush=True), parent_id=outer)
    if not parent.active:
        return None
    os.environ[PARENT_RUN_ENV] = parent.run_id
    return parent, outer


def finish(master, opened, stopped: int | None = None) -> int:
    """After the last job, or after a job ``stopped`` by a stop signal (its exit code): the summary, the
    sweep's MLflow run (``start``'s) ended, and the sweep's exit code (the worst job's, or ``stopped``)."""
    sweep_dir = Path(str(master.hydra.sweep.dir))
    rows = write_summary(sweep_dir)
    failed = sum(r["exit_code"] != 0 for r in rows)
    if opened is not None:
        parent, outer = opened
        scored = [r for r in rows if r["best"] is not None and math.isfinite(r["best"])]
        if scored:
            best = max(scored, key=lambda r: r["best"])
            values = {"best": best["best"], "best_job": best["job"], "best_job_last_mean": best["last_mean"]}
            parent.log_metrics({k: v for k, v in values.items() if v is not None}, step=0)
            parent.send("tagging the run", "set_tag", "best_overrides", best["overrides"])
        parent.log_files([sweep_dir / SUMMARY_CSV, sweep_dir / SUMMARY_JSON], None)
        parent.finish("KILLED" if stopped is not None else "FAILED" if failed else "FINISHED")
        os.environ.pop(PARENT_RUN_ENV, None)
        if outer is not None:
            os.environ[PARENT_RUN_ENV] = outer
    if stopped is not None:
        print(f"\nsweep stopped: {len(rows)} job(s); summary in {sweep_dir / SUMMARY_CSV}", flush=True)
        again = [a for a in shlex.split(os.environ.get(COMMAND_ENV, ""))
                 if a.split("=", 1)[0] not in ("run_dir", "hydra.sweep.dir")]
        print(f"continue with: python -m metarl.evolve {shlex.join([*again, f'run_dir={sweep_dir}'])}",
              file=sys.stderr, flush=True)
        return stopped
    print(f"\nsweep done: {len(rows)} job(s), {failed} failed or unfinished; summary in {sweep_dir / SUMMARY_CSV}",
          flush=True)
    # The code that says the most: a failure over success, the higher over the lower; a job killed by a
    # signal has a negative code, reported the way a shell would; one without a code (killed outright) 1.
    codes = [(128 - c if c < 0 else c) if isinstance(c, int) else 1 for c in (r["exit_code"] for r in rows)]
    return max(codes or [0], key=lambda c: (c != 0, c))
