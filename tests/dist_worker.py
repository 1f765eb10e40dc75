"""One rank of a real distributed ShardLoader run, for tests/test_distributed.py.

Run under torchrun (gloo, CPU, loopback)::

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=W --master-addr=127.0.0.1 \
        --master-port=PORT tests/dist_worker.py --out DIR --index INDEX --batch-size B SHARD...

The loader gets no rank or world size: it must take them from torch.distributed. Every rank
iterates the given epochs (directly, or through ``loader.dataloader(num_workers=K)``, made anew each
epoch or, with ``--persistent``, once with persistent workers), does one
all_reduce per batch as DDP's gradient sync would (so unequal batch counts fail loudly instead of
passing unnoticed), and writes ``DIR/rank-<r>.json`` with the keys of every batch. With
``--stop-after n`` it stops after n batches of the first epoch and takes ``state_dict()``; the
ranks all_gather a hash of it (no pickle: a tensor of hashes) and rank 0 writes the state as JSON
to ``--save-state``. ``--resume-state`` loads such a state before the first epoch. ``--sources
FILE`` (a JSON list of ``shardstream.Source`` fields) mixes several indexed datasets instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from shardstream import ShardLoader, Source


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shards", nargs="*", help="shard paths (default: the index's)")
    p.add_argument("--out", required=True, help="directory for rank-<r>.json")
    p.add_argument("--index", default=None)
    p.add_argument("--sources", default=None, help="JSON file: a list of Source fields (a mixture)")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--workers", type=int, default=0, help="0: iterate the loader in this process")
    p.add_argument(
        "--persistent", action="store_true", help="one DataLoader with persistent workers for every epoch"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--caption-key", default=None, help="a caption member or Parquet column")
    p.add_argument("--image-keys", default=None, help="comma-separated image members or columns")
    p.add_argument("--epochs", default="0", help="comma-separated epochs, e.g. 0,1")
    p.add_argument("--shuffle-buffer", type=int, default=5)
    p.add_argument("--samples-per-epoch", type=int, default=None)
    p.add_argument("--stop-after", type=int, default=None, help="batches of the first epoch, then save state")
    p.add_argument("--save-state", default=None)
    p.add_argument("--resume-state", default=None)
    p.add_argument("--gather-state", action="store_true", help="state_dict(gather=True): a collective")
    p.add_argument("--collective-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def state_hash(state: dict[str, Any]) -> int:
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def gather_ints(value: int) -> list[int]:
    mine = torch.tensor([value], dtype=torch.int64)
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [int(t.item()) for t in everyone]


def write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, sort_keys=True, default=str)
    os.replace(tmp, path)


def run_epoch(iterable: Any, stop_after: int | None, batch_size: int) -> dict[str, Any]:
    batches: list[list[str]] = []
    sizes: list[int] = []
    it = iter(iterable)
    step = torch.ones(1)
    try:
        for batch in it:
            assert batch.images.shape[1:] == (3, 32, 32), batch.images.shape
            assert len(batch.keys) == len(batch.texts) == batch.images.shape[0] <= batch_size
            batches.append(list(batch.keys))
            sizes.append(int(batch.images.shape[0]))
            dist.all_reduce(step)  # what DDP does every step: unequal batch counts break here
            if stop_after is not None and len(batches) == stop_after:
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return {"batches": batches, "sizes": sizes, "len": len(iterable)}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sources = None
        if args.sources:
            with open(args.sources) as f:
                sources = [Source(**fields) for fields in json.load(f)]
        loader = ShardLoader(
            args.shards or None,
            index=args.index,
            sources=sources,
            batch_size=args.batch_size,
            image_size=32,
            seed=args.seed,
            shuffle_buffer=args.shuffle_buffer,
            threads=1,
            samples_per_epoch=args.samples_per_epoch,
            **({"caption_key": args.caption_key} if args.caption_key else {}),
            **({"image_keys": args.image_keys.split(",")} if args.image_keys else {}),
        )
        result: dict[str, Any] = {
            "rank": rank,
            "world_size": world,
            "loader_rank": loader.rank,
            "loader_world_size": loader.world_size,
            "epochs": {},
        }
        persistent = (
            loader.dataloader(num_workers=args.workers, persistent_workers=True) if args.persistent else None
        )
        for i, epoch in enumerate(int(e) for e in args.epochs.split(",")):
            if i == 0 and args.resume_state:
                with open(args.resume_state) as f:
                    loader.load_state_dict(json.load(f))  # the state names the epoch
            else:
                loader.set_epoch(epoch)
            stop = args.stop_after if i == 0 else None
            if persistent is not None:
                iterable = persistent
            else:
                iterable = loader.dataloader(num_workers=args.workers) if args.workers else loader
            record = run_epoch(iterable, stop, args.batch_size)
            record["epoch"] = loader.epoch
            record["stats"] = loader.stats
            record["all_batch_counts"] = gather_ints(len(record["batches"]))
            result["epochs"][str(loader.epoch)] = record
            if stop is not None:
                state = loader.state_dict(gather=args.gather_state)
                result["state"] = state
                result["state_hashes"] = gather_ints(state_hash(state))
                if rank == 0 and args.save_state:
                    write_json(args.save_state, state)
    result["warnings"] = [str(w.message) for w in caught]
    result["seconds"] = time.monotonic() - started
    write_json(os.path.join(args.out, f"rank-{rank}.json"), result)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
