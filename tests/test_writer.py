"""ShardWriter and the folder/table builders: deterministic bytes, atomic files, shard limits, and
shards that webdataset and shardstream read back identically."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tarfile

import pytest
from corpus import good_samples, photo_jpegs, photo_paths
from PIL import Image
from shardstream.writer import ShardWriter, resize_shorter_side, write_from_folder, write_from_table


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_samples(pattern: str, samples, **kwargs) -> list[str]:
    with ShardWriter(pattern, **kwargs) as writer:
        for key, sample in samples:
            writer.write({"__key__": key, **sample})
    return writer.shards


def as_bytes(sample: dict) -> dict:
    return {k: v.encode() if isinstance(v, str) else v for k, v in sample.items()}


def read_with_webdataset(paths: list[str]) -> list[dict]:
    import webdataset as wds

    return [
        {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
        for s in wds.WebDataset(paths, shardshuffle=False)
    ]


def test_round_trip_through_webdataset_and_shardstream(tmp_path):
    from shardstream import read_samples

    samples = good_samples(10, seed=1)
    shards = write_samples(str(tmp_path / "shard-%06d.tar"), samples, max_count=4)
    assert [os.path.basename(p) for p in shards] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    expected = [{"__key__": key, **as_bytes(sample)} for key, sample in samples]
    assert read_with_webdataset(shards) == expected
    ours = [{k: v for k, v in s.items() if k != "__url__"} for s in read_samples(shards)]
    assert ours == expected


def test_same_input_gives_byte_identical_shards(tmp_path):
    samples = good_samples(6, seed=2)
    first = write_samples(str(tmp_path / "a" / "{shard:04d}.tar"), samples, max_count=4)
    second = write_samples(str(tmp_path / "b" / "{shard:04d}.tar"), samples, max_count=4)
    assert [sha256(p) for p in first] == [sha256(p) for p in second]


def test_headers_carry_no_time_owner_or_pax_records(tmp_path):
    (shard,) = write_samples(str(tmp_path / "%d.tar"), good_samples(2, seed=3))
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "s0000.jpg",
        "s0000.json",
        "s0000.txt",
        "s0001.jpg",
        "s0001.json",
        "s0001.txt",
    ]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) == (
            0,
            0,
            0,
            "",
            "",
            0o644,
            tarfile.REGTYPE,
        )
        assert m.pax_headers == {}
    # No record padding: the archive ends with exactly two zero blocks after the last member.
    size = os.path.getsize(shard)
    assert size % 512 == 0
    with open(shard, "rb") as f:
        f.seek(size - 1024)
        assert f.read() == bytes(1024)


def test_long_and_unicode_names_use_a_pax_path_and_read_back(tmp_path):
    key = "folder/" + "deep/" * 25 + "légende_日本"
    shards = write_samples(str(tmp_path / "%d.tar"), [(key, {"txt": "unicode key", "jpg": b"\xff\xd8\xff"})])
    assert read_with_webdataset(shards) == [{"__key__": key, "jpg": b"\xff\xd8\xff", "txt": b"unicode key"}]
    again = write_samples(
        str(tmp_path / "again-%d.tar"), [(key, {"txt": "unicode key", "jpg": b"\xff\xd8\xff"})]
    )
    assert sha256(shards[0]) == sha256(again[0])
    with tarfile.open(shards[0]) as tar:
        for m in tar.getmembers():
            assert set(m.pax_headers) == {"path"}  # a name record only, never mtime/atime/ctime


def test_max_size_is_never_exceeded_except_by_a_single_oversized_sample(tmp_path):
    samples = good_samples(12, seed=4)
    limit = 40_000
    shards = write_samples(str(tmp_path / "%03d.tar"), samples, max_size=limit)
    assert len(shards) > 2
    assert all(os.path.getsize(p) <= limit for p in shards)
    assert [s["__key__"] for s in read_with_webdataset(shards)] == [k for k, _ in samples]

    big = [("a", {"txt": "small"}), ("b", {"bin": bytes(50_000)}), ("c", {"txt": "small"})]
    shards = write_samples(str(tmp_path / "big-%03d.tar"), big, max_size=limit)
    assert [[s["__key__"] for s in read_with_webdataset([p])] for p in shards] == [["a"], ["b"], ["c"]]


def test_max_count_rolls_over_exactly(tmp_path):
    samples = [(f"k{i}", {"txt": str(i)}) for i in range(7)]
    shards = write_samples(str(tmp_path / "%d.tar"), samples, max_count=3)
    assert [[s["__key__"] for s in read_with_webdataset([p])] for p in shards] == [
        ["k0", "k1", "k2"],
        ["k3", "k4", "k5"],
        ["k6"],
    ]


def test_shards_appear_only_when_complete_and_failures_leave_no_temp_files(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="input failed"):
        with ShardWriter(str(out / "%d.tar"), max_count=2) as writer:
            for i in range(3):
                writer.write({"__key__": f"k{i}", "txt": "x"})
                # the shard being written is a hidden temporary file, never the final name
                assert not (out / f"{len(writer.shards)}.tar").exists()
            raise RuntimeError("input failed")
    assert sorted(os.listdir(out)) == ["0.tar"]  # the finished shard stays, the partial one is gone
    assert [s["__key__"] for s in read_with_webdataset([str(out / "0.tar")])] == ["k0", "k1"]


def test_nothing_written_gives_no_shards(tmp_path):
    with ShardWriter(str(tmp_path / "%d.tar")) as writer:
        pass
    assert writer.close() == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"txt": "no key"}, "needs a str '__key__'"),
        ({"__key__": "a.b", "txt": "x"}, "has a '.' in its last path component"),
        ({"__key__": "/etc/passwd", "txt": "x"}, "absolute path or contains '..'"),
        ({"__key__": "x/../../y", "txt": "x"}, "absolute path or contains '..'"),
        ({"__key__": "dir/", "txt": "x"}, "is empty or ends with '/'"),
        ({"__key__": "k", "txt": 3}, "member 'txt': value must be bytes or str, got int"),
        ({"__key__": "k", "a/b": b"x"}, "bad extension 'a/b'"),
        ({"__key__": "k"}, "has no members"),
    ],
)
def test_bad_samples_are_refused_with_the_reason(tmp_path, sample, message):
    with ShardWriter(str(tmp_path / "%d.tar")) as writer:
        with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
            writer.write(sample)


def test_duplicate_key_in_one_shard_is_refused(tmp_path):
    with ShardWriter(str(tmp_path / "%d.tar")) as writer:
        writer.write({"__key__": "a", "txt": "1"})
        with pytest.raises(ValueError, match="duplicate key 'a'"):
            writer.write({"__key__": "a", "txt": "2"})


@pytest.mark.parametrize(
    "pattern", ["out.tar", "out-{shard:06d.tar", "out-{name}.tar", "s3://bucket/%06d.tar"]
)
def test_bad_patterns_are_refused(tmp_path, pattern):
    with pytest.raises(ValueError, match="pattern|local paths"):
        ShardWriter(pattern if "://" in pattern else str(tmp_path / pattern))


def test_other_dunder_entries_are_ignored(tmp_path):
    shards = write_samples(str(tmp_path / "%d.tar"), [("k", {"txt": "x", "__url__": "elsewhere"})])
    assert read_with_webdataset(shards) == [{"__key__": "k", "txt": b"x"}]


# -- write_from_folder ------------------------------------------------------------------------------


def make_photo_folder(root, count: int = 5) -> list[bytes]:
    images = photo_jpegs(count, seed=5)
    os.makedirs(root / "sub.dir", exist_ok=True)
    for i, data in enumerate(images[:3]):
        (root / f"img{i}.jpg").write_bytes(data)
        (root / f"img{i}.txt").write_text(f"caption {i}", encoding="utf-8")
    (root / "img1.json").write_text('{"source": "test"}')
    (root / "sub.dir" / "photo.v2.JPG").write_bytes(images[3])
    (root / "sub.dir" / "photo.v2.txt").write_text("nested, dotted name")
    (root / "nocaption.jpg").write_bytes(images[4])
    (root / "orphan.txt").write_text("caption without its image")
    (root / "README.md").write_text("not a sample")
    (root / ".hidden.jpg").write_bytes(images[0])
    return images


def test_folder_to_shards(tmp_path):
    src = tmp_path / "photos"
    images = make_photo_folder(src)
    result = write_from_folder(str(src), str(tmp_path / "out" / "%02d.tar"), max_count=2, threads=2)
    got = read_with_webdataset(result.shards)
    assert [s["__key__"] for s in got] == ["img0", "img1", "img2", "sub.dir/photo_v2"]
    assert got[0] == {"__key__": "img0", "jpg": images[0], "txt": b"caption 0"}
    assert got[1]["json"] == b'{"source": "test"}'
    assert got[3] == {"__key__": "sub.dir/photo_v2", "jpg": images[3], "txt": b"nested, dotted name"}
    assert result.samples == 4 and len(result.shards) == 2
    assert result.skipped == [("nocaption", "no .txt caption"), ("orphan", "no image file (txt)")]
    assert result.ignored_files == 1  # README.md


def test_folder_output_does_not_depend_on_file_times_or_creation_order(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    make_photo_folder(first)
    make_photo_folder(second)
    for i, name in enumerate(sorted(os.listdir(second))):
        path = second / name
        if path.is_file():
            os.utime(path, (1_000_000 + i * 7919, 2_000_000_000 - i * 104729))
    a = write_from_folder(str(first), str(tmp_path / "a-%d.tar"), threads=1)
    b = write_from_folder(str(second), str(tmp_path / "b-%d.tar"), threads=3)
    assert [sha256(p) for p in a.shards] == [sha256(p) for p in b.shards]


def test_folder_without_captions_when_allowed(tmp_path):
    src = tmp_path / "photos"
    make_photo_folder(src)
    result = write_from_folder(str(src), str(tmp_path / "%d.tar"), require_caption=False)
    keys = [s["__key__"] for s in read_with_webdataset(result.shards)]
    assert "nocaption" in keys and result.skipped == [("orphan", "no image file (txt)")]


def test_resize_shorter_side_and_orientation(tmp_path):
    big = Image.open(photo_paths()[0]).convert("RGB").resize((600, 400))
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the displayed image is 400 wide, 600 high
    big.save(buf, format="JPEG", quality=90, exif=exif.tobytes())
    data, ext = resize_shorter_side(buf.getvalue(), 200)
    with Image.open(io.BytesIO(data)) as out:
        assert (ext, out.format, out.size) == ("jpg", "JPEG", (200, 300))
        assert 0x0112 not in out.getexif()
    # already small enough: the original bytes, untouched and not upscaled
    small = photo_jpegs(1, seed=9, min_side=100, max_side=120)[0]
    assert resize_shorter_side(small, 200) == (small, "jpg")
    png = io.BytesIO()
    big.convert("RGBA").save(png, format="PNG")
    data, ext = resize_shorter_side(png.getvalue(), 100, ext="png")
    with Image.open(io.BytesIO(data)) as out:
        assert (ext, out.format, out.mode, out.size) == ("jpg", "JPEG", "RGB", (150, 100))


def test_folder_with_resize_is_deterministic_and_skips_undecodable_images(tmp_path):
    src = tmp_path / "photos"
    make_photo_folder(src)
    (src / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (src / "broken.txt").write_text("broken image")
    a = write_from_folder(str(src), str(tmp_path / "a-%d.tar"), resize=64, threads=2)
    b = write_from_folder(str(src), str(tmp_path / "b-%d.tar"), resize=64, threads=1)
    assert [sha256(p) for p in a.shards] == [sha256(p) for p in b.shards]
    assert a.skipped[0][0] == "broken" and a.skipped[0][1].startswith("cannot read or resize image")
    for s in read_with_webdataset(a.shards):
        with Image.open(io.BytesIO(s["jpg"])) as im:
            assert min(im.size) == 64


def test_keys_that_collide_after_dot_replacement_are_refused(tmp_path):
    src = tmp_path / "photos"
    src.mkdir()
    (src / "a.b.jpg").write_bytes(b"x")
    (src / "a_b.jpg").write_bytes(b"y")
    with pytest.raises(ValueError, match="same key 'a_b'"):
        write_from_folder(str(src), str(tmp_path / "%d.tar"))


# -- write_from_table -------------------------------------------------------------------------------


def make_table_inputs(root) -> list[bytes]:
    images = photo_jpegs(3, seed=6)
    (root / "imgs").mkdir(parents=True)
    for i, data in enumerate(images):
        (root / "imgs" / f"{i}.jpg").write_bytes(data)
    return images


def test_csv_table_to_shards(tmp_path):
    images = make_table_inputs(tmp_path)
    table = tmp_path / "captions.csv"
    with open(table, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "text", "url"])
        w.writerow(["first", "imgs/0.jpg", "a café, ünïcode", "http://x/0"])
        w.writerow(["second", "imgs/missing.jpg", "gone", "http://x/1"])
        w.writerow(["third", "imgs/2.jpg", "third", "http://x/2"])
    result = write_from_table(
        str(table),
        str(tmp_path / "out-%d.tar"),
        image_col="path",
        caption_col="text",
        key_col="id",
        json_cols=["url"],
    )
    got = read_with_webdataset(result.shards)
    assert got == [
        {
            "__key__": "first",
            "jpg": images[0],
            "txt": "a café, ünïcode".encode(),
            "json": b'{"url": "http://x/0"}',
        },
        {"__key__": "third", "jpg": images[2], "txt": b"third", "json": b'{"url": "http://x/2"}'},
    ]
    assert result.skipped == [("second", f"row 1: image file not found: {tmp_path}/imgs/missing.jpg")]


def test_parquet_table_with_paths_and_with_image_bytes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = make_table_inputs(tmp_path)
    pq.write_table(
        pa.table({"image": ["imgs/0.jpg", "imgs/1.jpg"], "caption": ["zero", None]}),
        tmp_path / "paths.parquet",
    )
    result = write_from_table(str(tmp_path / "paths.parquet"), str(tmp_path / "p-%d.tar"))
    assert read_with_webdataset(result.shards) == [{"__key__": "000000000", "jpg": images[0], "txt": b"zero"}]
    assert result.skipped == [("000000001", "row 1: empty 'caption'")]

    pq.write_table(
        pa.table(
            {
                "jpg": [images[2], b"not an image"],
                "caption": ["two", "bad"],
                "meta": [json.dumps({"w": 1}), "x"],
            }
        ),
        tmp_path / "bytes.parquet",
    )
    result = write_from_table(
        str(tmp_path / "bytes.parquet"), str(tmp_path / "b-%d.tar"), image_col="jpg", json_cols=["meta"]
    )
    assert read_with_webdataset(result.shards) == [
        {"__key__": "000000000", "jpg": images[2], "txt": b"two", "json": b'{"meta": "{\\"w\\": 1}"}'}
    ]
    assert result.skipped == [("000000001", "row 1: 'jpg' bytes are not an image")]


def test_table_with_a_missing_column_names_it(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("path,text\nimgs/0.jpg,x\n")
    with pytest.raises(ValueError, match=r"no column\(s\) \['image', 'caption'\]"):
        write_from_table(str(table), str(tmp_path / "%d.tar"))
