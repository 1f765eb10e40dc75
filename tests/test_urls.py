"""URL specs: brace expansion, '::' lists, local directories and globs, refusals, redaction.
(S3 listing and presigning against a real S3 server are in test_sources_s3.py.)"""

from __future__ import annotations

import os

import pytest
from shardstream import _core
from shardstream.errors import BadUrlError, NotFoundError, ShardError
from shardstream.urls import Shard, brace_expand, expand_urls, glob_to_regex, redact, split_parts


def test_brace_ranges_keep_zero_padding_and_steps():
    assert brace_expand("s-{000..003}.tar") == [f"s-{i:03d}.tar" for i in range(4)]
    assert brace_expand("s-{8..11}.tar") == ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]
    assert brace_expand("s{0..10..5}") == ["s0", "s5", "s10"]
    assert brace_expand("s{3..1}") == ["s3", "s2", "s1"]
    assert brace_expand("s{a..c}") == ["sa", "sb", "sc"]
    assert len(brace_expand("shard-{000000..000999}.tar")) == 1000


def test_brace_lists_products_and_nesting():
    assert brace_expand("{train,val}/{0..1}.tar") == ["train/0.tar", "train/1.tar", "val/0.tar", "val/1.tar"]
    assert brace_expand("{a,b{1..2}}.tar") == ["a.tar", "b1.tar", "b2.tar"]
    # Not an expansion: left alone, as bash does.
    assert brace_expand("x{}y{z}.tar") == ["x{}y{z}.tar"]
    with pytest.raises(BadUrlError, match="unbalanced"):
        brace_expand("s-{0..3.tar")


def test_double_colon_lists_but_not_inside_ipv6_hosts():
    assert split_parts("a.tar::b.tar:: c.tar") == ["a.tar", "b.tar", "c.tar"]
    assert split_parts("http://[::1]:8080/a.tar::b.tar") == ["http://[::1]:8080/a.tar", "b.tar"]


