"""`python -m metarl.evolve` end to end, with the real libraries at tiny sizes, in subprocesses."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import TINY, env_vars, evolve, run_here, records, snapshot

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_tiny_run_writes_config_metrics_and_best(tmp_path, tiny_value_loss_run):
    run_dir, proc = tiny_value_loss_run  # experiment=value_loss, TINY, es.generations=2 (conftest.py)
    assert (run_dir / "config.yaml").exists()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in records] == [1, 2]
    for r in records:
        assert {"best", "mean", "fps", "seconds", "fitness", "nonfinite"} <= set(r)
        assert len(r["fitness"]) == 4
    assert (run_dir / "best_meta_params.msgpack").stat().st_size > 0
    info = json.loads((run_dir / "best_meta_params.json").read_text())
    assert info["kind"] == "value_loss" and info["env"] == "CartPole-v1"
    assert "gen    2/2" in proc.stdout and "frames/s" in proc.stdout and "left" in proc.stdout
    # A second run loads the generation from the compilation cache; XLA's C++ log lines about
    # that ("Assume version compatibility", "+prefer-no-gather") must not reach the console.
    again = evolve(["experiment=value_loss", *TINY, "es.generations=2", f"run_dir={tmp_path / 'again'}"],
                   cwd=tmp_path, check=True)
    assert again.stderr.strip() == "", again.stderr


DQN_TINY = ["es.popsize=4", "fitness.num_seeds=1", "inner.total_timesteps=256", "inner.log_interval=64",
            "inner.learning_starts=32", "inner.buffer_size=64", "inner.batch_size=8", "inner.hidden=[8]",
            "checkpoint.every=1"]


@pytest.mark.timeout(600)
def test_dqn_hyperparams_experiment_runs(tmp_path):
    run_dir = tmp_path / "run"
    evolve(["experiment=dqn_hyperparams", *DQN_TINY, "es.generations=2", f"run_dir={run_dir}"], cwd=tmp_path,
           check=True)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.timeout(600)
@pytest.mark.parametrize("experiment", ["policy_objective", "hyperparams"])
def test_other_experiments_run(tmp_path, experiment):
    tiny = [a for a in TINY if not a.startswith("component.")]
    if experiment == "policy_objective":
        tiny.append("component.hidden=[4]")
    run_dir = tmp_path / "run"
    evolve([f"experiment={experiment}", *tiny, "es.generations=2", f"run_dir={run_dir}", "env=Acrobot-v1"],
           cwd=tmp_path, check=True)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


# The plug-in experiment of docs/extending.md (examples/experiments/huber_value_loss.yaml), here with the copy of
# its component in tests/plugins.py, so the run does not depend on the working directory.
HUBER = ["--config-dir", str(REPO / "examples" / "experiments"), "experiment=huber_value_loss",
         "component._target_=plugins.HuberValueLoss", "component.delta_init=2.0"]


@pytest.mark.timeout(600)
def test_component_and_strategy_of_your_own_by_target(tmp_path):
    # A Huber value loss with a learnable width, from tests/plugins.py, evolved by a strategy class
    # from the same module: neither is known to metarl.
    run_dir = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("component.")]
    proc = evolve([*HUBER, *tiny, "es._target_=plugins.DampedOpenES",
                   "es.args.damping=0.5", "es.generations=2", f"run_dir={run_dir}"], cwd=tmp_path, check=True)
    assert "gen    2/2" in proc.stdout
    assert [r["generation"] for r in records(run_dir)] == [1, 2]
    from metarl.results import load_best

    best = load_best(run_dir)
    assert type(best.component).__name__ == "HuberValueLoss" and best.component.delta_init == 2.0
    assert set(best.meta_params) == {"log_delta"} and best.info["generation"] in (1, 2)
    saved = (run_dir / "config.yaml").read_text()
    assert "plugins.HuberValueLoss" in saved and "plugins.DampedOpenES" in saved


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, field", [
    (["experiment=nope"], "experiment"),
    ([], "experiment"),
    (["experiment=value_loss", "es.strategy=FancyES"], "es.strategy"),
    (["experiment=value_loss", "env=NoSuchEnv-v9"], "env"),
    (["experiment=value_loss", "es.popsize=7"], "es.popsize"),
    (["experiment=value_loss", "es.generations=0"], "es.generations"),
    (["experiment=value_loss", "inner.total_timesteps=0"], "inner.total_timesteps"),
    (["experiment=value_loss", "inner.lr=-1"], "inner.lr"),
    (["experiment=value_loss", "fitness.num_seeds=0"], "fitness.num_seeds"),
    (["experiment=value_loss", "es.popsize=abc"], "es.popsize"),
    (["experiment=value_loss", "es.typo=3"], "es.typo"),
    (["experiment=value_loss", "inner.num_minibatches=3"], "inner.num_minibatches"),
    (["experiment=value_loss", "logger.wandb.mode=sometimes"], "logger.wandb.mode"),
    # A path that cannot be a directory: a file, or under one.
    (["experiment=value_loss", "run_dir={tmp}/afile"], "run_dir"),
    (["experiment=value_loss", "run_dir={tmp}/afile/run"], "run_dir"),
    (["resume={tmp}/afile"], "resume"),
    # Integers beyond what JAX takes (a seed is a C long; sizes are int32).
    (["experiment=value_loss", "seed=99999999999999999999"], "seed"),
    (["experiment=value_loss", "es.popsize=1000000000000"], "es.popsize"),
    (["experiment=value_loss", "fitness.num_seeds=1000000000000"], "fitness.num_seeds"),
    (["experiment=value_loss", "inner.num_steps=4294967296"], "inner.num_steps"),
    # Fits int32 but not in memory: refused by the estimate, before compiling.
    (["experiment=value_loss", "fitness.num_seeds=1000000000"], "fitness.num_seeds"),
    # Non-finite floats, and the wrong type where a number or a list goes.
    (["experiment=value_loss", "es.lr=inf"], "es.lr"),
    (["experiment=value_loss", "es.std_init=nan"], "es.std_init"),
    (["experiment=value_loss", "fitness.nonfinite_floor=nan"], "fitness.nonfinite_floor"),
    (["experiment=value_loss", "inner.gamma=nan"], "inner.gamma"),
    (["experiment=value_loss", "inner.lr=fast"], "inner.lr"),
    (["experiment=value_loss", "inner.hidden=64"], "inner.hidden"),
    (["experiment=value_loss", "component.hidden=[100000,100000]"], "component.hidden"),
    (["experiment=hyperparams", "component.search.lr.low=fast"], "component.search.lr.low"),
    # A trainer that cannot act in the environment: DQN scores a finite set of actions.
    (["experiment=dqn_hyperparams", "env=Pendulum-v1"], "env"),
    # Malformed overrides name themselves, with no internal prefix.
    (["experiment=value_loss", "es.popsize=[1,2"], "es.popsize"),
    (["experiment=value_loss", "=4"], "argument '=4'"),
    (["experiment=value_loss", "inner=[1]"], "inner"),  # Hydra's own error, without its `++` form
    (["experiment=value_loss", "component._target_=no_such_module.Loss"], "component._target_"),
    ([*HUBER[:3], "component._target_=plugins.NotAComponent"], "component._target_"),
    (["experiment=value_loss", "component.typo=1"], "component.typo"),
    (["experiment=value_loss", "es._target_=no_such_module.ES"], "es._target_"),
    (["experiment=value_loss", "es.strategy=PSO"], "es.strategy"),
    (["experiment=value_loss", "inner._target_=plugins.NoSuchConfig"], "inner._target_"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, field):
    (tmp_path / "afile").write_text("not a directory\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if not any(a.startswith(("run_dir=", "resume=")) for a in args):
        args.append(f"run_dir={tmp_path / 'run'}")
    before = snapshot(tmp_path)
    # in this process; a new one: test_bad_input_in_a_new_process_exits_2_with_one_line
    code, _, stderr = run_here("metarl.evolve", args, cwd=tmp_path)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {field}:"), lines[0]
    assert "Traceback" not in stderr and "++" not in stderr
    assert snapshot(tmp_path) == before  # nothing written, nothing changed


@pytest.mark.timeout(120)
def test_bad_input_in_a_new_process_exits_2_with_one_line(tmp_path):
    before = snapshot(tmp_path)
    proc = evolve(["experiment=value_loss", "es.popsize=7", f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: es.popsize:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and snapshot(tmp_path) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, named, allowed", [
    (["experiment=value_loss", "--popsize=4"], "argument '--popsize=4'", "es.popsize=4"),
    (["experiment=value_loss", "=4"], "argument '=4'", "KEY=VALUE"),
    (["experiment=value_loss", ""], "argument ''", "KEY=VALUE"),
    (["experiment=4"], "argument 'experiment=4'", "experiment=NAME with NAME one of adaptive_schedule"),
    (["resume={tmp}/run"], "resume: {tmp}/run/config.yaml", "empty; allowed: the config.yaml a run wrote"),
])
def test_a_mistyped_argument_is_one_line_naming_it_as_typed(tmp_path, args, named, allowed):
    # What a new user might type: a flag for an override, no key, an empty argument, a run whose
    # config.yaml is empty; each one line naming the argument and what is allowed, not Hydra's usage.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = evolve(args, cwd=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {named.replace('{tmp}', str(tmp_path))}:") and allowed in lines[0], lines[0]


def test_help_exits_0():
    # With a folder of the user's own experiments too: the keys listed are still the shipped base.yaml's.
    for extra in ([], ["--config-dir", str(REPO / "examples" / "experiments")]):
        proc = subprocess.run([sys.executable, "-m", "metarl.evolve", *extra, "--help"], env=env_vars(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "experiment=" in proc.stdout and "  popsize: 16" in proc.stdout, proc.stderr
        assert ("huber_value_loss" in proc.stdout) == bool(extra)
