"""`shardstream index`: the dataset index with counts, offsets and the invalid samples found."""

from __future__ import annotations

import gzip
import json
import os
import tarfile

from corpus import build_corrupt_corpus, good_shard
from index_layout import read_layout
from servers import RangeHTTPServer
from shardstream.cli import main


def load_index(path: str) -> dict:
    """What `shardstream index -o` wrote: the folder layout (read as docs/epoch-plan.md
    describes it) or a version-1 JSON file."""
    if os.path.isdir(path):
        return read_layout(path)
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def offsets_of(entry: dict) -> list[int]:
    raw = entry["offsets"]
    if isinstance(raw, list):
        return raw
    total, out = 0, []
    for value in raw["values"]:
        total += value * raw["unit"]
        out.append(total)
    return out


def sample_starts(path: str) -> list[int]:
    """Where each sample's first member header starts, read with Python's tarfile."""
    starts, last_key = [], None
    with tarfile.open(path) as tar:
        for member in tar:
            key = member.name.split(".", 1)[0]
            if key != last_key:
                starts.append(member.offset)
                last_key = key
    return starts


def test_index_records_counts_offsets_keys_and_invalid_samples(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus))
    shards = [good_shard(str(tmp_path / "a.tar"), 5, seed=1), str(corpus / "bitflip_jpeg.tar"),
              str(corpus / "duplicate_keys.tar"), str(corpus / "truncated.tar")]  # fmt: skip
    out = str(tmp_path / "data.index")
    assert main(["index", *shards, "-o", out]) == 0
    printed = capsys.readouterr().out
    assert (
        "indexed 4 shards" in printed and "warning: " in printed and "truncated.tar: truncated_tar" in printed
    )
    index = load_index(out)
    entries = index["shards"]
    assert [e["url"] for e in entries] == shards
    assert [e["num_samples"] for e in entries[:3]] == [5, 3, 4]
    assert entries[0].get("invalid", []) == []
    assert [(i["ordinal"], i["key"], i["reason"]) for i in entries[1]["invalid"]] == [
        (1, "b", "corrupt_image")
    ]
    assert [(i["ordinal"], i["key"], i["reason"]) for i in entries[2]["invalid"]] == [
        (2, "a", "duplicate_key"), (3, "c", "duplicate_member")]  # fmt: skip
    for entry, path in zip(entries[:2], shards[:2], strict=True):
        offsets = offsets_of(entry)
        assert offsets[:-1] == sample_starts(path)
        assert len(offsets) == entry["num_samples"] + 1
    assert entries[0]["keys"] == [f"s{i:04d}" for i in range(5)]


def test_no_decode_index_records_structural_defects_only(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus))
    out = str(tmp_path / "data.index")
    assert (
        main(
            [
                "index",
                str(corpus / "bitflip_jpeg.tar"),
                str(corpus / "bad_utf8.tar"),
                "-o",
                out,
                "--no-decode",
            ]
        )
        == 0
    )
    entries = load_index(out)["shards"]
    assert entries[0].get("invalid", []) == []  # the corrupt JPEG needs a decode to be found
    assert [(i["key"], i["reason"]) for i in entries[1]["invalid"]] == [("b", "bad_utf8")]
    assert "structure only" in capsys.readouterr().out


def test_unreadable_shard_means_no_index(tmp_path, capsys):
    good = good_shard(str(tmp_path / "a.tar"), 2)
    out = tmp_path / "data.index"
    with RangeHTTPServer(str(tmp_path)) as server:
        status = main(["index", server.url("a.tar"), server.url("gone.tar"), "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert "gone.tar" in err and "no index written" in err
    assert os.path.exists(good)


def test_training_with_the_index_yields_exactly_the_valid_samples(tmp_path, capsys):
    from shardstream import ShardLoader

    corpus = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus))
    shards = [good_shard(str(tmp_path / "a.tar"), 5, seed=1), str(corpus / "duplicate_keys.tar"),
              str(corpus / "bad_utf8.tar"), str(corpus / "missing_caption.tar")]  # fmt: skip
    out = str(tmp_path / "data.index")
    assert main(["index", *shards, "-o", out, "-q"]) == 0
    loader = ShardLoader(shards, index=out, batch_size=1, image_size=32, drop_last=False, threads=1)
    keys = sorted(key for batch in loader for key in batch.keys)
    # a.tar: 5; duplicate_keys.tar: "a" and "b" (the second "a" and "c" are invalid);
    # bad_utf8.tar: "a"; missing_caption.tar: "a".
    assert keys == sorted([f"s{i:04d}" for i in range(5)] + ["a", "b", "a", "a"])
    assert len(loader) == len(keys)


def test_index_from_img2dataset_stats(tmp_path, capsys):
    paths = [
        good_shard(str(tmp_path / f"{i:05d}.tar"), count=n, seed=i, prefix=f"p{i}_")
        for i, n in enumerate([3, 5])
    ]
    for i, n in enumerate([3, 5]):
        (tmp_path / f"{i:05d}_stats.json").write_text(json.dumps({"count": n, "successes": n}))
    out = str(tmp_path / "i2d.index")
    assert main(["index", *paths, "-o", out, "--from-img2dataset-stats"]) == 0
    index = load_index(out)
    assert [(s["url"], s["num_samples"]) for s in index["shards"]] == [(paths[0], 3), (paths[1], 5)]
    assert "offsets" not in index["shards"][0]
    os.unlink(tmp_path / "00001_stats.json")
    assert main(["index", *paths, "-o", out, "--from-img2dataset-stats"]) == 2
    assert "00001_stats.json" in capsys.readouterr().err


def test_an_index_of_relative_paths_is_read_from_any_working_directory(tmp_path, monkeypatch):
    """`shardstream index data/x/*.tar -o data/x.index` records absolute paths: a loader started
    elsewhere, with the index alone or with the shards named from its own directory, reads them."""
    from shardstream import ShardLoader

    (tmp_path / "data" / "x").mkdir(parents=True)
    for i in range(2):
        good_shard(str(tmp_path / "data" / "x" / f"{i}.tar"), 3, seed=i, prefix=f"p{i}-")
    monkeypatch.chdir(tmp_path)
    assert main(["index", "data/x/*.tar", "-o", "data/x.index", "-q"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for urls in (None, "../data/x/*.tar", str(tmp_path / "data" / "x")):
        loader = ShardLoader(urls, index="../data/x.index", batch_size=2, image_size=16, threads=1)
        keys = sorted(k for batch in loader for k in batch.keys)
        assert len(keys) == 6 and keys[0].startswith("p0-"), urls
