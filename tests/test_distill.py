"""`metarl.distill` and the formula components: a known formula recovered, the CLI on a tiny real run,
`metarl.evaluate distilled=K`, and the refusals. The symbolic search runs at a small budget."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from clihelp import TINY, evolve
from test_inspect import check_image

from metarl import distill, evaluate, results
from metarl.inner_loops import plugins
from metarl.errors import ConfigError, layer_errors
from metarl.run import check
from metarl.rundir import DISTILL, FIGURES
from metarl.inner_loops.components import (CLIPPED_SURROGATE, DRIFT_INPUTS, VALUE_LOSS_INPUTS, FormulaDrift,
                                           FormulaValueLoss, Progress, parse_formula)
from metarl.inner_loops.ppo import PPOConfig
from metarl.kinds import KINDS
from metarl.tasks import build_task

SMALL = ["evaluations=4000", "max_size=12", "samples=400"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny finished value-loss run whose loss also reads the training progress (a temporal form)."""
    root = tmp_path_factory.mktemp("distill")
    evolve(["experiment=value_loss", *TINY, "es.generations=2", "component.inputs=[error,progress]",
            f"run_dir={root / 'run'}"], cwd=root, check=True)
    return root / "run"


def _with_component(run_dir, component: dict, **inner):
    cfg = results.load_config(run_dir)
    return build_task(dataclasses.replace(cfg, component=component, inner={**cfg.inner, **inner}))


@pytest.mark.timeout(300)
def test_a_known_formula_is_recovered_and_simplified(run):
    """A value loss that is 0.7 e^2 + 0.3 e: the front holds it, small, and nothing on the front fits better.
    The search may reach it in any of its forms with its numbers rounded to 4 digits (0.7 e^2 + 0.3 e, or
    -0.305 e (-2.295 e - 0.9838), whose product is 0.69998 e^2 + 0.30006 e): expanded, it has the same
    terms, each coefficient within 0.1%."""
    task = _with_component(run, {"kind": "value_loss", "_target_": KINDS["value_loss"].formula,
                                 "expression": "0.7*error**2 + 0.3*error"})
    report, problem, _ = distill.fit(task, {}, max_size=12, evaluations=4000, samples=400)
    assert problem.variables == ("error",) and report["ranges"]["error"][0] < report["ranges"]["error"][1]
    e = sympy.Symbol("error", real=True)

    def is_target(expression: str) -> bool:
        terms = sympy.expand(parse_formula(expression, VALUE_LOSS_INPUTS)).as_coefficients_dict()
        target = {e**2: 0.7, e: 0.3}
        return terms.keys() == target.keys() and all(abs(float(terms[t]) / c - 1) < 1e-3 for t, c in target.items())

    exact = [f for f in report["front"] if is_target(f["expression"])]
    assert exact, report["front"]
    assert exact[0]["nmse"] < 1e-8 and exact[0]["size"] <= 9
    assert exact[0]["k"] == len(report["front"]) - 1  # nothing fits better
    sizes, errors = [f["size"] for f in report["front"]], [f["nmse"] for f in report["front"]]
    assert sizes == sorted(sizes) and errors == sorted(errors, reverse=True)


def test_formula_components_gradients_equal_the_hand_written_ones():
    config = PPOConfig(env="CartPole-v1")
    loss = FormulaValueLoss("0.7*error**2 + 0.3*error*progress + Abs(old_error)")
    assert loss.temporal and loss.init(None) == {}
    value, old_value, target = jnp.array([1.5, -2.0, 0.3]), jnp.array([1.0, 1.0, 1.0]), jnp.array([0.5, 0.5, -1.0])
    progress = Progress(jnp.float32(0.25), jnp.log(jnp.float32(100)))
    grad = jax.jit(jax.grad(lambda v: loss.apply({}, v, old_value, target, config, progress).sum()))(value)
    np.testing.assert_allclose(grad, 1.4 * (value - target) + 0.3 * 0.25, rtol=1e-6)

    drift = FormulaDrift("0.2*(ratio - 1)**2*advantage", ppo_init=False)
    ratio, advantage = jnp.array([0.8, 1.1, 1.3]), jnp.array([1.0, -2.0, 0.5])
    grad = jax.grad(lambda r: drift.apply({}, r, advantage, config).sum())(ratio)
    raw = 0.2 * (ratio - 1) ** 2 * advantage
    np.testing.assert_allclose(grad, advantage - jnp.where(raw > 0, 0.4 * (ratio - 1) * advantage, 0.0), rtol=1e-6)
    # With ppo_init the formula takes the place of LPO's network: a zero formula is PPO's clipped objective.
    np.testing.assert_allclose(FormulaDrift("0").apply({}, ratio, advantage, config),
                               CLIPPED_SURROGATE.apply({}, ratio, advantage, config), atol=1e-6)


@pytest.mark.parametrize("expression, words", [("foo(error)", "unknown function foo"),
                                               ("error + x", "unknown variable x"), ("error +", "not a formula")])
def test_a_bad_formula_names_the_field(expression, words):
    with pytest.raises(ConfigError, match=f"^component.expression: .*{words}"), layer_errors("component"):
        plugins.instantiate(KINDS["value_loss"].formula, {"expression": expression})
    with pytest.raises(ValueError, match="allowed: a formula of ratio, advantage"):
        parse_formula("error", DRIFT_INPUTS)


