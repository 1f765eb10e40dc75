"""One rank of a ``_rank_group.RankGroup`` run inside a script that already initialised
torch.distributed, as a training script does, for tests/test_rank_group.py.

Run under torchrun (CPU, loopback) with ``--backend gloo`` (the default group is reused) or
``--backend cpu:gloo`` (a backend spec other than plain gloo: RankGroup makes its own gloo
subgroup, the path it takes under NCCL). Every rank gathers and broadcasts JSON through the
group and writes ``DIR/rank-<r>.json`` with what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from shardstream._rank_group import RankGroup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    with RankGroup(rank, world) as group:
        gathered = group.gather_json({"rank": rank, "text": "x" * rank})
        broadcast = group.broadcast_json({"from": rank, "shards": list(range(3))})
        group_backend = group.backend
    # The caller's default group must outlive the block: the training script goes on with it.
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    record = {
        "default_backend": str(dist.get_backend()),
        "group_backend": group_backend,
        "gathered": gathered,
        "broadcast": broadcast,
        "all_reduce_after": int(total.item()),
    }
    (args.out / f"rank-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
