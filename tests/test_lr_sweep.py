"""examples/lr_sweep.py: PPO at several learning rates beside a run's learned part, on the run's evaluation
seeds, at a tiny size through the real command lines."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clihelp import TINY, env_vars, evolve, run_module

pytestmark = pytest.mark.timeout(900)

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "lr_sweep.py"
ARGS = ["experiment=high_lr_schedule", *[a for a in TINY if not a.startswith(("component.", "inner.total_timesteps"))],
        "tasks=[{env: CartPole-v1, inner: {total_timesteps: 64}}]",
        "eval_tasks=[{env: Acrobot-v1, inner: {total_timesteps: 64}}]",
        "fitness.reference_seeds=2", "es.generations=1"]


def test_the_sweep_trains_ppo_at_each_rate_on_the_evaluations_seeds(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "sweep"
    assert evolve([*ARGS, f"run_dir={run_dir}"], cwd=tmp_path, timeout=600).returncode == 0
    run_module("metarl.evaluate", [f"run_dir={run_dir}", "num_seeds=4", "num_cpu_devices=1"], tmp_path, 600, True)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), str(out), "--seeds", "2",
                           "--lrs", "2.5e-4,1e-2"], cwd=tmp_path, env=env_vars(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "lr_sweep.json").read_text())
    report = json.loads((run_dir / "evaluation.json").read_text())
    assert np.allclose(result["lrs"], [2.5e-4, 1e-2], rtol=1e-5)
    assert [row["task"] for row in result["tasks"]] == [row["task"] for row in report["tasks"]]
    for row, evaluated in zip(result["tasks"], report["tasks"]):
        assert [len(p["final_returns"]) for p in row["ppo"]] == [2, 2]
        # At the run's own rate (float32 through the hyperparameter space), PPO on the evaluation's first two seeds
        # is the evaluation's baseline on them.
        baseline = next(s["label"] for s in report["sides"] if s["role"] == "baseline")
        np.testing.assert_allclose(row["ppo"][0]["final_returns"], evaluated["sides"][baseline]["final_returns"][:2],
                                   rtol=1e-3)
    for by_lr in result["by_lr"]:
        low, high = by_lr["learned_iqm_ci95"]
        assert low <= by_lr["learned_iqm"] <= high
    assert "| learned, IQM normalised by that PPO |" in (out / "lr_sweep.md").read_text()
    bad = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), str(out), "--lrs", "0"], env=env_vars(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--lrs: a comma-separated list of positive numbers" in bad.stderr
