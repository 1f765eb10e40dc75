"""Shards for tests: real photos, and a corpus of hostile and corrupt shards with known defects.

Everything here is deterministic (fixed seeds, fixed tar header fields), so tests can pin exact
expected validation reports. Photos come from the scikit-image and scikit-learn wheels (real
photographs, see data/PROVENANCE.md), cropped and re-encoded at img2dataset-like sizes.

Other test modules may import this file (``from corpus import ...``; tests/ is on sys.path under
pytest's default rootdir-based import mode).
"""

from __future__ import annotations

import gzip
import io
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

BLOCK = 512


# -- real photos ---------------------------------------------------------------------------------


def photo_paths() -> list[str]:
    """Real photographs shipped in installed wheels (colour, at least 300 px on the short side)."""
    import skimage
    import sklearn

    skimage_data = os.path.join(os.path.dirname(skimage.__file__), "data")
    sklearn_images = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images")
    paths = [
        os.path.join(skimage_data, n)
        for n in (
            "astronaut.png",
            "chelsea.png",
            "coffee.png",
            "rocket.jpg",
            "motorcycle_left.png",
            "hubble_deep_field.jpg",
        )
    ]
    paths += [os.path.join(sklearn_images, n) for n in ("china.jpg", "flower.jpg")]
    return [p for p in paths if os.path.exists(p)]


@lru_cache(maxsize=4)
def _photos_rgb() -> tuple:
    from PIL import Image

    images = []
    for path in photo_paths():
        with Image.open(path) as im:
            images.append(im.convert("RGB"))
    return tuple(images)


