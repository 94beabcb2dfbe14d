"""One run's life in one place: in a tiny run with tuning, each search (the two tunings and the run's own)
builds its evolution once and closes its trackers once. The real classes are counted as they are called."""
import pytest

from clihelp import TINY
from metarl import config as config_lib, run
from metarl.logger import Logger
from metarl.outer_loops.evolution import Evolution
from metarl.rundir import RunDir

TUNE = "baseline.tune={lr: {low: 1.0e-4, high: 1.0e-2, log: true}}"
ARGS = [*[a for a in TINY if not a.startswith("component.hidden")], "tasks=[CartPole-v1]", "es.generations=1",
        "baseline.generations=1", "baseline.tunings=2", "fitness.validation_seeds=2", TUNE]


@pytest.mark.timeout(600)
def test_each_search_builds_its_evolution_once_and_closes_its_logger_once(tmp_path, monkeypatch):
    built, closed = [], []
    build, finish = Evolution.__init__, Logger.finish

    def counted_build(self, *args, **kwargs):
        built.append(self)
        build(self, *args, **kwargs)

    def counted_finish(self, *args, **kwargs):
        closed.append(self.run_dir.name)
        finish(self, *args, **kwargs)

    monkeypatch.setattr(Evolution, "__init__", counted_build)
    monkeypatch.setattr(Logger, "finish", counted_finish)
    cfg = config_lib.load("high_lr_schedule", [*ARGS, f"run_dir={tmp_path / 'run'}"])
    RunDir(tmp_path / "run").write_config(cfg.to_dict())   # as the command line leaves it before the stages
    summary = run.run_stages(cfg, tmp_path / "run", mesh=None)
    assert summary["generations"] == 1 and (tmp_path / "run" / "tuned.json").is_file()
    assert closed == ["tune", "tune-2", "run"]   # each search's trackers, once each, in the order they ran
    assert len(built) == 3                       # one evolution per search; the tunings' rescoring reuses one
