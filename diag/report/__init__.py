"""Renderers of an analysis: terminal (rich), JSON, Markdown, HTML with plots, Perfetto timelines.

`model.build(trace, findings, failures)` computes the figures once into a plain, JSON-able dict (the
documented `--json` schema); every renderer formats that dict and never computes findings.
"""
