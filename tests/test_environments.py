"""Environments by plug-in (a class of the user's own by `_target_`, a registered name) and the Brax
and XLand-MiniGrid adapters, with the real libraries at tiny sizes."""
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from clihelp import TINY, env_vars, evolve

from metarl import config as config_lib
from metarl.errors import ConfigError
from metarl.rundir import RunDir
from metarl.inner_loops import envs
from metarl.inner_loops.ppo import PPOConfig, make_train
from metarl.tasks import inner_config, task_specs

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env" / "corridor.py"


def example_command(program: str) -> list[str]:
    """The arguments of the example's own ``python -m PROGRAM ...`` line, as its docstring writes it."""
    for line in EXAMPLE.read_text().splitlines():
        if line.strip().startswith(f"python -m {program} "):
            return shlex.split(line.split("#")[0])[3:]
    raise AssertionError(f"no `python -m {program}` line in {EXAMPLE}")


def run(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env_vars(), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.timeout(600)
def test_the_custom_env_example_runs_as_written_from_a_fresh_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE, work)
    run_dir = tmp_path / "run"
    # Two devices: corridor.py is imported from the directory the run started in.
    evolve([*example_command("metarl.evolve"), *TINY, "devices.num_cpu_devices=2",
            f"run_dir={run_dir}"], cwd=work, check=True)
    saved = RunDir(run_dir).read_config()
    assert saved["env"] == {"_target_": "corridor.Corridor", "length": 6}
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3  # es.generations=3, as written
    evaluate = run(["-m", "metarl.evaluate", *[f"run_dir={run_dir}" if a == "run_dir=RUN_DIR" else a
                                              for a in example_command("metarl.evaluate")]], work)
    assert evaluate.returncode == 0, evaluate.stderr
    assert "Corridor(length=6)  trained-on" in evaluate.stdout
    assert json.loads((run_dir / "evaluation.json").read_text())["tasks"][0]["env"] == "corridor.Corridor"
    best = run(["-c", f"from metarl.results import load_best; b = load_best({str(run_dir)!r}); "
                      "print(b.inner_config.env, dict(b.inner_config.env_kwargs), b.info['tasks'])"], work)
    assert best.stdout.split("\n")[0] == "corridor.Corridor {'length': 6} ['Corridor(length=6)']", best.stderr
    # Where corridor.py cannot be imported, the run's config names the field, in one line.
    elsewhere = run(["-m", "metarl.evaluate", f"run_dir={run_dir}"], tmp_path)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.strip().startswith("error: env._target_: 'corridor.Corridor' cannot be imported")
    assert len(elsewhere.stderr.strip().splitlines()) == 1


