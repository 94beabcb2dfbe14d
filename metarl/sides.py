"""What ``metarl.evaluate`` trains on fresh seeds and compares: one registry entry per side kind (docs/extending.md)
says how its sides are built, what each is compared with and how the report's tables and figures show it."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

from metarl import config as config_lib, results
from metarl.errors import layer_errors
from metarl.inner_loops import plugins
from metarl.rundir import RunDir
from metarl.tasks import build_task


@dataclasses.dataclass(frozen=True)
class Side:
    label: str
    role: str            # its kind's name; the scores are normalised by the "baseline" side
    trainers: tuple      # per task: train(key), or with ``inputs`` make(inputs of seed i)(key)
    inputs: Optional[tuple] = None   # per task, what each seed trains with (leading axis: seeds)
    record: Any = None   # what its kind's ``finish`` reads


class Comparison(NamedTuple):
    """The challenger role ``a`` against the reference ``b``, tested where both are evaluated."""
    test: str                       # the key of its tests in each task's row
    part: Optional[str]             # the key of its IQMs in each split's aggregate; None: the split's own
    a: str
    b: str
    column: Any = None              # the table's header of its p, or roles -> header; None: "p " + a's column
    unless: Optional[str] = None    # a role whose presence drops it

    def of(self, aggregate: dict) -> Optional[dict]:
        return aggregate if self.part is None else aggregate.get(self.part)


@dataclasses.dataclass(frozen=True)
class SideKind:
    name: str                     # its sides' role in the report
    build: Callable               # (loaded run, evaluate's arguments) -> its sides; none where it does not apply
    order: float                  # its place in the table, the closing line and the compute line, lowest first
    colours: tuple = ("tab:pink",)      # its i-th side's colour in figures: colours[i % len(colours)]
    compared: tuple = ()                # its Comparisons: where it is the challenger, or `unless` names a role
    column: Optional[Callable] = lambda label: label.split()[0]   # label -> its normalised score's header; None: none
    short: Callable = lambda label: label.split(":")[0]           # label -> its name in the aggregates' differences
    compute: Optional[Callable] = None  # (loaded, arguments) -> its tuning compute in trainings: report["compute"]
    cost: Optional[Callable] = None     # (report, its compute) -> its part of the compute line
    finish: Optional[Callable] = None   # (report, its sides, arguments) -> the files' suffix; adds what it records


SIDES: dict[str, SideKind] = {}


def register(kind: SideKind) -> SideKind:
    """Make ``kind`` available as ``metarl.evaluate sides=[<kind.name>]``."""
    SIDES[kind.name] = kind
    return kind


def get(name: str) -> SideKind:
    """A registered side kind, or the dotted path of a ``SideKind`` of your own (``my_pkg.sides.TWICE_THE_LR``),
    registered here so that the command line reaches it without code."""
    if name in SIDES:
        return SIDES[name]
    allowed = f"a registered side kind ({', '.join(SIDES)}) or the dotted path of a metarl.sides.SideKind"
    with layer_errors(lambda key: key):   # plugins names the argument: sides
        return register(plugins.locate_instance(name, "sides", SideKind, allowed))


def in_order(kinds) -> list:
    """Side kinds, or the report's sides (label and role), in the table's order."""
    return sorted(kinds, key=lambda k: SIDES[k["role"]].order if isinstance(k, dict) else k.order)


def comparisons(roles: dict) -> list[Comparison]:
    """The comparisons whose roles are both evaluated, in the kinds' order (``roles``: role -> label; of a role's
    several sides, the last: per_task's at the largest k)."""
    return [c for kind in in_order(SIDES.values()) for c in kind.compared
            if c.a in roles and c.b in roles and c.unless not in roles]


def compared(sides: list[dict]) -> list[tuple]:
    """The report's compared ``sides``, each once: label, colour, its first comparison and its IQM's key there (the
    challenger's or the reference's)."""
    roles, colour, found = {side["role"]: side["label"] for side in sides}, colours(sides), {}
    for c in comparisons(roles):
        found.setdefault(roles[c.a], (c, "iqm_learned"))
        found.setdefault(roles[c.b], (c, "iqm_baseline"))
    return [(label, colour[label], c, key) for label, (c, key) in found.items()]


def colours(sides: list[dict]) -> dict:
    """Each of the report's sides' colour: its kind's colours in turn."""
    found, seen = {}, []
    for side in sides:
        palette = SIDES[side["role"]].colours
        found[side["label"]] = palette[seen.count(side["role"]) % len(palette)]
        seen.append(side["role"])
    return found


def hand_designed(prefix: str, role: str, run, task) -> Side:
    """A side of ``task``'s hand-designed rule (its baselines), labelled by the run's kind."""
    return Side(prefix + run.task.kind.baseline_label(task.inner_config), role, tuple(task.baselines))


def _learned_compute(run, args) -> dict:
    from metarl.search import trainings
    tuning = run.tuned["trainings"] if run.tuned else 0
    return {"search": trainings(run.cfg, pick=True), "tuning": tuning}


