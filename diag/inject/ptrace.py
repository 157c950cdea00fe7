"""Injection with ptrace but without gdb: pyinjector loads a small shared library into the target.

The library is hypno's: a constructor that takes the GIL and runs the Python code embedded in the
library file. `hypno.inject_py` writes that file to /tmp; `inject_pyinjector` writes the same
patched copy into the private 0700 directory instead (0600) and calls pyinjector itself.
"""

from __future__ import annotations

import importlib.util
import os

from diag.control import protocol
from diag.inject import InjectFailed
from diag.inject.checks import Target, ptrace_hint

MAGIC = b"--- hypno code start ---"


def _library_with(code: bytes) -> bytes:
    """hypno's injection library with `code` written over its placeholder (as hypno does)."""
    spec = importlib.util.find_spec("hypno.injection")
    if spec is None or spec.origin is None:
        raise InjectFailed("the hypno package is not installed (pip install diag[attach])")
    with open(spec.origin, "rb") as f:
        lib = f.read()
    magic = lib.find(MAGIC)
    end = lib.find(b"\0", magic + len(MAGIC))
    max_size = int(lib[magic + len(MAGIC):end])
    if len(code) > max_size:
        raise InjectFailed(f"payload of {len(code)} bytes exceeds hypno's {max_size}")
    start = magic - 1
    return lib[:start] + code + b"\0" + lib[start + len(code) + 1:]


def _fail(exc: Exception) -> InjectFailed:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__name__ == "LinuxInjectorPermissionError" or "ermission" in text:
        return InjectFailed(f"ptrace not permitted: {ptrace_hint()}")
    return InjectFailed(text)


def inject_pyinjector(target: Target, code: str) -> None:
    try:
        import pyinjector
    except ImportError:
        raise InjectFailed("the pyinjector package is not installed (pip install diag[attach])") from None
    path = protocol.write_private(f"inject-{target.pid}-{os.urandom(8).hex()}.so",
                                  _library_with(code.encode()))
    try:
        pyinjector.inject(target.pid, path, uninject=True)
    except Exception as exc:  # noqa: BLE001 - pyinjector raises several types; each is one line
        raise _fail(exc) from None
    finally:
        os.unlink(path)


def inject_hypno(target: Target, code: str) -> None:
    try:
        import hypno
    except ImportError:
        raise InjectFailed("the hypno package is not installed (pip install diag[attach])") from None
    try:
        hypno.inject_py(target.pid, code, permissions=0o600)
    except Exception as exc:  # noqa: BLE001
        raise _fail(exc) from None