def test_an_environment_without_the_gymnax_interface_exits_2_naming_the_field(tmp_path):
    shutil.copy(EXAMPLE, tmp_path)
    proc = evolve(["experiment=value_loss", "tasks=[CartPole-v1,{env: {_target_: corridor.EnvParams}}]",
                   f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: tasks[1].env._target_: corridor.EnvParams builds a EnvParams "
                                          "without reset_env, step_env"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def specs_and_configs(overrides: dict, field="tasks"):
    cfg = config_lib.from_dict({"experiment": "x", "component": {"kind": "hyperparams", "search": {}},
                                "inner": {"total_timesteps": 512, **overrides.pop("inner", {})}, **overrides})
    specs = task_specs(cfg, field)
    return specs, [inner_config(cfg, spec)[2] for spec in specs]


@pytest.mark.parametrize("overrides, field", [
    ({"env": {"_target_": "corridor.Nope"}}, "env._target_"),
    ({"env": {"_target_": "nomodule.Corridor"}}, "env._target_"),
    ({"env": {"_target_": "corridor.Corridor", "lenght": 6}}, "env.lenght"),
    ({"env": {"_target_": "corridor.Corridor", "length": 1}}, "env.length"),
    ({"env": {"length": 6}}, "env._target_"),
    ({"env": 5}, "env"),
    ({"env": "corridor:Nope"}, "env"),
    ({"env": "NoSuchEnv-v0"}, "env"),
    ({"tasks": ["CartPole-v1", {"env": {"_target_": "collections.OrderedDict"}}]}, "tasks[1].env._target_"),
    ({"tasks": ["CartPole-v1", {"env": {"_target_": "GridWorld", "size": 1}}]}, "tasks[1].env.rows/cols"),
    ({"inner": {"env_kwargs": [["size", 5]]}}, "inner.env_kwargs"),
])
def test_bad_environments_name_the_field(monkeypatch, overrides, field):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    with pytest.raises(ConfigError) as err:
        specs_and_configs(dict(overrides))
    assert str(err.value).startswith(f"{field}: ") and "\n" not in str(err.value), str(err.value)


def test_environments_by_target_name_and_registration_reach_the_trainer(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    specs, configs = specs_and_configs({"tasks": [
        {"env": {"_target_": "corridor.Corridor", "length": 4}, "inner": {"num_envs": 2}},
        {"env": {"_target_": "GridWorld", "size": 5}},
        "corridor:Corridor",  # the name corridor.py registers on import
        "Doors",
    ]})
    assert [s.name for s in specs] == ["Corridor(length=4)[num_envs=2]", "GridWorld(size=5)", "corridor:Corridor",
                                       "Doors"]
    assert [(c.env, c.env_kwargs) for c in configs] == [
        ("corridor.Corridor", (("length", 4),)), ("GridWorld", (("size", 5),)), ("corridor:Corridor", ()),
        ("Doors", ())]
    env, params = envs.make("corridor.Corridor", length=4)
    assert type(env).__name__ == "Corridor" and env.length == 4 and params.max_steps_in_episode == 16
    assert envs.make("GridWorld", size=5)[1].rows == 5
    assert type(envs.make("corridor:Corridor")[0]).__name__ == "Corridor"


def test_the_suites_experiment_holds_out_a_brax_and_a_grid_suite_task():
    cfg = config_lib.load("value_loss_suites", [])
    specs = task_specs(cfg, "eval_tasks")
    assert [(s.env, s.name) for s in specs] == [("Brax", "brax-inverted_pendulum"), ("XMiniGrid", "minigrid-empty-5x5")]
    configs = [inner_config(cfg, spec)[2] for spec in specs]
    assert [c.total_timesteps for c in configs] == [65536, 65536]


TINY_PPO = dict(num_envs=2, num_steps=16, total_timesteps=2 * 16 * 3, update_epochs=1, num_minibatches=1,
                hidden=(8,), unroll=1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env, kwargs, obs_dim, actions", [
    ("Brax", {"env_name": "inverted_pendulum", "max_steps_in_episode": 8}, 4, "Box"),
    ("XMiniGrid", {"env_id": "MiniGrid-Empty-5x5", "max_steps": 8}, 7 * 7 * 2, "Discrete"),
])
def test_ppo_trains_on_the_brax_and_xland_minigrid_adapters(env, kwargs, obs_dim, actions):
    config = PPOConfig(env=env, env_kwargs=tuple(sorted(kwargs.items())), **TINY_PPO).validate()
    gym_env, params = envs.make(env, **kwargs)
    assert gym_env.observation_space(params).shape == (obs_dim,)
    assert type(gym_env.action_space(params)).__name__ == actions
    _, metrics = jax.jit(make_train(config))(jax.random.key(0))
    returns = np.asarray(metrics["episode_return"])
    # Episodes of at most 8 steps end within each 16-step rollout, so every update reports a return.
    assert returns.shape == (3,) and np.all(np.isfinite(returns)), returns
    if env == "Brax":  # 1 per step the pole stays up, at most 8 steps
        assert np.all((returns >= 1) & (returns <= 8)), returns
    else:  # 1 - 0.9 * steps / max_steps at the goal, else 0
        assert np.all((returns >= 0) & (returns < 1)), returns


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_evaluate_reports_the_brax_and_grid_suite_tasks(tmp_path):
    """`metarl.evaluate` on a tiny CartPole run, held out on a Brax and an XLand-MiniGrid task (slow: PPO
    compiles for each task and side, about 20-40 s each on 2 cores)."""
    from metarl import evaluate

    evolve(["experiment=value_loss", *TINY, "es.generations=1", "run_dir=run"], cwd=tmp_path, check=True)
    held_out = [{"env": {"_target_": "Brax", "env_name": "inverted_pendulum", "max_steps_in_episode": 8},
                 "name": "brax"},
                {"env": {"_target_": "XMiniGrid", "env_id": "MiniGrid-Empty-5x5", "max_steps": 8}, "name": "grid"}]
    report = evaluate.evaluate(tmp_path / "run", num_seeds=2, tasks=held_out)
    rows = {row["task"]: row for row in report["tasks"]}
    assert set(rows) == {"brax", "grid"}
    for row in rows.values():
        assert sorted(label.split()[0] for label in row["sides"]) == ["baseline:", "learned"]
        assert all(np.isfinite(side["mean"]) for side in row["sides"].values())


def test_an_environment_first_built_under_jit_is_cached_as_arrays_not_tracers():
    # make_train inside a jitted function builds (and caches) the environment during tracing; the
    # cached parameters must still work outside that trace.
    envs._BUILT.pop(("Acrobot-v1", ()), None)  # Acrobot's parameters hold arrays
    cfg = PPOConfig(env="Acrobot-v1", num_envs=2, num_steps=4, total_timesteps=8, update_epochs=1,
                    num_minibatches=1)
    jax.jit(lambda k: make_train(cfg)(k)[1]["episode_return"])(jax.random.key(0))
    _, params = envs.make("Acrobot-v1")
    assert all(not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(params))
    make_train(cfg)(jax.random.key(1))
