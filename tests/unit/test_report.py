"""Renderers: the JSON document, self-contained HTML with four SVG plots, Markdown, terminal, and
`diag export --perfetto` of a trace the agent wrote."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

import diag
from diag import agent, schema
from diag.cli import main
from diag.findings import Finding, Fix
from diag.importers import load_inputs
from diag.report import html, json_report, markdown, model, terminal, trace_doc
from tests.unit.kineto_samples import GPT_DS
from tests.unit.synth_trace import MS

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"

FINDING = Finding(
    rule="exposed_comm",
    severity="warning",
    title="comm <exposed> & slow",
    detail="d",
    ranks=[1],
    recoverable_s=0.004,
    fixes=[
        Fix("overlap it", ds_config={"zero_optimization": {"overlap_comm": True}}, env={"NCCL_ALGO": "Ring"})
    ],
)


def _doc():
    trace = load_inputs([GPT_DS])
    return model.build(trace, [FINDING], {"broken_rule": "KeyError: 'x'"})


def test_json_document_is_plain_and_versioned():
    doc = json.loads(json_report.render(_doc()))
    assert (doc["schema"], doc["version"]) == (model.SCHEMA, model.VERSION)
    assert set(doc["metrics"]) == {
        "breakdown",
        "overlap",
        "collectives",
        "bandwidth_by_size",
        "stragglers",
        "step_times",
        "loss_scale",
        "step_split",
        "steps_joined",
    }
    assert doc["findings"][0]["fixes"][0]["env"] == {"NCCL_ALGO": "Ring"}
    assert all(r["source"] == "cpu" for r in doc["metrics"]["breakdown"])


def test_html_is_self_contained_with_plots():
    page = html.render(_doc())
    assert page.count("<svg") == 7 and "<script" not in page and "src=" not in page
    assert "comm &lt;exposed&gt; &amp; slow" in page  # escaped
    assert "Loss scale over steps" in page and "polyline" in page
    assert "rule broken_rule failed" in page
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):  # each plot is well-formed XML
        assert ElementTree.fromstring(svg).tag.endswith("svg")


def test_markdown_and_terminal_show_findings_and_fixes():
    doc = _doc()
    md = markdown.render(doc)
    assert "### [warning] comm <exposed> & slow (`exposed_comm`)" in md
    assert "| rank | source | span ms |" in md
    block = re.search(r"```json\n(.*?)```", md, flags=re.S)
    assert block is not None and json.loads(block.group(1)) == {"zero_optimization": {"overlap_comm": True}}
    assert re.search(r"```sh\n\s*NCCL_ALGO=Ring\n\s*```", md)  # pasteable, not a Python repr after a |
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
    ag.emit(
        (
            schema.COMM,
            0,
            "all_reduce",
            4 << 20,
            "float32",
            "dp",
            2,
            [0, 1],
            t0 + 2_000_000,
            1_000_000,
            "model.embed",
            False,
        )
    )
    agent.stop()
    out = tmp_path / "timeline.json"
    assert main(["export", "--perfetto", str(out), str(tmp_path / "t")]) == 0
    doc = json.loads(out.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["tid"], e["name"]) for e in spans) == [
        (1, "step 0"),
        (2, "model.layers.0.mlp forward"),
        (10, "all_reduce"),  # the track of its process group, "collectives [dp]"
    ]
    comm = next(e for e in spans if e["tid"] == 10)
    assert comm["dur"] == 1000.0 and comm["args"]["bytes"] == 4 << 20
    step = next(e for e in spans if e["tid"] == 1)
    assert comm["ts"] - step["ts"] == 2000.0 and step["ts"] == 0.0  # microseconds from the first event
    assert diag.load(str(tmp_path / "t")).ranks == [
        r["pid"] for r in doc["traceEvents"] if r.get("name") == "process_sort_index"
    ]
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
        "-",
        "512 B",
        "1.5 KiB",
        "5.0 GiB",
        "3.0 TiB",
    ]
    assert [units.decimal_rate(v) for v in (None, 999, 1500, 25e9)] == [
        "-",
        "999 B/s",
        "1.5 KB/s",
        "25.0 GB/s",
    ]


def test_diag_trace_report_has_every_signal_in_human_units(tmp_path, capsys):
    """A diag trace (no Kineto timeline): step split, top layers, steps, memory and overflow tables,
    the breakdown plot drawn (not "no data"), no raw floats, fixes as JSON, the merged ds_config."""
    src = str(SAMPLES / "fp16_overflow")
    md_path, html_path = tmp_path / "r.md", tmp_path / "r.html"
    assert main(["analyze", src, "--markdown", str(md_path), "--html", str(html_path), "-q"]) == 0
    md, page = md_path.read_text(), html_path.read_text()
    for title in (
        "## Throughput and MFU",
        "## Step time per rank: compute / exposed communication / other",
        "## Top layers by time",
        "## Steps",
        "## Memory per rank",
        "## fp16 overflows",
    ):
        assert title in md
    assert "| 4 | " in md and "skipped" in md and "256 -> 128" in md  # the first overflow, as recorded
    assert not re.search(r"\d\.\d{6,}|\de-\d", md)  # no 17-digit floats, no exponents
    assert "0.000" not in md and "MB/s" in md.split("## Collectives")[1]  # bandwidth in a unit that reads
    breakdown = re.search(r'<svg[^>]*aria-label="Time breakdown per rank".*?</svg>', page, flags=re.S)
    assert breakdown and "no data" not in breakdown.group(0) and "exposed comm" in breakdown.group(0)
    step_plot = re.search(r'<svg[^>]*aria-label="Step time".*?</svg>', page, flags=re.S).group(0)
    assert step_plot.count('stroke-dasharray="3,3"') == 5  # the five overflow steps marked


def test_fix_blocks_evidence_units_and_merged_ds_config(tmp_path, capsys):
    from diag.report import human

    assert human.evidence_value("busbw_gbs", 2.61e-05) == "26.1 KB/s"
    assert human.evidence_value("compute_s", {0: 0.012340539500000004}) == "{0: 12.3 ms}"
    assert human.evidence_value("peak_bytes", 3 << 30) == "3.0 GiB"
    assert human.evidence_value("step_share", 0.5512) == "55.1%"
    assert (
        human.prose("gathers run at 2.61e-05 GB/s against a nominal 1.25 GB/s link")
        == "gathers run at 26.1 KB/s against a nominal 1.25 GB/s link"
    )
    blocks = human.fix_blocks(
        {"ds_config": {"a": {"b": True}}, "megatron_args": ["--recompute-granularity", "selective"]}
    )
    assert json.loads(blocks[0][1]) == {"a": {"b": True}}
    assert blocks[1][1] == "--recompute-granularity selective"  # one pasteable line
    out = tmp_path / "ds.json"
    assert main(["analyze", str(SAMPLES / "zero3_slow_link"), "-q", "--ds-config-out", str(out)]) == 0
    cfg = json.loads(out.read_text())
    zo = cfg["zero_optimization"]
    assert zo["stage"] == 3 and zo["zero_quantized_weights"] is True  # its first fix only
    assert cfg["train_micro_batch_size_per_gpu"] == 4  # the job's own settings kept
    assert "alternatives not merged" in capsys.readouterr().err
    md = tmp_path / "z3.md"
    assert main(["analyze", str(SAMPLES / "zero3_slow_link"), "-q", "--markdown", str(md)]) == 0
    assert "2.19 MB/s" in md.read_text() and not re.search(r"\de-\d", md.read_text())


def test_perfetto_counters_overflow_markers_and_group_tracks(tmp_path):
    """fp16_overflow: RSS and loss-scale counters, one instant marker per rank and overflowed step,
    collectives on their process group's track; no device-memory counter where the trace has no
    device allocator figures (a CPU run: never drawn as 0)."""
    src = str(SAMPLES / "fp16_overflow")
    tr = diag.load(src)
    out = tmp_path / "t.json"
    assert main(["export", "--perfetto", str(out), src]) == 0
    ev = json.loads(out.read_text())["traceEvents"]
    over = tr.overflow[tr.overflow["overflow"].astype(bool)]
    marks = [e for e in ev if e["ph"] == "i"]
    assert sorted((e["pid"], e["args"]["step"]) for e in marks) == sorted(zip(over["rank"], over["step"]))
    assert all(e["tid"] == 1 and "scale" in e["name"] for e in marks)
    scale = [e for e in ev if e["ph"] == "C" and e["name"] == "loss scale"]
    assert (
        len(scale) == tr.overflow["scale_after"].notna().sum() and min(e["args"]["scale"] for e in scale) == 8
    )
    rss = [e["args"]["rss"] for e in ev if e["ph"] == "C" and e["name"] == "host RSS"]
    assert sorted(rss) == sorted(tr.memory["rss"].dropna())
    assert not [e for e in ev if e["ph"] == "C" and e["name"] == "device memory"]
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    comm_tids = {e["tid"] for e in ev if e.get("cat") == "comm"}
    assert len(comm_tids) == tr.comms["group"].nunique() and any(n.startswith("collectives [") for n in names)


def test_perfetto_refuses_a_kineto_trace_in_one_line(capsys, tmp_path):
    for src in (SAMPLES / "kineto_gloo_dp", SAMPLES / "kineto_gloo_dp" / "rank0.json.gz"):
        assert main(["export", "--perfetto", str(tmp_path / "o.json"), str(src)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Kineto" in err and "ui.perfetto.dev" in err, err


def test_html_step_timeline_per_rank_marks_overflows(tmp_path):
    """The per-rank step timeline: one rectangle per rank and step at its time (starts and lengths
    from diag.load), overflowed steps in red, lanes named by rank."""
    from diag.report.figures import OVERFLOW_COLOR

    src = str(SAMPLES / "fp16_overflow")
    page_path = tmp_path / "r.html"
    assert main(["analyze", src, "--html", str(page_path), "-q"]) == 0
    svg = re.search(
        r'<svg[^>]*aria-label="Steps of each rank over time".*?</svg>', page_path.read_text(), flags=re.S
    ).group(0)
    root = ElementTree.fromstring(svg)
    rects = [
        (r.get("fill"), r.find("{http://www.w3.org/2000/svg}title").text)
        for r in root.iter("{http://www.w3.org/2000/svg}rect")
        if r.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    st = diag.load(src).steps.dropna(subset=["dur"])
    assert len(rects) == len(st)
    over = diag.load(src).overflow
    hit = {(int(r), int(s)) for r, s in over[over["overflow"].astype(bool)][["rank", "step"]].values}
    for fill, tip in rects:
        rank, step = map(int, re.match(r"rank (\d+) step (\d+)", tip).groups())
        assert (fill == OVERFLOW_COLOR) == ((rank, step) in hit), tip
    assert "rank 0</text>" in svg and "rank 1</text>" in svg and "overflow step" in svg


def test_plot_legends_wrap_above_the_data_and_x_ticks_are_whole_steps():
    """Many series: the legend takes more rows and the plotting area starts below the last one;
    every legend entry stays inside the frame."""
    from diag.report import plots

    series = {
        f"rank {r} {k}": [(0, 1.0), (3, 2.0)] for r in range(2) for k in ("allocated", "reserved", "rss")
    }
    svg = plots.lines(series, "Memory", "step", "MiB", integer_x=True, marks=[1], mark_label="overflow")
    root = ElementTree.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    texts = {t.text: t for t in root.iter(f"{ns}text")}
    for name in series:
        x = float(texts[name].get("x"))
        assert x + 6.2 * len(name) <= plots.W, name  # inside the frame
    legend_bottom = max(float(texts[n].get("y")) for n in series)
    axis_top = min(float(line.get("y1")) for line in root.iter(f"{ns}line"))
    assert legend_bottom < axis_top  # the legend never over the data
    ticks = [t.text for t in root.iter(f"{ns}text") if t.get("y") == str(plots.H - plots.B + 14)]
    assert ticks == ["0", "1", "2", "3"]


def test_timeline_ticks_are_round_numbers():
    from diag.report import plots

    assert plots._nice_ticks(0, 0.388) == [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]
    assert plots._nice_ticks(0, 64.3) == [0, 10, 20, 30, 40, 50, 60]
    assert plots._nice_ticks(3, 3) == [3]


def test_top_layers_take_each_module_from_its_own_lowest_rank():
    """Pipeline parallel: stage 0 (ranks 0, 1) runs the embedding and layer 0, stage 1 (ranks 2, 3)
    layer 1 and the logits. The table read the lowest rank only: stage 1's layers, most of the
    FLOPs of Megatron-DeepSpeed's PP=2 run, were not in it."""
    import pandas as pd

    from diag.metrics.layer_stats import top_layers

    rows = []
    for rank, modules in (
        (0, ("embed", "layers.0")),
        (1, ("embed", "layers.0")),
        (2, ("layers.1", "logits")),
        (3, ("layers.1", "logits")),
    ):
        for step in (50, 100):
            for i, name in enumerate(modules):
                for phase, ms in (("fwd", 2 + i + rank % 2), ("bwd", 4 + 2 * i)):
                    rows.append(
                        {
                            "rank": rank,
                            "step": step,
                            "module": name,
                            "phase": phase,
                            "ts": 0,
                            "dur": ms * 1e6,
                            "flops": 1e6 * (1 + i),
                            "mem_delta": None,
                        }
                    )
            for phase in ("fwd", "bwd"):  # each stage's root, named by its class: not a leaf
                rows.append(
                    {
                        "rank": rank,
                        "step": step,
                        "module": "GPTModelPipe",
                        "phase": phase,
                        "ts": 0,
                        "dur": 20e6,
                        "flops": 9e6,
                        "mem_delta": None,
                    }
                )
    top = top_layers(pd.DataFrame(rows), None).set_index("module")
    assert set(top.index) == {"embed", "layers.0", "layers.1", "logits"}
    assert top.loc["logits", "fwd_ms"] == 3.0 and top.loc["layers.1", "fwd_ms"] == 2.0  # rank 2's
    assert (top["steps"] == 2).all() and top.loc["logits", "flops"] == 4e6  # fwd + bwd per step


