"""A side kind of the tests' own, in one entry (tests/test_sides.py; docs/extending.md): the baseline again on a
second stream of seeds, agent i from ``fold_in(its evaluation key, 1)``. Against the baseline it is an A/A test:
how far apart two seed streams of one method land, the noise every other comparison stands on."""
import jax

from metarl import sides


def other_seeds(run, args) -> list:
    baseline = sides.BASELINE.build(run, args)[0]
    trainers = tuple(lambda key, train=train: train(jax.random.fold_in(key, 1)) for train in baseline.trainers)
    return [sides.Side(f"{baseline.label.split(':')[0]}, other seeds", "other_seeds", trainers)]


OTHER_SEEDS = sides.register(sides.SideKind(
    "other_seeds", other_seeds, order=3.5, colours=("tab:red",), column=lambda label: "A/A",
    compared=(sides.Comparison("test_other_seeds", "other_seeds", "other_seeds", "baseline"),),
    compute=sides.BASELINE.compute, cost=lambda report, c: f"the baseline on other seeds {c['tuning']:,}"))
