"""``python -m metarl.distill run_dir=RUN_DIR [generation=best] [max_size=25] [seed=0] [evaluations=200000]
[samples=2000]``: closed-form formulas read off a run's learned value loss or policy objective.

Records the component's inputs over one training per task, samples points where training goes, fits
formulas to the learned function there by symbolic regression (pyoperon, seeded) and keeps the front
of size against NMSE. Prints the front and writes RUN_DIR/distill.json (entry K is
``python -m metarl.evaluate run_dir=RUN_DIR distilled=K``) and RUN_DIR/figures/distill.png. ``generation=G``
distils the best found up to kept checkpoint G. Needs ``pip install metarl[distill]``; docs/distill.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from metarl import compilation, kinds, results, rundir
from metarl.commands import run_command
from metarl.errors import ConfigError
from metarl.inner_loops.components import (CLIPPED_SURROGATE, L2_VALUE_LOSS, Recording, component_at,
                                           formula_function, formula_problem, parse_formula, value_and_gradient)
from metarl.outer_loops import streams
from metarl.progress import progress

FIGURE = "distill.png"
QUANTILES = (0.005, 0.995)
SUGGESTED_NMSE = 0.01     # the suggested formula: the smallest that leaves at most 1% of the variance
# Smooth blocks (like the networks' tanh) and abs, so no formula divides by 0 or logs a negative between points.
OPERATORS = "add,sub,mul,square,tanh,abs,exp,constant,variable"
# How the inputs read in the figure's legend (error as δ, so that e stays Euler's number).
LATEX_NAMES = {"error": r"\delta", "old_error": r"\delta_{old}", "target": r"\mathrm{target}", "ratio": "r",
               "advantage": "A", "progress": r"\mathrm{progress}", "log_updates": r"\mathrm{log\_updates}"}
# Searched less their centre: ratios stay near 1, so ratio - 1 avoids large terms that cancel (and rounding breaks).
CENTRES = {"ratio": 1}


@dataclasses.dataclass
class Problem:
    """The learned function of one run, seen as a function of named inputs."""
    inputs: tuple          # every input the formula component takes (components.VALUE_LOSS_INPUTS / DRIFT_INPUTS)
    variables: tuple       # those the formulas are fitted over, in the columns' order
    fitted: str            # what is fitted, in words
    component_args: dict = dataclasses.field(default_factory=dict)  # further arguments of the formula component
    fixed: dict = dataclasses.field(default_factory=dict)           # inputs held at one value: {name: value}


def visited_inputs(task, meta, seed: int) -> dict:
    """{input: 1-d array} at the seam over one training per task; rows aligned (one sample of a minibatch each)."""
    recorder = Recording(task.component)
    for i, inner in enumerate(task.inner_configs):
        train = task.trainer.make_train(inner, **{task.kind.seam: recorder})
        args = (streams.recording(seed, i), {task.kind.seam: meta})
        jax.block_until_ready(compilation.compile_program(jax.jit(train), *args)(*args))
        jax.effects_barrier()  # every callback has run
    return recorder.inputs(task.kind is kinds.VALUE_LOSS)


def sample_points(visited: dict, problem: Problem, samples: int, seed: int) -> tuple[dict, dict]:
    """``(points, ranges)`` as docs/distill.md describes them; an input seen at one value moves to ``problem.fixed``."""
    rng = np.random.default_rng(seed)
    ranges = {}
    for name in problem.variables:
        if name == "progress":
            ranges[name] = [0.0, 1.0]
        elif np.ptp(visited[name]) == 0:  # one horizon; a ratio of 1 throughout with one epoch
            problem.fixed[name] = float(visited[name][0])
        else:
            ranges[name] = [float(q) for q in np.quantile(visited[name], QUANTILES)]
    problem.variables = tuple(n for n in problem.variables if n not in problem.fixed)
    inside = [(visited[name] >= low) & (visited[name] <= high) for name, (low, high) in ranges.items()]
    rows = rng.choice(np.flatnonzero(np.all(inside, axis=0)), samples // 2)
    return {name: np.concatenate([visited[name][rows], rng.uniform(*ranges[name], samples - len(rows))])
            if name in ranges else np.full(samples, problem.fixed.get(name, 0.0)) for name in problem.inputs}, ranges


def search(X: np.ndarray, y: np.ndarray, max_size: int, evaluations: int, seed: int) -> list[str]:
    """Formulas from pyoperon's NSGA-II front of fit (R^2) against length, as text over x0, x1, ..."""
    try:
        from pyoperon.sklearn import SymbolicRegressor
    except ImportError:
        raise ConfigError("distill needs pyoperon; allowed: after `pip install metarl[distill]`") from None
    reg = SymbolicRegressor(allowed_symbols=OPERATORS, objectives=["r2", "length"], max_length=max_size,
                            population_size=500, generations=10_000, max_evaluations=evaluations,
                            optimizer_iterations=10, n_threads=1, random_state=seed)
    reg.fit(np.array(X, np.float32), np.array(y, np.float32))  # writable copies of one dtype, as its C++ side needs
    return [reg.get_model_string(m["tree"], precision=12, names=[f"x{i}" for i in range(X.shape[1])])
            for m in reg.pareto_front_]


