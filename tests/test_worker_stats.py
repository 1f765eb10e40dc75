"""Stats across the DataLoader worker queue: each batch carries what changed in its worker's stats
(counter increments, new faults only), and the main process adds them up into the totals that
``loader.stats`` shows, the same as if every worker had sent its whole stats."""

from __future__ import annotations

import pickle

import pytest
import shardstream
import shardstream._workers
from corpus import runtime_corrupt_shards
from shardstream.loader import add_stats_delta, merge_stats, stats_delta

pytest.importorskip("torch")

# Enough failures that a worker's fault list grows over many batches.
CORRUPT = [(0, 1), (0, 4), (0, 8), (1, 0), (1, 5), (1, 9), (2, 2), (2, 3), (2, 7), (3, 6)]
COUNTED = ("samples", "batches", "skipped", "skipped_total", "shard_errors", "replaced", "padded")


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("worker_stats")
    return runtime_corrupt_shards(str(d), shards=4, per_shard=12, corrupt=CORRUPT)


def _loader(dataset) -> shardstream.ShardLoader:
    paths, index = dataset
    return shardstream.ShardLoader(
        paths, index=index, batch_size=2, image_size=32, rank=0, world_size=1, shuffle_buffer=4, threads=1
    )


def _worker_stats_at_last_batch(dataset, worker: int, monkeypatch) -> dict:
    """What DataLoader worker ``worker`` of 2 has counted when it hands out its last batch: the
    same reader, run in this process."""
    loader = _loader(dataset)
    loader.dataset_view(2)
    monkeypatch.setattr(shardstream._workers, "worker", lambda: (worker, 2))
    last: dict = {}
    for _ in loader:
        last = dict(loader._last_stats)
    monkeypatch.undo()
    return last


def _fault_keys(stats: dict) -> list[tuple[str, str]]:
    return sorted((f["key"], f["reason"]) for f in stats["faults"])


def test_main_process_stats_are_the_sum_of_the_workers(corrupt_dataset, monkeypatch):
    expected = merge_stats([_worker_stats_at_last_batch(corrupt_dataset, w, monkeypatch) for w in (0, 1)])
    assert expected["skipped_total"] > 0 and expected["faults"], "the corrupt samples were read"

    loader = _loader(corrupt_dataset)
    keys = [k for batch in loader.dataloader(num_workers=2) for k in batch.keys]
    stats = loader.stats
    assert stats["samples"] == len(keys) == expected["samples"]
    assert {k: stats[k] for k in COUNTED} == {k: expected[k] for k in COUNTED}
    assert _fault_keys(stats) == _fault_keys(expected)
    assert stats["skipped"] == {"corrupt_image": len(stats["faults"])}


def test_a_batch_carries_only_the_new_faults(corrupt_dataset, monkeypatch):
    received: list[dict] = []
    depth = [0]  # add_stats_delta recurses into nested counters: record the top-level calls

    def record(total: dict, delta: dict) -> None:
        if depth[0] == 0:
            received.append(pickle.loads(pickle.dumps(delta)))
        depth[0] += 1
        try:
            add_stats_delta(total, delta)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(shardstream._workers, "add_stats_delta", record)
    loader = _loader(corrupt_dataset)
    batches = sum(1 for _ in loader.dataloader(num_workers=2))
    faults = loader.stats["faults"]
    assert len(received) == batches and len(faults) >= 5

    sent = [f for delta in received for f in delta.get("faults", [])]
    assert sorted(f["key"] for f in sent) == sorted(f["key"] for f in faults), "each fault crosses once"
    quiet = [d for d in received[2:] if "faults" not in d]
    assert quiet, "batches with no new fault carry no fault list"
    # What crosses the queue stays small however many faults were counted before it.
    full = len(pickle.dumps(loader.stats))
    assert max(len(pickle.dumps(d)) for d in quiet) < min(600, full / 2)


def test_deltas_add_up_to_the_stats_they_were_taken_from():
    snapshots = [
        {"samples": 0, "decode_seconds": 0.0, "skipped": {}, "faults": []},
        {"samples": 3, "decode_seconds": 0.5, "skipped": {"corrupt_image": 1}, "faults": [{"key": "a"}]},
        {"samples": 5, "decode_seconds": 0.7, "skipped": {"corrupt_image": 1}, "faults": [{"key": "a"}]},
        {
            "samples": 9,
            "decode_seconds": 1.5,
            "skipped": {"corrupt_image": 2},
            "faults": [{"key": "a"}, {"key": "b"}],
        },
    ]
    sent: dict = {}
    total: dict = {}
    deltas = []
    for snapshot in snapshots:
        deltas.append(stats_delta(snapshot, sent))
        add_stats_delta(total, deltas[-1])
        assert total == snapshot
    assert deltas[0] == snapshots[0], "the first delta names every key"
    assert deltas[2] == {"samples": 2, "decode_seconds": 0.7}
    assert deltas[3]["faults"] == [{"key": "b"}]
