"""The background checkpoint writer: one write at a time, failures kept, a lower CPU priority."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from shardstream.train.checkpoint_async import WRITER_NICENESS, BackgroundWriter


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_write_and_the_threads_it_starts_run_below_the_training_threads_priority():
    seen: dict[str, int] = {}

    def write() -> None:
        seen["writer"] = niceness()
        # boto3's transfer pool and torch.save's helpers are threads the write starts.
        child = threading.Thread(target=lambda: seen.__setitem__("child", niceness()))
        child.start()
        child.join()

    caller = niceness()
    writer = BackgroundWriter()
    writer.submit("step-1", write)
    assert writer.wait(timeout=30) is None
    assert niceness() == caller  # the training thread keeps its own
    assert seen["writer"] == min(19, caller + WRITER_NICENESS), seen
    assert seen["child"] == seen["writer"], seen


def test_a_failed_write_is_one_line_naming_the_checkpoint_and_is_raised_once():
    writer = BackgroundWriter()

    def write() -> None:
        raise OSError("No space left on device\nsecond line")

    writer.submit("step-00000040.pt", write)
    error = writer.wait(timeout=30)
    assert error == "checkpoint step-00000040.pt: write failed: OSError: No space left on device"
    assert writer.wait(timeout=30) is None
