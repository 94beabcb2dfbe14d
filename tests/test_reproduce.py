"""benchmarks/reproduce.py: its pre-stated test decides the verdict, its command refuses bad input in one
line, and docs/studies/reproductions.md prints what its records say (no training anywhere here)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "studies", "reproductions.md")


def sample(mean, spread, n=16, seed=0):
    return mean + spread * np.random.default_rng(seed).standard_normal(n)


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    peer = sample(100.0, 1.0, seed=1)
    assert reproduce.decide(sample(101.0, 1.0), peer, 0.05)["verdict"] == "equivalent"
    assert reproduce.decide(sample(80.0, 1.0), peer, 0.05)["verdict"] == "different"
    assert reproduce.decide(sample(112.0, 1.0), peer, 0.05)["verdict"] == "different"
    # The means agree, but the seeds are too noisy to show it: not equivalent.
    noisy = reproduce.decide(sample(100.0, 30.0), sample(100.0, 30.0, seed=1), 0.05)
    assert noisy["verdict"] == "inconclusive" and noisy["interval"][0] < 0.95 < noisy["interval"][1]


def test_the_peers_own_noise_widens_the_interval():
    exact = np.full(16, 100.0)
    tight = reproduce.decide(sample(100.0, 5.0), exact + np.linspace(-1e-3, 1e-3, 16), 0.05)
    both = reproduce.decide(sample(100.0, 5.0), sample(100.0, 5.0)[::-1], 0.05)  # the same spread on both sides
    width = lambda d: d["interval"][1] - d["interval"][0]  # noqa: E731
    assert width(both) > 1.25 * width(tight)  # about sqrt(2): both sides' seeds are resampled


def test_direction_over_games():
    ppo = np.stack([sample(10.0, 1.0, seed=s) for s in range(4)], axis=1)
    better = np.stack([sample(13.0, 1.0, seed=10 + s) for s in range(4)], axis=1)
    assert reproduce.decide(better, ppo, None)["verdict"] == "reproduced"
    assert reproduce.decide(ppo, better, None)["verdict"] == "contradicted"
    assert reproduce.decide(ppo, np.stack([sample(10.0, 1.0, seed=20 + s) for s in range(4)], 1),
                            None)["verdict"] == "inconclusive"


def tiny_record(first, second, margin=0.05, games=None):
    if games is None:
        sides = {"metarl": {"env": "CartPole-v1", "per_seed": list(first), "seconds": [1.0]},
                 "purejaxrl": {"env": "CartPole-v1", "per_seed": list(second), "seconds": [1.0]}}
        test = {"test": "equivalence (TOST)", "level": 0.9, "margin": margin}
    else:
        sides = {f"{side}/{g}": {"env": g, "per_seed": list(v[:, i]), "seconds": [1.0]}
                 for side, v in (("dpo", first), ("ppo", second)) for i, g in enumerate(games)}
        test = {"test": "direction", "level": 0.95}
    return {"task": "t", "total_timesteps": 1000, "seeds": len(first), "test": test, "sides": sides,
            "verdict": {}}


def test_a_record_is_decided_first_side_over_second_per_game():
    record = tiny_record(sample(100.0, 1.0), sample(80.0, 1.0, seed=1))
    assert reproduce.verdict_of(record)["verdict"] == "different"
    assert reproduce.verdict_of(record)["ratio"] > 1.2
    games = ("A", "B")
    dpo = np.stack([sample(12.0, 1.0, seed=s) for s in range(2)], axis=1)
    ppo = np.stack([sample(10.0, 1.0, seed=5 + s) for s in range(2)], axis=1)
    assert reproduce.verdict_of(tiny_record(dpo, ppo, games=games))["verdict"] == "reproduced"
    assert reproduce.verdict_of(tiny_record(ppo, dpo, games=games))["verdict"] == "contradicted"


def test_the_tuning_chooses_the_best_mean_on_its_own_seeds_and_flags_the_grids_edge():
    seen = []

    def final(seeds, lrs):  # a return that peaks at lr 1e-2, plus seed noise
        seen.append(np.asarray(seeds))
        return 100 - 10 * np.log2(np.asarray(lrs) / 1e-2) ** 2 + np.asarray(seeds) % 3
    inside = reproduce.tune(final)
    assert inside["chosen"] == 1e-2 and not inside["at_edge"] and inside["trainings"] == 20
    assert seen[0].min() >= 1000  # never the evaluation's seeds 0..N-1
    edge = reproduce.tune(lambda seeds, lrs: np.log(np.asarray(lrs)))  # larger is always better
    assert edge["chosen"] == 2e-2 and edge["at_edge"]


def test_a_tuned_side_gets_its_own_verdict_and_line_on_the_page(tmp_path, capsys):
    games = ["Asterix-MinAtar", "Breakout-MinAtar"]
    dpo = np.stack([sample(12.0, 1.0, seed=s) for s in range(2)], axis=1)
    ppo = np.stack([sample(10.0, 1.0, seed=2 + s) for s in range(2)], axis=1)
    record = tiny_record(dpo, ppo, games=games)
    for i, g in enumerate(games):  # a tuned PPO that beats DPO
        record["sides"][f"tuned-ppo/{g}"] = {"env": g, "per_seed": list(sample(15.0, 1.0, seed=4 + i)),
                                              "seconds": [1.0], "tuning": reproduce.tune(
                                                  lambda seeds, lrs: -np.abs(np.log(np.asarray(lrs) / 5e-3)))}
    record["test"]["against"] = ["ppo", "tuned-ppo"]
    record["verdict"] = record["verdict_tuned"] = {"stored": True}  # row() recomputes both
    assert reproduce.verdict_of(record)["verdict"] == "reproduced"
    assert reproduce.verdict_of(record, "tuned-ppo")["verdict"] == "contradicted"
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps(record))
    reproduce.table([str(path)])
    out = capsys.readouterr().out
    assert "verdict: **reproduced**" in out and "against tuned-ppo: **contradicted**" in out
    assert "Asterix-MinAtar 0.005; Breakout-MinAtar 0.005 (40 trainings" in out


def test_episodes_mean_weights_by_episodes_and_is_nan_where_none_ended():
    returns = np.array([[10.0, 20.0, 99.0]])
    ended = np.array([[1, 3, 0]])
    assert reproduce.episodes_mean(returns, ended, axis=1)[0] == pytest.approx(17.5)
    assert np.isnan(reproduce.episodes_mean(returns, np.zeros_like(ended), axis=1)[0])


def test_a_record_names_no_checkout_folder():
    assert reproduce.without_checkout(["ppo-cartpole", "--peer", "/x/y", "--seeds", "2"]) == \
        ["ppo-cartpole", "--peer", "DIR", "--seeds", "2"]
    assert reproduce.without_checkout(["--purejaxrl=/x/y"]) == ["--purejaxrl=DIR"]


def command(*args):
    env = {k: v for k, v in os.environ.items() if k != "METARL_PUREJAXRL"}
    return subprocess.run([sys.executable, "-m", "benchmarks.reproduce", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, field", [
    (["ppo-hopper", "--out", "{tmp}/r.json"], "task"),
    (["ppo-cartpole", "--seeds", "1", "--out", "{tmp}/r.json"], "--seeds"),
    (["ppo-cartpole", "--total-timesteps", "0", "--out", "{tmp}/r.json"], "--total-timesteps"),
    (["ppo-cartpole", "--ablation", "frozen", "--out", "{tmp}/r.json"], "--ablation"),
    (["dqn-cartpole", "--ablation", "time-limit-terminal", "--out", "{tmp}/r.json"], "--ablation"),
    (["ppo-cartpole", "--out", "{tmp}/exists.json"], "--out"),
    (["ppo-cartpole", "--out", "{tmp}/no/such/folder.json"], "--out"),
    (["ppo-cartpole", "--seeds", "many", "--out", "{tmp}/r.json"], "--seeds"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, args, field):
    (tmp_path / "exists.json").write_text("{}")
    proc = command(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"reproduce: error: {field}") or f" {field}" in proc.stderr
    assert (tmp_path / "exists.json").read_text() == "{}"  # nothing written over
    assert not (tmp_path / "r.json").exists()


def test_without_a_peer_checkout_it_says_so_in_one_line(tmp_path):
    proc = command("ppo-cartpole", "--seeds", "2", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--purejaxrl DIR" in proc.stderr


def test_the_page_prints_what_its_records_say():
    """Each ``<!-- table: RECORD ... -->`` block of the page is ``reproduce table RECORD ...``'s output."""
    with open(PAGE) as f:
        page = f.read()
    blocks = reproduce.BLOCK.findall(page)
    assert len(blocks) >= 4
    for _, names, text, _ in blocks:
        assert text == reproduce.rendered([os.path.join(ROOT, name) for name in names.split()]), names


