"""The distributed contracts of DESIGN.md under a real torchrun: W processes, gloo on 127.0.0.1,
CPU only. Each job runs tests/dist_worker.py, whose loader takes its rank and world size from
torch.distributed (never passed in); every rank writes the keys of its batches to a JSON file.
test_exact_epochs.py checks the same contracts with ranks simulated in one process."""

from __future__ import annotations

import collections
import json

import pytest
from corpus import (
    good_samples,
    photo_jpegs,
    runtime_corrupt_shards,
    sample_members,
    tar_bytes,
    write_file,
    write_shards,
)
from shardstream.index import build_index, load_index, write_index
from torchrun_jobs import Job, torchrun

pytestmark = pytest.mark.slow

B = 3
# Deliberately uneven, one single-sample shard, and 4 shards: fewer than the 6 readers of W=3, K=2.
COUNTS = [1, 13, 4, 17]
BAD_KEY = "s1_bad"  # rejected by validation, so the index never schedules it


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")

    def edit(i, members):
        if i != 1:
            return members
        # a truncated JPEG in the middle of the shard: invalid in the index
        bad = [(f"{BAD_KEY}.jpg", photo_jpegs(1, seed=9)[0][:300]), (f"{BAD_KEY}.txt", b"cut short")]
        return members[:15] + bad + members[15:]

    paths, keys = write_shards(d, COUNTS, seed=300, edit=edit)
    index = write_index(build_index(paths, threads=1), str(d / "index.json"))
    assert load_index(index).num_valid == len(keys) == sum(COUNTS)
    return paths, keys, index


def loader_args(dataset, *, workers: int, seed: int = 0, epochs=(0, 1), extra=()) -> list[str]:
    paths, _, index = dataset
    return [
        "--index", index, "--batch-size", str(B), "--workers", str(workers), "--seed", str(seed),
        "--epochs", ",".join(map(str, epochs)), *extra, *paths,
    ]  # fmt: skip


def assert_exactly_once(job: Job, epoch: int, keys: list[str], world: int) -> list[str]:
    """Contracts 1 and 2 for one epoch of one job; returns the keys in the order ranks yielded them."""
    per_rank = job.epoch(epoch)
    counts = [len(r["batches"]) for r in per_rank]
    assert len(set(counts)) == 1, f"unequal batch counts per rank: {counts}"
    assert all(r["all_batch_counts"] == counts for r in per_rank)
    assert all(r["len"] == counts[0] for r in per_rank), "len(loader) is the batch count"
    assert all(size == B for r in per_rank for size in r["sizes"]), "drop_last: only full batches"
    seen = [k for r in per_rank for b in r["batches"] for k in b]
    dupes = [k for k, n in collections.Counter(seen).items() if n > 1]
    assert not dupes, f"yielded twice: {dupes}"
    remainders = [r["stats"]["remainder_keys"] for r in per_rank]
    assert all(rem == remainders[0] for rem in remainders), "every rank reports the same remainder"
    remainder = remainders[0]
    assert per_rank[0]["stats"]["remainder"] == len(remainder) < world * B
    assert len(remainder) == len(keys) % (world * B)
    assert sorted(seen + remainder) == sorted(keys), "union is every valid sample minus the remainder"
    assert BAD_KEY not in seen
    return seen


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 0), (3, 2), (2, 2)])
def test_every_valid_sample_once_and_equal_batches(dataset, jobs, world, workers):
    _, keys, _ = dataset
    job = jobs(world, loader_args(dataset, workers=workers, seed=7))
    for epoch in (0, 1):
        assert_exactly_once(job, epoch, keys, world)
        assert len(job.epoch(epoch)[0]["batches"]) == len(keys) // (world * B)


def test_same_seed_same_order_and_fresh_epochs(dataset, jobs):
    _, keys, _ = dataset
    args = loader_args(dataset, workers=2, seed=7)  # the (2, 2) job above, and one more
    first, second = jobs(2, args), jobs(2, args, fresh=True)
    assert first.batches(0) == second.batches(0), "same seed, same epoch: identical keys on every rank"
    assert first.batches(1) == second.batches(1)
    assert first.batches(0) != first.batches(1), "epoch 1 has another order"
    assert_exactly_once(second, 0, keys, 2)


def test_persistent_workers_keep_the_contracts_across_epochs(dataset, jobs):
    """One DataLoader with persistent workers per rank for every epoch, as open_clip makes it:
    each epoch is the one a DataLoader made anew would yield (its workers used to replay epoch 0)."""
    _, keys, _ = dataset
    fresh = jobs(2, loader_args(dataset, workers=2, seed=7))
    persistent = jobs(2, loader_args(dataset, workers=2, seed=7, epochs=(0, 1, 2), extra=("--persistent",)))
    for epoch in (0, 1):
        assert persistent.batches(epoch) == fresh.batches(epoch), f"epoch {epoch}"
    for epoch in (0, 1, 2):
        assert_exactly_once(persistent, epoch, keys, 2)
    orders = [persistent.batches(e) for e in (0, 1, 2)]
    assert orders[0] != orders[1] != orders[2] != orders[0], "every epoch has its own order"