def photo_jpegs(
    count: int, *, seed: int = 0, min_side: int = 96, max_side: int = 160, quality: int = 90
) -> list[bytes]:
    """``count`` JPEGs cut from real photos at random places and sizes, re-encoded as
    img2dataset output looks (tests use small sizes to stay fast; benchmarks ask for 256-512)."""
    rng = random.Random(seed)
    photos = _photos_rgb()
    out = []
    for _ in range(count):
        photo = photos[rng.randrange(len(photos))]
        w, h = photo.size
        side = rng.randint(min(min_side, w, h), min(max_side, w, h))
        aspect = rng.uniform(0.75, 1.33)
        cw, ch = min(w, max(8, int(side * aspect))), side
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        buf = io.BytesIO()
        photo.crop((x, y, x + cw, y + ch)).save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def png_bytes(width: int, height: int, mode: str = "RGB", color: int | tuple = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


# -- raw tar building (no safety rails: corrupt shards need headers that lie) ---------------------


def tar_header(name: str, size: int, *, typeflag: bytes = b"0", checksum_delta: int = 0) -> bytes:
    """A ustar header with fixed mtime/uid/gid/mode. ``checksum_delta`` makes the checksum lie."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError("corpus names must fit a ustar name field")
    header = bytearray(BLOCK)
    header[0 : len(raw)] = raw
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = f"{size:011o}\0".encode() if size < 8**11 else _base256(size, 12)
    header[136:148] = b"00000000000\0"
    header[148:156] = b" " * 8
    header[156:157] = typeflag
    header[257:263] = b"ustar\0"
    header[263:265] = b"00"
    checksum = sum(header) + checksum_delta
    header[148:156] = f"{checksum:06o}\0 ".encode()
    return bytes(header)


def _base256(value: int, width: int) -> bytes:
    return bytes([0x80]) + value.to_bytes(width - 1, "big")


def tar_member(name: str, data: bytes) -> bytes:
    return tar_header(name, len(data)) + data + b"\0" * (-len(data) % BLOCK)


def tar_bytes(members: Iterable[tuple[str, bytes]], *, end: bool = True) -> bytes:
    body = b"".join(tar_member(name, data) for name, data in members)
    return body + (b"\0" * (2 * BLOCK) if end else b"")


def sample_members(key: str, sample: dict[str, bytes | str]) -> list[tuple[str, bytes]]:
    """Members of one sample in sorted extension order (as ShardWriter writes them)."""
    return [(f"{key}.{ext}", v.encode() if isinstance(v, str) else v) for ext, v in sorted(sample.items())]


def write_file(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def good_samples(count: int, *, seed: int = 0, prefix: str = "s") -> list[tuple[str, dict[str, bytes | str]]]:
    """``count`` valid (key, sample) pairs: a real-photo JPEG, a caption and a small JSON."""
    images = photo_jpegs(count, seed=seed)
    return [
        (
            f"{prefix}{i:04d}",
            {
                "jpg": img,
                "txt": f"photo number {i} from seed {seed}",
                "json": f'{{"index": {i}, "seed": {seed}}}',
            },
        )
        for i, img in enumerate(images)
    ]


def write_shards(
    directory: str | os.PathLike[str],
    counts: Sequence[int],
    *,
    seed: int,
    prefix: str = "s",
    edit: Callable[[int, list[tuple[str, bytes]]], list[tuple[str, bytes]]] | None = None,
) -> tuple[list[str], list[str]]:
    """Shards ``shard-00.tar``, ``shard-01.tar`` ... in ``directory``, shard ``i`` holding
    ``counts[i]`` good samples (seed ``seed + i``, keys ``{prefix}{i}_NNNN``); ``edit(i, members)``
    may change a shard's members (add invalid ones). Returns (paths, the good samples' keys)."""
    paths, keys = [], []
    for i, n in enumerate(counts):
        samples = good_samples(n, seed=seed + i, prefix=f"{prefix}{i}_")
        members = [m for k, s in samples for m in sample_members(k, s)]
        if edit is not None:
            members = edit(i, members)
        paths.append(write_file(os.path.join(os.fspath(directory), f"shard-{i:02d}.tar"), tar_bytes(members)))
        keys += [k for k, _ in samples]
    return paths, keys


def good_shard(path: str, count: int = 8, *, seed: int = 0, prefix: str = "s") -> str:
    members = [m for key, s in good_samples(count, seed=seed, prefix=prefix) for m in sample_members(key, s)]
    return write_file(path, tar_bytes(members))


# -- the corrupt corpus ----------------------------------------------------------------------------


def corrupt_jpeg(jpeg: bytes) -> bytes:
    """Flips bits so that the file still starts like a JPEG but cannot be decoded: the bytes of
    every Huffman table (DHT segment) after its length field are inverted, which makes the code
    lengths impossible, so any conforming decoder rejects the file (bit flips in the
    entropy-coded data alone are usually concealed, not reported)."""
    data = bytearray(jpeg)
    i, flipped = 2, 0
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xDA:  # start of scan: the tables are all behind us
            break
        if marker == 0xC4:
            for j in range(i + 4, i + 2 + length):
                data[j] ^= 0xFF
            flipped += 1
        i += 2 + length
    if not flipped:
        raise ValueError("no Huffman table found to corrupt")
    return bytes(data)


def huge_png() -> bytes:
    """A real, valid 1-bit PNG of 9000 x 9000 = 81 M pixels (> the default 64 M max_pixels) that
    weighs only ~10 kB: a decompression bomb in miniature."""
    return png_bytes(9000, 9000, mode="1")


@dataclass(frozen=True)
class Expected:
    """What validation must say about one shard: invalid samples as (key, reason) in shard order,
    the total sample count, and the shard-level fault (reason or None)."""

    samples: int
    invalid: tuple[tuple[str, str], ...] = ()
    fatal: str | None = None


def build_corrupt_corpus(directory: str) -> dict[str, Expected]:
    """Writes one shard per defect into ``directory``; returns file name -> expected report
    (with decoding on, the default options, and ``max_member_bytes`` = 1 MiB)."""
    good = good_samples(12, seed=7)
    img = {key: s["jpg"] for key, s in good}
    keys = [key for key, _ in good]
    expected: dict[str, Expected] = {}

    def shard(name: str, members: Sequence[tuple[str, bytes]], exp: Expected, *, end: bool = True) -> None:
        write_file(os.path.join(directory, name), tar_bytes(members, end=end))
        expected[name] = exp

    def sample(key: str, **members: bytes | str) -> list[tuple[str, bytes]]:
        return sample_members(key, members)

    # A clean shard: the control.
    shard("good.tar", [m for k, s in good[:4] for m in sample_members(k, s)], Expected(4))

    # Truncated in the middle of the third sample's image: two good samples, the third is cut.
    # (The second is complete: the next member's header names another key.)
    full = tar_bytes([m for k, s in good[:4] for m in sample_members(k, s)])
    third = sum(len(tar_member(n, d)) for k, s in good[:2] for n, d in sample_members(k, s))
    cut = third + BLOCK + len(img[keys[2]]) // 2
    write_file(os.path.join(directory, "truncated.tar"), full[:cut])
    expected["truncated.tar"] = Expected(3, ((keys[2], "truncated_tar"),), fatal="truncated_tar")

    shard(
        "bitflip_jpeg.tar",
        sample("a", jpg=img[keys[0]], txt="fine")
        + sample("b", jpg=corrupt_jpeg(img[keys[1]]), txt="flipped")
        + sample("c", jpg=img[keys[2]], txt="fine"),
        Expected(3, (("b", "corrupt_image"),)),
    )

    # A JPEG cut short (a partial download): Pillow and libjpeg-turbo both refuse it.
    cut = img[keys[1]][: len(img[keys[1]]) * 2 // 3]
    shard(
        "truncated_jpeg.tar",
        sample("a", jpg=img[keys[0]], txt="fine")
        + sample("b", jpg=cut, txt="cut")
        + sample("c", jpg=img[keys[2]], txt="fine"),
        Expected(3, (("b", "corrupt_image"),)),
    )

    shard(
        "bad_utf8.tar",
        sample("a", jpg=img[keys[0]], txt="fine") + sample("b", jpg=img[keys[1]], txt=b"caf\xe9 \xff\xfe"),
        Expected(2, (("b", "bad_utf8"),)),
    )

    shard(
        "missing_caption.tar",
        sample("a", jpg=img[keys[0]], txt="fine")
        + sample("b", jpg=img[keys[1]])
        + sample("c", jpg=img[keys[2]], json="{}"),
        Expected(3, (("b", "missing_caption"), ("c", "missing_caption"))),
    )

    shard(
        "missing_image.tar",
        sample("a", txt="caption without image") + sample("b", jpg=img[keys[1]], txt="fine"),
        Expected(2, (("a", "missing_image"),)),
    )

    # Key "a" again after "b" (a second sample with the same key) and a member repeated inside one
    # sample ("c.jpg" twice in a row groups into one sample with a duplicate extension).
    shard(
        "duplicate_keys.tar",
        sample("a", jpg=img[keys[0]], txt="first a")
        + sample("b", jpg=img[keys[1]], txt="b")
        + sample("a", jpg=img[keys[2]], txt="second a")
        + [("c.jpg", img[keys[3]]), ("c.jpg", img[keys[4]]), ("c.txt", b"c")],
        Expected(4, (("a", "duplicate_key"), ("c", "duplicate_member"))),
    )

    shard(
        "too_many_pixels.tar",
        sample("a", jpg=img[keys[0]], txt="fine") + sample("bomb", png=huge_png(), txt="81 megapixels"),
        Expected(2, (("bomb", "too_many_pixels"),)),
    )

    # A 2 MiB member against max_member_bytes = 1 MiB: skipped unread, the shard goes on.
    shard(
        "member_too_large.tar",
        sample("a", jpg=img[keys[0]], txt="fine")
        + sample("big", jpg=img[keys[1]], txt="x", bin=bytes(2 << 20))
        + sample("c", jpg=img[keys[2]], txt="fine"),
        Expected(3, (("big", "member_too_large"),)),
    )

    # A header that claims 1 TB with nothing behind it: must be refused from the header, not by
    # trying to allocate or read a terabyte.
    lying = tar_member("a.jpg", img[keys[0]]) + tar_member("a.txt", b"fine") + tar_header("b.jpg", 1 << 40)
    write_file(os.path.join(directory, "lying_size.tar"), lying + bytes(4 * BLOCK))
    expected["lying_size.tar"] = Expected(2, (("b", "truncated_tar"),), fatal="truncated_tar")

    # A header with a wrong checksum after the first sample: the members behind it must not
    # vanish silently as if the archive had ended there (tarfile and webdataset stop quietly).
    # Sample "a" was read whole and stays valid; the shard is reported corrupt.
    broken = bytearray(
        tar_bytes(sample("a", jpg=img[keys[0]], txt="fine") + sample("b", jpg=img[keys[1]], txt="x"))
    )
    second = len(tar_member("a.jpg", img[keys[0]])) + len(tar_member("a.txt", b"fine"))
    broken[second : second + BLOCK] = tar_header("b.jpg", len(img[keys[1]]), checksum_delta=1)
    write_file(os.path.join(directory, "bad_checksum.tar"), bytes(broken))
    expected["bad_checksum.tar"] = Expected(1, (), fatal="corrupt_tar")

    shard(
        "unsupported_format.tar",
        sample("a", jpg=b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", txt="a gif named jpg")
        + sample("b", jpg=img[keys[1]], txt="fine"),
        Expected(2, (("a", "unsupported_format"),)),
    )

    # gzip-compressed shard with one corrupt image: defects are found through the decompressor.
    members = sample("a", jpg=img[keys[0]], txt="fine") + sample("b", jpg=corrupt_jpeg(img[keys[1]]), txt="x")
    write_file(os.path.join(directory, "compressed.tar.gz"), gzip.compress(tar_bytes(members), mtime=0))
    expected["compressed.tar.gz"] = Expected(2, (("b", "corrupt_image"),))

    return expected


def runtime_corrupt_shards(
    directory: str, *, shards: int, per_shard: int, corrupt: list[tuple[int, int]]
) -> tuple[list[str], str]:
    """Shards of real photos where the samples at (shard, position) have their JPEG cut short,
    indexed without decoding: the plan schedules them and they fail only when decoded."""
    from shardstream.index import build_index, write_index

    paths = []
    for i in range(shards):
        samples = good_samples(per_shard, seed=600 + i, prefix=f"c{i}_")
        cut = {f"c{i}_{position:04d}.jpg" for shard, position in corrupt if shard == i}
        members = [
            (name, data[:400] if name in cut else data)
            for k, s in samples
            for name, data in sample_members(k, s)
        ]
        paths.append(write_file(os.path.join(directory, f"c-{i}.tar"), tar_bytes(members)))
    index = write_index(build_index(paths, decode=False), os.path.join(directory, "index.json"))
    return paths, index
