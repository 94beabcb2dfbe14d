"""benchmarks/jax_deadlock_check.py at its smallest: one run of one tiny training, and its JSON (slow: a
fresh process compiles PPO)."""
import json
import os
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_one_run_reports_this_jax_and_a_finished_run():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.jax_deadlock_check", "--runs", "1",
         "--seeds", "1", "--total-timesteps", "512", "--compile", "metarl", "--timeout", "60",
         "--compile-timeout", "240"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT).stdout
    result = json.loads(out)
    assert result["jax"] == jax.__version__ and result["python"] == sys.executable
    assert (result["runs"], result["hangs"], result["errors"]) == (1, 0, 0)
    assert result["per_run"][0]["status"] == "ok" and result["frames_per_s_median"] > 0
    assert result["compile_s_median"] > 0 and result["xla_flags"] == ""
    assert len(result["loadavg_before"]) == 3 and len(result["loadavg_after"]) == 3
