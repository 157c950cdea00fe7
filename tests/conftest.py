"""Shared fixtures. The autouse `no_leftovers` fails any test that leaves the agent running, global
module hooks installed, or extra threads alive: diag promises to leave a process as it found it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def sample_folders() -> list[str]:
    """Every folder of sample_traces/ and tests/fixtures/, sorted: the inputs that tests comparing
    two ways of reading run on."""
    return [
        os.path.join(ROOT, base, name)
        for base in ("sample_traces", os.path.join("tests", "fixtures"))
        for name in sorted(os.listdir(os.path.join(ROOT, base)))
        if os.path.isdir(os.path.join(ROOT, base, name))
    ]


# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). Every test that
# trains, attaches, launches or signals processes, binds a port or a socket, mounts, hogs a CPU or
# compares a time with a threshold goes in ONE group, run one after another on one worker as without
# xdist; the pure in-process tests (the readers, the rules, the reports) share the other worker. A
# session fixture (tests/integration's `runs` and `venv`, tests/reliability's `baseline`, tests/tui's
# `real_trace`) is then made once, on the worker of the group, as before.
SERIAL_GROUP = "jobs"
SERIAL_FOLDERS = ("integration", "reliability")
SERIAL_TUI = {"test_app", "test_cli_top", "test_model"}  # live jobs and processes; the rest render in-process
SERIAL_UNITS = {
    "test_agent_api",  # the agent's threads, waited for with a deadline
    "test_agent_limits",  # a tmpfs mount, memory growth of ten million events
    "test_comm_group_roles",  # torch.distributed (gloo) in this process
    "test_comm_group_sp",
    "test_comms",  # torch.multiprocessing ranks
    "test_comms_local",
    "test_control",  # control sockets
    "test_exporter",  # a port, a deadline
    "test_fault_cells",  # a busy-loop process next to a measurement
    "test_flight_recorder",  # torch's flight recorder dumps from a real run
    "test_inject",  # injection into live processes
    "test_inject_native",
    "test_inject_raw",
    "test_layers",
    "test_looker",  # processes killed and reaped on a schedule while the GIL is held
    "test_pending_entered",  # compares held times with OPEN_S
    "test_rank_labels",  # diag run of a training script
    "test_run_site",  # torchrun with a free port
    "test_runs",  # diag run, the exporter on a port
    "test_stacks",  # py-spy on live processes
    "test_startup",
    "test_steps",
    "test_straggler_contended",  # a CPU hog and wall-time measurement
    "test_straggler_throttle",  # SIGSTOP/SIGCONT of a process, timing
    "test_uncaught",
    "test_watch",  # diag watch of processes ending, with timing
}
# Their verdicts compare the ranks' speeds (a straggler, a throttled or hogged rank, a healthy job that
# must show none): on two cores they run alone, the other worker waiting between two of its tests
# (`_cpu_turn`). A healthy DDP cell was once called a straggler with a pandas test beside it.
ALONE = {"test_fault_matrix", "test_fault_extra", "test_top_looks", "test_scenarios"}
ALONE |= {"test_straggler_contended", "test_fault_cells"}
ALONE |= {"test_ddp_attach_steps"}  # step ends within SLEEP/3 (10 ms) of the program's: 18 ms once, loaded
# a healthy profiled job that must show no DataLoader wait: with a real job beside it on the other
# worker, its loader's ops took 5 ms a step of 21 (24%) and idle_between_steps fired once
ALONE |= {"test_input_wait"}


@pytest.hookimpl(tryfirst=True)  # before the tmp_path factory is made from the option
def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker, `gw1` for xdist's `popen-gw1` in the base of tmp_path. A control socket is
    bound as `<tmp_path>/diag/<pid>.sock.<12 hex>.new` in the tests that point XDG_RUNTIME_DIR at
    their tmp_path, and AF_UNIX takes 107 bytes: the 6 more of `popen-` were 109 in
    test_attach_installed (its `<tmp_path>/xdg`)."""
    base = getattr(config.option, "basetemp", None)
    if hasattr(config, "workerinput") and base and os.path.basename(base).startswith("popen-"):
        config.option.basetemp = os.path.join(os.path.dirname(base), os.path.basename(base)[len("popen-") :])


def _module(item: pytest.Item) -> str:
    """The test's module name (`test_hang`), as SERIAL_UNITS and ALONE name them."""
    return os.path.splitext(os.path.basename(str(item.path)))[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).split(os.sep)
        module = _module(item)
        serial = rel[0] in SERIAL_FOLDERS or (rel[0] == "tui" and module in SERIAL_TUI)
        if serial or module in SERIAL_UNITS or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


@contextlib.contextmanager
def _cpu_turn(item: pytest.Item) -> Iterator[None]:
    """On an xdist worker: a test of ALONE holds the run's lock file exclusively, any other test
    shares it. The gate, taken before the lock and held by a waiting ALONE test, lets no shared
    holder in ahead of it (flock would let the other worker's next test starve it)."""
    base = getattr(item.config.option, "basetemp", None)
    if not hasattr(item.config, "workerinput") or not base:
        yield
        return
    root = os.path.dirname(base)  # the run's folder: the workers' basetemps are in it
    alone = _module(item) in ALONE
    gate = os.open(os.path.join(root, "cpu.gate"), os.O_RDWR | os.O_CREAT, 0o600)
    lock = os.open(os.path.join(root, "cpu.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(lock)  # closing releases both
        os.close(gate)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _cpu_turn(item):
        yield


def _global_hooks() -> dict[str, int]:
    mod = sys.modules.get("torch.nn.modules.module")
    if mod is None:
        return {}
    names = [n for n in dir(mod) if n.startswith("_global_") and n.endswith("hooks")]
    return {n: len(getattr(mod, n)) for n in names}


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("diag")}


@pytest.fixture(autouse=True)
def no_leftovers():
    hooks_before = _global_hooks()
    threads_before = _threads()
    yield
    from diag import agent

    leaked = agent.current()
    if leaked is not None:
        agent.stop()
        pytest.fail("test left the diag agent running")
    deadline = time.monotonic() + 5
    while _threads() - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_threads() - threads_before), f"diag threads left: {_threads() - threads_before}"
    assert _global_hooks() == {**hooks_before, **{k: 0 for k in _global_hooks() if k not in hooks_before}}, (
        "global hooks left"
    )


@pytest.fixture
def without_deepspeed(monkeypatch):
    """For plain torch loops: hide a DeepSpeed that an earlier test imported into this pytest process
    (tests/integration/ds_harness.py does). While DeepSpeed is loaded, the steps collector waits
    `TORCH_GRACE` torch optimizer steps for an engine (collectors/steps.py): a plain loop's first steps
    would not be boundaries, and its step numbers and layer samples would depend on test order."""
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