def readable(text: str, variables: tuple, scale: float):
    """A searched formula (over x0, x1, ... = inputs less ``CENTRES``) in sympy, numbers to 4 digits and additive
    ones below 1e-3 of ``scale`` dropped: the smallest of its forms as parsed, expanded, factored or simplified."""
    import sympy

    def rounded(form):
        digits = {f: float(f"{float(f):.4g}") for f in form.atoms(sympy.Float)}
        form = form.xreplace({f: sympy.Integer(int(d)) if d == int(d) and abs(d) < 1e4 else sympy.Float(d)
                              for f, d in digits.items()})
        if not isinstance(form, sympy.Add):
            return form
        return sympy.Add(*[a for a in form.args if not (a.is_Number and abs(float(a)) < 1e-3 * scale)])

    columns = [sympy.Symbol(f"x{i}", real=True) for i in range(len(variables))]
    # sympify reads pyoperon's ^ as a power
    expr = sympy.sympify(text, locals={**{str(c): c for c in columns}, "abs": sympy.Abs, "square": lambda a: a**2})
    forms = [expr, sympy.expand(expr), sympy.factor_terms(expr)]
    if not expr.atoms(sympy.Function):  # sympy's simplify spends minutes on nested tanh and exp
        forms.append(sympy.simplify(expr))
    forms = [rounded(f) for f in forms]
    inputs = {c: sympy.Symbol(n, real=True) - CENTRES.get(n, 0) for c, n in zip(columns, variables)}
    # c (ratio - 1) stays as it is, not c ratio - c merged with other numbers
    with sympy.evaluate(not any(n in CENTRES for n in variables)):
        forms = [f.xreplace(inputs) for f in forms]
    return min(forms, key=size)


def size(expr) -> int:
    import sympy
    return sum(1 for _ in sympy.preorder_traversal(expr))


def score(problem: Problem, expression: str, points: dict, y: np.ndarray) -> dict:
    """The rounded formula as the formula component computes it, against the learned function."""
    names, fn = formula_function(parse_formula(expression, problem.inputs))
    # a number beyond float32 becomes inf, and the formula is dropped
    with warnings.catch_warnings(action="ignore", category=RuntimeWarning):
        f = np.broadcast_to(np.asarray(fn(*(points[n].astype(np.float32) for n in names)), np.float64), y.shape)
    mse = float(np.mean((f - y) ** 2))
    return {"mse": mse, "nmse": mse / max(float(np.var(y)), 1e-12)}


