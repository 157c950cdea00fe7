"""diag: profile and diagnose DeepSpeed / Megatron training jobs.

This module is the public import surface. It stays light (stdlib only at import time) because the
agent imports it inside the training process, where pandas and textual must never be loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diag.errors import DiagError

if TYPE_CHECKING:
    from diag.trace.model import Trace

__version__ = "0.1.0"
__all__ = ["DiagError", "Trace", "__version__", "load"]


def load(path: str, *, strict: bool = False) -> Trace:
    """Load a diag trace directory (one `rank-*.jsonl` per rank) into pandas frames.

    Imported lazily so that `import diag` inside a training job never pulls in pandas.
    """
    from diag.trace.reader import load_trace

    return load_trace(path, strict=strict)
