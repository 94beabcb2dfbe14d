"""What a newcomer meets in the first hour, through the real command line: a run's closing lines, a suggestion
for a typo, a missing run directory, a stop signal that cannot arrive, the help texts and the README's account
of what a run writes."""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelp import TINY, alive, env_vars, run_module

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_a_run_closes_with_its_best_member_the_population_mean_and_the_next_commands(tiny_value_loss_run):
    run_dir, proc = tiny_value_loss_run  # experiment=value_loss, TINY, es.generations=2 (conftest.py)
    info = json.loads((run_dir / "best_meta_params.json").read_text())
    means = [json.loads(line)["mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peak = max(range(len(means)), key=means.__getitem__)
    assert proc.stdout.splitlines()[-5:] == [
        f"done: 2 generations in {run_dir}",
        f"best member: fitness {info['fitness']:.2f}, found in generation {info['generation']}; exported to "
        f"{run_dir / 'best_meta_params.msgpack'}",
        f"population mean: peak {means[peak]:.2f} at generation {peak + 1}, last {means[-1]:.2f}",
        f"next: python -m metarl.evaluate run_dir={run_dir}  (the best member against the baseline, on fresh seeds)",
        f"next: python -m metarl.inspect run_dir={run_dir}  (figures in {run_dir / 'figures'})"], proc.stdout


@pytest.mark.timeout(300)
def test_a_run_started_with_sigint_ignored_says_so_and_sigterm_still_stops_it(tmp_path):
    # As the issue found it: `python -m metarl.evolve ... &` in a script, where bash (without `set -m`) starts the
    # background command with SIGINT ignored.
    run_dir = tmp_path / "run"
    command = shlex.join([sys.executable, "-m", "metarl.evolve", "experiment=value_loss", *TINY,
                          "es.generations=100000", f"run_dir={run_dir}"])
    proc = subprocess.Popen(["bash", "-c", f'{command} & echo "pid $!"; wait $!'], cwd=tmp_path, env=env_vars(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        pid, lines = int(proc.stdout.readline().split()[1]), []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("gen "):  # the loop, and its stop handlers, have started
                break
        note = next((line for line in lines if line.startswith("note: SIGINT ignored")), None)
        assert note is not None, "".join(lines)
        assert "SIGTERM or SIGHUP still stops it" in note and "set -m" in note
        os.kill(pid, signal.SIGINT)
        time.sleep(2)
        assert proc.poll() is None and alive(pid)  # as the note says: SIGINT does nothing
        os.kill(pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if pid is not None and alive(pid):  # a failure above: the run would go on alone
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr, stderr
    assert (run_dir / "ckpt").is_dir()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module, typo, named, suggestion", [
    ("metarl.evolve", "experiment=value_los", "error: experiment: ", "(did you mean value_loss or "),
    ("metarl.evolve", "es.popsze=8", "error: es.popsze: ", "(did you mean es.popsize"),
    ("metarl.evolve", "loger.progress=false", "error: loger: ", "(did you mean logger.progress"),
    ("metarl.evolve", "hydra/launcher=jobli", "error: hydra/launcher: ", "basic, joblib (did you mean joblib?)"),
    ("metarl.evolve", "inner.num_envz=2", "error: inner.num_envz: ", "(did you mean num_envs?)"),
    ("metarl.inspect", "error_rang=2", "error: argument 'error_rang=2': ", "(did you mean error_range?)"),
])
def test_a_typo_gets_did_you_mean_in_the_same_one_line(tmp_path, module, typo, named, suggestion):
    args = ([] if typo.startswith("experiment=") or module != "metarl.evolve" else ["experiment=value_loss"]) + [typo]
    proc = run_module(module, [*args, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(named) and "; allowed: " in lines[0] and suggestion in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, field", [("metarl.evolve", "resume"), ("metarl.inspect", "run_dir"),
                                           ("metarl.evaluate", "run_dir"), ("metarl.distill", "run_dir")])
def test_a_missing_run_directory_is_named_with_the_latest_runs(tmp_path, module, field):
    runs = tmp_path / "checkpoints"
    for i, name in enumerate(["value_loss-1", "value_loss-2", "hyperparams-3", "value_loss-4"]):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.yaml").write_text("experiment: value_loss\n")
        os.utime(runs / name, (1e9 + i, 1e9 + i))
    (runs / "not_a_run").mkdir()
    latest = "such as the latest: checkpoints/value_loss-4, checkpoints/hyperparams-3, checkpoints/value_loss-2"
    missing = "checkpoints/value_loss-20260101-000000"
    proc = run_module(module, [f"{field}={missing}"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {field}: {missing}: no such directory; allowed: a run's directory, {latest}"], proc.stderr
    # An existing directory that holds no run (here: the folder of runs itself): the same form, its runs listed.
    proc = run_module(module, [f"{field}=checkpoints"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {field}: checkpoints: not a metarl run directory (no config.yaml); allowed: a run's directory, "
        f"{latest}"], proc.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["metarl.evolve", "--help"], ["metarl.evolve", "experiment=hyperparams", "-h"],
                                  ["metarl.inspect", "--help"], ["metarl.evaluate", "--help"],
                                  ["metarl.distill", "--help"]])
def test_help_shows_plain_text_and_resolved_values(tmp_path, args):
    proc = run_module(args[0], args[1:], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and f"python -m {args[0]}" in proc.stdout, proc.stderr
    for markup in ("``", "${", ":func:`", ":class:`", ":mod:`"):
        assert markup not in proc.stdout, markup
    if "experiment=hyperparams" in args:
        assert "\nexperiment: hyperparams\n" in proc.stdout


def _readme_section(title: str) -> str:
    return (REPO / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.timeout(600)
def test_the_readme_lists_what_a_default_run_writes_and_prints(tiny_value_loss_run):
    run_dir, proc = tiny_value_loss_run
    rows = [line.split(" | ") for line in _readme_section("What a run leaves behind").splitlines()
            if line.startswith("| `")]
    every_run = {name for row in rows if row[-1].rstrip(" |") == "every run"
                 for name in re.findall(r"`([^`]+)`", row[0])}
    written = {p.name + "/" * p.is_dir() for p in run_dir.iterdir()}
    assert every_run == written
    # The sample console lines have the form a run prints: the same words, numbers in the same places (the
    # quick start's seeds measure the signal, which the tiny run's one seed cannot: a gen line may go on).
    blocks = re.findall(r"```(\w*)\n(.*?)```", _readme_section("Quick start"), re.DOTALL)
    sample = next(text for lang, text in blocks if not lang)

    def shape(line: str) -> str:
        line = re.sub(r"\S*checkpoints/\S*", "DIR", line.replace(str(run_dir), "checkpoints/run"))
        return re.sub(r"\s+", " ", re.sub(r"-?\d[\d.e+-]*(h\d+m|m\d+s|s|m)?", "N", line))

    printed = [shape(line) for line in proc.stdout.splitlines()]
    for line in sample.strip().splitlines():
        assert any(shape(line) == p or line.startswith("gen ") and shape(line).startswith(p + " |")
                   for p in printed), line
    # ... and are what the quick start printed in the run the README links to.
    record = (REPO / "docs" / "runs" / "value_loss" / "evolve.log").read_text().splitlines()
    assert set(sample.strip().splitlines()) <= set(record)
    assert "](docs/runs/value_loss/)" in _readme_section("Quick start")
