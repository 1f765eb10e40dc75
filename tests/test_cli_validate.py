"""`shardstream validate`: exact reports on a corpus of corrupt and hostile shards, on the
third-party webdataset test shards, over HTTP and S3, and its exit statuses."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from corpus import (
    Expected,
    build_corrupt_corpus,
    corrupt_jpeg,
    good_samples,
    good_shard,
    sample_members,
    tar_bytes,
    write_file,
)
from servers import RangeHTTPServer, SeaweedS3
from shardstream.cli import main

WDS_DATA = "/work/shared/data/webdataset-testdata"
# Defects only a decode can see; `--no-decode` must not report them.
DECODE_REASONS = {"corrupt_image", "unsupported_format", "too_many_pixels"}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> tuple[str, dict[str, Expected]]:
    directory = str(tmp_path_factory.mktemp("corpus"))
    return directory, build_corrupt_corpus(directory)


def run_validate(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["validate", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def shard_name(url: str) -> str:
    return url.split("?", 1)[0].rsplit("/", 1)[-1]


def observed(report: dict) -> dict[str, Expected]:
    """The report in the corpus' terms: per shard file name, samples, (key, reason), fatal."""
    out = {}
    for shard in report["shards"]:
        invalid = tuple((i["key"], i["reason"]) for i in report["invalid"] if i["shard"] == shard["url"])
        fatal = shard["fatal"]["reason"] if shard["fatal"] else None
        out[shard_name(shard["url"])] = Expected(shard["samples"], invalid, fatal)
    return out


def without_timing(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("elapsed_s", "world_size")}


def test_corrupt_corpus_gives_the_exact_report(corpus_dir, tmp_path, capsys):
    directory, expected = corpus_dir
    paths = [os.path.join(directory, name) for name in sorted(expected)]
    status, out, _ = run_validate(
        capsys, *paths, "--json", str(tmp_path / "r.json"), "--max-member-bytes", "1MiB"
    )
    report = load(tmp_path / "r.json")
    assert observed(report) == {name: expected[name] for name in sorted(expected)}
    assert status == 1 and report["exit_status"] == 1
    # Ordinals are positions in the shard; invalid samples are listed in input order.
    for item in report["invalid"]:
        shard = next(s for s in report["shards"] if s["url"] == item["shard"])
        assert 0 <= item["ordinal"] < shard["samples"] and item["detail"]
    assert [shard_name(s["url"]) for s in report["shards"]] == sorted(expected)
    reasons = [reason for e in expected.values() for _, reason in e.invalid]
    assert report["by_reason"] == {r: reasons.count(r) for r in sorted(set(reasons))}
    totals = report["totals"]
    assert totals["shards"] == len(expected)
    assert totals["samples"] == sum(e.samples for e in expected.values())
    assert totals["invalid_samples"] == len(reasons)
    assert totals["valid_samples"] == totals["samples"] - len(reasons)
    assert totals["corrupt_shards"] == sum(1 for e in expected.values() if e.fatal)
    assert totals["unreadable_shards"] == 0
    assert report["options"]["max_member_bytes"] == 1 << 20 and report["options"]["decode"] is True
    assert f"invalid samples: {len(reasons)} of {totals['samples']}" in out
    assert "result: INVALID samples found (exit status 1)" in out


def test_the_report_does_not_depend_on_thread_count(corpus_dir, tmp_path, capsys):
    directory, expected = corpus_dir
    paths = [os.path.join(directory, name) for name in sorted(expected)]
    reports = []
    for threads in ("1", "5"):
        run_validate(capsys, *paths, "--threads", threads, "--json", str(tmp_path / f"{threads}.json"))
        reports.append(without_timing(load(tmp_path / f"{threads}.json")))
    assert reports[0] == reports[1]


