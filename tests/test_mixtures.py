"""Mixtures (``ShardLoader(sources=[Source(...), ...])``): several indexed datasets in one exact
epoch, each in proportion to its weight. The contracts run under a real torchrun (gloo), as in
test_distributed.py; errors and per-source options run in one process."""

from __future__ import annotations

import collections
import json
import math

import pytest
import shardstream
from corpus import good_samples, photo_jpegs, sample_members, tar_bytes, write_file
from shardstream import Source
from shardstream.index import build_index, write_index

WEIGHTS = {"a": 0.6, "b": 0.3, "c": 0.1}
# Uneven sources: "c" is small enough to repeat within an epoch, "a" too large to be used up.
SHARD_COUNTS = {"a": [70, 55, 75], "b": [40, 50], "c": [30]}
B, W, K = 8, 2, 2
BLOCK = 40  # shuffle_buffer: 5 batches a block


def make_source(directory, name: str, counts: list[int], seed: int) -> tuple[str, list[str]]:
    paths, keys = [], []
    for i, n in enumerate(counts):
        samples = good_samples(n, seed=seed + i, prefix=f"{name}{i}_")
        members = [m for k, s in samples for m in sample_members(k, s)]
        paths.append(write_file(str(directory / f"{name}-{i:02d}.tar"), tar_bytes(members)))
        keys += [k for k, _ in samples]
    return write_index(build_index(paths, threads=1), str(directory / f"index-{name}")), keys


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixture")
    sources, keys = [], {}
    for seed, (name, counts) in enumerate(SHARD_COUNTS.items()):
        index, keys[name] = make_source(d, name, counts, 100 * seed)
        sources.append({"index": index, "weight": WEIGHTS[name], "name": name})
    spec = d / "sources.json"
    spec.write_text(json.dumps(sources))
    return str(spec), sources, keys


def source_of(key: str) -> str:
    return key[0]


def quotas_of(sources) -> dict[str, int]:
    from shardstream.planned_mixture import MixturePlanner

    return MixturePlanner([Source(**s) for s in sources], None).quotas


# -- one process ------------------------------------------------------------------------------


def test_bad_shares_and_sources_get_clear_errors(mixture, tmp_path):
    _, sources, _ = mixture
    index = sources[0]["index"]
    for weight in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="weight must be a positive number"):
            Source(index=index, weight=weight)
    with pytest.raises(ValueError, match="samples_per_epoch must be a positive integer"):
        Source(index=index, samples_per_epoch=0)
    with pytest.raises(ValueError, match="weight or samples_per_epoch, not both"):
        Source(index=index, weight=1.0, samples_per_epoch=5)
    with pytest.raises(ValueError, match="needs an index"):
        Source(urls="/data/{00000..00009}.tar")
    with pytest.raises(ValueError, match="not both"):
        shardstream.ShardLoader("/x.tar", sources=[Source(index=index)], batch_size=2)
    # A source whose every sample is invalid: named, with its counts.
    bad = write_file(
        str(tmp_path / "bad.tar"), tar_bytes([("k.jpg", photo_jpegs(1)[0][:200]), ("k.txt", b"x")])
    )
    empty = write_index(build_index([bad], threads=1), str(tmp_path / "index-empty"))
    with pytest.raises(
        ValueError, match=r"source 'broken': the index schedules no sample: its 1 shards hold 1 samples"
    ):
        shardstream.ShardLoader(
            sources=[Source(index=index), Source(index=empty, name="broken")], batch_size=2
        )
    with pytest.raises(ValueError, match="samples_per_epoch add up to"):
        shardstream.ShardLoader(
            sources=[Source(index=index, samples_per_epoch=500)], batch_size=2, samples_per_epoch=100
        )


def test_fixed_counts_and_epoch_length(mixture):
    _, sources, _ = mixture
    from shardstream.planned_mixture import MixturePlanner

    planner = MixturePlanner(
        [Source(index=sources[0]["index"], samples_per_epoch=50, name="a"),
         Source(index=sources[2]["index"], weight=1.0, name="c")],
        120,
    )  # fmt: skip
    assert planner.quotas == {"a": 50, "c": 70}
    # Default epoch length: every source's valid samples together, shared by weight.
    assert quotas_of(sources) == {"a": 192, "b": 96, "c": 32}


