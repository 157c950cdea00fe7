"""Injection pieces that run without ptrace: preflight parsing, the payload's in-process half,
finding ranks under a launcher, and the sitecustomize decision of `diag run`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from diag import agent
from diag.control import protocol
from diag.errors import DiagError
from diag.inject import checks, payload
from diag.procs import launcher_of, ranks_under


@pytest.fixture(autouse=True)
def private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def test_python_version_from_maps_or_executable():
    maps = "7f00 r-xp 00000000 08:01 1 /usr/lib/libpython3.12.so.1.0\n"
    assert checks.python_version("/usr/bin/python3", maps) == (3, 12)
    assert checks.python_version("/root/.pyenv/versions/3.9.1/bin/python3.9", "") == (3, 9)
    assert checks.python_version("/usr/bin/sleep", "") is None
    assert checks.python_version(sys.executable, "") == sys.version_info[:2]  # asks the interpreter


def test_ptrace_hints(tmp_path):
    scope, status = tmp_path / "scope", tmp_path / "status"
    status.write_text("CapEff:\t0000000000000000\n")
    scope.write_text("1\n")
    assert "kernel.yama.ptrace_scope=1" in checks.ptrace_hint(str(scope), str(status))
    scope.write_text("3\n")
    assert "until reboot" in checks.ptrace_hint(str(scope), str(status))
    scope.write_text("0\n")
    assert "CAP_SYS_PTRACE" in checks.ptrace_hint(str(scope), str(status))
    status.write_text(f"CapEff:\t{1 << checks.CAP_SYS_PTRACE:016x}\n")
    assert "seccomp" in checks.ptrace_hint(str(scope), str(status))


def test_inspect_own_process_and_missing_pid():
    me = checks.inspect(os.getpid(), need_torch=False)
    assert me.version == sys.version_info[:2]
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(DiagError, match="no such process"):
        checks.inspect(dead.pid)


def test_payload_code_is_safe_as_a_pending_call():
    """Two lines for gdb's C string and PyRun_SimpleString in `__main__`: no double quotes or
    backslashes, binds no names there, and never raises (a pending call's exception would become a
    SystemError in the job's main thread)."""
    line = payload.code("/run/user/0/diag/attach-1-ab.json")
    assert '"' not in line and "\\" not in line and line.count("\n") == 2
    namespace: dict = {}
    exec(line.replace("diag.inject.payload", "diag.inject.no_such_module"), namespace)
    assert set(namespace) == {"__builtins__"}
    with pytest.raises(ValueError, match="quotes"):
        payload.code("/tmp/x'; import os; os.system('id') #")


def _wait(path: str) -> None:
    deadline = time.monotonic() + 60  # the agent imports torch: slow on a loaded machine
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_boot_starts_agent_once_and_removes_its_options(tmp_path):
    opts = payload.write_options(os.getpid(), {"trace_dir": str(tmp_path / "t"), "what": "steps"})
    assert stat.S_IMODE(os.stat(opts).st_mode) == 0o600
    payload.boot(opts)
    _wait(protocol.socket_path(os.getpid()))
    first = agent.current()
    assert first is not None and not os.path.exists(opts)
    again = payload.write_options(os.getpid(), {"trace_dir": str(tmp_path / "other")})
    payload.boot(again)
    for t in threading.enumerate():  # the boot thread must be done before we stop the agent, or it
        if t.name == "diag-attach":  # would find none running and start a fresh one
            t.join(timeout=10)
    assert not os.path.exists(again)
    assert agent.current() is first  # reused
    agent.stop()
    assert not os.path.exists(protocol.socket_path(os.getpid()))


def test_boot_failure_is_reported_next_to_the_socket(tmp_path):
    opts = payload.write_options(os.getpid(), {"trace_dir": str(tmp_path), "what": "nonsense"})
    payload.boot(opts)
    err = payload.error_file(os.getpid())
    _wait(err)
    assert "unknown collector(s) nonsense" in open(err).read()
    os.unlink(err)
    assert agent.current() is None


CHILD = "import os,time; print(os.environ['RANK'], flush=True); time.sleep(30)"
# each child says it runs before the launcher says ready: a child not yet past exec still shows the
# launcher's environment, no RANK (rank 0 went unseen under CI's load)
LAUNCHER = f"""
import os, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, '-c', {CHILD!r}], env={{**os.environ, 'RANK': str(r)}},
                         stdout=subprocess.PIPE, text=True)
        for r in (1, 0)]
for kid in kids:
    kid.stdout.readline()
print('ready', flush=True)
time.sleep(30)
"""


def _until_exec(pid: int, word: str) -> None:
    """Until the process's command line holds `word` (it has run exec)."""
    import psutil

    for _ in range(1000):
        if word in psutil.Process(pid).cmdline():
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never ran {word}")


@pytest.mark.parametrize("argv", [["torchrun"], ["-m", "torch.distributed.run"], ["deepspeed"], ["train.py"]])
def test_a_launcher_with_no_ranks_yet_is_no_target(tmp_path, argv):
    """Attached 4 s into the public DDP tutorial's start, `diag attach <torchrun pid>` injected the
    launcher itself (it had no rank yet): a trace of "1 process without a rank", and a later
    `diag detach` found its ranks unattached. A launcher is told by its command line; one with no
    rank is no target of attach or detach."""
    script = tmp_path / argv[-1].replace(".", "_")
    script.write_text("import time\ntime.sleep(60)\n")
    cmd = (
        [sys.executable, *argv[:-1], str(script)] if argv[0] != "-m" else [sys.executable, str(script), *argv]
    )
    proc = subprocess.Popen([*cmd, "--nproc-per-node", "2", "train.py"])
    try:
        _until_exec(proc.pid, str(script))  # before its exec, the child's command line is pytest's
        if argv == ["train.py"]:
            assert launcher_of(proc.pid) is None
            return
        assert launcher_of(proc.pid) == os.path.basename(argv[-1])
        # attach before its ranks started; detach after they exited (the public DDP tutorial's
        # launcher, detached a moment after its job ended: "pid N is not attached (no control socket)")
        for command, says in (("attach", "attach again once its ranks run"), ("detach", "nothing to detach")):
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "diag",
                    command,
                    str(proc.pid),
                    *(["--no-torch"] * (command == "attach")),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 1 and "launcher with no rank under it" in res.stderr, res
            assert says in res.stderr and "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    finally:
        proc.kill()
        proc.wait()


def test_ranks_under_a_launcher_are_its_topmost_rank_processes():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == "ready"
        found = ranks_under(launcher.pid)
        assert [r for _, r in found] == [0, 1]
        assert ranks_under(found[0][0]) == [found[0]]
    finally:
        for child in __import__("psutil").Process(launcher.pid).children():
            child.kill()
        launcher.kill()
        launcher.wait()


def test_the_automatic_order_never_uses_an_injector_that_mallocs_in_the_stopped_thread():
    """pyinjector's dlopen deadlocked a real rank stopped inside malloc (issue 9): it, hypno and gdb
    (strdup) run only when named; every method tried is named with why it failed."""
    from diag.inject import AUTO_ORDER, inject

    assert set(AUTO_ORDER) == {"remote_exec", "ptrace"}
    dead = subprocess.Popen(["true"])
    dead.wait()
    tried: list[str] = []
    with pytest.raises(DiagError) as err:
        inject(checks.Target(dead.pid, sys.executable, sys.version_info[:2], False), "pass", None, tried)
    assert [t.split(":")[0] for t in tried] == ["remote_exec", "ptrace"]
    assert "needs 3.14+" in tried[0] and "only when named with --method" in str(err.value)
    assert "pyinjector:" not in str(err.value) and "gdb:" not in str(err.value)


def test_named_injectors_warn_of_what_they_risk_in_the_target():
    """pyinjector (and hypno, on the same library) restore no AVX state: on Megatron-DeepSpeed's
    pretrain_gpt.py an attach with it was followed by an fp16 overflow the untouched run did not
    have (issue 9's verification). The automatic order warns of nothing; gdb saves the full state."""
    from diag.inject import AUTO_ORDER, risks

    assert all(risks(m) == [] for m in AUTO_ORDER)
    for method in ("pyinjector", "hypno"):
        said = " ".join(risks(method))
        assert "malloc" in said and "AVX" in said and "numbers" in said, said
    assert "malloc" in " ".join(risks("gdb")) and "AVX" not in " ".join(risks("gdb"))


def test_expired_or_orphaned_payload_files_are_swept(tmp_path):
    from diag.inject.attach import sweep_expired

    dead = subprocess.Popen(["true"])
    dead.wait()
    base = protocol.runtime_dir()
    names = {
        "young": f"attach-{os.getpid()}-aa.json",
        "old": f"inject-{os.getpid()}-bb.py",
        "orphan": f"attach-{dead.pid}-cc.json",
        "other": f"{os.getpid()}.sock.x",
    }
    for n in names.values():
        open(os.path.join(base, n), "w").close()
    old = time.time() - payload.QUEUED_LIFE_S - 5
    os.utime(os.path.join(base, names["old"]), (old, old))
    removed = {os.path.basename(p) for p in sweep_expired()}
    assert removed == {names["old"], names["orphan"]}
    assert sorted(os.listdir(base)) == sorted([names["young"], names["other"]])


def test_a_payload_that_runs_after_its_life_starts_nothing(tmp_path):
    opts = payload.write_options(os.getpid(), {"trace_dir": str(tmp_path / "t"), "what": "steps"})
    old = time.time() - payload.QUEUED_LIFE_S - 5
    os.utime(opts, (old, old))
    payload._start(opts)
    assert agent.current() is None and not os.path.exists(opts)
    assert not os.path.exists(payload.error_file(os.getpid()))
    payload._start(opts)  # swept before it ran: nothing, not even an error file
    assert agent.current() is None and not os.path.exists(payload.error_file(os.getpid()))
