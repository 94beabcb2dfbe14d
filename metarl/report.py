"""What ``metarl.evaluate`` prints: the header, a row per task with each side's final return, the normalised
scores and tests, the IQMs per split and each side's tuning compute, all read from the report's JSON."""
from __future__ import annotations

from metarl import payoff
from metarl.stats import bracket

# Tests run where both sides are evaluated: (row's Welch key, aggregate key or None, challenger, reference).
COMPARISONS = (("test", None, "learned", "baseline"), ("test_configured", "vs_configured", "learned", "configured"),
               ("test_formula", "formula", "formula", "baseline"), ("test_per_task", "per_task", "per_task", "baseline"))
# A run's baselines alone (no learned side): the tuned baseline against the configured one.
TUNING = ("test_tuning", "tuning", "baseline", "configured")


def comparisons(roles) -> list[tuple]:
    """The ``COMPARISONS`` whose sides are both present, and ``TUNING`` where there is no learned side."""
    found = [c for c in COMPARISONS if c[2] in roles and c[3] in roles]
    return found + [TUNING] * ("learned" not in roles and "configured" in roles)


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


def _in_order(report: dict) -> list[str]:
    """The sides' labels in the order the table and the closing line show them."""
    order = ("learned", "formula", "baseline", "per_task", "configured")
    return [side["label"] for side in sorted(report["sides"], key=lambda side: order.index(side["role"]))]


def _compute_line(report: dict) -> str:
    """Each side's tuning compute, in trainings."""
    c, parts = report.get("compute", {}), []
    if "learned" in c:
        parts.append(f"learned {c['learned']['search']:,} (its search and pick)"
                     + (f" + {c['learned']['tuning']:,} (the tuning it starts from)" if c["learned"]["tuning"] else ""))
    if c.get("baseline", {}).get("tuning"):
        parts.append(f"tuned once {c['baseline']['tuning']:,} on the trained-on tasks")
    if "per_task" in report:
        parts.append(f"tuned per task k on each evaluated task ({report['per_task']['tunings']} tunings per task here, "
                     f"{report['per_task']['seeds_per_setting']} seeds per setting)")
    parts += ["as configured 0"] if "configured" in c else []
    return "tuning compute in trainings: " + "; ".join(parts)


def _table(report: dict, roles: dict) -> list[str]:
    """A row per task: each side's final return, a random policy's, the challengers' normalised scores, each p."""
    shown = _in_order(report)
    scored = [s for s in shown if s not in (roles["baseline"], roles.get("configured"))]
    per_task = [side["label"] for side in report["sides"] if side["role"] == "per_task"]
    names = {"test": "p vs tuned" if "configured" in roles else "p (paired)", "test_configured": "p vs config",
             "test_formula": "p formula", TUNING[0]: "p vs config"}
    tests = [(test, names.get(test) or f"p {roles['per_task'].split()[-1]}") for test, *_ in comparisons(roles)]
    width = max(12, max(len(r["task"]) for r in report["tasks"]) + 2)
    cols = {s: max(28, len(_short(s)) + 11) for s in shown}   # a header such as "tuned per task at k=64 [95% CI]"
    lines = [f"{'task':<{width}}{'split':<12}" + "".join(f"{_short(s) + ' [95% CI]':<{cols[s]}}" for s in shown)
             + f"{'random':>8}" + "".join(f"{'norm. ' + _short(s).split()[-1 if s in per_task else 0]:>15}"
                                          for s in scored)
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
    named = {role: "learned" if role == "learned" else _short(label) for role, label in roles.items()}
    lines = []
    for name, agg in report["aggregate"].items():
        iqms, better = [], []
        for _, key, a, b in comparisons(roles):
            v, w = (agg, agg.get("with_left_out")) if key is None else (agg[key], agg.get("with_left_out", {}).get(key))
            # the sides whose IQMs this comparison adds: both (the first, or TUNING's two baselines), else the new one
            added = ([(a, "learned"), (b, "baseline")] if key in (None, TUNING[1])
                     else [(b, "baseline")] if a == "learned" else [(a, "learned")])
            iqms += [f"{_short(roles[side])} {v[f'iqm_{which}']:.3f} {bracket(v[f'iqm_{which}_ci95'])}"
                     for side, which in added]
            better.append(f"{named[a]} - {named[b]} {v['iqm_difference']:+.3f} "
                          f"{bracket(v['iqm_difference_ci95'], '+.3f')}"
                          + (f" (flagged in: {w['iqm_difference']:+.3f} {bracket(w['iqm_difference_ci95'], '+.3f')})"
                             if w else "") + f", P({named[a]} > {named[b]}) = {v['probability_of_improvement']:.3f} "
                          f"{bracket(v['probability_of_improvement_ci95'])}")
        left_out = f"; {', '.join(agg['left_out'])} flagged, left out" if agg.get("left_out") else ""
        lines += [f"{name} ({agg['tasks']} task(s){left_out}), IQM of normalised scores: " + ", ".join(iqms),
                  "    " + "; ".join(better)]
    return lines + ["(sides: " + "; ".join(_in_order(report)) + "; stratified bootstrap CIs over every side's seeds, "
                    "resampled jointly (paired), and the normalising baseline mean)"]
