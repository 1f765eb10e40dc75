"""S3 through a real S3 server (SeaweedFS, which checks request signatures): URL expansion,
credentials through boto3's chain, clear errors, presigned streaming, and faults on the way."""

from __future__ import annotations

import os
import time
import urllib.parse

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
from shardstream import SourceOptions, read_samples
from shardstream.errors import CredentialsError, NotFoundError
from shardstream.urls import Shard, expand_urls
from source_checks import check_resumes, comparable

pytestmark = pytest.mark.slow

BUCKET = "shards"
SHARDS, PER_SHARD = 6, 20
FAST = {"connect_timeout": 2.0, "read_timeout": 1.0, "max_retries": 4}


@pytest.fixture(autouse=True)
def _no_machine_aws(hermetic_aws_env: None) -> None:
    """Every test of this module runs without the machine's AWS settings (conftest.py)."""


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
    # Shards keep their s3:// URL; the signature is made when a shard is opened.
    assert all(isinstance(s, Shard) and s.url == s.display for s in shards)
    signed = shards[0].open_url()
    assert signed.startswith(s3.endpoint_url) and "X-Amz-Signature=" in signed
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
    got = list(read_samples(f"s3://{BUCKET}/train/*.tar", source=s3.source(), **FAST))
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
        list(
            read_samples(f"s3://{BUCKET}/train/shard-000001.tar", source=SourceOptions(check="none"), **FAST)
        )
    assert f"s3://{BUCKET}/train/shard-000001.tar" in str(info.value) and "403" in str(info.value)
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
        list(
            read_samples(
                f"s3://{BUCKET}/train/shard-99999{{7..8}}.tar", source=SourceOptions(check="none"), **FAST
            )
        )
    assert "shard-999997.tar" in str(info.value)


def test_an_expired_presigned_url_is_a_clean_credentials_error(s3, monkeypatch):
    """A presigned URL made elsewhere (by a user, with boto3) and past its expiry: SeaweedFS
    refuses it, and the error says so without printing the signature."""
    with_env(monkeypatch, s3)
    url = s3.client().generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "train/shard-000002.tar"}, ExpiresIn=1
    )
    time.sleep(2.5)
    with pytest.raises(CredentialsError) as info:
        list(read_samples(url, **FAST))
    assert "expired" in str(info.value) and "X-Amz" not in str(info.value)


def test_a_run_outlives_the_life_of_a_signature(s3, local_dir, monkeypatch):
    """Shards listed, then read after every signature made at listing time would have expired
    (as temporary credentials expire hours into a long run): each shard is presigned when it
    is opened, by the loader's threads, by read_samples, and in DataLoader worker processes."""
    from shardstream import ShardLoader

    with_env(monkeypatch, s3)
    shards = expand_urls(f"s3://{BUCKET}/train/shard-{{000000..000002}}.tar", expires_in=2)
    time.sleep(3)
    expected = comparable(read_samples([os.path.join(local_dir, f"shard-00000{i}.tar") for i in range(3)]))
    assert comparable(read_samples(shards, **FAST)) == expected

    loader = ShardLoader(shards, batch_size=PER_SHARD, image_size=32, shuffle_buffer=1, threads=1, **FAST)
    keys = [k for batch in loader for k in batch.keys]
    assert sorted(keys) == sorted(s["__key__"] for s in expected)

    loader = ShardLoader(
        shards, batch_size=10, image_size=32, samples_per_epoch=3 * PER_SHARD, threads=1, **FAST
    )
    keys = [k for batch in loader.dataloader(num_workers=2) for k in batch.keys]
    # Without an index, a reader with fewer samples cycles to make its quota.
    assert len(keys) == 3 * PER_SHARD and set(keys) <= {s["__key__"] for s in expected}


