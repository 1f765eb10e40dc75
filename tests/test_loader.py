"""ShardLoader in one process and under a torch DataLoader: real photo shards, real decode."""

from __future__ import annotations

import random

import numpy as np
import pytest
import shardstream
import torch
from corpus import good_samples, photo_jpegs, sample_members, tar_bytes, write_file
from pillow_reference import pillow_reference
from shardstream.errors import ShardError


def make_shards(tmp_path, counts, *, seed=0):
    paths, captions = [], {}
    for i, n in enumerate(counts):
        samples = good_samples(n, seed=seed + i, prefix=f"sh{i}_")
        captions.update({k: s["txt"] for k, s in samples})
        paths.append(
            write_file(
                str(tmp_path / f"shard-{i:03d}.tar"),
                tar_bytes([m for k, s in samples for m in sample_members(k, s)]),
            )
        )
    return paths, captions


def all_keys(loader):
    return [k for batch in loader for k in batch.keys]


def test_batches_shape_dtype_captions_and_every_sample_once(tmp_path):
    paths, captions = make_shards(tmp_path, [7, 5, 9])
    loader = shardstream.ShardLoader(paths, batch_size=4, image_size=64, drop_last=False, threads=2)
    seen = []
    for batch in loader:
        assert isinstance(batch.images, torch.Tensor) and batch.images.dtype == torch.uint8
        assert batch.images.shape[1:] == (3, 64, 64) and batch.images.shape[0] == len(batch.keys)
        assert batch.texts == [captions[k] for k in batch.keys]
        assert batch.images.float().std() > 10  # real photo content, not an empty buffer
        seen += batch.keys
    assert sorted(seen) == sorted(captions)
    assert loader.stats["samples"] == 21 and loader.stats["skipped_total"] == 0


def test_pixels_are_the_decode_of_the_right_sample(tmp_path):
    paths, _ = make_shards(tmp_path, [6])
    by_key = {k: s["jpg"] for k, s in good_samples(6, seed=0, prefix="sh0_")}
    import io

    from PIL import Image

    for batch in shardstream.ShardLoader(paths, batch_size=3, image_size=96, seed=5):
        for img, key in zip(batch.images, batch.keys, strict=True):
            ref = pillow_reference(Image.open(io.BytesIO(by_key[key])), 96)
            assert np.abs(img.numpy().astype(int) - ref.astype(int)).mean() < 3.0


def test_drop_last_reports_the_remainder(tmp_path):
    paths, captions = make_shards(tmp_path, [10])
    loader = shardstream.ShardLoader(paths, batch_size=4, image_size=32)
    keys = all_keys(loader)
    assert len(keys) == 8
    assert loader.stats["remainder"] == 2
    assert sorted(keys + loader.stats["remainder_keys"]) == sorted(captions)


def test_same_seed_same_order_other_seed_or_epoch_other_order(tmp_path):
    paths, _ = make_shards(tmp_path, [12, 12])

    def run(seed, epoch=0):
        loader = shardstream.ShardLoader(paths, batch_size=4, image_size=32, seed=seed, shuffle_buffer=12)
        loader.set_epoch(epoch)
        return all_keys(loader)

    a = run(1)
    assert a == run(1)
    assert sorted(a) == sorted(run(2)) and a != run(2)
    assert a != run(1, epoch=1)


def test_corrupt_samples_are_skipped_and_counted_or_raised(tmp_path):
    good = good_samples(6, seed=9)
    members = [m for k, s in good[:3] for m in sample_members(k, s)]
    members += [("bad.jpg", photo_jpegs(1)[0][:200]), ("bad.txt", b"cut jpeg")]
    members += [("nocap.jpg", good[0][1]["jpg"])]
    members += [("badutf.jpg", good[1][1]["jpg"]), ("badutf.txt", b"\xff\xfe caption")]
    members += [m for k, s in good[3:] for m in sample_members(k, s)]
    path = write_file(str(tmp_path / "mixed.tar"), tar_bytes(members))
    loader = shardstream.ShardLoader(path, batch_size=2, image_size=32, drop_last=False, threads=2)
    keys = all_keys(loader)
    assert sorted(keys) == sorted(k for k, _ in good)
    assert loader.stats["skipped"] == {"corrupt_image": 1, "missing_caption": 1, "bad_utf8": 1}
    reasons = {f["key"]: f["reason"] for f in loader.stats["faults"]}
    assert {f["url"] for f in loader.stats["faults"]} == {path}, "faults name their shard"
    assert reasons == {"bad": "corrupt_image", "nocap": "missing_caption", "badutf": "bad_utf8"}

    strict = shardstream.ShardLoader(path, batch_size=2, image_size=32, on_error="raise", shuffle_buffer=1)
    with pytest.raises(ShardError) as info:
        all_keys(strict)
    assert info.value.key == "bad" and "mixed.tar" in str(info.value)
    assert info.value.reason == "corrupt_image"


