"""Decode-thread scaling, 1 -> N threads, for the square and the NaFlex path on the same shards.

How many cores a rank's loader can use before something other than decoding (the reader, the
batch hand-off, Python) stops it: on an 8-GPU node with 128 cores a rank has about 16. The job
is the same as the per-core benchmarks' (``bench_decode.py``: 224 px centre crop;
``bench_naflex.py``: patch 16, 256 patches), on the same real-photo shards (``photo_shards.py``).

Each thread count runs in its own process pinned to that many cores (``threads=T`` on cores
0..T-1), so the figure is what T cores give, not T threads time-sharing fewer. Counts take turns,
``--repeat`` rounds of them, and each keeps its best round. Printed: samples/s, the speed-up over
1 thread and the parallel efficiency (speed-up / T).

    python benches/bench_threads.py [--samples 8000] [--repeat 2] [--threads 1,2,4,8,16]

Thread counts above this machine's cores are left out, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
PER_SHARD = 250
SQUARE_SIZE = 224
PATCH, MAX_PATCHES = 16, 256
KINDS = ("square", "naflex")


def run_loader(kind: str, paths: list[str], threads: int) -> int:
    import shardstream
    from shardstream.kinds import NaFlex

    sample = {"naflex": NaFlex(patch_size=PATCH, max_num_patches=MAX_PATCHES)}.get(kind)
    options = {"sample": sample} if sample is not None else {"image_size": SQUARE_SIZE}
    loader = shardstream.ShardLoader(
        paths, batch_size=64, threads=threads, shuffle_buffer=1, drop_last=False, **options
    )
    n = 0
    for batch in loader:
        n += len(batch.keys)
    return n


def worker(args: argparse.Namespace) -> None:
    paths = json.loads(args.paths)
    pin(args.cpus)
    import shardstream.loader  # noqa: F401  (imports are not part of the job)

    kind, threads = args.worker.split("-")
    start = time.perf_counter()
    n = run_loader(kind, paths, int(threads))
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_result({"samples": n, "seconds": elapsed, "peak_mb": peak})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8000, help=f"rounded up to shards of {PER_SHARD}")
    ap.add_argument("--repeat", type=int, default=2, help="rounds; each thread count keeps its best")
    ap.add_argument("--threads", default="1,2,4,8,16", help="comma-separated thread counts")
    ap.add_argument("--kinds", default=",".join(KINDS), help="square, naflex or both")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    ap.add_argument("--worker")
    ap.add_argument("--paths")
    ap.add_argument("--cpus")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    cores = sorted(os.sched_getaffinity(0))
    wanted = [int(t) for t in args.threads.split(",")]
    counts = [t for t in wanted if t <= len(cores)]
    if len(counts) < len(wanted):
        print(f"left out (more than this machine's {len(cores)} cores): {sorted(set(wanted) - set(counts))}")
    kinds = [k for k in args.kinds.split(",") if k]
    for kind in kinds:
        if kind not in KINDS:
            sys.exit(f"--kinds: {kind!r} is not one of {', '.join(KINDS)}")

    sys.path.insert(0, HERE)
    from photo_shards import build

    shards = max(1, -(-args.samples // PER_SHARD))
    paths = build(args.dir, shards=shards, per_shard=PER_SHARD)
    print(
        f"{shards * PER_SHARD} real-photo JPEGs (256-512 px) in {shards} shards; {len(cores)} cores; "
        f"square {SQUARE_SIZE} px, NaFlex patch {PATCH} / {MAX_PATCHES} patches; best of {args.repeat}"
    )

    best: dict[tuple[str, int], dict] = {}
    for _ in range(args.repeat):
        for kind in kinds:
            for t in counts:
                result = try_worker(
                    __file__, f"{kind}-{t}", {"paths": paths, "cpus": cores[:t]}, timeout=1800
                )
                if result is None:
                    continue
                rate = result["samples"] / result["seconds"]
                if rate > best.get((kind, t), {}).get("rate", 0.0):
                    best[(kind, t)] = {**result, "rate": rate}

    table = []
    for kind in kinds:
        one = best.get((kind, 1), {}).get("rate")
        print(f"\n{kind}:")
        print(f"  {'threads':>7}  {'samples/s':>10}  {'x 1 thread':>10}  {'efficiency':>10}  {'peak MB':>8}")
        for t in counts:
            r = best.get((kind, t))
            if r is None:
                print(f"  {t:>7}  failed")
                continue
            speedup = r["rate"] / one if one else float("nan")
            print(
                f"  {t:>7}  {r['rate']:>10,.0f}  {speedup:>9.2f}x  {speedup / t:>9.0%}  {r['peak_mb']:>8.0f}"
            )
            table.append(
                {
                    "kind": kind,
                    "threads": t,
                    "samples_per_s": r["rate"],
                    "speedup": speedup,
                    "peak_mb": r["peak_mb"],
                    "samples": r["samples"],
                }
            )
    print("\nJSON " + json.dumps(table))


if __name__ == "__main__":
    main()
