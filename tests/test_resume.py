"""Checkpoints and resume: a run stopped at any moment continues exactly where it was."""
import shutil
import signal
import time

import jax
import numpy as np
import pytest

from clihelp import TINY, evolve, final_state, records, snapshot, start_evolve

# A little more work per generation than TINY, so that a kill can land inside one.
SLOWER = [a for a in TINY if not a.startswith("inner.total_timesteps")] + ["inner.total_timesteps=2048"]


def assert_same_run(a, b):
    assert records(a) == records(b)
    (sa, ma), (sb, mb) = final_state(a), final_state(b)
    assert ma["generation"] == mb["generation"]
    for x, y in zip(jax.tree.leaves(jax.random.key_data(sa.key)), jax.tree.leaves(jax.random.key_data(sb.key))):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(jax.tree.leaves(sa.es_state), jax.tree.leaves(sb.es_state)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def straight_six(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    evolve(["experiment=value_loss", *TINY, "es.generations=6", f"run_dir={run_dir}"], cwd=run_dir.parent,
           check=True)
    return run_dir


@pytest.mark.timeout(600)
def test_three_then_resume_three_equals_six_straight(tmp_path, straight_six):
    run_dir = tmp_path / "run"
    evolve(["experiment=value_loss", *TINY, "es.generations=3", f"run_dir={run_dir}"], cwd=tmp_path, check=True)
    assert len(records(run_dir)) == 3
    proc = evolve([f"resume={run_dir}", "es.generations=6"], cwd=tmp_path, check=True)
    assert "resuming" in proc.stdout
    assert [r["generation"] for r in records(run_dir)] == list(range(1, 7))
    assert_same_run(run_dir, straight_six)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["SIGTERM"])  # SIGHUP and SIGKILL: test_kill.py
def test_stop_signal_saves_then_exits_with_a_message(tmp_path, sig):
    run_dir = tmp_path / "run"
    args = ["experiment=value_loss", *SLOWER, "es.generations=200", "checkpoint.every=1000",
            f"run_dir={run_dir}"]
    proc = start_evolve(args, cwd=tmp_path)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        time.sleep(0.02)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, stderr
    assert f"stopped by {sig.name} after generation " in stderr and f"resume={run_dir}" in stderr
    _, meta = final_state(run_dir)
    assert meta["generation"] == len(records(run_dir)) >= 1  # saved where it stopped, nothing lost


@pytest.mark.timeout(600)
def test_changed_search_is_refused_and_nothing_is_touched(tmp_path, straight_six):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_six, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    proc = evolve(["experiment=value_loss", *TINY, "es.generations=6", "es.popsize=8", "seed=1",
                   f"run_dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("error: run_dir:") and "es.popsize: 4 -> 8" in line and "seed: 0 -> 1" in line
    assert (run_dir / "metrics.jsonl").read_text() == before
    # Raising the number of generations is allowed.
    proc = evolve([f"resume={run_dir}", "es.generations=7"], cwd=tmp_path, check=True)
    assert len(records(run_dir)) == 7


@pytest.mark.timeout(300)
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, straight_six):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_six, run_dir)
    latest = max(int(p.name) for p in (run_dir / "ckpt").iterdir() if p.name.isdigit())
    for path in (run_dir / "ckpt" / str(latest)).rglob("*"):
        if path.is_file() and "state" in path.parts:
            path.write_bytes(b"garbage")
    before = snapshot(tmp_path)
    # es.generations=8 would rewrite config.yaml: the corruption must be found before that.
    for args in ([f"resume={run_dir}", "es.generations=8"], ["experiment=value_loss", *TINY, f"run_dir={run_dir}"]):
        proc = evolve(args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()
        assert len(line) == 1 and "unreadable" in line[0] and str(latest) in line[0], proc.stderr
        assert snapshot(tmp_path) == before


@pytest.mark.timeout(600)
def test_a_second_process_on_a_run_dir_is_refused_and_the_first_is_undisturbed(tmp_path, straight_six):
    run_dir = tmp_path / "run"
    args = ["experiment=value_loss", *TINY, "es.generations=6", f"run_dir={run_dir}"]
    first = start_evolve(args, cwd=tmp_path)
    # Freeze the first run once it holds the directory (config.yaml is written under the lock), so
    # the second surely arrives while the first is mid-run, whatever this machine's speed.
    deadline = time.time() + 400
    while time.time() < deadline and first.poll() is None and not (run_dir / "config.yaml").exists():
        time.sleep(0.002)
    first.send_signal(signal.SIGSTOP)
    try:
        assert first.poll() is None, "the first run ended before a second could be started"
        before = snapshot(tmp_path)
        second = evolve(args, cwd=tmp_path)  # the same command again
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip().splitlines()
        assert len(line) == 1 and line[0].startswith(f"error: run_dir: {run_dir} is in use by process "
                                                     f"{first.pid} on host "), second.stderr
        assert snapshot(tmp_path) == before  # the refused process touched nothing
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert_same_run(run_dir, straight_six)


@pytest.mark.timeout(600)
def test_exported_best_loads_into_a_fresh_ppo_training(straight_six):
    from metarl.inner_loops.ppo import make_train
    from metarl.results import load_best

    best = load_best(straight_six)
    assert best.kind == "value_loss"
    _, metrics = jax.jit(best.train)(jax.random.key(123))
    assert np.all(np.isfinite(metrics["episode_return"]))
    # The same through the trainer's own API, as a researcher would use it.
    train = jax.jit(make_train(best.inner_config, value_loss=best.component))
    _, metrics2 = train(jax.random.key(123), {"value_loss": best.meta_params})
    np.testing.assert_allclose(metrics["episode_return"], metrics2["episode_return"], rtol=1e-5)


def test_a_run_saved_before_a_setting_was_added_still_counts_as_the_same_search():
    from metarl import config as config_lib

    new = config_lib.load("value_loss", []).to_dict()
    old = {**new, "es": {k: v for k, v in new["es"].items() if k not in ("_target_", "args")}}
    assert config_lib.search_differences(old, new) == []  # absent then, at its empty default now
    changed = {**new, "es": {**new["es"], "_target_": "my_pkg.MyES"}}
    assert config_lib.search_differences(old, changed) == ["es._target_: '<unset>' -> 'my_pkg.MyES'"]
