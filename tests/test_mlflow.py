"""MLflow tracking through the CLI, read back from MLflow's real local store (SQLite) with its client."""
import json
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from clihelp import TINY, env_vars, evolve, records, snapshot, start_evolve
from metarl import config as config_lib
from metarl.errors import ConfigError
from metarl.rundir import RunDir
from metarl.logger import MlflowRun, mlflow_store, scalars

HP = [a for a in TINY if not a.startswith("component.")]


def store(folder):
    return MlflowClient(tracking_uri=mlflow_store(str(folder))[0])


def only_run(client, experiment):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def steps(client, run_id, key="best"):
    return [m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


def closed_port() -> int:
    """A loopback port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SWEEP = ["-m", "experiment=hyperparams", *HP, "es.generations=2", "seed=0,1", "run_dir=sweep",
         "logger.mlflow.mode=enabled", "logger.mlflow.tags={study:tiny}"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep of two tiny runs (seed=0,1) logged to the default store, mlruns/ in the working directory;
    shared by the tests of what a run logs and of what a sweep logs."""
    cwd = tmp_path_factory.mktemp("mlflow")
    proc = evolve(SWEEP, cwd=cwd, check=True)
    return cwd, proc, store(cwd / "mlruns")


@pytest.mark.timeout(600)
def test_run_logs_config_metrics_figures_and_best_files(sweep):
    cwd, proc, client = sweep
    assert proc.stderr.strip() == "", proc.stderr  # no warnings from MLflow or its database
    run_dir = cwd / "sweep" / "0"
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("hyperparams").experiment_id])
              if r.info.run_name == "0"]
    assert run.info.status == "FINISHED"
    assert RunDir(run_dir).mlflow_run.read()["run_id"] == run.info.run_id
    assert run.data.tags["study"] == "tiny" and run.data.tags["metarl.run_dir"] == str(run_dir)

    saved = config_lib.flatten(RunDir(run_dir).read_config())
    assert run.data.params == {k: config_lib.show_value(v) for k, v in saved.items()}
    assert run.data.params["es.popsize"] == "4" and run.data.params["inner.hidden"] == "[8]"

    history = RunDir(run_dir).metrics()
    names = set(scalars(history[0]))
    assert {"best", "mean", "search/mean/lr", "search/low/lr", "tasks/CartPole-v1/raw_mean"} <= names
    assert set(run.data.metrics) == names
    for name in names:
        logged = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [m.step for m in logged] == [1, 2], name
        assert [m.value for m in logged] == pytest.approx([scalars(r)[name] for r in history], nan_ok=True), name

    files = {a.path for folder in ("figures", "meta-params") for a in client.list_artifacts(run.info.run_id, folder)}
    assert files == {"figures/fitness.png", "figures/hyperparams.png", "figures/signal.png",
                     "meta-params/best_meta_params.json",
                     "meta-params/best_meta_params.msgpack"}
    got = client.download_artifacts(run.info.run_id, "meta-params/best_meta_params.json", str(cwd))
    assert open(got).read() == (run_dir / "best_meta_params.json").read_text()


@pytest.mark.timeout(600)
def test_sweep_is_a_parent_run_with_a_nested_run_per_job(sweep):
    cwd, _, client = sweep
    runs = client.search_runs([client.get_experiment_by_name("hyperparams").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if r.info.run_id != parent.info.run_id), key=lambda r: r.info.run_name)
    assert len(runs) == 3 and [c.info.run_name for c in children] == ["0", "1"]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert [c.data.params["seed"] for c in children] == ["0", "1"]
    assert all(c.info.status == "FINISHED" and steps(client, c.info.run_id) == [1, 2] for c in children)

    summary = json.loads((cwd / "sweep" / "summary.json").read_text())
    top = max(summary, key=lambda r: r["best"])
    assert parent.info.status == "FINISHED" and parent.info.run_name == "sweep"
    assert parent.data.tags["metarl.command"] == shlex.join(SWEEP)  # as Hydra recorded the command line
    assert parent.data.metrics["best"] == top["best"] and parent.data.metrics["best_job"] == top["job"]
    assert parent.data.tags["best_overrides"] == top["overrides"]
    assert "seed" not in parent.data.params and parent.data.params["es.popsize"] == "4"  # what the jobs share
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"summary.csv", "summary.json"}


