"""`diag export --prometheus`: the exposition of a real trace agrees with `diag.load` of the same
files (steps, collectives, overflows, memory, findings), GPU health comes from the sidecar's records
(NVML faked at the hardware seam), and bad input is one line. The real-server test (a Prometheus
scraping a training job) is tests/integration/test_prometheus.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is the prometheus extra; not installed")

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import diag
from diag.exporter.server import Exporter, registry_for, run_analyzers
from tests.unit import fake_nvml
from tests.unit.synth_trace import Job, write_capture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP16 = os.path.join(ROOT, "sample_traces", "fp16_overflow")


def scrape(exporter: Exporter) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted labels: value}} of one scrape, through the text format Prometheus reads."""
    text = generate_latest(registry_for(exporter)).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def read_all(exporter: Exporter) -> None:
    for _ in range(100):  # a file is read at most 8 MiB a poll
        if exporter.poll_once() == 0:
            return
    raise AssertionError("the trace kept growing")


def by(metric: dict, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(dict(labels)[k] for k in keys): v for labels, v in metric.items()}


@pytest.fixture(scope="module")
def fp16() -> tuple[diag.Trace, dict]:
    ex = Exporter(FP16, "j", analyze=None)
    read_all(ex)
    return diag.load(FP16), scrape(ex)


def test_steps_and_step_time_match_the_trace(fp16) -> None:
    trace, m = fp16
    steps = trace.steps.dropna(subset=["dur"])
    for rank, rows in steps.groupby("rank"):
        assert by(m["diag_steps_total"], "rank")[(str(rank),)] == len(rows)
        seconds = by(m["diag_step_seconds_total"], "rank")[(str(rank),)]
        assert seconds == pytest.approx(rows["dur"].sum() / 1e9)
        last = rows.sort_values("ts").iloc[-1]
        assert by(m["diag_step_duration_seconds"], "rank")[(str(rank),)] == pytest.approx(last["dur"] / 1e9)
        assert by(m["diag_samples_total"], "rank")[(str(rank),)] == rows["samples"].sum()
    assert set(by(m["diag_steps_total"], "job", "host")) == {("j", h) for h in trace.hosts().values()}
    assert "diag_tokens_total" not in m  # the job reported no tokens: absent, not 0


def test_collectives_by_group_and_op_match_the_trace(fp16) -> None:
    trace, m = fp16
    c = trace.comms
    c = c.assign(group=c["group"].astype(str), op=c["op"].astype(str))
    want = c.groupby(["rank", "group", "op"], observed=True).agg(
        n=("dur", "size"), dur=("dur", "sum"), nbytes=("bytes", "sum")
    )
    got_n = by(m["diag_collectives_total"], "rank", "group", "op")
    assert len(got_n) == len(want) > 0
    for (rank, group, op), row in want.iterrows():
        key = (str(rank), group, op)
        assert got_n[key] == row["n"]
        seconds = by(m["diag_collective_seconds_total"], "rank", "group", "op")[key]
        assert seconds == pytest.approx(row["dur"] / 1e9)
        assert by(m["diag_collective_bytes_total"], "rank", "group", "op")[key] == row["nbytes"]
    ar = [v for k, v in by(m["diag_collective_busbw_bytes_per_second"], "op").items() if k == ("all_reduce",)]
    assert ar and all(v > 0 for v in ar)


def test_overflows_loss_scale_memory_and_exposed_share(fp16) -> None:
    trace, m = fp16
    ov = trace.frame("overflow")
    for rank, rows in ov.groupby("rank"):
        assert by(m["diag_overflows_total"], "rank")[(str(rank),)] == int(rows["overflow"].astype(bool).sum())
    first = ov[ov["rank"] == ov["rank"].min()].sort_values("ts")
    assert m["diag_loss_scale"][(("job", "j"),)] == first["scale_after"].iloc[-1]
    assert m["diag_skipped_steps_total"][(("job", "j"),)] == ov["skipped_steps"].max() > 0
    mem = trace.frame("memory")
    for rank, rows in mem.groupby("rank"):
        peak = rows["peak"].fillna(rows["rss"]).max()
        assert by(m["diag_memory_peak_bytes"], "rank")[(str(rank),)] == peak
    shares = by(m["diag_exposed_comm_ratio"], "rank")
    assert len(shares) == len(trace.ranks) and all(0 < v <= 1 for v in shares.values())


def test_live_findings_are_the_rules_findings(fp16) -> None:
    trace, _ = fp16
    ex = Exporter(FP16, "j", analyze_every=1.0)
    read_all(ex)
    ex.maybe_analyze()
    m = scrape(ex)
    found, _ = run_analyzers(trace)
    want = {(f.rule, f.severity) for f in found}
    assert want and set(by(m["diag_findings"], "rule", "severity")) == want
    assert m["diag_live_findings"][(("job", "j"),)] == len(found)


def test_a_later_capture_is_exported_alone_and_said(tmp_path, capsys) -> None:
    """A second attach into the directory writes `rank-N.1.jsonl`: the exporter switches to it (its
    counters the newest capture's, not both added up) and says so on stderr, once a switch."""
    path = write_capture(str(tmp_path / "t"), 0)
    ex = Exporter(path, "j", analyze=None)
    read_all(ex)
    assert capsys.readouterr().err == ""
    write_capture(path, 1, steps=3)
    read_all(ex)
    assert by(scrape(ex)["diag_steps_total"], "rank") == {("0",): 3, ("1",): 3}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "holds several captures: following capture 1" in err[0], err