def test_no_decode_reports_exactly_the_structural_defects(corpus_dir, tmp_path, capsys):
    directory, expected = corpus_dir
    paths = [os.path.join(directory, name) for name in sorted(expected)]
    args = ("--no-decode", "--max-member-bytes", "1MiB", "--json", str(tmp_path / "r.json"))
    status, out, _ = run_validate(capsys, *paths, *args)
    structural = {
        name: Expected(e.samples, tuple(i for i in e.invalid if i[1] not in DECODE_REASONS), e.fatal)
        for name, e in sorted(expected.items())
    }
    assert observed(load(tmp_path / "r.json")) == structural
    assert status == 1 and "[structure only, no decode]" in out


def test_limits_are_options(corpus_dir, tmp_path, capsys):
    directory, _ = corpus_dir
    # Default member limit (256 MiB): the 2 MiB member is fine.
    status, _, _ = run_validate(capsys, os.path.join(directory, "member_too_large.tar"))
    assert status == 0
    # A low pixel limit rejects the ordinary photos too.
    status, _, _ = run_validate(
        capsys,
        os.path.join(directory, "good.tar"),
        "--max-pixels",
        "1000",
        "--json",
        str(tmp_path / "r.json"),
    )
    report = load(tmp_path / "r.json")
    assert status == 1 and report["by_reason"] == {"too_many_pixels": 4}


def test_optional_caption_still_checks_images_and_present_captions(tmp_path, capsys):
    """--require image: a missing caption is fine, but images are still decoded and a caption
    that is there must still be UTF-8."""
    (_, first), (_, second) = good_samples(2, seed=21)
    members = (
        sample_members("a", {"jpg": first["jpg"]})
        + sample_members("b", {"jpg": corrupt_jpeg(second["jpg"])})
        + sample_members("c", {"jpg": first["jpg"], "txt": b"\xff"})
    )
    shard = write_file(str(tmp_path / "s.tar"), tar_bytes(members))
    status, _, _ = run_validate(capsys, shard, "--require", "image", "--json", str(tmp_path / "r.json"))
    report = load(tmp_path / "r.json")
    assert status == 1
    assert [(i["key"], i["reason"]) for i in report["invalid"]] == [("b", "corrupt_image"), ("c", "bad_utf8")]


def test_caption_from_a_json_field(tmp_path, capsys):
    (_, first), (_, second) = good_samples(2, seed=22)
    members = sample_members("a", {"jpg": first["jpg"], "json": '{"caption": "from json"}'}) + sample_members(
        "b", {"jpg": second["jpg"], "json": '{"other": 1}'}
    )
    shard = write_file(str(tmp_path / "s.tar"), tar_bytes(members))
    status, _, _ = run_validate(
        capsys, shard, "--caption-key", "json:caption", "--json", str(tmp_path / "r.json")
    )
    assert status == 1
    assert [(i["key"], i["reason"]) for i in load(tmp_path / "r.json")["invalid"]] == [
        ("b", "missing_caption")
    ]


def test_clean_shards_exit_0_with_a_summary(tmp_path, capsys):
    paths = [good_shard(str(tmp_path / f"shard-{i:02d}.tar"), 5, seed=i) for i in range(3)]
    status, out, err = run_validate(
        capsys, str(tmp_path / "shard-{00..02}.tar"), "--json", str(tmp_path / "r.json")
    )
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("checked 3 shards, 15 samples, ")
    assert lines[0].endswith("[decoded]")
    assert lines[-1] == "result: all samples valid (exit status 0)"
    report = load(tmp_path / "r.json")
    assert report["format"] == "shardstream-validate/1"
    assert [s["url"] for s in report["shards"]] == paths
    assert report["invalid"] == [] and report["shard_errors"] == []
    status, out, _ = run_validate(capsys, *paths, "-q")
    assert out == "result: all samples valid (exit status 0)\n"


