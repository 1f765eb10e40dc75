"""Per-step metrics without a per-step host sync.

What a step knows on the host (lr, times, keys) is known at once. What lives on the device (the
loss, the gradient norm, the logit scale, fp16's loss scale and skipped steps) stays there as
0-dim tensors: reading any of them would make the host wait for the step to finish, so that the
CPU could not prepare step n+1 while the device runs step n. ``StepMetrics`` keeps them until a
logging step (every ``log.every_steps``, and before every checkpoint, evaluation, epoch end and
the end of the run), then reads them all in one transfer, the loss's mean over ranks in one
collective. The values are those a per-step read would have given: each step's own.

The same collective carries each rank's window of host times (its loader wait and input fraction
over the steps since the last flush), so that the logging step's record shows their max and mean
over ranks: rank 0's own figures would hide a starving rank. The window's wall-clock throughput
counts everything between two flushes (checks, logging, evaluation, checkpoints), not steps alone.

On CUDA each step's compute is bracketed by two CUDA events (``begin_compute``/``end_compute``),
read at the flush, when the device has finished them anyway: the window's ``device_idle_s`` is its
wall-clock time minus the events' elapsed compute time, one more window value per rank (max and
mean over ranks). Elsewhere there are no such events, and no such key (not a made-up 0).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from shardstream.train.dist import DistContext

#: Per window, each rank's: the sum of its steps' loader waits, and the part of its step time that
#: was input work. Logged as NAME_max and NAME_mean over ranks (and NAME_max_rank: whose).
WINDOW_NAMES = ("loader_wait_s", "input_frac")
#: On CUDA, one more: the window's wall time the device spent outside the steps' compute.
DEVICE_WINDOW_NAMES = (*WINDOW_NAMES, "device_idle_s")


def window_host_values(records: list[dict[str, Any]]) -> list[float]:
    """This rank's ``WINDOW_NAMES`` over the steps of ``records``."""
    step_time = sum(r["step_time_s"] for r in records)
    input_time = sum(r["input_s"] for r in records)
    return [sum(r["loader_wait_s"] for r in records), input_time / step_time if step_time > 0 else 0.0]


class StepMetrics:
    """Step records waiting for their device values. ``add`` per step; ``flush`` (a collective:
    every rank calls it at the same steps) returns the completed records, in step order."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._records: list[dict[str, Any]] = []
        self._names: tuple[str, ...] | None = None
        self._values: list[Tensor] = []
        self._window_start: float | None = None  # the previous flush (or the first step's start)
        # CUDA events around each step's compute, whose elapsed times give device_idle_s
        self._timed = ctx.device.type == "cuda"
        self.window_names = DEVICE_WINDOW_NAMES if self._timed else WINDOW_NAMES
        self._compute: list[tuple[Any, Any]] = []
        self._compute_start: Any = None

    def begin_compute(self) -> None:
        """Marks, on CUDA, where this step's device work starts on the current stream."""
        if self._timed:
            self._compute_start = torch.cuda.Event(enable_timing=True)
            self._compute_start.record()

    def end_compute(self) -> None:
        """Marks, on CUDA, where this step's device work ends (after ``begin_compute``)."""
        if self._timed and self._compute_start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._compute.append((self._compute_start, end))
            self._compute_start = None

    def _compute_s(self) -> float:
        """The elapsed time of the window's compute events (waits for the last to complete)."""
        if not self._compute:
            return 0.0
        self._compute[-1][1].synchronize()  # the flush reads the device's values next anyway
        seconds = sum(start.elapsed_time(end) for start, end in self._compute) / 1000.0
        self._compute = []
        return seconds

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
        if self._window_start is None:
            self._window_start = time.perf_counter() - record["step_time_s"]

    def flush(self, samples_per_step: int) -> list[dict[str, Any]]:
        """``samples_per_step``: the global batch, for the window's wall-clock throughput."""
        if not self._records:
            return []
        assert self._names is not None and self._window_start is not None
        now = time.perf_counter()
        window_wall_s = now - self._window_start
        self._window_start = now
        values = torch.stack(self._values)  # [steps, names] float64, on the device
        if self.ctx.backend != "nccl":
            values = values.cpu()  # gloo reduces host tensors
        world, rank = self.ctx.world_size, self.ctx.rank
        # one slot per rank for its window values, zero elsewhere: the sum over ranks gathers them
        names = self.window_names
        slots = torch.zeros((world, len(names)), dtype=torch.float64)
        own = window_host_values(self._records)
        if self._timed:
            own.append(max(0.0, window_wall_s - self._compute_s()))
        slots[rank] = torch.tensor(own, dtype=torch.float64)
        slots = slots.to(values.device)
        if self.ctx.distributed:
            # the losses and the slots in one collective: the sum over ranks of the losses is the
            # same element-wise sum as step by step
            packed = torch.cat([values[:, 0], slots.reshape(-1)])
            dist.all_reduce(packed)
            values[:, 0] = packed[: len(values)]
            slots = packed[len(values) :].reshape(world, len(names))
        host = torch.cat([values.reshape(-1), slots.reshape(-1)]).cpu()  # the window's one read
        rows = host[: values.numel()].reshape(values.shape).tolist()
        per_rank = host[values.numel() :].reshape(world, len(names)).tolist()
        done = []
        for record, row in zip(self._records, rows, strict=True):
            record = dict(record)
            # the global loss: the mean of the ranks' local losses, as mean_over_ranks gives it
            record["loss"] = row[0] / world if self.ctx.distributed else row[0]
            for name, value in zip(self._names[1:], row[1:], strict=True):
                record[name] = int(value) if name == "skipped_steps" else value
            done.append(record)
        done[-1].update(window_record(per_rank, len(done) * samples_per_step, window_wall_s, names))
        self._records, self._values, self._names = [], [], None
        return done


#: What each step record contributes to an experiment tracker (TensorBoard, wandb) as
#: ``train/KEY``; the rest of a record are host timings and bookkeeping. Keys a model does not
#: log (``logit_bias`` without SigLIP, ``device_idle_s_*`` off CUDA) are left out per record.
LOGGED_KEYS = (
    "loss",
    "lr",
    "samples_per_s",
    "input_frac",
    "logit_scale",
    "logit_bias",
    "grad_norm",
    "loss_scale",
    "skipped_steps",
    # per logging window, over ranks (window_record)
    "loader_wait_s_max",
    "loader_wait_s_mean",
    "input_frac_max",
    "input_frac_mean",
    "device_idle_s_max",
    "device_idle_s_mean",
    "samples_per_s_wall",
    "samples_per_s_per_device",
)


def window_record(
    per_rank: list[list[float]], samples: int, wall_s: float, names: tuple[str, ...] = WINDOW_NAMES
) -> dict[str, Any]:
    """The window's figures, from ``per_rank`` (one row per rank, ``names`` columns), ``samples``
    trained in it over all ranks, and its wall-clock time."""
    out: dict[str, Any] = {}
    for column, name in enumerate(names):
        values = [row[column] for row in per_rank]
        highest = max(values)
        out[f"{name}_max"] = highest
        out[f"{name}_max_rank"] = values.index(highest)
        out[f"{name}_mean"] = sum(values) / len(values)
    throughput = samples / wall_s if wall_s > 0 else 0.0
    out["samples_per_s_wall"] = throughput
    out["samples_per_s_per_device"] = throughput / len(per_rank)
    out["window_wall_s"] = wall_s
    return out


__all__ = ["DEVICE_WINDOW_NAMES", "WINDOW_NAMES", "StepMetrics", "window_record"]