@pytest.mark.parametrize("workers,stop,persistent", [(2, 3, False), (0, 2, False), (2, 2, True)])
def test_resume_in_a_new_job_continues_exactly(dataset, jobs, tmp_path, workers, stop, persistent):
    state_path = str(tmp_path / "state.json")
    full = jobs(2, loader_args(dataset, workers=workers, seed=7))
    stop_args = ("--stop-after", str(stop), "--save-state", state_path)
    if persistent:
        stop_args += ("--persistent",)
    before = jobs(2, loader_args(dataset, workers=workers, seed=7, epochs=(0,), extra=stop_args))
    states = [r["state"] for r in before.ranks]
    assert states[0] == states[1], "identical state on every rank"
    assert len(set(before.ranks[0]["state_hashes"])) == 1
    with open(state_path) as f:
        saved = json.load(f)
    assert saved == states[0] and len(json.dumps(saved)) < 1000
    for r in range(2):
        assert before.batches(0)[r] == full.batches(0)[r][:stop]
    resume_args = ("--resume-state", state_path, *(("--persistent",) if persistent else ()))
    after = jobs(2, loader_args(dataset, workers=workers, seed=7, extra=resume_args))
    for r in range(2):
        assert after.batches(0)[r] == full.batches(0)[r][stop:], f"rank {r} continues with the next batches"
        assert after.batches(1)[r] == full.batches(1)[r], "the next epoch is the uninterrupted run's"


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_on_another_world_size(dataset, jobs, tmp_path, persistent):
    _, keys, _ = dataset
    state_path = str(tmp_path / "state.json")
    stop_args = ("--stop-after", "2", "--save-state", state_path)
    before = jobs(3, loader_args(dataset, workers=2, seed=5, epochs=(0,), extra=stop_args))
    assert len(set(before.ranks[0]["state_hashes"])) == 1
    # Persistent workers carry the elastic plan, then the next epoch's, into their processes.
    after_args = ("--resume-state", state_path, *(("--persistent",) if persistent else ()))
    after = jobs(2, loader_args(dataset, workers=2 if persistent else 0, seed=5, extra=after_args))
    counts = [len(b) for b in after.batches(0)]
    assert len(set(counts)) == 1 and counts[0] > 0, f"unequal batch counts after the elastic resume: {counts}"
    seen = [k for rank in before.batches(0) + after.batches(0) for b in rank for k in b]
    dupes = [k for k, n in collections.Counter(seen).items() if n > 1]
    assert not dupes, f"yielded twice across the resume: {dupes}"
    remainder = after.epoch(0)[0]["stats"]["remainder_keys"]
    assert len(remainder) < 2 * B
    assert sorted(seen + remainder) == sorted(keys), "nothing lost but the reported remainder"
    assert_exactly_once(after, 1, keys, 2)  # the next epoch is whole again, on the new world size


