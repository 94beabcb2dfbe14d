"""Checkpoints and resume: a run stopped at any moment continues exactly where it was."""
import shutil
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from clihelp import TINY, evolve, final_state, records, run_module, snapshot, start_evolve

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


def straight(tmp_path_factory, name: str, settings: list[str]) -> Path:
    """A six-generation run, straight through, to compare resumed ones with."""
    run_dir = tmp_path_factory.mktemp(name) / "run"
    evolve(["experiment=value_loss", *settings, "es.generations=6", f"run_dir={run_dir}"], cwd=run_dir.parent,
           check=True)
    return run_dir


@pytest.fixture(scope="module")
def straight_six(tmp_path_factory):
    return straight(tmp_path_factory, "straight", TINY)


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


# Leaves over 1 KiB, which Orbax writes out of line into data files that nothing but the digest checks (smaller
# ones sit in the b-tree's nodes, which tensorstore checksums).
WIDE = [a for a in TINY if not a.startswith("component.")] + ["component.hidden=[64,64]"]


@pytest.fixture(scope="module")
def straight_wide(tmp_path_factory):
    return straight(tmp_path_factory, "wide", WIDE)


def data_files(step: Path) -> list[Path]:
    return [p for p in (step / "state").rglob("*") if p.is_file() and p.parent.name == "d"]


def truncate(step: Path):  # every data file cut to half its size, as a full disk leaves them
    for path in data_files(step):
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def flip(step: Path):  # four bytes inverted in the largest data file: corruption that no file format notices
    path = max(data_files(step), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 4])
    path.write_bytes(bytes(data))


def damaged_copy(tmp_path: Path, run: Path, *flipped: str) -> Path:
    """A copy of ``run`` whose ckpt/6 is truncated and whose ``flipped`` checkpoints carry flipped bytes."""
    shutil.copytree(run, tmp_path / "run")
    ckpt = tmp_path / "run" / "ckpt"
    truncate(ckpt / "6")
    for step in flipped:
        flip(ckpt / step)
    return tmp_path / "run"


@pytest.mark.timeout(600)
def test_damaged_checkpoints_are_skipped_kept_aside_and_the_rerun_is_bit_identical(tmp_path, straight_wide):
    run_dir = damaged_copy(tmp_path, straight_wide, "5")
    ckpt = run_dir / "ckpt"
    damaged = {step: snapshot(ckpt / step) for step in ("5", "6")}
    skipped = (f"skipped damaged checkpoint(s) {ckpt / '6'} (truncated file), {ckpt / '5'} (digest mismatch); "
               "from generation 4")
    proc = run_module("metarl.inspect", [f"run_dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0 and f"note: {skipped}" in proc.stderr.splitlines(), proc.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == ["4", "5", "6"]  # a reader sets nothing aside
    proc = evolve([f"resume={run_dir}"], cwd=tmp_path, check=True)
    assert [line for line in proc.stdout.splitlines() if "skipped" in line] == [
        f"{skipped}; set aside as 5.damaged, 6.damaged"], proc.stdout
    assert {step: snapshot(ckpt / f"{step}.damaged") for step in ("5", "6")} == damaged  # kept as they were
    assert_same_run(run_dir, straight_wide)  # generations 1 to 6 once each, the re-run ones identical


@pytest.mark.timeout(600)
def test_no_readable_checkpoint_is_one_line_and_exit_2_with_nothing_deleted(tmp_path, straight_wide):
    run_dir = damaged_copy(tmp_path, straight_wide, "5", "4")
    ckpt = run_dir / "ckpt"
    before = snapshot(run_dir)
    for module, args in (("metarl.evolve", [f"resume={run_dir}", "es.generations=8"]),
                         ("metarl.inspect", [f"run_dir={run_dir}"])):
        proc = run_module(module, args, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines == [
            f"error: {ckpt}: none of 3 checkpoints readable (6: truncated file); start afresh with another "
            "run_dir= or restore a copy"], proc.stderr
        assert len(lines[0]) < 200
        after = snapshot(run_dir)
        assert {path: after.get(path) for path in before} == before  # nothing deleted or changed
        assert set(after) - set(before) == {"checkpoint_errors.log"}
    log = (run_dir / "checkpoint_errors.log").read_text()
    assert log.count("Traceback") == 6 and "OUT_OF_RANGE" in log and "DIGEST" in log  # the full errors, twice


# A generation that hangs: a callback of the plug-in loss sleeps once metrics.jsonl holds 2 generations.
STALLING = ["--config-dir", str(Path(__file__).resolve().parents[1] / "examples" / "experiments"),
            "experiment=huber_value_loss", "component._target_=plugins.StallingHuberValueLoss",
            *[a for a in TINY if not a.startswith("component.")], "es.generations=4", "watchdog.min_seconds=5"]


@pytest.mark.slow  # three runs, about 40 s: every CLI test of the default suite arms the watchdog all the same
@pytest.mark.timeout(600)
def test_a_stalled_generation_ends_the_run_with_every_stack_and_a_resume_equals_a_straight_run(tmp_path):
    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    evolve([*STALLING, f"run_dir={straight}"], cwd=tmp_path, check=True)
    proc = evolve([*STALLING, f"run_dir={run_dir}"], cwd=tmp_path,
                  extra_env={"METARL_TEST_STALL": f"{run_dir / 'metrics.jsonl'}:2"})
    assert proc.returncode == 75, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: generation 3 still running after 5 s, over 10x the longest before it: stopped; every thread's "
        f"stack is in {run_dir / 'stacks.txt'}. Continue with: python -m metarl.evolve resume={run_dir}"]
    stacks = (run_dir / "stacks.txt").read_text()
    assert stacks.count("hread 0x") >= 2 and "in _stall_when_due" in stacks and "in search" in stacks  # the callback
    assert len(records(run_dir)) == 2
    evolve([f"resume={run_dir}"], cwd=tmp_path, check=True)
    assert_same_run(run_dir, straight)
