"""Faults for the trainer's failure drills, kept out of the product (no tests here).

As a callback (``--train.callbacks '[train_faults:KillOnFirstAttempt]'``, with this folder on the
workers' PYTHONPATH): ``SHARDSTREAM_TEST_KILL=RANK:STEP`` SIGKILLs that rank right after that step
(its checkpoint, if due, is written first: the checkpointer runs before configured callbacks),
on torchrun's first attempt only, so the restarted workers run on.
``[train_faults:SlowCheckpointWrites]`` with ``SHARDSTREAM_TEST_SLOW_WRITE_S=SECONDS`` delays
every background checkpoint write by that long.
``[train_faults:StopServerAt]`` with ``SHARDSTREAM_TEST_STOP_SERVER=PGID:STEP``: rank 0 kills
that process group (the S3 server) right after that step, once the checkpoint write in flight
has landed, so that the next checkpoint's write is the one that meets the outage.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from shardstream.train.callbacks import Callback  # noqa: E402


class KillOnFirstAttempt(Callback):
    def __init__(self) -> None:
        rank, step = os.environ["SHARDSTREAM_TEST_KILL"].split(":")
        self.rank, self.step = int(rank), int(step)

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and trainer.ctx.rank == self.rank and trainer.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SlowCheckpointWrites(Callback):
    """``SHARDSTREAM_TEST_SLOW_WRITE_S=SECONDS``: every background checkpoint write first sleeps
    that long, so that a write is still in flight when the next fault strikes."""

    def __init__(self) -> None:
        self.delay_s = float(os.environ["SHARDSTREAM_TEST_SLOW_WRITE_S"])

    def on_train_start(self, trainer: Any) -> None:
        submit, delay_s = trainer.writer.submit, self.delay_s

        def slow_submit(what: str, write: Any) -> None:
            submit(what, lambda: (time.sleep(delay_s), write()))

        trainer.writer.submit = slow_submit


class StopServerAt(Callback):
    def __init__(self) -> None:
        group, step = os.environ["SHARDSTREAM_TEST_STOP_SERVER"].split(":")
        self.group, self.step = int(group), int(step)

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if trainer.ctx.rank == 0 and trainer.step == self.step:
            trainer.writer.wait()  # the earlier checkpoint is complete: the fault hits the next one
            os.killpg(self.group, signal.SIGKILL)


if __name__ == "__main__":
    if os.environ.get("RANK") == os.environ.get("SHARDSTREAM_TEST_STALL_RANK"):
        time.sleep(600)  # torchrun stops it when the other ranks fail
        raise SystemExit(3)
    from shardstream.train.cli import main

    raise SystemExit(main(sys.argv[1:]))