def test_top_layers_name_megatron_core_pipeline_stages_model_wide(tmp_path):
    """megatron-core numbers each pipeline stage's layers from 0 and the agent records the model-wide
    index (`layer_numbers`): Megatron-LM's run_simple_mcore_train_loop.py at PP=2 showed stage 0's
    `decoder.layers.0` only, stage 1's layer (also `decoder.layers.0` locally) dropped as its shard."""
    from diag.report import trace_doc
    from tests.unit.synth_trace import T0, Job

    job = Job(ranks=2, steps=1)
    job.add(1, schema.META, ts=T0, key=schema.META_LAYER_NUMBERS, value={"decoder.layers.0": 1})
    for rank, ms in ((0, 3), (1, 5)):
        modules = (
            ("decoder.layers.0.mlp", 10**6),
            (("embed", "logits")[rank], 2 * 10**6),
            ("GPTModel", 9 * 10**6),
        )
        for name, flops in modules:  # the root, named by its class, is not a leaf
            job.add(rank, schema.LAYER, step=0, module=name, phase="fwd", ts=T0, dur=ms * MS, flops=flops)
    rows = {r["module"]: r for r in trace_doc.layers(job.write(str(tmp_path)), None)}
    assert set(rows) == {"embed", "logits", "decoder.layers.0.mlp", "decoder.layers.1.mlp"}
    assert rows["decoder.layers.1.mlp"]["fwd_ms"] == 5.0 and rows["decoder.layers.0.mlp"]["fwd_ms"] == 3.0


