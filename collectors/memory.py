"""Per-step memory: one `memory` record at each step boundary (an `agent.step_listeners` callback).

On CUDA (only once the job itself has initialized it): allocated / reserved / peak bytes from one
`torch.cuda.memory_stats` call (host-side allocator counters, no synchronization) and the device's
capacity. Process RSS comes from /proc/self/statm on every device (no psutil in the agent).

Peak: by default `peak` is the allocator's running peak (`allocated_bytes.all.peak`), which the agent
never resets, because `torch.cuda.reset_peak_memory_stats` would change what the job's own
`max_memory_allocated()` logging reads. A step's own peak is still exact wherever it matters: when
the running peak rose during step n, step n set it (peak[n] > peak[n-1]); otherwise step n stayed
below it. Option `memory_reset_peak=True` resets the peak at each boundary instead, making `peak` the
step's own peak. A `memory_peak` meta record ("running" / "per_step") says which one a trace holds.
"""

from __future__ import annotations

import os
import time

from diag.collectors import device

from diag import schema
from diag.agent.api import AgentAPI, StepListener
from diag.agent.undo import Undo

NAME = "memory"
PAGE = os.sysconf("SC_PAGE_SIZE")
MEMORY = schema.MEMORY
_now = time.perf_counter_ns
_pread = os.pread


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * PAGE
    except (ValueError, OSError):
        return None


class _Memory:
    """Holds /proc/self/statm open (re-read with pread) and the device capacity once known."""

    def __init__(self, agent: AgentAPI, reset_peak: bool) -> None:
        self.agent = agent
        self.reset_peak = reset_peak
        self.fd: int | None = None
        try:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            pass  # not Linux: rss stays null
        self.capacity: dict[int, int] = {}
        self.cpu_row = ("cpu", None, None, None, physical_memory())
        self.emit = agent.emit  # fixed for the agent's life, as is its module stack (kept in place)
        self.stack = agent.module_stack

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def cuda(self) -> tuple[str, int | None, int | None, int | None, int | None]:
        """(device, allocated, reserved, peak, capacity) from the CUDA allocator's counters (once the
        job initialized CUDA; on CPU `cpu_row`: the host's RAM)."""
        dev = device.backend
        index = dev.current_device()
        stats = dev.memory_stats(index)
        cap = self.capacity.get(index)
        if cap is None:
            cap = self.capacity[index] = dev.total_memory(index)
            name = getattr(dev, "device_name", None)
            if name is not None:  # once per device: the peak-FLOP/s table of `diag analyze` reads it
                self.agent.set_meta("device_name", name(index))
        peak = stats.get("allocated_bytes.all.peak")
        if self.reset_peak:
            dev.reset_peak(index)
        return (
            f"cuda:{index}",
            stats.get("allocated_bytes.all.current"),
            stats.get("reserved_bytes.all.current"),
            peak,
            cap,
        )

    def on_step(self, next_step: int) -> None:
        """Boundary of the step before `next_step`: record what it left and reached. Inline, as
        few lookups as can be (a hook runs cold: each costs ~0.1-1 us there); RSS is the second
        statm field, the first two always within 64 bytes (the rest of the line is not needed)."""
        now = _now()  # agent.now's clock, one call fewer
        dev = device.backend
        name, allocated, reserved, peak, capacity = self.cuda() if dev.ready() else self.cpu_row
        fd = self.fd
        fields = _pread(fd, 64, 0).split(None, 2) if fd is not None else ()
        rss = int(fields[1]) * PAGE if len(fields) > 1 else None
        stack = self.stack
        top = stack[-1] if stack else None
        self.emit((MEMORY, next_step - 1, now, name, allocated, reserved, peak, capacity, rss, top))


def install(agent: AgentAPI, undo: Undo) -> None:
    """Register the per-step listener; close the statm file on undo."""
    state = _Memory(agent, agent.options.memory_reset_peak)
    undo.call(state.close, "memory: close /proc/self/statm")
    listener = StepListener(NAME, "step", state.on_step)
    agent.step_listeners.append(listener)
    undo.call(
        lambda: agent.step_listeners.remove(listener) if listener in agent.step_listeners else None,
        "memory: step listener",
    )
    agent.set_meta("memory_peak", "per_step" if state.reset_peak else "running")
