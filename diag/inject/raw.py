"""A ptrace injector with no dlopen and no malloc in the target (x86-64 Linux).

pyinjector (and hypno, and gdb's string literals) make the stopped thread call dlopen, which mallocs:
measured here, a thread stopped inside malloc then deadlocks on its own arena lock (gdb backtrace:
__libc_calloc <- _dl_new_object <- dlopen, 1 in ~65 injections into a torch loop). This injector
makes the stopped main thread call only two lock-free-in-practice functions, each returning to
address 0 (a SIGSEGV that the tracer swallows): libc's `mmap` (a bare syscall) for a page that
holds the payload, then `Py_AddPendingCall(PyRun_SimpleString, page)`, which queues the payload for
the main thread's next bytecode boundary. No code in the target is overwritten.

Run as `python -I -S .../raw.py PID PAYLOAD_FILE` (ptrace.py does, by its checked path, with a
timeout; stdlib only, so it needs nothing on sys.path); it finds the functions by their offsets in
this interpreter's own libc and libpython, so the target must map the same files (the usual case:
same venv); otherwise it exits with a one-line reason. The target is seized, not attached, so this
process dying leaves it running (see `_Seized`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys
import time

PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH, PTRACE_CONT = 12, 13, 17, 7
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_EVENT_STOP = 0x4206, 0x4207, 128
DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}  # until registers are back
FIELDS = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
          "fs_base gs_base ds es fs gs").split()
TIMEOUT_S = 10.0
SPIN_S = 0.002


class Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in FIELDS]


libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


def _ptrace(req: int, pid: int, addr: int = 0, data: object = None) -> None:
    if libc.ptrace(req, pid, addr, data) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({req}): {os.strerror(err)}")


def _mapped_base(pid: int | str, path: str) -> int | None:
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == path:
                return int(parts[0].split("-")[0], 16) - int(parts[2], 16)
    return None


def _file_of(addr: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split()[5]
    raise LookupError(hex(addr))


def target_address(pid: int, fn: ctypes._CFuncPtr) -> int:  # type: ignore[name-defined]
    """`fn`'s address in the target: same file, same offset from where it is mapped."""
    here = ctypes.cast(fn, ctypes.c_void_p).value or 0
    path = _file_of(here)
    base, mine = _mapped_base(pid, path), _mapped_base("self", path)
    if base is None or mine is None:
        raise LookupError(f"the target does not map {path} (run diag from the job's environment)")
    return here - mine + base


def _wait_stop(pid: int, deadline: float) -> tuple[int, int]:
    """(signal, ptrace event) of the thread's next stop."""
    spin = time.monotonic() + SPIN_S  # our calls take microseconds: the window where our death
    while (now := time.monotonic()) < deadline:  # would hurt the target stays that short
        got, status = os.waitpid(pid, os.WNOHANG | 0x40000000)  # __WALL
        if got == pid:
            if not os.WIFSTOPPED(status):
                raise ChildProcessError(f"target exited (status {status})")
            return os.WSTOPSIG(status), status >> 16
        if now > spin:
            time.sleep(0.0005)
    raise TimeoutError("the target did not stop")


