"""Does a learned part pay for itself? ``metarl.evaluate``'s four-sided summary on the held-out tasks (docs/results.md):
the share of per-task tuning's gain the learned part recovers, its IQM normalised by the single tuned configuration,
the pairs where it is worse by more than a margin (Holm-corrected) and the break-even point: the new tasks after
which meta-training has cost fewer frames than tuning each with k trainings. A diverged seed scores 0."""
from __future__ import annotations

import math

import numpy as np

from metarl import stats

# The win stated before issue 57's run: recovered share (and its lower bound), IQM over the tuned configuration
# (and its lower bound), the largest deficit a pair may show after Holm's correction, the break-even tasks.
BAR = {"recovered": 0.5, "recovered_low": 0.2, "iqm": 1.10, "iqm_low": 1.0, "margin": 0.05, "break_even": 20}
ALPHA = 0.05


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given."""
    order = np.argsort(p)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order]))
    return adjusted[np.argsort(order)]


def payoff(report: dict, normalized: list[dict], frames_per_training: int, reps: int = 2000) -> dict | None:
    """The summary (None unless the report has held-out tasks, a learned side and a per-task side); ``normalized``:
    per held-out task, each side's normalised scores."""
    from metarl.pertask import label
    roles = {side["role"]: side["label"] for side in report["sides"]}
    held = [row for row in report["tasks"] if row["split"] == "held-out"]
    if not held or not {"learned", "baseline", "per_task"} <= set(roles):
        return None
    ks, base = report["per_task"]["ks"], roles["baseline"]
    scores = lambda side: np.stack([np.nan_to_num(n[side], nan=0.0) for n in normalized], axis=1)  # noqa: E731
    learned, baseline, rng = scores(roles["learned"]), scores(base), np.random.RandomState(0)

    def recovered(learned, baseline, per_task) -> float:   # undefined (NaN) where per-task tuning gained nothing
        gain = stats.iqm(per_task) - stats.iqm(baseline)
        return (stats.iqm(learned) - stats.iqm(baseline)) / gain if gain > 0 else float("nan")
    iqm, iqm_ci = stats.interval(stats.iqm, (learned,), reps, rng)
    # one-sided Welch per pair: is the learned part worse than the tuned configuration by more than the margin?
    p_holm = holm(np.array([stats.welch(learned[:, i] + BAR["margin"], baseline[:, i], alternative="less").pvalue
                            for i in range(len(held))]))
    worse = [row["task"] for row, q in zip(held, p_holm) if q < ALPHA]
    c = report["compute"]
    meta = (c["learned"]["search"] + c["learned"]["tuning"]) * frames_per_training
    frames = float(np.mean([row["total_timesteps"] for row in held]))
    by_k = {}   # every check at each k: the win is judged at one k at a time, never mixed across ks
    for k in ks:
        per_task = scores(label(k))
        share, share_ci = stats.interval(recovered, (learned, baseline, per_task), reps, rng)
        after = math.floor(meta / (k * frames)) + 1
        by_k[str(k)] = {"label": label(k), "iqm_per_task": stats.iqm(per_task), "recovered": share,
                        "recovered_ci95": share_ci, "per_task_frames": k * frames, "tasks": meta / (k * frames),
                        "after": after,
                        "win": {"recovered": share >= BAR["recovered"] and share_ci[0] > BAR["recovered_low"],
                                "iqm": iqm >= BAR["iqm"] and iqm_ci[0] > BAR["iqm_low"],
                                "no_pair_worse": not worse, "break_even": after <= BAR["break_even"]}}
    return {"tasks": [row["task"] for row in held], "sides": {"learned": roles["learned"], "baseline": base},
            "iqm": {"learned": stats.iqm(learned), "baseline": stats.iqm(baseline)}, "iqm_learned": iqm,
            "iqm_learned_ci95": iqm_ci, "worse_pairs": worse, "worse_p_holm": [float(q) for q in p_holm],
            "meta_frames": meta, "tuned_frames": c["baseline"]["tuning"] * frames_per_training,
            "frames_per_training": frames_per_training, "by_k": by_k, "bar": BAR}


def lines(summary: dict) -> list[str]:
    """The summary as ``metarl.evaluate`` prints it."""
    s = summary
    out = [f"pays for itself? on {len(s['tasks'])} held-out task(s): learned IQM {s['iqm_learned']:.3f} "
           f"{stats.bracket(s['iqm_learned_ci95'], '.2f')} of the tuned configuration (bar: >= {s['bar']['iqm']}); "
           f"worse than it by > {s['bar']['margin']} (Holm): " + (", ".join(s["worse_pairs"]) or "no pair")
           + f"; meta-training {s['meta_frames']:.3g} frames"]
    for k, b in s["by_k"].items():
        out += [f"    against per-task tuning at k={k}: recovered share of its gain {b['recovered']:.2f} "
                f"{stats.bracket(b['recovered_ci95'], '.2f')} (bar: >= {s['bar']['recovered']}, lower bound > "
                f"{s['bar']['recovered_low']}); break-even after {b['after']} new task(s) ({b['per_task_frames']:.3g} "
                f"frames per task; bar: <= {s['bar']['break_even']}); win: "
                + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in b["win"].items())]
    return out


def figure(summary: dict):
    """Cumulative frames against new tasks: meta-training, the single tuning and per-task tuning at each k."""
    from metarl import plots
    by_k = summary["by_k"]
    n = np.arange(0, max(25, math.ceil(2 * max(b["tasks"] for b in by_k.values()))) + 1)
    fig = plots.new_figure(7, 4, "recovered share of per-task tuning's gain: " + "; ".join(
        f"k={k} {b['recovered']:.2f} {stats.bracket(b['recovered_ci95'], '.2f')}" for k, b in by_k.items()))
    ax = fig.add_subplot()
    ax.plot(n, np.full(n.shape, summary["meta_frames"]), color=plots.LEARNED, lw=2,
            label="learned: its tuning and meta-training, once")
    ax.plot(n, np.full(n.shape, summary["tuned_frames"]), color=plots.BASELINE, lw=2, label="tuned once (matched compute)")
    for shade, (k, b) in zip(np.linspace(0.3, 0.0, len(by_k)), by_k.items()):
        colour = (shade, 0.5 + shade, shade)
        ax.plot(n, n * b["per_task_frames"], color=colour, lw=1.5, label=f"tuned per task, k={k}")
        ax.axvline(b["tasks"], color=colour, ls="--", lw=1, label=f"break-even at k={k}: {b['tasks']:.1f} tasks")
    ax.set(xlabel="new tasks", ylabel="environment frames spent", xlim=(0, n[-1]), ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
