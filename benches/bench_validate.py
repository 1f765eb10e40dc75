"""`shardstream validate` benchmark: structure-only throughput (GB/s per core) and decode rate,
side by side with the Python way of doing the same job, ratios printed.

Shards: real photographs (scikit-image / scikit-learn wheels) cut and re-encoded as 256-512 px
JPEGs like img2dataset output, with real web alt-text captions and a JSON member; a pool of
distinct photos is tiled into ~1 GB of shards (cached between runs).

  --no-decode, shardstream, 1 thread, 1 core     target >= 1 GB/s per core (header walk)
  --no-decode, shardstream, all cores
  --no-decode, Python tarfile walk, 1 core        what a pure-Python check costs
  --no-decode, the CLI end to end, 1 core         including interpreter start and imports
  decode,      shardstream, 1 thread, 1 core      samples/s
  decode,      shardstream, all cores
  decode,      webdataset + Pillow, 1 core        the open_clip way to find broken images

Each contender runs in its own process pinned with sched_setaffinity; figures are the best of
--repeat runs on a warm page cache (the first pass warms it).

    python benches/bench_validate.py [--gb 1.0] [--decode-samples 2000] [--json results.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

from _harness import pin, print_result, try_worker

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_GB_PER_CORE = 1.0


# -- shards ------------------------------------------------------------------------------------------


def build_shards(directory: str, *, total_bytes: int, shard_bytes: int, pool: int, name: str) -> list[str]:
    """Shards of img2dataset-like samples (jpg + txt + json) up to ``total_bytes``; cached."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from corpus import photo_jpegs
    from shardstream.writer import ShardWriter

    folder = os.path.join(directory, f"{name}-{total_bytes}-{shard_bytes}-{pool}")
    marker = os.path.join(folder, "complete.json")
    if os.path.exists(marker):
        with open(marker) as f:
            return [os.path.join(folder, p) for p in json.load(f)]
    print(f"building {total_bytes / 1e9:.2f} GB of shards in {folder} (once) ...", flush=True)
    images = photo_jpegs(pool, seed=1, min_side=256, max_side=512, quality=90)
    captions = _captions()
    written = 0
    n = 0
    with ShardWriter(os.path.join(folder, "shard-%06d.tar"), max_size=shard_bytes, fsync=False) as writer:
        while written < total_bytes:
            image, caption = images[n % len(images)], captions[n % len(captions)]
            key = f"{n:09d}"
            meta = json.dumps({"key": key, "caption": caption, "width": 0, "height": 0})
            writer.write({"__key__": key, "jpg": image, "txt": caption, "json": meta})
            written += len(image) + len(caption) + len(meta) + 3 * 512
            n += 1
    paths = writer.shards
    with open(marker, "w") as f:
        json.dump([os.path.basename(p) for p in paths], f)
    return paths


def _captions() -> list[str]:
    import pyarrow.parquet as pq

    for base in ("/work/shared", os.path.join(ROOT, "..", "shared")):
        path = os.path.join(base, "data", "img2dataset-test_1000.parquet")
        if os.path.exists(path):
            return [str(t) for t in pq.read_table(path, columns=["TEXT"]).column("TEXT").to_pylist() if t]
    return [f"a photo number {i}" for i in range(1000)]


# -- contenders (each runs in a worker process) -------------------------------------------------------


def run_shardstream(paths: list[str], threads: int, decode: bool) -> dict:
    from shardstream.urls import Shard
    from shardstream.validation import ScanOptions, scan_shards

    shards = [Shard(p, p) for p in paths]
    start = time.perf_counter()
    results = scan_shards(shards, ScanOptions(decode=decode), threads=threads)
    elapsed = time.perf_counter() - start
    invalid = sum(len(r["invalid"]) + bool(r["fatal"]) for r in results)
    if invalid:
        raise RuntimeError(f"{invalid} invalid samples in benchmark shards")
    return {"samples": sum(r["samples"] for r in results), "bytes": sum(r["bytes"] for r in results),
            "seconds": elapsed}  # fmt: skip


def run_tarfile_walk(paths: list[str]) -> dict:
    """Structure check in pure Python: every member read, keys grouped, captions UTF-8."""
    import tarfile

    start = time.perf_counter()
    samples = nbytes = 0
    for path in paths:
        last = None
        with tarfile.open(path) as tar:
            for member in tar:
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                key, ext = member.name.split(".", 1)
                if ext == "txt":
                    data.decode("utf-8")
                if key != last:
                    samples += 1
                    last = key
        nbytes += os.path.getsize(path)
    return {"samples": samples, "bytes": nbytes, "seconds": time.perf_counter() - start}


def run_webdataset_pillow(paths: list[str]) -> dict:
    """Decode every image fully with Pillow, as a webdataset pipeline would to find bad ones."""
    import webdataset as wds
    from PIL import Image

    start = time.perf_counter()
    samples = 0
    for sample in wds.WebDataset(paths, shardshuffle=False):
        with Image.open(io.BytesIO(sample["jpg"])) as im:
            im.convert("RGB")
        sample["txt"].decode("utf-8")
        samples += 1
    nbytes = sum(os.path.getsize(p) for p in paths)
    return {"samples": samples, "bytes": nbytes, "seconds": time.perf_counter() - start}


