"""What ``metarl.evaluate`` prints: the header, a row per task with each side's final return, the normalised
scores and tests, the IQMs per split and each side's tuning compute, all read from the report's JSON."""
from __future__ import annotations

from metarl import payoff
from metarl.sides import SIDES, compared, comparisons, in_order
from metarl.stats import bracket


def format_report(report: dict) -> str:
    """The report as the command prints it: the header, a row per task, the IQMs per split."""
    roles = {side["role"]: side["label"] for side in report["sides"]}
    which = ("no exported learned part: its baselines alone" if "learned" not in roles
             else f"{report['picked']} of generation {report['best_generation']}, picked on fresh seeds"
             if report.get("picked") else f"best of generation {report['best_generation']}")
    lines = [f"{report['kind']} from {report['run_dir']} ({which}): "
             f"{report['num_seeds']} fresh seeds per side and task (fold_in(key({report['key_root']}), i))",
             f"final return = {report['statistic']}; normalised = {report['normalized']}"]
    if t := report.get("tuned"):
        lines.append("tuned baseline: " + ", ".join(f"{k} {v:.4g} (configured {t['configured'][k]:.4g})"
                                                    for k, v in t["hyperparameters"].items())
                     + f", tuned with {t['trainings']:,} trainings (the search: {t['search_trainings']:,})"
                     + (f"; its fitness on fresh seeds {t['fitness']:.3f} {bracket(t['fitness_ci95_best_of'])} "
                        "(adjusted for the best of its candidates)" if t.get("fitness_ci95_best_of") else ""))
        if t.get("tunings"):  # several tunings: how far apart they landed
            lines.append(f"spread across {len(t['tunings'])} tunings (baseline: {t['chosen_by']}): " + ", ".join(
                f"{k} {low:.4g} to {high:.4g}" for k, (low, high) in t["spread"].items()))
        if "matched" in t:   # the evaluation's baseline: the best of every tuning, the search's trainings included
            m = t["matched"]
            lines.append(f"tuned baseline compared with: tuning {m['chosen'] + 1}, the best of all {len(t['tunings'])}"
                         f" with {m['trainings']:,} trainings (the learned side's tuning and search): " + ", ".join(
                             f"{k} {v:.4g}" for k, v in m["hyperparameters"].items()))
        lines += [f"warning: tuned baseline: {w}" for w in t.get("warnings", [])]
    if "formula" in report:
        f = report["formula"]
        lines.append(f"{f['label']}: {f['expression']} (size {f['size']}, NMSE {f['nmse']:.3g} against the "
                     "learned function; python -m metarl.distill)")
    lines += ["", *_table(report, roles), "", *_aggregate_lines(report, roles), _compute_line(report)]
    if report.get("payoff"):
        lines += payoff.lines(report["payoff"])
    if "learned_values" in report:
        lines.append("hyperparameters (learned | baseline): " + ", ".join(
            f"{k} {v:.4g} | {report['baseline_values'][k]:.4g}" for k, v in report["learned_values"].items()))
    lines += [f"wrote {report['json']}", f"wrote {report['figure']}"] + (
        [f"wrote {report['per_task']['figure']}"] if "per_task" in report else []) + (
        [f"wrote {report['payoff']['figure']}"] if report.get("payoff") else [])
    return "\n".join(lines)


def _short(label: str) -> str:
    return label.split(":")[0]


def _compute_line(report: dict) -> str:
    """Each side's tuning compute, in trainings."""
    c = report.get("compute", {})
    return "tuning compute in trainings: " + "; ".join(filter(None, (
        kind.cost(report, c[kind.name]) for kind in in_order(SIDES.values()) if kind.cost and kind.name in c)))


def _table(report: dict, roles: dict) -> list[str]:
    """A row per task: each side's final return, a random policy's, the challengers' normalised scores, each p."""
    shown = [side["label"] for side in in_order(report["sides"])]
    column = {side["label"]: SIDES[side["role"]].column for side in report["sides"]}   # its normalised score's header
    scored = [s for s in shown if column[s]]
    # each p's header: its comparison's (roles -> header, or the header), else "p " and its challenger's column
    tests = [(c.test, c.column(roles) if callable(c.column) else c.column or "p " + column[roles[c.a]](roles[c.a]))
             for c in comparisons(roles)]
    width = max(12, max(len(r["task"]) for r in report["tasks"]) + 2)
    cols = {s: max(28, len(_short(s)) + 11) for s in shown}   # a header such as "tuned per task at k=64 [95% CI]"
    lines = [f"{'task':<{width}}{'split':<12}" + "".join(f"{_short(s) + ' [95% CI]':<{cols[s]}}" for s in shown)
             + f"{'random':>8}" + "".join(f"{'norm. ' + column[s](s):>15}" for s in scored)
             + "".join(f"{name:>13}" for _, name in tests)]
    cell = lambda s: f"{s['mean']:.2f} {bracket(s['ci95'], '.2f')}" + (  # noqa: E731
        f" ({s['nonfinite']} diverged)" if s["nonfinite"] else "")
    for r in report["tasks"]:
        lines.append(f"{r['task']:<{width}}{r['split']:<12}" + "".join(f"{cell(r['sides'][s]):<{cols[s]}}" for s in shown)
                     + f"{r['random_return']:>8.2f}" + "".join(f"{r['normalized'][s]:>15.3f}" for s in scored)
                     + "".join(f"{r[test]['paired_p']:>13.3g}" for test, _ in tests))
    flagged = [r["task"] for r in report["tasks"] if r["degenerate"]]
    return lines + [f"flagged: {', '.join(flagged)}: the baseline does not clear random play beyond noise (one-sided "
                    "Welch p >= 0.05): no scale to normalise by, left out of the aggregates"] * bool(flagged)


def _aggregate_lines(report: dict, roles: dict) -> list[str]:
    """Per split, the IQM of each side's normalised scores, the differences and probabilities of improvement, and
    the differences with the flagged tasks beside."""
    named = {role: SIDES[role].short(label) for role, label in roles.items()}
    lines = []
    for name, agg in report["aggregate"].items():
        # each side's IQM where its first comparison has it (as that comparison's challenger or reference)
        iqms = [f"{_short(label)} {c.of(agg)[key]:.3f} {bracket(c.of(agg)[key + '_ci95'])}"
                for label, _, c, key in compared(report["sides"])]
        better = []
        for c in comparisons(roles):
            v, w, a, b = c.of(agg), c.of(agg.get("with_left_out") or {}), c.a, c.b   # w: with the flagged tasks
            better.append(f"{named[a]} - {named[b]} {v['iqm_difference']:+.3f} "
                          f"{bracket(v['iqm_difference_ci95'], '+.3f')}"
                          + (f" (flagged in: {w['iqm_difference']:+.3f} {bracket(w['iqm_difference_ci95'], '+.3f')})"
                             if w else "") + f", P({named[a]} > {named[b]}) = {v['probability_of_improvement']:.3f} "
                          f"{bracket(v['probability_of_improvement_ci95'])}")
        left_out = f"; {', '.join(agg['left_out'])} flagged, left out" if agg.get("left_out") else ""
        lines += [f"{name} ({agg['tasks']} task(s){left_out}), IQM of normalised scores: " + ", ".join(iqms),
                  "    " + "; ".join(better)]
    return lines + ["(sides: " + "; ".join(s["label"] for s in in_order(report["sides"])) + "; stratified bootstrap "
                    "CIs over every side's seeds, resampled jointly (paired), and the normalising baseline mean)"]
