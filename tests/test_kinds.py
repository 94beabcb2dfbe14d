"""A kind of meta-learned part added by one registration, and the trainer protocol metarl reads
(metarl.kinds, metarl.inner_loops.trainer). This module is itself the plug-in trainer's module."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from metarl import config as config_lib
from metarl import evaluate, figures, kinds, plots, results, run
from metarl.errors import ConfigError
from metarl.rundir import RunDir
from metarl.tasks import build_task, check_memory


# --- a trainer of your own with a seam: gradient ascent on -(x - 1)^2, the curve standing in for returns --

@struct.dataclass
class ScaledConfig:
    env: str = struct.field(pytree_node=False, default="CartPole-v1")
    steps: int = struct.field(pytree_node=False, default=4)
    lr: float = 0.05

    @property
    def frames_per_run(self) -> int:
        return self.steps

    MEMORY_FIELD = "steps"

    def memory_floats(self) -> int:
        return 1000 * self.steps


SEAMS = ("step_scale",)


class StepScale:
    """The learned part: a multiplier exp(s) on the trainer's step size."""

    def init(self, key):
        return {"log_scale": jnp.zeros((), jnp.float32)}

    def apply(self, meta_params, lr):
        return lr * jnp.exp(meta_params["log_scale"])


def make_train(config: ScaledConfig, step_scale=None):
    def train(key, meta_params=None):
        lr = config.lr if step_scale is None else step_scale.apply(meta_params["step_scale"], config.lr)

        def step(x, _):
            x = x + lr * 2.0 * (1.0 - x)
            return x, -(x - 1.0) ** 2

        x, curve = jax.lax.scan(step, jnp.float32(0.0), None, length=config.steps)
        return x, {"episode_return": curve}

    return train


def scale_figure(run_dir, cfg, task, meta, info, out, error_range):
    """The kind's figure: the learned multiplier beside the baseline's 1."""
    fig = plots.new_figure(3, 3)
    fig.add_subplot(1, 1, 1).bar(["learned", "baseline"], [float(jnp.exp(meta["log_scale"])), 1.0])
    return [plots.save(fig, out / "step_scale.png")]


RUN = {
    "experiment": "step_scale", "env": "CartPole-v1",
    "inner": {"_target_": "test_kinds.ScaledConfig", "steps": 4},
    "component": {"kind": "step_scale"},
    "es": {"strategy": "SNES", "popsize": 4, "generations": 2, "std_init": 0.5, "lr": 1.0, "optimizer": "sgd"},
    "fitness": {"num_seeds": 1, "statistic": "auc"},
    "checkpoint": {"every": 1},
    "logger": {"progress": False},
}


@pytest.fixture
def step_scale_kind():
    kind = kinds.register(kinds.Kind("step_scale", seam="step_scale", component="test_kinds.StepScale",
                                     baseline_label=lambda inner: "unscaled lr", plot=scale_figure))
    yield kind
    kinds.KINDS.pop(kind.name)


@pytest.mark.timeout(300)
def test_a_kind_added_by_one_registration_runs_end_to_end(step_scale_kind, tmp_path):
    cfg = config_lib.from_dict({**RUN, "run_dir": str(tmp_path / "run")})
    run_dir = tmp_path / "run"
    RunDir(run_dir).write_config(cfg.to_dict())
    summary = run.run_stages(cfg, run_dir, mesh=None)
    assert summary["generations"] == 2

    paths = figures.write_figures(run_dir)
    assert run_dir / "figures" / "step_scale.png" in paths and (run_dir / "figures" / "step_scale.png").is_file()

    report = evaluate.evaluate(run_dir, num_seeds=2)
    assert report["kind"] == "step_scale"
    sides = report["tasks"][0]["sides"]
    assert set(sides) == {"learned step_scale", "baseline: unscaled lr"}
    # Each side's final return is the run's fitness statistic (auc here: the mean of the toy's curve) at its
    # step size: the exported multiplier's, and 1's.
    def final(scale):
        x, curve = 0.0, []
        for _ in range(4):
            x = x + 0.05 * scale * 2.0 * (1.0 - x)
            curve.append(-(x - 1.0) ** 2)
        return float(np.mean(curve))

    learned_scale = float(jnp.exp(results.load_best(run_dir).meta_params["log_scale"]))
    np.testing.assert_allclose(sides["learned step_scale"]["mean"], final(learned_scale), rtol=1e-4)
    np.testing.assert_allclose(sides["baseline: unscaled lr"]["mean"], final(1.0), rtol=1e-4)


