"""The docs quote their records: a figure in README.md, docs/studies/*.md or docs/runs/*/README.md followed by
``<!-- record: PATH KEY -->`` (PATH from the repository's root, KEY a /-separated path into its JSON, ``len`` for
a list's length) is the record's value rounded as printed (an interval ``[low, high]`` both bounds; a percentage
the value x 100), and a table rendered by a command is what that command renders from its record today."""
import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "studies").glob("*.md")),
        *sorted((ROOT / "docs" / "runs").glob("*/README.md"))]
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
MARKED = re.compile(rf"(?:\[({NUMBER}), ({NUMBER})\]|({NUMBER}))(%?)\s*<!-- record: (\S+) (\S+) -->")


def value(record, key: str):
    for part in key.split("/"):
        record = len(record) if part == "len" else record[int(part)] if isinstance(record, list) else record[part]
    return record


def agrees(shown: str, actual: float, percent: str) -> bool:
    mantissa, _, exponent = shown.replace(",", "").partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    tolerance = 0.5 * 10 ** (int(exponent or 0) - decimals)
    return abs(float(shown.replace(",", "")) - (100 if percent else 1) * actual) <= tolerance + 1e-9


def marked(text: str):
    return [(m.group(0), [g for g in (m.group(1), m.group(2), m.group(3)) if g], m.group(4), m.group(5), m.group(6))
            for m in MARKED.finditer(text)]


def test_every_marked_figure_is_its_records():
    wrong, found = [], 0
    for doc in DOCS:
        text = doc.read_text()
        figures = marked(text)
        # a marker with no figure right before it checks nothing: refused
        assert len(figures) == text.count("<!-- record: "), f"{doc}: a marker not right after a figure"
        for quoted, shown, percent, path, key in figures:
            actual = value(json.loads((ROOT / path).read_text()), key)
            actual = actual if isinstance(actual, list) else [actual]
            found += 1
            if len(shown) != len(actual) or not all(agrees(s, a, percent) for s, a in zip(shown, actual)):
                wrong.append(f"{doc.relative_to(ROOT)}: {quoted!r}, the record has {actual}")
    assert not wrong, "\n".join(wrong)
    assert found >= 40   # the restated results: README's paragraph, horizon_cpu, the studies


def test_a_figure_that_differs_from_its_record_is_caught():
    text = "IQM -0.086 [-0.140, -0.026]<!-- record: docs/runs/horizon_cpu/evaluation_held-out_per_task16-64.json " \
           "payoff/iqm_difference_ci95 --> and 3%<!-- record: x y -->"
    (quoted, shown, _, _, key), (_, pct, percent, _, _) = marked(text)
    assert shown == ["-0.140", "-0.026"] and key == "payoff/iqm_difference_ci95" and pct == ["3"] and percent
    assert agrees("-0.140", -0.1403, "") and not agrees("-0.140", -0.1394, "") and agrees("3", 0.0301, "%")
    assert agrees("1.06e8", 105512960, "") and not agrees("1.06e8", 1.07e8, "") and agrees("1,320", 1320, "")


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rendered_tables_are_their_records():
    headroom = load(ROOT / "examples" / "headroom.py")
    study = ROOT / "docs" / "studies" / "headroom"
    table = headroom.table(json.loads((study / "headroom.json").read_text())["pairs"])
    assert (study / "headroom.md").read_text() == table + "\n" and table in (study.parent / "headroom.md").read_text()
    runs = ROOT / "docs" / "runs" / "high_lr_schedule"
    sweep = load(ROOT / "examples" / "lr_sweep.py").table(json.loads((runs / "lr_sweep.json").read_text()))
    assert (runs / "lr_sweep.md").read_text() == sweep + "\n"


def test_a_stored_evaluation_holds_todays_statistics(tmp_path):
    """examples/restate.py on a copy of a record changes none of its statistics: the records were re-stated with
    the statistics metarl computes now (rerun it after changing them)."""
    import shutil

    record = ROOT / "docs" / "runs" / "horizon_cpu" / "evaluation_held-out_per_task16-64.json"
    copy = tmp_path / record.name
    shutil.copy(record, copy)
    load(ROOT / "examples" / "restate.py").restate(copy)
    stored, again = json.loads(record.read_text()), json.loads(copy.read_text())
    for key in ("aggregate", "payoff", "paired"):
        assert json.dumps(stored[key], sort_keys=True) == json.dumps(again[key], sort_keys=True), key
    assert [r["degenerate"] for r in stored["tasks"]] == [r["degenerate"] for r in again["tasks"]]
