"""Exact epochs with an index, in one process per simulated rank (the torchrun tests in
test_distributed.py run the same contracts across real processes)."""

from __future__ import annotations

import collections

import pytest
import shardstream
import torch
from corpus import (
    good_samples,
    photo_jpegs,
    runtime_corrupt_shards,
    sample_members,
    tar_bytes,
    write_file,
    write_shards,
)
from epoch_runs import run
from shardstream.index import build_index, load_index, write_index

COUNTS = [1, 7, 3, 12, 5, 9]  # deliberately uneven, one single-sample shard


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("exact")

    def edit(i, members):
        if i == 3:  # one sample that validation rejects: the index excludes it
            members += [("s3_bad.jpg", photo_jpegs(1)[0][:300]), ("s3_bad.txt", b"truncated jpeg")]
        return members

    paths, keys = write_shards(d, COUNTS, seed=100, edit=edit)
    index_path = write_index(build_index(paths), str(d / "index.json"))
    return paths, keys, index_path


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_valid_sample_exactly_once_with_equal_batches(dataset, world):
    paths, keys, index = dataset
    per_rank = [run(paths, index, rank=r, world=world)[0] for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1, "every rank yields the same number of batches"
    seen = [k for batches in per_rank for b in batches for k in b]
    assert len(seen) == len(set(seen))
    loader = run(paths, index, rank=0, world=world)[2]
    remainder = loader.stats["remainder_keys"]
    assert loader.stats["remainder"] == len(remainder) < world * 4
    assert sorted(seen + remainder) == sorted(keys), "union is the dataset minus the reported remainder"
    assert "s3_bad" not in seen
    assert len(loader) == len(per_rank[0])


def test_deterministic_and_fresh_per_epoch(dataset):
    paths, _, index = dataset
    a = run(paths, index, rank=1, world=2, seed=7)[0]
    assert a == run(paths, index, rank=1, world=2, seed=7)[0]
    assert a != run(paths, index, rank=1, world=2, seed=7, epoch=1)[0]
    assert a != run(paths, index, rank=1, world=2, seed=8)[0]


@pytest.mark.parametrize("stop", [1, 2, 4])
def test_resume_continues_with_the_exact_next_batches(dataset, stop):
    paths, _, index = dataset
    full = run(paths, index, rank=0, world=2, seed=3)[0]
    first, state, _ = run(paths, index, rank=0, world=2, seed=3, stop_after=stop)
    states = [run(paths, index, rank=r, world=2, seed=3, stop_after=stop)[1] for r in range(2)]
    assert states[0] == states[1] == state, "the state is identical on every rank"
    assert len(str(state)) < 1000, "the state is small"
    rest = run(paths, index, rank=0, world=2, seed=3, state=state)[0]
    assert first + rest == full


def test_elastic_resume_onto_another_world_size(dataset):
    paths, keys, index = dataset
    before = [run(paths, index, rank=r, world=3, seed=5, stop_after=1) for r in range(3)]
    state = before[0][1]
    seen = [k for batches, _, _ in before for b in batches for k in b]
    after = [run(paths, index, rank=r, world=2, seed=5, state=state) for r in range(2)]
    assert len({len(b) for b, _, _ in after}) == 1
    seen += [k for batches, _, _ in after for b in batches for k in b]
    assert len(seen) == len(set(seen)), "nothing seen twice"
    remainder = after[0][2].stats["remainder_keys"]
    assert sorted(seen + remainder) == sorted(keys), "nothing lost but the reported remainder"


def test_sample_corrupt_only_at_run_time_keeps_batches_equal(tmp_path):
    paths = []
    for i in range(3):
        samples = good_samples(6, seed=200 + i, prefix=f"r{i}_")
        members = [m for k, s in samples for m in sample_members(k, s)]
        if i == 1:
            members[0] = (members[0][0], members[0][1][:400])  # r1_0000.jpg cut short
        paths.append(write_file(str(tmp_path / f"rt-{i}.tar"), tar_bytes(members)))
    index = write_index(build_index(paths, decode=False), str(tmp_path / "index.json"))  # structural only
    assert load_index(index).num_valid == 18
    results = [run(paths, index, rank=r, world=2, batch=4) for r in range(2)]
    assert [len(b) for b, _, _ in results] == [2, 2]
    assert all(len(batch) == 4 for b, _, _ in results for batch in b)
    stats = [loader.stats for _, _, loader in results]
    assert sum(s["skipped"].get("corrupt_image", 0) for s in stats) == 1
    assert sum(s["replaced"] + s["padded"] for s in stats) == 1
    seen = [k for b, _, _ in results for batch in b for k in batch]
    assert "r1_0000" not in seen


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_between_run_time_failures_uses_each_reserve_sample_once(tmp_path, workers):
    """30 samples, B=8: 3 batches and a reserve of 6 (3 per reader with 2 DataLoader workers).
    Two samples of one reader fail when decoded, one before the checkpoint and one after: the
    resumed run refills the second from a reserve sample the first did not use, so it yields
    exactly the batches of the uninterrupted run."""
    paths, index = runtime_corrupt_shards(str(tmp_path), shards=3, per_shard=10, corrupt=[(0, 3), (2, 6)])
    bad = {"c0_0003", "c2_0006"}

    def batches_of(seed, *, state=None, stop_after=None):
        loader = shardstream.ShardLoader(
            paths, index=index, batch_size=8, image_size=32, seed=seed, rank=0, world_size=1,
            shuffle_buffer=5, threads=1,
        )  # fmt: skip
        if state is not None:
            loader.load_state_dict(state)
        source = loader.dataloader(num_workers=workers) if workers else loader
        out = []
        for b in source:
            out.append(list(b.keys))
            if stop_after is not None and len(out) == stop_after:
                return out, loader.state_dict(), loader
        return out, None, loader

    # A seed whose order puts the two failures in different batches of the same reader (batch b
    # of an uninterrupted run comes from reader b mod K).
    for seed in range(60):
        full, _, loader = batches_of(seed)
        reserve = set(loader.stats["remainder_keys"])
        refilled = [i for i, b in enumerate(full) if reserve & set(b)]
        if len(refilled) == 2 and refilled[0] % max(workers, 1) == refilled[1] % max(workers, 1):
            break
    else:
        pytest.fail("no seed in range(60) puts the two failures in two batches of one reader")
    assert loader.stats["replaced"] == 2 and not bad & {k for b in full for k in b}
    stop = refilled[0] + 1
    first, state, _ = batches_of(seed, stop_after=stop)
    assert state["phases"][-1]["reserve_used"], state
    rest, _, resumed = batches_of(seed, state=state)
    assert first + rest == full
    seen = [k for b in first + rest for k in b]
    assert len(seen) == len(set(seen)) == 24
    assert resumed.stats["replaced"] == 1


def test_dataloader_workers_split_a_rank_exactly(dataset):
    paths, keys, index = dataset
    plain = run(paths, index, rank=0, world=1, batch=3)[0]
    loader = shardstream.ShardLoader(
        paths, index=index, batch_size=3, image_size=32, shuffle_buffer=5, threads=1
    )
    batches = [list(b.keys) for b in loader.dataloader(num_workers=2)]
    assert len(batches) == len(plain) == len(loader)
    got = collections.Counter(k for b in batches for k in b)
    assert got == collections.Counter(k for b in plain for k in b)
    assert max(got.values()) == 1
    assert isinstance(loader.state_dict(), dict) and torch.is_tensor(torch.zeros(1))


def test_persistent_workers_follow_set_epoch_and_resume(dataset):
    """One DataLoader with persistent workers, as open_clip makes it, iterated over three epochs
    and then resumed mid-epoch: its workers must yield each epoch's own order (they used to keep
    the loader copy they were started with and replay epoch 0), and the resumed rest must be the
    batches that follow the state."""
    paths, _, index = dataset

    def fresh_loader():
        return shardstream.ShardLoader(
            paths, index=index, batch_size=3, image_size=32, shuffle_buffer=5, threads=1, seed=3
        )

    def per_epoch_reference(epoch):
        loader = fresh_loader()
        loader.set_epoch(epoch)
        return [list(b.keys) for b in loader.dataloader(num_workers=2)]

    loader = fresh_loader()
    persistent = loader.dataloader(num_workers=2, persistent_workers=True)
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        seen.append([list(b.keys) for b in persistent])
    assert seen == [per_epoch_reference(e) for e in range(3)]
    assert seen[0] != seen[1] != seen[2]

    loader.set_epoch(1)
    first = []
    for b in persistent:
        first.append(list(b.keys))
        if len(first) == 2:
            break
    state = loader.state_dict()
    loader.set_epoch(2)
    assert [list(b.keys) for b in persistent] == seen[2]
    loader.load_state_dict(state)
    rest = [list(b.keys) for b in persistent]
    assert first + rest == seen[1]


@pytest.mark.slow
def test_dataloader_workers_started_by_spawn(dataset):
    """Worker processes started by spawn (what CUDA users must use instead of fork) receive the
    loader pickled, index included, and yield the same batches as forked ones."""
    paths, _, index = dataset

    def batches(context: str) -> list[list[str]]:
        loader = shardstream.ShardLoader(
            paths, index=load_index(index), batch_size=3, image_size=32, shuffle_buffer=5, threads=1
        )
        dataloader = loader.dataloader(num_workers=2, multiprocessing_context=context)
        return [list(b.keys) for b in dataloader]

    forked = batches("fork")
    assert forked and batches("spawn") == forked


def test_index_round_trip_and_mismatched_urls(dataset, tmp_path):
    paths, keys, index = dataset
    idx = load_index(index)
    assert idx.num_samples == len(keys) + 1 and idx.num_valid == len(keys)
    with pytest.raises(ValueError, match="differ"):
        shardstream.ShardLoader(paths[:2], index=index, batch_size=2)
    # urls may be omitted: the index names the shards
    assert run(None, index, rank=0, world=1)[0] == run(paths, index, rank=0, world=1)[0]


def test_index_from_img2dataset_stats_files(tmp_path):
    import json

    from shardstream.index import index_from_img2dataset

    paths, keys = [], []
    for i, n in enumerate([5, 3, 8]):
        samples = good_samples(n, seed=300 + i, prefix=f"i{i}_")
        path = write_file(
            str(tmp_path / f"{i:05d}.tar"), tar_bytes([m for k, s in samples for m in sample_members(k, s)])
        )
        # what img2dataset writes next to each shard
        (tmp_path / f"{i:05d}_stats.json").write_text(
            json.dumps({"count": n + 2, "successes": n, "failed_to_download": 2})
        )
        paths.append(path)
        keys += [k for k, _ in samples]
    index = index_from_img2dataset(paths)
    assert index.num_samples == 16
    per_rank = [run(paths, index, rank=r, world=2, batch=2)[0] for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 4
    seen = [k for batches in per_rank for b in batches for k in b]
    assert sorted(seen) == sorted(keys)
    (tmp_path / "00001_stats.json").unlink()
    with pytest.raises(shardstream.ShardError, match="00001_stats.json"):
        index_from_img2dataset(paths)
