"""Mid-epoch checkpoints for open_clip_train, in its own format, with the loader's position.

open_clip_train saves ``{"epoch", "name", "state_dict", "optimizer", "scaler"}`` at epoch ends
only. With ``--save-every-n-steps N`` the adapter saves the same dict every N optimizer steps of
an epoch, plus ``"shardstream": {"epoch", "batches", "loader"}`` (the loader's ``state_dict``),
as ``epoch_{E}_step_{B}.pt`` in the run's checkpoint folder (and ``epoch_latest.pt`` with
``--save-most-recent``); B counts batches (``--accum-freq`` of them per step). ``"epoch"`` is E,
the epoch in progress, so open_clip_train's own ``--resume`` starts that epoch again, and the
adapter makes it continue after batch B:

* open_clip_train's ``pt_load`` is wrapped to keep the checkpoint's ``"shardstream"`` entry (the
  file is read once); ``get_data`` hands it to the loader, which resumes at the exact next batch
  (also on another world size: the rest of the epoch is re-planned exactly once);
* the learning-rate schedule of the resumed epoch is shifted by the B batches already trained,
  since open_clip_train counts the epoch's steps from 0.

The natural sort ``--resume latest`` uses puts ``epoch_1_step_4.pt`` after ``epoch_1.pt`` and before
``epoch_2.pt``: the newest position wins. Every rank reaches the save at the same batch, so the
loader's state is gathered across ranks there (its reserve use, a collective) without a hang;
rank 0 writes the file, to a temporary name first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

CHECKPOINT_KEY = "shardstream"


@dataclass
class ResumeCapture:
    """The ``"shardstream"`` entry of the checkpoint open_clip_train resumed from, if any."""

    entry: dict[str, Any] | None = None

    def wrap_pt_load(self, pt_load: Callable[..., Any]) -> Callable[..., Any]:
        def load(path: str, *args: Any, **kwargs: Any) -> Any:
            checkpoint = pt_load(path, *args, **kwargs)
            if isinstance(checkpoint, dict) and "epoch" in checkpoint:
                self.entry = checkpoint.get(CHECKPOINT_KEY)
            return checkpoint

        return load


def step_checkpoint_name(epoch: int, batches: int) -> str:
    return f"epoch_{epoch}_step_{batches}.pt"


@dataclass
class MidEpochSaver:
    """Saves open_clip_train's checkpoint dict every ``every`` batches of an epoch."""

    every: int
    model: Any
    optimizer: Any
    scaler: Any
    args: Any
    epoch: int
    loader: Any
    num_batches: int
    _previous: str | None = None

    def __call__(self, batches: int) -> None:
        # Every `every` optimizer steps (of --accum-freq batches each), not at the epoch's end
        # (open_clip_train saves that).
        accum = max(1, int(self.args.accum_freq))
        if self.every <= 0 or batches % (self.every * accum) or batches >= self.num_batches:
            return
        state = self.loader.state_dict(gather=True)  # a collective: every rank is here
        if not self.args.save_logs:
            return
        model = getattr(self.model, "_orig_mod", self.model)  # torch.compile's wrapper
        checkpoint: dict[str, Any] = {
            "epoch": self.epoch,
            "name": self.args.name,
            "state_dict": model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            CHECKPOINT_KEY: {"epoch": self.epoch, "batches": batches, "loader": state},
        }
        if self.scaler is not None:
            checkpoint["scaler"] = self.scaler.state_dict()
        folder = self.args.checkpoint_path
        path = os.path.join(folder, step_checkpoint_name(self.epoch, batches))
        _save_atomically(checkpoint, path)
        if self.args.save_most_recent:
            _save_atomically(checkpoint, os.path.join(folder, "epoch_latest.pt"))
        if self.args.delete_previous_checkpoint and self._previous and os.path.exists(self._previous):
            os.remove(self._previous)
        self._previous = path


def _save_atomically(checkpoint: dict[str, Any], path: str) -> None:
    tmp = path + ".tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def wrap_train_one_epoch(train_one_epoch: Callable[..., Any], save_every: int) -> Callable[..., Any]:
    """open_clip_train's ``train_one_epoch`` with the mid-epoch saver attached to the train
    batches and, in an epoch resumed mid-way, the schedule shifted by the batches already done."""

    def run(
        model: Any, data: dict[str, Any], loss: Any, epoch: int, optimizer: Any, scaler: Any,
        scheduler: Any, dist_model: Any, args: Any, tb_writer: Any = None,
    ) -> Any:  # fmt: skip
        batches = data["train"].dataloader
        offset = batches.epoch.resume_offset(epoch)
        if offset and scheduler is not None:
            shift = offset // max(1, int(args.accum_freq))
            original = scheduler

            def scheduler(step: int) -> Any:  # noqa: F811 - the shifted schedule replaces it
                return original(step + shift)

        batches.after_step = MidEpochSaver(
            save_every, model, optimizer, scaler, args, epoch, batches.loader, batches.num_batches
        )
        try:
            return train_one_epoch(
                model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=tb_writer
            )
        finally:
            batches.after_step = None

    return run
