"""Memory that DataLoader worker processes free but the C allocator keeps.

Each batch a worker yields is a fresh ``uint8 [B, 3, S, S]`` tensor (several MB) that torch then
copies into shared memory for the main process, so the worker frees one such buffer per batch,
from several threads (the Rust decode threads allocate too). glibc's malloc raises its mmap
threshold to the size of the largest block freed (up to 32 MB), so after the first batch these
buffers come from its arenas instead of fresh mappings, and freed arena memory returns to the
system only when it sits at the top of an arena: the worker's RSS climbs for several epochs to a
plateau that depends on how the frees interleave (measured with ``benches/soak.py``).

:func:`release_memory` hands the free pages back (``malloc_trim(0)``, which walks every arena) and
is cheap at an epoch boundary (milliseconds); it is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

_LIBC: Any = None
_LOOKED_UP = False


def _glibc() -> Any:
    global _LIBC, _LOOKED_UP
    if not _LOOKED_UP:
        _LOOKED_UP = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                libc.malloc_trim.restype = ctypes.c_int
                _LIBC = libc
            except (OSError, AttributeError):  # musl and others: no malloc_trim
                _LIBC = None
    return _LIBC


def release_memory() -> bool:
    """Returns the pages the C allocator holds free to the system; True if it released any."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
