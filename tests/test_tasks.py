"""Meta-training on several tasks: per-task fitness, normalised scores, one trace, resume, bad lists."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import TINY, evolve, run_here, final_state, records, start_and_kill_after

from metarl import stages
from metarl.outer_loops import streams
from metarl.outer_loops.fitness import degenerate, make_aggregate, normalize
from metarl.config import experiment_names, load
from metarl.errors import ConfigError
from metarl.outer_loops.evolution import ESConfig, Evolution
from metarl.tasks import build_task, task_specs

TWO_TASKS = "tasks=[CartPole-v1,{env: CartPole-v1, inner: {total_timesteps: 131072}}]"


def test_normalisation_maps_the_baseline_to_one_and_random_play_to_zero():
    reference = {"tasks": ["a", "b", "c"], "base": [500.0, -80.0, 1.0], "low": [20.0, -500.0, -1.0]}
    raw = jnp.array([[500.0, -80.0, 1.0], [20.0, -500.0, -1.0], [260.0, -290.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(normalize(raw, reference)),
                                  [[1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.5]])
    total, per_task = make_aggregate(reference, "min")(raw)
    np.testing.assert_array_equal(np.asarray(total), [1, 0, 0.5])
    assert per_task.shape == (3, 3)
    # A baseline no better than random: the score still rises with the return.
    flat = {"tasks": ["x"], "base": [10.0], "low": [22.0]}
    assert degenerate(flat) == ["x"]
    low, high = np.asarray(normalize(jnp.array([[10.0], [30.0]]), flat))[:, 0]
    assert high > low


def test_a_reference_without_intervals_still_reads():
    """Runs measured before the intervals were stored hold means only; they print and score as before."""
    old = {"tasks": ["a"], "base": [500.0], "low": [20.0], "num_seeds": 2, "seed": 0}
    assert stages.describe(old) == "a baseline 500.00, random 20.00 (over 2 seeds)"
    new = {**old, "base_ci": [[488.0, 512.0]], "low_ci": [[19.0, 21.0]]}
    assert stages.describe(new) == "a baseline 500.00 [488.00, 512.00] (+-2.5% of the gap), random 20.00 (over 2 seeds)"
    np.testing.assert_array_equal(normalize(np.array([[260.0]]), old), [[0.5]])
    with pytest.raises(ConfigError, match="^fitness.reference_seeds: 1; allowed: an integer >= 2"):
        load("value_loss", ["fitness.reference_seeds=1"])


@pytest.mark.timeout(300)
def test_reference_intervals_shrink_with_seeds_and_each_task_trains_from_the_members_keys():
    tiny = [a for a in TINY if not a.startswith("inner.total_timesteps")]
    task_cfg = load("value_loss", [*tiny, "inner.total_timesteps=512", "fitness.statistic=final",
                                   "tasks=[CartPole-v1,{env: CartPole-v1, inner: {total_timesteps: 256}}]"])
    task = build_task(task_cfg)
    few = stages.measure_reference(task, 3, 3)
    many = stages.measure_reference(build_task(task_cfg, task.specs[:1]), 3, 24)  # one task: fewer compilations
    for name in ("base", "low"):
        (lo3, hi3), (lo24, hi24) = few[name + "_ci"][0], many[name + "_ci"][0]
        assert lo3 <= few[name][0] <= hi3 and 0 < hi24 - lo24 < hi3 - lo3
    # Task i's baseline trains from outer_loops.fitness.task_key(key, i), as the control (and a member) does.
    keys = streams.stream(3, "reference_baseline", 3)
    control = np.asarray(jax.jit(jax.vmap(task.control_fn))(keys))
    np.testing.assert_allclose(few["base"], control.mean(axis=0), rtol=1e-5)
    assert control[:, 0].tolist() != control[:, 1].tolist()


@pytest.mark.parametrize("experiment", experiment_names())
def test_every_shipped_experiment_builds_and_starts_at_its_baseline(experiment):
    """Each shipped experiment's config and task build (nothing is compiled); the small families start at
    the hand-designed rule: zero meta-parameters, counted."""
    cfg = load(experiment, [])
    task = build_task(cfg)
    sizes = {"drift_family": 14, "value_loss_family": 4, "high_lr_schedule": 9}
    if experiment in sizes:
        assert sum(x.size for x in jax.tree.leaves(task.init_mean)) == sizes[experiment]
        assert all(not np.any(x) for x in jax.tree.leaves(task.init_mean))


def test_the_schedule_kind_plots_its_learned_schedules_beside_ppos(tmp_path):
    from metarl import figures

    task = build_task(load("high_lr_schedule", []))
    assert task.kind.name == "schedule"
    assert task.kind.baseline_label(task.inner_configs[0]) == "PPO's hyperparameters (lr annealed)"
    meta = {k: jnp.array([0.5, -1.0, 0.0]) for k in task.init_mean}
    paths = figures.schedule_plots(tmp_path, None, task, meta, {}, tmp_path, 5.0)
    assert paths == [tmp_path / "schedule.png"] and paths[0].stat().st_size > 1000


def test_several_tasks_trace_the_generation_once():
    def fitness(params, key):  # two "tasks" with different optima
        return jnp.stack([-jnp.sum((params["x"] - 1.0) ** 2), -jnp.sum((params["x"] + 1.0) ** 2)])

    evo = Evolution(ESConfig(popsize=8), {"x": jnp.zeros(3)}, fitness, num_seeds=2,
                    aggregate=make_aggregate(None, "mean"))
    state = evo.init(jax.random.key(0))
    for _ in range(3):
        state, stats = evo.step(state)
    assert evo.step._cache_size() == 1  # one trace and compilation of the generation
    assert stats["tasks"]["raw_mean"].shape == (2,) and stats["fitness"].shape == (8,)
    np.testing.assert_allclose(np.mean(stats["fitness"]), np.mean(stats["tasks"]["raw_mean"]), rtol=1e-5)


def test_task_specs_from_the_command_line_and_mappings():
    cfg = load("value_loss", ["tasks=[CartPole-v1,Acrobot-v1]"])
    assert [(s.name, s.env) for s in task_specs(cfg)] == [("CartPole-v1", "CartPole-v1"), ("Acrobot-v1", "Acrobot-v1")]
    cfg = load("value_loss", [TWO_TASKS, "eval_tasks=[Catch-bsuite]"])
    specs = task_specs(cfg)
    assert specs[1].name == "CartPole-v1[total_timesteps=131072]" and specs[1].inner == {"total_timesteps": 131072}
    assert [s.env for s in task_specs(cfg, "eval_tasks")] == ["Catch-bsuite"]
    task = build_task(cfg)
    assert [c.total_timesteps for c in task.inner_configs] == [65536, 131072]
    assert task.frames_per_eval == 65536 + 131072
    assert [s.name for s in task_specs(load("value_loss", []))] == ["CartPole-v1"]  # env= is one task


@pytest.mark.parametrize("override, field", [
    ("tasks=[]", "tasks"),
    ("tasks=[CartPole-v1,NoSuchEnv-v0]", "tasks[1].env"),
    ("tasks=[{env: CartPole-v1, inner: {total_timesteps: 1000}}]", "tasks[0].inner.total_timesteps"),
    ("tasks=[{env: CartPole-v1, budget: 3}]", "tasks[0].budget"),
    ("tasks=[{env: CartPole-v1, inner: {no_such: 1}}]", "tasks[0].inner.no_such"),
    ("tasks=[CartPole-v1,CartPole-v1]", "tasks[1].name"),
])
def test_bad_task_lists_name_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        build_task(load("value_loss", [override]))
    message = str(err.value)
    assert message.startswith(f"{field}:") and "\n" not in message, message


def test_a_task_the_trainer_cannot_act_in_is_named():
    with pytest.raises(ConfigError) as err:
        build_task(load("dqn_hyperparams", ["tasks=[CartPole-v1,Pendulum-v1]"]))
    assert str(err.value).startswith("tasks[1].env: 'Pendulum-v1' has continuous actions"), str(err.value)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("override", ["tasks=[]", "tasks=[CartPole-v1,NoSuchEnv-v0]",
                                      "tasks=[{env: CartPole-v1, inner: {total_timesteps: 100}}]"])
def test_bad_task_lists_exit_2_before_anything_is_written(tmp_path, override):
    code, _, stderr = run_here("metarl.evolve", ["experiment=value_loss", *TINY, override, "run_dir=run"],
                               cwd=tmp_path)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tasks"), stderr
    assert list(tmp_path.iterdir()) == []


ARGS = ["experiment=value_loss", *[a for a in TINY if not a.startswith("inner.total_timesteps")],
        "inner.total_timesteps=1024", "tasks=[CartPole-v1,{env: CartPole-v1, inner: {total_timesteps: 512}}]",
        "es.generations=5"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = evolve([*ARGS, f"run_dir={run_dir}"], cwd=run_dir.parent, check=True)
    (run_dir.parent / "stdout.txt").write_text(proc.stdout)
    return run_dir


@pytest.mark.timeout(600)
def test_two_task_run_writes_per_task_fitness_and_its_reference(straight):
    recs = records(straight)
    assert len(recs) == 5
    names = ["CartPole-v1", "CartPole-v1[total_timesteps=512]"]
    for r in recs:
        assert list(r["tasks"]) == names
        for t in r["tasks"].values():
            assert set(t) == {"raw_mean", "score_mean", "raw_best", "score_best"}
    reference = json.loads((straight / "reference.json").read_text())
    assert reference["tasks"] == names and len(reference["base"]) == len(reference["low"]) == 2
    assert reference["num_seeds"] == 32  # fitness.reference_seeds, not fitness.num_seeds
    assert stages.describe(reference) in (straight.parent / "stdout.txt").read_text()  # printed at the start
    for name in ("base", "low"):
        for mean, (low, high) in zip(reference[name], reference[name + "_ci"]):
            assert low <= mean <= high
    # The fitness the strategy ranked is the mean of the normalised scores.
    r = recs[-1]
    np.testing.assert_allclose(r["mean"], np.mean([t["score_mean"] for t in r["tasks"].values()]), rtol=1e-4)
    best = json.loads((straight / "best_meta_params.json").read_text())
    assert best["tasks"] == names


@pytest.mark.timeout(900)
def test_multi_task_run_killed_and_resumed_equals_the_straight_run(tmp_path, straight):
    run_dir = tmp_path / "killed"
    assert start_and_kill_after([*ARGS, f"run_dir={run_dir}"], tmp_path, run_dir, 2) < 5, \
        "the run finished before it could be killed"
    reference = (run_dir / "reference.json").read_text()
    final = evolve([*ARGS, f"run_dir={run_dir}"], cwd=tmp_path, check=True)
    assert "measured the reference" not in final.stdout  # read back, not measured again
    assert (run_dir / "reference.json").read_text() == reference
    assert records(run_dir) == records(straight)
    (sa, ma), (sb, mb) = final_state(run_dir), final_state(straight)
    assert ma["generation"] == mb["generation"] == 5
    for x, y in zip(jax.tree.leaves(sa.es_state), jax.tree.leaves(sb.es_state)):
        np.testing.assert_array_equal(x, y)


def test_a_baseline_within_noise_of_random_play_is_flagged():
    """The reference's intervals decide, as evaluate's one-sided Welch test does: a baseline mean above random
    play's by less than the seeds' scatter is flagged; the same gap with tight intervals is not."""
    noisy = {"tasks": ["x"], "base": [25.0], "low": [22.0], "base_ci": [[15.0, 35.0]], "low_ci": [[21.0, 23.0]],
             "num_seeds": 8}
    tight = {**noisy, "base_ci": [[24.0, 26.0]]}
    assert degenerate(noisy) == ["x"] and degenerate(tight) == []
    assert degenerate({**tight, "base": [21.0], "base_ci": [[20.0, 22.0]]}) == ["x"]   # below random play
