"""wandb in offline mode through the CLI: read back what the run directory's wandb run holds."""
import json
import struct
from pathlib import Path

import pytest

from clihelp import TINY, evolve


def wandb_records(path):
    """The protobuf records of an offline run file (``run-<id>.wandb``): a LevelDB-style log of 32 KiB
    blocks, each record a 7-byte header (checksum, length, type) and its data, split over blocks
    as FIRST/MIDDLE/LAST pieces; the file opens with a 7-byte ``:W&B`` header."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32768, 7
    pos, pending, records = 7, b"", []
    while pos + header <= len(data):
        if block - pos % block < header:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + header])
        if kind == 0:
            break
        chunk = data[pos + header:pos + header + length]
        pos += header + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL, FIRST start a record
        if kind in (1, 4):  # FULL, LAST end one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


@pytest.mark.timeout(600)
def test_offline_run_holds_histograms_search_figures_and_the_best_as_an_artifact(tmp_path):
    run_dir = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("component.")]
    home = {k: str(tmp_path / "wandb-home") for k in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")}
    proc = evolve(["experiment=hyperparams", *tiny, "es.generations=2", f"run_dir={run_dir}",
                   "logger.wandb.mode=offline", "logger.wandb.group=sweep-7", "logger.wandb.tags=[tiny,test]"],
                  cwd=tmp_path, check=True, extra_env={**home, "WANDB_SILENT": "false"})  # the suite silences it
    # wandb says where the run is saved, without its footer (history and summary) unless logger.verbose.
    assert "Run data is saved locally" in proc.stderr and "Run summary" not in proc.stderr, proc.stderr
    (offline,) = list((run_dir / "wandb").glob("offline-run-*"))
    records = wandb_records(next(offline.glob("run-*.wandb")))
    kinds = [r.WhichOneof("record_type") for r in records]

    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_group == "sweep-7" and list(run.tags) == ["tiny", "test"] and run.project == "metarl"

    history = [{("/".join(i.nested_key) or i.key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    per_generation = [h for h in history if "fitness/_type" in h]
    assert [h["_step"] for h in per_generation] == [1, 2]  # generations from 1, as metrics.jsonl
    for h in per_generation:
        assert h["fitness/_type"] == "histogram" and sum(h["fitness/values"]) == 4  # popsize members
        assert 1e-5 <= h["search/mean/lr"] <= 1e-2 and h["search/low/lr"] <= h["search/high/lr"]
        assert "best" in h and "mean" in h

    images = {k.split("/")[1]: v for h in history for k, v in h.items()
              if k.startswith("figures/") and k.endswith("/_type")}
    assert images == {"fitness": "image-file", "hyperparams": "image-file", "signal": "image-file"}
    pngs = sorted(p.name for p in (offline / "files" / "media" / "images" / "figures").glob("*.png"))
    assert [p.split("_")[0] for p in pngs] == ["fitness", "hyperparams", "signal"], pngs

    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifact.type == "meta-params" and artifact.name == "run-meta-params"
    assert sorted(e.path for e in artifact.manifest.contents) == ["best_meta_params.json",
                                                                   "best_meta_params.msgpack"]
    metadata = json.loads(artifact.metadata)
    assert metadata["kind"] == "hyperparams" and metadata["generation"] in (1, 2)
    assert "exit" in kinds  # the run was finished, not left open
