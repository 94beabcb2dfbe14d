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
# Every per-task gain is one test of the family the study's claim rests on (a pair wins if any k does):
# its interval is at 1 - 0.05 / FAMILY (Bonferroni), enough bootstrap draws for that tail.
FAMILY, REPS = sum(len(ks) for *_, ks in PAIRS), 20_000


def pair_name(env: str, frames: int, inner: dict) -> str:
    return f"{env}@{frames // 1024}k" + "".join(f",{k}={v}" for k, v in inner.items())


def resampled_means(a: np.ndarray, tunings: int, rng: np.random.RandomState) -> np.ndarray:
    """REPS bootstrap means of ``a`` with its tunings as clusters (seed i trained with tuning i % tunings): the
    tunings drawn with replacement, then seeds within each drawn one (a side tuned once: ``tunings=1``)."""
    groups = [a[j::tunings] for j in range(tunings)]
    sums = np.stack([g[rng.randint(len(g), size=(REPS, tunings, len(g)))].sum(-1) for g in groups], axis=-1)
    picked = rng.randint(tunings, size=(REPS, tunings))
    sizes = np.array([len(g) for g in groups])
    return np.take_along_axis(sums, picked[..., None], -1)[..., 0].sum(1) / sizes[picked].sum(1)


def gain(row: dict, label: str, baseline: str, tunings: int = 1) -> dict:
    """``label``'s mean final return over the baseline's, in units of the baseline's margin over random play, with
    bootstrap intervals at 95% and at the family's level: ``label``'s seeds resampled by tuning (``resampled_means``),
    the baseline's seeds on their own (unpaired: clusters break the pairing), its mean renormalising in each draw."""
    from metarl.outer_loops.fitness import spans

    a, b = (np.asarray(row["sides"][s]["final_returns"], float) for s in (label, baseline))
    rng, random = np.random.RandomState(0), row["random_return"]
    span = lambda base: np.asarray(spans({"base": base, "low": np.full(np.shape(base), random)}), float)  # noqa: E731
    base = resampled_means(b, 1, rng)
    draws = (resampled_means(a, tunings, rng) - base) / span(base)
    ci = lambda level: np.percentile(draws, [50 - 50 * level, 50 + 50 * level]).tolist()  # noqa: E731
    return {"gain": float((a.mean() - b.mean()) / span([b.mean()])[0]), "ci95": ci(0.95),
            "ci_family": ci(1 - 0.05 / FAMILY)}


def summarise(report: dict, seconds: float) -> dict:
    row = report["tasks"][0]
    roles = {side["role"]: side["label"] for side in report["sides"]}
    base, tunings = roles["baseline"], report["per_task"]["tunings"]
    per_task = {str(k): {**gain(row, f"tuned per task at k={k}", base, tunings),
                         "mean": row["sides"][f"tuned per task at k={k}"]["mean"],
                         "tunings": [t["hyperparameters"] for t in row["per_task"][str(k)]]}
                for k in report["per_task"]["ks"]}
    return {"task": row["task"], "tuned_once": row["sides"][base]["mean"], "tuned_once_ci95": row["sides"][base]["ci95"],
            "random": row["random_return"], "flagged": row["degenerate"],
            "learned": gain(row, roles["learned"], base) if "learned" in roles else None,
            "configured": gain(row, roles["configured"], base), "per_task": per_task, "seconds": seconds,
            "report": report["json"]}


