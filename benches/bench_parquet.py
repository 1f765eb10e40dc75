"""Parquet benchmark, side by side in one run: the loader over Parquet files against the loader
over tars holding the same real-photo JPEGs and captions, per core; Parquet from S3 (SeaweedFS,
tests/servers.py) against local; and the footer rate of `index --no-decode` on many small files.

Targets (issue 21): Parquet per core within 10 % of tars; Parquet from S3 at least 0.9x local;
footers at >= 2,000 files/s from local disk for an index of 100k row groups, in O(row groups)
memory (the peak resident growth while indexing is printed, per row group).

Both loaders run the full job (decode, resize to 224x224) on one core (threads=1, pinned),
alternating, best of --repeat, each repeat's ratio printed; the S3 server runs on the other cores.

    python benches/bench_parquet.py [--shards 8] [--per-shard 300] [--repeat 5] \
        [--footers 5000] [--groups-per-file 20] [--no-s3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import photo_shards  # noqa: E402
from _harness import drop_page_cache, pin, proc_kb, reset_peak, run_worker  # noqa: E402


def to_parquet(tar_path: str, out: str, rows_per_group: int) -> str:
    """The tar's samples as HF `datasets` writes them: an Image struct column, `text`, `key`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys, images, texts = [], [], []
    with tarfile.open(tar_path) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    for name in sorted(n for n in members if n.endswith(".jpg")):
        key = name[:-4]
        keys.append(key)
        images.append({"bytes": members[name], "path": None})
        texts.append(members[key + ".txt"].decode())
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"key": keys, "image": pa.array(images, image_type), "text": texts})
    pq.write_table(table, out, row_group_size=rows_per_group)
    return out


def rate(urls, **kw) -> float:
    import shardstream

    loader = shardstream.ShardLoader(
        urls, batch_size=64, image_size=224, threads=1, drop_last=False, shuffle_buffer=64, **kw
    )
    start = time.perf_counter()
    n = sum(len(b.keys) for b in loader)
    return n / (time.perf_counter() - start)


def main() -> None:
    if sys.argv[1:3] == ["--worker", "footers"]:
        opts = dict(zip(sys.argv[3::2], sys.argv[4::2], strict=True))
        footer_worker(opts["--dir"], int(opts["--threads"]), opts["--cpus"])
        return
    if sys.argv[1:3] == ["--worker", "loader"]:
        opts = dict(zip(sys.argv[3::2], sys.argv[4::2], strict=True))
        loader_worker(opts["--dir"], int(opts["--files"]), opts["--index"])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--footers", type=int, default=5000, help="files in the footer run")
    ap.add_argument("--groups-per-file", type=int, default=20, help="row groups per file in the footer run")
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args()
    pin("[0]")
    cache = os.path.join(tempfile.gettempdir(), "shardstream-bench-photos")
    tars = photo_shards.build(cache, shards=args.shards, per_shard=args.per_shard, seed=21)
    parquets = [to_parquet(t, t[:-4] + ".parquet", 100) for t in tars]
    hf = {"caption_key": "text", "image_keys": ["image"]}
    rate(tars), rate(parquets, **hf)  # untimed: page cache, first allocations
    best_tar = best_pq = 0.0
    for i in range(args.repeat):
        t = rate(tars)
        p = rate(parquets, **hf)
        best_tar, best_pq = max(best_tar, t), max(best_pq, p)
        print(f"repeat {i}: tar {t:.0f}/s, parquet {p:.0f}/s, parquet/tar {p / t:.3f}")
    print(
        f"per core, best of {args.repeat}: tar {best_tar:.0f} samples/s, parquet {best_pq:.0f} samples/s, "
        f"parquet/tar {best_pq / best_tar:.3f}"
    )
    if not args.no_s3:
        from servers import SeaweedS3

        # The server on the other cores (its threads inherit this affinity when it starts),
        # so that it does not take the loader's core
        others = set(range(os.cpu_count() or 1)) - {0}
        os.sched_setaffinity(0, others or {0})
        with tempfile.TemporaryDirectory() as tmp, SeaweedS3(tmp) as server:
            pin("[0]")
            server.upload("parquet-bench", parquets, "hf/")
            os.environ.update(server.env())
            spec = "s3://parquet-bench/hf/*.parquet"
            rate(spec, **hf)  # untimed: the first connections, the server's first reads
            best_s3 = best_local = 0.0
            for i in range(args.repeat):
                s, p = rate(spec, **hf), rate(parquets, **hf)
                best_s3, best_local = max(best_s3, s), max(best_local, p)
                print(f"repeat {i}: s3 {s:.0f}/s, local {p:.0f}/s, s3/local {s / p:.3f}")
            print(f"parquet from S3 {best_s3:.0f} samples/s, local {best_local:.0f} (same repeats)")
            print(f"best s3/local {best_s3 / best_local:.3f}")
    from parquet_corpus import write_img2dataset

    with tempfile.TemporaryDirectory() as tmp:
        tiny = [("k", {"jpg": b"\xff\xd8", "txt": "t"})]
        rows = tiny * (2 * args.groups_per_file)
        files = [
            write_img2dataset(os.path.join(tmp, f"f{i:05d}.parquet"), rows, 2) for i in range(args.footers)
        ]
        os.sync()  # the files' writeback is not the index's work
        groups = len(files) * args.groups_per_file
        print(f"index --no-decode of {len(files)} files, {groups} row groups, each run in a fresh process:")
        # One thread on one core, then what `shardstream index` runs: its default threads on
        # every core
        for threads, cores in ((1, [0]), (0, sorted(range(os.cpu_count() or 1)))):
            for cache in ("cold", "warm"):
                if cache == "cold" and not drop_page_cache():
                    print("  cold page cache: skipped (needs root to write /proc/sys/vm/drop_caches)")
                    continue
                r = run_worker(
                    __file__, "footers", {"dir": tmp, "threads": threads, "cpus": json.dumps(cores)}
                )
                assert r["samples"] == len(files) * len(rows), r
                print(
                    f"  {'one thread, one core' if threads else f'default threads, {len(cores)} cores'}, "
                    f"{cache} page cache: {len(files) / r['elapsed']:.0f} files/s, "
                    f"{groups / r['elapsed']:.0f} row groups/s (footers and key columns); peak resident "
                    f"growth {r['grown'] / 2**20:.1f} MiB, {r['grown'] / groups:.0f} B per row group"
                )
        loader_memory(tmp, len(files), args.groups_per_file)


