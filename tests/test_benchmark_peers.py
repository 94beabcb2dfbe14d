"""benchmarks/peers.py: the scripts that measure against PureJaxRL need a checkout the user names, and
say so in one line when there is none; with one (``METARL_PUREJAXRL``), its trainings trace on gymnax 1.0."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_without_checkout(args, env_value=None):
    env = {k: v for k, v in os.environ.items() if k != "METARL_PUREJAXRL"}
    if env_value is not None:
        env["METARL_PUREJAXRL"] = env_value
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("script", ["ppo_side_by_side", "dqn_side_by_side"])
def test_no_checkout_is_one_line_naming_the_option_and_exit_code_2(script):
    proc = run_without_checkout([f"benchmarks.{script}"])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--purejaxrl DIR" in lines[0] and "METARL_PUREJAXRL" in lines[0]
    assert "https://github.com/luchris429/purejaxrl" in lines[0] and "checkout " in lines[0]


def test_a_folder_that_is_not_a_checkout_is_refused_the_same_way(tmp_path):
    proc = run_without_checkout(["benchmarks.ppo_side_by_side", "--agents", "1"], env_value=str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and str(tmp_path) in proc.stderr and "--purejaxrl" in proc.stderr


def test_metarl_alone_needs_no_checkout():
    proc = run_without_checkout(["benchmarks.ppo_side_by_side", "--impl", "metarl", "--help"])
    assert proc.returncode == 0 and "--purejaxrl" in proc.stdout


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_named_checkout_traces_on_gymnax_1(algo):
    directory = os.environ.get("METARL_PUREJAXRL")
    if not directory:
        pytest.skip("METARL_PUREJAXRL names no PureJaxRL checkout")
    import jax
    import jax.numpy as jnp

    from benchmarks import dqn_side_by_side, peers, ppo_side_by_side

    if peers.find(directory, algo) is None:
        pytest.skip(f"{directory} holds no PureJaxRL {algo.upper()}")
    peers.require(directory, algo)
    config = (dict(ppo_side_by_side.PJR_CONFIG, TOTAL_TIMESTEPS=1024.0) if algo == "ppo"
              else dqn_side_by_side.pjr_config(20000))
    train = peers.load(algo).make_train(config)
    out = jax.eval_shape(train, jax.ShapeDtypeStruct((2,), jnp.uint32))
    assert "metrics" in out
