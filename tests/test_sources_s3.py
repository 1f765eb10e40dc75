"""S3 through a real S3 server (SeaweedFS, which checks request signatures): URL expansion,
credentials through boto3's chain, clear errors, presigned streaming, and faults on the way."""

from __future__ import annotations

import os
import time

import pytest
from servers import (
    FaultProxy,
    SeaweedS3,
    build_photo_shards,
    error_status,
    reset_after,
    short_body,
    stall_after,
)
from shardstream import read_samples
from shardstream.errors import CredentialsError, NotFoundError
from shardstream.urls import Shard, expand_urls
from test_sources_http import check_resumes, comparable

pytestmark = pytest.mark.slow

BUCKET = "shards"
SHARDS, PER_SHARD = 6, 20
FAST = {"connect_timeout": 2.0, "read_timeout": 1.0, "max_retries": 4}


@pytest.fixture(autouse=True)
def hermetic_aws_env(monkeypatch, tmp_path):
    """No credentials, profiles or instance-metadata lookups leak in from the machine."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("s3-shards")
    build_photo_shards(str(directory), shards=SHARDS, per_shard=PER_SHARD, seed=5)
    return str(directory)


@pytest.fixture(scope="module")
def s3(tmp_path_factory, local_dir):
    with SeaweedS3(str(tmp_path_factory.mktemp("seaweed"))) as server:
        server.upload_dir(BUCKET, local_dir, prefix="train/")
        client = server.client()
        client.put_object(Bucket=BUCKET, Key="train/README.txt", Body=b"not a shard")
        client.put_object(
            Bucket=BUCKET, Key="train/sub/extra.tar", Body=open(first_shard(local_dir), "rb").read()
        )
        yield server


def first_shard(local_dir: str) -> str:
    return os.path.join(local_dir, "shard-000000.tar")


def local_samples(local_dir: str) -> list[dict]:
    return comparable(read_samples(local_dir))


def with_env(monkeypatch, s3: SeaweedS3, *, secret: str | None = None) -> None:
    for name, value in s3.env(secret=secret).items():
        monkeypatch.setenv(name, value)


def test_expansion_of_keys_prefixes_and_globs(s3, monkeypatch):
    with_env(monkeypatch, s3)
    shards = expand_urls(f"s3://{BUCKET}/train/shard-{{000000..000005}}.tar")
    assert [s.display for s in shards] == [f"s3://{BUCKET}/train/shard-{i:06d}.tar" for i in range(6)]
    assert all(isinstance(s, Shard) and s.url.startswith(s3.endpoint_url) for s in shards)
    assert all("X-Amz-Signature=" in s.url for s in shards)
    assert "X-Amz-Signature" not in repr(shards) and s3.secret_key not in repr(shards)

    listed = expand_urls(f"s3://{BUCKET}/train/")
    assert [s.display for s in listed] == [s.display for s in shards]  # README.txt and sub/ left out
    assert [s.display for s in expand_urls(f"s3://{BUCKET}/train/*.tar")] == [s.display for s in shards]
    deep = [s.display for s in expand_urls(f"s3://{BUCKET}/train/**.tar")]
    assert deep == sorted([s.display for s in shards] + [f"s3://{BUCKET}/train/sub/extra.tar"])
    few = expand_urls(f"s3://{BUCKET}/train/shard-00000[0-2].tar::s3://{BUCKET}/train/shard-000005.tar")
    assert [s.display[-8:] for s in few] == ["0000.tar", "0001.tar", "0002.tar", "0005.tar"]


def test_streaming_from_s3_equals_local_files(s3, local_dir, monkeypatch):
    with_env(monkeypatch, s3)
    got = list(read_samples(f"s3://{BUCKET}/train/*.tar", **s3.s3_options(), **FAST))
    assert comparable(got) == local_samples(local_dir)
    assert got[0]["__url__"] == f"s3://{BUCKET}/train/shard-000000.tar"


def test_credentials_from_environment_and_from_a_profile(s3, monkeypatch, tmp_path):
    with_env(monkeypatch, s3)
    assert len(expand_urls(f"s3://{BUCKET}/train/shard-000000.tar")) == 1  # env keys + AWS_ENDPOINT_URL

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[shards-test]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    shards = expand_urls(f"s3://{BUCKET}/train/*.tar", profile="shards-test")
    assert len(shards) == SHARDS


def test_wrong_secret_fails_at_once_with_a_clear_error(s3, monkeypatch):
    wrong = "wrong-secret-do-not-print"
    with_env(monkeypatch, s3, secret=wrong)
    started = time.monotonic()
    with pytest.raises(CredentialsError) as info:
        expand_urls(f"s3://{BUCKET}/train/shard-000000.tar")
    message = str(info.value)
    assert f"s3://{BUCKET}/train/shard-000000.tar" in message and "403" in message
    with pytest.raises(CredentialsError, match="SignatureDoesNotMatch|403"):
        expand_urls(f"s3://{BUCKET}/train/")
    # The same mistake caught only when streaming (no up-front check): one 403, no retry loop.
    with pytest.raises(CredentialsError) as info:
        list(read_samples(f"s3://{BUCKET}/train/shard-000001.tar", check="none", **FAST))
    assert "shard-000001.tar?<redacted>" in str(info.value)
    assert time.monotonic() - started < 10
    for text in (message, str(info.value)):
        assert wrong not in text and "X-Amz-Signature" not in text and s3.access_key not in text


def test_no_credentials_at_all(s3):
    with pytest.raises(CredentialsError, match="no usable AWS credentials"):
        expand_urls(f"s3://{BUCKET}/train/shard-000000.tar", endpoint_url=s3.endpoint_url)


def test_missing_bucket_and_key_are_named(s3, monkeypatch):
    with_env(monkeypatch, s3)
    with pytest.raises(NotFoundError, match=f"s3://{BUCKET}/train/shard-999999.tar"):
        expand_urls(f"s3://{BUCKET}/train/shard-999999.tar")
    with pytest.raises(NotFoundError, match="s3://no-such-bucket/"):
        expand_urls("s3://no-such-bucket/train/")
    with pytest.raises(NotFoundError, match="no matching objects"):
        expand_urls(f"s3://{BUCKET}/validation/*.tar")
    with pytest.raises(NotFoundError) as info:
        list(read_samples(f"s3://{BUCKET}/train/shard-99999{{7..8}}.tar", check="none", **FAST))
    assert "shard-999997.tar" in str(info.value)


def test_expired_presigned_url_is_a_clean_credentials_error(s3, monkeypatch):
    with_env(monkeypatch, s3)
    shards = expand_urls(f"s3://{BUCKET}/train/shard-000002.tar", expires_in=1)
    assert expand_urls(shards) == shards and expand_urls(shards)[0].display == shards[0].display
    time.sleep(2.5)
    with pytest.raises(CredentialsError) as info:
        list(read_samples(shards, **FAST))
    assert "expired" in str(info.value) and "X-Amz" not in str(info.value)


def test_full_epoch_over_s3_through_faults_is_byte_identical(s3, local_dir, monkeypatch):
    with_env(monkeypatch, s3)
    sizes = [os.path.getsize(os.path.join(local_dir, f"shard-{i:06d}.tar")) for i in range(SHARDS)]
    path = f"/{BUCKET}/train/shard-{{:06d}}.tar".format
    faults = {
        path(0): [reset_after(sizes[0] // 2)],
        path(1): [error_status(503, "SlowDown"), error_status(503, "SlowDown")],
        path(3): [short_body(sizes[3] // 3), stall_after(sizes[3] // 2, 30)],
        path(5): [reset_after(100), error_status(503, "SlowDown"), short_body(sizes[5] - 10)],
    }
    with FaultProxy(s3.endpoint_url, faults, preserve_host=True) as proxy:
        # Presigned for the proxy's address: the signature stays valid behind it.
        shards = expand_urls(f"s3://{BUCKET}/train/*.tar", endpoint_url=proxy.url().rstrip("/"))
        started = time.monotonic()
        got = comparable(read_samples(shards, **FAST))
        elapsed = time.monotonic() - started
    assert proxy.faults_left() == 0
    assert got == local_samples(local_dir)
    assert elapsed < 30, elapsed
    gets: dict[str, list] = {}
    for r in proxy.requests:
        if r.method == "GET" and r.path.endswith(".tar"):
            gets.setdefault(r.path, []).append(r)
    etag = s3.client().head_object(Bucket=BUCKET, Key="train/shard-000003.tar")["ETag"]
    assert {r.if_match for r in gets[path(3)][1:]} == {etag}
    for requests in gets.values():
        check_resumes(requests)


def test_exact_epoch_over_s3_with_an_index_built_by_the_cli(s3, local_dir, monkeypatch, tmp_path):
    # The index names shards as users do (s3://...), never by a presigned URL, so the loader
    # matches it to the s3:// shards it is given and seeks with Range requests from its offsets.
    import json

    from shardstream import ShardLoader
    from shardstream.cli import main

    with_env(monkeypatch, s3)
    spec = f"s3://{BUCKET}/train/shard-{{000000..000005}}.tar"
    index = str(tmp_path / "s3.index")
    assert main(["index", spec, "-o", index, "-q"]) == 0
    with open(index, "rb") as f:
        urls = [s["url"] for s in json.loads(f.read())["shards"]]
    assert urls == [f"s3://{BUCKET}/train/shard-{i:06d}.tar" for i in range(SHARDS)]
    keys = []
    for rank in range(2):
        loader = ShardLoader(
            spec,
            index=index,
            batch_size=8,
            image_size=32,
            rank=rank,
            world_size=2,
            shuffle_buffer=10,
            threads=1,
            **FAST,
        )
        keys += [k for b in loader for k in b.keys]
    remainder = loader.stats["remainder_keys"]
    local = [s["__key__"] for s in read_samples(local_dir)]
    assert len(keys) == len(set(keys)) and sorted(keys + remainder) == sorted(local)
