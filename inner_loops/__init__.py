"""RL inner loops: fully jitted trainers (PPO, DQN, tabular Q-learning) and JAX environments.

This package knows RL and environments only; it never imports ``metarl.outer_loops`` or the rest of ``metarl``. Import it as ``metarl.inner_loops``.
"""