class _Seized:
    """The target's main thread, seized (PTRACE_SEIZE): it stops only in ptrace-stops that we ask
    for, never in a group-stop, so if this process dies at any point the kernel detaches it and it
    runs on (PTRACE_ATTACH's SIGSTOP left it in state T, issue 10). The one exception is a call in
    flight (`running_call`): the target would return to address 0 without us and die; signals that
    would end this process are blocked for the whole injection, so only SIGKILL can hit it."""

    def __init__(self, pid: int, deadline: float) -> None:
        self.pid, self.deadline = pid, deadline
        self.held: list[int] = []  # signals for the target that arrived during our calls
        self.stopped = False

    def stop(self) -> None:
        _ptrace(PTRACE_INTERRUPT, self.pid)
        while True:
            sig, event = _wait_stop(self.pid, self.deadline)
            if event == PTRACE_EVENT_STOP:
                self.stopped = True
                return
            _ptrace(PTRACE_CONT, self.pid, 0, sig)  # its own signal, delivered now as usual

    def call(self, saved: Regs, fn: int, args: list[int]) -> int:
        """fn(*args) in the stopped thread, below its red zone, returning to 0 (a SIGSEGV)."""
        regs = Regs.from_buffer_copy(saved)
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, name, value & 0xFFFFFFFFFFFFFFFF)
        regs.rsp = ((saved.rsp - 512) & ~0xF) - 8  # the return address slot: rsp % 16 == 8 on entry
        regs.rip, regs.rax, regs.orig_rax = fn, 0, 0xFFFFFFFFFFFFFFFF  # no syscall restart for us
        with open(f"/proc/{self.pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(regs.rsp)
            mem.write(b"\0" * 8)
        _ptrace(PTRACE_SETREGS, self.pid, 0, ctypes.byref(regs))
        while True:
            self.stopped = False
            _ptrace(PTRACE_CONT, self.pid, 0, None)
            sig, event = _wait_stop(self.pid, self.deadline)
            self.stopped = True
            out = Regs()
            _ptrace(PTRACE_GETREGS, self.pid, 0, ctypes.byref(out))
            if event == 0 and sig == signal.SIGSEGV and out.rip == 0:
                return out.rax
            if event == 0 and sig == signal.SIGSEGV:
                raise RuntimeError(f"the call faulted at {out.rip:#x}")
            if event == 0:
                self.held.append(sig)  # another signal arrived meanwhile: delivered on detach

    def release(self, saved: Regs) -> None:
        """Put the registers back (stopping the thread first if a call was cut short) and detach;
        held signals are delivered again."""
        try:
            if not self.stopped:
                self.deadline = time.monotonic() + TIMEOUT_S
                self.stop()
            if saved.rsp:
                _ptrace(PTRACE_SETREGS, self.pid, 0, ctypes.byref(saved))
        finally:
            _ptrace(PTRACE_DETACH, self.pid, 0, self.held[0] if self.held else 0)
            for sig in self.held[1:]:
                os.kill(self.pid, sig)


def inject(pid: int, payload: bytes) -> None:
    if platform.machine() != "x86_64":
        raise OSError(f"raw injection supports x86_64 only, not {platform.machine()}")
    py = ctypes.pythonapi
    add, run, mmap = (target_address(pid, f) for f in (py.Py_AddPendingCall,
                                                      py.PyRun_SimpleString, libc.mmap))
    size = (len(payload) + 1 + 4095) & ~4095
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        _inject(pid, payload, size, add, run, mmap)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _inject(pid: int, payload: bytes, size: int, add: int, run: int, mmap: int) -> None:
    target = _Seized(pid, time.monotonic() + TIMEOUT_S)
    _ptrace(PTRACE_SEIZE, pid)
    saved = Regs()
    try:
        target.stop()
        _ptrace(PTRACE_GETREGS, pid, 0, ctypes.byref(saved))
        page = target.call(saved, mmap, [0, size, 3, 0x22, -1, 0])  # RW, ANON|PRIVATE
        if page >= 0xFFFFFFFFFFFFF000:
            raise OSError(f"mmap in the target failed ({-(page - (1 << 64))})")
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(page)
            mem.write(payload + b"\0")
        rc = target.call(saved, add, [run, page]) & 0xFFFFFFFF
        if rc != 0:
            raise RuntimeError("Py_AddPendingCall refused (its queue is full)")
    finally:
        target.release(saved)


def main(argv: list[str]) -> int:
    with open(argv[1], "rb") as f:
        payload = f.read()
    try:
        inject(int(argv[0]), payload)
    except Exception as e:  # noqa: BLE001 - one line for the parent
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
