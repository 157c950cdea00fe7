"""Preloaded by `diag run` (this directory is put first on PYTHONPATH): starts the diag agent in the
job's ranks, not in its launcher, then runs any sitecustomize this one shadows.

Starts in: a process with RANK in its environment (torchrun / deepspeed workers), the command
`diag run` executed itself when that is not a launcher, or a direct child of that command when it
is one (`accelerate launch` runs a single process without RANK). Skips: launchers, multiprocessing helpers,
and other Python subprocesses of the job. Options come from the DIAG_RUN environment variable.

A job's own sitecustomize earlier on sys.path (a launch script prepending its directory to PYTHONPATH)
shadows this module; where diag is installed in the job's interpreter, its `diag-run.pth` arms
hook.py, which boots the agent after that sitecustomize instead.
"""

import os
import sys

# a launcher is the program a process runs, never a word in its arguments: the public DDP tutorial's
# own script is `multigpu_torchrun.py`, and a substring test took its ranks for launchers
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher",
    "accelerate.commands",
)
LAUNCHER_SCRIPTS = ("torchrun", "deepspeed", "accelerate")
HELPERS = ("multiprocessing.spawn", "multiprocessing.forkserver", "multiprocessing.resource_tracker")
OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")  # interpreter options whose value is the next word
BOOTED = "DIAG_RUN_BOOTED"  # "pid:RANK" of the process the agent started in, for its subprocesses


def _cmdline(pid: str = "self") -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return [sys.executable, *sys.argv] if pid == "self" else []


def launcher(argv: list[str]) -> bool:
    """Does this command line (interpreter first) run a launcher: `-m torch.distributed.run`, a
    `torchrun` / `deepspeed` script (its shebang puts the interpreter first), or the binary itself?"""
    if argv and os.path.basename(argv[0]) in LAUNCHER_SCRIPTS:
        return True
    words = iter(argv[1:])
    for word in words:
        if word == "-m":
            module = next(words, "")
            return any(module == m or module.startswith(m + ".") for m in LAUNCHER_MODULES)
        if word == "-c":
            return False
        if word in OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return os.path.basename(word) in LAUNCHER_SCRIPTS
    return False


def _wanted(argv: list[str]) -> bool:
    """A rank (RANK set by its launcher), the command `diag run` ran when it is no launcher, or a
    direct child of the launcher it ran: `accelerate launch` runs a single process without RANK (the
    agent was in accelerate itself, the training process had none: 0 steps recorded). Not a Python
    subprocess of a process the agent runs in, with the same RANK: a helper of that rank, not a rank
    (DeepSpeed runs `cpuinfo.py --json` twice a rank, each inheriting RANK: it became a second
    "rank 0" trace file and took 5.3 s for 1.2 s, importing torch for the agent)."""
    if launcher(argv) or any(h in " ".join(argv) for h in HELPERS):
        return False
    pid, _, rank = os.environ.get(BOOTED, "").partition(":")
    if pid and pid != str(os.getpid()) and rank == os.environ.get("RANK", ""):
        return False
    top = os.environ.get("DIAG_RUN_PID")
    if "RANK" in os.environ or top == str(os.getpid()):
        return True
    return top == str(os.getppid()) and launcher(_cmdline(top))


def boot() -> None:
    """Start the agent here if this process is one of the job's ranks (diag run's DIAG_RUN is set);
    in the launcher `diag run` became, say at exit if no rank recorded anything."""
    spec = os.environ.get("DIAG_RUN")
    if not spec:
        return
    argv = _cmdline()
    if not _wanted(argv):
        if os.environ.get("DIAG_RUN_PID") == str(os.getpid()) and launcher(argv):
            _report_at_exit(spec)
        return
    try:
        import json

        from diag.inject.payload import start_agent

        start_agent(json.loads(spec))
        os.environ[BOOTED] = f"{os.getpid()}:{os.environ.get('RANK', '')}"  # its subprocesses inherit it
    except Exception as exc:  # noqa: BLE001 - the job runs on without diag
        print(f"diag: agent not started in pid {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _report_at_exit(spec: str) -> None:
    """The launcher's exit: one line on stderr when no trace file was written since it started,
    so a job that ran without the agent is never taken for one that recorded nothing wrong."""
    import atexit
    import json
    import time

    try:
        folder = json.loads(spec).get("trace_dir")
    except ValueError:
        return
    folder = folder or os.environ.get("DIAG_TRACE_DIR") or os.path.abspath("diag-trace")
    started = time.time()

    def report() -> None:
        try:
            names = os.listdir(folder)
            fresh = any(os.path.getmtime(os.path.join(folder, n)) >= started - 1 for n in names)
        except OSError:
            fresh = False
        if not fresh:
            print(
                f"diag run: no process of this job started the diag agent: nothing was recorded in "
                f"{folder} (a rank that fails to start it says why on stderr)",
                file=sys.stderr,
            )

    atexit.register(report)


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
