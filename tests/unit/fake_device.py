"""A fake device behind the collectors' device seam (diag.collectors.device): CUDA "in use" on a CPU
machine, timing events from a test's fake event class, allocated bytes from a test's counter."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from diag.collectors import device


class FakeDevice:
    def __init__(self, event_cls: Callable[..., Any], allocated: Callable[[], int] = lambda: 0) -> None:
        self.event_cls, self.allocated = event_cls, allocated

    def ready(self) -> bool:
        return True

    def timer(self) -> device.CudaTimer:
        return device.CudaTimer(self.event_cls)

    def memory_allocated(self) -> int:
        return self.allocated()


@contextlib.contextmanager
def installed(fake: Any) -> Iterator[Any]:
    """`fake` is the device seam's backend inside the block; the previous one after it."""
    old = device.use(fake)
    try:
        yield fake
    finally:
        device.use(old)
