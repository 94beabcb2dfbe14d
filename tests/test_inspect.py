"""`metarl.inspect` and `metarl.evaluate` on tiny real runs of the three experiments."""
import contextlib
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clihelp import TINY, env_vars, run_here, start_evolve

from metarl import evaluate, inspect
from metarl.outer_loops import streams
from metarl.rundir import FIGURES

# figure -> (width, height) in pixels (figsize x 100 dpi)
EXPECTED = {
    "value_loss": {"fitness.png": (700, 400), "signal.png": (700, 550), "value_loss.png": (1100, 420),
                   "value_loss_target.png": (1100, 420)},
    "policy_objective": {"fitness.png": (700, 400), "signal.png": (700, 550), "fitness_tasks.png": (800, 300),
                         "policy_objective.png": (1000, 800)},
    "hyperparams": {"fitness.png": (700, 400), "signal.png": (700, 550),
                    "hyperparams.png": (1280, 600)},  # 7 panels, 4 columns
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny finished run per experiment, evolved side by side."""
    root = tmp_path_factory.mktemp("runs")
    base = [a for a in TINY if not a.startswith("component.")] + ["es.generations=2"]
    extra = {"value_loss": ["component.hidden=[4]", "component.inputs=[error,target]"],
             # several tasks and held-out ones: per-task plots, the held-out table
             "policy_objective": ["component.hidden=[4]", "tasks=[CartPole-v1,Acrobot-v1]",
                                  "eval_tasks=[Catch-bsuite,{env: CartPole-v1, inner: {total_timesteps: 128}}]"],
             "hyperparams": []}
    procs = {kind: start_evolve([f"experiment={kind}", *base, *args, f"run_dir={root / kind}"], cwd=root)
             for kind, args in extra.items()}
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{kind}: exit {proc.returncode}\n{out}\n{err}"
    return {kind: root / kind for kind in procs}


def check_image(path: Path, size):
    image = Image.open(path)
    assert image.size == size, f"{path.name}: {image.size} != {size}"
    pixels = np.asarray(image.convert("RGB"), dtype=float)
    assert pixels.std() > 0
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_inspect_writes_every_figure(runs, kind, capsys):
    assert inspect.main([f"run_dir={runs[kind]}"]) == 0
    printed = capsys.readouterr().out.split()
    expected = {runs[kind] / FIGURES / name for name in EXPECTED[kind]}
    assert {Path(p) for p in printed} == expected
    for name, size in EXPECTED[kind].items():
        check_image(runs[kind] / FIGURES / name, size)


@pytest.mark.timeout(600)
def test_inspect_on_a_copied_run(runs, tmp_path, capsys):
    """Checkpoints restored from the copy, not from where the run was made (the original is moved away)."""
    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(runs["hyperparams"], copy, ignore=shutil.ignore_patterns(FIGURES))
    original = runs["hyperparams"].with_name("hyperparams-moved")
    runs["hyperparams"].rename(original)
    try:
        assert inspect.main([f"run_dir={copy}"]) == 0
    finally:
        original.rename(runs["hyperparams"])
    printed = [Path(p) for p in capsys.readouterr().out.split()]
    assert printed and all(p.parent == copy / FIGURES for p in printed)
    for name, size in EXPECTED["hyperparams"].items():
        check_image(copy / FIGURES / name, size)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["metarl.inspect", "metarl.evaluate"])
def test_bad_run_dir_exits_2(tmp_path, module):
    for arg in (str(tmp_path / "missing"), str(tmp_path)):
        code, _, stderr = run_here(module, [f"run_dir={arg}"])
        assert code == 2, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and str(tmp_path) in lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["metarl.inspect", "metarl.evaluate", "metarl.distill"])
def test_the_run_dir_is_a_key_like_every_other(tmp_path, module):
    """One grammar with ``metarl.evolve``: ``run_dir=PATH`` among the other keys, in any order; a bare path
    is refused with the form to use."""
    code, _, stderr = run_here(module, [str(tmp_path)])
    assert code == 2 and stderr.strip() == f"error: argument {str(tmp_path)!r}: not KEY=VALUE; the run " \
                                           f"directory is given as run_dir={tmp_path}"
    code, usage, _ = run_here(module, [])
    assert code == 2 and usage.startswith(f"python -m {module} run_dir=RUN_DIR")
    setting = {"metarl.inspect": "error_range=2", "metarl.evaluate": "num_seeds=2", "metarl.distill": "seed=1"}[module]
    code, _, stderr = run_here(module, [setting])
    assert code == 2 and stderr.strip() == "error: run_dir: not given; allowed: run_dir=PATH, the directory of a run"
    code, _, stderr = run_here(module, [setting, f"run_dir={tmp_path}"])
    assert code == 2 and stderr.strip().startswith(f"error: run_dir: {tmp_path}: not a metarl run directory (no "
                                                  "config.yaml); allowed: a run's directory")


@pytest.fixture(scope="module")
def evaluated_64(runs, tmp_path_factory):
    """`metarl.evaluate run_dir=RUN num_seeds=4 total_timesteps=64` on the value-loss run, in this process (one CPU
    device), once for the tests that read it: what it printed, the report it wrote and a copy of its figure,
    both taken right after it (a later evaluation of the run writes the same files)."""
    run = runs["value_loss"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert evaluate.main([f"run_dir={run}", "num_seeds=4", "total_timesteps=64"]) == 0
    figure = tmp_path_factory.mktemp("evaluated_64") / "evaluation_64.png"
    shutil.copy(run / FIGURES / "evaluation_64.png", figure)
    return printed.getvalue(), json.loads((run / "evaluation_64.json").read_text()), figure


@pytest.mark.timeout(600)
def test_evaluate_prints_both_sides_and_the_tests(evaluated_64):
    out, report, figure = evaluated_64
    assert "learned value_loss" in out and "baseline: L2 value loss" in out
    assert "p (paired)" in out and "held-out" in out
    [row] = report["tasks"]
    assert set(row["sides"]) == {"learned value_loss", "baseline: L2 value loss (clipped)"}
    assert row["split"] == "held-out" and row["task"] == "CartPole-v1[total_timesteps=64]"
    for side in row["sides"].values():
        assert side["n"] == 4 and len(side["final_returns"]) == 4
        assert all(math.isfinite(v) for v in [side["mean"], side["std"], *side["ci95"]])
        assert side["ci95"][0] <= side["mean"] <= side["ci95"][1]
    test = row["test"]
    assert all(math.isfinite(test[k]) for k in ("welch_t", "welch_p", "mannwhitney_u", "mannwhitney_p", "paired_p"))
    check_image(figure, (700, 400))
    # The table shows the random policy's return that the normalised score is measured from.
    header, shown = (next(line for line in out.splitlines() if line.startswith(start))
                     for start in ("task ", row["task"]))
    assert " random " in header and f" {row['random_return']:.2f} " in shown


@pytest.mark.timeout(600)
def test_evaluate_on_trained_and_held_out_tasks(runs, capsys):
    run = runs["policy_objective"]
    assert evaluate.main([f"run_dir={run}", "num_seeds=3"]) == 0
    out = capsys.readouterr().out
    report = json.loads((run / "evaluation.json").read_text())
    rows = report["tasks"]
    assert [(r["task"], r["split"]) for r in rows] == [
        ("CartPole-v1", "trained-on"), ("Acrobot-v1", "trained-on"), ("Catch-bsuite", "held-out"),
        ("CartPole-v1[total_timesteps=128]", "held-out")]
    baseline = "baseline: PPO clipped objective"
    for r in rows:
        assert r["task"] in out
        if r["sides"][baseline]["mean"] - r["random_return"] > 1e-6:  # the baseline scores 1 by definition
            assert r["normalized"][baseline] == pytest.approx(1.0, abs=1e-6)
    assert set(report["aggregate"]) == {"held-out", "trained-on"}
    held = report["aggregate"]["held-out"]
    # a held-out task whose baseline does not clear random play at this size is flagged and left out
    assert held["tasks"] + len(held["left_out"]) == 2 and 0.0 <= held["probability_of_improvement"] <= 1.0
    assert held["left_out"] == [r["task"] for r in rows[2:] if r["degenerate"]] or held["tasks"] == 2
    low, high = held["iqm_learned_ci95"]
    assert low <= held["iqm_learned"] <= high
    assert "IQM of normalised scores" in out and "P(learned > baseline)" in out
    check_image(run / FIGURES / "evaluation.png", (1100, 420))


@pytest.mark.timeout(600)
def test_evaluate_split_over_two_devices_gives_the_same_agents(runs, evaluated_64):
    run = runs["value_loss"]
    _, one, _ = evaluated_64  # this process has one CPU device
    proc = subprocess.run([sys.executable, "-m", "metarl.evaluate", f"run_dir={run}", "num_seeds=4", "total_timesteps=64",
                           "num_cpu_devices=2"], env=env_vars(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((run / "evaluation_64.json").read_text())
    assert one["devices"] == 1 and two["devices"] == 2
    for label, side in one["tasks"][0]["sides"].items():
        np.testing.assert_allclose(two["tasks"][0]["sides"][label]["final_returns"], side["final_returns"],
                                   rtol=1e-5)


def test_eval_keys_avoid_the_runs_root():
    root, keys = streams.evaluation(streams.EVAL_ROOT, 3)
    assert root != streams.EVAL_ROOT and keys.shape == (3,)
    assert streams.evaluation(0, 3)[0] == streams.EVAL_ROOT


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module, arg, message", [
    ("metarl.evaluate", "num_seeds=abc", "error: num_seeds: 'abc'; allowed: an integer"),
    ("metarl.evaluate", "tasks=CartPole-v1", "error: tasks: 'CartPole-v1'; allowed: a list"),
    ("metarl.evaluate", "typo=1", "error: argument 'typo=1': not a setting of this command; allowed: run_dir=, env="),
    ("metarl.distill", "generation=[1", "error: generation: "),
    ("metarl.distill", "seed=1,2", "error: argument 'seed=1,2': not a setting of this command"),
    ("metarl.inspect", "error_range=wide", "error: error_range: 'wide'; allowed: a number"),
])
def test_the_commands_that_read_a_run_read_values_as_evolve_does(tmp_path, module, arg, message):
    # Hydra's override grammar, checked against the argument's type, before the run directory is read.
    code, _, stderr = run_here(module, [f"run_dir={tmp_path}", arg])
    assert code == 2 and stderr.startswith(message), stderr
    assert len(stderr.strip().splitlines()) == 1
