"""The pending-call injection library (pending.c): compiled on first use, cached, patched per attach.

Compiled with the system C compiler into the per-user private 0700 directory, named by the hash of
the source and the flags, so each user builds it once per diag version. `-z now` makes dlopen()
fail cleanly, instead of the target aborting later, if the target lacks the two C API symbols.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

from diag.control import protocol

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pending.c")
FLAGS = ["-shared", "-fPIC", "-O0", "-Wl,-z,now"]
PENDING_MAGIC = b"--- diag pending-call payload ---"
HYPNO_MAGIC = b"--- hypno code start ---"
COMPILE_TIMEOUT_S = 60


class NoCompiler(Exception):
    """No working C compiler: the caller falls back to a riskier library and says so."""


def pending_library() -> bytes:
    """The compiled pending-call library's bytes (built once per source hash)."""
    with open(SOURCE, "rb") as f:
        src = f.read()
    digest = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    path = os.path.join(protocol.runtime_dir(), f"pending-{digest}.so")
    if not os.path.exists(path):
        _compile(path)
    with open(path, "rb") as f:
        return f.read()


def _compile(path: str) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise NoCompiler("no C compiler (cc, gcc or clang) on PATH")
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"  # ranks attached in parallel race here
    try:
        proc = subprocess.run(
            [cc, *FLAGS, "-o", tmp, SOURCE],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NoCompiler(f"{cc} failed: {e}") from None
    if proc.returncode != 0:
        raise NoCompiler(f"{cc} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def patched(lib: bytes, magic: bytes, code: bytes, max_size: int) -> bytes:
    """`lib` with `code` (NUL-terminated) written over the placeholder that starts with `magic`."""
    start = lib.find(magic)
    if start < 0:
        raise ValueError("placeholder not found in the injection library")
    if len(code) >= max_size:
        raise ValueError(f"payload of {len(code)} bytes exceeds the library's {max_size - 1}")
    return lib[:start] + code + b"\0" + lib[start + len(code) + 1 :]


def pending_with(code: bytes) -> bytes:
    return patched(pending_library(), PENDING_MAGIC, code, 4096)


def hypno_with(code: bytes) -> bytes:
    """hypno's library (takes the GIL in the hijacked thread: the last resort) with `code`."""
    import importlib.util

    spec = importlib.util.find_spec("hypno.injection")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the hypno package is not installed (pip install diag[attach])")
    with open(spec.origin, "rb") as f:
        lib = f.read()
    magic = lib.find(HYPNO_MAGIC)
    end = lib.find(b"\0", magic + len(HYPNO_MAGIC))
    max_size = int(lib[magic + len(HYPNO_MAGIC) : end])
    return patched(lib, lib[magic - 1 : magic + len(HYPNO_MAGIC)], code, max_size + 1)
