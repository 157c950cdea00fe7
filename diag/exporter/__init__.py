"""`diag export --prometheus`: a per-node Prometheus exporter over the local ranks' trace files.

It follows the trace directory as `diag top` does (diag.tui.tail, diag.tui.model: the same records,
the same aggregates) and serves them through prometheus-client; nothing runs in the training job.
families.py names the metrics (docs/prometheus.md lists them); server.py polls, analyzes and serves.
"""
