"""RL inner loops: fully jitted trainers (PPO, DQN, tabular Q-learning) and JAX environments.

This package knows RL and environments only; it never imports ``outer_loops`` or ``metarl``.
"""
