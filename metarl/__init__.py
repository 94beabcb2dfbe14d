"""metarl: evolve parts of RL algorithms (CLI, config, devices, checkpoints, logging, plots)."""
import os as _os

# XLA's C++ logging writes warning and error lines to stderr whenever a compiled program is loaded
# from the on-disk compilation cache ("Assume version compatibility", "Target machine feature
# +prefer-no-gather is not supported", both harmless). They would bury the CLI's one-line errors
# and every run's console, so metarl shows C++ logs only at FATAL, unless the level was set to
# something other than "1": that is jax's own default, which a parent process that imported jax
# passes on. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything. Failures still raise Python exceptions.
if _os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "1":
    _os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
