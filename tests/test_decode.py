"""The decode path on real photos against Pillow, the formats users feed us, and hostile images."""

from __future__ import annotations

import io
import math
import struct

import numpy as np
import pytest
from corpus import photo_paths
from PIL import Image
from pillow_reference import SIZE, pillow_reference
from shardstream import _core


def ours(data: bytes, size: int = SIZE, **kw) -> np.ndarray:
    return np.frombuffer(_core.decode_image(data, size, **kw), dtype=np.uint8).reshape(3, size, size)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def mae(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    out = []
    for p in photo_paths():
        with Image.open(p) as im:
            out.append(im.convert("RGB"))
    assert len(out) >= 6
    return out


def test_jpeg_crops_match_pillow_on_real_photos(photos):
    # Photos whose shorter side is at least twice the target are decoded at 1/2 or 1/4 DCT
    # scale (as Pillow's draft() does); the others at full size. YCbCr JPEGs are resized as
    # planes (chroma from its own subsampled plane) and converted to RGB at the output size,
    # where Pillow upsamples chroma and converts first. Measured: mean 1.2, max 4.2 (the
    # sharpest photo, at 1/2 scale); full-size decodes 0.43-0.78.
    errors = []
    for img in photos:
        data = encode(img, "JPEG", quality=90)
        errors.append(mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))))
    assert max(errors) < 5.0, errors
    assert np.mean(errors) < 1.5, errors
    full_size = [e for img, e in zip(photos, errors, strict=True) if min(img.size) < 2 * SIZE]
    assert full_size and max(full_size) < 0.9, errors


def test_jpeg_crops_are_as_faithful_to_the_original_as_pillows(photos):
    """Against the photo before JPEG compression, our crop is within 10 % of Pillow's error
    (measured: 1.03-1.08x): resizing chroma from its own plane loses nothing real."""
    for img in photos:
        if min(img.size) >= 2 * SIZE:
            continue  # DCT-reduced decodes trade accuracy for speed, as Pillow's draft() does
        truth = pillow_reference(img)
        data = encode(img, "JPEG", quality=90)
        pillow_error = mae(pillow_reference(Image.open(io.BytesIO(data))), truth)
        assert mae(ours(data), truth) <= 1.1 * pillow_error


@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["444", "422", "420"])
@pytest.mark.parametrize("size", [(301, 227), (227, 505), (17, 300), (224, 224), (522, 448), (1003, 677)])
def test_jpeg_chroma_layouts_and_odd_sizes(photos, subsampling, size):
    # Odd sizes pad the planes to whole chroma samples; 522x448 at 4:2:0 is decoded at 1/2
    # scale with an odd width, whose chroma upscale once read out of bounds in the resizer.
    img = photos[1].resize(size, Image.BICUBIC)
    data = encode(img, "JPEG", quality=92, subsampling=subsampling)
    error = mae(ours(data), pillow_reference(Image.open(io.BytesIO(data))))
    assert error < (1.0 if min(size) < 2 * SIZE else 2.5), error


@pytest.mark.parametrize("subsampling", ["440", "411"])
def test_jpeg_vertical_and_4x_chroma_subsampling(photos, subsampling):
    # Pillow cannot write these layouts; simplejpeg (libjpeg-turbo's encoder) can. Measured:
    # 0.41 (4:4:0) and 0.64 (4:1:1).
    import simplejpeg  # a dev requirement (the decode benchmark's ceiling)

    pixels = np.ascontiguousarray(np.asarray(photos[1].resize((301, 227))))
    data = simplejpeg.encode_jpeg(pixels, quality=92, colorspace="RGB", colorsubsampling=subsampling)
    assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 1.0


def test_progressive_jpeg(photos):
    data = encode(photos[1].resize((301, 227)), "JPEG", quality=92, progressive=True)
    assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 1.0


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P"])
def test_png_modes_become_rgb(photos, mode):
    img = photos[0].resize((300, 260))
    data = encode(img.convert(mode), "PNG")
    assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 2.0


