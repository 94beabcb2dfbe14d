"""The headroom study (docs/studies/headroom.md): on task x budget pairs that no shipped search trains on, the
single PPO configuration tuned on a run's trained-on tasks against PPO tuned on each pair (``metarl.evaluate
per_task=...``: random search over the run's ``baseline.tune`` ranges, k = 16 and 64 trainings, 256 where cheap,
3 tunings each), and the run's learned part beside them, on 16 fresh seeds per side.

    python examples/headroom.py RUN_DIR OUT_DIR [--pairs N]

Each pair is one ``metarl.evaluate`` call writing its report into RUN_DIR (its tunings kept in
RUN_DIR/per_task_tuning.json); OUT_DIR gets ``headroom.json`` (a row per pair), ``headroom.md`` (the table) and
``headroom.png``. Run again after a kill: finished pairs are read back, the pair that was running continues from
its finished tunings. ``--pairs N`` stops after the first N pairs (cheapest first).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# (env, frames, other inner settings, k values), cheapest first. 16k is a quarter of the trained-on budget,
# 262k four times it; 1M frames with 64 environments per agent (244 updates) is the longest.
PAIRS = [
    ("Catch-bsuite", 4096, {}, (16, 64, 256)),
    ("CartPole-v1", 16384, {}, (16, 64, 256)),
    ("Acrobot-v1", 16384, {}, (16, 64, 256)),
    ("DeepSea-bsuite", 16384, {}, (16, 64, 256)),
    ("FourRooms-misc", 65536, {}, (16, 64, 256)),
    ("Breakout-MinAtar", 16384, {}, (16, 64, 256)),
    ("SpaceInvaders-MinAtar", 16384, {}, (16, 64, 256)),
    ("Freeway-MinAtar", 65536, {}, (16, 64)),
    ("Asterix-MinAtar", 65536, {}, (16, 64)),
    ("Breakout-MinAtar", 262144, {}, (16, 64)),
    ("SpaceInvaders-MinAtar", 262144, {}, (16, 64)),
    ("Breakout-MinAtar", 1048576, {"num_envs": 64}, (16,)),
]
SEEDS, TUNINGS, SEEDS_PER_SETTING, GAIN = 16, 3, 2, 0.15


def pair_name(env: str, frames: int, inner: dict) -> str:
    return f"{env}@{frames // 1024}k" + "".join(f",{k}={v}" for k, v in inner.items())


def gain(row: dict, label: str, baseline: str) -> dict:
    """``label``'s mean final return over the baseline's, in units of the baseline's margin over random play,
    with a Welch 95% interval (the sides share evaluation seeds; unpaired is the conservative test)."""
    from scipy import stats

    from metarl.outer_loops.fitness import spans

    a, b = (np.asarray(row["sides"][s]["final_returns"], float) for s in (label, baseline))
    span = float(spans({"base": [row["sides"][baseline]["mean"]], "low": [row["random_return"]]})[0])
    low, high = stats.ttest_ind(a, b, equal_var=False).confidence_interval()
    return {"gain": float((a.mean() - b.mean()) / span), "ci95": [float(low / span), float(high / span)]}


def summarise(report: dict, seconds: float) -> dict:
    row = report["tasks"][0]
    roles = {side["role"]: side["label"] for side in report["sides"]}
    base = roles["baseline"]
    per_task = {str(k): {**gain(row, f"tuned per task at k={k}", base),
                         "mean": row["sides"][f"tuned per task at k={k}"]["mean"],
                         "tunings": [t["hyperparameters"] for t in row["per_task"][str(k)]]}
                for k in report["per_task"]["ks"]}
    return {"task": row["task"], "tuned_once": row["sides"][base]["mean"], "tuned_once_ci95": row["sides"][base]["ci95"],
            "random": row["random_return"], "learned": gain(row, roles["learned"], base) if "learned" in roles else None,
            "configured": gain(row, roles["configured"], base), "per_task": per_task, "seconds": seconds,
            "report": report["json"]}


def table(rows: dict) -> str:
    """The study's table in Markdown: gains over the single tuned configuration, normalised by its margin."""
    ci = lambda g: f"{g['gain']:+.2f} [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]" if g else "-"  # noqa: E731
    learned = any(r["learned"] for r in rows.values())   # records without an exported part have none
    lines = ["| pair | tuned once (random play) | per task k=16 | k=64 | k=256 |" + " learned |" * learned
             + " as configured | minutes |", "| --- " * (7 + learned) + "|"]
    for name, r in rows.items():
        cells = [ci(r["per_task"][k]) if k in r["per_task"] else "" for k in ("16", "64", "256")]
        cells += [ci(r["learned"])] * learned + [ci(r["configured"]), f"{r['seconds'] / 60:.1f}"]
        lines.append(f"| {name} | {r['tuned_once']:.3g} ({r['random']:.3g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(named: dict, path: Path) -> None:
    from metarl import plots

    fig = plots.new_figure(11, 4.2, "gain over the single tuned configuration, in units of its margin over random "
                                    "play (95% CI over 16 seeds)")
    ax = fig.add_subplot()
    rows = list(named.values())
    x = np.arange(len(rows))
    series = [("per task k=16", "16", "tab:olive"), ("per task k=64", "64", "tab:green"),
              ("per task k=256", "256", "darkgreen")]
    for offset, (label, k, colour) in zip((-0.2, -0.07, 0.06), series):
        shown = [(i, r["per_task"][k]) for i, r in enumerate(rows) if k in r["per_task"]]
        if shown:
            g = np.array([s["gain"] for _, s in shown])
            lo, hi = np.array([s["ci95"] for _, s in shown]).T
            ax.errorbar(np.array([i for i, _ in shown]) + offset, g, yerr=[g - lo, hi - g], fmt="o", color=colour,
                        capsize=3, label=label)
    learned = [(i, r["learned"]) for i, r in enumerate(rows) if r["learned"]]
    if learned:
        g = np.array([s["gain"] for _, s in learned])
        lo, hi = np.array([s["ci95"] for _, s in learned]).T
        ax.errorbar(np.array([i for i, _ in learned]) + 0.19, g, yerr=[g - lo, hi - g], fmt="s", color=plots.LEARNED,
                    capsize=3, label="learned part")
    ax.axhline(0, color=plots.BASELINE, lw=1, label="the single tuned configuration")
    ax.axhline(GAIN, color="0.5", lw=0.8, ls="--", label=f"+{GAIN} (the study's bar)")
    ax.set_xticks(x, list(named), fontsize=7, rotation=25, ha="right")
    ax.set_ylabel("normalised gain")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    plots.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--pairs", type=int, default=len(PAIRS))
    args = parser.parse_args(argv)
    from metarl import evaluate

    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = args.out_dir / "headroom.json"
    done = json.loads(summary_path.read_text())["pairs"] if summary_path.exists() else {}
    for i, (env, frames, inner, ks) in enumerate(PAIRS[:args.pairs]):
        name = pair_name(env, frames, inner)
        if name in done:
            continue
        print(f"headroom: pair {i + 1}/{args.pairs}: {name}, k = {list(ks)}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        report = evaluate.evaluate(args.run_dir, num_seeds=SEEDS, per_task=list(ks), per_task_tunings=TUNINGS,
                                   per_task_seeds=SEEDS_PER_SETTING,
                                   tasks=[{"env": env, "inner": {"total_timesteps": frames, **inner}}])
        done[name] = summarise(report, time.perf_counter() - t)
        summary = {"run_dir": str(args.run_dir), "seeds": SEEDS, "tunings": TUNINGS,
                   "seeds_per_setting": SEEDS_PER_SETTING, "bar": GAIN, "pairs": done}
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")   # after every pair: a kill loses none
        print(f"headroom: {name} took {done[name]['seconds'] / 60:.1f} min: " + ", ".join(
            f"k={k} {g['gain']:+.2f}" for k, g in done[name]["per_task"].items()), file=sys.stderr, flush=True)
    rows = list(done.values())
    (args.out_dir / "headroom.md").write_text(table(done) + "\n")
    figure(done, args.out_dir / "headroom.png")
    wins = [r["task"] for r in rows if any(g["gain"] >= GAIN and g["ci95"][0] > 0 for g in r["per_task"].values())]
    print(table(done))
    print(f"per-task tuning beats the single tuned configuration by >= {GAIN} (interval above 0) on {len(wins)} of "
          f"{len(rows)} pairs: {', '.join(wins) or 'none'}; {sum(r['seconds'] for r in rows) / 60:.0f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