@pytest.mark.timeout(600)
def test_cli_front_figure_and_evaluate_with_the_formula(run, capsys):
    assert distill.main([f"run_dir={run}", *SMALL, "generation=1"]) == 0
    out = capsys.readouterr().out
    report = json.loads((run / DISTILL).read_text())
    assert report["generation"] == 1 and report["variables"] == ["error", "progress"]
    assert set(report["fixed"]) == {"log_updates"} and report["ranges"]["progress"] == [0.0, 1.0]
    front = report["front"]
    assert front and [f["k"] for f in front] == list(range(len(front)))
    for f in front:
        assert f"{f['k']:>3} {f['size']:>5}" in out and f["expression"] in out
        assert f["component"]["_target_"] == KINDS["value_loss"].formula
        plugins.instantiate(f["component"]["_target_"], {"expression": f["component"]["expression"]})
    # Temporal: three rows (0%, 50%, 100% of training) of loss and gradient.
    check_image(run / FIGURES / distill.FIGURE, (1100, 1200))

    k = report["suggested"]
    assert evaluate.main([f"run_dir={run}", "num_seeds=2", f"distilled={k}"]) == 0
    out = capsys.readouterr().out
    table = json.loads((run / f"evaluation_distilled{k}.json").read_text())
    [row] = table["tasks"]
    assert list(row["sides"]) == ["learned value_loss", "baseline: L2 value loss (clipped)", f"formula {k}"]
    assert row["sides"][f"formula {k}"]["n"] == 2 and "test_formula" in row
    assert table["formula"]["expression"] == front[k]["expression"]
    assert front[k]["expression"] in out and "norm. formula" in out and f"P(formula {k} > baseline)" in out


@pytest.mark.timeout(300)
def test_a_drift_is_distilled_as_its_learned_part(run):
    """LPO with random weights on the run's tiny trainer (two epochs, so the ratio moves off 1): the
    formula fits what the network adds inside the relu."""
    task = _with_component(run, {"kind": "policy_objective", "hidden": [4]}, update_epochs=2)
    meta = task.component.init(jax.random.key(1))
    report, problem, _ = distill.fit(task, meta, max_size=12, evaluations=4000, samples=400)
    assert problem.variables == ("ratio", "advantage") and problem.component_args == {"ppo_init": True}
    assert "relu(f + PPO's drift)" in report["fitted"]
    best = report["front"][-1]
    assert best["component"] == {"kind": "policy_objective", "_target_": KINDS["policy_objective"].formula,
                                 "expression": best["expression"], "ppo_init": True}
    assert best["nmse"] < 0.05
    lo, hi = report["ranges"]["ratio"]
    assert lo < 1.0 < hi


@pytest.mark.timeout(300)
def test_a_drift_whose_ratio_stays_at_one_is_drawn_about_it(run, tmp_path):
    """One epoch of one minibatch (the run's trainer): the ratio is 1 throughout, so it is held there, not
    fitted, and the figure draws the drift over ratios about 1."""
    task = _with_component(run, {"kind": "policy_objective", "hidden": [4]})
    meta = task.component.init(jax.random.key(1))
    report, problem, visited = distill.fit(task, meta, max_size=8, evaluations=2000, samples=200)
    assert problem.fixed == {"ratio": 1.0} and "ratio" not in report["ranges"]
    report = {**report, "run_dir": str(run), "generation": 0}
    check_image(distill.distill_figure(task, meta, problem, report, visited, tmp_path / "d.png"), (1100, 480))


def _exit_2(main, args, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_refusals_are_one_line(run, tmp_path, capsys):
    hyper = tmp_path / "hyperparams"
    hyper.mkdir()
    saved = (run / "config.yaml").read_text()
    component = saved[saved.index("component:"):saved.index("inner:")]
    (hyper / "config.yaml").write_text(saved.replace(
        component, "component:\n  kind: hyperparams\n  search:\n    lr: {low: 1.0e-4, high: 1.0e-2, log: true}\n"))
    assert "component.kind: hyperparams" in _exit_2(distill.main, [f"run_dir={hyper}"], capsys)
    assert "generation: 7 has no kept checkpoint" in _exit_2(distill.main, [f"run_dir={run}", "generation=7"], capsys)
    assert "max_size: 1; allowed: >= 3" in _exit_2(distill.main, [f"run_dir={run}", "max_size=1"], capsys)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.yaml", "best_meta_params.msgpack", "best_meta_params.json"):
        (copy / name).write_bytes((run / name).read_bytes())
    assert "distill.json does not exist" in _exit_2(evaluate.main, [f"run_dir={copy}", "distilled=0"], capsys)
    (copy / DISTILL).write_text(json.dumps({"front": [{"k": 0}, {"k": 1}]}))
    assert "distilled: 99; allowed: 0 to 1" in _exit_2(evaluate.main, [f"run_dir={copy}", "distilled=99"], capsys)
    # Called as library functions, they raise (a user's own process goes on) with the same one line.
    with pytest.raises(ConfigError, match=r"^distilled: 99; allowed: 0 to 1"):
        evaluate.evaluate(copy, distilled=99)
    with pytest.raises(ConfigError, match=r"^num_seeds: 1; allowed: >= 2"):
        evaluate.evaluate(copy, num_seeds=1)
    with pytest.raises(ConfigError, match=r"^run_dir: \S+/missing: no such directory; allowed: "):
        evaluate.evaluate(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"^max_size: 1; allowed: >= 3$"):
        distill.distill(run, max_size=1)
    with pytest.raises(ConfigError, match=r"^generation: 7 has no kept checkpoint"):
        distill.distill(run, generation=7)
    # A formula has nothing to evolve: the run is refused before it starts.
    cfg = results.load_config(run)
    formula = {"kind": "value_loss", "_target_": KINDS["value_loss"].formula, "expression": "error**2"}
    with pytest.raises(ConfigError, match="^component._target_: FormulaValueLoss has no meta-parameters"):
        check(dataclasses.replace(cfg, component=formula), setup_devices=False)
