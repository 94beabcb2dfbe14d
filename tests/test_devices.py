"""The population split over devices and over processes gives the run a single device gives.

Every run is a real CLI subprocess at tiny sizes under a timeout: a multi-device or multi-process
hang fails the test instead of the session. The runs here leave the optimisation level out of
``XLA_FLAGS``, so metarl compiles with its own compiler options, as a user's run does.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clihelp import TINY, children_of, env_vars, final_state, records, without_opt_level_flag

GENS = 3
ARGS = ["experiment=value_loss", *TINY, f"es.generations={GENS}", "logger.progress=false"]
FORCE2 = "--xla_force_host_platform_device_count=2"


def evolve(args, cwd, extra_env=None, timeout=240):
    env = env_vars()
    env["XLA_FLAGS"] = without_opt_level_flag()
    env.update(extra_env or {})
    env["METARL_INIT_TIMEOUT"] = "120"  # a process that never joins fails the run instead of hanging it
    return subprocess.run([sys.executable, "-m", "metarl.evolve", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def leaves(run_dir):
    state, meta = final_state(run_dir)
    out = [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
           for x in jax.tree.leaves(state)]
    return meta["generation"], out


def assert_same_run(a, b):
    """Bit for bit: every generation's fitness and the whole final state (the search distribution,
    its optimiser, the key). The split over devices changes only where members are evaluated."""
    ra, rb = records(a), records(b)
    assert len(ra) == len(rb) == GENS
    assert ra == rb
    (ga, xa), (gb, xb) = leaves(a), leaves(b)
    assert ga == gb == GENS
    for x, y in zip(xa, xb, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("one") / "run"
    ok(evolve([*ARGS, f"run_dir={run_dir}"], cwd=run_dir.parent))
    return run_dir


@pytest.mark.timeout(300)
def test_two_forced_cpu_devices_match_one_device(tmp_path, one_device):
    proc = ok(evolve([*ARGS, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path,
                     extra_env={"XLA_FLAGS": without_opt_level_flag() + " " + FORCE2}))
    assert "on 2 device(s)" in proc.stdout + proc.stderr
    assert_same_run(one_device, tmp_path / "run")


# Every line a default run prints: metarl's own (run_dir, compile time, its notes, progress, the summary).
OWN_LINES = re.compile(r"(run directory: |compiled the generation in |note: |gen +\d+/\d+ \| |done: \d+ generations)")


@pytest.mark.timeout(300)
def test_two_processes_match_one_process_and_write_one_run_dir(tmp_path, one_device):
    # With the progress lines, as a default run prints them.
    proc = ok(evolve([*[a for a in ARGS if a != "logger.progress=false"], "devices.num_processes=2"], cwd=tmp_path))
    assert "on 2 device(s)" in proc.stdout + proc.stderr
    assert proc.stdout.count("run directory:") == 1 and proc.stdout.count("done:") == 1
    # The console holds metarl's lines only (no gloo "[Gloo] Rank 1 is connected ..."), in order.
    assert proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if not OWN_LINES.match(line)] == [], proc.stdout
    assert [line.split("|")[0].split()[1] for line in lines if line.startswith("gen ")] == \
        [f"{g}/{GENS}" for g in range(1, GENS + 1)]
    assert lines[0].startswith("run directory:") and lines[-1].startswith("done:")
    runs = list((tmp_path / "checkpoints").iterdir())
    assert len(runs) == 1, runs
    assert len((runs[0] / "metrics.jsonl").read_text().splitlines()) == GENS
    assert sorted(p.name for p in (runs[0] / "ckpt").iterdir()) == [str(g) for g in range(1, GENS + 1)]
    assert_same_run(one_device, runs[0])
    # Process 0 compiled for both and kept the executable, which a second run loads (and runs the same).
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert any(name.startswith("metarl-multiprocess-") for name in os.listdir(cache))
    again = tmp_path / "again"
    proc = ok(evolve([*ARGS, "devices.num_processes=2", f"run_dir={again}", "logger.verbose=true"], cwd=tmp_path))
    assert_same_run(one_device, again)
    # logger.verbose=true passes on the third-party lines too: gloo's, one per process.
    assert sorted(re.findall(r"\[Gloo\] Rank (\d) is connected", proc.stdout)) == ["0", "1"], proc.stdout


@pytest.mark.timeout(300)
def test_two_processes_continue_a_one_process_checkpoint(tmp_path, one_device):
    # Restored state placed on the two-process mesh: the run goes on exactly as the straight one.
    run_dir = tmp_path / "run"
    shutil.copytree(one_device, run_dir)
    shutil.rmtree(run_dir / "ckpt" / str(GENS))
    ok(evolve([f"resume={run_dir}", "devices.num_processes=2"], cwd=tmp_path))
    assert_same_run(one_device, run_dir)


@pytest.mark.timeout(120)
def test_population_that_does_not_divide_is_refused_at_start(tmp_path):
    proc = evolve(["experiment=value_loss", *TINY, "es.popsize=6", "devices.num_processes=4"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: es.popsize: 6 does not divide over 4")
    proc = evolve(["experiment=value_loss", *TINY, "es.popsize=6"], cwd=tmp_path,
                  extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: es.popsize: 6 does not divide over 4")
    assert not (tmp_path / "checkpoints").exists()


def test_a_population_too_small_for_the_devices_names_one_multiple():
    from metarl import devices

    with pytest.raises(ValueError) as err:
        devices.check_divides(4, 8)
    assert str(err.value) == ("es.popsize: 4 does not divide over 8 devices; allowed: a multiple of 8 "
                              "(such as 8)")
    with pytest.raises(ValueError, match=r"a multiple of 4 \(such as 8 or 12\)$"):
        devices.check_divides(10, 4)


def auto_env():
    """The environment of a user who set nothing: `auto` decides the process count."""
    env = env_vars()
    env["XLA_FLAGS"] = without_opt_level_flag()
    env.pop("METARL_NUM_PROCESSES", None)
    env["METARL_INIT_TIMEOUT"] = "120"
    return env


def _auto_count(cores: str, popsize: int, extra_env=None) -> int:
    code = f"from metarl import devices; print(devices.auto_processes({popsize}))"
    proc = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", code], env={**auto_env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_auto_counts_the_cores_the_affinity_allows():
    cores = sorted(os.sched_getaffinity(0))
    assert _auto_count(str(cores[0]), 16) == 1
    if len(cores) >= 2:
        two = f"{cores[0]},{cores[1]}"
        assert _auto_count(two, 16) == 2
        assert _auto_count(two, 7) == 1  # the largest count that divides the population
    assert _auto_count(",".join(map(str, cores)), 1) == 1
    if len(cores) >= 2:  # each process gets the CPU devices the user asked for: counted, not refused later
        four = {"JAX_NUM_CPU_DEVICES": "4"}
        assert _auto_count(two, 8, four) == 2
        assert _auto_count(two, 4, four) == 1


@pytest.mark.timeout(300)
def test_auto_with_several_cpu_devices_per_process_runs_or_says_why(tmp_path):
    # The user's JAX_NUM_CPU_DEVICES=4 on this machine: popsize 4 runs (one process of 4 devices rather
    # than 2 of 4 that it cannot divide over); popsize 6 divides over no count of such processes.
    env = {**auto_env(), "JAX_NUM_CPU_DEVICES": "4"}

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "metarl.evolve", *ARGS, *extra], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)

    proc = ok(run(f"run_dir={tmp_path / 'run'}"))
    assert "on 4 device(s)" in proc.stdout
    proc = run("es.popsize=6", f"run_dir={tmp_path / 'six'}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: es.popsize: 6 does not divide over 4 devices; allowed: a multiple of 4 (such as 4 or 8)"]
    assert not (tmp_path / "six").exists()


def _eigen_threads(pid: int) -> int:
    """Threads of XLA's CPU pool (sized by the cores the process could use when JAX started)."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            count += open(f"/proc/{pid}/task/{tid}/comm").read().strip() == "tf_XLAEigen"
        except OSError:
            pass
    return count