def test_summary_names_reasons_worst_shards_and_samples(corpus_dir, capsys):
    directory, _ = corpus_dir
    names = ("bitflip_jpeg.tar", "missing_caption.tar", "truncated.tar", "good.tar")
    status, out, _ = run_validate(capsys, *(os.path.join(directory, n) for n in names), "--worst", "2")
    assert status == 1
    assert "  missing_caption               2" in out
    assert "  corrupt_image                 1" in out
    assert "shards with a fatal error: 1\n  truncated_tar" in out
    worst = out.split("worst shards (of 3 with errors):\n")[1].splitlines()[:3]
    assert worst[0].split() == [
        "2",
        "invalid",
        "of",
        "3",
        "samples",
        os.path.join(directory, "missing_caption.tar"),
    ]
    assert worst[1].split()[:2] == ["1", "invalid"] and "bitflip_jpeg.tar" in worst[1]
    assert worst[2].startswith("invalid samples:")
    assert f"{os.path.join(directory, 'bitflip_jpeg.tar')} #1 key 'b': corrupt_image: " in out


def test_webdataset_sample_tgz_needs_the_cls_member_as_caption(tmp_path, capsys):
    """90 MNIST digits (png + cls, gzip-compressed), no txt member."""
    shard = os.path.join(WDS_DATA, "sample.tgz")
    status, out, _ = run_validate(capsys, shard, "--json", str(tmp_path / "r.json"))
    report = load(tmp_path / "r.json")
    assert status == 1 and report["by_reason"] == {"missing_caption": 90}
    assert report["totals"]["samples"] == 90
    assert report["shards"][0]["compressed"] is True
    for extra in (["--caption-key", "cls"], ["--require", "image"], ["--caption-key", "cls", "--no-decode"]):
        status, out, _ = run_validate(capsys, shard, *extra)
        assert status == 0, (extra, out)
        assert out.startswith("checked 1 shards, 90 samples, ")


@pytest.mark.parametrize("decode", [True, False])
def test_webdataset_text_only_shards_have_no_image(tmp_path, capsys, decode):
    """compressed.tar (3 samples) and testgz.tar (1000) hold only .txt.gz members."""
    args = [os.path.join(WDS_DATA, "compressed.tar"), os.path.join(WDS_DATA, "testgz.tar")]
    args += ["--json", str(tmp_path / "r.json")] + ([] if decode else ["--no-decode"])
    status, _, _ = run_validate(capsys, *args)
    report = load(tmp_path / "r.json")
    assert status == 1
    assert report["by_reason"] == {"missing_image": 1003}
    assert [i["key"] for i in report["invalid"][:3]] == [
        "compressed/0001",
        "compressed/0002",
        "compressed/0003",
    ]


def test_unreadable_shard_exits_2_and_the_rest_is_still_reported(tmp_path, capsys):
    good_shard(str(tmp_path / "good.tar"), 2)
    with RangeHTTPServer(str(tmp_path)) as server:
        good, missing = server.url("good.tar"), server.url("missing.tar")
        status, out, _ = run_validate(capsys, good, missing, "--json", str(tmp_path / "r.json"))
    report = load(tmp_path / "r.json")
    assert status == 2 and report["exit_status"] == 2
    assert report["totals"]["unreadable_shards"] == 1 and report["totals"]["samples"] == 2
    (error,) = report["shard_errors"]
    assert error["shard"] == missing and error["reason"] == "unreadable" and "not found" in error["detail"]
    assert "result: UNREADABLE input (exit status 2)" in out


def test_missing_local_file_is_a_usage_error(tmp_path, capsys):
    good = good_shard(str(tmp_path / "good.tar"), 2)
    status, out, err = run_validate(capsys, good, str(tmp_path / "missing.tar"))
    assert status == 2 and out == ""
    assert err.startswith("shardstream validate: error: ") and "missing.tar" in err


