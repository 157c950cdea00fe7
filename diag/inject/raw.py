"""A ptrace injector with no dlopen and no malloc in the target (x86-64 Linux).

pyinjector (and hypno, and gdb's string literals) make the stopped thread call dlopen, which mallocs:
measured here, a thread stopped inside malloc then deadlocks on its own arena lock (gdb backtrace:
__libc_calloc <- _dl_new_object <- dlopen, 1 in ~65 injections into a torch loop). This injector
makes the stopped main thread call only two lock-free-in-practice functions: libc's `mmap` (a
bare syscall) for a page that holds the payload, then `Py_AddPendingCall(PyRun_SimpleString,
page)`, which queues the payload for the main thread's next bytecode boundary. Each call returns
into libc's own rt_sigreturn trampoline over a signal frame written below the thread's red zone
that holds its registers, FPU state and signal mask: the kernel itself puts the thread back, so the
target is intact whenever this process dies (the old return to address 0, a SIGSEGV the tracer
swallowed, killed it if the tracer died mid-call). mmap's result is read at its syscall-exit stop.
No code in the target is overwritten; after the second call the registers and FPU state are
compared with those at the stop (and put back by hand, with a warning, if they ever differ).

Run as `python -I -S .../raw.py PID PAYLOAD_FILE` (ptrace.py does, by its checked path, with a
timeout; stdlib only, so it needs nothing on sys.path); it finds the functions by their offsets in
this interpreter's own libc and libpython, so the target must map the same files (the usual case:
same venv); otherwise it exits with a one-line reason. The target is seized, not attached (no
SIGSTOP, no group-stop), so this process dying leaves it running (see `_Seized`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import sys
import time

PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH, PTRACE_CONT, PTRACE_SYSCALL = 12, 13, 17, 7, 24
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_EVENT_STOP = 0x4206, 0x4207, 128
PTRACE_GETREGSET, PTRACE_SETREGSET, NT_X86_XSTATE, PTRACE_O_TRACESYSGOOD = 0x4204, 0x4205, 0x202, 1
SYSCALL_STOP = signal.SIGTRAP | 0x80
NR_MMAP, NR_RT_SIGRETURN = 9, 15
PTRACE_GET_SYSCALL_INFO, SYSCALL_ENTRY, SYSCALL_EXIT = 0x420E, 1, 2
RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")  # mov $15,%rax; syscall
RESTART_CODES = (512, 513, 514, 516)  # -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND, -ERESTART_RESTARTBLOCK
SIGCONTEXT_REGS = ("r8 r9 r10 r11 r12 r13 r14 r15 rdi rsi rbp rbx rdx rax rcx rsp rip eflags").split()
FX_SW_OFFSET, XSTATE_MAGIC1, XSTATE_MAGIC2, XSTATE_MAX = 464, 0x46505853, 0x46505845, 64 * 1024
UC_FLAGS = 0x7  # UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS
BAD_SS_FLAGS = 3  # an invalid sigaltstack mode: rt_sigreturn then leaves the thread's altstack alone
FRAME_SIZE = 8 + 304 + 128  # pretcode, ucontext, siginfo
RED_ZONE = 128 + 256  # the ABI's red zone, and some slack
DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}  # until registers are back
FIELDS = (
    "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
    "fs_base gs_base ds es fs gs"
).split()
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
    return _address_in(pid, ctypes.cast(fn, ctypes.c_void_p).value or 0)


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


def _address_in(pid: int, here: int) -> int:
    """An address in one of our mapped files, translated to where the target maps that file."""
    path = _file_of(here)
    base, mine = _mapped_base(pid, path), _mapped_base("self", path)
    if base is None or mine is None:
        raise LookupError(f"the target does not map {path} (run diag from the job's environment)")
    return here - mine + base


class _SigAction(ctypes.Structure):  # glibc's struct sigaction (x86-64)
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ubyte * 128),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


def _ignore(_signum: int, _frame: object) -> None:
    """A Python-level handler whose only use is making libc install a restorer (see restorer)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def restorer() -> int:
    """libc's `__restore_rt` (`mov $15,%rax; syscall`: rt_sigreturn) in this process: glibc's
    sigaction sets it as SA_RESTORER of every handler it installs, so it is read back from one.
    Python's SIGINT handler is the usual one; a process started with SIGINT ignored (a background
    job of a non-interactive shell) has none, so a handler is set on SIGUSR2 just to read it."""
    act = _SigAction()
    if libc.sigaction(signal.SIGINT, None, ctypes.byref(act)) != 0 or not act.restorer:
        previous = signal.signal(signal.SIGUSR2, _ignore)
        try:
            if libc.sigaction(signal.SIGUSR2, None, ctypes.byref(act)) != 0:
                act.restorer = None
        finally:
            signal.signal(signal.SIGUSR2, previous)
    if not act.restorer:
        raise LookupError("cannot find libc's signal restorer")
    if ctypes.string_at(act.restorer, len(RESTORE_RT)) != RESTORE_RT:
        raise LookupError("libc's signal restorer is not `mov $15,%rax; syscall`")
    return int(act.restorer)