def _baseline(run, args) -> list[Side]:
    """The tuned baseline if the run tuned it, else as configured: the side the scores are normalised by."""
    if run.tuned and "matched" in run.tuned:   # tuned with the learned side's tuning and search: the same compute
        matched = build_task(config_lib.with_tuned(run.cfg, run.tuned["matched"]), run.task.specs)
        return [hand_designed("tuned baseline (matched compute): ", "baseline", run, matched)]
    return [hand_designed("tuned baseline: " if run.tuned else "baseline: ", "baseline", run, run.task)]


def _formula(run, args) -> list[Side]:
    """With ``distilled=K``, formula K of the run's ``metarl.distill`` front in place of the learned part."""
    if args["distilled"] is None:
        return []
    from metarl.distill import load_formula
    formula = load_formula(run.run_dir, args["distilled"])
    fixed = build_task(dataclasses.replace(run.cfg, component=formula["component"]), run.task.specs)
    return [Side(f"formula {formula['k']}", "formula", tuple(make({}) for make in fixed.trainers), record=formula)]


def _formula_finish(report: dict, sides: list[Side], args) -> str:
    report["formula"] = {"k": args["distilled"], "label": sides[0].label,
                         **{key: sides[0].record[key] for key in ("expression", "size", "nmse", "component")}}
    return f"_distilled{args['distilled']}"


def _per_task(run, args) -> list[Side]:
    """With ``per_task=[k, ...]``, a side per k of PPO tuned on each task (``metarl.pertask``)."""
    if args["per_task"] is None:
        return []
    from metarl import pertask
    spec = pertask.PerTask(tuple(sorted(set(args["per_task"]))), args["per_task_tunings"], args["per_task_seeds"])
    spec.check(run.cfg, args["num_seeds"])
    space = {"kind": "hyperparams", "search": dict(run.cfg.baseline.tune)}
    hp = build_task(dataclasses.replace(run.cfg, component=space), run.task.specs)
    picks = pertask.tune(run.cfg, hp, spec, RunDir(run.run_dir))   # per task, per k
    return [Side(pertask.label(k), "per_task", tuple(hp.trainers),
                 tuple(pertask.per_seed(p[k], args["num_seeds"]) for p in picks), picks) for k in spec.ks]


def _per_task_finish(report: dict, sides: list[Side], args) -> str:
    from metarl import pertask
    pertask.report(report, sides[0].record, args["per_task_tunings"], args["per_task_seeds"])
    return f"_per_task{'-'.join(str(k) for k in report['per_task']['ks'])}"


LEARNED = register(SideKind(
    "learned", order=1, colours=("tab:blue",), short=lambda label: "learned",
    build=lambda run, args: [] if run.meta is None else [
        Side(f"learned {run.task.kind}", "learned", tuple(make(run.meta) for make in run.task.trainers))],
    compared=(Comparison("test", None, "learned", "baseline",
                         lambda roles: "p vs tuned" if "configured" in roles else "p (paired)"),
              Comparison("test_configured", "vs_configured", "learned", "configured", "p vs config")),
    compute=_learned_compute, cost=lambda report, c: f"learned {c['search']:,} (its search and pick)" + (
        f" + {c['tuning']:,} (the tuning it starts from)" if c["tuning"] else "")))
BASELINE = register(SideKind(
    "baseline", _baseline, order=3, colours=("tab:orange",), column=None,
    compute=lambda run, args: {"tuning": run.tuned.get("matched", run.tuned)["trainings"] if run.tuned else 0},
    cost=lambda report, c: c["tuning"] and f"tuned once {c['tuning']:,} on the trained-on tasks"))
FORMULA = register(SideKind(
    "formula", _formula, order=2, colours=("tab:green",), finish=_formula_finish,
    compared=(Comparison("test_formula", "formula", "formula", "baseline"),)))
CONFIGURED = register(SideKind(
    "configured", order=5, colours=("0.55",), column=None,
    build=lambda run, args: [hand_designed("baseline as configured: ", "configured", run, build_task(
        results.load_config(run.run_dir, tuned=False), run.task.specs))] if run.tuned else [],
    # a run's baselines alone (no learned side): the tuned baseline against the configured one
    compared=(Comparison("test_tuning", "tuning", "baseline", "configured", "p vs config", unless="learned"),),
    compute=lambda run, args: {"tuning": 0}, cost=lambda report, c: "as configured 0"))
PER_TASK = register(SideKind(
    "per_task", _per_task, order=4, colours=("tab:olive", "tab:cyan", "tab:brown"),
    column=lambda label: label.split()[-1], finish=_per_task_finish,
    compared=(Comparison("test_per_task", "per_task", "per_task", "baseline"),),
    cost=lambda report, c: f"tuned per task k on each evaluated task ({report['per_task']['tunings']} tunings per "
                           f"task here, {report['per_task']['seeds_per_setting']} seeds per setting)"))
# The kinds every evaluation builds (each where it applies); others only where ``sides=[...]`` names them.
DEFAULT = tuple(SIDES.values())