def _pool_sizes_of_launched_processes(launcher: subprocess.Popen) -> dict[int, tuple[int, int]]:
    """For each process the launcher starts: (cores ``METARL_CPUS`` gives it, threads of XLA's pool)."""
    sizes = {}
    while launcher.poll() is None and len(sizes) < 2:
        for pid in children_of(launcher.pid):
            try:
                if pid in sizes or not _eigen_threads(pid):
                    continue
                time.sleep(0.5)  # the pool has started all its threads
                env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
                sizes[pid] = (len(env["METARL_CPUS"].split(",")), _eigen_threads(pid))
            except (OSError, KeyError):  # ended meanwhile
                pass
        time.sleep(0.1)
    return sizes


@pytest.mark.timeout(300)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_auto_uses_every_core_and_matches_one_process(tmp_path, one_device):
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, "devices.num_processes=auto",
                                 f"run_dir={run_dir}"], cwd=tmp_path, env=auto_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        # Every process, process 0 too, is pinned before XLA sizes its pool: a pool sized for more cores
        # than the process runs on made every generation about 1.4x slower.
        sizes = _pool_sizes_of_launched_processes(launcher)
        out, err = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, f"exit {launcher.returncode}\n{out}\n{err[-4000:]}"
    assert len(sizes) == 2 and all(cores == threads for cores, threads in sizes.values()), sizes
    assert "on 2 device(s)" in out + err
    assert_same_run(one_device, run_dir)
    # Pinned to one core, the same default runs as one process.
    pinned = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m",
                             "metarl.evolve", *ARGS, f"run_dir={tmp_path / 'pinned'}"], cwd=tmp_path,
                            env=auto_env(), capture_output=True, text=True, timeout=240)
    ok(pinned)
    assert "on 1 device(s)" in pinned.stdout + pinned.stderr


