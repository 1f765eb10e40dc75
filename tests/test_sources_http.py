"""Streaming shards over HTTP through real servers and our fault-injecting proxy.

The standard is exactness: an epoch read through resets, throttling, stalls and truncated bodies
yields the same samples, byte for byte and in the same order, as reading the files locally.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import textwrap
import time

import pytest
from servers import (
    FaultProxy,
    RangeHTTPServer,
    build_photo_shards,
    error_status,
    http_get,
    make_test_pki,
    reset_after,
    short_body,
    stall_after,
)
from shardstream import SourceOptions, read_samples
from shardstream.errors import CredentialsError, NotFoundError, ShardError, SourceError
from source_checks import check_resumes, comparable

SHARDS, PER_SHARD = 9, 24
FAKE_SIGNATURE = "X-Amz-Signature=deadbeefcafe"  # our server ignores queries; it must never leak
FAST = {"connect_timeout": 2.0, "read_timeout": 1.0, "max_retries": 4}


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("http-shards")
    build_photo_shards(str(directory), shards=SHARDS, per_shard=PER_SHARD, seed=3)
    return str(directory)


def names() -> list[str]:
    return [f"shard-{i:06d}.tar" for i in range(SHARDS)]


def local_samples(shard_dir: str) -> list[dict]:
    return comparable(read_samples([os.path.join(shard_dir, n) for n in names()]))


# -- the test servers themselves ---------------------------------------------------------------------------


def test_range_server_answers_ranges_and_preconditions(shard_dir):
    path = os.path.join(shard_dir, names()[0])
    data = open(path, "rb").read()
    with RangeHTTPServer(shard_dir) as srv:
        status, headers, body = http_get(srv.url(names()[0]))
        assert (status, body) == (200, data)
        etag = headers["etag"]
        status, headers, body = http_get(srv.url(names()[0]), {"Range": "bytes=100-"})
        assert (status, body, headers["content-range"]) == (
            206,
            data[100:],
            f"bytes 100-{len(data) - 1}/{len(data)}",
        )
        assert http_get(srv.url(names()[0]), {"Range": "bytes=100-", "If-Match": etag})[0] == 206
        assert http_get(srv.url(names()[0]), {"Range": "bytes=100-", "If-Match": '"other"'})[0] == 412
        assert http_get(srv.url(names()[0]), {"Range": f"bytes={len(data)}-"})[0] == 416
        assert http_get(srv.url("missing.tar"))[0] == 404
        assert http_get(srv.url("../../etc/passwd"))[0] == 404


def test_fault_proxy_injects_each_fault(shard_dir):
    name = names()[0]
    faults = {f"/{name}": [reset_after(1000), short_body(2000), error_status(), stall_after(10, 30)]}
    with RangeHTTPServer(shard_dir) as srv, FaultProxy(srv.url(), faults) as proxy:
        with pytest.raises(ConnectionResetError):
            http_get(proxy.url(name))
        with pytest.raises(http.client.IncompleteRead):
            http_get(proxy.url(name))
        status, _, body = http_get(proxy.url(name))
        assert status == 503 and b"<Code>SlowDown</Code>" in body
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            http_get(proxy.url(name), timeout=0.5)
        assert time.monotonic() - started < 5
        assert http_get(proxy.url(name))[2] == open(os.path.join(shard_dir, name), "rb").read()
    assert proxy.faults_left() == 0


# -- streaming through the real stack ---------------------------------------------------------------------


def test_http_stream_equals_local_files(shard_dir):
    expected = local_samples(shard_dir)
    assert len(expected) == SHARDS * PER_SHARD
    with RangeHTTPServer(shard_dir) as srv:
        spec = f"http://127.0.0.1:{srv.port}/shard-{{000000..{SHARDS - 1:06d}}}.tar"
        got = list(read_samples(spec, **FAST))
    assert comparable(got) == expected
    assert got[0]["__url__"].startswith("http://127.0.0.1:")


def fault_plan(shard_dir: str) -> dict[str, list]:
    """Faults in at least one of every three shards, several kinds in some."""
    size = [os.path.getsize(os.path.join(shard_dir, n)) for n in names()]
    return {
        f"/{names()[0]}": [reset_after(size[0] // 3)],
        f"/{names()[2]}": [error_status(), error_status(503, "SlowDown")],
        f"/{names()[3]}": [short_body(size[3] // 2)],
        f"/{names()[5]}": [stall_after(size[5] // 4, 30)],
        f"/{names()[6]}": [reset_after(5000), error_status(500, "InternalError"), short_body(size[6] // 2)],
        f"/{names()[8]}": [reset_after(0), short_body(size[8] - 1)],
    }


def test_full_epoch_through_faults_is_byte_identical_to_local(shard_dir):
    expected = local_samples(shard_dir)
    with RangeHTTPServer(shard_dir) as srv, FaultProxy(srv.url(), fault_plan(shard_dir)) as proxy:
        urls = [proxy.url(n) + "?" + FAKE_SIGNATURE for n in names()]
        started = time.monotonic()
        got = comparable(read_samples(urls, **FAST))
        elapsed = time.monotonic() - started
    assert proxy.faults_left() == 0, "every scripted fault was hit"
    assert got == expected  # same samples, same order, identical bytes: nothing lost, nothing twice
    # The stall is cut by the 1 s read timeout, not waited out (30 s).
    assert elapsed < 20, elapsed

    by_path: dict[str, list] = {}
    for r in proxy.requests:
        by_path.setdefault(r.path, []).append(r)
    for requests in by_path.values():
        check_resumes(requests)
    assert len(by_path[f"/{names()[6]}"]) == 4


def test_unavailable_shard_is_raised_or_skipped_within_the_retry_budget(shard_dir):
    dead = f"/{names()[1]}"
    options = dict(FAST, max_retries=2)
    with RangeHTTPServer(shard_dir) as srv, FaultProxy(srv.url(), {dead: [error_status()] * 100}) as proxy:
        urls = [proxy.url(n) + "?" + FAKE_SIGNATURE for n in names()[:3]]
        started = time.monotonic()
        with pytest.raises(SourceError) as info:
            list(read_samples(urls, on_error="raise", **options))
        assert time.monotonic() - started < 30
        message = str(info.value)
        assert names()[1] in message and "SlowDown" in message and "3 attempts" in message
        assert "deadbeef" not in message and "?<redacted>" in message
        assert len([r for r in proxy.requests if r.path == dead]) == 3

        got = comparable(read_samples(urls, on_error="skip", **options))
    local = comparable(read_samples([os.path.join(shard_dir, n) for n in (names()[0], names()[2])]))
    assert got == local


def test_missing_and_forbidden_shards_fail_at_once_with_clear_errors(shard_dir):
    forbidden = f"/{names()[0]}"
    with (
        RangeHTTPServer(shard_dir) as srv,
        FaultProxy(srv.url(), {forbidden: [error_status(403, "AccessDenied")]}) as proxy,
    ):
        started = time.monotonic()
        with pytest.raises(NotFoundError) as info:
            list(read_samples(proxy.url("no-such-shard.tar") + "?" + FAKE_SIGNATURE, **FAST))
        assert "no-such-shard.tar?<redacted>" in str(info.value) and "deadbeef" not in str(info.value)
        with pytest.raises(CredentialsError) as info:
            list(read_samples(proxy.url(names()[0]) + "?" + FAKE_SIGNATURE, **FAST))
        assert "403" in str(info.value) and "deadbeef" not in str(info.value)
        assert time.monotonic() - started < 5, "client errors are not retried"
    assert len(proxy.requests) == 2


def test_object_replaced_mid_stream_is_an_error_not_a_splice(tmp_path):
    # One shard large enough that the reader's buffers (about 1.3 MB) cannot hold it all.
    paths = build_photo_shards(str(tmp_path), shards=1, per_shard=160, seed=11, min_side=300, max_side=420)
    size = os.path.getsize(paths[0])
    assert size > 4_000_000, size
    expected = local_samples_of(paths)
    name = os.path.basename(paths[0])
    with (
        RangeHTTPServer(str(tmp_path)) as srv,
        FaultProxy(srv.url(), {f"/{name}": [reset_after(size - 500_000)]}) as proxy,
    ):
        stream = read_samples(proxy.url(name) + "?" + FAKE_SIGNATURE, **FAST)
        first = next(stream)
        # A new version of the object is published while we are reading the old one, atomically
        # as object stores do (the response in flight keeps serving the old version).
        data = bytearray(open(paths[0], "rb").read())
        data[size // 2 : size // 2 + 1024] = bytes(1024)
        with open(paths[0] + ".new", "wb") as f:
            f.write(data)
        os.replace(paths[0] + ".new", paths[0])
        got = [first]
        with pytest.raises(ShardError) as info:
            for sample in stream:
                got.append(sample)
    assert "changed while it was being read" in str(info.value) and "deadbeef" not in str(info.value)
    assert comparable(got) == expected[: len(got)], "only samples of the first version were yielded"
    assert proxy.requests[-1].if_match is not None


def local_samples_of(paths: list[str]) -> list[dict]:
    return comparable(read_samples(paths))


CACHE_READER = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    from shardstream import SourceOptions, read_samples
    urls, cache_dir, ready_dir, me, ranks = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], 8
    # Start together (imports take uneven time), so the ranks really race for each shard.
    open(os.path.join(ready_dir, me), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(ready_dir)) < ranks and time.monotonic() < deadline:
        time.sleep(0.01)
    h = hashlib.sha256()
    n = 0
    cached = SourceOptions(cache_dir=cache_dir, cache_max_bytes=1 << 30)
    for s in read_samples(urls, source=cached, read_timeout=5.0):
        for k in sorted(s):
            if k != "__url__":
                h.update(k.encode()); h.update(s[k] if isinstance(s[k], bytes) else s[k].encode())
        n += 1
    print(json.dumps({"samples": n, "digest": h.hexdigest()}))
    """
)


