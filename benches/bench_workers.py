"""A rank read in its own process against ``dataloader(K)`` worker processes, side by side.

``dataloader(K)`` without ``threads=`` now shares the rank's decode threads among its K workers;
before, every worker took the whole share, so K workers ran K times the cores. Three contenders,
each in its own process, taking turns for ``--repeat`` rounds (each keeps its best):

  in process    ``ShardLoader(...)`` iterated in the training process (0 workers, the default
                threads: this process's cores)
  K workers     ``loader.dataloader(K)``, threads left to the default (the share split among the
                K workers)
  K workers, whole share each   the same with ``threads=`` the whole share passed to every
                worker: what the default did before

The job is the square kind's (224 px centre crop, real photos of 256-512 px from
``photo_shards.py``), on all of this machine's cores. Printed: samples/s and each against the
in-process figure.

    python benches/bench_workers.py [--samples 4000] [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from _harness import print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
PER_SHARD = 250
CONTENDERS = ("in-process", "workers", "workers-whole-share")


def run(contender: str, paths: list[str], workers: int) -> int:
    import shardstream
    from shardstream._system import default_loader_threads

    threads = default_loader_threads() if contender == "workers-whole-share" else None
    loader = shardstream.ShardLoader(
        paths, batch_size=64, image_size=224, threads=threads, shuffle_buffer=1, drop_last=False,
        samples_per_epoch=len(paths) * PER_SHARD, rank=0, world_size=1,
    )  # fmt: skip
    batches = loader if contender == "in-process" else loader.dataloader(workers)
    return sum(len(b.keys) for b in batches)


def worker(args: argparse.Namespace) -> None:
    paths = json.loads(args.paths)
    import shardstream.loader  # noqa: F401  (imports are not part of the job)

    start = time.perf_counter()
    n = run(args.worker, paths, args.workers)
    print_result({"samples": n, "seconds": time.perf_counter() - start})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=4000, help=f"rounded up to shards of {PER_SHARD}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    ap.add_argument("--worker")
    ap.add_argument("--paths")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, HERE)
    from photo_shards import build

    shards = max(args.workers, -(-args.samples // PER_SHARD))
    paths = build(args.dir, shards=shards, per_shard=PER_SHARD)
    cores = len(os.sched_getaffinity(0))
    print(f"{shards * PER_SHARD} real photos in {shards} shards; {cores} cores; {args.workers} workers")
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for name in CONTENDERS:
            result = try_worker(__file__, name, {"paths": paths, "workers": args.workers}, timeout=1800)
            if result is not None:
                best[name] = max(best.get(name, 0.0), result["samples"] / result["seconds"])
    base = best.get("in-process")
    for name in CONTENDERS:
        rate = best.get(name)
        ratio = f"{rate / base:.2f}x" if rate and base else "-"
        print(f"  {name:<22} {rate or 0:>9,.0f} samples/s  {ratio} in process")
    print("\nJSON " + json.dumps(best))


if __name__ == "__main__":
    main()
