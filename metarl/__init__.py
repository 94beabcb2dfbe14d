"""metarl: evolve parts of RL algorithms (CLI, config, devices, checkpoints, logging, plots)."""
import os as _os

# XLA's C++ logging writes warning and error lines to stderr whenever a compiled program is loaded
# from the on-disk compilation cache ("Assume version compatibility", "Target machine feature
# +prefer-no-gather is not supported", both harmless). They would bury the CLI's one-line errors
# and every run's console, so metarl silences C++ logs below FATAL unless the user set a level.
# Failures still surface as Python exceptions. Takes effect when jax is first imported after this.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
