"""The background checkpoint writer: one write at a time, failures kept, a lower CPU priority."""

from __future__ import annotations

import os
import sys
import threading
from typing import get_args, get_type_hints

import pytest
from shardstream.train.checkpoint_async import WRITER_NICENESS, WRITER_PRIORITIES, BackgroundWriter
from shardstream.train.config import CheckpointConfig


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def priorities_seen(priority: str) -> dict[str, tuple[int, int]]:
    """(scheduling policy, nice) of the write's thread and of a thread the write starts."""
    seen: dict[str, tuple[int, int]] = {}

    def write() -> None:
        seen["writer"] = (policy(), niceness())
        # boto3's transfer pool and torch.save's helpers are threads the write starts.
        child = threading.Thread(target=lambda: seen.__setitem__("child", (policy(), niceness())))
        child.start()
        child.join()

    writer = BackgroundWriter(priority)
    writer.submit("step-1", write)
    assert writer.wait(timeout=30) is None
    return seen


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")


@linux_only
def test_the_default_write_runs_at_idle_policy_and_the_training_thread_keeps_its_own():
    caller = (policy(), niceness())
    seen = priorities_seen(CheckpointConfig().writer_priority)
    assert CheckpointConfig().writer_priority == "idle"
    assert (policy(), niceness()) == caller
    assert seen["writer"][0] == os.SCHED_IDLE, seen
    assert seen["child"] == seen["writer"], seen


@linux_only
def test_a_low_priority_write_runs_nice_levels_below_and_normal_at_the_callers():
    caller = (policy(), niceness())
    low = priorities_seen("low")
    assert low["writer"] == (caller[0], min(19, caller[1] + WRITER_NICENESS)), low
    assert low["child"] == low["writer"], low
    assert priorities_seen("normal")["writer"] == caller


def test_the_priorities_are_the_configs_and_a_wrong_one_is_refused():
    hints = get_type_hints(CheckpointConfig)
    assert get_args(hints["writer_priority"]) == WRITER_PRIORITIES
    with pytest.raises(ValueError, match="checkpoint.writer_priority"):
        BackgroundWriter("realtime")


def test_a_failed_write_is_one_line_naming_the_checkpoint_and_is_raised_once():
    writer = BackgroundWriter()

    def write() -> None:
        raise OSError("No space left on device\nsecond line")

    writer.submit("step-00000040.pt", write)
    error = writer.wait(timeout=30)
    assert error == "checkpoint step-00000040.pt: write failed: OSError: No space left on device"
    assert writer.wait(timeout=30) is None
