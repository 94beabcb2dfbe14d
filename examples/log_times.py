"""Turns the durations a run folder's logs print into a JSON record beside them, for the docs to quote:

    python examples/log_times.py docs/runs/NAME [...]

Writes NAME/times.json: for each ``*.log`` there (sorted), each kind of duration it prints, in the log's order,
in seconds: ``reference`` ("measured the reference returns in 28.9 s"), ``compile`` ("compiled the generation in
54.6 s"), ``tuning`` ("144 trainings in 285 s") and ``command`` ("== evolve rc=0 after 432 s"). A generation's
seconds are in metrics.jsonl already. tests/test_docs_records.py checks the record is what this writes today.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

KINDS = {"reference": r"measured the reference returns in ([\d.,]+) s\b", "compile": r"compiled the generation in "
         r"([\d.,]+) s\b", "tuning": r"trainings in ([\d.,]+) s\b", "command": r"^== \S+ rc=\d+ after ([\d.,]+) s\b"}


def times(folder: Path) -> dict:
    """Each log's durations by kind, in seconds; a kind (or a log) with none is left out."""
    record = {}
    for log in sorted(folder.glob("*.log")):
        text = log.read_text()
        found = {kind: [float(s.replace(",", "")) for s in re.findall(pattern, text, re.M)]
                 for kind, pattern in KINDS.items()}
        if any(found.values()):
            record[log.name] = {kind: seconds for kind, seconds in found.items() if seconds}
    return record


def main(folders: list[str]) -> None:
    for folder in map(Path, folders):
        (folder / "times.json").write_text(json.dumps(times(folder), indent=1) + "\n")
        print(f"wrote {folder / 'times.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
