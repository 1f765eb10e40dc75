"""Per-step metrics without a per-step host sync.

What a step knows on the host (lr, times, keys) is known at once. What lives on the device (the
loss, the gradient norm, the logit scale, fp16's loss scale and skipped steps) stays there as
0-dim tensors: reading any of them would make the host wait for the step to finish, so that the
CPU could not prepare step n+1 while the device runs step n. ``StepMetrics`` keeps them until a
logging step (every ``log.every_steps``, and before every checkpoint, evaluation, epoch end and
the end of the run), then reads them all in one transfer, the loss's mean over ranks in one
collective. The values are those a per-step read would have given: each step's own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from shardstream.train.dist import DistContext


class StepMetrics:
    """Step records waiting for their device values. ``add`` per step; ``flush`` (a collective:
    every rank calls it at the same steps) returns the completed records, in step order."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._records: list[dict[str, Any]] = []
        self._names: tuple[str, ...] | None = None
        self._values: list[Tensor] = []

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: dict[str, Any], loss: Tensor, **device_values: Tensor | None) -> None:
        """``record``: host values; ``loss``: this rank's loss (0-dim, on the device); the other
        ``device_values`` (None ones left out) are taken as they are on this rank."""
        present = {k: v for k, v in device_values.items() if v is not None}
        names = ("loss", *present)
        if self._names is None:
            self._names = names
        elif names != self._names:
            raise ValueError(f"StepMetrics: every step must give the same values ({self._names} vs {names})")
        # stacked on the device: converting and stacking are queued, nothing is read
        values = [t.detach().reshape(()).to(torch.float64) for t in (loss, *present.values())]
        self._values.append(torch.stack(values))
        self._records.append(record)

    def flush(self) -> list[dict[str, Any]]:
        if not self._records:
            return []
        assert self._names is not None
        values = torch.stack(self._values)  # [steps, names] float64, on the device
        if self.ctx.backend != "nccl":
            values = values.cpu()  # gloo reduces host tensors
        if self.ctx.distributed:
            losses = values[:, 0].contiguous()
            dist.all_reduce(losses)  # the sum over ranks: the same element-wise sum as step by step
            values[:, 0] = losses
        rows = values.cpu().tolist()  # the window's one device-to-host read
        world = self.ctx.world_size
        done = []
        for record, row in zip(self._records, rows, strict=True):
            record = dict(record)
            # the global loss: the mean of the ranks' local losses, as mean_over_ranks gives it
            record["loss"] = row[0] / world if self.ctx.distributed else row[0]
            for name, value in zip(self._names[1:], row[1:], strict=True):
                record[name] = int(value) if name == "skipped_steps" else value
            done.append(record)
        self._records, self._values, self._names = [], [], None
        return done


__all__ = ["StepMetrics"]
