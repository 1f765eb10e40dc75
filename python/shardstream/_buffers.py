"""Batch buffers reused once nothing refers to the batch made in them any more.

A fresh buffer per batch costs a page fault for every 4 KiB page the decoder first writes (the
kernel clears each page before handing it over): 7 % of a NaFlex batch's time on one core. A
pooled buffer goes back to its pool only when the last array or tensor sharing its memory has
been freed, so a batch the caller keeps (or any view of it) is never written again.

How that is known: the memory is a ``bytearray`` or an anonymous ``mmap`` that the pool keeps,
lent as ``np.frombuffer(memory)``. Every numpy view made from that array keeps it alive (numpy
makes a view's base the first array that does not own its data, and this one's base is the
memory object), ``torch.from_numpy`` keeps it alive for as long as the tensor's storage lives,
and a ``weakref.finalize`` on it hands the memory back. Pinned buffers are not pooled: torch's
caching host allocator already reuses them.

A buffer of ``MAP_FROM_BYTES`` or more is an anonymous mapping, whose pages the kernel gives as
they are first written: a region sized for the largest batch (the interleaved kind's pixels:
``max_patches_per_batch`` patches) costs the pages the batches use, where ``bytearray(n)``
writes every byte at once (462 MB of zeros, a fifth of an interleaved pass's instructions, in
the profile of a pass whose patch budget never binds).
"""

from __future__ import annotations

import math
import mmap
import threading
import weakref
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None  # type: ignore[assignment]


#: Buffers from this size on are anonymous mappings, written page by page (see the module's doc).
MAP_FROM_BYTES = 1 << 20


def _fresh(nbytes: int) -> bytearray | mmap.mmap:
    """``nbytes`` of zeroed memory; from ``MAP_FROM_BYTES`` on, none of it touched yet."""
    return mmap.mmap(-1, nbytes) if nbytes >= MAP_FROM_BYTES else bytearray(nbytes)


class BufferPool:
    """Uninitialised batch buffers, recycled once every reference to a lent one is gone.

    ``keep`` bounds the free buffers held per size, so the memory a pool holds is bounded by
    configuration (the loader's prefetch depth), not by how many batches a caller kept.
    """

    def __init__(self, keep: int) -> None:
        self._keep = max(1, keep)
        self._free: dict[int, list[bytearray | mmap.mmap]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: int | tuple[int, ...], dtype: Any, *, pin: bool = False) -> Any:
        """An uninitialised buffer of ``shape`` and numpy ``dtype``: a torch tensor when torch is
        installed (pinned, and then not pooled, with ``pin``), else a numpy array."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if pin and torch is not None:
            return torch.empty(shape, dtype=_TORCH_DTYPES[dtype], pin_memory=True)
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            free = self._free.get(nbytes)
            memory = free.pop() if free else None
        if memory is None:
            memory = _fresh(nbytes)
        lent = np.frombuffer(memory, dtype=dtype)
        weakref.finalize(lent, self._give_back, memory)
        array = lent.reshape(shape)
        return torch.from_numpy(array) if torch is not None else array

    def __getstate__(self) -> dict[str, int]:
        # A loader sent to a spawned DataLoader worker takes an empty pool (and no lock).
        return {"keep": self._keep}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["keep"])  # type: ignore[misc]

    def _give_back(self, memory: bytearray | mmap.mmap) -> None:
        with self._lock:
            free = self._free.setdefault(len(memory), [])
            if len(free) < self._keep:
                free.append(memory)

    def free_buffers(self) -> int:
        """How many buffers wait to be lent again (what tests and memory accounting read)."""
        with self._lock:
            return sum(len(f) for f in self._free.values())


_TORCH_DTYPES: dict[np.dtype, Any] = (
    {}
    if torch is None
    else {
        np.dtype(np.uint8): torch.uint8,
        np.dtype(np.int32): torch.int32,
        np.dtype(np.int64): torch.int64,
    }
)


def address(buf: Any) -> tuple[int, int]:
    """The (address, bytes) of a contiguous torch tensor or numpy array."""
    if torch is not None and isinstance(buf, torch.Tensor):
        return buf.data_ptr(), buf.numel() * buf.element_size()
    return buf.ctypes.data, buf.nbytes


def lend(core: Any, *buffers: Any) -> bool:
    """Lends a running pipeline (``_core.Pipeline``) one batch's buffers, one per region of its
    ``region_bytes`` (None for a region this configuration does not use). The pipeline keeps
    them alive while it may write there; False once it has ended."""
    regions = [address(b) if b is not None else (0, 0) for b in buffers]
    return bool(core.submit(tuple(b for b in buffers if b is not None), regions))
