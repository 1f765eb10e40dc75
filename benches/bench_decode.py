"""Side-by-side decode benchmark (DESIGN.md "Performance"), one command, ratios printed.

The same job for every contender, on the same shards of real photos: tar -> 224x224 RGB uint8
(shorter side resized with antialiasing, bicubic, centre crop) + caption.

  webdataset + Pillow          what open_clip does today
  webdataset + pillow-simd     AVX2 build, in its own venv (it replaces PIL); skipped if absent
  simplejpeg decode-only       the libjpeg-turbo ceiling: full-size decode of the same JPEGs
  shardstream, 1 thread        pinned to one core
  shardstream, all cores

Each contender runs in its own process (so peak memory is its own), per-core figures pinned
to one core with sched_setaffinity. Contenders take turns, --repeat rounds of them, and each
keeps its best round (as timeit does): on a shared machine the other processes only ever slow a
round down, and alternating keeps a slow spell from landing on one contender alone.

    python benches/bench_decode.py [--samples 2000] [--repeat 3] [--simd-python PATH]
                                   [--baseline PYTHON_DIR]

``--baseline`` runs another build of shardstream beside this one, 1 thread on 1 core, taking
turns with it: the ``python/`` folder of a worktree at an earlier commit with its extension
built (``cargo build --release --features python --lib``, ``libshardstream.so`` copied to
``python/shardstream/_core.abi3.so``). The ratio printed is this build over that one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 224


def pil_transform(data: bytes):
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    s = SIZE / min(w, h)
    img = img.resize((max(SIZE, round(w * s)), max(SIZE, round(h * s))), Image.BICUBIC)
    w, h = img.size
    left, top = (w - SIZE) // 2, (h - SIZE) // 2
    return np.asarray(img.crop((left, top, left + SIZE, top + SIZE))).transpose(2, 0, 1)


def run_webdataset(paths: list[str]) -> int:
    import webdataset as wds

    n = 0
    ds = (
        wds.WebDataset(paths, shardshuffle=False)
        .to_tuple("jpg", "txt")
        .map_tuple(pil_transform, bytes.decode)
    )
    for img, _text in ds:
        assert img.shape == (3, SIZE, SIZE)
        n += 1
    return n


def run_simplejpeg(paths: list[str]) -> tuple[int, float]:
    """Decode only, full size; the JPEG bytes are read before the clock starts."""
    import tarfile

    import simplejpeg

    blobs = []
    for p in paths:
        with tarfile.open(p) as tf:
            blobs += [tf.extractfile(m).read() for m in tf if m.name.endswith(".jpg")]
    start = time.perf_counter()
    for b in blobs:
        simplejpeg.decode_jpeg(b, colorspace="RGB")
    return len(blobs), time.perf_counter() - start


def run_shardstream(paths: list[str], threads: int) -> int:
    import shardstream

    loader = shardstream.ShardLoader(
        paths, batch_size=64, image_size=SIZE, threads=threads, shuffle_buffer=1, drop_last=False
    )
    n = 0
    for batch in loader:
        n += len(batch.keys)
    return n


def worker(args) -> None:
    paths = json.loads(args.paths)
    pin(args.cpus)
    # Imports (torch comes with webdataset and with our loader) are not part of the job.
    if args.worker == "webdataset":
        import webdataset  # noqa: F401
    elif args.worker.startswith("shardstream"):
        import shardstream.loader  # noqa: F401
    start = time.perf_counter()
    if args.worker == "webdataset":
        n = run_webdataset(paths)
        elapsed = time.perf_counter() - start
    elif args.worker == "simplejpeg":
        n, elapsed = run_simplejpeg(paths)
    else:
        n = run_shardstream(paths, int(args.worker.split("-")[1]))
        elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_result({"samples": n, "seconds": elapsed, "peak_mb": peak})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each contender keeps its best")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench"))
    ap.add_argument(
        "--simd-python",
        default=os.environ.get("PILLOW_SIMD_PYTHON"),
        help="python of a venv with pillow-simd + webdataset",
    )
    ap.add_argument("--baseline", help="python/ folder of another shardstream build, run beside")
    ap.add_argument("--worker")
    ap.add_argument("--paths")
    ap.add_argument("--cpus")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    sys.path.insert(0, HERE)
    import photo_shards

    per_shard = 250
    paths = photo_shards.build(args.dir, shards=max(1, args.samples // per_shard), per_shard=per_shard)
    cores = sorted(os.sched_getaffinity(0))
    one = [cores[-1]]
    print(
        f"{len(paths)} shards x {per_shard} real-photo JPEGs (256-512 px), "
        f"target {SIZE}x{SIZE}; cores: {len(cores)}"
    )
    runs = {
        "webdataset + Pillow (1 core)": (sys.executable, "webdataset", one, None),
        "simplejpeg decode-only ceiling (1 core)": (sys.executable, "simplejpeg", one, None),
        "shardstream, 1 thread (1 core)": (sys.executable, "shardstream-1", one, None),
        f"shardstream, {len(cores)} threads ({len(cores)} cores)": (
            sys.executable,
            f"shardstream-{len(cores)}",
            cores,
            None,
        ),
    }
    if args.simd_python:
        runs["webdataset + pillow-simd AVX2 (1 core)"] = (args.simd_python, "webdataset", one, None)
    if args.baseline:
        env = {"PYTHONPATH": os.path.abspath(args.baseline)}
        runs["baseline shardstream, 1 thread (1 core)"] = (sys.executable, "shardstream-1", one, env)
    rounds: dict[str, list[dict]] = {label: [] for label in runs}
    for _ in range(max(1, args.repeat)):
        for label, (python, name, cpus, env) in runs.items():
            r = try_worker(__file__, name, {"paths": paths, "cpus": cpus}, python=python, env=env)
            if r:
                r["rate"] = r["samples"] / r["seconds"]
                rounds[label].append(r)
    results = {}
    for label, rs in rounds.items():
        if not rs:
            continue
        best = max(rs, key=lambda r: r["rate"])
        best["peak_mb"] = max(r["peak_mb"] for r in rs)
        results[label] = best
        spread = ", ".join(f"{r['rate']:.0f}" for r in rs)
        rate, peak = best["rate"], best["peak_mb"]
        print(f"  {label:48s} {rate:8.1f} samples/s   peak {peak:6.0f} MB   (rounds: {spread})")
    ours1 = results.get("shardstream, 1 thread (1 core)")
    if not ours1:
        return
    print("\nratios (samples/s):")
    for label, r in results.items():
        if "shardstream" not in label or label.startswith("baseline"):
            print(f"  shardstream 1 thread / {label:40s} {ours1['rate'] / r['rate']:5.2f}x")
    for label, r in results.items():
        if label.startswith("shardstream,") and r is not ours1:
            print(f"  {label} / shardstream 1 thread{'':14s} {r['rate'] / ours1['rate']:5.2f}x")


if __name__ == "__main__":
    main()