def loader_memory(directory: str, total: int, groups_per_file: int) -> None:
    """A rank's loader (of 8) over a counts-only index of a tenth of the files and of all."""
    from shardstream.index import build_index, write_index

    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
    rows = []
    for n in (max(1, total // 10), total):
        index = os.path.join(directory, f"index-{n}")
        paths = [os.path.join(directory, f) for f in files[:n]]
        write_index(build_index(paths, decode=False, with_keys=False), index)
        r = run_worker(__file__, "loader", {"dir": directory, "files": n, "index": index})
        rows.append((n, r["grown"]))
    (n0, g0), (n1, g1) = rows
    print(
        "a rank's loader over the index (8 ranks, counts only): "
        + ", ".join(f"{n} files {g / 2**20:.1f} MiB" for n, g in rows)
        + f"; {(g1 - g0) / ((n1 - n0) * groups_per_file):.0f} B per further row group"
    )


def loader_worker(directory: str, n: int, index: str) -> None:
    import shardstream
    import torch  # noqa: F401  (the loader's own import of torch is not the index's memory)

    files = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".parquet"))
    base = reset_peak_rss()
    loader = shardstream.ShardLoader(
        files[:n],
        index=index,
        batch_size=64,
        image_size=32,
        rank=0,
        world_size=8,
        caption_key="caption",
        image_keys=["jpg"],
    )
    loader.set_epoch(0)
    loader.state_dict()
    print(json.dumps({"grown": peak_rss() - base}))


def footer_worker(directory: str, threads: int, cpus: str) -> None:
    """One footer index of every Parquet file in ``directory``; prints its time and memory."""
    import glob

    from shardstream.index import build_index

    pin(cpus)
    files = sorted(glob.glob(os.path.join(directory, "*.parquet")))
    base = reset_peak_rss()
    start = time.perf_counter()
    index = build_index(files, decode=False, threads=threads or None)
    elapsed = time.perf_counter() - start
    print(json.dumps({"elapsed": elapsed, "grown": peak_rss() - base, "samples": index.num_samples}))


def reset_peak_rss() -> int:
    """Resets the process's peak resident size; returns the current one, bytes."""
    reset_peak()
    return proc_kb("VmRSS") * 1024


def peak_rss() -> int:
    return proc_kb("VmHWM") * 1024


if __name__ == "__main__":
    main()