@pytest.mark.timeout(600)
def test_stopped_and_resumed_run_continues_its_mlflow_run_with_each_generation_once(tmp_path):
    mlruns, run_dir = tmp_path / "mlruns", tmp_path / "run"
    # The sweep's tiny program (compiled once for the session); enough generations for a signal to land.
    args = ["experiment=hyperparams", *HP, "es.generations=1000", f"run_dir={run_dir}",
            "logger.mlflow.mode=enabled", f"logger.mlflow.tracking_uri={mlruns}"]
    # 1. SIGTERM once a generation is logged: the checkpoint is saved, and the MLflow run is marked KILLED.
    proc = start_evolve(args, cwd=tmp_path)
    deadline = time.time() + 300
    while time.time() < deadline and len(RunDir(run_dir).metrics()) < 1:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    done = len(RunDir(run_dir).metrics())
    client = store(mlruns)
    run = only_run(client, "hyperparams")
    assert run.info.status == "KILLED" and steps(client, run.info.run_id) == list(range(1, done + 1))

    # 2. Resumed with a tracking server that cannot be reached: one warning, and the run completes.
    proc = evolve([f"resume={run_dir}", f"es.generations={done + 2}",
                   f"logger.mlflow.tracking_uri=http://127.0.0.1:{closed_port()}"], cwd=tmp_path, check=True)
    assert proc.stdout.count("warning: MLflow") == 1 and "127.0.0.1" in proc.stdout, proc.stdout
    assert len(RunDir(run_dir).metrics()) == done + 2
    assert steps(client, run.info.run_id) == list(range(1, done + 1))  # nothing reached the store

    # 3. Resumed with the store again: the same MLflow run gets the generations it lacks (from the
    #    checkpoint's history, skipping those it holds), then the new one; each step once.
    proc = evolve([f"resume={run_dir}", f"es.generations={done + 3}", f"logger.mlflow.tracking_uri={mlruns}"],
                  cwd=tmp_path, check=True)
    assert f"MLflow: continuing run {run.info.run_id}" in proc.stdout
    run = only_run(client, "hyperparams")
    assert run.info.status == "FINISHED"
    expected = list(range(1, done + 4))
    assert [r["generation"] for r in records(run_dir)] == expected
    for name in ("best", "mean", "fps"):
        assert steps(client, run.info.run_id, name) == expected, name
    best = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "best")}
    assert best == {r["generation"]: r["best"] for r in records(run_dir)}
    assert run.data.params["es.generations"] == "1000"  # MLflow keeps a parameter's first value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sweep", [False, True])
def test_mlflow_asked_for_but_not_installed_exits_2_having_written_nothing(tmp_path, sweep):
    # `sys.modules[name] = None` makes the package absent to this interpreter, as if not installed.
    code = ("import sys; sys.modules['mlflow'] = None; from metarl.evolve import main; "
            "sys.exit(main(sys.argv[1:]))")
    args = [*(["-m"] if sweep else []), "experiment=value_loss", *TINY, "run_dir=run", "logger.mlflow.mode=enabled"]
    before = snapshot(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env_vars(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: logger.mlflow.mode: enabled, but mlflow cannot be "
                                                   "imported") and 'pip install "metarl[mlflow]"' in lines[0]
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(120)
def test_a_file_store_mlflow_refuses_exits_2_having_written_nothing(tmp_path):
    before = snapshot(tmp_path)
    proc = evolve(["experiment=value_loss", *TINY, "run_dir=run", "logger.mlflow.mode=enabled",
                   f"logger.mlflow.tracking_uri=file:{tmp_path / 'mlruns'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: logger.mlflow.tracking_uri: file:{tmp_path / 'mlruns'} "
                                                   "is a store MLflow refuses (MlflowException: "), lines
    assert lines[0].endswith("allowed: a folder (a local store metarl keeps in it), sqlite:///PATH or http://HOST:PORT")
    assert snapshot(tmp_path) == before


def test_unreachable_server_costs_one_quick_failure_and_one_warning(tmp_path, monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(name, "")  # so that the value metarl sets is undone after the test
        monkeypatch.delenv(name)  # metarl's own defaults apply
    section = config_lib.MlflowSection(mode="enabled", tracking_uri=f"http://127.0.0.1:{closed_port()}")
    messages = []
    t = time.perf_counter()
    run = MlflowRun(section, "value_loss", tmp_path, "run", {"seed": 0}, {}, messages.append)
    for generation in range(1, 4):
        run.log_metrics({"best": 1.0}, generation)
    run.log_files([__file__], "figures")
    run.finish()
    assert time.perf_counter() - t < 3
    assert not run.active and len(messages) == 1 and messages[0].startswith("warning: MLflow: starting its run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override, field", [
    ("logger.mlflow.mode=on", "logger.mlflow.mode"),
    ("logger.mlflow.tracking_uri=' '", "logger.mlflow.tracking_uri"),
    ("logger.mlflow.experiment=''", "logger.mlflow.experiment"),
    ("logger.mlflow.tags={a:[1]}", "logger.mlflow.tags"),
    ("logger.mlflow.typo=1", "logger.mlflow.typo"),
])
def test_bad_mlflow_settings_are_one_line_naming_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        config_lib.load("value_loss", [override])
    assert str(err.value).startswith(f"{field}:") and "allowed:" in str(err.value) and "\n" not in str(err.value)


def test_a_folder_is_a_local_store_and_a_uri_is_mlflow_own(tmp_path):
    assert mlflow_store(str(tmp_path / "m")) == (f"sqlite:///{tmp_path}/m/mlflow.db", f"{tmp_path}/m/artifacts")
    for uri in ("http://127.0.0.1:5000", "https://mlflow.example.org", "sqlite:///x.db"):
        assert mlflow_store(uri) == (uri, None)
