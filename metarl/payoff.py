"""Does a learned part pay for itself? ``metarl.evaluate``'s summary on the held-out tasks against per-task tuning
(what it states: docs/results.md). A diverged seed scores 0; a task whose baseline does not clear random play is
flagged and left out."""
from __future__ import annotations

import math

import numpy as np

from metarl import stats

# The win stated before issue 57's run: recovered share (and its lower bound), IQM over the tuned configuration
# (and its lower bound), the margin by which no pair may be worse (shown by a non-inferiority test), the break-even.
BAR = {"recovered": 0.5, "recovered_low": 0.2, "iqm": 1.10, "iqm_low": 1.0, "margin": 0.05, "break_even": 20}
ALPHA = 0.05


def normalised(row: dict, labels, base: str) -> dict:
    """Each side's per-seed scores on a task, (R - random) / (``base``'s mean - random); a diverged seed 0."""
    from metarl.outer_loops.fitness import spans
    span = float(spans({"base": [row["sides"][base]["mean"]], "low": [row["random_return"]]})[0])
    return {label: np.nan_to_num((np.asarray(row["sides"][label]["final_returns"], float) - row["random_return"])
                                 / span, nan=0.0) for label in labels}


def payoff(report: dict, frames_per_training: int, reps: int = 2000) -> dict | None:
    """The summary (None unless the report has held-out tasks, a learned side, a per-task side and a task whose
    baseline clears random play); seed i of every side trains from one key, so the per-pair t-tests are paired."""
    from metarl.pertask import label
    roles = {side["role"]: side["label"] for side in report["sides"]}
    held = [row for row in report["tasks"] if row["split"] == "held-out"]
    kept = [row for row in held if not row["degenerate"]]
    if not kept or not {"learned", "baseline", "per_task"} <= set(roles):
        return None
    ks, base, learned = report["per_task"]["ks"], roles["baseline"], roles["learned"]
    raw = {s: np.stack([row["sides"][s]["final_returns"] for row in kept], axis=1)
           for s in (learned, base, *map(label, ks))}

    def statistic(n: dict) -> list:   # the IQMs' ratio, learned's gain, P(learned > base), per-task tuning's gain per k
        b, gain = stats.iqm(n[base]), stats.iqm(n[learned]) - stats.iqm(n[base])
        return [1 + gain / b, gain, stats.probability_of_improvement(n[learned], n[base]),
                *(stats.iqm(n[label(k)]) - b for k in ks)]
    point, draws = stats.bootstrap(statistic, raw, np.array([row["random_return"] for row in kept]), base, reps,
                                   np.random.RandomState(0))
    ci, n = stats.percentile(draws), [normalised(row, (learned, base), base) for row in kept]
    # per pair: H0 "worse by the margin or more" (non-inferiority) and H0 "no difference", each Holm over the pairs
    p_ni = stats.holm([stats.t_test(s[learned] + BAR["margin"], s[base], paired=True, alternative="greater").pvalue
                       for s in n])
    p_diff = stats.holm([stats.t_test(s[learned], s[base], paired=True).pvalue for s in n])
    gains = {row["task"]: float(np.mean(s[learned] - s[base])) for row, s in zip(kept, n)}
    not_worse = [row["task"] for row, q in zip(kept, p_ni) if q < ALPHA]
    c, frames = report["compute"], {row["task"]: row["total_timesteps"] for row in kept}
    meta = (c["learned"]["search"] + c["learned"]["tuning"]) * frames_per_training
    costliest = max(frames, key=frames.get)
    by_k = {}   # every check at each k: the win is judged at one k at a time, never mixed across ks
    for i, k in enumerate(ks, start=3):
        share = point[1] / point[i] if point[i] > 0 else float("nan")   # undefined where per-task tuning gained nothing
        share_ci, per_task_frames = stats.fieller(point[1], point[i], draws[:, [1, i]]), k * np.mean([*frames.values()])

        def after(tasks) -> int | None:   # None where the learned part recovers nothing: it never pays
            return math.floor(meta / (k * np.mean([frames[t] for t in tasks]))) + 1 if share > 0 and tasks else None
        by_k[str(k)] = {"label": label(k), "gain_per_task": point[i], "gain_per_task_ci95": ci[i], "recovered": share,
                        "recovered_ci95": share_ci, "recovered_undefined": float(np.mean(draws[:, i] <= 0)),
                        "per_task_frames": per_task_frames, "tasks": meta / per_task_frames, "after": after(frames),
                        "after_without": {"task": costliest, "after": after([t for t in frames if t != costliest])},
                        "after_per_pair": {t: after([t]) if gains[t] > 0 else None for t in frames},
                        "win": {"recovered": share >= BAR["recovered"] and (share_ci or [0])[0] > BAR["recovered_low"],
                                "iqm": point[0] >= BAR["iqm"] and ci[0][0] > BAR["iqm_low"],
                                "not_worse": len(not_worse) == len(kept),
                                "break_even": (after(frames) or math.inf) <= BAR["break_even"]}}
    return {"tasks": list(frames), "flagged": [row["task"] for row in held if row["degenerate"]], "paired": True,
            "sides": {"learned": learned, "baseline": base}, "iqm_ratio": point[0], "iqm_ratio_ci95": ci[0],
            "iqm_difference": point[1], "iqm_difference_ci95": ci[1], "probability_of_improvement": point[2],
            "probability_of_improvement_ci95": ci[2], "gains": gains, "not_worse_pairs": not_worse,
            "not_worse_p_holm": p_ni.tolist(), "worse_p_holm": p_diff.tolist(),
            "worse_pairs": [t for t, q in zip(frames, p_diff) if q < ALPHA and gains[t] < 0], "meta_frames": meta,
            "tuned_frames": c["baseline"]["tuning"] * frames_per_training, "frames_per_training": frames_per_training,
            "by_k": by_k, "bar": BAR}


