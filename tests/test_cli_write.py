"""`shardstream write`: folders and tables to shards that validate and read back identically."""

from __future__ import annotations

import csv
import hashlib
import json
import os

import pytest
from corpus import photo_jpegs
from shardstream.cli import main

SHARED_DATA = "/work/shared/data"


def sha256s(paths) -> list[str]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(hashlib.sha256(f.read()).hexdigest())
    return out


def read_with_webdataset(paths) -> list[dict]:
    import webdataset as wds

    return [
        {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
        for s in wds.WebDataset(sorted(paths), shardshuffle=False)
    ]


def make_folder(root, count: int = 7) -> list[bytes]:
    images = photo_jpegs(count, seed=11)
    root.mkdir(parents=True)
    for i, data in enumerate(images):
        (root / f"{i:03d}.jpg").write_bytes(data)
        (root / f"{i:03d}.txt").write_text(f"caption {i} — ünïcödé", encoding="utf-8")
    return images


def test_folder_to_shards_that_validate_and_read_back(tmp_path, capsys):
    images = make_folder(tmp_path / "src")
    pattern = str(tmp_path / "out" / "shard-%06d.tar")
    assert main(["write", str(tmp_path / "src"), "-o", pattern, "--max-count", "3"]) == 0
    out = capsys.readouterr().out
    assert "wrote 7 samples in 3 shards" in out
    shards = sorted(str(tmp_path / "out" / n) for n in os.listdir(tmp_path / "out"))
    assert [os.path.basename(s) for s in shards] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    got = read_with_webdataset(shards)
    assert got == [
        {"__key__": f"{i:03d}", "jpg": img, "txt": f"caption {i} — ünïcödé".encode()}
        for i, img in enumerate(images)
    ]
    report = tmp_path / "report.json"
    assert main(["validate", *shards, "--json", str(report)]) == 0
    totals = json.loads(report.read_text())["totals"]
    assert (totals["shards"], totals["samples"], totals["invalid_samples"]) == (3, 7, 0)


def test_write_twice_gives_identical_bytes_also_with_resize(tmp_path):
    make_folder(tmp_path / "src")
    for flags in ([], ["--resize", "48", "--quality", "80"]):
        runs = []
        for run in ("a", "b"):
            out = tmp_path / f"{run}{len(flags)}"
            assert (
                main(["write", str(tmp_path / "src"), "-o", str(out / "{shard:03d}.tar"), "-q", *flags]) == 0
            )
            runs.append(sha256s(sorted(str(out / n) for n in os.listdir(out))))
        assert runs[0] == runs[1]


def test_max_size_is_respected(tmp_path):
    make_folder(tmp_path / "src")
    out = tmp_path / "out"
    assert main(["write", str(tmp_path / "src"), "-o", str(out / "%d.tar"), "--max-size", "12kB", "-q"]) == 0
    sizes = [os.path.getsize(out / n) for n in os.listdir(out)]
    assert len(sizes) >= 4 and max(sizes) <= 12_000


def test_real_captions_from_a_parquet_table(tmp_path):
    """Captions: the img2dataset test table (real web alt-texts); images: real photos on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    captions = (
        pq.read_table(os.path.join(SHARED_DATA, "img2dataset-test_1000.parquet")).column("TEXT").to_pylist()
    )
    captions = [c for c in captions if c][:20]
    images = photo_jpegs(len(captions), seed=12)
    (tmp_path / "img").mkdir()
    for i, data in enumerate(images):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(data)
    table = tmp_path / "table.parquet"
    pq.write_table(
        pa.table(
            {
                "file": [f"img/{i}.jpg" for i in range(len(captions))],
                "TEXT": captions,
                "id": [f"sample{i:05d}" for i in range(len(captions))],
            }
        ),
        table,
    )
    out = tmp_path / "out"
    argv = ["write", str(table), "-o", str(out / "%02d.tar"), "--image-col", "file", "--caption-col", "TEXT"]
    assert main([*argv, "--key-col", "id", "--json-cols", "file", "--max-count", "8", "-q"]) == 0
    got = read_with_webdataset(str(out / n) for n in os.listdir(out))
    assert [s["txt"].decode() for s in got] == captions
    assert [s["jpg"] for s in got] == images
    assert json.loads(got[3]["json"]) == {"file": "img/3.jpg"}
    assert main(["validate", str(out / "{00..02}.tar"), "-q"]) == 0


def test_csv_table(tmp_path, capsys):
    images = photo_jpegs(2, seed=13)
    for i, data in enumerate(images):
        (tmp_path / f"{i}.jpg").write_bytes(data)
    with open(tmp_path / "t.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerows([["image", "caption"], ["0.jpg", "zero"], ["1.jpg", "one"], ["nope.jpg", "missing"]])
    assert main(["write", str(tmp_path / "t.csv"), "-o", str(tmp_path / "out" / "%d.tar")]) == 0
    captured = capsys.readouterr()
    assert "wrote 2 samples in 1 shards" in captured.out
    assert "skipped 1 inputs:" in captured.err and "000000002: row 2: image file not found" in captured.err
    got = read_with_webdataset([str(tmp_path / "out" / "0.tar")])
    assert got == [
        {"__key__": "000000000", "jpg": images[0], "txt": b"zero"},
        {"__key__": "000000001", "jpg": images[1], "txt": b"one"},
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["write", "{tmp}/nowhere", "-o", "{tmp}/%d.tar"], "source not found"),
        (["write", "{tmp}/src", "-o", "{tmp}/fixed.tar"], "has no shard number"),
        (["write", "{tmp}/src", "-o", "{tmp}/%d.tar", "--key-col", "id"], "--key-col only apply to a table"),
        (["write", "{tmp}/empty", "-o", "{tmp}/%d.tar"], "no samples found"),
        (["write", "{tmp}/table.xlsx", "-o", "{tmp}/%d.tar"], "table must be .csv, .tsv or .parquet"),
        (["write", "{tmp}/src", "-o", "{tmp}/%d.tar", "--max-size", "lots"], "not a size: 'lots'"),
        (["write", "{tmp}/src", "-o", "{tmp}/%d.tar", "--max-count", "0"], "must be >= 1"),
        (["write", "{tmp}/src"], "the following arguments are required: -o/--output"),
    ],
)
def test_bad_usage_exits_2_with_a_clear_message(tmp_path, capsys, argv, message):
    make_folder(tmp_path / "src", count=1)
    (tmp_path / "empty").mkdir()
    (tmp_path / "table.xlsx").write_bytes(b"")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
