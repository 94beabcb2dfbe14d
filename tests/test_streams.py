"""The named random streams (metarl.outer_loops.streams): each is what docs/results.md says, and no two give one key."""
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from metarl.config import SEED_MAX
from metarl.outer_loops import streams

DOCS = Path(__file__).parents[1] / "docs"
SEEDS = [0, 1, 3, 42, streams.EVAL_ROOT, streams.EVAL_ROOT + 1, streams.TUNING_SEED_BITS, 2**32 - 1, 2**32, SEED_MAX]


def _data(keys) -> list[tuple]:
    return [tuple(row) for row in np.asarray(jax.random.key_data(keys)).reshape(-1, 2).tolist()]


def test_each_stream_is_what_the_docs_say():
    rows = re.findall(r"^\| (\w+) \| `([^`]+)`", (DOCS / "results.md").read_text(), re.MULTILINE)
    documented = {name: int(found[0].replace("_", ""), 16) for name, keys in rows
                  if (found := re.findall(r"fold_in\(key\(seed\), (0x[0-9A-F_]+)\)", keys))}
    assert documented == streams.STREAMS
    assert dict(rows)["evolution"] == "key(seed)" and dict(rows)["evaluation"] == "fold_in(key(10000), i)"
    assert "seed ^ (0x7E57_5EED + i)" in (DOCS / "results.md").read_text()
    seed = 7
    for name, constant in streams.STREAMS.items():
        expected = jax.random.split(jax.random.fold_in(jax.random.key(seed), constant), 5)
        assert _data(streams.stream(seed, name, 5)) == _data(expected)
    assert _data(streams.evolution(seed)) == _data(jax.random.key(seed))
    per_task = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 0x5EED_0004), 0), 2)
    assert _data(streams.per_task_tuning(seed, 2)) == _data(per_task)
    root, keys = streams.evaluation(seed, 3)
    assert root == 10_000 and _data(keys) == sum((_data(jax.random.fold_in(jax.random.key(10_000), i))
                                                       for i in range(3)), [])
    assert streams.evaluation(10_000, 1)[0] == 10_001
    assert streams.tuning_seed(seed, 1) == seed ^ (0x7E57_5EED + 1)


def test_stored_records_name_the_same_streams():
    """The stream numbers stored in the repository's records are the ones the streams still draw from."""
    validations = list((DOCS / "runs").rglob("validation.json"))
    assert validations
    for path in validations:
        assert json.loads(path.read_text())["stream"] == streams.STREAMS["validation"], path
    for path in (DOCS / "runs").rglob("slice_*.json"):
        assert json.loads(path.read_text())["stream"] == streams.STREAMS["slice"], path


@pytest.mark.parametrize("seed", SEEDS)
def test_no_two_streams_give_one_key(seed):
    """Per run seed, every key drawn from one stream differs from every key of every other stream (and from the
    keys evolution splits off ``key(seed)``, and the tunings' seeds' own)."""
    drawn = {"evolution": _data(streams.evolution(seed)) + _data(jax.random.split(streams.evolution(seed), 4)),
             "evaluation": _data(streams.evaluation(seed, 16)[1])}
    for name in streams.STREAMS:
        drawn[name] = _data(streams.stream(seed, name, 16))
    for j in range(3):
        key = streams.per_task_tuning(seed, j)
        drawn[f"per_task_tuning {j}"] = _data(key) + _data(jax.random.split(key))
        tuning = streams.tuning_seed(seed, j)
        assert tuning != seed
        drawn[f"tuning {j}"] = _data(streams.evolution(tuning)) + _data(streams.stream(tuning, "validation", 4))
    owner = {}
    for name, keys in drawn.items():
        for key in keys:
            assert owner.setdefault(key, name) == name, f"seed {seed}: {name} and {owner[key]} share a key"