def table(rows: dict) -> str:
    """The study's table in Markdown: gains over the single tuned configuration, normalised by its margin, with
    the family-adjusted interval for per-task tuning and 95% for the rest; a flagged pair marked."""
    ci = lambda g, key="ci95": f"{g['gain']:+.2f} [{g[key][0]:+.2f}, {g[key][1]:+.2f}]" if g else "-"  # noqa: E731
    learned = any(r["learned"] for r in rows.values())   # records without an exported part have none
    lines = ["| pair | tuned once (random play) | per task k=16 | k=64 | k=256 |" + " learned |" * learned
             + " as configured | minutes |", "| --- " * (7 + learned) + "|"]
    for name, r in rows.items():
        cells = [ci(r["per_task"][k], "ci_family") if k in r["per_task"] else "" for k in ("16", "64", "256")]
        cells += [ci(r["learned"])] * learned + [ci(r["configured"]), f"{r['seconds'] / 60:.1f}"]
        flag = " (flagged: does not clear random play)" if r.get("flagged") else ""
        lines.append(f"| {name}{flag} | {r['tuned_once']:.3g} ({r['random']:.3g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(named: dict, path: Path) -> None:
    from metarl import plots

    fig = plots.new_figure(11, 4.2, "gain over the single tuned configuration, in units of its margin over random "
                                    f"play (per task: interval adjusted for {FAMILY} tests; tunings as clusters)")
    ax = fig.add_subplot()
    rows = list(named.values())
    x = np.arange(len(rows))
    series = [("per task k=16", "16", "tab:olive"), ("per task k=64", "64", "tab:green"),
              ("per task k=256", "256", "darkgreen")]
    for offset, (label, k, colour) in zip((-0.2, -0.07, 0.06), series):
        shown = [(i, r["per_task"][k]) for i, r in enumerate(rows) if k in r["per_task"]]
        if shown:
            g = np.array([s["gain"] for _, s in shown])
            lo, hi = np.array([s["ci_family"] for _, s in shown]).T
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


def wins(done: dict) -> dict:
    """Per k and at any k: the pairs that clear random play and were run there, and those per-task tuning wins
    (the gain reaches the bar, its interval adjusted for the family of tests above 0)."""
    found = {}
    for k in ("16", "64", "256", "any"):
        run = [n for n, r in done.items() if not r.get("flagged") and (k == "any" or k in r["per_task"])]
        found[k] = {"pairs": run, "wins": [n for n in run if any(g["gain"] >= GAIN and g["ci_family"][0] > 0 for kk, g
                                                                in done[n]["per_task"].items() if k in ("any", kk))]}
    return found


def save(path: Path, run_dir: Path, done: dict) -> None:
    path.write_text(json.dumps({"run_dir": str(run_dir), "seeds": SEEDS, "tunings": TUNINGS, "seeds_per_setting":
                                SEEDS_PER_SETTING, "bar": GAIN, "family": FAMILY, "wins": wins(done), "pairs": done},
                               indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--pairs", type=int, default=len(PAIRS))
    parser.add_argument("--restate", action="store_true", help="recompute each finished pair's statistics from its "
                        "stored report (examples/restate.py first), without training")
    args = parser.parse_args(argv)
    from metarl import evaluate

    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = args.out_dir / "headroom.json"
    done = json.loads(summary_path.read_text())["pairs"] if summary_path.exists() else {}
    if args.restate:
        done = {name: summarise({**json.loads(Path(r["report"]).read_text()), "json": r["report"]}, r["seconds"])
                for name, r in done.items()}
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
        save(summary_path, args.run_dir, done)   # after every pair: a kill loses none
        print(f"headroom: {name} took {done[name]['seconds'] / 60:.1f} min: " + ", ".join(
            f"k={k} {g['gain']:+.2f}" for k, g in done[name]["per_task"].items()), file=sys.stderr, flush=True)
    rows = list(done.values())
    save(summary_path, args.run_dir, done)
    (args.out_dir / "headroom.md").write_text(table(done) + "\n")
    figure(done, args.out_dir / "headroom.png")
    found = wins(done)["any"]
    print(table(done))
    print(f"per-task tuning beats the single tuned configuration by >= {GAIN} (interval adjusted for {FAMILY} tests "
          f"above 0, tunings resampled as clusters) on {len(found['wins'])} of the {len(found['pairs'])} pairs that "
          f"clear random play: {', '.join(found['wins']) or 'none'}; {sum(r['seconds'] for r in rows) / 60:.0f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
