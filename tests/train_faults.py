"""Faults for the trainer's failure drills, kept out of the product (no tests here).

As a callback (``--train.callbacks '[train_faults:KillOnFirstAttempt]'``, with this folder on the
workers' PYTHONPATH): ``SHARDSTREAM_TEST_KILL=RANK:STEP`` SIGKILLs that rank right after that step
(its checkpoint, if due, is written first: the checkpointer runs before configured callbacks),
on torchrun's first attempt only, so the restarted workers run on.

As a script in place of train_clip.py: ``SHARDSTREAM_TEST_STALL_RANK=R`` makes rank R sleep
instead of joining the process group, so the other ranks wait for a peer that never comes.
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


if __name__ == "__main__":
    if os.environ.get("RANK") == os.environ.get("SHARDSTREAM_TEST_STALL_RANK"):
        time.sleep(600)  # torchrun stops it when the other ranks fail
        raise SystemExit(3)
    from shardstream.train.cli import main

    raise SystemExit(main(sys.argv[1:]))
