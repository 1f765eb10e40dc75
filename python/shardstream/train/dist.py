"""torch.distributed set-up from torchrun's environment, and the few collectives the trainer uses."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardstream.train.config import ConfigError, DistConfig


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: a single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def init_distributed(cfg: DistConfig) -> DistContext:
    """Joins the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT or a c10d
    rendezvous), choosing nccl on CUDA GPUs and gloo on CPU unless the config says otherwise.
    Without torchrun's variables it is a single process with no process group."""
    cuda = torch.cuda.is_available()
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("dist.backend: nccl needs CUDA GPUs, and none is visible; use gloo or auto")
    local_rank = _env_int("LOCAL_RANK", 0)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext(0, 1, 0, 1, device, None)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=cfg.timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
        device=device,
        backend=backend,
    )


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def all_gather(ctx: DistContext, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor (same shape everywhere), on the CPU, in rank order."""
    if not ctx.distributed:
        return [tensor.cpu()]
    local = tensor.to(_comm_device(ctx)).contiguous()
    out = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    return [t.cpu() for t in out]


def all_gather_rows(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenates every rank's rows (counts may differ between ranks) in rank order."""
    if not ctx.distributed:
        return tensor.cpu()
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    counts = [int(c.item()) for c in all_gather(ctx, count)]
    padded = torch.zeros((max(counts), *tensor.shape[1:]), dtype=tensor.dtype)
    padded[: tensor.shape[0]] = tensor.cpu()
    parts = all_gather(ctx, padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)])


def mean_over_ranks(ctx: DistContext, value: torch.Tensor) -> float:
    """The mean of a scalar over all ranks (the global loss from each rank's local loss)."""
    if not ctx.distributed:
        return float(value.item())
    t = value.detach().to(_comm_device(ctx), torch.float64).reshape(1)
    dist.all_reduce(t)
    return float(t.item()) / ctx.world_size


def reduce_over_ranks(ctx: DistContext, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Element-wise sum or max of a small float64 vector over all ranks (on the CPU)."""
    if not ctx.distributed:
        return values.clone()
    t = values.to(_comm_device(ctx), torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.cpu()


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True if the flag is set on any rank (so all ranks take the same branch)."""
    if not ctx.distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=_comm_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