class _Seized:
    """The target's main thread, seized (PTRACE_SEIZE): it stops only in ptrace-stops that we ask
    for, never in a group-stop, and each call we make in it returns into libc's rt_sigreturn
    trampoline over a signal frame holding the thread's own registers, FPU state and signal mask.
    So if this process dies at any moment the kernel detaches the thread and it carries on exactly
    where it was (PTRACE_ATTACH's SIGSTOP left it in state T, issue 10; returning to address 0, as
    this injector did, would have killed it). Signals that would end this process are blocked
    meanwhile, so a Ctrl-C or a timeout's SIGTERM waits until the thread is released."""

    def __init__(self, pid: int, deadline: float, trampoline: int) -> None:
        self.pid, self.deadline, self.trampoline = pid, deadline, trampoline
        self.held: list[int] = []  # signals for the target that arrived during our calls

    def stop(self) -> None:
        _ptrace(PTRACE_INTERRUPT, self.pid)
        while True:
            sig, event = _wait_stop(self.pid, self.deadline)
            if event == PTRACE_EVENT_STOP:
                return
            _ptrace(PTRACE_CONT, self.pid, 0, sig)  # its own signal, delivered now as usual

    def regs(self) -> Regs:
        out = Regs()
        _ptrace(PTRACE_GETREGS, self.pid, 0, ctypes.byref(out))
        return out

    def xstate(self) -> bytes:
        buf = ctypes.create_string_buffer(XSTATE_MAX)
        iov = _Iovec(ctypes.cast(buf, ctypes.c_void_p), XSTATE_MAX)
        _ptrace(PTRACE_GETREGSET, self.pid, NT_X86_XSTATE, ctypes.byref(iov))
        return buf.raw[: iov.len]

    def call(self, saved: Regs, xstate: bytes, fn: int, args: list[int], result_of: int | None) -> int:
        """fn(*args) in the stopped thread, which then returns through rt_sigreturn to `saved`.
        Returns the result of syscall `result_of` made inside fn (fn's own result is lost to the
        trampoline), or 0; on return the thread is stopped again, back in its own state."""
        frame_at, data = signal_frame(saved, xstate, self.trampoline, self._blocked())
        with open(f"/proc/{self.pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(frame_at)
            mem.write(data)  # fails cleanly (EIO) if the stack is not mapped that far: nothing changed
        regs = Regs.from_buffer_copy(saved)
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, name, value & 0xFFFFFFFFFFFFFFFF)
        regs.rsp = frame_at  # [rsp] is the return address: the trampoline; rsp % 16 == 8 on entry
        regs.rip, regs.rax, regs.orig_rax = fn, 0, 0xFFFFFFFFFFFFFFFF  # no syscall restart for us
        _ptrace(PTRACE_SETREGS, self.pid, 0, ctypes.byref(regs))
        result, last_nr = 0, -1
        while True:
            _ptrace(PTRACE_SYSCALL, self.pid, 0, None)
            sig, event = _wait_stop(self.pid, self.deadline)
            if event:
                continue  # a stray interrupt stop
            if sig != SYSCALL_STOP:
                if sig == signal.SIGSEGV:
                    raise RuntimeError(f"the call faulted at {self.regs().rip:#x}")
                self.held.append(sig)  # another signal arrived meanwhile: delivered on detach
                continue
            op, value = self._syscall_stop()
            if op == SYSCALL_ENTRY:
                last_nr = value
            elif op == SYSCALL_EXIT and last_nr == result_of:
                result = value
            elif op == SYSCALL_EXIT and last_nr == NR_RT_SIGRETURN:
                return result  # back in its own registers

    def _syscall_stop(self) -> tuple[int, int]:
        """(entry or exit, the syscall number at entry or its result at exit)."""
        info = ctypes.create_string_buffer(88)
        _ptrace(PTRACE_GET_SYSCALL_INFO, self.pid, 88, info)
        return info.raw[0], struct.unpack_from("<Q", info.raw, 24)[0]

    def _blocked(self) -> int:
        with open(f"/proc/{self.pid}/task/{self.pid}/status") as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return int(line.split()[1], 16)
        raise LookupError("no SigBlk in /proc status")

    def release(self) -> None:
        _ptrace(PTRACE_DETACH, self.pid, 0, self.held[0] if self.held else 0)
        for sig in self.held[1:]:
            os.kill(self.pid, sig)