def fit(task, meta, max_size: int = 25, seed: int = 0, evaluations: int = 200_000, samples: int = 2000):
    """``(report, problem, visited)``; a learned function not finite where training visits raises ValueError."""
    import sympy

    t = time.perf_counter()
    problem = Problem(*formula_problem(task.component, task.kind is kinds.VALUE_LOSS))
    with progress("recording the component's inputs over training"):
        visited = visited_inputs(task, meta, seed)
    recorded_s = time.perf_counter() - t
    points, ranges = sample_points(visited, problem, samples, seed)
    inputs = {k: jnp.asarray(v, jnp.float32) for k, v in points.items()}
    y = np.asarray(component_at(task.component, meta, inputs, task.inner_config, task.kind is kinds.VALUE_LOSS,
                                learned_part=True))
    if not np.all(np.isfinite(y)):
        raise ValueError(f"the learned {task.kind} is not finite where training visits; nothing to fit")
    X = np.stack([points[n] - CENTRES.get(n, 0) for n in problem.variables], axis=1)

    t = time.perf_counter()
    with progress("searching formulas (pyoperon)"):
        found = search(X, y, max_size, evaluations, seed)
    search_s = time.perf_counter() - t
    scale = float(np.std(y)) or 1.0
    exprs = {}  # by their text: the first of those that read the same
    for expr in (readable(text, problem.variables, scale) for text in found):
        exprs.setdefault(sympy.sstr(expr, full_prec=False), expr)
    candidates = [{"size": size(expr), **score(problem, expression, points, y), "expression": expression,
                   "latex": sympy.latex(expr, symbol_names={v: LATEX_NAMES[v.name] for v in expr.free_symbols}),
                   "component": {"kind": task.kind.name, "_target_": task.kind.formula,
                                 "expression": expression, **problem.component_args}}
                  for expression, expr in exprs.items()]
    front = []  # those no other is at least as small and as accurate as (strictly one of them), by size
    for c in sorted((c for c in candidates if np.isfinite(c["nmse"])), key=lambda c: (c["size"], c["nmse"])):
        if not front or c["nmse"] < front[-1]["nmse"]:
            front.append({**c, "k": len(front)})
    report = {
        "kind": task.kind.name, "component": type(task.component).__name__, "fitted": problem.fitted,
        "variables": list(problem.variables), "fixed": problem.fixed, "ranges": ranges,
        "quantiles": list(QUANTILES), "samples": samples, "recorded": len(next(iter(visited.values()))),
        "search": {"library": f"pyoperon {version('pyoperon')}", "operators": OPERATORS, "max_size": max_size,
                   "evaluations": evaluations, "seed": seed, "seconds": round(search_s, 2)},
        "recording_seconds": round(recorded_s, 2),
        "suggested": next((e["k"] for e in front if e["nmse"] <= SUGGESTED_NMSE), front[-1]["k"]),
        "suggested_rule": f"the smallest formula with NMSE <= {SUGGESTED_NMSE}", "front": front,
    }
    return report, problem, visited


