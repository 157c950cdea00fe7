"""A real Prometheus server (Debian's `prometheus`, started here on 127.0.0.1 with a generated
config and a temporary storage folder) scrapes `diag export --prometheus` while a real 2-rank
DeepSpeed job trains with the diag agent (fp16, two forced overflows); the assertions read the
server's HTTP query API, and the final counters must equal what `diag.load` reads from the files.
Every wait is bounded; the job, the exporter and the server are stopped whatever happens."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

import diag
from tests.unit import fake_nvml
from tests.unit.test_exporter import dashboard_queries
from tests.workloads import launch

pytest.importorskip("prometheus_client", reason="prometheus-client is the prometheus extra; not installed")
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="Debian's prometheus binary is absent (apt-get install -y prometheus; .ci/run installs it)",
    ),
]
JOB = "ds-fp16"
STEPS = 50


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def values(port: int, expr: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(k, "") for k in keys): float(s["value"][1]) for s in query(port, expr)}


def wait_until(what: str, ok: Callable[[], bool], timeout: float, *procs: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args[:4]} exited {p.returncode} while waiting for {what}"
        try:
            if ok():
                return
        except OSError:  # the server is not listening yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def start_prometheus(tmp, target: str, port: int) -> subprocess.Popen:
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: diag\n"
        "    honor_labels: true\n"  # keep the exporter's `job` label (the training job's name)
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    with open(tmp / "prometheus.log", "w") as log:  # the child keeps its own descriptor
        args = [
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        return subprocess.Popen([PROMETHEUS, *args], stdout=log, stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen | None, group: bool = False) -> None:
    if p is None or p.poll() is not None:
        return
    if group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL) if group else p.kill()
        p.wait(timeout=10)


def dashboard_check(port: int) -> list[str]:
    """Run every query of the shipped Grafana dashboard on the server (each must parse and run);
    returns the queries that returned no data."""
    empty = []
    for _title, expr in dashboard_queries():
        expr = (
            expr.replace("$__rate_interval", "10s")
            .replace("$peak_flops", "1e12")
            .replace('=~"$job"', f'=~"{JOB}"')
        )
        if not query(port, expr):
            empty.append(expr)
    return empty


def test_prometheus_scrapes_a_training_job(tmp_path) -> None:
    trace_dir = tmp_path / "trace"
    exp_port, prom_port = launch.free_port(), launch.free_port()
    job = exporter = server = sidecar = None
    t0 = time.monotonic()
    try:
        job = launch.popen(
            "tests.workloads.gpt_ds",
            [
                "--diag",
                "--trace-dir",
                str(trace_dir),
                "--dtype",
                "fp16",
                "--overflow-at",
                "5,9",
                "--steps",
                str(STEPS),
                "--step-sleep",
                "0.2",
            ],
        )
        wait_until("the trace directory", trace_dir.is_dir, 120, job)
        from diag.nvml.sidecar import Sidecar  # GPU health: NVML faked at the hardware seam

        sidecar = Sidecar(str(trace_dir), interval=0.5, module=fake_nvml.make(xids=[(1, 79)]), host="gpuhost")
        assert sidecar.start()
        with open(tmp_path / "exporter.log", "w") as log:
            exporter = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "diag",
                    "export",
                    "--prometheus",
                    f"127.0.0.1:{exp_port}",
                    str(trace_dir),
                    "--job",
                    JOB,
                    "--interval",
                    "0.5",
                    "--analyze-every",
                    "2",
                    "--duration",
                    "300",
                ],
                env=launch.job_env(),
                cwd=launch.ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = start_prometheus(tmp_path, f"127.0.0.1:{exp_port}", prom_port)
        up = 'up{job="diag"} == 1'  # the server's own series of the scrape job
        wait_until("the scrape target up", lambda: bool(query(prom_port, up)), 60, server, exporter)
        t_up = time.monotonic()

        # while the job trains: both ranks' steps advance in the server, as its queries see them
        def steps() -> dict[tuple[str, ...], float]:
            return values(prom_port, f'diag_last_step{{job="{JOB}"}}', "rank", "host")

        wait_until(
            "both ranks past step 12",
            lambda: len(steps()) == 2 and min(steps().values()) >= 12,
            180,
            job,
            server,
            exporter,
        )
        assert job.poll() is None, "the job ended before the server saw it train"
        mid = steps()
        wait_until("a later scrape", lambda: min(steps().values()) > min(mid.values()), 60, server, exporter)
        t_live = time.monotonic()

        q = f'{{job="{JOB}"}}'
        step_s = values(
            prom_port, f"rate(diag_step_seconds_total{q}[5s]) / rate(diag_steps_total{q}[5s])", "rank"
        )
        assert set(step_s) == {("0",), ("1",)} and all(0.2 <= v < 5 for v in step_s.values()), step_s
        busbw = values(
            prom_port,
            f'diag_collective_busbw_bytes_per_second{{job="{JOB}",op="all_reduce"}}',
            "rank",
            "group",
        )
        assert len(busbw) >= 2 and all(v > 0 for v in busbw.values()), busbw
        exposed = values(prom_port, f"diag_exposed_comm_ratio{q}", "rank")
        assert len(exposed) == 2 and all(0 <= v <= 1 for v in exposed.values())
        assert values(prom_port, f"diag_samples_per_second{q}")[()] > 0
        assert all(v > 0 for v in values(prom_port, f"diag_memory_peak_bytes{q}", "rank").values())
        assert values(prom_port, f"diag_loss_scale{q}")[()] < 256  # initial_scale_power 8, halved on overflow
        assert values(prom_port, f"diag_ranks{q}")[()] == 2
        util = values(prom_port, f"diag_gpu_utilization_ratio{q}", "host", "gpu")
        assert set(util) == {("gpuhost", "0"), ("gpuhost", "1")} and all(0 < v <= 1 for v in util.values())

        # after the job: the server's last counters are what the trace files hold
        job.wait(timeout=240)
        assert job.returncode == 0, job.stdout.read() if job.stdout else ""
        trace = diag.load(str(trace_dir))
        done = trace.steps.dropna(subset=["dur"]).groupby("rank").size()
        want = {(str(r),): float(n) for r, n in done.items()}
        wait_until(
            "the final step counts",
            lambda: values(prom_port, f"diag_steps_total{q}", "rank") == want,
            60,
            server,
            exporter,
        )
        comms = trace.comms.assign(op=trace.comms["op"].astype(str)).groupby("op", observed=True).size()
        got = values(prom_port, f"sum by (op) (diag_collectives_total{q})", "op")
        assert got == {(op,): float(n) for op, n in comms.items()}
        ov = trace.frame("overflow")
        n_over = int(ov["overflow"].astype(bool).sum())
        assert n_over >= 2 and values(prom_port, f"sum(diag_overflows_total{q})")[()] == n_over
        skipped = values(prom_port, f"diag_skipped_steps_total{q}")[()]
        assert skipped == ov["skipped_steps"].max() >= 2
        wait_until(
            "the rules' findings",
            lambda: bool(query(prom_port, f"diag_live_findings{q}")),
            60,
            server,
            exporter,
        )
        live = values(prom_port, f"diag_live_findings{q}")[()]
        assert live == sum(values(prom_port, f"diag_findings{q}", "rule", "severity").values())
        empty = dashboard_check(prom_port)
        # the job reports no tokens; findings by rule have no series while no rule fires (a healthy
        # run: 2 overflows in 50 steps are no storm)
        allowed = ("diag_tokens_total",) if live else ("diag_tokens_total", "diag_findings{")
        assert empty and all(any(a in e for a in allowed) for e in empty), empty
        assert any("diag_tokens_total" in e for e in empty), empty
        print(
            f"\nprometheus test: target up {t_up - t0:.1f}s after launch, live asserts at "
            f"{t_live - t0:.1f}s, mean step {max(step_s.values()):.3f}s, busbw {busbw}, exposed {exposed}, "
            f"overflows {n_over}, skipped {skipped}, findings {live}, total {time.monotonic() - t0:.1f}s"
        )
    finally:
        if sidecar is not None:
            sidecar.stop()
        stop(job, group=True)
        stop(exporter)
        stop(server)
