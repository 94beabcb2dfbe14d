"""metarl works from inside a research project whose folders share its layout's names.

Under ``python -m`` the current directory comes first on ``sys.path``, so a user's ``experiments/``,
``inner_loops/`` or ``outer_loops/`` folder would win over top-level packages of those names. metarl
installs everything under the one ``metarl`` namespace; these tests run it from a directory full of
such folders, with the editable install the suite runs on and with a non-editable install elsewhere.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import TINY, env_vars

REPO = Path(__file__).resolve().parents[1]

TRAIN_SCRIPT = """
import jax
from metarl.inner_loops.ppo import PPOConfig, make_train
config = PPOConfig(env="CartPole-v1", num_envs=2, num_steps=8, total_timesteps=64, update_epochs=1,
                   num_minibatches=1, hidden=(8,), unroll=1)
_, metrics = jax.jit(make_train(config))(jax.random.key(0))
print("trained", metrics["episode_return"].shape[0])
"""

USER_EXPERIMENT = """# @package _global_
component:
  kind: hyperparams
  search:
    lr: {low: 1.0e-4, high: 1.0e-2, log: true}
"""


def _research_project(root: Path, package_init: bool) -> Path:
    """A directory like a research repo: its own experiments/, inner_loops/, outer_loops/, and a
    folder of its own experiment YAMLs. Importing any of its folders fails loudly."""
    root.mkdir()
    for name in ("experiments", "inner_loops", "outer_loops"):
        (root / name).mkdir()
        if package_init:
            (root / name / "__init__.py").write_text(f"raise ImportError('the user folder {name}/ was imported')\n")
    (root / "experiments" / "value_loss.yaml").write_text("this: is the user's file, not metarl's\n")
    (root / "my_experiments" / "experiment").mkdir(parents=True)
    (root / "my_experiments" / "experiment" / "my_lr_search.yaml").write_text(USER_EXPERIMENT)
    (root / "train.py").write_text(TRAIN_SCRIPT)
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A non-editable install of this repository into its own folder."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(REPO)], check=True, timeout=600, capture_output=True)
    return target


def _run(args, cwd, pythonpath=None, timeout=300):
    env = env_vars()
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _check_project(project: Path, pythonpath=None, expect_prefix=None):
    where = _run(["-c", "import metarl.experiments as e, metarl.inner_loops.ppo as p; print(e.__file__); "
                  "print(p.__file__)"], project, pythonpath)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert not line.startswith(str(project)), line
        if expect_prefix:
            assert line.startswith(str(expect_prefix)), line

    proc = _run(["-m", "metarl.evolve", "experiment=value_loss", *TINY, "es.generations=1", "run_dir=run"],
                project, pythonpath)
    assert proc.returncode == 0, proc.stderr
    assert (project / "run" / "metrics.jsonl").read_text().count("\n") == 1

    proc = _run(["train.py"], project, pythonpath)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "trained 4"

    proc = _run(["-m", "metarl.evolve", "--config-dir", "my_experiments", "experiment=my_lr_search",
                 *[o for o in TINY if not o.startswith("component.")],
                 "es.generations=1", "run_dir=mine"], project, pythonpath)
    assert proc.returncode == 0, proc.stderr
    saved = (project / "mine" / "config.yaml").read_text()
    assert "experiment: my_lr_search" in saved and "kind: hyperparams" in saved
    assert "popsize: 4" in saved and "checkpoint:" in saved  # the override, and a key only the schema sets


# Each install with one kind of user folder (the four pairs took a minute more of the suite's time;
# each kind of folder and each install still runs): folders that are packages whose import fails
# loudly, and plain folders that Python would import as namespace packages.
@pytest.mark.timeout(900)
def test_editable_install_from_a_research_project_with_package_folders(tmp_path):
    _check_project(_research_project(tmp_path / "project", package_init=True))


@pytest.mark.timeout(1200)
def test_non_editable_install_from_a_research_project_with_plain_folders(tmp_path, site):
    assert (site / "metarl" / "experiments" / "experiment" / "value_loss.yaml").exists()
    assert not (site / "experiments").exists() and not (site / "inner_loops").exists()
    # The console entry points, each printing its own usage.
    for name in ("evolve", "inspect", "evaluate", "distill"):
        script = site / "bin" / f"metarl-{name}"
        assert script.exists(), sorted(p.name for p in (site / "bin").iterdir())
        if name != "evolve":  # evolve's --help composes every experiment's config: seconds more
            proc = _run([str(script), "--help"], tmp_path, site)
            assert proc.returncode == 0 and proc.stdout.startswith(f"python -m metarl.{name} run_dir=RUN_DIR"), proc
    _check_project(_research_project(tmp_path / "project", package_init=False), pythonpath=site,
                   expect_prefix=site)


def test_a_missing_config_dir_is_one_line(tmp_path):
    proc = _run(["-m", "metarl.evolve", "--config-dir", "nowhere", "experiment=value_loss"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --config-dir:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
