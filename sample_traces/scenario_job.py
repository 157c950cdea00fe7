"""Run `tests.workloads.gpt_ds` with DeepSpeed config overrides it has no flag for.

`DIAG_SCENARIO_DS` holds a JSON object deep-merged into the workload's ds_config (for example ZeRO-3
without prefetch, so each module gathers its own parameters when it runs). Everything else is the
workload unchanged: `python -m sample_traces.scenario_job <gpt_ds flags>`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.workloads import gpt_ds

_workload_config = gpt_ds.ds_config


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def ds_config(args: Any) -> dict[str, Any]:
    return merged(_workload_config(args), json.loads(os.environ.get("DIAG_SCENARIO_DS") or "{}"))


if __name__ == "__main__":
    gpt_ds.ds_config = ds_config
    raise SystemExit(gpt_ds.main())
