"""Per-generation reporting: a console line, ``metrics.jsonl`` and (optionally) Weights & Biases.

To wandb go, every generation, the scalars of the record, every member's fitness as a histogram
(``fitness``) and the decoded search distribution of a hyperparameter search (``search/mean/lr``,
``search/low/lr``, ...); at the end of a run, the figures of ``python -m metarl.inspect`` as images
(``figures/<name>``) and the best meta-parameters as a versioned artifact of type ``meta-params``.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Optional

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill mid-write
                break
    return records


def _json_safe(value):
    """``value`` with every NaN or infinity as None: JSON has no token for them (Python's json would
    write ``NaN``, which strict readers refuse)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def to_json_line(record: dict) -> str:
    return json.dumps(_json_safe(record), allow_nan=False) + "\n"


def truncate_metrics(run_dir: str | Path, generations_done: int) -> None:
    """Keep the records of the first ``generations_done`` generations: a resumed run recomputes the
    rest, so each generation appears exactly once."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return
    kept = [r for r in read_metrics(run_dir) if r.get("generation", 0) <= generations_done]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(to_json_line(r) for r in kept))
    os.replace(tmp, path)


def say(text: str, error: bool = False) -> None:
    """A line on the console. A console that has gone away (a closed terminal: EIO; a closed pipe:
    EPIPE) never stops a run: the line is dropped, and ``metrics.jsonl`` stays the record."""
    try:
        print(text, file=sys.stderr if error else sys.stdout, flush=True)
    except OSError:
        pass


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Logger:
    def __init__(self, run_dir: Path, config: dict, total_generations: int, progress: bool = True,
                 wandb_cfg: Optional[dict] = None, write: bool = True, run_name: str = "",
                 task_names: Optional[list] = None):
        self.run_dir = Path(run_dir)
        self.total = total_generations
        self.progress = progress and write
        self.write = write
        self.durations: list[float] = []
        self.task_names = list(task_names or [])
        self.wandb_run = None
        self.last_step = 0
        if write and wandb_cfg and wandb_cfg.get("mode", "disabled") != "disabled":
            import wandb

            # A sweep's runs share `group` (null: each run stands alone).
            self.wandb_run = wandb.init(project=wandb_cfg.get("project", "metarl"),
                                        entity=wandb_cfg.get("entity"), mode=wandb_cfg["mode"],
                                        group=wandb_cfg.get("group"), tags=list(wandb_cfg.get("tags") or []),
                                        dir=str(self.run_dir), config=config,
                                        name=run_name or self.run_dir.name,
                                        id=_wandb_id(self.run_dir), resume="allow")

    def log(self, record: dict) -> None:
        if not self.write:
            return
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(to_json_line(record))
        self.durations.append(record["seconds"])
        if self.progress:
            g = record["generation"]
            recent = sorted(self.durations[-5:])[len(self.durations[-5:]) // 2]
            left = (self.total - g) * recent
            bad = f" | diverged {record['nonfinite']}" if record.get("nonfinite") else ""
            if len(self.task_names) > 1 and "tasks" in record:  # the population's mean, raw (score)
                bad += " | " + " ".join(f"{n} {t['raw_mean']:.1f} ({t['score_mean']:.2f})"
                                        for n, t in record["tasks"].items())
            say(f"gen {g:>4}/{self.total} | best {record['best']:9.2f} | mean {record['mean']:9.2f} | "
                f"best so far {record['best_so_far']:9.2f} | {record['fps']:9.3g} frames/s | "
                f"{record['seconds']:6.1f} s | left {_duration(left)}{bad}")
        if self.wandb_run is not None:
            import wandb

            data = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "generation"}
            data["fitness"] = wandb.Histogram(record["fitness"])
            for name, values in record.get("tasks", {}).items():
                data.update({f"tasks/{name}/{stat}": v for stat, v in values.items()})
            for part, values in record.get("search", {}).items():  # mean, low, high -> {name: value}
                data.update({f"search/{part}/{name}": v for name, v in values.items()})
            self.wandb_run.log(data, step=record["generation"])
            self.last_step = record["generation"]

    def log_results(self, figures: list, best_files: list, best_info: Optional[dict]) -> None:
        """The end of a run, to wandb: ``figures`` (PNG paths) as images, and ``best_files`` (the
        exported best meta-parameters) as an artifact; a resumed run adds a new version."""
        if self.wandb_run is None:
            return
        import wandb

        images = {f"figures/{Path(p).stem}": wandb.Image(str(p)) for p in figures}
        if images:
            self.wandb_run.log(images, step=self.last_step)
        if best_files:
            name = re.sub(r"[^\w.-]", "-", f"{self.run_dir.name}-meta-params")
            artifact = wandb.Artifact(name, type="meta-params", metadata=best_info or {},
                                      description="best meta-parameters found (flax msgpack) and what they belong to")
            for path in best_files:
                artifact.add_file(str(path))
            self.wandb_run.log_artifact(artifact)

    @property
    def wandb_on(self) -> bool:
        return self.wandb_run is not None

    def message(self, text: str) -> None:
        if self.write:
            say(text, error=text.startswith("error"))

    def finish(self, summary: Optional[dict] = None) -> None:
        if self.wandb_run is not None:
            if summary:
                for k, v in summary.items():
                    self.wandb_run.summary[k] = v
            self.wandb_run.finish()


def _wandb_id(run_dir: Path) -> str:
    # Stable per run directory, so a resumed run continues the same wandb run.
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]