def test_local_files_directories_globs_and_lists(tmp_path):
    for name in ("s-000.tar", "s-001.tar", "s-002.tar.gz", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    d = str(tmp_path)
    assert expand_urls(d) == [f"{d}/s-000.tar", f"{d}/s-001.tar", f"{d}/s-002.tar.gz"]
    assert expand_urls(f"{d}/*.tar") == [f"{d}/s-000.tar", f"{d}/s-001.tar"]
    assert expand_urls(f"{d}/s-{{000..001}}.tar::{d}/s-002.tar.gz") == expand_urls(d)
    assert expand_urls([f"{d}/s-000.tar", f"file://{d}/s-001.tar"]) == [f"{d}/s-000.tar", f"{d}/s-001.tar"]
    assert expand_urls(tmp_path / "s-000.tar") == [f"{d}/s-000.tar"]


def test_missing_local_shards_are_named(tmp_path):
    with pytest.raises(NotFoundError, match="nope-000.tar"):
        expand_urls(f"{tmp_path}/nope-{{000..003}}.tar")
    with pytest.raises(NotFoundError, match=r"\*\.tar"):
        expand_urls(f"{tmp_path}/*.tar")
    # check="none" defers to the reader (and its on_error policy).
    assert len(expand_urls(f"{tmp_path}/nope-{{000..003}}.tar", check="none")) == 4


def test_http_urls_pass_through_as_shards():
    shards = expand_urls("http://127.0.0.1:9/d/s-{0..1}.tar?X-Amz-Signature=sekrit")
    assert shards == [f"http://127.0.0.1:9/d/s-{i}.tar?X-Amz-Signature=sekrit" for i in range(2)]
    assert all(isinstance(s, Shard) and isinstance(s, str) for s in shards)
    assert shards[0].url == "http://127.0.0.1:9/d/s-0.tar?X-Amz-Signature=sekrit"
    assert shards[0].display == "http://127.0.0.1:9/d/s-0.tar?<redacted>"
    assert "sekrit" not in repr(shards)


@pytest.mark.parametrize(
    "url",
    ["pipe:curl -s http://x/a.tar", "gs://bucket/a.tar", "ftp://h/a.tar", "hdfs://nn/a.tar", "GS://b/a.tar"],
)
def test_pipe_and_unknown_schemes_are_refused(url):
    with pytest.raises(BadUrlError) as info:
        expand_urls(url)
    assert isinstance(info.value, ShardError) and isinstance(info.value, ValueError)
    assert "pipe:" in str(info.value) or "unknown scheme" in str(info.value)


def test_unknown_options_are_refused_reader_options_accepted(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x")
    with pytest.raises(TypeError, match="endpoint"):
        expand_urls(str(tmp_path / "a.tar"), endpiont_url="http://x")
    assert expand_urls(str(tmp_path / "a.tar"), read_timeout=1.0, max_retries=2) == [str(tmp_path / "a.tar")]


@pytest.mark.parametrize(
    "url",
    [
        "https://h.example/b/k.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F&X-Amz-Signature=abc",
        "http://user:pw@h:9/x.tar",
        "http://user:pw@h:9/x.tar?token=t#frag",
        "/data/plain.tar",
        "s3://bucket/key.tar",
        "https://h/a@b.tar",
    ],
)
def test_python_redaction_matches_rust(url):
    assert redact(url) == _core.redact_url(url)
    for secret in ("abc", "AKIA", ":pw", "token=t"):
        assert secret not in redact(url)


def test_glob_segments():
    assert glob_to_regex("p/*.tar").match("p/a.tar")
    assert not glob_to_regex("p/*.tar").match("p/sub/a.tar")
    assert glob_to_regex("p/**.tar").match("p/sub/a.tar")
    assert glob_to_regex("p/s-[0-1]?.tar").match("p/s-07.tar")
    assert not glob_to_regex("p/s-[!0]?.tar").match("p/s-07.tar")


def test_expanding_the_shipped_test_data_directory():
    data = "/work/shared/data/webdataset-testdata"
    if not os.path.isdir(data):
        pytest.skip("shared test data not present")
    names = [os.path.basename(s) for s in expand_urls(data)]
    assert names == ["compressed.tar", "sample.tgz", "testgz.tar"]


def test_a_presigned_url_is_handed_out_again_for_a_tenth_of_its_life_at_most_a_minute(monkeypatch) -> None:
    # boto3 presigns in Python on the reader threads: a Parquet row group is one or two
    # requests, and signing each cost the loader 5-10 % of a core.
    import time

    from shardstream.urls import S3Options, S3Signer, presign_reuse_s

    assert presign_reuse_s(3600) == 60.0 and presign_reuse_s(2) == pytest.approx(0.2)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    signer = S3Signer(S3Options(endpoint_url="http://127.0.0.1:9", expires_in=2))
    real = signer.client("s3://bucket/a.tar").generate_presigned_url
    made: list[str] = []

    def counting(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(signer.client("s3://bucket/a.tar"), "generate_presigned_url", counting)
    first = signer("s3://bucket/a.tar")
    assert "X-Amz-Signature=" in first and "Expires=2" in first
    assert signer("s3://bucket/a.tar") == first and len(made) == 1
    assert signer("s3://bucket/b.tar") != first and len(made) == 2
    time.sleep(0.3)  # past 2 s / 10
    signer("s3://bucket/a.tar")
    assert len(made) == 3


def test_source_options_split_once_by_who_takes_them_and_an_unknown_one_is_refused_by_name():
    """One conversion from the resolved options to each part (issue 50: ``check``, an option of
    the URL expansion, reached the S3 client of an index-only loader and crashed it)."""
    from shardstream import SourceOptions
    from shardstream.urls import split_options

    resolved = SourceOptions(region="eu-west-1", check="all", cache_dir="/tmp/c", expires_in=60).keywords()
    parts = split_options({**resolved, "connect_timeout": 2.0})
    assert (parts.s3.region, parts.s3.expires_in, parts.check) == ("eu-west-1", 60, "all")
    assert parts.reader == {
        "connect_timeout": 2.0, "cache_dir": "/tmp/c", **{k: resolved[k] for k in
        ("backoff_initial", "backoff_max", "retry_after_max", "cache_max_bytes")},
    }  # fmt: skip
    with pytest.raises(TypeError, match="'bogus'"):
        split_options({**resolved, "bogus": 1})
