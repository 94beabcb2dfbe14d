"""Running the real CLI at tiny sizes: in a subprocess, or (``run_here``) a command's main in this process."""
import contextlib
import importlib
import io
import os
import subprocess
import sys

# Budgets small enough that a generation takes milliseconds; compilation dominates.
TINY = ["es.popsize=4", "fitness.num_seeds=1", "inner.num_envs=2", "inner.num_steps=8",
        "inner.total_timesteps=64", "inner.update_epochs=1", "inner.num_minibatches=1",
        "inner.hidden=[8]", "inner.unroll=1", "component.hidden=[4]",
        "checkpoint.every=1"]


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# The first flag stopped XLA's CPU scheduler deadlocking small vmapped programs on jax 0.10 (docs/performance.md,
# "Which jax"); harmless on the jax we pin, kept as a second guard beside pytest-timeout. The second
# compiles every program of the suite at LLVM level 0: the suite's programs are tiny and compiling is
# most of its time (about 40% less of it than at level 1, metarl's own level on a CPU). Tests of that
# path itself take it out (``without_opt_level_flag``); tests whose time is training rather than compiling
# compile it at metarl's level (``at_metarl_level``).
CPU_OPT_LEVEL_FLAG = "--xla_backend_optimization_level=0"
TEST_XLA_FLAGS = f"--xla_cpu_enable_concurrency_optimized_scheduler=false {CPU_OPT_LEVEL_FLAG}"


def without_opt_level_flag() -> str:
    """``XLA_FLAGS`` without the optimisation level: metarl then passes its own compiler options."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != CPU_OPT_LEVEL_FLAG)


def at_metarl_level(jitted, *args):
    """``jitted(*args)`` compiled with metarl's own CPU options (``CPU_COMPILER_OPTIONS``) rather than the
    suite's level 0, under which a long training runs about twice as long."""
    from metarl.compilation import CPU_COMPILER_OPTIONS

    return jitted.lower(*args).compile(CPU_COMPILER_OPTIONS)(*args)


def env_vars():
    env = dict(os.environ)
    # The classes that tests name by `_target_` (plugins.py, plugin_trainer.py) live here.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    env.setdefault("XLA_FLAGS", TEST_XLA_FLAGS)
    env["WANDB_MODE"] = "disabled"
    # One CPU device per run unless a test asks for more: `devices.num_cpu_devices=auto` (the default)
    # would make one per core, and the suite already runs one test per core.
    env.setdefault("JAX_NUM_CPU_DEVICES", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_module(module, args, cwd, timeout=300, check=False, extra_env=None):
    """``python -m MODULE ARGS`` in ``cwd`` with the tests' environment (``env_vars``)."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd,
                          env={**env_vars(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def evolve(args, cwd, timeout=300, check=False, extra_env=None):
    return run_module("metarl.evolve", args, cwd, timeout, check, extra_env)


def run_here(module, args, cwd="."):
    """``python -m MODULE ARGS`` as ``MODULE.main(ARGS)`` in this process, from ``cwd``: ``(exit code,
    stdout, stderr)``. For input refused before any work starts, where a new interpreter would cost a
    test seconds."""
    main = importlib.import_module(module).main
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:
                code = exit_.code
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux: read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split() if stat else []
        if fields and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether any thread of process ``pid`` runs. A zombie (ended, not yet reaped) does not; but its
    first thread turns zombie while the others may still be ending, holding its open files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            if open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                return True
        except OSError:  # ended meanwhile
            pass
    return False


def start_evolve(args, cwd):
    return subprocess.Popen([sys.executable, "-m", "metarl.evolve", *args], cwd=cwd, env=env_vars(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(run_dir):
    """metrics.jsonl without the timings, which differ between runs."""
    import json
    from pathlib import Path

    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds"), r.pop("fps")
        out.append(r)
    return out


def final_state(run_dir):
    """``(evolution state, checkpoint meta)`` of the run's latest checkpoint, on one device."""
    import jax

    from metarl import rundir
    from metarl.results import load_config
    from metarl.search import build_evolution

    _, evo = build_evolution(load_config(run_dir), mesh=None)
    ckpt = rundir.Checkpointer(run_dir, write=False)
    try:
        return ckpt.newest(evo.init(jax.random.key(0)))[1:]
    finally:
        ckpt.close()


def snapshot(root):
    """Every path under ``root`` with its bytes (None for a directory): equal snapshots mean nothing
    was written, removed or changed."""
    from pathlib import Path

    root = Path(root)
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def start_and_kill_after(args, cwd, run_dir, generations: int, timeout: float = 600) -> int:
    """Start a run, SIGKILL it once ``generations`` are logged (the next one is then running), and
    return how many generations its metrics.jsonl holds."""
    import signal
    import time
    from pathlib import Path

    proc = start_evolve(args, cwd=cwd)
    metrics = Path(run_dir) / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= generations:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(metrics.read_text().splitlines())