@pytest.mark.timeout(400)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_auto_runs_at_once_both_finish(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, f"run_dir={tmp_path / name}"],
                              cwd=tmp_path, env=auto_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b")]
    try:
        outs = [p.communicate(timeout=360) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
        assert "on 2 device(s)" in out + err
    assert records(tmp_path / "a") == records(tmp_path / "b")


def test_shared_executables_beyond_the_newest_are_evicted(tmp_path):
    from metarl import compilation

    for i in range(compilation.SHARED_CACHE_KEEP + 3):
        entry = tmp_path / f"metarl-multiprocess-{i:02d}"
        entry.write_bytes(b"x")
        os.utime(entry, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "metarl-multiprocess-99.123.tmp").write_bytes(b"being written")
    (tmp_path / "jax-cache-entry").write_bytes(b"JAX's own")
    compilation._evict_old_shared(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"metarl-multiprocess-{i:02d}" for i in range(3, compilation.SHARED_CACHE_KEEP + 3)]
                          + ["metarl-multiprocess-99.123.tmp", "jax-cache-entry"])


def test_metarl_compiles_at_its_own_level_unless_xla_flags_sets_one(monkeypatch):
    from metarl import compilation

    monkeypatch.setenv("XLA_FLAGS", without_opt_level_flag())
    assert compilation.compiler_options() == compilation.CPU_COMPILER_OPTIONS == {"xla_backend_optimization_level": 1}
    program = jax.jit(lambda x: jnp.tanh(x) @ x.T)
    x = jnp.arange(12.0).reshape(3, 4) / 10
    np.testing.assert_allclose(compilation.compile_program(program, x)(x), program(x), rtol=1e-6)
    monkeypatch.setenv("XLA_FLAGS", without_opt_level_flag() + " --xla_backend_optimization_level=2")
    assert compilation.compiler_options() == {}