@pytest.mark.slow
def test_local_cache_downloads_each_shard_once_for_eight_processes(shard_dir, tmp_path):
    import json

    cache_dir, ready_dir = str(tmp_path / "cache"), tmp_path / "ready"
    ready_dir.mkdir()
    with RangeHTTPServer(shard_dir) as srv:
        urls = [srv.url(n) + "?" + FAKE_SIGNATURE for n in names()]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CACHE_READER, json.dumps(urls), cache_dir, str(ready_dir), str(rank)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(8)
        ]
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        gets = [r for r in srv.requests if r.method == "GET"]
    assert len({json.dumps(r) for r in results}) == 1 and results[0]["samples"] == SHARDS * PER_SHARD
    assert sorted(r.path for r in gets) == sorted(f"/{n}" for n in names()), "each shard fetched once"
    cached = os.listdir(cache_dir)
    assert not any("deadbeef" in n or ".part-" in n for n in cached)


def test_https_with_a_private_ca(shard_dir, tmp_path):
    try:
        ca, cert, key = make_test_pki(str(tmp_path))
    except RuntimeError as e:
        pytest.skip(str(e))
    expected = local_samples(shard_dir)
    with RangeHTTPServer(shard_dir, tls=(cert, key)) as srv:
        urls = [srv.url(n) + "?" + FAKE_SIGNATURE for n in names()]
        assert urls[0].startswith("https://127.0.0.1:")
        assert comparable(read_samples(urls, source=SourceOptions(ca_bundle=ca), **FAST)) == expected
        # Without our CA the certificate is refused at once: a clear error, no retry loop.
        started = time.monotonic()
        with pytest.raises(SourceError) as info:
            list(read_samples(urls[:1], **FAST))
        assert time.monotonic() - started < 5
        assert "TLS" in str(info.value) and "deadbeef" not in str(info.value)
        # Building an index scans the shards with the same reader options.
        from shardstream.index import build_index

        index = build_index(urls, decode=False, threads=2, source_options={"ca_bundle": ca, **FAST})
        assert index.num_valid == SHARDS * PER_SHARD
        # ... and an index file on that server is fetched trusting the same CA.
        from shardstream.index import load_index, write_index

        write_index(index, os.path.join(shard_dir, "private-ca.index.json"))
        try:
            fetched = load_index(srv.url("private-ca.index.json"), ca_bundle=ca)
        finally:
            os.unlink(os.path.join(shard_dir, "private-ca.index.json"))
        assert fetched.to_json() == index.to_json()


