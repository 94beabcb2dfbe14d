"""The signal figures the studies quote, computed from the runs' records into docs/studies/signal/signal.json:

    python examples/signal_record.py

- ``searches``: per shipped search, from its metrics.jsonl, ``signal`` per generation (re-estimated where the
  run recorded a seed noise that also counted the paired control's: that noise halved, as metarl estimates it
  now), with its median (of all generations and of each half), extremes and the generations with none, and
  above each bar of ``above`` (``recorded``: the same of the signal as the run recorded it); ``update_signal``'s
  median (all, each half), first and last;
- ``shared_luck``: the correlation of the learned and the tuned side's final returns on the shared seeds of
  four paired evaluations, per task pair: count, mean, extremes, and sqrt(2 (1 - mean)), the spread of a
  margin over the control per seed relative to a member's.

tests/test_docs_records.py checks the record is what this computes today.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from metarl import rundir

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "studies" / "signal" / "signal.json"
# run: whether its metrics.jsonl counted the control's seed noise too (recorded before metarl halved it)
SEARCHES = {"high_lr_schedule": False, "horizon_cpu": False, "tuned_schedule_h100": True,
            "adaptive_schedule_h100": True, "adaptive_schedule_narrow_h100": True, "tuned_value_loss_h100": True,
            "tuned_drift_h100": True}
# the bars the generations are counted above
ABOVE = (0.2, 0.5)
EVALUATIONS = ["adaptive_schedule_h100/evaluation.json", "adaptive_schedule_narrow_h100/evaluation.json",
               "adaptive_schedule_narrow_h100/evaluation_cpu.json", "tuned_drift_h100/evaluation.json"]


def search(run: str, halve: bool) -> dict:
    rows = [json.loads(line) for line in (ROOT / "docs" / "runs" / run / rundir.METRICS).read_text().splitlines()]
    noise = np.array([r["seed_noise"] for r in rows]) / (2 if halve else 1)
    between = np.array([r["signal_between"] for r in rows])
    signal = np.maximum(0.0, between - noise) / between
    update = np.array([r["update_signal"] for r in rows])
    half = len(rows) // 2
    recorded = np.array([r["signal"] for r in rows])
    return {"generations": len(rows), "signal": signal.tolist(), "median": float(np.median(signal)),
            "median_first_half": float(np.median(signal[:half])), "median_second_half": float(np.median(signal[half:])),
            "min": float(signal.min()), "max": float(signal.max()), "none": int(np.sum(signal == 0)),
            "above": [int(np.sum(signal > bar)) for bar in ABOVE],
            "update_median": float(np.median(update)), "update_median_first_half": float(np.median(update[:half])),
            "update_median_second_half": float(np.median(update[half:])), "update_first": float(update[0]),
            "update_last": float(update[-1]), "recorded": {"none": int(np.sum(recorded == 0)), "median": float(
                np.median(recorded)), "above": [int(np.sum(recorded > bar)) for bar in ABOVE]}}


def shared_luck() -> dict:
    correlations = []
    for path in EVALUATIONS:
        report = json.loads((ROOT / "docs" / "runs" / path).read_text())
        role = {side["label"]: side["role"] for side in report["sides"]}
        for task in report["tasks"]:
            returns = {role[label]: side["final_returns"] for label, side in task["sides"].items()}
            correlations.append(float(np.corrcoef(returns["learned"], returns["baseline"])[0, 1]))
    mean = float(np.mean(correlations))
    return {"pairs": len(correlations), "correlations": correlations, "mean": mean, "min": min(correlations),
            "max": max(correlations), "margin_spread": float(np.sqrt(2 * (1 - mean)))}


def record() -> dict:
    return {"above": list(ABOVE), "searches": {run: search(run, halve) for run, halve in SEARCHES.items()},
            "shared_luck": shared_luck()}


if __name__ == "__main__":
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}", file=sys.stderr)
