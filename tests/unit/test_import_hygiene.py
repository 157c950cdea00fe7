"""What the in-job code loads: the agent and collectors run inside the training job, so stdlib +
torch/deepspeed/megatron only, checked at run time and in the source. The package layering (analyzers
pure, only diag/tui imports textual, the report without analyzers, ...) is import-linter's:
tests/unit/test_layering.py.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IN_JOB_FORBIDDEN = {"pandas", "textual", "rich", "numpy", "psutil", "pynvml"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _py_files(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (ROOT / part).rglob("*.py"))


def test_in_job_modules_import_nothing_heavy() -> None:
    """Start the agent with every collector in a fresh interpreter: no pandas/textual/rich loaded.
    (The NVML sidecar, diag/nvml/, runs outside the job: it is not a collector.)"""
    code = (
        "import sys, tempfile, torch\n"
        f"job = {{m for m in {sorted(IN_JOB_FORBIDDEN)!r} if m in sys.modules}}\n"
        "import diag.agent as a\n"
        "ag = a.start(tempfile.mkdtemp())\n"
        "a.stop()\n"
        f"bad = sorted(m for m in {sorted(IN_JOB_FORBIDDEN)!r} if m in sys.modules and m not in job)\n"
        "print(','.join(bad))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=str(ROOT)
    )
    assert out.returncode == 0, out.stderr
    loaded = set(filter(None, out.stdout.strip().split(",")))
    # what `import torch` loads by itself (numpy, pynvml when installed) is the job's, not ours
    assert loaded == set(), f"in-job code loaded {loaded}"


def test_collectors_source_has_no_heavy_imports() -> None:
    files = _py_files("collectors", "diag/agent")
    offenders = {str(p.relative_to(ROOT)): _imports(p) & IN_JOB_FORBIDDEN for p in files}
    assert not {k: v for k, v in offenders.items() if v}
