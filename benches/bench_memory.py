"""Loader memory does not grow with shard size: peak RSS of streaming a 20 MB shard and a
2 GB shard (same photos, same loader settings), each in its own process.

    python benches/bench_memory.py [--big-mb 2048] [--small-mb 20]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def write_shard(path: str, megabytes: int) -> str:
    if os.path.exists(path):
        return path
    sys.path.insert(0, HERE)
    import photo_shards

    (src,) = photo_shards.build(os.path.dirname(path), shards=1, per_shard=200, seed=11)
    with tarfile.open(src) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf]
    target, n, written = megabytes << 20, 0, 0
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as out:
        while written < target:
            for name, data in members:
                stem, ext = name.split(".", 1)
                info = tarfile.TarInfo(f"{n:09d}-{stem}.{ext}")
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
                written += len(data) + 512
            n += 1
    os.replace(tmp, path)
    return path


def measure(path: str) -> None:
    import shardstream

    start = time.perf_counter()
    loader = shardstream.ShardLoader(
        path, batch_size=64, image_size=224, shuffle_buffer=1000, drop_last=False
    )
    samples = sum(len(b.keys) for b in loader)
    print(
        json.dumps(
            {
                "samples": samples,
                "seconds": time.perf_counter() - start,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mb", type=int, default=2048)
    ap.add_argument("--small-mb", type=int, default=20)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    ap.add_argument("--measure")
    args = ap.parse_args()
    if args.measure:
        return measure(args.measure)
    os.makedirs(args.dir, exist_ok=True)
    results = {}
    for mb in (args.small_mb, args.big_mb):
        path = write_shard(os.path.join(args.dir, f"mem-{mb}mb.tar"), mb)
        out = subprocess.run(
            [sys.executable, __file__, "--measure", path],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[mb] = r
        print(
            f"  {os.path.getsize(path) / 2**20:7.0f} MB shard: {r['samples']:6d} samples "
            f"in {r['seconds']:6.1f} s, peak RSS {r['peak_mb']:6.0f} MB"
        )
    ratio = results[args.big_mb]["peak_mb"] / results[args.small_mb]["peak_mb"]
    print(
        f"peak memory, {args.big_mb} MB shard / {args.small_mb} MB shard: {ratio:.2f}x "
        "(shuffle_buffer=1000, batch 64x3x224x224)"
    )


if __name__ == "__main__":
    main()
