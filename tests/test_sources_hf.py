"""hf:// URLs against a local Hub (tests/hub_server.py: routes from huggingface_hub 2.4.0's client).

The standard is the same as for HTTP and S3: the samples read from the Hub are the local files'
samples, byte for byte; what a shard read costs in API calls is counted by the server."""

from __future__ import annotations

import os

import pytest
from hub_server import LocalHub
from servers import build_photo_shards
from shardstream import ShardLoader, SourceOptions, read_samples
from shardstream.errors import BadUrlError, CredentialsError, NotFoundError, SourceError
from shardstream.index import build_index, write_index
from shardstream.urls import expand_urls
from source_checks import comparable

pytestmark = pytest.mark.timeout(300)

SHARDS, PER_SHARD = 12, 4
REPO = "acme/photos-wds"
TOKEN = "hf_secret_token_for_tests_0123"
FAST = {"connect_timeout": 2.0, "read_timeout": 2.0, "max_retries": 4}


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf-shards")
    build_photo_shards(str(directory), shards=SHARDS, per_shard=PER_SHARD, seed=5)
    return str(directory)


def names() -> list[str]:
    return [f"shard-{i:06d}.tar" for i in range(SHARDS)]


def files_of(shard_dir: str) -> dict[str, bytes]:
    return {f"train/{n}": open(os.path.join(shard_dir, n), "rb").read() for n in names()}


@pytest.fixture()
def hub(shard_dir, monkeypatch, tmp_path):
    # No token file of the user's may leak in: huggingface_hub reads HF_HOME's token file.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LocalHub(token=TOKEN, page_size=5) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        server.push(REPO, {**files_of(shard_dir), "README.md": b"# photos\n"})
        yield server


def local_samples(shard_dir: str) -> list[dict]:
    return comparable(read_samples([os.path.join(shard_dir, n) for n in names()]))


def test_a_loader_over_twelve_hub_shards_reads_what_the_local_files_hold(hub, shard_dir):
    spec = f"hf://datasets/{REPO}/train/*.tar"
    shards = expand_urls(spec)
    assert [s.display.rsplit("/", 1)[1] for s in shards] == names()
    sha = hub.repos[REPO].branches["main"]
    assert all(s.display.startswith(f"hf://datasets/{REPO}@{sha}/train/") for s in shards)
    # One revision call and the folder's pages (12 files, 5 a page): never one call per file.
    assert len(hub.api_calls()) == 1 + 3
    assert comparable(read_samples(spec, **FAST)) == local_samples(shard_dir)

    loader = ShardLoader(spec, batch_size=PER_SHARD, image_size=32, shuffle_buffer=1, threads=2, **FAST)
    keys = [k for batch in loader for k in batch.keys]
    assert sorted(keys) == sorted(s["__key__"] for s in local_samples(shard_dir))
    # Every byte came from the storage host, through a redirect, with Range where resumed.
    assert hub.storage_requests and all(r.path.startswith("/blobs/") for r in hub.storage_requests)


def test_listing_costs_calls_per_folder_not_per_file(hub):
    many = {f"many/part-{i:04d}.tar": b"x" for i in range(2000)}
    hub.page_size = 1000  # the Hub's page size
    hub.push(REPO, many)
    before = len(hub.api_calls())
    shards = expand_urls(f"hf://datasets/{REPO}/many/part-{{0000..1999}}.tar::hf://datasets/{REPO}/train/")
    assert len(shards) == 2000 + SHARDS
    # 1 revision + 2 pages for many/ + 1 page for train/ (13 entries, 1,000 a page).
    assert len(hub.api_calls()) - before == 4


def test_the_token_reaches_the_resolve_host_and_never_the_storage_host(hub, shard_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.gate(REPO, "train/shard-000003.tar")
    shard = expand_urls(f"hf://datasets/{REPO}/train/shard-000003.tar")
    got = comparable(read_samples(shard, **FAST))
    assert got == comparable(read_samples([os.path.join(shard_dir, "shard-000003.tar")]))
    resolves = [r for r in hub.requests if "/resolve/" in r.path]
    assert resolves and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in resolves)
    assert hub.storage_requests
    assert all("authorization" not in r.headers for r in hub.storage_requests)
    # Nothing printable carries it.
    assert TOKEN not in repr(shard) + shard[0].display + repr(shard[0].signer)


