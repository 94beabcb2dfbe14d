"""Re-states stored evaluations' statistics from their per-seed final returns, without training again:

    python examples/restate.py EVALUATION.json [...]

Each JSON (a ``metarl.evaluate`` report, such as the records under docs/runs/) gets the statistics today's
``metarl.evaluate`` computes (``metarl.evaluate.restate``), written back in place; its figures' paths are kept.
Prints each report as the command prints it. A headroom study is re-stated by ``examples/headroom.py --restate``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


# Older records name no roles: their labels' beginnings do.
ROLES = (("learned", "learned"), ("formula", "formula"), ("tuned per task", "per_task"),
         ("baseline as configured", "configured"), ("tuned baseline", "baseline"), ("baseline", "baseline"))


def restate(path: Path) -> dict:
    from metarl import evaluate

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
        print(format_report(restate(path)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
