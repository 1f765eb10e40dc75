"""One rank of a torchrun job reading an epoch of video-text CLIP clips, for
tests/test_video_torchrun.py.

Run under torchrun (gloo, CPU, loopback)::

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=W --master-addr=127.0.0.1 \
        --master-port=PORT tests/video_worker.py --out DIR --batch-size B SHARD...

Every rank counts its share of the shards (``count_clips(distributed=True)``: every rank gets
the same counts), builds a ``VideoLoader`` with no rank or world size (it must take them from
torch.distributed), reads the epoch through ``loader.dataloader(--workers)``, does one
all_reduce per batch as DDP's gradient sync would (unequal batch counts fail loudly instead of
passing unnoticed), and writes ``DIR/rank-<r>.json``: every batch's frames shape and dtype, and
per clip its key, its frame numbers and a SHA-256 of its frames. With ``--save-after k`` it takes
``state_dict()`` after k batches and goes on to the end of the epoch, as a trainer checkpoints
mid-epoch; ``--resume-state FILE`` loads such a state first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from shardstream.kinds.video import VideoLoader, count_clips


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shards", nargs="+")
    p.add_argument("--out", required=True, help="directory for rank-<r>.json")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--save-after", type=int, default=None, help="take state_dict() after k batches")
    p.add_argument("--resume-state", default=None, help="a state (JSON) to load before the epoch")
    p.add_argument("--collective-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def clip_digest(frames: Any) -> str:
    """SHA-256 of one clip's frames (a ``[T, 3, S, S]`` uint8 tensor)."""
    return hashlib.sha256(frames.numpy().tobytes()).hexdigest()


def gather_ints(value: int) -> list[int]:
    mine = torch.tensor([value], dtype=torch.int64)
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [int(t.item()) for t in everyone]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = count_clips(args.shards, threads=1, distributed=True)
    loader = VideoLoader(counts, batch_size=args.batch_size, frames=args.frames, size=args.size, threads=1)
    if args.resume_state:
        with open(args.resume_state) as f:
            loader.load_state_dict(json.load(f))
    source = loader.dataloader(args.workers)
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "loader_rank": loader.rank,
        "loader_world_size": loader.world_size,
        "counts": {"identity": counts.identity(), "clips": counts.clips},
        "len": len(source),
        "batches": [],
        "state": None,
    }
    step = torch.ones(1)
    for batch in source:
        frames = batch.frames
        result["batches"].append(
            {
                "shape": list(frames.shape),
                "dtype": str(frames.dtype),
                "keys": list(batch.keys),
                "indices": batch.indices.tolist(),
                "digests": [clip_digest(clip) for clip in frames],
            }
        )
        dist.all_reduce(step)  # what DDP does every step: unequal batch counts break here
        if len(result["batches"]) == args.save_after:
            result["state"] = source.state_dict()
    result["remainder_clips"] = source.stats["remainder_clips"]
    result["all_batch_counts"] = gather_ints(len(result["batches"]))
    path = os.path.join(args.out, f"rank-{rank}.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump(result, f)
    os.replace(f"{path}.tmp", path)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