def resumed(saved: Regs) -> Regs:
    """`saved` as the thread must resume: a system call the stop interrupted is set up to run again,
    as the kernel does when no handler runs (rt_sigreturn itself restarts nothing)."""
    regs = Regs.from_buffer_copy(saved)
    if saved.orig_rax < 1 << 63 and (1 << 64) - saved.rax in RESTART_CODES:
        regs.rax, regs.rip, regs.orig_rax = saved.orig_rax, saved.rip - 2, 0xFFFFFFFFFFFFFFFF
    return regs


XSTATE_BV = slice(512, 520)  # the XSAVE header's "which components are not in their init state"
TILEDATA = 18  # AMX tile data: the one dynamic XSAVE component (granted per process on request)
TILEDATA_SIZE = 8192  # 8 tiles x 1 KiB, the last component of the standard format


def frame_features(xstate: bytes) -> tuple[int, int]:
    """(xfeatures, xstate size) the signal frame declares. ptrace's buffer holds every feature of
    XCR0 (its word at FX_SW_OFFSET); on a CPU with AMX that includes the 8 KiB of tile data, which a
    thread has only once its process asked for it. The kernel's rt_sigreturn takes a frame larger
    than the thread's own XSAVE area for a legacy one and restores x87/SSE only (AVX-512 state was
    lost, and put back by hand, on every injection on a Sapphire Rapids host): tile data the thread
    does not use (its XSTATE_BV bit clear) is left out of the frame; it stays in its init state."""
    xfeatures = struct.unpack_from("<Q", xstate, FX_SW_OFFSET)[0]
    in_use = struct.unpack_from("<Q", xstate, XSTATE_BV.start)[0]
    size = len(xstate)
    if xfeatures >> TILEDATA & 1 and not in_use >> TILEDATA & 1 and size > TILEDATA_SIZE + 576:
        return xfeatures & ~(1 << TILEDATA), size - TILEDATA_SIZE
    return xfeatures, size