def test_s3_endpoint_behind_a_private_ca_from_aws_ca_bundle(shard_dir, tmp_path, monkeypatch):
    """An S3-compatible store behind a private CA, trusted the AWS way (AWS_CA_BUNDLE): the Rust
    reader fetching the presigned URLs trusts the same CA as boto3. (Our HTTPS server plays the
    S3 endpoint: presigning makes no request, and the server ignores the signature.)"""
    import shutil

    from shardstream import ShardLoader
    from shardstream.urls import S3Options, S3Signer, Shard

    try:
        ca, cert, key = make_test_pki(str(tmp_path))
    except RuntimeError as e:
        pytest.skip(str(e))
    root = tmp_path / "endpoint"
    (root / "bucket").mkdir(parents=True)
    shutil.copy(os.path.join(shard_dir, names()[0]), root / "bucket" / names()[0])
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CA_BUNDLE", ca)
    with RangeHTTPServer(str(root), tls=(cert, key)) as srv:
        options = S3Options(endpoint_url=srv.url().rstrip("/"), region="us-east-1", addressing_style="path")
        shard = Shard(f"s3://bucket/{names()[0]}", signer=S3Signer(options))
        got = comparable(read_samples([shard], **FAST))

        # An explicit ca_bundle wins over AWS_CA_BUNDLE (here: another CA's), in the loader too.
        (tmp_path / "other").mkdir()
        other_ca = make_test_pki(str(tmp_path / "other"))[0]
        monkeypatch.setenv("AWS_CA_BUNDLE", other_ca)
        shard = Shard(f"s3://bucket/{names()[0]}", signer=S3Signer(options))
        private_ca = SourceOptions(ca_bundle=ca)
        assert comparable(read_samples([shard], source=private_ca, **FAST)) == got
        loader = ShardLoader(
            [shard], batch_size=PER_SHARD, image_size=32, threads=1, source=private_ca, **FAST
        )
        assert sorted(k for b in loader for k in b.keys) == sorted(s["__key__"] for s in got)
    assert got == comparable(read_samples(os.path.join(shard_dir, names()[0])))