def lines(summary: dict) -> list[str]:
    """The summary as ``metarl.evaluate`` prints it."""
    s, ci = summary, lambda v, spec=".2f": stats.bracket(v, spec) if v else "unbounded"  # noqa: E731
    out = [f"pays for itself? on {len(s['tasks'])} held-out task(s)" + (f" ({', '.join(s['flagged'])} flagged, left "
           "out)" if s["flagged"] else "") + ", seeds paired: learned IQM / tuned configuration's "
           f"{s['iqm_ratio']:.3f} {ci(s['iqm_ratio_ci95'])} (bar: >= {s['bar']['iqm']}), difference "
           f"{s['iqm_difference']:+.3f} {ci(s['iqm_difference_ci95'], '+.3f')}, P(learned > tuned) "
           f"{s['probability_of_improvement']:.2f} {ci(s['probability_of_improvement_ci95'])}",
           f"    not worse by > {s['bar']['margin']} (non-inferiority, Holm): shown on {len(s['not_worse_pairs'])} of "
           f"{len(s['tasks'])}; worse beyond noise (Holm): {', '.join(s['worse_pairs']) or 'none'}; meta-training "
           f"{s['meta_frames']:.3g} frames"]
    for k, b in s["by_k"].items():
        out += [f"    against per-task tuning at k={k}: its gain {b['gain_per_task']:+.3f} "
                f"{ci(b['gain_per_task_ci95'], '+.3f')}; recovered share {b['recovered']:.2f} "
                f"{ci(b['recovered_ci95'])} "
                f"(Fieller; denominator <= 0 in {b['recovered_undefined']:.0%} of resamples; bar: >= "
                f"{s['bar']['recovered']}, low > {s['bar']['recovered_low']}); break-even: {b['after'] or 'never'} new "
                f"task(s) ({b['per_task_frames']:.3g} frames per task; without {b['after_without']['task']}: "
                f"{b['after_without']['after'] or 'never'}; bar: <= {s['bar']['break_even']}); win: "
                + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in b["win"].items())]
    return out


def figure(summary: dict):
    """Cumulative frames against new tasks: meta-training, the single tuning and per-task tuning at each k."""
    from metarl import plots
    by_k = summary["by_k"]
    n = np.arange(0, max(25, math.ceil(2 * max(b["tasks"] for b in by_k.values()))) + 1)
    fig = plots.new_figure(7, 4, "recovered share of per-task tuning's gain: " + "; ".join(
        f"k={k} {b['recovered']:.2f} {stats.bracket(b['recovered_ci95'] or [-np.inf, np.inf], '.2f')}"
        for k, b in by_k.items()))
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
