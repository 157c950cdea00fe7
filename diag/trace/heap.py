"""Hand freed heap pages back to the OS after a big parse (glibc keeps them otherwise)."""

from __future__ import annotations


def release_memory() -> None:
    """Return the heap's free pages to the OS, so that the peak RSS of a many-rank load stays near
    one parsed file plus the frames (a no-op where the C library is not glibc)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