def signal_frame(saved: Regs, xstate: bytes, trampoline: int, blocked: int) -> tuple[int, bytes]:
    """(address, bytes) of an x86-64 rt_sigframe below `saved`'s red zone whose first word (the
    return address of our call) is the trampoline, then the ucontext with `saved`'s registers, then
    the FPU state (64-byte aligned, with the signal-frame software bytes and closing magic)."""
    regs = resumed(saved)
    xfeatures, size = frame_features(xstate)
    fp = bytearray(xstate[:size])
    struct.pack_into("<IIQI", fp, FX_SW_OFFSET, XSTATE_MAGIC1, len(fp) + 4, xfeatures, len(fp))
    fp += struct.pack("<I", XSTATE_MAGIC2)
    fp_at = (saved.rsp - RED_ZONE - len(fp)) & ~63
    frame_at = ((fp_at - FRAME_SIZE) & ~15) - 8
    mcontext = struct.pack("<18Q", *(getattr(regs, r) for r in SIGCONTEXT_REGS))
    mcontext += struct.pack("<4H", regs.cs, regs.gs, regs.fs, regs.ss) + bytes(32)  # err..cr2
    mcontext += struct.pack("<Q", fp_at) + bytes(64)
    ucontext = struct.pack("<QQ", UC_FLAGS, 0) + struct.pack("<Qi4xQ", 0, BAD_SS_FLAGS, 0)
    frame = struct.pack("<Q", trampoline) + ucontext + mcontext + struct.pack("<Q", blocked)
    frame += bytes(FRAME_SIZE - len(frame))
    return frame_at, frame + bytes(fp_at - frame_at - len(frame)) + bytes(fp)


def inject(pid: int, payload: bytes) -> None:
    if platform.machine() != "x86_64":
        raise OSError(f"raw injection supports x86_64 only, not {platform.machine()}")
    py = ctypes.pythonapi
    add, run, mmap = (
        target_address(pid, f) for f in (py.Py_AddPendingCall, py.PyRun_SimpleString, libc.mmap)
    )
    trampoline = _address_in(pid, restorer())
    size = (len(payload) + 1 + 4095) & ~4095
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        _inject(_Seized(pid, time.monotonic() + TIMEOUT_S, trampoline), payload, size, add, run, mmap)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _inject(target: _Seized, payload: bytes, size: int, add: int, run: int, mmap: int) -> None:
    _ptrace(PTRACE_SEIZE, target.pid, 0, PTRACE_O_TRACESYSGOOD)
    try:
        target.stop()
        saved, xstate = target.regs(), target.xstate()
        page = target.call(saved, xstate, mmap, [0, size, 3, 0x22, -1, 0], NR_MMAP)  # RW, ANON|PRIVATE
        if not page or page >= 0xFFFFFFFFFFFFF000:
            raise OSError(f"mmap in the target failed ({-(page - (1 << 64)) if page else 'no result'})")
        with open(f"/proc/{target.pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(page)
            mem.write(payload + b"\0")
        back = target.regs()  # the thread's own state again (a restarted syscall set up to rerun)
        target.call(back, target.xstate(), add, [run, page], None)  # its result is lost to the trampoline
        _check_restored(target, resumed(saved), xstate)
    finally:
        target.release()


def same_xstate(a: bytes, b: bytes) -> bool:
    """The same FPU/vector state. The header's XSTATE_BV may differ alone: the CPU marks a component
    back in its init state (AVX after a vzeroupper), and the kernel writes a marked-init component's
    init values into the buffer, so equal bytes everywhere else mean equal state (seen: 6 vs 2)."""
    return (
        len(a) == len(b)
        and a[: XSTATE_BV.start] == b[: XSTATE_BV.start]
        and a[XSTATE_BV.stop :] == b[XSTATE_BV.stop :]
    )


def _check_restored(target: _Seized, want: Regs, xstate: bytes) -> None:
    """The trampoline must have put everything back; if not, put it back by hand and say so."""
    now, fp = target.regs(), target.xstate()
    differ = [r for r in (*SIGCONTEXT_REGS, "cs", "ss") if getattr(now, r) != getattr(want, r)]
    if differ:
        _ptrace(PTRACE_SETREGS, target.pid, 0, ctypes.byref(want))
    if not same_xstate(fp, xstate):
        buf = ctypes.create_string_buffer(xstate, len(xstate))
        iov = _Iovec(ctypes.cast(buf, ctypes.c_void_p), len(xstate))
        _ptrace(PTRACE_SETREGSET, target.pid, NT_X86_XSTATE, ctypes.byref(iov))
        differ.append("fpu")
    if differ:
        print(
            f"warning: rt_sigreturn did not restore {', '.join(differ)} (restored by hand)", file=sys.stderr
        )


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
