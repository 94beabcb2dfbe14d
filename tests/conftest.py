import os
import signal
import tempfile

from clihelp import TEST_XLA_FLAGS

os.environ.setdefault("XLA_FLAGS", TEST_XLA_FLAGS)
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# One CPU device per CLI run or evaluation unless a test asks for more: `auto` (the default) would
# make one per core, and pytest-xdist already runs one test per core.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "1")

# One compilation cache for the whole session: the CLI tests run the same tiny program in many
# subprocesses, and only the first has to compile it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="metarl-test-jax-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# Under `nohup` SIGHUP is ignored, and an ignored signal stays ignored in every process started from
# here, so the runs the tests signal would never see it (a run keeps an inherited SIG_IGN on purpose).
# A handler that does nothing keeps this process alive on a hangup, as nohup intends, while the runs
# it starts get the default disposition back (exec resets handled signals).
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)
