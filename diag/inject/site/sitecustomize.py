"""Preloaded by `diag run` (this directory is put first on PYTHONPATH): starts the diag agent in the
job's ranks, not in its launcher, then runs any sitecustomize this one shadows.

Starts in: a process with RANK in its environment (torchrun / deepspeed workers), or the command
`diag run` executed itself when that is not a launcher. Skips: launchers, multiprocessing helpers,
and other Python subprocesses of the job. Options come from the DIAG_RUN environment variable.

A job's own sitecustomize earlier on sys.path (a launch script prepending its directory to PYTHONPATH)
shadows this module; where diag is installed in the job's interpreter, its `diag-run.pth` arms
hook.py, which boots the agent after that sitecustomize instead.
"""

import os
import sys

LAUNCHERS = (
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher",
    "bin/deepspeed",
)
HELPERS = ("multiprocessing.spawn", "multiprocessing.forkserver", "multiprocessing.resource_tracker")


def _cmdline() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return " ".join(sys.argv)


def _wanted() -> bool:
    cmd = _cmdline()
    if any(h in cmd for h in HELPERS) or any(name in cmd for name in LAUNCHERS):
        return False
    return "RANK" in os.environ or os.environ.get("DIAG_RUN_PID") == str(os.getpid())


def boot() -> None:
    """Start the agent here if this process is one of the job's ranks (diag run's DIAG_RUN is set)."""
    spec = os.environ.get("DIAG_RUN")
    if not spec or not _wanted():
        return
    try:
        import json

        from diag.inject.payload import start_agent

        start_agent(json.loads(spec))
    except Exception as exc:  # noqa: BLE001 - the job runs on without diag
        print(f"diag: agent not started in pid {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    """Run the sitecustomize this module shadows, if the environment has one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # imported as diag.inject.site.sitecustomize by hook.py: boot only
    boot()
    _chain()
