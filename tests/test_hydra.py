"""`python -m metarl.evolve` as a Hydra application: sweeps (-m) with the basic and the joblib launcher,
their summary, --cfg, --help, and Hydra's own keys, through the real CLI at tiny sizes."""
import csv
import json
import shutil

import pytest

from clihelp import TINY, evolve, run_here, records, snapshot

SWEEP = ["-m", "experiment=value_loss", *TINY, "es.generations=2", "seed=0,1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep of two jobs (seed=0,1) on Hydra's basic launcher, shared by the tests below."""
    cwd = tmp_path_factory.mktemp("sweep")
    proc = evolve([*SWEEP, "run_dir=sweep"], cwd=cwd, check=True)
    return cwd, proc


@pytest.mark.timeout(600)
def test_sweep_runs_each_job_in_its_own_run_dir_and_writes_a_summary(sweep):
    cwd, proc = sweep
    sweep_dir = cwd / "sweep"
    assert "summary in sweep/summary.csv" in proc.stdout
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{k: str(v) for k, v in row.items()} for row in json.loads((sweep_dir / "summary.json").read_text())]
    assert [r["job"] for r in rows] == ["0", "1"]
    for seed, row in enumerate(rows):
        run_dir = cwd / row["run_dir"]
        assert run_dir == sweep_dir / str(seed)
        assert f"seed={seed}" in row["overrides"].split() and "es.popsize=4" in row["overrides"].split()
        assert f"seed: {seed}\n" in (run_dir / "config.yaml").read_text()
        history = records(run_dir)
        assert [r["generation"] for r in history] == [1, 2]
        assert row["exit_code"] == "0" and row["generations"] == "2"
        assert float(row["best"]) == history[-1]["best_so_far"] and float(row["last_mean"]) == history[-1]["mean"]
    # Hydra leaves no outputs/ or .hydra/ behind, changes no directory and logs nothing of its own.
    assert sorted(p.name for p in cwd.iterdir()) == ["sweep"]
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["0", "1", "jobs", "multirun.yaml", "summary.csv",
                                                          "summary.json"]
    assert not list(sweep_dir.rglob(".hydra")) and "[HYDRA]" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


@pytest.mark.timeout(600)
def test_joblib_launcher_runs_a_job_as_the_basic_one_did_and_a_sweep_continues_its_jobs(sweep, tmp_path):
    cwd, _ = sweep
    # Hydra's joblib launcher runs the job in a worker process of its own: the same run as job 1 above.
    evolve(["-m", "experiment=value_loss", *TINY, "es.generations=2", "seed=1", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=1", "run_dir=joblib"], cwd=tmp_path, check=True)
    assert records(tmp_path / "joblib" / "0") == records(cwd / "sweep" / "1")
    summary = json.loads((tmp_path / "joblib" / "summary.json").read_text())
    assert [(r["job"], r["exit_code"], r["run_dir"]) for r in summary] == [(0, 0, "joblib/0")]

    # The same sweep again with the same run_dir and more generations: each job continues its run.
    shutil.copytree(cwd / "sweep", tmp_path / "sweep")
    proc = evolve([*SWEEP[:-2], "es.generations=3", "seed=0,1", "run_dir=sweep"], cwd=tmp_path, check=True)
    assert proc.stdout.count("resuming") == 2
    for job in ("0", "1"):
        history = records(tmp_path / "sweep" / job)
        assert [r["generation"] for r in history] == [1, 2, 3] and history[:2] == records(cwd / "sweep" / job)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, field", [
    # A bad value in one job of the sweep: refused before the first job starts, naming the job.
    (["-m", "experiment=value_loss", "seed=0,1", "es.popsize=4,7"], "es.popsize"),
    (["-m", "experiment=value_loss", "seed=0,1", "hydra.nope=1"], "hydra.nope"),
    (["-m", "experiment=value_loss", "seed=0,1", "hydra/launcher=nope"], "hydra/launcher"),
    (["-m", "experiment=value_loss", "seed=0,1", "hydra.job.chdir=true"], "hydra.job.chdir"),
    (["-m", "experiment=value_loss", "seed=0,1", "run_dir=a,b"], "run_dir"),
    # interval() is sampled by an optimising sweeper; the basic one cannot list its values.
    (["-m", "experiment=value_loss", "es.lr=interval(0.01,0.1)"], "es.lr"),
    (["-m", "resume={tmp}/run"], "resume"),
    # Without -m, a list of values is refused; with it, hydra.run.dir names the run's directory.
    (["experiment=value_loss", "seed=0,1"], "seed"),
    (["experiment=value_loss", "hydra.run.dir={tmp}/afile"], "hydra.run.dir"),
    (["experiment=value_loss", "hydra.run.dir={tmp}/new"], "hydra.run.dir"),
])
def test_bad_sweeps_and_hydra_keys_exit_2_with_one_line_and_write_nothing(tmp_path, args, field):
    (tmp_path / "afile").write_text("not a directory\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = snapshot(tmp_path)
    code, _, stderr = run_here("metarl.evolve", args, cwd=tmp_path)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), stderr
    assert "Traceback" not in stderr and "++" not in stderr
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(120)
def test_cfg_job_prints_the_composed_config_and_help_lists_experiments_and_keys(tmp_path):
    import yaml

    proc = evolve(["experiment=hyperparams", "es.popsize=8", "inner.num_envs=2", "--cfg", "job", "--resolve"], cwd=tmp_path,
                  timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert shown["experiment"] == "hyperparams" and shown["es"]["popsize"] == 8
    assert shown["inner"]["num_envs"] == 2 and "hydra" not in shown
    proc = evolve(["--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for text in ("-m experiment=NAME", "value_loss, value_loss_family, value_loss_gpu", "drift_family",
                 "hyperparams", "  popsize: 16", "  num_seeds: 2", "inner.*", "component.*"):
        assert text in proc.stdout, text
    # With an experiment, its values; Hydra's own help lists the launchers.
    proc = evolve(["experiment=hyperparams", "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "  strategy: SNES" in proc.stdout, proc.stderr
    proc = evolve(["--hydra-help"], cwd=tmp_path, timeout=120)
    launchers = next(line for line in proc.stdout.splitlines() if line.startswith("hydra/launcher"))
    assert {"basic", "joblib"} <= set(launchers.split(": ", 1)[1].split(", "))
    # Hydra's own argument errors: its usage, exit code 2.
    proc = evolve(["experiment=value_loss", "--cfg", "everything"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "argument --cfg" in proc.stderr.splitlines()[-1], proc.stderr
    assert list(tmp_path.iterdir()) == []