def distill(run_dir: str | Path, generation: int | str = "best", max_size: int = 25, seed: int = 0,
            evaluations: int = 200_000, samples: int = 2000) -> dict:
    """Fits the exported best (or the best up to kept checkpoint ``generation``); returns and writes the report.
    Bad input: ``ConfigError`` (a ``ValueError``) naming the argument; an unreadable run: it or ``CheckpointError``."""
    from metarl.search import build_evolution  # the run's modules: seconds that --help does without

    if generation != "best" and (isinstance(generation, str) or generation < 0):
        raise ConfigError(f"generation: {generation!r}; allowed: best, or a checkpointed generation number")
    for name, value, least in (("max_size", max_size, 3), ("evaluations", evaluations, 1000), ("samples", samples, 10)):
        if value < least:
            raise ConfigError(f"{name}: {value}; allowed: >= {least}")
    rundir.RunDir(run_dir).require_run()
    run_dir, run, t = Path(run_dir), rundir.RunDir(run_dir), time.perf_counter()
    cfg, task = results.load_run(run_dir)
    if task.kind.formula is None:
        raise ConfigError(f"component.kind: {task.kind} in {run_dir}; allowed: "
                          f"{' or '.join(name for name, kind in kinds.KINDS.items() if kind.formula)} "
                          "(hyperparameters are numbers already: `python -m metarl.evaluate` reports them)")
    if generation == "best":
        meta, info = run.read_best(task.template)
    else:
        with contextlib.closing(rundir.Checkpointer(run_dir, write=False)) as ckpt:
            if generation not in (steps := sorted(ckpt.manager.all_steps())):
                raise ConfigError(f"generation: {generation} has no kept checkpoint in {run_dir}; allowed: best"
                                  + "".join(f", {s}" for s in steps))
            _, evo = build_evolution(cfg, task=task, mesh=None)
            state, _ = ckpt.restore(evo.init(streams.evolution(cfg.seed)), generation)
        meta, info = state.best_params, {"generation": generation, "fitness": float(state.best_fitness)}
    try:
        report, problem, visited = fit(task, meta, max_size, seed, evaluations, samples)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"{run_dir}: {err}") from err
    report = {"run_dir": str(run_dir), "generation": info.get("generation"), "fitness": info.get("fitness"),
              "from": str(generation), **report}
    report["figure"] = str(distill_figure(task, meta, problem, report, visited, run.figures / FIGURE))
    report["json"] = str(run.distill.write(report))
    report["seconds"] = round(time.perf_counter() - t, 2)
    return report


def distill_figure(task, meta, problem: Problem, report: dict, visited: dict, path: Path) -> Path:
    """``figures/distill.png`` as docs/distill.md describes it, written to ``path``."""
    from metarl import plots  # matplotlib: seconds that --help does without

    config, value_loss, front = task.inner_config, task.kind is kinds.VALUE_LOSS, report["front"]
    x_name = "error" if value_loss else "ratio"
    # An input training held at one value (the ratio with one epoch of one minibatch) is drawn about it.
    ranges = {**{n: [v - 0.5, v + 0.5] for n, v in problem.fixed.items()}, **report["ranges"]}
    x = np.linspace(*ranges[x_name], 201)
    # Inputs not drawn: fitted ones at their visited median, the rest at their one value (or 0).
    base = {n: float(np.median(visited[n])) if n in problem.variables else problem.fixed.get(n, 0.0)
            for n in problem.inputs}
    # The panels of a row: (title, ylabel, further inputs drawn at, curve from a side's value y and gradient g).
    if value_loss:
        xlabel, baseline = "error δ = prediction - target", ("L2: 0.5 δ²", L2_VALUE_LOSS)
        panels = [("loss - loss at error 0", "loss", {}, lambda y, g: y - y[np.argmin(np.abs(x))]),
                  ("gradient w.r.t. the prediction", "d loss / d prediction", {}, lambda y, g: g)]
    else:
        xlabel, baseline = "ratio r = π / π_old", (f"PPO (clip_eps={float(config.clip_eps):g})", CLIPPED_SURROGATE)
        advantages = [round(float(q), 2) for q in np.quantile(visited["advantage"], (0.9, 0.1))]
        panels = [(f"drift at advantage {a:g}", "drift", {"advantage": a}, lambda y, g: y) for a in advantages]
    # The sides: learned, the smallest, the suggested and the most accurate formula, and the baseline.
    sides = [("learned", task.component, meta, "learned"),
             *[(f"formula {e['k']} (size {e['size']}, NMSE {e['nmse']:.2g})"
                + (f": {plots.math_label(e['latex'])}" if plots.math_label(e["latex"]) else ""),
                task.kind.build({k: v for k, v in e["component"].items() if k != "kind"}, []), {}, "formula")
               for e in (front[k] for k in sorted({0, report["suggested"], len(front) - 1}))],
             (*baseline, {}, "baseline")]

    fns = [jax.jit(functools.partial(value_and_gradient, comp, config=config, value_loss=value_loss))
           for _, comp, _, _ in sides]  # each compiled once

    def panel(title, ylabel, drawn, curve):
        pts = {n: jnp.full(len(x), v, jnp.float32) for n, v in {**base, x_name: x, **drawn}.items()}
        curves = [(label, curve(*jax.tree.map(np.asarray, fn(m, pts))), style)
                  for fn, (label, _, m, style) in zip(fns, sides)]
        return {"title": title, "ylabel": ylabel, "curves": curves}

    moments = ({f", at {f:.0%} of training": {"progress": f} for f in (0.0, 0.5, 1.0)}
               if "progress" in problem.variables else {"": {}})
    rows = [[panel(title + when, ylabel, {**at, **drawn}, curve) for title, ylabel, drawn, curve in panels]
            for when, at in moments.items()]
    held = [n for n in problem.variables if n not in (x_name, "progress")]
    note = (f"{report['component']} of {report['run_dir']} (generation {report['generation']}); fitted: "
            f"{problem.fitted} over {', '.join(problem.variables)}"
            + (f"; drawn with {', '.join(held)} at the visited median" if held else "")
            + "".join(f"; {n} = {v:.3g}" for n, v in problem.fixed.items()))
    return plots.save(plots.formula_figure(x, rows, xlabel, note), path)