def test_a_gated_file_without_a_token_is_one_clear_line_naming_it(hub):
    hub.gate(REPO, "train/shard-000001.tar")
    shard = expand_urls(f"hf://datasets/{REPO}/train/shard-000001.tar")
    with pytest.raises(CredentialsError) as caught:
        list(read_samples(shard, **FAST))
    message = str(caught.value)
    assert "\n" not in message and f"{REPO}" in message and "train/shard-000001.tar" in message
    with pytest.raises(NotFoundError, match="no-such.tar"):
        expand_urls(f"hf://datasets/{REPO}/train/no-such.tar")
    with pytest.raises(NotFoundError, match="acme/absent"):
        expand_urls("hf://datasets/acme/absent/train/*.tar")


@pytest.mark.parametrize(
    "url",
    [
        "hf://models/acme/x/a.tar",
        "hf://datasets/acme",
        "hf://datasets/acme/x@/a.tar",
        "hf://datasets/a/b@r/../c",
    ],
)
def test_a_wrong_url_form_is_a_bad_url_error(url):
    with pytest.raises(BadUrlError, match="hf://datasets/"):
        expand_urls(url)


def test_429s_are_retried_as_told_and_counted(hub, shard_dir):
    hub.throttle("train/shard-000002.tar", 2)
    spec = f"hf://datasets/{REPO}/train/shard-00000{{2..3}}.tar"
    # backoff_max far below the server's Retry-After (1 s): the server's wait wins, in full.
    loader = ShardLoader(
        spec,
        batch_size=PER_SHARD,
        image_size=32,
        shuffle_buffer=1,
        threads=1,
        source=SourceOptions(backoff_max=0.2),
        **FAST,
    )
    keys = [k for batch in loader for k in batch.keys]
    assert len(keys) == 2 * PER_SHARD
    assert loader.stats["retries"] == 2
    assert loader.stats["throttled"] == 2
    throttled = [r for r in hub.requests if r.path.endswith("shard-000002.tar")]
    assert len(throttled) == 3
    gaps = [b.at - a.at for a, b in zip(throttled, throttled[1:], strict=False)]
    assert all(gap >= hub.retry_after for gap in gaps), gaps


def test_a_retry_after_over_the_ceiling_fails_the_read_naming_the_url_and_the_wait(hub):
    hub.retry_after = 3600
    hub.throttle("train/shard-000004.tar", 1)
    shard = expand_urls(f"hf://datasets/{REPO}/train/shard-000004.tar")
    with pytest.raises(SourceError) as caught:
        list(read_samples(shard, **FAST))
    message = str(caught.value)
    assert "\n" not in message and "train/shard-000004.tar" in message, message
    assert "retry after 3600 s" in message and "HTTP 429" in message, message
    # Given up at once: no second request sleeping through the hour.
    assert len([r for r in hub.requests if r.path.endswith("shard-000004.tar")]) == 1


def test_a_retry_after_given_as_an_http_date_is_waited_until_that_time(hub):
    # RFC 9110 allows an HTTP-date; read as seconds it parsed as nothing and the 0.2 s backoff won.
    hub.retry_after, hub.retry_after_as_date = 3, True
    hub.throttle("train/shard-000005.tar", 1)
    shard = expand_urls(f"hf://datasets/{REPO}/train/shard-000005.tar")
    samples = list(read_samples(shard, source=SourceOptions(backoff_max=0.2), **FAST))
    assert len(samples) == PER_SHARD
    tried = [r for r in hub.requests if r.path.endswith("shard-000005.tar")]
    assert len(tried) == 2
    # The date has whole seconds: the wait is at least the 3 s asked less the one truncated.
    assert tried[1].at - tried[0].at >= 2.0, tried[1].at - tried[0].at


def test_the_retry_after_ceiling_is_an_option_of_the_reader(hub):
    hub.retry_after = 30
    hub.throttle("train/shard-000006.tar", 1)
    shard = expand_urls(f"hf://datasets/{REPO}/train/shard-000006.tar")
    with pytest.raises(SourceError, match="retry after 30 s"):
        list(read_samples(shard, source=SourceOptions(retry_after_max=5), **FAST))
    assert len([r for r in hub.requests if r.path.endswith("shard-000006.tar")]) == 1


