"""What a sample becomes depends on its bytes alone, not on what its decoder thread decoded
before: every kind of JPEG (standard and optimized Huffman tables, none at all, no quantization
tables, progressive, EXIF-rotated) gives the same pixels, or the same typed skip, whatever the
thread count and the order of the shard. libjpeg keeps one image's tables in a decompressor for
the next; a JPEG without DHT was skipped as corrupt after an optimized one, and a JPEG without
DQT was decoded with the previous image's quantization (wrong pixels, no error)."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import shardstream
from corpus import _photos_rgb, sample_members, tar_bytes, write_file
from PIL import Image

DHT, DQT = 0xC4, 0xDB


def without(jpeg: bytes, marker: int) -> bytes:
    """``jpeg`` without its segments of ``marker`` before the first scan."""
    out, i = bytearray(jpeg[:2]), 2
    while jpeg[i] == 0xFF and jpeg[i + 1] != 0xDA:
        end = i + 2 + int.from_bytes(jpeg[i + 2 : i + 4], "big")
        if jpeg[i + 1] != marker:
            out += jpeg[i:end]
        i = end
    out += jpeg[i:]
    assert len(out) < len(jpeg)
    return bytes(out)


def variants(photo: Image.Image) -> dict[str, bytes]:
    def save(**kw) -> bytes:
        buf = io.BytesIO()
        photo.save(buf, format="JPEG", **kw)
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: decoded through a TurboJPEG handle, then turned
    standard = save(quality=90)
    return {
        "standard": standard,
        "optimized": save(quality=90, optimize=True),
        "q100-444-optimized": save(quality=100, subsampling=0, optimize=True),
        "nodht": without(standard, DHT),
        "nodqt": without(standard, DQT),
        "progressive": save(quality=85, progressive=True),
        "rotated": save(quality=90, exif=exif),
        "rotated-optimized": save(quality=75, optimize=True, exif=exif),
        "rotated-nodht": without(save(quality=90, exif=exif), DHT),
    }


@pytest.fixture(scope="module")
def samples() -> list[tuple[str, bytes]]:
    out = []
    for p, photo in enumerate(_photos_rgb()):
        photo = photo.crop((0, 0, min(photo.width, 400), min(photo.height, 300)))
        for name, jpeg in variants(photo).items():
            out.append((f"p{p}-{name}", jpeg))
    return out


def run(path: str, threads: int) -> tuple[dict[str, bytes], dict[str, int]]:
    loader = shardstream.ShardLoader(
        path, batch_size=5, image_size=64, threads=threads, shuffle_buffer=1, drop_last=False
    )
    images = {}
    for batch in loader:
        for key, image in zip(batch.keys, np.asarray(batch.images), strict=True):
            images[key] = image.tobytes()
    return images, {k: v for k, v in loader.stats["skipped"].items() if v}


def test_pixels_and_skips_do_not_depend_on_the_previous_image_threads_or_order(samples, tmp_path):
    shuffled = list(samples)
    random.Random(7).shuffle(shuffled)
    shards = {}
    for name, order in (("in-order", samples), ("shuffled", shuffled)):
        members = [m for key, jpeg in order for m in sample_members(key, {"jpg": jpeg, "txt": key})]
        shards[name] = write_file(str(tmp_path / f"{name}.tar"), tar_bytes(members))
    runs = {(name, threads): run(path, threads) for name, path in shards.items() for threads in (1, 2)}
    (first_images, first_skips), *_ = runs.values()
    for how, (images, skips) in runs.items():
        assert skips == first_skips, how
        assert images.keys() == first_images.keys(), how
        differ = sorted(k for k in images if images[k] != first_images[k])
        assert not differ, f"{how}: {differ}"
    photos = len(_photos_rgb())
    # Each no-DQT image, and only those, is skipped as corrupt; the others all decode.
    assert first_skips == {"corrupt_image": photos}
    assert {k for k in (key for key, _ in samples) if k not in first_images} == {
        f"p{p}-nodqt" for p in range(photos)
    }
    # Without DHT the standard tables apply: the same pixels as the standard encoding.
    for p in range(photos):
        assert first_images[f"p{p}-nodht"] == first_images[f"p{p}-standard"]
        assert first_images[f"p{p}-rotated-nodht"] == first_images[f"p{p}-rotated"]