def format_report(report: dict) -> str:
    r, search = report, report["search"]
    spec = r["front"][r["suggested"]]["component"]  # the suggested formula's, in code
    module, _, name = spec["_target_"].rpartition(".")
    args = ", ".join(f"{k}={v!r}" for k, v in spec.items() if k not in ("kind", "_target_"))
    row = "{:>3} {:>5} {:>10}{} {}".format  # the front's table: K, size, NMSE, * on the suggested one, formula
    ranges = ", ".join(f"{n} in [{lo:.3g}, {hi:.3g}]" for n, (lo, hi) in r["ranges"].items())
    return "\n".join([
        f"distilled the learned {r['kind']} ({r['component']}) of {r['run_dir']}, generation {r['generation']} "
        f"(fitness {r['fitness']:.4g})",
        f"fitted: {r['fitted']} over {ranges}" + "".join(f"; {n} = {v:.4g}" for n, v in r["fixed"].items()),
        f"  {r['samples']} points: half from {r['recorded']} inputs recorded in training, half uniform over their "
        f"{QUANTILES[0]:.1%}-{QUANTILES[1]:.1%} range",
        f"search: {search['library']}, {search['evaluations']} evaluations, max_size {search['max_size']}, seed "
        f"{search['seed']}: {search['seconds']:.1f} s (recording the inputs: {r['recording_seconds']:.1f} s)", "",
        row("K", "size", "NMSE", " ", "formula"),
        *(row(e["k"], e["size"], f"{e['nmse']:.3g}", "*" if e["k"] == r["suggested"] else " ", e["expression"])
          for e in r["front"]), "",
        f"* suggested: {r['suggested_rule']} (NMSE = mean squared error / variance of the learned function over "
        "the points)",
        f"compare on fresh seeds: python -m metarl.evaluate run_dir={r['run_dir']} distilled={r['suggested']}",
        f"in code: from {module} import {name}; {name}({args})",
        f"wrote {r['json']}", f"wrote {r['figure']}"])


def load_formula(run_dir: Path, k: int) -> dict:
    """Entry ``k`` of the run's distilled front; a bad ``k`` or none: ``ConfigError``."""
    file = rundir.RunDir(run_dir).distill
    report, path = file.read(), file.path
    if report is None:
        raise ConfigError(f"distilled: {path} does not exist; allowed: after "
                          f"`python -m metarl.distill run_dir={run_dir}`")
    front = report["front"]
    if not 0 <= k < len(front):
        raise ConfigError(f"distilled: {k}; allowed: 0 to {len(front) - 1} (the front in {path})")
    return front[k]


def main(argv: list[str] | None = None) -> int:
    return run_command(argv, distill, __doc__, format_report)


if __name__ == "__main__":
    sys.exit(main())
