"""read_samples: tar variants, grouping equal to webdataset's, and broken shards."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile

import pytest
import shardstream
from corpus import good_samples, sample_members, tar_bytes, write_file
from shardstream.errors import ShardError

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "webdataset-testdata")
if not os.path.isdir(DATA):  # CI clones next to shared/, a session works in /work/main
    DATA = "/work/shared/data/webdataset-testdata"


def webdataset_samples(path: str) -> list[dict]:
    from webdataset.tariterators import tarfile_samples

    return [{k: v for k, v in s.items() if k != "__local_path__"} for s in tarfile_samples([{"url": path}])]


def ours(path: str, **kw) -> list[dict]:
    return list(shardstream.read_samples(path, **kw))


@pytest.mark.parametrize("name", ["sample.tgz", "compressed.tar", "testgz.tar"])
def test_grouping_equals_webdataset_on_third_party_shards(name, tmp_path):
    path = os.path.join(DATA, name)
    expected = webdataset_samples(path)
    got = ours(path)
    assert len(got) == len(expected) > 0
    assert got == expected


def _tarfile(path, members, fmt, mode="w"):
    with tarfile.open(path, mode, format=fmt) as tf:
        for name, data in members:
            if data is None:  # a directory
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
                continue
            if isinstance(data, tuple):  # a link
                info = tarfile.TarInfo(name)
                info.type, info.linkname = data
                tf.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def _variant_members():
    long_dir = "/".join(["a.very.long.folder.name"] * 8)  # > 100 chars, dots in folders
    samples = good_samples(4, seed=3)
    members: list = [("dir/", None)]
    for key, s in samples:
        members += sample_members(f"{long_dir}/{key}", s)
    members += [("link.jpg", (tarfile.SYMTYPE, "x.jpg")), ("hard.txt", (tarfile.LNKTYPE, "x.txt"))]
    members += [("__meta__", b"skip me"), ("noext", b"no extension: belongs to no sample")]
    members += sample_members("UPPER", {"JPG": samples[0][1]["jpg"], "Txt": "case"})
    return members


@pytest.mark.parametrize(
    "fmt,mode,suffix",
    [
        (tarfile.PAX_FORMAT, "w", ".tar"),
        (tarfile.GNU_FORMAT, "w", ".tar"),
        (tarfile.USTAR_FORMAT, "w", ".tar"),
        (tarfile.PAX_FORMAT, "w:gz", ".tar.gz"),
        (tarfile.GNU_FORMAT, "w:gz", ".tgz"),
    ],
)
def test_tar_variants_group_like_webdataset(tmp_path, fmt, mode, suffix):
    members = _variant_members()
    if fmt == tarfile.USTAR_FORMAT:  # ustar holds long paths only through its prefix field
        members = [(n.replace("a.very.long.folder.name/", "f/", 6), d) for n, d in members]
    path = _tarfile(tmp_path / f"shard{suffix}", members, fmt, mode)
    got = ours(path)
    assert got == webdataset_samples(path)
    assert len(got) == 5
    assert got[-1]["__key__"] == "UPPER" and set(got[-1]) == {"__key__", "__url__", "jpg", "txt"}
    assert all(len(s["__key__"]) > 100 for s in got[:4]) or fmt == tarfile.USTAR_FORMAT


def test_gzip_detected_by_content_without_suffix(tmp_path):
    plain = _tarfile(tmp_path / "p.tar", _variant_members(), tarfile.PAX_FORMAT)
    gz = tmp_path / "shard-without-suffix"
    with open(plain, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    assert ours(str(gz)) == [dict(s, __url__=str(gz)) for s in ours(plain)]


def test_missing_end_blocks_and_trailing_garbage_are_tolerated(tmp_path):
    samples = good_samples(3, seed=1)
    members = [m for k, s in samples for m in sample_members(k, s)]
    no_end = write_file(str(tmp_path / "noend.tar"), tar_bytes(members, end=False))
    garbage = write_file(str(tmp_path / "garbage.tar"), tar_bytes(members) + os.urandom(3000))
    for path in (no_end, garbage):
        got = ours(path)
        assert [s["__key__"] for s in got] == [k for k, _ in samples]
        assert got[1]["jpg"] == samples[1][1]["jpg"]


def test_truncated_shard_raises_with_url_and_reason_or_is_skipped(tmp_path):
    samples = good_samples(4, seed=2)
    members = [m for k, s in samples for m in sample_members(k, s)]
    data = tar_bytes(members)
    cut = len(data) // 2 + 100
    path = write_file(str(tmp_path / "cut.tar"), data[:cut])
    with pytest.raises(ShardError) as info:
        ours(path)
    assert info.value.reason == "truncated_tar"
    assert "cut.tar" in str(info.value)
    got = ours(path, on_error="skip")
    # Only complete samples come through; the one cut in half is not passed on.
    assert 0 < len(got) < 4
    for s in got:
        assert s == {
            "__key__": s["__key__"],
            "__url__": path,
            **{k: (v.encode() if isinstance(v, str) else v) for k, v in dict(samples)[s["__key__"]].items()},
        }


def test_duplicate_extension_in_one_sample_is_an_error(tmp_path):
    img = good_samples(1)[0][1]["jpg"]
    path = write_file(str(tmp_path / "dup.tar"), tar_bytes([("a.jpg", img), ("a.txt", b"x"), ("a.jpg", img)]))
    with pytest.raises(ShardError) as info:
        ours(path)
    assert info.value.reason == "duplicate_member" and info.value.key == "a"


def test_url_lists_and_brace_expansion(tmp_path):
    for i in range(3):
        samples = good_samples(2, seed=i, prefix=f"k{i}_")
        write_file(
            str(tmp_path / f"s-{i:03d}.tar"), tar_bytes([m for k, s in samples for m in sample_members(k, s)])
        )
    braces = ours(str(tmp_path / "s-{000..002}.tar"))
    listed = ours(f"{tmp_path}/s-000.tar::{tmp_path}/s-001.tar::{tmp_path}/s-002.tar")
    assert [s["__key__"] for s in braces] == [f"k{i}_{j:04d}" for i in range(3) for j in range(2)]
    assert braces == listed == ours([str(tmp_path / f"s-{i:03d}.tar") for i in range(3)])


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ShardError) as info:
        ours(str(tmp_path / "nope.tar"))
    assert "nope.tar" in str(info.value)


def test_pipe_urls_are_refused():
    with pytest.raises(ShardError):
        ours("pipe:curl -s http://127.0.0.1/x.tar")
