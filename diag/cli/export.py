"""Export a diag trace: a Perfetto timeline (--perfetto), or live metrics for Prometheus (--prometheus).

--perfetto OUT.json writes a Perfetto / Chrome JSON timeline; --prometheus [ADDR]:PORT serves live
Prometheus metrics of the local ranks.

--perfetto: each rank is a process with tracks for steps (overflowed steps marked), layers and the
collectives of each process group, plus device memory, host RSS and loss-scale counters. Files that
cannot be read (one line each on stderr, exit code 2) are left out; a Kineto trace is refused with
one line (it is already a Perfetto trace).

--prometheus: a per-node exporter. It follows TRACE_DIR's files as they grow (the job's ranks on this
node write them; nothing is added to the training process) and serves step time, throughput, FLOP/s,
collectives by group and op, exposed communication, overflows, loss scale, memory, GPU health (the
NVML sidecar's records; --gpu starts it) and the count of live findings at http://ADDR:PORT/metrics.
":PORT" listens on every interface (Prometheus scrapes from elsewhere); see docs/prometheus.md.
"""

from __future__ import annotations

import argparse
import json
import os

from diag.errors import USAGE, DiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR", help="a diag trace directory")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", metavar="OUT.json", help="write a Chrome/Perfetto trace-event JSON file")
    what.add_argument(
        "--prometheus",
        metavar="[ADDR]:PORT",
        help="serve live metrics of the trace directory for Prometheus to scrape",
    )
    parser.add_argument(
        "--capture",
        type=int,
        metavar="K",
        help="with --perfetto: which capture of a directory two attaches wrote into (0 the first, K its "
        "rank-N.K.jsonl files); --prometheus follows the newest",
    )
    prom = parser.add_argument_group("--prometheus options")
    prom.add_argument("--job", help="the job label (default: the trace directory's name)")
    prom.add_argument("--interval", type=float, default=2.0, help="seconds between reads of the files")
    prom.add_argument(
        "--analyze-every",
        type=float,
        default=60.0,
        metavar="S",
        help="run diag's rules on what was read every S seconds (0: never; default 60)",
    )
    prom.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="stop after S seconds (default: until interrupted)",
    )
    prom.add_argument("--gpu", action="store_true", help="also run this host's NVML sidecar")


def run(args: argparse.Namespace) -> int:
    if args.prometheus is not None:
        if args.capture is not None:  # (served silently from the newest, it read as obeyed)
            raise DiagError("--capture is --perfetto's: --prometheus follows the newest capture", USAGE)
        return serve(args)
    return perfetto(args)


def parse_listen(text: str) -> tuple[str, int]:
    """ "[ADDR]:PORT" -> (ADDR, PORT); an empty ADDR is every interface."""
    addr, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise DiagError(f"--prometheus {text!r}: expected [ADDR]:PORT, e.g. :9400 or 127.0.0.1:9400", USAGE)
    return addr.strip("[]") or "0.0.0.0", int(port)


def serve(args: argparse.Namespace) -> int:
    import time

    try:
        from prometheus_client import start_http_server

        from diag.exporter.server import Exporter, registry_for
    except ImportError as e:
        raise DiagError(
            f"--prometheus needs prometheus-client: pip install 'diag[prometheus]' ({e.name} missing)"
        ) from None
    addr, port = parse_listen(args.prometheus)
    if args.interval <= 0:
        raise DiagError("--interval must be > 0", USAGE)
    job = args.job or os.path.basename(os.path.abspath(args.trace_dir))
    exporter = Exporter(args.trace_dir, job, interval=args.interval, analyze_every=args.analyze_every)
    try:
        server, _thread = start_http_server(port, addr, registry=registry_for(exporter))
    except OSError as e:
        raise DiagError(f"cannot listen on {addr}:{port} ({e.strerror or e})") from None
    sidecar = _sidecar(args.trace_dir) if args.gpu else None
    exporter.start()
    print(
        f"serving metrics of {args.trace_dir} (job {job!r}) at http://{addr}:{server.server_port}/metrics",
        flush=True,
    )
    try:
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic())))
    finally:
        exporter.stop()
        server.shutdown()
        if sidecar is not None:
            sidecar.stop()
    return 0


def _sidecar(trace_dir: str) -> object | None:
    import sys

    from diag.nvml.sidecar import Sidecar

    sidecar = Sidecar(trace_dir)
    if sidecar.start():
        return sidecar
    print(f"diag export: no GPU health ({sidecar.error})", file=sys.stderr)
    return None


def _refuse_kineto(path: str) -> None:
    """A PyTorch profiler (Kineto) trace is already a Chrome trace: one line that says so, instead
    of a complaint per line that it is not a diag trace."""
    from diag.importers.detect import KINETO, ImportProblem, expand, kind_of_file

    try:
        found = expand(path)
    except ImportProblem:
        return  # diag.load says what is wrong with the path
    kinds = []
    for file, kind in found:
        try:
            kinds.append(kind or kind_of_file(file))
        except ImportProblem:
            kinds.append(None)
    if kinds and KINETO in kinds and all(k in (KINETO, None) for k in kinds):
        raise DiagError(
            f"{path}: a PyTorch profiler (Kineto) trace, already in Chrome trace format: open it as it is "
            "at ui.perfetto.dev (export --perfetto converts diag traces; diag analyze reads Kineto traces)"
        )


def perfetto(args: argparse.Namespace) -> int:
    import sys

    import diag
    from diag.report.perfetto import timeline
    from diag.trace.reader import ManyCaptures, Unreadable

    _refuse_kineto(args.trace_dir)
    try:
        trace = diag.load(args.trace_dir, capture=args.capture)
    except ManyCaptures as e:
        raise ManyCaptures(e.path, e.held, "--capture K") from None
    except Unreadable as e:  # nothing readable: one line per bad file
        for p in e.per_file():
            print(f"diag export: error: {p}", file=sys.stderr)
        return e.exit_code
    doc = timeline(trace)
    try:
        with open(args.perfetto, "w", encoding="utf-8") as f:
            json.dump(doc, f, default=str)
    except OSError as e:
        raise DiagError(f"{args.perfetto}: cannot write ({e.strerror or e})") from None
    n = sum(1 for e in doc["traceEvents"] if e["ph"] != "M")
    print(f"wrote {n} events of {len(trace.ranks)} rank(s) to {args.perfetto}")
    for p in trace.problems:  # what could not be read is still exported; say so, exit 2 as analyze
        print(f"diag export: error: {p}", file=sys.stderr)
    return 2 if trace.problems else 0
