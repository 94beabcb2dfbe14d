"""metarl: evolve parts of RL algorithms (CLI, config, devices, checkpoints, logging, plots)."""
import os as _os

# XLA's C++ logging writes harmless warnings to stderr whenever a compiled program is loaded from the
# on-disk cache, which would bury the CLI's one-line errors: metarl shows C++ logs only at FATAL unless
# the level was set to something other than jax's own default, "1" (TF_CPP_MIN_LOG_LEVEL=0 shows all).
if _os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "1":
    _os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