def test_sixteen_bit_png_is_scaled_to_eight_bits(photos):
    gray8 = np.asarray(photos[0].resize((300, 260)).convert("L"))
    data = encode(Image.fromarray(gray8.astype(np.uint16) * 257), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    assert mae(ours(data), pillow_reference(Image.fromarray(gray8))) < 2.0


def test_webp_and_grayscale_jpeg(photos):
    img = photos[1].resize((320, 240))
    for data in (encode(img, "WEBP", quality=90), encode(img.convert("L"), "JPEG", quality=92)):
        assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 2.0


def test_cmyk_jpeg(photos):
    img = photos[2].resize((300, 300))
    data = encode(img.convert("CMYK"), "JPEG", quality=95)
    assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 3.0


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(photos, orientation):
    img = photos[3].resize((400, 250))
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(img, "JPEG", quality=92, exif=exif.tobytes())
    assert mae(ours(data), pillow_reference(Image.open(io.BytesIO(data)))) < 3.0
    # and it really rotates: without the tag the result differs a lot
    plain = encode(img, "JPEG", quality=92)
    assert mae(ours(data), ours(plain)) > 10


def test_probe_reports_displayed_size(photos):
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(photos[0].resize((400, 250)), "JPEG", exif=exif.tobytes())
    assert _core.probe_image(data) == ("jpeg", 250, 400)


def _patch_jpeg_size(data: bytes, width: int, height: int) -> bytes:
    """Rewrites the SOF0 frame size: a small file that claims to be huge."""
    i = 2
    while i < len(data):
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
        if marker in (0xC0, 0xC2):
            return data[: i + 5] + struct.pack(">HH", height, width) + data[i + 9 :]
        i += 2 + length
    raise AssertionError("no SOF marker")


def test_pixel_bomb_is_rejected_before_decoding(photos):
    bomb = _patch_jpeg_size(encode(photos[0].resize((64, 64)), "JPEG"), 60000, 60000)
    with pytest.raises(ValueError, match="too_many_pixels"):
        ours(bomb)
    with pytest.raises(ValueError, match="too_many_pixels"):
        ours(encode(photos[0].resize((100, 100)), "PNG"), max_pixels=5000)


def test_corrupt_and_unsupported_bytes(photos):
    data = encode(photos[0].resize((200, 200)), "JPEG")
    with pytest.raises(ValueError, match="corrupt_image"):
        ours(data[: len(data) // 3])
    with pytest.raises(ValueError, match="unsupported_format"):
        ours(encode(photos[0].resize((50, 50)), "GIF"))
    with pytest.raises(ValueError, match="unsupported_format"):
        ours(b"definitely not an image")


def test_a_corrupt_jpeg_does_not_poison_the_next_decode_on_the_same_thread(photos, tmp_path):
    # Regression: the per-thread libjpeg-turbo handle kept state from a failed decode, so the
    # following good JPEGs failed with "Bogus Huffman table definition".
    import shardstream
    from corpus import sample_members, tar_bytes, write_file

    good = [encode(p.resize((120, 100)), "JPEG", quality=90) for p in photos[:4]]
    members = sample_members("a", {"jpg": good[0], "txt": "a"})
    members += sample_members("bad", {"jpg": good[1][:400], "txt": "cut"})
    for i, data in enumerate(good[1:]):
        members += sample_members(f"z{i}", {"jpg": data, "txt": "ok"})
    path = write_file(str(tmp_path / "poison.tar"), tar_bytes(members))
    loader = shardstream.ShardLoader(
        path, batch_size=1, image_size=32, threads=1, shuffle_buffer=1, drop_last=False
    )
    keys = [k for b in loader for k in b.keys]
    assert keys == ["a", "z0", "z1", "z2"]
    assert loader.stats["skipped"] == {"corrupt_image": 1}


# -- the random crop's aspect-ratio range --------------------------------------------------------


def _best_box_error(out: np.ndarray, img: Image.Image, area: float, aspect: float) -> float:
    """The smallest error between ``out`` and Pillow's resize of any whole-pixel box of that
    area and aspect ratio in ``img``: small only if the crop's source box had that shape."""
    w, h = img.size
    cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
    size = out.shape[-1]

    def resized(x: int, y: int) -> np.ndarray:
        box = (x, y, x + cw, y + ch)
        return np.asarray(img.resize((size, size), Image.BICUBIC, box=box)).transpose(2, 0, 1)

    return min(mae(out, resized(x, y)) for x in range(w - cw + 1) for y in range(h - ch + 1))


def test_random_crop_ratio_sets_the_source_boxs_aspect(photos, tmp_path):
    """A narrow ``random_crop_ratio`` ([2, 2]) at a fixed area (half the photo): the crops of a
    real photo, from decode_image and from the loader, are Pillow's resize of a 2:1 box of that
    area (at a position each seed picks), and of no 1:1 or 4:3 box; a bad range is refused."""
    import shardstream
    from corpus import sample_members, tar_bytes, write_file

    img = photos[3].resize((150, 100), Image.BICUBIC)
    data = encode(img, "PNG")  # lossless: only the crop and the resize differ from Pillow's
    area, size = 150 * 100 * 0.5, 32
    kw = {"crop": "random", "random_crop_scale": (0.5, 0.5), "random_crop_ratio": (2.0, 2.0)}
    crops = [ours(data, size, **kw, crop_seed=seed) for seed in range(3)]
    members = []
    for i in range(3):
        members += sample_members(f"s{i}", {"png": data, "txt": "x"})
    path = write_file(str(tmp_path / "ratio.tar"), tar_bytes(members))
    loader = shardstream.ShardLoader(
        path, batch_size=3, image_size=size, threads=1, shuffle_buffer=1,
        random_crop_scale=(0.5, 0.5), random_crop_ratio=(2.0, 2.0), crop="random",
    )  # fmt: skip
    crops += [np.asarray(image) for batch in loader for image in batch.images]
    assert len(crops) == 6 and not np.array_equal(crops[0], crops[1]), "each seed places its box"
    for out in crops:
        matched = _best_box_error(out, img, area, 2.0)
        assert matched < 2.0, matched
        for other in (1.0, 4 / 3):
            assert _best_box_error(out, img, area, other) > 2 * matched, other
    for bad in ((2.0, 1.0), (0.0, 1.0)):
        with pytest.raises(ValueError, match="random_crop_ratio"):
            ours(data, size, crop="random", random_crop_ratio=bad)
        with pytest.raises(ValueError, match="random_crop_ratio"):
            shardstream.ShardLoader(path, batch_size=1, crop="random", random_crop_ratio=bad)


# -- decoding only the rows a crop needs ---------------------------------------------------------


def _layouts(photos) -> list[tuple[str, bytes]]:
    """JPEGs of real photos in the layouts the raw decoder handles: each chroma subsampling,
    grayscale, progressive; portrait and landscape; sizes decoded at full size and at 1/2, 1/4
    and 1/8 DCT scale for a 224 crop; sizes that are not whole blocks."""
    import simplejpeg

    out = []
    for i, (w, h) in enumerate([(301, 517), (517, 301), (227, 227), (461, 1003), (1901, 977), (3605, 1811)]):
        img = photos[i % len(photos)].resize((w, h), Image.BICUBIC)
        for subsampling in (0, 1, 2):
            data = encode(img, "JPEG", quality=90, subsampling=subsampling)
            out.append((f"{w}x{h} pil-{subsampling}", data))
        pixels = np.ascontiguousarray(np.asarray(img))
        for layout in ("440", "411"):
            data = simplejpeg.encode_jpeg(pixels, quality=90, colorspace="RGB", colorsubsampling=layout)
            out.append((f"{w}x{h} {layout}", data))
        out.append((f"{w}x{h} gray", encode(img.convert("L"), "JPEG", quality=90)))
        out.append((f"{w}x{h} progressive", encode(img, "JPEG", quality=90, progressive=True)))
    return out


def test_decoding_only_what_the_crop_reads_gives_the_whole_decodes_pixels(photos, tmp_path):
    """The loader stops decoding a JPEG after the last row its crop's resize reads (the rows below
    a portrait photo's centre, or a random crop, are never entropy-decoded) and skips the IDCT of
    blocks the resize does not read (beside a landscape photo's centre); validation decodes all.
    Both must give the same bytes, for every layout, for centre and random crops (whose boxes
    reach every edge of the image over these seeds), and in the loader, whose decoder reuses
    its buffers, so that skipped blocks hold the previous image's pixels."""
    import shardstream
    from corpus import sample_members, tar_bytes, write_file

    layouts = _layouts(photos)
    checked = 0
    for name, data in layouts:
        for crop, scale, seeds in (("center", (0.9, 1.0), [0]), ("random", (0.08, 1.0), range(12))):
            for seed in seeds:
                kw = {"crop": crop, "random_crop_scale": scale, "crop_seed": seed}
                partial = ours(data, **kw)
                whole = ours(data, **kw, whole=True)
                assert np.array_equal(partial, whole), (name, crop, seed)
                checked += 1
    assert checked == 6 * 7 * 13

    members = []
    for i, (_, data) in enumerate(layouts):
        members += sample_members(f"{i:03d}", {"jpg": data, "txt": "x"})
    path = write_file(str(tmp_path / "layouts.tar"), tar_bytes(members))
    loader = shardstream.ShardLoader(path, batch_size=7, threads=1, shuffle_buffer=1, drop_last=False)
    loaded = {k: np.asarray(img) for b in loader for k, img in zip(b.keys, b.images, strict=True)}
    assert len(loaded) == len(layouts)
    for i, (name, data) in enumerate(layouts):
        assert np.array_equal(loaded[f"{i:03d}"], ours(data, whole=True)), name


def test_a_truncated_jpeg_is_rejected_even_when_the_crop_ends_above_the_cut(photos):
    # A portrait photo's centre crop ends well above its last quarter, which the loader's decode
    # never reaches: a file cut there must still count as corrupt (it lacks its end marker).
    data = encode(photos[2].resize((300, 900), Image.BICUBIC), "JPEG", quality=90)
    assert ours(data).any()
    cut = data[: len(data) * 9 // 10]
    for whole in (False, True):
        with pytest.raises(ValueError, match="corrupt_image"):
            ours(cut, whole=whole)


def test_validation_decodes_rows_the_crop_does_not_need(photos, tmp_path):
    """Damage below a portrait photo's centre crop, in a file that still ends with its end marker:
    the loader's decode stops above it and gives correct pixels; validation (``whole``, and the
    shard scan behind ``shardstream validate`` and the index) decodes every row and reports it."""
    from corpus import sample_members, tar_bytes, write_file

    data = encode(photos[2].resize((300, 900), Image.BICUBIC), "JPEG", quality=90)
    damaged = data[: len(data) * 9 // 10] + b"\xff\xd9"
    assert np.array_equal(ours(damaged), ours(data))
    with pytest.raises(ValueError, match="corrupt_image"):
        ours(damaged, whole=True)
    members = sample_members("ok", {"jpg": data, "txt": "a"})
    members += sample_members("bad", {"jpg": damaged, "txt": "b"})
    path = write_file(str(tmp_path / "damaged.tar"), tar_bytes(members))
    report = _core.scan_shard(path, decode=True)
    assert [(s["key"], s["reason"]) for s in report["invalid"]] == [("bad", "corrupt_image")], report
