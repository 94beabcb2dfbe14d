"""The docs quote their records: a figure in README.md, docs/studies/*.md or docs/runs/*/README.md followed by
``<!-- record: PATH KEY -->`` (PATH from the repository's root, KEY a /-separated path into its JSON, ``len`` for
a list's length; a JSON-lines record is the list of its lines) is the record's value rounded as printed (an
interval ``[low, high]`` both bounds; a percentage the value x 100), and a table or record rendered by a command is
what that command renders today. Every decimal in those docs quotes its record so."""
import importlib.util
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "studies").glob("*.md")),
        *sorted((ROOT / "docs" / "runs").glob("*/README.md"))]
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
MARKED = re.compile(rf"(?:\[({NUMBER}), ({NUMBER})\]|({NUMBER}))(%?)\s*<!-- record: (\S+) (.+?) -->")
# tables a command renders into a file of their own (test_rendered_tables_are_their_records checks them)
RENDERED = [ROOT / "docs" / "studies" / "headroom" / "headroom.md",
            ROOT / "docs" / "runs" / "high_lr_schedule" / "lr_sweep.md"]
# a decimal figure, also as a ratio (1.5x); not a version part (0.11.2) or a name (v1.5a)
DECIMAL = re.compile(r"(?<![\w.])[-+]?\d[\d,]*\.\d+(?:e[-+]?\d+)?(?=x\b|[^\w.]|$)", re.M)
QUOTED = re.compile(rf"\]?%?\s*<!-- record: |, {NUMBER}\]\s*<!-- record: ")
# code, versions, and blocks `benchmarks.reproduce page` renders (tests/test_reproduce.py checks them)
NOT_FIGURES = re.compile(r"```.*?```|`[^`\n]*`|(?:Python|jax|gymnax) \d+\.\d+|<!-- table: .*?<!-- end -->", re.S)
# figures another test checks against their records: the reproductions' summary (tests/test_reproduce.py)
CHECKED = {ROOT / "docs" / "studies" / "reproductions.md": re.compile(r"ratio [\d.]+ \[[\d.]+, [\d.]+\]")}


def value(record, key: str):
    """``part*`` in a key is the one key that begins with ``part`` (a label with spaces: ``sides/tuned*``)."""
    for part in key.split("/"):
        if part.endswith("*"):
            (part,) = [name for name in record if name.startswith(part[:-1])]
        record = len(record) if part == "len" else record[int(part)] if isinstance(record, list) else record[part]
    return record


def read(path: Path):
    """A JSON record, a JSON-lines one as the list of its lines, or a YAML config (a setting the docs quote)."""
    text = path.read_text()
    if path.suffix == ".yaml":
        return yaml.safe_load(text)
    return [json.loads(line) for line in text.splitlines()] if path.suffix == ".jsonl" else json.loads(text)


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
            actual = value(read(ROOT / path), key)
            actual = actual if isinstance(actual, list) else [actual]
            found += 1
            if len(shown) != len(actual) or not all(agrees(s, a, percent) for s, a in zip(shown, actual)):
                wrong.append(f"{doc.relative_to(ROOT)}: {quoted!r}, the record has {actual}")
    assert not wrong, "\n".join(wrong)
    assert found >= 600   # every decimal of the docs and many counts


def test_a_figure_that_differs_from_its_record_is_caught():
    text = "IQM -0.086 [-0.140, -0.026]<!-- record: docs/runs/horizon_cpu/evaluation_held-out_per_task16-64.json " \
           "payoff/iqm_difference_ci95 --> and 3%<!-- record: x y -->"
    (quoted, shown, _, _, key), (_, pct, percent, _, _) = marked(text)
    assert shown == ["-0.140", "-0.026"] and key == "payoff/iqm_difference_ci95" and pct == ["3"] and percent
    assert agrees("-0.140", -0.1403, "") and not agrees("-0.140", -0.1394, "") and agrees("3", 0.0301, "%")
    assert agrees("1.06e8", 105512960, "") and not agrees("1.06e8", 1.07e8, "") and agrees("1,320", 1320, "")


