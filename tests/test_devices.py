"""The population split over devices, in one process or over processes joined as hosts are, gives
the run a single device gives.

Every run is a real CLI subprocess at tiny sizes under a timeout: a multi-device or multi-process
hang fails the test instead of the session. The runs here leave the optimisation level out of
``XLA_FLAGS``, so metarl compiles with its own compiler options, as a user's run does.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import socket

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

from clihelp import TINY, env_vars, final_state, records, without_opt_level_flag

GENS = 3
ARGS = ["experiment=value_loss", *TINY, f"es.generations={GENS}", "logger.progress=false"]


def evolve(args, cwd, extra_env=None, timeout=240, env=None):
    env = dict(env or env_vars())
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
    ok(evolve([*ARGS, "devices.num_cpu_devices=1", f"run_dir={run_dir}"], cwd=run_dir.parent))
    return run_dir


# Every line a default run prints: metarl's own (run_dir, compile time, its notes, progress, the closing lines).
OWN_LINES = re.compile(r"(run directory: |compiled the generation in |note: |gen +\d+/\d+ \| |done: \d+ generations"
                       r"|best member: |population mean: |next: python -m metarl\.)")


@pytest.mark.timeout(300)
def test_two_cpu_devices_match_one_device_and_write_one_run_dir(tmp_path, one_device):
    # As a user who set nothing runs it, with the progress lines: on two cores `auto` makes two devices.
    two_cores = len(os.sched_getaffinity(0)) >= 2
    proc = ok(evolve([a for a in ARGS if a != "logger.progress=false"] + ([] if two_cores else
                                                                           ["devices.num_cpu_devices=2"]),
                     cwd=tmp_path, env=auto_env()))
    assert "on 2 device(s)" in proc.stdout
    assert proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if not OWN_LINES.match(line)] == [], proc.stdout
    assert [line.split("|")[0].split()[1] for line in lines if line.startswith("gen ")] == \
        [f"{g}/{GENS}" for g in range(1, GENS + 1)]
    assert lines[0].startswith("run directory:") and lines[-5].startswith("done:") and lines[-1].startswith("next:")
    runs = list((tmp_path / "checkpoints").iterdir())
    assert len(runs) == 1, runs
    assert sorted(p.name for p in (runs[0] / "ckpt").iterdir()) == [str(g) for g in range(1, GENS + 1)]
    assert_same_run(one_device, runs[0])


@pytest.mark.timeout(300)
def test_two_devices_continue_a_one_device_checkpoint(tmp_path, one_device):
    # Restored state placed on the two-device mesh: the run goes on exactly as the straight one.
    run_dir = tmp_path / "run"
    shutil.copytree(one_device, run_dir)
    shutil.rmtree(run_dir / "ckpt" / str(GENS))
    ok(evolve([f"resume={run_dir}", "devices.num_cpu_devices=2"], cwd=tmp_path))
    assert_same_run(one_device, run_dir)


@pytest.mark.timeout(400)
def test_two_processes_joined_as_hosts_match_one_device(tmp_path, one_device):
    # What a cluster's launcher does on each host, here on loopback: the same command, told the
    # coordinator, the process count and its own id. Process 0 alone writes and prints.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    env = {**env_vars(), "XLA_FLAGS": without_opt_level_flag(), "METARL_INIT_TIMEOUT": "120",
           "METARL_COORDINATOR": f"127.0.0.1:{port}", "METARL_NUM_PROCESSES": "2"}
    procs = [subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, "devices.num_cpu_devices=1",
                               f"run_dir={run_dir}"], cwd=tmp_path, env={**env, "METARL_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    first, second = finish_all(procs)
    assert "on 2 device(s)" in first and first.count("done:") == 1
    assert "run directory:" not in second and "done:" not in second
    assert_same_run(one_device, run_dir)


@pytest.mark.timeout(120)
def test_a_process_count_without_its_coordinator_is_refused(tmp_path):
    proc = evolve(["experiment=value_loss", *TINY, "devices.num_processes=2"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: devices.num_processes: 2 processes need the "
                                                            "coordinator's host:port")
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.timeout(120)
def test_population_that_does_not_divide_is_refused_at_start(tmp_path):
    proc = evolve(["experiment=value_loss", *TINY, "es.popsize=6", "devices.num_cpu_devices=4"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: es.popsize: 6 does not divide over 4 devices; allowed: a multiple of 4 (such as 4 or 8)"]
    assert not (tmp_path / "checkpoints").exists()


def finish_all(procs: list) -> list[str]:
    """Wait for every process (each killed if the wait fails); each one's stdout, all having exited 0."""
    try:
        outs = [p.communicate(timeout=360) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
    return [out for out, _ in outs]


def test_a_population_too_small_for_the_devices_names_one_multiple():
    from metarl.errors import layer_errors
    from metarl.outer_loops.evolution import check_divides

    with pytest.raises(ValueError) as err, layer_errors("es"):   # as devices.population_mesh names it
        check_divides(4, 8)
    assert str(err.value) == ("es.popsize: 4 does not divide over 8 devices; allowed: a multiple of 8 "
                              "(such as 8)")
    with pytest.raises(ValueError, match=r"a multiple of 4 \(such as 8 or 12\)$"):
        check_divides(10, 4)


def auto_env():
    """The environment of a user who set nothing: `auto` decides the CPU device count."""
    env = env_vars()
    env["XLA_FLAGS"] = without_opt_level_flag()
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return env


# How many CPU devices `auto` makes, and how many of them a population of 4, 6 and 7 is split over.
AUTO = ("import jax; from metarl import devices; devices.use_cpu_cores('auto'); "
        "print(jax.device_count(), *[getattr(devices.population_mesh(p, fit=True), 'size', 1) for p in (4, 6, 7)])")


def _auto_counts(cores: str, extra_env=None) -> list[int]:
    proc = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", AUTO], env={**auto_env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [int(n) for n in proc.stdout.split()]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_auto_makes_a_device_per_core_the_affinity_allows():
    cores = sorted(os.sched_getaffinity(0))
    assert _auto_counts(str(cores[0])) == [1, 1, 1, 1]
    if len(cores) >= 2:
        two = f"{cores[0]},{cores[1]}"
        assert _auto_counts(two) == [2, 2, 2, 1]  # the largest count that divides the population
        # The user's own count (JAX_NUM_CPU_DEVICES, or XLA's forced count) is left as it is.
        assert _auto_counts(two, {"JAX_NUM_CPU_DEVICES": "4"}) == [4, 4, 3, 1]
        assert _auto_counts(two, {"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}) == [3, 2, 3, 1]


def test_a_device_count_set_after_jax_started_is_refused():
    from metarl import devices

    jax.numpy.zeros(1).block_until_ready()  # JAX has started, with this process's one CPU device
    devices.use_cpu_cores("auto")  # the devices it has
    devices.use_cpu_cores(jax.local_device_count())
    with pytest.raises(ValueError, match=r"^devices.num_cpu_devices: 3, but JAX has started in this process with"):
        devices.use_cpu_cores(3)


@pytest.mark.timeout(400)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_auto_runs_at_once_both_finish(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "metarl.evolve", *ARGS, f"run_dir={tmp_path / name}"],
                              cwd=tmp_path, env=auto_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b")]
    assert all("on 2 device(s)" in out for out in finish_all(procs))
    assert records(tmp_path / "a") == records(tmp_path / "b")


def test_metarl_compiles_at_its_own_level_unless_xla_flags_sets_one(monkeypatch):
    from metarl import compilation

    monkeypatch.setenv("XLA_FLAGS", without_opt_level_flag())
    assert compilation.compiler_options() == compilation.CPU_COMPILER_OPTIONS == {"xla_backend_optimization_level": 1}
    program = jax.jit(lambda x: jnp.tanh(x) @ x.T)
    x = jnp.arange(12.0).reshape(3, 4) / 10
    np.testing.assert_allclose(compilation.compile_program(program, x)(x), program(x), rtol=1e-6)
    monkeypatch.setenv("XLA_FLAGS", without_opt_level_flag() + " --xla_backend_optimization_level=2")
    assert compilation.compiler_options() == {}
    # The GPU's options are compile options XLA knows (a misspelt one is refused, on a CPU too).
    np.testing.assert_allclose(program.lower(x).compile(compilation.GPU_COMPILER_OPTIONS)(x), program(x), rtol=1e-6)
    with pytest.raises(Exception, match="No such compile option"):
        program.lower(x).compile({"xla_gpu_autotune_levl": 0})


def test_single_agent_options_stop_splitting_loops_over_cores_and_keep_results():
    from metarl import compilation

    program = jax.jit(lambda x: jnp.sin(x) * jnp.cos(x) + jnp.exp(x))  # a loop XLA splits over the cores
    x = jnp.linspace(0.0, 1.0, 1 << 16)
    split, whole = program.lower(x).compile(), program.lower(x).compile(compilation.SINGLE_AGENT_CPU_OPTIONS)
    np.testing.assert_array_equal(whole(x), split(x))
    # XLA ignores an unknown pass name: this fails if its task assigner is renamed.
    assert "outer_dimension_partitions" not in whole.as_text()
    if (os.cpu_count() or 1) >= 2:
        assert "outer_dimension_partitions" in split.as_text()


LAGGING_DEVICE = '''
import sys, time
import jax
from metarl import devices
devices.use_cpu_cores(2)
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(jax.devices(), ("d",))

def late(x):
    time.sleep(float(sys.argv[1]))
    return x

def body(x):  # device 0 reaches the all-gather argv[1] seconds after device 1
    x = jax.lax.cond(jax.lax.axis_index("d") == 0,
                     lambda v: jax.pure_callback(late, jax.ShapeDtypeStruct(v.shape, v.dtype), v), lambda v: v, x)
    return jax.lax.all_gather(x.sum(), "d")

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P(), check_vma=False))
print(np.asarray(f(jax.device_put(jnp.ones(4), NamedSharding(mesh, P("d"))))).tolist())
'''


def _lagging_device(tmp_path, lag: float, xla_flags=None):
    script = tmp_path / "lag.py"
    script.write_text(LAGGING_DEVICE)
    env = {k: v for k, v in env_vars().items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    env.update({"XLA_FLAGS": xla_flags} if xla_flags else {})
    return subprocess.run([sys.executable, str(script), str(lag)], env=env, capture_output=True, text=True,
                          timeout=lag + 120)


@pytest.mark.timeout(200)
def test_a_device_late_at_a_collective_is_waited_for_unless_the_user_says_otherwise(tmp_path):
    # XLA ends the process when a CPU device waits for another at a collective too long; metarl sets
    # that limit to a day before JAX starts (patient_cpu_collectives). A user's own XLA_FLAGS value
    # stands: at 1 s a device 25 s late ends the process, as it shows the lag is real.
    from metarl import devices

    if tuple(int(x) for x in jaxlib.__version__.split(".")[:2]) < (0, 9):
        pytest.skip("jaxlib before 0.9 has no such flag")
    proc = _lagging_device(tmp_path, 25, f"--{devices.COLLECTIVE_TIMEOUT_FLAG}=1")
    assert proc.returncode == -signal.SIGABRT and "Termination timeout" in proc.stderr, proc.stderr[-2000:]
    code = ("import os, jax\nfrom metarl import devices\ndevices.use_cpu_cores(2)\nprint(os.environ['XLA_FLAGS'])\n"
            "assert jax.device_count() == 2")
    env = {k: v for k, v in env_vars().items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"--{devices.COLLECTIVE_TIMEOUT_FLAG}=86400", out.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_device_a_minute_late_at_a_collective_is_waited_for(tmp_path):
    proc = _lagging_device(tmp_path, 70)   # XLA's own limit: about 60 s
    assert proc.returncode == 0 and proc.stdout.strip() == "[2.0, 2.0]", proc.stderr[-2000:]
