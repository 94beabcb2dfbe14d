"""A side kind registered from outside metarl (tests/dummy_side.py, one entry) goes through ``metarl.evaluate``
whole: built from the loaded run, trained on the evaluation's seeds, compared with the baseline in the report's JSON,
in the printed table and aggregates, in the scores figure, and restated from its record as the stored ones are."""
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from metarl import evaluate, plots, sides

LABEL = "baseline, other seeds"   # dummy_side.OTHER_SEEDS's side on a run with an untuned baseline


@pytest.mark.timeout(600)
def test_a_side_kind_of_ones_own_is_built_compared_printed_and_drawn(tiny_value_loss_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_value_loss_run[0], run_dir)   # the session's run is read-only
    args = [f"run_dir={run_dir}", "num_seeds=3", "num_cpu_devices=1", "tasks=[CartPole-v1,Acrobot-v1]"]
    assert evaluate.main([*args, "sides=[dummy_side.OTHER_SEEDS]"]) == 0
    out = capsys.readouterr().out
    wrote = [line.removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote ")]
    assert wrote[0].endswith("_other_seeds.json") and all(Path(p).is_file() for p in wrote)
    report = json.loads(Path(wrote[0]).read_text())

    # the JSON: the side, its tests against the baseline per task, its IQMs per split, its compute
    assert [s["role"] for s in report["sides"]] == ["learned", "baseline", "other_seeds"]
    assert report["sides"][2]["label"] == LABEL and report["compute"]["other_seeds"] == {"tuning": 0}
    base = report["sides"][1]["label"]
    for row in report["tasks"]:
        assert 0 <= row["test_other_seeds"]["paired_p"] <= 1 and LABEL in row["normalized"]
        assert len(row["sides"][LABEL]["final_returns"]) == len(row["sides"][base]["final_returns"]) == 3
    agg = report["aggregate"]["held-out"]["other_seeds"]
    assert agg["iqm_learned_ci95"][0] <= agg["iqm_learned"] <= agg["iqm_learned_ci95"][1]

    # the printed table and aggregates: its columns after the baseline's (order 3.5), its p, its difference
    header = next(line for line in out.splitlines() if line.startswith("task"))
    assert header.index("baseline [95% CI]") < header.index(f"{LABEL} [95% CI]")
    assert "norm. A/A" in header and header.endswith(f"{'p (paired)':>13}{'p A/A':>13}")
    assert f"{LABEL} - baseline " in out and f"P({LABEL} > baseline) = " in out
    assert "; the baseline on other seeds 0\n" in out and f"; {LABEL}; stratified bootstrap CIs" in out

    # the figure: the side with its colour and its IQM beside the learned side's and the baseline's
    shown = [(label, colour, c.part, key) for label, colour, c, key in sides.compared(report["sides"])]   # as drawn
    assert [(label, colour) for label, colour, *_ in shown][2] == (LABEL, "tab:red")
    fig = plots.task_scores_figure(report["tasks"], report["aggregate"], shown)
    assert fig.axes[0].get_legend_handles_labels()[1] == [s["label"] for s in report["sides"]]

    # its record restates to the same statistics, as the stored records do (examples/restate.py)
    again = evaluate.restate(json.loads(Path(wrote[0]).read_text()))
    assert json.dumps(again["aggregate"], sort_keys=True) == json.dumps(report["aggregate"], sort_keys=True)


@pytest.mark.timeout(300)
def test_the_side_trains_from_other_keys_than_the_baselines(tiny_value_loss_run):
    """At the tiny run's budget no episode ends (every final return is 0): the trained networks tell them apart."""
    import dummy_side

    run = evaluate._load(tiny_value_loss_run[0], None, None)
    (base,), (other,) = sides.BASELINE.build(run, {}), dummy_side.OTHER_SEEDS.build(run, {})
    key = jax.random.key(0)
    trained, moved = (jax.tree.leaves(jax.jit(side.trainers[0])(key)[0]) for side in (base, other))
    assert not all(np.array_equal(a, b) for a, b in zip(trained, moved))


def test_a_side_kind_that_is_not_one_is_refused_in_one_line(tiny_value_loss_run, capsys):
    for name, says in (("dummy_side.other_seeds", "sides: dummy_side.other_seeds is a function, not a SideKind"),
                       ("nowhere.SIDE", "sides: 'nowhere.SIDE' cannot be imported"), ("OTHER", "sides: 'OTHER'; ")):
        with pytest.raises(SystemExit) as stop:
            evaluate.main([f"run_dir={tiny_value_loss_run[0]}", f"sides=[{name}]"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"error: {says}") and err.count("\n") == 1, err
    assert "other_seeds" not in [kind.name for kind in sides.DEFAULT]   # registered, built only where asked
