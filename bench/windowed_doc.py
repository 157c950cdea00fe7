"""A windowed report against the whole read's: the same but for what the windowed one says it did
not do (`windowed.not_run` rules, `windowed.partial` sections). Shared by the bench
(`bench.analyze --diag-trace ... --windowed`) and tests/unit/test_windowed_analyze.py."""

from __future__ import annotations

from typing import Any


def without_what_was_not_done(whole: dict[str, Any], windowed: dict[str, Any]) -> dict[str, Any]:
    """Both documents less what `windowed["windowed"]` names (popped from it, and returned)."""
    said = windowed.pop("windowed")
    skip = set(said["not_run"])
    for doc in (whole, windowed):
        for rule in skip:
            doc["rule_failures"].pop(rule, None)
        doc["findings"] = [f for f in doc["findings"] if f["rule"] not in skip]
        doc["summary"]["findings"] = len(doc["findings"])
        for name in said["partial"]:
            where = doc if name in doc else doc["metrics"]
            where[name] = None
        if "throughput" in said["partial"]:  # (the headline is the throughput section's)
            for k in ("tflops_median", "mfu", "tflops_source"):
                doc["summary"][k] = None
        if "straggler" in skip:  # (its verdict column)
            for row in doc["metrics"]["stragglers"]:
                row.pop("straggler")
    return said