@pytest.mark.parametrize("option", ["backoff_max", "read_timeout", "retry_after_max"])
def test_a_negative_duration_option_is_a_value_error_naming_it(shard_dir, option):
    # Duration::from_secs_f64 panicked on these before.
    shard = os.path.join(shard_dir, "shard-000000.tar")
    with pytest.raises(ValueError, match=option):
        list(read_samples(shard, **{option: -1.0}))


def test_a_pin_and_an_index_read_the_bytes_of_their_commit_after_main_moved(hub, shard_dir, tmp_path):
    old = hub.repos[REPO].branches["main"]
    spec = f"hf://datasets/{REPO}/train/*.tar"
    index_path = write_index(build_index(spec), str(tmp_path / "hub.index"))
    expected = local_samples(shard_dir)
    # main moves on: shard 0 now holds other photos.
    other = tmp_path / "other"
    other.mkdir()
    build_photo_shards(str(other), shards=1, per_shard=PER_SHARD, seed=9)
    new = hub.push(REPO, {"train/shard-000000.tar": (other / "shard-000000.tar").read_bytes()})
    assert new != old
    assert comparable(read_samples(f"hf://datasets/{REPO}@{old}/train/*.tar", **FAST)) == expected
    moved = comparable(read_samples(f"hf://datasets/{REPO}/train/shard-000000.tar", **FAST))
    assert moved != expected[:PER_SHARD]

    for urls in (spec, None):  # the spec resolves to the new commit; the index pins the old one
        loader = ShardLoader(urls, index=index_path, batch_size=PER_SHARD, image_size=32, threads=1, **FAST)
        keys = [k for batch in loader for k in batch.keys]
        assert sorted(keys) == sorted(s["__key__"] for s in expected)


def test_the_cli_validates_and_indexes_hub_shards_and_a_loader_reads_the_index(
    hub, tmp_path, capsys, monkeypatch
):
    from shardstream.cli import main

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    spec = f"hf://datasets/{REPO}/train/shard-00000{{0..2}}.tar"
    assert main(["validate", spec, "-q"]) == 0
    out = str(tmp_path / "cli.index")
    assert main(["index", spec, "-o", out, "-q"]) == 0
    loader = ShardLoader(None, index=out, batch_size=PER_SHARD, image_size=32, threads=1, **FAST)
    assert len([k for batch in loader for k in batch.keys]) == 3 * PER_SHARD
    printed = capsys.readouterr()
    assert TOKEN not in printed.out + printed.err


def test_parquet_files_on_the_hub_read_as_the_local_files_with_range_reads_through_the_redirect(
    hub, tmp_path
):
    # The layout of most image datasets on the Hub: datasets' Image struct, several row groups.
    from parquet_corpus import write_pairs

    parquets, _, keys = write_pairs(str(tmp_path / "pq"), [9, 7], seed=12, layout="hf", rows_per_group=3)
    repo = "acme/photos-parquet"
    hub.push(repo, {f"data/{os.path.basename(p)}": open(p, "rb").read() for p in parquets})
    spec = f"hf://datasets/{repo}/data/*.parquet"
    columns = {"caption_key": "text", "image_keys": ["image"]}
    strip = lambda rows: [{k: v for k, v in r.items() if k != "__url__"} for r in rows]  # noqa: E731
    assert strip(read_samples(spec, **FAST)) == strip(read_samples(parquets))
    index = write_index(build_index(spec, decode=False, **columns), str(tmp_path / "index"))

    def by_key(loader) -> dict:
        return {k: (b.images[i].numpy().tobytes(), b.texts[i]) for b in loader for i, k in enumerate(b.keys)}

    kw = {"batch_size": 4, "image_size": 32, "drop_last": False, "threads": 1, **columns}
    got = by_key(ShardLoader(spec, index=index, **kw, **FAST))
    assert sorted(got) == sorted(keys)
    assert got == by_key(ShardLoader(parquets, **kw))
    # Footers and row groups came by Range from the storage host, never a whole file per row group.
    blob_reads = [r for r in hub.storage_requests if r.path.startswith("/blobs/")]
    assert blob_reads and all(r.headers.get("range", "").startswith("bytes=") for r in blob_reads)
