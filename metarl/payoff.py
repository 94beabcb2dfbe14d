"""Does a learned part pay for itself? ``metarl.evaluate``'s four-sided summary on the held-out tasks, read from
its report: the learned part, the single tuned configuration, PPO tuned per task at the largest k and PPO as
configured. It gives the share of per-task tuning's gain that the learned part recovers, the learned part's IQM
normalised by the single tuned configuration, the pairs where it is worse by more than a margin (Holm-corrected)
and the break-even point: the number of new tasks after which meta-training (the tuning it starts from and its
search) has cost fewer environment frames than tuning each new task with k trainings.

Scores are normalised per task as ``evaluate`` normalises them (random play 0, the single tuned configuration 1);
a diverged seed scores 0. Intervals are stratified bootstrap ones (``metarl.stats``), seeded.
"""
from __future__ import annotations

import math

import numpy as np

# The win stated before issue 57's run: recovered share (and its lower bound), IQM over the tuned configuration
# (and its lower bound), the largest deficit a pair may show after Holm's correction, the break-even tasks.
BAR = {"recovered": 0.5, "recovered_low": 0.2, "iqm": 1.10, "iqm_low": 1.0, "margin": 0.05, "break_even": 20}
ALPHA = 0.05


def _normalised(row: dict, label: str, baseline: str) -> np.ndarray:
    from metarl.outer_loops.fitness import spans

    finals = np.asarray(row["sides"][label]["final_returns"], float)
    base = float(np.nanmean(row["sides"][baseline]["final_returns"]))
    span = float(spans({"base": [base], "low": [row["random_return"]]})[0])
    return np.nan_to_num((finals - row["random_return"]) / span, nan=0.0)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given."""
    order = np.argsort(p)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return out


def payoff(report: dict, frames_per_training: int, reps: int = 2000) -> dict | None:
    """The summary (None unless the report has held-out tasks, a learned side and a per-task side)."""
    from scipy import stats as scipy_stats

    from metarl import stats
    from metarl.pertask import label

    roles = {side["role"]: side["label"] for side in report["sides"]}
    held = [row for row in report["tasks"] if row["split"] == "held-out"]
    if not held or not {"learned", "baseline", "per_task"} <= set(roles):
        return None
    ks = report["per_task"]["ks"]
    labels = {"learned": roles["learned"], "baseline": roles["baseline"],
              "per_task": label(ks[-1])}
    scores = {side: np.stack([_normalised(r, name, roles["baseline"]) for r in held], axis=1)
              for side, name in labels.items()}
    rng = np.random.RandomState(0)

    def recovered(learned, baseline, per_task) -> float:   # undefined (NaN) where per-task tuning gained nothing
        gain = stats.iqm(per_task) - stats.iqm(baseline)
        return (stats.iqm(learned) - stats.iqm(baseline)) / gain if gain > 0 else float("nan")
    share, share_ci = stats.interval(recovered, (scores["learned"], scores["baseline"], scores["per_task"]), reps, rng)
    iqm, iqm_ci = stats.interval(stats.iqm, (scores["learned"],), reps, rng)
    # one-sided Welch per pair: is the learned part worse than the tuned configuration by more than the margin?
    p = np.array([scipy_stats.ttest_ind(scores["learned"][:, i] + BAR["margin"], scores["baseline"][:, i],
                                        equal_var=False, alternative="less").pvalue for i in range(len(held))])
    worse = [row["task"] for row, q in zip(held, holm(p)) if q < ALPHA]
    c = report["compute"]
    meta = (c["learned"]["search"] + c["learned"]["tuning"]) * frames_per_training
    frames = float(np.mean([row["total_timesteps"] for row in held]))
    break_even = {str(k): {"per_task_frames": k * frames, "tasks": meta / (k * frames),
                           "after": math.floor(meta / (k * frames)) + 1} for k in ks}
    after = break_even[str(ks[-1])]["after"]
    return {"tasks": [row["task"] for row in held], "k": ks[-1], "sides": labels,
            "iqm": {side: stats.iqm(s) for side, s in scores.items()},
            "recovered": share, "recovered_ci95": share_ci, "iqm_learned": iqm, "iqm_learned_ci95": iqm_ci,
            "worse_pairs": worse, "worse_p_holm": [float(q) for q in holm(p)],
            "meta_frames": meta, "tuned_frames": c["baseline"]["tuning"] * frames_per_training,
            "frames_per_training": frames_per_training, "break_even": break_even,
            "bar": BAR, "win": {"recovered": share >= BAR["recovered"] and share_ci[0] > BAR["recovered_low"],
                                "iqm": iqm >= BAR["iqm"] and iqm_ci[0] > BAR["iqm_low"],
                                "no_pair_worse": not worse, "break_even": after <= BAR["break_even"]}}


def lines(summary: dict) -> list[str]:
    """The summary as ``metarl.evaluate`` prints it."""
    s, ci = summary, lambda v: f"[{v[0]:.2f}, {v[1]:.2f}]"  # noqa: E731
    k = str(s["k"])
    return [f"pays for itself? on {len(s['tasks'])} held-out task(s), against per-task tuning at k={k}:",
            f"    recovered share of per-task tuning's gain {s['recovered']:.2f} {ci(s['recovered_ci95'])} (bar: "
            f">= {s['bar']['recovered']}, lower bound > {s['bar']['recovered_low']}); learned IQM "
            f"{s['iqm_learned']:.3f} {ci(s['iqm_learned_ci95'])} of the tuned configuration (bar: >= {s['bar']['iqm']})",
            f"    worse than the tuned configuration by > {s['bar']['margin']} (Holm): "
            + (", ".join(s["worse_pairs"]) or "no pair") + f"; break-even after {s['break_even'][k]['after']} new "
            f"task(s) ({s['meta_frames']:.3g} frames of meta-training against {s['break_even'][k]['per_task_frames']:.3g}"
            f" per task; bar: <= {s['bar']['break_even']})",
            "    win: " + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in s["win"].items())]


def figure(summary: dict):
    """Cumulative frames against the number of new tasks: meta-training (flat), the single tuning (flat) and
    per-task tuning at each k (a line through 0), the break-even at the largest k marked."""
    from metarl import plots

    k = str(summary["k"])
    n = np.arange(0, max(25, math.ceil(2 * summary["break_even"][k]["tasks"])) + 1)
    fig = plots.new_figure(7, 4, f"recovered share of per-task tuning's gain: {summary['recovered']:.2f} "
                           f"[{summary['recovered_ci95'][0]:.2f}, {summary['recovered_ci95'][1]:.2f}]")
    ax = fig.add_subplot()
    ax.plot(n, np.full(n.shape, summary["meta_frames"]), color=plots.LEARNED, lw=2,
            label="learned: its tuning and meta-training, once")
    ax.plot(n, np.full(n.shape, summary["tuned_frames"]), color=plots.BASELINE, lw=2, label="tuned once (matched compute)")
    for shade, (ks, b) in zip(np.linspace(0.3, 0.0, len(summary["break_even"])), summary["break_even"].items()):
        ax.plot(n, n * b["per_task_frames"], color=(shade, 0.5 + shade, shade), lw=1.5, label=f"tuned per task, k={ks}")
    ax.axvline(summary["break_even"][k]["tasks"], color="0.4", ls="--", lw=1,
               label=f"break-even at k={k}: {summary['break_even'][k]['tasks']:.1f} tasks")
    ax.set(xlabel="new tasks", ylabel="environment frames spent", xlim=(0, n[-1]), ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
