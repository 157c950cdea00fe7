"""Renderers: the JSON document, self-contained HTML with four SVG plots, Markdown, terminal, and
`diag export --perfetto` of a trace the agent wrote."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from xml.etree import ElementTree

from rich.console import Console

import diag
from diag import agent, schema
from diag.cli import main
from diag.findings import Finding, Fix
from diag.importers import load_inputs
from diag.report import html, json_report, markdown, model, terminal
from tests.unit.kineto_samples import GPT_DS

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

FINDING = Finding(rule="exposed_comm", severity="warning", title="comm <exposed> & slow", detail="d",
                  ranks=[1], recoverable_s=0.004, fixes=[Fix("overlap it", ds_config={"zero_optimization": {
                      "overlap_comm": True}}, env={"NCCL_ALGO": "Ring"})])


def _doc():
    trace = load_inputs([GPT_DS])
    return model.build(trace, [FINDING], {"broken_rule": "KeyError: 'x'"})


def test_json_document_is_plain_and_versioned():
    doc = json.loads(json_report.render(_doc()))
    assert (doc["schema"], doc["version"]) == (model.SCHEMA, model.VERSION)
    assert set(doc["metrics"]) == {"breakdown", "overlap", "collectives", "bandwidth_by_size",
                                   "stragglers", "step_times", "loss_scale", "steps_joined"}
    assert doc["findings"][0]["fixes"][0]["env"] == {"NCCL_ALGO": "Ring"}
    assert all(r["source"] == "cpu" for r in doc["metrics"]["breakdown"])


def test_html_is_self_contained_with_plots():
    page = html.render(_doc())
    assert page.count("<svg") == 4 and "<script" not in page and "src=" not in page
    assert "comm &lt;exposed&gt; &amp; slow" in page  # escaped
    assert "Loss scale over steps" in page and "polyline" in page
    assert "rule broken_rule failed" in page
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):  # each plot is well-formed XML
        assert ElementTree.fromstring(svg).tag.endswith("svg")


def test_markdown_and_terminal_show_findings_and_fixes():
    doc = _doc()
    md = markdown.render(doc)
    assert "### [warning] comm <exposed> & slow (`exposed_comm`)" in md
    assert "overlap_comm" in md and "NCCL_ALGO=Ring" in md and "| rank | source | span ms |" in md
    out = io.StringIO()
    terminal.render(doc, Console(file=out, width=200), quiet=False)
    text = out.getvalue()
    assert "WARNING comm <exposed> & slow" in text and "recoverable: ~4.0 ms per step" in text
    assert "Collectives" in text and "all_reduce" in text


def test_perfetto_export_of_agent_trace(tmp_path, capsys):
    ag = agent.start(str(tmp_path / "t"), what=("steps",))
    t0 = ag.now()
    ag.emit((schema.STEP, 0, t0, 5_000_000, 8, None, True))
    ag.emit((schema.LAYER, 0, "model.layers.0.mlp", "forward", t0 + 100, 1_000_000, 10**9, None))
    ag.emit((schema.COMM, 0, "all_reduce", 4 << 20, "float32", "dp", 2, [0, 1], t0 + 2_000_000,
             1_000_000, "model.embed", False))
    agent.stop()
    out = tmp_path / "timeline.json"
    assert main(["export", "--perfetto", str(out), str(tmp_path / "t")]) == 0
    doc = json.loads(out.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["tid"], e["name"]) for e in spans) == [
        (1, "step 0"), (2, "model.layers.0.mlp forward"), (3, "all_reduce")]
    comm = next(e for e in spans if e["tid"] == 3)
    assert comm["dur"] == 1000.0 and comm["args"]["bytes"] == 4 << 20
    step = next(e for e in spans if e["tid"] == 1)
    assert comm["ts"] - step["ts"] == 2000.0 and step["ts"] == 0.0  # microseconds from the first event
    assert diag.load(str(tmp_path / "t")).ranks == [r["pid"] for r in doc["traceEvents"]
                                                    if r.get("name") == "process_sort_index"]
    assert "wrote 3 events" in capsys.readouterr().out


def test_straggler_column_is_the_rules_verdict():
    """The stragglers table says "yes" exactly for the ranks the straggler rule flagged: on a healthy
    2-rank run one rank still arrives last at most collectives, which alone is no straggler."""
    from diag.analyzers.base import run_all

    for name, expect in (("healthy", set()), ("straggler", None)):
        trace = load_inputs([str(SAMPLES / name)])
        findings, _ = run_all(trace)
        rows = model.build(trace, findings, {})["metrics"]["stragglers"]
        flagged = {r["rank"] for r in rows if r["straggler"]}
        ruled = {r for f in findings if f.rule == "straggler" for r in f.ranks}
        assert flagged == (ruled if expect is None else expect)
        assert max(r["last_arrival_frac"] for r in rows) > 0.5  # one rank is "last" either way
        if name == "straggler":
            assert flagged


def test_units_binary_sizes_and_decimal_rates():
    from diag import units

    assert [units.binary_bytes(v) for v in (None, 512, 1536, 5 * 2**30, 3 * 2**40)] == [
        "-", "512 B", "1.5 KiB", "5.0 GiB", "3.0 TiB"]
    assert [units.decimal_rate(v) for v in (None, 999, 1500, 25e9)] == [
        "-", "999 B/s", "1.5 KB/s", "25.0 GB/s"]
