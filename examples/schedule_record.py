"""A `LearnedSchedules` run's exported schedules at a few points of training, as a JSON record beside it:

    python examples/schedule_record.py docs/runs/high_lr_schedule

Writes RUN/schedule.json: for each scheduled field, the multiplier exp(c0 + c1 t + c2 t^2 ...) of the exported
coefficients (best_meta_params.msgpack) at t = 0, 0.5 and 1 (the fraction of training done), and the value it
gives the run's PPO (PPOConfig's default, or the run's config.yaml ``inner``, times the multiplier).
tests/test_docs_records.py checks the record is what this computes today.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import yaml
from flax import serialization

from metarl import rundir
from metarl.inner_loops.ppo import PPOConfig

POINTS = (0.0, 0.5, 1.0)


def schedule(run: Path) -> dict:
    coefficients = serialization.msgpack_restore((run / rundir.BEST_PARAMS).read_bytes())
    inner = yaml.safe_load((run / rundir.CONFIG).read_text())["inner"]
    base = {f.name: inner.get(f.name, f.default) for f in dataclasses.fields(PPOConfig)}
    fields = {}
    for field, c in coefficients.items():
        c = np.asarray(c, dtype=np.float64)
        multiplier = [float(np.exp(c @ t ** np.arange(len(c)))) for t in POINTS]
        fields[field] = {"multiplier": multiplier, "value": [base[field] * x for x in multiplier]}
    return {"t": list(POINTS), "fields": fields}


if __name__ == "__main__":
    for run in map(Path, sys.argv[1:]):
        (run / "schedule.json").write_text(json.dumps(schedule(run), indent=1) + "\n")
        print(f"wrote {run / 'schedule.json'}", file=sys.stderr)