def test_terminal_tables_fold_module_names_and_keep_op_whole_at_80_columns():
    """At 80 columns a megatron-core leaf read `module.decoder.layers.1…` (every leaf of the layer
    alike) and `all_reduce` read `all_red…` beside its group: names are folded or kept whole."""
    name = "module.decoder.layers.1.self_attention.linear_proj"
    layers = terminal.plain_table(
        "t", ["module", "fwd ms", "bwd ms", "FLOPs", "FLOP/s", "MFU"], [[name] + ["1.0"] * 5]
    )
    comms = terminal.plain_table(
        "t",
        ["rank", "op [group]", "calls", "time ms", "mean size", "algbw", "busbw"],
        [["0", "all_reduce [dp_cp:1]", "12", "88.00", "27.2 KiB", "3.8 MB/s", "3.8 MB/s"]],
    )
    firsts, seconds = [], []
    for table, into, col in ((layers, firsts, 1), (comms, seconds, 2)):
        out = io.StringIO()
        Console(file=out, width=80).print(table)
        into.extend(line.split("│")[col].strip() for line in out.getvalue().splitlines() if "│" in line)
    assert "".join(firsts) == name and "all_reduce" in seconds, (firsts, seconds)


def test_terminal_tables_left_justify_names_and_right_justify_numbers():
    """A short op under a long one reads from the column's start (`send` beside `all_reduce`), the
    numbers beside it from its end, so digits line up."""
    table = terminal.plain_table(
        "t", ["rank", "op", "calls"], [["0", "all_reduce", "1200"], ["0", "send", "3"]]
    )
    out = io.StringIO()
    Console(file=out, width=80).print(table)
    rows = [line.split("│") for line in out.getvalue().splitlines() if "send" in line or "1200" in line]
    (send,) = (r for r in rows if "send" in r[2])
    assert send[2].startswith(" send ") and send[3].endswith("    3 "), rows


