"""The checkpoint digest's cost against a default run's generation time.

Runs ``python -m metarl.evolve experiment=value_loss`` (the README's main line, default sizes) for
``--generations`` generations with a checkpoint after every one, then times ``metarl.rundir.digest`` over
the newest checkpoint's state and history ``--repeats`` times. A run computes the digest once per
checkpoint (``checkpoint.every``, default 5), so ``overhead_every_generation`` (digest median over
generation median) is the cost with a checkpoint every generation and ``overhead_default`` the default's.
Prints one JSON object; progress goes to stderr.

    python -m benchmarks.digest_overhead                  # about 3 minutes on 2 cores
    python -m benchmarks.digest_overhead --generations 6 --repeats 50
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from metarl import rundir
    from metarl.config import CheckpointSection

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [sys.executable, "-m", "metarl.evolve", "experiment=value_loss", f"es.generations={args.generations}",
               "checkpoint.every=1", "logger.progress=false", f"run_dir={run_dir}"]
        print(f"running: {' '.join(cmd)}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        generation_s = [r["seconds"] for r in rundir.RunDir(run_dir).metrics()]
        with contextlib.closing(rundir.Checkpointer(run_dir, write=False)) as ckpt:
            step, state, meta = ckpt.newest()
        timings = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            assert rundir.digest(state, meta) == meta["digest"]
            timings.append(time.perf_counter() - t)
    import jax
    import numpy as np
    digest_s, gen_s = statistics.median(timings), statistics.median(generation_s)
    print(json.dumps({
        "generation_s_median": gen_s, "digest_s_median": digest_s,
        "overhead_every_generation": digest_s / gen_s,
        "overhead_default": digest_s / gen_s / CheckpointSection().every,
        "state_bytes": int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))),
        "history_records": len(meta["history"]), "generations": args.generations, "repeats": args.repeats,
        "generation_s": generation_s, "digest_s": timings, "jax": jax.__version__, "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
