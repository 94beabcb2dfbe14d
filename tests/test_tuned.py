"""A tuned baseline (``baseline.tune``) and the final pick on fresh seeds (``fitness.validation_top``).

At tiny sizes, through the real command line: the tuned point is what the learned part starts from
and what the normalised fitness, the live control and ``evaluate`` compare with; a run killed while
it tunes continues to the same tuned point; and the final pick, re-scored on seeds the search never
used, is the candidate that is really best, not the one the search's seeds flattered.
"""
import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import TINY, evolve, start_and_kill_after
from metarl.rundir import RunDir
from metarl.stats import bracket

pytestmark = pytest.mark.timeout(900)

TUNE = "baseline.tune={lr: {low: 1.0e-4, high: 1.0e-2, log: true}, ent_coef: {low: 1.0e-3, high: 0.1, log: true}}"
ARGS = ["experiment=high_lr_schedule", *[a for a in TINY if not a.startswith("component.hidden")],
        "tasks=[CartPole-v1]", "eval_tasks=[Acrobot-v1]", "inner.total_timesteps=128", "fitness.num_seeds=2",
        "fitness.reference_seeds=2", "fitness.normalize=baseline", "es.generations=1", "baseline.generations=3",
        "baseline.es={std_init: 2.0}", "fitness.validation_top=2", "fitness.validation_seeds=4", TUNE,
        "baseline.tunings=2"]


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuned")
    result = evolve([*ARGS, f"run_dir={root / 'run'}"], cwd=root, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run", result.stderr + result.stdout


def test_the_tuned_point_is_used_by_fitness_control_and_evaluate(tuned_run):
    from metarl import evaluate, results
    from metarl.outer_loops.fitness import make_aggregate
    from metarl.rundir import RunDir
    from metarl.search import build_evolution

    run_dir, output = tuned_run
    tuned = json.loads((run_dir / "tuned.json").read_text())
    values, configured = tuned["hyperparameters"], tuned["configured"]
    assert set(values) == {"lr", "ent_coef"} and 1e-4 <= values["lr"] <= 1e-2 and 1e-3 <= values["ent_coef"] <= 0.1
    assert configured == {"lr": 2.5e-4, "ent_coef": 0.01} and values != configured
    assert tuned["trainings"] >= tuned["search_trainings"] > 0   # a budget at least the search's
    low, high = tuned["fitness_ci95"]                             # the pick's interval on fresh seeds
    assert low <= tuned["fitness"] <= high
    assert isinstance(tuned["warnings"], list)   # edge and convergence checks (tuning_warnings)
    wide = tuned["fitness_ci95_best_of"]          # chosen as the best of its candidates: a wider interval
    assert wide[0] <= low <= high <= wide[1]
    # Two tunings on seeds of their own, both scored on the same fresh seeds; the better is the baseline.
    first, second = tuned["tunings"]
    assert [first["run_dir"], second["run_dir"]] == ["tune", "tune-2"] and first["seed"] != second["seed"]
    assert tuned["hyperparameters"] == tuned["tunings"][tuned["chosen"]]["hyperparameters"]
    assert tuned["tunings"][tuned["chosen"]]["fresh_fitness"] == max(first["fresh_fitness"], second["fresh_fitness"])
    assert tuned["spread"]["lr"] == sorted([first["hyperparameters"]["lr"], second["hyperparameters"]["lr"]])
    assert tuned["trainings"] == first["trainings"] + second["trainings"] + 2 * 4 * 2  # the fresh seeds' too
    assert "the best of 2 tunings on 4 fresh seeds" in output and "tune-2" in output
    # each tuning's interval adjusted for the choice of the best of 2 (Bonferroni): wider, and the one printed
    for t in tuned["tunings"]:
        assert t["fresh_ci95_best_of"][0] <= t["fresh_ci95"][0] <= t["fresh_ci95"][1] <= t["fresh_ci95_best_of"][1]
        assert f"{t['run_dir']} {t['fresh_fitness']:.3f} {bracket(t['fresh_ci95_best_of'])}" in output
    assert "(adjusted for the best of 2); tune" in output
    assert "tuned baseline: lr" in output
    # The learned part starts from the tuned values; the normalised fitness scores against the tuned PPO.
    cfg, task = results.load_run(run_dir)
    assert task.inner_config.lr == pytest.approx(values["lr"]) and task.inner_config.ent_coef == pytest.approx(
        values["ent_coef"])
    assert results.load_config(run_dir, tuned=False).inner.get("lr") == 2.5e-4
    reference = RunDir(run_dir).reference.read()
    assert reference["tuned"] == values
    # The live control of generation 1 is the tuned PPO on that generation's seeds.
    _, evo = build_evolution(cfg, task, mesh=None, reference=reference)
    _, _, seed_keys, _ = evo.generation_keys(evo.init(jax.random.key(cfg.seed)).key)
    control = jax.jit(jax.vmap(task.control_fn))(seed_keys)
    fitness, _ = make_aggregate(reference, cfg.fitness.aggregate)(jnp.mean(control, axis=0)[None])
    history = results.history(run_dir)
    assert history[0]["control"] == pytest.approx(float(fitness[0]), rel=1e-5)
    # evaluate: three sides, normalised by the tuned PPO, the learned side tested against both baselines.
    report = evaluate.evaluate(run_dir, num_seeds=2, num_cpu_devices=1)
    learned, tuned_side, configured_side = list(report["tasks"][0]["sides"])
    assert tuned_side.startswith("tuned baseline") and configured_side.startswith("baseline as configured")
    assert [r["split"] for r in report["tasks"]] == ["trained-on", "held-out"]
    for row in report["tasks"]:
        # the side the scores are normalised by scores 1 (-1 where, at this tiny budget, it is below random play)
        assert abs(row["normalized"][tuned_side]) == pytest.approx(1.0)
        assert {"test", "test_configured"} <= set(row)
    assert report["tuned"]["hyperparameters"] == values
    assert set(report["aggregate"]["held-out"]["vs_configured"]) >= {"iqm_baseline", "probability_of_improvement"}
    text = evaluate.format_report(report)
    assert "p vs tuned" in text and "p vs config" in text and "P(learned > baseline as configured)" in text
    assert f"its fitness on fresh seeds {tuned['fitness']:.3f} [" in text
    assert "] (adjusted for the best of its candidates)" in text
    assert "spread across 2 tunings (baseline: the best of 2 tunings on 4 fresh seeds): fresh_fitness " in text
    # One final return for the search and the evaluation: the run's fitness.statistic and window.
    assert report["statistic"] == "mean episode return over the last 20% of updates (the search's fitness statistic)"
    picked = json.loads((run_dir / "validation.json").read_text())["picked"]
    assert report["picked"] == picked and f"({picked} of generation " in text.splitlines()[0]


def test_the_final_pick_is_exported_with_what_it_was_picked_from(tuned_run):
    run_dir, _ = tuned_run
    for where in (run_dir, run_dir / "tune"):  # the search's pick and the tuning's
        validation = json.loads((where / "validation.json").read_text())
        labels = [c["candidate"] for c in validation["candidates"]]
        assert labels[-1] == "search mean" and 2 <= len(labels) <= 3 and validation["seeds"] == 4
        scores = [c["validation_fitness"] for c in validation["candidates"]]
        assert validation["picked"] == labels[int(np.argmax(scores))]
        _, info = RunDir(where).read_best()
        assert info["picked"] == validation["picked"] and info["validation_fitness"] == max(scores)
        for c in validation["candidates"]:  # the interval of the best of them covers the 95% one, and is wider
            (low, high), (wide_low, wide_high) = c["validation_ci95"], c["validation_ci95_best_of"]
            assert wide_low <= low <= high <= wide_high and (high == low or wide_high - wide_low > high - low)
    tuned = json.loads((run_dir / "tuned.json").read_text())
    assert tuned["picked"] == json.loads((run_dir / tuned["run_dir"] / "validation.json").read_text())["picked"]


def test_a_kill_while_tuning_continues_to_the_same_tuned_point(tuned_run, tmp_path):
    straight, _ = tuned_run
    run_dir = tmp_path / "run"
    args = [*ARGS, f"run_dir={run_dir}"]
    logged = start_and_kill_after(args, tmp_path, run_dir / "tune", generations=1)
    assert 1 <= logged < 3 and not (run_dir / "tuned.json").exists()
    result = evolve([f"resume={run_dir}"], cwd=tmp_path, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = json.loads((run_dir / "tuned.json").read_text())
    expected = json.loads((straight / "tuned.json").read_text())
    assert resumed["hyperparameters"] == expected["hyperparameters"]
    assert (run_dir / "best_meta_params.msgpack").read_bytes() == (straight / "best_meta_params.msgpack").read_bytes()


def test_a_resumed_run_reads_its_finished_picks_instead_of_scoring_again(tuned_run, tmp_path):
    # Killed after its tunings finished but before tuned.json: the resume re-enters every tuning, and each
    # tuning's pick (and the run's own) is read from validation.json, not scored again on the fresh seeds.
    straight, _ = tuned_run
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    (run_dir / "tuned.json").unlink()
    kept = {p: p.read_bytes() for p in run_dir.rglob("*") if p.name in ("validation.json", "best_meta_params.msgpack")}
    assert len(kept) == 6   # the run's, tune's and tune-2's
    result = evolve([f"resume={run_dir}"], cwd=tmp_path, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("picked earlier on 4 fresh seeds: ") == 3 and "\npicked on " not in result.stdout
    assert "compiled the generation" not in result.stdout   # finished searches compile nothing
    assert {p: p.read_bytes() for p in kept} == kept
    def timeless(tuned):   # the seconds each took differ; nothing else may
        return {**{k: v for k, v in tuned.items() if k != "seconds"},
                "tunings": [{k: v for k, v in t.items() if k != "seconds"} for t in tuned["tunings"]]}
    resumed, expected = (timeless(json.loads((d / "tuned.json").read_text())) for d in (run_dir, straight))
    assert resumed == expected


def test_a_tuning_smaller_than_the_search_is_refused(tmp_path):
    result = evolve([*ARGS, "baseline.generations=1", "es.generations=2", f"run_dir={tmp_path / 'run'}"],
                    cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines()[-1].startswith("error: baseline.generations: the tuning trains")


def test_the_pick_on_fresh_seeds_is_the_really_best_candidate_not_the_luckiest():
    """A search whose seed noise dwarfs the differences between members: the best member on its own
    seeds is mostly luck, and the validation pick (many fresh seeds) is the candidate nearest the optimum."""
    from metarl.outer_loops.es_config import ESConfig
    from metarl.outer_loops.evolution import Evolution

    def fitness(x, key):  # optimum at 0; noise of std 3 per seed against differences of about 1
        return -jnp.sum(x["w"] ** 2) + 3.0 * jax.random.normal(key)

    evo = Evolution(ESConfig(strategy="SimpleES", popsize=8, std_init=1.0), {"w": jnp.zeros(2)}, fitness,
                    num_seeds=1, keep_top=4)
    state = evo.init(jax.random.key(3))
    step = jax.jit(evo.step)
    for _ in range(3):
        state, _ = step(state)
    candidates = jax.tree.map(lambda t, m: jnp.concatenate([t, m[None]]), state.top_params, evo.mean(state))
    scores, per_seed = evo.rescore(candidates, jax.random.split(jax.random.key(99), 4096))
    assert per_seed.shape == (5, 4096)
    true_loss = np.sum(np.asarray(candidates["w"]) ** 2, axis=1)
    picked = int(np.argmax(scores))
    assert picked == int(np.argmin(true_loss))      # the fresh seeds find the really best candidate
    assert picked != 0                               # which is not the best member the search saw
    assert np.all(np.diff(np.asarray(state.top_fitness)) <= 0)   # the kept members, best first


def test_a_run_can_use_another_runs_tuned_baseline(tuned_run, tmp_path):
    source, _ = tuned_run
    args = [*ARGS, f"baseline.tuned_from={source}"]
    # Tuned with other inner settings: refused before anything runs.
    refused = evolve([*args, "inner.num_envs=4", f"run_dir={tmp_path / 'other'}"], cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "other").exists()
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f"error: baseline.tuned_from: {source} was tuned over another space, on other tasks or with other inner")
    run_dir = tmp_path / "run"
    result = evolve([*args, "fitness.num_seeds=1", f"run_dir={run_dir}"], cwd=tmp_path, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (run_dir / "tune").exists()   # no tuning of its own
    mine, theirs = (json.loads((d / "tuned.json").read_text()) for d in (run_dir, source))
    assert mine["from"] == str(source.resolve()) and mine["hyperparameters"] == theirs["hyperparameters"]
    # The budget compared with the tuning's is this run's search, not the search the tuning was made for.
    # 5 trainings a generation and the pick's 3 candidates x 4 seeds x 2 (paired), counted on both sides
    assert mine["trainings"] == theirs["trainings"]
    assert mine["search_trainings"] == 5 + 24 < theirs["search_trainings"]
    assert json.loads((run_dir / "reference.json").read_text())["tuned"] == theirs["hyperparameters"]


def test_a_tuning_on_its_ranges_edge_or_still_rising_is_flagged():
    from metarl.outer_loops.evolution import search_warnings
    from metarl.stages import tuning_field

    def tuning_warnings(*args, **kwargs):   # as the run checks its tunings
        return search_warnings(*args, **kwargs, field=tuning_field)

    # The shipped H100 tuning: three values on the low ends of their ranges, its mean still climbing.
    record = RunDir(Path(__file__).parents[1] / "docs" / "runs" / "tuned_schedule_h100")
    tuned = record.tuned.read()
    found = tuning_warnings(tuned["search_space"], tuned["hyperparameters"], record.tuning().metrics())
    assert [w.split()[0] for w in found[:3]] == ["ent_coef", "clip_eps", "gae_lambda"]
    assert all("widen baseline.tune." in w for w in found[:3]) and "run longer" in found[3] and len(found) == 4
    # An interior point (on the log scale where the range is one) and a flat, noisy mean: nothing to say.
    space = {"lr": {"low": 1e-4, "high": 1e-2, "log": True}, "clip_eps": {"low": 0.05, "high": 0.4}}
    flat = [{"mean": m} for m in (0.1, 0.5, 0.6, 0.55, 0.62, 0.58, 0.61, 0.57, 0.6)]
    assert tuning_warnings(space, {"lr": 1.5e-4, "clip_eps": 0.2}, flat) == []
    # a trend through the last 3 of 7 generations says nothing: too few to judge, named by its tuning
    assert tuning_warnings(space, {"lr": 1.5e-4, "clip_eps": 0.2}, flat[:7], name="tune-2") == [
        "tune-2: 7 generations are too few to judge whether the population mean still rises"]
    assert tuning_warnings(space, {"lr": 1.1e-4, "clip_eps": 0.39}, flat) == [
        "lr 0.00011 lies within 5% of its range's low end 0.0001; widen baseline.tune.lr",
        "clip_eps 0.39 lies within 5% of its range's high end 0.4; widen baseline.tune.clip_eps"]


def test_evaluate_adds_ppo_tuned_on_each_task_with_its_compute(tuned_run, tmp_path):
    """``per_task=[k, ...]``: PPO tuned on each evaluated task by random search with k trainings, a side per k
    beside the learned part and the single tuned configuration, each side's tuning compute stated."""
    from metarl import evaluate

    run_dir, _ = tuned_run
    report = evaluate.evaluate(run_dir, num_seeds=4, num_cpu_devices=1, per_task=[4, 2], per_task_tunings=2,
                               per_task_seeds=1)
    labels = [side["label"] for side in report["sides"] if side["role"] == "per_task"]
    assert labels == ["tuned per task at k=2", "tuned per task at k=4"] and report["per_task"]["ks"] == [2, 4]
    done = RunDir(run_dir).per_task.read()
    assert len(done) == 2 * 2   # two tasks, two tunings each: four random searches of 4 settings x 1 seed
    first, second = ([done[n] for n in done if n.startswith(row["task"] + " |")] for row in report["tasks"])
    assert first[0]["z"] == second[0]["z"]   # tuning j draws the same settings on every task
    for row in report["tasks"]:
        assert set(labels) <= set(row["sides"]) and "test_per_task" in row
        searches = [done[name] for name in done if name.startswith(row["task"] + " |")]
        assert len(searches) == 2 and searches[0]["z"] != searches[1]["z"]   # tunings draw apart
        for k in (2, 4):
            picks = row["per_task"][str(k)]
            assert [p["tuning"] for p in picks] == [0, 1] and picks[1]["seeds"] == [1, 3]   # seed i: tuning i % 2
            for pick, search in zip(picks, searches):   # the best of the first k draws by its tuning score
                assert pick["tuning_score"] == pytest.approx(max(s[0] for s in search["scores"][:k]))
                assert set(pick["hyperparameters"]) == {"lr", "ent_coef"}
            finals = row["sides"][f"tuned per task at k={k}"]["final_returns"]
            assert picks[0]["mean"] == pytest.approx(np.mean(finals[0::2]))
    assert report["compute"]["baseline"]["tuning"] == report["tuned"]["trainings"] > 0
    assert report["compute"]["learned"]["search"] > 0 and report["compute"]["configured"]["tuning"] == 0
    assert report["json"].endswith("_per_task2-4.json") and Path(report["per_task"]["figure"]).is_file()
    text = evaluate.format_report(report)
    assert "tuned per task at k=4 [95% CI]" in text and "p k=4" in text and "norm. k=2" in text
    assert "tuning compute in trainings: learned " in text and "tuned per task k on each evaluated task" in text
    # A second evaluation reuses the finished tunings: the same picks, no search run again.
    stamp = RunDir(run_dir).per_task.path.stat().st_mtime_ns
    again = evaluate.evaluate(run_dir, num_seeds=4, num_cpu_devices=1, per_task=[2, 4], per_task_tunings=2,
                              per_task_seeds=1)
    assert RunDir(run_dir).per_task.path.stat().st_mtime_ns == stamp
    assert again["tasks"][0]["per_task"] == report["tasks"][0]["per_task"]
    with pytest.raises(ValueError, match=r"^per_task: 3; allowed: a list of multiples of per_task_seeds \(2\)"):
        evaluate.evaluate(run_dir, num_seeds=4, per_task=[3])
    # Records that kept no exported learned part (a run's tuning alone): the baselines and the per-task side.
    bare = tmp_path / "records"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("best_meta_params.*", "ckpt", "tune", "tune-*"))
    alone = evaluate.evaluate(bare, num_seeds=4, num_cpu_devices=1, per_task=[2, 4], per_task_tunings=2,
                              per_task_seeds=1)
    assert [side["role"] for side in alone["sides"]] == ["baseline", "configured", "per_task", "per_task"]
    assert alone["tasks"][0]["per_task"] == report["tasks"][0]["per_task"]   # the copied tunings, reused
    text = evaluate.format_report(alone)
    assert "(no exported learned part: its baselines alone)" in text and "p vs config" in text
    agg = alone["aggregate"]["trained-on"]   # the tuned baseline against the configured one, and per task
    low, high = agg["tuning"]["iqm_learned_ci95"]
    assert low <= agg["tuning"]["iqm_learned"] <= high and "per_task" in agg
    assert re.search(r"IQM of normalised scores: .*tuned baseline [-\d.]+ \[.*baseline as configured [-\d.]+ \[", text)
    assert "P(tuned baseline > baseline as configured) = " in text


def test_a_slice_through_the_tuned_point_scores_each_value_on_seeds_of_its_own(tuned_run, tmp_path):
    """examples/slice.py: the tuned point with one value varied past its range, each value scored on seeds no
    stage used, the same whatever else is sliced beside it."""
    import subprocess
    import sys

    from clihelp import env_vars

    run_dir, _ = tuned_run
    ent = json.loads((run_dir / "tuned.json").read_text())["hyperparameters"]["ent_coef"]
    script = Path(__file__).parents[1] / "examples" / "slice.py"
    results = []
    for values, out in ((f"1e-4,{ent!r}", tmp_path / "two"), (repr(ent), tmp_path / "one")):
        proc = subprocess.run([sys.executable, str(script), str(run_dir), "ent_coef", values, str(out), "--seeds", "3"],
                              cwd=tmp_path, env=env_vars(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads((out / "slice_ent_coef.json").read_text()))
    (below, at), (alone,) = results[0]["slice"], results[1]["slice"]
    assert results[0]["seeds"] == 3 and np.isclose(below["ent_coef"], 1e-4, rtol=1e-4)
    assert at["fitness"] == pytest.approx(alone["fitness"], rel=1e-4) and np.isfinite(below["fitness"])
    assert at["ci95"][0] <= at["fitness"] <= at["ci95"][1]
    table = (tmp_path / "two" / "slice_ent_coef.md").read_text().splitlines()
    assert table[2].startswith("| 0.0001 |") and table[2].endswith("| no |") and table[3].endswith("| yes |")
    bad = subprocess.run([sys.executable, str(script), str(run_dir), "gamma", "0.9", str(tmp_path)], env=env_vars(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "NAME: 'gamma'; allowed: lr, ent_coef" in bad.stderr
