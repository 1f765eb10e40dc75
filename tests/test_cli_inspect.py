"""`shardstream inspect`: the first samples with members, sizes, image dimensions and captions."""

from __future__ import annotations

import io
import json
import os

from corpus import build_corrupt_corpus, good_samples, good_shard
from PIL import Image
from servers import RangeHTTPServer
from shardstream.cli import main

WDS_DATA = "/work/shared/data/webdataset-testdata"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["inspect", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_text_view_shows_members_sizes_dimensions_and_captions(tmp_path, capsys):
    shard = good_shard(str(tmp_path / "s.tar"), 4, seed=3)
    (key0, sample0), (key1, _) = good_samples(2, seed=3)
    with Image.open(io.BytesIO(sample0["jpg"])) as im:
        width, height = im.size
    status, out, err = run(capsys, shard, "-n", "2")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"#0 key '{key0}'  ({shard})"
    assert lines[1].split() == ["jpg", f"{len(sample0['jpg']):,}", "B", "jpeg", f"{width}x{height}"]
    assert lines[2].split()[:3] == ["json", str(len(sample0["json"])), "B"]
    assert lines[3] == f"  txt      {len(sample0['txt']):>10,} B  {json.dumps(sample0['txt'])}"
    assert lines[4] == f"#1 key '{key1}'  ({shard})"
    assert len(lines) == 8  # exactly two samples


def test_json_lines(tmp_path, capsys):
    shard = good_shard(str(tmp_path / "s.tar"), 3, seed=4)
    status, out, _ = run(capsys, shard, "--json", "-n", "5")
    records = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [r["key"] for r in records] == ["s0000", "s0001", "s0002"]
    jpg = records[0]["members"][0]
    assert jpg["ext"] == "jpg" and jpg["format"] == "jpeg" and jpg["width"] > 0 and jpg["height"] > 0
    assert records[0]["members"][2] == {"ext": "txt", "bytes": 26, "text": "photo number 0 from seed 4"}


def test_webdataset_mnist_shard(capsys):
    status, out, _ = run(capsys, os.path.join(WDS_DATA, "sample.tgz"), "-n", "1", "--json")
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and record["key"] == "10"
    members = {m["ext"]: m for m in record["members"]}
    assert (members["png"]["format"], members["png"]["width"], members["png"]["height"]) == ("png", 28, 28)
    assert members["cls"]["text"].strip().isdigit()


def test_long_text_is_cut_and_bad_text_or_images_are_named(tmp_path, capsys):
    corpus_dir = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus_dir))
    status, out, _ = run(capsys, str(corpus_dir / "bad_utf8.tar"), "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and records[1]["members"][1]["error"].startswith("not UTF-8:")
    status, out, _ = run(capsys, str(corpus_dir / "bitflip_jpeg.tar"))
    assert status == 0 and "ERROR corrupt_image" in out.split("#1 key 'b'")[1].split("#2")[0]
    status, out, _ = run(capsys, str(corpus_dir / "good.tar"), "--width", "10", "--json", "-n", "1")
    txt = json.loads(out)["members"][2]
    assert txt["text"] == "photo n..." and txt["bytes"] == 26


def test_truncated_shard_shows_what_it_can_then_exits_1(tmp_path, capsys):
    corpus_dir = tmp_path / "corpus"
    build_corrupt_corpus(str(corpus_dir))
    status, out, err = run(capsys, str(corpus_dir / "truncated.tar"), "-n", "10")
    assert status == 1
    assert "#0 key 's0000'" in out
    assert "truncated_tar" in err and "truncated.tar" in err


def test_unreadable_and_remote(tmp_path, capsys):
    status, out, err = run(capsys, str(tmp_path / "absent.tar"))
    assert status == 2 and out == "" and "absent.tar" in err
    good_shard(str(tmp_path / "s.tar"), 2)
    with RangeHTTPServer(str(tmp_path)) as server:
        status, out, _ = run(capsys, server.url("s.tar") + "?sig=hidden-signature", "-n", "1")
        missing_status, _, missing_err = run(capsys, server.url("gone.tar"))
    assert status == 0 and "#0 key 's0000'" in out and "hidden-signature" not in out
    assert missing_status == 2 and "gone.tar" in missing_err
