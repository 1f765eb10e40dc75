"""A group of ranks that share out a scan and gather its results on rank 0: ``shardstream
validate``, ``index`` and ``subset`` under torchrun, and the count passes (``count_tokens``,
``count_interleaved``, ...) run by every rank of a training job. Each rank scans its share, and
rank 0 receives every rank's results to write the one merged report, index or counts.

Results travel as JSON bytes in uint8 tensors over torch.distributed (gloo, CPU only), never as
pickled objects, so a peer can send nothing but data.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")

# Ranks that finish early wait in the gather for the slowest one; validating a large dataset can
# take hours, so the collective timeout must be far longer than torch's 30-minute default.
DEFAULT_TIMEOUT = timedelta(hours=24)


def share(items: Sequence[T], rank: int, world: int) -> list[tuple[int, T]]:
    """This rank's items with their positions: every world-th item, so that ranks get similar
    numbers of shards even when shard sizes drift along the list."""
    return [(i, items[i]) for i in range(rank, len(items), world)]


def needs_gloo_subgroup(default_backend: str) -> bool:
    """Whether the collectives here (CPU tensors) need their own gloo group rather than the
    caller's default group: they do unless that group is plain gloo. NCCL (a training script on
    GPUs) cannot move CPU tensors, and a combined backend such as ``cpu:gloo,cuda:nccl`` is not
    worth parsing when one extra gloo group is always correct."""
    return default_backend != "gloo"


class RankGroup:
    """A gloo process group for the duration of a ``with`` block: the default group, initialised
    here, or the caller's if it already initialised a gloo one, or else (e.g. NCCL inside a
    training script) a gloo subgroup of every rank, created here and destroyed on exit."""

    def __init__(self, rank: int, world: int, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        self.rank = rank
        self.world = world
        self.timeout = timeout
        self._owned = False
        # None: collectives run on the default group.
        self._group: Any = None

    def __enter__(self) -> RankGroup:
        try:
            import torch.distributed as dist
        except ImportError:
            raise RuntimeError(
                f"WORLD_SIZE={self.world}: distributed validation needs torch (torch.distributed with "
                "gloo); install torch or pass --no-distributed to validate everything in this process"
            ) from None
        if not dist.is_available():
            raise RuntimeError("this torch build has no torch.distributed; pass --no-distributed")
        if not dist.is_initialized():
            from shardstream._system import require_rendezvous

            require_rendezvous(self.world)  # srun's tasks without an address: one line, not a hang
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world, timeout=self.timeout)
            self._owned = True
        elif needs_gloo_subgroup(str(dist.get_backend())):
            # Collective over the default group: every rank enters the block, as for init above.
            self._group = dist.new_group(backend="gloo", timeout=self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        if self._owned:
            dist.destroy_process_group()
        elif self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None

    @property
    def backend(self) -> str:
        """The backend the collectives here run on (``gloo`` whenever the block is entered)."""
        import torch.distributed as dist

        return str(dist.get_backend(self._group))

    def gather_json(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` (JSON-serialisable) on rank 0, in rank order; None elsewhere."""
        import torch
        import torch.distributed as dist

        payload = json.dumps(value, separators=(",", ":")).encode()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64), group=self._group)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if self.rank == 0:
            buffers = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world)]
            dist.gather(mine, buffers, dst=0, group=self._group)
            return [
                json.loads(bytes(buf[: int(size.item())].numpy()))
                for buf, size in zip(buffers, sizes, strict=True)
            ]
        dist.gather(mine, None, dst=0, group=self._group)
        return None

    def broadcast_json(self, value: Any) -> Any:
        """Rank 0's ``value`` (JSON-serialisable; ignored elsewhere) on every rank."""
        import torch
        import torch.distributed as dist

        payload = json.dumps(value, separators=(",", ":")).encode() if self.rank == 0 else b""
        length = self.broadcast_int(len(payload))
        buffer = torch.zeros(length, dtype=torch.uint8)
        if self.rank == 0 and payload:
            buffer[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.broadcast(buffer, src=0, group=self._group)
        return json.loads(bytes(buffer.numpy()))

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (also a barrier: nobody exits before rank 0 is done)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=self._group)
        return int(tensor.item())


class SoloGroup:
    """The one-process stand-in for :class:`RankGroup` (rank 0 of 1): the same code runs alone."""

    rank, world = 0, 1

    def __enter__(self) -> SoloGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def gather_json(self, value: Any) -> list[Any]:
        return [value]

    def broadcast_json(self, value: Any) -> Any:
        return value

    def broadcast_int(self, value: int) -> int:
        return value
