import json
import os
import shutil
import signal
import tempfile

import pytest

from clihelp import TEST_XLA_FLAGS, TINY, evolve

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


@pytest.fixture(scope="session")
def tiny_value_loss_run(tmp_path_factory):
    """``python -m metarl.evolve experiment=value_loss`` at TINY sizes for two generations, its output piped
    (not a terminal), as test_cli.py and test_progress.py both start it: ``(run_dir, the finished process)``.
    Made once per session; the tests read it and write nothing into it."""
    cwd = tmp_path_factory.mktemp("tiny_value_loss")
    run_dir = cwd / "run"
    proc = evolve(["experiment=value_loss", *TINY, "es.generations=2", f"run_dir={run_dir}"], cwd=cwd, check=True)
    return run_dir, proc

# --- pytest-xdist: the tests that share a run on one worker, the longest work first --------------------
#
# Under `-n` (xdist's default `--dist load`), tests go to the workers in chunks of consecutive tests: a
# module-scoped run (a tiny evolution that several tests read) was made again on each worker that got one
# of its tests, and a long test could start last and finish alone. Here instead each worker, at collection,
# writes a plan: the tests that use one of the suite's own module- or session-scoped fixtures form one unit
# (run on one worker, the fixture made once), every other test is a unit of its own, and each unit's cost
# is its tests' timeouts (the suite marks each compiling test with one). The controller then gives an idle
# worker the costliest unit left. Another `--dist` is left as it is.

SHARED_SCOPES = ("module", "package", "session")
PLAN_KEY = "metarl_xdist_plan"
_plan_dir: str | None = None


def _shared_fixtures(item) -> list[str]:
    """The suite's own module-, package- or session-scoped fixtures that ``item`` uses (not pytest's)."""
    info = getattr(item, "_fixtureinfo", None)
    found = []
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if defs and defs[-1].scope in SHARED_SCOPES and defs[-1].baseid:
            found.append(f"{defs[-1].baseid}::{name}")
    return found


def _timeout(item) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is None:
        return 0.0
    value = mark.args[0] if mark.args else mark.kwargs.get("timeout", 0)
    return float(value or 0)


def pytest_collection_modifyitems(config, items):
    path = getattr(config, "workerinput", {}).get(PLAN_KEY)
    if not path:
        return
    # Tests joined through a shared fixture, transitively (union-find over the fixtures).
    parent: dict[str, str] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    uses = {item.nodeid: _shared_fixtures(item) for item in items}
    for fixtures in uses.values():
        for other in fixtures[1:]:
            parent[find(other)] = find(fixtures[0])
    plan = {"groups": {nodeid: "shared:" + find(fixtures[0]) for nodeid, fixtures in uses.items() if fixtures},
            "cost": {item.nodeid: _timeout(item) for item in items}}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    os.replace(tmp, path)  # both workers write the same plan


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    global _plan_dir
    if _plan_dir is None:
        _plan_dir = tempfile.mkdtemp(prefix="metarl-xdist-plan-")
    node.workerinput[PLAN_KEY] = os.path.join(_plan_dir, "plan.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load" or _plan_dir is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        plan = None

        def _plan(self):
            if self.plan is None:
                try:
                    with open(os.path.join(_plan_dir, "plan.json")) as f:
                        self.plan = json.load(f)
                except (OSError, ValueError):  # no plan: one test per unit, in collection order
                    self.plan = {"groups": {}, "cost": {}}
            return self.plan

        def _split_scope(self, nodeid):
            return self._plan()["groups"].get(nodeid, nodeid)

        def _assign_work_unit(self, node):
            cost = self._plan()["cost"]
            scope = max(self.workqueue, key=lambda s: sum(cost.get(n, 0.0) for n in self.workqueue[s]))
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def pytest_sessionfinish(session):
    if _plan_dir is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_plan_dir, ignore_errors=True)
