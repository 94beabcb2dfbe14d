"""Re-states stored evaluations' statistics from their per-seed final returns, without training again:

    python examples/restate.py EVALUATION.json [...]

Each JSON (a ``metarl.evaluate`` report, such as the records under docs/runs/) gets the statistics today's
``metarl.evaluate`` computes (``metarl.evaluate.restate``), written back in place; its figures' paths are kept.
Prints each report as the command prints it. A headroom study is re-stated by ``examples/headroom.py --restate``.
A pick's record (``validation.json``) or a slice's (``slice_NAME.json``) older than its interval adjusted for the
choice gets it, from its 95% t-interval (mean and standard error are recoverable from it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


# Older records name no roles: their labels' beginnings do.
ROLES = (("learned", "learned"), ("formula", "formula"), ("tuned per task", "per_task"),
         ("baseline as configured", "configured"), ("tuned baseline", "baseline"), ("baseline", "baseline"))


def widened(ci: list, mean: float, seeds: int, k: int) -> list:
    """A 95% t-interval widened to the best of ``k`` (Bonferroni: 1 - 0.05 / k) on the same ``seeds``."""
    from scipy import stats

    half = (ci[1] - ci[0]) / 2 * stats.t.ppf(1 - 0.025 / k, seeds - 1) / stats.t.ppf(0.975, seeds - 1)
    return [mean - half, mean + half]


def adjust_pick(path: Path) -> dict:
    """validation.json with each candidate's ``validation_ci95_best_of``, or a slice (examples/slice.py) with
    each value's ``ci_best_of``: its t-interval at 1 - 0.05 / candidates."""
    record = json.loads(path.read_text())
    if "slice" in record:
        for row in record["slice"]:
            row.setdefault("ci_best_of", widened(row["ci95"], row["fitness"], record["seeds"], len(record["slice"])))
        path.write_text(json.dumps(record, indent=1) + "\n")
        return record
    for row in record["candidates"]:
        row.setdefault("validation_ci95_best_of", widened(row["validation_ci95"], row["validation_fitness"],
                                                          record["seeds"], len(record["candidates"])))
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def restate(path: Path) -> dict:
    from metarl import evaluate

    if path.name == "validation.json" or path.name.startswith("slice_"):
        return adjust_pick(path)
    report = json.loads(path.read_text())
    report.setdefault("sides", [{"label": label, "role": next(r for start, r in ROLES if label.startswith(start))}
                                for label in report["tasks"][0]["sides"]])
    figure = (report.get("payoff") or {}).get("figure")
    evaluate.restate(report)
    if report.get("payoff") and figure:
        report["payoff"]["figure"] = figure
    report.setdefault("json", str(path))
    path.write_text(json.dumps(report, indent=2, default=float) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    from metarl.report import format_report

    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths or any(not p.is_file() for p in paths):
        print("error: EVALUATION.json: missing or not a file; allowed: one or more evaluation reports",
              file=sys.stderr)
        return 2
    for path in paths:
        record = restate(path)
        print(format_report(record) + "\n" if "tasks" in record else f"{path}: the adjusted intervals added")
    return 0


if __name__ == "__main__":
    sys.exit(main())