def test_a_resume_after_the_signature_expired_is_signed_afresh(s3, local_dir, monkeypatch):
    """The stream breaks off halfway and comes back after its signature has expired, as a
    stalled connection to a slow consumer does: the Range request that resumes it carries a new
    signature instead of failing with 403.

    The signature lives 3 s and the stall lasts 5 s. X-Amz-Date is in whole seconds, so a URL
    signed for n seconds is good for between n - 1 and n: with n = 1 a fresh signature could
    expire before the request reached the server on a loaded machine (a flake seen in CI); with
    n = 3 it has at least 2 s, and the first one is surely dead when the stream resumes."""
    with_env(monkeypatch, s3)
    name = "shard-000004.tar"
    size = os.path.getsize(os.path.join(local_dir, name))
    path = f"/{BUCKET}/train/{name}"
    with FaultProxy(s3.endpoint_url, {path: [stall_after(size // 2, 5)]}, preserve_host=True) as proxy:
        shards = expand_urls(
            f"s3://{BUCKET}/train/{name}", endpoint_url=proxy.url().rstrip("/"), expires_in=3
        )
        got = comparable(read_samples(shards, connect_timeout=2.0, read_timeout=8.0, max_retries=3))
    assert got == comparable(read_samples(os.path.join(local_dir, name)))
    gets = [r for r in proxy.requests if r.method == "GET" and r.path == path]
    assert len(gets) == 2 and gets[1].range == f"bytes={size // 2}-", gets
    signatures = [dict(urllib.parse.parse_qsl(r.query))["X-Amz-Signature"] for r in gets]
    assert signatures[0] != signatures[1]


def test_index_from_img2dataset_stats_on_s3(s3, local_dir, monkeypatch):
    """img2dataset writes NNNNN_stats.json next to each shard: the index is made from them with
    one S3 client for all the stats files (not one per file), and plans an exact epoch."""
    import json

    from shardstream import ShardLoader, urls
    from shardstream.index import index_from_img2dataset

    with_env(monkeypatch, s3)
    for i in range(SHARDS):
        stats = {"count": PER_SHARD + 1, "successes": PER_SHARD, "failed_to_download": 1}
        s3.client().put_object(
            Bucket=BUCKET, Key=f"train/shard-{i:06d}_stats.json", Body=json.dumps(stats).encode()
        )
    clients = []
    make_client = urls._new_s3_client
    monkeypatch.setattr(urls, "_new_s3_client", lambda opts: clients.append(opts) or make_client(opts))
    spec = f"s3://{BUCKET}/train/shard-{{000000..000005}}.tar"
    index = index_from_img2dataset(spec)
    assert index.num_samples == SHARDS * PER_SHARD
    assert len(clients) == 2, "one client for the shards, one for all their stats files"
    loader = ShardLoader(spec, index=index, batch_size=8, image_size=32, threads=1, **FAST)
    keys = [k for batch in loader for k in batch.keys]
    assert len(keys) == len(set(keys)) == SHARDS * PER_SHARD

    s3.client().delete_object(Bucket=BUCKET, Key="train/shard-000003_stats.json")
    with pytest.raises(NotFoundError, match="shard-000003_stats.json"):
        index_from_img2dataset(spec)


def test_a_shard_that_cannot_be_signed_names_its_url(s3):
    """Signing fails when the shard is opened (here: a profile that does not exist; in a long
    run, credentials that can no longer be refreshed): a credentials error naming the shard."""
    from shardstream.urls import S3Options, S3Signer

    signer = S3Signer(S3Options(endpoint_url=s3.endpoint_url, profile="no-such-profile"))
    shard = Shard(f"s3://{BUCKET}/train/shard-000000.tar", signer=signer)
    with pytest.raises(CredentialsError) as info:
        list(read_samples([shard], **FAST))
    message = str(info.value)
    assert f"s3://{BUCKET}/train/shard-000000.tar" in message and "cannot sign" in message
    assert "no-such-profile" in message


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

    from shardstream import ShardLoader
    from shardstream.cli import main

    with_env(monkeypatch, s3)
    spec = f"s3://{BUCKET}/train/shard-{{000000..000005}}.tar"
    from index_layout import read_layout

    index = str(tmp_path / "s3.index")
    assert main(["index", spec, "-o", index, "-q"]) == 0
    urls = [s["url"] for s in read_layout(index)["shards"]]
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

    # The index itself from S3 (fetched through a presigned URL made for that one request), its
    # detail blocks too: rank 1's spans start mid-shard, so it seeks with offsets read from them.
    for name in os.listdir(index):
        with open(os.path.join(index, name), "rb") as f:
            s3.client().put_object(Bucket=BUCKET, Key=f"indexes/train.index/{name}", Body=f.read())
    remote = ShardLoader(
        spec,
        index=f"s3://{BUCKET}/indexes/train.index",
        batch_size=8,
        image_size=32,
        rank=1,
        world_size=2,
        shuffle_buffer=10,
        threads=1,
        **FAST,
    )
    assert [k for b in remote for k in b.keys] == keys[len(keys) // 2 :]


def test_index_records_s3_etags_from_the_listing_and_updates_only_changed_objects(
    s3, local_dir, monkeypatch, tmp_path
):
    """Shards found by listing get their ETag from the listing (no HeadObject); named ones from
    one HeadObject each; the two agree. Re-indexing after one object is replaced scans only it."""
    from index_layout import read_layout
    from shardstream import urls
    from shardstream.cli import main
    from shardstream.identity import probe_identities

    with_env(monkeypatch, s3)
    names = sorted(n for n in os.listdir(local_dir) if n.endswith(".tar"))[:3]
    s3.upload(BUCKET, [os.path.join(local_dir, n) for n in names], prefix="update/")
    listed = expand_urls(f"s3://{BUCKET}/update/")
    named = expand_urls([f"s3://{BUCKET}/update/{n}" for n in names])
    assert all(s.listed is not None for s in listed) and all(s.listed is None for s in named)
    heads = []
    make_client = urls._new_s3_client

    def counting_client(opts):
        client = make_client(opts)
        client.meta.events.register("before-call.s3.HeadObject", lambda **kw: heads.append(kw))
        return client

    monkeypatch.setattr(urls, "_new_s3_client", counting_client)
    from_listing = probe_identities(expand_urls(f"s3://{BUCKET}/update/"))
    assert heads == []
    from_heads = probe_identities(expand_urls([f"s3://{BUCKET}/update/{n}" for n in names], check="none"))
    assert len(heads) == 3
    assert from_listing == from_heads and all(i.identity.startswith('etag:"') for i in from_listing)
    assert [i.size for i in from_listing] == [os.path.getsize(os.path.join(local_dir, n)) for n in names]

    out = str(tmp_path / "s3.index")
    assert main(["index", f"s3://{BUCKET}/update/", "-o", out, "-q"]) == 0
    before = read_layout(out)["shards"]
    assert [e["identity"] for e in before] == [i.identity for i in from_listing]
    other = os.path.join(local_dir, f"shard-{SHARDS - 1:06d}.tar")
    s3.client().upload_file(other, BUCKET, f"update/{names[1]}")  # other content under the same key
    assert main(["index", f"s3://{BUCKET}/update/", "-o", out]) == 0
    after = read_layout(out)["shards"]
    assert [a == b for a, b in zip(after, before, strict=True)] == [True, False, True]
    assert after[1]["identity"] != before[1]["identity"]