def test_bad_urls_are_usage_errors(tmp_path, capsys):
    status, _, err = run_validate(capsys, "pipe:cat /etc/passwd")
    assert status == 2 and "pipe:" in err and "Traceback" not in err
    status, _, err = run_validate(capsys, str(tmp_path / "nothing-here-*.tar"))
    assert status == 2 and "shardstream validate: error:" in err


def test_report_is_written_atomically_and_to_new_folders(tmp_path, capsys):
    shard = good_shard(str(tmp_path / "good.tar"), 2)
    target = tmp_path / "deep" / "er" / "report.json"
    assert run_validate(capsys, shard, "--json", str(target))[0] == 0
    assert load(target)["totals"]["samples"] == 2
    assert sorted(os.listdir(target.parent)) == ["report.json"]  # no temporary file left behind


# -- remote shards ------------------------------------------------------------------------------------


def test_http_shards_report_like_local_ones_and_hide_tokens(corpus_dir, tmp_path, capsys):
    directory, expected = corpus_dir
    names = sorted(expected)
    local_args = [os.path.join(directory, n) for n in names]
    run_validate(capsys, *local_args, "--json", str(tmp_path / "local.json"), "--max-member-bytes", "1MiB")
    with RangeHTTPServer(directory) as server:
        urls = [server.url(n) + "?token=s3cr3t-token" for n in names]
        status, out, err = run_validate(
            capsys,
            *urls,
            "--json",
            str(tmp_path / "http.json"),
            "--max-member-bytes",
            "1MiB",
            "--threads",
            "4",
        )
        missing_status, missing_out, _ = run_validate(capsys, server.url("absent.tar"))
    text = (tmp_path / "http.json").read_text()
    assert "s3cr3t" not in text + out + err
    assert status == 1 and observed(load(tmp_path / "http.json")) == observed(load(tmp_path / "local.json"))
    assert missing_status == 2 and "absent.tar" in missing_out


@pytest.mark.slow
def test_s3_shards_through_a_real_s3_server(corpus_dir, tmp_path, capsys, monkeypatch):
    directory, expected = corpus_dir
    upload = tmp_path / "upload"
    upload.mkdir()
    for name in ("good.tar", "bitflip_jpeg.tar", "compressed.tar.gz"):
        shutil.copy(os.path.join(directory, name), upload / name)
    with SeaweedS3(str(tmp_path / "weed")) as s3:
        s3.upload_dir("shards", str(upload), prefix="set/")
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        status, out, err = run_validate(capsys, "s3://shards/set/", "--json", str(tmp_path / "r.json"))
        report = load(tmp_path / "r.json")
        assert status == 1, err
        assert [s["url"] for s in report["shards"]] == [
            "s3://shards/set/bitflip_jpeg.tar",
            "s3://shards/set/compressed.tar.gz",
            "s3://shards/set/good.tar",
        ]
        assert observed(report) == {
            n: expected[n] for n in ("bitflip_jpeg.tar", "compressed.tar.gz", "good.tar")
        }
        assert "X-Amz-Signature" not in out + json.dumps(report)

        # Wrong secret: a clear credentials error, exit 2, and the secret is never printed.
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
        status, out, err = run_validate(capsys, "s3://shards/set/good.tar")
        assert status == 2
        assert "wrong-secret-value" not in out + err
        assert "s3://shards/set/good.tar" in out + err


def test_footer_only_scans_of_local_files_default_to_more_threads_than_cores(tmp_path) -> None:
    # Without decoding a scan waits on the disk (footers from a cold page cache), not the CPU.
    from shardstream._system import available_cores
    from shardstream.urls import expand_urls
    from shardstream.validation import default_threads

    cores = available_cores()
    local = expand_urls([good_shard(str(tmp_path / "a.tar"), 2)])
    assert default_threads(local) == cores
    assert default_threads(local, decode=False) == min(32, 4 * cores)
    remote = expand_urls(["http://127.0.0.1:9/a.tar"])
    assert default_threads(remote) == default_threads(remote, decode=False) == min(32, 4 * cores)
