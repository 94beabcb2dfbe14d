"""A tracker of the tests' own, in one file (tests/test_trackers.py; docs/extending.md): enabled by
``logger.trackers=[dummy_tracker.RecordingTracker]``, it writes what it is sent into its run directory, one JSON
line per call, in a file named after its class."""
import json

from metarl.errors import ConfigError
from metarl.logger import Sink


class RecordingTracker(Sink):
    during_tuning = False   # like wandb and MLflow: the run's generations only, not a tuning's searches

    def __init__(self, section, logger):
        self.path = logger.run_dir / f"{type(self).__name__}.jsonl"
        self.write("start", section=section, experiment=logger.config["experiment"])

    def write(self, event: str, **data) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, **data}) + "\n")

    def log(self, record: dict) -> None:
        self.write("log", **{k: record[k] for k in ("generation", "best", "mean")})

    def finish(self, summary=None, stopped=False) -> None:
        self.write("finish", stopped=stopped)

    @staticmethod
    def check(section) -> None:
        if section is not None:
            raise ConfigError(f"logger.trackers: built with the section {section!r}; allowed: none")


class TuningRecordingTracker(RecordingTracker):
    during_tuning = True   # also a tuning's searches: each writes into its own run directory
