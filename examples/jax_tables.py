"""Renders docs/studies/speed.md's two jax-release tables from their benchmark records:

    python examples/jax_tables.py

prints the `benchmarks.jax_deadlock_check` table (benchmarks/results/jax_deadlock_check_2core.json: its
batches at the default settings that ran, grouped by Python and jax; frames/s and compile seconds are the
range of the batches' medians) and the `benchmarks.jax_releases` one
(benchmarks/results/jax_releases_2core.json).
tests/test_docs_records.py checks the page holds what this renders today.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _span(values: list[float], fmt) -> str:
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def _k(frames: float) -> str:
    return f"{frames / 1000:.3g}k"


def _median_compile(batch: dict) -> float | None:
    seconds = [r["compile_s"] for r in batch.get("per_run", []) if "compile_s" in r]
    return statistics.median(seconds) if seconds else None


def deadlock_table(record: dict) -> str:
    groups: dict[tuple, list] = {}
    for batch in record["batches"]:
        if batch.get("errors") or "settings" in batch:
            continue
        # the batches from before the record noted python ran 3.11
        python = ".".join(batch.get("python", "3.11").split(".")[:2])
        groups.setdefault((python, batch["jax"]), []).append(batch)
    rows = ["| Python | jax | runs | hangs | frames/s | compile s |", "| --- | --- | --- | --- | --- | --- |"]
    for (python, jax), batches in groups.items():
        fps = [b["frames_per_s_median"] / 1000 for b in batches if "frames_per_s_median" in b]
        compile_s = [b["compile_s_median"] if "compile_s_median" in b else _median_compile(b) for b in batches]
        compile_s = [c for c in compile_s if c is not None]
        runs, hangs = sum(b["runs"] for b in batches), sum(b["hangs"] for b in batches)
        rows.append(f"| {python} | {jax} | {runs} | {hangs} | {_span(fps, lambda x: f'{x:.0f}')}k | "
                    f"{_span(compile_s, lambda x: f'{x:.1f}')} |")
    return "\n".join(rows)


def releases_table(record: dict) -> str:
    rows = ["| Python | jax | PPO frames/s, 1 / 8 / 32 agents | main line wall | its compile | "
            "best fitness, gen 1 / 20 |", "| --- | --- | --- | --- | --- | --- |"]
    for release in record["releases"]:
        ppo = release["ppo_throughput"][0]["metarl"]
        main = release["main_line"][0]
        best = {generation: max(fitness) for generation, fitness in main["history"]}
        python = ".".join(release["python_version"].split(".")[:2])
        frames = " / ".join(_k(ppo[agents]["frames_per_s"]) for agents in ("1", "8", "32"))
        rows.append(f"| {python} | {release['jax']} | {frames} | {main['wall_s']:.0f} s | {main['compile_s']:.1f} s | "
                    f"{best[1]:.1f} / {best[max(best)]:.1f} |")
    return "\n".join(rows)


def tables() -> list[str]:
    return [deadlock_table(json.loads((RESULTS / "jax_deadlock_check_2core.json").read_text())),
            releases_table(json.loads((RESULTS / "jax_releases_2core.json").read_text()))]


if __name__ == "__main__":
    print("\n\n".join(tables()))