def test_per_source_caption_key_and_samples_by_source(mixture, tmp_path):
    _, sources, keys = mixture
    # A source whose captions are a field of its json member, not a txt member.
    jpegs = photo_jpegs(12, seed=5)
    members = []
    for i, jpg in enumerate(jpegs):
        members += [
            (f"j{i:03d}.jpg", jpg),
            (f"j{i:03d}.json", json.dumps({"caption": f"json caption {i}"}).encode()),
        ]
    shard = write_file(str(tmp_path / "json-captions.tar"), tar_bytes(members))
    jindex = write_index(
        build_index([shard], threads=1, caption_key="json:caption"), str(tmp_path / "index-j")
    )
    mixed = [
        Source(index=sources[1]["index"], name="b"),
        Source(index=jindex, caption_key="json:caption", name="j"),
    ]
    loader = shardstream.ShardLoader(sources=mixed, batch_size=4, image_size=32, threads=1, shuffle_buffer=16)
    texts: dict[str, list[str]] = collections.defaultdict(list)
    for batch in loader:
        for key, text in zip(batch.keys, batch.texts, strict=True):
            texts[key[0]].append(text)
    assert texts["j"] and all(t.startswith("json caption ") for t in texts["j"])
    assert texts["b"] and all(t.startswith("photo number ") for t in texts["b"])
    stats = loader.stats
    assert stats["skipped_total"] == 0
    assert stats["samples_by_source"] == {"b": len(texts["b"]), "j": len(texts["j"])}


def test_dataloader_workers_merge_samples_by_source(mixture):
    _, sources, _ = mixture
    loader = shardstream.ShardLoader(
        sources=[Source(**s) for s in sources], batch_size=B, image_size=32, threads=1, shuffle_buffer=40
    )
    seen = collections.Counter()
    for batch in loader.dataloader(num_workers=2, persistent_workers=True):
        seen.update(source_of(k) for k in batch.keys)
    assert loader.stats["samples_by_source"] == dict(sorted(seen.items()))
    assert sum(seen.values()) == len(loader) * B


# -- torchrun ---------------------------------------------------------------------------------


def mixture_args(spec: str, *, workers: int, epochs=(0, 1), extra=()) -> list[str]:
    return [
        "--sources", spec, "--batch-size", str(B), "--workers", str(workers), "--shuffle-buffer", str(BLOCK),
        "--epochs", ",".join(map(str, epochs)), *extra,
    ]  # fmt: skip


def epoch_samples(job, epoch: int) -> tuple[list[list[list[str]]], list[str]]:
    """(per rank, its batches' keys), and the epoch's remainder keys (the same on every rank)."""
    per_rank = job.epoch(epoch)
    remainders = [r["stats"]["remainder_keys"] for r in per_rank]
    assert all(rem == remainders[0] for rem in remainders)
    return [r["batches"] for r in per_rank], remainders[0]


