"""Checkpoint writes on a background thread, one at a time, whose failures are never silent.

The trainer snapshots a checkpoint into host memory at the step boundary and hands the write
(serialise, hash, publish, pointer, prune) to :class:`BackgroundWriter` on rank 0, then trains
on. A new checkpoint first waits for the previous write, so at most one is in flight (and one
snapshot held beside the live state). A failed write is kept and raised as
:class:`CheckpointWriteError`, naming the checkpoint, at the next checkpoint or when the run
ends; the run's end waits for the last write, within ``checkpoint.flush_timeout_s``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, get_args

from shardstream.train.config import WriterPriority


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (or not within the flush bound); names the checkpoint."""


# How much lower than the training thread a "low" writer runs (a nice increment; 19 is the lowest).
WRITER_NICENESS = 10
WRITER_PRIORITIES: tuple[str, ...] = get_args(WriterPriority)


def set_thread_priority(priority: str) -> None:
    """Sets the calling thread's CPU priority (Linux: policy and nice are per thread, and threads
    it starts, such as boto3's upload pool, inherit them). The write serialises, hashes and
    uploads gigabytes on the cores the step's intra-op threads and the loader use. At the
    training thread's priority it takes its share of them out of every step it overlaps, and
    more than its share: a step's parallel region waits for its slowest thread, so one intra-op
    thread pushed off its core stalls them all. ``idle`` (SCHED_IDLE) gives it only the cores
    nothing else wants; ``low`` lowers it by ``WRITER_NICENESS`` nice levels; ``normal`` keeps
    the caller's."""
    get_native_id = getattr(threading, "get_native_id", None)
    if priority == "normal" or get_native_id is None or not hasattr(os, "setpriority"):
        return
    tid = get_native_id()
    try:
        if priority == "idle" and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            lowered = min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICENESS)
            os.setpriority(os.PRIO_PROCESS, tid, lowered)
    except OSError:
        pass  # a sandbox that forbids it: the write runs at the training thread's priority


class BackgroundWriter:
    def __init__(self, priority: WriterPriority = "idle") -> None:
        if priority not in WRITER_PRIORITIES:
            expected = ", ".join(WRITER_PRIORITIES)
            raise ValueError(f"checkpoint.writer_priority: expected one of {expected}, got {priority!r}")
        self._priority = priority
        self._thread: threading.Thread | None = None
        self._what = ""
        self._error: str | None = None
        self._started = 0.0
        self.last_write_s = 0.0  # how long the last completed write took (reported in the log)

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, what: str, write: Callable[[], Any]) -> None:
        """Runs ``write()`` on a new thread; the previous write must have been waited for."""
        assert not self.busy, "one checkpoint write at a time: wait() first"
        self._what, self._started = what, time.perf_counter()

        def run() -> None:
            set_thread_priority(self._priority)
            try:
                write()
                self.last_write_s = time.perf_counter() - self._started
            except BaseException as e:  # noqa: BLE001 - kept and raised on the training thread
                first = (str(e).strip().splitlines() or [""])[0]
                self._error = f"checkpoint {what}: write failed: {type(e).__name__}: {first}"

        # A daemon, so that a write past the flush bound cannot hold the exit beyond it (that exit
        # is an error); every other exit joins it first.
        self._thread = threading.Thread(target=run, name="shardstream-checkpoint-writer", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> str | None:
        """Waits for the write in flight (at most ``timeout`` seconds; None: no bound) and returns
        the failure, if any, as one line (once: it is then cleared)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return (
                    f"checkpoint {self._what}: not written within {timeout:g} s "
                    "(checkpoint.flush_timeout_s); the previous checkpoint is the latest"
                )
            self._thread = None
        error, self._error = self._error, None
        return error


__all__ = ["BackgroundWriter", "CheckpointWriteError", "WRITER_PRIORITIES", "set_thread_priority"]