def test_without_index_equal_batches_and_a_warning(dataset, jobs):
    paths, keys, _ = dataset
    job = jobs(2, ["--batch-size", str(B), "--samples-per-epoch", "30", *paths])
    counts = [len(b) for b in job.batches(0)]
    assert counts == [30 // (2 * B)] * 2, counts
    assert all(r["all_batch_counts"] == counts for r in job.epoch(0))
    for result in job.ranks:
        assert result["epochs"]["0"]["stats"]["exact"] is False
        assert any("not exact" in w for w in result["warnings"]), result["warnings"]
    assert {k for b in job.batches(0) for batch in b for k in batch} <= set(keys)


def test_without_index_fewer_shards_than_readers(dataset, jobs):
    paths, keys, _ = dataset
    args = ["--batch-size", str(B), "--samples-per-epoch", "30", "--workers", "2", "--seed", "2", *paths]
    job = jobs(3, args)  # 6 readers, 4 shards, one of them a single sample
    assert [len(b) for b in job.batches(0)] == [30 // (3 * B)] * 3


def test_without_index_or_samples_per_epoch_is_a_clear_error(dataset, tmp_path):
    """The webdataset habit, ``ShardLoader(urls, batch_size=...)`` on 2 ranks: refused when the
    loader is made (not at the first batch), with both ways out in the message."""
    paths, _, _ = dataset
    rc, stdout, stderr, seconds = torchrun(2, ["--batch-size", str(B), *paths], str(tmp_path / "out"))
    assert rc != 0
    assert "OptionError: samples_per_epoch: several readers without an index" in stderr, stderr[-3000:]
    assert "shardstream index URLS -o INDEX" in stderr and "samples_per_epoch=N" in stderr
    # Raised by the constructor: no reader was started, no batch was asked for.
    assert "in __init__" in stderr and "_core_loader" not in stderr and "__iter__" not in stderr
    assert seconds < 120, "failed fast, no hang"


@pytest.fixture(scope="module")
def runtime_corrupt(tmp_path_factory):
    """18 samples in 3 shards; r1_0000's JPEG is cut short, but the index is built without
    decoding, so the plan schedules it and the failure only shows when a rank decodes it."""
    d = tmp_path_factory.mktemp("runtime")
    paths = []
    for i in range(3):
        samples = good_samples(6, seed=400 + i, prefix=f"r{i}_")
        members = [m for k, s in samples for m in sample_members(k, s)]
        if i == 1:
            members[0] = (members[0][0], members[0][1][:400])
        paths.append(write_file(str(d / f"rt-{i}.tar"), tar_bytes(members)))
    index = write_index(build_index(paths, decode=False, threads=1), str(d / "index.json"))
    assert load_index(index).num_valid == 18
    return paths, index


# B=4, W=2: G=8, a remainder of 2 to refill from. B=3, W=3: G=9 divides 18, no reserve: padding.
# With K=2 the rank's one reserve sample goes to the reader that does not meet the corrupt one.
@pytest.mark.parametrize("world,batch,workers", [(2, 4, 0), (3, 3, 0), (2, 4, 2)])
def test_sample_corrupt_at_run_time_keeps_ranks_in_step(runtime_corrupt, jobs, world, batch, workers):
    paths, index = runtime_corrupt
    args = ["--index", index, "--batch-size", str(batch), "--seed", "2", "--workers", str(workers), *paths]
    job = jobs(world, args)
    counts = [len(b) for b in job.batches(0)]
    assert counts == [18 // (world * batch)] * world, f"unequal batch counts (DDP would hang): {counts}"
    assert all(size == batch for r in job.epoch(0) for size in r["sizes"])
    seen = [k for b in job.batches(0) for batch_keys in b for k in batch_keys]
    assert "r1_0000" not in seen
    repeats = [k for k, n in collections.Counter(seen).items() if n > 1]
    assert len(repeats) <= 1, repeats
    for key in repeats:  # padding repeats a sample of the same batch, never one of another rank's
        assert any(b.count(key) == 2 for rank in job.batches(0) for b in rank), key
    stats = [r["stats"] for r in job.epoch(0)]
    assert sum(s["skipped"].get("corrupt_image", 0) for s in stats) == 1, [s["skipped"] for s in stats]
    assert sum(s["replaced"] + s["padded"] for s in stats) == 1
    if sum(s["replaced"] for s in stats):
        assert len(seen) == len(set(seen)), "refilled from the reserve: still nothing twice"
    else:
        assert len(seen) == len(set(seen)) + 1, "no reserve at hand: one repeat, counted as padding"


def test_resume_between_run_time_failures_on_one_rank_uses_each_reserve_sample_once(jobs, tmp_path):
    """W=2, B=4, 30 samples: 3 batches per rank, a reserve of 3 per rank. Two samples of rank 1
    fail when decoded, one before the checkpoint and one after. Rank 0 saves the state, so it
    must hold rank 1's reserve use (gathered): rank 1 then refills the second failure from an
    unused reserve sample, and the resumed job yields exactly the uninterrupted job's batches."""
    from shardstream import ShardLoader

    paths, index = runtime_corrupt_shards(str(tmp_path), shards=3, per_shard=10, corrupt=[(0, 3), (2, 6)])

    def plan_of(seed: int) -> tuple[list[list[list[str]]], list[str]]:
        """The batches of both ranks, simulated in this process (rank and world given)."""
        ranks = []
        for rank in range(2):
            loader = ShardLoader(
                paths, index=index, batch_size=4, image_size=32, seed=seed, rank=rank, world_size=2,
                shuffle_buffer=5, threads=1,
            )  # fmt: skip
            ranks.append([list(b.keys) for b in loader])
        return ranks, loader.stats["remainder_keys"]

    for seed in range(60):  # a seed that puts both failures on rank 1, in different batches
        ranks, reserve = plan_of(seed)
        refilled = [[i for i, b in enumerate(batches) if set(reserve) & set(b)] for batches in ranks]
        if not refilled[0] and len(refilled[1]) == 2:
            break
    else:
        pytest.fail("no seed in range(60) puts both failures in two batches of rank 1")
    stop = refilled[1][0] + 1
    args = ["--index", index, "--batch-size", "4", "--seed", str(seed), *paths]
    full = jobs(2, args)
    assert full.batches(0) == ranks, "torchrun ranks yield what the simulated ranks yield"
    state_path = str(tmp_path / "state.json")
    stop_args = ["--epochs", "0", "--stop-after", str(stop), "--save-state", state_path, "--gather-state"]
    before = jobs(2, args + stop_args)
    assert len(set(before.ranks[0]["state_hashes"])) == 1, "identical state on every rank"
    with open(state_path) as f:
        saved = json.load(f)
    assert saved["phases"][-1]["reserve_used"] == [{"rank": 1, "reader": 0, "used": 1}], saved
    after = jobs(2, args + ["--epochs", "0", "--resume-state", state_path])
    for r in range(2):
        assert before.batches(0)[r] + after.batches(0)[r] == full.batches(0)[r], f"rank {r}"
    seen = [k for job in (before, after) for rank in job.batches(0) for b in rank for k in b]
    assert len(seen) == len(set(seen)) == 2 * 3 * 4
