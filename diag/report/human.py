"""Human forms of what findings carry: evidence values in units read from their names, and fixes as
pasteable text (a ds_config patch as JSON, Megatron arguments and environment variables as one
shell line each), plus the job's ds_config with the suggested patches merged
(`diag analyze --ds-config-out`)."""

from __future__ import annotations

import copy
import json
import re
import shlex
from typing import Any

from diag.ranks import rank_label
from diag.units import binary_bytes, significant


def evidence_value(key: str, v: Any) -> str:
    """One evidence value for reading: seconds as ms/s, bytes in KiB/MiB, GB/s as a rate, shares as
    percentages, other floats to 4 significant digits; dicts and lists element by element (the JSON
    report keeps the exact numbers)."""
    more = ", ..." if isinstance(v, (dict, list, tuple)) and len(v) > 8 else ""
    if isinstance(v, dict):
        return (
            "{"
            + ", ".join(f"{_key(k)}: {evidence_value(key, x)}" for k, x in list(v.items())[:8])
            + more
            + "}"
        )
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(evidence_value(key, x) for x in list(v)[:8]) + more + "]"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    k = key.lower()
    if k.endswith("_s") or k.endswith("_s_before_end"):
        return f"{v * 1e3:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if "bytes" in k:
        return binary_bytes(v)
    if k.endswith("_gbs"):
        return significant(v * 1e9, ("B/s", "KB/s", "MB/s", "GB/s", "TB/s"))
    if k.endswith(("share", "_frac", "_rate")):
        return f"{v * 100:.1f}%"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _key(k: Any) -> str:
    """An evidence dict's key as it reads: integer keys are ranks (the rules key per-rank figures by
    the reader's rank, `analyzers.evidence.by_rank`; a JSON document holds them as strings), shown
    as every report shows a rank: a log line's missing rank (-1) as `no rank`, a process without a
    rank as `pid N`."""
    if isinstance(k, bool):
        return str(k)
    if isinstance(k, str):
        if not re.fullmatch(r"-?\d+", k):
            return k
        k = int(k)
    if not isinstance(k, int):
        return str(k)
    label = rank_label(k)
    return "no rank" if label == "-" else label


_GBS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?) GB/s")


def prose(text: str) -> str:
    """A rule's title or detail with its bandwidths in the unit that reads ("2.61e-05 GB/s" ->
    "26.1 KB/s"); everything else as the rule wrote it."""
    return _GBS.sub(
        lambda m: significant(float(m.group(1)) * 1e9, ("B/s", "KB/s", "MB/s", "GB/s", "TB/s")), text
    )


def evidence_line(evidence: dict[str, Any]) -> str:
    return ", ".join(f"{k}={evidence_value(k, v)}" for k, v in evidence.items())


def fix_blocks(fix: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, text, language) per part of a fix: `ds_config` JSON, Megatron arguments on one line,
    environment variables on one line."""
    out: list[tuple[str, str, str]] = []
    if fix.get("ds_config"):
        out.append(("ds_config patch", json.dumps(fix["ds_config"], indent=2, sort_keys=False), "json"))
    if fix.get("megatron_args"):
        out.append(("Megatron arguments", " ".join(str(a) for a in fix["megatron_args"]), "sh"))
    if fix.get("env"):
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in fix["env"].items())
        out.append(("environment", env, "sh"))
    return out


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`patch` deep-merged into a copy of `base` (nested dicts merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in patch.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = merge(out[k], v) if nested else copy.deepcopy(v)
    return out


def merged_ds_config(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the job's effective ds_config with each finding's first ds_config fix merged, in report order,
    most severe first; the fixes merged; the alternatives left out). A finding's later fixes are
    alternatives to its first (ZeRO++ or ZeRO-2), so only the first is merged; a later finding's
    patch wins a key an earlier one set."""
    cfg: dict[str, Any] = dict(doc.get("layout", {}).get("ds_config") or {})
    used: list[str] = []
    skipped: list[str] = []
    for f in doc.get("findings", []):
        patches = [fix for fix in f.get("fixes") or [] if fix.get("ds_config")]
        for i, fix in enumerate(patches):
            if i == 0:
                cfg = merge(cfg, fix["ds_config"])
            (used if i == 0 else skipped).append(f"{f['rule']}: {fix['summary']}")
    return cfg, used, skipped
