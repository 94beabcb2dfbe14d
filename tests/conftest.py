import os

# Tests compile small programs; a single XLA thread per op avoids oversubscribing the 2-core CI box.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