@pytest.mark.slow
def test_every_global_batch_holds_the_weights_and_sources_continue_across_epochs(mixture, jobs):
    spec, sources, keys = mixture
    quotas = quotas_of(sources)
    job = jobs(W, mixture_args(spec, workers=K))
    epoch_keys = {}
    for epoch in (0, 1):
        ranks, remainder = epoch_samples(job, epoch)
        counts = [len(b) for b in ranks]
        assert len(set(counts)) == 1 and counts[0] == sum(quotas.values()) // (W * B)
        g = W * B
        totals = collections.Counter()
        squared = collections.Counter()
        for n in range(counts[0]):
            batch = collections.Counter(source_of(k) for rank in ranks for k in rank[n])
            for name, w in WEIGHTS.items():
                # Each batch is a uniform draw from a block that holds the exact shares.
                assert abs(batch[name] - g * w) <= 4 * math.sqrt(g * w * (1 - w)) + 1, (n, batch)
                squared[name] += (batch[name] - g * w) ** 2
            totals.update(batch)
        for name, w in WEIGHTS.items():
            # The spread of a source's count over batches is about a binomial draw's, far below
            # what a mixture by whole shards gives (all or nothing of a source per block).
            assert squared[name] / counts[0] <= 3 * g * w * (1 - w), (name, squared[name] / counts[0])
        # Stratified: every shuffle block of every reader (DataLoader worker w yields the rank's
        # batches w, w + K, ...) holds each source's share to within two samples.
        per_block = BLOCK // B
        for rank in ranks:
            for w in range(K):
                mine = rank[w::K]
                for start in range(0, len(mine), per_block):
                    block = collections.Counter(
                        source_of(k) for b in mine[start : start + per_block] for k in b
                    )
                    size = sum(block.values())
                    assert all(abs(block[n] - size * x) <= 2 for n, x in WEIGHTS.items()), block
        yielded = sum(totals.values())
        for name, w in WEIGHTS.items():
            assert abs(totals[name] - yielded * w) <= B, ("within one batch of the weights", totals)
        everything = [k for rank in ranks for b in rank for k in b] + remainder
        by_source = collections.Counter(source_of(k) for k in everything)
        assert by_source == quotas, "the epoch holds each source's quota exactly"
        stats = collections.Counter()
        for r in job.epoch(epoch):
            stats.update(r["stats"]["samples_by_source"])
        assert stats == totals, "stats['samples_by_source'] counts what was yielded"
        epoch_keys[epoch] = everything
    for name in WEIGHTS:
        e0 = [k for k in epoch_keys[0] if source_of(k) == name]
        e1 = [k for k in epoch_keys[1] if source_of(k) == name]
        n = len(keys[name])
        stream = collections.Counter(e0 + e1)
        # Two epochs are the first 2q samples of the source's stream of whole passes: no sample
        # is used a (p+1)-th time before every sample was used p times.
        assert max(stream.values()) - min(stream.get(k, 0) for k in keys[name]) <= 1, name
        if quotas[name] < n:
            # A large source goes on where it stopped: what epoch 0 left out comes first in 1.
            assert set(keys[name]) - set(e0) <= set(e1), name
            assert len(set(e0)) == len(e0), f"{name}: no repeat within one pass"
        else:
            assert set(e0) == set(keys[name]), f"{name}: a small source is used whole every epoch"


@pytest.mark.slow
def test_resume_and_elastic_resume_continue_the_same_mixture(mixture, jobs, tmp_path):
    spec, sources, _ = mixture
    full = jobs(W, mixture_args(spec, workers=K, epochs=(0,)))
    full_ranks, full_remainder = epoch_samples(full, 0)
    whole_epoch = collections.Counter([k for r in full_ranks for b in r for k in b] + full_remainder)
    stop = 3
    state = tmp_path / "state.json"
    first = jobs(
        W,
        mixture_args(
            spec, workers=K, epochs=(0,), extra=["--stop-after", str(stop), "--save-state", str(state)]
        ),
    )
    before = [k for r in epoch_samples(first, 0)[0] for b in r for k in b]
    # The same world size continues with exactly the batches the uninterrupted run yielded.
    same = jobs(
        W, mixture_args(spec, workers=K, epochs=(0,), extra=["--resume-state", str(state)]), fresh=True
    )
    same_ranks, _ = epoch_samples(same, 0)
    assert same_ranks == [r[stop:] for r in full_ranks]
    # Three ranks instead of two: nothing seen twice, nothing lost, the same mixture.
    elastic = jobs(
        3, mixture_args(spec, workers=K, epochs=(0,), extra=["--resume-state", str(state)]), fresh=True
    )
    after_ranks, after_remainder = epoch_samples(elastic, 0)
    after = [k for r in after_ranks for b in r for k in b]
    assert collections.Counter(before + after + after_remainder) == whole_epoch
    totals = collections.Counter(source_of(k) for k in after)
    for name, w in WEIGHTS.items():
        assert abs(totals[name] - len(after) * w) <= B, totals