def test_mutated_jpegs_are_decoded_or_counted_and_never_crash(tmp_path):
    """Real-photo JPEGs cut short, with flipped bytes or scrambled headers, through one loader
    whose decode threads reuse their libjpeg-turbo handles and buffers, at sizes that take the
    DCT-scaled planes path: every sample comes out or is counted, and nothing crashes."""
    rng = random.Random(7)
    jpegs = photo_jpegs(24, seed=3, min_side=200, max_side=520)
    members, untouched = [], 0
    for i in range(400):
        data = bytearray(rng.choice(jpegs))
        r = rng.random()
        if r < 0.25:
            data = data[: rng.randrange(2, len(data))]
        elif r < 0.5:
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif r < 0.75:
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(min(len(data), 700))] = rng.randrange(256)
        else:
            untouched += 1
        members += [(f"{i:05d}.jpg", bytes(data)), (f"{i:05d}.txt", b"a photo")]
    path = write_file(str(tmp_path / "mutated.tar"), tar_bytes(members))
    for crop in ("center", "random"):
        loader = shardstream.ShardLoader(
            path, batch_size=16, image_size=224, threads=2, drop_last=False, crop=crop,
            random_crop_scale=(0.08, 1.0),
        )  # fmt: skip
        decoded = len(all_keys(loader))
        skipped = loader.stats["skipped"]
        assert decoded + sum(skipped.values()) == 400, skipped
        assert set(skipped) <= {"corrupt_image", "unsupported_format", "too_many_pixels"}, skipped
        assert decoded >= untouched


def test_random_crop_is_seeded(tmp_path):
    paths, _ = make_shards(tmp_path, [4])

    def images(seed):
        loader = shardstream.ShardLoader(
            paths,
            batch_size=4,
            image_size=48,
            crop="random",
            random_crop_scale=(0.3, 0.6),
            seed=seed,
            shuffle_buffer=1,
        )
        return next(iter(loader)).images.clone()

    assert torch.equal(images(3), images(3))
    assert not torch.equal(images(3), images(4))


def test_torch_dataloader_with_worker_processes(tmp_path):
    paths, captions = make_shards(tmp_path, [8, 8, 8, 8])
    loader = shardstream.ShardLoader(paths, batch_size=4, image_size=32, threads=1, samples_per_epoch=32)
    dl = torch.utils.data.DataLoader(loader.dataset_view(num_workers=2), batch_size=None, num_workers=2)
    keys = []
    for batch in dl:
        assert batch.images.shape == (4, 3, 32, 32)
        keys += batch.keys
    assert len(keys) == 32
    assert set(keys) <= set(captions)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_size"):
        shardstream.ShardLoader("x.tar", batch_size=0)
    with pytest.raises(ValueError, match="crop"):
        shardstream.ShardLoader("x.tar", batch_size=2, crop="middle")


def test_memory_is_lent_not_copied(tmp_path):
    paths, _ = make_shards(tmp_path, [4])
    batch = next(iter(shardstream.ShardLoader(paths, batch_size=4, image_size=32)))
    # the tensor owns the memory the Rust pipeline wrote into: contiguous, no view of a copy
    assert batch.images.is_contiguous() and batch.images.storage_offset() == 0


def _threads() -> int:
    import os

    return len(os.listdir("/proc/self/task"))


def test_breaking_out_early_stops_every_pipeline_thread(tmp_path):
    import time

    paths, _ = make_shards(tmp_path, [12, 12])
    baseline = _threads()
    kept = []
    for _ in range(4):
        it = iter(shardstream.ShardLoader(paths, batch_size=2, image_size=32, prefetch=4, threads=2))
        kept.append(next(it))
        it.close()  # what `break` in a for loop does
    deadline = time.time() + 10
    while _threads() > baseline and time.time() < deadline:
        time.sleep(0.05)
    assert _threads() <= baseline
    # batches handed out before the stop stay intact
    assert all(b.images.float().std() > 5 for b in kept)


def test_the_serial_path_benchmarks_undecoded_run_reads_what_a_decoding_run_reads(tmp_path):
    """``benches/bench_serial_path.py`` times a pass with decoding switched off (the pipeline
    config's ``undecoded``): it must still read, group and skip as a decoding pass does, so that
    the figure is the rest of the pipeline's cost. The same keys and captions
    and the same skips for a sample without a caption; only a corrupt JPEG, which only a decode
    finds, goes through."""
    good = good_samples(5, seed=4)
    members = [m for k, s in good[:2] for m in sample_members(k, s)]
    members += [("nocap.jpg", good[0][1]["jpg"]), ("bad.jpg", photo_jpegs(1)[0][:200]), ("bad.txt", b"cut")]
    members += [m for k, s in good[2:] for m in sample_members(k, s)]
    path = write_file(str(tmp_path / "mixed.tar"), tar_bytes(members))

    def run(undecoded: bool):
        loader = shardstream.ShardLoader(path, batch_size=2, image_size=32, drop_last=False, seed=3)
        loader._config["undecoded"] = undecoded
        read = [
            (k, c, b.images[i].sum().item())
            for b in loader
            for i, (k, c) in enumerate(zip(b.keys, b.texts, strict=True))
        ]
        return read, loader.stats["skipped"]

    decoded, decoded_skips = run(False)
    undecoded, undecoded_skips = run(True)
    assert decoded_skips == {"corrupt_image": 1, "missing_caption": 1}
    assert undecoded_skips == {"missing_caption": 1}
    # (sorted: a rejected sample's place in its batch is refilled by the next, so orders shift)
    assert sorted((k, c) for k, c, _ in decoded) == sorted((k, c) for k, c, _ in undecoded if k != "bad")
    assert [k for k, _, _ in undecoded if k == "bad"] == ["bad"]
    assert all(pixels > 0 for _, _, pixels in decoded)