def run_cli(paths: list[str]) -> dict:
    """The whole command, interpreter start and imports included."""
    cmd = [sys.executable, "-m", "shardstream", "validate", "--no-decode", "--threads", "1", "-q", *paths]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"validate exited {done.returncode}: {done.stdout}{done.stderr}")
    nbytes = sum(os.path.getsize(p) for p in paths)
    return {"samples": 0, "bytes": nbytes, "seconds": elapsed}


def worker(args: argparse.Namespace) -> None:
    paths = json.loads(args.paths)
    pin(args.cpus)
    best = None
    for _ in range(args.repeat):
        if args.worker == "tarfile":
            r = run_tarfile_walk(paths)
        elif args.worker == "webdataset":
            r = run_webdataset_pillow(paths)
        elif args.worker == "cli":
            r = run_cli(paths)
        else:
            _, threads, mode = args.worker.split("-")
            r = run_shardstream(paths, int(threads), decode=mode == "decode")
        if best is None or r["seconds"] < best["seconds"]:
            best = r
    print_result(best)


def warm(paths: list[str]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0, help="structure-only shard set size (default: 1.0)")
    ap.add_argument("--decode-samples", type=int, default=2000, help="decode set size (default: 2000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per contender, best kept (default: 3)")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "shardstream-bench-validate"))
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--worker")
    ap.add_argument("--paths")
    ap.add_argument("--cpus")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    cores = sorted(os.sched_getaffinity(0))
    one = [cores[-1]]
    big = build_shards(args.dir, total_bytes=int(args.gb * 1e9), shard_bytes=128 << 20, pool=400,
                       name="structure")  # fmt: skip
    # The decode set: enough shards for every core to have work (parallelism is per shard).
    decode_bytes = args.decode_samples * 48_000
    decode_paths = build_shards(args.dir, total_bytes=decode_bytes, pool=400, name="decode",
                                shard_bytes=max(1 << 20, decode_bytes // (2 * len(cores))))  # fmt: skip
    warm(big + decode_paths)
    total = sum(os.path.getsize(p) for p in big)
    print(f"structure set: {len(big)} shards, {total / 1e9:.2f} GB; decode set: {len(decode_paths)} shards; "
          f"real-photo JPEGs 256-512 px + caption + json; {len(cores)} cores")  # fmt: skip

    runs = [
        ("no-decode", "shardstream, 1 thread, 1 core", "shardstream-1-structure", big, one),
        ("no-decode", f"shardstream, {len(cores)} threads, {len(cores)} cores",
         f"shardstream-{len(cores)}-structure", big, cores),
        ("no-decode", "Python tarfile walk, 1 core", "tarfile", big, one),
        ("no-decode", "shardstream validate CLI end to end, 1 core", "cli", big, one),
        ("decode", "shardstream, 1 thread, 1 core", "shardstream-1-decode", decode_paths, one),
        ("decode", f"shardstream, {len(cores)} threads, {len(cores)} cores",
         f"shardstream-{len(cores)}-decode", decode_paths, cores),
        ("decode", "webdataset + Pillow decode, 1 core", "webdataset", decode_paths, one),
    ]  # fmt: skip
    results: dict[str, dict] = {}
    for mode, label, name, paths, cpus in runs:
        r = try_worker(__file__, name, {"paths": paths, "cpus": cpus, "repeat": args.repeat}, timeout=3600)
        if r is None:
            continue
        r["gb_per_s"] = r["bytes"] / r["seconds"] / 1e9
        r["samples_per_s"] = r["samples"] / r["seconds"] if r["samples"] else None
        results[f"{mode}: {label}"] = r
        rate = f"{r['gb_per_s']:6.2f} GB/s"
        if r["samples_per_s"]:
            rate += f"  {r['samples_per_s']:10,.0f} samples/s"
        print(f"  {mode:<9} {label:<46} {rate}  ({r['seconds']:.2f} s)", flush=True)

    def ratio(a: str, b: str, key: str) -> float | None:
        if a in results and b in results and results[b][key]:
            return results[a][key] / results[b][key]
        return None

    print()
    one_core = results.get("no-decode: shardstream, 1 thread, 1 core")
    if one_core:
        verdict = "PASS" if one_core["gb_per_s"] >= TARGET_GB_PER_CORE else "FAIL"
        print(f"structure-only per core: {one_core['gb_per_s']:.2f} GB/s "
              f"(target >= {TARGET_GB_PER_CORE} GB/s per core): {verdict}")  # fmt: skip
    summary = {
        "no-decode vs Python tarfile walk (1 core)": ratio(
            "no-decode: shardstream, 1 thread, 1 core", "no-decode: Python tarfile walk, 1 core", "gb_per_s"),
        f"no-decode scaling 1 -> {len(cores)} threads": ratio(
            f"no-decode: shardstream, {len(cores)} threads, {len(cores)} cores",
            "no-decode: shardstream, 1 thread, 1 core", "gb_per_s"),
        "decode vs webdataset + Pillow (1 core)": ratio(
            "decode: shardstream, 1 thread, 1 core", "decode: webdataset + Pillow decode, 1 core",
            "samples_per_s"),
        f"decode scaling 1 -> {len(cores)} threads": ratio(
            f"decode: shardstream, {len(cores)} threads, {len(cores)} cores",
            "decode: shardstream, 1 thread, 1 core", "samples_per_s"),
    }  # fmt: skip
    for label, value in summary.items():
        print(f"  {label}: " + (f"{value:.2f}x" if value else "n/a"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": len(cores), "results": results, "ratios": summary}, f, indent=1)


if __name__ == "__main__":
    main()
