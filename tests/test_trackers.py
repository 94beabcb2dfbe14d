"""A tracker of one's own (``logger.trackers``, tests/dummy_tracker.py), through the real command line at tiny
sizes: it gets every generation's record and is closed once, is left out of a tuning's searches unless it asks to
run there, and a path that names no ``Sink`` subclass is one line, exit code 2."""
import json

import pytest

from clihelp import TINY, evolve, run_here

TUNE = "baseline.tune={lr: {low: 1.0e-4, high: 1.0e-2, log: true}}"
ARGS = ["experiment=high_lr_schedule", *[a for a in TINY if not a.startswith("component.hidden")],
        "tasks=[CartPole-v1]", "es.generations=2", "baseline.generations=2", "baseline.tunings=1", TUNE,
        "logger.trackers=[dummy_tracker.RecordingTracker,dummy_tracker.TuningRecordingTracker]"]


def events(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(600)
def test_a_tracker_of_ones_own_gets_every_generation_and_is_closed_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = evolve([*ARGS, f"run_dir={run_dir}"], cwd=tmp_path, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in metrics] == [1, 2]
    for name in ("RecordingTracker", "TuningRecordingTracker"):
        found = sorted(tmp_path.rglob(f"{name}.jsonl"))
        run = events(run_dir / f"{name}.jsonl")
        assert run[0] == {"event": "start", "section": None, "experiment": "high_lr_schedule"}
        assert run[1:-1] == [{"event": "log", **{k: r[k] for k in ("generation", "best", "mean")}} for r in metrics]
        assert run[-1] == {"event": "finish", "stopped": False}
        tunings = [path for path in found if path.parent != run_dir]
        if name == "RecordingTracker":   # during_tuning = False: never started for a tuning's search
            assert tunings == [], tunings
        else:   # the control: the same tracker asking to run there is started for the search, and closed once
            assert len(tunings) == 1, found
            tuning = events(tunings[0])
            assert [e["event"] for e in tuning] == ["start", "log", "log", "finish"]   # baseline.generations=2


@pytest.mark.parametrize("path, problem", [
    ("dummy_tracker.Missing", "dummy_tracker has no Missing"),
    ("json.dumps", "json.dumps is a function, not a Sink subclass"),
])
def test_a_path_that_names_no_tracker_is_one_line_naming_the_field(tmp_path, path, problem):
    code, out, err = run_here("metarl.evolve", ["experiment=value_loss", *TINY, f"run_dir={tmp_path / 'run'}",
                                                f"logger.trackers=[{path}]"], cwd=tmp_path)
    assert code == 2, (out, err)
    line = err.strip()
    assert line.startswith("error: logger.trackers: ") and problem in line and "; allowed: " in line, line
    assert "\n" not in line and not (tmp_path / "run").exists()