def test_an_unregistered_kind_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"^component.kind: 'step_scale'; allowed: value_loss, policy_objective, "
                                          r"hyperparams, schedule, optimiser, or the dotted path of a metarl.kinds.Kind$"):
        build_task(config_lib.from_dict(RUN))
    with pytest.raises(ConfigError, match=r"^component.kind: test_kinds.scale_figure is a function, not a Kind"):
        build_task(config_lib.from_dict({**RUN, "component": {"kind": "test_kinds.scale_figure"}}))


# The same kind, named on the command line by its dotted path instead of registered in code.
STEP_SCALE = kinds.Kind("step_scale", seam="step_scale", component="test_kinds.StepScale",
                        baseline_label=lambda inner: "unscaled lr", plot=scale_figure)


@pytest.mark.timeout(300)
def test_a_kind_named_by_its_dotted_path_runs_through_the_command_line(tmp_path):
    import json

    import yaml

    from clihelp import evolve, run_module

    (tmp_path / "exps" / "experiment").mkdir(parents=True)
    cli_run = {**RUN, "component": {"kind": "test_kinds.STEP_SCALE"}, "devices": {"num_cpu_devices": 1}}
    (tmp_path / "exps" / "experiment" / "step_scale.yaml").write_text("# @package _global_\n" + yaml.safe_dump(cli_run))
    evolve(["--config-dir", "exps", "experiment=step_scale", "run_dir=run"], cwd=tmp_path, check=True)
    run_module("metarl.inspect", ["run_dir=run"], cwd=tmp_path, check=True)
    assert (tmp_path / "run" / "figures" / "step_scale.png").is_file()
    run_module("metarl.evaluate", ["run_dir=run", "num_seeds=2", "num_cpu_devices=1"], cwd=tmp_path, check=True)
    report = json.loads(next((tmp_path / "run").rglob("evaluation*.json")).read_text())
    assert report["kind"] == "test_kinds.STEP_SCALE"
    assert set(report["tasks"][0]["sides"]) == {"learned test_kinds.STEP_SCALE", "baseline: unscaled lr"}


def test_a_trainer_without_the_seam_is_refused(step_scale_kind):
    with pytest.raises(ConfigError, match=r"^inner.algo: 'ppo' has no step_scale seam"):
        build_task(config_lib.from_dict({**RUN, "inner": {"algo": "ppo"}}))


# --- memory: what the trainer declares, or a warning ------------------------------------------------------

HYPER = {**RUN, "component": {"kind": "hyperparams", "search": {"lr": {"low": 0.01, "high": 0.45}}}}


def test_a_trainer_that_declares_its_memory_gets_an_estimate():
    cfg = config_lib.from_dict(HYPER)
    need = check_memory(cfg, build_task(cfg), None, members_here=4)
    per_training = 4 * 1000 * 4 * 2   # float32 x memory_floats() x XLA's temporaries
    assert need == 4 * per_training + 4 * 3 * cfg.es.popsize * 1
    big = config_lib.from_dict({**HYPER, "inner": {**HYPER["inner"], "steps": 10**6}})
    with pytest.raises(ConfigError, match=r"^inner.steps: one generation needs"):  # the declared MEMORY_FIELD
        check_memory(big, build_task(big), 2**20, members_here=4)


def test_a_trainer_that_declares_no_memory_is_warned_not_estimated_at_zero(capsys):
    cfg = config_lib.from_dict({**HYPER, "inner": {"_target_": "plugin_trainer.ToyConfig", "steps": 4}})
    task = build_task(cfg)
    search_only = 4 * 3 * cfg.es.popsize * 1
    assert check_memory(cfg, task, None, members_here=4) == search_only
    assert capsys.readouterr().err == ""  # nothing to check against: nothing to say
    assert check_memory(cfg, task, 2**40, members_here=4) == search_only
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: inner._target_: plugin_trainer.ToyConfig declares no "
                                               "memory_floats()"), err
