"""The import structure of metarl: no cycle between its modules, the layers inner_loops < outer_loops <
the harness (the contracts in pyproject.toml's [tool.importlinter], checked by import-linter), JAX's
private modules used in one place, none of Hydra's, and every module importable before a run sets
its devices."""
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(dest: Path) -> Path:
    """The package as it installs (pyproject's package-dir: the top-level folders become subpackages
    of ``metarl``), copied into ``dest``, where import-linter analyses it."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(package_dir.items()):
        shutil.copytree(ROOT / folder, dest / package.replace(".", "/"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest)
    return dest


def test_no_import_cycles_and_the_layers_hold(tmp_path):
    root = installed_layout(tmp_path)
    # `lint-imports`, which puts the working directory, here the copy, first on sys.path.
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout


def python_files():
    return [p for folder in ("metarl", "inner_loops", "outer_loops") for p in (ROOT / folder).rglob("*.py")]


def test_no_private_jax_module_is_used():
    users = sorted(p.relative_to(ROOT).as_posix() for p in python_files()
                   if re.search(r"^\s*(from|import) jax\._src|jax\._src\.", p.read_text(), re.M))
    assert users == []


def test_no_private_hydra_module_is_used():
    # The command line, the config and the sweep go through Hydra's public API only.
    users = [p.relative_to(ROOT).as_posix() for p in python_files() if "hydra._internal" in p.read_text()]
    assert users == []


def test_every_harness_module_imports_before_the_devices_are_set():
    # A run sets its CPU device count (JAX's jax_num_cpu_devices) before JAX starts its backends; no
    # module of the harness, nor the evolution driver, may start them when it is imported (gymnax
    # does, so the trainers import it only when an environment is made).
    modules = sorted(p.stem for p in (ROOT / "metarl").glob("*.py") if p.stem not in ("__init__", "__main__"))
    code = ("import importlib, jax\n"
            f"for name in {modules!r} + ['outer_loops.evolution']:\n"
            "    importlib.import_module('metarl.' + name)\n"
            "jax.config.update('jax_num_cpu_devices', 2)\n"
            "assert len(jax.devices('cpu')) == 2\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_run_directory_file_is_named_by_rundir_alone():
    # One owner of a run directory: a file's name appears as a string literal in metarl.rundir and
    # nowhere else in the package (messages may mention a file by name in a longer text).
    from metarl import rundir

    names = {value for key, value in vars(rundir).items() if key.isupper() and isinstance(value, str)}
    assert {"config.yaml", "metrics.jsonl", "tuned.json", "ckpt", "figures", ".lock", "mlflow_run.json"} <= names
    import ast

    for path in python_files():
        if path == ROOT / "metarl" / "rundir.py":
            continue
        spelled = {node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)} & names
        assert not spelled, f"{path.relative_to(ROOT)} names run-directory files {sorted(spelled)}"
