"""`shardstream validate` and `shardstream index` on Parquet files: each bad-file case with its own
typed reason, and a file that is no shard at all refused by the index (exit status 2)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus import photo_jpegs, write_file
from parquet_corpus import samples_for, write_img2dataset
from shardstream.cli import main

ARGS = ["--caption-key", "caption", "--image-keys", "jpg"]


def validate(capsys, tmp_path, *paths: str) -> tuple[int, dict]:
    out = str(tmp_path / "report.json")
    status = main(["validate", *paths, *ARGS, "--json", out])
    capsys.readouterr()
    with open(out, encoding="utf-8") as f:
        return status, json.load(f)


def table(images, captions=None) -> pa.Table:
    n = len(images)
    return pa.table(
        {
            "key": pa.array([f"k{i}" for i in range(n)]),
            "caption": pa.array(captions or [f"caption {i}" for i in range(n)]),
            "jpg": images,
        }
    )


@pytest.fixture(scope="module")
def jpegs():
    return photo_jpegs(6, seed=11)


def test_each_bad_file_reports_its_own_reason(jpegs, tmp_path, capsys):
    good = write_img2dataset(str(tmp_path / "good.parquet"), samples_for(0, 6, 11), 2)
    pq.write_table(table(pa.array(jpegs)).drop_columns(["jpg"]), str(tmp_path / "no_image_column.parquet"))
    pq.write_table(table(pa.array(list(range(6)))), str(tmp_path / "numbers_for_images.parquet"))
    with_null = list(jpegs)
    with_null[2] = None
    pq.write_table(
        table(pa.array(with_null, pa.binary())), str(tmp_path / "null_image.parquet"), row_group_size=2
    )
    # A data page whose compressed bytes are damaged: snappy cannot decode it.
    data = bytearray(open(good, "rb").read())
    meta = pq.ParquetFile(good).metadata.row_group(1).column(2)
    for at in range(meta.data_page_offset + 40, meta.data_page_offset + 400, 7):
        data[at] ^= 0x5A
    write_file(str(tmp_path / "corrupt_page.parquet"), bytes(data))
    names = ["good", "no_image_column", "numbers_for_images", "null_image", "corrupt_page"]
    status, report = validate(capsys, tmp_path, *(str(tmp_path / f"{n}.parquet") for n in names))
    fatal = {s["url"].rsplit("/", 1)[-1]: (s["fatal"] or {}).get("reason") for s in report["shards"]}
    assert fatal == {
        "good.parquet": None,
        "no_image_column.parquet": "missing_column",
        "numbers_for_images.parquet": "wrong_type",
        "null_image.parquet": None,
        "corrupt_page.parquet": "corrupt_parquet",
    }
    invalid = [(i["shard"].rsplit("/", 1)[-1], i["key"], i["reason"]) for i in report["invalid"]]
    assert ("null_image.parquet", "k2", "null_image") in invalid
    assert not [i for i in invalid if i[0] in ("good.parquet", "null_image.parquet") and i[1] != "k2"]
    assert status == 1
    shards = {s["url"].rsplit("/", 1)[-1]: s for s in report["shards"]}
    assert shards["good.parquet"]["samples"] == 6 and shards["null_image.parquet"]["samples"] == 6
    assert 2 <= shards["corrupt_page.parquet"]["samples"] < 6, "the rows before the damaged page count"
    detail = next(s for s in report["shards"] if s["url"].endswith("no_image_column.parquet"))["fatal"][
        "detail"
    ]
    assert "jpg" in detail and "caption (string)" in detail, (
        "the error names the column and what the file has"
    )


def test_a_file_that_is_not_a_shard_is_an_error_unless_keep_going(jpegs, tmp_path, capsys):
    good = write_img2dataset(str(tmp_path / "good.parquet"), samples_for(0, 4, 2), 2)
    stranger = write_file(str(tmp_path / "notes.tar"), b"these are my notes, not a tar archive\n" * 40)
    status = main(["index", good, stranger, "-o", str(tmp_path / "idx"), *ARGS])
    err = capsys.readouterr().err
    assert status == 2
    assert "notes.tar is not a shard" in err
    assert not (tmp_path / "idx").exists(), "no index written"
    status = main(["index", good, stranger, "-o", str(tmp_path / "idx"), *ARGS, "--keep-going"])
    out = capsys.readouterr().out
    assert status == 0 and "notes.tar" in out
    # The Parquet file itself is indexed as a shard (before, it was a 0-sample "corrupt tar").
    from shardstream.index import load_index

    assert load_index(str(tmp_path / "idx")).num_samples == 4