def test_the_page_summary_is_the_records():
    """The summary table's ratio, interval and verdict are each record's, by its pre-stated test."""
    with open(PAGE) as f:
        page = f.read()
    rows = re.findall(r"ratio ([\d.]+) \[([\d.]+), ([\d.]+)\][^|]*\|[^|]*\| \[`([\w/.-]+\.json)`\]\([^)]*\) \| "
                      r"\*\*(\w+)\*\*", page)
    assert len(rows) >= 5
    for ratio, low, high, name, verdict in rows:
        decided = reproduce.verdict_of(reproduce.load(os.path.join(ROOT, "docs", "studies", name)))
        assert decided["verdict"] == verdict, name
        assert [ratio, low, high] == [f"{x:.3f}" for x in (decided["ratio"], *decided["interval"])], name
    tuned = re.findall(r"against the tuned PPO ratio ([\d.]+) \[([\d.]+), ([\d.]+)\], also \*\*(\w+)\*\*[^|]*\|[^|]*\| "
                       r"\[`([\w/.-]+\.json)`\]", page)
    assert tuned
    for ratio, low, high, verdict, name in tuned:
        record = reproduce.load(os.path.join(ROOT, "docs", "studies", name))
        decided = reproduce.verdict_of(record, record["test"]["against"][-1])
        assert decided["verdict"] == verdict, name
        assert [ratio, low, high] == [f"{x:.3f}" for x in (decided["ratio"], *decided["interval"])], name
