"""Batch buffers reused once nothing refers to the batch made in them any more.

A fresh buffer per batch costs a page fault for every 4 KiB page the decoder first writes (the
kernel clears each page before handing it over): 7 % of a NaFlex batch's time on one core. A
pooled buffer goes back to its pool only when the last array or tensor sharing its memory has
been freed, so a batch the caller keeps (or any view of it) is never written again.

How that is known: the memory is a ``bytearray`` that the pool keeps, lent as
``np.frombuffer(memory)``. Every numpy view made from that array keeps it alive (numpy makes
a view's base the first array that does not own its data, and this one's base is the
``bytearray``), ``torch.from_numpy`` keeps it alive for as long as the tensor's storage lives,
and a ``weakref.finalize`` on it hands the memory back. Pinned buffers are not pooled: torch's
caching host allocator already reuses them.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None  # type: ignore[assignment]


class BufferPool:
    """Uninitialised batch buffers, recycled once every reference to a lent one is gone.

    ``keep`` bounds the free buffers held per size, so the memory a pool holds is bounded by
    configuration (the loader's prefetch depth), not by how many batches a caller kept.
    """

    def __init__(self, keep: int) -> None:
        self._keep = max(1, keep)
        self._free: dict[int, list[bytearray]] = {}
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
            memory = bytearray(nbytes)
        lent = np.frombuffer(memory, dtype=dtype)
        weakref.finalize(lent, self._give_back, memory)
        array = lent.reshape(shape)
        return torch.from_numpy(array) if torch is not None else array

    def __getstate__(self) -> dict[str, int]:
        # A loader sent to a spawned DataLoader worker takes an empty pool (and no lock).
        return {"keep": self._keep}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["keep"])  # type: ignore[misc]

    def _give_back(self, memory: bytearray) -> None:
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
    """``(address, bytes)`` of a torch tensor's or a numpy array's memory."""
    if torch is not None and isinstance(buf, torch.Tensor):
        return buf.data_ptr(), buf.numel() * buf.element_size()
    return buf.ctypes.data, buf.nbytes


def lend(core: Any, owner: Any, regions: list[tuple[int, int]]) -> None:
    """Lends a running pipeline (``_core.Loader``, ``BudgetLoader``, ``PackedLoader``) the memory
    of one batch: ``regions`` are ``(address, size)`` pairs, the batch's main buffer first (its
    size in bytes) and at most one second buffer (token rows or position ids: its size, today, a
    count of int64 elements); ``owner`` keeps them alive until the pipeline hands them back. Every
    ``submit`` goes through here, so a change of the binding's signature is made once."""
    (ptr, nbytes), *rest = regions
    core.submit(owner, ptr, nbytes, *(rest[0] if rest else ()))