def test_gpu_health_from_the_sidecar_records(tmp_path) -> None:
    from diag.nvml.sidecar import Sidecar

    Job(steps=3).write(str(tmp_path))
    car = Sidecar(str(tmp_path), interval=3600, module=fake_nvml.make(xids=[(1, 79)]), host="hostA")
    assert car.start()
    sample_after_the_thread(car)
    car.stop()
    ex = Exporter(str(tmp_path), "j", analyze=None)
    read_all(ex)
    m = scrape(ex)
    gpu = diag.load(str(tmp_path)).gpu.sort_values("ts")
    assert len(gpu) >= 4  # two samples of each of the two GPUs
    for index, rows in gpu.groupby("index"):
        rec, key = rows.iloc[-1], ("hostA", str(index))
        assert by(m["diag_gpu_utilization_ratio"], "host", "gpu")[key] == pytest.approx(rec["util"] / 100)
        assert by(m["diag_gpu_memory_used_bytes"], "host", "gpu")[key] == rec["mem_used"]
        assert by(m["diag_gpu_power_watts"], "host", "gpu")[key] == pytest.approx(rec["power_w"])
        xids = sum(len(x) for x in rows["xid"])
        assert by(m["diag_gpu_xid_errors_total"], "host", "gpu")[key] == xids
    assert by(m["diag_gpu_xid_errors_total"], "host", "gpu")[("hostA", "1")] == 1  # the pending Xid 79


def sample_after_the_thread(car) -> None:
    """One more sample once the sidecar's thread wrote its first (samples are not serialized)."""
    import time

    deadline = time.monotonic() + 30
    while car.samples < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert car.samples >= 1, "the sidecar's thread never sampled"
    car.sample_once()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "diag", "export", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize("listen", ["9400", "host:port", ":99999"])
def test_a_bad_listen_address_is_one_line(listen) -> None:
    p = _cli("--prometheus", listen, FP16)
    assert p.returncode == 2 and "expected [ADDR]:PORT" in p.stderr and len(p.stderr.splitlines()) == 1


def test_a_port_in_use_is_one_line_and_a_missing_directory_too(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = _cli("--prometheus", f"127.0.0.1:{s.getsockname()[1]}", "--duration", "1", FP16)
    assert p.returncode != 0 and "cannot listen on 127.0.0.1" in p.stderr, p.stderr
    assert len(p.stderr.splitlines()) == 1
    p = _cli("--prometheus", "127.0.0.1:0", "--duration", "1", str(tmp_path / "nope"))
    assert p.returncode == 2 and "no such trace directory" in p.stderr and len(p.stderr.splitlines()) == 1


DASHBOARD = os.path.join(ROOT, "docs", "grafana", "diag-dashboard.json")


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the shipped Grafana dashboard."""
    import json

    with open(DASHBOARD) as f:
        doc = json.load(f)
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", ())]


def test_the_dashboard_uses_only_exported_metrics(tmp_path) -> None:
    import re

    from diag.nvml.sidecar import Sidecar
    from tests.tui.synth import SynthJob

    job = SynthJob(str(tmp_path), 4, overflow_at=1)
    # 5 steps: the synthetic job idles between steps, a finding (diag_findings has samples) once
    # idle_between_steps has its 3 measured steady steps
    for step in range(5):
        job.write_step(step)
    job.close()
    car = Sidecar(str(tmp_path), interval=3600, module=fake_nvml.make(), host="node0")
    assert car.start()
    sample_after_the_thread(car)  # NVLink rates need a previous sample
    car.stop()
    ex = Exporter(str(tmp_path), "j", analyze_every=1.0)
    read_all(ex)
    ex.maybe_analyze()
    exported = set(scrape(ex)) | {"diag_gpu_throttled"}  # a family with samples only while throttled
    used = {name for _, q in dashboard_queries() for name in re.findall(r"\bdiag_\w+", q)}
    assert len(used) >= 25 and used <= exported, sorted(used - exported)


def test_exposed_share_is_absent_where_async_collectives_ran() -> None:
    """A DDP job (sample_traces/ddp_contention, a real 2-rank run) waits for its Reducer's async
    all-reduces inside C++: no blocking collective, so the blocking share read 0.0 while the
    all-reduce cost the step time; live, without compute intervals, the exposed part is unknown."""
    folder = os.path.join(ROOT, "sample_traces", "ddp_contention")
    trace = diag.load(folder)
    assert trace.comms["async_op"].astype(bool).any()
    ex = Exporter(folder, "j", analyze=None)
    read_all(ex)
    m = scrape(ex)
    assert len(by(m["diag_step_duration_seconds"], "rank")) == len(trace.ranks)
    assert by(m.get("diag_exposed_comm_ratio", {}), "rank") == {}


def test_samples_per_second_is_the_global_batch_over_the_step_time() -> None:
    """Every rank reports the job's global batch per step (DeepSpeed's global_samples delta): the
    job's rate is that over the job's step time, with no factor of dp (it read 2x on 2 ranks)."""
    folder = os.path.join(ROOT, "sample_traces", "zero3")
    st = diag.load(folder).steps.dropna(subset=["dur"])
    ex = Exporter(folder, "j", analyze=None)
    read_all(ex)
    m = scrape(ex)
    per_step = st.groupby("step").agg(samples=("samples", "max"), dur=("dur", "max")).tail(20)
    want = per_step["samples"].astype(float).sum() / (per_step["dur"].sum() / 1e9)
    assert m["diag_samples_per_second"][(("job", "j"),)] == pytest.approx(want)
