"""What decoding only what a crop reads saves, one command, ratios printed.

The loader stops a JPEG's decode after the last row its crop's resize reads and skips the IDCT
of blocks outside the crop; validation decodes everything. This times both on the same
real-photo JPEGs as bench_decode.py (decode + resize to 224x224 through ``_core.decode_image``,
bytes already in memory, one core), for centre crops (the decode benchmark's job) and for
random-resized crops at the loader's default scale (0.9-1.0 of the area, open_clip's) and at
torchvision's ImageNet default (0.08-1.0).

    python benches/bench_crop_rows.py [--samples 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def jpegs(paths: list[str]) -> list[bytes]:
    out = []
    for path in paths:
        with tarfile.open(path) as tf:
            for member in tf:
                if member.name.endswith(".jpg"):
                    out.append(tf.extractfile(member).read())
    return out


def rate(blobs: list[bytes], crop: str, scale: tuple[float, float], whole: bool) -> float:
    from shardstream import _core

    start = time.perf_counter()
    for i, data in enumerate(blobs):
        _core.decode_image(data, 224, crop=crop, random_crop_scale=scale, crop_seed=i, whole=whole)
    return len(blobs) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5, help="rounds; each variant keeps its best")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import photo_shards

    per_shard = 250
    paths = photo_shards.build(args.dir, shards=max(1, args.samples // per_shard), per_shard=per_shard)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    blobs = jpegs(paths)
    print(f"{len(blobs)} real-photo JPEGs (256-512 px), 224x224 crops, 1 core; best of {args.repeat} rounds")
    for label, crop, scale in (
        ("centre crops", "center", (1.0, 1.0)),
        ("random crops, scale 0.9-1", "random", (0.9, 1.0)),
        ("random crops, scale 0.08-1", "random", (0.08, 1.0)),
    ):
        # Alternate the two within each round, so that a slow spell of this shared machine does
        # not land on one of them alone.
        best = {True: 0.0, False: 0.0}
        for _ in range(max(1, args.repeat)):
            for whole in (True, False):
                best[whole] = max(best[whole], rate(blobs, crop, scale, whole))
        print(
            f"  {label:27s} whole image {best[True]:6.0f}/s, what the crop reads {best[False]:6.0f}/s"
            f"  -> {best[False] / best[True]:.2f}x"
        )


if __name__ == "__main__":
    main()
