"""diag: profile and diagnose DeepSpeed / Megatron training jobs.

This module is the public import surface. It stays light (stdlib only at import time) because the
agent imports it inside the training process, where pandas and textual must never be loaded.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from diag.errors import EXTRAS, DiagError, needs

if TYPE_CHECKING:
    from diag.trace.model import Trace

__version__ = "0.1.0"  # the one place the version is stated (pyproject reads it)


def _source_checkout_path() -> None:
    """Make `diag.collectors` and `diag.analyzers` importable from a source checkout.

    The repository keeps `collectors/` and `analyzers/` beside `diag/` (the folder layout is the
    architecture); a wheel installs them inside `diag/` (pyproject's package-dir), so nothing diag
    loads can collide with a job's own top-level `collectors` or `analyzers`. In a checkout (an
    editable install, a worktree, PYTHONPATH) the parent folder joins this package's path, but only
    when it is this project's checkout: never a site-packages that happens to hold a `collectors`.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isdir(os.path.join(here, "collectors")):
        return  # installed: the sub-packages are inside
    root = os.path.dirname(here)
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            ours = 'name = "diag"' in f.read(4096)
    except OSError:
        return
    if ours and os.path.isfile(os.path.join(root, "collectors", "__init__.py")):
        __path__.append(os.path.join(root))


_source_checkout_path()
__all__ = ["DiagError", "Trace", "__version__", "load"]


def load(path: str, *, strict: bool = False, capture: int | None = None) -> Trace:
    """Load a diag trace directory (one `rank-*.jsonl` per rank) into pandas frames.

    `trace.steps`, `.layers`, `.comms`, `.memory`, `.overflow`, `.gpu`, ...: one frame per record
    kind with a `rank` column; times are integer nanoseconds (`ts` since the epoch, `dur`), sizes
    bytes (see `diag.trace.model.Trace` for every column and unit). `trace.headers[rank]` holds each
    rank's header, `trace.layout()` the parallel layout, `trace.problems` what could not be read.
    strict: raise `DiagError` on the first unreadable line instead of skipping it.
    capture: which capture of a directory a second attach wrote into (0 the first, K its
    `rank-N.K.jsonl` files); a directory holding several is refused without it (their steps collide).

        >>> tr = diag.load("diag-trace")
        >>> tr.steps.groupby("rank")["dur"].median() / 1e6   # ms per step and rank

    Imported lazily so that `import diag` inside a training job never pulls in pandas.
    """
    try:
        from diag.trace.reader import load_trace

        return load_trace(path, strict=strict, capture=capture)
    except ModuleNotFoundError as e:  # `pip install diag` alone has no pandas: say which extra
        if (e.name or "").split(".")[0] not in EXTRAS:
            raise
        raise ModuleNotFoundError(f"diag.load {needs(e)}", name=e.name) from None