def unquoted(text: str, rendered=(), checked=None) -> list[str]:
    """The decimals in a doc's text that no marker follows, outside code, versions, rendered tables' rows and
    what ``checked`` matches."""
    rows = {line for table in rendered for line in table.splitlines() if line.startswith("|")}
    lines, previous = [], ""
    for line in text.splitlines():   # an indented block after a blank line is code; a table row a command wrote
        code = line.startswith(("    ", "\t")) and not previous.strip()
        lines.append("" if code or line in rows else line)
        previous = lines[-1] if code else line
    text = "\n".join(lines)
    for pattern in (NOT_FIGURES, checked) if checked else (NOT_FIGURES,):
        text = pattern.sub(lambda m: re.sub(r"\S", " ", m.group(0)), text)
    text = re.sub(r"(<!-- record: )(.*?)(-->)", lambda m: m.group(1) + " " * len(m.group(2)) + m.group(3), text)
    return [m.group(0) for m in DECIMAL.finditer(text) if not QUOTED.match(text, m.end())]


def test_every_decimal_in_the_docs_names_its_record():
    """Outside code, versions and tables a command renders, every decimal figure is followed by its marker."""
    rendered = [path.read_text() for path in RENDERED] + load(ROOT / "examples" / "jax_tables.py").tables()
    missing = {doc.relative_to(ROOT): unquoted(doc.read_text(), rendered, CHECKED.get(doc)) for doc in DOCS}
    assert not any(missing.values()), "\n".join(f"{doc}: {figures}" for doc, figures in missing.items() if figures)


def test_a_figure_without_a_marker_is_caught():
    text = ("IQM 1.88<!-- record: a b --> and 1.40 [0.99, 1.03]<!-- record: a c --> on Python 3.13, `lr=0.25`,\n"
            "```\n0.5 s\n```\n| x | 2.5 |\n| y | 7.5 |\n\n    python run.py lr=0.1\n      seed=0.5\nmean 0.6"
            "<!-- record: a final 0.2/mean --> 0.7, 1.3<!-- record: a c -->x and 1.5x, 64x64")
    assert unquoted(text, ["| y | 7.5 |"]) == ["1.40", "2.5", "0.7", "1.5"]
    text = "<!-- table: r.json -->\n| a | 1.5 |\n<!-- end -->\nratio 1.02 [0.99, 1.05], mean 2.5"
    assert unquoted(text, checked=re.compile(r"ratio [\d.]+ \[[\d.]+, [\d.]+\]")) == ["2.5"]


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
    speed = (ROOT / "docs" / "studies" / "speed.md").read_text()
    assert all(table in speed for table in load(ROOT / "examples" / "jax_tables.py").tables())
    runs = ROOT / "docs" / "runs" / "high_lr_schedule"
    sweep = load(ROOT / "examples" / "lr_sweep.py").table(json.loads((runs / "lr_sweep.json").read_text()))
    assert (runs / "lr_sweep.md").read_text() == sweep + "\n"


def test_log_times_are_their_logs():
    log_times = load(ROOT / "examples" / "log_times.py")
    records = sorted((ROOT / "docs" / "runs").glob("*/times.json"))
    assert records
    for record in records:
        assert json.loads(record.read_text()) == log_times.times(record.parent), record


def test_a_learned_schedule_record_is_its_run():
    schedule = load(ROOT / "examples" / "schedule_record.py")
    run = ROOT / "docs" / "runs" / "high_lr_schedule"
    assert json.loads((run / "schedule.json").read_text()) == json.loads(json.dumps(schedule.schedule(run)))


def test_the_signal_study_is_its_runs_records():
    signal = load(ROOT / "examples" / "signal_record.py")
    assert json.loads(signal.RECORD.read_text()) == json.loads(json.dumps(signal.record()))


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
