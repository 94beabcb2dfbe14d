"""experiment=learned_optimiser at a tiny size through the real command lines: it evolves (after tuning Adam's lr),
a run killed mid-way continues to the same result bit for bit, metarl.evaluate compares the three sides,
metarl.inspect draws what was learned, and examples/learned_optimiser.py trains a PPO of one's own with it."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from clihelp import TINY, env_vars, evolve, records, run_module
from test_inspect import check_image
from test_resume import assert_same_run

from metarl.rundir import FIGURES

pytestmark = pytest.mark.timeout(900)

GENS = 3
ARGS = ["experiment=learned_optimiser", *[a for a in TINY if not a.startswith(("component.", "inner.total"))],
        "component.hidden=[4]", "tasks=[{env: CartPole-v1, inner: {total_timesteps: 256}}, Acrobot-v1]",
        "inner.total_timesteps=128", "eval_tasks=[{env: Catch-bsuite, inner: {total_timesteps: 128}}]",
        "fitness.reference_seeds=2", "fitness.validation_top=2", "fitness.validation_seeds=2",
        f"es.generations={GENS}"]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "learned_optimiser.py"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    evolve([*ARGS, f"run_dir={run_dir}"], cwd=run_dir.parent, timeout=600, check=True)
    return run_dir


def test_killed_mid_run_it_continues_to_the_same_result(tmp_path, straight):
    run_dir = tmp_path / "run"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, f"run_dir={run_dir}"], cwd=tmp_path,
                                env=env_vars(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline and not (
                (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 1):
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert len(records(run_dir)) < GENS
    evolve([*ARGS, f"run_dir={run_dir}"], cwd=tmp_path, timeout=600, check=True)
    assert_same_run(run_dir, straight)
    tuned = [{k: v for k, v in json.loads((d / "tuned.json").read_text()).items() if k != "seconds"}
             for d in (run_dir, straight)]
    assert tuned[0] == tuned[1]


def test_evaluate_inspect_and_the_library_example(straight, tmp_path):
    run_module("metarl.evaluate", [f"run_dir={straight}", "num_seeds=2", "num_cpu_devices=1"], tmp_path, 600, True)
    report = json.loads((straight / "evaluation.json").read_text())
    assert report["kind"] == "optimiser"
    roles = {side["role"]: side["label"] for side in report["sides"]}
    assert set(roles) == {"learned", "baseline", "configured"}
    assert roles["learned"] == "learned optimiser"
    assert roles["configured"] == "baseline as configured: Adam, lr 0.00025 annealed"
    tuned_lr = json.loads((straight / "tuned.json").read_text())["hyperparameters"]["lr"]
    assert roles["baseline"] == f"tuned baseline: Adam, lr {tuned_lr:g} annealed"
    assert [row["task"] for row in report["tasks"]][-1].startswith("Catch-bsuite")
    for row in report["tasks"]:
        assert set(row["sides"]) == set(roles.values())

    out = run_module("metarl.inspect", [f"run_dir={straight}"], tmp_path, 600, True).stdout.split()
    names = {Path(p).name for p in out}
    assert {"optimiser_update.png", "optimiser_step_size.png", "fitness.png"} <= names
    check_image(straight / FIGURES / "optimiser_update.png", (1650, 480))
    check_image(straight / FIGURES / "optimiser_step_size.png", (1100, 480))

    proc = subprocess.run([sys.executable, str(EXAMPLE), str(straight), "--timesteps", "512", "--seeds", "2"],
                          cwd=tmp_path, env=env_vars(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert len(result["learned_optimiser"]) == len(result["adam"]) == 2
    assert np.isfinite(result["learned_optimiser"]).all() and np.isfinite(result["adam"]).all()
    # the run's component with its settings (a few generations from Adam move it too little to tell them apart)
    assert result["optimiser"].startswith("LearnedOptimiser(hidden=(4,), stochastic=True, residual=True")