def _timeline_copied(trace):
    """`trace_doc.step_timeline`'s rows as they were chosen before it made its masks first."""
    st = trace.steps.dropna(subset=["ts", "dur", "step"])
    st = st[st["rank"].isin(sorted(st["rank"].unique())[: trace_doc.TIMELINE_RANKS])]
    return st[st["step"].isin(sorted(st["step"].unique())[-trace_doc.TIMELINE_STEPS :])]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),  # rank
            st.one_of(st.none(), st.integers(0, 6)),  # step
            st.one_of(st.none(), st.integers(0, 10**6)),  # dur
        ),
        max_size=40,
    )
)
def test_step_timeline_keeps_the_rows_it_kept(rows):
    """The lowest ranks and the last steps of those with a time, a duration and a step (2 and 3
    kept here, so that the cut is made)."""
    from diag.trace.model import Trace

    steps = pd.DataFrame(rows, columns=["rank", "step", "dur"])
    steps["ts"] = range(len(steps))
    trace = Trace(frames={"step": steps})
    kept = (trace_doc.TIMELINE_RANKS, trace_doc.TIMELINE_STEPS)
    trace_doc.TIMELINE_RANKS, trace_doc.TIMELINE_STEPS = 2, 3
    try:
        want = _timeline_copied(trace)
        got = trace_doc.step_timeline(trace)
    finally:
        trace_doc.TIMELINE_RANKS, trace_doc.TIMELINE_STEPS = kept
    want = want.sort_values(["rank", "step"])  # (the timeline's own order)
    assert [(r["rank"], r["step"]) for r in got] == list(zip(want["rank"], want["step"].astype(int)))
