"""Subsets without resharding (``shardstream subset``, ``Source(uids=..., filter=...)``) on a
DataComp-style pool: real photos, a json member per sample with a 128-bit uid, a CLIP-style
similarity and the image size. Every expectation comes from an oracle that reads each json
member with Python's tarfile, independently of shardstream."""

from __future__ import annotations

import json
import random
import tarfile

import numpy as np
import pytest
import shardstream
from corpus import photo_jpegs, tar_bytes, write_file
from shardstream import Source
from shardstream.cli import main as cli
from shardstream.index import build_index, load_index, write_index
from shardstream.subset import parse_filter, subset_index

SHARDS, PER_SHARD = 6, 20
FILTER = "similarity >= 0.28 and width >= 200"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    d = tmp_path_factory.mktemp("pool")
    rng = random.Random(7)
    photos = photo_jpegs(8, seed=3)
    paths = []
    for s in range(SHARDS):
        members = []
        for i in range(PER_SHARD):
            key = f"{s:05d}{i:04d}"
            meta = {
                "uid": f"{rng.getrandbits(128):032x}",
                "similarity": round(rng.uniform(0.1, 0.45), 4),
                "width": rng.choice([64, 180, 256, 512]),
                "caption": f"sample {key}",
            }
            if s == 2 and i == 5:
                del meta["similarity"]  # one sample lacks a filter field
            members += [
                (f"{key}.jpg", photos[(s * PER_SHARD + i) % len(photos)]),
                (f"{key}.txt", meta["caption"].encode()),
                (f"{key}.json", json.dumps(meta).encode()),
            ]
        paths.append(write_file(str(d / f"{s:05d}.tar"), tar_bytes(members)))
    index = write_index(build_index(paths, threads=1), str(d / "pool.index"))
    return d, paths, index


def oracle(paths) -> dict[str, dict]:
    """key -> json metadata, read with tarfile."""
    out = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.endswith(".json"):
                    out[member.name[: -len(".json")]] = json.load(tar.extractfile(member))
    return out


def epoch_keys(index, *, world=1, epoch=0, **kw) -> list[list[str]]:
    per_rank = []
    for rank in range(world):
        loader = shardstream.ShardLoader(
            index=index, batch_size=3, image_size=32, threads=1, rank=rank, world_size=world, **kw
        )
        loader.set_epoch(epoch)
        keys = [k for b in loader for k in b.keys]
        per_rank.append(keys + (loader.stats["remainder_keys"] if rank == 0 else []))
    return per_rank


def test_a_uid_subset_yields_exactly_those_samples_once_per_epoch(pool, tmp_path):
    d, paths, index = pool
    meta = oracle(paths)
    rng = random.Random(1)
    wanted = sorted(rng.sample(sorted(meta), 37))
    # DataComp's subset files: 128-bit uids as pairs of uint64 (high, low), sorted.
    uids = np.array(
        sorted((int(meta[k]["uid"], 16) >> 64, int(meta[k]["uid"], 16) & (2**64 - 1)) for k in wanted),
        dtype=np.uint64,
    )
    np.save(tmp_path / "uids.npy", uids)
    subset, report = subset_index(index, uids=str(tmp_path / "uids.npy"))
    assert (report.by_uids, report.kept, report.considered) == (37, 37, SHARDS * PER_SHARD)
    out = write_index(subset, str(tmp_path / "subset.index"))
    loaded = load_index(out)
    assert loaded.num_valid == 37 and loaded.is_subset
    assert loaded.fingerprint != load_index(index).fingerprint
    for epoch in (0, 1):
        for world in (1, 2):
            keys = [k for rank in epoch_keys(out, world=world, epoch=epoch) for k in rank]
            assert sorted(keys) == wanted, (epoch, world)


def test_a_filter_yields_exactly_the_samples_satisfying_it(pool, tmp_path, capsys):
    d, paths, index = pool
    meta = oracle(paths)
    expected = sorted(
        k for k, m in meta.items() if "similarity" in m and m["similarity"] >= 0.28 and m["width"] >= 200
    )
    assert 10 < len(expected) < len(meta) // 2
    out = str(tmp_path / "filtered.index")
    assert cli(["subset", index, "-o", out, "--filter", FILTER]) == 0
    printed = capsys.readouterr().out
    assert f"kept {len(expected):,} of {len(meta):,} samples" in printed
    assert "field 'similarity' is absent from 1 samples" in printed
    passing_width = sum(m["width"] >= 200 for m in meta.values())
    assert f"filter term 'width >= 200': {passing_width:,} samples pass" in printed
    keys = [k for rank in epoch_keys(out, world=2, shuffle_buffer=4) for k in rank]
    assert sorted(keys) == expected
    # The same through a Source, and a subset of a subset intersects.
    loader = shardstream.ShardLoader(
        sources=[Source(index=out, filter="width >= 512")], batch_size=2, image_size=32, threads=1
    )
    got = sorted([k for b in loader for k in b.keys] + loader.stats["remainder_keys"])
    assert got == sorted(k for k in expected if meta[k]["width"] >= 512)


def test_keys_subset_and_a_mixture_of_subsets(pool, tmp_path):
    d, paths, index = pool
    meta = oracle(paths)
    keys = sorted(meta)[::3]
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    subset, report = subset_index(index, keys=str(tmp_path / "keys.txt"))
    assert report.kept == len(keys)
    assert sorted(k for rank in epoch_keys(subset) for k in rank) == keys
    # Two subsets of the same pool mixed 1:1, with the filter's samples repeating as needed.
    loader = shardstream.ShardLoader(
        sources=[
            Source(index=index, keys=keys, name="keys"),
            Source(index=index, filter="width == 64", name="small"),
        ],
        batch_size=4, image_size=32, threads=1, samples_per_epoch=40,
    )  # fmt: skip
    yielded = [k for batch in loader for k in batch.keys]
    assert all(k in keys or meta[k]["width"] == 64 for k in yielded)
    assert loader.stats["samples_by_source"] == {"keys": 20, "small": 20}
    small = [k for k in yielded if meta[k]["width"] == 64 and k not in keys]
    assert small, "the filtered source is read"


def test_bad_subsets_get_clear_errors(pool, tmp_path):
    d, paths, index = pool
    with pytest.raises(ValueError, match="syntax error at column"):
        parse_filter("similarity >= ")
    with pytest.raises(ValueError, match="Call is not allowed"):
        parse_filter("__import__('os').system('true')")
    with pytest.raises(ValueError, match="names no field"):
        parse_filter("1 < 2")
    (tmp_path / "none.txt").write_text("f" * 32 + "\n")
    with pytest.raises(ValueError, match="none of the 1 uids matches a sample"):
        subset_index(index, uids=str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="names field 'aesthetic', which is absent from all 120 samples"):
        subset_index(index, filter="aesthetic > 5")
    with pytest.raises(ValueError, match="keeps no sample of 120"):
        subset_index(index, filter="width > 100000")
    assert cli(["subset", index, "-o", str(tmp_path / "x.json"), "--filter", FILTER]) == 2
    assert cli(["subset", index, "-o", str(tmp_path / "y")]) == 2


def test_the_parquet_beside_each_shard_gives_the_fields(pool, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d, paths, index = pool
    meta = oracle(paths)
    # As img2dataset writes it: one row per sample, its key, and the metadata columns.
    for path in paths:
        stem = path[: -len(".tar")]
        rows = [
            dict(key=k, width=m["width"], similarity=m.get("similarity"))
            for k, m in meta.items()
            if k[:5] == stem[-5:]
        ]
        pq.write_table(pa.Table.from_pylist(rows), stem + ".parquet")
    subset, report = subset_index(index, filter="width >= 256", metadata="parquet")
    assert report.kept == sum(m["width"] >= 256 for m in meta.values())
    keys = sorted(k for rank in epoch_keys(subset) for k in rank)
    assert keys == sorted(k for k, m in meta.items() if m["width"] >= 256)


@pytest.mark.slow
def test_a_subset_under_torchrun_is_exact_with_workers_and_resume(pool, tmp_path_factory, jobs):
    d, paths, index = pool
    meta = oracle(paths)
    expected = sorted(k for k, m in meta.items() if m["width"] >= 180)
    out = str(tmp_path_factory.mktemp("sub") / "wide.index")
    assert cli(["subset", index, "-o", out, "--filter", "width >= 180", "-q"]) == 0
    args = ["--index", out, "--batch-size", "3", "--workers", "2", "--epochs", "0,1"]
    job = jobs(2, args)
    for epoch in (0, 1):
        per_rank = job.epoch(epoch)
        assert len({len(r["batches"]) for r in per_rank}) == 1
        seen = [k for r in per_rank for b in r["batches"] for k in b]
        remainder = per_rank[0]["stats"]["remainder_keys"]
        assert sorted(seen + remainder) == expected, epoch
        assert len(seen) == len(set(seen))
    state = str(tmp_path_factory.mktemp("state") / "state.json")
    jobs(2, [*args[:-2], "--epochs", "0", "--stop-after", "4", "--save-state", state])
    resumed = jobs(3, [*args[:-2], "--epochs", "0", "--resume-state", state])
    first = jobs.cache[(2, tuple([*args[:-2], "--epochs", "0", "--stop-after", "4", "--save-state", state]))]
    before = [k for r in first.epoch(0) for b in r["batches"] for k in b]
    after = [k for r in resumed.epoch(0) for b in r["batches"] for k in b]
    remainder = resumed.epoch(0)[0]["stats"]["remainder_keys"]
    assert sorted(before + after + remainder) == expected


@pytest.mark.slow
def test_shardstream_subset_under_torchrun_splits_the_shards_and_writes_the_same_subset(pool, tmp_path):
    import train_support

    d, paths, index = pool
    single = str(tmp_path / "single.index")
    assert cli(["subset", index, "-o", single, "--filter", FILTER, "-q"]) == 0
    merged = str(tmp_path / "merged.index")
    run = train_support.torchrun(
        ["subset", index, "-o", merged, "--filter", FILTER, "--threads", "1"],
        module="shardstream",
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("kept ") == 1, "rank 0 alone prints the summary"
    a, b = load_index(single), load_index(merged)
    assert (a.fingerprint, a.num_valid) == (b.fingerprint, b.num_valid)


def test_a_subset_travels_whole_to_spawned_dataloader_workers(pool, tmp_path):
    import pickle

    d, paths, index = pool
    meta = oracle(paths)
    subset, _ = subset_index(index, filter="width >= 256")
    again = pickle.loads(pickle.dumps(subset))
    assert (again.fingerprint, again.num_valid, again.is_subset) == (
        subset.fingerprint,
        subset.num_valid,
        True,
    )
    # Spawned workers (macOS's default) get the loader pickled: they must read the subset, not
    # the whole pool.
    loader = shardstream.ShardLoader(
        sources=[Source(index=index, filter="width >= 256")], batch_size=4, image_size=32, threads=1
    )
    keys = [k for b in loader.dataloader(num_workers=2, multiprocessing_context="spawn") for k in b.keys]
    expected = sorted(k for k, m in meta.items() if m["width"] >= 256)
    assert sorted(keys + loader.stats["remainder_keys"]) == expected
